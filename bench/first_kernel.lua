-- Start-up to the first finished kernel: one 1-element fill, waited for,
-- then the host's monotonic clock.  bench/run.lua notes the clock just
-- before it starts this process, as it does for `ref first-kernel`.
local gpu = require "gpu"
local t = gpu.empty({1})
t:fill(1)
gpu.synchronize()
local now = gpu.clock()
io.write(string.format("first_kernel %.9f %s\n", now, gpu.backend))
