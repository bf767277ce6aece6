-- The views, joins and creation ops against NumPy: every dtype, contiguous
-- and strided (transposed, stepped) inputs, through .npy files (t:save here,
-- numpy.load in a python3 child that applies NumPy's equivalent and compares
-- bit for bit: a view or a copy moves elements, it computes nothing).  Runs
-- on whichever backend the suite runs.  Skips when no python3 with numpy is
-- found (apt install python3-numpy; GPULUA_PYTHON names one).
--
-- Parameters reach the oracle as gpulua takes them (1-based dims and
-- indices, string.sub's inclusive ranges); the oracle converts them itself.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local ALL = T.dtypes
local IRANGE = { i8 = { -128, 128 }, u8 = { 0, 256 }, i32 = { -100000, 100000 }, i64 = { -(1 << 40), 1 << 40 } }

local seed = 5000
local function rand(dt, shape)
  seed = seed + 1
  local o = { dtype = dt, seed = seed }
  if T.is_float(dt) then o.low, o.high = -100, 100 end
  if IRANGE[dt] then o.low, o.high = IRANGE[dt][1], IRANGE[dt][2] end
  return gpu.rand(shape, o)
end

-- ---- cases ----------------------------------------------------------------

local function save(t) return O:save(t) end

local py = N.pyval

-- name; op (the oracle's); ins (tensors); params (a Lua value for the
-- oracle); result (a tensor)
local function case(name, op, ins, params, result)
  local i = {}
  for k, t in ipairs(ins) do i[k] = save(t) end
  O:case(name, string.format("C(%q, %q, [%s], %s, %s)", name, op, table.concat(i, ", "), py(params),
                                    save(result)))
end

-- The inputs: a contiguous {5, 6, 7}, a transposed one (strides 1, 7, 42)
-- and a stepped slice of a bigger one.
local function inputs(dt)
  return {
    { "", rand(dt, { 5, 6, 7 }) },
    { " transposed", rand(dt, { 7, 6, 5 }):permute { 3, 2, 1 } },
    { " stepped", rand(dt, { 10, 6, 9 }):slice(1, 1, -1, 2):slice(3, 2, 8) },
  }
end

for _, dt in ipairs(ALL) do
  for _, inp in ipairs(inputs(dt)) do
    local tag, x = inp[1], inp[2]
    local function c(name, op, params, r) case(name .. " " .. dt .. tag, op, { x }, params, r) end
    c("transpose(1, 3)", "transpose", { 1, 3 }, x:transpose(1, 3))
    c("transpose(-1, 2)", "transpose", { -1, 2 }, x:transpose(-1, 2))
    c("permute{3, 1, 2}", "permute", { 3, 1, 2 }, x:permute { 3, 1, 2 })
    c("permute{2, 3, 1}", "permute", { 2, 3, 1 }, x:permute { 2, 3, 1 })
    c("unsqueeze(1)", "unsqueeze", 1, x:unsqueeze(1))
    c("unsqueeze(-1)", "unsqueeze", -1, x:unsqueeze(-1))
    c("unsqueeze(3)", "unsqueeze", 3, x:unsqueeze(3))
    c("select(2, 3)", "select", { 2, 3 }, x:select(2, 3))
    c("select(-1, -2)", "select", { -1, -2 }, x:select(-1, -2))
    c("slice(1, 2, 4)", "slice", { 1, 2, 4, 1 }, x:slice(1, 2, 4))
    c("slice(3, -5, -1, 2)", "slice", { 3, -5, -1, 2 }, x:slice(3, -5, -1, 2))
    c("slice(2, 0, 100, 4)", "slice", { 2, 0, 100, 4 }, x:slice(2, 0, 100, 4))
    for k, p in ipairs(x:split(2, 3)) do c("split(2, 3)[" .. k .. "]", "split", { 3, 2, k }, p) end
    for k, p in ipairs(x:split({ 1, 4, 1 }, 2)) do c("split({1, 4, 1}, 2)[" .. k .. "]", "split", { 2, { 1, 4, 1 }, k }, p) end
    for k, p in ipairs(x:chunk(3)) do c("chunk(3)[" .. k .. "]", "chunk", { 1, 3, k }, p) end
    for k, p in ipairs(x:chunk(4, -1)) do c("chunk(4, -1)[" .. k .. "]", "chunk", { -1, 4, k }, p) end
    c("reshape{30, 7}", "reshape", { 30, 7 }, x:reshape { 30, 7 })
    c("reshape{-1}", "reshape", { -1 }, x:reshape { -1 })
    c("reshape{7, -1, 3}", "reshape", { 7, -1, 3 }, x:reshape { 7, -1, 3 })
    c("reshape{5, 3, 2, 7}", "reshape", { 5, 3, 2, 7 }, x:reshape { 5, 3, 2, 7 })
    local m = x:select(3, 1)
    case("t() " .. dt .. tag, "t", { m }, nil, m:t())
    local one = x:slice(2, 3, 3):unsqueeze(1)   -- {1, 5, 1, 7}
    case("squeeze() " .. dt .. tag, "squeeze", { one }, nil, one:squeeze())
    case("squeeze(3) " .. dt .. tag, "squeeze", { one }, 3, one:squeeze(3))
    case("squeeze(2) " .. dt .. tag, "squeeze", { one }, 2, one:squeeze(2))
    case("expand{4, 5, 6, 7} " .. dt .. tag, "expand", { x }, { 4, 5, 6, 7 }, x:expand { 4, 5, 6, 7 })
    case("expand{5, 3, 7} " .. dt .. tag, "expand", { x:slice(2, 2, 2) }, { 5, 3, 7 }, x:slice(2, 2, 2):expand { 5, 3, -1 })
    local e = x:slice(2, 4, 4):expand { -1, 6, -1 }
    case("reshape of an expanded view " .. dt .. tag, "reshape", { e }, { 30, 7 }, e:reshape { 30, 7 })
  end
end

for _, dt in ipairs(ALL) do
  local a, b, c = rand(dt, { 4, 6, 5 }), rand(dt, { 6, 4, 5 }):transpose(1, 2), rand(dt, { 4, 12, 10 }):slice(3, 1, -1, 2):slice(2, 3, 8)
  local function cc(name, op, list, params, r) case(name .. " " .. dt, op, list, params, r) end
  cc("cat dim 1", "cat", { a, b, c }, 1, gpu.cat { a, b, c })
  cc("cat dim 2", "cat", { a, b, c:slice(2, 3, 5) }, 2, gpu.cat({ a, b, c:slice(2, 3, 5) }, 2))
  cc("cat dim -1", "cat", { a, c:slice(3, 2, 4) }, -1, gpu.cat({ a, c:slice(3, 2, 4) }, -1))
  cc("cat of one", "cat", { b }, 1, gpu.cat { b })
  for d = 1, 4 do
    cc("stack dim " .. d, "stack", { a, b, c }, d, gpu.stack({ a, b, c }, d))
  end
  cc("stack dim -1", "stack", { a, b }, -1, gpu.stack({ a, b }, -1))
  local out = rand(dt, { 3, 10, 6, 7 }):select(1, 2):slice(3, 2, 6)   -- {10, 6, 5}, strided
  gpu.cat({ a, b }, { out = out:slice(1, 2, -2) })
  cc("cat into a strided out", "cat", { a, b }, 1, out:slice(1, 2, -2))
end

for _, dt in ipairs(ALL) do
  for _, l in ipairs { { 0, 1, 5 }, { -3, 3.5, 11 }, { 1000, -2.5, 7 }, { 5, 5, 3 }, { 2, 7, 1 }, { -1, 1, 1001 },
                       { 0.1, 0.7, 13 } } do
    local a, b, n = l[1], l[2], l[3]
    local lo, hi = -math.huge, math.huge
    if T.is_int(dt) then lo, hi = T.int_range(dt) end
    -- out of an integer dtype's range a cast saturates (NumPy's wraps): not compared
    if math.min(a, b) >= lo and math.max(a, b) <= hi then case(string.format("linspace(%g, %g, %d) %s", a, b, n, dt), "linspace", {}, { a, b, n, dt },
         gpu.linspace(a, b, n, { dtype = dt })) end
  end
  for _, e in ipairs { { 4 }, { 3, 5 }, { 5, 2 }, { 1 } } do
    case(string.format("eye(%s) %s", table.concat(e, ", "), dt), "eye", {}, { e[1], e[2] or e[1], dt },
         gpu.eye(e[1], e[2], { dtype = dt }))
  end
