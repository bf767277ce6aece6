-- index_select, gather and scatter_add_ (1-based indices, shapes, the three
-- forms, errors at the right line: bad arguments at once, an index out of
-- range at the next sync, in the main chunk and inside a task), the new
-- reductions' options and errors, cumsum/softmax forms, and reductions of
-- nothing (a zero-sized dim), which follow NumPy.  Values are checked
-- against plain Lua; tests/reduce_numpy.lua compares with NumPy.
local gpu = require "gpu"
local T = require "gpu.test"

local M = { { 1, 2, 3, 4 }, { 5, 6, 7, 8 }, { 9, 10, 11, 12 } }

T.test("index_select: slices along a dim, 1-based, any integer index dtype", function()
  for _, dt in ipairs(T.dtypes) do
    local t = gpu.tensor(M, { dtype = "i32" }):to(dt)
    for _, idt in ipairs(T.int_dtypes) do
      local r = t:index_select(1, gpu.tensor({ 3, 1, 3 }, { dtype = idt }))
      local want = { M[3], M[1], M[3] }
      T.is({ r.dtype, r.shape, r:totable() }, { dt, { 3, 4 }, T.map(want, function(v) return T.cast(v, dt) end) },
           string.format("%s rows 3, 1, 3 (index %s)", dt, idt))
    end
    local c = t:index_select(-1, gpu.tensor({ 4, 2 }, { dtype = "i64" }))
    T.is(c:totable(), T.map({ { 4, 2 }, { 8, 6 }, { 12, 10 } }, function(v) return T.cast(v, dt) end),
         dt .. " columns 4, 2 (dim -1)")
  end
  local t = gpu.tensor(M, { dtype = "f32" })
  local o = gpu.zeros({ 2, 4 })
  local r = t:index_select(1, gpu.tensor({ 2, 2 }, { dtype = "i64" }), { out = o })
  T.ok(r == o, "opts.out: written and returned")
  T.is(o:totable(), { M[2], M[2] }, "... with the rows")
  -- a strided tensor, and a strided index (the middle of a longer one)
  local s = t:narrow(2, 2, 2)
  local ix = gpu.tensor({ 9, 3, 1, 9 }, { dtype = "i64" }):narrow(1, 2, 2)
  T.is(s:index_select(1, ix):totable(), { { 10, 11 }, { 2, 3 } }, "a column slice, rows 3 and 1")
end)

T.test("gather: r[i][j] = t[i][idx[i][j]] along dim 2, t[idx[i][j]][j] along dim 1", function()
  local t = gpu.tensor(M, { dtype = "f64" })
  local idx = gpu.tensor({ { 4, 1 }, { 2, 2 }, { 3, 4 } }, { dtype = "i64" })
  T.is(t:gather(2, idx):totable(), { { 4, 1 }, { 6, 6 }, { 11, 12 } }, "dim 2")
  local idx1 = gpu.tensor({ { 3, 1, 2, 3 } }, { dtype = "i32" })
  T.is(t:gather(1, idx1):totable(), { { 9, 2, 7, 12 } }, "dim 1, an index smaller than t")
  local o = gpu.empty({ 3, 2 }, { dtype = "f64" })
  T.ok(t:gather(2, idx, { out = o }) == o, "opts.out")
  T.is(o:totable(), { { 4, 1 }, { 6, 6 }, { 11, 12 } }, "... written")
  local b = gpu.tensor({ { true, false }, { false, true } }, { dtype = "bool" })
  T.is(b:gather(2, gpu.tensor({ { 2, 2 }, { 2, 1 } }, { dtype = "i64" })):totable(), { { false, false }, { true, false } },
       "bool")
end)

