-- What the gpu.fuse tests of several results share: random tensors, the
-- unfused reference path and op counts.  tests/fuse_multi.lua and
-- tests/fuse_reduce_multi.lua load it with dofile from their own folder.
local gpu = require "gpu"
local core = require "gpu._fuse"
local H = {}

-- a tensor of shape and dtype dt (default f32), uniform in [-3, 3)
function H.rand(shape, dt)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local v = {}
  for i = 1, n do v[i] = (math.random() - 0.5) * 6 end
  return gpu.tensor(v, { dtype = dt or "f32" }):view(shape)
end

-- f(...) on the unfused ops (gpu._fuse's reference path); the path is
-- switched back off when f raises, so that one failure does not turn the
-- later tests into comparisons of the reference with itself
function H.unfused(f, ...)
  core.unfused = true
  local r = table.pack(pcall(f, ...))
  core.unfused = false
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- how many ops fn() submitted, then its results
function H.launches(fn)
  gpu.synchronize()
  local l0 = gpu.stats().launches
  local r = table.pack(fn())
  return gpu.stats().launches - l0, table.unpack(r, 1, r.n)
end

return H
