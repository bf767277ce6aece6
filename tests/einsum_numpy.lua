-- gpu.einsum, gpu.bmm, gpu.outer and gpu.dot against NumPy (issue 34):
-- np.einsum, np.matmul, np.outer and np.dot as the oracle, over every dtype
-- matmul takes, with contiguous and strided (transposed, sliced) operands,
-- diagonals (an index repeated in one operand) and '...' broadcasting.
-- Floats are compared with the float64 answer within a tolerance relative
-- to the same contraction of |operands| (each intermediate is rounded to
-- the dtype); integers wrap, so they must equal the exact sum modulo 2^64
-- cut to the dtype.  Bad specs and shapes raise at the calling line.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local seed = 3400
local function rand(dt, shape)
  seed = seed + 1
  local o = { dtype = dt, seed = seed, low = -2, high = 2 }
  if not T.is_float(dt) then o.low, o.high = -9, 10 end
  if dt == "u8" then o.low, o.high = 0, 6 end
  return gpu.rand(shape, o)
end

-- an operand of the given shape: contiguous, a transposed view of the
-- last two dims, or a slice of a wider last dim
local function operand(dt, shape, layout)
  local n = #shape
  if layout == "t" and n >= 2 then
    local s = { table.unpack(shape) }
    s[n - 1], s[n] = shape[n], shape[n - 1]
    return rand(dt, s):transpose(n - 1, n)
  elseif layout == "slice" and n >= 1 then
    local s = { table.unpack(shape) }
    s[n] = shape[n] + 5
    return rand(dt, s):narrow(n, 3, shape[n])
  end
  return rand(dt, shape)
end

-- a case: fn is an einsum spec or "matmul", "outer", "dot"
local function case(name, dt, fn, ops, r)
  local saved = {}
  for i, t in ipairs(ops) do saved[i] = O:save(t) end
  O:case(name, string.format("C(%q, %q, %q, [%s], %s)", name, dt, fn, table.concat(saved, ", "), O:save(r)))
end

local SPECS = {
  { "ij,jk->ik", { { 4, 5 }, { 5, 3 } } },
  { "ij,jk", { { 4, 5 }, { 5, 3 } } },                      -- implicit output
  { "ij,kj->ik", { { 4, 5 }, { 3, 5 } } },
  { "ji,jk->ki", { { 5, 4 }, { 5, 3 } } },
  { "bij,bjk->bik", { { 2, 3, 4 }, { 2, 4, 5 } } },
  { "bij,bkj->bki", { { 2, 3, 4 }, { 2, 5, 4 } } },
  { "bhqd,bhkd->bhqk", { { 2, 3, 4, 5 }, { 2, 3, 6, 5 } } },
  { "ij->ji", { { 3, 4 } } },
  { "ijk->kij", { { 2, 3, 4 } } },
  { "ij->", { { 3, 4 } } },
  { "ij->j", { { 3, 4 } } },
  { "ijk->ki", { { 2, 3, 4 } } },
  { "ijk", { { 2, 3, 4 } } },                                -- implicit: all kept
  { "i,i->", { { 7 }, { 7 } } },
  { "i,j->ij", { { 4 }, { 3 } } },
  { "i,j", { { 4 }, { 3 } } },
  { "ij,j", { { 4, 6 }, { 6 } } },
  { "ij,ij->ij", { { 3, 4 }, { 3, 4 } } },
  { "ij,ij->", { { 3, 4 }, { 3, 4 } } },
  { "ij,ji->i", { { 3, 4 }, { 4, 3 } } },
  { "ab,cd->", { { 2, 3 }, { 4, 2 } } },
  { "ab,cd->da", { { 2, 3 }, { 4, 2 } } },
  { "iJ,Jk->ki", { { 3, 2 }, { 2, 4 } } },
  { "ik,jkl,l->ij", { { 3, 4 }, { 2, 4, 5 }, { 5 } } },
  { "ij,jk,kl->il", { { 2, 3 }, { 3, 4 }, { 4, 5 } } },
  { "ij,jk->ik", { { 3, 0 }, { 0, 4 } } },                   -- empty contraction: zeros
  { "ij,jk->ik", { { 0, 2 }, { 2, 4 } } },                   -- empty result
  -- diagonals: a repeated index in one operand
  { "ii->i", { { 4, 4 } } },
  { "ii->", { { 4, 4 } } },                                  -- trace
  { "ii", { { 4, 4 } } },                                    -- implicit trace
  { "iij->ij", { { 3, 3, 2 } } },
  { "bii->bi", { { 2, 3, 3 } } },
  { "iji->ji", { { 3, 2, 3 } } },
  { "iii->i", { { 3, 3, 3 } } },
  { "iijj->ij", { { 2, 2, 3, 3 } } },
  { "ii,ij->j", { { 3, 3 }, { 3, 4 } } },
  { "ij,jj->i", { { 2, 3 }, { 3, 3 } } },
  { "ii->i", { { 0, 0 } } },                                 -- empty diagonal
  -- ellipsis, broadcast as NumPy does
  { "...ij,...jk->...ik", { { 2, 3, 4 }, { 2, 4, 5 } } },
  { "...ij,...jk->...ik", { { 2, 1, 3, 4 }, { 5, 4, 2 } } },  -- {2,1} against {5}
  { "...ij,...jk->...ik", { { 3, 4 }, { 2, 4, 2 } } },
  { "...ij,jk->...ik", { { 3, 4 }, { 4, 2 } } },             -- '...' of no dims
  { "...ij,...jk", { { 2, 3, 4 }, { 1, 4, 2 } } },           -- implicit: '...' first
  { "i...->...i", { { 2, 3, 4 } } },
  { "...->...", { { 2, 3 } } },
  { "...->...", { {} } },                                    -- 0-dim
  { "...", { { 2, 3 } } },
  { "...i,...i", { { 3, 4 }, { 2, 1, 4 } } },
  { "...ij->...", { { 2, 3, 4 } } },
  { "i...,i...->...", { { 3, 2 }, { 3 } } },
  { "...ii->...i", { { 2, 3, 3 } } },
  { "b...ii,b...i->b...", { { 2, 3, 4, 4 }, { 2, 1, 4 } } },
  { "...i,...i->...", { { 0, 4 }, { 1, 4 } } },              -- broadcast to an empty dim
}

