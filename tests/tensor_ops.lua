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
  a:mul_(gpu.tensor({ 2, 0, -1 }))
  T.is(a:totable(), { 22.0, 0.0, -13.0 }, "mul_ with a tensor")
  a:neg_()
  T.is(a:totable(), { -22.0, -0.0, 13.0 }, "neg_")
  a:relu_()
  T.is(a:totable(), { 0.0, 0.0, 13.0 }, "relu_")
  local i = gpu.tensor({ 7, -7 }, { dtype = "i64" })
  i:div_(2)
  T.is(i:totable(), { 3, -4 }, "div_ floors on i64")
  local o = gpu.empty({3})
  local x = gpu.tensor({ 1, 4, 9 })
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

T.done()