end

-- zero-sized dims: views, joins, creation, elementwise ops, matmul over k = 0
for _, dt in ipairs(ALL) do
  local z = rand(dt, { 4, 0, 3 })
  local x = rand(dt, { 4, 5, 3 })
  local function c(name, op, ins, params, r) case(name .. " " .. dt .. " zero-sized", op, ins, params, r) end
  c("transpose(1, 2)", "transpose", { z }, { 1, 2 }, z:transpose(1, 2))
  c("permute{3, 2, 1}", "permute", { z }, { 3, 2, 1 }, z:permute { 3, 2, 1 })
  c("unsqueeze(2)", "unsqueeze", { z }, 2, z:unsqueeze(2))
  c("select(1, 2)", "select", { z }, { 1, 2 }, z:select(1, 2))
  c("slice(2, 1, -1)", "slice", { z }, { 2, 1, -1, 1 }, z:slice(2, 1, -1))
  c("slice(1, 3, 2) of a full one", "slice", { x }, { 1, 3, 2, 1 }, x:slice(1, 3, 2))
  c("slice(2, 9, 20, 2) of a full one", "slice", { x }, { 2, 9, 20, 2 }, x:slice(2, 9, 20, 2))
  c("reshape{0, 12}", "reshape", { z }, { 0, 12 }, z:reshape { 0, 12 })
  c("reshape{3, 0, 4}", "reshape", { z }, { 3, 0, 4 }, z:reshape { 3, 0, 4 })
  c("expand{4, 0, 3}", "expand", { x:slice(2, 1, 1) }, { 4, 0, 3 }, x:slice(2, 1, 1):expand { 4, 0, 3 })
  for k, p in ipairs(z:split(2, 2)) do c("split(2, 2)[" .. k .. "]", "split", { z }, { 2, 2, k }, p) end
  for k, p in ipairs(x:split({ 2, 0, 3 }, 2)) do c("split({2, 0, 3}, 2)[" .. k .. "]", "split", { x }, { 2, { 2, 0, 3 }, k }, p) end
  c("cat with a zero-sized part", "cat", { x, z, x }, 2, gpu.cat({ x, z, x }, 2))
  c("cat of zero-sized parts", "cat", { z, z }, 1, gpu.cat({ z, z }, 1))
  c("stack", "stack", { z, z, z }, 2, gpu.stack({ z, z, z }, 2))
  c("contiguous of a transposed view", "transpose", { z }, { 1, 3 }, z:transpose(1, 3):contiguous())
  c("eye(3, 0)", "eye", {}, { 3, 0, dt }, gpu.eye(3, 0, { dtype = dt }))
  c("eye(0)", "eye", {}, { 0, 0, dt }, gpu.eye(0, { dtype = dt }))
  c("linspace(0, 1, 0)", "linspace", {}, { 0, 1, 0, dt }, gpu.linspace(0, 1, 0, { dtype = dt }))
  if dt ~= "bool" then
    c("add", "add", { z, z }, nil, z + z)
    c("add, broadcast {4, 0, 3} {3}", "add", { z, x:select(1, 1):select(1, 1) }, nil,
      z + x:select(1, 1):select(1, 1))
    local a, b = rand(dt, { 3, 0 }), rand(dt, { 0, 4 })
    if dt ~= "u8" then
      c("matmul {3, 0} @ {0, 4}", "matmul", { a, b }, nil, gpu.matmul(a, b))
      c("matmul {0, 3} @ {3, 4}", "matmul", { rand(dt, { 0, 3 }), rand(dt, { 3, 4 }) }, nil,
        gpu.matmul(rand(dt, { 0, 3 }), rand(dt, { 3, 4 })))
    end
  end
  c("eq", "eq", { z, z }, nil, z:eq(z))
  c("where", "where", { z:eq(z), z, z }, nil, gpu.where(z:eq(z), z, z))
