-- Copy and elementwise rows through gpulua: pinned H2D, D2H, both at once on
-- two streams, D2D, pageable H2D and D2H (256 MiB and 4 MiB), the seeds'
-- loop (a pageable batch to the device and computed, per step), and c = a + b
-- in f32.  Event timing around each op,
-- warm-up, median of the repeats, every result checked: as bench/ref.cu's
-- bench_copy.  GB/s are 1e9 bytes per second; D2D counts bytes read and
-- written, the add its two reads and one write.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

local bytes = Z.copy_bytes
local n = bytes // 4
local s, s2 = gpu.stream(), gpu.stream()
local o = { stream = s }

-- median ms of what fn enqueues on s, between two timing events
local function timed(fn)
  local t = {}
  for r = 1 - Z.copy_warm, Z.copy_reps do
    local e0 = s:record { timing = true }
    fn()
    local e1 = s:record { timing = true }
    e1:synchronize()
    if r > 0 then t[r] = e1 - e0 end
  end
  return B.median(t)
end

local function gbps(moved, ms) return moved / (ms * 1e6) end

-- i32 pattern 0, 1, ..., n-1 on the host; checks compare whole buffers
local h = gpu.arange(n, { dtype = "i32", device = "pinned" })
local h2 = gpu.pinned({n}, { dtype = "i32" })
local d = gpu.empty({n}, { dtype = "i32" })
local d2 = gpu.empty({n}, { dtype = "i32" })

local function same_host(x, what)
  local diff = x:sub(h):abs_():max():item()
  return diff == 0, string.format("%s differs from the source (max |diff| %s)", what, diff)
end

B.guard("h2d", function()
  local ms = timed(function() d:copy(h, o) end)
  B.row("h2d", gbps(bytes, ms), "GB/s", B.size_label("H2D pinned", bytes))
  h2:fill(-1)
  h2:copy(d, o)
  B.check("h2d", same_host(h2, "device data"))
end)

B.guard("d2h", function()
  h2:fill(-1)
  local ms = timed(function() h2:copy(d, o) end)
  B.row("d2h", gbps(bytes, ms), "GB/s", B.size_label("D2H pinned", bytes))
  B.check("d2h", same_host(h2, "host data"))
end)

-- both at once: H2D on s, D2H on s2, from the start event on s to the stop
-- event on s after s has waited for s2
B.guard("bidir", function()
  d2:copy(d, o)
  h2:fill(-1)
  local o2 = { stream = s2 }
  local ms = timed(function()
    s2:wait(s:record { timing = false })
    d:copy(h, o)
    h2:copy(d2, o2)
    s:wait(s2:record { timing = false })
  end)
  B.row("bidir", gbps(2 * bytes, ms), "GB/s", B.size_label("H2D + D2H at once, pinned", bytes))
  B.check("bidir", same_host(h2, "D2H data"))
end)

B.guard("d2d", function()
  d2:fill(-1, o)
  local ms = timed(function() d2:copy(d, o) end)
  B.row("d2d", gbps(2 * bytes, ms), "GB/s", B.size_label("D2D copy (read + write)", bytes))
  h2:fill(-1)
  h2:copy(d2, o)
  B.check("d2d", same_host(h2, "copy"))
end)

h:close(); h2:close(); d:close(); d2:close()

-- Pageable ("host") memory: staged through pinned memory and queued (the
-- driver's pageable copy blocks instead).  Wall time of the copy and a wait
-- for its stream, so every side is timed the same way, into buffers made
-- and touched beforehand; median of the repeats.
local function wall_ms(fn, reps)
  local t = {}
  for r = 1 - Z.copy_warm, reps do
    local t0 = gpu.clock()
    fn()
    s:synchronize()
    if r > 0 then t[r] = (gpu.clock() - t0) * 1e3 end
  end
  return B.median(t)
end

for _, size in ipairs { { "", bytes, Z.copy_reps }, { "_4m", Z.page_small, Z.page_reps } } do
  local tag, nbytes, reps = size[1], size[2], size[3]
  local m = nbytes // 4
  B.guard("h2d_pageable" .. tag, function()
    local hp = gpu.arange(m, { dtype = "i32", device = "host" })
    local hp2 = gpu.full({m}, -1, { dtype = "i32", device = "host" })
    local dp = gpu.full({m}, -1, { dtype = "i32" })
    local ms = wall_ms(function() dp:copy(hp, o) end, reps)
    B.row("h2d_pageable" .. tag, gbps(nbytes, ms), "GB/s", B.size_label("H2D pageable", nbytes))
    hp2:copy(dp, o)
    local diff = hp2:sub(hp):abs_():max():item()
    B.check("h2d_pageable" .. tag, diff == 0, string.format("device data differs from the source (max |diff| %s)", diff))
    hp2:fill(-1)
    ms = wall_ms(function() hp2:copy(dp, o) end, reps)
    B.row("d2h_pageable" .. tag, gbps(nbytes, ms), "GB/s", B.size_label("D2H pageable", nbytes))
    diff = hp2:sub(hp):abs_():max():item()
    B.check("d2h_pageable" .. tag, diff == 0, string.format("host data differs from the source (max |diff| %s)", diff))
    hp:close(); hp2:close(); dp:close()
  end)
end

-- The seeds' loop: each step moves a pageable batch (a dataset held in
-- ordinary memory) to the device and computes on it, as a PyTorch user
-- writes `x = batch.to('cuda'); y = (x * 2 + 1).relu(); y.sum()`; gpulua's
-- side fuses the compute (gpu.fuse), as its README's first example does.
B.guard("seeds_loop", function()
  local ne, nb = Z.seeds_elems, Z.seeds_batches
  local data = {}
  for k = 1, nb do data[k] = gpu.full({ne}, k, { device = "host" }) end
  local last
  -- the compute as one op (issue 32): one pass over x, the sum included
  local relu_sum = gpu.fuse(function(x) return (x * 2 + 1):relu():sum() end, { name = "relu_sum" })
  local function step(i)
    local x = data[(i - 1) % nb + 1]:to("device")
    last = relu_sum(x)
  end
  local rates = {}
  for run = 1, Z.seeds_runs do
    for i = 1, Z.seeds_warm do step(i) end
    gpu.synchronize()
    local t0 = gpu.clock()
    for i = 1, Z.seeds_steps do step(i) end
    gpu.synchronize()
    rates[run] = Z.seeds_steps / (gpu.clock() - t0)
  end
  B.row("seeds_loop", B.median(rates), "it/s",
        string.format("seeds' loop: %s pageable batch to the device + (x*2+1):relu():sum(), steps/s",
                      B.size_label("", ne * 4):sub(2)))
  local k = (Z.seeds_steps - 1) % nb + 1
  local got, want = last:item(), ne * (2 * k + 1)
  B.check("seeds_loop", got == want, string.format("last step's sum %s, want %s", got, want))
end)

B.guard("add", function()
  local a = gpu.rand({n}, { seed = 1, stream = s })
  local b = gpu.rand({n}, { seed = 2, stream = s })
  local c = gpu.full({n}, 0 / 0, o)              -- NaN until written
  local ms = timed(function() a:add(b, { out = c, stream = s }) end)
  B.row("add", gbps(3 * bytes, ms), "GB/s", B.size_label("add f32 a+b->c", bytes))
  -- c against the exact sum in f64: within half an ulp of c (c < 2)
  local err = c:to("f64", o):sub_(a:to("f64", o)):sub_(b:to("f64", o)):abs_():max():item()
  B.check("add", err <= 2 ^ -24, string.format("max |c - (a + b)| = %s", err))
end)

B.finish()
