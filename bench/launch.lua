-- Launch rows through gpulua: back-to-back enqueue (an empty run-time
-- kernel, and fill of a 1-element tensor) and the launch + stream sync round
-- trip.  Host wall time (gpu.clock) of N calls, the stream drained between
-- repeats outside the timed part, one warm-up repeat, median of the repeats:
-- as bench/ref.cu's bench_launch.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

local s = gpu.stream()
local o = { stream = s }

-- median µs per call; body(n) makes n calls; r = 0 warms up
local function per_call(n, body)
  local t = {}
  for r = 0, Z.launch_reps do
    local t0 = gpu.clock()
    body(n)
    local t1 = gpu.clock()
    s:synchronize()
    if r > 0 then t[r] = (t1 - t0) / n * 1e6 end
  end
  return B.median(t)
end

-- the empty run-time kernel: n/a where gpu.compile is missing or refuses
-- (the host backend), a failed check where it compiles but does not run
local launcher
do
  local ok, err = pcall(function()
    local m = gpu.compile([[extern "C" __global__ void empty() {}]])
    launcher = m.empty { grid = 1, block = 1, stream = s }
  end)
  if not ok then
    launcher = nil
    B.row("enqueue_empty", nil, "us", "enqueue, empty kernel")
    B.row("roundtrip_empty", nil, "us", "launch + stream sync, empty kernel")
    B.note("enqueue_empty", "gpulua: gpu.compile unavailable: " .. tostring(err))
  end
end
if launcher then
  B.guard("enqueue_empty", function()
    -- an empty kernel has no result: the check is that every launch and
    -- sync returned without error (an error lands in B.guard)
    local k = launcher
    local us = per_call(Z.launches, function(n) for _ = 1, n do k() end end)
    B.row("enqueue_empty", us, "us", "enqueue, empty kernel")
    B.check("enqueue_empty", true)
    us = per_call(Z.roundtrips, function(n) for _ = 1, n do k(); s:synchronize() end end)
    B.row("roundtrip_empty", us, "us", "launch + stream sync, empty kernel")
    B.check("roundtrip_empty", true)
  end)
end

B.guard("enqueue_fill", function()
  local t = gpu.empty({1}, o)
  local us = per_call(Z.launches, function(n) for i = 1, n do t:fill(i, o) end end)
  B.row("enqueue_fill", us, "us", "enqueue, fill of 1 element")
  local got = t:item()
  B.check("enqueue_fill", got == Z.launches, string.format("element is %s, want %d", got, Z.launches))

  us = per_call(Z.roundtrips, function(n) for i = 1, n do t:fill(i, o); s:synchronize() end end)
  B.row("roundtrip_fill", us, "us", "launch + stream sync, fill of 1 element")
  got = t:item()
  B.check("roundtrip_fill", got == Z.roundtrips, string.format("element is %s, want %d", got, Z.roundtrips))
end)

B.finish()
