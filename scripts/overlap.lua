-- Double buffering: copy batch b+1 host -> device while computing on batch b.
--
--   gpulua scripts/overlap.lua [batches [elements_per_batch [unsafe]]]
--
-- Two pinned staging buffers and two device buffers take turns.  A transfer
-- stream does the H2D copies, a compute stream does the math, and events
-- order them:
--
--   copy_done[k]  recorded on the transfer stream after the copy into dev[k];
--                 the compute stream waits on it before reading dev[k].
--   comp_done[k]  recorded on the compute stream after the last op on dev[k];
--                 the transfer stream waits on it before overwriting dev[k].
--
-- and the host waits on copy_done[k] before refilling stage[k], so it never
-- writes a pinned buffer that a copy is still reading.  (gpulua would fence
-- that host write by itself; the wait shows where the dependency is.)
--
-- Each batch b holds x[j] = b + (j-1)/n.  The compute stream works out
-- y = relu(2x - 1) and its sum, min and max, which are checked against the
-- closed forms at the end.  Pass "unsafe" as the third argument to drop the
-- two stream waits and watch the check fail: the transfer stream then runs
-- ahead and overwrites device buffers that batches still queued on the
-- compute stream were meant to read.

local gpu = require "gpu"

local args = arg or {}
local nbatches = math.tointeger(tonumber(args[1]) or 16)
local n = math.tointeger(tonumber(args[2]) or 1 << 20)
local unsafe = args[3] == "unsafe"
assert(nbatches and nbatches >= 1, "batches must be a positive integer")
assert(n and n >= 2 and n <= 1 << 24, "elements per batch must be an integer in [2, 2^24]")

local copy_stream = gpu.stream()
local compute_stream = gpu.stream()

-- ramp[j] = (j-1)/n, made once on the host; batch b is ramp + b
local ramp = gpu.arange(n, { dtype = "f32", device = "pinned" }):div_(n)

local stage, dev, copy_done, comp_done = {}, {}, {}, {}
for k = 1, 2 do
  stage[k] = gpu.pinned({n}, { dtype = "f32" })
  dev[k] = gpu.empty({n}, { dtype = "f32" })
  copy_done[k] = gpu.event()
  comp_done[k] = gpu.event()
end

local results = {}                         -- per batch: device scalars, read at the end
local timing = {}                          -- per batch: events around copy and compute
gpu.synchronize()                          -- setup done; time only the pipeline

local start = copy_stream:record { timing = true }
compute_stream:wait(start)

for b = 1, nbatches do
  local k = (b - 1) % 2 + 1
  local tm = {}

  -- host: produce batch b in stage[k], once the copy of batch b-2 has read it
  if b > 2 then copy_done[k]:synchronize() end
  ramp:add(b, { out = stage[k] })

  -- transfer stream: dev[k] may still be in use by the compute of batch b-2
  if b > 2 and not unsafe then copy_stream:wait(comp_done[k]) end
  tm.copy0 = copy_stream:record { timing = true }
  dev[k]:copy(stage[k], { stream = copy_stream })
  tm.copy1 = copy_stream:record { timing = true }
  copy_done[k]:record(copy_stream)

  -- compute stream: start batch b when its data has arrived
  if not unsafe then compute_stream:wait(copy_done[k]) end
  do
    local _ <close> = gpu.using(compute_stream)
    tm.comp0 = compute_stream:record { timing = true }
    local y = dev[k]:mul(2):sub_(1):relu_()
    results[b] = { sum = y:sum(), min = y:min(), max = y:max() }
    tm.comp1 = compute_stream:record { timing = true }
  end
  comp_done[k]:record(compute_stream)
  timing[b] = tm
end

local stop = compute_stream:record { timing = true }
gpu.synchronize()

-- check against closed forms: y[j] = 2b - 1 + 2(j-1)/n, all positive for b >= 1
local bad = 0
for b = 1, nbatches do
  local r = results[b]
  local sum, lo, hi = r.sum:item(), r.min:item(), r.max:item()
  local want_sum = 2.0 * n * b - 1                  -- n(2b-1) + 2/n * n(n-1)/2
  local want_hi = 2 * b - 1 + 2 * (n - 1) / n       -- before f32 rounding
  local ok = lo == 2 * b - 1
      and math.abs(hi - want_hi) <= 4 * 2.0 ^ -23 * want_hi
      and math.abs(sum - want_sum) <= 1e-4 * want_sum
  if not ok then
    bad = bad + 1
    if bad <= 3 then
      print(string.format("overlap: batch %d wrong: sum %.9g (want %.9g) min %.9g (want %d) max %.9g (want %.9g)",
                          b, sum, want_sum, lo, 2 * b - 1, hi, want_hi))
    end
  end
end

local mib = n * 4 / 2 ^ 20
if bad > 0 then
  error(string.format("overlap: %d batches x %.1f MiB, check FAILED for %d of %d batches%s",
                      nbatches, mib, bad, nbatches, unsafe and " (unsafe: no event waits)" or ""), 0)
end
print(string.format("overlap: %d batches x %.1f MiB, check ok", nbatches, mib))

-- copy time hidden behind compute: how much of each copy's interval lies
-- inside some batch's compute interval (all times from the start event)
local copy_ms, comp_ms, hidden_ms = 0, 0, 0
for b = 1, nbatches do
  local c0, c1 = timing[b].copy0 - start, timing[b].copy1 - start
  copy_ms = copy_ms + (c1 - c0)
  comp_ms = comp_ms + (timing[b].comp1 - timing[b].comp0)
  for j = 1, nbatches do
    local k0, k1 = timing[j].comp0 - start, timing[j].comp1 - start
    hidden_ms = hidden_ms + math.max(0, math.min(c1, k1) - math.max(c0, k0))
  end
end
local total_ms = stop - start
print(string.format("time:    total %.2f ms   copy %.2f ms (%.2f GiB/s)   compute %.2f ms",
                    total_ms, copy_ms, nbatches * n * 4 / 2 ^ 30 / (copy_ms / 1000), comp_ms))
print(string.format("overlap: %.0f%% of copy time hidden behind compute (%.2f of %.2f ms; at most %.0f%%), "
                    .. "%.2fx vs back to back", 100 * hidden_ms / copy_ms, hidden_ms, copy_ms,
                    100 * (nbatches - 1) / nbatches, (copy_ms + comp_ms) / total_ms))
