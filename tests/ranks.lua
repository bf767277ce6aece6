-- Collectives between processes on the host backend, through the launcher:
-- tests/ranks/collectives.lua under -n 2 and -n 4, and jobs that go wrong
-- (tests/ranks/failures.lua), each of which must end with its cause.
local gpu = require "gpu"
local T = require "gpu.test"

local GPULUA = os.getenv("GPULUA") or "build/gpulua"
local DIR = (arg[0]:match("^(.*)/") or ".") .. "/ranks/"

-- run a job; output (stdout and stderr, rank-prefixed) and exit status.
-- `timeout` only guards against a hang of the test itself.
local function job(n, script, args, env)
  local cmd = string.format("%s timeout 120 %s -n %d --prefix --device host %s %s 2>&1",
                            env or "", GPULUA, n, DIR .. script, args or "")
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

for _, n in ipairs { 2, 4 } do
  T.test(string.format("every collective on %d ranks", n), function()
    local out, code = job(n, "collectives.lua")
    T.is(code, 0, "the job exits 0")
    local failed = {}
    for line in out:gmatch("[^\n]+") do
      if line:match("^%[rank %d+%] not ok") then failed[#failed + 1] = line end
    end
    T.is(#failed, 0, "no rank failed a check" .. (#failed > 0 and (": " .. failed[1]) or ""))
    for rank = 0, n - 1 do
      local oks = count(out, "%[rank " .. rank .. "%] ok ")
      T.ok(oks > 200, string.format("rank %d passed its checks (%d)", rank, oks))
    end
    if code ~= 0 or #failed > 0 then T.diag(out:sub(-3000)) end
  end)
end

-- each case: mode, what the output must say, the exit status
local CASES = {
  { "count", "ranks disagree on collective #1: rank 0 called all_reduce%(sum%) of 4 f32, rank 1 called all_reduce%(sum%) of 5 f32" },
  { "kind", "rank 0 called all_reduce%(sum%) of 4 f32, rank 1 called broadcast of 4 f32, root 0" },
  { "op", "rank 0 called all_reduce%(sum%) of 4 f32, rank 1 called all_reduce%(max%) of 4 f32" },
  { "dtype", "rank 1 called all_reduce%(sum%) of 4 f64" },
  { "root", "rank 0 called broadcast of 4 f32, root 0, rank 1 called broadcast of 4 f32, root 1" },
  { "exit", "rank 1 left the job %(its script ended after 0 collectives%) while rank 0 waits for it in all_reduce #1" },
  { "kill", "rank 1 failed: killed by signal 9" },
  { "error", "rank 1 gives up" },
  -- the sender's 8 elements fit in the ring: it goes on; the receiver fails
  { "p2p", "rank 0 sent 8 f32 to rank 1, which expected 16 f32", "rank 1 survived" },
}

T.test("a job that goes wrong ends with its cause", function()
  for _, c in ipairs(CASES) do
    local mode, want, survivor = c[1], c[2], c[3] or "survived"
    -- a long timeout: the failure must be seen because of what happened
    local out, code = job(2, "failures.lua", mode, "GPULUA_COMM_TIMEOUT=100")
    T.isnt(code, 0, mode .. ": the job fails")
    T.ok(out:find(want) ~= nil, mode .. ": the output says what happened")
    T.ok(not out:find(survivor), mode .. ": no rank carried on past the failed collective")
    if not out:find(want) then T.diag(out) end
  end
end)

T.test("rank fields without a launcher", function()
  T.is(gpu.rank, 0, "gpu.rank is 0")
  T.is(gpu.world_size, 1, "gpu.world_size is 1")
  T.is(gpu.local_rank, 0, "gpu.local_rank is 0")
  if gpu.backend == "host" then
    local t = gpu.tensor({ 1, 2 })
    gpu.all_reduce(t, { op = "avg" })
    T.is(t:totable(), { 1, 2 }, "a world of one: all_reduce is the identity")
  else
    T.raises_at(function() gpu.all_reduce(gpu.ones({ 2 })) end, "not built yet", "cuda: collectives say they need NCCL")
  end
  local p = assert(io.popen(string.format("RANK=x WORLD_SIZE=2 %s --device host -e 'gpu.all_reduce(gpu.ones({1}))' 2>&1", GPULUA)))
  local out = p:read("a")
  p:close()
  T.ok(out:find("cannot join the job: RANK='x' is not a non%-negative integer") ~= nil, "a malformed RANK is named: " .. out)
  p = assert(io.popen(string.format("RANK=2 WORLD_SIZE=2 %s --device host -e 'gpu.all_reduce(gpu.ones({1}))' 2>&1", GPULUA)))
  out = p:read("a")
  p:close()
  T.ok(out:find("RANK=2 is not below WORLD_SIZE=2") ~= nil, "a rank past the world is named: " .. out)
end)

T.done()
