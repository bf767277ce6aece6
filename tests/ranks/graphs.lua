-- Run by tests/ranks.lua under `gpulua -n N`: collectives captured in
-- graphs (gpu.graph).  A replay must give what the same calls give run
-- directly, numbered among the collectives called around it; a
-- data-parallel step (compute, bucketed all_reduce on a second stream, the
-- update) captured once and replayed must train as the step run directly.
local gpu = require "gpu"
local T = require "gpu.test"

local r, w = gpu.rank, gpu.world_size
local nxt, prv = (r + 1) % w, (r - 1) % w

-- rank q's input for refill k: small integers, exact in f32
local function input(q, k, n)
  local t = {}
  for i = 1, n do t[i] = (q + 1) * (i % 5 + 1) + k end
  return t
end

-- every collective once, on the stream given (the capture's, or another)
local function all_kinds(bufs, s)
  local o = { stream = s }
  gpu.all_reduce(bufs.sum, o)
  gpu.all_reduce(bufs.max, { op = "max", stream = s })
  gpu.broadcast(bufs.bc, { root = w - 1, stream = s })
  gpu.reduce(bufs.red, { root = 0, stream = s })
  gpu.all_gather(bufs.ag_out, bufs.ag_in, o)
  gpu.reduce_scatter(bufs.rs_out, bufs.rs_in, o)
  gpu.group(function()
    gpu.send(bufs.p_send, nxt, o)
    gpu.recv(bufs.p_recv, prv, o)
  end)
end

local N = 6
local function fresh()
  return {
    sum = gpu.empty({ N }), max = gpu.empty({ N }), bc = gpu.empty({ N }), red = gpu.empty({ N }),
    ag_in = gpu.empty({ N }), ag_out = gpu.empty({ N * w }),
    rs_in = gpu.empty({ N * w }), rs_out = gpu.empty({ N }),
    p_send = gpu.empty({ N }), p_recv = gpu.empty({ N }),
  }
end
local function fill(b, k)
  local v = gpu.tensor(input(r, k, N), { dtype = "f32" })
  for _, name in ipairs { "sum", "max", "bc", "red", "ag_in", "p_send" } do b[name]:copy(v) end
  b.rs_in:copy(gpu.tensor(input(r, k, N * w), { dtype = "f32" }))
end
local function results(b)
  local t = {}
  for _, name in ipairs { "sum", "max", "bc", "ag_out", "rs_out", "p_recv" } do t[name] = b[name]:totable() end
  if r == 0 then t.red = b.red:totable() end
  return t
end

T.test("every collective in a graph: replays equal the calls run directly", function()
  local direct, replayed = fresh(), fresh()
  local g <close> = gpu.graph(function(s) all_kinds(replayed, s) end, { name = "colls" })
  T.is(g.nodes, 7, "seven collectives captured (the group is one): " .. g.nodes)
  for k = 0, 2 do
    fill(direct, k)
    all_kinds(direct)
    fill(replayed, k)
    g:launch()
    T.is(results(replayed), results(direct), "replay " .. (k + 1) .. " after a refill equals the direct calls")
  end
end)

T.test("replays among direct collectives keep the job's order", function()
  local a, b = gpu.empty({ 3 }), gpu.empty({ 3 })
  local s <close> = gpu.stream()
  local g <close> = gpu.graph(function() gpu.all_reduce(a); gpu.all_reduce(a, { op = "max" }) end)
  for k = 1, 4 do
    a:fill(r + k)
    b:fill(r * k)
    gpu.all_reduce(b)              -- before the replay, on the default stream
    g:launch(s)                    -- two collectives on another stream
    gpu.all_reduce(b, { stream = s })
    s:synchronize()
    local sum = 0
    for q = 0, w - 1 do sum = sum + q + k end
    T.is(a:totable(), { sum, sum, sum }, "replay " .. k .. ": sum, then max of equal values")
    local sb = 0
    for q = 0, w - 1 do sb = sb + q * k end
    T.is(b:totable(), { sb * w, sb * w, sb * w }, "direct all_reduces around it: " .. k)
  end
end)

-- the data-parallel step: two layers of y = x W; each layer's gradient
-- bucket all_reduced (avg) on comm as soon as the backward wrote it, the
-- update waiting for it
local D, H, B, LR = 8, 6, 5, 0.1
local function model(seed)
  return { W1 = gpu.randn({ D, H }, { seed = seed, std = 1 / math.sqrt(D) }),
           W2 = gpu.randn({ H, 1 }, { seed = seed + 1, std = 1 / math.sqrt(H) }),
           dW1 = gpu.empty({ D, H }), dW2 = gpu.empty({ H, 1 }) }
end
local function dp_step(m, x, t, cs, comm)
  local o = { stream = cs }
  local h = gpu.matmul(x, m.W1, o)
  local y = gpu.matmul(h, m.W2, o)
  local dy = y:sub(t, o):mul(2 / B, o)
  gpu.matmul(h:t(), dy, { out = m.dW2, stream = cs })
  comm:wait(cs:record())
  gpu.all_reduce(m.dW2, { op = "avg", stream = comm })
  local e2 = comm:record()
  local dh = gpu.matmul(dy, m.W2:t(), o)   -- overlaps layer 2's all_reduce
  gpu.matmul(x:t(), dh, { out = m.dW1, stream = cs })
  comm:wait(cs:record())
  gpu.all_reduce(m.dW1, { op = "avg", stream = comm })
  local e1 = comm:record()
  cs:wait(e2)
  m.W2:sub_(m.dW2:mul(LR, o), o)
  cs:wait(e1)
  m.W1:sub_(m.dW1:mul(LR, o), o)
end
local function batch(k)
  return gpu.randn({ B, D }, { seed = 100 * k + r }), gpu.randn({ B, 1 }, { seed = 100 * k + r + 50 })
end

T.test("a data-parallel step captured once and replayed trains as run directly", function()
  local comm <close> = gpu.stream()
  local direct, graphed = model(7), model(7)
  local xb, tb = gpu.empty({ B, D }), gpu.empty({ B, 1 })
  local g <close> = gpu.graph(function(s) dp_step(graphed, xb, tb, s, comm) end, { name = "dp_step" })
  T.is(g.nodes >= 12, true, "the step's ops and both all_reduces are nodes: " .. g.nodes)
  local cs <close> = gpu.stream()
  for k = 1, 8 do
    local x, t = batch(k)
    dp_step(direct, x, t, cs, comm)
    xb:copy(x)
    tb:copy(t)
    g:launch()
  end
  gpu.synchronize()
  local d1, g1 = direct.W1:totable(), graphed.W1:totable()
  local worst = 0
  for i = 1, D do
    for j = 1, H do
      local d = math.abs(d1[i][j] - g1[i][j])
      if d ~= d or d > worst then worst = d end   -- a NaN is the worst
    end
  end
  T.ok(worst <= 1e-5, "W1 after 8 replays equals W1 after 8 direct steps (max difference " .. worst .. ")")
  -- every rank holds the same parameters
  local hi, lo = graphed.W2:clone(), graphed.W2:clone()
  gpu.all_reduce(hi, { op = "max" })
  gpu.all_reduce(lo, { op = "min" })
  T.is(hi:sub(lo):abs():max():item(), 0, "W2 is the same on every rank")
end)

T.test("capture refusals for collectives", function()
  local other <close> = gpu.stream()
  local x = gpu.ones({ 4 })
  T.raises(function() gpu.graph(function() gpu.all_reduce(x, { stream = other }) end) end,
           "is not part of the capture", "a collective on a stream outside the capture")
  T.raises(function() gpu.graph(function() gpu.all_reduce(gpu.ones({ 4 }, { device = "host" })) end) end,
           "pageable host memory cannot be captured", "a collective on pageable memory")
  -- a bad collective is refused as outside a capture, at its line
  T.raises_at(function() gpu.graph(function() gpu.all_gather(gpu.empty({ 3 }), x) end) end,
              "all_gather: the output has 3 elements", "a bad all_gather inside a capture")
  -- the job goes on
  gpu.all_reduce(x)
  T.is(x:totable(), { w, w, w, w }, "collectives work after refused captures")
end)

T.done()
