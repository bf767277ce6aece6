-- gpu.matmul against NumPy (issue 17): 2-D and batched 3-D products, a 2-D
-- operand or a batch of one broadcast to the other's batch, transposed
-- views (t:t(), transpose) and column slices, `out =` (also a strided one),
-- every dtype matmul takes, through .npy files (t:save here, numpy.load
-- in a python3 child).  Float dtypes accumulate in at least f32 (f16/bf16
-- too, as cuBLAS does with CUBLAS_COMPUTE_32F), so the oracle computes in
-- float64 and the result must be within a tolerance relative to
-- sum |a_ik b_kj| at each entry; integer products wrap as NumPy's integer
-- matmul does (issue 35: they saturated), checked against np.matmul in the
-- dtype itself, with operands over the whole range of each integer dtype
-- too.  Runs on the backend of the suite (GPULUA_DEVICE=cuda: cuBLAS).
-- Skips without numpy.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local seed = 500
local function rand(dt, shape)
  seed = seed + 1
  local o = { dtype = dt, seed = seed, low = -2, high = 2 }
  if not T.is_float(dt) then o.low, o.high = -9, 10 end
  if dt == "u8" then o.low, o.high = 0, 6 end
  return gpu.rand(shape, o)
end

local function save(t) return O:save(t) end

-- a case: the operands as gpulua sees them and its result
local function case(name, dt, a, b, c)
  O:case(name, string.format("C(%q, %q, %s, %s, %s)", name, dt, save(a), save(b), save(c)))
end

