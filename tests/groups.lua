-- Process groups (gpu.new_group, gpu.split_group) between processes,
-- through the launcher: tests/ranks/groups.lua under -n 4, and jobs with
-- groups that go wrong (tests/ranks/group_failures.lua), each of which must
-- end with its cause, naming the group.  Host backend (shared memory) in
-- CI; cuda (NCCL's split communicators) under `make test-gpu` with 4 GPUs.
local gpu = require "gpu"
local T = require "gpu.test"

local GPULUA = os.getenv("GPULUA") or "build/gpulua"
local DIR = (arg[0]:match("^(.*)/") or ".") .. "/ranks/"
local CUDA = gpu.backend == "cuda"
local DEVICE = CUDA and "cuda" or "host"
local NGPU = CUDA and gpu.device_count() or 0
local ENV = CUDA and "NCCL_NVLS_ENABLE=0 " or ""

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

T.test("two groups of two out of four, split, graphs, close (" .. DEVICE .. ")", function()
  if CUDA and NGPU < 4 then return T.skip("groups of a world of 4", "they need 4 GPUs") end
  local out, code = job(4, "groups.lua")
  T.is(code, 0, "the job exits 0")
  local failed = out:match("%[rank %d%] not ok[^\n]*")
  T.is(failed, nil, "no rank failed a check")
  for rank = 0, 3 do
    local oks = count(out, "%[rank " .. rank .. "%] ok ")
    T.ok(oks >= 40, string.format("rank %d passed its checks (%d)", rank, oks))
  end
  if code ~= 0 or failed then T.diag(out:sub(-3000)) end
end)

-- mode, what the output must say, the comm timeout; the ranks that take
-- no part in the failed group's collective go on
local CASES = {
  { "count", "ranks of group {1,3} disagree on collective #1: rank 1 called all_reduce%(sum%) of 4 f32, rank 3 called all_reduce%(sum%) of 5 f32" },
  { "root", "ranks of group {1,3} disagree on collective #1: rank 1 called broadcast of 4 f32, root 0, rank 3 called broadcast of 4 f32, root 1" },
  { "stall", "timed out after 3 s: rank 3 never reached all_reduce #1 of group {1,3}", 3 },
  { "exit", "rank 3 left group {1,3} %(closed it, or its script ended, after 1 collectives of it%) while rank 1 waits for it in all_reduce #2 of group {1,3}" },
  { "list", "new_group: ranks disagree on the group made #2: rank 2 passed other ranks than rank 0" },
}

T.test("a job whose group goes wrong ends with its cause, naming the group (" .. DEVICE .. ")", function()
  -- on cuda the check goes through the group's sideband (GPULUA_COMM_CHECK=1)
  if CUDA and NGPU < 4 then return T.skip("group failure cases", "they need 4 GPUs") end
  for _, c in ipairs(CASES) do
    local mode, want = c[1], c[2]
    -- known gap (issue 36): on cuda the watchdog does not yet see a group
    -- member leave; the collective times out instead (H200 x4, 2026-11-28)
    if CUDA and mode == "exit" then T.skip("exit on cuda", "a member leaving is seen only at the timeout") goto next end
    local mark = os.tmpname()
    local out, code = job(4, "group_failures.lua", mode,
                          string.format("GPULUA_COMM_TIMEOUT=%d GPULUA_COMM_CHECK=1 GROUP_FAILURES_MARK=%s ",
                                        c[3] or 100, mark))
    for _, f in ipairs { mark, mark .. "0", mark .. "2" } do os.remove(f) end
    T.isnt(code, 0, mode .. ": the job fails")
    T.ok(out:find(want) ~= nil, mode .. ": the output says what happened")
    if mode ~= "list" then
      T.ok(out:find("rank 0 survived") and out:find("rank 2 survived"), mode .. ": the ranks outside the group go on")
    end
    T.ok(not out:find("rank 1 survived"), mode .. ": rank 1 did not carry on past the failed collective")
    if not out:find(want) then T.diag(out) end
    ::next::
  end
end)

T.test("a world of one: a group of one", function()
  local g <close> = gpu.new_group({ 0 })
  T.is(g.rank, 0, "g.rank")
  T.is(g.size, 1, "g.size")
  local t = gpu.tensor({ 1, 2 })
  g:all_reduce(t)
  T.is(t:totable(), { 1, 2 }, "all_reduce on a group of one is the identity")
  T.raises(function() g:all_reduce(t, 5) end, "bad argument #2 to 'all_reduce' %(table expected, got number%)",
           "a method's options that are not a table")
  T.raises(function() g:all_reduce(t, { group = g }) end, "bad option 'group'", "a method given a group")
  local none <close> = gpu.split_group(nil)
  T.is(none.rank, nil, "split_group(nil): in no group")
  T.raises(function() none:all_reduce(t) end, "this rank %(0%) is not in", "its collectives refused")
  T.raises(function() gpu.graph(function() gpu.new_group({ 0 }) end) end, "cannot be made while a graph is captured",
           "no group made in a capture")
end)

T.done()
