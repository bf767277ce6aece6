-- The elementwise ops of issue 34 against NumPy, as tests/ops_numpy.lua
-- does for the first rows of the table: log1p expm1 log2 log10 exp2 tan
-- asin acos atan sinh cosh erf reciprocal gelu silu softplus isnan isinf
-- isfinite, atan2 hypot leaky_relu, lerp, and the compositions isclose
-- allclose nan_to_num; every dtype each takes, contiguous and strided, with
-- edge values (signed zeros, infinities, NaN, tiny and huge values, domain
-- errors such as log1p(-2) and asin(2), NaN as NumPy's).  Runs on whichever
-- backend the suite runs, so the host loops and the CUDA kernels both meet
-- the same oracle (and so agree with each other within twice its
-- tolerance).
--
-- The oracle computes in the compute type (f16 and bf16 in float32, then
-- rounded, as gpulua), with NumPy's functions, and math.erf / math.erfc
-- (vectorised) where NumPy has none.  The functions of the C library (CUDA's
-- on the GPU) are allowed a few ulps (the relative TOL below); the ops that
-- round once (reciprocal, isnan...) must match bit for bit.  gelu, silu and
-- softplus are PyTorch's formulas, step by step (gelu the exact, erf form,
-- written with erfc); lerp PyTorch's two-sided form, within a few ulps of
-- |a| + |b| (the GPU fuses its multiply-add).
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local FLOATS = { "f32", "f64", "f16", "bf16" }
local CLASSES = {
  F = FLOATS,
  FIB = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" },
}

-- unary: name, dtype classes, input domain, exact
local UNARY = {
  { "log1p", "F", "gtm1", false }, { "expm1", "F", "any", false }, { "log2", "F", "pos", false },
  { "log10", "F", "pos", false }, { "exp2", "F", "any", false }, { "tan", "F", "any", false },
  { "asin", "F", "unit", false }, { "acos", "F", "unit", false }, { "atan", "F", "any", false },
  { "sinh", "F", "any", false }, { "cosh", "F", "any", false }, { "erf", "F", "any", false },
  { "reciprocal", "F", "any", true }, { "gelu", "F", "any", false }, { "silu", "F", "any", false },
  { "softplus", "F", "wide", false },
  { "isnan", "FIB", "any", true }, { "isinf", "FIB", "any", true }, { "isfinite", "FIB", "any", true },
}

local IRANGE = { i8 = { -100, 100 }, u8 = { 0, 200 }, i32 = { -100000, 100000 }, i64 = { -(1 << 40), 1 << 40 } }
local FRANGE = { any = { -4, 4 }, pos = { 0.05, 8 }, gtm1 = { -0.95, 8 }, unit = { -1, 1 }, wide = { -30, 30 } }

local seed = 3400
local function rand(dt, shape, dom)
  seed = seed + 1
  if dt == "bool" then return gpu.rand(shape, { dtype = "bool", seed = seed }) end
  local o = { dtype = dt, seed = seed }
  if T.is_float(dt) then
    o.low, o.high = FRANGE[dom][1], FRANGE[dom][2]
  else
    o.low, o.high = IRANGE[dt][1], IRANGE[dt][2]
  end
  return gpu.rand(shape, o)
end

local function operand(dt, dom, strided)
  if strided then return rand(dt, { 13, 40 }, dom):narrow(2, 7, 17) end
  return rand(dt, { 13, 17 }, dom)
end

-- edge values: every domain's, whatever the op's (domain errors give NaN)
local FSPECIAL = { 0.0, -0.0, 1, -1, 1 / 0, -1 / 0, 0 / 0, 1e-30, -1e-30, 1e30, -1e30, 2, -2, 0.5, -0.5,
                   100, -100, 1e-3, 60000, -3.75, 21, -0.99 }
local function special(dt, flip)
  local v = {}
  if T.is_float(dt) then
    for i, x in ipairs(FSPECIAL) do v[i] = x end
  elseif dt == "bool" then
    v = { true, false, true, false }
  else
    local lo, hi = T.int_range(dt)
    v = { lo, lo + 1, -1, 0, 1, 2, 7, -7, hi - 1, hi }
    if dt == "u8" then v = { 0, 1, 2, 7, 100, 128, 254, 255 } end
  end
  if flip then
    local r = {}
    for i = #v, 1, -1 do r[#r + 1] = v[i] end
    v = r
  end
  return gpu.tensor(v, { dtype = dt })
