-- Fused bf16 and f16 chains equal the unfused ops bit for bit, where the
-- cuda backend's fused kernels take their exact shortcuts (fgen.c: packed
-- + - x, tanh and exp from approximations with an exact fallback;
-- docs/internals.md, "bf16 and f16 pairs"): every bf16 and every f16 value
-- through GELU, tanh, exp and x op c for numbers exact in the dtype and
-- not, as constants and as parameters; pairs of tensors through + - x;
-- bf16's tanh (no fallback: tests/fuse_tanh_bf16.lua) of every operand kind,
-- results stored as pairs, and a reduction of them.
-- Meaningful on the cuda backend (make test-gpu); on the host it checks the
-- host's fused path the same way, on fewer random pairs.
local gpu = require "gpu"
local T = require "gpu.test"

-- every value of a 16-bit float format (exponent bits, mantissa bits, bias),
-- in order of their bits; NaNs are one NaN (payloads are not kept apart)
local function all_values(ebits, mbits, dtype)
  local bias, v = (1 << (ebits - 1)) - 1, {}
  for u = 0, 0xffff do
    local s, e, m = u >> 15, (u >> mbits) & ((1 << ebits) - 1), u & ((1 << mbits) - 1)
    local x
    if e == (1 << ebits) - 1 then x = m == 0 and math.huge or 0 / 0
    elseif e == 0 then x = math.ldexp(m, 1 - bias - mbits)
    else x = math.ldexp(m + (1 << mbits), e - bias - mbits) end
    v[u + 1] = s == 1 and -x or x
  end
  return gpu.tensor(v, { dtype = dtype })
end

-- how many elements differ: NaN equals NaN, -0 is not 0 (1/x tells them apart)
local function mismatches(a, b)
  local same = a:eq(b):logical_and(a:reciprocal():eq(b:reciprocal())):logical_or(a:isnan():logical_and(b:isnan()))
  local bad = same:logical_not()
  local n = bad:sum():item()
  local first = n > 0 and bad:to("i32"):argmax():item() or nil
  return n, first
end

local function check(name, fn, ...)
  local f = gpu.fuse(fn, { name = name })
  local got, want = f(...), fn(...)
  local n, i = mismatches(got, want)
  if not T.ok(n == 0, name) then
    local x = select(1, ...)
    T.diag(string.format("  %d differ; first at %d: x = %s, fused %s, unfused %s", n, i, tostring(x:get(i)),
                         tostring(got:get(i)), tostring(want:get(i))))
  end
end

local function gelu9(x)
  return x:mul(x):mul(x):mul(0.044715):add(x):mul(0.7978845608):tanh():add(1):mul(x):mul(0.5)
end

-- numbers: exact in bf16 (and f16) or not, specials, a bf16 subnormal (a
-- constant is a compile each: a few)
local NUMS = { 2, 0.5, -3, -0.0, 0.1, 0.7978845608, 3e38, math.huge, 2 ^ -130 }

local FORMATS = { { "bf16", 8, 7 }, { "f16", 5, 10 } }

