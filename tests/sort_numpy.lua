-- sort, argsort, topk, cumprod, flip, roll, tril and triu against NumPy
-- (issue 34): every dtype,
-- NaN, infinities, signed zeros and ties, along every dim, strided inputs,
-- rows longer than the GPU's shared-memory chunk, empty and 0-dim tensors,
-- and the errors of bad dims and k.  Runs on whichever backend the suite
-- runs, so the host loops and the CUDA kernels meet the same oracle.
--
-- The oracle: np.argsort(kind='stable') ascending (NaN last, as gpulua);
-- descending is PyTorch's stable descending sort (NaN first, equal values
-- in their order), as np.lexsort of (-x, not NaN).  Indices are 1-based.
-- Values and indices must match exactly; cumprod (in double, rounded once)
-- within a few ulps of NumPy's float64 cumprod rounded to the dtype.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local DTYPES = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" }
local pyval = N.pyval

-- values with ties, NaN, the infinities and both zeros (floats); small
-- integers (ties); n of them, from a seed
local function values(dt, n, seed)
  local r, x = {}, seed
  local special = { 0 / 0, 1 / 0, -1 / 0, 0.0, -0.0, 0.5, -0.5, 2 }
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    local k = x % 11
    if dt == "bool" then
      r[i] = k % 2 == 0
    elseif T.is_float(dt) then
      r[i] = k < 4 and special[(x // 11) % #special + 1] or (k - 7) * 0.25
    elseif dt == "u8" then
      r[i] = k * 20
    else
      r[i] = k - 5
    end
  end
  return r
end

local function tensor(dt, shape, seed)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return gpu.tensor(values(dt, n, seed), { dtype = dt }):view(shape)
end

-- a case: name, op, dt, the input, the results, the options (a python dict)
local function case(name, op, dt, x, res, opts)
  local r = {}
  for i, t in ipairs(res) do r[i] = O:save(t) end
  O:case(name, string.format("C(%q, %q, %q, %s, [%s], %s)", name, op, dt, O:save(x), table.concat(r, ", "), opts))
end

local seed = 34
local function sorts(dt, x, dim, tag)
  local axis = dim > 0 and dim - 1 or #x.shape + dim
  local v, i = x:sort(dim)
  case("sort " .. tag, "sort", dt, x, { v, i }, string.format("{'axis': %d, 'desc': False}", axis))
  v, i = x:sort { dim = dim, descending = true }
  case("sort descending " .. tag, "sort", dt, x, { v, i }, string.format("{'axis': %d, 'desc': True}", axis))
  case("argsort " .. tag, "argsort", dt, x, { x:argsort(dim) }, string.format("{'axis': %d, 'desc': False}", axis))
  local len = #x.shape > 0 and x.shape[axis + 1] or 1
  local seen = {}
  for _, k in ipairs { #x.shape > 0 and 0 or 1, math.min(1, len), math.min(3, len), len } do
    if seen[k] then goto next end
    seen[k] = true
    v, i = x:topk(k, dim)
    case(string.format("topk %d %s", k, tag), "topk", dt, x, { v, i },
         string.format("{'axis': %d, 'desc': True, 'k': %d}", axis, k))
    v, i = x:topk(k, { dim = dim, largest = false })
    case(string.format("topk %d smallest %s", k, tag), "topk", dt, x, { v, i },
         string.format("{'axis': %d, 'desc': False, 'k': %d}", axis, k))
    ::next::
  end
end

for _, dt in ipairs(DTYPES) do
  seed = seed + 1
  local m = tensor(dt, { 7, 33 }, seed)
  sorts(dt, m, 2, dt .. " {7,33} dim 2")
  sorts(dt, m, 1, dt .. " {7,33} dim 1")
  sorts(dt, m:narrow(2, 3, 20):t(), -1, dt .. " strided, transposed")
  local long = tensor(dt, { 2, 9000 }, seed + 100)
  sorts(dt, long, -1, dt .. " {2,9000} rows longer than a chunk")
  -- the cuda backend's radix paths: one long row, many rows, strided rows
  sorts(dt, tensor(dt, { 5000 }, seed + 300), 1, dt .. " {5000} one long row")
  sorts(dt, tensor(dt, { 3, 2100, 2 }, seed + 400), 2, dt .. " {3,2100,2} dim 2, strided rows")
  sorts(dt, long:t(), 1, dt .. " {9000,2} transposed, dim 1")
  -- topk's paths on cuda: a selection for k up to 256 (any k on rows of up
  -- to 2048), a sort past it
  for _, k in ipairs { 16, 256, 257, 2049, 9000 } do
    local v, i = long:topk(k)
    case(string.format("topk %d %s {2,9000}", k, dt), "topk", dt, long, { v, i },
         string.format("{'axis': 1, 'desc': True, 'k': %d}", k))
    v, i = long:t():topk(k, { dim = 1, largest = false })
    case(string.format("topk %d smallest %s {9000,2} dim 1", k, dt), "topk", dt, long:t(), { v, i },
         string.format("{'axis': 0, 'desc': False, 'k': %d}", k))
  end
  sorts(dt, tensor(dt, { 3, 1, 5 }, seed + 200):expand({ 3, 4, 5 }), 2, dt .. " expanded, all ties")
  sorts(dt, tensor(dt, { 3, 0 }, seed), 2, dt .. " empty rows")
  sorts(dt, tensor(dt, { 0, 3 }, seed), 2, dt .. " no rows")
  local s = gpu.tensor(values(dt, 1, seed)[1], { dtype = dt })
  sorts(dt, s, -1, dt .. " 0-dim")
end

-- cumprod: floats near 1, so the products stay finite for a while;
-- integers small, so i64 wraps as NumPy's does
local function cumvals(dt, shape)
  seed = seed + 1
  if dt == "bool" then return gpu.rand(shape, { dtype = "bool", seed = seed }) end
  if T.is_float(dt) then return gpu.rand(shape, { dtype = dt, low = 0.6, high = 1.6, seed = seed }) end
  if dt == "u8" then return gpu.rand(shape, { dtype = dt, low = 0, high = 4, seed = seed }) end
  return gpu.rand(shape, { dtype = dt, low = -3, high = 4, seed = seed })
end
for _, dt in ipairs(DTYPES) do
  local m = cumvals(dt, { 6, 70 })
  for _, dim in ipairs { 1, 2, -1 } do
    local axis = dim > 0 and dim - 1 or 1
    case(string.format("cumprod %s dim %d", dt, dim), "cumprod", dt, m, { m:cumprod(dim) },
         string.format("{'axis': %d}", axis))
  end
  local st = m:narrow(2, 5, 40):t()
  case("cumprod " .. dt .. " strided", "cumprod", dt, st, { st:cumprod { dim = 1 } }, "{'axis': 0}")
  local e = cumvals(dt, { 3, 0 })
  case("cumprod " .. dt .. " empty", "cumprod", dt, e, { e:cumprod(2) }, "{'axis': 1}")
  if T.is_float(dt) then
    local sp = tensor(dt, { 4, 9 }, seed)
    case("cumprod " .. dt .. " NaN, inf, zeros", "cumprod", dt, sp, { sp:cumprod(2) }, "{'axis': 1}")
  end
end

-- flip, roll, tril, triu: exact; contiguous, strided, batched, empty
local function axes(dims, nd)
  local r = {}
  for i, d in ipairs(dims) do r[i] = tostring(d > 0 and d - 1 or nd + d) end
  return "(" .. table.concat(r, ", ") .. (#r == 1 and ",)" or ")")
end
for _, dt in ipairs(DTYPES) do
  seed = seed + 1
  local m = tensor(dt, { 4, 5, 6 }, seed)
  local inputs = { { m, "" }, { m:narrow(3, 2, 4):transpose(1, 3), " strided" }, { tensor(dt, { 3, 0, 2 }, seed), " empty" } }
  for _, inp in ipairs(inputs) do
    local x, tag = inp[1], dt .. inp[2]
    for _, dims in ipairs { { 1 }, { -1 }, { 1, 3 }, { 3, 2, 1 } } do
      case("flip " .. axes(dims, 3) .. " " .. tag, "flip", dt, x, { x:flip(dims) }, string.format("{'axis': %s}", axes(dims, 3)))
    end
    case("flip one dim as a number " .. tag, "flip", dt, x, { x:flip(2) }, "{'axis': (1,)}")
    for _, sh in ipairs { { 1, { 1 } }, { -2, { 3 } }, { 7, { 2 } }, { { 1, -3 }, { 1, 3 } }, { { 2, 5, -1 }, { 3, 2, 1 } } } do
      local shifts, dims = sh[1], sh[2]
      local shpy = type(shifts) == "table" and "(" .. table.concat(shifts, ", ") .. ")" or tostring(shifts)
      case("roll " .. shpy .. " " .. axes(dims, 3) .. " " .. tag, "roll", dt, x, { x:roll(shifts, dims) },
           string.format("{'shift': %s, 'axis': %s}", shpy, axes(dims, 3)))
    end
    for _, sh in ipairs { 0, 3, -4, 121 } do
      case("roll flat " .. sh .. " " .. tag, "roll", dt, x, { x:roll(sh) }, string.format("{'shift': %d, 'axis': None}", sh))
    end
    for _, k in ipairs { 0, 1, -2, 7, -9 } do
      case("tril " .. k .. " " .. tag, "tril", dt, x, { x:tril(k) }, string.format("{'k': %d}", k))
      case("triu " .. k .. " " .. tag, "triu", dt, x, { x:triu(k) }, string.format("{'k': %d}", k))
    end
  end
  local sq = tensor(dt, { 5, 7 }, seed + 1)
  case("tril default " .. dt, "tril", dt, sq, { sq:tril() }, "{'k': 0}")
  case("triu default " .. dt, "triu", dt, sq, { sq:triu() }, "{'k': 0}")
  local z = gpu.tensor(values(dt, 1, seed)[1], { dtype = dt })
  case("flip 0-dim " .. dt, "flip", dt, z, { z:flip({}) }, "{'axis': ()}")
  case("roll 0-dim " .. dt, "roll", dt, z, { z:roll(3) }, "{'shift': 3, 'axis': None}")
end

local ORACLE = [=[
import sys
import numpy as np

np.seterr(all="ignore")
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8,
      "i32": np.int32, "i64": np.int64, "bool": np.bool_}
TOL = {"f32": 4e-7, "f64": 1e-15, "f16": 1e-3, "bf16": 8e-3}
FLOATS = ("f32", "f64", "f16", "bf16")

def bf16_to_f32(u):
    return (u.astype(np.uint32) << 16).view(np.float32)

def f32_to_bf16(f):
    f = np.ascontiguousarray(f, dtype=np.float32)
    b = f.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(np.isnan(f), ((b >> 16) | 0x40) & 0xFFFF, r)
    return bf16_to_f32(r.astype(np.uint16))

def load(p):
    path, dt = p
    a = np.load(path)
    return bf16_to_f32(a.reshape(-1).view(np.uint16)).reshape(a.shape) if dt == "bf16" else a

def order(x, axis, desc):
    x = np.asarray(x)
    if x.ndim == 0:
        return np.zeros((), np.int64)
    if not desc:
        return np.argsort(x, axis=axis, kind="stable")
    f = x.astype(np.float64)
    # lexsort's last key is the first: NaN first, then the largest, ties stable
    return np.lexsort((-f, ~np.isnan(f)), axis=axis)

def same(a, b):
    if a.shape != b.shape:
        return "shape %s, numpy %s" % (a.shape, b.shape)
    if a.dtype.kind == "f":
        eq = (a == b) | (np.isnan(a) & np.isnan(b))
    else:
        eq = a == b
    if not np.all(eq):
        i = np.flatnonzero(~np.asarray(eq))[0]
        return "differs at flat %d: gpulua %r, numpy %r" % (i, a.reshape(-1)[i].item(), b.reshape(-1)[i].item())
    return None

def close(g, r, dt):
    if dt not in FLOATS:
        return same(g, r)
    if g.shape != r.shape:
        return "shape %s, numpy %s" % (g.shape, r.shape)
    ok = (g == r) | (np.isnan(g) & np.isnan(r)) | (np.abs(g.astype(np.float64) - r) <= 4 * TOL[dt] * np.abs(r))
    if not np.all(ok):
        i = np.flatnonzero(~ok)[0]
        return "differs at flat %d: gpulua %r, numpy %r" % (i, g.reshape(-1)[i].item(), r.reshape(-1)[i].item())
    return None

def rounded(r, dt):
    if dt == "bf16":
        return f32_to_bf16(r.astype(np.float32))
    return r.astype(NP[dt])

results = []

def C(name, op, dt, x, res, o):
    try:
        x = load(x)
        got = [load(r) for r in res]
        if op == "cumprod":
            if dt in FLOATS:
                ref = rounded(np.cumprod(x.astype(np.float64), axis=o["axis"]), dt)
            else:
                ref = np.cumprod(x.astype(np.int64), axis=o["axis"])
            if got[0].dtype != (np.int64 if dt not in FLOATS else got[0].dtype):
                return results.append((name, "result dtype %s" % got[0].dtype))
            err = close(got[0], ref, dt)
            return results.append((name, err))
        if op in ("flip", "roll", "tril", "triu"):
            if op == "flip":
                ref = np.flip(x, axis=o["axis"]) if x.ndim else x
            elif op == "roll":
                ref = np.roll(x, o["shift"], axis=o["axis"])
            else:
                ref = getattr(np, op)(x, o["k"])
            return results.append((name, same(got[0], np.asarray(ref).astype(got[0].dtype)) if got[0].dtype == x.dtype
                                   else "dtype %s" % got[0].dtype))
        idx = order(x, o["axis"], o["desc"])
        if x.ndim == 0:
            val = x
        else:
            val = np.take_along_axis(x, idx, axis=o["axis"])
        if op == "topk":
            k = o["k"]
            if x.ndim > 0:
                sl = [slice(None)] * x.ndim
                sl[o["axis"]] = slice(0, k)
                idx, val = idx[tuple(sl)], val[tuple(sl)]
        want = [idx + 1] if op == "argsort" else [val, idx + 1]
        if got[-1].dtype != np.int64:
            return results.append((name, "indices of dtype %s" % got[-1].dtype))
        for g, w in zip(got, want):
            err = same(g, w)
            if err:
                return results.append((name, err))
        results.append((name, None))
    except Exception as e:
        results.append((name, "oracle raised %s: %s" % (type(e).__name__, e)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("sort, argsort, topk, cumprod, flip, roll, tril, triu against NumPy", ORACLE)

T.test("sort: forms, result dtypes, stable flag", function()
  local x = gpu.tensor({ { 3, 1, 2 }, { 1, 1, 0 } }, { dtype = "f32" })
  local v, i = x:sort()
  T.is({ v:totable(), i:totable(), i.dtype }, { { { 1, 2, 3 }, { 0, 1, 1 } }, { { 2, 3, 1 }, { 3, 1, 2 } }, "i64" },
       "the last dim by default")
  local v2, i2 = x:sort(2, { descending = true, stable = true })
  T.is({ v2:totable(), i2:totable() }, { { { 3, 2, 1 }, { 1, 1, 0 } }, { { 1, 3, 2 }, { 1, 2, 3 } } },
       "dim first, then the options")
  T.is(x:sort { dim = 1 }:totable(), { { 1, 1, 0 }, { 3, 1, 2 } }, "dim in the options")
  T.is(x:argsort { stable = false }:totable(), { { 2, 3, 1 }, { 3, 1, 2 } }, "stable = false is stable too")
  local tv, ti = x:topk(2, 1, { largest = false, sorted = false })
  T.is({ tv:totable(), ti:totable() }, { { { 1, 1, 0 }, { 3, 1, 2 } }, { { 2, 1, 2 }, { 1, 2, 1 } } }, "topk's forms")
  T.ok(ti:is_contiguous(), "topk's indices are a tensor of their own")
end)

T.test("bad input: dims, k and options named, at the script's line", function()
  local x = gpu.ones({ 2, 3 })
  T.raises_at(function() return x:sort(3) end, "dim 3 out of range for a 2%-dim tensor", "sort dim out of range")
  T.raises_at(function() return x:sort(0) end, "dim 0 out of range", "sort dim 0 (dims start at 1)")
  T.raises_at(function() return x:argsort { dim = 1.5 } end, "integer dim expected", "a fractional dim")
  T.raises_at(function() return x:sort(1, { dim = 2 }) end, "sort: dim given twice", "dim twice")
  T.raises_at(function() return x:sort { descending = 1 } end, "bad option 'descending' to 'sort' %(boolean expected",
              "descending a number")
  T.raises_at(function() return x:sort { order = 1 } end, "unknown option 'order'", "a misspelt option")
  T.raises_at(function() return x:topk(4) end, "k = 4 is out of range for dim 2 of size 3", "k too large")
  T.raises_at(function() return x:topk(-1) end, "k = %-1 is out of range", "k negative")
  T.raises_at(function() return x:topk("a") end, "bad argument #1 to 'topk'", "k not a number")
  T.raises_at(function() return x:topk(1, { largest = "yes" }) end, "bad option 'largest' to 'topk'", "largest a string")
  T.raises_at(function() return gpu.tensor(1):topk(0) end, "k = 0 is out of range for a 0%-dim tensor", "0-dim topk(0)")
  T.raises_at(function() return gpu.tensor(1):sort(2) end, "dim 2 out of range for a 1%-dim tensor", "0-dim: dim 1 only")
  T.raises_at(function() return x:cumprod() end, "bad argument #1 to 'cumprod'", "cumprod without dim")
  T.raises_at(function() return x:cumprod { dim = 3 } end, "dim 3 out of range", "cumprod dim out of range")
  T.raises_at(function() return x:cumprod(1, { out = gpu.ones({ 2, 3 }, { dtype = "i32" }) }) end,
              "does not match the result", "cumprod into an out of another dtype")
end)

T.test("flip, roll, tril, triu: bad input named, at the script's line", function()
  local x = gpu.ones({ 2, 3 })
  T.raises_at(function() return x:flip(3) end, "dim 3 out of range for a 2%-dim tensor", "flip dim out of range")
  T.raises_at(function() return x:flip({ 1, -2 }) end, "flip: dim 1 given twice", "flip a dim twice")
  T.raises_at(function() return x:flip("a") end, "integer or table of dims expected", "flip dims a string")
  T.raises_at(function() return x:flip({ 1.5 }) end, "integer dim expected", "flip a fractional dim")
  T.raises_at(function() return x:roll({ 1, 2 }, { 1 }) end, "roll: 2 shifts for 1 dims", "roll shifts and dims differ")
  T.raises_at(function() return x:roll({ 1, 2 }) end, "roll: 2 shifts without dims", "roll shifts without dims")
  T.raises_at(function() return x:roll(0.5, 1) end, "integer shift expected", "roll a fractional shift")
  T.raises_at(function() return x:roll(1, 0) end, "dim 0 out of range", "roll dim 0")
  T.raises_at(function() return gpu.ones({ 3 }):tril() end, "tril needs a tensor of at least 2 dims", "tril of 1-D")
  T.raises_at(function() return x:triu(0.5) end, "integer k expected", "triu a fractional k")
  T.raises_at(function() return x:triu(1, { colour = 1 }) end, "unknown option 'colour'", "triu's options")
end)

O:close()
T.done()
