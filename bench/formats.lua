-- Loading NumPy's compressed archives to the device (issue 34, item 3),
-- beside numpy.load + .cuda() (bench/torch_peer.py, the same sizes):
--   npz_deflated         gpu.load_npz of a numpy.savez_compressed-style
--                        archive (gpu.save_npz{compress = true}: zlib's
--                        default level, as numpy) of 8 members of randn f32,
--                        8 MiB each (quick: 1 MiB), then gpu.synchronize():
--                        GB/s of array bytes over the wall time, from the
--                        call to the end of the sync (the members inflate
--                        on the staging threads, several at once)
--   npz_deflated_atcall  the same with map = false: each member inflated
--                        whole at the call, one after the other
-- Median of 5 loads after one warm-up (the file is in the page cache for
-- every load, as for the peer's).
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"

local MEMBERS, EACH = 8, B.quick and (1 << 20) or (8 << 20)
local REPS = 5

local path = os.tmpname()
local arrays = {}
for i = 1, MEMBERS do arrays["w" .. i] = gpu.randn({ EACH // 4 }, { seed = i }) end
gpu.save_npz(path, arrays, { compress = true })
local f = assert(io.open(path, "rb"))
local fsize = f:seek("end")
f:close()

local function load(opts)
  local t = {}
  for r = 0, REPS do
    local t0 = gpu.clock()
    local got = gpu.load_npz(path, opts)
    gpu.synchronize()
    if r > 0 then t[r] = gpu.clock() - t0 end
    if r == REPS then return B.median(t), got end
  end
end

local total = MEMBERS * EACH
for _, v in ipairs { { "npz_deflated", nil, "inflated by the staging threads" },
                     { "npz_deflated_atcall", { map = false }, "map = false: inflated at the call" } } do
  B.guard(v[1], function()
    local s, got = load(v[2])
    B.row(v[1], total / s / 1e9, "GB/s", string.format("load_npz of %d deflated f32 members of %d MiB, %s",
                                                        MEMBERS, EACH >> 20, v[3]))
    local ok, why = true, ""
    for name, want in pairs(arrays) do
      local d = got[name]:ne(want):sum():item()
      if d ~= 0 then ok, why = false, string.format("%s: %d elements differ", name, d) end
    end
    B.check(v[1], ok, why)
  end)
end
B.note("npz_deflated", string.format("archive of %d MiB (%.2f of the arrays' bytes)", fsize >> 20, fsize / total))
os.remove(path)
B.finish()
