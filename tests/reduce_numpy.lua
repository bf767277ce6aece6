-- The reductions with dim/keepdim (prod, var, std, norm, argmin,
-- logsumexp), cumsum, softmax, log_softmax and the index ops (index_select,
-- gather, scatter_add_) against NumPy: random and special inputs in every
-- dtype each op takes, whole tensor and along every dim, keepdim,
-- non-contiguous inputs, through .npy files (the harness of
-- tests/ops_numpy.lua).  Runs on whichever backend the suite runs.
--
-- The oracle computes in float64 (NumPy's own f32 reductions add up in f32)
-- and rounds to the result's dtype; bf16 as ops_numpy.lua rounds it.
-- gpulua adds up floats in double too, so the results agree to an ulp or
-- so: each case has a tolerance.  Indices are 1-based here, 0-based in
-- NumPy (the documented difference).  Reductions of nothing follow NumPy
-- (sum 0, prod 1, mean/var NaN ...): tests/index_ops.lua has them, once
-- zero-sized tensors can be made.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local FLOATS = { "f32", "f64", "f16", "bf16" }
local NUMERIC = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64" }
local ALL = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" }

local seed = 5000
-- random values of dt in [lo, hi) (integers: [lo, hi) too); bool 0/1
local function rand(dt, shape, lo, hi)
  seed = seed + 1
  if dt == "bool" then return gpu.rand(shape, { dtype = "bool", seed = seed }) end
  return gpu.rand(shape, { dtype = dt, seed = seed, low = lo or -4, high = hi or 4 })
end

-- {5, 6, 7}, or the same shape as a non-contiguous view (every other
-- element of the last dim of a {5, 6, 14}, dims 1 and 2 swapped by view
-- strides would need transpose: a narrow of dim 2 of {5, 9, 14} instead)
local SHAPE = { 5, 6, 7 }
local function operand(dt, strided, lo, hi)
  if strided then return rand(dt, { 5, 9, 7 }, lo, hi):narrow(2, 3, 6) end
  return rand(dt, SHAPE, lo, hi)
end

local function save(t) return O:save(t) end

local pyval = N.pyval

-- name; op; the dtype; the inputs; the result; its tolerance (0: exact);
-- extra (a python dict literal: axis, keepdims, ddof, p, dim)
local function case(name, op, dt, ins, result, tol, extra)
  local i = {}
  for k, t in ipairs(ins) do i[k] = save(t) end
  O:case(name, string.format("C(%q, %q, %q, [%s], %s, %s, %s)", name, op, dt, table.concat(i, ", "),
                                    save(result), tol, extra or "{}"))
end

-- ---- reductions ------------------------------------------------------------

-- op, dtypes, input range, tolerance (in ulps of the oracle's rounding), options
local REDUCE = {
  { "prod", ALL, 0.5, 1.6, 2 }, { "argmin", ALL, -4, 4, 0 },
  { "var", FLOATS, -4, 4, 2 }, { "var", FLOATS, -4, 4, 2, { unbiased = false } },
  { "std", FLOATS, -4, 4, 2 }, { "std", FLOATS, -4, 4, 2, { unbiased = false } },
  { "norm", FLOATS, -4, 4, 2 }, { "norm", FLOATS, -4, 4, 2, { p = 1 } },
  { "norm", FLOATS, -4, 4, 0, { p = math.huge } }, { "norm", FLOATS, -4, 4, 4, { p = 3 } },
  { "norm", FLOATS, -4, 4, 4, { p = 0.5 } },
  { "logsumexp", FLOATS, -30, 30, 2 },
}
-- integer prod wraps in int64, as NumPy's does: small factors, many of them
local IPROD = { lo = -3, hi = 4 }

local function pyopts(o, axis, keep)
  local t = {}
  if axis then t[#t + 1] = string.format("'axis': %d", axis) end
  if keep then t[#t + 1] = "'keepdims': True" end
  for k, v in pairs(o or {}) do
    if k == "unbiased" then t[#t + 1] = string.format("'ddof': %d", v and 1 or 0) end
    if k == "p" then t[#t + 1] = string.format("'p': %s", pyval(v)) end
  end
  return "{" .. table.concat(t, ", ") .. "}"
end

local function optstr(o)
  local t = {}
  for k, v in pairs(o or {}) do t[#t + 1] = k .. "=" .. tostring(v) end
  return #t > 0 and " {" .. table.concat(t, ",") .. "}" or ""
end

for _, r in ipairs(REDUCE) do
  local op, dts, lo, hi, tol, o = table.unpack(r)
  for _, dt in ipairs(dts) do
    local l, h = lo, hi
    if not T.is_float(dt) and op == "prod" then l, h = IPROD.lo, IPROD.hi end
    if dt == "u8" and l < 0 then l = 0 end
    local label = op .. optstr(o) .. " " .. dt
    for _, strided in ipairs { false, true } do
      local x = operand(dt, strided, l, h)
      local sfx = strided and " strided" or ""
      local opts = {}
      for k, v in pairs(o or {}) do opts[k] = v end
      case(label .. sfx, op, dt, { x }, x[op](x, opts), tol, pyopts(o))
      for dim = 1, 3 do
        opts.dim, opts.keepdim = dim, nil
        case(string.format("%s dim %d%s", label, dim, sfx), op, dt, { x }, x[op](x, opts), tol, pyopts(o, dim - 1))
      end
      opts.dim, opts.keepdim = -2, true
      case(label .. " dim -2 keepdim" .. sfx, op, dt, { x }, x[op](x, opts), tol, pyopts(o, 1, true))
    end
  end
end

-- special values: NaN (first wins for argmin), inf, -inf, ties, a row of
-- -inf (logsumexp -inf), large values (logsumexp's shift), one element
-- (var unbiased: NaN)
local SPECIAL = {
  { 0 / 0, 1, -1, 2 }, { 1, -1 / 0, 3, -1 / 0 }, { 1 / 0, 2, 3, 4 }, { -1 / 0, -1 / 0, -1 / 0, -1 / 0 },
  { 1000, 999, 1001, -1000 }, { 2, 2, 2, 2 }, { -0.0, 0.0, 5, -5 }, { 1e-3, 3, 0 / 0, 1 / 0 },
}
for _, dt in ipairs(FLOATS) do
  local x = gpu.tensor(SPECIAL, { dtype = dt })
  for _, r in ipairs(REDUCE) do
    local op, dts, _, _, tol, o = table.unpack(r)
    if dts == FLOATS or dts == ALL then
      local opts = {}
      for k, v in pairs(o or {}) do opts[k] = v end
      opts.dim = 2
      case(op .. optstr(o) .. " " .. dt .. " special values", op, dt, { x }, x[op](x, opts), tol, pyopts(o, 1))
    end
  end
  local one = gpu.tensor({ { 3 } }, { dtype = dt })
  case("var " .. dt .. " of one element", "var", dt, { one }, one:var(), 0, "{'ddof': 1}")
end

-- ---- cumsum, softmax, log_softmax ------------------------------------------

for _, dt in ipairs(ALL) do
  for _, strided in ipairs { false, true } do
    local x = operand(dt, strided, dt == "u8" and 0 or -50, 50)
    for _, dim in ipairs { 1, 2, 3, -1 } do
      case(string.format("cumsum %s dim %d%s", dt, dim, strided and " strided" or ""), "cumsum", dt, { x },
           x:cumsum(dim), T.is_float(dt) and 2 or 0, string.format("{'axis': %d}", dim > 0 and dim - 1 or 3 + dim))
    end
  end
end

-- CUDA computes f32 softmax in f32: exp(x - max) carries the rounding of
-- x - max, |x - max| ulps of it (up to 40 here), as PyTorch's does
local SOFT_TOL = 64
for _, dt in ipairs(FLOATS) do
  for _, op in ipairs { "softmax", "log_softmax" } do
    for _, strided in ipairs { false, true } do
      local x = operand(dt, strided, -10, 10)
      for _, dim in ipairs { 1, 2, 3 } do
        case(string.format("%s %s dim %d%s", op, dt, dim, strided and " strided" or ""), op, dt, { x },
             x[op](x, { dim = dim }), SOFT_TOL, string.format("{'axis': %d}", dim - 1))
      end
    end
    -- long rows (the CUDA kernels' other paths), and special values
    for _, n in ipairs { 600, 5000, 20000 } do
      local x = rand(dt, { 3, n }, -20, 20)
      case(string.format("%s %s rows of %d", op, dt, n), op, dt, { x }, x[op](x, -1), SOFT_TOL, "{'axis': 1}")
    end
    local s = gpu.tensor(SPECIAL, { dtype = dt })
    case(op .. " " .. dt .. " special values", op, dt, { s }, s[op](s, { dim = 2 }), SOFT_TOL, "{'axis': 1}")
  end
end

-- ---- indexing ---------------------------------------------------------------

local function index(shape, n, dt)
  seed = seed + 1
  return gpu.rand(shape, { dtype = dt or "i64", low = 1, high = n + 1, seed = seed })
end

for _, dt in ipairs(ALL) do
  for _, strided in ipairs { false, true } do
    local x = operand(dt, strided, dt == "u8" and 0 or -50, 50)
    local sfx = strided and " strided" or ""
    for dim = 1, 3 do
      for _, idt in ipairs { "i64", "i32" } do
        local i = index({ 9 }, SHAPE[dim], idt)
        case(string.format("index_select %s dim %d %s%s", dt, dim, idt, sfx), "index_select", dt, { x, i },
             x:index_select(dim, i), 0, string.format("{'dim': %d}", dim - 1))
      end
      -- the index may be smaller than the tensor along the other dims
      local shape = { 4, 5, 6 }
      shape[dim] = 8
      local g = index(shape, SHAPE[dim], dim == 2 and "i32" or "i64")
      case(string.format("gather %s dim %d%s", dt, dim, sfx), "gather", dt, { x, g }, x:gather(dim, g), 0,
           string.format("{'dim': %d}", dim - 1))
      if dt ~= "bool" then
        local self = operand(dt, strided, dt == "u8" and 0 or -50, 50)
        local before = self:clone()
        local src = rand(dt, { 10, 10, 10 }, dt == "u8" and 0 or -50, 50)   -- larger than the index
        local sshape = { 4, 5, 6 }
        sshape[dim] = 9
        local si = index(sshape, SHAPE[dim])
        self:scatter_add_(dim, si, src)
        case(string.format("scatter_add_ %s dim %d%s", dt, dim, sfx), "scatter_add", dt, { before, si, src }, self,
             T.is_float(dt) and 2 or 0, string.format("{'dim': %d}", dim - 1))
      end
    end
  end
end

-- ---- the oracle -------------------------------------------------------------

local ORACLE = [=[
import sys
import numpy as np

np.seterr(all="ignore")
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8,
      "i32": np.int32, "i64": np.int64, "bool": np.bool_}
# one ulp of each float dtype, relative; f64's a thousand: sums of thousands
# of terms in another order
ULP = {"f32": 2.0 ** -23, "f64": 2.0 ** -42, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}

def bf16_to_f32(u):
    u = np.asarray(u)
    return (np.atleast_1d(u).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(u.shape)

def f32_to_bf16(f):
    """float32 -> bf16 (as float32 values): nearest even, NaN kept quiet, as gpulua"""
    f = np.asarray(f, dtype=np.float32)
    shape = f.shape
    f = np.ascontiguousarray(f.reshape(-1))
    b = f.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(np.isnan(f), ((b >> 16) | 0x40) & 0xFFFF, r)
    return bf16_to_f32(r.astype(np.uint16)).reshape(shape)

def load(path, dt):
    a = np.load(path)
    return bf16_to_f32(a.view(np.uint16)) if dt == "bf16" else a

def isint(dt):
    return dt in ("i8", "u8", "i32", "i64", "bool")

def wide(a, dt):
    """the oracle's compute type: float64, or int64 for integers and bool"""
    return a.astype(np.int64) if isint(dt) else a.astype(np.float64)

def as_dtype(r, dt):
    if dt == "bf16":
        return f32_to_bf16(np.asarray(r, dtype=np.float64).astype(np.float32))
    return np.asarray(r).astype(NP[dt])

def norm(x, p, axis, keepdims):
    a = np.abs(x)
    if np.isinf(p):
        return np.max(a, axis=axis, keepdims=keepdims)
    return np.sum(a ** p, axis=axis, keepdims=keepdims) ** (1.0 / p)

def logsumexp(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True)
    s = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - s), axis=axis, keepdims=True)) + s
    r = np.where(np.isfinite(m), r, m)
    return r if keepdims else np.squeeze(r, axis=axis)

def softmax(x, axis, log):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return x - m - np.log(s) if log else e / s

def reduce(op, dt, x, e):
    axis, keep = e.get("axis"), e.get("keepdims", False)
    if op == "prod":
        return np.prod(x, axis=axis, keepdims=keep), "i64" if isint(dt) else dt
    if op == "argmin":
        if axis is None:
            return np.argmin(x) + 1, "i64"
        return np.argmin(x, axis=axis, keepdims=keep) + 1, "i64"
    if op in ("var", "std"):
        f = np.var if op == "var" else np.std
        return f(x, axis=axis, ddof=e.get("ddof", 1), keepdims=keep), dt
    if op == "norm":
        return norm(x, e.get("p", 2.0), axis, keep), dt
    if op == "logsumexp":
        return logsumexp(x, axis, keep), dt
    raise ValueError(op)

def ordered(a):
    """argmin of NaN-holding rows: NumPy's first NaN is gpulua's too"""
    return a

results = []

def C(name, op, dt, ins, out, tol, e):
    try:
        raw = [load(p, d) for p, d in ins]
        xs = [wide(a, d) for a, (p, d) in zip(raw, ins)]
        if op in ("prod", "argmin", "var", "std", "norm", "logsumexp"):
            ref, rdt = reduce(op, dt, xs[0], e)
        elif op == "cumsum":
            ref, rdt = np.cumsum(xs[0], axis=e["axis"]), "i64" if isint(dt) else dt
        elif op in ("softmax", "log_softmax"):
            ref, rdt = softmax(xs[0], e["axis"], op == "log_softmax"), dt
        elif op == "index_select":
            ref, rdt = np.take(raw[0], xs[1] - 1, axis=e["dim"]), dt
        elif op == "gather":
            x, i, d = raw[0], xs[1] - 1, e["dim"]
            # the index may be smaller than x along the other dims: x cut to it
            cut = tuple(slice(None) if k == d else slice(0, i.shape[k]) for k in range(x.ndim))
            ref, rdt = np.take_along_axis(x[cut], i, axis=d), dt
        elif op == "scatter_add":
            # one add at a time in C order of the index, each rounded to the
            # dtype (as the host does); CUDA's atomics add in another order:
            # the tolerance scales with the magnitudes added
            x, i, src, d = xs[0].copy(), xs[1] - 1, xs[2], e["dim"]
            src = src[tuple(slice(0, n) for n in i.shape)]
            mag = np.abs(x)
            for p in np.ndindex(*i.shape):
                q = list(p)
                q[d] = i[p]
                q = tuple(q)
                x[q] = x[q] + src[p] if isint(dt) else as_dtype(x[q] + src[p], dt).astype(np.float64)
                mag[q] += abs(src[p])
            ref, rdt = x, dt
        else:
            raise ValueError(op)
        got = load(*out)
        ref = as_dtype(ref, rdt)
        if got.shape != ref.shape:
            return results.append((name, "shape %s, numpy %s" % (got.shape, ref.shape)))
        if isint(rdt):
            if op == "scatter_add":
                ref = ref.astype(np.int64).astype(NP[rdt])   # wraps, as gpulua's
            bad = np.flatnonzero(got.astype(np.int64) != ref.astype(np.int64))
        else:
            g, r = got.astype(np.float64), ref.astype(np.float64)
            ok = (g == r) | (np.isnan(g) & np.isnan(r))
            if tol:
                # relative, with a floor of one: log_softmax and logsumexp near 0
                scale = np.maximum(np.abs(r), 1.0) if op in ("log_softmax", "logsumexp") else np.abs(r)
                if op == "scatter_add":
                    scale = mag.reshape(r.shape)
                ok |= np.abs(g - r) <= tol * ULP[rdt] * scale
            bad = np.flatnonzero(~ok)
        if len(bad):
            i = bad[0]
            return results.append((name, "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), got.size, i, got.reshape(-1)[i].item(), ref.reshape(-1)[i].item())))
        results.append((name, None))
    except Exception as ex:
        results.append((name, "oracle raised %s: %s" % (type(ex).__name__, ex)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("every reduction, scan, softmax and index op against NumPy", ORACLE)

O:close()
T.done()
