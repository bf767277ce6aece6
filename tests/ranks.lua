-- Collectives between processes, through the launcher: tests/ranks/
-- collectives.lua under -n 2 and -n 4, and jobs that go wrong (tests/ranks/
-- failures.lua), each of which must end with its cause.  The jobs run on
-- this file's backend: host (shared memory) in CI; cuda (NCCL, one GPU per
-- rank, as many ranks as GPUs up to 4) under `make test-gpu`.
local gpu = require "gpu"
local T = require "gpu.test"

local GPULUA = os.getenv("GPULUA") or "build/gpulua"
local DIR = (arg[0]:match("^(.*)/") or ".") .. "/ranks/"
local CUDA = gpu.backend == "cuda"
local DEVICE = CUDA and "cuda" or "host"
local NGPU = CUDA and gpu.device_count() or 0
-- on cuda: the per-collective check is behind GPULUA_COMM_CHECK=1, and
-- multicast stays off on shared machines
local ENV = CUDA and "NCCL_NVLS_ENABLE=0 " or ""

-- run a job; output (stdout and stderr, rank-prefixed) and exit status.
-- `timeout` only guards against a hang of the test itself.
local function job(n, script, args, env)
  local cmd = string.format("%s%s timeout 120 %s -n %d --prefix --device %s %s %s 2>&1",
                            ENV, env or "", GPULUA, n, DEVICE, DIR .. script, args or "")
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

