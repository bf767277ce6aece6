-- Reductions split over several blocks (k_reduce.cu: partials, then
-- reduce_final combines them): every reduction code, sizes around the
-- split thresholds, one output
-- and many, rows and columns, against the same reduction of pinned memory
-- (the host kernels on the calling thread).  The data make every order give
-- the same bits where the code allows it (sums of eighths, products of
-- +-1, maxima with ties), so those compare exactly; var, std, logsumexp and
-- norm 3 within a tolerance.  Then the same device results again (bit for
-- bit: no race decides them), inside a graph replayed twice, and on two
-- streams at once.  Meaningful on the cuda backend (make test-gpu); on the
-- host backend both sides are the host.
--
-- `gpulua tests/gpu/reduce_split.lua FILE` also writes every device result
-- as hex floats to FILE: the same file from two builds shows whether a
-- change kept the bits (floats outside the exact cases included).
local gpu = require "gpu"
local T = require "gpu.test"

-- var and std of f64 merge (count, mean, squared deviations) in a tree
-- whose order differs from the host's: over 1M elements they differed by
-- 2.4e-11 relative on an H200 (2026-11-29), so f64 is not held to 1e-12
local RTOL = { f32 = 1e-5, f64 = 1e-10, bf16 = 1.6e-2 }
local DTYPES = { "f32", "f64", "bf16", "i32" }
local dump = arg and arg[1] and assert(io.open(arg[1], "w"))

local function isfloat(dt) return RTOL[dt] ~= nil end

local function bits(x)
  if type(x) ~= "number" then return tostring(x) end
  return math.type(x) == "integer" and string.format("%d", x) or string.format("%a", x)
end

-- device result d against host result h, element by element (tol nil or 0:
-- the same numbers; NaN equals NaN); one TAP line
local function same(d, h, name, tol)
  local a, b = T.flatten(d:totable()), T.flatten(h:totable())
  if dump then
    local s = {}
    for i = 1, #a do s[i] = bits(a[i]) end
    dump:write(name, " ", table.concat(s, " "), "\n")
  end
  if #a ~= #b then return T.ok(false, name .. ": sizes differ") end
  for i = 1, #a do
    local x, y = a[i], b[i]
    local ok = (x ~= x and y ~= y) or x == y
    if not ok and tol and tol > 0 and type(x) == "number" then
      ok = math.abs(x - y) <= tol * math.max(1, math.abs(y))
    end
    if not ok then
      return T.ok(false, string.format("%s: element %d: device %s, host %s", name, i, bits(x), bits(y)))
    end
  end
  return T.ok(true, name)
end

-- the reductions: name, options, data kind, exact
local CODES = {
  { "sum", nil, "eighths", true }, { "mean", nil, "eighths", true },
  { "max", nil, "ties", true }, { "min", nil, "ties", true },
  { "argmax", nil, "ties", true }, { "argmin", nil, "ties", true },
  { "any", nil, "sparse", true }, { "all", nil, "dense", true },
  { "prod", nil, "signs", true },
  { "var", nil, "eighths", false, true }, { "std", { unbiased = false }, "eighths", false, true },
  { "logsumexp", nil, "eighths", false, true },
  { "norm", nil, "eighths", false, true }, { "norm", { p = 1 }, "eighths", true, true },
  { "norm", { p = math.huge }, "eighths", true, true }, { "norm", { p = 3 }, "eighths", false, true },
}

-- data of a kind, made on the device, and its pinned copy
local function data(kind, dt, shape, seed)
  local lo, hi = -50, 51
  if kind == "ties" then lo, hi = -3, 4
  elseif kind == "sparse" then lo, hi = 0, 2   -- any: mostly 0 needs a sparse 1
  elseif kind == "dense" then lo, hi = 1, 4
  elseif kind == "signs" then lo, hi = 0, 2 end
  local d = gpu.randint(lo, hi, shape, { dtype = isfloat(dt) and "f32" or dt, seed = seed })
  if kind == "sparse" then d = d:mul(gpu.randint(0, 2, shape, { dtype = d.dtype, seed = seed + 1 })) end
  if kind == "signs" then d = d:mul(2):sub(1) end   -- +-1
  if isfloat(dt) then
    d = d:to(dt)
    if kind == "eighths" then d = d:div(8) end
  end
  return d, d:to("pinned")
