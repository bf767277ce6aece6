-- Run by tests/launch.lua under `gpulua -n N`: says it is ready, then runs
-- Lua code for 30 s (so SIGINT interrupts it) and prints "survived".
print("ready " .. os.getenv("RANK"))
local stop = os.time() + 30
while os.time() < stop do end
print("survived " .. os.getenv("RANK"))