local DTYPES = { "f32", "f64", "f16", "bf16", "i32", "i64", "i8", "u8" }

for _, dt in ipairs(DTYPES) do
  for _, layout in ipairs({ "c", "t", "slice" }) do
    for k, sc in ipairs(SPECS) do
      local ops = {}
      for i, shape in ipairs(sc[2]) do ops[i] = operand(dt, shape, layout) end
      case(string.format("%s %s #%d '%s'", dt, layout, k, sc[1]), dt, sc[1], ops, gpu.einsum(sc[1], table.unpack(ops)))
    end
    local a, b = operand(dt, { 3, 4, 5 }, layout), operand(dt, { 3, 5, 2 }, layout)
    case(dt .. " " .. layout .. " a:bmm(b)", dt, "matmul", { a, b }, a:bmm(b))
    case(dt .. " " .. layout .. " gpu.bmm", dt, "matmul", { a, b }, gpu.bmm(a, b))
    local u = operand(dt, { 6 }, layout)
    local v = layout == "t" and rand(dt, { 6, 2 }):select(2, 2) or operand(dt, { 6 }, layout)
    case(dt .. " " .. layout .. " u:outer(v)", dt, "outer", { u, v }, u:outer(v))
    local w = rand(dt, { 3 })
    case(dt .. " " .. layout .. " gpu.outer", dt, "outer", { u, w }, gpu.outer(u, w))
    case(dt .. " " .. layout .. " u:dot(v)", dt, "dot", { u, v }, u:dot(v))
    case(dt .. " " .. layout .. " gpu.dot", dt, "dot", { u, v }, gpu.dot(u, v))
  end
end