end

local function reduce(x, op, opts, dim)
  local o = { dim = dim }
  for k, v in pairs(opts or {}) do o[k] = v end
  return x[op](x, o)
end

local function label(c, dt, what)
  return string.format("%s%s %s %s", c[1], c[2] and " " .. T.fmt(c[2]) or "", dt, what)
end

-- one output: runs of the lengths where the group size and the split change
local LENS = { 1, 33, 511, 512, 1023, 1024, 2047, 2048, 4095, 4096, 8191, 8192, 16385, 100003, 1 << 20, (1 << 22) + 7 }
-- several outputs: (outputs, run length), along rows (dim 2) and columns (dim 1)
local SHAPES = { { 2, 70001 }, { 3, 8192 }, { 7, 4099 }, { 33, 2049 }, { 100, 1500 }, { 1000, 600 }, { 40, 100000 } }

T.test("whole tensors: one output, split or not", function()
  for _, dt in ipairs(DTYPES) do
    for _, c in ipairs(CODES) do
      if isfloat(dt) or not c[5] then
        for i, n in ipairs(LENS) do
          local d, h = data(c[3], dt, { n }, 1000 + i)
          local tol = not c[4] and RTOL[dt] * 4 or nil
          same(reduce(d, c[1], c[2]), reduce(h, c[1], c[2]), label(c, dt, "n " .. n), tol)
        end
      end
    end
  end
end)

T.test("along a dim: many outputs, rows and columns", function()
  for _, dt in ipairs(DTYPES) do
    for _, c in ipairs(CODES) do
      if isfloat(dt) or not c[5] then
        for i, s in ipairs(SHAPES) do
          local tol = not c[4] and RTOL[dt] * 4 or nil
          local d, h = data(c[3], dt, s, 2000 + i)
          same(reduce(d, c[1], c[2], 2), reduce(h, c[1], c[2], 2), label(c, dt, "rows " .. T.fmt(s)), tol)
          -- the runs across memory: columns (outputs neighbours in memory)
          local dc, hc = data(c[3], dt, { s[2], s[1] }, 3000 + i)
          same(reduce(dc, c[1], c[2], 1), reduce(hc, c[1], c[2], 1), label(c, dt, "cols " .. T.fmt(s)), tol)
        end
      end
    end
  end
  -- a dim of a view that is not one run (rows over a strided view)
  local d, h = data("eighths", "f32", { 64, 3000 }, 77)
  same(d:narrow(2, 2, 2500):sum({ dim = 2 }), h:narrow(2, 2, 2500):sum({ dim = 2 }), "sum f32 rows of a narrowed view")
  same(d:t():sum(), h:t():sum(), "sum f32 of a transposed view")
end)

-- the device results of the same reduction, called again: the same bits
local function again(name, f)
  local a, b = T.flatten(f():totable()), T.flatten(f():totable())
  if dump then
    local s = {}
    for i = 1, #a do s[i] = bits(a[i]) end
    dump:write(name, " ", table.concat(s, " "), "\n")
  end
  local ok = #a == #b
  for i = 1, #a do ok = ok and (a[i] == b[i] or (a[i] ~= a[i] and b[i] ~= b[i])) end
  T.ok(ok, name .. ": the same bits again")
end

T.test("the same bits on every call (floats, whatever the order)", function()
  local x = gpu.randn({ 1 << 22 }, { seed = 5 })
  local m = gpu.randn({ 40, 100000 }, { seed = 6 })
  for _, op in ipairs { "sum", "var", "logsumexp", "norm" } do
    again(op .. " of 4M f32", function() return x[op](x) end)
    again(op .. " f32 rows", function() return m[op](m, { dim = 2 }) end)
    again(op .. " f32 cols", function() return m:t()[op](m:t(), { dim = 1 }) end)
  end
end)

