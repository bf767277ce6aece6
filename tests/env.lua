-- The environment, read one way each (issue 31, item 3): the job's numbers
-- (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, else Slurm's names),
-- MASTER_PORT, and the on/off variables, which all take 1/on/yes/true and
-- 0/off/no/false and refuse anything else by name.
local T = require "gpu.test"

local function job(env, code)
  return T.run(env, "--device host -e '" .. code .. "'")
end

T.test("the job's numbers: torchrun's names, else Slurm's", function()
  local out, ok = job("LOCAL_RANK=1 LOCAL_WORLD_SIZE=2", "print(gpu.local_rank)")
  T.ok(ok and out:match("^1\n"), "LOCAL_RANK: " .. out)
  out, ok = job("LOCAL_RANK= SLURM_LOCALID=1 SLURM_NTASKS_PER_NODE=2", "print(gpu.local_rank)")
  T.ok(ok and out:match("^1\n"), "an empty LOCAL_RANK falls back to SLURM_LOCALID: " .. out)
  out, ok = job("LOCAL_RANK=one", "gpu.all_reduce(gpu.ones({1}))")
  T.ok(not ok and out:find("LOCAL_RANK='one' is not a non%-negative integer") ~= nil,
       "a malformed LOCAL_RANK is named: " .. out)
  out, ok = job("SLURM_LOCALID=-1", "gpu.all_reduce(gpu.ones({1}))")
  T.ok(not ok and out:find("SLURM_LOCALID='%-1' is not a non%-negative integer") ~= nil,
       "a negative SLURM_LOCALID is named: " .. out)
end)

T.test("MASTER_PORT is a port number", function()
  local out, ok = job("MASTER_PORT=70000", "gpu.all_reduce(gpu.ones({1}))")
  T.ok(not ok and out:find("MASTER_PORT='70000' is not a port number") ~= nil, "70000: " .. out)
  out, ok = job("MASTER_PORT=29501", "gpu.all_reduce(gpu.ones({1})) print(\"ok\")")
  T.ok(ok and out:find("ok") ~= nil, "29501: " .. out)
end)

local EXPECT = "is not on or off %(expected 1, on, yes or true; 0, off, no or false%)"

T.test("on/off variables take 1/0, on/off, yes/no, true/false in any case", function()
  for _, v in ipairs { "1", "on", "YES", "True", "0", "off", "No", "false", "" } do
    local out, ok = job("GPULUA_HOST_JITTER=" .. v, "print(gpu.ones({2}):sum():item())")
    T.ok(ok and out:match("^2"), "GPULUA_HOST_JITTER=" .. v .. ": " .. out)
  end
end)

T.test("an on/off variable set to anything else is an error that names it", function()
  local out, ok = job("GPULUA_HOST_JITTER=2", "print(1)")
  T.ok(not ok and out:find("GPULUA_HOST_JITTER='2' " .. EXPECT) ~= nil, "GPULUA_HOST_JITTER=2, at start: " .. out)
  out, ok = job("GPULUA_COMM_CHECK=maybe", "gpu.all_reduce(gpu.ones({1}))")
  T.ok(not ok and out:find("cannot join the job: GPULUA_COMM_CHECK='maybe' " .. EXPECT) ~= nil,
       "GPULUA_COMM_CHECK, when the script joins the job: " .. out)
  out, ok = job("GPULUA_KERNEL_CHECK=\"yes please\"",
                "gpu.compile([[extern \"C\" __global__ void k(float *x) { x[0] = 1; }]], {cache = false})")
  T.ok(not ok and out:find("GPULUA_KERNEL_CHECK='yes please' " .. EXPECT) ~= nil, "GPULUA_KERNEL_CHECK, at compile: " .. out)
end)

T.test("GPULUA_HOST_BLAS: off in words too; anything else fails the matmul", function()
  local mm = "print(gpu.matmul(gpu.ones({2, 3}), gpu.ones({3, 2})):sum():item())"
  for _, v in ipairs { "0", "off", "no", "false", "1", "on" } do
    local out, ok = job("GPULUA_HOST_BLAS=" .. v, mm)
    T.ok(ok and out:match("^12"), "GPULUA_HOST_BLAS=" .. v .. ": " .. out)
  end
  local out, ok = job("GPULUA_HOST_BLAS=none", mm)
  -- only a build with OpenBLAS reads it
  if out:find("not on or off", 1, true) then
    T.ok(not ok and out:find("matmul: GPULUA_HOST_BLAS='none' " .. EXPECT) ~= nil, "the matmul names it: " .. out)
  else
    T.ok(ok, "a build without OpenBLAS ignores GPULUA_HOST_BLAS: " .. out)
  end
end)

T.test("GPULUA_KERNEL_CACHE: off in words; on means the default directory", function()
  local dir = os.tmpname()
  os.remove(dir)
  local compile = "gpu.compile([[extern \"C\" __global__ void k(float *x) { x[0] = 2; }]]) print(\"ok\")"
  local out, ok = job("XDG_CACHE_HOME=" .. dir .. " GPULUA_KERNEL_CACHE=no", compile)
  T.ok(ok and io.open(dir) == nil, "no: nothing cached: " .. out)
  out, ok = job("XDG_CACHE_HOME=" .. dir .. " GPULUA_KERNEL_CACHE=on", compile)
  local f = io.open(dir .. "/gpulua")
  T.ok(ok and f ~= nil, "on: cached in $XDG_CACHE_HOME/gpulua: " .. out)
  if f then f:close() end
  T.ok(io.open("on") == nil, "not in a directory named 'on'")
  T.sh("rm -rf '" .. dir .. "'")
end)

-- -E: gpulua's own settings are ignored too, as lua.c's -E ignores LUA_*.
-- Each setting, given a bad value, must fail the run without -E (so the
-- value is read) and be ignored with it.  Every GPULUA_* the docs list is
-- either here or named in NOT_SETTINGS, so a new variable cannot slip by.
local KERNEL = "gpu.compile([[extern \"C\" __global__ void k(float *x) { x[0] = 1; }]], {cache = false})"
local SETTINGS = {
  {"GPULUA_CHECK", "bogus", "print(1)"},
  {"GPULUA_DEVICE", "bogus", "print(1)"},
  {"GPULUA_SYNC_DEBUG", "bogus", "print(1)"},
  {"GPULUA_TRACE", "/nonexistent-dir/t.json", "print(1)"},
  {"GPULUA_STAGE_CHUNK", "2G", "print(1)"},
  {"GPULUA_STAGE_THREADS", "0", "print(1)"},
  {"GPULUA_HOST_JITTER", "2", "print(1)", "host"},
  {"GPULUA_HOST_MEMORY", "lots", "print(1)", "host"},
  {"GPULUA_HOST_THREADS", "many", "local x = gpu.ones({4096}) " ..
     "gpu.compile([[extern \"C\" __global__ void k(float *x) { x[blockIdx.x] = 2; }]], {cache = false})" ..
     ".k{grid = 4096, block = 1}(x) print(x:sum():item())", "host"},
  {"GPULUA_CXX", "/nonexistent/c++", KERNEL, "host"},
  {"GPULUA_KERNEL_CHECK", "maybe", KERNEL, "host"},
  {"GPULUA_CXX_TIMEOUT", "soon", KERNEL, "host"},
  {"GPULUA_CXX_MEMORY", "lots", KERNEL, "host"},
  {"GPULUA_HOST_BLAS", "none", "print(gpu.matmul(gpu.ones({2, 3}), gpu.ones({3, 2})):sum():item())", "blas"},
  {"GPULUA_COMM_CHECK", "maybe", "gpu.all_reduce(gpu.ones({1}))"},
  {"GPULUA_COMM_TIMEOUT", "soon", "gpu.all_reduce(gpu.ones({1}))"},
  {"GPULUA_LAUNCH_BLOCKING", "maybe", "print(1)", "cuda"},
  {"GPULUA_KERNEL_LOADER", "maybe", "print(1)", "cuda"},
  {"GPULUA_NCCL", "/nonexistent/libnccl.so", "gpu.all_reduce(gpu.ones({1}))", "cuda"},
}
-- read by the launcher itself (its protocol, not settings), by the REPL
-- (tested in tests/repl.lua), by the cache test below, by the test suite
local NOT_SETTINGS = {GPULUA_LAUNCHER = true, GPULUA_LAUNCHER_FD = true, GPULUA_HISTORY = true,
                      GPULUA_KERNEL_CACHE = true, GPULUA_PYTHON = true, GPULUA_TEST_SLOWDOWN = true}

local BACKEND = (T.run("", "-e 'io.write(gpu.backend)'"))

T.test("-E: settings are read through env_setting or cli_setting, never getenv", function()
  local out = T.sh("grep -rnoE 'getenv\\(\"GPULUA_[A-Z_]+\"' interp cuda bindings")
  for line in out:gmatch("[^\n]+") do
    local name = line:match('"(GPULUA_[%u_]+)"')
    T.ok(name == "GPULUA_LAUNCHER" or name == "GPULUA_LAUNCHER_FD", "only the launcher's own: " .. line)
  end
  T.ok(out:find("GPULUA_LAUNCHER", 1, true), "the grep finds the launcher's variables")
end)

T.test("-E: every documented GPULUA_* setting is covered here", function()
  local listed = {}
  for _, s in ipairs(SETTINGS) do listed[s[1]] = true end
  local docs = assert(T.readfile("docs/environment.md"))
  for name in docs:gmatch("`(GPULUA_[A-Z_]+)") do
    T.ok(listed[name] or NOT_SETTINGS[name], name .. " is tested with -E or named as not a setting")
  end
end)

T.test("-E: each GPULUA_* setting is read without it and ignored with it", function()
  for _, s in ipairs(SETTINGS) do
    local name, value, code, only = s[1], s[2], s[3], s[4]
    local env = string.format("%s='%s'", name, value)
    local out, ok = T.run(env, "-e '" .. code .. "'")
    if only == "blas" and not out:find("GPULUA_HOST_BLAS", 1, true) then only = "skip" end
    if (only == "host" or only == "blas") and BACKEND ~= "host" or only == "cuda" and BACKEND ~= "cuda"
       or only == "skip" then
      T.skip(name, "not read by this backend or build")
    else
      T.ok(not ok and out:find(name, 1, true) ~= nil, env .. " without -E fails and names it: " .. out)
      out, ok = T.run(env, "-E -e '" .. code .. "'")
      T.ok(ok and not out:find(name, 1, true), env .. " with -E is ignored: " .. out)
    end
  end
end)

T.test("-E also reaches the ranks of gpulua -n", function()
  -- on the host backend: a machine of one GPU has no cuda job of two ranks
  local out, ok = T.run("GPULUA_COMM_TIMEOUT=soon",
                        "-n 2 -E --device host -e 'gpu.all_reduce(gpu.ones({1})) print(gpu.rank)'")
  T.ok(ok and out:find("0") and out:find("1") and not out:find("GPULUA_COMM_TIMEOUT"), "-n 2 -E: " .. out)
  out, ok = T.run("GPULUA_COMM_TIMEOUT=soon", "-n 2 --device host -e 'gpu.all_reduce(gpu.ones({1}))'")
  T.ok(not ok and out:find("GPULUA_COMM_TIMEOUT", 1, true), "-n 2 without -E names it: " .. out)
end)

T.test("-E: GPULUA_KERNEL_CACHE is ignored, the default directory is used", function()
  local dir = os.tmpname()
  os.remove(dir)
  local compile = "gpu.compile([[extern \"C\" __global__ void k(float *x) { x[0] = 3; }]]) print(\"ok\")"
  local env = "XDG_CACHE_HOME=" .. dir .. "/xdg GPULUA_KERNEL_CACHE=" .. dir .. "/kc"
  local out, ok = T.run(env, "-E -e '" .. compile .. "'")
  T.ok(ok and io.open(dir .. "/kc") == nil and io.open(dir .. "/xdg/gpulua") ~= nil, "with -E: " .. out)
  out, ok = T.run(env, "-e '" .. compile .. "'")
  T.ok(ok and io.open(dir .. "/kc") ~= nil, "without -E: the named directory: " .. out)
  T.sh("rm -rf '" .. dir .. "'")
end)

T.done()