for _, fm in ipairs(FORMATS) do
  local dt = fm[1]
  T.test("every " .. dt .. " value: GELU, tanh, exp, square", function()
    local x = all_values(fm[2], fm[3], dt)
    check("gelu " .. dt, gelu9, x)
    check("tanh " .. dt, function(a) return a:tanh() end, x)
    check("exp " .. dt, function(a) return a:exp() end, x)
    check("x * x * x " .. dt, function(a) return a * a * a end, x)
    check("tanh(x * 0.5) + 1 " .. dt, function(a) return (a * 0.5):tanh() + 1 end, x)
    -- tanh of a float op's rounded result, of a cast, of -x
    check("tanh(x * 0.1) " .. dt, function(a) return (a * 0.1):tanh() end, x)
    check("tanh of a cast from f32 " .. dt, function(a) return (a:to("f32") * 3):to(dt):tanh() end, x)
    check("tanh(-x) + tanh(x) " .. dt, function(a) return (-a):tanh() + a:tanh() end, x)
  end)

  T.test("every " .. dt .. " value: several results stored as pairs", function()
    local x = all_values(fm[2], fm[3], dt)
    local function fn(a) return a:tanh(), a, a * 2, (a * 0.1):exp() end
    local got, want = { gpu.fuse(fn, { name = "results " .. dt })(x) }, { fn(x) }
    for k = 1, #want do
      local n, i = mismatches(got[k], want[k])
      if not T.ok(n == 0, dt .. " result " .. k) then
        T.diag(string.format("  %d differ; first at %d: x = %s", n, i, tostring(x:get(i))))
      end
    end
  end)

  T.test("every " .. dt .. " value with numbers, as constants and as parameters", function()
    local x = all_values(fm[2], fm[3], dt)
    for _, c in ipairs(NUMS) do
      local s = string.format("%.17g", c)
      check(dt .. " x + " .. s, function(a) return a + c end, x)
      check(dt .. " x - " .. s, function(a) return a - c end, x)
      check(dt .. " " .. s .. " - x", function(a) return c - a end, x)
      check(dt .. " x * " .. s, function(a) return a * c end, x)
      check(dt .. " (x * " .. s .. ") * x", function(a) return (a * c) * a end, x)
      check(dt .. " x * p, p = " .. s, function(a, p) return a * p end, x, c)
      check(dt .. " x + p, p = " .. s, function(a, p) return a + p end, x, c)
      check(dt .. " p - x, p = " .. s, function(a, p) return p - a end, x, c)
      check(dt .. " (x * p) * x, p = " .. s, function(a, p) return (a * p) * a end, x, c)
    end
  end)
end

for _, fm in ipairs(FORMATS) do
  local dt = fm[1]
  T.test(dt .. " pairs: every value against every value in another order", function()
    local x = all_values(fm[2], fm[3], dt)
    -- an odd multiplier permutes 0 .. 65535
    local idx = {}
    for i = 0, 0xffff do idx[i + 1] = (i * 40503 + 12345) % 65536 + 1 end
    local y = x:index_select(1, gpu.tensor(idx, { dtype = "i64" }))
    check(dt .. " x + y", function(a, b) return a + b end, x, y)
    check(dt .. " x - y", function(a, b) return a - b end, x, y)
    check(dt .. " x * y", function(a, b) return a * b end, x, y)
    check(dt .. " (x * y + x) * y - x", function(a, b) return (a * b + a) * b - a end, x, y)
  end)

  T.test(dt .. " pairs: random tensors over the whole range of exponents", function()
    local n = gpu.backend == "cuda" and (1 << 24) or (1 << 16)
    -- randn * 2^k, k uniform over the format's exponents and past them:
    -- subnormals, overflow to inf, signs
    local lo, hi = table.unpack(dt == "bf16" and { -140, 130 } or { -28, 18 })
    local function wide(seed)
      local k = gpu.rand({ n }, { dtype = "i32", low = lo, high = hi, seed = seed }):to("f32"):exp2()
      return (gpu.randn({ n }, { seed = seed + 1 }) * k):to(dt)
    end
    local x, y = wide(1), wide(3)
    local z = gpu.randn({ n }, { seed = 5 }):to(dt)
    check("random " .. dt .. " x + y", function(a, b) return a + b end, x, y)
    check("random " .. dt .. " x - y", function(a, b) return a - b end, x, y)
    check("random " .. dt .. " x * y", function(a, b) return a * b end, x, y)
    check("random " .. dt .. " x * z", function(a, b) return a * b end, x, z)
    check("random " .. dt .. " GELU of randn", gelu9, z)
    check("random " .. dt .. " GELU of randn * 4", function(a) return gelu9(a * 4) end, z)
    check("random " .. dt .. " exp of randn * 4", function(a) return (a * 4):exp() end, z)
    -- a reduction of packed results (its 16-byte steps: gf_elem2)
    local function tsum(a) return (a * 4):tanh():sum() end
    local got, want = gpu.fuse(tsum, { name = "tanh sum " .. dt })(z):item(), tsum(z):item()
    T.is(got, want, "random " .. dt .. " sum of tanh(randn * 4)")
  end)
end

T.done()
