-- Elementwise ops (unary, binary, scalar, metamethods, in place, out=,
-- broadcasting), integer semantics, casts between every dtype pair, and
-- views, each against a plain-Lua reference.
local gpu = require "gpu"
local T = require "gpu.test"

-- result of an f32 computation stored in dtype (f16/bf16 compute in f32)
local function store(dt)
  if dt == "f64" then return function(x) return x end end
  if dt == "f32" then return T.round_f32 end
  local r = dt == "f16" and T.round_f16 or T.round_bf16
  return function(x) return r(T.round_f32(x)) end
end

local TOL = { f64 = { rel = 1e-12, abs = 1e-300 }, f32 = { rel = 1e-6, abs = 1e-37 },
              f16 = { rel = 1e-3, abs = 6e-8 }, bf16 = { rel = 8e-3, abs = 1e-37 } }

local function map2(a, b, f)
  local r = {}
  for i = 1, #a do r[i] = f(a[i], type(b) == "table" and b[i] or b) end
  return r
end

local function in_dtype(list, dt)
  local r = {}
  for i, x in ipairs(list) do r[i] = T.cast(x, dt) end
  return r
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end
local function tanh(x)
  if x > 20 then return 1.0 elseif x < -20 then return -1.0 end
  local e = math.exp(2 * x)
  return (e - 1) / (e + 1)
end

T.test("unary ops on float dtypes", function()
  local xs = { -3.5, -1.25, -0.5, 0, 0.5, 1, 2.75, 10 }
  local pos = { 0.25, 0.5, 1, 2, 3.75, 100 }
  local approx = { exp = math.exp, log = math.log, sigmoid = sigmoid, tanh = tanh }
  for _, dt in ipairs(T.float_dtypes) do
    local R = store(dt)
    local t = gpu.tensor(in_dtype(xs, dt), { dtype = dt })
    local p = gpu.tensor(in_dtype(pos, dt), { dtype = dt })
    T.is(t:neg():totable(), map2(xs, nil, function(x) return R(-x) end), dt .. " neg")
    T.is(t:abs():totable(), map2(xs, nil, function(x) return R(math.abs(x)) end), dt .. " abs")
    T.is(t:relu():totable(), map2(xs, nil, function(x) return R(math.max(x, 0)) end), dt .. " relu")
    T.is(p:sqrt():totable(), map2(pos, nil, function(x) return R(math.sqrt(x)) end), dt .. " sqrt (correctly rounded)")
    for name, f in pairs(approx) do
      local src = name == "log" and p or t
      local list = name == "log" and pos or xs
      T.near(src[name](src):totable(), map2(list, nil, function(x) return R(f(x)) end), TOL[dt], dt .. " " .. name)
    end
    T.is((-t):totable(), t:neg():totable(), dt .. " unary minus metamethod")
    local sp = gpu.tensor({ 0, -1, 1000, -1000 }, { dtype = dt })
    local lg = sp:log():totable()
    T.is(lg[1], -math.huge, dt .. " log(0) = -inf")
    T.ok(lg[2] ~= lg[2], dt .. " log(-1) = nan")
    T.ok(sp:sqrt():totable()[2] ~= sp:sqrt():totable()[2], dt .. " sqrt(-1) = nan")
    local ex = sp:exp():totable()
    if dt ~= "f64" then T.is(ex[3], math.huge, dt .. " exp(1000) = inf") end
    T.is(ex[4], 0.0, dt .. " exp(-1000) = 0")
  end
end)

local IVALS = {
  i8 = { -128, -5, 0, 7, 127 }, u8 = { 0, 1, 200, 255 },
  i32 = { -2147483648, -7, 0, 9, 2147483647 }, i64 = { math.mininteger, -7, 0, 9, math.maxinteger },
}

T.test("unary ops on integer and bool dtypes", function()
  for _, dt in ipairs(T.int_dtypes) do
    local xs = IVALS[dt]
    local t = gpu.tensor(xs, { dtype = dt })
    T.is(t:neg():totable(), map2(xs, nil, function(x) return T.cast(-x, dt) end), dt .. " neg wraps")
    T.is(t:abs():totable(), map2(xs, nil, function(x) return T.cast(math.abs(x), dt) end), dt .. " abs wraps")
    T.is(t:relu():totable(), map2(xs, nil, function(x) return math.max(x, 0) end), dt .. " relu")
    for _, op in ipairs { "exp", "log", "sqrt", "sigmoid", "tanh" } do
      T.raises_at(function() return t[op](t) end, { "float", dt }, dt .. " " .. op .. " raises (needs a float dtype)")
    end
  end
  local b = gpu.tensor({ true, false }, { dtype = "bool" })
  for _, op in ipairs { "neg", "abs", "exp", "sqrt" } do
    T.raises_at(function() return b[op](b) end, "bool", "bool " .. op .. " raises")
  end
  T.raises_at(function() return -b end, "bool", "bool unary minus raises")
end)

-- binary operands: floats
local FA = { -3.5, -1.25, 0.5, 2, 7.75, 100, 0 }
local FB = { 2, -0.5, 3, 0.25, -1.5, 3, 4 }
local FOPS = {
  add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end, div = function(a, b) return a / b end,
  max = math.max, min = math.min,
}

