-- The shape ops of issue 34 against NumPy: flatten, tile, diag, nonzero,
-- masked_select, amax, amin, in every dtype, on contiguous, transposed and
-- stepped inputs, empty and 0-dim ones (gpulua's results saved as .npy, a
-- python3 child applies NumPy's equivalent and compares).  Then the queries
-- (size, stride, dim), bad input, and the sync that nonzero and
-- masked_select are.  Skips the NumPy part without a python3 with numpy.
local gpu = require "gpu"
local T = require "gpu.test"

-- ---- queries and bad input (no NumPy needed) ------------------------------

T.test("size, stride, dim", function()
  local t = gpu.zeros(2, 3, 4)
  T.is(t:size(), { 2, 3, 4 }, "size(): the shape")
  T.is({ t:size(1), t:size(-1), t:size(2) }, { 2, 4, 3 }, "size(d), negative d from the end")
  T.is(t:stride(), { 12, 4, 1 }, "stride(): in elements")
  T.is(t:permute(3, 1, 2):stride(), { 1, 12, 4 }, "stride of a permuted view")
  T.is(t:slice(3, 1, -1, 2):stride(-1), 2, "stride(-1) of a stepped view")
  T.is(t:expand(5, 2, 3, 4):stride(1), 0, "stride 0 of an expanded dim")
  T.is({ t:dim(), gpu.tensor(1.5):dim(), gpu.zeros(0):dim() }, { 3, 0, 1 }, "dim()")
  T.is(gpu.tensor(1.5):size(), {}, "size() of a 0-dim tensor")
  T.is(t:size(), t.shape, "size() is t.shape")
end)

T.test("bad input: clear errors at the script's line", function()
  local t = gpu.zeros(2, 3)
  T.raises_at(function() t:size(3) end, "bad argument #1 to 'size' %(dim 3 out of range for a 2%-dim tensor", "size(3)")
  T.raises_at(function() t:stride(0) end, "dim 0 out of range", "stride(0)")
  T.raises_at(function() gpu.tensor(1.0):size(1) end, "dim 1 out of range for a 0%-dim tensor", "size(1) of 0-dim")
  T.raises_at(function() t:size("x") end, "integer dim expected, got string", "size('x')")
  T.raises_at(function() gpu.zeros(2, 3, 4):flatten(3, 1) end, "end dim 1 comes before start dim 3", "flatten(3, 1)")
  T.raises_at(function() t:flatten(4) end, "dim 4 out of range", "flatten(4)")
  T.raises_at(function() t:tile(-1) end, "reps%[1%] must be non%-negative, got %-1", "tile(-1)")
  T.raises_at(function() t:tile() end, "reps expected", "tile()")
  T.raises_at(function() t:tile(1.5) end, "reps%[1%] must be an integer, got 1.5", "tile(1.5)")
  T.raises_at(function() gpu.zeros(2, 2, 2, 2, 2):tile(2, 2, 2, 2, 2) end,
              "too many dims: the dims and the reps other than 1 come to more than 8", "tile: too many dims")
  T.raises_at(function() gpu.zeros(2, 2, 2):diag() end, "diag: needs a 1%-D or 2%-D tensor, got 3 dims", "diag of 3-D")
  T.raises_at(function() gpu.tensor(1.0):diag() end, "diag: needs a 1%-D or 2%-D tensor, got 0 dims", "diag of 0-D")
  T.raises_at(function() t:diag(0.5) end, "diagonal", "diag(0.5)")
  T.raises_at(function() t:amax(3) end, "dim 3 out of range", "amax(3)")
  T.raises_at(function() t:amax({ 1, 1 }) end, "dim 1 appears twice", "amax{1, 1}")
  T.raises_at(function() t:amax("x") end, "dim or table of dims expected", "amax('x')")
  T.raises_at(function() t:amin(1, { keep = true }) end, "unknown option 'keep'", "amin: unknown option")
  T.raises_at(function() gpu.zeros(2, 0):amax(2) end, "amax: dim 2 has size 0", "amax over an empty dim")
  T.raises_at(function() gpu.zeros(2, { dtype = "bool" }):amax() end, "amax: not supported for bool", "amax of bool")
  T.raises_at(function() t:masked_select(gpu.ones(2, 3)) end, "mask must be bool, got f32", "a float mask")
  T.raises_at(function() t:masked_select(gpu.ones(2, { dtype = "bool" })) end,
              "mask shape {2} does not broadcast with {2,3}", "a mask that does not broadcast")
  T.raises_at(function() t:masked_select(gpu.ones(2, 3, { dtype = "bool", device = "host" })) end, "memory",
              "a mask in other memory")
  T.raises_at(function() t:masked_select(5) end, "gpu.Tensor expected", "a number as mask")
end)

T.test("nonzero and masked_select are syncs, refused in a nosync scope", function()
  local t = gpu.tensor({ { 0, 1 }, { 2, 0 } })
  local before = gpu.stats().syncs
  T.is(t:nonzero():totable(), { { 1, 2 }, { 2, 1 } }, "nonzero: 1-based indices in C order")
  T.ok(gpu.stats().syncs > before, "nonzero counts a sync")
  before = gpu.stats().syncs
  local r = t:masked_select(t:gt(0))
  T.ok(gpu.stats().syncs > before, "masked_select counts a sync")
  T.is(r:totable(), { 1, 2 }, "masked_select values")
  do
    local _ <close> = gpu.nosync()
    T.raises(function() t:nonzero() end, "sync", "nonzero inside gpu.nosync() raises")
    T.raises(function() t:masked_select(t:gt(0)) end, "sync", "masked_select inside gpu.nosync() raises")
    T.is(t:size(), { 2, 2 }, "size is no sync")
    T.is(t:amax():dim(), 0, "amax is no sync")
  end
end)

T.test("the results are new tensors, not views", function()
  local m = gpu.arange(1, 10, { dtype = "f32" }):view(3, 3)
  local d, tl, a, s = m:diag(), m:tile(1, 1), m:amax({}), gpu.tensor(2.5)
  local sa = s:amax()
  s:fill(0)
  T.is(sa:item(), 2.5, "amax of a 0-dim tensor is a copy")
  m:fill(0)
  T.is(d:totable(), { 1, 5, 9 }, "diag of a 2-D tensor is a copy")
  T.is(tl:sum():item(), 45.0, "tile(1, 1) is a copy")
  T.is(a:item(), 9.0, "amax{} reduces every dim, as torch.amax(dim = ())")
  T.is(gpu.arange(6):view(2, 3):flatten():totable(), { 0, 1, 2, 3, 4, 5 }, "flatten values")
  local x = gpu.arange(6):view(2, 3)
  T.is(x:t():flatten():totable(), { 0, 3, 1, 4, 2, 5 }, "flatten of a transposed view copies in C order")
  T.is(x:amax(1, { keepdim = true }).shape, { 1, 3 }, "amax(dim, {keepdim})")
  T.is(x:amax { keepdim = true }.shape, { 1, 1 }, "amax{keepdim} reduces all and keeps them")
  T.is(x:amin(2):totable(), { 0, 3 }, "amin(2)")
end)

-- ---- against NumPy --------------------------------------------------------

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the rest without a python3 with numpy

local IRANGE = { i8 = { -128, 128 }, u8 = { 0, 256 }, i32 = { -100000, 100000 }, i64 = { -(1 << 40), 1 << 40 } }
local seed = 9100
local function rand(dt, shape, sparse)
  seed = seed + 1
  local o = { dtype = dt, seed = seed }
  if T.is_float(dt) then o.low, o.high = -100, 100 end
  if IRANGE[dt] then o.low, o.high = IRANGE[dt][1], IRANGE[dt][2] end
  if sparse and dt ~= "bool" then
    -- about half zeros, for nonzero
    o.low, o.high = -1, 2
    if dt == "u8" then o.low = 0 end
  end
  return gpu.rand(shape, o)
end

local function case(name, op, ins, params, result)
  local i = {}
  for k, t in ipairs(ins) do i[k] = O:save(t) end
  O:case(name, string.format("C(%q, %q, [%s], %s, %s)", name, op, table.concat(i, ", "), N.pyval(params),
                             O:save(result)))
end

local function inputs(dt, sparse)
  return {
    { "", rand(dt, { 5, 6, 7 }, sparse) },
    { " transposed", rand(dt, { 7, 6, 5 }, sparse):permute(3, 2, 1) },
    { " stepped", rand(dt, { 10, 6, 9 }, sparse):slice(1, 1, -1, 2):slice(3, 2, 8) },
    { " empty", rand(dt, { 4, 0, 3 }, sparse) },
  }
end

for _, dt in ipairs(T.dtypes) do
  for _, inp in ipairs(inputs(dt, false)) do
    local tag, x = inp[1], inp[2]
    local function c(name, op, params, r, ins) case(name .. " " .. dt .. tag, op, ins or { x }, params, r) end
    c("flatten()", "flatten", { 1, -1 }, x:flatten())
    c("flatten(2)", "flatten", { 2, -1 }, x:flatten(2))
    c("flatten(1, 2)", "flatten", { 1, 2 }, x:flatten(1, 2))
    c("flatten(-2, -1)", "flatten", { -2, -1 }, x:flatten(-2, -1))
    c("tile(2)", "tile", { 2 }, x:tile(2))
    c("tile(2, 1, 3)", "tile", { 2, 1, 3 }, x:tile(2, 1, 3))
    c("tile{2, 1, 1, 2}", "tile", { 2, 1, 1, 2 }, x:tile { 2, 1, 1, 2 })
    c("tile(1, 0, 1)", "tile", { 1, 0, 1 }, x:tile(1, 0, 1))
    local m = x:select(3, 2)
    for _, k in ipairs { 0, 1, -2, 9, -9 } do
      c("diag(" .. k .. ") of 2-D", "diag", k, m:diag(k), { m })
    end
    local v = x:select(1, 1):select(-1, 1)
    for _, k in ipairs { 0, 2, -1 } do
      c("diag(" .. k .. ") of 1-D", "diag", k, v:diag(k), { v })
    end
    local mask = rand("bool", { 5, 6, 7 })
    if x:numel() > 0 then
      c("masked_select", "masked_select", nil, x:masked_select(mask), { x, mask })
      local row = rand("bool", { 7 })
      c("masked_select, a broadcast mask", "masked_select", nil, x:masked_select(row), { x, row })
      local small = rand("bool", { 6, 1 })
      c("masked_select, mask {6, 1}", "masked_select", nil, x:masked_select(small), { x, small })
    else
      local zmask = rand("bool", { 4, 0, 3 })
      c("masked_select", "masked_select", nil, x:masked_select(zmask), { x, zmask })
    end
    if dt ~= "bool" and x:numel() > 0 then
      for _, dims in ipairs { 1, -1, { 1, 3 }, { 3, 2, 1 }, {} } do
        for _, keep in ipairs { false, true } do
          local p = N.pyval(dims) .. (keep and " keep" or "")
          c("amax(" .. p .. ")", "amax", { type(dims) == "table" and dims or { dims }, keep },
            x:amax(dims, { keepdim = keep }))
          c("amin(" .. p .. ")", "amin", { type(dims) == "table" and dims or { dims }, keep },
            x:amin(dims, { keepdim = keep }))
        end
      end
    elseif dt ~= "bool" then
      c("amax(2) of an empty tensor", "amax", { { 1 }, false }, x:amax(1))
      c("amin{1, 3} of an empty tensor", "amin", { { 1, 3 }, true }, x:amin({ 1, 3 }, { keepdim = true }))
    end
  end
  for _, inp in ipairs(inputs(dt, true)) do
    local tag, x = inp[1], inp[2]
    case("nonzero " .. dt .. tag, "nonzero", { x }, nil, x:nonzero())
  end
  -- 0-dim
  local s = rand(dt, {})
  local function c0(name, op, params, r, ins) case(name .. " " .. dt .. " 0-dim", op, ins or { s }, params, r) end
  c0("flatten", "flatten", { 1, -1 }, s:flatten())
  c0("tile(3)", "tile", { 3 }, s:tile(3))
  c0("tile(2, 2)", "tile", { 2, 2 }, s:tile(2, 2))
  c0("nonzero", "nonzero", nil, s:nonzero())
  c0("nonzero of a zero", "nonzero", nil, gpu.zeros({}, { dtype = dt }):nonzero(), { gpu.zeros({}, { dtype = dt }) })
  local tm = gpu.tensor(true)
  c0("masked_select", "masked_select", nil, s:masked_select(tm), { s, tm })
  local vm = rand("bool", { 4 })
  c0("masked_select with a {4} mask", "masked_select", nil, s:masked_select(vm), { s, vm })
  if dt ~= "bool" then
    c0("amax()", "amax", { {}, false }, s:amax())
    c0("amin{} keepdim", "amin", { {}, true }, s:amin({}, { keepdim = true }))
  end
end

-- tile with many dims: a dim of size 1 or a rep of 1 costs no extra dim
for _, dt in ipairs { "f32", "i8", "bool" } do
  local x = rand(dt, { 2, 1, 3, 1, 2, 1, 2 })
  case("tile of 7 dims " .. dt, "tile", { x }, { 1, 3, 2, 1, 1, 2, 1 }, x:tile(1, 3, 2, 1, 1, 2, 1))
  local y = rand(dt, { 1, 1, 1, 1, 1, 1, 1, 2 })
  case("tile of 8 dims " .. dt, "tile", { y }, { 2, 1, 3, 1, 1, 1, 4, 1 }, y:tile(2, 1, 3, 1, 1, 1, 4, 1))
end

-- NaN: amax and amin propagate it, as NumPy
for _, dt in ipairs(T.float_dtypes) do
  local x = gpu.tensor({ { 1, 0 / 0, 3 }, { 4, 5, -6 } }, { dtype = dt })
  case("amax(2) with NaN " .. dt, "amax", { x }, { { 2 }, false }, x:amax(2))
  case("amin(1) with NaN " .. dt, "amin", { x }, { { 1 }, false }, x:amin(1))
  case("nonzero with NaN " .. dt, "nonzero", { x }, nil, x:nonzero())
end

local ORACLE = [=[
import sys
import numpy as np

def load(path, dt):
    a = np.load(path)
    if dt == "bf16":
        # bf16 bits -> the float32 of the same value (exact)
        b = a.reshape(-1).view(np.uint16).astype(np.uint32) << 16
        return b.view(np.float32).reshape(a.shape)
    return a

def dim(d, nd):
    return d + nd if d < 0 else d - 1

def flatten(x, p):
    if x.ndim == 0:
        return x.reshape(1)
    a, b = dim(p[0], x.ndim), dim(p[1], x.ndim)
    return x.reshape(x.shape[:a] + (-1 if x.size else int(np.prod(x.shape[a:b + 1])),) + x.shape[b + 1:])

def extreme(f, x, p):
    dims, keep = p
    axes = tuple(dim(d, x.ndim) for d in dims) if dims else None
    return f(x, axis=axes, keepdims=keep)

def masked_select(x, m):
    x, m = np.broadcast_arrays(x, m)
    return x[m]

F = {
    "flatten": lambda xs, p: flatten(xs[0], p),
    "tile": lambda xs, p: np.tile(xs[0], p),
    "diag": lambda xs, p: np.diag(xs[0], p),
    "nonzero": lambda xs, p: np.argwhere(xs[0]).astype(np.int64) + 1,
    "masked_select": lambda xs, p: masked_select(xs[0], xs[1]),
    "amax": lambda xs, p: extreme(np.amax, xs[0], p),
    "amin": lambda xs, p: extreme(np.amin, xs[0], p),
}

results = []

def same(got, ref):
    if got.dtype == np.bool_ or ref.dtype == np.bool_:
        return np.array_equal(got.astype(np.bool_), ref.astype(np.bool_))
    if got.dtype.kind == "f":
        return np.array_equal(got, ref.astype(got.dtype), equal_nan=True)
    return np.array_equal(got, ref.astype(got.dtype))

def C(name, op, ins, params, out):
    try:
        xs = [load(p, d) for p, d in ins]
        ref = np.asarray(F[op](xs, params))
        got = load(*out)
        if got.shape != ref.shape:
            return results.append((name, "shape %s, numpy %s" % (got.shape, ref.shape)))
        if not same(got, ref):
            g, r = got.reshape(-1), ref.astype(got.dtype).reshape(-1)
            bad = np.flatnonzero(g != r)
            i = bad[0] if len(bad) else 0
            return results.append((name, "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), got.size, i, g[i].item(), r[i].item())))
        results.append((name, None))
    except Exception as e:
        results.append((name, "oracle raised %s: %s" % (type(e).__name__, e)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("flatten, tile, diag, nonzero, masked_select, amax, amin against NumPy", ORACLE)

O:close()
T.done()
