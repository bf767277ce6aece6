-- Double buffering: copy batch b+1 host -> device while computing on batch b.
--
--   gpulua scripts/overlap.lua [batches [elements_per_batch]] [unsafe] [passes=N|passes=auto] [graph]
--
-- Every batch starts in its own pinned buffer, filled before the timed
-- region (batches x elements x 4 bytes of pinned memory), so the timed
-- pipeline is the two device engines alone: no host work inside it.  Two
-- device buffers take turns.  A transfer stream does the H2D copies, a
-- compute stream does the math, and events order them:
--
--   copy_done[k]  recorded on the transfer stream after the copy into dev[k];
--                 the compute stream waits on it before reading dev[k].
--   comp_done[k]  recorded on the compute stream after the last op on dev[k];
--                 the transfer stream waits on it before overwriting dev[k].
--
-- Each batch b holds x[j] = b + (j-1)/n.  The compute stream works out
-- y = relu(2x - 1) in place, then `passes` more in-place passes that multiply
-- by 2 and by 0.5 in turn (an even number: exact, so y is unchanged), then
-- y's sum, min and max, which are checked against the closed forms at the
-- end.  The passes are built-in ops only (so the script runs on the host
-- backend too); with passes=auto (the default) their number is calibrated
-- before the timed region so that one batch's compute takes about as long
-- as one batch's copy.  passes=N fixes it.
--
-- Pass "graph" to capture the compute of each device buffer once (gpu.graph)
-- and replay it for every batch in that buffer: one launch instead of its
-- ops.  The step a replay cannot take from Lua (which batch it is) it takes
-- on the device: it adds y's sum, min and max into the row of a results
-- tensor that a device counter names, and moves the counter on.
--
-- Pass "unsafe" to drop the two stream waits and watch the check fail: the
-- transfer stream then runs ahead and overwrites device buffers that batches
-- still queued on the compute stream were meant to read.

local gpu = require "gpu"