local ORACLE = [=[
import sys
import numpy as np

def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)

def load(path, dt):
    a = np.load(path)
    return bf16_to_f32(a.reshape(-1).view(np.uint16)).reshape(a.shape) if dt == "bf16" else a

TOL = {"f64": 1e-12, "f32": 1e-5, "f16": 4e-3, "bf16": 3e-2}
FN = {"matmul": np.matmul, "outer": np.outer, "dot": np.dot}
results = []

def C(name, dt, fn, ops, pr):
    try:
        f = FN.get(fn) or (lambda *xs: np.einsum(fn, *xs))
        xs = [load(p[0], dt) for p in ops]
        got = load(pr[0], dt)
        if dt in TOL:
            x64 = [x.astype(np.float64) for x in xs]
            ref = np.asarray(f(*x64))
            mag = np.asarray(f(*[np.abs(x) for x in x64]))
            g = got.astype(np.float64)
            if g.shape != ref.shape:
                return results.append((name, "shape %s, numpy %s" % (g.shape, ref.shape)))
            bad = np.flatnonzero(~(np.abs(g - ref) <= TOL[dt] * np.maximum(mag, 1e-30)))
        else:
            with np.errstate(over="ignore"):
                # the exact sum modulo 2^64, cut to the dtype: how integers wrap
                ref = np.asarray(f(*[x.astype(np.uint64) for x in xs])).astype(got.dtype)
                same = np.asarray(f(*xs))
            if same.dtype == got.dtype and not np.array_equal(same, ref):
                return results.append((name, "oracle: numpy's own answer does not wrap here"))
            g = got
            if g.shape != ref.shape:
                return results.append((name, "shape %s, numpy %s" % (g.shape, ref.shape)))
            bad = np.flatnonzero(g != ref)
        if len(bad):
            i = bad[0]
            return results.append((name, "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), g.size, i, g.reshape(-1)[i].item(), ref.reshape(-1)[i].item())))
        if got.dtype != xs[0].dtype and dt != "bf16":
            return results.append((name, "dtype %s, operands %s" % (got.dtype, xs[0].dtype)))
        results.append((name, None))
    except Exception as e:
        results.append((name, "oracle raised %s: %s" % (type(e).__name__, e)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

O:check("einsum, bmm, outer, dot against NumPy: every matmul dtype, strided operands", ORACLE)

T.test("dot gives a 0-dim tensor; outer and bmm their shapes", function()
  local u, v = gpu.tensor({ 1, 2, 3 }, { dtype = "f64" }), gpu.tensor({ 4, 5, 6 }, { dtype = "f64" })
  T.is(u:dot(v).ndim, 0, "dot is 0-dim")
  T.is(u:dot(v):item(), 32.0, "1*4 + 2*5 + 3*6")
  T.is(table.concat(u:outer(v:narrow(1, 1, 2)).shape, ","), "3,2", "outer {3} x {2}")
  T.is(table.concat(gpu.bmm(gpu.ones({ 2, 3, 4 }), gpu.ones({ 2, 4, 5 })).shape, ","), "2,3,5", "bmm")
  T.is(gpu.einsum("i,i", u, v).ndim, 0, "implicit 'i,i' is 0-dim")
end)

T.test("einsum: bad specs raise at the calling line, saying what is wrong", function()
  local a, b = gpu.ones({ 2, 3 }), gpu.ones({ 3, 4 })
  T.raises_at(function() return gpu.einsum("ij,jk->iz", a, b) end, "output index 'z' is in no operand")
  T.raises_at(function() return gpu.einsum("ij,jk->ii", a, b) end, "output index 'i' appears twice")
  T.raises_at(function() return gpu.einsum("ij,jk->ik", a, a) end, "index 'j' has size 2 in operand 2 {2,3} but 3 before")
  T.raises_at(function() return gpu.einsum("ij->ik", a) end, "output index 'k' is in no operand")
  T.raises_at(function() return gpu.einsum("ijk,jk->i", a, b) end, "operand 1 has 2 dim%(s%) {2,3}, its term 'ijk' names 3")
  T.raises_at(function() return gpu.einsum("ij,jk->ik", a) end, "names 2 operand%(s%), 1 tensor%(s%) given")
  T.raises_at(function() return gpu.einsum("ij->ik", a, b) end, "names 1 operand%(s%), 2 tensor%(s%) given")
  T.raises_at(function() return gpu.einsum("i1,jk", a, b) end, "'1' is not an index")
  T.raises_at(function() return gpu.einsum("ij,jk->i->k", a, b) end, "more than one '%->'")
  T.raises_at(function() return gpu.einsum("ij,jk>ik", a, b) end, "a '%-' or '>' outside '%->'")
  T.raises_at(function() return gpu.einsum("ii->i", gpu.ones({ 3, 4 })) end,
              "index 'i' repeats in operand 1 {3,4} with sizes 3 and 4")
  T.raises_at(function() return gpu.einsum("ii,i->i", gpu.ones({ 3, 3 }), gpu.ones({ 4 })) end,
              "index 'i' has size 4 in operand 2 {4} but 3 before")
  T.raises_at(function() return gpu.einsum("ij->...", a) end, "'...' in the output but in no operand")
  T.raises_at(function() return gpu.einsum("ij->i...", a) end, "'...' in the output but in no operand")
  T.raises_at(function() return gpu.einsum("...i...", a) end, "'...' appears twice in operand 1")
  T.raises_at(function() return gpu.einsum("...ij->......", a) end, "'...' appears twice in the output")
  T.raises_at(function() return gpu.einsum("..i,ij", a, b) end, "a '.' outside '...'")
  T.raises_at(function() return gpu.einsum("...ij->ij", gpu.ones({ 2, 3, 4 })) end,
              "the '...' covers 1 dim%(s%) but the output has no '...'")
  T.raises_at(function() return gpu.einsum("...ijk", a) end, "operand 1 has 2 dim%(s%) {2,3}, its term names 3 besides '...'")
  T.raises_at(function() return gpu.einsum("...i,...i", gpu.ones({ 3, 4 }), gpu.ones({ 2, 4 })) end,
              "the '...' dims of operand 2 {2,4} do not broadcast: size 2 against 3")
  T.raises_at(function() return gpu.einsum("ij,jk", a, b:to("f64")) end, "operand 2 is f64, operand 1 f32")
  T.raises_at(function() return gpu.einsum("ij,jk", a, 3) end, "bad argument #3 to 'einsum' %(gpu.Tensor expected")
  T.raises_at(function() return gpu.einsum(42, a) end, "bad argument #1 to 'einsum' %(string expected, got number%)")
  T.raises_at(function() return gpu.einsum("ij") end, "gpu.Tensor expected, got no value")
  T.raises_at(function() return gpu.einsum("i,i", gpu.ones({ 2 }, { dtype = "bool" }), gpu.ones({ 2 }, { dtype = "bool" })) end,
              "not supported for bool")
end)

T.test("t:diagonal: a view of the elements along two dims, as torch.diagonal", function()
  local a = gpu.arange(24):reshape({ 2, 3, 4 })
  local d = a:diagonal(0, 2, 3)
  T.is(table.concat(d.shape, ","), "2,3", "dims 2 and 3 dropped, the diagonal last")
  T.is(d:totable(), { { 0, 5, 10 }, { 12, 17, 22 } }, "offset 0")
  T.is(a:diagonal(1, 2, 3):totable(), { { 1, 6, 11 }, { 13, 18, 23 } }, "offset 1: above")
  T.is(a:diagonal(-1, 3, 2):totable(), { { 1, 6, 11 }, { 13, 18, 23 } }, "offset -1, dims swapped")
  T.is(a:diagonal(1, 1, -1):totable(), { { 1, 14 }, { 5, 18 }, { 9, 22 } }, "dims 1 and 3")
  T.is(table.concat(a:diagonal(4, 2, 3).shape, ","), "2,0", "an offset past the end: empty")
  T.is(table.concat(a:diagonal(-3, 2, 3).shape, ","), "2,0", "a negative offset past the end: empty")
  local m = gpu.zeros({ 3, 3 }, { dtype = "i32" })
  m:diagonal():fill(7)
  T.is(m:totable(), { { 7, 0, 0 }, { 0, 7, 0 }, { 0, 0, 7 } }, "a view: writes land in the base")
  T.raises_at(function() return gpu.ones({ 3 }):diagonal() end, "needs a tensor of at least 2 dims, got 1")
  T.raises_at(function() return a:diagonal(0, 2, 2) end, "dim1 and dim2 are both dim 2")
  T.raises_at(function() return a:diagonal(0, 1, 4) end, "dim 4 out of range for a 3%-dim tensor")
  T.raises_at(function() return a:diagonal(0.5) end, "offset")
end)

T.test("einsum: a diagonal alone is a view, not a copy", function()
  local m = gpu.zeros({ 3, 3 }, { dtype = "f64" })
  gpu.einsum("ii->i", m):fill(2)
  T.is(m:totable(), { { 2, 0, 0 }, { 0, 2, 0 }, { 0, 0, 2 } }, "'ii->i' writes through to m")
  local b = gpu.zeros({ 2, 3, 3 }, { dtype = "i32" })
  gpu.einsum("bii->bi", b):fill(1)
  T.is(b:sum():item(), 6, "'bii->bi' too")
  gpu.einsum("...ii->...i", b):fill(4)
  T.is(b:sum():item(), 24, "'...ii->...i' too")
end)

T.test("bmm, outer, dot: bad shapes and dtypes raise at the calling line", function()
  local a3, v = gpu.ones({ 2, 3, 4 }), gpu.ones({ 4 })
  T.raises_at(function() return a3:bmm(gpu.ones({ 4, 5 })) end, "b must be 3%-D {batch, k, m}, got {4,5}")
  T.raises_at(function() return gpu.ones({ 3, 4 }):bmm(a3) end, "a must be 3%-D {batch, n, k}, got {3,4}")
  T.raises_at(function() return a3:bmm(gpu.ones({ 3, 4, 5 })) end, "batch sizes 2 and 3 differ")
  T.raises_at(function() return a3:bmm(gpu.ones({ 2, 5, 5 })) end, "a's dim 3 %(4%) differs from b's dim 2 %(5%)")
  T.raises_at(function() return a3:bmm(gpu.ones({ 2, 4, 5 }, { dtype = "f64" })) end, "dtype f64 does not match f32")
  T.raises_at(function() return v:outer(a3) end, "outer: needs two 1%-D tensors, got {4} and {2,3,4}")
  T.raises_at(function() return v:dot(gpu.ones({ 5 })) end, "dot: sizes 4 and 5 differ")
  T.raises_at(function() return v:dot(gpu.ones({ 2, 2 })) end, "dot: needs two 1%-D tensors")
  T.raises_at(function() return v:dot(v:to("i32")) end, "dtype i32 does not match f32")
  T.raises_at(function() return v:dot() end, "gpu.Tensor expected, got no value")
  T.raises_at(function() return gpu.outer(v, "x") end, "gpu.Tensor expected, got string")
end)

O:close()
T.done()
