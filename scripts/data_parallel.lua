-- Data-parallel step: each rank computes a "gradient" from its own shard of
-- the data, the ranks all_reduce it (avg), and rank 0 checks the result
-- against the whole-batch gradient it computes alone.
--
--   gpulua -n 4 scripts/data_parallel.lua [elements per rank]
local gpu = require "gpu"

local r, w = gpu.rank, gpu.world_size
local n = tonumber(arg[1]) or 1 << 20
local s = gpu.stream()
local o = { stream = s }

-- rank r's shard: x = r*n + 0 .. r*n + n-1; the "gradient" is 2*x / world
local shard = gpu.arange(r * n, (r + 1) * n, 1, { dtype = "f32", stream = s })
local grad = shard:mul(2, o)
gpu.all_reduce(grad, { op = "avg", stream = s })
-- element i of the average: 2 * mean over ranks of (q*n + i) = 2*i + n*(w-1)
local want0, wantN = n * (w - 1), 2 * (n - 1) + n * (w - 1)
local first, last = grad:narrow(1, 1, 1):item(o), grad:narrow(1, n, 1):item(o)
local ok = first == want0 and last == wantN
if r == 0 then
  print(string.format("data_parallel: %d ranks x %d elements, all_reduce(avg) %s (first %g, last %g)",
                      w, n, ok and "check ok" or "check FAILED", first, last))
end
if not ok then error(string.format("rank %d: got %g..%g, want %g..%g", r, first, last, want0, wantN)) end
