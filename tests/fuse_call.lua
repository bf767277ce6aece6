-- A gpu.fuse callable's call (issue 32): a signature already traced to one
-- op whose numbers need no check goes to the op from C (gpu._fuse's
-- caller), the rest through stdlib/gpu/fuse.lua.  Both paths must say and
-- do the same: errors at the caller's line, the op's site in messages,
-- f:stats(), the checks of number arguments, the options.
local gpu = require "gpu"
local T = require "gpu.test"
local core = require "gpu._fuse"

local x = gpu.tensor({ 1.5, -2, 3, 0.25, 4, -1 }):view({ 2, 3 })

T.test("calls are counted on both paths; a new number is no new trace", function()
  local f = gpu.fuse(function(a, s) return a * s + 1 end, { name = "axpb" })
  local r1 = f(x, 2)           -- traced (the Lua path)
  local r2 = f(x, 3)           -- the C path
  local r3 = f(x, 2.5, { out = gpu.empty({ 2, 3 }) })
  T.is(f:stats(), { traces = 1, calls = 3 }, "three calls, one trace")
  T.is(r1:totable(), (x * 2 + 1):totable(), "the first call's result")
  T.is(r2:totable(), (x * 3 + 1):totable(), "a new number, the same program")
  T.is(r3:totable(), (x * 2.5 + 1):totable(), "into out")
end)

T.test("errors at the caller's line, as on the first call", function()
  local f = gpu.fuse(function(a, s) return a * s end, { name = "scale" })
  f(x, 2)
  T.raises_at(function() f(x, 2, { out = gpu.empty({ 3 }) }) end, "does not match the result", "an out of another shape")
  T.raises_at(function() f(x, 2, { out = "y" }) end, "gpu.Tensor expected", "an out that is not a tensor")
  T.raises_at(function() f(x, 2, { outs = x }) end, "scale: unknown option 'outs'", "an unknown option")
  T.raises_at(function() f(x, "2") end, "gpu.Tensor or number expected, got string", "a string for a number")
  T.raises_at(function() f(x, 2, { stream = 5 }) end, "bad option 'stream'", "a stream that is not one")
  T.raises_at(function() f(print, 2) end, "argument 1: gpu.Tensor or number expected, got function", "a function")
  local closed = gpu.zeros({ 2, 3 })
  closed:close()
  T.raises_at(function() f(closed, 2) end, "closed", "a closed tensor")
end)

T.test("numbers of integer ops are still checked on every call", function()
  local x32 = gpu.tensor({ 7, -9, 12 }, { dtype = "i32" })
  local d = gpu.fuse(function(a, k) return a // k end, { name = "idiv" })
  T.is(d(x32, 2):totable(), { 3, -5, 6 }, "7 -9 12 // 2")
  T.raises_at(function() d(x32, 2.5) end, "has no integer representation", "2.5 for an i32 op")
  T.raises_at(function() d(x32, 0) end, "integer division by zero", "a zero divisor")
  T.raises_at(function() d(x32, 2 ^ 40) end, "does not fit in i32", "out of i32's range")
  T.is(d(x32, 3):totable(), { 2, -3, 4 }, "and a good one after")
end)

T.test("the reference path (gpu._fuse's unfused) is taken when set", function()
  local f = gpu.fuse(function(a) return a:exp() end)
  f(x)
  local l0 = gpu.stats().launches
  core.unfused = true
  local ok, r = pcall(f, x)
  core.unfused = false
  T.ok(ok, "runs")
  T.is(r:totable(), x:exp():totable(), "the same values")
  T.is(f:stats().calls, 2, "counted")
  T.ok(gpu.stats().launches - l0 >= 1, "through the ops")
end)

T.test("the op's site is the caller's line, on both paths", function()
  local script = T.tmpfile([[
local gpu = require "gpu"
local f = gpu.fuse(function(a) return a:exp():add(1) end, { name = "expadd" })
local x = gpu.ones({ 1000 })
local s1, s2 = gpu.stream(), gpu.stream()
local y = f(x)
do local _ <close> = gpu.using(s1); f(x, { out = y }) end
do local _ <close> = gpu.using(s2); f(y, { out = x }) end
gpu.synchronize()
]])
  local out = T.run("", "--check races " .. script)
  T.ok(out:find(":7: expadd: race", 1, true), "raised at the racing call's line")
  T.ok(out:find("on stream 2 (" .. script .. ":7)", 1, true) and out:find("on stream 1 (" .. script .. ":6)", 1, true),
       "each op named with its own line")
  if not out:find("race", 1, true) then T.diag(out) end
end)

x:close()
T.done()
