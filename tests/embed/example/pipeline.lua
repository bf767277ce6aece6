-- pipeline.lua: the script tests/embed/example/app.c runs on its own buffer.
--
-- `input` (a global the application sets): a gpu.Tensor over the
-- application's memory, n f32 values, n a multiple of BATCH.  Each batch goes
-- through gpu.pipeline: copied into a pinned buffer, to the device, y = 2x + 1
-- there, back, and written over the batch in the application's buffer.  The
-- application synchronizes and checks every value.
local gpu = require "gpu"
local pipeline = require "gpu.pipeline"

local BATCH = 1024
local n = input:numel()
assert(input.dtype == "f32" and n % BATCH == 0, "input: f32, a multiple of " .. BATCH .. " values")

local function batch(i) return input:narrow(1, (i - 1) * BATCH + 1, BATCH) end

local stats = pipeline.run {
  batches = n // BATCH, depth = 2, progress = false,
  input = { shape = { BATCH }, dtype = "f32" },
  output = { shape = { BATCH }, dtype = "f32" },
  load = function(i, pin) pin:copy(batch(i)) end,
  compute = function(_, x, y) x:mul(2, { out = y }); y:add_(1) end,
  sink = function(i, pout) batch(i):copy(pout) end,
}
print(string.format("pipeline.lua: %d batches of %d on %s", stats.batches, BATCH, gpu.backend))
