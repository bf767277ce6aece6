-- Allocating ops in the forms users write, each a `local u = ...` in a loop:
-- gpu.empty, t + 1 and (t * 2 + 1):relu() at 1 and 2^18 f32 elements,
-- beside the in-place t:add_(1); an allocation and a stream while many
-- tensors or streams stay alive; and a loop of 1 GiB temporaries (iterations
-- per second, peak memory).  Host wall time (gpu.clock) of N calls on the
-- default stream, the device drained between repeats outside the timed
-- part, one warm-up repeat, median of the repeats: as bench/launch.lua.
-- bench/torch_peer.py times the same forms through PyTorch.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

-- outside the timed parts: the garbage of what ran before is freed
local function fresh()
  collectgarbage()
  gpu.synchronize()
end

-- median µs per call, enqueue only and with the drain; body(n) makes n
-- calls; r = 0 warms up
local function per_call(n, body, reps)
  local t, d = {}, {}
  for r = 0, reps or Z.alloc_reps do
    local t0 = gpu.clock()
    body(n)
    local t1 = gpu.clock()
    gpu.synchronize()
    local t2 = gpu.clock()
    if r > 0 then
      t[r] = (t1 - t0) / n * 1e6
      d[r] = (t2 - t0) / n * 1e6
    end
  end
  return B.median(t), B.median(d)
end

local function minmax(u) return u:min():item(), u:max():item() end

-- ---- the allocating forms -----------------------------------------------------

local got, drained, dgot = {}, {}, {}

