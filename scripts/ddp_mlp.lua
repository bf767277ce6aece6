-- Data-parallel training of a small MLP, the pattern of PyTorch's DDP with
-- hand-written backward: every rank holds the same parameters and trains on
-- its own shard of a synthetic data set labelled by a fixed "teacher"
-- network; the gradients are averaged across ranks by all_reduce, one bucket
-- per layer, on a communication stream, so that layer 2's all_reduce runs
-- while layer 1's backward computes.  Rank 0 prints the loss as it falls;
-- at the end every rank checks that all ranks hold the same parameters.
--
--   gpulua -n 2 scripts/ddp_mlp.lua [steps] [batch per rank] [graph]
--   gpulua -n 2 --trace step.svg scripts/ddp_mlp.lua 20   -- see the overlap
--
-- DDP_MLP_TRACE=PATH writes the timeline of the last step alone, one SVG
-- per rank (PATH.rankR.svg): layer 2's all_reduce on the comm stream
-- beside layer 1's backward on the compute stream.
--
-- With `graph`, the step (forward, backward, both all_reduces, the update)
-- is captured once with gpu.graph and replayed: each step then only draws
-- its batch into the step's input buffers and launches the graph.
--
-- Model: x {B, D} -> relu(x W1 + b1) {B, H} -> z = h W2 + b2 {B, C};
-- loss = mean over the batch of -log_softmax(z)[label].
local gpu = require "gpu"

local steps = tonumber(arg[1]) or 300
local B = tonumber(arg[2]) or 64          -- examples per rank and step
local GRAPH = arg[3] == "graph"
if arg[3] and not GRAPH then error("ddp_mlp: the third argument is 'graph' or nothing, not '" .. arg[3] .. "'") end
local D, H, C = 32, 64, 8                 -- input, hidden, classes
local LR = 0.5
local r, w = gpu.rank or 0, gpu.world_size or 1

local compute = gpu.stream()              -- forward, backward, update
local comm = gpu.stream()                 -- the gradient all_reduces
local _ <close> = gpu.using(compute)      -- every op below, unless it names comm

-- ---- the data: a teacher labels random inputs; each rank its own shard --------

local T1 = gpu.randn({ D, 4 * H }, { seed = 7 })
local T2 = gpu.randn({ 4 * H, C }, { seed = 8 })
local function batch(step)
  -- the same (step, rank) gives the same batch; ranks never share
  -- examples; step 0 is the held-out batch, the same on every rank
  local seed = step == 0 and 1 or 1000003 * step + r + 2
  local x = gpu.randn({ B, D }, { seed = seed })
  local logits = gpu.matmul(gpu.matmul(x, T1):relu(), T2)
  local y = logits:argmax({ dim = 2, keepdim = true })   -- {B, 1}, 1-based
  return x, y
end

-- ---- parameters: the same seeds on every rank, so the same start ---------------

-- each layer's gradient bucket holds dW then db, contiguous: one all_reduce
local function layer(fan_in, fan_out, seed)
  local l = {}
  l.W = gpu.randn({ fan_in, fan_out }, { seed = seed, std = 1 / math.sqrt(fan_in) })
  l.b = gpu.zeros({ fan_out })
  l.bucket = gpu.zeros({ fan_in * fan_out + fan_out })
  l.dW = l.bucket:narrow(1, 1, fan_in * fan_out):view({ fan_in, fan_out })
  l.db = l.bucket:narrow(1, fan_in * fan_out + 1, fan_out)
  l.ready = nil   -- the event after which the bucket holds the averaged gradient
  return l
end
local L1, L2 = layer(D, H, 11), layer(H, C, 12)
local classes = gpu.arange(1, C + 1, { dtype = "i64" })   -- {C}: 1..C

-- average a layer's bucket across ranks on the comm stream, after cs (the
-- compute stream, or the capture's) has written it; the update waits for ready
local function reduce_async(l, cs)
  comm:wait(cs:record())
  gpu.all_reduce(l.bucket, { op = "avg", stream = comm })
  l.ready = comm:record()
end

-- one step on batch (x, y); cs is the current stream
local function step_on(x, y, cs)
  -- forward
  local h = gpu.matmul(x, L1.W):add_(L1.b)
  local a = h:relu()
  local z = gpu.matmul(a, L2.W):add_(L2.b)
  local logp = z:log_softmax({ dim = 2 })
  -- backward: dz = (softmax(z) - onehot(y)) / B
  local onehot = y:eq(classes):to("f32")                       -- {B, C}
  local dz = logp:exp():sub_(onehot):mul_(1 / B)
  gpu.matmul(a:t(), dz, { out = L2.dW })
  dz:sum({ dim = 1, out = L2.db })
  reduce_async(L2, cs)                        -- layer 2's bucket goes ...
  local da = gpu.matmul(dz, L2.W:t())         -- ... while layer 1's backward runs
  local dh = gpu.where(h:gt(0), da, 0)
  gpu.matmul(x:t(), dh, { out = L1.dW })
  dh:sum({ dim = 1, out = L1.db })
  reduce_async(L1, cs)
  -- update with the averaged gradients
  for _, l in ipairs { L2, L1 } do
    cs:wait(l.ready)
    l.W:sub_(l.dW:mul(LR))
    l.b:sub_(l.db:mul(LR))
  end
