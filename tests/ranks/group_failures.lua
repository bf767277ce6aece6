-- Run by tests/groups.lua under `gpulua -n 4`: one way for a job with
-- process groups to go wrong, named by arg[1].  The job must end with the
-- cause, naming the group, never hang.
local gpu = require "gpu"
local mode, r = arg[1], gpu.rank
local odds = gpu.new_group({ 1, 3 })
local t = gpu.ones({ 4 })

-- The ranks outside the group finish first; only then does the group go
-- wrong.  The launcher tears the whole job down once a rank fails, so a
-- rank outside that is merely slow (a loaded machine) would otherwise be
-- killed before it could say it went on.  GROUP_FAILURES_MARK (set by
-- tests/groups.lua): the prefix of the files the even ranks leave.
local mark = os.getenv("GROUP_FAILURES_MARK")
if mark and mode ~= "list" then
  if r % 2 == 0 then
    gpu.synchronize()
    print("rank " .. r .. " survived " .. mode)
    io.stdout:flush()
    assert(io.open(mark .. r, "w")):close()
    return
  end
  local t0 = os.time()
  while not (io.open(mark .. "0") and io.open(mark .. "2")) and os.time() - t0 < 60 do os.execute("sleep 0.05") end
end

if mode == "count" then
  -- the odd ranks disagree on the count; the even ones take no part
  if r % 2 == 1 then odds:all_reduce(gpu.ones({ 4 + r // 2 })) end
elseif mode == "root" then
  if r % 2 == 1 then odds:broadcast(t, { root = r // 2 }) end
elseif mode == "stall" then
  -- rank 3 stays alive but never calls the all_reduce rank 1 waits in
  if r == 1 then odds:all_reduce(t) elseif r == 3 then os.execute("sleep 8") end
elseif mode == "exit" then
  -- rank 3's script ends after one all_reduce of the group; rank 1 waits
  -- for it in the second
  if r % 2 == 1 then odds:all_reduce(t) end
  gpu.synchronize()
  if r == 3 then return end
  if r == 1 then odds:all_reduce(t) end
elseif mode == "list" then
  -- rank 2 passes another list
  gpu.new_group(r == 2 and { 0, 2 } or { 0, 1 })
end
gpu.synchronize()
print("rank " .. r .. " survived " .. mode)