local args = arg or {}
local pos, unsafe, passes_opt, graph = {}, false, "auto", false
for i = 1, #args do
  local a = args[i]
  if a == "unsafe" then
    unsafe = true
  elseif a == "graph" then
    graph = true
  elseif a:match("^passes=") then
    passes_opt = a:sub(8)
  else
    pos[#pos + 1] = a
  end
end
local nbatches = math.tointeger(tonumber(pos[1]) or 16)
local n = math.tointeger(tonumber(pos[2]) or 1 << 20)
assert(nbatches and nbatches >= 1, "batches must be a positive integer")
assert(n and n >= 2 and n <= 1 << 24, "elements per batch must be an integer in [2, 2^24]")
local fixed_passes = passes_opt ~= "auto" and math.tointeger(tonumber(passes_opt))
assert(passes_opt == "auto" or (fixed_passes and fixed_passes >= 0 and fixed_passes % 2 == 0),
       "passes must be auto or an even integer >= 0")

local copy_stream = gpu.stream()
local compute_stream = gpu.stream()

-- the batches, in pinned memory: src[b] = ramp + b, ramp[j] = (j-1)/n
local ramp = gpu.arange(n, { dtype = "f32", device = "pinned" }):div_(n)
local src = {}
for b = 1, nbatches do
  src[b] = gpu.pinned({n}, { dtype = "f32" })
  ramp:add(b, { out = src[b] })
end

local dev, copy_done, comp_done = {}, {}, {}
for k = 1, 2 do
  dev[k] = gpu.empty({n}, { dtype = "f32" })
  copy_done[k] = gpu.event { timing = false }
  comp_done[k] = gpu.event { timing = false }
end

-- relu(2x - 1) as one op (one kernel on cuda, written in place): gpu.fuse
local relu2m1 = gpu.fuse(function(x) return (x * 2 - 1):relu() end, { name = "relu2m1" })

-- one batch's compute on x (enqueued on the current stream); with st, the
-- sum, min and max go into st[1], st[2], st[3]
local function compute(x, passes, st)
  relu2m1(x, { out = x })
  for p = 1, passes do x:mul_(p % 2 == 1 and 2 or 0.5) end
  if st then
    x:sum({ out = st:select(1, 1) })
    x:min({ out = st:select(1, 2) })
    x:max({ out = st:select(1, 3) })
    return st
  end
  return { sum = x:sum(), min = x:min(), max = x:max() }
end

-- ms taken on stream s by what fn enqueues there; the median of 3 runs
local function time_on(s, fn)
  local t = {}
  for i = 1, 3 do
    local e0 = s:record { timing = true }
    fn()
    local e1 = s:record { timing = true }
    e1:synchronize()
    t[i] = e1 - e0
  end
  table.sort(t)
  return t[2]
end

local passes, calibration = fixed_passes, "fixed"
if not passes then
  -- one copy, one pair of passes, and the rest of one batch's compute, alone
  local copy_ms = time_on(copy_stream, function() dev[1]:copy(src[1], { stream = copy_stream }) end)
  local _ <close> = gpu.using(compute_stream)
  local fixed_ms = time_on(compute_stream, function() compute(dev[1], 0) end)
  local pair_ms = time_on(compute_stream, function() dev[1]:mul_(2):mul_(0.5) end)
  passes = 2 * math.max(0, math.floor((copy_ms - fixed_ms) / (2 * pair_ms) + 0.5))
  passes = math.min(passes, 4096)
  calibration = string.format("calibrated: copy %.3f ms, fixed part %.3f ms, pass %.4f ms",
                              copy_ms, fixed_ms, pair_ms / 2)
end

-- graph: the compute of dev[k] captured once; a replay adds its sum, min
-- and max into row `row` of rows and moves row on, on the device (the two
-- graphs share both, in batch order on the compute stream)
local graphs, rows, row = {}, nil, nil
if graph then
  rows = gpu.zeros({ nbatches, 3 }, { dtype = "f32" })
  row = gpu.ones({ 1, 1 }, { dtype = "i64" })
  for k = 1, 2 do
    graphs[k] = gpu.graph(function()
      local st = compute(dev[k], passes, gpu.empty({ 3 }, { dtype = "f32" }))
      rows:scatter_add_(1, row:expand({ 1, 3 }), st:view({ 1, 3 }))
      row:add_(1)
    end, { name = "overlap compute " .. k })
  end
end

local results = {}                         -- per batch: device scalars, read at the end
local timing = {}                          -- per batch: events around copy and compute
gpu.synchronize()                          -- setup done; time only the pipeline

local start = copy_stream:record { timing = true }
compute_stream:wait(start)

for b = 1, nbatches do
  local k = (b - 1) % 2 + 1
  local tm = {}

  -- transfer stream: dev[k] may still be in use by the compute of batch b-2
  if b > 2 and not unsafe then copy_stream:wait(comp_done[k]) end
  tm.copy0 = copy_stream:record { timing = true }
  dev[k]:copy(src[b], { stream = copy_stream })
  tm.copy1 = copy_stream:record { timing = true }
  copy_done[k]:record(copy_stream)

  -- compute stream: start batch b when its data has arrived
  if not unsafe then compute_stream:wait(copy_done[k]) end
  do
    local _ <close> = gpu.using(compute_stream)
    tm.comp0 = compute_stream:record { timing = true }
    if graph then
      graphs[k]:launch()
    else
      results[b] = compute(dev[k], passes)
    end
    tm.comp1 = compute_stream:record { timing = true }
  end
  comp_done[k]:record(compute_stream)
  timing[b] = tm
end

local stop = compute_stream:record { timing = true }
gpu.synchronize()

-- check against closed forms: y[j] = 2b - 1 + 2(j-1)/n, all positive for b >= 1
local bad = 0
local graph_rows = graph and rows:totable()
for b = 1, nbatches do
  local r = results[b]
  local sum, lo, hi
  if graph then sum, lo, hi = table.unpack(graph_rows[b]) else sum, lo, hi = r.sum:item(), r.min:item(), r.max:item() end
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
-- where it ran: on the host backend both engines are CPU threads
local info = gpu.device_info(gpu.device_count() > 0 and 0 or nil)
print(string.format("device:  %s%s", info.name,
                    gpu.backend == "host" and ": the host backend, where copies and compute are CPU work" or ""))
print(string.format("compute: %d passes per batch (%s)%s", passes, calibration,
                    graph and string.format(", replayed from a graph per buffer (%d nodes)", graphs[1].nodes) or ""))

-- Everything below comes from the events of this run.  copy_ms and comp_ms
-- are the sums of the per-batch intervals, each measured while the other
-- engine was busy, so a slowdown the two engines cause each other is in the
-- ideal too and the efficiency measures the schedule alone (its gaps).
local copy_ms, comp_ms, hidden_ms, first_copy_ms = 0, 0, 0, 0
for b = 1, nbatches do
  local c0, c1 = timing[b].copy0 - start, timing[b].copy1 - start
  copy_ms = copy_ms + (c1 - c0)
  if b == 1 then first_copy_ms = c1 - c0 end
  comp_ms = comp_ms + (timing[b].comp1 - timing[b].comp0)
  -- copy time hidden behind compute: the part of this copy inside some compute
  for j = 1, nbatches do
    local k0, k1 = timing[j].comp0 - start, timing[j].comp1 - start
    hidden_ms = hidden_ms + math.max(0, math.min(c1, k1) - math.max(c0, k0))
  end
end
local total_ms = stop - start
-- a 2-stage pipeline at best: the longer stage throughout, plus the shorter
-- stage of one batch to fill it (first copy) or drain it (last compute)
local ideal_ms = math.max(copy_ms, comp_ms) + math.min(copy_ms, comp_ms) / nbatches
print(string.format("time:    total %.2f ms   copy %.2f ms (%.2f GiB/s)   compute %.2f ms",
                    total_ms, copy_ms, nbatches * n * 4 / 2 ^ 30 / (copy_ms / 1000), comp_ms))
print(string.format("efficiency: %.3f (ideal %.2f ms = max(copy, compute) + min(copy, compute) / batches; measured %.2f ms)",
                    ideal_ms / total_ms, ideal_ms, total_ms))
-- the first copy has no compute to hide behind (the compute stream waits
-- for it), so at most the other copies' share of the copy time is hidden;
-- without the waits (unsafe) there is no such bound
local bound = unsafe and "" or string.format("; at most %.0f%%: the first copy cannot be hidden",
                                             100 * (copy_ms - first_copy_ms) / copy_ms)
print(string.format("overlap: %.0f%% of copy time hidden behind compute (%.2f of %.2f ms%s), "
                    .. "%.2fx vs back to back", 100 * hidden_ms / copy_ms, hidden_ms, copy_ms, bound,
                    (copy_ms + comp_ms) / total_ms))