T.test("scatter_add_: in place, duplicates add up, every numeric dtype", function()
  for _, dt in ipairs(T.int_dtypes) do
    local t = gpu.zeros({ 2, 3 }, { dtype = dt })
    local idx = gpu.tensor({ { 1, 1, 3 }, { 2, 2, 2 } }, { dtype = "i64" })
    local src = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = dt })
    T.ok(t:scatter_add_(2, idx, src) == t, dt .. " returns t")
    T.is(t:totable(), { { 3, 0, 3 }, { 0, 15, 0 } }, dt .. " dim 2: duplicates add up")
  end
  for _, dt in ipairs(T.float_dtypes) do
    local t = gpu.ones({ 3, 2 }, { dtype = dt })
    local idx = gpu.tensor({ { 3, 1 }, { 3, 1 } }, { dtype = "i32" })
    local src = gpu.tensor({ { 0.5, 1 }, { 0.25, 2 }, { 9, 9 } }, { dtype = dt })   -- larger than idx
    t:scatter_add_(1, idx, src)
    T.is(t:totable(), { { 1, 4 }, { 1, 1 }, { 1.75, 1 } }, dt .. " dim 1, src larger than the index")
  end
  local u = gpu.full({ 2 }, 250, { dtype = "u8" })
  u:scatter_add_(1, gpu.tensor({ 1, 1 }, { dtype = "i64" }), gpu.tensor({ 3, 4 }, { dtype = "u8" }))
  T.is(u:totable(), { 1, 250 }, "u8 wraps (250 + 7 = 1)")
  local i8 = gpu.zeros({ 4 }, { dtype = "i8" })
  i8:scatter_add_(1, gpu.tensor({ 2, 3, 3, 4 }, { dtype = "i64" }), gpu.tensor({ -1, 100, 100, 5 }, { dtype = "i8" }))
  T.is(i8:totable(), { 0, -1, -56, 5 }, "i8 neighbours in one word, and wrapping")
end)

T.test("bad arguments raise at the call, naming them", function()
  local t = gpu.tensor(M, { dtype = "f32" })
  local i = gpu.tensor({ 1, 2 }, { dtype = "i64" })
  local cases = {
    { "float index", "the index must be an integer tensor", function() t:index_select(1, gpu.ones({ 2 })) end },
    { "bool index", "the index must be an integer tensor",
      function() t:gather(1, gpu.ones({ 1, 4 }, { dtype = "bool" })) end },
    { "2-D index for index_select", "the index must be 1%-D",
      function() t:index_select(1, gpu.ones({ 1, 2 }, { dtype = "i64" })) end },
    { "dim out of range", "dim 3 out of range", function() t:index_select(3, i) end },
    { "gather: index ndim", "the index has 1 dims", function() t:gather(1, i) end },
    { "gather: index larger", "is larger than the tensor's", function() t:gather(1, gpu.ones({ 1, 5 }, { dtype = "i64" })) end },
    { "scatter_add_: dtype", "dtype f64 does not match f32",
      function() t:scatter_add_(1, gpu.ones({ 1, 2 }, { dtype = "i64" }), gpu.ones({ 1, 2 }, { dtype = "f64" })) end },
    { "scatter_add_: src smaller", "is larger than src's",
      function() t:scatter_add_(1, gpu.ones({ 1, 3 }, { dtype = "i64" }), gpu.ones({ 1, 2 })) end },
    { "scatter_add_ on bool", "not supported for bool",
      function() local b = gpu.ones({ 2 }, { dtype = "bool" }); b:scatter_add_(1, i, b) end },
    { "scatter_add_: no out", "out", function() t:scatter_add_(1, gpu.ones({ 1, 2 }, { dtype = "i64" }), t, { out = t }) end },
    { "index on the host, tensor on the device", "memory",
      function() t:index_select(1, i:to("pinned")) end },
    { "var of integers", "var: not supported for i32", function() gpu.ones({ 3 }, { dtype = "i32" }):var() end },
    { "norm p = 0", "bad option 'p' to 'norm'", function() t:norm { p = 0 } end },
    { "norm p a string", "bad option 'p' to 'norm'", function() t:norm { p = "fro" } end },
    { "std: unknown option", "correction", function() t:std { correction = 0 } end },
    { "softmax of integers", "softmax: not supported for i64", function() gpu.ones({ 3 }, { dtype = "i64" }):softmax(1) end },
    { "softmax without dim", "option 'dim' is required", function() t:softmax {} end },
    { "log_softmax dim", "dim 5 out of range", function() t:log_softmax(5) end },
    { "cumsum without dim", "bad argument #1 to 'cumsum'", function() t:cumsum() end },
    { "cumsum out dtype", "does not match the result", function() gpu.ones({ 3 }, { dtype = "i32" }):cumsum(1, { out = gpu.ones({ 3 }, { dtype = "i32" }) }) end },
  }
  for _, c in ipairs(cases) do T.raises_at(c[3], c[2], c[1]) end
  T.is(t:sum():item(), 78.0, "the runtime works after them")
end)

