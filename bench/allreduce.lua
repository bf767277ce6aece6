-- The all_reduce sweep through gpulua, nccl-tests style; bench/nccl_ref.cu
-- is the same sweep in raw NCCL.  f32 sum, out of place, 8 B to 1 GiB in
-- steps of 8 (quick: to 256 KiB).  Per size: warm-up calls, gpu.barrier(),
-- then back-to-back calls on one stream timed with events: time = elapsed /
-- calls, algbw = bytes / time, busbw = algbw * 2(n-1)/n.  Then every rank
-- checks its result (every element on the device, a strided sample on the
-- host); the count of ranks with a wrong result is all-reduced and rank 0
-- reports for the job.  Call counts: benchlib's allreduce_plan.  Then the
-- 8-byte all_reduce captured in a graph, replayed back-to-back (KEY_graph).
--
--   gpulua -n N --device cuda bench/allreduce.lua [quick] [latency]
--
-- Rank 0 prints, per size (KEY: allreduce_nN_SIZE, e.g. allreduce_n2_128M):
--   row KEY_time US us LABEL   row KEY_algbw X GB/s LABEL   row KEY_busbw X GB/s LABEL
--   check KEY ok
-- A rank with a wrong result or an error prints `check KEY FAILED rank R: why`.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"

local quick, latency = B.quick, false
for _, a in ipairs(arg) do
  if a == "quick" then quick = true elseif a == "latency" then latency = true end
end
local n, rank = gpu.world_size, gpu.rank
local P = B.allreduce_plan(quick, n, latency)   -- latency: the 8-byte size only
local TRI = n * (n + 1) // 2        -- sum over ranks of (rank + 1)

-- t[i] = factor * (1 + i % 7), i from 0: small integers, so the f32 sum is
-- exact; made in chunks, each waited for, so that the i64 temporaries of
-- one chunk at a time hold memory
local function pattern(t, numel, factor)
  local CH = 1 << 24
  for off = 0, numel - 1, CH do
    local len = math.min(CH, numel - off)
    local i <close> = gpu.arange(off, off + len)
    local q <close> = i / 7                     -- integer division floors
    i:sub_(q:mul_(7)):add_(1)
    local v <close> = i:to("f32")
    t:narrow(1, off + 1, len):copy(v:mul_(factor))
    gpu.current_stream():synchronize()
  end
end

-- nil, or why yv (the first numel elements of the result) is wrong
local function wrong(yv, want, numel)
  local d <close> = yv - want:narrow(1, 1, numel)
  local worst = d:abs_():max():item()
  if worst ~= 0 then return string.format("max |result - expected| is %s", worst) end
  -- a sample on the host, read without gpulua's ops: one element of each
  -- row of numel/k x k, k a power of two (so i % 7 goes round)
  local k = math.max(1, numel // 4096)
  local col = yv:view({ numel // k, k }):narrow(2, k // 2 + 1, 1):contiguous():totable()
  for r, row in ipairs(col) do
    local i = (r - 1) * k + k // 2
    local w = TRI * (1 + i % 7)
    if row[1] ~= w then return string.format("element %d is %s, want %d", i, row[1], w) end
  end
  return nil
end

local function sweep()
  local s = gpu.stream()
  local _ <close> = gpu.using(s)
  gpu.init_comm()
  local maxn = P.sizes[#P.sizes] // 4
  local x <close> = gpu.empty({ maxn })
  local y <close> = gpu.empty({ maxn })
  local want <close> = gpu.empty({ maxn })
  pattern(x, maxn, rank + 1)
  pattern(want, maxn, TRI)
  s:synchronize()

  for _, bytes in ipairs(P.sizes) do
    local numel = bytes // 4
    local iters = P.iters(bytes)
    local skey, slabel = B.bytes_names(bytes)
    local key = string.format("allreduce_n%d_%s", n, skey)
    local label = string.format("all_reduce n=%d %s", n, slabel)
    local xv, yv = x:narrow(1, 1, numel), y:narrow(1, 1, numel)
    local o = { out = yv, stream = s }
    yv:fill(-1)
    for _ = 1, P.warm do gpu.all_reduce(xv, o) end
    gpu.barrier()                               -- on s: the warm-up is done everywhere
    local e0 = s:record()
    local h0 = gpu.clock()
    for _ = 1, iters do gpu.all_reduce(xv, o) end
    local host_us = (gpu.clock() - h0) * 1e6 / iters
    local e1 = s:record()
    e1:synchronize()
    local us = e0:elapsed(e1) * 1e3 / iters

    local why = wrong(yv, want, numel)
    if why then
      B.check(key, false, string.format("rank %d: %s", rank, why))
    end
    local bad <close> = gpu.tensor({ why and 1 or 0 }, { dtype = "i32" })
    gpu.all_reduce(bad)
    local nbad = bad:item()
    if nbad > 0 then B.failed = true end
    if rank == 0 then
      local algbw = bytes / (us * 1e3)
      B.row(key .. "_time", us, "us", label .. " time")
      B.row(key .. "_algbw", algbw, "GB/s", label .. " algbw")
      B.row(key .. "_busbw", algbw * 2 * (n - 1) / n, "GB/s", label .. " busbw")
      -- the interpreter's time per call, beside raw NCCL's: what bounds the
      -- smallest sizes when it is longer than the collective itself
      if bytes == P.sizes[1] then B.row(key .. "_host", host_us, "us", label .. " host time per call") end
      if nbad == 0 then B.check(key, true) end
    end
  end
  -- the 8-byte all_reduce captured in a graph (gpu.graph), replayed
  -- back-to-back: the time per replay, and the replays' result checked
  do
    local bytes = P.sizes[1]
    local numel, iters = bytes // 4, P.iters(bytes)
    local key = string.format("allreduce_n%d_%s_graph", n, (B.bytes_names(bytes)))
    local label = string.format("all_reduce n=%d %s in a graph", n, select(2, B.bytes_names(bytes)))
    local xv, yv = x:narrow(1, 1, numel), y:narrow(1, 1, numel)
    yv:fill(-1)
    local g <close> = gpu.graph(function() gpu.all_reduce(xv, { out = yv }) end, { name = "allreduce_8B" })
    for _ = 1, P.warm do g:launch(s) end
    gpu.barrier()
    local e0 = s:record()
    for _ = 1, iters do g:launch(s) end
    local e1 = s:record()
    e1:synchronize()
    local us = e0:elapsed(e1) * 1e3 / iters
    local why = wrong(yv, want, numel)
    if why then B.check(key, false, string.format("rank %d: %s", rank, why)) end
    local bad <close> = gpu.tensor({ why and 1 or 0 }, { dtype = "i32" })
    gpu.all_reduce(bad)
    if bad:item() > 0 then B.failed = true end
    if rank == 0 then
      B.row(key .. "_time", us, "us", label .. " time (a replay)")
      if bad:item() == 0 then B.check(key, true) end
    end
  end
  -- nobody exits (and gets its peers killed) before rank 0 has printed
  gpu.barrier()
end

local ok, err = xpcall(sweep, debug.traceback)
if not ok then
  -- the others would wait for this rank in their next collective: leave now,
  -- so that the launcher ends them
  B.check(string.format("allreduce_n%d", n), false, string.format("rank %d: %s", rank, err))
  os.exit(1, true)
end
B.finish()
