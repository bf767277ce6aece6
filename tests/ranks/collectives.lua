-- Run by tests/ranks.lua under `gpulua -n N`: every collective, several
-- dtypes and sizes, against values computed here in Lua.  Each rank prints
-- its own TAP lines (prefixed by rank in the test's output).
local gpu = require "gpu"
local T = require "gpu.test"

local r, w = gpu.rank, gpu.world_size
local DTYPES = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64" }
-- 300001 f32 elements pass the 1 MiB step of the host backend's shared memory
local SIZES = { 1, 7, 300001 }

-- rank q's element i: small integers, exact in every dtype
local function val(q, i) return (q + 1) * (i % 3 + 1) end

local function make(q, n, dtype, f)
  local t = {}
  for i = 1, n do t[i] = (f or val)(q, i) end
  return gpu.tensor(t, { dtype = dtype })
end

-- what a reduction over all ranks gives, as the dtype stores it
local function expect(dtype, op, i)
  local a = val(0, i)
  for q = 1, w - 1 do
    local b = val(q, i)
    if op == "sum" or op == "avg" then a = a + b
    elseif op == "prod" then a = a * b
    elseif op == "max" then a = math.max(a, b)
    else a = math.min(a, b) end
  end
  if op == "avg" then a = a / w end
  if T.is_int(dtype) then
    local bits = ({ i8 = 8, u8 = 8, i32 = 32, i64 = 64 })[dtype]
    return T.wrap_int(a, bits, dtype ~= "u8")
  end
  if dtype == "f16" then return T.round_f16(a) end
  if dtype == "bf16" then return T.round_bf16(a) end
  return a
end

local function same(got, want_fn, n, name)
  local bad
  for i = 1, n do
    local e = want_fn(i)
    if got[i] ~= e and not (math.abs(got[i] - e) <= 1e-6 * math.abs(e)) then bad = i break end
  end
  T.ok(bad == nil, name .. (bad and string.format(" (element %d: got %s, want %s)", bad, got[bad], want_fn(bad)) or ""))
end

T.test("rank fields", function()
  T.is(math.type(r), "integer", "gpu.rank is an integer")
  T.ok(r >= 0 and r < w, "0 <= rank < world_size")
  T.is(gpu.local_rank, r, "one node: local_rank == rank")
  T.is(gpu.local_world_size, w, "one node: local_world_size == world_size")
end)

T.test("all_reduce: every op, dtype and size", function()
  for _, dt in ipairs(DTYPES) do
    for _, n in ipairs(SIZES) do
      if n < 1000 or dt == "f32" then
        for _, op in ipairs { "sum", "prod", "max", "min", "avg" } do
          if op ~= "avg" or T.is_float(dt) then
            local t = make(r, n, dt)
            local res = gpu.all_reduce(t, { op = op })
            T.ok(rawequal(res, t), "in place returns t")
            same(t:totable(), function(i) return expect(dt, op, i) end, n,
                 string.format("all_reduce %s %s x%d", op, dt, n))
          end
        end
      end
    end
  end
  -- out of place leaves the input alone
  local t, o = make(r, 7, "f32"), gpu.empty({7})
  T.ok(rawequal(gpu.all_reduce(t, { out = o }), o), "out = o returns o")
  same(o:totable(), function(i) return expect("f32", "sum", i) end, 7, "all_reduce out of place")
  same(t:totable(), function(i) return val(r, i) end, 7, "the input is untouched")
end)

T.test("broadcast from every root", function()
  for root = 0, w - 1 do
    for _, dt in ipairs { "f32", "i64", "bf16", "bool" } do
      local t = dt == "bool" and gpu.tensor({ r == root, r ~= root }, { dtype = "bool" }) or make(r, 7, dt)
      gpu.broadcast(t, { root = root })
      if dt == "bool" then T.is(t:totable(), { true, false }, "broadcast bool from " .. root)
      else same(t:totable(), function(i) return val(root, i) end, 7, string.format("broadcast %s from %d", dt, root)) end
    end
  end
  local big = make(r, 300001, "f32")
  gpu.broadcast(big, { root = w - 1 })
  same(big:totable(), function(i) return val(w - 1, i) end, 300001, "broadcast of 300001 elements")
  local src, out = make(r, 5, "i32"), gpu.zeros({5}, { dtype = "i32" })
  gpu.broadcast(src, { root = 0, out = out })
  same(out:totable(), function(i) return val(0, i) end, 5, "broadcast into out")
end)

T.test("reduce: the result on the root only", function()
  for root = 0, w - 1 do
    local t = make(r, 7, "i32")
    gpu.reduce(t, { root = root, op = "max" })
    if r == root then
      same(t:totable(), function(i) return expect("i32", "max", i) end, 7, "reduce max at root " .. root)
    else
      same(t:totable(), function(i) return val(r, i) end, 7, "reduce leaves non-root " .. r .. " alone")
    end
  end
end)

T.test("all_gather and reduce_scatter", function()
  for _, dt in ipairs { "f32", "f16", "u8", "i64" } do
    for _, n in ipairs { 1, 5, dt == "f32" and 300001 or 9 } do
      local out = gpu.empty({ w * n }, { dtype = dt })
      T.ok(rawequal(gpu.all_gather(out, make(r, n, dt)), out), "all_gather returns out")
      same(out:totable(), function(i) return val((i - 1) // n, (i - 1) % n + 1) end, w * n,
           string.format("all_gather %s x%d", dt, n))
      -- reduce_scatter: rank r gets block r of the sum of every rank's w*n elements
      local rs = gpu.empty({ n }, { dtype = dt })
      gpu.reduce_scatter(rs, make(r, w * n, dt))
      same(rs:totable(), function(i) return expect(dt, "sum", r * n + i) end, n,
           string.format("reduce_scatter %s x%d", dt, n))
    end
  end
  -- in place: the input is this rank's block of the output
  local out = gpu.empty({ w * 4 })
  out:narrow(1, r * 4 + 1, 4):copy(make(r, 4, "f32"))
  gpu.all_gather(out, out:narrow(1, r * 4 + 1, 4))
  same(out:totable(), function(i) return val((i - 1) // 4, (i - 1) % 4 + 1) end, w * 4, "all_gather in place")
end)

T.test("send and recv: a ring in a group, pairs without one", function()
  local nxt, prv = (r + 1) % w, (r - 1) % w
  for _, n in ipairs { 3, 300001 } do
    local s, got = make(r, n, "f32"), gpu.empty({ n })
    gpu.group(function()
      gpu.send(s, nxt)
      gpu.recv(got, prv)
    end)
    same(got:totable(), function(i) return val(prv, i) end, n, "ring of " .. n .. " from rank " .. prv)
  end
  -- rank pairs (0,1), (2,3): the even one sends first
  if w % 2 == 0 then
    local peer = r % 2 == 0 and r + 1 or r - 1
    local s, got = make(r, 6, "i64"), gpu.empty({ 6 }, { dtype = "i64" })
    if r % 2 == 0 then gpu.send(s, peer); gpu.recv(got, peer) else gpu.recv(got, peer); gpu.send(s, peer) end
    same(got:totable(), function(i) return val(peer, i) end, 6, "pair exchange with " .. peer)
  end
  -- several messages to one peer arrive in order
  local a, b = gpu.empty({ 2 }), gpu.empty({ 3 })
  gpu.group(function()
    gpu.send(gpu.tensor({ 1, 2 }, { dtype = "f32" }), nxt)
    gpu.send(gpu.tensor({ 3, 4, 5 }, { dtype = "f32" }), nxt)
    gpu.recv(a, prv)
    gpu.recv(b, prv)
  end)
  T.is({ a:totable(), b:totable() }, { { 1, 2 }, { 3, 4, 5 } }, "two messages, in order")
  -- a group on a stream that each of its calls names
  local st <close> = gpu.stream()
  local got = gpu.empty({ 3 })
  gpu.group(function()
    gpu.send(make(r, 3, "f32"), nxt, { stream = st })
    gpu.recv(got, prv, { stream = st })
  end)
  st:synchronize()
  same(got:totable(), function(i) return val(prv, i) end, 3, "a group on a named stream")
  T.raises_at(function()
    gpu.group(function()
      gpu.send(make(r, 3, "f32"), nxt, { stream = st })
      gpu.recv(got, prv)
    end)
  end, "every send and recv of a group goes on one stream", "a group over two streams")
end)

T.test("collectives on a stream, ordered with events", function()
  local s = gpu.stream()
  local t = gpu.empty({ 7 }, { stream = s })
  t:copy(make(r, 7, "f32"), { stream = s })
  gpu.all_reduce(t, { stream = s })
  local ev = s:record()
  local other = gpu.stream()
  other:wait(ev)
  local doubled = t:mul(2, { stream = other })
  other:synchronize()
  same(doubled:totable(), function(i) return 2 * expect("f32", "sum", i) end, 7, "all_reduce on s, then mul on another stream after its event")
  local syncs = gpu.stats().syncs
  gpu.barrier()
  T.is(gpu.stats().syncs - syncs, 1, "barrier is one counted sync on every rank")
end)

T.test("bad calls raise on the calling rank, before anything is enqueued", function()
  local t = make(r, 4, "f32")
  T.raises_at(function() gpu.all_reduce(t, { op = "mean" }) end, "bad option 'op'", "unknown op")
  T.raises_at(function() gpu.all_reduce(t, { opp = "sum" }) end, "unknown option 'opp'", "misspelt option")
  T.raises_at(function() gpu.all_reduce(t, { op = 5 }) end, "bad option 'op' (expected \"sum\"", "op not a string")
  T.raises_at(function() gpu.all_reduce(t, { out = 5 }) end, "bad option 'out' (gpu.Tensor expected, got number)",
              "out not a tensor")
  T.raises_at(function() gpu.broadcast(t, { stream = t }) end, "bad option 'stream' (gpu.Stream expected",
              "stream not a stream")
  T.raises_at(function() gpu.reduce(t, { root = 0.5 }) end, "bad option 'root'", "root not an integer")
  T.raises_at(function() gpu.all_reduce(t, { [1] = "sum" }) end, "bad option key (a number", "positional key")
  T.raises_at(function() gpu.all_reduce(gpu.tensor({ true }, { dtype = "bool" })) end, "bool tensors cannot be reduced",
              "bool reduction")
  T.raises_at(function() gpu.all_reduce(make(r, 2, "i32"), { op = "avg" }) end, "avg needs a floating dtype", "integer avg")
  T.raises_at(function() gpu.broadcast(t, { root = w }) end, "is not a rank", "root out of range")
  T.raises_at(function() gpu.send(t, -1) end, "is not a rank", "negative peer")
  T.raises_at(function() gpu.all_gather(gpu.empty({ 4 * w + 1 }), t) end, "expected " .. 4 * w, "all_gather output size")
  T.raises_at(function() gpu.reduce_scatter(gpu.empty({ 3 }), t) end, "the input has %d+ elements, expected " .. 3 * w, "reduce_scatter input size")
  T.raises_at(function() gpu.all_reduce(t, { out = gpu.empty({ 4 }, { dtype = "f64" }) }) end, "dtypes differ", "out dtype")
  T.raises_at(function() gpu.all_reduce(gpu.empty({ 4, 4 }):narrow(2, 1, 2)) end, "contiguous", "strided tensor")
  -- an output that overlaps the input other than in place: the input is
  -- read first (through a copy), as for every op with an output
  local whole = make(r, 4 * w + 2, "f32")
  gpu.all_reduce(whole:narrow(1, 1, 4), { out = whole:narrow(1, 3, 4) })
  same(whole:narrow(1, 3, 4):totable(), function(i) return expect("f32", "sum", i) end, 4,
       "all_reduce into an overlapping output")
  local g = make(r, 4 * w + 2, "f32")
  gpu.all_gather(g:narrow(1, 1, 4 * w), g:narrow(1, r * 4 + 3, 4))
  same(g:narrow(1, 1, 4 * w):totable(), function(i)
    local q = (i - 1) // 4
    return val(q, q * 4 + 3 + (i - 1) % 4)
  end, 4 * w, "all_gather from an overlapping block other than its own")
  local rs = make(r, 4 * w + 2, "f32")
  gpu.reduce_scatter(rs:narrow(1, r * 4 + 3, 4), rs:narrow(1, 1, 4 * w))
  same(rs:narrow(1, r * 4 + 3, 4):totable(), function(i) return expect("f32", "sum", r * 4 + i) end, 4,
       "reduce_scatter into an overlapping block other than its own")
  local c = make(r, 4, "f32")
  c:close()
  T.raises_at(function() gpu.all_reduce(c) end, "closed", "closed tensor")
  T.raises_at(function() gpu.all_reduce("x") end, "gpu.Tensor expected", "not a tensor")
  T.raises_at(function() gpu.send(t, r) end, "matching recv in the same gpu.group", "send to itself alone")
  T.raises_at(function() gpu.group(function() gpu.all_reduce(t) end) end, "cannot be grouped", "all_reduce in a group")
  T.raises_at(function() gpu.group(function() gpu.send(t, (r + 1) % w); error("boom") end) end, "boom",
              "an error in the group body enqueues nothing")
  -- the communicator still works: every rank raised the same errors locally
  local ok = make(r, 3, "f32")
  gpu.all_reduce(ok)
  same(ok:totable(), function(i) return expect("f32", "sum", i) end, 3, "all_reduce after the bad calls")
end)

T.done()