end

local pyval = N.pyval

-- name; op (the oracle's); dt; form (t a tensor of ins, s a number of nums,
-- n nil); the result; exact; extra (a python literal: the options)
local function case(name, op, dt, form, ins, nums, result, exact, extra)
  local i, s = {}, {}
  for k, t in ipairs(ins) do i[k] = O:save(t) end
  for k, v in ipairs(nums) do s[k] = pyval(v) end
  O:case(name, string.format("C(%q, %q, %q, %q, [%s], [%s], %s, %s, %s)", name, op, dt, form,
                             table.concat(i, ", "), table.concat(s, ", "), O:save(result),
                             exact and "True" or "False", extra or "None"))
end

for _, u in ipairs(UNARY) do
  local op, cls, dom, exact = table.unpack(u)
  for _, dt in ipairs(CLASSES[cls]) do
    for _, strided in ipairs { false, true } do
      local x = operand(dt, dom, strided)
      case(string.format("%s %s%s", op, dt, strided and " strided" or ""), op, dt, "t", { x }, {}, x[op](x), exact)
    end
    local x = special(dt)
    case(op .. " " .. dt .. " special values", op, dt, "t", { x }, {}, x[op](x), exact)
  end
end

-- binary: name, domain of each operand, the number given as the second
local BINARY = { { "atan2", "any", "any", -1.5 }, { "hypot", "any", "any", 3 }, { "leaky_relu", "any", "any", 0.2 } }
for _, b in ipairs(BINARY) do
  local op, da, db, v = table.unpack(b)
  for _, dt in ipairs(FLOATS) do
    local x, y = operand(dt, da), operand(dt, db)
    case(op .. " " .. dt, op, dt, "tt", { x, y }, {}, x[op](x, y), false)
    local xs, ys = operand(dt, da, true), operand(dt, db, true)
    case(op .. " " .. dt .. " strided", op, dt, "tt", { xs, ys }, {}, xs[op](xs, ys), false)
    local row = rand(dt, { 17 }, db)
    case(op .. " " .. dt .. " broadcast", op, dt, "tt", { x, row }, {}, x[op](x, row), false)
    case(op .. " " .. dt .. " number", op, dt, "ts", { x }, { v }, x[op](x, v), false)
    local sx, sy = special(dt), special(dt, true)
    case(op .. " " .. dt .. " special values", op, dt, "tt", { sx, sy }, {}, sx[op](sx, sy), false)
  end
end
for _, dt in ipairs(FLOATS) do
  local x = special(dt)
  case("leaky_relu " .. dt .. " default slope", "leaky_relu", dt, "tn", { x }, {}, x:leaky_relu(), true)
  case("leaky_relu " .. dt .. " special values, number", "leaky_relu", dt, "ts", { x }, { 0.2 }, x:leaky_relu(0.2), true)
end

-- lerp: tensors and numbers as end and weight, broadcast, strided, in place
for _, dt in ipairs(FLOATS) do
  local a, b = operand(dt, "any"), operand(dt, "any")
  local w = gpu.rand({ 13, 17 }, { dtype = dt, low = -0.5, high = 1.5, seed = 77 })
  case("lerp " .. dt, "lerp", dt, "ttt", { a, b, w }, {}, a:lerp(b, w), false)
  case("lerp " .. dt .. " number weight", "lerp", dt, "tts", { a, b }, { 0.25 }, a:lerp(b, 0.25), false)
  case("lerp " .. dt .. " weight 0.75", "lerp", dt, "tts", { a, b }, { 0.75 }, a:lerp(b, 0.75), false)
  case("lerp " .. dt .. " number end", "lerp", dt, "tst", { a, w }, { 2 }, a:lerp(2, w), false)
  local row, as = rand(dt, { 17 }, "any"), operand(dt, "any", true)
  case("lerp " .. dt .. " broadcast, strided", "lerp", dt, "tts", { as, row }, { 0.5 }, as:lerp(row, 0.5), false)
  case("lerp " .. dt .. " weights 0 and 1 exact", "lerp", dt, "tts", { a, b }, { 1 }, a:lerp(b, 1), true)
  local c = a:clone()
  c:lerp_(b, 0)
  case("lerp_ " .. dt .. " weight 0", "lerp", dt, "tts", { a, b }, { 0 }, c, true)