end

local step
if GRAPH then
  -- the step's inputs live in buffers the graph reads: a step copies its batch in
  local xs, ys = gpu.empty({ B, D }), gpu.empty({ B, 1 }, { dtype = "i64" })
  local g = gpu.graph(function(cs) step_on(xs, ys, cs) end, { name = "ddp_step" })
  step = function(i)
    local x, y = batch(i)
    xs:copy(x)
    ys:copy(y)
    g:launch()
  end
else
  step = function(i)   -- i >= 1: batch 0 is held out
    local x, y = batch(i)
    step_on(x, y, compute)
  end
end

-- the loss on a held-out batch, the same on every rank (a sync: only now and then)
local xe, ye = batch(0)
local function eval_loss()
  local h = gpu.matmul(xe, L1.W):add_(L1.b):relu_()
  local z = gpu.matmul(h, L2.W):add_(L2.b)
  return z:log_softmax({ dim = 2 }):gather(2, ye):mean():neg():item()
end

local first, last = eval_loss(), nil
if r == 0 then print(string.format("ddp_mlp: step %4d  held-out loss %.4f", 0, first)) end
local t0, evals = nil, 0
local TRACE = os.getenv("DDP_MLP_TRACE")
for i = 1, steps do
  -- the time per step leaves out step 1, which pays for first uses (kernel
  -- modules loaded, cuBLAS set up) that a graph pays for at its capture
  if i == 2 then
    gpu.synchronize()
    t0 = gpu.clock()
  end
  if TRACE and i == steps then
    gpu.synchronize()
    gpu.trace.start()
  end
  step(i)
  if TRACE and i == steps then
    gpu.trace.stop()
    gpu.trace.svg(string.format("%s.rank%d.svg", TRACE, r))
    -- how long the first all_reduce (layer 2's) ran beside compute work
    local ev, ar = gpu.trace.events(), nil
    for _, e in ipairs(ev) do
      if e.name == "all_reduce" and not ar then ar = e end
    end
    local beside = 0
    for _, e in ipairs(ev) do
      if ar and e.kind == "op" and e.stream and e.stream ~= ar.stream and e.name ~= "all_reduce" then
        local a, b = math.max(e.ts, ar.ts), math.min(e.ts + e.dur, ar.ts + ar.dur)
        if b > a then beside = beside + (b - a) end
      end
    end
    if ar and r == 0 then
      print(string.format("ddp_mlp: traced step: layer 2's all_reduce ran %.1f us, %.1f us of it beside compute ops",
                          ar.dur, beside))
    end
  end
  if i % 100 == 0 or i == steps then
    gpu.synchronize()   -- the steps so far are done: their time counts
    local te = gpu.clock()
    last = eval_loss()
    evals = evals + (gpu.clock() - te)
    if r == 0 then print(string.format("ddp_mlp: step %4d  held-out loss %.4f", i, last)) end
  end
end
-- the steps' time from step 2 on, wall clock, the evaluations left out
local per_step = t0 and (gpu.clock() - t0 - evals) / (steps - 1) * 1e6

-- every rank must hold the same parameters: the elementwise max and min
-- across ranks equal this rank's
local params = gpu.cat({ L1.W:reshape({ -1 }), L1.b, L2.W:reshape({ -1 }), L2.b }, 1)
local hi, lo = params:clone(), params:clone()
gpu.all_reduce(hi, { op = "max" })
gpu.all_reduce(lo, { op = "min" })
local spread = hi:sub(lo):abs():max():item()
local same = spread == 0
-- the threshold: half the initial held-out loss, after 100 steps or more
-- (a short run, e.g. for a trace, checks the parameters only)
local learned = steps < 100 or last < first / 2
if r == 0 then
  print(string.format("ddp_mlp: %d ranks x %d examples, %d steps: loss %.4f -> %.4f, parameters %s: %s",
                      w, B, steps, first, last, same and "equal on every rank" or "DIFFER",
                      (same and learned) and "check ok" or "check FAILED"))
end
if r == 0 and per_step then
  print(string.format("ddp_mlp: %d steps%s, %.1f us per step (steps 2 to %d)", steps,
                      GRAPH and " replayed from a graph" or "", per_step, steps))
end
if not (same and learned) then
  error(string.format("rank %d: loss %.4f -> %.4f, parameter spread across ranks %g", r, first, last, spread))
end
