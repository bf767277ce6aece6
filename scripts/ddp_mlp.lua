-- Data-parallel training of a small MLP, the pattern of PyTorch's DDP with
-- hand-written backward: every rank holds the same parameters and trains on
-- its own shard of a synthetic data set labelled by a fixed "teacher"
-- network; the gradients are averaged across ranks by all_reduce, one bucket
-- per layer, on a communication stream, so that layer 2's all_reduce runs
-- while layer 1's backward computes.  Rank 0 prints the loss as it falls;
-- at the end every rank checks that all ranks hold the same parameters.
--
--   gpulua -n 2 scripts/ddp_mlp.lua [steps] [batch per rank] [graph] [accum=K]
--   gpulua -n 2 --trace step.svg scripts/ddp_mlp.lua 20   -- see the overlap
--
-- DDP_MLP_TRACE=PATH writes the timeline of the last step alone, one SVG
-- per rank (PATH.rankR.svg): layer 2's all_reduce on the comm stream
-- beside layer 1's backward on the compute stream.
--
-- With accum=K, gradient accumulation: a step runs K micro-batches of the
-- batch size each, adds their gradients in the buckets, and all-reduces only
-- after the last one.  The script then checks that one accumulated step
-- gives the parameters of one step on the K-times batch.  (Direct steps
-- only: with graph, accum= is refused.)
--
-- With `graph`, the step (forward, backward, both all_reduces, the update)
-- is captured once with gpu.graph and replayed: each step then only draws
-- its batch into the step's input buffers and launches the graph.
--
-- Model: x {B, D} -> relu(x W1 + b1) {B, H} -> z = h W2 + b2 {B, C};
-- loss = mean over the batch of -log_softmax(z)[label].
local gpu = require "gpu"

