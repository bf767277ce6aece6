-- Run by tests/launch.lua under `gpulua -n N`: prints this rank's launcher
-- environment, its first script argument and the global X (set by -e), on one line.
local function v(name) return os.getenv(name) or "nil" end
print(string.format("rank=%s world=%s local=%s local_world=%s addr=%s port=%s launcher=%s arg1=%s x=%s",
  v("RANK"), v("WORLD_SIZE"), v("LOCAL_RANK"), v("LOCAL_WORLD_SIZE"), v("MASTER_ADDR"),
  v("MASTER_PORT"), v("GPULUA_LAUNCHER"), tostring(arg[1]), tostring(X)))