end

-- ---- the oracle -----------------------------------------------------------

local ORACLE = [=[
import sys
import numpy as np

def load(path, dt):
    a = np.load(path)
    return a.view(np.uint16) if dt == "bf16" else a

NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8,
      "i32": np.int32, "i64": np.int64, "bool": np.bool_}

def bf16_bits(x):
    """float64 -> bf16 bits, rounded once to nearest even"""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    r = np.ldexp(np.round(m * 256), e - 8).astype(np.float32)
    return (r.view(np.uint32) >> 16).astype(np.uint16)

def as_dtype(x, dt):
    return bf16_bits(x) if dt == "bf16" else x.astype(NP[dt])

def linspace(p):
    a, b, n, dt = p
    if dt == "bf16":
        return bf16_bits(np.linspace(a, b, n))
    return np.linspace(a, b, n, dtype=NP[dt])

def dim(d, nd):
    """a 1-based (or negative) gpulua dim as a NumPy axis"""
    return d + nd if d < 0 else d - 1

def sub(n, i, j):
    """string.sub's [i, j] of n elements, as a Python start and stop"""
    if i < 0:
        i = max(n + i + 1, 1)
    elif i == 0:
        i = 1
    if j < 0:
        j = n + j + 1
    elif j > n:
        j = n
    return i - 1, max(j, i - 1)

def pieces(x, axis, sizes):
    """np.split at the boundaries of the given sizes"""
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)

