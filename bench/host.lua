-- The host backend beside NumPy (issue 32, item 5): built-in elementwise ops,
-- GELU unfused and fused, and x:sum() on 2^20 f32 (2^16 with BENCH_QUICK),
-- each the median over rounds of a timed loop with gpu.synchronize() around
-- it, in us per call.  bench/numpy_peer.py times the same forms in NumPy on
-- one thread; bench/run.lua prints both and the ratios.
--
--   build/gpulua --device host bench/host.lua
local gpu = require "gpu"
local HERE = arg[0]:match("^(.*)/") or "."
package.path = HERE .. "/?.lua;" .. package.path
local B = require "benchlib"

local N = B.quick and 1 << 16 or 1 << 20
local ROUNDS = B.quick and 3 or 7
local TARGET_S = B.quick and 0.02 or 0.2   -- a round lasts about this long

local x = gpu.rand(N, { seed = 32 })

local function gelu(t)
  return t:mul(t):mul(t):mul(0.044715):add(t):mul(0.7978845608):tanh():add(1):mul(t):mul(0.5)
end
local gelu_fused = gpu.fuse(gelu, { name = "gelu" })

-- us per call: calls per round sized from one timed call
local function time(f)
  f()
  gpu.synchronize()
  local t0 = gpu.clock()
  f()
  gpu.synchronize()
  local calls = math.max(3, math.floor(TARGET_S / math.max(gpu.clock() - t0, 1e-6)))
  local r = {}
  for i = 1, ROUNDS do
    collectgarbage()
    t0 = gpu.clock()
    for _ = 1, calls do f() end
    gpu.synchronize()
    r[i] = (gpu.clock() - t0) / calls * 1e6
  end
  return B.median(r)
end

local size = string.format("2^%d f32", math.floor(math.log(N, 2) + 0.5))
local ROWS = {
  { "host_add1", "`x + 1`", function() return x + 1 end },
  { "host_exp", "`x:exp()`", function() return x:exp() end },
  { "host_tanh", "`x:tanh()`", function() return x:tanh() end },
  { "host_chain3", "`(x * 2 + 1):relu()`", function() return (x * 2 + 1):relu() end },
  { "host_gelu", "GELU as 9 ops", function() return gelu(x) end },
  { "host_gelu_fused", "GELU fused (`gpu.fuse`)", function() return gelu_fused(x) end },
  { "host_sum", "`x:sum()`", function() return x:sum() end },
}
for _, row in ipairs(ROWS) do
  B.row(row[1], time(row[3]), "us", string.format("host backend: %s, %s", row[2], size))
end

-- the fused GELU is the unfused one, bit for bit
local a, b = gelu(x), gelu_fused(x)
B.check("host_gelu_fused", a:eq(b):all(), "fused GELU differs from the unfused ops")
