-- The first call of a fused GELU in a fresh process: trace, compile (or
-- read the disk cache of compiled kernels: GPULUA_KERNEL_CACHE), load,
-- run.  Prints "fuse_first <ms>"; bench/run.lua runs it twice per fresh
-- cache directory, cold and then from the cache.
local gpu = require "gpu"
local x = gpu.rand({ 1024 }, { seed = 15 })
local f = gpu.fuse(function(t)
  return t:mul(t):mul(t):mul(0.044715):add(t):mul(0.7978845608):tanh():add(1):mul(t):mul(0.5)
end, { name = "gelu" })
gpu.synchronize()
local t0 = gpu.clock()
f(x)
gpu.synchronize()
print(string.format("fuse_first %.3f", (gpu.clock() - t0) * 1e3))