T.test("an index out of range fails at the next sync, naming the op and its line", function()
  local t = gpu.tensor(M, { dtype = "f32" })
  local bad = gpu.tensor({ 1, 4 }, { dtype = "i64" })
  for _, case in ipairs {
    { "index_select", function() return t:index_select(1, bad) end, "'index_select' failed: index out of range" },
    { "gather", function() return t:gather(1, gpu.tensor({ { 0, 1, 1, 1 } }, { dtype = "i32" })) end,
      "'gather' failed: index out of range" },
    { "scatter_add_", function() return gpu.zeros({ 3, 4 }):scatter_add_(2, gpu.tensor({ { 5 } }, { dtype = "u8" }), t) end,
      "'scatter_add_' failed: index out of range" },
  } do
    local name, fn, pat = case[1], case[2], case[3]
    local line = debug.getinfo(fn, "S").linedefined
    local ok = pcall(fn)
    T.ok(ok, name .. ": enqueued without an error")
    local ok2, err = pcall(gpu.synchronize)
    T.ok(not ok2 and tostring(err):find(pat, 1, true), name .. ": the sync raises " .. pat)
    T.ok(tostring(err):find("index_ops.lua:" .. line .. ": '", 1, true), name .. ": naming line " .. line)
    T.ok(pcall(gpu.synchronize), name .. ": reported once")
  end
  -- host memory: the op runs at the call, which raises
  local h, hb = t:to("pinned"), bad:to("pinned")
  T.raises_at(function() h:index_select(1, hb) end, "index out of range (4 not in 1..3)", "pinned: at the call")
end)

T.test("an index out of range inside a task: its sync raises, at its line", function()
  local t = gpu.tensor(M, { dtype = "f32" })
  local bad = gpu.tensor({ { 9 } }, { dtype = "i64" })
  local s <close> = gpu.stream()
  local line
  local task = gpu.task(function()
    local _ <close> = gpu.using(s)
    line = debug.getinfo(1, "l").currentline + 1
    local r = t:gather(2, bad)
    gpu.await(s)       -- the host backend reports it here already
    s:synchronize()    -- cuda's flag is read at a sync
    return r
  end)
  local ok, err = pcall(gpu.run)
  T.ok(not ok, "gpu.run raises the task's failure")
  T.ok(tostring(err):find("'gather' failed: index out of range", 1, true), "naming the op: " .. tostring(err))
  T.ok(tostring(err):find("index_ops.lua:" .. tostring(line) .. ": '", 1, true), "and the line in the task")
  T.ok(task.failed, "the task failed")
  T.ok(pcall(gpu.synchronize), "nothing left to report")
end)

T.test("reductions: options, dtypes, argmin ties and NaN", function()
  local t = gpu.tensor({ { 2, 1, 1 }, { 3, 0 / 0, 3 } })
  T.is(t:argmin { dim = 2 }:totable(), { 2, 2 }, "first minimum; NaN wins as for argmax")
  T.is(t:argmin():item(), 5, "whole tensor: NaN at flat position 5")
  local a = gpu.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "f32" })
  T.is(a:prod():item(), 24.0, "prod")
  T.is(gpu.tensor({ 1, 2, 3 }, { dtype = "u8" }):prod().dtype, "i64", "prod of integers is i64")
  T.is(gpu.tensor({ true, true }, { dtype = "bool" }):prod():item(), 1, "prod of bool")
  T.is(a:var():item(), T.round_f32(5 / 3), "var: unbiased by default")
  T.near(a:var { unbiased = false }:item(), 1.25, 1e-7, "var {unbiased = false}")
  T.near(a:std { dim = 1 }:totable(), { math.sqrt(2), math.sqrt(2) }, 1e-6, "std {dim = 1}")
  T.is(a:norm():item(), T.round_f32(math.sqrt(30)), "norm: 2 by default")
  T.is(a:norm { p = 1, dim = 2, keepdim = true }:totable(), { { 3 }, { 7 } }, "norm {p = 1, dim, keepdim}")
  T.is(a:norm { p = math.huge }:item(), 4.0, "norm {p = math.huge}")
  T.near(a:logsumexp { dim = 2 }:totable(), { math.log(math.exp(1) + math.exp(2)), math.log(math.exp(3) + math.exp(4)) },
         1e-6, "logsumexp {dim = 2}")
  T.is(gpu.tensor({ 1000.0, 1000 }):logsumexp():item(), T.round_f32(1000 + math.log(2)), "logsumexp is max-shifted")
  T.is(gpu.tensor({ -1 / 0, -1 / 0 }):logsumexp():item(), -1 / 0, "logsumexp of -inf only: -inf")