T.test("binary ops on float dtypes: tensor, scalar, metamethods", function()
  for _, dt in ipairs(T.float_dtypes) do
    local R = store(dt)
    local a = gpu.tensor(FA, { dtype = dt })
    local b = gpu.tensor(FB, { dtype = dt })
    for name, f in pairs(FOPS) do
      T.is(a[name](a, b):totable(), map2(FA, FB, function(x, y) return R(f(x, y)) end), dt .. " " .. name .. " tensor")
      T.is(a[name](a, 2.5):totable(), map2(FA, 2.5, function(x, y) return R(f(x, y)) end), dt .. " " .. name .. " scalar")
    end
    T.near(a:pow(b):totable(), map2(FA, FB, function(x, y) return R(x ^ y) end), TOL[dt], dt .. " pow tensor")
    T.near(a:pow(2):totable(), map2(FA, 2, function(x, y) return R(x ^ y) end), TOL[dt], dt .. " pow scalar")
    T.is((a + b):totable(), a:add(b):totable(), dt .. " a + b")
    T.is((a - 1.5):totable(), map2(FA, 1.5, function(x, y) return R(x - y) end), dt .. " a - 1.5")
    T.is((a * 2):totable(), map2(FA, 2, function(x, y) return R(x * y) end), dt .. " a * 2")
    T.is((2 - a):totable(), map2(FA, 2, function(x, y) return R(y - x) end), dt .. " 2 - a")
    T.is((2 / b):totable(), map2(FB, 2, function(x, y) return R(y / x) end), dt .. " 2 / b")
    T.is((3 * a):totable(), (a * 3):totable(), dt .. " 3 * a")
    T.is((a / b):totable(), a:div(b):totable(), dt .. " a / b")
    local z = gpu.tensor({ 1, -1, 0 }, { dtype = dt }):div(0):totable()
    T.is(z[1], math.huge, dt .. " 1/0 = inf")
    T.is(z[2], -math.huge, dt .. " -1/0 = -inf")
    T.ok(z[3] ~= z[3], dt .. " 0/0 = nan")
  end
  T.raises_at(function() return gpu.ones({2}) + gpu.ones({2}, { dtype = "f64" }) end, "dtype",
              "f32 + f64 tensors raises (same dtype needed)")
end)

local IA = { i8 = { -7, 7, -7, 7, 100, 3, 0, -128 }, u8 = { 7, 200, 255, 0, 100, 13, 1, 128 } }
IA.i32 = { -7, 7, -7, 7, 100000, 3, 0, -2147483648 }
IA.i64 = { -7, 7, -7, 7, 4000000000, 3, 0, math.mininteger }
local IB = { i8 = { 2, 2, -2, -2, 7, 3, 5, 3 }, u8 = { 2, 100, 3, 5, 7, 13, 255, 2 } }
IB.i32 = { 2, 2, -2, -2, 70000, 3, 5, 3 }
IB.i64 = { 2, 2, -2, -2, 4000000000, 3, 5, 3 }
local IE = { 2, 3, 0, 1, 2, 3, 5, 1 }     -- exponents for pow

