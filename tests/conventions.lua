-- One calling convention for dims (issue 34, item 1, first slice): every
-- reduction takes its dim first or in the options table, t:sum(2),
-- t:sum(2, {keepdim = true}), t:sum{dim = 2, keepdim = true}, with the same
-- result; the row ops (cumsum, cumprod, softmax, log_softmax) take dim
-- first or {dim =}; sort, argsort and topk too, the last dim by default.  A dim given both ways must agree; bad dims get the one range
-- message, which says where indices start.  max and min keep their number
-- operand (t:max(2) is the elementwise max with 2).
local gpu = require "gpu"
local T = require "gpu.test"

local m = gpu.arange(1, 25, { dtype = "f64" }):view({ 2, 3, 4 })

local function same(a, b, name)
  T.is(a.shape, b.shape, name .. ": shape")
  T.ok(a.dtype == b.dtype and a:eq(b):all():item(), name .. ": values")
end

local REDUCTIONS = { "sum", "mean", "prod", "var", "std", "norm", "logsumexp", "argmax", "argmin", "any", "all" }

T.test("every reduction: t:r(d) == t:r{dim = d}, with keepdim either way", function()
  for _, r in ipairs(REDUCTIONS) do
    for d = -3, 3 do
      if d ~= 0 then
        same(m[r](m, d), m[r](m, { dim = d }), r .. "(" .. d .. ")")
        same(m[r](m, d, { keepdim = true }), m[r](m, { dim = d, keepdim = true }), r .. "(" .. d .. ", keepdim)")
      end
    end
  end
end)

T.test("the positional dim reduces that dim (against a reduction by hand)", function()
  T.is(m:sum(2).shape, { 2, 4 }, "sum(2) drops dim 2")
  T.is(m:sum(3, { keepdim = true }).shape, { 2, 3, 1 }, "sum(3, {keepdim}) keeps it as 1")
  T.is(m:sum(2):totable(), { { 15, 18, 21, 24 }, { 51, 54, 57, 60 } }, "sum(2) values")
  T.is(m:to("f32"):norm(3, { p = 1 }):totable(), { { 10, 26, 42 }, { 58, 74, 90 } }, "norm(3, {p = 1})")
  T.is(m:var(1, { unbiased = false }):get(1, 1), 36.0, "var(1, {unbiased = false})")
end)

T.test("row ops: dim first or {dim =}", function()
  same(m:cumsum(3), m:cumsum { dim = 3 }, "cumsum")
  same(m:softmax(2), m:softmax { dim = 2 }, "softmax")
  same(m:log_softmax(-1), m:log_softmax { dim = -1 }, "log_softmax")
  local o = gpu.empty({ 2, 3, 4 }, { dtype = "f64" })
  T.ok(m:cumsum { dim = 3, out = o } == o, "cumsum{dim =, out =} returns out")
  same(o, m:cumsum(3), "into out")
  same(m:cumprod(2), m:cumprod { dim = 2 }, "cumprod")
end)

T.test("sort, argsort, topk: dim first, in the options, or the last by default", function()
  for d = -3, 3 do
    if d ~= 0 then
      local v1, i1 = m:sort(d, { descending = true })
      local v2, i2 = m:sort { dim = d, descending = true }
      same(v1, v2, "sort(" .. d .. ") values")
      same(i1, i2, "sort(" .. d .. ") indices")
      same(m:argsort(d), m:argsort { dim = d }, "argsort(" .. d .. ")")
      local t1, j1 = m:topk(2, d)
      local t2, j2 = m:topk(2, { dim = d })
      same(t1, t2, "topk(2, " .. d .. ") values")
      same(j1, j2, "topk(2, " .. d .. ") indices")
    end
  end
  same(m:argsort(), m:argsort(3), "the last dim by default")
  T.raises(function() m:argsort(2, { dim = 1 }) end, "argsort: dim given twice (2, and 1 in the options)",
           "two dims that differ")
  T.raises(function() m:topk(1, 2, { dim = 1 }) end, "topk: dim given twice", "topk's two dims")
end)

T.test("max and min keep their operand", function()
  T.is(m:max(2):get(1, 1, 1), 2.0, "t:max(2) is elementwise")
  T.is(m:max():item(), 24.0, "t:max() reduces")
  T.is(m:max { dim = 3 }:totable()[1], { 4, 8, 12 }, "t:max{dim = 3} reduces along 3")
end)

T.test("bad dims: clear errors", function()
  T.raises(function() m:sum(2, { dim = 1 }) end, "sum: dim given twice (2, and 1 in the options)", "two dims that differ")
  same(m:sum(2, { dim = 2 }), m:sum(2), "two dims that agree")
  T.raises(function() m:sum(0) end, "dim 0 out of range for a 3-dim tensor (1..3, or -3..-1)", "dim 0: indices start at 1")
  T.raises(function() m:sum(4) end, "dim 4 out of range", "past the last dim")
  T.raises(function() m:mean(1.5) end, "integer dim expected, got 1.5", "not an integer")
  T.raises(function() m:sum(1, 2) end, "table expected, got number", "options not a table")
  T.raises(function() gpu.tensor(5.0):sum(1) end, "sum: dim given for a 0-dim tensor", "a 0-dim tensor")
  T.raises(function() m:cumsum {} end, "cumsum: option 'dim' is required", "cumsum{} without dim")
  T.raises(function() m:cumsum { dim = 1, keepdim = true } end, "unknown option 'keepdim'", "cumsum's options")
end)

m = nil
collectgarbage()
T.done()