end)

T.test("cumsum, softmax, log_softmax: forms and result dtypes", function()
  local i = gpu.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "i8" })
  local c = i:cumsum(1)
  T.is({ c.dtype, c:totable() }, { "i64", { { 1, 2 }, { 4, 6 } } }, "cumsum of i8 is i64")
  T.is(gpu.tensor({ 0.5, 0.25 }, { dtype = "f16" }):cumsum(-1):totable(), { 0.5, 0.75 }, "cumsum of f16 stays f16")
  T.is(gpu.tensor({ true, false, true }, { dtype = "bool" }):cumsum(1):totable(), { 1, 1, 2 }, "cumsum of bool counts")
  local x = gpu.tensor({ { 1, 2, 3 }, { 1000, 1000, 1000 } }, { dtype = "f32" })
  local s = x:softmax(2)
  T.near(s:totable()[2], { 1 / 3, 1 / 3, 1 / 3 }, 1e-6, "softmax is max-shifted (no overflow)")
  T.near(x:softmax { dim = -1 }:sum { dim = 2 }:totable(), { 1, 1 }, 1e-6, "rows sum to 1 ({dim =} form)")
  local o = gpu.empty({ 2, 3 })
  T.ok(x:log_softmax(2, { out = o }) == o, "log_softmax into opts.out")
  T.near(o:totable()[1], { 1 - math.log(math.exp(1) + math.exp(2) + math.exp(3)),
                           2 - math.log(math.exp(1) + math.exp(2) + math.exp(3)),
                           3 - math.log(math.exp(1) + math.exp(2) + math.exp(3)) }, 1e-6, "... its values")
  local bf = gpu.tensor({ 1, 2, 3 }, { dtype = "bf16" }):softmax(1)
  T.is(bf.dtype, "bf16", "softmax of bf16 is bf16")
end)

T.test("reductions of nothing follow NumPy", function()
  local ok, z = pcall(gpu.zeros, { 2, 0 })
  if not ok then
    return T.skip("zero-sized dims", "this build cannot make a zero-sized tensor yet: " .. tostring(z))
  end
  local function val(r) return r:totable() end
  T.is(val(z:sum { dim = 2 }), { 0, 0 }, "sum: 0")
  T.is(val(z:prod { dim = 2 }), { 1, 1 }, "prod: 1")
  T.is(val(z:any { dim = 2 }), { false, false }, "any: false")
  T.is(val(z:all { dim = 2 }), { true, true }, "all: true")
  T.ok(z:mean():item() ~= z:mean():item(), "mean: NaN")
  T.ok(z:var { dim = 2 }:totable()[1] ~= z:var { dim = 2 }:totable()[1], "var: NaN")
  T.ok(z:std():item() ~= z:std():item(), "std: NaN")
  T.is(z:norm():item(), 0.0, "norm: 0")
  T.is(z:logsumexp():item(), -1 / 0, "logsumexp: -inf")
  T.is(z:sum { dim = 1 }.shape, { 0 }, "reducing the other dim: an empty result")
  for _, op in ipairs { "max", "min", "argmax", "argmin" } do
    T.raises_at(function() return z[op](z, { dim = 2 }) end, op .. ": the reduction of an empty tensor has no identity",
                op .. " raises")
  end
  T.is(val(z:cumsum(2)), { {}, {} }, "cumsum of nothing")
  T.is(z:softmax(2).shape, { 2, 0 }, "softmax of nothing")
end)

T.done()
