-- gpu.fuse with several trailing reductions (issue 32): results that reduce
-- values of one dtype and shape pattern along one dim with one keepdim are
-- ONE op (up to 4), each result the unfused call's bit for bit (against the
-- direct methods and gpu._fuse's unfused reference path, never against
-- written-down floats, so the file means the same on cuda): every pair and
-- quad of sum, mean, prod, max, min over everything, each dim (negative
-- too) and keepdim; every dtype the reductions take (floats, integers that
-- wrap in int64, bool); every layout of the cuda reduction's plan
-- (tests/fuse.lua's list) with several accumulators; NaN, inf and -0; the
-- empty and 0-dim cases; the op counts (a fifth result, another dim,
-- keepdim or value dtype, elementwise results: more ops); `out = {...}` and
-- the bad outs, refused at the caller's line with nothing written; the C
-- fast path (second calls, number parameters, inputs that do not broadcast
-- together); gpu.graph; integer division by zero at the next sync; the race
-- checker; one trace per signature.
local gpu = require "gpu"
local T = require "gpu.test"

local SRC = debug.getinfo(1, "S").short_src

math.randomseed(3233)
local helpers = dofile((arg[0]:match("^(.*)/") or ".") .. "/fuse/helpers.lua")
local rand, unfused, launches = helpers.rand, helpers.unfused, helpers.launches

-- integers of dtype dt in [lo, hi]
local function ints(shape, dt, lo, hi)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local v = {}
  for i = 1, n do v[i] = math.random(lo, hi) end
  return gpu.tensor(v, { dtype = dt }):view(shape)
end

-- equal element for element: NaN equals NaN, -0 is not 0
local check = T.same
local function same(a, b) return T.differ(a, b) == nil end

-- body fused, called twice (the first call traces and runs in Lua, the
-- second runs from C when the signature is one op): `ops` ops each time
-- (when given), and every result equal to both the direct methods' (body
-- called outside gpu.fuse) and the reference path's, bit for bit.
local function agree(name, body, ops, ...)
  local args = table.pack(...)
  local want = table.pack(body(...))
  local f = gpu.fuse(body, { name = name })
  local got = {}
  for call = 1, 2 do
    local r = table.pack(launches(function() return f(table.unpack(args, 1, args.n)) end))
    if ops then T.is(r[1], ops, string.format("%s: %d op%s (call %d)", name, ops, ops ~= 1 and "s" or "", call)) end
    got[call] = r
  end
  local ref = table.pack(unfused(f, ...))
  T.is(ref.n, want.n, name .. ": as many results as the direct calls")
  for k = 1, want.n do
    local w = T.differ(got[1][k + 1], want[k]) or T.differ(got[2][k + 1], want[k]) or T.differ(ref[k], want[k])
    if not T.ok(w == nil, string.format("%s: result %d as unfused (both calls)", name, k)) then T.diag("  " .. w) end
  end
  return f
end

-- the reduction `red` of t; o: nil (everything) or {dim =, keepdim =}
local function red(t, r, o)
  if not o then return t[r](t) end
  return t[r](t, { dim = o.dim, keepdim = o.keepdim })
end

