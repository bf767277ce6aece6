-- scripts/overlap.lua written with gpu.pipeline: the same batches, compute,
-- checks and printed lines, the streams, events and device buffers left to
-- the module.
--
--   gpulua scripts/overlap_pipeline.lua [batches [elements_per_batch]] [passes=N|passes=auto]
--                                       [trace=FILE.svg|FILE.json] [graph]
--
-- As in overlap.lua, every batch starts in its own pinned buffer filled
-- before the timed region; they are handed to the module as `inputs`, so the
-- timed pipeline is the two device engines alone (the host never waits in
-- it).  depth = 2: two device buffers take turns.  The compute stage works
-- out y = relu(2x - 1) in place, then `passes` more in-place passes (x2, x0.5
-- in turn: exact), then y's sum, min and max, checked against the closed
-- forms at the end.  passes=auto (the default) calibrates them so that one
-- batch's compute takes about as long as one batch's copy.  Times come from
-- the module's events (timing = true).  trace=FILE writes the timeline of
-- the timed pipeline alone (setup and checks left out) as an SVG picture or
-- a Chrome trace (gpu.trace).  graph: the module captures each slot's compute
-- once (graph = true) and replays it per batch; a replay adds the sum, min
-- and max into the row of a results tensor that a device counter names (as
-- overlap.lua graph).

local gpu = require "gpu"
local pipeline = require "gpu.pipeline"

local args = arg or {}
local pos, passes_opt, trace_file, graph = {}, "auto", nil, false
for i = 1, #args do
  local a = args[i]
  if a:match("^passes=") then
    passes_opt = a:sub(8)
  elseif a:match("^trace=.") then
    trace_file = a:sub(7)
  elseif a == "graph" then
    graph = true
  elseif a == "unsafe" then
    error("overlap_pipeline: no 'unsafe' variant: gpu.pipeline always orders its stages with events", 0)
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

-- the batches, in pinned memory: src[b] = ramp + b, ramp[j] = (j-1)/n
local ramp = gpu.arange(n, { dtype = "f32", device = "pinned" }):div_(n)
local src = {}
for b = 1, nbatches do
  src[b] = gpu.pinned({n}, { dtype = "f32" })
  ramp:add(b, { out = src[b] })
end

-- one batch's compute on x (enqueued on the current stream); with st, the
-- sum, min and max go into st[1], st[2], st[3]
local prep = gpu.fuse(function(x) return (x * 2 - 1):relu() end, { name = "relu(2x - 1)" })
local function compute(x, passes, st)
  prep(x, { out = x })   -- one pass, in place
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
    local e0 <close> = s:record { timing = true }
    fn()
    local e1 <close> = s:record { timing = true }
    e1:synchronize()
    t[i] = e1 - e0
  end
  table.sort(t)
  return t[2]
end

local passes, calibration = fixed_passes, "fixed"
if not passes then
  -- as overlap.lua: one copy, one pair of passes, and the rest of one
  -- batch's compute, alone, on streams and a buffer of the calibration's own
  local copy_stream <close> = gpu.stream()
  local compute_stream <close> = gpu.stream()
  local x <close> = gpu.empty({n}, { dtype = "f32" })
  local copy_ms = time_on(copy_stream, function() x:copy(src[1], { stream = copy_stream }) end)
  local _ <close> = gpu.using(compute_stream)
  local fixed_ms = time_on(compute_stream, function() compute(x, 0) end)
  local pair_ms = time_on(compute_stream, function() x:mul_(2):mul_(0.5) end)
  passes = 2 * math.max(0, math.floor((copy_ms - fixed_ms) / (2 * pair_ms) + 0.5))
  passes = math.min(passes, 4096)
  calibration = string.format("calibrated: copy %.3f ms, fixed part %.3f ms, pass %.4f ms",
                              copy_ms, fixed_ms, pair_ms / 2)
end

-- the fused step's first call (trace, compile or the disk cache) before
-- the timed region, as overlap.lua's ops need none (with passes= given
-- there is no calibration to make it)
do
  local w <close> = gpu.zeros({n}, { dtype = "f32" })
  prep(w, { out = w })
