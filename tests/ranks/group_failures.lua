-- Run by tests/groups.lua under `gpulua -n 4`: one way for a job with
-- process groups to go wrong, named by arg[1].  The job must end with the
-- cause, naming the group, never hang.
local gpu = require "gpu"
local mode, r = arg[1], gpu.rank
local odds = gpu.new_group({ 1, 3 })
local t = gpu.ones({ 4 })

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
