-- Copy and elementwise rows through gpulua: pinned H2D, D2H, both at once on
-- two streams, D2D, and c = a + b in f32.  Event timing around each op,
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