-- the m x k operand of a case, in one of several layouts: contiguous, a
-- transposed view of a k x m tensor, a column slice of a wider one
local function matrix(dt, shape, layout)
  local r, c = shape[#shape - 1], shape[#shape]
  local lead = #shape == 3 and { shape[1] } or {}
  local function sh(x, y)
    local s = { table.unpack(lead) }
    s[#s + 1], s[#s + 2] = x, y
    return s
  end
  if layout == "t" then
    local t = rand(dt, sh(c, r))
    return t:transpose(-1, -2)
  elseif layout == "slice" then
    return rand(dt, sh(r, c + 9)):narrow(#shape, 4, c)
  end
  return rand(dt, shape)
end

local DTYPES = { "f32", "f64", "f16", "bf16", "i32", "i64", "i8", "u8" }
local LAYOUTS = { "c", "t", "slice" }

for _, dt in ipairs(DTYPES) do
  for _, la in ipairs(LAYOUTS) do
    for _, lb in ipairs(LAYOUTS) do
      -- 2-D
      local a, b = matrix(dt, { 13, 21 }, la), matrix(dt, { 21, 7 }, lb)
      case(string.format("%s 2-D %s @ %s", dt, la, lb), dt, a, b, gpu.matmul(a, b))
      -- batched, both 3-D
      a, b = matrix(dt, { 3, 5, 6 }, la), matrix(dt, { 3, 6, 4 }, lb)
      case(string.format("%s 3-D %s @ 3-D %s", dt, la, lb), dt, a, b, gpu.matmul(a, b))
    end
  end
  -- broadcast: a 2-D operand or a batch of one against a batch
  local a3, b2 = rand(dt, { 4, 5, 6 }), rand(dt, { 6, 3 })
  case(dt .. " 3-D @ 2-D", dt, a3, b2, gpu.matmul(a3, b2))
  local a2, b3 = rand(dt, { 5, 6 }), rand(dt, { 4, 6, 3 })
  case(dt .. " 2-D @ 3-D", dt, a2, b3, gpu.matmul(a2, b3))
  local a1 = rand(dt, { 1, 5, 6 })
  case(dt .. " batch of one @ 3-D", dt, a1, b3, gpu.matmul(a1, b3))
  local a3t = a3:transpose(2, 3)
  case(dt .. " method form, transposed 3-D", dt, a3, a3t, a3:matmul(a3t))
  -- out =, contiguous and a column slice of a wider tensor
  local out = gpu.full({ 4, 5, 3 }, 7, { dtype = dt })
  gpu.matmul(a3, b2, { out = out })
  case(dt .. " out =", dt, a3, b2, out)
  local wide = gpu.full({ 4, 5, 8 }, 7, { dtype = dt })
  local outs = wide:narrow(3, 2, 3)
  gpu.matmul(a3, b2, { out = outs })
  case(dt .. " out = a strided view", dt, a3, b2, outs:contiguous())
  -- vectors: a row, a column
  local r, m = rand(dt, { 1, 9 }), rand(dt, { 9, 4 })
  case(dt .. " 1 x k @ k x n", dt, r, m, gpu.matmul(r, m))
  local col = rand(dt, { 9, 1 })
  case(dt .. " 4 x 9 (transposed) @ 9 x 1", dt, m:t(), col, gpu.matmul(m:t(), col))
end

-- integer products past the dtype's range wrap (issue 35): ones of i8
-- (100 @ 100 fits), twos past 127, and operands over each dtype's range
T.test("i8 matmul wraps past 127 as elementwise arithmetic does", function()
  local o = gpu.ones({ 100, 100 }, { dtype = "i8" })
  T.is(o:matmul(o):get(1, 1), 100, "100 x (1 * 1) fits")
  local a, b = gpu.full({ 2, 100 }, 2, { dtype = "i8" }), gpu.ones({ 100, 3 }, { dtype = "i8" })
  T.is(a:matmul(b):get(2, 3), 200 - 256, "100 x (2 * 1) = 200 wraps to -56")
  T.is(gpu.full({ 1 }, 100, { dtype = "i8" }):add(100):item(), 200 - 256, "as elementwise 100 + 100 does")
end)

local RANGE = { i8 = { -128, 128 }, u8 = { 0, 256 }, i32 = { -(1 << 31), 1 << 31 },
                i64 = { -(1 << 62), 1 << 62 } }
for _, dt in ipairs({ "i8", "u8", "i32", "i64" }) do
  local lo, hi = RANGE[dt][1], RANGE[dt][2]
  local function big(shape)
    seed = seed + 1
    return gpu.rand(shape, { dtype = dt, seed = seed, low = lo, high = hi })
  end
  local a, b = big({ 9, 33 }), big({ 33, 5 })
  case(dt .. " over the dtype's range (wraps)", dt, a, b, gpu.matmul(a, b))
  local a3, b3 = big({ 2, 4, 17 }), big({ 2, 17, 3 })
  case(dt .. " batched, over the dtype's range (wraps)", dt, a3, b3, gpu.matmul(a3, b3))
  local at = big({ 33, 9 }):t()
  case(dt .. " transposed, over the dtype's range (wraps)", dt, at, b, gpu.matmul(at, b))
end

local ORACLE = [=[
import sys
import numpy as np

def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)

def load(path, dt):
    a = np.load(path)
    return bf16_to_f32(a.view(np.uint16)) if dt == "bf16" else a

TOL = {"f64": 1e-12, "f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
results = []

def C(name, dt, pa, pb, pc):
    try:
        a, b, got = load(pa[0], dt), load(pb[0], dt), load(pc[0], dt)   # (path, dtype)
        if dt in TOL:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            ref = np.matmul(a64, b64)
            mag = np.matmul(np.abs(a64), np.abs(b64))
            g = got.astype(np.float64)
            if g.shape != ref.shape:
                return results.append((name, "shape %s, numpy %s" % (g.shape, ref.shape)))
            bad = np.flatnonzero(~(np.abs(g - ref) <= TOL[dt] * np.maximum(mag, 1e-30)))
        else:
            # NumPy's integer matmul in the dtype itself: it wraps
            with np.errstate(over="ignore"):
                ref = np.matmul(a, b)
                # the same, as the exact sum modulo 2^64 cut to the dtype
                wide = np.matmul(a.astype(np.uint64), b.astype(np.uint64)).astype(got.dtype)
            if not np.array_equal(ref, wide):
                return results.append((name, "oracle: numpy's matmul does not wrap here"))
            g = got
            if g.shape != ref.shape:
                return results.append((name, "shape %s, numpy %s" % (g.shape, ref.shape)))
            bad = np.flatnonzero(g != ref)
        if len(bad):
            i = bad[0]
            return results.append((name, "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), g.size, i, g.reshape(-1)[i].item(), ref.reshape(-1)[i].item())))
        results.append((name, None))
    except Exception as e:
        results.append((name, "oracle raised %s: %s" % (type(e).__name__, e)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("matmul against NumPy: 2-D, batched, broadcast, transposed views, out =", ORACLE)

T.test("matmul: bad shapes and batches raise naming both shapes", function()
  local a = gpu.ones({ 2, 3, 4 })
  T.raises(function() gpu.matmul(a, gpu.ones({ 3, 4, 5 })) end, "batch sizes 2 and 3 differ")
  T.raises(function() gpu.matmul(a, gpu.ones({ 5, 2 })) end, "a {2,3,4} @ b {5,2}: a's dim 3 %(4%) differs from b's dim 1 %(5%)")
  T.raises(function() gpu.matmul(gpu.ones({ 2, 2, 2, 2 }), a) end, "matmul needs a 2%-D or 3%-D tensor, got 4%-D")
  T.raises(function() gpu.matmul(a, gpu.ones({ 4 })) end, "got 1%-D")
  T.raises(function() gpu.matmul(a, gpu.ones({ 4, 2 }), { out = gpu.empty({ 3, 2 }) }) end,
           "does not match the result f32 {2,3,2}")
end)

T.test("matmul with zero-sized dims: k = 0 gives zeros, batched too", function()
  local c = gpu.matmul(gpu.ones({ 2, 3, 0 }), gpu.ones({ 2, 0, 4 }))
  T.is(table.concat(c.shape, ","), "2,3,4", "shape {2,3,4}")
  T.is(c:abs():max():item(), 0.0, "all zeros")
  local d = gpu.matmul(gpu.ones({ 3, 0 }), gpu.ones({ 0, 2 }):t():t())
  T.is(d:abs():max():item(), 0.0, "2-D k = 0: zeros")
  T.is(table.concat(gpu.matmul(gpu.ones({ 0, 3, 5 }), gpu.ones({ 5, 2 })).shape, ","), "0,3,2", "an empty batch")
end)

O:close()
T.done()
