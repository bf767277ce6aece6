-- Tensor files beside .npy: safetensors (gpu.load_safetensors and
-- gpu.save_safetensors).  The files read here are built byte for byte from
-- the published format: the header's length (u64 little-endian), the JSON
-- header, the byte buffer.  NumPy (a python3 child) is the oracle for the
-- round trips; the safetensors package too, where it is installed.
local gpu = require "gpu"
local T = require "gpu.test"
local N = dofile("tests/numpy/oracle.lua")

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

local function pack(fmt, values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = string.pack(fmt, v) end
  return table.concat(parts)
end

-- A safetensors file: header text and buffer, as given (hlen: a length field that lies).
local function st(header, buffer, hlen)
  return string.pack("<I8", hlen or #header) .. header .. (buffer or "")
end

-- A header for {name, dtype, shape (a JSON list), begin, end}, ... in that order.
local function header(entries, meta)
  local parts = {}
  if meta then parts[#parts + 1] = '"__metadata__":' .. meta end
  for _, e in ipairs(entries) do
    parts[#parts + 1] = string.format('"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}', e[1], e[2], e[3],
      e[4], e[5])
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- every dtype: our name, the format's, string.pack format of the stored
-- bits, stored values, values a load gives back (f16/bf16 bits as integers)
local DT = {
  { "f32", "F32", "<f", { 1.5, -2.25, 1e6 }, { 1.5, -2.25, 1e6 } },
  { "f64", "F64", "<d", { 1.5, -2.25, 1e300 }, { 1.5, -2.25, 1e300 } },
  { "f16", "F16", "<I2", { 0x3E00, 0xC080, 0x7BFF }, { 1.5, -2.25, 65504.0 } },
  { "bf16", "BF16", "<I2", { 0x3FC0, 0xC010, 0x4780 }, { 1.5, -2.25, 65536.0 } },
  { "i8", "I8", "<i1", { -128, 0, 127 }, { -128, 0, 127 } },
  { "u8", "U8", "<I1", { 0, 200, 255 }, { 0, 200, 255 } },
  { "i32", "I32", "<i4", { -2147483648, 7, 2147483647 }, { -2147483648, 7, 2147483647 } },
  { "i64", "I64", "<i8", { math.mininteger, 7, math.maxinteger }, { math.mininteger, 7, math.maxinteger } },
  { "bool", "BOOL", "B", { 1, 0, 1 }, { true, false, true } },
}

T.test("safetensors: every dtype loads to device, pinned and host; the metadata table", function()
  local entries, buf, at = {}, {}, 0
  for _, d in ipairs(DT) do
    local bytes = pack(d[3], d[4])
    entries[#entries + 1] = { d[1], d[2], "[3]", at, at + #bytes }
    buf[#buf + 1] = bytes
    at = at + #bytes
  end
  local p = file(st(header(entries, '{"format":"pt","note":"caf\\u00e9 \\"q\\""}'), table.concat(buf)))
  for _, dev in ipairs { "device", "pinned", "host" } do
    local ts, meta = gpu.load_safetensors(p, { device = dev })
    T.is(meta, { format = "pt", note = 'café "q"' }, "metadata, JSON escapes decoded (" .. dev .. ")")
    for _, d in ipairs(DT) do
      local t = ts[d[1]]
      T.is({ t.dtype, t.shape, t.device, t:totable() }, { d[1], { 3 }, dev, d[5] }, d[2] .. " -> " .. dev)
    end
  end
end)

T.test("safetensors: 0-dim, empty and 3-D tensors; no metadata gives an empty table; white space", function()
  local hdr = header({ { "s", "F64", "[]", 0, 8 }, { "e", "F32", "[0, 3]", 8, 8 }, { "e2", "I32", "[0]", 8, 8 },
    { "c", "I32", "[2,1,2]", 8, 24 } }) .. "   "
  local p = file(st(hdr, string.pack("<d", 2.5) .. pack("<i4", { 1, 2, 3, 4 })))
  local ts, meta = gpu.load_safetensors(p)
  T.is(meta, {}, "no __metadata__: {}")
  T.is({ ts.s.shape, ts.s:item() }, { {}, 2.5 }, "0-dim")
  T.is({ ts.e.shape, ts.e.dtype, ts.e2.shape }, { { 0, 3 }, "f32", { 0 } }, "empty")
  T.is(ts.c:totable(), { { { 1, 2 } }, { { 3, 4 } } }, "3-D in C order")
  local none = file(st("{}", ""))
  local t0, m0 = gpu.load_safetensors(none)
  T.is({ next(t0), next(m0) }, {}, "an empty file of tensors")
end)

T.test("safetensors: a selection reads only the tensors named", function()
  local hdr = header({ { "a", "F32", "[2]", 0, 8 }, { "b", "F32", "[1]", 8, 12 } })
  local p = file(st(hdr, pack("<f", { 1, 2, 3 })))
  local ts = gpu.load_safetensors(p, { names = { "b" }, device = "host" })
  T.is({ ts.a, ts.b:totable() }, { nil, { 3 } }, "only b")
  T.is(gpu.load_safetensors(p, { names = {} }), {}, "an empty selection")
  T.raises_at(function() gpu.load_safetensors(p, { names = { "b", "zz" } }) end,
    "load_safetensors: .*: no tensor 'zz' in the file %(it has 'a', 'b'%)", "an unknown name")
  T.raises_at(function() gpu.load_safetensors(p, { names = "a" }) end,
    "bad option 'names' %(a table of tensor names expected, got string%)", "names is a table")
  T.raises_at(function() gpu.load_safetensors(p, { names = { 1 } }) end,
    "bad option 'names' %(item 1 is a number", "names are strings")
  T.raises_at(function() gpu.load_safetensors(p, { nmes = {} }) end, "unknown option 'nmes'", "a misspelt option")
end)

-- The mappings of path in this process (/proc/self/maps): a list of their
-- sizes in bytes; nil where /proc is not there
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

-- Bytes this process has read through read(2) and the like (/proc/self/io's
-- rchar); nil without /proc
local function rchar()
  local f = io.open("/proc/self/io")
  if not f then return nil end
  local n = f:read("a"):match("rchar:%s*(%d+)")
  f:close()
  return tonumber(n)
end

-- a file of tensors "a" (n f32 values i), "b" (4 i32, 10..13) and "c" (n
-- f32, garbage unless given), data aligned as the safetensors package does
local function three(n, cbytes)
  local hdr = header({ { "a", "F32", "[" .. n .. "]", 0, 4 * n }, { "b", "I32", "[4]", 4 * n, 4 * n + 16 },
    { "c", "F32", "[" .. n .. "]", 4 * n + 16, 8 * n + 16 } })
  hdr = hdr .. string.rep(" ", (8 - #hdr % 8) % 8)
  local a = {}
  for i = 1, n do a[i] = string.pack("<f", i) end
  return st(hdr, table.concat(a) .. pack("<i4", { 10, 11, 12, 13 }) .. (cbytes or string.rep("\xff", 4 * n)))
end

T.test("safetensors: the file is mapped and the copies queued; the call returns before them", function()
  local n = 1 << 20
  local p = file(three(n))
  local s <close> = gpu.stream()
  gpu.sleep(200, { stream = s })   -- the copies queue behind it
  local r0 = rchar()
  local ts = gpu.load_safetensors(p, { stream = s })
  local read = r0 and rchar() - r0
  local maps = mappings(p)
  if maps then
    T.ok(#maps >= 1, "while the copies wait, the file is mapped")
  end
  if read then T.ok(read < n, string.format("the elements are mapped, not read: %d bytes read for 8 MiB", read)) end
  os.remove(p)                      -- the mapping outlives the path
  s:synchronize()
  T.is({ ts.a:get(1), ts.a:get(n), ts.a:sum():item() }, { 1.0, n + 0.0, n * (n + 1) / 2 }, "a's values")
  T.is(ts.b:totable(), { 10, 11, 12, 13 }, "b's values")
  T.ok(ts.c:isnan():all():item(), "c's bytes, as they are (NaNs)")
  gpu.synchronize()                 -- a device call: the finished copies' mappings go
  if maps then T.is(mappings(p), {}, "once the copies are done, nothing stays mapped") end
end)

T.test("safetensors: a selection maps only its tensor's pages; the rest may be anything", function()
  local n = 1 << 20
  -- c's bytes do not exist: the file ends (sparse) with a hole where c is
  local p = tmppath()
  local f = assert(io.open(p, "wb"))
  f:write(three(n, ""))
  f:seek("set", #three(n, "") + 4 * n - 1)
  f:write("\0")
  f:close()
  local s <close> = gpu.stream()
  gpu.sleep(200, { stream = s })
  local ts = gpu.load_safetensors(p, { names = { "b" }, stream = s })
  local maps = mappings(p)
  if maps then
    local total = 0
    for _, m in ipairs(maps) do total = total + m end
    T.ok(#maps == 1 and total <= 2 * 65536, string.format("b alone is mapped: %d mapping(s), %d bytes", #maps, total))
  end
  s:synchronize()
  T.is({ ts.a, ts.c, ts.b:totable() }, { nil, nil, { 10, 11, 12, 13 } }, "only b, right")
  local one = gpu.load_safetensors(p, { names = { "a" } })
  T.is({ one.a:get(1), one.a:get(n) }, { 1.0, n + 0.0 }, "a on the default stream")
end)

T.test("safetensors: loads in a loop leave no mapping and no buffer behind", function()
  local p = file(three(1024))
  gpu.synchronize()
  local before = gpu.stats().buffers
  local s <close> = gpu.stream()
  for i = 1, 200 do
    if i % 50 == 1 then gpu.sleep(5, { stream = s }) end
    local ts = gpu.load_safetensors(p, { stream = s, names = i % 2 == 0 and { "b" } or nil })
    for _, t in pairs(ts) do t:close() end
  end
  s:synchronize()
  gpu.synchronize()
  collectgarbage()
  T.is(gpu.stats().buffers, before, "every tensor and mapping is released")
  local maps = mappings(p)
  if maps then T.is(maps, {}, "no mapping of the file stays") end
end)

T.test("safetensors: bools are read, unaligned elements mapped as bytes; pinned and host", function()
  local hdr = header({ { "x", "U8", "[1]", 0, 1 }, { "u", "I32", "[2]", 1, 9 }, { "k", "BOOL", "[3]", 9, 12 } })
  hdr = hdr .. string.rep(" ", (8 - #hdr % 8) % 8)
  local p = file(st(hdr, "\3" .. pack("<i4", { -5, 6 }) .. "\0\7\1"))
  local ts = gpu.load_safetensors(p)
  T.is({ ts.x:totable(), ts.u:totable(), ts.k:totable() }, { { 3 }, { -5, 6 }, { false, true, true } },
    "a u8, an unaligned i32, bools of any byte")
  local th = gpu.load_safetensors(p, { device = "host" })
  T.is(th.u:totable(), { -5, 6 }, "to the host")
end)

T.test("safetensors, gpu.load: map = false reads the file at the call instead", function()
  local n = 1 << 18
  local p = file(three(n))
  local r0 = rchar()
  local ts = gpu.load_safetensors(p, { map = false, names = { "a" } })
  local read = r0 and rchar() - r0
  if read then T.ok(read >= 4 * n, string.format("%d bytes read for a's %d", read, 4 * n)) end
  local maps = mappings(p)
  if maps then T.is(maps, {}, "nothing mapped") end
  T.is({ ts.a:get(1), ts.a:get(n) }, { 1.0, n + 0.0 }, "the values")
  local q = tmppath()
  gpu.arange(10):save(q)
  T.is(gpu.load(q, { map = false }):totable(), { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 }, "gpu.load too")
  T.raises_at(function() gpu.load_safetensors(p, { map = 1 }) end,
    "bad option 'map' to 'load_safetensors' %(boolean expected, got number%)", "map is a boolean")
  T.raises_at(function() gpu.load(q, { map = "no" }) end, "bad option 'map' to 'load' %(boolean expected, got string%)",
    "map is a boolean (gpu.load)")
end)

T.test("safetensors: a file shorter than its header says is refused before anything is read", function()
  local full = three(1024)
  local p = file(full:sub(1, #full - 1))
  T.raises_at(function() gpu.load_safetensors(p, { names = { "a" } }) end,
    "load_safetensors: .*: truncated data: tensor .c. ends at byte %d+ of the buffer", "even for a selection")
end)

T.test(".npy: gpu.load maps the elements and queues the copy too", function()
  local n = 1 << 18
  local src = gpu.arange(n, { dtype = "f64" })
  local p = tmppath()
  src:save(p)
  local s <close> = gpu.stream()
  gpu.sleep(200, { stream = s })
  local t = gpu.load(p, { stream = s })
  local maps = mappings(p)
  if maps then T.ok(#maps == 1, "mapped while the copy waits") end
  os.remove(p)
  s:synchronize()
  T.is({ t:get(1), t:get(n), t.dtype }, { 0.0, n - 1.0, "f64" }, "the values")
end)

T.test("safetensors: save writes the format; load reads it back, every dtype", function()
  local tensors = {}
  for _, d in ipairs(DT) do tensors[d[1]] = gpu.tensor(d[5], { dtype = d[1] }) end
  tensors.empty = gpu.zeros({ 0, 2 })
  tensors.scalar = gpu.tensor(3, { dtype = "i64" }):reshape({})
  tensors.view = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }):t()   -- not contiguous: saved in C order
  local p = tmppath()
  gpu.save_safetensors(p, tensors, { metadata = { format = "pt", ["k\"ey"] = "v\n" } })
  local raw = T.readfile(p)
  local n = string.unpack("<I8", raw)
  T.is(n % 8, 0, "the header is padded to a multiple of 8")
  local text = raw:sub(9, 8 + n)
  T.ok(text:find('"__metadata__":{"format":"pt","k\\"ey":"v\\u000a"}', 1, true), "the metadata, escaped")
  T.ok(text:find('"bool":{"dtype":"BOOL","shape":[3],"data_offsets":[6,9]}', 1, true), "an entry: " .. text:sub(1, 120))
  local ts, meta = gpu.load_safetensors(p)
  T.is(meta, { format = "pt", ["k\"ey"] = "v\n" }, "metadata back")
  for _, d in ipairs(DT) do T.is({ ts[d[1]].dtype, ts[d[1]]:totable() }, { d[1], d[5] }, d[2] .. " round trip") end
  T.is({ ts.empty.shape, ts.scalar.shape, ts.scalar:item() }, { { 0, 2 }, {}, 3 }, "empty and 0-dim back")
  T.is(ts.view:totable(), { { 1, 4 }, { 2, 5 }, { 3, 6 } }, "a transposed view, in C order")
end)

T.test("safetensors: bad arguments to save", function()
  local p = tmppath()
  local t = gpu.ones({ 2 })
  T.raises_at(function() gpu.save_safetensors(p, { [1] = t }) end, "a number key; tensors are named by strings", "a number key")
  T.raises_at(function() gpu.save_safetensors(p, { a = 3 }) end, "tensor 'a' is a number", "not a tensor")
  T.raises_at(function() gpu.save_safetensors(p, { __metadata__ = t }) end, "cannot be named '__metadata__'", "the reserved key")
  T.raises_at(function() gpu.save_safetensors(p, { a = t }, { metadata = { a = 1 } }) end,
    "keys and values must be strings", "metadata values are strings")
  T.raises_at(function() gpu.save_safetensors(p, { a = t }, { metadata = { a = "\xff" } }) end,
    "metadata value .* is not valid UTF%-8", "metadata is UTF-8")
  T.raises_at(function() gpu.save_safetensors("/nonexistent/dir/x.safetensors", { a = t }) end,
    "save_safetensors: cannot write /nonexistent/dir/x.safetensors", "an unwritable path")
end)

-- each bad file: name, bytes, the error expected after "load_safetensors: <path>: "
local function bad_cases()
  local ok_hdr = header({ { "a", "F32", "[2]", 0, 8 } })
  local data = pack("<f", { 1, 2 })
  return {
    { "empty file", "", "truncated %(0 bytes: no room for the header length%)" },
    { "7 bytes", "\1\0\0\0\0\0\0", "truncated %(7 bytes" },
    { "header length too large", string.pack("<I8", 1 << 40) .. "{}", "header length 1099511627776 is too large" },
    { "header truncated", st(ok_hdr, "", #ok_hdr + 100), "truncated header %(the header length says" },
    { "data truncated", st(ok_hdr, data:sub(1, 5)), "truncated data: tensor 'a' ends at byte 8 of the buffer, the file has 5" },
    { "trailing bytes", st(ok_hdr, data .. "xx"), "the tensors end at byte 8 of the buffer, the file has 10 %(trailing bytes%)" },
    { "bad JSON", st('{"a":{"dtype":"F32",}}', ""), "invalid JSON: expected '\"' at byte" },
    { "not an object", st('[1, 2]', ""), "invalid JSON: the header is not an object" },
    { "text after", st(ok_hdr .. "x", data), "text after the header's object" },
    { "a trailing comma", st('{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},}', data:sub(1, 4)), "invalid JSON" },
    { "a zero byte", st('{"a\0":1}', ""), "a control character in a string" },
    { "bad UTF-8", st('{"\xff":1}', ""), "invalid UTF%-8 in a string" },
    { "gap", st(header({ { "a", "F32", "[1]", 4, 8 } }), data), "tensor 'a': data_offsets %[4, 8%] leave a gap" },
    { "overlap", st(header({ { "a", "F32", "[2]", 0, 8 }, { "b", "F32", "[1]", 4, 8 } }), data),
      "data_offsets %[4, 8%] overlap the tensor before" },
    { "end before begin", st(header({ { "a", "F32", "[0]", 8, 0 } }), data), "end before they begin" },
    { "length vs shape", st(header({ { "a", "F32", "[3]", 0, 8 } }), data),
      "tensor 'a': data_offsets %[0, 8%] hold 8 bytes, its shape and dtype need 12" },
    { "huge shape", st(header({ { "a", "F32", "[4294967296, 4294967296]", 0, 8 } }), data), "tensor 'a': shape %[4294967296, 4294967296%] of F32 is too large" },
    { "negative size", st(header({ { "a", "F32", "[-2]", 0, 8 } }), data), "a negative number" },
    { "a fraction", st(header({ { "a", "F32", "[2.0]", 0, 8 } }), data), "expected an integer" },
    { "unsupported dtype", st(header({ { "a", "I16", "[4]", 0, 8 } }), data),
      "tensor 'a': unsupported dtype 'I16' %(gpulua has F64 F32 F16 BF16 I64 I32 I8 U8 BOOL%)" },
    { "unknown dtype", st(header({ { "a", "Q7", "[4]", 0, 8 } }), data), "tensor 'a': unknown dtype 'Q7'" },
    { "duplicate tensor", st(header({ { "a", "F32", "[1]", 0, 4 }, { "a", "F32", "[1]", 4, 8 } }), data),
      "duplicate tensor name 'a'" },
    { "duplicate field", st('{"a":{"dtype":"F32","dtype":"F32"}}', ""), "tensor 'a': duplicate key 'dtype'" },
    { "unexpected field", st('{"a":{"dtype":"F32","x":1}}', ""), "tensor 'a': unexpected key 'x'" },
    { "missing field", st('{"a":{"dtype":"F32","shape":[]}}', ""), "tensor 'a' has no 'data_offsets'" },
    { "duplicate metadata", st('{"__metadata__":{},"__metadata__":{}}', ""), "duplicate key '__metadata__'" },
    { "metadata not strings", st('{"__metadata__":{"a":1}}', ""), "a __metadata__ value is not a string" },
    { "too many dims", st(header({ { "a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4 } }), data:sub(1, 4)), "more than 8 dims" },
    { "deep nesting", st('{"a":' .. string.rep("[", 100) .. string.rep("]", 100) .. "}", ""), "expected '{'" },
    { "a .npy file", "\x93NUMPY\1\0" .. string.rep(" ", 40), "header length .* is too large" },
  }
end

T.test("safetensors: a bad file gets a clear error naming the file", function()
  for _, c in ipairs(bad_cases()) do
    local p = file(c[2])
    T.raises_at(function() gpu.load_safetensors(p) end, "load_safetensors: " .. p:gsub("%p", "%%%0") .. ": .-" .. c[3], c[1])
  end
  T.raises_at(function() gpu.load_safetensors("/nonexistent/dir/x.safetensors") end,
    "load_safetensors: cannot open /nonexistent/dir/x.safetensors: No such file", "a missing file")
  T.raises_at(function() gpu.load_safetensors("/tmp") end, "not a regular file %(a directory%)", "a directory")
  T.raises_at(function() gpu.load_safetensors("a\0b") end, "the path contains a zero byte", "a zero byte in the path")
end)

-- NumPy as the oracle: a python3 child writes a file from the format's
-- description (json + numpy.tobytes) and reads ours (json + numpy.frombuffer).
local PY = N.python()
T.test("safetensors: round trips with NumPy", function()
  if not PY then return T.skip("NumPy round trips", "no python3 with numpy found") end
  local ours, theirs = tmppath(), tmppath()
  gpu.save_safetensors(ours, { w = gpu.tensor({ { 1.5, -2 }, { 3, 4 } }, { dtype = "f64" }),
    b = gpu.tensor({ true, false }, { dtype = "bool" }), i = gpu.tensor({ -5, 6 }, { dtype = "i32" }),
    h = gpu.tensor({ 0.5, -1 }, { dtype = "bf16" }) }, { metadata = { who = "gpulua" } })
  local script = [==[
import json, struct, sys, numpy as np
ours, theirs = sys.argv[1], sys.argv[2]
raw = open(ours, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
h = json.loads(raw[8:8 + n])
buf = raw[8 + n:]
meta = h.pop('__metadata__')
assert meta == {'who': 'gpulua'}, meta
dt = {'F64': '<f8', 'F32': '<f4', 'I32': '<i4', 'BOOL': '?', 'BF16': '<u2'}
got = {k: np.frombuffer(buf[v['data_offsets'][0]:v['data_offsets'][1]], dtype=dt[v['dtype']]).reshape(v['shape'])
       for k, v in h.items()}
assert (got['w'] == np.array([[1.5, -2], [3, 4]])).all() and got['w'].shape == (2, 2)
assert (got['b'] == np.array([True, False])).all()
assert (got['i'] == np.array([-5, 6], dtype=np.int32)).all()
assert (got['h'] == np.array([0x3f00, 0xbf80], dtype=np.uint16)).all()
arrays = {'x': np.arange(6, dtype=np.float32).reshape(2, 3) / 4, 'y': np.array([7, -8], dtype=np.int64),
          'z': np.zeros((0,), dtype=np.float16), 'u': np.array(200, dtype=np.uint8)}
hdr, parts, at = {'__metadata__': {'src': 'numpy'}}, [], 0
for k in sorted(arrays, key=lambda k: -arrays[k].itemsize):
    a = arrays[k]
    b = a.tobytes()
    hdr[k] = {'dtype': {'f': 'F', 'i': 'I', 'u': 'U'}[a.dtype.kind] + str(8 * a.itemsize), 'shape': list(a.shape),
              'data_offsets': [at, at + len(b)]}
    parts.append(b)
    at += len(b)
text = json.dumps(hdr).encode()
text += b' ' * (-len(text) % 8)
open(theirs, 'wb').write(struct.pack('<Q', len(text)) + text + b''.join(parts))
print('ok')
]==]
  local sp = tmppath()
  local f = assert(io.open(sp, "w"))
  f:write(script)
  f:close()
  local out, code = T.sh(string.format("%s %s %s %s 2>&1", PY, sp, ours, theirs))
  T.is({ code, out }, { 0, "ok\n" }, "numpy reads our file")
  local ts, meta = gpu.load_safetensors(theirs)
  T.is(meta, { src = "numpy" }, "their metadata")
  T.is({ ts.x.dtype, ts.x:totable() }, { "f32", { { 0, 0.25, 0.5 }, { 0.75, 1, 1.25 } } }, "their f32")
  T.is({ ts.y.dtype, ts.y:totable() }, { "i64", { 7, -8 } }, "their i64")
  T.is({ ts.z.dtype, ts.z.shape }, { "f16", { 0 } }, "their empty f16")
  T.is({ ts.u.dtype, ts.u.shape, ts.u:item() }, { "u8", {}, 200 }, "their 0-dim u8")
end)

T.test("safetensors: with the safetensors package", function()
  if not PY then return T.skip("the safetensors package", "no python3 found") end
  local _, code = T.sh(PY .. " -c 'import safetensors.numpy' 2>/dev/null")
  if code ~= 0 then return T.skip("the safetensors package", "not installed (pip install safetensors)") end
  local ours, theirs = tmppath(), tmppath()
  gpu.save_safetensors(ours, { a = gpu.tensor({ 1, 2, 3 }, { dtype = "f32" }), b = gpu.tensor({ 4, 5 }, { dtype = "i64" }) },
    { metadata = { m = "v" } })
  local out, c = T.sh(string.format([[%s -c "
import sys, numpy as np
from safetensors.numpy import load_file, save_file
from safetensors import safe_open
d = load_file('%s')
assert (d['a'] == np.array([1, 2, 3], np.float32)).all() and (d['b'] == np.array([4, 5])).all()
with safe_open('%s', 'np') as f: assert f.metadata() == {'m': 'v'}
save_file({'x': np.arange(4, dtype=np.float64).reshape(2, 2), 'e': np.zeros((0, 2), np.int32)}, '%s', metadata={'k': 'w'})
print('ok')" 2>&1]], PY, ours, ours, theirs))
  T.is({ c, out }, { 0, "ok\n" }, "the package reads our file")
  local ts, meta = gpu.load_safetensors(theirs)
  T.is({ meta, ts.x:totable(), ts.e.shape }, { { k = "w" }, { { 0, 1 }, { 2, 3 } }, { 0, 2 } }, "we read theirs")
end)

-- ---- .npz ---------------------------------------------------------------------

-- CRC-32 (the zip one), bit by bit
local function crc32(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do
    c = c ~ s:byte(i)
    for _ = 1, 8 do c = (c >> 1) ~ (0xEDB88320 & -(c & 1)) end
  end
  return c ~ 0xFFFFFFFF
end

-- A zip built byte by byte (APPNOTE): members {name, data, crc =, method =,
-- flags =, zip64 = true (sizes and offset in the zip64 extra field, and a
-- zip64 end record), dd = true (a data descriptor, zeros in the local header)}.
local function zip(members, o)
  o = o or {}
  local parts, cds, off = {}, {}, 0
  for _, m in ipairs(members) do
    local name, data = m[1], m[2]
    local crc, method, flags = m.crc or crc32(data), m.method or 0, (m.flags or 0) | (m.dd and 8 or 0)
    local lsize = m.dd and 0 or (m.zip64 and 0xFFFFFFFF or #data)
    local lextra = (m.zip64 and not m.dd) and string.pack("<I2I2I8I8", 1, 16, #data, #data) or ""
    local lh = string.pack("<I4I2I2I2I2I2I4I4I4I2I2", 0x04034b50, m.zip64 and 45 or 20, flags, method, 0, 0x21,
      m.dd and 0 or crc, lsize, lsize, #name, #lextra) .. name .. lextra
    local dd = m.dd and string.pack("<I4I4I4I4", 0x08074b50, crc, #data, #data) or ""
    local cextra = m.zip64 and string.pack("<I2I2I8I8I8", 1, 24, #data, #data, off) or ""
    local csize = m.zip64 and 0xFFFFFFFF or #data
    cds[#cds + 1] = string.pack("<I4I2I2I2I2I2I2I4I4I4I2I2I2I2I2I4I4", 0x02014b50, 45, m.zip64 and 45 or 20, flags,
      method, 0, 0x21, crc, csize, csize, #name, #cextra, 0, 0, 0, 0, m.zip64 and 0xFFFFFFFF or off) .. name .. cextra
    parts[#parts + 1] = lh .. data .. dd
    off = off + #lh + #data + #dd
  end
  local cd = table.concat(cds)
  local tail = ""
  if o.zip64 then
    local rec = string.pack("<I4I8I2I2I4I4I8I8I8I8", 0x06064b50, 44, 45, 45, 0, 0, #members, #members, #cd, off)
    tail = rec .. string.pack("<I4I4I8I4", 0x07064b50, 0, off + #cd, 1)
  end
  local n16 = o.zip64 and 0xFFFF or #members
  local cdoff = o.zip64 and 0xFFFFFFFF or (o.cd_off or off)
  return table.concat(parts) .. cd .. tail .. string.pack("<I4I2I2I2I2I4I4I2", 0x06054b50, 0, 0, n16, n16,
    o.zip64 and 0xFFFFFFFF or #cd, cdoff, #(o.comment or "")) .. (o.comment or "")
end

local function npy_bytes(t)
  local p = tmppath()
  t:save(p)
  return T.readfile(p)
end

T.test("npz: stored members, data descriptors, zip64 and a comment, built byte by byte", function()
  local a, b = npy_bytes(gpu.tensor({ 1, 2, 3 }, { dtype = "f32" })), npy_bytes(gpu.tensor({ { 7, 8 } }, { dtype = "i64" }))
  for _, case in ipairs {
    { "plain", zip({ { "a.npy", a }, { "b.npy", b } }) },
    { "data descriptors", zip({ { "a.npy", a, dd = true }, { "b.npy", b, dd = true } }) },
    { "zip64", zip({ { "a.npy", a, zip64 = true }, { "b.npy", b, zip64 = true } }, { zip64 = true }) },
    { "a comment", zip({ { "a.npy", a }, { "b.npy", b } }, { comment = "hello PK\5\6" }) },
  } do
    local t = gpu.load_npz(file(case[2]))
    T.is({ t.a.dtype, t.a:totable(), t.b.dtype, t.b:totable() }, { "f32", { 1, 2, 3 }, "i64", { { 7, 8 } } }, case[1])
  end
  local p = file(zip({ { "a.npy", a }, { "b.npy", b } }))
  local t = gpu.load_npz(p, { names = { "b" }, device = "host" })
  T.is({ t.a, t.b.device, t.b:totable() }, { nil, "host", { { 7, 8 } } }, "a selection")
  T.raises_at(function() gpu.load_npz(p, { names = { "c" } }) end, "load_npz: .*: no array 'c' in the file", "a missing name")
  T.is(gpu.load_npz(file(zip({}))), {}, "an empty archive")
end)

-- each bad archive: name, bytes, the error after "load_npz: <path>: "
local function bad_npz()
  local a = npy_bytes(gpu.tensor({ 1, 2, 3 }, { dtype = "f32" }))
  local good = zip({ { "a.npy", a } })
  local flipped = a:sub(1, -2) .. string.char(a:byte(-1) ~ 1)
  return {
    { "not a zip", string.rep("x", 100), "not a zip archive %(no end of central directory record" },
    { "too short", "PK", "not a zip archive %(2 bytes: too short%)" },
    { "truncated", good:sub(1, #good - 10), "not a zip archive %(no end of central directory record: truncated%?%)" },
    { "cut before the directory", good:sub(#good - 21), "bad central directory" },
    -- a mapped member is not CRC-checked (tests/npz_map.lua): read it
    { "bad CRC", zip({ { "a.npy", flipped, crc = crc32(a) } }), "member 'a.npy': CRC%-32 mismatch", map = false },
    { "bad local header", good:gsub("^PK\3\4", "PK\9\9"), "member 'a.npy': bad local header" },
    { "method 12", zip({ { "a.npy", a, method = 12 } }), "member 'a.npy': compression method 12 is not supported" },
    { "encrypted", zip({ { "a.npy", a, flags = 1 } }), "member 'a.npy' is encrypted" },
    { "not a .npy", zip({ { "a.npy", "hello" } }), "member 'a.npy': not a .npy file" },
    { "a .npy that lies", zip({ { "a.npy", a:sub(1, -3) } }), "member 'a.npy': truncated data" },
    { "two members, one key", zip({ { "a.npy", a }, { "a", a } }), "two members named 'a'" },
    { "directory past the end", zip({ { "a.npy", a } }, { cd_off = 5000 }), "bad central directory %(offset 5000" },
  }
end

T.test("npz: a bad archive gets a clear error naming the file", function()
  for _, c in ipairs(bad_npz()) do
    local p = file(c[2])
    T.raises_at(function() gpu.load_npz(p, { map = c.map }) end, "load_npz: " .. p:gsub("%p", "%%%0") .. ": .-" .. c[3], c[1])
  end
  T.raises_at(function() gpu.load_npz("/nonexistent/x.npz") end, "load_npz: cannot open /nonexistent/x.npz", "a missing file")
  T.raises_at(function() gpu.load_npz(file("")) end, "not a zip archive", "an empty file")
  T.raises_at(function() gpu.load(file(zip({ { "a.npy", "x" } }))) end, "it is a zip archive: for %.npz files, gpu.load_npz", "gpu.load points at load_npz")
end)

T.test("npz: bad arguments to save", function()
  local p = tmppath()
  T.raises_at(function() gpu.save_npz(p, { [1] = gpu.ones({ 1 }) }) end, "save_npz: bad tensors table", "a number key")
  T.raises_at(function() gpu.save_npz(p, { a = "x" }) end, "tensor 'a' is a string", "not a tensor")
  T.raises_at(function() gpu.save_npz(p, {}, { compres = true }) end, "unknown option 'compres'", "a misspelt option")
  T.raises_at(function() gpu.save_npz("/nonexistent/x.npz", { a = gpu.ones({ 1 }) }) end, "save_npz: cannot write", "an unwritable path")
end)

T.test("npz: round trips with NumPy (savez, savez_compressed, np.load), every dtype", function()
  if not PY then return T.skip("NumPy npz round trips", "no python3 with numpy found") end
  -- numpy.savez adds ".npz" to a path without it
  local stored, compressed, ours, ours_c = tmppath() .. ".npz", tmppath() .. ".npz", tmppath(), tmppath()
  files[#files + 1], files[#files + 2] = stored, compressed
  local sp = tmppath()
  local f = assert(io.open(sp, "w"))
  f:write([==[
import sys, numpy as np
mode, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
arrays = {'f32': np.array([1.5, -2.25, 1e6], np.float32), 'f64': np.array([[1.5], [-2.25], [1e300]]),
          'f16': np.array([1.5, -2.25, 65504], np.float16), 'i8': np.array([-128, 0, 127], np.int8),
          'u8': np.array([0, 200, 255], np.uint8), 'i32': np.array([-2**31, 7, 2**31 - 1], np.int32),
          'i64': np.array([-2**63, 7, 2**63 - 1], np.int64), 'bool': np.array([True, False, True]),
          'scalar': np.array(2.5), 'empty': np.zeros((0, 3), np.float32),
          'big': np.arange(100000, dtype=np.float32) % 97}
if mode == 'write':
    np.savez(a, **arrays)
    np.savez_compressed(b, **arrays)
else:
    for path in (a, b):
        d = np.load(path)
        assert sorted(d.files) == sorted(arrays), d.files
        for k, v in arrays.items():
            assert d[k].dtype == v.dtype and d[k].shape == v.shape and (d[k] == v).all(), (path, k, d[k])
    print('ok')
]==])
  f:close()
  local out, code = T.sh(string.format("%s %s write %s %s 2>&1", PY, sp, stored, compressed))
  T.is({ code, out }, { 0, "" }, "numpy writes savez and savez_compressed")
  for _, p in ipairs { stored, compressed } do
    local t = gpu.load_npz(p)
    local names = {}
    for k in pairs(t) do names[#names + 1] = k end
    table.sort(names)
    T.is(names, { "big", "bool", "empty", "f16", "f32", "f64", "i32", "i64", "i8", "scalar", "u8" }, "every key")
    for _, d in ipairs(DT) do
      if d[1] ~= "bf16" then T.is({ t[d[1]].dtype, T.flatten(t[d[1]]:totable()) }, { d[1], d[5] }, d[1] .. " from numpy") end
    end
    T.is({ t.scalar.shape, t.scalar:item(), t.empty.shape }, { {}, 2.5, { 0, 3 } }, "0-dim and empty from numpy")
    local want = 0
    for i = 0, 99999 do want = want + i % 97 end
    T.is(t.big:to("f64"):sum():item(), want, "100000 elements")
    -- write them back, stored and deflated; numpy reads ours
    gpu.save_npz(ours, t)
    gpu.save_npz(ours_c, t, { compress = true })
  end
  T.ok(#T.readfile(ours_c) < #T.readfile(ours), "compress = true makes a smaller file")
  out, code = T.sh(string.format("%s %s read %s %s 2>&1", PY, sp, ours, ours_c))
  T.is({ code, out }, { 0, "ok\n" }, "numpy reads ours, stored and deflated")
  local sel = gpu.load_npz(compressed, { names = { "i8", "scalar" } })
  T.is({ sel.i8:totable(), sel.scalar:item(), sel.f32 }, { { -128, 0, 127 }, 2.5, nil }, "a selection from a deflated archive")
  -- a deflated member corrupted in the middle: map = false inflates at the
  -- call (to the device it inflates on the staging threads and the next
  -- sync raises: tests/npz_inflate.lua)
  local raw = T.readfile(compressed)
  local at = raw:find("big.npy", 1, true) + 200
  local bad = file(raw:sub(1, at) .. string.rep("\255", 64) .. raw:sub(at + 65))
  T.raises_at(function() gpu.load_npz(bad, { names = { "big" }, map = false }) end,
    { "member 'big.npy': corrupt deflate data", "member 'big.npy': CRC%-32 mismatch" }, "corrupt deflate data")
end)

-- The savers sort names and check UTF-8 with Lua's own table and utf8
-- libraries, whatever the script made of those globals.
T.test("saving does not use the script's globals table and utf8", function()
  local p = os.tmpname()
  files[#files + 1] = p
  files[#files + 1] = p .. ".npz"
  local t = { b = gpu.ones({ 2 }), a = gpu.zeros({ 3 }) }
  local saved_table, saved_utf8 = table, utf8
  table, utf8 = nil, { len = function() return nil end }
  local ok, err = pcall(function()
    gpu.save_safetensors(p, t, { metadata = { k = "v" } })
    gpu.save_npz(p .. ".npz", t)
  end)
  table, utf8 = saved_table, saved_utf8
  T.ok(ok, "both save" .. (ok and "" or ": " .. tostring(err)))
  if ok then
    local r, meta = gpu.load_safetensors(p)
    T.is(r.a.shape, { 3 }, "safetensors: read back")
    T.is(meta.k, "v", "safetensors: the metadata")
    T.is(gpu.load_npz(p .. ".npz").b:sum():item(), 2.0, "npz: read back")
  end
end)

for _, p in ipairs(files) do os.remove(p) end
T.done()