T.test("binary ops on integer dtypes: wrap and floor division", function()
  local iops = {
    add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
    mul = function(a, b) return a * b end, div = function(a, b) return a // b end,
    max = math.max, min = math.min,
  }
  for _, dt in ipairs(T.int_dtypes) do
    local A, B = IA[dt], IB[dt]
    local a = gpu.tensor(A, { dtype = dt })
    local b = gpu.tensor(B, { dtype = dt })
    for name, f in pairs(iops) do
      T.is(a[name](a, b):totable(), map2(A, B, function(x, y) return T.cast(f(x, y), dt) end), dt .. " " .. name)
      T.is(a[name](a, 3):totable(), map2(A, 3, function(x, y) return T.cast(f(x, y), dt) end), dt .. " " .. name .. " scalar")
    end
    local e = gpu.tensor(IE, { dtype = dt })
    local powref = map2(A, IE, function(x, y)
      local r = 1
      for _ = 1, y do r = r * x end
      return T.cast(r, dt)
    end)
    T.is(a:pow(e):totable(), powref, dt .. " pow (non-negative exponents, wraps)")
    T.is((100 - a):totable(), map2(A, 100, function(x, y) return T.cast(y - x, dt) end), dt .. " 100 - a")
    T.is((100 / b):totable(), map2(B, 100, function(x, y) return T.cast(y // x, dt) end), dt .. " 100 / b floors")
    if dt ~= "u8" then
      T.is(a:add(-1):totable(), map2(A, -1, function(x, y) return T.cast(x + y, dt) end), dt .. " add(-1)")
    end
    T.raises_at(function() return a:add(1.5) end, "bad argument", dt .. " non-integer scalar raises")
    T.raises_at(function() return a:div(0) end, "division by zero", dt .. " div by scalar 0 raises at once")
    T.raises_at(function() return a / 0 end, "division by zero", dt .. " a / 0 raises at once")
  end
  -- the one quotient that overflows: wraps instead of trapping
  for _, dt in ipairs { "i8", "i32", "i64" } do
    local lo = T.int_range(dt)
    T.is(gpu.tensor({ lo }, { dtype = dt }):div(-1):totable(), { lo }, dt .. " min // -1 wraps to min")
  end
end)

T.test("integer division by a zero tensor raises at the next sync", function()
  local a = gpu.tensor({ 1, 2, 3 }, { dtype = "i32" })
  local z = gpu.tensor({ 1, 0, 1 }, { dtype = "i32" })
  local ok = pcall(function() return a:div(z) end)
  T.ok(ok, "enqueueing the division does not raise")
  T.raises(function() gpu.synchronize() end, "division by zero", "the next sync raises 'division by zero'")
  T.ok(pcall(gpu.synchronize), "the error is reported once; the next sync is clean")
  T.is((a + 1):totable(), { 2, 3, 4 }, "runtime usable after the async error")
end)

T.test("bool supports max/min only among elementwise ops", function()
  local a = gpu.tensor({ true, true, false, false }, { dtype = "bool" })
  local b = gpu.tensor({ true, false, true, false }, { dtype = "bool" })
  T.is(a:max(b):totable(), { true, true, true, false }, "bool max is or")
  T.is(a:min(b):totable(), { true, false, false, false }, "bool min is and")
  for _, op in ipairs { "add", "sub", "mul", "div", "pow" } do
    T.raises_at(function() return a[op](a, b) end, "bool", "bool " .. op .. " raises")
  end
  T.raises_at(function() return a + b end, "bool", "bool + bool raises")
end)

T.test("in place and out=", function()
  local a = gpu.tensor({ 1, 2, 3 }, { dtype = "f32" })
  local r = a:add_(10)
  T.is(a:totable(), { 11.0, 12.0, 13.0 }, "add_ changes the tensor")
  T.ok(rawequal(r, a), "add_ returns the tensor itself")
  a:mul_(gpu.tensor({ 2.0, 0, -1 }))
  T.is(a:totable(), { 22.0, 0.0, -13.0 }, "mul_ with a tensor")
  a:neg_()
  T.is(a:totable(), { -22.0, -0.0, 13.0 }, "neg_")
  a:relu_()
  T.is(a:totable(), { 0.0, 0.0, 13.0 }, "relu_")
  local i = gpu.tensor({ 7, -7 }, { dtype = "i64" })
  i:div_(2)
  T.is(i:totable(), { 3, -4 }, "div_ floors on i64")
  local o = gpu.empty({3})
  local x = gpu.tensor({ 1, 4, 9 }, { dtype = "f32" })
  local ro = x:sqrt { out = o }
  T.is(o:totable(), { 1.0, 2.0, 3.0 }, "sqrt{out=} writes into out")
  T.ok(rawequal(ro, o), "out= returns out")
  x:sub(1, { out = o })
  T.is(o:totable(), { 0.0, 3.0, 8.0 }, "sub(1, {out=})")
  x:add(x, { out = x })
  T.is(x:totable(), { 2.0, 8.0, 18.0 }, "out= may alias an input")
  T.raises_at(function() x:add(1, { out = gpu.empty({4}) }) end, "out", "out= with the wrong shape raises")
  T.raises_at(function() x:add(1, { out = gpu.empty({3}, { dtype = "f64" }) }) end, "out",
              "out= with the wrong dtype raises")
end)

T.test("broadcasting", function()
  local c = gpu.tensor({ { 1 }, { 2 }, { 3 } }, { dtype = "i32" })         -- {3,1}
  local r = gpu.tensor({ { 10, 20, 30, 40 } }, { dtype = "i32" })          -- {1,4}
  local s = c + r
  T.is(s.shape, { 3, 4 }, "{3,1} + {1,4} -> {3,4}")
  T.is(s:totable(), { { 11, 21, 31, 41 }, { 12, 22, 32, 42 }, { 13, 23, 33, 43 } }, "{3,1} + {1,4} values")
  local m = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local v = gpu.tensor({ 10, 20, 30 })
  T.is((m * v):totable(), { { 10.0, 40.0, 90.0 }, { 40.0, 100.0, 180.0 } }, "{2,3} * {3}")
  T.is((v - m):totable(), { { 9.0, 18.0, 27.0 }, { 6.0, 15.0, 24.0 } }, "{3} - {2,3}")
  T.is((m + gpu.tensor(1)):totable(), { { 2.0, 3.0, 4.0 }, { 5.0, 6.0, 7.0 } }, "{2,3} + 0-dim")
  m:add_(v)
  T.is(m:totable(), { { 11.0, 22.0, 33.0 }, { 14.0, 25.0, 36.0 } }, "add_ broadcasts the operand")
  T.raises_at(function() return m + gpu.tensor({ 1, 2 }) end, { "shape", "broadcast" }, "{2,3} + {2} raises")
  T.raises_at(function() v:add_(m) end, { "shape", "broadcast" }, "in place into a smaller tensor raises")
end)

-- cast sources: representable values of each dtype
local CAST_SRC = { 0, 1.5, -2.5, 3.75, -3.75, 200.5, -200.5, 1e10, -1e10, 70000, 0.1, 0 / 0, 1 / 0, -1 / 0 }
local CAST_INT = { 0, 1, -1, 127, -128, 255, 256, 300, -300, 70000, 2147483647, -2147483648, 1 << 40, math.mininteger }

T.test("casts between every pair of dtypes", function()
  for _, from in ipairs(T.dtypes) do
    local src
    if from == "bool" then src = { true, false, true }
    elseif T.is_float(from) then src = in_dtype(CAST_SRC, from)
    else src = in_dtype(CAST_INT, from) end
    local t = gpu.tensor(src, { dtype = from })
    for _, to in ipairs(T.dtypes) do
      local c = t:to(to)
      T.is(c.dtype, to, from .. " -> " .. to .. " dtype")
      T.is(c:totable(), map2(src, nil, function(x) return T.cast(x, to) end), from .. " -> " .. to .. " values")
    end
  end
  local p = gpu.tensor({ 1.75, -1.75 }):to { device = "pinned", dtype = "i8" }
  T.is({ p.device, p.dtype, p:totable() }, { "pinned", "i8", { 1, -1 } }, "to{device=, dtype=} truncates")
end)

T.test("narrow and view share storage", function()
  local base = gpu.arange(12, { dtype = "i32" }):view({3, 4})
  T.is(base:totable(), { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 } }, "view {3,4}")
  local row = base:narrow(1, 2, 1)
  T.is(row.shape, { 1, 4 }, "narrow(1, 2, 1) shape")
  T.is(row:totable(), { { 4, 5, 6, 7 } }, "narrow picks row 2 (1-based)")
  row:fill(-1)
  T.is(base:totable()[2], { -1, -1, -1, -1 }, "filling a row view writes the base")
  local cols = base:narrow(2, 2, 2)
  T.is(cols.shape, { 3, 2 }, "narrow(2, 2, 2) shape")
  T.is(cols:is_contiguous(), false, "a column slice is not contiguous")
  T.is(cols:totable(), { { 1, 2 }, { -1, -1 }, { 9, 10 } }, "column slice values")
  T.is((cols * 10):totable(), { { 10, 20 }, { -10, -10 }, { 90, 100 } }, "op on a non-contiguous view")
  cols:add_(100)
  T.is(base:totable(), { { 0, 101, 102, 3 }, { -1, 99, 99, -1 }, { 8, 109, 110, 11 } },
       "in place op through a non-contiguous view writes the base")
  cols:copy(gpu.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, { dtype = "i32" }))
  T.is(base:totable(), { { 0, 1, 2, 3 }, { -1, 3, 4, -1 }, { 8, 5, 6, 11 } }, "copy into a non-contiguous view")
  local cc = cols:contiguous()
  T.is(cc:is_contiguous(), true, "contiguous() gives a contiguous tensor")
  T.is(cc:totable(), cols:totable(), "contiguous() keeps the values")
  cc:fill(0)
  T.is(cols:totable(), { { 1, 2 }, { 3, 4 }, { 5, 6 } }, "contiguous() of a view is a copy")
  local cl = base:clone()
  cl:fill(7)
  T.is(base:get(1, 1), 0, "clone() is independent")
  local flat = base:view({-1})
  T.is(flat.shape, { 12 }, "view({-1})")
  flat:set(12, 42)
  T.is(base:get(3, 4), 42, "set through a view writes the base")
  T.is(base:view({2, -1}).shape, { 2, 6 }, "view({2, -1})")
  T.raises_at(function() cols:view({6}) end, "contiguous", "view of a non-contiguous tensor raises")
  local nn = base:narrow(1, 2, 2):narrow(2, 2, 2)
  T.is(nn:totable(), { { 3, 4 }, { 5, 6 } }, "narrow of a narrow")
  T.is(base:narrow(-1, 4, 1):totable(), { { 3 }, { -1 }, { 42 } }, "narrow with dim -1")
end)

-- comparison operands: every dtype, with ties, NaN for floats
local CA = { -3, -1, 0, 0, 2, 5, 7, 100 }
local CB = { 2, -1, 0, 1, 2, 4, 9, 100 }
local CMP = {
  eq = function(a, b) return a == b end, ne = function(a, b) return a ~= b end,
  lt = function(a, b) return a < b end, le = function(a, b) return a <= b end,
  gt = function(a, b) return a > b end, ge = function(a, b) return a >= b end,
}

T.test("comparisons: every dtype, tensor and number, a bool result", function()
  for _, dt in ipairs(T.dtypes) do
    local A, B, sc = CA, CB, 2
    if dt == "u8" then
      A = map2(CA, nil, function(x) return math.abs(x) end)
      B = map2(CB, nil, function(x) return math.abs(x) end)
    end
    if dt == "bool" then A, B, sc = { 1, 0, 0, 1 }, { 1, 1, 0, 0 }, true end
    local a = gpu.tensor(A, { dtype = dt })
    local b = gpu.tensor(B, { dtype = dt })
    -- values as stored, bool as 0/1
    local num = function(x) x = T.cast(x, dt); return type(x) == "boolean" and (x and 1 or 0) or x end
    local av, bv = map2(A, nil, num), map2(B, nil, num)
    local sv = dt == "bool" and 1 or sc
    for name, f in pairs(CMP) do
      local r = a[name](a, b)
      T.is({ r.dtype, r.shape }, { "bool", { #A } }, dt .. " " .. name .. ": bool, same shape")
      T.is(r:totable(), map2(av, bv, f), dt .. " " .. name .. " tensor")
      T.is(a[name](a, sc):totable(), map2(av, sv, f), dt .. " " .. name .. " number")
      T.is(a[name .. "_"], nil, dt .. " no " .. name .. "_ (the result is bool)")
    end
  end
  local nan = gpu.tensor({ 0 / 0, 1, 0 / 0 })
  local one = gpu.tensor({ 0 / 0, 1, 1 })
  T.is(nan:eq(one):totable(), { false, true, false }, "NaN == NaN is false")
  T.is(nan:ne(one):totable(), { true, false, true }, "NaN ~= x is true")
  for _, name in ipairs { "lt", "le", "gt", "ge" } do
    T.is(nan[name](nan, 1):totable(), { false, name ~= "lt" and name ~= "gt", false }, "NaN " .. name .. " is false")
  end
  local h = gpu.tensor({ 0.1, 0.2 }, { dtype = "f16" })
  T.is(h:eq(0.1):totable(), { true, false }, "f16 eq(0.1): the number as f16 holds it")
  T.is(h:lt(0.1):totable(), { false, false }, "f16 lt(0.1)")
  local m = gpu.tensor({ { 1, 5 }, { 3, 2 } }, { dtype = "i32" })
  T.is(m:gt(gpu.tensor({ 2, 2 }, { dtype = "i32" })):totable(), { { false, true }, { true, false } }, "broadcast")
  local o = gpu.empty({ 2, 2 }, { dtype = "bool" })
  T.ok(rawequal(m:le(3, { out = o }), o), "out= returns out")
  T.is(o:totable(), { { true, false }, { true, true } }, "out= (a bool tensor)")
  T.raises_at(function() m:le(3, { out = gpu.empty({ 2, 2 }, { dtype = "i32" }) }) end, "out", "out= must be bool")
  T.raises_at(function() return m:lt(2.5) end, "integer", "a non-integer number against an integer tensor raises")
  T.raises_at(function() return m:lt(gpu.ones({ 2 })) end, "dtype", "tensors of two dtypes raise")
  T.is(m:narrow(2, 2, 1):eq(2):totable(), { { false }, { true } }, "a strided view")
  T.is(gpu.ones({ 2 }) == 1, false, "t == 1 stays Lua's: false, a userdata is no number (t:eq(1) compares)")
end)

T.test("logical_and, logical_or, logical_not", function()
  local a = gpu.tensor({ true, true, false, false }, { dtype = "bool" })
  local b = gpu.tensor({ true, false, true, false }, { dtype = "bool" })
  T.is(a:logical_and(b):totable(), { true, false, false, false }, "and")
  T.is(a:logical_or(b):totable(), { true, true, true, false }, "or")
  T.is(a:logical_not():totable(), { false, false, true, true }, "not")
  T.is(a:logical_and(true):totable(), { true, true, false, false }, "and with true")
  T.is(a:logical_or(false):totable(), { true, true, false, false }, "or with false")
  for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64" } do
    local x = gpu.tensor({ 0, 2, 0, 3 }, { dtype = dt })
    local y = gpu.tensor({ 0, 0, 5, 1 }, { dtype = dt })
    T.is(x:logical_and(y):totable(), { false, false, false, true }, dt .. " and: nonzero is true")
    T.is(x:logical_or(y):totable(), { false, true, true, true }, dt .. " or")
    T.is(x:logical_not().dtype, "bool", dt .. " not gives bool")
    T.is(x:logical_not():totable(), { true, false, true, false }, dt .. " not")
    T.is(x.logical_not_, nil, dt .. " no logical_not_")
  end
  T.is(gpu.tensor({ 0 / 0, 0 }):logical_not():totable(), { false, true }, "NaN is true")
end)

T.test("where", function()
  local c = gpu.tensor({ true, false, true, false }, { dtype = "bool" })
  for _, dt in ipairs(T.dtypes) do
    local A = dt == "bool" and { true, true, true, true } or { 1, 2, 3, 4 }
    local B = dt == "bool" and { false, false, false, false } or { 10, 20, 30, 40 }
    local a, b = gpu.tensor(A, { dtype = dt }), gpu.tensor(B, { dtype = dt })
    local va = dt == "bool" and true or 5
    local r = gpu.where(c, a, b)
    T.is(r.dtype, dt, dt .. " where keeps the dtype")
    T.is(r:totable(), in_dtype({ A[1], B[2], A[3], B[4] }, dt), dt .. " tensors")
    T.is(gpu.where(c, va, b):totable(), in_dtype({ va, B[2], va, B[4] }, dt), dt .. " number, tensor")
    T.is(gpu.where(c, a, va):totable(), in_dtype({ A[1], va, A[3], va }, dt), dt .. " tensor, number")
  end
  T.is(gpu.where(c, 1, 0):totable(), { 1.0, 0.0, 1.0, 0.0 }, "two numbers: f32")
  T.is(gpu.where(c, 1, 0, { dtype = "i64" }):totable(), { 1, 0, 1, 0 }, "two numbers, dtype = i64")
  local col = gpu.tensor({ { true }, { false } }, { dtype = "bool" })      -- {2,1}
  local row = gpu.tensor({ 1, 2, 3 })                                     -- {3}
  local w = gpu.where(col, row, gpu.tensor({ { -1 }, { -2 } }))            -- {2,1}
  T.is(w.shape, { 2, 3 }, "the three broadcast together")
  T.is(w:totable(), { { 1.0, 2.0, 3.0 }, { -2.0, -2.0, -2.0 } }, "broadcast values")
  local o = gpu.empty({ 4 })
  T.ok(rawequal(gpu.where(c, 1, gpu.zeros({ 4 }), { out = o }), o), "out= returns out")
  T.is(o:totable(), { 1.0, 0.0, 1.0, 0.0 }, "out= values")
  local base = gpu.arange(8, { dtype = "f32" }):view({ 2, 4 })
  T.is(gpu.where(c, base:narrow(1, 2, 1), 0):totable(), { { 4.0, 0.0, 6.0, 0.0 } }, "a strided operand")
  T.raises_at(function() return gpu.where(gpu.ones({ 4 }), 1, 2) end, "bool", "a non-bool condition raises")
  T.raises_at(function() return gpu.where(c, gpu.ones({ 4 }), gpu.ones({ 4 }, { dtype = "f64" })) end, "dtype",
              "two dtypes raise")
  T.raises_at(function() return gpu.where(c, gpu.ones({ 3 }), 0) end, "broadcast", "shapes that do not broadcast")
  T.raises_at(function() return gpu.where(c, gpu.ones({ 4 }), 0, { dtype = "f64" }) end, "dtype",
              "opts.dtype that differs from the tensors' raises")
  T.raises_at(function() return gpu.where(c, "x", 0) end, "number", "a string operand raises")
  T.raises_at(function() return gpu.where(c, 1.5, gpu.ones({ 4 }, { dtype = "i32" })) end, "integer",
              "a non-integer number for an integer dtype raises")
end)

T.test("masked_fill", function()
  local t = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local m = t:gt(2)
  T.is(t:masked_fill(m, 0):totable(), { { 1.0, 2.0, 0.0 }, { 0.0, 0.0, 0.0 } }, "new tensor")
  T.is(t:get(1, 3), 3.0, "t unchanged")
  local cols = gpu.tensor({ true, false, true }, { dtype = "bool" })
  T.is(t:masked_fill(cols, -1):totable(), { { -1.0, 2.0, -1.0 }, { -1.0, 5.0, -1.0 } }, "a broadcast mask")
  local r = t:masked_fill_(m, 9)
  T.ok(rawequal(r, t), "masked_fill_ returns t")
  T.is(t:totable(), { { 1.0, 2.0, 9.0 }, { 9.0, 9.0, 9.0 } }, "masked_fill_ writes t")
  local i = gpu.tensor({ 1, -2, 3 }, { dtype = "i8" })
  T.is(i:masked_fill(i:lt(0), 127):totable(), { 1, 127, 3 }, "i8")
  local o = gpu.empty({ 3 }, { dtype = "i8" })
  T.ok(rawequal(i:masked_fill(i:lt(0), 0, { out = o }), o), "out= returns out")
  T.is(o:totable(), { 1, 0, 3 }, "out= values")
  local v = gpu.arange(6, { dtype = "i32" }):view({ 2, 3 }):narrow(2, 2, 2)
  v:masked_fill_(gpu.tensor({ true, false }, { dtype = "bool" }), -7)
  T.is(v:totable(), { { -7, 2 }, { -7, 5 } }, "in place through a strided view")
  T.raises_at(function() return i:masked_fill(i, 0) end, "bool", "a non-bool mask raises")
  T.raises_at(function() return i:masked_fill(i:lt(0), 300) end, "fit", "a value the dtype cannot hold raises")
  T.raises_at(function() return i:masked_fill(gpu.ones({ 2, 3 }, { dtype = "bool" }), 0) end, "mask shape",
              "a mask larger than the tensor raises")
  T.raises_at(function() return i:masked_fill(i:lt(0), gpu.ones({ 3 }, { dtype = "i8" })) end, "number",
              "the value is a number")
end)

T.test("any, all", function()
  for _, dt in ipairs(T.dtypes) do
    local z, x = gpu.zeros({ 2, 3 }, { dtype = dt }), gpu.ones({ 2, 3 }, { dtype = dt })
    local r = z:any()
    T.is({ r.dtype, r.shape }, { "bool", {} }, dt .. " any: a 0-dim bool")
    T.is({ z:any():item(), z:all():item(), x:any():item(), x:all():item() }, { false, false, true, true },
         dt .. " any/all of zeros and ones")
    x:set(2, 2, dt == "bool" and false or 0)
    T.is({ x:any():item(), x:all():item() }, { true, false }, dt .. " one zero")
    T.is(x:all { dim = 1 }:totable(), { true, false, true }, dt .. " all{dim = 1}")
    T.is(x:all { dim = 2, keepdim = true }:totable(), { { true }, { false } }, dt .. " all{dim = 2, keepdim}")
    T.is(z:any { dim = -1 }:totable(), { false, false }, dt .. " any{dim = -1}")
  end
  T.is(gpu.tensor({ 0, 0 / 0 }):any():item(), true, "NaN is true")
  local big = gpu.zeros({ 5000 }, { dtype = "u8" })
  big:set(4999, 1)
  T.is({ big:any():item(), big:all():item() }, { true, false }, "across blocks")
end)

-- round half to even (NumPy's round, C's rint)
local function rint(x)
  if x ~= x or x == math.huge or x == -math.huge then return x end
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then f = f + 1 end
  return f + 0.0
end
local function trunc(x)
  if x ~= x or x == math.huge or x == -math.huge then return x end
  return x >= 0 and math.floor(x) + 0.0 or math.ceil(x) + 0.0
end
local function sign(x) return x > 0 and 1.0 or x < 0 and -1.0 or x ~= x and x or 0.0 end

T.test("floor, ceil, round, trunc, sign, square, sin, cos, rsqrt", function()
  local xs = { -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.7, 3.7, 0, 1e10 }
  local fl = function(x) return math.floor(x) + 0.0 end
  local ce = function(x) return math.ceil(x) + 0.0 end
  for _, dt in ipairs(T.float_dtypes) do
    local R = store(dt)
    local v = in_dtype(xs, dt)
    local t = gpu.tensor(v, { dtype = dt })
    T.is(t:floor():totable(), map2(v, nil, fl), dt .. " floor")
    T.is(t:ceil():totable(), map2(v, nil, ce), dt .. " ceil")
    T.is(t:round():totable(), map2(v, nil, rint), dt .. " round: half to even")
    T.is(t:trunc():totable(), map2(v, nil, trunc), dt .. " trunc")
    T.is(t:sign():totable(), map2(v, nil, sign), dt .. " sign")
    T.is(t:square():totable(), map2(v, nil, function(x) return R(x * x) end), dt .. " square")
    T.near(t:sin():totable(), map2(v, nil, function(x) return R(math.sin(x)) end), TOL[dt], dt .. " sin")
    T.near(t:cos():totable(), map2(v, nil, function(x) return R(math.cos(x)) end), TOL[dt], dt .. " cos")
    local p = gpu.tensor({ 0.25, 1, 4, 100 }, { dtype = dt })
    T.is(p:rsqrt():totable(), { 2.0, 1.0, 0.5, R(0.1) }, dt .. " rsqrt")
    local sp = gpu.tensor({ 0 / 0, 1 / 0, -1 / 0, -0.0 }, { dtype = dt })
    local r = sp:round():totable()
    T.ok(r[1] ~= r[1] and r[2] == math.huge and r[3] == -math.huge and 1 / r[4] < 0, dt .. " round keeps NaN, inf, -0")
    local sg = sp:sign():totable()
    T.ok(sg[1] ~= sg[1] and sg[2] == 1 and sg[3] == -1 and 1 / sg[4] > 0, dt .. " sign of NaN, inf, -0 (+0)")
    T.is(gpu.tensor({ 0 }, { dtype = dt }):rsqrt():totable(), { math.huge }, dt .. " rsqrt(0) = inf")
    local c = t:clone()
    c:floor_()
    T.is(c:totable(), t:floor():totable(), dt .. " floor_ in place")
  end
  for _, dt in ipairs(T.int_dtypes) do
    local xs_ = IVALS[dt]
    local t = gpu.tensor(xs_, { dtype = dt })
    for _, op in ipairs { "floor", "ceil", "round", "trunc" } do
      local r = t[op](t)
      T.is({ r.dtype, r:totable() }, { dt, xs_ }, dt .. " " .. op .. " is the identity")
    end
    T.is(t:sign():totable(), map2(xs_, nil, function(x) return x > 0 and 1 or x < 0 and -1 or 0 end), dt .. " sign")
    T.is(t:square():totable(), map2(xs_, nil, function(x) return T.cast(x * x, dt) end), dt .. " square wraps")
    for _, op in ipairs { "sin", "cos", "rsqrt" } do
      T.raises_at(function() return t[op](t) end, { "float", dt }, dt .. " " .. op .. " raises (needs a float dtype)")
    end
  end
  local b = gpu.tensor({ true }, { dtype = "bool" })
  for _, op in ipairs { "floor", "sign", "square", "sin" } do
    T.raises_at(function() return b[op](b) end, "bool", "bool " .. op .. " raises")
  end
end)

T.test("% and //: Lua's meanings; fmod, remainder, floor_divide", function()
  local A = { 7, -7, 7, -7, 5.5, -5.5, 1, 0, 3, -1e10 }
  local B = { 2, 2, -2, -2, 2, -1.5, 0.1, 3, 0.75, 3 }
  for _, dt in ipairs { "f64", "f32" } do
    local R = store(dt)
    local a, b = gpu.tensor(in_dtype(A, dt), { dtype = dt }), gpu.tensor(in_dtype(B, dt), { dtype = dt })
    local av, bv = in_dtype(A, dt), in_dtype(B, dt)
    -- Lua's own % and // on the values the tensors hold (exact, so rounded once: the same)
    T.is((a % b):totable(), map2(av, bv, function(x, y) return R(x % y) end), dt .. " a % b is Lua's %")
    T.is(a:remainder(b):totable(), (a % b):totable(), dt .. " remainder is %")
    -- (floor of the quotient as the dtype rounds it: 1 // 0.1 is 10 in f32, where 0.1f is a bit over 0.1)
    local idiv = function(x, y) return R(math.floor(R(x / y))) end
    T.is((a // b):totable(), map2(av, bv, idiv), dt .. " a // b is Lua's //: floor(a / b)")
    T.is(a:floor_divide(b):totable(), (a // b):totable(), dt .. " floor_divide is //")
    T.is(a:fmod(b):totable(), map2(av, bv, function(x, y) return R(math.fmod(x, y)) end), dt .. " fmod is math.fmod")
    T.is((a % 3):totable(), map2(av, 3, function(x, y) return R(x % y) end), dt .. " a % 3")
    T.is((10 % b):totable(), map2(bv, 10, function(x, y) return R(y % x) end), dt .. " 10 % b")
    T.is((10 // b):totable(), map2(bv, 10, function(x, y) return idiv(y, x) end), dt .. " 10 // b")
    local z = gpu.tensor({ 5, -5 }, { dtype = dt })
    local m = (z % 0):totable()
    T.ok(m[1] ~= m[1] and m[2] ~= m[2], dt .. " x % 0 is NaN (as Lua's)")
    T.is((z // 0):totable(), { math.huge, -math.huge }, dt .. " x // 0 is +-inf (as Lua's)")
  end
  local IAv = { 7, -7, 7, -7, 0, 100, -100, 1 }
  local IBv = { 2, 2, -2, -2, 3, 7, 7, -1 }
  for _, dt in ipairs { "i8", "i32", "i64" } do
    local a, b = gpu.tensor(IAv, { dtype = dt }), gpu.tensor(IBv, { dtype = dt })
    T.is((a % b):totable(), map2(IAv, IBv, function(x, y) return x % y end), dt .. " a % b is Lua's %")
    T.is((a // b):totable(), map2(IAv, IBv, function(x, y) return x // y end), dt .. " a // b is Lua's //")
    T.is(a:fmod(b):totable(), map2(IAv, IBv, function(x, y) return math.fmod(x, y) end), dt .. " fmod is math.fmod")
    T.is((100 % b):totable(), map2(IBv, 100, function(x, y) return y % x end), dt .. " 100 % b")
    T.raises_at(function() return a % 0 end, "division by zero", dt .. " a % 0 raises at once")
    T.raises_at(function() return a // 0 end, "division by zero", dt .. " a // 0 raises at once")
    T.raises_at(function() return a:fmod(0) end, "division by zero", dt .. " fmod(0) raises at once")
    local zero = gpu.tensor({ 1, 0 }, { dtype = dt })
    local ok = pcall(function() return gpu.tensor({ 1, 2 }, { dtype = dt }) % zero end)
    T.ok(ok, dt .. " a % (a tensor with a zero) enqueues")
    T.raises(function() gpu.synchronize() end, "division by zero", dt .. " ... and the next sync raises")
  end
  for _, dt in ipairs { "i8", "i32", "i64" } do
    local lo = T.int_range(dt)
    local t = gpu.tensor({ lo }, { dtype = dt })
    T.is({ (t % -1):item(), t:fmod(-1):item(), (t // -1):item() }, { 0, 0, lo }, dt .. " min % -1 is 0, min // -1 wraps")
  end
  local u = gpu.tensor({ 7, 200 }, { dtype = "u8" })
  T.is({ (u % 3):totable(), (u // 3):totable() }, { { 1, 2 }, { 2, 66 } }, "u8")
  local x = gpu.tensor({ 7, -7 }, { dtype = "i32" })
  x:remainder_(3)
  T.is(x:totable(), { 1, 2 }, "remainder_ in place")
  T.raises_at(function() return gpu.tensor({ true }, { dtype = "bool" }) % 2 end, "bool", "bool % raises")
end)

T.test("clamp", function()
  for _, dt in ipairs(T.float_dtypes) do
    local t = gpu.tensor({ -3, -1, 0, 0.5, 2, 5, 0 / 0 }, { dtype = dt })
    local r = t:clamp(-1, 2):totable()
    T.is({ table.unpack(r, 1, 6) }, { -1.0, -1.0, 0.0, 0.5, 2.0, 2.0 }, dt .. " clamp(-1, 2)")
    T.ok(r[7] ~= r[7], dt .. " NaN stays NaN")
    T.is({ table.unpack(t:clamp(nil, 0):totable(), 1, 6) }, { -3.0, -1.0, 0.0, 0.0, 0.0, 0.0 }, dt .. " clamp(nil, 0)")
    T.is({ table.unpack(t:clamp(1):totable(), 1, 6) }, { 1.0, 1.0, 1.0, 1.0, 2.0, 5.0 }, dt .. " clamp(1)")
    T.is({ table.unpack(t:clamp(3, 1):totable(), 1, 6) }, { 1.0, 1.0, 1.0, 1.0, 1.0, 1.0 }, dt .. " lo > hi gives hi")
  end
  for _, dt in ipairs(T.int_dtypes) do
    local lo, hi = T.int_range(dt)
    local t = gpu.tensor({ lo, 0, 5, hi }, { dtype = dt })
    T.is(t:clamp(1, 4):totable(), { 1, 1, 4, 4 }, dt .. " clamp(1, 4)")
    T.is(t:clamp(nil, 3):totable(), { lo, 0, 3, 3 }, dt .. " clamp(nil, 3)")
    T.is(t:clamp(2, nil):totable(), { 2, 2, 5, hi }, dt .. " clamp(2, nil)")
  end
  local m = gpu.tensor({ { 1, 5, 9 }, { -4, 0, 4 } }, { dtype = "f32" })
  local lo = gpu.tensor({ 0, 2, 4 }, { dtype = "f32" })
  T.is(m:clamp(lo, 6):totable(), { { 1.0, 5.0, 6.0 }, { 0.0, 2.0, 4.0 } }, "a tensor bound, broadcast")
  T.is(m:clamp(nil, gpu.tensor({ { 3 }, { -1 } }, { dtype = "f32" })):totable(), { { 1.0, 3.0, 3.0 }, { -4.0, -1.0, -1.0 } },
       "a {2,1} upper bound")
  local o = gpu.empty({ 2, 3 })
  T.ok(rawequal(m:clamp(0, 1, { out = o }), o), "out= returns out")
  T.is(o:totable(), { { 1.0, 1.0, 1.0 }, { 0.0, 0.0, 1.0 } }, "out= values")
  local r = m:clamp_(-1, 4)
  T.ok(rawequal(r, m), "clamp_ returns t")
  T.is(m:totable(), { { 1.0, 4.0, 4.0 }, { -1.0, 0.0, 4.0 } }, "clamp_ in place")
  local v = gpu.arange(6, { dtype = "i32" }):view({ 2, 3 }):narrow(2, 2, 2)
  T.is(v:clamp(2, 4):totable(), { { 2, 2 }, { 4, 4 } }, "a strided tensor")
  T.raises_at(function() return m:clamp() end, "lo, hi", "no bound raises")
  T.raises_at(function() return gpu.tensor({ 1 }, { dtype = "i32" }):clamp(0.5) end, "integer",
              "a non-integer bound for an integer dtype raises")
  T.raises_at(function() return m:clamp(gpu.ones({ 3 }, { dtype = "f64" })) end, "dtype", "a bound of another dtype")
  T.raises_at(function() return m:clamp("a") end, "number", "a string bound raises")
  T.raises_at(function() return gpu.ones({ 3 }):clamp_(gpu.ones({ 2, 3 })) end, "in place",
              "clamp_ whose result would be larger raises")
  T.raises_at(function() return gpu.tensor({ true }, { dtype = "bool" }):clamp(0, 1) end, "bool", "bool raises")
end)

T.done()