-- key: the row; body(calls): the timed loop; last(): one more result of the
-- same form; want: every element of it (nil: any, gpu.empty).  Once it is
-- dropped, the device bytes in use are back where they were before the loop.
local function alloc_row(key, label, n, body, last, want)
  fresh()
  local base = gpu.memory().allocated
  local us, with_drain = per_call(Z.alloc_calls, body)
  B.row(key, us, "us", label)
  got[key], dgot[key] = us, with_drain
  drained[#drained + 1] = string.format("%s %.4g", key, with_drain)
  local u = last()
  local numel, lo, hi = u:numel(), want, want
  if want then lo, hi = minmax(u) end
  u = nil
  fresh()
  local left = gpu.memory().allocated - base
  B.check(key, numel == n and lo == want and hi == want and left == 0,
          string.format("%d elements (want %d), values in [%s, %s] (want %s), %d bytes left after the loop",
                        numel, n, lo, hi, want, left))
end

for _, sz in ipairs { { 1, "1", "1 element" }, { 1 << 18, "256k", "2^18 f32 (1 MiB)" } } do
  local n, tag, what = sz[1], sz[2], sz[3]
  B.guard("alloc_empty_" .. tag, function()
    alloc_row("alloc_empty_" .. tag, "`local u = gpu.empty({n})`, " .. what, n,
              function(calls) for _ = 1, calls do local u = gpu.empty({n}) end end,
              function() return gpu.empty({n}) end, nil)
  end)
  local t = gpu.ones({n})
  B.guard("alloc_add_" .. tag, function()
    alloc_row("alloc_add_" .. tag, "`local u = t + 1`, " .. what, n,
              function(calls) for _ = 1, calls do local u = t + 1 end end,
              function() return t + 1 end, 2)
  end)
  B.guard("alloc_chain_" .. tag, function()
    alloc_row("alloc_chain_" .. tag, "`local u = (t * 2 + 1):relu()`, " .. what, n,
              function(calls) for _ = 1, calls do local u = (t * 2 + 1):relu() end end,
              function() return (t * 2 + 1):relu() end, 3)
  end)
  -- the in-place baseline: t counts the adds
  B.guard("inplace_add_" .. tag, function()
    fresh()
    local us, with_drain = per_call(Z.alloc_calls, function(calls) for _ = 1, calls do t:add_(1) end end)
    B.row("inplace_add_" .. tag, us, "us", "`t:add_(1)`, " .. what)
    got["inplace_add_" .. tag], dgot["inplace_add_" .. tag] = us, with_drain
    drained[#drained + 1] = string.format("inplace_add_%s %.4g", tag, with_drain)
    local want = 1 + Z.alloc_calls * (Z.alloc_reps + 1)
    local lo, hi = minmax(t)
    B.check("inplace_add_" .. tag, lo == want and hi == want,
            string.format("values in [%s, %s], want %d", lo, hi, want))
  end)
  t = nil
end

-- what an allocation adds to the same op: the host backend's target.  There
-- the device is a worker thread of this process, so the op's cost is its
-- time with the drain (enqueue alone leaves the work out); on cuda, the
-- enqueue time (the kernel runs on the GPU either way).
local host = gpu.backend == "host"
local src = host and dgot or got
if src.alloc_add_256k and src.inplace_add_256k then
  B.row("alloc_vs_inplace_256k", src.alloc_add_256k / src.inplace_add_256k, "x",
        "`local u = t + 1` / `t:add_(1)`, 2^18 f32 (1 MiB)" .. (host and ", with the drain" or ", enqueue"))
end

-- On the host backend the device is a worker thread, and enqueue time
-- alone leaves out the allocator's work there: the drained figures too.
B.note("alloc", string.format("alloc rows gpulua: %d calls per repeat, median of %d; us per call with the "
                              .. "drain: %s", Z.alloc_calls, Z.alloc_reps, table.concat(drained, ", ")))

-- ---- what stays alive ---------------------------------------------------------

-- the allocator and stream table should cost nothing per call that grows
-- with what is alive: 1 element allocations, then stream create + close,
-- beside live sets of two sizes
local function live_rows(kind, counts, calls, make, body, count_of)
  local us = {}
  for i, count in ipairs(counts) do
    local key = string.format("%s_live_%s", kind, B.count_name(count))
    B.guard(key, function()
      fresh()
      local base = count_of()
      local keep = {}
      for k = 1, count do keep[k] = make() end
      local v = per_call(calls, body)
      B.row(key, v, "us", string.format("%s, %d live", kind == "alloc" and "`local u = gpu.empty({1})`"
                                        or "`local s = gpu.stream(); s:close()`", count))
      fresh()
      local alive = count_of() - base
      B.check(key, alive == count, string.format("%d live after the loop, want %d", alive, count))
      us[i] = v
      if kind == "stream" then for k = 1, count do keep[k]:close() end end
    end)
  end
  local key = kind .. "_live_ratio"
  if us[1] and us[2] then
    B.row(key, us[2] / us[1], "x", string.format("%s, %s live / %s live", kind == "alloc" and "gpu.empty({1})"
                                                 or "stream create + close", B.count_name(counts[2]),
                                                 B.count_name(counts[1])))
  end
end

live_rows("alloc", Z.live_tensors, Z.live_calls, function() return gpu.empty({1}) end,
          function(calls) for _ = 1, calls do local u = gpu.empty({1}) end end,
          function() return gpu.stats().buffers end)
-- Host streams start their worker thread on first use (cuda/host/backend.c):
-- these are never used, so 100k of them are no threads there.
live_rows("stream", Z.live_streams, Z.stream_calls, function() return gpu.stream() end,
          function(calls) for _ = 1, calls do local s = gpu.stream(); s:close() end end,
          function() return gpu.stats().streams end)
B.note("live", string.format("live rows gpulua: gpu.empty %d calls, stream %d calls per repeat, median of %d; "
                             .. "the live streams are never used", Z.live_calls, Z.stream_calls, Z.alloc_reps))

-- ---- 1 GiB temporaries --------------------------------------------------------

-- Last: where its temporaries run the device out of memory, the rows above
-- are measured already.  Without gpu.reset_peak_memory its peak is the
-- peak since start, the rows above included.
B.guard("loop_1g", function()
  local n, iters = Z.loop_elems, Z.loop_iters
  local what = string.format("%s x %d", select(2, B.bytes_names(n * 4)), iters)
  fresh()
  local t = gpu.ones({n})
  for _ = 1, Z.loop_warm do local u = (t * 2 + 1):relu() end
  fresh()
  local reset = gpu.reset_peak_memory
  if reset then reset() end
  local its, done = {}, 0
  for r = 1, Z.loop_reps do
    done = 0
    local t0 = gpu.clock()
    for i = 1, iters do
      local u = (t * 2 + 1):relu()
      done = i
    end
    gpu.synchronize()
    its[r] = iters / (gpu.clock() - t0)
    if r < Z.loop_reps then collectgarbage() end
  end
  local peak = gpu.memory().peak / 2^30
  B.row("loop_1g_its", B.median(its), "it/s", "`local u = (t * 2 + 1):relu()` loop, " .. what)
  B.row("loop_1g_peak", peak, "GiB", "peak memory of that loop, " .. what)
  B.note("loop_1g", string.format("loop_1g gpulua: %s, warm-up %d iterations, median of %d loops; peak: %s",
                                  what, Z.loop_warm, Z.loop_reps, reset and "since gpu.reset_peak_memory()"
                                  or "since start (no gpu.reset_peak_memory)"))
  local u = (t * 2 + 1):relu()
  local lo, hi = minmax(u)
  B.check("loop_1g", done == iters and lo == 3 and hi == 3,
          string.format("%d of %d iterations, last result in [%s, %s], want 3", done, iters, lo, hi))
end)

B.finish()
