-- Run by tests/ranks_where.lua: rank 1 fails to reach the second world
-- all_reduce in the way arg[1] names; rank 0's timeout message must say
-- where rank 1 is.  The test finds the lines marked "-- HERE".
local gpu = require "gpu"
local mode, r = arg[1], gpu.rank
local t = gpu.ones({ 4 })
-- late: rank 1 comes to the first collective after rank 0 gave up on it
-- (on cuda, rank 0 then leaves with its thread still in NCCL's creation of
-- the communicator)
if mode == "late" and r == 1 then os.execute("sleep 5") end -- HERE late
gpu.all_reduce(t) -- HERE first
if r == 1 then
  if mode == "loop" then
    local x = 0
    while true do x = x + 1 end -- HERE loop
  elseif mode == "c" then
    os.execute("sleep 4") -- HERE c
  elseif mode == "other" then
    -- waits in a collective of a group whose other rank never comes; it
    -- starts 2 s after rank 0's wait, so that rank 0's timeout (4 s: the
    -- test sets it) comes while rank 1 waits, 2 s before rank 1's own (at
    -- the same time, rank 1 could give up first and exit); margins of a
    -- second failed on a loaded 2-core machine
    local g = gpu.new_group({ 1, 2 })
    os.execute("sleep 2")
    g:all_reduce(t) -- HERE other
    gpu.synchronize()
  elseif mode == "exit" then
    os.exit(3)
  elseif mode == "left" then
    os.exit(0)
  end
elseif mode == "other" and r == 2 then
  gpu.new_group({ 1, 2 })
  os.execute("sleep 8")
  os.exit(0)
elseif mode == "other" then
  gpu.new_group({ 1, 2 })
end
if mode == "group" then
  local g = gpu.new_group({ 0, 1 }, { name = "pair" })
  if r == 1 then
    local x = 0
    while true do x = x + 1 end -- HERE group
  end
  if r <= 1 then g:all_reduce(t) end
  gpu.synchronize()
  os.exit(0)
end
gpu.all_reduce(t)
gpu.synchronize()
print("rank " .. r .. " survived")
