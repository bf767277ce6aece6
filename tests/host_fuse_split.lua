-- A large fused op shared out over the host's threads (cuda/cpu_fuse.c:
-- fused_chunk, through cpu_par.c): each chunk seeks its own walks over the
-- inputs and out.  Every result here is the unfused ops' bit for bit, at
-- sizes around the split threshold (2^16 elements) and not a multiple of
-- the block (BLK, 1024), with broadcast and non-contiguous inputs, two results,
-- an update in place, a division by zero in one chunk, and in a child
-- under GPULUA_HOST_JITTER=1 with one thread and with four.  A chunk that
-- started at the wrong element, or a walk that seeked wrongly through a
-- view's dims, would put values at the wrong places.  On cuda the same
-- comparisons check the fused kernels.
local gpu = require "gpu"
local T = require "gpu.test"

local SIZES = { 65535, 65536, 65537, 65536 + 512 * 7 + 3, 65536 + 1024 * 5 + 3, 200003 }

-- distinct values at every position (a misplaced one shows)
local function ramp(n, shift)
  return (gpu.arange(0, n, { dtype = "f32" }) * 0.37 + (shift or 0)):sin() * 3
end

local function same(a, b, name)
  local eq = a:eq(b):all():item()
  if not T.ok(eq and a.dtype == b.dtype, name) then
    local x, y = T.flatten(a:totable()), T.flatten(b:totable())
    for i = 1, #x do
      if x[i] ~= y[i] then T.diag(string.format("  first difference at %d: %s vs %s", i, x[i], y[i])) break end
    end
  end
end

local function gelu(t)
  return t:mul(t):mul(t):mul(0.044715):add(t):mul(0.7978845608):tanh():add(1):mul(t):mul(0.5)
end
local gelu_f = gpu.fuse(gelu, { name = "gelu" })
local axpb = gpu.fuse(function(a, b, s) return (a * s + b):relu() - b end, { name = "axpb" })

T.test("contiguous: sizes around the split threshold, not a multiple of the block", function()
  for _, n in ipairs(SIZES) do
    local a, b = ramp(n), ramp(n, 1)
    same(gelu_f(a), gelu(a), "gelu n=" .. n)
    same(axpb(a, b, 1.5), (a * 1.5 + b):relu() - b, "two inputs and a number n=" .. n)
  end
end)

T.test("broadcast inputs in the split path", function()
  for _, shape in ipairs({ { 301, 677 }, { 97, 1031 }, { 3, 65537 } }) do
    local r, c = shape[1], shape[2]
    local a = ramp(r * c):view(shape)
    local row = ramp(c, 2):view({ 1, c })
    local col = ramp(r, 3):view({ r, 1 })
    local name = string.format("%dx%d", r, c)
    same(axpb(a, row, 0.5), (a * 0.5 + row):relu() - row, name .. " with a row")
    same(axpb(a, col, 0.5), (a * 0.5 + col):relu() - col, name .. " with a column")
    same(axpb(col, row, 2), (col * 2 + row):relu() - row, name .. " a column with a row")
  end
end)

T.test("non-contiguous inputs in the split path", function()
  local m = ramp(301 * 677):view({ 301, 677 })
  local t = m:t()   -- 677 x 301, strided
  T.ok(not t:is_contiguous(), "a transposed view")
  same(gelu_f(t), gelu(t:contiguous()), "gelu of a transpose")
  local nar = ramp(400 * 700):view({ 400, 700 }):narrow(2, 3, 511)
  same(gelu_f(nar), gelu(nar:contiguous()), "gelu of a narrowed view (rows of 511)")
  same(axpb(t, t:contiguous(), 3), (t * 3 + t):relu() - t, "a strided and a contiguous operand")
  local h = ramp(200003):to("f16")
  same(gelu_f(h), gelu(h), "f16 (rounded after every op)")
end)

T.test("two results, and writing into given tensors", function()
  local two = gpu.fuse(function(a, b) return a * 2 + b, (a - b):tanh() end, { name = "two" })
  for _, n in ipairs({ 65537, 200003 }) do
    local a, b = ramp(n), ramp(n, 5)
    local p, q = two(a, b)
    same(p, a * 2 + b, "first result n=" .. n)
    same(q, (a - b):tanh(), "second result n=" .. n)
  end
  local sgd = gpu.fuse(function(w, g, lr) return w - g * lr end, { name = "sgd" })
  local w, g = ramp(200003), ramp(200003, 7)
  local expect = w - g * 0.1
  sgd(w, g, 0.1, { out = w })
  same(w, expect, "w updated in place")
  local wt = ramp(301 * 677):view({ 301, 677 }):t()
  local gt = ramp(301 * 677, 9):view({ 301, 677 }):t()
  local expect_t = wt - gt * 0.25
  sgd(wt, gt, 0.25, { out = wt })
  same(wt, expect_t, "a strided w updated in place")
end)

