-- Ops whose `out` overlaps an input (issue 35): the result is NumPy's, as
-- if every input were read before anything is written, for any overlap
-- (shifted by an element, transposed, an op that reads other elements than
-- the one it writes), on whichever backend the suite runs.  Each case runs
-- on one base tensor b: its state before is saved, the op runs on views of
-- b, its state after is saved, and a python3 child does the same on the
-- NumPy array (a line of Python on `b`) and compares.  Sizes below and
-- above 512 (the CUDA kernels' and the host loops' block), 4097 and 100000;
-- device, pinned and pageable memory.  Skips without python3 and numpy.
--
-- Also: an output that is exactly its input (t:add(1, {out = t}), t:add_(1))
-- stays one op, with no copy; an overlapping one costs one more copy.
local gpu = require "gpu"
local T = require "gpu.test"

local N = dofile("tests/numpy/oracle.lua")
local O = N.open()   -- skips the file without a python3 with numpy

local failed = {}   -- cases whose Lua side raised: name -> message

-- A case: b the base tensor, run(b) the op on its views, py the NumPy
-- statement on the array b (its state before), tol a relative tolerance (0:
-- bit for bit), extra {name = tensor} saved for py to use.
local function case(name, b, run, py, tol, extra)
  local pre = O:save(b)
  local ex = {}
  for k, t in pairs(extra or {}) do ex[#ex + 1] = string.format("%q: %s", k, O:save(t)) end
  local ok, err = pcall(run, b)
  if not ok then failed[name] = tostring(err) end
  O:case(name, string.format("C(%q, %s, %s, %q, %s, {%s})", name, pre, O:save(b), py, N.pyval(tol or 0),
                             table.concat(ex, ", ")))
end

-- n values of dtype dt and memory kind mem: 0, 1, ..., 96, 0, 1, ... (exact
-- in every dtype, sums of 100000 too in f32)
local function ramp(n, dt, mem)
  local t = gpu.arange(0, n, { dtype = "f64" }):remainder(97):to(dt)
  return mem and mem ~= "device" and t:to(mem) or t
end

local function square(n, dt, mem) return ramp(n * n, dt, mem):view({ n, n }) end

-- ---- item 1: elementwise ops, out shifted by one element or transposed ----

local SIZES = { 100, 513, 1000, 4097, 100000 }
local DTYPES = { "f64", "f32", "f16", "bf16", "i64", "i32", "i8", "u8" }
local MEMS = { { "f64", "pinned" }, { "f32", "host" }, { "i32", "pinned" } }

local function shifts(dt, mem, n)
  local tag = string.format("%s%s n=%d", dt, mem and " " .. mem or "", n)
  -- out one element ahead of the input (what a forward loop gets wrong),
  -- then one behind
  case("add 0, out ahead " .. tag, ramp(n + 1, dt, mem), function(b)
    b:narrow(1, 1, n):add(0, { out = b:narrow(1, 2, n) })
  end, string.format("b[1:%d] = b[0:%d] + 0", n + 1, n))
  case("add 0, out behind " .. tag, ramp(n + 1, dt, mem), function(b)
    b:narrow(1, 2, n):add(0, { out = b:narrow(1, 1, n) })
  end, string.format("b[0:%d] = b[1:%d] + 0", n, n + 1))
  case("sub of two shifted views " .. tag, ramp(n + 2, dt, mem), function(b)
    b:narrow(1, 1, n):sub(b:narrow(1, 3, n), { out = b:narrow(1, 2, n) })
  end, string.format("b[1:%d] = b[0:%d] - b[2:%d]", n + 1, n, n + 2))
  case("add_ of the view behind, in place " .. tag, ramp(n + 1, dt, mem), function(b)
    b:narrow(1, 2, n):add_(b:narrow(1, 1, n))
  end, string.format("b[1:%d] = b[1:%d] + b[0:%d]", n + 1, n + 1, n))
  if dt ~= "u8" then
    case("neg, out ahead " .. tag, ramp(n + 1, dt, mem), function(b)
      b:narrow(1, 1, n):neg({ out = b:narrow(1, 2, n) })
    end, string.format("b[1:%d] = -b[0:%d]", n + 1, n))
  end
end

for _, dt in ipairs(DTYPES) do
  for _, n in ipairs(SIZES) do shifts(dt, nil, n) end
end
for _, m in ipairs(MEMS) do
  for _, n in ipairs { 1000, 4097 } do shifts(m[1], m[2], n) end
end

for _, n in ipairs { 8, 64, 100 } do
  for _, m in ipairs { { "f64" }, { "f32", "pinned" }, { "i64" } } do
    local dt, mem = m[1], m[2]
    local tag = string.format("%s%s %dx%d", dt, mem and " " .. mem or "", n, n)
    case("add 0 into the transpose " .. tag, square(n, dt, mem), function(u)
      u:add(0, { out = u:t() })
    end, "b.T[...] = b + 0")
    case("neg into the transpose " .. tag, square(n, dt, mem), function(u)
      u:neg({ out = u:t() })
    end, "b.T[...] = -b")
    case("sub the transpose, in place " .. tag, square(n, dt, mem), function(u)
      u:sub(u:t(), { out = u })
    end, "b[...] = b - b.T")
    case("sub of the transpose into the transpose " .. tag, square(n, dt, mem), function(u)
      u:sub(u:t(), { out = u:t() })
    end, "b.T[...] = b - b.T")
  end
end

-- ternary: where and clamp, masked_fill
for _, n in ipairs { 100, 1000, 4097 } do
  for _, dt in ipairs { "f32", "i64" } do
    local tag = string.format("%s n=%d", dt, n)
    case("where, out ahead " .. tag, ramp(n + 2, dt), function(b)
      local c = gpu.arange(0, n, { dtype = "i64" }):remainder(3):eq(0)
      gpu.where(c, b:narrow(1, 1, n), b:narrow(1, 3, n), { out = b:narrow(1, 2, n) })
    end, string.format("b[1:%d] = np.where(np.arange(%d) %% 3 == 0, b[0:%d], b[2:%d])", n + 1, n, n, n + 2))
    case("clamp, out ahead " .. tag, ramp(n + 1, dt), function(b)
      b:narrow(1, 1, n):clamp(10, 50, { out = b:narrow(1, 2, n) })
    end, string.format("b[1:%d] = np.clip(b[0:%d], 10, 50)", n + 1, n))
    case("clamp by a shifted view " .. tag, ramp(n + 2, dt), function(b)
      b:narrow(1, 2, n):clamp(b:narrow(1, 1, n), nil, { out = b:narrow(1, 3, n) })
    end, string.format("b[2:%d] = np.maximum(b[1:%d], b[0:%d])", n + 2, n + 1, n))
    case("masked_fill, out ahead " .. tag, ramp(n + 1, dt), function(b)
      local m = gpu.arange(0, n, { dtype = "i64" }):remainder(5):eq(1)
      b:narrow(1, 1, n):masked_fill(m, 7, { out = b:narrow(1, 2, n) })
    end, string.format("b[1:%d] = np.where(np.arange(%d) %% 5 == 1, 7, b[0:%d])", n + 1, n, n))
  end
end

-- copy was right already: it must stay so
for _, n in ipairs { 1000, 100000 } do
  case("copy, out ahead f32 n=" .. n, ramp(n + 1, "f32"), function(b)
    b:narrow(1, 2, n):copy(b:narrow(1, 1, n))
  end, string.format("b[1:%d] = b[0:%d]", n + 1, n))
end
case("copy of the transpose f64 64x64", square(64, "f64"), function(u) u:copy(u:t()) end, "b[...] = b.T.copy()")

-- ---- item 2 and every other op kind with out ------------------------------

local function rev(n) return gpu.arange(n, 0, -1, { dtype = "i64" }) end

case("index_select reversed into itself f32 n=4", gpu.arange(1, 5, { dtype = "f32" }), function(t)
  t:index_select(1, gpu.tensor({ 4, 3, 2, 1 }, { dtype = "i64" }), { out = t })
end, "b[...] = b[[3, 2, 1, 0]]")
for _, n in ipairs { 1000, 4097 } do
  for _, m in ipairs { { "f64" }, { "i32", "pinned" } } do
    local tag = string.format("%s%s n=%d", m[1], m[2] and " " .. m[2] or "", n)
    case("index_select reversed into itself " .. tag, ramp(n, m[1], m[2]), function(t)
      local i = rev(n)
      if m[2] then i = i:to(m[2]) end
      t:index_select(1, i, { out = t })
    end, "b[...] = b[::-1].copy()")
  end
end
case("index_select of columns into the rows f32 64x64", square(64, "f32"), function(u)
  u:index_select(2, rev(64), { out = u:t() })
end, "b.T[...] = b[:, ::-1].copy()")
case("index_select by itself i64", gpu.tensor({ 2, 3, 4, 1, 1, 5 }, { dtype = "i64" }), function(t)
  t:index_select(1, t, { out = t })
end, "b[...] = b[b - 1].copy()")
case("gather into itself f32 64x64", square(64, "f32"), function(u)
  local idx = square(64, "i64"):mul(7):remainder(64):add(1)
  u:gather(2, idx, { out = u })
end, "b[...] = np.take_along_axis(b, (np.arange(4096).reshape(64, 64) % 97 * 7 % 64), axis=1)")
case("gather into its transpose f64 n=100", square(100, "f64"), function(u)
  local idx = square(100, "i64"):remainder(100):add(1)
  u:gather(1, idx, { out = u:t() })
end, "b.T[...] = np.take_along_axis(b, np.arange(10000).reshape(100, 100) % 97 % 100, axis=0)")

case("scatter_add_ of itself f64 n=1000", ramp(1000, "f64"), function(t)
  t:scatter_add_(1, rev(1000), t)
end, "np.add.at(b, np.arange(999, -1, -1), b.copy())")
case("scatter_add_ of a shifted view f32 n=4097", ramp(4098, "f32"), function(b)
  b:narrow(1, 1, 4097):scatter_add_(1, rev(4097), b:narrow(1, 2, 4097))
end, "np.add.at(b[0:4097], np.arange(4096, -1, -1), b[1:4098].copy())")
case("scatter_add_ by and of itself i64", gpu.tensor({ 2, 3, 4, 1, 1 }, { dtype = "i64" }), function(t)
  t:scatter_add_(1, t, t)
end, "c = b.copy(); np.add.at(b, c - 1, c)")

-- softmax and log_softmax: float, a tolerance
local SOFT = "E = lambda x: np.exp(x - x.max(axis=1, keepdims=True)); "
  .. "sm = lambda x: E(x) / E(x).sum(axis=1, keepdims=True); "
for _, dt in ipairs { "f32", "f64" } do
  local tol = dt == "f32" and 1e-5 or 1e-12
  case("softmax into the transpose " .. dt .. " 2x2", gpu.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = dt }), function(u)
    u:softmax(2, { out = u:t() })
  end, SOFT .. "b.T[...] = sm(b)", tol)
  for _, n in ipairs { 64, 100 } do
    local tag = string.format("%s %dx%d", dt, n, n)
    case("softmax into the transpose " .. tag, square(n, dt):div(10), function(u)
      u:softmax(2, { out = u:t() })
    end, SOFT .. "b.T[...] = sm(b)", tol)
    case("softmax into itself " .. tag, square(n, dt):div(10), function(u)
      u:softmax(2, { out = u })
    end, SOFT .. "b[...] = sm(b)", tol)
    case("log_softmax into the transpose " .. tag, square(n, dt):div(10), function(u)
      u:log_softmax(2, { out = u:t() })
    end, SOFT .. "b.T[...] = np.log(sm(b))", tol)
  end
