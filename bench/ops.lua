-- The tensor vocabulary's bandwidth-bound ops at copy size (256 MiB of f32
-- operands; quick: 8 MiB) and softmax over rows of 4096 f32, through gpulua.
-- bench/run.lua sets the bandwidth rows against the D2D copy of the same run
-- (raw C's, bench/ref.cu) and softmax against PyTorch's (torch_peer.py).
-- GB/s count every byte read and written once (1e9 bytes per second):
--   lt        a:lt(b, {out})                    2 x 4 B read, 1 B written
--   where     gpu.where(c, a, b, {out})         1 + 2 x 4 B read, 4 B written
--   clamp     a:clamp(-0.5, 0.5, {out})         4 B read, 4 B written
--   gelu      a:gelu({out})                     4 B read, 4 B written
--   atan2     a:atan2(b, {out})                 2 x 4 B read, 4 B written
--   lerp      a:lerp(b, 0.25, {out})            2 x 4 B read, 4 B written
--   cat       gpu.cat({a1, a2}, 1, {out})       the halves read, the whole written
--   transpose m:t():contiguous() into out       a square f32 matrix read, written
--   flip      a:flip(1), a new tensor           4 B read, 4 B written
--   gather    a:gather(2, idx, {out})           i64 index + f32 read, f32 written
--   fuse_gelu_f32/bf16  gpu.fuse'd GELU of 9 ops  4 (2) B read, 4 (2) B written
--   fuse_gelu_1, fuse_add1_1: one call on 1 element, us per call (host clock
--   over many calls, then a sync), the fused GELU against the built-in t + 1
--   fuse_first_call: the first call of a new fused function (trace, compile)
--   op_sum, fuse_relu_sum: t:sum() and gpu.fuse'd (x * 2 + 1):relu():sum(),
--                        4 B read per element (one pass)
--   fuse_sum_sumsq  gpu.fuse'd x:sum(), (x * x):sum() (one op, one pass),
--                   4 B read per element
--   sort_1m   x:sort() of 1M f32 (values and i64 indices), us
--   sort_64x1m  x:sort() of 64 rows of 1M f32 (quick: 2 rows), us
--   topk_16   x:topk(16) of 64 rows of 1M f32 (quick: 2 rows), us
-- Event timing around each op, warm-up, median of the repeats, as
-- bench/copy.lua; each result spot-checked.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

local bytes = Z.copy_bytes
local n = bytes // 4
local s = gpu.stream()
local o = { stream = s }

local function timed(fn)
  local t = {}
  for r = 1 - Z.copy_warm, Z.copy_reps do
    local e0 = s:record { timing = true }
    fn()
    local e1 = s:record { timing = true }
    e1:synchronize()
    if r > 0 then t[r] = e1 - e0 end
  end
  return B.median(t)
end

local function gbps(moved, ms) return moved / (ms * 1e6) end

local a = gpu.rand({n}, { seed = 11, low = -1, high = 1, stream = s })
local b = gpu.rand({n}, { seed = 12, low = -1, high = 1, stream = s })

B.guard("op_lt", function()
  local c = gpu.empty({n}, { dtype = "bool", stream = s })
  local ms = timed(function() a:lt(b, { out = c, stream = s }) end)
  B.row("op_lt", gbps(n * 9, ms), "GB/s", B.size_label("a:lt(b) -> bool", bytes))
  local want = a:sub(b, o):lt(0, o):to("i32", o):sum(o):item()
  local got = c:to("i32", o):sum(o):item()
  B.check("op_lt", got == want, string.format("%d true, want %d", got, want))
end)

B.guard("op_where", function()
  local c = a:gt(0, o)
  local out = gpu.empty({n}, o)
  local ms = timed(function() gpu.where(c, a, b, { out = out, stream = s }) end)
  B.row("op_where", gbps(n * 13, ms), "GB/s", B.size_label("gpu.where(c, a, b)", bytes))
  local ok, msg = true, ""
  for _, i in ipairs { 1, n // 2 + 1, n } do
    local ai, bi = a:get(i), b:get(i)
    local want = ai > 0 and ai or bi
    if out:get(i) ~= want then ok, msg = false, string.format("element %d: %s, want %s", i, out:get(i), want) end
  end
  B.check("op_where", ok, msg)
end)

B.guard("op_clamp", function()
  local out = gpu.empty({n}, o)
  local ms = timed(function() a:clamp(-0.5, 0.5, { out = out, stream = s }) end)
  B.row("op_clamp", gbps(n * 8, ms), "GB/s", B.size_label("a:clamp(-0.5, 0.5)", bytes))
  local lo, hi = out:min(o):item(), out:max(o):item()
  B.check("op_clamp", lo == -0.5 and hi == 0.5, string.format("range [%s, %s], want [-0.5, 0.5]", lo, hi))
end)

-- issue 34's rows, one per kind: the costliest unary formula (gelu's erfc),
-- a binary C library function, lerp with a number weight
B.guard("op_gelu", function()
  local out = gpu.empty({n}, o)
  local ms = timed(function() a:gelu({ out = out, stream = s }) end)
  B.row("op_gelu", gbps(n * 8, ms), "GB/s", B.size_label("a:gelu()", bytes))
  local lo, hi = out:min(o):item(), out:max(o):item()
  B.check("op_gelu", lo > -0.2 and lo < -0.1 and hi > 0.8 and hi < 0.85,
          string.format("range [%s, %s], want about [-0.17, 0.84]", lo, hi))
end)

B.guard("op_atan2", function()
  local out = gpu.empty({n}, o)
  local ms = timed(function() a:atan2(b, { out = out, stream = s }) end)
  B.row("op_atan2", gbps(n * 12, ms), "GB/s", B.size_label("a:atan2(b)", bytes))
  local lo, hi = out:min(o):item(), out:max(o):item()
  B.check("op_atan2", lo >= -math.pi - 1e-6 and hi <= math.pi + 1e-6 and hi - lo > 6,
          string.format("range [%s, %s], want about [-pi, pi]", lo, hi))
end)

B.guard("op_lerp", function()
  local out = gpu.empty({n}, o)
  local ms = timed(function() a:lerp(b, 0.25, { out = out, stream = s }) end)
  B.row("op_lerp", gbps(n * 12, ms), "GB/s", B.size_label("a:lerp(b, 0.25)", bytes))
  local err = out:sub(a:mul(0.75, o):add(b:mul(0.25, o), o), o):abs(o):max(o):item()
  B.check("op_lerp", err < 1e-6, string.format("largest difference from 0.75 a + 0.25 b: %s", err))
end)

B.guard("op_cat", function()
  local h1, h2 = a:narrow(1, 1, n // 2), b:narrow(1, n // 2 + 1, n - n // 2)
  local out = gpu.empty({n}, o)
  local ms = timed(function() gpu.cat({ h1, h2 }, 1, { out = out, stream = s }) end)
  B.row("op_cat", gbps(n * 8, ms), "GB/s", B.size_label("gpu.cat of two halves", bytes))
  local ok = out:get(1) == a:get(1) and out:get(n) == b:get(n) and out:get(n // 2 + 1) == b:get(n // 2 + 1)
  B.check("op_cat", ok, "the first, middle and last elements come from the right halves")
end)

B.guard("op_transpose", function()
  local side = math.floor(math.sqrt(n))
  local m = a:narrow(1, 1, side * side):view({ side, side })
  local out = gpu.empty({ side, side }, o)
  local ms = timed(function() out:copy(m:t(), o) end)
  B.row("op_transpose", gbps(side * side * 8, ms), "GB/s",
        string.format("m:t() copied contiguous, %d x %d f32", side, side))
  local ok = out:get(1, 2) == m:get(2, 1) and out:get(side, 1) == m:get(1, side)
  B.check("op_transpose", ok, "out[i][j] == m[j][i] at the spot checks")
end)

-- flip: one copy of a view walking back; a new tensor each call (as
-- torch.flip), given back at once
B.guard("op_flip", function()
  local out
  local ms = timed(function()
    if out then out:close() end
    out = a:flip(1, o)
  end)
  B.row("op_flip", gbps(n * 8, ms), "GB/s", B.size_label("a:flip(1)", bytes))
  local ok = out:get(1) == a:get(n) and out:get(n) == a:get(1) and out:get(n // 2 + 1) == a:get(n - n // 2)
  B.check("op_flip", ok, "the first, middle and last elements come from the other end")
  out:close()
end)

B.guard("op_gather", function()
  local cols = 1024
  local rows = n // cols
  local src = a:narrow(1, 1, rows * cols):view({ rows, cols })
  local idx = gpu.randint(1, cols + 1, { rows, cols }, { dtype = "i64", seed = 13, stream = s })
  local out = gpu.empty({ rows, cols }, o)
  local ms = timed(function() src:gather(2, idx, { out = out, stream = s }) end)
  B.row("op_gather", gbps(rows * cols * (8 + 4 + 4), ms), "GB/s",
        string.format("a:gather(2, idx) %d x %d f32, i64 index", rows, cols))
  local i, j = rows // 2 + 1, 7
  local k = idx:get(i, j)
  B.check("op_gather", out:get(i, j) == src:get(i, k), "out[i][j] == a[i][idx[i][j]] at a spot check")
end)

-- issue 32: GELU written as 9 ops, fused into one
local function gelu9(x)
  return x:mul(x):mul(x):mul(0.044715):add(x):mul(0.7978845608):tanh():add(1):mul(x):mul(0.5)
end
local gelu = gpu.fuse(gelu9, { name = "gelu" })

for _, dt in ipairs { "f32", "bf16" } do
  local key = "fuse_gelu_" .. dt
  B.guard(key, function()
    local x = dt == "f32" and a or a:to(dt, o)
    local m = x:numel()
    local out = gpu.empty({m}, { dtype = dt, stream = s })
    local ms = timed(function() gelu(x, { out = out, stream = s }) end)
    local esz = dt == "f32" and 4 or 2
    B.row(key, gbps(m * esz * 2, ms), "GB/s", B.size_label("gpu.fuse'd GELU (9 ops) " .. dt, m * esz))
    local want
    do local _ <close> = gpu.using(s); want = gelu9(x) end
    local err = out:sub(want, o):abs(o):max(o):item()
    B.check(key, err == 0, string.format("largest difference from the unfused ops: %s", err))
  end)
end

-- issue 32: t:sum() and a fused chain ending in a sum, bytes read per second
B.guard("op_sum", function()
  local out = gpu.empty({}, o)
  local ms = timed(function() a:sum({ out = out, stream = s }) end)
  B.row("op_sum", gbps(n * 4, ms), "GB/s", B.size_label("t:sum() f32, bytes read", bytes))
  local want = a:to("f64", o):sum(o):item()
  B.check("op_sum", math.abs(out:item() - want) <= 1e-6 * n, string.format("%s against %s in f64", out:item(), want))
end)

B.guard("fuse_relu_sum", function()
  local relu_sum = gpu.fuse(function(x) return (x * 2 + 1):relu():sum() end, { name = "relu_sum" })
  local out = gpu.empty({}, o)
  local ms = timed(function() relu_sum(a, { out = out, stream = s }) end)
  B.row("fuse_relu_sum", gbps(n * 4, ms), "GB/s", B.size_label("gpu.fuse'd (x * 2 + 1):relu():sum() f32, bytes read", bytes))
  local want
  do local _ <close> = gpu.using(s); want = (a * 2 + 1):relu():sum():item() end
  B.check("fuse_relu_sum", out:item() == want, string.format("%s, the unfused ops' %s", out:item(), want))
end)

-- issue 32: two reductions of one tensor as one fused op (one pass: the
-- bytes of a read once, as op_sum's)
B.guard("fuse_sum_sumsq", function()
  local sum_sumsq = gpu.fuse(function(x) return x:sum(), (x * x):sum() end, { name = "sum_sumsq" })
  local out = { gpu.empty({}, o), gpu.empty({}, o) }
  local ms = timed(function() sum_sumsq(a, { out = out, stream = s }) end)
  B.row("fuse_sum_sumsq", gbps(n * 4, ms), "GB/s", B.size_label("gpu.fuse'd x:sum(), (x * x):sum() f32, bytes read", bytes))
  local ws, wq
  do local _ <close> = gpu.using(s); ws, wq = a:sum():item(), (a * a):sum():item() end
  local gs, gq = out[1]:item(), out[2]:item()
  B.check("fuse_sum_sumsq", gs == ws and gq == wq,
          string.format("%s and %s, the unfused ops' %s and %s", gs, gq, ws, wq))
end)

-- issue 32: an Adam step as one fused op of three results, in place: p, g,
-- m and v read, p, m and v written (7 x 4 B a parameter)
B.guard("fuse_adam", function()
  local adam = gpu.fuse(function(p, g, m, v, lr, b1, b2, c1, c2, eps)
    local m2 = m * b1 + g * c1
    local v2 = v * b2 + g * g * c2
    return p - lr * m2 / (v2:sqrt() + eps), m2, v2
  end, { name = "adam" })
  local g = gpu.rand({n}, { seed = 16, low = -1, high = 1, stream = s })
  local p, m, v = a:clone(o), gpu.zeros({n}, o), gpu.zeros({n}, o)
  local h = { 1e-3, 0.9, 0.999, 0.1, 0.001, 1e-8 }
  local function step() adam(p, g, m, v, h[1], h[2], h[3], h[4], h[5], h[6], { out = { p, m, v }, stream = s }) end
  step()
  -- one step against the unfused ops, from the state now
  local p0, m0, v0
  do
    local _ <close> = gpu.using(s)
    p0, m0, v0 = p:clone(), m:clone(), v:clone()
    local m2 = m0 * h[2] + g * h[4]
    local v2 = v0 * h[3] + g * g * h[5]
    p0 = p0 - h[1] * m2 / (v2:sqrt() + h[6])
    m0, v0 = m2, v2
  end
  step()
  local err = 0
  do
    local _ <close> = gpu.using(s)
    err = math.max((p - p0):abs():max():item(), (m - m0):abs():max():item(), (v - v0):abs():max():item())
  end
  local ms = timed(step)
  B.row("fuse_adam", gbps(n * 28, ms), "GB/s", B.size_label("gpu.fuse'd Adam step f32 (p, m, v in place), 7 x", bytes))
  B.check("fuse_adam", err == 0, string.format("largest difference from the unfused ops: %s", err))
end)

local function per_call_us(fn, calls)
  for _ = 1, 20 do fn() end
  s:synchronize()
  local t0 = gpu.clock()
  for _ = 1, calls do fn() end
  s:synchronize()
  return (gpu.clock() - t0) / calls * 1e6
end

B.guard("fuse_gelu_1", function()
  local x = gpu.rand({1}, { seed = 14, stream = s })
  local out = gpu.empty({1}, o)
  local calls = B.quick and 200 or 5000
  B.row("fuse_add1_1", per_call_us(function() x:add(1, { out = out, stream = s }) end, calls), "us",
        "t + 1 (built-in), 1 element, per call")
  B.row("fuse_gelu_1", per_call_us(function() gelu(x, { out = out, stream = s }) end, calls), "us",
        "gpu.fuse'd GELU, 1 element, per call")
  B.check("fuse_gelu_1", out:item() == gelu9(x):item(), "the fused result is the unfused ops'")
end)

B.guard("fuse_first_call", function()
  local x = gpu.rand({1024}, { seed = 15, stream = s })
  -- a constant unique to this run: a new program, not one a cache holds
  local k = 1 + (os.time() % 100000) * 1e-9
  local f = gpu.fuse(function(t) return gelu9(t):mul(k) end)
  s:synchronize()
  local t0 = gpu.clock()
  f(x, { stream = s })
  s:synchronize()
  B.row("fuse_first_call", (gpu.clock() - t0) * 1e3, "ms", "first call of a new fused GELU (trace and compile)")
end)

-- softmax over rows of 4096 f32 (the rows of a 256 MiB matrix; quick: 8 MiB)
B.guard("softmax_4096", function()
  local cols = 4096
  local rows = n // cols
  local x = a:narrow(1, 1, rows * cols):view({ rows, cols })
  local out = gpu.empty({ rows, cols }, o)
  local ms = timed(function() x:softmax(2, { out = out, stream = s }) end)
  B.row("softmax_4096", ms * 1e3, "us", string.format("softmax over rows, %d x %d f32", rows, cols))
  local sum = out:narrow(1, rows // 2 + 1, 1):sum(o):item()
  B.check("softmax_4096", math.abs(sum - 1) < 1e-4, string.format("a row sums to %.7f", sum))
end)

-- sort and topk (issue 34): PyTorch's time on the same input is the bar
B.guard("sort", function()
  local len = 1 << 20
  local rows = bytes >= (256 << 20) and 64 or 2
  local x1 = gpu.rand({ len }, { seed = 21, stream = s })
  local xm = gpu.rand({ rows, len }, { seed = 22, stream = s })
  local ms = timed(function() x1:sort(o) end)
  B.row("sort_1m", ms * 1e3, "us", "sort of 1M f32, values and indices")
  local v = x1:sort(o)
  B.check("sort_1m", v:get(1) <= v:get(2) and v:get(len - 1) <= v:get(len), "the ends are in order")
  ms = timed(function() xm:sort(o) end)
  B.row("sort_64x1m", ms * 1e3, "us", string.format("sort of %d rows of 1M f32, values and indices", rows))
  ms = timed(function() xm:topk(16, o) end)
  B.row("topk_16", ms * 1e3, "us", string.format("topk(16) of %d rows of 1M f32", rows))
  local tv = xm:topk(16, o)
  B.check("topk_16", tv:get(1, 1) == xm:narrow(1, 1, 1):max(o):item(), "the first is the row's max")
end)

B.finish()
