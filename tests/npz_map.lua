-- gpu.load_npz maps stored members (issue 34, item 3): a stored member is
-- a .npy at a known place in the file, so its elements are mapped and a
-- staged copy queued, as gpu.load does; deflated members, map = false and
-- host or pinned loads read the member whole, CRC-32 checked.  The zips
-- here are built byte by byte (APPNOTE.TXT), with local headers that lie;
-- NumPy (a python3 child) writes the real ones.
local gpu = require "gpu"
local T = require "gpu.test"
local N = dofile("tests/numpy/oracle.lua")
local PY = N.python()

local files = {}
local function file(bytes)
  local p = T.tmpfile(bytes)
  files[#files + 1] = p
  return p
end
local function tmppath()
  local p = os.tmpname()
  files[#files + 1] = p
  return p
end
local function pattern(s) return (s:gsub("%p", "%%%0")) end

-- CRC-32 (the zip one), bit by bit
local function crc32(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do
    c = c ~ s:byte(i)
    for _ = 1, 8 do c = (c >> 1) ~ (0xEDB88320 & -(c & 1)) end
  end
  return c ~ 0xFFFFFFFF
end

-- A zip built byte by byte: members {name, data, crc =, dd = true (a data
-- descriptor: zeros in the local header), zip64 = true (sizes in the zip64
-- extra field), pad = n (bytes of extra field in the local header, to
-- place the data), and what the local header says where it lies: lname,
-- lmethod, lsize, lcrc, lextra (its extra length field alone); lho: the
-- central directory's offset of the local header}.
local function zip(members)
  local parts, cds, off = {}, {}, 0
  for _, m in ipairs(members) do
    local name, data = m[1], m[2]
    local crc, flags = m.crc or crc32(data), m.dd and 8 or 0
    local lsize = m.dd and 0 or (m.zip64 and 0xFFFFFFFF or #data)
    local lextra = (m.zip64 and not m.dd) and string.pack("<I2I2I8I8", 1, 16, #data, #data) or ""
    if m.pad then lextra = lextra .. string.pack("<I2I2", 0xCAFE, m.pad - 4) .. string.rep("\0", m.pad - 4) end
    local lname = m.lname or name
    local lh = string.pack("<I4I2I2I2I2I2I4I4I4I2I2", 0x04034b50, 45, flags, m.lmethod or 0, 0, 0x21,
      m.lcrc or (m.dd and 0 or crc), m.lsize or lsize, m.lsize or lsize, #lname, m.lextra or #lextra) .. lname .. lextra
    local dd = m.dd and string.pack("<I4I4I4I4", 0x08074b50, crc, #data, #data) or ""
    cds[#cds + 1] = string.pack("<I4I2I2I2I2I2I2I4I4I4I2I2I2I2I2I4I4", 0x02014b50, 45, 45, flags, 0, 0, 0x21,
      crc, #data, #data, #name, 0, 0, 0, 0, 0, m.lho or off) .. name
    parts[#parts + 1] = lh .. data .. dd
    off = off + #lh + #data + #dd
  end
  local cd = table.concat(cds)
  return table.concat(parts) .. cd .. string.pack("<I4I2I2I2I2I4I4I2", 0x06054b50, 0, 0, #members, #members, #cd,
    off, 0)
end

local function npy_bytes(t)
  local p = tmppath()
  t:save(p)
  return T.readfile(p)
end

-- The mappings of path in this process: their sizes; nil without /proc
local function mappings(path)
  local f = io.open("/proc/self/maps")
  if not f then return nil end
  local sizes = {}
  for line in f:lines() do
    local lo, hi, name = line:match("^(%x+)%-(%x+)%s+%S+%s+%S+%s+%S+%s+%S+%s+(.*)$")
    if name and (name == path or name == path .. " (deleted)") then
      sizes[#sizes + 1] = tonumber(hi, 16) - tonumber(lo, 16)
    end
  end
  f:close()
  return sizes
end

-- Bytes read by this process through read(2) and the like; nil without /proc
local function rchar()
  local f = io.open("/proc/self/io")
  if not f then return nil end
  local n = f:read("a"):match("rchar:%s*(%d+)")
  f:close()
  return tonumber(n)
end

local N_BIG = 1 << 20
local function big_npy()
  return npy_bytes(gpu.arange(N_BIG, { dtype = "f32" }))
end

T.test("npz: a stored member is mapped and its copy queued; the call returns before it", function()
  -- pad = 5: the elements start at an odd offset, as numpy.savez places them
  local p = file(zip({ { "small.npy", npy_bytes(gpu.tensor({ 4, 5 }, { dtype = "i32" })) },
    { "big.npy", big_npy(), pad = 5 } }))
  local s <close> = gpu.stream()
  gpu.sleep(200, { stream = s })   -- the copies queue behind it
  local r0 = rchar()
  local t = gpu.load_npz(p, { stream = s })
  local read = r0 and rchar() - r0
  local maps = mappings(p)
  if maps then T.ok(#maps >= 1, "while the copies wait, the file is mapped") end
  if read then T.ok(read < N_BIG, string.format("the elements are mapped, not read: %d bytes read for 4 MiB", read)) end
  os.remove(p)                       -- the mapping outlives the path
  s:synchronize()
  T.is({ t.big:get(1), t.big:get(N_BIG), t.big:sum():item() }, { 0.0, N_BIG - 1.0, N_BIG * (N_BIG - 1) / 2 },
    "the unaligned member's values")
  T.is({ t.small.dtype, t.small:totable() }, { "i32", { 4, 5 } }, "the small one")
  gpu.synchronize()                  -- a device call: the finished copies' mappings go
  if maps then T.is(mappings(p), {}, "once the copies are done, nothing stays mapped") end
end)

T.test("npz: a selection maps only its member; the others are not touched", function()
  -- a's local header is garbage and c's data lies: neither is read for b
  local a = big_npy()
  local p = file(zip({ { "a.npy", a, lname = "zz.npy" }, { "b.npy", npy_bytes(gpu.tensor({ 10, 11, 12, 13 }, { dtype = "i64" })) },
    { "c.npy", a:sub(1, -9), crc = 0 } }))
  local s <close> = gpu.stream()
  gpu.sleep(200, { stream = s })
  local r0 = rchar()
  local t = gpu.load_npz(p, { names = { "b" }, stream = s })
  local read = r0 and rchar() - r0
  local maps = mappings(p)
  if maps then
    local total = 0
    for _, m in ipairs(maps) do total = total + m end
    T.ok(#maps == 1 and total <= 2 * 65536, string.format("b alone is mapped: %d mapping(s), %d bytes", #maps, total))
  end
  if read then T.ok(read < 4 * 65536, string.format("%d bytes read: not a's or c's", read)) end
  s:synchronize()
  T.is({ t.a, t.c, t.b:totable() }, { nil, nil, { 10, 11, 12, 13 } }, "only b, right")
  T.raises_at(function() gpu.load_npz(p, { names = { "a" } }) end,
    "member 'a%.npy': its local header names 'zz%.npy'", "a, asked for, raises")
  T.raises_at(function() gpu.load_npz(p, { names = { "c" } }) end, "member 'c%.npy': truncated data", "so does c")
end)

T.test("npz: map = false (and host, pinned) read at the call and check the CRC-32", function()
  local n = 1 << 18
  local bytes = npy_bytes(gpu.arange(n, { dtype = "f32" }))
  local good = file(zip({ { "a.npy", bytes } }))
  local r0 = rchar()
  local t = gpu.load_npz(good, { map = false })
  local read = r0 and rchar() - r0
  if read then T.ok(read >= 4 * n, string.format("%d bytes read for a's %d", read, 4 * n)) end
  local maps = mappings(good)
  if maps then T.is(maps, {}, "nothing mapped") end
  T.is({ t.a:get(1), t.a:get(n) }, { 0.0, n - 1.0 }, "the values")
  -- one flipped element: the CRC catches it where the member is read, not where it is mapped
  local flipped = bytes:sub(1, -2) .. string.char(bytes:byte(-1) ~ 1)
  local bad = file(zip({ { "a.npy", flipped, crc = crc32(bytes) } }))
  for _, opts in ipairs { { map = false }, { device = "pinned" }, { device = "host" } } do
    local how = next(opts) .. " = " .. tostring(opts[next(opts)])
    T.raises_at(function() gpu.load_npz(bad, opts) end, "member 'a%.npy': CRC%-32 mismatch", "CRC checked: " .. how)
  end
  T.is(gpu.load_npz(bad).a:get(1), 0.0, "a mapped member is not CRC-checked (documented)")
  T.raises_at(function() gpu.load_npz(good, { map = 1 }) end,
    "bad option 'map' to 'load_npz' %(boolean expected, got number%)", "map is a boolean")
end)

T.test("npz: a stored member read in place is CRC-checked whole: preamble, header and elements", function()
  -- a space becomes a tab, an element's byte changes
  local function spoil(npy, at) return npy:sub(1, at - 1) .. string.char(npy:byte(at) ~ 0x29) .. npy:sub(at + 1) end
  local f = npy_bytes(gpu.tensor({ 1, 2, 3 }, { dtype = "f32" }))
  local k = npy_bytes(gpu.tensor({ true, false }, { dtype = "bool" }))
  local e = npy_bytes(gpu.zeros({ 0, 2 }))
  local pad = f:find(" \n", 1, true)   -- a space of the header's padding: the header still parses
  for _, c in ipairs {
    { "a header byte", "f", spoil(f, pad), f, { map = false } },
    { "a header byte, pinned", "f", spoil(f, pad), f, { device = "pinned" } },
    { "a header byte, host", "f", spoil(f, pad), f, { device = "host" } },
    { "an element", "f", spoil(f, #f), f, { map = false } },
    { "a bool (read, never mapped)", "k", spoil(k, #k), k, {} },
    { "an empty array's header", "e", spoil(e, e:find(" \n", 1, true)), e, {} },
  } do
    local p = file(zip({ { c[2] .. ".npy", c[3], crc = crc32(c[4]) } }))
    T.raises_at(function() gpu.load_npz(p, c[5]) end,
      "member '" .. c[2] .. "%.npy': CRC%-32 mismatch", c[1])
  end
  T.is(gpu.load_npz(file(zip({ { "f.npy", spoil(f, pad), crc = crc32(f) } }))).f:totable(), { 1, 2, 3 },
    "mapped: not CRC-checked")
end)

-- every dtype, 0-d and empty, big-endian: name, array expression, values a load gives back
local ARRAYS = {
  { "f32", "np.array([1.5, -2.25, 1e6], np.float32)", { 1.5, -2.25, 1e6 } },
  { "f64", "np.array([[1.5], [-2.25], [1e300]])", { { 1.5 }, { -2.25 }, { 1e300 } } },
  { "f16", "np.array([1.5, -2.25, 65504], np.float16)", { 1.5, -2.25, 65504.0 } },
  { "i8", "np.array([-128, 0, 127], np.int8)", { -128, 0, 127 } },
  { "u8", "np.array([0, 200, 255], np.uint8)", { 0, 200, 255 } },
  { "i32", "np.array([-2**31, 7, 2**31 - 1], np.int32)", { -2147483648, 7, 2147483647 } },
  { "i64", "np.array([-2**63, 7, 2**63 - 1], np.int64)", { math.mininteger, 7, math.maxinteger } },
  { "bool", "np.array([True, False, True])", { true, false, true } },
  { "scalar", "np.array(2.5)", 2.5 },
  { "empty", "np.zeros((0, 3), np.float32)", {} },
  { "be_f32", "np.array([1.5, -3], '>f4')", { 1.5, -3.0 } },
  { "be_i64", "np.array([[1, -2]], '>i8')", { { 1, -2 } } },
  { "c3d", "np.arange(24, dtype=np.int32).reshape(2, 3, 4)", nil },
}

local function numpy_archives()
  local stored, deflated = tmppath() .. ".npz", tmppath() .. ".npz"
  files[#files + 1], files[#files + 2] = stored, deflated
  local items = {}
  for _, a in ipairs(ARRAYS) do items[#items + 1] = string.format("%q: %s", a[1], a[2]) end
  local script = string.format("import numpy as np; d = {%s}; np.savez(%q, **d); np.savez_compressed(%q, **d)",
    table.concat(items, ", "), stored, deflated)
  local out, code = T.sh(string.format("%s -c %q 2>&1", PY, script))
  T.is({ code, out }, { 0, "" }, "numpy writes savez and savez_compressed")
  return stored, deflated
end

T.test("npz: NumPy's archives, every dtype, map = true and false, device, pinned and host", function()
  if not PY then return T.skip("NumPy npz files", "no python3 with numpy found") end
  local stored, deflated = numpy_archives()
  local c3d = {}
  for i = 0, 1 do
    c3d[i + 1] = {}
    for j = 0, 2 do
      c3d[i + 1][j + 1] = {}
      for k = 0, 3 do c3d[i + 1][j + 1][k + 1] = i * 12 + j * 4 + k end
    end
  end
  for _, p in ipairs { stored, deflated } do
    for _, opts in ipairs { {}, { map = false }, { device = "pinned" }, { device = "host" } } do
      local t = gpu.load_npz(p, opts)
      local how = (p == stored and "savez" or "savez_compressed") .. " " .. (opts.device or "device") ..
        (opts.map == false and " map = false" or "")
      for _, a in ipairs(ARRAYS) do
        local got = t[a[1]]
        T.is(a[1] == "scalar" and got:item() or got:totable(), a[3] or c3d, a[1] .. ": " .. how)
      end
      T.is({ t.empty.shape, t.scalar.shape, t.be_f32.dtype, t.bool.dtype }, { { 0, 3 }, {}, "f32", "bool" },
        "shapes and dtypes: " .. how)
    end
  end
  -- numpy.savez's members (elements at odd offsets) are mapped too
  local s <close> = gpu.stream()
  gpu.sleep(100, { stream = s })
  local m = gpu.load_npz(stored, { names = { "c3d", "f64" }, stream = s })
  local maps = mappings(stored)
  if maps then T.ok(#maps >= 1, "numpy.savez's members are mapped while their copies wait") end
  s:synchronize()
  T.is({ m.c3d:totable(), m.f64:totable() }, { c3d, ARRAYS[2][3] }, "and right")
  local sel = gpu.load_npz(deflated, { names = { "i64", "be_f32" }, map = true })
  T.is({ sel.i64:totable(), sel.be_f32:totable(), sel.f32 }, { ARRAYS[7][3], { 1.5, -3.0 }, nil },
    "map = true on a deflated archive reads its selection")
end)

T.test("npz: bf16, Fortran order and a big archive of NumPy's, mapped", function()
  if not PY then return T.skip("NumPy npz files", "no python3 with numpy found") end
  local bf = gpu.tensor({ 1.5, -2.25 }, { dtype = "bf16" })
  local p = tmppath()
  gpu.save_npz(p, { bf = bf, x = gpu.arange(1000, { dtype = "f64" }) })
  local t = gpu.load_npz(p)
  T.is({ t.bf.dtype, t.bf:totable(), t.x:sum():item() }, { "bf16", { 1.5, -2.25 }, 499500.0 }, "ours, read back mapped")
  local f = tmppath() .. ".npz"
  files[#files + 1] = f
  local out, code = T.sh(string.format("%s -c %q 2>&1", PY,
    string.format("import numpy as np; np.savez(%q, f=np.asfortranarray(np.ones((2, 3), np.float32)))", f)))
  T.is({ code, out }, { 0, "" }, "numpy writes a Fortran-order member")
  for _, map in ipairs { true, false } do
    T.raises_at(function() gpu.load_npz(f, { map = map }) end,
      "member 'f%.npy': Fortran%-order data .* is not supported", "Fortran order is refused (map = " .. tostring(map) .. ")")
  end
end)

T.test("npz: a local header that disagrees with the central directory is refused", function()
  local a = npy_bytes(gpu.tensor({ 1, 2, 3 }, { dtype = "f32" }))
  local cases = {
    { "another name", { "a.npy", a, lname = "b.npy" }, "its local header names 'b%.npy'" },
    { "a longer name", { "a.npy", a, lname = "a.npyy" }, "its local header names 'a%.npyy'" },
    { "another method", { "a.npy", a, lmethod = 8 }, "its local header says method 8, the central directory 0" },
    { "another size", { "a.npy", a, lsize = #a - 1 }, "its local header says " .. (#a - 1) .. " bytes" },
    { "another CRC", { "a.npy", a, lcrc = 7 }, "its local header's CRC%-32" },
    { "extra field past the directory", { "a.npy", a, lextra = 4000 }, "its data runs into the central directory" },
    { "zip64 sizes missing", { "a.npy", a, lsize = 0xFFFFFFFF }, "bad zip64 extra field in its local header" },
  }
  for _, c in ipairs(cases) do
    local p = file(zip({ c[2] }))
    for _, map in ipairs { true, false } do
      T.raises_at(function() gpu.load_npz(p, { map = map }) end,
        "load_npz: " .. pattern(p) .. ": member 'a%.npy': " .. c[3], c[1] .. " (map = " .. tostring(map) .. ")")
    end
  end
  -- data descriptors (zeros in the local header) and zip64 local headers agree
  for _, m in ipairs { { "a.npy", a, dd = true }, { "a.npy", a, zip64 = true }, { "a.npy", a, pad = 9 } } do
    T.is(gpu.load_npz(file(zip({ m }))).a:totable(), { 1, 2, 3 }, "a local header that agrees")
  end
end)

T.test("npz: truncated, overlapping and lying archives get clear errors, never a read past the end", function()
  local a = npy_bytes(gpu.arange(64, { dtype = "f64" }))
  local good = zip({ { "a.npy", a } })
  local lying = a:gsub("'shape': %(64,%)", "'shape': (99,)")
  local cases = {
    { "truncated", good:sub(1, #good - 30), "not a zip archive" },
    { "a local header past the end", zip({ { "a.npy", a, lho = 0xFFFFFFF0 } }), "does not lie before the central directory" },
    { "overlapping members", zip({ { "a.npy", a }, { "b.npy", a, lho = 0 } }), "members 'a%.npy' and 'b%.npy' overlap" },
    { "members overlapping by a byte", zip({ { "a.npy", a }, { "b.npy", a, lho = 35 + #a - 1 } }),
      "members 'a%.npy' and 'b%.npy' overlap" },
    { "a .npy header that claims more", zip({ { "a.npy", lying } }), "member 'a%.npy': truncated data" },
    { "a .npy header that claims less", zip({ { "a.npy", a .. "12345678" } }), "member 'a%.npy': the header does not match" },
  }
  for _, c in ipairs(cases) do
    local p = file(c[2])
    for _, map in ipairs { true, false } do
      T.raises_at(function() gpu.load_npz(p, { map = map }) end, "load_npz: " .. pattern(p) .. ": .-" .. c[3],
        c[1] .. " (map = " .. tostring(map) .. ")")
    end
  end
end)

T.test("npz: after an awaited load the file may be deleted, replaced or rewritten", function()
  local p = tmppath()
  gpu.save_npz(p, { x = gpu.arange(5000, { dtype = "f32" }) })
  local s <close> = gpu.stream()
  gpu.sleep(100, { stream = s })
  local t = gpu.load_npz(p, { stream = s })
  -- replaced while the copy waits: the mapping still holds the old file
  gpu.save_npz(p, { x = gpu.zeros({ 5000 }, { dtype = "f32" }) })
  s:synchronize()
  T.is(t.x:sum():item(), 5000 * 4999 / 2, "replaced (renamed over) while the copy waits")
  -- rewritten in place, then truncated, once the copy is done
  local u = gpu.load_npz(p, { stream = s })
  gpu.await(s)
  local f = assert(io.open(p, "r+b"))
  f:seek("set", 200)
  f:write(string.rep("\255", 4000))
  f:close()
  T.is(u.x:sum():item(), 0.0, "rewritten in place after the copy")
  io.open(p, "wb"):close()
  os.remove(p)
  T.is({ t.x:get(5000), u.x:get(5000) }, { 4999.0, 0.0 }, "truncated and deleted after")
end)

T.test("npz: loads in a loop leave no mapping and no buffer behind", function()
  local p = tmppath()
  gpu.save_npz(p, { a = gpu.arange(1024), b = gpu.ones({ 3 }, { dtype = "i32" }) })
  collectgarbage()
  gpu.synchronize()
  local before = gpu.stats().buffers
  local s <close> = gpu.stream()
  for i = 1, 200 do
    if i % 50 == 1 then gpu.sleep(5, { stream = s }) end
    local ts = gpu.load_npz(p, { stream = s, names = i % 2 == 0 and { "b" } or nil })
    for _, t in pairs(ts) do t:close() end
  end
  s:synchronize()
  gpu.synchronize()
  collectgarbage()
  T.is(gpu.stats().buffers, before, "every tensor and mapping is released")
  local maps = mappings(p)
  if maps then T.is(maps, {}, "no mapping of the file stays") end
end)

T.test("npz: the race checker sees a byte-copied member's copy as writing the whole tensor", function()
  local p = tmppath()
  -- x's elements start at an odd offset: its copy is a byte copy
  gpu.save_npz(p, { x = gpu.arange(5000, { dtype = "f64" }) })
  gpu.check_races(true)
  local s <close> = gpu.stream { nonblocking = true }
  gpu.sleep(20, { stream = s })
  local t = gpu.load_npz(p, { stream = s })
  local ok, err = pcall(function() return t.x + 1 end)
  s:synchronize()
  gpu.check_races(false)
  T.ok(not ok and tostring(err):find("race: 'add' on the default stream", 1, true) ~= nil,
    "a use without waiting for the copy is a race: " .. tostring(err):sub(1, 120))
  T.is(t.x:get(5000), 4999.0, "the values, once waited for")
end)

T.test("gpu.load: unaligned elements are mapped too, copied as bytes", function()
  local n = 1 << 16
  local dict = string.format("{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n)
  dict = dict .. string.rep(" ", 10 - (10 + #dict + 1) % 8 + 1) .. "\n"   -- 10 + #dict is odd
  local vals = {}
  for i = 1, n do vals[i] = string.pack("<i4", i - 1) end
  local p = file("\x93NUMPY\1\0" .. string.pack("<I2", #dict) .. dict .. table.concat(vals))
  T.is((10 + #dict) % 2, 1, "the elements start at an odd offset")
  local s <close> = gpu.stream()
  gpu.sleep(100, { stream = s })
  local t = gpu.load(p, { stream = s })
  local maps = mappings(p)
  if maps then T.ok(#maps >= 1, "mapped while the copy waits") end
  s:synchronize()
  T.is({ t.dtype, t:get(1), t:get(n), t:sum():item() }, { "i32", 0, n - 1, n * (n - 1) // 2 }, "the values")
end)

for _, p in ipairs(files) do os.remove(p) end
T.done()