-- positional arguments first; accum=K may stand anywhere after them
local pos, ACCUM = {}, 1
for _, a in ipairs(arg) do
  local k = a:match("^accum=(.*)$")
  if k then
    ACCUM = math.tointeger(tonumber(k))
    if not ACCUM or ACCUM < 1 then error("ddp_mlp: accum= takes a positive integer, not '" .. k .. "'") end
  else
    pos[#pos + 1] = a
  end
end
local steps = tonumber(pos[1]) or 300
local B = tonumber(pos[2]) or 64          -- examples per rank and micro-batch
local GRAPH = pos[3] == "graph"
if pos[3] and not GRAPH then error("ddp_mlp: the third argument is 'graph' or nothing, not '" .. pos[3] .. "'") end
if GRAPH and ACCUM > 1 then error("ddp_mlp: accum= runs without graph") end
local D, H, C = 32, 64, 8                 -- input, hidden, classes
local LR = 0.5
local r, w = gpu.rank or 0, gpu.world_size or 1

local compute = gpu.stream()              -- forward, backward, update
local comm = gpu.stream()                 -- the gradient all_reduces
local _ <close> = gpu.using(compute)      -- every op below, unless it names comm

-- ---- the data: a teacher labels random inputs; each rank its own shard --------

local T1 = gpu.randn({ D, 4 * H }, { seed = 7 })
local T2 = gpu.randn({ 4 * H, C }, { seed = 8 })
local function batch(step, micro)
  -- the same (step, micro-batch, rank) gives the same batch; ranks never
  -- share examples; step 0 is the held-out batch, the same on every rank
  local seed = step == 0 and 1 or 1000003 * step + 1009 * ((micro or 1) - 1) + r + 2
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

-- write (add, if acc) into the buckets the gradient of the loss over n
-- examples, of which (x, y) are some; the last micro-batch of a step
-- (last) starts the all_reduces
local function backward(x, y, n, acc, last, cs)
  -- forward
  local h = gpu.matmul(x, L1.W):add_(L1.b)
  local a = h:relu()
  local z = gpu.matmul(a, L2.W):add_(L2.b)
  local logp = z:log_softmax({ dim = 2 })
  -- backward: dz = (softmax(z) - onehot(y)) / n
  local onehot = y:eq(classes):to("f32")                       -- {B, C}
  local dz = logp:exp():sub_(onehot):mul_(1 / n)
  -- the first micro-batch writes the buckets, the others add to them
  local function mm(p, q, g) if acc then g:add_(gpu.matmul(p, q)) else gpu.matmul(p, q, { out = g }) end end
  local function colsum(t, g) if acc then g:add_(t:sum({ dim = 1 })) else t:sum({ dim = 1, out = g }) end end
  mm(a:t(), dz, L2.dW)
  colsum(dz, L2.db)
  if last then reduce_async(L2, cs) end       -- layer 2's bucket goes ...
  local da = gpu.matmul(dz, L2.W:t())         -- ... while layer 1's backward runs
  local dh = gpu.where(h:gt(0), da, 0)
  mm(x:t(), dh, L1.dW)
  colsum(dh, L1.db)
  if last then reduce_async(L1, cs) end
end

-- one step on the micro-batches xs[k], ys[k] (k = 1..#xs), all of n examples
local function step_on_micro(xs, ys, n, cs)
  for k = 1, #xs do backward(xs[k], ys[k], n, k > 1, k == #xs, cs) end
  -- update with the averaged gradients
  for _, l in ipairs { L2, L1 } do
    cs:wait(l.ready)
    l.W:sub_(l.dW:mul(LR))
    l.b:sub_(l.db:mul(LR))
  end
end

-- one step on batch (x, y); cs is the current stream
local function step_on(x, y, cs)
  step_on_micro({ x }, { y }, x.shape[1], cs)
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
    local xs, ys = {}, {}
    for k = 1, ACCUM do xs[k], ys[k] = batch(i, k) end
    step_on_micro(xs, ys, ACCUM * B, compute)
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

-- accumulation: one step of K micro-batches must give the parameters of one
-- step on the K-times batch.  Not bit for bit: each gradient entry, a sum of
-- n = K*B terms, is added in another order (K partial sums, then their sum);
-- two f32 orders of n additions differ by at most about n * 2^-24 times the
-- sum of the terms' magnitudes, which is below 4 here (each term is an input
-- or activation, |.| < 4 for these inputs, times dz, |dz| <= 1/n summed over
-- n terms).  Times LR: the tolerance.
local ACC_TOL = ACCUM * B * 2^-24 * 4 * LR
local acc_diff
if ACCUM > 1 then
  local start = params:clone()
  local function flat() return gpu.cat({ L1.W:reshape({ -1 }), L1.b, L2.W:reshape({ -1 }), L2.b }, 1) end
  local function restore()
    local o = 0
    for _, p in ipairs { L1.W, L1.b, L2.W, L2.b } do
      p:copy(start:narrow(1, o + 1, p:numel()):view(p.shape))
      o = o + p:numel()
    end
  end
  local xs, ys = {}, {}
  for k = 1, ACCUM do xs[k], ys[k] = batch(steps + 1, k) end
  step_on_micro(xs, ys, ACCUM * B, compute)
  local p_acc = flat()
  restore()
  step_on_micro({ gpu.cat(xs, 1) }, { gpu.cat(ys, 1) }, ACCUM * B, compute)
  acc_diff = p_acc:sub(flat()):abs():max():item()
  if r == 0 then
    print(string.format("ddp_mlp: accumulation: %d micro-batches of %d vs one batch of %d: parameters differ by %.3g (tolerance %g): %s",
                        ACCUM, B, ACCUM * B, acc_diff, ACC_TOL, acc_diff <= ACC_TOL and "check ok" or "check FAILED"))
  end
end
-- the threshold: half the initial held-out loss, after 100 steps or more
-- (a short run, e.g. for a trace, checks the parameters only)
local learned = steps < 100 or last < first / 2
if r == 0 then
  print(string.format("ddp_mlp: %d ranks x %d examples%s, %d steps: loss %.4f -> %.4f, parameters %s: %s",
                      w, B, ACCUM > 1 and string.format(" x %d micro-batches", ACCUM) or "", steps, first, last, same and "equal on every rank" or "DIFFER",
                      (same and learned) and "check ok" or "check FAILED"))
end
if r == 0 and per_step then
  print(string.format("ddp_mlp: %d steps%s, %.1f us per step (steps 2 to %d)", steps,
                      GRAPH and " replayed from a graph" or "", per_step, steps))
end
if not (same and learned) then
  error(string.format("rank %d: loss %.4f -> %.4f, parameter spread across ranks %g", r, first, last, spread))
end
if acc_diff and not (acc_diff <= ACC_TOL) then
  error(string.format("rank %d: an accumulated step differs from one step on the K-times batch by %g", r, acc_diff))
end
