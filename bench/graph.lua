-- Graph replay through gpulua: gpu.graph of graph_nodes small ops (x:add_(1)
-- on a 1-element f32 tensor, in sequence on the capture stream), replayed
-- with g:launch(s).  Events around a batch of graph_replays launches, after
-- graph_warm batches; the row is the time per node (a batch's time /
-- replays / nodes), median of graph_reps batches: as bench/ref.cu's
-- bench_graph.  The check: x holds the number of adds run, and the graph
-- has one node per add.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

local N, NR = Z.graph_nodes, Z.graph_replays

B.guard("graph_node", function()
  local s <close> = gpu.stream()
  local x = gpu.zeros({1}, { dtype = "f32", stream = s })
  s:synchronize()
  local g <close> = gpu.graph(function()
    for _ = 1, N do x:add_(1) end            -- on the capture stream (current inside)
  end, { name = "bench" })
  local nodes = g.nodes

  local t = {}
  for r = 1 - Z.graph_warm, Z.graph_reps do
    local e0 <close> = s:record { timing = true }
    for _ = 1, NR do g:launch(s) end
    local e1 <close> = s:record { timing = true }
    e1:synchronize()
    if r >= 1 then t[r] = (e1 - e0) * 1e3 / (NR * N) end
  end
  B.row("graph_node", B.median(t), "us", string.format("graph replay, time per node (%d kernels)", N))
  B.note("graph_node", string.format("graph_node gpulua: gpu.graph of %d ops (x:add_(1), 1 element), %d replays "
                                     .. "per batch, median of %d batches after %d", nodes, NR, Z.graph_reps,
                                     Z.graph_warm))
  local want = N * NR * (Z.graph_warm + Z.graph_reps)
  local got = x:item()
  B.check("graph_node", got == want and nodes == N,
          string.format("element is %s, want %d; %d nodes, want %d", got, want, nodes, N))
end)

B.finish()