end

-- cumsum: a scan reads the elements before the one it writes
for _, n in ipairs { 100, 1000, 4097, 100000 } do
  for _, dt in ipairs { "f64", "f32", "i64" } do
    local tag = string.format("%s n=%d", dt, n)
    case("cumsum, out ahead " .. tag, ramp(n + 1, dt), function(b)
      b:narrow(1, 1, n):cumsum(1, { out = b:narrow(1, 2, n) })
    end, string.format("b[1:%d] = np.cumsum(b[0:%d])", n + 1, n))
    case("cumsum into itself " .. tag, ramp(n, dt), function(t)
      t:cumsum(1, { out = t })
    end, "b[...] = np.cumsum(b)")
  end
end
case("cumsum into the transpose f64 64x64", square(64, "f64"), function(u)
  u:cumsum(2, { out = u:t() })
end, "b.T[...] = np.cumsum(b, axis=1)")
case("cumsum, out ahead f64 pinned n=4097", ramp(4098, "f64", "pinned"), function(b)
  b:narrow(1, 1, 4097):cumsum(1, { out = b:narrow(1, 2, 4097) })
end, "b[1:4098] = np.cumsum(b[0:4097])")

-- reductions: out a row or a column of the input
for _, m in ipairs { { "f64" }, { "i64" }, { "f32", "pinned" } } do
  local dt, mem = m[1], m[2]
  for _, n in ipairs { 64, 100 } do
    local tag = string.format("%s%s %dx%d", dt, mem and " " .. mem or "", n, n)
    case("sum into its first column " .. tag, square(n, dt, mem), function(u)
      u:sum({ dim = 2, keepdim = true, out = u:narrow(2, 1, 1) })
    end, "b[:, 0:1] = b.sum(axis=1, keepdims=True)")
    case("max into its last row " .. tag, square(n, dt, mem), function(u)
      u:max({ dim = 1, keepdim = true, out = u:narrow(1, n, 1) })
    end, string.format("b[%d:%d, :] = b.max(axis=0, keepdims=True)", n - 1, n))
    if dt == "i64" then
      case("argmax into its first column " .. tag, square(n, dt, mem), function(u)
        u:argmax({ dim = 2, keepdim = true, out = u:narrow(2, 1, 1) })
      end, "b[:, 0:1] = b.argmax(axis=1).reshape(-1, 1) + 1")
    end
  end
