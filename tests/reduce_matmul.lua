-- Reductions (whole tensor and along each dim, keepdim, result dtypes) and
-- matmul, against plain-Lua references.
local gpu = require "gpu"
local T = require "gpu.test"

local M = { { 1, 5, 3 }, { 4, 2, 6 } }       -- values exact in every numeric dtype

local SUM_DT = { f32 = "f32", f64 = "f64", f16 = "f16", bf16 = "bf16",
                 i8 = "i64", u8 = "i64", i32 = "i64", i64 = "i64", bool = "i64" }
local MEAN_DT = { f32 = "f32", f64 = "f64", f16 = "f16", bf16 = "bf16",
                  i8 = "f64", u8 = "f64", i32 = "f64", i64 = "f64" }

T.test("reductions over the whole tensor, every numeric dtype", function()
  for _, dt in ipairs(T.dtypes) do
    if dt ~= "bool" then
      local t = gpu.tensor(M, { dtype = dt })
      local s = t:sum()
      T.is({ s.dtype, s.shape }, { SUM_DT[dt], {} }, dt .. " sum: dtype " .. SUM_DT[dt] .. ", 0-dim")
      T.is(s:item(), T.cast(21, SUM_DT[dt]), dt .. " sum value")
      local m = t:mean()
      T.is(m.dtype, MEAN_DT[dt], dt .. " mean dtype " .. MEAN_DT[dt])
      T.is(m:item(), T.cast(3.5, MEAN_DT[dt]), dt .. " mean value")
      local mx, mn = t:max(), t:min()
      T.is({ mx.dtype, mx:item() }, { dt, T.cast(6, dt) }, dt .. " max keeps the dtype")
      T.is({ mn.dtype, mn:item() }, { dt, T.cast(1, dt) }, dt .. " min keeps the dtype")
      local am = t:argmax()
      T.is({ am.dtype, am:item() }, { "i64", 6 }, dt .. " argmax: 1-based flat index, i64")
    end
  end
end)

T.test("reductions along a dim", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64" } do
    local t = gpu.tensor(M, { dtype = dt })
    local sdt = SUM_DT[dt]
    local c = function(list) local r = {} for i, v in ipairs(list) do r[i] = T.cast(v, sdt) end return r end
    local s1 = t:sum { dim = 1 }
    T.is({ s1.shape, s1:totable() }, { { 3 }, c { 5, 7, 9 } }, dt .. " sum{dim=1}")
    T.is(t:sum { dim = 2 }:totable(), c { 9, 12 }, dt .. " sum{dim=2}")
    T.is(t:sum { dim = -1 }:totable(), c { 9, 12 }, dt .. " sum{dim=-1} is the last dim")
    T.is(t:sum { dim = -2 }:totable(), c { 5, 7, 9 }, dt .. " sum{dim=-2}")
    local k = t:sum { dim = 2, keepdim = true }
    T.is({ k.shape, k:totable() }, { { 2, 1 }, { c { 9 }, c { 12 } } }, dt .. " sum{dim=2, keepdim}")
    T.is(t:max { dim = 1 }:totable(), { T.cast(4, dt), T.cast(5, dt), T.cast(6, dt) }, dt .. " max{dim=1}")
    T.is(t:min { dim = 2 }:totable(), { T.cast(1, dt), T.cast(2, dt) }, dt .. " min{dim=2}")
    T.is(t:argmax { dim = 1 }:totable(), { 2, 1, 2 }, dt .. " argmax{dim=1}")
    T.is(t:argmax { dim = 2 }:totable(), { 2, 3 }, dt .. " argmax{dim=2}")
    T.is(t:mean { dim = 2 }:totable(), { T.cast(3, MEAN_DT[dt]), T.cast(4, MEAN_DT[dt]) }, dt .. " mean{dim=2}")
  end
end)

