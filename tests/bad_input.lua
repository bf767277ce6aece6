-- Bad input: each case raises a Lua error that names the argument or the
-- problem and points at this file's line, and the runtime still works after.
local gpu = require "gpu"
local T = require "gpu.test"

local function alive(what)
  local ok, v = pcall(function() return (gpu.ones({2}) + 1):sum():item() end)
  T.ok(ok and v == 4.0, "runtime still works after " .. what)
end

-- each case: { name, pattern, fn }; fn must make the bad call on one line
local function run_cases(cases)
  for _, c in ipairs(cases) do
    T.raises_at(c[3], c[2], c[1])
  end
  alive(#cases .. " cases")
end

T.test("wrong argument types", function()
  local t = gpu.ones({2, 2})
  local s <close> = gpu.stream()
  run_cases {
    { "empty(string)", "bad argument #1 to 'empty'", function() gpu.empty("big") end },
    { "empty(nil)", "bad argument #1 to 'empty'", function() gpu.empty() end },
    { "shape with a string", "bad argument #1 to 'zeros'", function() gpu.zeros({ 2, "a" }) end },
    { "opts not a table", "bad argument #2 to 'ones'", function() gpu.ones({2}, 5) end },
    { "full without a value", "bad argument", function() gpu.full({2}) end },
    { "full with a string value", "bad argument", function() gpu.full({2}, "x") end },
    { "dtype not a string", "dtype", function() gpu.zeros({2}, { dtype = 4 }) end },
    { "device not a string", "device", function() gpu.zeros({2}, { device = true }) end },
    { "stream= not a stream", "stream", function() gpu.zeros({2}, { stream = "s" }) end },
    { "tensor of strings", "bad argument #1 to 'tensor'", function() gpu.tensor({ "a", "b" }) end },
    { "tensor ragged", "bad argument #1 to 'tensor'", function() gpu.tensor({ { 1, 2 }, { 3 } }) end },
    { "tensor(nil)", "bad argument #1 to 'tensor'", function() gpu.tensor() end },
    { "add(string)", "bad argument #1 to 'add'", function() t:add("x") end },
    { "add(table)", "bad argument #1 to 'add'", function() t:add({}) end },
    { "tensor + string", "bad argument", function() return t + "x" end },
    { "tensor + boolean", "bad argument", function() return t * true end },
    { "copy(number)", "bad argument #1 to 'copy'", function() t:copy(3) end },
    { "copy(stream)", "bad argument #1 to 'copy'", function() t:copy(s) end },
    { "method on a non-tensor", "bad argument", function() t.add(5, 1) end },
    { "matmul(number, number)", "bad argument #1 to 'matmul'", function() gpu.matmul(1, 2) end },
    { "narrow(string, ...)", "bad argument #1 to 'narrow'", function() t:narrow("a", 1, 1) end },
    { "view(string)", "bad argument #1 to 'view'", function() t:view("x") end },
    { "get(string)", "bad argument", function() t:get("a", 1) end },
    { "stream(number)", "bad argument #1 to 'stream'", function() gpu.stream(3) end },
    { "stream priority", "priority", function() gpu.stream { priority = 7 } end },
    { "event(string)", "bad argument #1 to 'event'", function() gpu.event("x") end },
    { "wait(tensor)", "bad argument #1 to 'wait'", function() s:wait(t) end },
    { "using(tensor)", "bad argument #1 to 'using'", function() gpu.using(t) end },
    { "record(tensor)", "bad argument", function() gpu.event():record(t) end },
    { "sleep(string)", "bad argument #1 to 'sleep'", function() gpu.sleep("long") end },
    { "device_info(string)", "bad argument #1 to 'device_info'", function() gpu.device_info("x") end },
    { "seed(string)", "bad argument #1 to 'seed'", function() gpu.seed("x") end },
  }
end)

T.test("method arguments are numbered as Lua does (self not counted)", function()
  local t = gpu.ones({2})
  local i = gpu.ones({2}, { dtype = "i32" })
  local u = gpu.ones({2}, { dtype = "u8" })
  run_cases {
    { "t:add(string)", "bad argument #1 to 'add'", function() t:add("x") end },
    { "t:fill(string)", "bad argument #1 to 'fill'", function() t:fill("z") end },
    { "i32:add(1.5)", "bad argument #1 to 'add'", function() i:add(1.5) end },
    { "u8:add(-1) out of range", "bad argument #1 to 'add'", function() u:add(-1) end },
    { "u8:fill(300) out of range", "bad argument #1 to 'fill'", function() u:fill(300) end },
    { "t:narrow(dim, 0, 1)", "bad argument #2 to 'narrow'", function() t:narrow(1, 0, 1) end },
    { "t:get(3)", "bad argument #1 to 'get'", function() t:get(3) end },
    { "t:sum{dim = 3}", { "bad argument #1 to 'sum'", "bad option 'dim'" }, function() t:sum { dim = 3 } end },
  }
end)

T.test("bad shapes", function()
  run_cases {
    { "negative dim", "bad argument #1 to 'empty'", function() gpu.empty({ 2, -3 }) end },
    { "negative integer shape", "bad argument #1 to 'zeros'", function() gpu.zeros(-1) end },
    { "negative dim after a zero-sized one", "must be non-negative, got -1", function() gpu.empty({ 0, -1 }) end },
    { "non-integer dim", "bad argument #1 to 'ones'", function() gpu.ones({ 2.5 }) end },
    { "NaN dim", "bad argument #1 to 'ones'", function() gpu.ones({ 0 / 0 }) end },
    { "inf dim", "bad argument #1 to 'ones'", function() gpu.ones({ 1 / 0 }) end },
    { "{1e12, 1e12} overflows", { "bad argument #1 to 'empty'", "out of memory" },
      function() gpu.empty({ 1e12, 1e12 }) end },
    { "{2^31, 2^31, 2^31} overflows int64 bytes", { "bad argument #1 to 'empty'", "out of memory" },
      function() gpu.empty({ 1 << 31, 1 << 31, 1 << 31 }, { dtype = "f64" }) end },
    { "too many dims", "bad argument #1 to 'zeros'", function() gpu.zeros({ 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }) end },
    { "pinned negative", "bad argument #1 to 'pinned'", function() gpu.pinned({ -4 }) end },
    { "rand negative", "bad argument #1 to 'rand'", function() gpu.rand({ -1 }) end },
    { "zero-sized beside sizes whose product is too large", "bad argument #1 to 'empty'",
      function() gpu.empty({ 0, 1 << 40, 1 << 40 }) end },
    { "view(-1, -1)", "bad argument #1 to 'view'", function() gpu.ones({4}):view({ -1, -1 }) end },
    { "view(0)", "bad argument #1 to 'view'", function() gpu.ones({4}):view({ 0, 4 }) end },
  }
end)

T.test("unknown dtype and device", function()
  run_cases {
    { "unknown dtype", "f128", function() gpu.zeros({2}, { dtype = "f128" }) end },
    { "unknown dtype in to()", "f128", function() gpu.zeros({2}):to("f128") end },
    { "unknown device", "tpu", function() gpu.zeros({2}, { device = "tpu" }) end },
    { "cuda:N out of range", { "device", "cuda:99" }, function() gpu.zeros({2}, { device = "cuda:99" }) end },
  }
end)

T.test("numel and shape mismatches", function()
  local a, b = gpu.ones({4, 4}), gpu.ones({4, 5})
  run_cases {
    { "copy numel mismatch", "bad argument #1 to 'copy'", function() a:copy(b) end },
    { "copy dtype mismatch", "dtype", function() a:copy(gpu.ones({4, 4}, { dtype = "f64" })) end },
    { "add shape mismatch", { "shape", "broadcast" }, function() return a + b end },
    { "sub dtype mismatch", "dtype", function() return a:sub(gpu.ones({4, 4}, { dtype = "i32" })) end },
    { "out= shape mismatch", "out", function() a:mul(2, { out = b }) end },
    { "matmul inner mismatch", "bad argument", function() gpu.matmul(b, b) end },
    { "matmul 3-D", "bad argument", function() gpu.matmul(gpu.ones({ 2, 2, 2 }), a) end },
    { "view numel mismatch", "bad argument #1 to 'view'", function() a:view({ 5, 3 }) end },
    { "view -1 not divisible", "bad argument #1 to 'view'", function() a:view({ -1, 3 }) end },
    { "view of non-contiguous", "contiguous", function() a:narrow(2, 1, 2):view({8}) end },
  }
end)

T.test("indices and narrow", function()
  local t = gpu.arange(12, { dtype = "i32" }):view({3, 4})
  run_cases {
    { "get index past the end", "bad argument #1 to 'get'", function() t:get(4, 1) end },
    { "get second index past the end", "bad argument #2 to 'get'", function() t:get(1, 5) end },
    { "get index 0", "bad argument #1 to 'get'", function() t:get(0, 1) end },
    { "get negative index", "bad argument #1 to 'get'", function() t:get(-1, 1) end },
    { "get non-integer index", "bad argument #1 to 'get'", function() t:get(1.5, 1) end },
    { "get too few indices", "index", function() t:get(1) end },
    { "get too many indices", "index", function() t:get(1, 1, 1) end },
    { "set index past the end", "bad argument #2 to 'set'", function() t:set(1, 9, 0) end },
    { "set index 0", "bad argument #1 to 'set'", function() t:set(0, 1, 0) end },
    { "set non-integer value in i32", "integer", function() t:set(1, 1, 0.5) end },
    { "narrow past the end", "bad argument", function() t:narrow(2, 3, 3) end },
    { "narrow start 0", "bad argument #2 to 'narrow'", function() t:narrow(1, 0, 1) end },
    { "narrow len -1", "bad argument #3 to 'narrow'", function() t:narrow(1, 1, -1) end },
    { "narrow len -1 says non-negative", "length must be non-negative, got -1", function() t:narrow(1, 1, -1) end },
    { "narrow len 0 past the end", "bad argument #2 to 'narrow'", function() t:narrow(1, 5, 0) end },
    { "narrow dim out of range", "bad argument #1 to 'narrow'", function() t:narrow(3, 1, 1) end },
    { "narrow dim 0", "bad argument #1 to 'narrow'", function() t:narrow(0, 1, 1) end },
    { "sum dim out of range", "dim", function() t:sum { dim = 3 } end },
    { "item of many elements", "item", function() t:item() end },
  }
  T.is(t:get(3, 4), 11, "valid get still works")
end)

T.test("closed objects", function()
  local t = gpu.ones({3})
  t:close()
  t:close()                                 -- idempotent
  local u = gpu.ones({3})
  local s = gpu.stream()
  s:close()
  local ev = gpu.event()
  ev:close()
  run_cases {
    { "method on a closed tensor", "closed", function() t:add(1) end },
    { "closed tensor as operand", "closed", function() u:add(t) end },
    { "closed tensor in a metamethod", "closed", function() return u + t end },
    { "totable of a closed tensor", "closed", function() t:totable() end },
    { "copy from a closed tensor", "closed", function() u:copy(t) end },
    { "shape of a closed tensor", "closed", function() return t:numel() end },
    { "op on a closed stream", "closed", function() u:add(1, { stream = s }) end },
    { "sleep on a closed stream", "closed", function() gpu.sleep(1, { stream = s }) end },
    { "query a closed stream", "closed", function() s:query() end },
    { "record on a closed event", "closed", function() ev:record() end },
    { "elapsed of a closed event", "closed", function() return ev - ev end },
    { "query a closed event", "closed", function() ev:query() end },
  }
  T.ok(tostring(t):find("closed"), "tostring of a closed tensor says closed: " .. tostring(t))
end)

T.test("elapsed errors", function()
  local a, b = gpu.event { timing = false }, gpu.event { timing = false }
  a:record(); b:record(); b:synchronize()
  local c, d = gpu.event { timing = true }, gpu.event { timing = true }
  run_cases {
    { "elapsed without timing", "timing", function() return b - a end },
    { "elapsed never recorded", "record", function() return c:elapsed(d) end },
    { "elapsed one never recorded", "record", function() c:record(); c:synchronize(); return d - c end },
  }
  a:close(); b:close(); c:close(); d:close()
end)

T.test("allocation larger than memory", function()
  local total = gpu.device_info(0).total_memory
  run_cases {
    { "device tensor of 2^40 f32", "memory", function() gpu.empty({ 1 << 40 }) end },
    { "device tensor of 8x total memory", "memory", function() gpu.empty({ total }, { dtype = "f64" }) end },
    { "pinned tensor of 2^40 f32", "memory", function() gpu.pinned({ 1 << 40 }) end },
    { "host tensor of 2^40 f32", "memory", function() gpu.empty({ 1 << 40 }, { device = "host" }) end },
  }
  local t = gpu.zeros({1 << 20})
  T.is(t:sum():item(), 0.0, "the next allocation works")
  T.is(gpu.stats().buffers >= 1, true, "and is counted")
end)

T.test("integer division by zero", function()
  local i = gpu.tensor({ 4, 6 }, { dtype = "i64" })
  run_cases {
    { "div by scalar 0", "division by zero", function() i:div(0) end },
    { "div_ by scalar 0", "division by zero", function() i:div_(0) end },
    { "i / 0", "division by zero", function() return i / 0 end },
  }
  T.is(i:totable(), { 4, 6 }, "the tensor is untouched")
  local f = gpu.tensor({ 1.0 }):div(0):item()
  T.is(f, math.huge, "float division by zero follows IEEE (no error)")
  T.raises_at(function() return i:add(0.5) end, "bad argument", "non-integer number with an integer tensor")
end)

T.test("misspelt options, read-only fields, stray arguments", function()
  local t = gpu.ones({2})
  run_cases {
    { "zeros{dtyp=}", "unknown option 'dtyp' %(expected: dtype device stream%)",
      function() gpu.zeros({2}, { dtyp = "f64" }) end },
    { "add{strem=}", "unknown option 'strem'", function() t:add(1, { strem = 1 }) end },
    { "sum{dims=}", "unknown option 'dims'", function() t:sum { dims = 1 } end },
    { "stream{prio=}", "unknown option 'prio'", function() gpu.stream { prio = "high" } end },
    { "event{timeing=}", "unknown option 'timeing'", function() gpu.event { timeing = true } end },
    { "positional key in opts", "bad option key", function() gpu.ones({2}, { "f64" }) end },
    { "dtype not a string", "dtype' %(string expected, got number", function() gpu.zeros({2}, { dtype = 5 }) end },
    { "device index out of range", "device index out of range", function() gpu.zeros({2}, { device = "cuda:7" }) end },
    { "assigning a field", "read%-only", function() t.dtype = "f64" end },
    { "assigning an element", "read%-only", function() t[1] = 3 end },
    { "reading t[1]", "not indexable", function() return t[1] end },
    { "synchronize(s)", "takes no argument", function() gpu.synchronize(gpu.default_stream()) end },
  }
end)

T.test("stream-only options (fill, zero_): one pass checks keys and the stream", function()
  local t = gpu.ones({2})
  local closed = gpu.stream()
  closed:close()
  run_cases {
    { "fill{strem=}", "unknown option 'strem' %(expected: stream%)", function() t:fill(2, { strem = 1 }) end },
    { "fill{stream=, extra=}", "unknown option 'extra'", function() t:fill(2, { stream = gpu.stream(), extra = 1 }) end },
    { "fill positional key", "bad option key %(a number", function() t:fill(2, { 5 }) end },
    { "fill{stream=5}", "bad option 'stream' %(gpu.Stream expected, got number%)",
      function() t:fill(2, { stream = 5 }) end },
    { "fill{stream=event}", "bad option 'stream' %(gpu.Stream expected, got gpu.Event%)",
      function() t:fill(2, { stream = gpu.event() }) end },
    { "fill{stream=closed}", "bad option 'stream' %(stream is closed%)", function() t:fill(2, { stream = closed }) end },
    { "fill(v, 5)", "bad argument #2 to 'fill' %(table expected, got number%)", function() t:fill(2, 5) end },
    { "zero_{stream=io.stdout}", "gpu.Stream expected, got FILE%*", function() t:zero_ { stream = io.stdout } end },
    { "add{stream=event}", "bad option 'stream' %(gpu.Stream expected, got gpu.Event%)",
      function() t:add(1, { stream = gpu.event() }) end },
  }
  T.is(t:totable(), { 1, 1 }, "no failed call wrote the tensor")
  local s = gpu.stream()
  t:fill(7, { stream = s })
  s:synchronize()
  T.is(t:totable(), { 7, 7 }, "fill{stream = s} ran on s")
  t:fill(3, {})
  T.is(t:totable(), { 3, 3 }, "an empty options table is the current stream")
end)

T.test("handles are told apart by type, foreign userdata included", function()
  local t, s, e = gpu.ones({2}), gpu.stream(), gpu.event()
  run_cases {
    { "a stream as a tensor", "gpu.Tensor expected, got gpu.Stream", function() t.add(s, 1) end },
    { "a FILE* as a tensor", "gpu.Tensor expected, got FILE%*", function() t.add(io.stdout, 1) end },
    { "a tensor as a stream", "gpu.Stream expected, got gpu.Tensor", function() s.synchronize(t) end },
    { "an event as a stream", "gpu.Stream expected, got gpu.Event", function() s.synchronize(e) end },
    { "a FILE* as an event", "gpu.Event expected, got FILE%*", function() e.synchronize(io.stdout) end },
    { "s:wait(FILE*)", "gpu.Event or gpu.Stream expected, got FILE%*", function() s:wait(io.stdout) end },
    { "copy from a stream", "gpu.Tensor expected, got gpu.Stream", function() t:copy(s) end },
  }
end)

T.done()