end

local results = {}                         -- per batch: device scalars, read at the end
gpu.synchronize()                          -- setup done; time only the pipeline

if trace_file then gpu.trace.start() end
local spec = {
  inputs = src, depth = 2, timing = true, name = "overlap_pipeline",
  compute = function(b, x) results[b] = compute(x, passes) end,
}
local rows
if graph then
  -- a replay adds its sum, min and max into the row of rows that the
  -- device counter row names, and moves row on (as overlap.lua graph)
  rows = gpu.zeros({ nbatches, 3 }, { dtype = "f32" })
  local row = gpu.ones({ 1, 1 }, { dtype = "i64" })
  spec.graph = true
  spec.compute = function(_, x)
    local st = compute(x, passes, gpu.empty({ 3 }, { dtype = "f32" }))
    rows:scatter_add_(1, row:expand({ 1, 3 }), st:view({ 1, 3 }))
    row:add_(1)
  end
  gpu.synchronize()
end
local stats = pipeline.run(spec)
if trace_file then
  gpu.trace.stop()
  gpu.trace.write(trace_file)
end

-- check against closed forms: y[j] = 2b - 1 + 2(j-1)/n, all positive for b >= 1
local bad = 0
local graph_rows = graph and rows:totable()
for b = 1, nbatches do
  local r = graph and graph_rows[b] or results[b]
  local sum, lo, hi
  if graph then sum, lo, hi = table.unpack(r) else sum, lo, hi = r.sum:item(), r.min:item(), r.max:item() end
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
  error(string.format("overlap: %d batches x %.1f MiB, check FAILED for %d of %d batches (gpu.pipeline)",
                      nbatches, mib, bad, nbatches), 0)
end
print(string.format("overlap: %d batches x %.1f MiB, check ok", nbatches, mib))
print(string.format("compute: %d passes per batch (%s)%s", passes, calibration,
                    graph and ", replayed from a graph per slot" or ""))

-- The same figures as overlap.lua's, from the module's events (ms since its
-- start event): per-batch copy and compute intervals, each measured while
-- the other engine was busy, so efficiency measures the schedule alone.
local tl = stats.timeline
local copy_ms, comp_ms, hidden_ms = 0, 0, 0
for b = 1, nbatches do
  local c0, c1 = tl[b].h2d[1], tl[b].h2d[2]
  copy_ms = copy_ms + (c1 - c0)
  comp_ms = comp_ms + (tl[b].compute[2] - tl[b].compute[1])
  -- copy time hidden behind compute: the part of this copy inside some compute
  for j = 1, nbatches do
    local k0, k1 = tl[j].compute[1], tl[j].compute[2]
    hidden_ms = hidden_ms + math.max(0, math.min(c1, k1) - math.max(c0, k0))
  end
end
local total_ms = stats.device_ms
-- a 2-stage pipeline at best: the longer stage throughout, plus the shorter
-- stage of one batch to fill it (first copy) or drain it (last compute)
local ideal_ms = math.max(copy_ms, comp_ms) + math.min(copy_ms, comp_ms) / nbatches
print(string.format("time:    total %.2f ms   copy %.2f ms (%.2f GiB/s)   compute %.2f ms",
                    total_ms, copy_ms, nbatches * n * 4 / 2 ^ 30 / (copy_ms / 1000), comp_ms))
print(string.format("efficiency: %.3f (ideal %.2f ms = max(copy, compute) + min(copy, compute) / batches; measured %.2f ms)",
                    ideal_ms / total_ms, ideal_ms, total_ms))
print(string.format("overlap: %.0f%% of copy time hidden behind compute (%.2f of %.2f ms; at most %.0f%%), "
                    .. "%.2fx vs back to back", 100 * hidden_ms / copy_ms, hidden_ms, copy_ms,
                    100 * (nbatches - 1) / nbatches, (copy_ms + comp_ms) / total_ms))
print(string.format("pipeline: gpu.pipeline depth %d, %d host waits before the drain, %.2f GB/s host-timed",
                    stats.depth, stats.waits, stats.gbps))
