-- Every elementwise op of the op table (cuda/ops.h), and any/all, against
-- NumPy: random and special inputs in every dtype the op takes, contiguous,
-- strided (a column slice), broadcast, with numbers on either side, through
-- .npy files (t:save here, numpy.load in a python3 child that computes the
-- reference and compares).  Runs on whichever backend the suite runs
-- (GPULUA_DEVICE=cuda: the CUDA kernels).  Skips when no python3 with numpy
-- is found (apt install python3-numpy; GPULUA_PYTHON names one).
--
-- NumPy computes f16 in float32 and rounds, as gpulua does; bf16 is not a
-- NumPy dtype: the oracle computes in float32 and rounds to nearest even.
-- Ops that round once (+ - * /, sqrt, comparisons, floor...) must match bit
-- for bit; the others (exp, log, sin, pow...) within a few ulps.  The
-- documented differences from NumPy are the reference here (docs/lua-api.md,
-- "Tensors"): integer division floors and raises on zero; `//` and
-- floor_divide on floats are floor(a / b), as Lua's; floor, ceil, round and
-- trunc keep an integer dtype (the identity).  Zero-sized tensors are
-- compared in tests/views_numpy.lua.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local FLOATS = { "f32", "f64", "f16", "bf16" }
local INTS = { "i8", "u8", "i32", "i64" }
local CLASSES = {
  F = FLOATS,
  FI = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64" },
  FIB = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" },
}

-- unary: name, dtype classes, input domain, exact (rounded once: bit for bit)
local UNARY = {
  { "neg", "FI", "any", true }, { "abs", "FI", "any", true }, { "exp", "F", "any", false },
  { "log", "F", "pos", false }, { "sqrt", "F", "pos", true }, { "relu", "FI", "any", true },
  { "sigmoid", "F", "any", false }, { "tanh", "F", "any", false }, { "logical_not", "FIB", "any", true },
  { "floor", "FI", "any", true }, { "ceil", "FI", "any", true }, { "round", "FI", "any", true },
  { "trunc", "FI", "any", true }, { "sign", "FI", "any", true }, { "sin", "F", "any", false },
  { "cos", "F", "any", false }, { "rsqrt", "F", "pos", true }, { "square", "FI", "any", true },
}
-- binary: name, classes, domain of the second operand, exact, takes a number on the left
local BINARY = {
  { "add", "FI", "any", true, true }, { "sub", "FI", "any", true, true }, { "mul", "FI", "any", true, true },
  { "div", "FI", "nonzero", true, true }, { "pow", "FI", "exponent", false, true },
  { "max", "FIB", "any", true }, { "min", "FIB", "any", true },
  { "eq", "FIB", "any", true }, { "ne", "FIB", "any", true }, { "lt", "FIB", "any", true },
  { "le", "FIB", "any", true }, { "gt", "FIB", "any", true }, { "ge", "FIB", "any", true },
  { "logical_and", "FIB", "any", true }, { "logical_or", "FIB", "any", true },
  { "fmod", "FI", "nonzero", true }, { "remainder", "FI", "nonzero", true, true },
  { "floor_divide", "FI", "nonzero", true, true },
}
local COMPARE = { eq = true, ne = true, lt = true, le = true, gt = true, ge = true }

-- ---- inputs ---------------------------------------------------------------

local IRANGE = { i8 = { -100, 100 }, u8 = { 0, 200 }, i32 = { -100000, 100000 }, i64 = { -(1 << 40), 1 << 40 } }

