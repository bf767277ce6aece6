-- .npy files: gpu.load and t:save.  The files read here are built byte for
-- byte from the published format (NEP 1 / numpy.lib.format): the magic, the
-- version, the header length, the dict, the padding, the elements.
local gpu = require "gpu"
local T = require "gpu.test"

local MAGIC = "\x93NUMPY"

-- A .npy file's bytes.  o: major, minor (version), dict (the header text;
-- default from descr, shape and fortran), align (64 as numpy today, 16 as
-- older writers, 1 for none), hlen (a header length field that lies).
local function npy(descr, shape, data, o)
  o = o or {}
  local major = o.major or 1
  local dict = o.dict or string.format("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
    o.fortran and "True" or "False", shape)
  local pre = 8 + (major == 1 and 2 or 4)
  local align = o.align or 64
  local pad = (align - (pre + #dict + 1) % align) % align
  local header = dict .. string.rep(" ", pad) .. "\n"
  return MAGIC .. string.char(major, o.minor or 0) .. string.pack(major == 1 and "<I2" or "<I4", o.hlen or #header)
      .. header .. data
end

local function pack(fmt, values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = string.pack(fmt, v) end
  return table.concat(parts)
end

-- every dtype: descr, string.pack format of the stored bits, stored values,
-- and the values a load gives back (f16/bf16 bits are given as integers)
local DT = {
  { "f32", "<f4", "<f", { 1.5, -2.25, 1e6 }, { 1.5, -2.25, 1e6 } },
  { "f64", "<f8", "<d", { 1.5, -2.25, 1e300 }, { 1.5, -2.25, 1e300 } },
  { "f16", "<f2", "<I2", { 0x3E00, 0xC080, 0x7BFF }, { 1.5, -2.25, 65504.0 } },
  { "bf16", "<V2", "<I2", { 0x3FC0, 0xC010, 0x4780 }, { 1.5, -2.25, 65536.0 } },
  { "i8", "|i1", "<i1", { -128, 0, 127 }, { -128, 0, 127 } },
  { "u8", "|u1", "<I1", { 0, 200, 255 }, { 0, 200, 255 } },
  { "i32", "<i4", "<i4", { -2147483648, 7, 2147483647 }, { -2147483648, 7, 2147483647 } },
  { "i64", "<i8", "<i8", { math.mininteger, 7, math.maxinteger }, { math.mininteger, 7, math.maxinteger } },
  { "bool", "|b1", "B", { 1, 0, 1 }, { true, false, true } },
}

local files = {}
local function file(bytes)
  local p = T.tmpfile(bytes)
  files[#files + 1] = p
  return p
end

local slurp = T.readfile

-- numpy.save's header for a C-order array, written out independently
local function numpy_header(descr, shape)
  local st = "(" .. table.concat(shape, ", ") .. (#shape == 1 and ",)" or ")")
  local d = string.format("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, st)
  if #shape > 0 then d = d .. string.rep(" ", 21 - #tostring(shape[1])) end
  local hl = #d + 1
  local pad = 64 - (10 + hl) % 64
  return MAGIC .. "\1\0" .. string.pack("<I2", hl + pad) .. d .. string.rep(" ", pad) .. "\n"
end

T.test("every dtype loads, format 1.0 and 2.0, to device, pinned and host", function()
  for _, d in ipairs(DT) do
    local name, descr, fmt, stored, want = d[1], d[2], d[3], d[4], d[5]
    for _, major in ipairs { 1, 2 } do
      local p = file(npy(descr, "(3,)", pack(fmt, stored), { major = major }))
      for _, dev in ipairs { "device", "pinned", "host" } do
        local t = gpu.load(p, { device = dev })
        T.is({ t.dtype, t.shape, t.device, t:totable() }, { name, { 3 }, dev, want },
          string.format("%s v%d.0 -> %s", name, major, dev))
      end
    end
  end
end)

T.test("the default is device memory, as gpu.zeros; 0-dim and 3-D shapes", function()
  local p = file(npy("<f8", "()", string.pack("<d", 2.5)))
  local t = gpu.load(p)
  T.is({ t.device, t.ndim, t:item() }, { "device", 0, 2.5 }, "shape () is a 0-dim tensor")
  local v = {}
  for i = 0, 23 do v[#v + 1] = i end
  p = file(npy("|u1", "(2, 3, 4)", pack("<I1", v)))
  t = gpu.load(p)
  T.is(t.shape, { 2, 3, 4 }, "shape (2, 3, 4)")
  T.is(T.flatten(t:totable()), v, "C order")
  T.is(t:totable()[2][3][4], 23, "last element at [2][3][4]")
end)

T.test("headers as other writers make them", function()
  local data = pack("<i4", { 1, 2, 3, 4, 5, 6 })
  local cases = {
    { "16-byte alignment (older numpy)", { align = 16 } },
    { "no alignment at all", { align = 1 } },
    { "keys in another order, double quotes, no trailing comma",
      { dict = "{\"shape\": (2, 3), \"fortran_order\": False, \"descr\": \"<i4\"}" } },
    { "Python 2 long sizes and odd spacing", { dict = "{ 'descr' : '<i4' ,'fortran_order':False,'shape':(2L,3L) }" } },
    { "format 3.0 (utf-8 header)", { major = 3 } },
    { "'=' byte order", { dict = "{'descr': '=i4', 'fortran_order': False, 'shape': (2, 3), }" } },
  }
  for _, c in ipairs(cases) do
    local t = gpu.load(file(npy("<i4", "(2, 3)", data, c[2])), { device = "host" })
    T.is(t:totable(), { { 1, 2, 3 }, { 4, 5, 6 } }, c[1])
  end
end)

T.test("big-endian data is swapped; other bool bytes are true; 'bfloat16' is bf16", function()
  local t = gpu.load(file(npy(">f4", "(3,)", pack(">f", { 1.5, -2.25, 3 }))))
  T.is(t:totable(), { 1.5, -2.25, 3.0 }, ">f4")
  t = gpu.load(file(npy(">i8", "(2,)", pack(">i8", { -2, 300 }))))
  T.is(t:totable(), { -2, 300 }, ">i8")
  t = gpu.load(file(npy(">f2", "(1,)", string.pack(">I2", 0x3E00))))
  T.is(t:totable(), { 1.5 }, ">f2")
  t = gpu.load(file(npy("|b1", "(3,)", "\0\2\255")))
  T.is(t:totable(), { false, true, true }, "bool bytes 0, 2, 255")
  T.is(t:to("u8"):totable(), { 0, 1, 1 }, "stored as 0/1")
  t = gpu.load(file(npy("bfloat16", "(1,)", string.pack("<I2", 0x3FC0))))
  T.is({ t.dtype, t:item() }, { "bf16", 1.5 }, "descr 'bfloat16' (ml_dtypes' name)")
  t = gpu.load(file(npy("|V2", "(1,)", string.pack("<I2", 0x3FC0))))
  T.is({ t.dtype, t:item() }, { "bf16", 1.5 }, "descr '|V2'")
end)

T.test("a load to the device: one async copy from pinned memory, no sync", function()
  local vals = {}
  for i = 1, 1000 do vals[i] = i end
  local p = file(npy("<f4", "(1000,)", pack("<f", vals)))
  collectgarbage(); gpu.synchronize()
  local s0 = gpu.stats()
  local s <close> = gpu.stream()
  local t = gpu.load(p, { stream = s })
  local s1 = gpu.stats()
  T.is({ s1.copies - s0.copies, s1.h2d_bytes - s0.h2d_bytes, s1.syncs - s0.syncs }, { 1, 4000, 0 },
    "one copy of 4000 bytes host-to-device, no sync")
  local x <close> = t:sum({ stream = s })
  T.is(x:item({ stream = s }), 500500.0, "values after the copy on the stream")
  x:close()
  t:close()
  collectgarbage(); gpu.synchronize()
  T.is(gpu.memory().pinned, 0, "the pinned staging buffer is released once the copy is done")
end)

T.test("t:save writes numpy.save's bytes", function()
  local p = os.tmpname()
  files[#files + 1] = p
  local t = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "f32" })
  T.is(t:save(p), t, "returns the tensor")
  local b = slurp(p)
  T.is(b:sub(1, 10), MAGIC .. "\1\0" .. string.pack("<I2", 118), "magic, version 1.0, header length 118")
  T.is(b:sub(11, 69), "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", "the dict")
  T.is(b:sub(70, 128), string.rep(" ", 58) .. "\n", "spaces, then '\\n' at byte 128: data aligned to 64")
  T.is(b:sub(129), pack("<f", { 1, 2, 3, 4, 5, 6 }), "the data, C order")
  for _, d in ipairs(DT) do
    local name, descr, fmt, stored, want = d[1], d[2], d[3], d[4], d[5]
    for _, dev in ipairs { "device", "pinned", "host" } do
      local x = gpu.tensor(want, { dtype = name, device = dev })
      x:save(p)
      T.is(slurp(p), numpy_header(descr, { 3 }) .. pack(fmt, stored), name .. " from " .. dev .. " memory")
    end
  end
  gpu.full({}, 7, { dtype = "i64" }):save(p)
  T.is(slurp(p), numpy_header("<i8", {}) .. string.pack("<i8", 7), "0-dim: shape ()")
  gpu.arange(0, 24, { dtype = "i32" }):view({ 2, 3, 4 }):save(p)
  T.ok(slurp(p):find("'shape': (2, 3, 4), }", 1, true), "3-D shape")
  T.is(#numpy_header("<i4", { 2, 3, 4 }) % 64, 0, "header padded to 64")
end)

T.test("t:save of a view writes C order; from the device it is one counted sync", function()
  local p = os.tmpname()
  files[#files + 1] = p
  local m = gpu.arange(0, 12, { dtype = "i32" }):view({ 3, 4 })
  local col = m:narrow(2, 2, 2)
  T.ok(not col:is_contiguous(), "a non-contiguous view")
  local s0 = gpu.stats().syncs
  col:save(p)
  T.is(gpu.stats().syncs - s0, 1, "saving device memory: one counted sync")
  T.is(slurp(p), numpy_header("<i4", { 3, 2 }) .. pack("<i4", { 1, 2, 5, 6, 9, 10 }), "the view's elements")
  local h = gpu.arange(0, 12, { dtype = "i32", device = "host" }):view({ 3, 4 }):narrow(2, 2, 2)
  h:save(p)
  T.is(slurp(p), numpy_header("<i4", { 3, 2 }) .. pack("<i4", { 1, 2, 5, 6, 9, 10 }), "the same from host memory")
  do
    local _ <close> = gpu.nosync()
    T.raises_at(function() col:save(p) end, "save: .*host%-device sync", "under gpu.nosync() a device save raises")
  end
end)

T.test("round trip of every dtype through device, pinned and host", function()
  local p = os.tmpname()
  files[#files + 1] = p
  for _, d in ipairs(DT) do
    local name, want = d[1], d[5]
    local vals = { { want[1], want[2] }, { want[3], want[1] } }
    for _, from in ipairs { "device", "pinned", "host" } do
      gpu.tensor(vals, { dtype = name, device = from }):save(p)
      for _, to in ipairs { "device", "pinned", "host" } do
        local t = gpu.load(p, { device = to })
        T.is({ t.dtype, t.shape, t:totable() }, { name, { 2, 2 }, vals }, name .. ": " .. from .. " -> " .. to)
      end
    end
  end
end)

T.test("bad files raise, naming the file", function()
  local good = npy("<f4", "(2,)", pack("<f", { 1, 2 }))
  local function hdr(dict, data) return npy(nil, nil, data or pack("<f", { 1, 2 }), { dict = dict }) end
  local cases = {
    { "empty file", "", "bad magic" },
    { "bad magic", "\x93NUMPZ\1\0" .. good:sub(9), "bad magic" },
    { "a zip (.npz) archive", "PK\3\4" .. string.rep("\0", 60), "zip archive" },
    { "text file", "hello, world\n", "bad magic" },
    { "truncated in the magic", "\x93NUM", "no room for the format version" },
    { "truncated before the version", MAGIC .. "\1", "no room for the format version" },
    { "truncated in the header length", MAGIC .. "\1\0\20", "no room for the header length" },
    { "version 4.0", MAGIC .. "\4\0" .. good:sub(9), "version 4.0" },
    { "version 1.1", MAGIC .. "\1\1" .. good:sub(9), "version 1.1" },
    { "version 0.0", MAGIC .. "\0\0" .. good:sub(9), "version 0.0" },
    { "header length past the end", npy("<f4", "(2,)", "", { hlen = 1000 }), "truncated header" },
    { "v2 header length 4 GiB", npy("<f4", "(2,)", "", { major = 2, hlen = 0xFFFFFFFF }), "truncated header" },
    { "data shorter than the shape", npy("<f4", "(3,)", pack("<f", { 1, 2 })),
      "truncated data: shape (3,) of '<f4' needs 12 bytes of data, the file has 8" },
    { "data longer than the shape", npy("<f4", "(1,)", pack("<f", { 1, 2 })),
      "does not match the file's size: shape (1,) of '<f4' needs 4 bytes of data, the file has 8 (trailing bytes)" },
    { "header not a dict", hdr("[1, 2]"), "expected '{'" },
    { "no shape key", hdr("{'descr': '<f4', 'fortran_order': False}"), "no 'shape' key" },
    { "unknown key", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"), "unexpected key 'x'" },
    { "repeated key", hdr("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}"),
      "repeated key 'descr'" },
    { "unterminated string", hdr("{'descr: '<f4', 'fortran_order': False, 'shape': (2,)}"), "malformed header" },
    { "shape not a tuple", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': 2}"), "expected '('" },
    { "negative size", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}"), "negative size" },
    { "size not a number", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (two,)}"), "expected a size" },
    { "fortran_order not a bool", hdr("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}"), "True or False" },
    { "text after the dict", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x"), "text after the dict" },
    { "missing colon", hdr("{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}"), "expected ':'" },
    { "a size that overflows int64", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"),
      "overflows" },
    { "a shape whose product overflows", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"),
      "is too large" },
    { "9 dims", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,2)}"), "more than 8 dims" },
    { "an empty dim with data", npy("<f4", "(3, 0)", pack("<f", { 1 })), "needs 0 bytes of data, the file has 4" },
    { "Fortran order", npy("<f4", "(2, 1)", pack("<f", { 1, 2 }), { fortran = true }), "Fortran-order data" },
    { "structured dtype", hdr("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}"),
      "structured" },
  }
  for _, u in ipairs { "<c8", "<u4", "|O", "<U5", "|S3", "<M8[ns]", "<V4", "<f16", "<i2", "x" } do
    cases[#cases + 1] = { "dtype " .. u, npy(u, "(2,)", pack("<f", { 1, 2 })), "unsupported dtype '" .. u .. "'" }
  end
  for _, c in ipairs(cases) do
    local p = file(c[2])
    local msg = T.raises_at(function() gpu.load(p) end, c[3], c[1])
    T.ok(msg and msg:find(p, 1, true), c[1] .. ": the message names the file")
  end
  T.raises_at(function() gpu.load("/nonexistent/dir/x.npy") end,
    "load: cannot open /nonexistent/dir/x.npy: No such file or directory", "a missing file")
  T.raises_at(function() gpu.load("/tmp") end, "load: /tmp: not a regular file", "a directory")
  T.is((gpu.ones({ 2 }) + 1):sum():item(), 4.0, "the runtime still works")
end)

T.test("bad arguments", function()
  local p = file(npy("<f4", "(2,)", pack("<f", { 1, 2 })))
  local t = gpu.ones({ 2 })
  local c = gpu.ones({ 2 })
  c:close()
  local cases = {
    { "load(number)", "bad argument #1 to 'load'", function() gpu.load({}) end },
    { "load(nil)", "bad argument #1 to 'load'", function() gpu.load() end },
    { "opts not a table", "bad argument #2 to 'load'", function() gpu.load(p, 5) end },
    { "unknown option", "unknown option 'colour'", function() gpu.load(p, { colour = 1 }) end },
    { "bad device", "bad option 'device'", function() gpu.load(p, { device = "gpu" }) end },
    { "bad device index", "bad option 'device'", function() gpu.load(p, { device = "cuda:99" }) end },
    { "bad stream", "stream", function() gpu.load(p, { stream = "s" }) end },
    { "save(number)", "bad argument #1 to 'save'", function() t:save({}) end },
    { "save opts", "unknown option 'device'", function() t:save(p, { device = "host" }) end },
    { "save on a closed tensor", "closed", function() c:save(p) end },
    { "save of a non-tensor", "bad argument", function() t.save(5, p) end },
  }
  for _, x in ipairs(cases) do T.raises_at(x[3], x[2], x[1]) end
end)

T.test("a failed save leaves the path as it was", function()
  local dir = os.tmpname()
  os.remove(dir)
  T.ok(os.execute("mkdir " .. dir .. " && touch " .. dir .. "/keep"), "a directory with a file")
  T.raises_at(function() gpu.ones({ 4 }):save(dir) end, "save: cannot write " .. dir .. ": Is a directory",
    "saving over a directory fails at the rename")
  local ls = io.popen("ls " .. dir .. "* 2>&1"):read("a")
  T.ok(not ls:find("%.tmp"), "no temporary file is left behind")
  os.execute("rm -rf " .. dir)
  T.raises_at(function() gpu.ones({ 4 }):save("/nonexistent/dir/x.npy") end,
    "save: cannot write /nonexistent/dir/x.npy: No such file or directory", "a missing directory")

  -- the disk fills up: a child limited in file size (SIGXFSZ ignored, so write fails with EFBIG)
  local p = os.tmpname()
  files[#files + 1] = p
  gpu.tensor({ 1, 2, 3 }, { dtype = "i32" }):save(p)
  local before = slurp(p)
  local out, ok = T.run("trap '' XFSZ; ulimit -f 16;", "-e \"local ok, e = pcall(function() "
    .. "gpu.zeros({1048576}):save('" .. p .. "') end) print(ok, e)\"")
  T.ok(ok and out:find("false", 1, true) and out:find("save: cannot write " .. p .. ": File too large", 1, true),
    "a write error raises with the OS message")
  if not out:find("File too large", 1, true) then T.diag(out) end
  T.is(slurp(p), before, "the file at the path is untouched")
  local left = io.popen("ls " .. p .. ".*.tmp 2>/dev/null"):read("a")
  T.is(left, "", "and the partial temporary file was removed")
end)

for _, p in ipairs(files) do os.remove(p) end
T.done()
