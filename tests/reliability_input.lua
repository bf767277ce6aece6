-- Reliability on hostile input (issue 21, items 1 and 6): special files
-- neither block nor grow memory, embedded zero bytes are not read as a
-- shorter string, environment values are parsed strictly, user integers are
-- range-checked before they become C ints, and no undefined behaviour on an
-- empty trace.  What could hang runs in a child under `timeout`, so a
-- regression fails its test instead of stalling the suite.
local gpu = require "gpu"
local T = require "gpu.test"

local HANG = 60                          -- seconds before a stuck child is called stuck
local SANITIZED = os.getenv("GPULUA_SANITIZE") == "1"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Run code in a child gpulua (env: words before the command, such as
-- "GPULUA_DEVICE=host"); its output (stdout and stderr) and exit status.
local function child(env, code, limits)
  local script = T.tmpfile(code)
  local out, status = T.sh(string.format("%s %s timeout -k 5 %d %s %s 2>&1", limits or "", env or "", HANG,
                                         T.gpulua, q(script)))
  os.remove(script)
  return out, status
end

-- A new named pipe; its path.
local function fifo()
  local name = os.tmpname()
  os.remove(name)
  local _, st = T.sh("mkfifo " .. q(name))
  assert(st == 0, "mkfifo failed")
  return name
end

