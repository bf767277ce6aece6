-- Tensor constructors in all nine dtypes and three memory kinds, checked
-- against plain Lua; f16/bf16 rounding against T.round_f16/T.round_bf16.
local gpu = require "gpu"
local T = require "gpu.test"

local function number_kind(dtype)
  if dtype == "bool" then return "boolean" end
  return T.is_float(dtype) and "float" or "integer"
end

-- every leaf of a totable() result has the Lua type its dtype calls for
local function leaf_types_ok(tbl, dtype)
  local want = number_kind(dtype)
  for _, v in ipairs(T.flatten(tbl)) do
    local got = type(v) == "number" and math.type(v) or type(v)
    if got ~= want then return false, got end
  end
  return true
end

-- a representable sample value per dtype
local FULL = { f32 = 2.5, f64 = -1.25e100, f16 = 2.5, bf16 = -384.0, i8 = -7, u8 = 200,
               i32 = -100000, i64 = 1 << 40, bool = true }

T.test("empty/zeros/ones/full: metadata and values in every dtype", function()
  for _, dt in ipairs(T.dtypes) do
    local e = gpu.empty({2, 3}, { dtype = dt })
    T.is(e.shape, { 2, 3 }, dt .. " empty shape")
    T.is(e.dtype, dt, dt .. " dtype field")
    T.is(e.device, "device", dt .. " device field")
    T.is(e.device_index, 0, dt .. " device_index")
    T.is(e.ndim, 2, dt .. " ndim")
    T.is(e:numel(), 6, dt .. " numel")
    T.is(e:nbytes(), 6 * T.dtype_size[dt], dt .. " nbytes")
    T.is(#e, 2, dt .. " #t is the size of dim 1")
    T.is(e:is_contiguous(), true, dt .. " is contiguous")

    local z = gpu.zeros({2, 3}, { dtype = dt }):totable()
    local zero, one = T.cast(0, dt), T.cast(1, dt)
    T.is(z, { { zero, zero, zero }, { zero, zero, zero } }, dt .. " zeros")
    T.ok(leaf_types_ok(z, dt), dt .. " zeros: values are " .. number_kind(dt) .. "s")
    T.is(gpu.ones({3}, { dtype = dt }):totable(), { one, one, one }, dt .. " ones")
    local v = T.cast(FULL[dt], dt)
    local f = gpu.full({2, 2}, FULL[dt], { dtype = dt }):totable()
    T.is(f, { { v, v }, { v, v } }, dt .. " full(" .. tostring(FULL[dt]) .. ")")
    T.ok(leaf_types_ok(f, dt), dt .. " full: values are " .. number_kind(dt) .. "s")
  end
  T.is(gpu.empty(7).shape, { 7 }, "shape given as one integer")
  T.is(gpu.zeros({4}).dtype, "f32", "f32 is the default dtype")
  local big = gpu.zeros({3, 1, 2, 1, 2})
  T.is(big.shape, { 3, 1, 2, 1, 2 }, "5-D shape with unit dims")
  T.is(big:numel(), 12, "5-D numel")
end)

T.test("memory kinds", function()
  for _, kind in ipairs { "device", "pinned", "host" } do
    local t = gpu.full({5}, 4, { dtype = "i32", device = kind })
    T.is(t.device, kind, "device = " .. kind)
    T.is(t:totable(), { 4, 4, 4, 4, 4 }, kind .. " values")
  end
  T.is(gpu.zeros({2}, { device = "cuda" }).device, "device", '"cuda" is a synonym of "device"')
  T.is(gpu.zeros({2}, { device = "cuda:0" }).device, "device", '"cuda:0" is a synonym of "device"')
  local p = gpu.pinned({3, 2}, { dtype = "f64" })
  T.is({ p.device, p.dtype, p.shape }, { "pinned", "f64", { 3, 2 } }, "gpu.pinned")
  T.is(gpu.pinned(4).dtype, "f32", "gpu.pinned default dtype")
end)

T.test("gpu.tensor from Lua values", function()
  local t = gpu.tensor({ { 1.0, 2, 3 }, { 4, 5, 6 } })
  T.is(t.shape, { 2, 3 }, "nested table shape")
  T.is(t.dtype, "f32", "a float among the values: f32")
  T.is(t:totable(), { { 1.0, 2.0, 3.0 }, { 4.0, 5.0, 6.0 } }, "values")
  local s = gpu.tensor(5)
  T.is(s.shape, {}, "a number makes a 0-dim tensor")
  T.is(s.ndim, 0, "0-dim ndim")
  T.is(s:numel(), 1, "0-dim numel")
  T.is(s:item(), 5.0, "0-dim item")
  local i = gpu.tensor(-5, { dtype = "i64" }):item()
  T.is(math.type(i), "integer", "i64 item is a Lua integer")
  T.is(i, -5, "i64 item value")
  local big = gpu.tensor({ math.maxinteger, math.mininteger, (1 << 53) + 1 }, { dtype = "i64" })
  T.is(big:totable(), { math.maxinteger, math.mininteger, (1 << 53) + 1 }, "i64 keeps all 64 bits")
  local b = gpu.tensor({ true, false, true }, { dtype = "bool" })
  T.is(b:totable(), { true, false, true }, "bool from Lua booleans")
  T.is(gpu.tensor({ 0, 1, 0 }, { dtype = "bool" }):totable(), { false, true, false },
       "bool from the numbers 0/1")
  T.is(gpu.full({2}, 2.0, { dtype = "i32" }):totable(), { 2, 2 }, "integer-valued float into i32")
  local deep = gpu.tensor({ { { 1 }, { 2 } }, { { 3 }, { 4 } } }, { dtype = "u8" })
  T.is(deep.shape, { 2, 2, 1 }, "3-level nesting")
  T.is(deep:totable(), { { { 1 }, { 2 } }, { { 3 }, { 4 } } }, "3-level values")
  for _, kind in ipairs { "pinned", "host" } do
    T.is(gpu.tensor({ 7, 8 }, { dtype = "i8", device = kind }):totable(), { 7, 8 }, "tensor on " .. kind)
  end
end)

T.test("integer values out of an integer dtype's range raise", function()
  -- (the README leaves this open; the runtime raises rather than wrap silently)
  for _, c in ipairs { { 200, "i8" }, { 300, "u8" }, { -1, "u8" }, { 1 << 32, "i32" } } do
    T.raises_at(function() return gpu.tensor({ c[1] }, { dtype = c[2] }) end, c[2],
                string.format("gpu.tensor({%d}, {dtype = %s}) raises", c[1], c[2]))
    T.raises_at(function() return gpu.full({2}, c[1], { dtype = c[2] }) end, c[2],
                string.format("gpu.full({2}, %d, {dtype = %s}) raises", c[1], c[2]))
  end
  T.is(gpu.tensor({ -128, 127 }, { dtype = "i8" }):totable(), { -128, 127 }, "the i8 limits fit")
  T.is(gpu.tensor({ 0, 255 }, { dtype = "u8" }):totable(), { 0, 255 }, "the u8 limits fit")
end)

T.test("f16 and bf16 rounding of stored values", function()
  local xs = { 0.1, 1 / 3, 65504, 65519, 65520, 1e5, 1e-7, -2.5e-5, 3.14159, 6.1e-5,
               2.0 ^ -24, 2.0 ^ -25, 1.5 * 2.0 ^ -25, 2.5 * 2.0 ^ -24, -0.0, 2049, 2051,
               1 / 0, -1 / 0 }
  local got = gpu.tensor(xs, { dtype = "f16" }):totable()
  for i, x in ipairs(xs) do
    T.is(got[i], T.round_f16(x), string.format("f16(%.9g) = %.9g", x, T.round_f16(x)))
  end
  local ys = { 0.1, 1 / 3, 3.14159, 257, 259, 1e38, 3.38e38, 3.4e38, 1e39, -1e-40,
               2.0 ^ -133, 1.2e-38, 65520, 1 / 0 }
  local gotb = gpu.tensor(ys, { dtype = "bf16" }):totable()
  for i, y in ipairs(ys) do
    T.is(gotb[i], T.round_bf16(y), string.format("bf16(%.9g) = %.9g", y, T.round_bf16(y)))
  end
  local nan = gpu.tensor({ 0 / 0 }, { dtype = "f16" }):item()
  T.ok(nan ~= nan, "f16 keeps NaN")
  T.ok(gpu.tensor({ 0 / 0 }, { dtype = "bf16" }):item() ~= gpu.tensor({ 0 / 0 }, { dtype = "bf16" }):item(),
       "bf16 keeps NaN")
  T.is(gpu.tensor({ 0.1, 1e39 }, { dtype = "f32" }):totable(), { T.round_f32(0.1), 1 / 0 }, "f32 rounding")
  T.is(gpu.full({1}, 0.1, { dtype = "f16" }):item(), T.round_f16(0.1), "full rounds to f16 too")
end)

T.test("arange", function()
  local a = gpu.arange(5)
  T.is(a.dtype, "i64", "integer arguments give i64")
  T.is(a:totable(), { 0, 1, 2, 3, 4 }, "arange(5)")
  T.is(gpu.arange(2, 6):totable(), { 2, 3, 4, 5 }, "arange(2, 6): stop exclusive")
  T.is(gpu.arange(0, 10, 3):totable(), { 0, 3, 6, 9 }, "arange(0, 10, 3)")
  T.is(gpu.arange(5, 0, -2):totable(), { 5, 3, 1 }, "negative step")
  local f = gpu.arange(0, 1, 0.25)
  T.is(f.dtype, "f32", "float arguments give f32")
  T.is(f:totable(), { 0.0, 0.25, 0.5, 0.75 }, "arange(0, 1, 0.25)")
  T.is(gpu.arange(4, { dtype = "f64" }):totable(), { 0.0, 1.0, 2.0, 3.0 }, "dtype option")
  T.is(gpu.arange(1, 4, { dtype = "u8", device = "pinned" }):totable(), { 1, 2, 3 }, "u8 on pinned")
  local n = gpu.arange(10000, { dtype = "i32" }):totable()
  local ok = #n == 10000
  for i = 1, #n do ok = ok and n[i] == i - 1 end
  T.ok(ok, "arange(10000) elementwise")
  T.raises_at(function() gpu.arange(0, 5, 0) end, "step", "step 0 raises")
  T.is(gpu.arange(5, 0).shape, { 0 }, "an empty range is an empty tensor (as NumPy)")
  T.is(gpu.arange(2.5, 2.5).shape, { 0 }, "also with float bounds")
  T.raises_at(function() gpu.arange(0, 0 / 0) end, "give no range", "a NaN bound raises")
end)

local function stats(list)
  local n, s, s2 = #list, 0, 0
  for i = 1, n do s = s + list[i] end
  local mean = s / n
  for i = 1, n do s2 = s2 + (list[i] - mean) ^ 2 end
  return mean, math.sqrt(s2 / (n - 1))
end

T.test("rand", function()
  local a = gpu.rand({1000}, { seed = 42 }):totable()
  local b = gpu.rand({1000}, { seed = 42 }):totable()
  local c = gpu.rand({1000}, { seed = 43 }):totable()
  T.is(a, b, "same seed, same numbers")
  T.isnt(a, c, "another seed, other numbers")
  local distinct = {}
  for _, v in ipairs(a) do distinct[v] = true end
  local nd = 0
  for _ in pairs(distinct) do nd = nd + 1 end
  T.ok(nd > 990, "1000 draws are (nearly) all distinct: " .. nd)
  for _, dt in ipairs(T.float_dtypes) do
    local v = gpu.rand({100000}, { dtype = dt, low = -2, high = 3, seed = 7 }):totable()
    local lo, hi = math.huge, -math.huge
    for i = 1, #v do lo = math.min(lo, v[i]); hi = math.max(hi, v[i]) end
    T.ok(lo >= -2 and hi < 3, string.format("%s rand in [-2, 3): min %.6g max %.6g", dt, lo, hi))
    local m = stats(v)
    T.near(m, 0.5, { abs = 0.02 }, dt .. " rand mean ~ 0.5")
  end
  local u = gpu.rand({100000}, { dtype = "f16", seed = 3 }):totable()
  local umax = -1
  for i = 1, #u do umax = math.max(umax, u[i]) end
  T.ok(umax < 1, "f16 rand in [0, 1): values close to 1 do not round up to 1 (max " .. umax .. ")")
  local r = gpu.rand({2000}, { dtype = "i32", low = -5, high = 5, seed = 1 }):totable()
  local seen, inrange = {}, true
  for _, v in ipairs(r) do
    inrange = inrange and math.type(v) == "integer" and v >= -5 and v < 5
    seen[v] = true
  end
  T.ok(inrange, "i32 rand integers in [-5, 5)")
  local all = true
  for k = -5, 4 do all = all and seen[k] == true end
  T.ok(all, "every value of [-5, 5) drawn")
  local d = gpu.rand({1000}, { dtype = "i64", seed = 2 }):totable()
  local okd = true
  for _, v in ipairs(d) do okd = okd and v >= 0 and v < (1 << 31) end
  T.ok(okd, "i64 rand default range [0, 2^31)")
  local bl = gpu.rand({200}, { dtype = "bool", seed = 9 }):totable()
  local nt, nf = 0, 0
  for _, v in ipairs(bl) do if v == true then nt = nt + 1 elseif v == false then nf = nf + 1 end end
  T.ok(nt > 0 and nf > 0 and nt + nf == 200, "bool rand gives both values: " .. nt .. " true")
end)

T.test("randn", function()
  local v = gpu.randn({100000}, { seed = 11 }):totable()
  local m, sd = stats(v)
  T.near(m, 0, { abs = 0.02 }, "randn mean ~ 0: " .. m)
  T.near(sd, 1, { abs = 0.02 }, "randn std ~ 1: " .. sd)
  local w = gpu.randn({100000}, { dtype = "f64", mean = 3, std = 2, seed = 12 }):totable()
  local m2, sd2 = stats(w)
  T.near(m2, 3, { abs = 0.04 }, "randn{mean=3} ~ 3: " .. m2)
  T.near(sd2, 2, { abs = 0.04 }, "randn{std=2} ~ 2: " .. sd2)
  local tails = 0
  for i = 1, #v do if math.abs(v[i]) > 3 then tails = tails + 1 end end
  T.ok(tails > 100 and tails < 450, "about 0.27% beyond 3 sigma: " .. tails .. " of 100000")
  T.is(gpu.randn({64}, { seed = 5 }):totable(), gpu.randn({64}, { seed = 5 }):totable(), "randn reproducible")
end)

T.done()
