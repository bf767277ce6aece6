-- Shared by the bench scripts: sizes (kept in step with sizes_init in
-- bench/ref.cu), the median, and the lines the driver (bench/run.lua) reads:
--
--   row KEY VALUE UNIT LABEL...     VALUE "n/a" when the row cannot be measured
--   check KEY ok | check KEY FAILED why
--   note KEY text
local B = {}

local q = os.getenv("BENCH_QUICK")
B.quick = q ~= nil and q ~= "" and q ~= "0"

B.sizes = {
  launches = B.quick and 200 or 2000,      -- back-to-back enqueues per repeat
  launch_reps = B.quick and 5 or 21,
  roundtrips = B.quick and 50 or 500,      -- launch + sync per repeat
  launch_rounds = B.quick and 2 or 5,      -- processes of each side, in turn (bench/run.lua)
  copy_bytes = B.quick and 8 << 20 or 256 << 20,
  copy_warm = 2,
  copy_reps = B.quick and 3 or 10,
  -- copies from pageable memory (bench/copy.lua; ref.cu's bench_pageable and
  -- bench/torch_peer.py keep these in step): the big rows use copy_bytes
  page_small = 4 << 20,
  page_reps = B.quick and 5 or 20,
  -- the seeds' loop: a pageable batch of f32 to the device and computed, per step
  seeds_elems = B.quick and 1 << 20 or 4 << 20,
  seeds_batches = 8,
  seeds_warm = B.quick and 2 or 10,
  seeds_steps = B.quick and 20 or 200,
  seeds_runs = 3,
  mm_n = B.quick and 512 or 8192,
  mm = {
    f32 = { warm = B.quick and 1 or 2, reps = B.quick and 3 or 5 },
    bf16 = { warm = B.quick and 1 or 3, reps = B.quick and 3 or 10 },
  },
  mm_bmm_batch = B.quick and 4 or 64,     -- the batched row: batch of n^3, bf16
  mm_bmm_n = B.quick and 128 or 1024,
  ov_batches = B.quick and 8 or 32,
  ov_big = B.quick and 1 << 16 or 1 << 24,   -- elements per batch (f32)
  ov_small = B.quick and 1 << 12 or 1 << 18,
  ov_runs = 3,
  -- bench/alloc.lua, no raw C twin (bench/torch_peer.py keeps these in step)
  alloc_calls = B.quick and 200 or 20000,  -- calls per repeat of an allocating form
  alloc_reps = B.quick and 5 or 11,
  live_calls = B.quick and 5000 or 20000,  -- calls per repeat beside a live set (a few GC cycles)
  live_tensors = { 1000, 100000 },         -- live sets: the small, the large
  live_streams = { 1000, 100000 },
  stream_calls = B.quick and 100 or 1000,
  loop_elems = B.quick and 16 << 20 or 256 << 20,  -- the temporaries loop, f32
  loop_iters = B.quick and 30 or 300,
  loop_warm = B.quick and 1 or 10,         -- iterations before the timed loops
  loop_reps = B.quick and 1 or 3,
  -- bench/kernels.lua: run-time kernels beside the built-in ops
  kernel_elems = B.quick and 1 << 22 or 1 << 24,
  kernel_warm = B.quick and 1 or 2,
  kernel_reps = B.quick and 5 or 10,
  -- bench/graph.lua: a graph of graph_nodes 1-element adds, replayed in
  -- timed batches of graph_replays (ref.cu's bench_graph and
  -- bench/torch_peer.py keep these in step)
  graph_nodes = 100,
  graph_replays = B.quick and 20 or 200,
  graph_warm = B.quick and 1 or 2,         -- batches before the timed ones
  graph_reps = B.quick and 5 or 21,
}

-- a count as a key part: 1000 "1k", 100000 "100k"
function B.count_name(n)
  if n >= 1000 and n % 1000 == 0 then return string.format("%dk", n // 1000) end
  return tostring(n)
end

-- The all_reduce sweep (bench/allreduce.lua; plan_iters in bench/nccl_ref.cu
-- computes the same counts): f32 sizes from 8 B up by 8x (to 1 GiB, quick: to
-- 256 KiB), warm-up calls, and timed calls per size.  The count is what makes
-- a timed loop last about 100 ms at 10 us + bytes at 300 GB/s busbw a call,
-- at least 20 and at most 1000; quick: 10.
function B.allreduce_plan(quick, n, latency)
  local p = { sizes = {}, warm = quick and 2 or 5 }
  local top = latency and 8 or quick and 256 << 10 or 1 << 30
  local b = 8
  while b <= top do
    p.sizes[#p.sizes + 1] = b
    b = b * 8
  end
  function p.iters(bytes)
    if quick then return 10 end
    local est_us = 10.0 + bytes * 2.0 * (n - 1) / n / 3e5
    return math.max(20, math.min(1000, math.floor(1e5 / est_us)))
  end
  return p
end

-- a byte count as a key part and a label: 8B "8 B", 32K "32 KiB", 1G "1 GiB"
function B.bytes_names(bytes)
  local units, names = { "B", "K", "M", "G" }, { "B", "KiB", "MiB", "GiB" }
  local u, v = 1, bytes
  while u < 4 and v >= 1024 and v % 1024 == 0 do
    v = v // 1024
    u = u + 1
  end
  return string.format("%d%s", v, units[u]), string.format("%d %s", v, names[u])
end

function B.median(t)
  local c = {}
  for i = 1, #t do c[i] = t[i] end
  table.sort(c)
  local n = #c
  if n == 0 then return nil end
  if n % 2 == 1 then return c[(n + 1) // 2] end
  return (c[n // 2] + c[n // 2 + 1]) / 2
end

function B.size_label(what, bytes)
  if bytes >= 1 << 20 then return string.format("%s %d MiB", what, bytes >> 20) end
  return string.format("%s %d KiB", what, bytes >> 10)
end

local function flat(s) return (tostring(s):gsub("%s+", " ")) end

function B.row(key, value, unit, label)
  print(string.format("row %s %s %s %s", key, value and string.format("%.6g", value) or "n/a", unit, label))
  io.stdout:flush()
end

function B.note(key, text) print("note " .. key .. " " .. flat(text)) end

B.failed = false
function B.check(key, ok, why)
  print(string.format("check %s %s%s", key, ok and "ok" or "FAILED", (not ok and why) and (" " .. flat(why)) or ""))
  io.stdout:flush()
  if not ok then B.failed = true end
end

-- Run fn(); an error becomes a failed check for key rather than ending the script.
function B.guard(key, fn)
  local ok, err = xpcall(fn, debug.traceback)
  if not ok then B.check(key, false, err) end
end

-- The exit status: 1 when a check failed.
function B.finish()
  os.exit(B.failed and 1 or 0, true)
end

return B
