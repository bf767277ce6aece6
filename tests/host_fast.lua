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

-- libmvec's widest variant (AVX-512: 16 floats a call) serves every
-- element, a short group through a padded vector: an element's result does
-- not depend on where it sits (alone, in a tail, in a full vector)
T.test("vector math: a value's result does not depend on its position", function()
  for _, dt in ipairs({ "f32", "f64" }) do
    local n = 37
    local t = gpu.tensor(values(dt, n), { dtype = dt })
    for _, op in ipairs({ "exp", "tanh", "sin", "log" }) do
      local arg = op == "log" and t:abs() + 0.5 or t
      local whole, ok = flat(arg[op](arg)), true
      for i = 1, n do
        local one = flat(arg:narrow(1, i, 1):contiguous()[op](arg:narrow(1, i, 1):contiguous()))[1]
        local tail = flat(arg:narrow(1, i, n - i + 1):contiguous()[op](arg:narrow(1, i, n - i + 1):contiguous()))[1]
        if not same({ whole[i] }, { one }) or not same({ whole[i] }, { tail }) then ok = false end
      end
      T.ok(ok, string.format("%s %s: alone, in a tail and in the array alike", op, dt))
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

-- The float functions run through glibc's libmvec where it is found (x86-64):
-- specials as the C library has them, values within the documented tolerance
-- (2e-6 relative for f32, 1e-13 for f64) of Lua's math in double.
T.test("vector math: specials and accuracy, f32 and f64, every size", function()
  local inf, nan = math.huge, 0 / 0
  local function is_neg0(v) return v == 0 and 1 / v < 0 end
  for _, dt in ipairs({ "f32", "f64" }) do
    for _, n in ipairs({ 4, 8, 9, 13 }) do
      local vals = { -0.0, inf, -inf, nan, 0.0, 100, -100, 0.5, 1, 2, 3, 4, 5 }
      local t = gpu.tensor({ table.unpack(vals, 1, n) }, { dtype = dt })
      local th, ex = t:tanh():totable(), t:exp():totable()
      T.ok(is_neg0(th[1]) and th[2] == 1 and th[3] == -1 and th[4] ~= th[4], dt .. " tanh(-0, inf, -inf, nan) n=" .. n)
      T.ok(ex[1] == 1 and ex[2] == inf and ex[3] == 0 and ex[4] ~= ex[4], dt .. " exp(-0, inf, -inf, nan) n=" .. n)
      if n > 5 and dt == "f32" then T.ok(ex[6] == inf and ex[7] >= 0 and ex[7] < 1e-40, "f32 exp(100) overflows, exp(-100) is tiny") end
    end
    local n, v = 1031, {}
    for i = 1, n do v[i] = (i - 516) / 37 end
    local t = gpu.tensor(v, { dtype = dt })
    local rel = dt == "f32" and 2e-6 or 1e-13
    -- Lua's math in double as the reference; the formulas for expm1, log1p,
    -- sinh and tanh lose bits near 0 in double, so f32 only for those
    local REF = {
      exp = math.exp, log = math.log, sin = math.sin, cos = math.cos, atan = math.atan,
      expm1 = dt == "f32" and function(x) return math.exp(x) - 1 end,
      log1p = dt == "f32" and function(x) return math.log(1 + x) end,
      sinh = dt == "f32" and function(x) return (math.exp(x) - math.exp(-x)) / 2 end,
      tanh = dt == "f32" and function(x) local e = math.exp(2 * x) return (e - 1) / (e + 1) end,
    }
    for _, f in ipairs({ "exp", "log", "sin", "cos", "atan", "expm1", "log1p", "sinh", "tanh" }) do
      local arg = f == "log" and t:abs() + 0.5 or f == "log1p" and t:abs() or t
      local ax, got, ref = arg:totable(), arg[f](arg):totable(), REF[f]
      if ref then
        local worst = 0
        for i = 1, n do
          local want = ref(ax[i])
          local err = math.abs(got[i] - want) / math.max(math.abs(want), dt == "f32" and 1e-6 or 1e-12)
          if err > worst then worst = err end
        end
        T.ok(worst <= rel, string.format("%s %s: worst relative error %.3g", f, dt, worst))
      end
    end
  end
end)

-- sum and mean of a contiguous f32/f64 tensor read it in place, the same
-- order (8 running sums in double) as the block path over a strided view
T.test("sum and mean: contiguous equals strided, NaN and inf kept", function()
  for _, dt in ipairs({ "f32", "f64" }) do
    for _, n in ipairs(SIZES) do
      -- finite values of many magnitudes: another order of the adds shows in the last bits
      local v = {}
      for i = 1, n do v[i] = math.sin(i) * 10 ^ (i % 9 - 4) end
      local c = gpu.tensor(v, { dtype = dt })
      local wide = gpu.zeros({ n, 2 }, { dtype = dt })
      wide:narrow(2, 1, 1):copy(c:view({ n, 1 }))
      local s = wide:narrow(2, 1, 1)
      local a, b = c:sum():item(), s:sum():item()
      local a2, b2 = c:mean():item(), s:mean():item()
      if gpu.backend == "host" then
        T.ok(same({ a }, { b }), string.format("sum %s n=%d: %s vs %s", dt, n, a, b))
        T.ok(same({ a2 }, { b2 }), string.format("mean %s n=%d", dt, n))
      else
        -- cuda's reductions take another order over another layout (not a
        -- promise of the API): the same sum within rounding
        local tol = dt == "f32" and 1e-5 or 1e-12
        T.near(a, b, tol * (1 + math.abs(a)), string.format("sum %s n=%d: %s vs %s", dt, n, a, b))
        T.near(a2, b2, tol * (1 + math.abs(a2)), string.format("mean %s n=%d", dt, n))
      end
    end
    local v = {}
    for i = 1, 1027 do v[i] = i % 3 == 0 and 0.1 or -0.05 end
    local want = 0
    for i = 1, #v do want = want + v[i] end
    local t = gpu.tensor(v, { dtype = dt })
    T.near(t:sum():item(), want, dt == "f32" and 1e-5 or 1e-12, dt .. " sum of 1027 values")
    for _, at in ipairs({ 1, 8, 9, 1027 }) do
      local w = gpu.tensor(v, { dtype = dt })
      w:narrow(1, at, 1):fill(0 / 0)
      local r = w:sum():item()
      T.ok(r ~= r, string.format("%s: a NaN at %d makes the sum NaN", dt, at))
      w:narrow(1, at, 1):fill(math.huge)
      T.is(w:sum():item(), math.huge, string.format("%s: inf at %d", dt, at))
      if at > 1 then
        w:narrow(1, 1, 1):fill(-math.huge)
        r = w:sum():item()
        T.ok(r ~= r, string.format("%s: inf and -inf (at 1, %d) give NaN", dt, at))
      end
    end
  end
end)