end
case("sum of all into its first element f64 n=4097", ramp(4097, "f64"), function(t)
  t:sum({ dim = 1, keepdim = true, out = t:narrow(1, 1, 1) })
end, "b[0:1] = b.sum(keepdims=True)")

-- matmul: out an operand, or its transpose
for _, m in ipairs { { "f64" }, { "f32" }, { "i32" }, { "f32", "pinned" } } do
  local dt, mem = m[1], m[2]
  for _, n in ipairs { 8, 64 } do
    local tag = string.format("%s%s %dx%d", dt, mem and " " .. mem or "", n, n)
    local function small(u) return u:remainder(5) end
    case("matmul a @ a into a " .. tag, small(square(n, dt, mem)), function(a)
      gpu.matmul(a, a, { out = a })
    end, "b[...] = b @ b")
    case("matmul a @ a.T into a.T " .. tag, small(square(n, dt, mem)), function(a)
      gpu.matmul(a, a:t(), { out = a:t() })
    end, "b.T[...] = b @ b.T")
    local c = small(square(n, dt, mem)):add(1)
    case("matmul a @ c into a " .. tag, small(square(n, dt, mem)), function(a)
      gpu.matmul(a, c, { out = a })
    end, "b[...] = b @ c", 0, { c = c })
  end