-- contiguous f32/f64/i64 runs are read and written in place when aligned
-- as a block and whole groups of 8; a view at an odd offset, a short last
-- block, a cast or an input as the last node, and an out that overlaps an
-- input go through blocks
T.test("in place reads and writes: offsets, dtypes, the last node's kind", function()
  local n = 200003
  for _, dt in ipairs({ "f32", "f64" }) do
    local big = ramp(n + 1):to(dt)
    local odd = big:narrow(1, 2, n)   -- one element in: not aligned for f32
    same(gelu_f(odd), gelu(odd), dt .. " gelu of a view at an odd offset")
    for _, at in ipairs({ 1, 2 }) do
      local o = gpu.zeros({ n + 9 }, { dtype = dt })
      gelu_f(big:narrow(1, 1, n), { out = o:narrow(1, at, n) })
      same(o:narrow(1, at, n), gelu(big:narrow(1, 1, n)), dt .. " into an out at offset " .. at - 1)
      same(o:narrow(1, at + n, 10 - at), gpu.zeros({ 10 - at }, { dtype = dt }), dt .. " the elements past out kept")
    end
  end
  local i = gpu.arange(-100001, 100002)
  local imix = gpu.fuse(function(a, b) return a * 3 - b // 7 end, { name = "imix" })
  same(imix(i, i:flip(1)), i * 3 - i:flip(1) // 7, "i64 with a flipped view")
  local cast = gpu.fuse(function(a) return (a * 2):to("f64") end, { name = "cast" })
  local a = ramp(n)
  same(cast(a), (a * 2):to("f64"), "a cast as the last node")
  local ident = gpu.fuse(function(x, y) return x end, { name = "ident" })
  same(ident(a, a), a, "an input as the last node")
  local b = ramp(n, 3)
  local expect = (b * 0.5 + a):relu() - a
  axpb(b, a, 0.5, { out = b })
  same(b, expect, "out is the first input")
  local c = ramp(n, 4)
  expect = (c * 0.5 + c):relu() - c
  axpb(c, c, 0.5, { out = c })
  same(c, expect, "out is both inputs")
end)

-- a trailing reduction runs the program split over threads into scratch,
-- then the built-in reduction: the unfused bits at every size
T.test("a trailing sum or mean of everything: the unfused bits", function()
  local relu_sum = gpu.fuse(function(a) return (a * 2 + 1):relu():sum() end, { name = "relu_sum" })
  local tanh_mean = gpu.fuse(function(a, b) return (a - b):tanh():mean() end, { name = "tanh_mean" })
  for _, dt in ipairs({ "f32", "f64" }) do
    for _, n in ipairs({ 1, 7, 9, 511, 513, 65537, 200003 }) do
      local a, b = ramp(n):to(dt), ramp(n, 2):to(dt)
      same(relu_sum(a), (a * 2 + 1):relu():sum(), string.format("sum %s n=%d", dt, n))
      same(tanh_mean(a, b), (a - b):tanh():mean(), string.format("mean %s n=%d", dt, n))
    end
  end
  local m = ramp(301 * 677):view({ 301, 677 })
  same(relu_sum(m:t()), (m:t() * 2 + 1):relu():sum(), "sum of a transposed view")
  local row = ramp(677, 3):view({ 1, 677 })
  same(tanh_mean(m, row), (m - row):tanh():mean(), "mean with a broadcast row")
  local o = gpu.empty({})
  relu_sum(m, { out = o })
  same(o, (m * 2 + 1):relu():sum(), "into out")
  local isum = gpu.fuse(function(a, d) return (a // d):sum() end, { name = "isum" })
  local d = gpu.ones({ 200003 }, { dtype = "f32" })
  same(isum(ramp(200003), d), (ramp(200003) // d):sum(), "f32 floor division and a sum")
  local iz = gpu.fuse(function(a, d) return (a // d):to("f32"):sum() end, { name = "izsum" })
  local di = gpu.ones({ 200003 }, { dtype = "i64" })
  di:narrow(1, 100000, 1):fill(0)
  T.raises_at(function() local _ = iz(gpu.arange(1, 200004), di):item() end, "division by zero",
              "an integer division by zero before the sum raises")
end)

T.test("integer division by zero in one chunk raises at the line", function()
  local n = 200003
  local div = gpu.fuse(function(a, d) return a // d + 1 end, { name = "idiv" })
  local a = gpu.arange(1, n + 1)
  local d = gpu.ones({ n }, { dtype = "i64" })
  same(div(a, d), a // d + 1, "no zero")
  d:narrow(1, 70001, 1):fill(0)
  T.raises_at(function() local _ = div(a, d):totable() end, "division by zero", "a zero in a middle chunk")
  d:narrow(1, 70001, 1):fill(1)
  d:narrow(1, n, 1):fill(0)
  T.raises_at(function() local _ = div(a, d):totable() end, "division by zero", "a zero in the last chunk")
end)

if gpu.backend == "host" then
  T.test("one thread, four, and under GPULUA_HOST_JITTER=1: the same bits", function()
    local script = "local f = gpu.fuse(function(a, b) return (a * 0.7 + b):tanh():mul(a) end) " ..
                   "local a = (gpu.arange(0, 199995, {dtype = 'f32'}) * 0.37):sin():view({199, 1005}) " ..
                   "local b = (gpu.arange(0, 1005, {dtype = 'f32'}) * 0.11):cos():view({1, 1005}) " ..
                   "local r = f(a:t():contiguous():t(), b) " ..
                   "local s = 0 for i, v in ipairs(r:view({-1}):totable()) do s = s + v * (i % 97) end " ..
                   "io.write(string.format('%a', s))"
    local outs = {}
    for i, env in ipairs({ "GPULUA_HOST_THREADS=1", "GPULUA_HOST_THREADS=4", "GPULUA_HOST_THREADS=2 GPULUA_HOST_JITTER=1",
                           "GPULUA_HOST_THREADS=4 GPULUA_HOST_JITTER=1" }) do
      local out, ok = T.run(env, "--device host -e " .. string.format("%q", script))
      T.ok(ok and out:match("^%-?0x"), env .. ": " .. out)
      outs[i] = out
    end
    T.ok(outs[1] == outs[2] and outs[1] == outs[3] and outs[1] == outs[4], "every run alike: " .. table.concat(outs, " "))
  end)
end

-- Two f32 ops in one loop (cpu_fuse.c eval_pair): an op of two values
-- whose only reader is the next op, with a number, runs as one loop.  Every
-- pair of add, sub, mul, div, the number on either side, a constant or a
-- parameter, over NaN, infinities, zeros of both signs, subnormals and
-- values that round, at a length that leaves a tail of 8 (and one below
-- the split): the unfused ops' bits.  A value read twice is not paired.
T.test("pairs of f32 ops in one loop, bit for bit", function()
  local special = { 0 / 0, 1 / 0, -1 / 0, 0.0, -0.0, 1e-45, -3e-39, 1.0, -1.5, 3.4e38, 1 / 3, 7 }
  local function operands(n, shift)
    local v = {}
    for i = 1, n do
      v[i] = i % 3 == 0 and special[(i // 3 * 5 + shift) % #special + 1] or math.sin(i * 0.37 + shift) * 3
    end
    return gpu.tensor(v, { dtype = "f32" })
  end
  -- the bits, NaN and -0 included (eq says NaN ~= NaN and -0 == 0)
  local function bits(a, b, name)
    local x, y = a:totable(), b:totable()
    local bad
    for i = 1, #x do
      if string.pack("<f", x[i]) ~= string.pack("<f", y[i]) then bad = i break end
    end
    if not T.ok(a.dtype == b.dtype and not bad, name) then
      T.diag(string.format("  first difference at %d: %s vs %s", bad or 0, x[bad or 1], y[bad or 1]))
    end
  end
  local OPS = { "+", "-", "*", "/" }
  for _, n in ipairs({ 1000, 65536 + 24 }) do
    local a, b = operands(n, 0), operands(n, 5)
    for _, o1 in ipairs(OPS) do
      for _, o2 in ipairs(OPS) do
        for _, k in ipairs({ 0.75, 0, -3 }) do
          local right = load(string.format("return function(a, b, k) return (a %s b) %s k end", o1, o2))()
          local left = load(string.format("return function(a, b, k) return k %s (a %s b) end", o2, o1))()
          local konst = load(string.format("return function(a, b) return (a %s b) %s %s end", o1, o2, k))()
          local name = string.format("n=%d (a %s b) %s %s", n, o1, o2, k)
          bits(gpu.fuse(right)(a, b, k), right(a, b, k), name)
          bits(gpu.fuse(left)(a, b, k), left(a, b, k), name .. ", the number on the left")
          bits(gpu.fuse(konst)(a, b), konst(a, b), name .. ", a constant")
        end
      end
    end
    local twice = function(x, y) local u = x * y; return u * 2 + u end
    bits(gpu.fuse(twice)(a, b), twice(a, b), "n=" .. n .. " a value read twice")
  end
end)

T.done()
