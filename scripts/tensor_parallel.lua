-- Tensor parallelism of an MLP block, Megatron-style, with hand-written
-- backward (as scripts/ddp_mlp.lua): the ranks of a tensor-parallel (TP)
-- group of 2 share one block
--
--   y = relu(x W1 + b1) W2 + b2        x, y {B, D}; W1 {D, F}; W2 {F, D}
--
-- TP rank k holds a column slice of W1 (and b1) and the matching row slice
-- of W2, so relu(x W1_k + b1_k) W2_k is a partial y with no communication
-- in between; one all_reduce over the TP group sums the partials in
-- forward (Megatron's "g").  In backward the same split gives each rank a
-- partial gradient of the block's input, summed by the matching all_reduce
-- (Megatron's "f").  With -n 4 two TP groups of 2 are the data-parallel
-- (DP) replicas: each trains on its own batch, and the gradients are
-- summed across them by one all_reduce over the DP group.
--
--   gpulua -n 2 scripts/tensor_parallel.lua [steps] [batch per DP group] [width=D] [hidden=F]   -- TP 2
--   gpulua -n 4 scripts/tensor_parallel.lua                                 -- TP 2 x DP 2
--
-- The default block is small (D 64, F 256: CI runs it on the host).  The
-- bench times a Megatron-sized one, `6 32768 width=4096 hidden=16384`: a
-- GPT-style layer's hidden size 4096 and FFN 4 x 4096, on 64 sequences of
-- 512 tokens (32768 rows) per DP group, in f32 (the check below is f32's;
-- ~13 TFLOP per rank and step, the activations ~10 GB per rank with the
-- one-rank reference).  It prints the forward+backward time per step,
-- measured with events around them (the update and the batch left out).
--
-- The check: every rank also trains the whole block alone on the whole
-- batch (all DP groups' examples) and compares its slices of the
-- parameters, the last step's output and input gradient with it.
-- TP_TRACE=PATH writes the timeline of the last step, one SVG per rank
-- (PATH.rankR.svg).
local gpu = require "gpu"

-- positional steps and batch, then width= and hidden= anywhere
local pos, size = {}, { width = 64, hidden = 256 }
for _, a in ipairs(arg) do
  local key, v = a:match("^(%a+)=(.*)$")
  if key then
    if size[key] == nil then error("tensor_parallel: the options are width= and hidden=, not '" .. a .. "'") end
    size[key] = math.tointeger(tonumber(v))
    if not size[key] or size[key] < 1 then error("tensor_parallel: " .. key .. "= takes a positive integer, not '" .. v .. "'") end
  else
    pos[#pos + 1] = a
  end
end
local steps = math.tointeger(tonumber(pos[1] or 50))
local B = math.tointeger(tonumber(pos[2] or 32))          -- examples per DP group and step
if not steps or steps < 1 or not B or B < 1 then
  error("tensor_parallel: steps and batch are positive integers, not '" .. tostring(pos[1]) .. "' '" .. tostring(pos[2]) .. "'")
end
local D, F = size.width, size.hidden      -- model width, hidden width
-- The step size: 0.02 for the small block, 5.12 / F for a wider one (0.02
-- at F 256): the loss's curvature in W2 grows with the F hidden units, and
-- 0.02 diverges at F 2048
local LR = math.min(0.02, 5.12 / F)
-- f32: only the order of the sums differs.  The difference is taken
-- relative to max(1, the largest magnitude of the reference's value): at
-- the bench's size sums of 16384 or 32768 terms round at ~1e-5 of it.
local TOL = 1e-4
local r, world = gpu.rank or 0, gpu.world_size or 1
if world % 2 ~= 0 then error("tensor_parallel: runs with -n 2 or -n 4 (TP groups of 2), got " .. world .. " rank(s)") end
local TP = 2
local DP = world // TP
if F % TP ~= 0 then error("tensor_parallel: hidden= must split in " .. TP .. " (TP), got " .. F) end
-- world rank = dp_index * TP + tp rank: a TP group is two neighbours
local tp <close> = gpu.split_group(r // TP, nil, { name = "tp" })
local dp <close> = gpu.split_group(r % TP, nil, { name = "dp" })
local k, d = tp.rank, dp.rank             -- this rank's slice and replica
local FK = F // TP                        -- hidden units per TP rank

-- ---- data: a random teacher block; DP replica d draws its own examples ---

local TW1 = gpu.randn({ D, F }, { seed = 3, std = 1 / math.sqrt(D) })
local TW2 = gpu.randn({ F, D }, { seed = 4, std = 1 / math.sqrt(F) })
local function batch(step, replica)
  local x = gpu.randn({ B, D }, { seed = 1000003 * step + replica + 1 })
  return x, gpu.matmul(gpu.matmul(x, TW1):tanh(), TW2)
end

-- ---- parameters: the full block from fixed seeds; this rank keeps its slices

local W1 = gpu.randn({ D, F }, { seed = 11, std = 1 / math.sqrt(D) })
local b1 = gpu.zeros({ F })
local W2 = gpu.randn({ F, D }, { seed = 12, std = 1 / math.sqrt(F) })
local b2 = gpu.zeros({ D })
local P = {
  W1 = W1:narrow(2, k * FK + 1, FK):clone(),   -- column slice {D, FK}
  b1 = b1:narrow(1, k * FK + 1, FK):clone(),    -- copies: the reference below trains the whole
  W2 = W2:narrow(1, k * FK + 1, FK):clone(),   -- row slice {FK, D}
  b2 = b2:clone(),                                  -- whole: added once, after the sum
}
-- the gradients in one flat bucket (views into it): one DP all_reduce
local sizes = { W1 = D * FK, b1 = FK, W2 = FK * D, b2 = D }
local ORDER = { "W1", "b1", "W2", "b2" }
local n = 0
for _, name in ipairs(ORDER) do n = n + sizes[name] end
local bucket, G, at = gpu.zeros({ n }), {}, 1
for _, name in ipairs(ORDER) do
  G[name] = bucket:narrow(1, at, sizes[name]):view(P[name].shape)
  at = at + sizes[name]
end

-- one step on this replica's batch; returns y and the input gradient dx
local function step_on(x, t, p, g, group, nglobal)
  -- forward: the partial y of this rank's hidden units, summed over TP
  local h = gpu.matmul(x, p.W1):add_(p.b1)
  local a = h:relu()
  local y = gpu.matmul(a, p.W2)
  if group then group:all_reduce(y) end
  y:add_(p.b2)
  -- backward of loss = sum (y - t)^2 / (2 nglobal): dy is whole on every rank
  local dy = y:sub(t):mul_(1 / nglobal)
  gpu.matmul(a:t(), dy, { out = g.W2 })
  dy:sum({ dim = 1, out = g.b2 })
  local dh = gpu.where(h:gt(0), gpu.matmul(dy, p.W2:t()), 0)
  gpu.matmul(x:t(), dh, { out = g.W1 })
  dh:sum({ dim = 1, out = g.b1 })
  -- the input's gradient: a partial sum per TP rank, summed over TP
  local dx = gpu.matmul(dh, p.W1:t())
  if group then group:all_reduce(dx) end
  return y, dx
end

local function update(p, g)
  for _, name in ipairs(ORDER) do p[name]:sub_(g[name]:mul(LR)) end
end

local function loss_of(y, t) return y:sub(t):pow(2):sum() end   -- a 0-dim tensor

local y_last, dx_last, loss_first, loss_last
local TRACE = os.getenv("TP_TRACE")
local t0
local fb = {}                             -- steps 2..: events around forward+backward
for i = 1, steps do
  -- step 1 pays for first uses; the time per step counts from step 2
  if i == 2 then
    gpu.synchronize()
    t0 = gpu.clock()
  end
  if TRACE and i == steps then
    gpu.synchronize()
    gpu.trace.start()
  end
  local x, t = batch(i, d)
  local e1 = i > 1 and gpu.current_stream():record() or nil
  local y, dx = step_on(x, t, P, G, tp, B * DP)
  if e1 then fb[#fb + 1] = { e1, gpu.current_stream():record() } end
  if DP > 1 then dp:all_reduce(bucket) end      -- the gradients summed over the replicas
  update(P, G)
  if TRACE and i == steps then
    gpu.trace.stop()
    gpu.trace.svg(string.format("%s.rank%d.svg", TRACE, r))
  end
  if i == 1 then loss_first = loss_of(y, t) end
  if i == steps then y_last, dx_last, loss_last = y, dx, loss_of(y, t) end
end
gpu.synchronize()
local per_step = t0 and (gpu.clock() - t0) / (steps - 1) * 1e6
local fb_us
if #fb > 0 then
  fb_us = 0
  for _, e in ipairs(fb) do fb_us = fb_us + e[1]:elapsed(e[2]) * 1e3 / #fb end
  -- the slowest rank's (the all_reduces keep them close anyway)
  local m = gpu.tensor({ fb_us }, { dtype = "f64" })
  gpu.all_reduce(m, { op = "max" })
  fb_us = m:item()
end

-- the whole batch's loss: the replicas' sums added
local function global_loss(l)
  if DP > 1 then dp:all_reduce(l) end
  return l:item() / (2 * B * DP)
end
loss_first, loss_last = global_loss(loss_first), global_loss(loss_last)

-- ---- the check: the same block trained on one rank, on the whole batch ----

local R = { W1 = W1, b1 = b1, W2 = W2, b2 = b2 }
local RG = {}
for name, v in pairs(R) do RG[name] = gpu.zeros(v.shape) end
local ry, rdx
for i = 1, steps do
  local xs, ts = {}, {}
  for j = 0, DP - 1 do xs[j + 1], ts[j + 1] = batch(i, j) end
  ry, rdx = step_on(gpu.cat(xs, 1), gpu.cat(ts, 1), R, RG, nil, B * DP)
  update(R, RG)
end
-- this rank's slices and rows of the reference
local function rows(t) return t:narrow(1, d * B + 1, B) end
local diff = 0
local function compare(got, ref)
  local scale = math.max(1, ref:abs():max():item())
  diff = math.max(diff, got:sub(ref):abs():max():item() / scale)
end
for name, ref in pairs {
  W1 = R.W1:narrow(2, k * FK + 1, FK), b1 = R.b1:narrow(1, k * FK + 1, FK),
  W2 = R.W2:narrow(1, k * FK + 1, FK), b2 = R.b2,
} do
  compare(P[name], ref)
end
compare(y_last, rows(ry))
compare(dx_last, rows(rdx))
-- the largest difference on any rank
local worst = gpu.tensor({ diff }, { dtype = "f32" })
gpu.all_reduce(worst, { op = "max" })
diff = worst:item()
-- a short run (a trace, say) checks the difference only
local ok = diff <= TOL and (steps < 10 or loss_last < loss_first)
if r == 0 then
  print(string.format("tensor_parallel: TP %d x DP %d on %d ranks, batch %d per DP group, %d steps: loss %.4f -> %.4f, "
                      .. "max diff to one rank %.2e (tolerance %.0e): %s", TP, DP, world, B, steps, loss_first,
                      loss_last, diff, TOL, ok and "check ok" or "check FAILED"))
  if per_step then
    print(string.format("tensor_parallel: %.1f us per step (forward, backward, update; steps 2 to %d)", per_step, steps))
    -- per rank: 6 matmuls of 2 T D F/TP flops each (2 forward, 4 backward)
    local flops = 12 * B * D * (F // TP)
    print(string.format("tensor_parallel: block D %d, F %d, %d rows per DP group, f32: forward+backward %.1f us per "
                        .. "step (events, steps 2 to %d), %.3g TFLOP/s per rank", D, F, B, fb_us, steps,
                        flops / fb_us * 1e-6))
  end
end
if not ok then
  error(string.format("rank %d: max difference to the one-rank block %g (tolerance %g), loss %.4f -> %.4f", r, diff,
                      TOL, loss_first, loss_last))
end
