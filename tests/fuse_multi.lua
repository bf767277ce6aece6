-- gpu.fuse with several results (issue 32): the results of one shape are
-- ONE op, one pass, that reads every input before it writes any result
-- (an optimizer step updates its tensors in place); they equal the unfused
-- ops bit for bit; results of other shapes, trailing reductions and more
-- than four results split into more ops; the outputs are written as one op
-- for gpu.stats, graphs and the race checker; bad outputs are refused.
local gpu = require "gpu"
local T = require "gpu.test"

math.randomseed(3232)
local helpers = dofile((arg[0]:match("^(.*)/") or ".") .. "/fuse/helpers.lua")
local rand, unfused, launches = helpers.rand, helpers.unfused, helpers.launches

-- equal element for element: NaN equals NaN, -0 is not 0
local check = T.same

-- Adam's update of p, m and v: three results of one shape
local adam = gpu.fuse(function(p, g, m, v, lr, b1, b2, c1, c2, eps)
  local m2 = m * b1 + g * c1
  local v2 = v * b2 + g * g * c2
  local p2 = p - lr * m2 / (v2:sqrt() + eps)
  return p2, m2, v2
end, { name = "adam" })
local H = { 0.01, 0.9, 0.999, 0.1, 0.001, 1e-8 }
-- adam of p, g, m, v with H (and options o)
local function step(p, g, m, v, o)
  if o then return adam(p, g, m, v, H[1], H[2], H[3], H[4], H[5], H[6], o) end
  return adam(p, g, m, v, table.unpack(H))
end

T.test("three results of one shape: one op, the unfused ops' values bit for bit", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16" } do
    local sh = { 3, 700 }
    local p, g, m, v = rand(sh, dt), rand(sh, dt), rand(sh, dt), rand(sh, dt):abs()
    adam(p, g, m, v, table.unpack(H))
    local n, a, b, c = launches(function() return adam(p, g, m, v, table.unpack(H)) end)
    T.is(n, 1, dt .. ": one launch for three results")
    local a2, b2, c2 = unfused(adam, p, g, m, v, table.unpack(H))
    check(a, a2, dt .. ": p")
    check(b, b2, dt .. ": m")
    check(c, c2, dt .. ": v")
  end
end)

T.test("in place: every input is read before any result is written", function()
  local sh = { 5, 1001 }
  local p, g, m, v = rand(sh), rand(sh), rand(sh), rand(sh):abs()
  local want = table.pack(adam(p, g, m, v, table.unpack(H)))
  local n, rp, rm, rv = launches(function()
    return step(p, g, m, v, { out = { p, m, v } })
  end)
  T.is(n, 1, "one launch")
  T.ok(rp == p and rm == m and rv == v, "returns the outs")
  check(p, want[1], "p updated in place")
  check(m, want[2], "m updated in place")
  check(v, want[3], "v updated in place")
  -- m first: one op at a time, p's would read the new m
  local mvp = gpu.fuse(function(p_, g_, m_, v_)
    local a, b = adam(p_, g_, m_, v_, table.unpack(H))
    local _, _, c = adam(p_, g_, m_, v_, table.unpack(H))
    return b, c, a
  end, { name = "mvp" })
  local q, gq, mq, vq = rand(sh), rand(sh), rand(sh), rand(sh):abs()
  local wq = table.pack(adam(q, gq, mq, vq, table.unpack(H)))
  mvp(q, gq, mq, vq, { out = { mq, vq, q } })
  check(q, wq[1], "results in another order: p")
  check(mq, wq[2], "results in another order: m")
  -- the reference path means the same: all computed, then written
  local p2, g2, m2, v2 = rand(sh), rand(sh), rand(sh), rand(sh):abs()
  local w2 = table.pack(adam(p2, g2, m2, v2, table.unpack(H)))
  unfused(step, p2, g2, m2, v2, { out = { p2, m2, v2 } })
  check(p2, w2[1], "unfused: p in place")
  check(m2, w2[2], "unfused: m in place")
end)

T.test("outputs of any layout; inputs broadcast and transposed", function()
  local f = gpu.fuse(function(a, b, s) return a * b + s, (a - b):abs(), a:gt(b) end, { name = "three" })
  local a, b = rand({ 40, 30 }):t(), rand({ 1, 40 })
  local n, x, y, z = launches(function() return f(a, b, 2.5) end)
  T.is(n, 1, "one launch")
  local x2, y2, z2 = unfused(f, a, b, 2.5)
  check(x, x2, "a * b + s")
  check(y, y2, "|a - b|")
  check(z, z2, "a > b (bool among floats)")
  local ox, oy, oz = gpu.zeros({ 40, 30 }):t(), gpu.zeros({ 40, 30 }):t(), gpu.zeros({ 30, 40 }, { dtype = "bool" })
  f(a, b, 2.5, { out = { ox, oy, oz } })
  check(ox, x2, "into a transposed view")
  check(oy, y2, "into another")
  check(oz, z2, "into a contiguous bool")
end)