-- Large contiguous ops are split over the host's threads (cuda/cpu_par.c,
-- from 2^16 elements, in chunks of multiples of 512): sizes around the split
-- threshold and ragged ends, compared with the block path, with
-- GPULUA_HOST_THREADS=1 (no split), and a division by zero in the last chunk.
T.test("threaded split: boundaries equal the block path", function()
  for _, n in ipairs({ 65535, 65536, 65537, 65536 + 512 * 7 + 3, 200003 }) do
    local a, as = pair("f32", n)
    local b, bs = pair("f32", n, 5)
    check(a:tanh(), as:tanh(), "tanh f32 n=" .. n)
    check(a + b, as + bs, "a + b f32 n=" .. n)
    check(2 - a, 2 - as, "2 - a f32 n=" .. n)
    local i, is = pair("i64", n)
    check(i * 3, is * 3, "i64 * 3 n=" .. n)
  end
  local n = 200003
  local a = gpu.arange(1, n + 1)
  local d = gpu.ones({ n }, { dtype = "i64" })
  d:narrow(1, n, 1):fill(0)
  T.raises_at(function() local _ = (a // d):totable() end, "division by zero", "a zero in the last chunk raises")
  d:narrow(1, n, 1):fill(1)
  d:narrow(1, 70000, 1):fill(0)
  T.raises_at(function() local _ = (a % d):totable() end, "division by zero", "a zero in a middle chunk raises")
end)

if gpu.backend == "host" then
  T.test("GPULUA_HOST_THREADS: one thread gives the same results; a bad value is an error at the line", function()
    local script = "local x = gpu.arange(0, 300001, {dtype = 'f64'}) / 7 " ..
                   "io.write(string.format('%a %a', (x:sin() * 3 + x):sum():item(), x:exp():max():item()))"
    local one, ok1 = T.run("GPULUA_HOST_THREADS=1", "--device host -e " .. string.format("%q", script))
    local many, ok2 = T.run("GPULUA_HOST_THREADS=4", "--device host -e " .. string.format("%q", script))
    T.ok(ok1 and ok2 and one == many and one ~= "", "1 and 4 threads: " .. one .. " / " .. many)
    local out, ok = T.run("GPULUA_HOST_THREADS=many",
                          "--device host -e \"local x = gpu.ones({100000})\nlocal y = x + 1\nprint(y:sum():item())\"")
    T.ok(not ok and out:find("GPULUA_HOST_THREADS='many' is not a number of threads", 1, true) ~= nil
         and out:find(":2: 'add' failed", 1, true) ~= nil, "bad count: " .. out)
  end)
end

T.done()