T.test("split reductions in a graph replayed twice, and on two streams at once", function()
  local x = gpu.empty({ (1 << 22) + 3 })
  local m = gpu.empty({ 40, 100000 })
  local c = gpu.empty({ 3000, 33 })
  local g, s1, s2, s3 = gpu.graph(function()
    return x:sum(), m:max({ dim = 2 }), c:sum({ dim = 1 })
  end, { name = "sums" })
  for r = 1, 2 do
    local xh = gpu.randint(-50, 51, { (1 << 22) + 3 }, { dtype = "f32", seed = 10 + r }):div(8)
    local mh = gpu.randint(-9, 10, { 40, 100000 }, { dtype = "f32", seed = 20 + r })
    local ch = gpu.randint(-50, 51, { 3000, 33 }, { dtype = "f32", seed = 30 + r })
    x:copy(xh); m:copy(mh); c:copy(ch)
    g:launch()
    same(s1, xh:to("pinned"):sum(), "graph replay " .. r .. ": sum of 4M f32")
    same(s2, mh:to("pinned"):max({ dim = 2 }), "graph replay " .. r .. ": max f32 rows")
    same(s3, ch:to("pinned"):sum({ dim = 1 }), "graph replay " .. r .. ": sum f32 cols")
  end
  g:close()

  -- two streams, each its own inputs, queued before either is waited for
  local st = { gpu.stream(), gpu.stream() }
  local ins, outs = {}, {}
  for k = 1, 2 do
    ins[k] = { gpu.randint(-50, 51, { 1 << 22 }, { dtype = "f32", seed = 40 + k }):div(8),
               gpu.randint(-50, 51, { 40, 100000 }, { dtype = "i32", seed = 50 + k }) }
  end
  gpu.synchronize()
  for k = 1, 2 do
    local _ <close> = gpu.using(st[k])
    outs[k] = {}
    for j = 1, 8 do
      outs[k][j] = { ins[k][1]:sum(), ins[k][2]:sum({ dim = 2 }), ins[k][2]:t():sum({ dim = 1 }) }
    end
  end
  gpu.synchronize()
  for k = 1, 2 do
    local a, b = ins[k][1]:to("pinned"), ins[k][2]:to("pinned")
    local want = { a:sum(), b:sum({ dim = 2 }), b:t():sum({ dim = 1 }) }
    local ok = true
    for j = 1, 8 do
      for q = 1, 3 do
        ok = ok and T.flatten(outs[k][j][q]:totable())[1] == T.flatten(want[q]:totable())[1]
        ok = ok and outs[k][j][q]:eq(want[q]:to(outs[k][j][q].device)):all():item()
      end
    end
    T.ok(ok, "stream " .. k .. ": 8 rounds of sums, rows and columns, all exact")
  end
end)

T.test("fused reductions split the same way", function()
  local f = gpu.fuse(function(x) return (x * 2 + 1):relu():sum() end, { name = "relu_sum" })
  local fr = gpu.fuse(function(x) return (x * 2 + 1):relu():sum({ dim = 2 }) end, { name = "relu_sum_rows" })
  local fc = gpu.fuse(function(x) return (x * 2 + 1):relu():max({ dim = 1 }) end, { name = "relu_max_cols" })
  for _, n in ipairs { 1023, 8192, 100003, (1 << 22) + 7 } do
    local x = gpu.randn({ n }, { seed = n })
    same(f(x), (x * 2 + 1):relu():sum(), "fused sum n " .. n)
  end
  local m = gpu.randn({ 40, 100000 }, { seed = 8 })
  same(fr(m), (m * 2 + 1):relu():sum({ dim = 2 }), "fused sum rows")
  local c = gpu.randn({ 3000, 33 }, { seed = 9 })
  same(fc(c), (c * 2 + 1):relu():max({ dim = 1 }), "fused max cols")
end)

if dump then dump:close() end
T.done()
