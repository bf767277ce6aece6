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

T.done()