-- random values of dtype dt in a domain: "any", "pos" (> 0), "nonzero",
-- "exponent" (a small power: integers 0..5)
local seed = 1000
local function rand(dt, shape, dom)
  seed = seed + 1
  if dt == "bool" then return gpu.rand(shape, { dtype = "bool", seed = seed }) end
  local o = { dtype = dt, seed = seed }
  if T.is_float(dt) then
    o.low, o.high = -4, 4
    if dom == "pos" then o.low, o.high = 0.05, 8 end
    if dom == "exponent" then o.low, o.high = -3, 3 end
    local t = gpu.rand(shape, o)
    if dom == "nonzero" then t = gpu.where(t:eq(0), 1, t) end
    return t
  end
  o.low, o.high = IRANGE[dt][1], IRANGE[dt][2]
  if dom == "pos" then o.low = 1 end
  if dom == "exponent" then o.low, o.high = 0, 6 end
  local t = gpu.rand(shape, o)
  if dom == "nonzero" then t = gpu.where(t:eq(0), 7, t) end
  return t
end

-- special values: signed zeros, ties for rounding, inf, NaN, the ends of the range
local FSPECIAL = { 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.75, -3.75, 1 / 0, -1 / 0, 0 / 0, 100, -100, 1e-3, 60000 }
local function special(dt, dom, flip)
  local v = {}
  if T.is_float(dt) then
    for i, x in ipairs(FSPECIAL) do v[i] = x end
    if dom == "pos" then for i, x in ipairs(v) do v[i] = math.abs(x) end end
  elseif dt == "bool" then
    v = { true, false, true, false }
  else
    local lo, hi = T.int_range(dt)
    v = { lo, lo + 1, -1, 0, 1, 2, 7, -7, hi - 1, hi }
    if dt == "u8" then v = { 0, 1, 2, 7, 100, 128, 254, 255 } end
    if dom == "exponent" then for i in ipairs(v) do v[i] = i % 6 end end
    if dom == "pos" then for i, x in ipairs(v) do v[i] = x > 0 and x or 3 end end
  end
  if dom == "nonzero" then for i, x in ipairs(v) do if x == 0 then v[i] = 3 end end end
  if dom == "exponent" and T.is_float(dt) then
    v = { 0.0, 1.0, 2.0, 0.5, -1.0, 3.0, -0.5, 2.5, 1 / 0, 0 / 0, -1 / 0, -2.0, 1.5, -0.0, 4.0, -3.0 }
  end
  if flip then
    local r = {}
    for i = #v, 1, -1 do r[#r + 1] = v[i] end
    v = r
  end
  return gpu.tensor(v, { dtype = dt })
end

-- ---- cases ----------------------------------------------------------------

local function save(t) return O:save(t) end

local pyval = N.pyval

