-- The environment, read one way each (issue 31, item 3): the job's numbers
-- (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, else Slurm's names) and
-- MASTER_PORT.
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

T.done()