T.test("3-D reductions along each dim and on views", function()
  local t = gpu.arange(24, { dtype = "i32" }):view({2, 3, 4})
  local function x(i, j, k) return (i - 1) * 12 + (j - 1) * 4 + (k - 1) end
  local r1, r2, r3 = {}, {}, {}               -- sums over dim 1, 2, 3
  for j = 1, 3 do r1[j] = {} for k = 1, 4 do r1[j][k] = x(1, j, k) + x(2, j, k) end end
  for i = 1, 2 do
    r2[i], r3[i] = {}, {}
    for k = 1, 4 do r2[i][k] = x(i, 1, k) + x(i, 2, k) + x(i, 3, k) end
    for j = 1, 3 do r3[i][j] = x(i, j, 1) + x(i, j, 2) + x(i, j, 3) + x(i, j, 4) end
  end
  T.is(t:sum { dim = 1 }:totable(), r1, "i32 {2,3,4} sum{dim=1}")
  T.is(t:sum { dim = 2 }:totable(), r2, "i32 {2,3,4} sum{dim=2}")
  T.is(t:sum { dim = 3 }:totable(), r3, "i32 {2,3,4} sum{dim=3}")
  T.is(t:sum { dim = 2, keepdim = true }.shape, { 2, 1, 4 }, "keepdim in the middle")
  local v = t:narrow(3, 2, 2)                -- non-contiguous {2,3,2}
  local ref_sum = 0
  for i = 0, 1 do for j = 0, 2 do for k = 1, 2 do ref_sum = ref_sum + i * 12 + j * 4 + k end end end
  T.is(v:sum():item(), ref_sum, "sum of a non-contiguous narrow view")
  T.is(v:max { dim = 2 }:totable(), { { 9, 10 }, { 21, 22 } }, "max{dim=2} of a narrow view")
end)

T.test("argmax first occurrence, NaN, bool", function()
  T.is(gpu.tensor({ 1, 7, 7, 2 }):argmax():item(), 2, "argmax returns the first maximum")
  T.is(gpu.tensor({ { 3, 3 }, { 1, 3 } }):argmax { dim = 2 }:totable(), { 1, 2 }, "argmax{dim} first maximum per row")
  local nan = gpu.tensor({ 1, 0 / 0, 3 }):max():item()
  T.ok(nan ~= nan, "max propagates NaN")
  local b = gpu.tensor({ false, true, false }, { dtype = "bool" })
  T.is(b:max():item(), true, "bool max")
  T.is(b:min():item(), false, "bool min")
  T.is(b:sum():item(), 1, "bool sum counts true")
  T.is(b:argmax():item(), 2, "bool argmax")
  T.is(gpu.tensor({ 100, 100, 100 }, { dtype = "i8" }):sum():item(), 300, "i8 sum accumulates in i64")
  T.is(gpu.tensor({ 1, 2 }, { dtype = "i32" }):mean():item(), 1.5, "i32 mean is f64")
end)

T.test("float sums of many values", function()
  local n = 10000
  for _, dt in ipairs(T.float_dtypes) do
    local t = gpu.rand({n}, { dtype = dt, seed = 21 })
    local vals = t:totable()
    local ref = 0
    for i = 1, n do ref = ref + vals[i] end
    local tol = ({ f64 = 1e-12, f32 = 1e-5, f16 = 2e-3, bf16 = 1e-2 })[dt]
    T.near(t:sum():item(), ref, { rel = tol }, dt .. " sum of 10000 rand")
    T.near(t:mean():item(), ref / n, { rel = tol }, dt .. " mean of 10000 rand")
  end
end)

-- plain-Lua matmul in double (or exact integers)
local function ref_matmul(a, b)
  local m, k, n = #a, #b, #b[1]
  local c = {}
  for i = 1, m do
    c[i] = {}
    for j = 1, n do
      local s = 0
      for p = 1, k do s = s + a[i][p] * b[p][j] end
      c[i][j] = s
    end
  end
  return c
end

local function ints(m, n, seed)
  local r = {}
  for i = 1, m do
    r[i] = {}
    for j = 1, n do r[i][j] = ((i * 7 + j * 3 + seed) % 11) - 5 end
  end
  return r
end