T.test("what is one op and what is not", function()
  local x, row = rand({ 4, 600 }), rand({ 1, 600 })
  local same_shape = gpu.fuse(function(a, r) return a * r, a + r, a:exp() end)
  T.is((launches(function() return same_shape(x, row) end)), 1, "three of one shape (broadcast): one op")
  local two_shapes = gpu.fuse(function(a, r) return a * r, r:exp() end)
  local n, u, w = launches(function() return two_shapes(x, row) end)
  T.is(n, 2, "a result of the row's shape: its own op")
  check(u, x * row, "the full one")
  check(w, row:exp(), "the row one")
  local with_sum = gpu.fuse(function(a) local y = a * 2 return y, y:sum(), a + 1 end)
  local n2, y, sm, z = launches(function() return with_sum(x) end)
  T.is(n2, 2, "a reduction is its own op; the two others one")
  check(y, x * 2, "y")
  check(z, x + 1, "a + 1")
  T.is(sm:item(), (x * 2):sum():item(), "the sum")
  local six = gpu.fuse(function(a) return a + 1, a + 2, a + 3, a + 4, a + 5, a + 6 end)
  local n3 = launches(function() return six(x) end)
  T.is(n3, 2, "six results: four in one op, two in another")
  local r = table.pack(six(x))
  for k = 1, 6 do check(r[k], x + k, "result " .. k .. " of six") end
  local twice = gpu.fuse(function(a) local y = a:sin() return y, y, a end)
  local n4, p, q, s = launches(function() return twice(x) end)
  T.is(n4, 1, "one value returned twice, and an input: one op")
  check(p, x:sin(), "first")
  check(q, x:sin(), "second")
  check(s, x, "the input itself")
  T.ok(p ~= q, "two tensors")
end)

T.test("a result that the next op reads with a number (the host pairs such ops in one loop)", function()
  local f = gpu.fuse(function(a, b) local y = a * b return y, y + 1, (a - b) * 2 end)
  local a, b = rand({ 3, 1000 }), rand({ 3, 1000 })
  local y, z, w = f(a, b)
  check(y, a * b, "y = a * b, read next by y + 1")
  check(z, a * b + 1, "y + 1")
  check(w, (a - b) * 2, "(a - b) * 2, a pair of its own")
end)

T.test("several reductions of one dim and dtype: one op, the unfused bits", function()
  local x = rand({ 37, 1001 })
  local stats = gpu.fuse(function(a) return a:sum(), (a * a):sum(), a:max(), a:min() end)
  local n, s, q, mx, mn = launches(function() return stats(x) end)
  T.is(n, 1, "sum, sum of squares, max, min: one op")
  check(s, x:sum(), "sum")
  check(q, (x * x):sum(), "sum of squares")
  check(mx, x:max(), "max")
  check(mn, x:min(), "min")
  local rows = gpu.fuse(function(a) return a:mean(2), (a - 1):prod { dim = 2, keepdim = true } end)
  local n2 = launches(function() return rows(x) end)
  T.is(n2, 2, "keepdim differs: two ops")
  local cols = gpu.fuse(function(a) return a:sum(1), a:abs():max { dim = 1 }, a:gt(0):to("f32"):mean(1) end)
  local n3, c1, c2, c3 = launches(function() return cols(x) end)
  T.is(n3, 1, "three reductions over dim 1: one op")
  check(c1, x:sum(1), "column sums")
  check(c2, x:abs():max { dim = 1 }, "column max of |x|")
  check(c3, x:gt(0):to("f32"):mean(1), "column means of x > 0")
  local mixed = gpu.fuse(function(a) return a:sum(), a:sum(1), a:to("f64"):sum(), a * 2 end)
  local n4 = launches(function() return mixed(x) end)
  T.is(n4, 4, "another dim, another dtype, an elementwise result: four ops")
  local o = { gpu.empty({}), gpu.empty({}) }
  local r1, r2 = gpu.fuse(function(a) return a:sum(), a:max() end)(x, { out = o })
  T.ok(r1 == o[1] and r2 == o[2], "out: the reductions' outputs")
  check(o[1], x:sum(), "the sum into out[1]")
  check(o[2], x:max(), "the max into out[2]")
end)

