-- Run by tests/launch.lua under `gpulua -n N`: the last rank fails as arg[1]
-- says (exit3, error, kill9; sleep: none does); the others sleep 30 s and
-- then print "survived", which they must never get to.
local rank, size = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
local mode = arg[1]
if rank == size - 1 and mode ~= "sleep" then
  io.stderr:write("rank " .. rank .. " fails by " .. mode .. "\n")
  if mode == "exit3" then
    os.exit(3)
  elseif mode == "error" then
    error("rank " .. rank .. " gives up")  -- the launcher's summary shows this line
  elseif mode == "kill9" then
    local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")
    os.execute("kill -9 " .. pid)
  end
  error("unknown mode " .. tostring(mode))
end
print("sleeping " .. rank)
os.execute("sleep 30")
print("survived " .. rank)