-- The bytes of a .npy file whose header dict is `dict` (version 1.0, 64-byte aligned).
local function npy(dict, data)
  local pad = (64 - (10 + #dict + 1) % 64) % 64
  local header = dict .. string.rep(" ", pad) .. "\n"
  return "\x93NUMPY\1\0" .. string.pack("<I2", #header) .. header .. data
end

-- ---- item 1: special files ------------------------------------------------

T.test("gpu.load on a FIFO raises at once instead of blocking", function()
  local p = fifo()
  local out, st = child("GPULUA_DEVICE=host", string.format([[
    local ok, err = pcall(gpu.load, %q)
    print(ok, err)
  ]], p))
  os.remove(p)
  T.isnt(st, 124, "the child did not hang (exit status " .. st .. ")")
  T.ok(out:find("false", 1, true) and out:find("not a regular file", 1, true),
       "the error says it is not a regular file: " .. out)
end)

T.test("gpu.load on other special files raises", function()
  T.raises_at(function() gpu.load("/dev/zero") end, "not a regular file", "/dev/zero")
  T.raises_at(function() gpu.load("/dev/null") end, "not a regular file", "/dev/null")
  T.raises_at(function() gpu.load("/") end, "not a regular file", "a directory")
end)

T.test("host backend: gpu.load_module says it needs cuda before reading anything", function()
  local p = fifo()
  local code = [[
    local function try(x) local ok, err = pcall(gpu.load_module, x); print(ok, err) end
    try(%q)
  ]]
  local out, st = child("GPULUA_DEVICE=host", string.format(code, p))
  T.isnt(st, 124, "a FIFO: the child did not hang")
  T.ok(out:find("need the cuda backend", 1, true), "a FIFO: the backend's error: " .. out)
  os.remove(p)
  -- without a sanitizer, a child that reads /dev/zero for ever stops at 1 GB
  -- (not where the parent has a GPU: the CUDA runtime in the binary then
  -- hangs at exit under that limit, H200 2026-11-24)
  out, st = child("GPULUA_DEVICE=host", string.format(code, "/dev/zero"),
                  not SANITIZED and gpu.backend == "host" and "ulimit -v 1000000;" or nil)
  T.isnt(st, 124, "/dev/zero: the child did not hang")
  T.ok(out:find("need the cuda backend", 1, true), "/dev/zero: the backend's error: " .. out)
  out = child("GPULUA_DEVICE=host", string.format(code, "/nonexistent/k.ptx"))
  T.ok(out:find("need the cuda backend", 1, true), "a missing file: the backend's error: " .. out)
  -- PTX text is not a path, even when it lacks .version and .target
  out = child("GPULUA_DEVICE=host", string.format(code, "//\n.visible .entry k()\n{\n  ret;\n}\n"))
  T.ok(out:find("need the cuda backend", 1, true) and not out:find("cannot open", 1, true),
       "PTX text: the backend's error, not 'cannot open': " .. out)
end)

T.test("gpu.load_module: a string with a zero byte is neither an image nor a path", function()
  T.raises_at(function() gpu.load_module("k.ptx\0junk") end, "zero byte", "a path with a zero byte")
end)

T.test("cuda backend: gpu.load_module reads regular files only", function()
  if gpu.backend ~= "cuda" then return T.skip("special files on cuda", "not the cuda backend") end
  local p = fifo()
  local code = [[
    local function try(x) local ok, err = pcall(gpu.load_module, x); print(ok, err) end
    try(%q)
    -- every failed load closes its file: 400 of them fit under 'ulimit -n 256'
    for i = 1, 400 do assert(not pcall(gpu.load_module, %q)) end
    try("/dev/null")
    try("//\n.visible .entry k()\n{\n  ret;\n}\n")
  ]]
  local out, st = child("", string.format(code, p, p), "ulimit -n 256;")
  os.remove(p)
  T.isnt(st, 124, "a FIFO: the child did not hang")
  T.ok(select(2, out:gsub("not a regular file", "")) == 2, "FIFO and /dev/null are not regular files: " .. out)
  T.ok(not out:find("open files", 1, true), "no descriptor leaked: " .. out)
  T.ok(out:find("nor a file", 1, true), "PTX-like text is not taken for a path: " .. out)
  out, st = child("", string.format(code, "/dev/zero", "/dev/zero"), "ulimit -n 256;")
  T.isnt(st, 124, "/dev/zero: the child did not hang")
  T.ok(out:find("not a regular file", 1, true), "/dev/zero is not a regular file: " .. out)
end)

-- ---- item 6: undefined behaviour and bad parsing ----------------------------

T.test("an empty trace: no qsort on NULL", function()
  -- in a child: under UBSan the error stops that process, not this test file
  local out, st = child("", [[
    gpu.trace.start(); gpu.trace.stop(); print("events", #gpu.trace.events())
  ]])
  T.is(st, 0, "exits 0")
  T.ok(out:find("events\t0", 1, true) and not out:find("runtime error", 1, true), "no events, no UB: " .. out)
end)

local function total_with(value)
  local out, st = child("GPULUA_DEVICE=host GPULUA_HOST_MEMORY=" .. q(value),
                        "print('total', gpu.device_info(0).total_memory)")
  return tonumber(out:match("total\t(%d+)")), st, out
end

T.test("GPULUA_HOST_MEMORY: a positive size with an optional K, M, G or T suffix", function()
  for _, c in ipairs {
    { "123", 123 }, { "512k", 512 << 10 }, { "512K", 512 << 10 }, { "1.5M", 3 << 19 }, { "8G", 8 << 30 },
    { "8g", 8 << 30 }, { "2T", 2 << 40 }, { "0.5T", 1 << 39 },
  } do
    local total, st, out = total_with(c[1])
    T.is(total, c[2], "GPULUA_HOST_MEMORY=" .. c[1] .. " is " .. c[2] .. " bytes " .. (st ~= 0 and out or ""))
  end
end)

T.test("GPULUA_HOST_MEMORY: anything else stops start-up naming the variable and the value", function()
  for _, v in ipairs { "inf", "nan", "1e30", "99999999999999999999T", "lots", "-5G", "0", "0.1",
                       "8GB", "8G ", " 8G", "8 G", "0x10", "16E", "1e400", "8GG", "." } do
    local total, st, out = total_with(v)
    T.ok(total == nil and st ~= 0 and st ~= 124 and out:find("GPULUA_HOST_MEMORY='" .. v .. "'", 1, true),
         "GPULUA_HOST_MEMORY=" .. v .. " is refused: " .. out)
  end
end)

T.test("GPULUA_COMM_TIMEOUT: a positive number of seconds, else a clear error", function()
  local code = "local t = gpu.ones({4}); gpu.all_reduce(t); print('sum', t:sum():item())"
  for _, v in ipairs { "100", "2.5", "1e3" } do
    local out = child("GPULUA_DEVICE=host GPULUA_COMM_TIMEOUT=" .. v, code)
    T.ok(out:find("sum\t4.0", 1, true), "GPULUA_COMM_TIMEOUT=" .. v .. " is accepted: " .. out)
  end
  for _, v in ipairs { "soon", "-5", "0", "inf", "nan", "10s", "1e400", " 10", "0x10" } do
    local out, st = child("GPULUA_DEVICE=host GPULUA_COMM_TIMEOUT=" .. q(v), code)
    T.ok(st ~= 0 and out:find("GPULUA_COMM_TIMEOUT='" .. v .. "'", 1, true),
         "GPULUA_COMM_TIMEOUT=" .. v .. " is refused: " .. out)
  end
end)

T.test("gpu.set_device and gpu.device_info range-check before any int cast", function()
  local n = gpu.device_count()
  for _, v in ipairs { 2 ^ 32, -(2 ^ 32), math.maxinteger, math.mininteger, (1 << 32) + n } do
    T.raises_at(function() gpu.set_device(v) end, "out of range", "set_device(" .. string.format("%.0f", v) .. ")")
    T.raises_at(function() gpu.device_info(v) end, "out of range", "device_info(" .. string.format("%.0f", v) .. ")")
  end
  gpu.set_device(0)
  T.is(gpu.device_info(0).index, 0, "device 0 still works")
end)

T.test("names with a zero byte are not read as their prefix", function()
  T.raises_at(function() gpu.zeros({2}, { dtype = "f32\0junk" }) end, "dtype", "zeros dtype")
  T.raises_at(function() gpu.tensor({ 1, 2 }, { dtype = "i32\0" }) end, "dtype", "tensor dtype")
  T.raises_at(function() gpu.zeros({2}, { device = "host\0x" }) end, "device", "zeros device")
  local t <close> = gpu.ones({2})
  T.raises_at(function() t:to("f64\0x") end, "unknown device or dtype", "t:to(dtype)")
  T.raises_at(function() t:to("host\0x") end, "unknown device or dtype", "t:to(device)")
  T.raises_at(function() t:to { dtype = "f64\0x" } end, "dtype", "t:to{dtype}")
  T.raises_at(function() t:to { device = "pinned\0x" } end, "device", "t:to{device}")
  local path = os.tmpname()
  t:save(path)
  T.raises_at(function() gpu.load(path, { device = "host\0x" }) end, "device", "gpu.load device")
  os.remove(path)
  local ok, err = pcall(gpu.zeros, {2}, { dtype = "f32\0junk" })
  T.ok(not ok and err:find("f32\\0", 1, true), "the message shows the zero byte: " .. tostring(err))
end)

T.test(".npy: a path or a descr with a zero byte is refused", function()
  local path = os.tmpname()
  local t <close> = gpu.tensor({ 1, 2 })
  t:save(path)
  T.is(gpu.load(path):totable(), { 1, 2 }, "the file loads")
  T.raises_at(function() gpu.load(path .. "\0junk") end, "zero byte", "gpu.load(path .. '\\0junk')")
  local other = path .. ".other"
  T.raises_at(function() t:save(other .. "\0junk") end, "zero byte", "t:save(path .. '\\0junk')")
  T.is(T.readfile(other), nil, "and nothing was written at the prefix")
  os.remove(other)
  local data = string.pack("<f<f", 1, 2)
  local f = assert(io.open(path, "wb"))
  f:write(npy("{'descr': '<f4\0junk', 'fortran_order': False, 'shape': (2,), }", data))
  f:close()
  T.raises_at(function() gpu.load(path) end, "zero byte", "a descr with a zero byte")
  f = assert(io.open(path, "wb"))
  f:write(npy("{'descr\0': '<f4', 'fortran_order': False, 'shape': (2,), }", data))
  f:close()
  T.raises_at(function() gpu.load(path) end, "zero byte", "a key with a zero byte")
  os.remove(path)
end)

T.test("device names: cuda:N takes digits only", function()
  for _, d in ipairs { "cuda:-0", "cuda:+0", "cuda: 0", "cuda:0x0", "cuda:" } do
    local out, st = T.sh(string.format("GPULUA_DEVICE=%s %s -e 'print(gpu.backend)' 2>&1", q(d), T.gpulua))
    T.ok(st ~= 0 and out:find("unknown device GPULUA_DEVICE='" .. d .. "'", 1, true), "GPULUA_DEVICE=" .. d .. ": " .. out)
    out, st = T.sh(string.format("%s --device %s -e 'print(gpu.backend)' 2>&1", T.gpulua, q(d)))
    T.ok(st ~= 0 and out:find("unknown device '" .. d .. "'", 1, true), "--device " .. d .. ": " .. out)
    T.raises_at(function() gpu.zeros({2}, { device = d }) end, "unknown device", "zeros device = " .. d)
    T.raises_at(function() gpu.ones({2}):to(d) end, "unknown device or dtype", "t:to('" .. d .. "')")
    local path = os.tmpname()
    gpu.ones({2}):save(path)
    T.raises_at(function() gpu.load(path, { device = d }) end, "device", "gpu.load device = " .. d)
    os.remove(path)
  end
  local z <close> = gpu.zeros({2}, { device = "cuda:0" })
  T.is(z.device, "device", "cuda:0 is still the device")
end)

-- Issue 35, item 12: char * takes any tensor (as the docs say); short * one
-- of 2-byte elements, and the message says so the same way every run (it
-- passed a string to %d).
T.test("kernel parameters: char * takes any dtype, short * 2-byte elements", function()
  local ok, m = pcall(gpu.compile, [[
extern "C" __global__ void bytes(char *p, int n) { if (threadIdx.x < n) p[threadIdx.x] = 0; }
extern "C" __global__ void halves(short *p) { p[0] = 0; }
]])
  if not ok then return T.skip("char * and short *", "no compiler: " .. tostring(m)) end
  local x = gpu.ones({4})
  m.bytes { grid = 1, block = 8 } (x, 4)                 -- zeroes the first 4 bytes: x[1] = 0
  T.is(x:totable(), { 0, 1, 1, 1 }, "char * of an f32 tensor: a view of its bytes")
  local h = gpu.ones({2}, { dtype = "f16" })
  m.halves { grid = 1, block = 1 } (h)
  T.is(h:totable(), { 0, 1 }, "short * of an f16 tensor")
  local msgs = {}
  for i = 1, 2 do
    local _, err = pcall(function() m.halves { grid = 1, block = 1 } (gpu.ones({2})) end)
    msgs[i] = tostring(err)
  end
  T.ok(msgs[1]:find("expected a tensor of 2%-byte elements, got f32") ~= nil, "short * of f32: " .. msgs[1])
  T.is(msgs[2], msgs[1], "the same message every time")
end)

-- Issue 35, item 11: the tables of an empty tensor count, not only its values.
T.test("totable of a zero-sized tensor: as many tables as gpu.tensor takes values", function()
  local out = child("GPULUA_DEVICE=host", [[
local ok, err = pcall(function() return gpu.zeros({3, 2^31, 0}):totable() end)
print(ok, err)
local t = gpu.zeros({2^20, 2^11, 0})
ok, err = pcall(function() return t:totable() end)
print(ok, err)
]], not SANITIZED and "ulimit -v 2000000;" or nil)
  T.ok(out:find("false\t[^\n]*:1: totable: too large for tables: over 2147483648 tables") ~= nil,
       "{3, 2^31, 0}: refused with the script line, the count of tables: " .. out)
  T.ok(out:find("false\t[^\n]*:4: totable: too large for tables") ~= nil,
       "{2^20, 2^11, 0}: 2^31 + 2^20 + 1 tables, refused: " .. out)
  T.is(gpu.zeros({0, 2^40}):totable(), {}, "{0, 2^40}: one empty table")
  T.is(gpu.zeros({2, 0}):totable(), { {}, {} }, "{2, 0}: two empty tables")
  T.is(gpu.zeros({1, 3, 0}):totable(), { { {}, {}, {} } }, "{1, 3, 0}")
  T.is(#gpu.zeros({2^10, 2^10, 0}):totable(), 2^10, "2^20 + 2^10 + 1 tables are built")
end)

-- Issue 35, item 16: arange's dtype and range, the generator's bounds.
T.test("arange: bool refused, integers that do not fit the dtype raise", function()
  T.raises_at(function() gpu.arange(5, { dtype = "bool" }) end, "option 'dtype' %(arange cannot make bool", "bool")
  T.raises_at(function() gpu.arange(120, 130, { dtype = "i8" }) end, "#2 to 'arange' %(the range reaches 129, " ..
              "which does not fit in i8", "i8 past 127")
  T.raises_at(function() gpu.arange(200, 0, -1, { dtype = "i8" }) end, "#1 to 'arange' %(200 does not fit in i8",
              "an i8 start past 127")
  T.raises_at(function() gpu.arange(0, 1000, { dtype = "u8" }) end, "999, which does not fit in u8", "u8 past 255")
  T.raises_at(function() gpu.arange(-1, 3, { dtype = "u8" }) end, "%-1 does not fit in u8", "u8 below 0")
  T.raises_at(function() gpu.arange(0, (1 << 31) + 2, 1 << 30, { dtype = "i32" }) end, "#2 to 'arange' %(the range reaches " ..
              "2147483648, which does not fit in i32", "i32 past 2^31 - 1")
  T.is(gpu.arange(120, 128, { dtype = "i8" }):totable(), { 120, 121, 122, 123, 124, 125, 126, 127 }, "i8 up to 127")
  T.is(gpu.arange(-128, -126, { dtype = "i8" }):totable(), { -128, -127 }, "i8 from -128")
  T.is(gpu.arange(255, 0, -100, { dtype = "u8" }):totable(), { 255, 155, 55 }, "u8 downwards")
  T.is(gpu.arange(300, 300, { dtype = "u8" }):totable(), {}, "an empty range makes no value")
  T.is(gpu.arange(0, 1000, { dtype = "f16" }):numel(), 1000, "float dtypes round, as full does")
end)

T.test("rand, randn: bounds that are not finite numbers raise", function()
  local nan, inf = 0 / 0, math.huge
  T.raises_at(function() gpu.randn({3}, { mean = nan }) end, "option 'mean' %(must be a finite number, got nan",
              "randn mean = nan")
  T.raises_at(function() gpu.randn({3}, { mean = inf }) end, "option 'mean' %(must be a finite number, got inf",
              "randn mean = inf")
  T.raises_at(function() gpu.randn({3}, { std = nan }) end, "option 'std' %(must be a finite number", "randn std = nan")
  T.raises_at(function() gpu.randn({3}, { std = inf }) end, "option 'std' %(must be a finite number", "randn std = inf")
  T.raises_at(function() gpu.rand({3}, { low = -inf }) end, "option 'low' %(must be a finite number", "rand low = -inf")
  T.raises_at(function() gpu.rand({3}, { high = inf }) end, "option 'high' %(must be a finite number", "rand high = inf")
  T.raises_at(function() gpu.rand({3}, { low = nan }) end, "option 'low' %(must be a finite number", "rand low = nan")
  T.raises_at(function() gpu.rand({3}, { high = 2, low = 2 }) end, "greater than 'low'", "an empty interval")
  T.is(gpu.randn({1}, { mean = 5, std = 0 }):item(), 5.0, "std = 0 gives the mean")
  T.is(gpu.full({2}, 0 / 0):totable()[1] ~= gpu.full({2}, 0 / 0):totable()[1], true,
       "full still takes nan (a value, as NumPy)")
end)


-- Issue 35, item 13: every string handed on to C as a C string refuses a zero
-- byte (one helper), instead of being read as its prefix.
T.test("strings with a zero byte: names, options, paths refused", function()
  local src = [[extern "C" __global__ void k(float *x) { x[0] = 1; }]]
  T.raises_at(function() gpu.compile(src, { name = "a\0b.cu" }) end, "option 'name' %(a string with a zero byte",
              "gpu.compile name")
  T.raises_at(function() gpu.compile(src, { options = { "-DX=1\0-DY=2" } }) end,
              "option 'options' %(item 1: a string with a zero byte", "gpu.compile options")
  T.raises_at(function() gpu.load_module("x.ptx", { declare = "void k(float *x);\0junk" }) end,
              "option 'declare' %(a string with a zero byte", "gpu.load_module declare")
  T.raises_at(function() gpu.range("a\0b") end, "#1 to 'range' %(a string with a zero byte", "gpu.range name")
  T.raises_at(function() gpu.sync_debug("warn\0x") end, "#1 to 'sync_debug' %(a string with a zero byte",
              "gpu.sync_debug mode")
  T.raises_at(function() local _ <close> = gpu.nosync("warn\0x") end, "a string with a zero byte", "gpu.nosync mode")
  T.raises_at(function() gpu.isatty("stdin\0x") end, "a string with a zero byte", "gpu.isatty")
  T.raises_at(function() gpu.graph(function() end, { name = "g\0x" }) end, "option 'name' %(a string with a zero byte",
              "gpu.graph name")
  T.raises_at(function() gpu.all_reduce(gpu.ones({2}), { op = "sum\0x" }) end, "zero byte", "all_reduce op")
  local trace = require "gpu.trace"
  T.raises_at(function() trace.write("a\0b.json") end, "#1 to 'write' %(a string with a zero byte", "trace.write path")
  T.raises_at(function() trace.json("a\0b.json") end, "#1 to 'json' %(a string with a zero byte", "trace.json path")
  T.raises_at(function() trace.svg("a\0b.svg") end, "#1 to 'svg' %(a string with a zero byte", "trace.svg path")
  -- fields: a key with a zero byte is no field, not its prefix
  local s <close> = gpu.stream()
  local e <close> = gpu.event()
  local t <close> = gpu.ones({2})
  T.is(s["priority\0x"], nil, "s['priority\\0x'] is no field")
  T.is(e["timing\0x"], nil, "e['timing\\0x'] is no field")
  T.is(t["shape\0x"], nil, "t['shape\\0x'] is no field")
  local ok = pcall(function() return gpu.compile(src).k end)
  if ok then
    local k = gpu.compile(src).k
    T.raises(function() return k["name\0x"] end, "has no field 'name\\0...'", "k['name\\0x'] is no field")
  else
    T.skip("kernel fields", "no compiler")
  end
end)

T.done()