end

-- cat and stack: out overlapping the list
case("cat into an overlapping view f32", ramp(20, "f32"), function(b)
  gpu.cat({ b:narrow(1, 1, 5), b:narrow(1, 6, 5) }, 1, { out = b:narrow(1, 3, 10) })
end, "b[2:12] = np.concatenate([b[0:5], b[5:10]])")
case("cat into an overlapping view i64 n=4097", ramp(3 * 4097, "i64"), function(b)
  gpu.cat({ b:narrow(1, 4097, 4097), b:narrow(1, 1, 4097) }, { out = b:narrow(1, 2, 8194) })
end, "b[1:8195] = np.concatenate([b[4096:8193], b[0:4097]])")
case("stack into an overlapping view f64", ramp(20, "f64"), function(b)
  gpu.stack({ b:narrow(1, 1, 5), b:narrow(1, 6, 5) }, 2, { out = b:narrow(1, 4, 10):view({ 5, 2 }) })
end, "b[3:13] = np.stack([b[0:5], b[5:10]], axis=1).reshape(-1)")

-- ---- the oracle -----------------------------------------------------------

local ORACLE = [=[
import sys
import numpy as np

np.seterr(all="ignore")

def bf16_to_f32(u):
    return (u.astype(np.uint32) << 16).view(np.float32)

def load(path, dt):
    a = np.load(path)
    return bf16_to_f32(a.view(np.uint16)) if dt == "bf16" else a

results = []

def C(name, pre, post, stmt, tol, extra):
    try:
        b = load(*pre)
        env = {"np": np, "b": b}
        for k, v in extra.items():
            env[k] = load(*v)
        exec(stmt, env)
        got = load(*post)
        if got.shape != b.shape:
            return results.append((name, "shape %s, numpy %s" % (got.shape, b.shape)))
        if tol:
            g, r = got.astype(np.float64), b.astype(np.float64)
            bad = np.flatnonzero(~(np.abs(g - r) <= tol * np.maximum(np.abs(r), 1.0)))
        else:
            bad = np.flatnonzero(got != b)
        if len(bad):
            i = bad[0]
            return results.append((name, "%d of %d differ; first at flat index %d: gpulua %r, numpy %r" % (
                len(bad), got.size, i, got.reshape(-1)[i].item(), b.reshape(-1)[i].item())))
        results.append((name, None))
    except Exception as ex:
        results.append((name, "oracle raised %s: %s" % (type(ex).__name__, ex)))

exec(open(sys.argv[1]).read())
for name, err in results:
    print("ok\t%s" % name if err is None else "fail\t%s\t%s" % (name, err))
]=]

