-- The proof that fused bf16 tanh needs no test and no fallback
-- (cuda/cuda/k_elem.cuh: k_p2_tanh_bf16; docs/internals.md, "bf16 and f16
-- pairs"): an exhaustive check over every bf16 input, in float arithmetic
-- emulated here (string.pack rounds a double to float), with every result
-- the approximate instructions may give within their error bounds.
--   |x| >= 2^-6 (inf included): y = 1 - 2 rcp(ex2(|x| c) + 1), ex2.approx
--     within 2 ulp, rcp.approx within 1 ulp; every y there is rounds to the
--     bf16 that tanhf(x) rounds to, for every tanhf within 2 ulp of tanh.
--   |x| < 2^-6: every tanhf(x) within 2 ulp of tanh rounds to x itself.
-- The candidates are the floats within a window of bits around the
-- correctly rounded value, wider than the bounds (2k + 1 floats each side
-- for k ulp: twice, for a window across a power of two).  No GPU needed.
local T = require "gpu.test"

local spack, sunpack = string.pack, string.unpack
local function f32(v) return (sunpack("<f", spack("<f", v))) end
local function bits(v) return (sunpack("<I4", spack("<f", v))) end
local function float(u) return (sunpack("<f", spack("<I4", u))) end
local FMAX = float(0x7f7fffff)
-- v rounded to float, overflow to inf (the C cast of string.pack is not
-- defined past float's range)
local function round(v)
  if v >= FMAX + 2.0 ^ 103 then return math.huge end
  return f32(v)
end

-- the floats of k ulp or less from v (v >= 0: a window of bits)
local function near(v, k)
  if v == math.huge then return { math.huge } end
  local c, r = bits(round(v)), {}
  for u = math.max(c - 2 * k - 1, 0), math.min(c + 2 * k + 1, 0x7f800000) do r[#r + 1] = float(u) end
  return r
end

-- a float >= 0 rounded to bf16 (to nearest even), as bits
local function bf16(v)
  local u = bits(v)
  return (u + 0x7fff + ((u >> 16) & 1)) >> 16
end

-- tanh in double: far within a float ulp of it (the error of exp is 2^-52
-- relative; the cancellation for x >= 2^-6 costs 2^7 at most)
local function tanh(x)
  if x > 20 then return 1.0 end
  if x < 2 ^ -6 then return x - x ^ 3 / 3 + 2 * x ^ 5 / 15 end
  local e = math.exp(2 * x)
  return (e - 1) / (e + 1)
end

-- the bf16 values of every result of the approximation for x >= 0 (as
-- k_tanh_pos computes it: c as the float literal rounds, each op rounded)
local function approx(x, c, ex2_ulp, rcp_ulp)
  local got, p = {}, round(x * c)
  for _, e in ipairs(near(p < 128 and 2.0 ^ p or math.huge, ex2_ulp)) do
    local s = round(e + 1)
    local rs = near(s == math.huge and 0.0 or 1 / s, rcp_ulp)
    if s >= 2.0 ^ 126 then rs[#rs + 1] = 0.0 end   -- .ftz: a subnormal 1/s is 0
    for _, r in ipairs(rs) do
      got[bf16(round(1 - 2 * r))] = true   -- fma(-2, r, 1): 1 - 2r exact in double
    end
  end
  return got
end

-- the bf16 values every tanhf of x may round to
local function unfused(x)
  local want = {}
  for _, t in ipairs(near(tanh(x), 2)) do want[bf16(t)] = true end
  return want
end

local function keys(s)
  local r = {}
  for k in pairs(s) do r[#r + 1] = string.format("0x%04x", k) end
  table.sort(r)
  return table.concat(r, " ")
end

-- every positive bf16 x from lo to hi (bits), approximated: how many may
-- round otherwise than tanhf, and the first
local function count_bad(lo, hi, c, ex2_ulp, rcp_ulp)
  local bad, first = 0, nil
  for u = lo, hi do
    local x = float(u << 16)
    local got, want = approx(x, c, ex2_ulp, rcp_ulp), unfused(x)
    local all = {}
    for k in pairs(got) do all[k] = true end
    for k in pairs(want) do all[k] = true end
    local n = 0
    for _ in pairs(all) do n = n + 1 end
    if n ~= 1 then
      bad = bad + 1
      first = first or string.format("x = %.9g (0x%04x): approximation %s, tanhf %s", x, u, keys(got), keys(want))
    end
  end
  return bad, first
end

local C = f32(2.88539004)   -- 2 log2 e, as k_tanh_pos writes it

T.test("|x| >= 2^-6: the approximation rounds as tanhf, for every bf16 x", function()
  T.is(C, f32(2 / math.log(2)), "the constant is 2 log2 e rounded to float")
  local bad, first = count_bad(0x3c80, 0x7f80, C, 2, 1)
  if not T.is(bad, 0, "no bf16 input needs a test") then T.diag(first) end
end)

T.test("|x| < 2^-6: tanhf rounds to x itself, for every bf16 x", function()
  local bad, first = 0, nil
  for u = 0, 0x3c7f do
    local x = float(u << 16)
    for _, t in ipairs(near(tanh(x), 2)) do
      if bf16(t) ~= u then
        bad = bad + 1
        first = first or string.format("x = %.9g: tanhf may be %.9g", x, t)
      end
    end
  end
  if not T.is(bad, 0, "every tanhf of a small x is x in bf16") then T.diag(first) end
end)

-- the check can fail: a worse approximation (c off by 2^-12, or ex2 within
-- 64 ulp) has inputs that round otherwise, as does x itself above 2^-6
T.test("the check finds an approximation that is not exact", function()
  T.ok(count_bad(0x3c80, 0x7f80, C * (1 + 2 ^ -12), 2, 1) > 0, "c off by 2^-12")
  T.ok(count_bad(0x3c80, 0x4100, C, 64, 1) > 0, "ex2 within 64 ulp")
  local wrong = 0
  for u = 0x3e80, 0x3f00 do
    if not unfused(float(u << 16))[u] then wrong = wrong + 1 end
  end
  T.ok(wrong > 0, "tanh(x) is not x for x in [0.25, 0.5]")
end)

T.done()
