-- The host backend's contiguous fast path for elementwise ops (cuda/cpu_ops.c:
-- direct_ok): contiguous f32/f64/i64 operands run on the tensors' memory, in
-- whole groups of 8 elements, the last n % 8 through blocks.  Every result
-- here is compared bit for bit with the same op on a strided view of the same
-- values, which takes the block path: sizes around 8 and the block size (512),
-- numbers on either side, in place, specials (NaN, inf, -0), integer wrap and
-- division by zero.  On cuda the same comparisons check the kernels.
local gpu = require "gpu"
local T = require "gpu.test"

local SIZES = { 1, 7, 8, 9, 15, 16, 17, 511, 512, 513, 1023, 1024, 1031, 4099 }
local SPECIAL = { 0 / 0, math.huge, -math.huge, -0.0, 0.0, 1e30, -1e-30, 2.5, -3.25 }

local function values(dt, n, shift)
  local r = {}
  for i = 1, n do
    local k = i + (shift or 0)
    if dt == "i64" then
      r[i] = k % 5 == 0 and math.maxinteger - k or (k * 7919) % 2001 - 1000
    elseif k % 4 == 0 then
      r[i] = SPECIAL[k // 4 % #SPECIAL + 1]
    else
      r[i] = math.sin(k) * 10
    end
  end
  return r
end

-- (contiguous tensor, the same values in a strided view of shape {n, 1})
local function pair(dt, n, shift)
  local v = values(dt, n, shift)
  local c = gpu.tensor(v, { dtype = dt })
  local wide = gpu.zeros({ n, 2 }, { dtype = dt })
  wide:narrow(2, 2, 1):copy(c:view({ n, 1 }))
  local s = wide:narrow(2, 2, 1)
  assert(n == 1 or not s:is_contiguous())
  return c, s
end

-- bit for bit: NaN equals NaN, -0 differs from 0
local function same(a, b)
  if #a ~= #b then return false, "lengths " .. #a .. " vs " .. #b end
  for i = 1, #a do
    local x, y = a[i], b[i]
    local eq = (x ~= x and y ~= y) or (x == y and (x ~= 0 or 1 / x == 1 / y) and math.type(x) == math.type(y))
    if not eq then return false, string.format("element %d: %s vs %s", i, tostring(x), tostring(y)) end
  end
  return true
end

local function flat(t) return T.flatten(t:totable()) end

local function check(fast, slow, name)
  local ok, why = same(flat(fast), flat(slow))
  T.ok(ok, name .. (why and (": " .. why) or ""))
end

T.test("unary ops: the fast path equals the block path at every size", function()
  for _, dt in ipairs({ "f32", "f64" }) do
    for _, n in ipairs(SIZES) do
      local c, s = pair(dt, n)
      for _, op in ipairs({ "exp", "tanh", "neg", "abs", "relu", "sqrt", "floor", "sigmoid" }) do
        check(c[op](c), s[op](s), string.format("%s %s n=%d", op, dt, n))
      end
    end
  end
  for _, n in ipairs(SIZES) do
    local c, s = pair("i64", n)
    for _, op in ipairs({ "neg", "abs", "relu", "square" }) do
      check(c[op](c), s[op](s), string.format("%s i64 n=%d", op, n))
    end
  end
end)

T.test("binary ops: tensors, a number on either side", function()
  for _, dt in ipairs({ "f32", "f64", "i64" }) do
    for _, n in ipairs(SIZES) do
      local a, as = pair(dt, n)
      local b, bs = pair(dt, n, 3)
      for _, op in ipairs({ "add", "sub", "mul", "max", "min", "pow" }) do
        if not (dt == "i64" and op == "pow") then
          check(a[op](a, b), as[op](as, bs), string.format("%s %s n=%d", op, dt, n))
        end
      end
      local k = dt == "i64" and 3 or 1.5
      check(a + k, as + k, string.format("t + %s %s n=%d", k, dt, n))
      check(k - a, k - as, string.format("%s - t %s n=%d", k, dt, n))
      check(a * a, as * as, string.format("t * t (the same tensor twice) %s n=%d", dt, n))
    end
  end
end)

T.test("integer wrap and float specials on the fast path", function()
  local big = gpu.tensor({ math.maxinteger, math.mininteger, -1, 5, 6, 7, 8, 9, 10 }, { dtype = "i64" })
  T.is((big + 1):totable(), { math.mininteger, math.mininteger + 1, 0, 6, 7, 8, 9, 10, 11 }, "i64 + 1 wraps")
  T.is((-big):totable()[2], math.mininteger, "-mininteger stays mininteger")
  local f = gpu.tensor({ 0 / 0, math.huge, -0.0, 1, 2, 3, 4, 5, 6 }, { dtype = "f64" })
  local r = (f * 1):totable()
  T.ok(r[1] ~= r[1] and r[2] == math.huge and 1 / r[3] == -math.huge, "NaN, inf and -0 kept")
  T.ok(1 / (f:neg():totable()[3]) == math.huge, "-(-0) is +0")
end)

T.test("integer division by zero raises on the fast path, at the script's line", function()
  for _, n in ipairs({ 8, 9, 513 }) do
    local a = gpu.arange(1, n + 1)
    local b = gpu.ones({ n }, { dtype = "i64" })
    b:narrow(1, n, 1):fill(0)   -- the zero in the last element: the tail when n % 8 ~= 0
    T.raises_at(function() local _ = (a // b):totable() end, "division by zero", "n=" .. n .. ": // by zero")
    T.raises_at(function() local _ = (a // 0):totable() end, "division by zero", "n=" .. n .. ": // 0")
  end
end)

T.test("in place: out is the input", function()
  for _, dt in ipairs({ "f32", "f64", "i64" }) do
    for _, n in ipairs({ 9, 513 }) do
      local a, as = pair(dt, n)
      local want = flat(as + 2)
      a:add_(2)
      T.ok(same(flat(a), want), string.format("add_ %s n=%d", dt, n))
      local b, bs = pair(dt, n)
      b:mul(b, { out = b })
      T.ok(same(flat(b), flat(bs * bs)), string.format("b:mul(b, {out = b}) %s n=%d", dt, n))
    end
  end
end)

T.test("shifted overlap keeps NumPy's rule", function()
  local t = gpu.arange(0, 1001, { dtype = "f64" })
  t:narrow(1, 1, 1000):add(0, { out = t:narrow(1, 2, 1000) })
  local r = t:totable()
  T.ok(r[1] == 0 and r[2] == 0 and r[3] == 1 and r[1001] == 999, "t[i + 1] = old t[i]")
end)

T.done()