def split(x, p):
    d, size, k = p
    ax = dim(d, x.ndim)
    n = x.shape[ax]
    sizes = size if isinstance(size, list) else [size] * (n // size) + ([n % size] if n % size else [])
    return pieces(x, ax, sizes)[k - 1]

def chunk(x, p):
    d, c, k = p
    ax = dim(d, x.ndim)
    n = x.shape[ax]
    each = -(-n // c)
    return split(x, [d, each, k])

def slice_(x, p):
    d, i, j, step = p
    ax = dim(d, x.ndim)
    a, b = sub(x.shape[ax], i, j)
    idx = [slice(None)] * x.ndim
    idx[ax] = slice(a, b, step)
    return x[tuple(idx)]

def squeeze(x, p):
    if p is None:
        return np.squeeze(x)
    ax = dim(p, x.ndim)
    return np.squeeze(x, ax) if x.shape[ax] == 1 else x

F = {
    "transpose": lambda x, p: np.swapaxes(x, dim(p[0], x.ndim), dim(p[1], x.ndim)),
    "t": lambda x, p: x.T,
    "permute": lambda x, p: np.transpose(x, [dim(d, x.ndim) for d in p]),
    "unsqueeze": lambda x, p: np.expand_dims(x, dim(p, x.ndim + 1)),
    "squeeze": squeeze,
    "expand": lambda x, p: np.broadcast_to(x, p),
    "select": lambda x, p: np.take(x, p[1] - 1 if p[1] > 0 else p[1], axis=dim(p[0], x.ndim)),
    "slice": slice_,
    "split": split,
    "chunk": chunk,
    "reshape": lambda x, p: x.reshape(p),
    "linspace": lambda xs, p: linspace(p),
    "eye": lambda xs, p: as_dtype(np.eye(p[0], p[1]), p[2]),
    "add": lambda xs, p: xs[0] + xs[1],
    "matmul": lambda xs, p: np.matmul(xs[0], xs[1]),
    "eq": lambda xs, p: np.equal(xs[0], xs[1]),
    "where": lambda xs, p: np.where(xs[0], xs[1], xs[2]),
    "cat": lambda xs, p: np.concatenate(xs, axis=dim(p, xs[0].ndim)),
    "stack": lambda xs, p: np.stack(xs, axis=dim(p, xs[0].ndim + 1)),
}
LISTS = ("cat", "stack", "linspace", "eye", "add", "matmul", "eq", "where")

results = []

def same(got, ref):
    """bit for bit, as the element size reads them"""
    if got.dtype == np.bool_ or ref.dtype == np.bool_:
        return np.array_equal(got.astype(np.bool_), ref.astype(np.bool_))
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    return np.array_equal(np.ascontiguousarray(got).view(u), np.ascontiguousarray(ref.astype(got.dtype)).view(u))

def C(name, op, ins, params, out):
    try:
        xs = [load(p, d) for p, d in ins]
        ref = np.asarray(F[op](xs, params) if op in LISTS else F[op](*xs, params))
        got = load(*out)
        if got.shape != ref.shape:
            return results.append((name, "shape %s, numpy %s" % (got.shape, ref.shape)))
        if not same(got, ref):
            bad = np.flatnonzero(np.asarray(got).reshape(-1) != np.asarray(ref).astype(got.dtype).reshape(-1))
            i = bad[0] if len(bad) else 0
            return results.append((name, "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), got.size, i, got.reshape(-1)[i].item(), ref.reshape(-1)[i].item())))
        results.append((name, None))
    except Exception as e:
        results.append((name, "oracle raised %s: %s" % (type(e).__name__, e)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("every view, join and creation op against NumPy", ORACLE)

O:close()
T.done()