T.test("no case raised", function()
  local n = 0
  for name, err in pairs(failed) do
    n = n + 1
    T.diag(name .. ": " .. err)
  end
  T.is(n, 0, "cases that raised")
end)

O:check("ops whose out overlaps an input, against NumPy", ORACLE)

-- ---- the cost: exactly in place is one op; an overlap one more copy -------

local function cost(fn)
  local s0 = gpu.stats()
  fn()
  local s1 = gpu.stats()
  return { launches = s1.launches - s0.launches, copies = s1.copies - s0.copies }
end

T.test("exactly in place stays one op, with no copy", function()
  for _, mem in ipairs { "device", "pinned" } do
    local t = ramp(4097, "f32", mem)
    local c = gpu.arange(0, 4097, { dtype = "i64" }):remainder(2):eq(0)
    if mem ~= "device" then c = c:to(mem) end
    T.is(cost(function() t:add(1, { out = t }) end), { launches = 1, copies = 0 }, mem .. ": t:add(1, {out = t})")
    T.is(cost(function() t:add_(1) end), { launches = 1, copies = 0 }, mem .. ": t:add_(1)")
    T.is(cost(function() t:neg_() end), { launches = 1, copies = 0 }, mem .. ": t:neg_()")
    T.is(cost(function() t:mul(t, { out = t }) end), { launches = 1, copies = 0 }, mem .. ": t:mul(t, {out = t})")
    T.is(cost(function() gpu.where(c, t, 0, { out = t }) end), { launches = 1, copies = 0 },
         mem .. ": gpu.where(c, t, 0, {out = t})")
    T.is(cost(function() t:masked_fill_(c, 2) end), { launches = 1, copies = 0 }, mem .. ": t:masked_fill_(c, 2)")
    T.is(cost(function() t:narrow(1, 1, 4096):add(0, { out = t:narrow(1, 2, 4096) }) end),
         { launches = 1, copies = 1 }, mem .. ": an overlapping out: one copy more")
  end
end)

T.test("an overlapping out inside a graph", function()
  local n = 1000
  local t = ramp(n + 1, "f64")
  local g = gpu.graph(function()
    t:narrow(1, 1, n):mul(2, { out = t:narrow(1, 2, n) })
  end)
  g:launch()
  g:launch()
  local want = ramp(n + 1, "f64"):totable()
  for _ = 1, 2 do
    for i = n + 1, 2, -1 do want[i] = want[i - 1] * 2 end
  end
  T.is(t:totable(), want, "two replays, each reading before writing")
  g:close()
end)

O:close()
T.done()