-- name; op (the oracle's); dt (the op's dtype); form (operands in order: t a
-- tensor of ins, s a number of nums, n nil); the result; exact; extra (a
-- python literal, e.g. the reduction's dim)
local function case(name, op, dt, form, ins, nums, result, exact, extra)
  local i, s = {}, {}
  for k, t in ipairs(ins) do i[k] = save(t) end
  for k, v in ipairs(nums) do s[k] = pyval(v) end
  O:case(name, string.format("C(%q, %q, %q, %q, [%s], [%s], %s, %s, %s)", name, op, dt, form,
                                    table.concat(i, ", "), table.concat(s, ", "), save(result),
                                    exact and "True" or "False", extra or "None"))
end

-- a {13, 17} operand: contiguous, or a column slice of a {13, 40} one
local function operand(dt, dom, strided)
  if strided then return rand(dt, { 13, 40 }, dom):narrow(2, 7, 17) end
  return rand(dt, { 13, 17 }, dom)
end

for _, u in ipairs(UNARY) do
  local op, cls, dom, exact = table.unpack(u)
  for _, dt in ipairs(CLASSES[cls]) do
    for _, strided in ipairs { false, true } do
      local x = operand(dt, dom, strided)
      case(string.format("%s %s%s", op, dt, strided and " strided" or ""), op, dt, "t", { x }, {}, x[op](x), exact)
    end
    local x = special(dt, dom)
    case(op .. " " .. dt .. " special values", op, dt, "t", { x }, {}, x[op](x), exact)
  end
end

local function number(dt, dom, op)
  if dt == "bool" then return true end
  if COMPARE[op] and T.is_float(dt) then return 0.1 end   -- seen as the dtype holds it
  if dom == "exponent" then return 2 end
  if T.is_float(dt) then return dom == "nonzero" and -1.5 or 1.5 end
  return dt == "u8" and 3 or -3
end

-- the operators, for a number on the left
local LEFT = {
  add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end, div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end, remainder = function(a, b) return a % b end,
  floor_divide = function(a, b) return a // b end,
}

for _, b in ipairs(BINARY) do
  local op, cls, dom, exact, left = table.unpack(b)
  for _, dt in ipairs(CLASSES[cls]) do
    local x, y = operand(dt, "any"), operand(dt, dom)
    case(op .. " " .. dt, op, dt, "tt", { x, y }, {}, x[op](x, y), exact)
    local xs, ys = operand(dt, "any", true), operand(dt, dom, true)
    case(op .. " " .. dt .. " strided", op, dt, "tt", { xs, ys }, {}, xs[op](xs, ys), exact)
    local row, col = rand(dt, { 17 }, dom), rand(dt, { 13, 1 }, dom)
    case(op .. " " .. dt .. " broadcast {13,17} {17}", op, dt, "tt", { x, row }, {}, x[op](x, row), exact)
    case(op .. " " .. dt .. " broadcast {13,17} {13,1}", op, dt, "tt", { x, col }, {}, x[op](x, col), exact)
    local v = number(dt, dom, op)
    case(op .. " " .. dt .. " number", op, dt, "ts", { x }, { v }, x[op](x, v), exact)
    if left then
      local l = number(dt, "any", op)
      local ly = operand(dt, dom)
      case(op .. " " .. dt .. " number on the left", op, dt, "st", { ly }, { l }, LEFT[op](l, ly), exact)
    end
    local sx, sy = special(dt, "any"), special(dt, dom, true)
    case(op .. " " .. dt .. " special values", op, dt, "tt", { sx, sy }, {}, sx[op](sx, sy), exact)
  end
end

for _, dt in ipairs(CLASSES.FIB) do
  local c, a, b = rand("bool", { 13, 17 }), operand(dt, "any"), operand(dt, "any")
  local v = number(dt, "any", "where")
  case("where " .. dt, "where", dt, "ttt", { c, a, b }, {}, gpu.where(c, a, b), true)
  case("where " .. dt .. " number, tensor", "where", dt, "tst", { c, b }, { v }, gpu.where(c, v, b), true)
  case("where " .. dt .. " tensor, number", "where", dt, "tts", { c, a }, { v }, gpu.where(c, a, v), true)
  case("where " .. dt .. " numbers", "where", dt, "tss", { c }, { v, v },
       gpu.where(c, v, v, { dtype = dt }), true)
  local cc, row = rand("bool", { 13, 1 }), rand(dt, { 17 }, "any")
  case("where " .. dt .. " broadcast", "where", dt, "ttt", { cc, row, b }, {}, gpu.where(cc, row, b), true)
  local cs, as = rand("bool", { 13, 40 }):narrow(2, 3, 17), operand(dt, "any", true)
  case("where " .. dt .. " strided", "where", dt, "ttt", { cs, as, b }, {}, gpu.where(cs, as, b), true)
  case("masked_fill " .. dt, "masked_fill", dt, "tts", { a, c }, { v }, a:masked_fill(c, v), true)
  local mrow = rand("bool", { 17 })
  case("masked_fill " .. dt .. " broadcast mask", "masked_fill", dt, "tts", { as, mrow }, { v },
       as:masked_fill(mrow, v), true)
  for _, op in ipairs { "any", "all" } do
    local x = dt == "bool" and rand("bool", { 5, 6, 7 }) or gpu.rand({ 5, 6, 7 }, { dtype = "i8", low = -1, high = 9,
                                                                                  seed = 77 }):to(dt)
    case(op .. " " .. dt, op, dt, "t", { x }, {}, x[op](x), true)
    for dim = 1, 3 do
      case(string.format("%s %s dim %d", op, dt, dim), op, dt, "t", { x }, {}, x[op](x, { dim = dim }), true,
           tostring(dim - 1))
    end
    case(op .. " " .. dt .. " dim -1 keepdim", op, dt, "t", { x }, {}, x[op](x, { dim = -1, keepdim = true }), true,
         "(2, True)")
    local sx = special(dt, "any")
    case(op .. " " .. dt .. " special values", op, dt, "t", { sx }, {}, sx[op](sx), true)
  end
end

for _, dt in ipairs(CLASSES.FI) do
  local x, lo, hi = operand(dt, "any"), rand(dt, { 17 }, "any"), rand(dt, { 13, 1 }, "any")
  local l, u = -1.5, 2
  if not T.is_float(dt) then l, u = dt == "u8" and 3 or -3, 50 end
  case("clamp " .. dt .. " numbers", "clamp", dt, "tss", { x }, { l, u }, x:clamp(l, u), true)
  case("clamp " .. dt .. " no lower bound", "clamp", dt, "tns", { x }, { u }, x:clamp(nil, u), true)
  case("clamp " .. dt .. " no upper bound", "clamp", dt, "tsn", { x }, { l }, x:clamp(l), true)
  case("clamp " .. dt .. " tensors, broadcast", "clamp", dt, "ttt", { x, lo, hi }, {}, x:clamp(lo, hi), true)
  case("clamp " .. dt .. " tensor, number", "clamp", dt, "tts", { x, lo }, { u }, x:clamp(lo, u), true)
  local xs = operand(dt, "any", true)
  case("clamp " .. dt .. " strided", "clamp", dt, "tss", { xs }, { l, u }, xs:clamp(l, u), true)
  local sx = special(dt, "any")
  case("clamp " .. dt .. " special values", "clamp", dt, "tss", { sx }, { l, u }, sx:clamp(l, u), true)
end

-- ---- the oracle -----------------------------------------------------------

local ORACLE = [=[
import sys
import numpy as np

np.seterr(all="ignore")
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8,
      "i32": np.int32, "i64": np.int64, "bool": np.bool_}
# relative error allowed where the op does not round once (exp, log, pow...)
TOL = {"f32": 2e-6, "f64": 1e-13, "f16": 2e-3, "bf16": 1.6e-2}

def bf16_to_f32(u):
    return (u.astype(np.uint32) << 16).view(np.float32)

def f32_to_bf16(f):
    """float32 -> bf16 (as float32 values): nearest even, NaN kept quiet, as gpulua"""
    f = np.ascontiguousarray(f, dtype=np.float32)
    b = f.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(np.isnan(f), ((b >> 16) | 0x40) & 0xFFFF, r)
    return bf16_to_f32(r.astype(np.uint16))

def load(path, dt):
    a = np.load(path)
    return bf16_to_f32(a.view(np.uint16)) if dt == "bf16" else a

def compute(a, dt):
    """the compute type: f16 and bf16 in float32"""
    return a.astype(np.float32) if dt in ("f16", "bf16") else a

def as_dtype(r, dt):
    """a compute-type value as dtype dt holds it"""
    if dt == "bf16":
        return f32_to_bf16(r)
    if r.dtype == np.bool_ or dt == "bool":
        return r.astype(np.bool_)
    return r.astype(NP[dt])

def number(v, dt, op):
    if dt in ("f16", "bf16", "f32"):
        x = np.float32(v)
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):   # the number as the dtype holds it
            x = np.float32(np.float16(v)) if dt == "f16" else f32_to_bf16(np.array([x]))[0] if dt == "bf16" else x
        return x
    return NP[dt](v)

def isint(dt):
    return dt in ("i8", "u8", "i32", "i64")

def floor_divide(dt, a, b):
    return np.floor_divide(a, b) if isint(dt) else np.floor(a / b)

def clamp(x, lo, hi):
    """np.clip's definition, minimum(maximum(x, lo), hi), with either bound absent"""
    m = x if lo is None else np.maximum(x, lo)
    return m if hi is None else np.minimum(m, hi)

def rounding(f):
    return lambda dt, x: x if isint(dt) else f(x)

F = {
    "neg": lambda dt, x: np.negative(x), "abs": lambda dt, x: np.abs(x),
    "exp": lambda dt, x: np.exp(x), "log": lambda dt, x: np.log(x), "sqrt": lambda dt, x: np.sqrt(x),
    "relu": lambda dt, x: np.maximum(x, x.dtype.type(0)),
    "sigmoid": lambda dt, x: 1 / (1 + np.exp(-x)), "tanh": lambda dt, x: np.tanh(x),
    "logical_not": lambda dt, x: np.logical_not(x),
    "floor": rounding(np.floor), "ceil": rounding(np.ceil), "round": rounding(np.rint),
    "trunc": rounding(np.trunc), "sign": lambda dt, x: np.sign(x),
    "sin": lambda dt, x: np.sin(x), "cos": lambda dt, x: np.cos(x),
    "rsqrt": lambda dt, x: 1 / np.sqrt(x), "square": lambda dt, x: np.square(x),
    "add": lambda dt, a, b: np.add(a, b), "sub": lambda dt, a, b: np.subtract(a, b),
    "mul": lambda dt, a, b: np.multiply(a, b), "div": lambda dt, a, b: floor_divide(dt, a, b) if isint(dt) else a / b,
    "pow": lambda dt, a, b: np.power(a, b), "max": lambda dt, a, b: np.maximum(a, b),
    "min": lambda dt, a, b: np.minimum(a, b),
    "eq": lambda dt, a, b: np.equal(a, b), "ne": lambda dt, a, b: np.not_equal(a, b),
    "lt": lambda dt, a, b: np.less(a, b), "le": lambda dt, a, b: np.less_equal(a, b),
    "gt": lambda dt, a, b: np.greater(a, b), "ge": lambda dt, a, b: np.greater_equal(a, b),
    "logical_and": lambda dt, a, b: np.logical_and(a, b), "logical_or": lambda dt, a, b: np.logical_or(a, b),
    "fmod": lambda dt, a, b: np.fmod(a, b), "remainder": lambda dt, a, b: np.remainder(a, b),
    "floor_divide": floor_divide,
    "where": lambda dt, c, a, b: np.where(c, a, b),
    "masked_fill": lambda dt, t, m, v: np.where(m, v, t),
    "clamp": lambda dt, x, lo, hi: clamp(x, lo, hi),
}

results = []

def C(name, op, dt, form, ins, nums, out, exact, extra):
    try:
        ts = [compute(load(p, d), d) for p, d in ins]
        ns = [number(v, dt, op) for v in nums]
        args = []
        for ch in form:
            args.append(ts.pop(0) if ch == "t" else ns.pop(0) if ch == "s" else None)
        if op in ("any", "all"):
            f = np.any if op == "any" else np.all
            axis, keep = (extra, False) if not isinstance(extra, tuple) else extra
            ref = f(args[0], axis=axis, keepdims=keep)
        else:
            ref = F[op](dt, *args)
        ref = np.asarray(ref)
        got = load(*out)
        ref = as_dtype(ref, "bool" if got.dtype == np.bool_ else dt)
        if got.shape != ref.shape:
            return results.append((name, "shape %s, numpy %s" % (got.shape, ref.shape)))
        if got.dtype == np.bool_ or isint(dt) and got.dtype != np.float32:
            bad = np.flatnonzero(got.astype(np.int64) != ref.astype(np.int64))
        else:
            g, r = got.astype(np.float64), ref.astype(np.float64)
            ok = (g == r) | (np.isnan(g) & np.isnan(r))
            if not exact:
                ok |= np.abs(g - r) <= TOL[dt] * np.abs(r)
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

O:check("every op against NumPy", ORACLE)

O:close()
T.done()