local REDS = { "sum", "mean", "prod", "max", "min" }
-- what each reduction reduces: values of one dtype, each its own
-- (prod of values near 1: no overflow to inf)
local FLOAT_OPERAND = {
  sum = function(a) return a * a end,
  mean = function(a) return a + 1 end,
  prod = function(a) return a / 64 + 1 end,
  max = function(a) return a:abs() end,
  min = function(a) return a - 1 end,
}
-- integers: wrapping in the dtype is the unfused ops' too; prod wraps in
-- int64
local INT_OPERAND = {
  sum = function(a) return a * 3 end,
  mean = function(a) return a end,
  prod = function(a) return a % 3 + 1 end,
  max = function(a) return a - 1 end,
  min = function(a) return a + 1 end,
}
local function body_of(list, o, operand)
  operand = operand or FLOAT_OPERAND
  return function(a)
    local r = {}
    for k, rname in ipairs(list) do r[k] = red(operand[rname](a), rname, o) end
    return table.unpack(r, 1, #list)
  end
end
local function dims_name(o)
  if not o then return "everything" end
  return "dim " .. o.dim .. (o.keepdim and " keepdim" or "")
end
-- Each fused function is a kernel that cuda compiles (about 1.5 s for a
-- reduction, once: the disk cache keeps it), so the matrix is a sample
-- that has each reduction beside each other one and each dim form, not
-- every product: every adjacent pair, a quad per dim form (each leaving
-- out another reduction), all five over two.
local DIMS = { false, { dim = 1 }, { dim = -1 }, { dim = 2, keepdim = true }, { dim = -2, keepdim = true } }

T.test("pairs, quads and all five of sum, mean, prod, max, min: one op (all five: 4 + 1)", function()
  local x = rand({ 3, 517 })
  for i = 1, #REDS do
    local pr = { REDS[i], REDS[i % #REDS + 1] }
    agree(pr[1] .. " + " .. pr[2] .. " over everything", body_of(pr), 1, x)
  end
  agree("max + min over dim 2", body_of({ "max", "min" }, { dim = 2 }), 1, x)
  agree("sum + prod over dim 2", body_of({ "sum", "prod" }, { dim = 2 }), 1, x)
  for d, o in ipairs(DIMS) do
    local quad = {}
    for k, r in ipairs(REDS) do if k ~= d then quad[#quad + 1] = r end end
    agree(table.concat(quad, ", ") .. " over " .. dims_name(o), body_of(quad, o), 1, x)
  end
  agree("all five over everything", body_of(REDS), 2, x)
  agree("all five, reversed, over dim -2 keepdim", body_of({ "min", "max", "prod", "mean", "sum" },
                                                          { dim = -2, keepdim = true }), 2, x)
end)

T.test("the ways to spell a dim: positional, a table, a dim and an options table", function()
  local x = rand({ 3, 517 })
  agree("sum(2), sum{dim = 2}, max{dim = 2}, mean(2, {})", function(a)
    return a:sum(2), (a * a):sum { dim = 2 }, a:max { dim = 2 }, (a + 1):mean(2, {})
  end, 1, x)
  agree("sum(1, {keepdim}), prod{dim = 1, keepdim}, min{dim = 1, keepdim}", function(a)
    return a:sum(1, { keepdim = true }), (a / 64 + 1):prod { dim = 1, keepdim = true },
           a:min { dim = 1, keepdim = true }
  end, 1, x)
  agree("keepdim over everything", function(a) return a:sum { keepdim = true }, a:max { keepdim = true } end, 1, x)
  -- a number for max/min is the elementwise max with it, fused or not
  agree("max(1) is elementwise, then reduced with a sum", function(a)
    return a:max(1):sum(), a:min(-1):sum(), a:sum()
  end, 1, x)
end)

T.test("float dtypes: f32, f64, f16, bf16 (sums, means, prods accumulate in double)", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16" } do
    local x = rand({ 3, 517 }, dt)
    agree(dt .. ": all five over everything", body_of(REDS), 2, x)
    local o = { dim = 2 }
    agree(dt .. ": sum, sum of squares, max, min over " .. dims_name(o), function(a)
      return red(a, "sum", o), red(a * a, "sum", o), red(a, "max", o), red(a, "min", o)
    end, 1, x)
  end
end)

T.test("integer dtypes: sum and prod in int64 (wrapping), max and min keep the dtype, mean", function()
  local inputs = {
    i32 = ints({ 3, 517 }, "i32", -1000000, 1000000),
    i64 = ints({ 3, 517 }, "i64", -(1 << 40), 1 << 40),
    u8 = ints({ 3, 517 }, "u8", 0, 255),
    i8 = ints({ 3, 517 }, "i8", -128, 127),
  }
  -- a dim form each; the products of 517 values of 1..3 overflow int64
  local forms = { i32 = false, i64 = { dim = 2 }, u8 = { dim = -2, keepdim = true }, i8 = { dim = 1 } }
  for _, dt in ipairs { "i32", "i64", "u8", "i8" } do
    local x, o = inputs[dt], forms[dt]
    local f = agree(dt .. ": all five over " .. dims_name(o), body_of(REDS, o, INT_OPERAND), 2, x)
    local s, m, p, mx, mn = f(x)
    T.is({ s.dtype, m.dtype, p.dtype, mx.dtype, mn.dtype }, { "i64", x:mean().dtype, "i64", dt, dt },
         dt .. ": the results' dtypes")
  end
  -- i32 values that overflow i32 when summed: int64 accumulators
  local big = gpu.full({ 4, 1000 }, 2000000000, { dtype = "i32" })
  agree("i32: sums past 2^31", function(a) return a:sum(), a:sum(2), a:max(), a:mean() end, 2, big)
  -- i64 sums past 2^63 wrap
  local huge = gpu.full({ 4, 1000 }, (1 << 62) + 12345, { dtype = "i64" })
  agree("i64: sums that wrap", function(a) return a:sum(), (a - 1):sum(), a:max(), a:mean() end, 1, huge)
end)

T.test("bool: sums and means of comparisons (i64, f64), max and min of bools", function()
  local x = rand({ 3, 517 })
  for _, o in ipairs { false, { dim = 1, keepdim = true } } do
    agree("bool: all five over " .. dims_name(o), function(a)
      return red(a:gt(0), "sum", o), red(a:lt(1), "mean", o), red(a:ge(-2.9), "prod", o),
             red(a:gt(2.5), "max", o), red(a:lt(2.9), "min", o)
    end, 2, x)
  end
end)

T.test("NaN, inf and -0 in every accumulator", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16" } do
    local v = {}
    for i = 1, 4 * 300 do v[i] = (math.random() - 0.5) * 4 end
    v[7] = 0 / 0                   -- row 1: a NaN
    v[300 + 9] = math.huge         -- row 2: inf and -inf
    v[300 + 250] = -math.huge
    for i = 601, 900 do v[i] = -0.0 end -- row 3: all -0
    v[900 + 5] = math.huge         -- row 4: inf
    local x = gpu.tensor(v, { dtype = dt }):view { 4, 300 }
    agree(dt .. ": specials over dim 2", body_of({ "sum", "max", "min", "prod" }, { dim = 2 },
      { sum = function(a) return a end, max = function(a) return a end, min = function(a) return a end,
        prod = function(a) return a end }), 1, x)
    if dt == "f32" then
      agree(dt .. ": specials over everything", function(a) return a:sum(), a:max(), a:min(), a:mean() end, 1, x)
    end
  end
end)

-- The cuda backend reduces a fused program's values in one pass on the
-- built-in reduction's plan: these are tests/fuse.lua's layouts, each one
-- op that carries several accumulators.
T.test("every layout of the reduction with several accumulators: one op, as unfused", function()
  local function quad(o)
    return function(a)
      return red(a, "sum", o), red(a * a, "sum", o), red(a, "max", o), red(a, "min", o)
    end
  end
  local big = gpu.rand({ 200003 }, { seed = 1 }) - 0.5
  agree("one run of 200003", quad(), 1, big)
  agree("one run of 200003 bf16: mean, prod, max, min", function(a)
    return (a * 3):exp():mean(), (a / 64 + 1):prod(), a:max(), a:min()
  end, 1, big:to("bf16"))
  agree("one run of 200003 f16", quad(), 1, big:to("f16"))
  local m = gpu.rand({ 3, 70001 }, { seed = 2 })
  agree("rows: dim 2 of 3 x 70001", quad { dim = 2 }, 1, m)
  agree("rows keepdim: the last dim", function(a)
    local o = { dim = 2, keepdim = true }
    return red(a * 0.1 + 0.95, "prod", o), red(a, "mean", o), red(a, "max", o), red(a - 0.5, "sum", o)
  end, 1, m)
  local c = gpu.rand({ 9000, 70 }, { seed = 3 })
  agree("columns: dim 1 of 9000 x 70", quad { dim = 1 }, 1, c)
  agree("columns keepdim", quad { dim = 1, keepdim = true }, 1, c)
  local s = gpu.rand({ 5000, 1, 3 }, { seed = 4 })
  agree("strided runs: dim 1 of 5000 x 1 x 3", quad { dim = 1 }, 1, s)
  agree("one output of a strided run: 5000 x 1", quad { dim = 1 }, 1, gpu.rand({ 5000, 1 }, { seed = 5 }))
  local row, col = gpu.rand({ 1, 3000 }, { seed = 6 }), gpu.rand({ 40, 1 }, { seed = 7 })
  agree("broadcast inputs: row x column", function(a, b)
    return (a * b):sum(2), (a + b):max { dim = 2 }, (a - b):min { dim = 2 }, (a * b):mean(2)
  end, 1, row, col)
  agree("broadcast inputs over everything", function(a, b)
    return (a * b):sum(), (a + b):max(), (a - b):min(), (a * b):mean()
  end, 1, row, col)
  agree("a transposed input", quad { dim = 1 }, 1, c:t())
  agree("a transposed input, over dim 2", quad { dim = 2 }, 1, c:t())
  agree("a narrowed, unaligned input", quad(), 1, big:narrow(1, 2, 199999))
  agree("many outputs: dim 2 of 4096 x 33", quad { dim = 2 }, 1, gpu.rand({ 4096, 33 }, { seed = 8 }))
  local i = gpu.arange(1, 100001, { dtype = "i32" })
  agree("i32: floor divisions (wrapping int64 sums)", function(a, d)
    return (a * 7919 // d):sum(), (a // d):max(), (a % d):sum(), (a * 7919 // d):min()
  end, 1, i, 3)
  agree("i64: prod, sum, max, min over a dim", function(a)
    return (a % 5 + 1):prod(2), a:sum(2), a:max { dim = 2 }, a:min { dim = 2 }
  end, 1, i:to("i64"):view(100, 1000))
  agree("bool: sums of comparisons, max and min", function(a)
    return a:gt(0):sum(), a:lt(0):sum(), a:gt(0.4):max(), a:gt(-0.4):min()
  end, 1, big)
  local d3 = gpu.rand({ 7, 300, 5 }, { seed = 9 })
  agree("3-dim: the middle dim of 7 x 300 x 5", quad { dim = 2 }, 1, d3)
  agree("3-dim: the first dim, keepdim", quad { dim = 1, keepdim = true }, 1, d3)
  agree("3-dim: the last dim", quad { dim = 3 }, 1, d3)
  agree("an expanded input (stride 0)", quad { dim = 1 }, 1, gpu.rand({ 1, 600 }, { seed = 10 }):expand { 50, 600 })
  agree("f16 sums past the f16 range: inf as unfused", function(a)
    local v = a * 30000 + 30000
    return v:sum(), (v * 0.5):sum(), v:max(), v:mean()
  end, 1, gpu.rand({ 2000 }, { seed = 11 }):to("f16"))
  agree("0-dim input", function(a)
    return (a + 1):sum(), (a * a):prod(), a:max(), a:min()
  end, 1, gpu.tensor(2.5))
  agree("0-dim input, all five", body_of(REDS), 2, gpu.tensor(-1.5))
end)

T.test("empty tensors: sums, prods and means as unfused; max and min raise as unfused", function()
  local e = gpu.zeros({ 0, 4 })
  agree("empty: sum, prod, mean over everything", function(a)
    return (a + 1):sum(), (a + 1):prod(), (a + 1):mean(), (a * a):sum()
  end, 1, e)
  agree("empty: sum, prod, mean over the empty dim", function(a)
    return (a + 1):sum(1), (a + 1):prod(1), (a + 1):mean(1), a:sum(1)
  end, 1, e)
  -- empty results: as many ops as the direct call's (none on the host)
  local none = launches(function() return e:sum(2) end)
  agree("empty: over the other dim (empty results), max included", function(a)
    return a:sum(2), a:max { dim = 2 }, a:min { dim = 2 }, a:prod(2)
  end, none, e)
  -- max of nothing: the error the unfused call raises, at the caller's line
  local f = gpu.fuse(function(a) return a:sum(), a:max() end, { name = "emptymax" })
  local function msg(fn)
    local ok, err = pcall(fn)
    T.ok(not ok, "raised")
    return tostring(err):gsub("^[^:]+:%d+: ", "")
  end
  local want = msg(function() return e:sum(), e:max() end)
  T.raises_at(function() f(e) end, "max: the reduction of an empty tensor has no identity",
              "an empty max raises at the caller's line (first call)")
  T.raises_at(function() f(e) end, "max: the reduction of an empty tensor has no identity",
              "an empty max raises at the caller's line (second call)")
  T.is(msg(function() f(e) end), want, "the unfused call's message")
  T.is(msg(function() unfused(f, e) end), want, "the reference path's message")
  local g = gpu.fuse(function(a) return a:sum(1), a:max { dim = 1 }, a:min { dim = 1 } end, { name = "emptycols" })
  local o = { gpu.full({ 4 }, 7), gpu.full({ 4 }, 7), gpu.full({ 4 }, 7) }
  T.is(msg(function() g(e, { out = o }) end), msg(function() return e:max { dim = 1 } end),
       "over the empty dim: the unfused max's message")
  gpu.synchronize()
  for k = 1, 3 do check(o[k], gpu.full({ 4 }, 7), "out " .. k .. " not written") end
end)

T.test("on a stream of its own", function()
  local x = rand({ 6, 1001 })
  local st <close> = gpu.stream()
  local f = gpu.fuse(function(a) return a:sum(2), (a * a):sum(2), a:max { dim = 2 }, a:min { dim = 2 } end)
  for call = 1, 2 do
    local r = table.pack(f(x, { stream = st }))
    st:synchronize()
    check(r[1], x:sum(2), "sum (call " .. call .. ")")
    check(r[2], (x * x):sum(2), "sum of squares (call " .. call .. ")")
    check(r[3], x:max { dim = 2 }, "max (call " .. call .. ")")
    check(r[4], x:min { dim = 2 }, "min (call " .. call .. ")")
  end
end)

T.test("bad dims: the unfused call's error, at the caller's line", function()
  local x = rand({ 3, 50 })
  local function msg(fn)
    local ok, err = pcall(fn)
    if ok then return "no error" end
    return (tostring(err):gsub("^[^:]+:%d+: ", ""))
  end
  local cases = {
    { "dim 3 of a 2-dim tensor", function(a) return a:sum(3), a:max { dim = 3 } end, x },
    { "dim -3 of a 2-dim tensor", function(a) return a:sum(-3), a:min { dim = -3 } end, x },
    { "a dim of a 0-dim tensor", function(a) return a:sum(1), a:max { dim = 1 } end, gpu.tensor(2.5) },
    -- refused by the trace: at the line in the body, as tests/fuse.lua's
    { "a dim twice", function(a) return a:sum(2, { dim = 1 }), a:sum(2) end, x, in_body = true },
  }
  for _, c in ipairs(cases) do
    local f = gpu.fuse(c[2])
    local want = msg(function() return c[2](c[3]) end)
    T.ok(want ~= "no error", c[1] .. ": the direct call raises")
    if c.in_body then
      local _, err = pcall(f, c[3])
      local at = SRC .. ":" .. debug.getinfo(c[2], "S").linedefined .. ":"
      T.ok(tostring(err):sub(1, #at) == at, c[1] .. ": raised at the body's line")
    else
      T.raises_at(function() f(c[3]) end, want, c[1] .. ": raised at the caller's line")
    end
    T.is(msg(function() f(c[3]) end), want, c[1] .. ": the direct call's message")
  end
end)

T.test("what is one op and what is not", function()
  local x = rand({ 3, 517 })
  agree("one reduction twice", function(a) return a:sum(), a:sum() end, 1, x)
  local f = gpu.fuse(function(a) return a:sum(), a:sum() end)
  local p, q = f(x)
  T.ok(p ~= q, "two tensors")
  agree("eight sums: two ops", function(a)
    local r = {}
    for k = 1, 8 do r[k] = (a * k):sum() end
    return table.unpack(r)
  end, 2, x)
  agree("nine sums: three ops", function(a)
    local r = {}
    for k = 1, 9 do r[k] = (a + k):sum(2) end
    return table.unpack(r)
  end, 3, x)
  agree("another dim: two ops", function(a) return a:sum(1), a:sum(2), a:max { dim = 1 } end, 2, x)
  agree("another keepdim: two ops", function(a)
    return a:sum(2), a:sum { dim = 2, keepdim = true }, a:max { dim = 2 }
  end, 2, x)
  agree("another value dtype (f64): two ops", function(a) return a:sum(), a:to("f64"):sum(), a:max() end, 2, x)
  agree("bool values beside f32: two ops", function(a) return a:gt(0):sum(), a:sum() end, 2, x)
  agree("i32 and i64 values, both summed to i64: two ops", function(a)
    return a:to("i32"):sum(), a:to("i64"):sum()
  end, 2, x)
  agree("one value dtype, three result dtypes: one op", function(a)
    local i = a:to("i32")
    return i:sum(), i:max(), i:mean()
  end, 1, x)
  agree("elementwise results beside reductions: two ops", function(a)
    return a * 2, a:sum(), a + 1, a:max()
  end, 2, x)
  agree("interleaved dims: two ops, the results in order", function(a)
    return a:sum(), a:sum(1), a:max(), a:max { dim = 1 }
  end, 2, x)
  agree("two shape patterns: two ops", function(a, b) return a:sum(), b:sum(), a:max(), b:max() end, 2, x,
        rand({ 1, 517 }))
  local inner = gpu.fuse(function(a) return a:sum(), a:max() end)
  agree("another fused function's reductions, traced in, beside one more: one op", function(a)
    local s, m = inner(a * 2)
    return s, m, (a * a):sum()
  end, 1, x)
  -- dim 2 and dim -1 of a 2-dim input are one dim (the group key takes
  -- the dim as the op does)
  local n = launches(function() return gpu.fuse(function(a) return a:sum(2), a:max { dim = -1 } end)(x) end)
  T.is(n, 1, "dim 2 and dim -1 of a 2-dim input: one op")
  agree("dim 2 and dim -1 of a 2-dim input: the unfused values", function(a)
    return a:sum(2), a:max { dim = -1 }
  end, nil, x)
end)

T.test("out = {...}: one tensor per result, written and returned", function()
  local x = rand({ 3, 517 })
  local f = gpu.fuse(function(a) return a:sum(2), (a * a):sum(2), a:max { dim = 2 }, a:min { dim = 2 } end,
                     { name = "rowstats" })
  local want = table.pack(f(x))
  local o = { gpu.empty({ 3 }), gpu.zeros({ 7 }):narrow(1, 2, 3), gpu.empty({ 3 }), gpu.empty({ 3 }) }
  for call = 1, 2 do
    local n, a, b, c, d = launches(function() return f(x, { out = o }) end)
    T.is(n, 1, "one op (call " .. call .. ")")
    T.ok(a == o[1] and b == o[2] and c == o[3] and d == o[4], "returns the outs (call " .. call .. ")")
    for k = 1, 4 do check(o[k], want[k], "out " .. k .. " (call " .. call .. ")") end
  end
  -- five results (two ops), keepdim outs, an int sum into an i64 out
  local g = gpu.fuse(function(a)
    local i = a:to("i32")
    return i:sum(1, { keepdim = true }), i:max { dim = 1, keepdim = true }, i:mean(1, { keepdim = true }),
           i:prod(1, { keepdim = true }), i:min { dim = 1, keepdim = true }
  end)
  local wg = table.pack(g(x))
  local og = {}
  for k = 1, 5 do og[k] = gpu.empty({ 1, 517 }, { dtype = wg[k].dtype }) end
  local r = table.pack(g(x, { out = og }))
  for k = 1, 5 do
    T.ok(r[k] == og[k], "five results: out " .. k .. " returned")
    check(og[k], wg[k], "five results: out " .. k)
  end
  -- the reference path writes the same outs
  local ou = {}
  for k = 1, 4 do ou[k] = gpu.empty({ 3 }) end
  unfused(f, x, { out = ou })
  for k = 1, 4 do check(ou[k], want[k], "unfused: out " .. k) end
end)

T.test("bad outs: refused at the caller's line, nothing written", function()
  local x = rand({ 3, 517 })
  local xi = ints({ 3, 517 }, "i32", -100, 100)
  local f = gpu.fuse(function(a) return a:sum(2), (a * a):sum(2), a:max { dim = 2 } end, { name = "st" })
  local fi = gpu.fuse(function(a) return a:sum(2), a:max { dim = 2 } end, { name = "sti" })
  f(x) -- traced: the calls below may take the C path
  fi(xi)
  local function outs() return { gpu.full({ 3 }, 7), gpu.full({ 3 }, 7), gpu.full({ 3 }, 7) } end
  local function untouched(o, what)
    gpu.synchronize()
    local seven = gpu.full({ 3 }, 7)
    for k = 1, #o do
      if o[k].dtype == "f32" and o[k].shape[1] == 3 and #o[k].shape == 1 then
        check(o[k], seven, what .. ": out " .. k .. " untouched")
      end
    end
  end
  for call = 1, 2 do
    local o = outs()
    local c = " (call " .. call .. ")"
    T.raises_at(function() f(x, { out = { o[1], o[2] } }) end, "st: out must be a list of 3 tensors",
                "a list of two outs for three results" .. c)
    T.raises_at(function() f(x, { out = { o[1], o[2], o[3], o[1] } }) end, "st: out must be a list of 3 tensors",
                "a list of four outs" .. c)
    T.raises_at(function() f(x, { out = o[1] }) end, "st: out must be a list of 3 tensors", "one tensor, not a list" .. c)
    T.raises_at(function() fi(xi, { out = { gpu.zeros({ 3 }), gpu.zeros({ 3 }, { dtype = "i32" }) } }) end,
                "bad option 'out' to 'sti' (f32 {3} does not match the result i64 {3})",
                "an f32 out for an integer sum (i64)" .. c)
    T.raises_at(function() fi(xi, { out = { gpu.zeros({ 3 }, { dtype = "i64" }), gpu.zeros({ 3 }, { dtype = "i64" }) } }) end,
                "bad option 'out' to 'sti' (i64 {3} does not match the result i32 {3})",
                "an i64 out for an i32 max" .. c)
    T.raises_at(function() f(x, { out = { o[1], o[2], gpu.zeros({ 3 }, { dtype = "f64" }) } }) end,
                "(f64 {3} does not match the result f32 {3})", "an out of the wrong dtype, last" .. c)
    T.raises_at(function() f(x, { out = { o[1], o[2], gpu.zeros({ 4 }) } }) end,
                "(f32 {4} does not match the result f32 {3})", "an out of the wrong shape" .. c)
    T.raises_at(function() f(x, { out = { o[1], gpu.zeros({ 3, 1 }), o[3] } }) end,
                "(f32 {3,1} does not match the result f32 {3})", "a keepdim shape where none was asked" .. c)
    T.raises_at(function() f(x, { out = { o[1], o[1], o[3] } }) end,
                "st: results 1 and 2 are written to overlapping memory", "one tensor for two results" .. c)
    local b = gpu.full({ 5 }, 7)
    T.raises_at(function() f(x, { out = { o[1], b:narrow(1, 1, 3), b:narrow(1, 3, 3) } }) end,
                "st: results 2 and 3 are written to overlapping memory", "two overlapping views" .. c)
    T.raises_at(function() f(x, { out = { o[1], "o", o[3] } }) end, "gpu.Tensor expected, got string",
                "a string for an out" .. c)
    untouched(o, "refused calls" .. c)
    check(b, gpu.full({ 5 }, 7), "the overlapping views untouched" .. c)
  end
  -- five results are two ops: every out is checked before the first op
  -- writes anything
  local five = gpu.fuse(function(a) return a:sum(2), a:mean(2), a:max { dim = 2 }, a:min { dim = 2 }, a:prod(2) end,
                        { name = "five" })
  local o = { gpu.full({ 3 }, 7), gpu.full({ 3 }, 7), gpu.full({ 3 }, 7), gpu.full({ 3 }, 7) }
  T.raises_at(function() five(x, { out = { o[1], o[2], o[3], o[4], gpu.zeros({ 4 }) } }) end,
              "(f32 {4} does not match the result f32 {3})", "five results: a bad fifth out is refused")
  gpu.synchronize()
  local kept = true
  for k = 1, 4 do kept = kept and same(o[k], gpu.full({ 3 }, 7)) end
  T.ok(kept, "five results: the first op's outs untouched by a bad fifth out")
  local six = gpu.fuse(function(a) return a + 1, a + 2, a + 3, a + 4, a + 5, a + 6 end)
  local e = {}
  for k = 1, 5 do e[k] = gpu.full({ 3, 517 }, 7) end
  T.raises_at(function() six(x, { out = { e[1], e[2], e[3], e[4], e[5], gpu.zeros({ 4 }) } }) end,
              "does not match", "six elementwise results: a bad sixth out is refused")
  gpu.synchronize()
  kept = true
  for k = 1, 5 do kept = kept and same(e[k], gpu.full({ 3, 517 }, 7)) end
  T.ok(kept, "six elementwise results: the other outs untouched by a bad sixth out")
  -- the reference path (gpu._fuse's unfused, the oracle of these files)
  -- checks the outs as the fused op does, before it writes any
  local ro = outs()
  T.raises(function() unfused(f, x, { out = { ro[1], ro[2], gpu.zeros({ 4 }) } }) end,
           "(f32 {4} does not match the result f32 {3})", "reference path: a bad last out is refused")
  gpu.synchronize()
  T.ok(same(ro[1], gpu.full({ 3 }, 7)), "reference path: the first outs untouched by a bad last out")
  T.raises(function() unfused(f, x, { out = { ro[1], ro[1], ro[3] } }) end, "overlapping memory",
           "reference path: one tensor for two results is refused")
end)

T.test("the C path: second calls, new tensors, number parameters", function()
  local stats = gpu.fuse(function(a) return a:sum(), (a * a):sum(), a:max(), a:min() end, { name = "stats" })
  local x, y = rand({ 5, 300 }), rand({ 5, 300 })
  stats(x)
  local n, s, q, mx, mn = launches(function() return stats(y) end)
  T.is(n, 1, "another tensor of the signature: one op")
  check(s, y:sum(), "its sum")
  check(q, (y * y):sum(), "its sum of squares")
  check(mx, y:max(), "its max")
  check(mn, y:min(), "its min")
  T.is(stats:stats().traces, 1, "one trace")
  local scaled = gpu.fuse(function(a, k) return (a * k):sum(), (a * k):max(), (a * k):min() end)
  for _, k in ipairs { 2, 3, -0.5 } do
    local n2, a, b, c = launches(function() return scaled(x, k) end)
    T.is(n2, 1, "k = " .. k .. ": one op")
    check(a, (x * k):sum(), "k = " .. k .. ": sum")
    check(b, (x * k):max(), "k = " .. k .. ": max")
    check(c, (x * k):min(), "k = " .. k .. ": min")
  end
  T.is(scaled:stats().traces, 1, "numbers: no new trace")
  -- inputs that do not broadcast together: one op per result, on the Lua
  -- path (first call) and the C path (second); then shapes that agree
  local function pair() return gpu.fuse(function(a, b) return (a * 2):sum(), (b * 2):sum() end) end
  local a3, b4, c3 = rand({ 3 }), rand({ 4 }), rand({ 3 })
  local f = pair()
  for call = 1, 2 do
    local n3, u, w = launches(function() return f(a3, b4) end)
    T.is(n3, 2, "{3} and {4}: two ops (call " .. call .. ")")
    check(u, (a3 * 2):sum(), "{3} and {4}: a's sum (call " .. call .. ")")
    check(w, (b4 * 2):sum(), "{3} and {4}: b's sum (call " .. call .. ")")
  end
  for call = 1, 2 do
    local n3, u, w = launches(function() return f(a3, c3) end)
    T.is(n3, 1, "then {3} and {3}: one op (call " .. call .. ")")
    check(u, (a3 * 2):sum(), "{3} and {3}: a's sum (call " .. call .. ")")
    check(w, (c3 * 2):sum(), "{3} and {3}: c's sum (call " .. call .. ")")
  end
  local g = pair()
  T.is((launches(function() return g(a3, c3) end)), 1, "{3} and {3} first (Lua path): one op")
  local n4, u, w = launches(function() return g(a3, b4) end)
  T.is(n4, 2, "then {3} and {4} (C path): two ops")
  check(u, (a3 * 2):sum(), "a's sum")
  check(w, (b4 * 2):sum(), "b's sum")
  T.is(g:stats().traces, 1, "one trace for both")
  -- outs that do not broadcast together either
  local o1, o2 = gpu.empty({}), gpu.empty({})
  T.ok(select(2, g(a3, b4, { out = { o1, o2 } })) == o2, "outs on the fallback: returned")
  check(o1, (a3 * 2):sum(), "outs on the fallback: out 1")
  check(o2, (b4 * 2):sum(), "outs on the fallback: out 2")
end)

T.test("inside gpu.graph: one node, replayed with new values", function()
  local x = gpu.rand({ 4, 5000 }, { seed = 8 })
  local y = { gpu.empty({ 4 }), gpu.empty({ 4 }), gpu.empty({ 4 }), gpu.empty({ 4 }) }
  local st = gpu.fuse(function(a, k)
    local v = a * k
    return v:sum(2), v:max { dim = 2 }, v:min { dim = 2 }, v:square():sum(2)
  end)
  st(x, 3, { out = y })
  local g = gpu.graph(function() st(x, 3, { out = y }) end)
  T.is(g.nodes, 1, "one node")
  for round = 1, 2 do
    for k = 1, 4 do y[k]:fill(0) end
    x:copy(gpu.rand({ 4, 5000 }, { seed = 8 + round }))
    g:launch()
    gpu.synchronize()
    local v = x * 3
    check(y[1], v:sum(2), "replay " .. round .. ": sum")
    check(y[2], v:max { dim = 2 }, "replay " .. round .. ": max")
    check(y[3], v:min { dim = 2 }, "replay " .. round .. ": min")
    check(y[4], v:square():sum(2), "replay " .. round .. ": sum of squares")
  end
  g:close()
  -- a fused function first called (traced) inside the capture
  local fresh = gpu.fuse(function(a) return a:sum(1), a:max { dim = 1 } end)
  local z1, z2 = gpu.empty({ 5000 }), gpu.empty({ 5000 })
  local g2 = gpu.graph(function() fresh(x, { out = { z1, z2 } }) end)
  T.is(g2.nodes, 1, "traced inside the capture: one node")
  x:copy(gpu.rand({ 4, 5000 }, { seed = 20 }))
  g2:launch()
  gpu.synchronize()
  check(z1, x:sum(1), "traced inside the capture: the replay's sum")
  check(z2, x:max { dim = 1 }, "traced inside the capture: the replay's max")
  g2:close()
end)

T.test("integer division by zero inside: raised at the next sync, naming the call", function()
  local i = gpu.arange(1, 100001, { dtype = "i32" })
  for call = 1, 2 do
    local f = gpu.fuse(function(a, b) return (a // b):sum(), (a // b):max(), (a % b):min() end, { name = "idivstats" })
    if call == 2 then f(i, i + 1) end -- traced: the failing call takes the C path
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() f(i, i - 5); gpu.synchronize() end)
    err = tostring(err)
    T.ok(not ok and err:find("integer division by zero", 1, true), "a zero divisor raises at the sync (call " .. call .. ")")
    T.ok(err:find("idivstats", 1, true), "names the fused function (call " .. call .. ")")
    T.ok(err:find(SRC .. ":" .. line, 1, true) ~= nil, "at the call's line (call " .. call .. ")")
    if not ok then T.diag(err) end
  end
  local s = gpu.fuse(function(a, b) return (a // b):sum(), (a // b):max() end)(i, i + 1)
  check(s, (i // (i + 1)):sum(), "then the next call runs")
end)

T.test("under --check races: the reductions are writes of the one op", function()
  local script = T.tmpfile([[
local gpu = require "gpu"
local f = gpu.fuse(function(a) return a:sum(), (a * a):sum(), a:max() end, { name = "stats3" })
local x = gpu.ones({ 1000 })
local y, z, w = gpu.zeros({}), gpu.zeros({}), gpu.zeros({})
local s1, s2 = gpu.stream(), gpu.stream()
do local _ <close> = gpu.using(s1); f(x, { out = { y, z, w } }) end
s2:wait(s1)
do local _ <close> = gpu.using(s2); local v = w * 3 end
gpu.synchronize()
print("ordered ok")
do local _ <close> = gpu.using(s1); f(x, { out = { y, z, w } }) end
do local _ <close> = gpu.using(s2); local v = w * 3 end
gpu.synchronize()
print("unreachable")
]])
  local out = T.run("", "--check races " .. script)
  T.ok(out:find("ordered ok", 1, true), "an ordered script runs")
  T.ok(out:find("stats3", 1, true) and out:find("race", 1, true) and not out:find("unreachable", 1, true),
       "reading the third result unordered is refused, naming the call")
  if not out:find("race", 1, true) then T.diag(out) end
  os.remove(script)
end)

T.test("f:stats(): one trace per signature", function()
  local f = gpu.fuse(function(a) return a:sum(), a:max(), a:min() end)
  for k = 1, 3 do f(rand({ 3, 100 + k })) end
  T.is(f:stats(), { traces = 1, calls = 3 }, "three calls of one signature: one trace")
  f(rand({ 3, 1 }))
  f(rand({ 3, 100 }, "f64"))
  f(rand({ 300 }))
  T.is(f:stats().traces, 4, "a dim of size 1, another dtype, another rank: a trace each")
  f(rand({ 3, 1 }))
  T.is(f:stats(), { traces = 4, calls = 7 }, "a signature seen: no new trace")
end)

T.done()
