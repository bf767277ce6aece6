-- A child of tests/pipeline.lua for the progress line:
--
--   gpulua tests/pipeline/progress.lua counted|stream|fail default|on|off
--
-- counted: 8 batches with a sink; stream: no batches (load ends after 6), no
-- sink; fail: as counted, but the sink raises at batch 5.  Each compute holds its stream 30 ms, so the line is drawn more than
-- once.  Prints "done N" on stdout at the end.
local gpu = require "gpu"
local pipeline = require "gpu.pipeline"

local form, mode = arg[1], arg[2]
local progress
if mode == "on" then progress = true elseif mode == "off" then progress = false end

local spec = {
  depth = 2, progress = progress, name = "progress-test",
  input = { shape = { 1024 }, dtype = "f32" },
  compute = function(i, x) gpu.sleep(30); x:add_(i) end,
}
if form == "counted" or form == "fail" then
  spec.batches = 8
  spec.load = function(i, pin) pin:fill(i) end
  spec.sink = function(i)
    if form == "fail" and i == 5 then error("sink fails at batch 5") end
  end
else
  spec.load = function(i, pin)
    pin:fill(i)
    return i <= 6
  end
end
local stats = pipeline.run(spec)
io.stdout:write("done ", stats.batches, "\n")
