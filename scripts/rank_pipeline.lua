-- A two-rank pipeline: rank 0 produces batches and sends each to rank 1,
-- which consumes them (here: sums them) while rank 0 makes the next one.
-- Two buffers on each side: batch k+1 is made while batch k is in flight.
--
--   gpulua -n 2 scripts/rank_pipeline.lua [batches] [elements]
local gpu = require "gpu"

local r, w = gpu.rank, gpu.world_size
if w ~= 2 then error("rank_pipeline.lua runs with -n 2 (got a world of " .. w .. ")") end
local batches = tonumber(arg[1]) or 16
local n = tonumber(arg[2]) or 1 << 18
local s = gpu.stream()
local o = { stream = s }
local buf = { gpu.empty({ n }, o), gpu.empty({ n }, o) }

if r == 0 then
  for k = 1, batches do
    local b = buf[k % 2 + 1]
    b:fill(k, o)                    -- "produce" batch k
    gpu.send(b, 1, o)               -- in stream order: made before it is sent
  end
  s:synchronize()
  print(string.format("rank_pipeline: rank 0 sent %d batches of %d", batches, n))
else
  local total = gpu.zeros({ 1 }, o)
  for k = 1, batches do
    local b = buf[k % 2 + 1]
    gpu.recv(b, 0, o)
    total:add_(b:sum(o), o)          -- "consume" batch k
  end
  local got, want = total:item(o), n * batches * (batches + 1) / 2
  print(string.format("rank_pipeline: rank 1 consumed %d batches, sum %g, %s", batches, got,
                      got == want and "check ok" or "check FAILED"))
  if got ~= want then error("rank_pipeline: wrong sum") end
end