end

-- isclose: pairs equal, off by a lot, or special, so no value sits on the
-- boundary; the oracle rounds each step to the dtype, as the ops do
for _, dt in ipairs(CLASSES.FIB) do
  if dt ~= "bool" then
    local x = operand(dt, "any")
    local mask = rand("bool", { 13, 17 })
    local y = gpu.where(mask, x, T.is_float(dt) and x:mul(2):add(1) or x:clone():fill(3))
    case("isclose " .. dt, "isclose", dt, "tt", { x, y }, {}, x:isclose(y), true, "{}")
    case("isclose " .. dt .. " rtol 0.3", "isclose", dt, "tt", { y, x }, {}, y:isclose(x, { rtol = 0.3, atol = 0 }),
         true, "{'rtol': 0.3, 'atol': 0}")
    local sx, sy = special(dt), special(dt, true)
    case("isclose " .. dt .. " special values", "isclose", dt, "tt", { sx, sy }, {}, sx:isclose(sy), true, "{}")
    case("isclose " .. dt .. " special values, equal_nan", "isclose", dt, "tt", { sx, sx }, {},
         gpu.isclose(sx, sx, { equal_nan = true }), true, "{'equal_nan': True}")
    case("isclose " .. dt .. " number", "isclose", dt, "ts", { sx }, { 2 }, sx:isclose(2), true, "{}")
    if T.is_float(dt) then
      case("isclose " .. dt .. " nan number, equal_nan", "isclose", dt, "ts", { sx }, { 0 / 0 },
           sx:isclose(0 / 0, { equal_nan = true }), true, "{'equal_nan': True}")
      case("isclose " .. dt .. " inf number", "isclose", dt, "ts", { sx }, { 1 / 0 }, sx:isclose(1 / 0), true, "{}")
    end
  end
end