T.test("matmul in every supported dtype", function()
  local A, B = ints(5, 7, 1), ints(7, 3, 2)
  local C = ref_matmul(A, B)
  for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i32", "i64" } do
    local a = gpu.tensor(A, { dtype = dt })
    local b = gpu.tensor(B, { dtype = dt })
    local c = gpu.matmul(a, b)
    T.is({ c.shape, c.dtype }, { { 5, 3 }, dt }, dt .. " matmul shape and dtype")
    T.is(c:totable(), T.map(C, function(x) return T.cast(x, dt) end), dt .. " matmul of small integers is exact")
    T.is(a:matmul(b):totable(), c:totable(), dt .. " a:matmul(b)")
  end
  -- random floats, larger
  for _, dt in ipairs { "f32", "f64", "f16", "bf16" } do
    local a = gpu.rand({33, 40}, { dtype = dt, low = -1, high = 1, seed = 3 })
    local b = gpu.rand({40, 17}, { dtype = dt, low = -1, high = 1, seed = 4 })
    local ref = ref_matmul(a:totable(), b:totable())
    local tol = ({ f64 = 1e-12, f32 = 1e-5, f16 = 2e-3, bf16 = 1e-2 })[dt]
    T.near(gpu.matmul(a, b):totable(), ref, { rel = tol, abs = tol }, dt .. " matmul {33,40} x {40,17}")
  end
  local o = gpu.zeros({2, 2}, { dtype = "f64" })
  local r = gpu.matmul(gpu.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "f64" }),
                       gpu.tensor({ { 5, 6 }, { 7, 8 } }, { dtype = "f64" }), { out = o })
  T.is(o:totable(), { { 19.0, 22.0 }, { 43.0, 50.0 } }, "matmul{out=} writes into out")
  T.ok(rawequal(r, o), "matmul{out=} returns out")
  local s <close> = gpu.stream()
  local d = gpu.matmul(gpu.ones({4, 4}), gpu.ones({4, 4}), { stream = s })
  s:synchronize()
  T.is(d:sum():item(), 64.0, "matmul{stream=}")
end)

T.test("matmul errors", function()
  local a, b = gpu.ones({2, 3}), gpu.ones({2, 3})
  T.raises_at(function() return gpu.matmul(a, b) end, "a {2,3} @ b {2,3}: a.s dim 2 %(3%) differs from b.s dim 1 %(2%)", "inner dims mismatch raises, naming both shapes")
  T.raises_at(function() return gpu.matmul(a, gpu.ones({3, 2}, { dtype = "f64" })) end, "dtype", "dtype mismatch raises")
  T.raises_at(function() return gpu.matmul(gpu.ones({3}), gpu.ones({3})) end, { "2%-D", "dim" }, "1-D operands raise")
  T.raises_at(function() return gpu.matmul(a, gpu.ones({3, 2}), { out = gpu.empty({3, 3}) }) end, "out",
              "out= of the wrong shape raises")
  T.raises_at(function() return gpu.matmul(a, 2) end, "bad argument", "matmul(tensor, number) raises")
  T.is(gpu.matmul(a, gpu.ones({3, 2})):totable(), { { 3.0, 3.0 }, { 3.0, 3.0 } }, "runtime usable afterwards")
end)

T.test("reduction errors", function()
  local t = gpu.ones({2, 3})
  T.raises_at(function() return t:sum { dim = 3 } end, "dim", "dim out of range raises")
  T.raises_at(function() return t:sum { dim = 0 } end, "dim", "dim 0 raises (dims are 1-based)")
  T.raises_at(function() return t:max { dim = -3 } end, "dim", "dim -3 of a 2-D tensor raises")
  T.raises_at(function() return t:mean { dim = "x" } end, "bad option .dim.", "non-integer dim raises")
  T.raises_at(function() return t:mean { dim = 1.5 } end, "integer dim", "fractional dim raises")
end)

T.test("reductions into out =, also a view of a larger tensor", function()
  local t = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "f32" })
  local o = gpu.full({ 3 }, -1)
  T.is(t:sum({ dim = 1, out = o }), o, "returns out")
  T.is(o:totable(), { 5.0, 7.0, 9.0 }, "sum over dim 1 into out")
  local bucket = gpu.zeros({ 8 })
  t:max({ dim = 2, out = bucket:narrow(1, 3, 2) })
  T.is(bucket:totable(), { 0.0, 0.0, 3.0, 6.0, 0.0, 0.0, 0.0, 0.0 }, "into a slice, nothing else written")
  local s = gpu.full({ 2, 1 }, 0, { dtype = "f64" })
  t:to("f64"):var({ dim = 2, keepdim = true, out = s })
  T.is(s:totable(), { { 1.0 }, { 1.0 } }, "var with keepdim into out")
  T.raises_at(function() return t:sum({ dim = 1, out = gpu.empty({ 2 }) }) end,
              "does not match the result f32 {3}", "out of the wrong shape raises")
  T.raises_at(function() return t:argmax({ out = gpu.empty({}) }) end, "does not match the result i64",
              "out of the wrong dtype raises")
end)

T.done()