local SIZES = {}
for _, n in ipairs { 2, 4 } do
  if not CUDA or n <= NGPU then SIZES[#SIZES + 1] = n end
end
-- one GPU: NCCL has one rank per GPU, so only a world of one runs
if CUDA and NGPU < 2 then SIZES = { 1 } end

-- a job of TAP-printing ranks: it exits 0, no rank failed a check, and
-- every rank passed at least `least` of them
local function tap_job(n, script, least, env)
  local out, code = job(n, script, nil, env)
  T.is(code, 0, "the job exits 0")
  local failed = {}
  for line in out:gmatch("[^\n]+") do
    if line:match("^%[rank %d+%] not ok") then failed[#failed + 1] = line end
  end
  T.is(#failed, 0, "no rank failed a check" .. (#failed > 0 and (": " .. failed[1]) or ""))
  for rank = 0, n - 1 do
    local oks = count(out, "%[rank " .. rank .. "%] ok ")
    T.ok(oks >= least, string.format("rank %d passed its checks (%d)", rank, oks))
  end
  if code ~= 0 or #failed > 0 then T.diag(out:sub(-3000)) end
end

for _, n in ipairs(SIZES) do
  T.test(string.format("every collective on %d rank%s (%s)", n, n > 1 and "s" or "", DEVICE), function()
    tap_job(n, "collectives.lua", 201)
  end)
end

for _, n in ipairs(SIZES) do
  for _, env in ipairs { "", "GPULUA_CHECK=races " } do
    if env == "" or n == 2 then
      T.test(string.format("collectives in graphs on %d rank%s (%s)%s", n, n > 1 and "s" or "", DEVICE,
                           env ~= "" and " under the race checker" or ""), function()
        tap_job(n, "graphs.lua", 20, env)
      end)
    end
  end
end

-- each case: mode, what the output must say, what no rank may print, the
-- comm timeout, the check (default 1), the most seconds the job may take
local CASES = {
  { "count", "ranks disagree on collective #1: rank 0 called all_reduce%(sum%) of 4 f32, rank 1 called all_reduce%(sum%) of 5 f32" },
  { "kind", "rank 0 called all_reduce%(sum%) of 4 f32, rank 1 called broadcast of 4 f32, root 0" },
  { "op", "rank 0 called all_reduce%(sum%) of 4 f32, rank 1 called all_reduce%(max%) of 4 f32" },
  { "dtype", "rank 1 called all_reduce%(sum%) of 4 f64" },
  { "root", "rank 0 called broadcast of 4 f32, root 0, rank 1 called broadcast of 4 f32, root 1" },
  { "exit", "rank 1 left the job %(its script ended after 0 collectives%) while rank 0 waits for it in all_reduce #1" },
  { "kill", "rank 1 failed: killed by signal 9" },
  { "error", "rank 1 gives up" },
  -- the launcher names the rank that raised, not the one that lost its peer
  { "error_after", "gpulua: rank 1 failed: exit status 1\n  rank 1: [^\n]*rank 1 gives up after a collective" },
  -- rank 0 may finish: the collective it waits in can complete if the
  -- driver lets rank 1's running kernel end (cuda); rank 1 cannot go on
  { "kill_mid", "gpulua: rank 1 failed: killed by signal 9", "rank 1 survived", nil, nil, 10 },
  { "graph_mismatch", "rank 0 called all_reduce%(sum%) of 4 f32 in a graph replay, rank 1 called all_reduce%(sum%) of 4 f32\n" },
  -- the sender's 8 elements fit in the ring: it goes on; the receiver fails
  { "p2p", "rank 0 sent 8 f32 to rank 1, which expected 16 f32", "rank 1 survived" },
  -- rank 0 is alive but never calls the collective rank 1 waits in: with
  -- the check, rank 1 waits to compare; without, in the collective itself
  { "stall", "timed out after 3 s: rank 0 never reached all_reduce #1", "rank 1 survived", 3 },
  { "stall", "timed out[^\n]*all_reduce #1", "rank 1 survived", 3, 0 },
  -- the same after a first all_reduce: on cuda NCCL is connected, the
  -- all_reduce is enqueued, and the watchdog aborts it
  { "stall2", "timed out[^\n]*all_reduce #2", "rank 1 survived", 3, 0 },
}
if CUDA then
  -- on cuda the watchdog names the line of stall2's second all_reduce
  local line, n, seen = nil, 0, false
  for l in io.lines(DIR .. "failures.lua") do
    n = n + 1
    seen = seen or l:find('mode == "stall2"', 1, true) ~= nil
    if seen and not line and l:find("else gpu.all_reduce(t) end", 1, true) then line = n end
  end
  for _, c in ipairs(CASES) do
    if c[1] == "stall2" and c[5] == 0 then
      c[2] = "timed out: all_reduce #2 %(enqueued at [^)]*failures.lua:" .. line .. "%)[^\n]*did not finish within 3 s"
    end
  end
end

T.test("a job that goes wrong ends with its cause (" .. DEVICE .. ")", function()
  if CUDA and NGPU < 2 then return T.skip("failure cases", "they need 2 GPUs") end
  for _, c in ipairs(CASES) do
    local mode, want, survivor = c[1], c[2], c[3] or "survived"
    -- a long timeout: the failure must be seen because of what happened
    local t0 = os.time()
    local out, code = job(2, "failures.lua", mode,
                          string.format("GPULUA_COMM_TIMEOUT=%d GPULUA_COMM_CHECK=%d", c[4] or 100, c[5] or 1))
    T.isnt(code, 0, mode .. ": the job fails")
    T.ok(out:find(want) ~= nil, mode .. ": the output says what happened")
    T.ok(not out:find(survivor), mode .. ": no rank carried on past the failed collective")
    local most = c[6] or 30
    T.ok(os.time() - t0 <= most, string.format("%s: the job ended within %d s (%d s)", mode, most, os.time() - t0))
    if not out:find(want) then T.diag(out) end
  end
end)

T.test("rank fields without a launcher", function()
  T.is(gpu.rank, 0, "gpu.rank is 0")
  T.is(gpu.world_size, 1, "gpu.world_size is 1")
  T.is(gpu.local_rank, 0, "gpu.local_rank is 0")
  local t = gpu.tensor({ 1, 2 }, { dtype = "f32" })
  gpu.all_reduce(t, { op = "avg" })
  T.is(t:totable(), { 1, 2 }, "a world of one: all_reduce is the identity")
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