T.test("inputs that do not broadcast together: one op per result, as unfused", function()
  local f = gpu.fuse(function(a, b) return a * 2, b * 3 end)
  local a, b = rand({ 3 }), rand({ 4 })
  local n, x, y = launches(function() return f(a, b) end)
  T.is(n, 2, "two ops")
  check(x, a * 2, "a * 2 of {3}")
  check(y, b * 3, "b * 3 of {4}")
  local c = rand({ 3 })
  local n2 = launches(function() return f(a, c) end)
  T.is(n2, 1, "the same function, shapes that agree: one op")
end)

T.test("bad outputs: refused, naming the call, nothing written", function()
  local sh = { 2, 600 }
  local p, g, m, v = rand(sh), rand(sh), rand(sh), rand(sh):abs()
  local keep = p:clone()
  T.raises(function() step(p, g, m, v, { out = { p, m } }) end,
           "adam: out must be a list of 3 tensors", "two outs for three results")
  T.raises(function() step(p, g, m, v, { out = { p, p, v } }) end,
           "adam: results 1 and 2 are written to overlapping memory", "one tensor for two results")
  T.raises(function() step(p, g, m, v, { out = { p, m:narrow(2, 1, 300), v } }) end,
           "does not match the result", "an out of the wrong shape")
  T.raises(function() step(p, g, m, v, { out = { p, gpu.zeros(sh, { dtype = "f64" }), v } }) end,
           "does not match the result", "an out of the wrong dtype")
  T.raises(function() step(p, g, m, v, { out = { p, gpu.zeros({ 1, 600 }):expand(sh), v } }) end,
           "expand", "an expanded out")
  T.raises(function() step(p, g, m, v, { out = { p, "m", v } }) end, "gpu.Tensor expected",
           "a string for an out")
  gpu.synchronize()
  check(p, keep, "p untouched by the refused calls")
end)

T.test("inside gpu.graph: one node writes every result, replayed", function()
  local sh = { 3, 500 }
  local p, g, m, v = rand(sh), rand(sh), rand(sh), rand(sh):abs()
  local p0, m0, v0 = p:clone(), m:clone(), v:clone()
  local graph = gpu.graph(function() step(p, g, m, v, { out = { p, m, v } }) end)
  T.is(graph.nodes, 1, "one node")
  local wp, wm, wv = p0, m0, v0
  for round = 1, 2 do
    graph:launch()
    gpu.synchronize()
    wp, wm, wv = adam(wp, g, wm, wv, table.unpack(H))
    check(p, wp, "p after replay " .. round)
    check(m, wm, "m after replay " .. round)
    check(v, wv, "v after replay " .. round)
  end
  graph:close()
end)

T.test("large tensors split over the host's threads, in place", function()
  local sh = { 3, 100003 }
  local p, g, m, v = rand(sh), rand(sh), rand(sh), rand(sh):abs()
  local want = table.pack(unfused(adam, p, g, m, v, table.unpack(H)))
  step(p, g, m, v, { out = { p, m, v } })
  check(p, want[1], "p")
  check(m, want[2], "m")
  check(v, want[3], "v")
end)

T.test("under --check races: every result is a write of the one op", function()
  local script = T.tmpfile([[
local gpu = require "gpu"
local f = gpu.fuse(function(a) return a + 1, a * 2 end, { name = "pair" })
local x, y, z = gpu.ones({ 1000 }), gpu.zeros({ 1000 }), gpu.zeros({ 1000 })
local s1, s2 = gpu.stream(), gpu.stream()
do local _ <close> = gpu.using(s1); f(x, { out = { y, z } }) end
s2:wait(s1)
do local _ <close> = gpu.using(s2); local w = z * 3 end
gpu.synchronize()
print("ordered ok")
do local _ <close> = gpu.using(s1); f(x, { out = { y, z } }) end
do local _ <close> = gpu.using(s2); local w = z * 3 end
gpu.synchronize()
print("unreachable")
]])
  local out = T.run("", "--check races " .. script)
  T.ok(out:find("ordered ok", 1, true), "an ordered script runs")
  T.ok(out:find("pair", 1, true) and out:find("race", 1, true) and not out:find("unreachable", 1, true),
       "reading the second result unordered is refused, naming the call")
  if not out:find("race", 1, true) then T.diag(out) end
end)

T.done()
