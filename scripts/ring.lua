-- Ring exchange: every rank sends its block to the next rank and receives
-- the previous rank's, world_size - 1 times, so each ends holding every
-- block (an all_gather by hand).  The sends and receives of a step go in one
-- gpu.group, so no rank waits for a receive that comes after its own send.
--
--   gpulua -n 4 scripts/ring.lua [elements per block]
local gpu = require "gpu"

local r, w = gpu.rank, gpu.world_size
local n = tonumber(arg[1]) or 1 << 16
local nxt, prv = (r + 1) % w, (r - 1) % w

local all = gpu.zeros({ w, n })
all:narrow(1, r + 1, 1):fill(r + 1)        -- my block: r + 1 everywhere
local have = r
for _ = 1, w - 1 do
  local from = (have - 1) % w
  gpu.group(function()
    gpu.send(all:narrow(1, have + 1, 1), nxt)
    gpu.recv(all:narrow(1, from + 1, 1), prv)
  end)
  have = from
end
-- every block q holds q + 1: the sum is n * w (w + 1) / 2
local got, want = all:sum():item(), n * w * (w + 1) // 2
print(string.format("ring: rank %d holds %d blocks of %d, sum %g, %s", r, w, n, got,
                    got == want and "check ok" or "check FAILED"))
if got ~= want then error("ring: wrong sum") end