-- nan_to_num: the defaults (the dtype's extremes) and given values
for _, dt in ipairs(CLASSES.FIB) do
  local sx = special(dt)
  case("nan_to_num " .. dt, "nan_to_num", dt, "t", { sx }, {}, sx:nan_to_num(), true, "{}")
  if T.is_float(dt) then
    case("nan_to_num " .. dt .. " given", "nan_to_num", dt, "t", { sx }, {},
         sx:nan_to_num { nan = -1, posinf = 5, neginf = -7 }, true, "{'nan': -1, 'posinf': 5, 'neginf': -7}")
    local c = sx:clone()
    c:nan_to_num_ { nan = 2 }
    case("nan_to_num_ " .. dt, "nan_to_num", dt, "t", { sx }, {}, c, true, "{'nan': 2}")
  end
end

-- ---- the oracle -----------------------------------------------------------

local ORACLE = [=[
import math
import sys
import numpy as np

np.seterr(all="ignore")
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8,
      "i32": np.int32, "i64": np.int64, "bool": np.bool_}
# relative error allowed where the op does not round once
TOL = {"f32": 2e-6, "f64": 1e-13, "f16": 2e-3, "bf16": 1.6e-2}
# the largest finite value of each float dtype
BIG = {"f32": float(np.finfo(np.float32).max), "f64": float(np.finfo(np.float64).max),
       "f16": 65504.0, "bf16": 3.3895313892515355e38}

def bf16_to_f32(u):
    return (u.astype(np.uint32) << 16).view(np.float32)

def f32_to_bf16(f):
    f = np.ascontiguousarray(f, dtype=np.float32)
    b = f.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(np.isnan(f), ((b >> 16) | 0x40) & 0xFFFF, r)
    return bf16_to_f32(r.astype(np.uint16))

def load(path, dt):
    a = np.load(path)
    return bf16_to_f32(a.view(np.uint16)) if dt == "bf16" else a

def compute(a, dt):
    return a.astype(np.float32) if dt in ("f16", "bf16") else a

def as_dtype(r, dt):
    if dt == "bf16":
        return f32_to_bf16(r)
    if r.dtype == np.bool_ or dt == "bool":
        return r.astype(np.bool_)
    return r.astype(NP[dt])

def rnd(dt):
    """a compute-type value rounded to dtype dt and back: the op's stored result"""
    if dt == "f16":
        return lambda v: np.asarray(v).astype(np.float16).astype(np.float32)
    if dt == "bf16":
        return lambda v: f32_to_bf16(np.asarray(v, dtype=np.float32))
    return lambda v: np.asarray(v)

def isint(dt):
    return dt in ("i8", "u8", "i32", "i64", "bool")

def ct(dt):
    return np.float64 if dt == "f64" else np.float32

def number(v, dt):
    return ct(dt)(v) if not isint(dt) else NP[dt](v)

def lib(f):
    """a function of Python's math module over an array, in double"""
    v = np.vectorize(lambda x: f(x) if not math.isnan(x) else x, otypes=[np.float64])
    return lambda x: v(x.astype(np.float64)).astype(x.dtype)

erf, erfc = lib(math.erf), lib(math.erfc)

def gelu(dt, x):
    c = ct(dt)
    z = (-x * c(0.70710678118654752440)).astype(c)
    return (x / c(2)) * erfc(z)

def softplus(dt, x):
    return np.where(x > 20, x, np.log1p(np.exp(x)))

def lerp(dt, a, b, w):
    return np.where(np.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))

def isclose(dt, a, b, o):
    """NumPy's, each step rounded to the dtype as the ops store it; integers in f64"""
    rtol, atol, eq = o.get("rtol", 1e-5), o.get("atol", 1e-8), o.get("equal_nan", False)
    if isint(dt):
        a, b = np.float64(a), np.float64(b)
        r = lambda v: np.asarray(v)
        c = np.float64
    else:
        r, c = rnd(dt), ct(dt)
    if not isinstance(b, np.ndarray):
        b = np.float64(b) if isint(dt) else c(b)
    d = r(np.abs(r(a - b)))
    if isinstance(b, np.ndarray):
        tol = r(r(c(rtol) * r(np.abs(b))) + c(atol))
    else:
        tol = np.float64(atol + rtol * abs(float(b))) if np.isfinite(b) else -np.inf
        tol = c(tol) if not isint(dt) else tol
    res = ((d <= tol) & np.isfinite(b)) | (a == b)
    if eq:
        res = res | (np.isnan(a) & np.isnan(b))
    return res

def nan_to_num(dt, x, o):
    if isint(dt):
        return x
    return np.nan_to_num(x, nan=o.get("nan", 0), posinf=o.get("posinf", BIG[dt]),
                         neginf=o.get("neginf", -BIG[dt]))

F = {
    "log1p": lambda dt, x: np.log1p(x), "expm1": lambda dt, x: np.expm1(x),
    "log2": lambda dt, x: np.log2(x), "log10": lambda dt, x: np.log10(x),
    "exp2": lambda dt, x: np.exp2(x), "tan": lambda dt, x: np.tan(x),
    "asin": lambda dt, x: np.arcsin(x), "acos": lambda dt, x: np.arccos(x),
    "atan": lambda dt, x: np.arctan(x), "sinh": lambda dt, x: np.sinh(x),
    "cosh": lambda dt, x: np.cosh(x), "erf": lambda dt, x: erf(x),
    "reciprocal": lambda dt, x: np.reciprocal(x), "gelu": gelu,
    "silu": lambda dt, x: x / (1 + np.exp(-x)), "softplus": softplus,
    "isnan": lambda dt, x: np.isnan(x), "isinf": lambda dt, x: np.isinf(x),
    "isfinite": lambda dt, x: np.isfinite(x),
    "atan2": lambda dt, a, b: np.arctan2(a, b), "hypot": lambda dt, a, b: np.hypot(a, b),
    "leaky_relu": lambda dt, x, s: np.where(x > 0, x, x * (ct(dt)(0.01) if s is None else s)),
    "lerp": lerp,
}

results = []

def C(name, op, dt, form, ins, nums, out, exact, extra):
    try:
        ts = [load(p, d) if op in ("isclose", "nan_to_num") else compute(load(p, d), d) for p, d in ins]
        ns = [number(v, dt) for v in nums]
        args = []
        for ch in form:
            args.append(ts.pop(0) if ch == "t" else ns.pop(0) if ch == "s" else None)
        if op == "isclose":
            ref = isclose(dt, args[0], args[1], extra)
        elif op == "nan_to_num":
            ref = nan_to_num(dt, args[0], extra)
        else:
            ref = F[op](dt, *args)
        ref = np.asarray(ref)
        got = load(*out)
        ref = as_dtype(ref, "bool" if got.dtype == np.bool_ else dt)
        if got.shape != ref.shape:
            return results.append((name, "shape %s, numpy %s" % (got.shape, ref.shape)))
        if got.dtype == np.bool_ or isint(dt):
            bad = np.flatnonzero(got.astype(np.int64) != ref.astype(np.int64))
        else:
            g, r = got.astype(np.float64), ref.astype(np.float64)
            ok = (g == r) | (np.isnan(g) & np.isnan(r))
            if not exact:
                scale = np.abs(r)
                if op == "lerp":
                    scale = np.abs(args[0]) + np.abs(args[1])
                ok |= np.abs(g - r) <= TOL[dt] * scale
            bad = np.flatnonzero(~ok)
        if len(bad):
            i = bad[0]
            detail = "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), got.size, i, got.reshape(-1)[i].item(), ref.reshape(-1)[i].item())
            if len(args) and isinstance(args[0], np.ndarray) and args[0].size == got.size:
                detail += "; operands " + ", ".join(
                    repr(a.reshape(-1)[i].item()) if isinstance(a, np.ndarray) and a.size == got.size
                    else repr(a) for a in args)
            return results.append((name, detail))
        results.append((name, None))
    except Exception as e:
        results.append((name, "oracle raised %s: %s" % (type(e).__name__, e)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("every new op against NumPy", ORACLE)

-- allclose is isclose's all, read: a Lua boolean, and a sync as t:item()
T.test("allclose: a Lua boolean, as isclose(...):all()", function()
  local a = gpu.tensor({ 1, 2, 1 / 0, 0 / 0 }, { dtype = "f32" })
  local b = gpu.tensor({ 1 + 1e-7, 2, 1 / 0, 0 / 0 }, { dtype = "f32" })
  T.is(gpu.allclose(a, b), false, "NaN is not close to NaN")
  T.is(gpu.allclose(a, b, { equal_nan = true }), true, "unless equal_nan")
  T.is(a:allclose(b:add(1)), false, "off by one")
  T.is(gpu.allclose(gpu.tensor({ 1, 2 }, { dtype = "i32" }), gpu.tensor({ 1, 2 }, { dtype = "i32" })), true,
       "integers")
  local before = gpu.stats().syncs
  gpu.allclose(b, b)
  T.ok(gpu.stats().syncs > before, "allclose is a counted sync")
  T.raises(function()
    local _ <close> = gpu.nosync()
    return gpu.allclose(b, b)
  end, "allclose: a device%-to%-host read waits for the device", "refused under gpu.nosync(), as item()")
end)

T.test("bad input: dtypes and options named", function()
  local f = gpu.tensor({ 1, 2 }, { dtype = "f32" })
  local i = gpu.tensor({ 1, 2 }, { dtype = "i32" })
  T.raises(function() return i:log1p() end, "log1p: not supported for i32", "a float op on integers")
  T.raises(function() return i:lerp(i, 0.5) end, "lerp: not supported for i32", "lerp on integers")
  T.raises(function() return f:atan2(i) end, "dtype i32 does not match f32", "atan2 of mixed dtypes")
  T.raises(function() return f:isclose(i) end, "dtype i32 does not match f32", "isclose of mixed dtypes")
  T.raises(function() return f:isclose(f, { rtol = "x" }) end, "bad option 'rtol' to 'isclose'", "rtol a string")
  T.raises(function() return f:nan_to_num { nan = {} } end, "bad option 'nan' to 'nan_to_num'", "nan a table")
  T.raises(function() return f:leaky_relu("x") end, "gpu.Tensor or number expected", "slope a string")
  T.raises(function() return gpu.tensor({ true }, { dtype = "bool" }):isclose(true) end,
           "not supported for bool", "isclose of bool")
end)

O:close()
T.done()
