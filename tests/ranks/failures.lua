-- Run by tests/ranks.lua under `gpulua -n 2`: one way for a job to go wrong,
-- named by arg[1].  The job must end with the cause, never hang.
local gpu = require "gpu"
local mode, r = arg[1], gpu.rank
local t = gpu.ones({ 4 })

local function pid()
  local f = assert(io.open("/proc/self/stat"))
  local p = f:read("n")
  f:close()
  return p
end

if mode == "count" then
  gpu.all_reduce(gpu.ones({ 4 + r }))
elseif mode == "kind" then
  if r == 1 then gpu.broadcast(t) else gpu.all_reduce(t) end
elseif mode == "op" then
  gpu.all_reduce(t, { op = r == 0 and "sum" or "max" })
elseif mode == "dtype" then
  gpu.all_reduce(r == 0 and t or gpu.ones({ 4 }, { dtype = "f64" }))
elseif mode == "root" then
  gpu.broadcast(t, { root = r })
elseif mode == "exit" then
  -- rank 1's script ends; rank 0 waits for it in a collective
  if r == 1 then return end
  gpu.all_reduce(t)
elseif mode == "kill" then
  if r == 1 then os.execute("kill -9 " .. pid()) end
  gpu.all_reduce(t)
elseif mode == "error" then
  if r == 1 then error("rank 1 gives up") end
  gpu.all_reduce(t)
elseif mode == "error_after" then
  -- after a collective both finished: rank 0 then loses its peer in the
  -- next one, but the launcher names rank 1, whose error is the cause
  gpu.all_reduce(t)
  gpu.synchronize()
  if r == 1 then error("rank 1 gives up after a collective") end
  gpu.all_reduce(t)
elseif mode == "kill_mid" then
  -- rank 1 dies with its all_reduce enqueued (on cuda: NCCL's kernel is
  -- running, waiting for rank 0, which comes a moment later)
  gpu.all_reduce(t)
  gpu.synchronize()
  if r == 0 then os.execute("sleep 1") end
  gpu.all_reduce(gpu.ones({ 1 << 20 }))
  if r == 1 then os.execute("kill -9 " .. pid()) end
elseif mode == "graph_mismatch" then
  -- rank 0 replays a captured all_reduce, rank 1 calls it directly: NCCL
  -- requires every rank to capture it; the check says so
  gpu.init_comm()
  if r == 0 then
    local g = gpu.graph(function() gpu.all_reduce(t) end)
    g:launch()
  else
    gpu.all_reduce(t)
  end
elseif mode == "p2p" then
  -- rank 0 sends 8 elements, rank 1 expects 16
  if r == 0 then gpu.send(gpu.ones({ 8 }), 1) else gpu.recv(gpu.empty({ 16 }), 0) end
elseif mode == "stall" then
  -- both join (on cuda: NCCL's communicator exists); rank 0 stays alive but
  -- never calls the all_reduce rank 1 waits in
  gpu.init_comm()
  if r == 0 then os.execute("sleep 8") else gpu.all_reduce(t) end
elseif mode == "stall2" then
  gpu.all_reduce(t)
  if r == 0 then os.execute("sleep 8") else gpu.all_reduce(t) end
end
gpu.synchronize()
print("rank " .. r .. " survived " .. mode)
