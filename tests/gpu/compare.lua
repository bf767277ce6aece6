-- Every built-in op on the device against the same op on pinned memory (run
-- by the host kernels on the calling thread), on the same inputs: exact for
-- integers and bool, a tolerance per dtype for floats.  Meaningful on the
-- cuda backend (make test-gpu); on the host backend both sides are the host.
local gpu = require "gpu"
local T = require "gpu.test"

local FLOATS = { "f32", "f64", "f16", "bf16" }
local INTS = { "i8", "u8", "i32", "i64" }
local ALL = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" }
local RTOL = { f32 = 1e-5, f64 = 1e-12, f16 = 2e-3, bf16 = 1.6e-2 }

local function isfloat(dt) return RTOL[dt] ~= nil end

-- compare two tensors element by element; one TAP line
local function same(dev, ref, name, rtol)
  local a, b = T.flatten(dev:totable()), T.flatten(ref:totable())
  if #a ~= #b then return T.ok(false, name .. ": sizes differ") end
  local tol = rtol or RTOL[ref.dtype]
  for i = 1, #a do
    local x, y = a[i], b[i]
    local ok
    if tol and type(x) == "number" then
      ok = (x ~= x and y ~= y) or x == y or math.abs(x - y) <= tol * math.max(1, math.abs(y))
    else
      ok = x == y
    end
    if not ok then
      return T.ok(false, string.format("%s: element %d: device %s, host %s", name, i, tostring(x), tostring(y)))
    end
  end
  T.ok(true, name)
end

-- inputs: made on the device, copied to pinned memory
local function inputs(dt, shape, seed, lo, hi)
  local opts = { dtype = dt, seed = seed }
  if not isfloat(dt) and dt ~= "bool" then
    local r = ({ i8 = { -128, 128 }, u8 = { 0, 256 } })[dt] or { math.mininteger, math.maxinteger }
    opts.low = math.max(lo or -50, r[1])
    opts.high = math.min(hi or 50, r[2])
  end
  if isfloat(dt) then opts.low, opts.high = lo or -4, hi or 4 end
  local d = gpu.rand(shape, opts)
  return d, d:to("pinned")
end

T.test("constructors and fill", function()
  for _, dt in ipairs(ALL) do
    local v = dt == "bool" and true or 3
    same(gpu.full({ 7, 5 }, v, { dtype = dt }), gpu.full({ 7, 5 }, v, { dtype = dt, device = "pinned" }), "full " .. dt)
    if dt ~= "bool" then
      same(gpu.arange(0, 100, 3, { dtype = dt == "u8" and "u8" or dt }),
           gpu.arange(0, 100, 3, { dtype = dt, device = "pinned" }), "arange " .. dt)
    end
    local ropts = { dtype = dt, seed = 42 }
    same(gpu.rand({ 4099 }, ropts), gpu.rand({ 4099 }, { dtype = dt, seed = 42, device = "pinned" }),
         "rand " .. dt .. " same numbers for the same seed", isfloat(dt) and 0 or nil)
    if isfloat(dt) then
      same(gpu.randn({ 4099 }, { dtype = dt, seed = 7 }), gpu.randn({ 4099 }, { dtype = dt, seed = 7, device = "pinned" }),
           "randn " .. dt)
    end
  end
end)

T.test("linspace, eye, randint, *_like", function()
  for _, dt in ipairs(ALL) do
    local function both(f) return f({ dtype = dt }), f({ dtype = dt, device = "pinned" }) end
    local a, b = both(function(o) return gpu.linspace(-7, 9.5, 1001, o) end)
    same(a, b, "linspace " .. dt, 0)
    a, b = both(function(o) return gpu.eye(37, 53, o) end)
    same(a, b, "eye " .. dt, 0)
    local lo, hi = -1000, 1000
    if dt == "u8" then lo, hi = 0, 256 elseif dt == "i8" then lo, hi = -128, 128 elseif dt == "bool" then lo, hi = 0, 2 end
    a, b = both(function(o) o.seed = 99 return gpu.randint(lo, hi, { 77, 53 }, o) end)
    same(a, b, "randint " .. dt .. " same numbers for the same seed", 0)
    local v = dt == "bool" and true or 3
    same(gpu.full_like(a, v), gpu.full_like(b, v), "full_like " .. dt)
    same(gpu.zeros_like(a), gpu.zeros_like(b), "zeros_like " .. dt)
  end
  same(gpu.randint(math.mininteger, math.maxinteger, 4099, { seed = 5 }),
       gpu.randint(math.mininteger, math.maxinteger, 4099, { seed = 5, device = "pinned" }), "randint over all of i64")
end)

T.test("casts between every pair of dtypes", function()
  for _, from in ipairs(ALL) do
    local d, h = inputs(from, { 333 }, 11, -300, 300)
    if isfloat(from) then
      d = (d * 80):to(from); h = (h * 80):to(from)   -- exercise saturation
    end
    for _, to in ipairs(ALL) do
      same(d:to(to), h:to(to), "cast " .. from .. " -> " .. to, 0)
    end
  end
end)

T.test("unary ops", function()
  for _, dt in ipairs(FLOATS) do
    local d, h = inputs(dt, { 64, 33 }, 3, 0.05, 3)
    for _, op in ipairs { "neg", "abs", "exp", "log", "sqrt", "relu", "sigmoid", "tanh",
                          "floor", "ceil", "round", "trunc", "sign", "sin", "cos", "rsqrt", "square" } do
      same(d[op](d), h[op](h), op .. " " .. dt)
    end
    local s, sh = inputs(dt, { 64, 33 }, 4, -3, 3)
    for _, op in ipairs { "floor", "ceil", "round", "trunc", "sign", "sin", "cos", "square" } do
      same(s[op](s), sh[op](sh), op .. " " .. dt .. " negatives")
      same(s:narrow(2, 2, 20)[op](s:narrow(2, 2, 20)), sh:narrow(2, 2, 20)[op](sh:narrow(2, 2, 20)),
           op .. " " .. dt .. " strided")
    end
    local h2 = (sh * 4):to(dt)
    same((s * 4):to(dt):round(), h2:round(), "round " .. dt .. " halves (to even)")
  end
  for _, dt in ipairs(INTS) do
    local d, h = inputs(dt, { 1000 }, 5)
    for _, op in ipairs { "neg", "abs", "relu", "floor", "ceil", "round", "trunc", "sign", "square" } do
      same(d[op](d), h[op](h), op .. " " .. dt)
    end
  end
end)

T.test("issue 34's ops: the C library's functions against CUDA's, isclose, nan_to_num", function()
  local SPECIAL = { 0.0, -0.0, 1, -1, 1 / 0, -1 / 0, 0 / 0, 1e-30, 1e30, -2, 2, 0.5, 100, -100, 21, -0.99 }
  for _, dt in ipairs(FLOATS) do
    local d, h = inputs(dt, { 64, 33 }, 31, -0.99, 3)
    local sd = gpu.tensor(SPECIAL, { dtype = dt })
    local sh = sd:to("pinned")
    for _, op in ipairs { "log1p", "expm1", "log2", "log10", "exp2", "tan", "asin", "acos", "atan", "sinh", "cosh",
                          "erf", "reciprocal", "gelu", "silu", "softplus", "isnan", "isinf", "isfinite" } do
      same(d[op](d), h[op](h), op .. " " .. dt)
      same(sd[op](sd), sh[op](sh), op .. " " .. dt .. " special values")
    end
    local b, bh = inputs(dt, { 64, 33 }, 32, -3, 3)
    for _, op in ipairs { "atan2", "hypot", "leaky_relu" } do
      same(d[op](d, b), h[op](h, bh), op .. " " .. dt)
      same(d[op](d, 0.3), h[op](h, 0.3), op .. " " .. dt .. " number")
    end
    same(d:lerp(b, 0.3), h:lerp(bh, 0.3), "lerp " .. dt)
    same(d:lerp(b, b), h:lerp(bh, bh), "lerp " .. dt .. " tensor weight")
    same(d:isclose(d:add(1e-3)), h:isclose(h:add(1e-3)), "isclose " .. dt, 0)
    same(sd:nan_to_num(), sh:nan_to_num(), "nan_to_num " .. dt, 0)
  end
  for _, dt in ipairs(INTS) do
    local d, h = inputs(dt, { 1000 }, 33)
    for _, op in ipairs { "isnan", "isinf", "isfinite" } do same(d[op](d), h[op](h), op .. " " .. dt) end
    same(d:isclose(d:add(1)), h:isclose(h:add(1)), "isclose " .. dt, 0)
  end
end)

T.test("binary ops: tensor, scalar, scalar on the left, broadcast, strided", function()
  for _, dt in ipairs(ALL) do
    local ops = dt == "bool" and { "max", "min" } or
                { "add", "sub", "mul", "div", "pow", "max", "min", "fmod", "remainder", "floor_divide" }
    local a, ah = inputs(dt, { 40, 30 }, 21, 1, 9)
    local b, bh = inputs(dt, { 40, 30 }, 22, 1, 9)
    local r, rh = inputs(dt, { 30 }, 23, 1, 9)
    for _, op in ipairs(ops) do
      same(a[op](a, b), ah[op](ah, bh), op .. " " .. dt)
      same(a[op](a, r), ah[op](ah, rh), op .. " " .. dt .. " broadcast")
      same(a:narrow(2, 3, 20)[op](a:narrow(2, 3, 20), b:narrow(2, 5, 20)),
           ah:narrow(2, 3, 20)[op](ah:narrow(2, 3, 20), bh:narrow(2, 5, 20)), op .. " " .. dt .. " strided")
      if dt ~= "bool" then
        same(a[op](a, 3), ah[op](ah, 3), op .. " " .. dt .. " scalar")
      end
    end
    if dt ~= "bool" then
      same(7 - a, 7 - ah, "scalar - " .. dt)
      same(7 / a, 7 / ah, "scalar / " .. dt)
      same(7 % a, 7 % ah, "scalar % " .. dt)
      same(7 // a, 7 // ah, "scalar // " .. dt)
      same(a % 3, ah % 3, dt .. " % 3")
      same(a // 3, ah // 3, dt .. " // 3")
    end
  end
  for _, dt in ipairs(INTS) do
    local a, ah = inputs(dt, { 500 }, 31, -100, 100)
    local b, bh = inputs(dt, { 500 }, 32, 1, 9)
    same(a / b, ah / bh, "floor division " .. dt)
    same(-a / b, -ah / bh, "floor division of negatives " .. dt)
    for _, op in ipairs { "fmod", "remainder", "floor_divide" } do
      same(a[op](a, -b), ah[op](ah, -bh), op .. " " .. dt .. " negative divisors")
    end
  end
  for _, dt in ipairs(FLOATS) do
    local a, ah = inputs(dt, { 500 }, 33, -100, 100)
    local b, bh = inputs(dt, { 500 }, 34, -9, 9)
    for _, op in ipairs { "fmod", "remainder", "floor_divide" } do
      same(a[op](a, b), ah[op](ah, bh), op .. " " .. dt .. " signs mixed")
    end
  end
end)

T.test("reductions, whole and along every dim", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 17, 9, 13 }, 41)
    for _, op in ipairs { "sum", "mean", "max", "min", "argmax" } do
      same(d[op](d), h[op](h), op .. " " .. dt)
      for dim = 1, 3 do
        same(d[op](d, { dim = dim }), h[op](h, { dim = dim }), op .. " " .. dt .. " dim " .. dim)
      end
    end
  end
  local big, bigh = inputs("f32", { 1 << 22 }, 43)
  same(big:sum(), bigh:sum(), "sum of 4M f32", 1e-4)
  same(big:argmax(), bigh:argmax(), "argmax of 4M f32")
end)

T.test("matmul", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i32", "i64", "i8" } do
    local a, ah = inputs(dt, { 67, 45 }, 51, -3, 3)
    local b, bh = inputs(dt, { 45, 29 }, 52, -3, 3)
    local tol = ({ f32 = 1e-4, f64 = 1e-10, f16 = 1e-2, bf16 = 3e-2 })[dt]
    same(gpu.matmul(a, b), gpu.matmul(ah, bh), "matmul " .. dt, tol)
    same(gpu.matmul(a:narrow(2, 2, 40), b:narrow(1, 3, 40)), gpu.matmul(ah:narrow(2, 2, 40), bh:narrow(1, 3, 40)),
         "matmul " .. dt .. " strided operands", tol)
  end
end)

T.test("copies: strided, between memories", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 31, 17 }, 61)
    same(d:narrow(2, 4, 9):contiguous(), h:narrow(2, 4, 9):contiguous(), "strided copy " .. dt)
    local hostt = gpu.empty({ 31, 9 }, { dtype = dt, device = "host" })
    hostt:copy(d:narrow(2, 4, 9))
    same(hostt, h:narrow(2, 4, 9):contiguous(), "device strided -> pageable " .. dt)
    local back = gpu.empty({ 31, 17 }, { dtype = dt })
    back:copy(h)
    same(back, h, "pinned -> device " .. dt)
  end
end)

T.test("views, reshape copies, cat and stack", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 6, 5, 7 }, 101)
    same(d:transpose(1, 3):contiguous(), h:transpose(1, 3):contiguous(), "transpose copy " .. dt)
    same(d:permute { 2, 3, 1 }:reshape { 5, 42 }, h:permute { 2, 3, 1 }:reshape { 5, 42 }, "reshape of a permuted view " .. dt)
    same(d:slice(3, 2, -1, 2):contiguous(), h:slice(3, 2, -1, 2):contiguous(), "stepped slice copy " .. dt)
    same(d:select(2, 3):unsqueeze(1):expand { 4, 6, 7 }:contiguous(), h:select(2, 3):unsqueeze(1):expand { 4, 6, 7 }:contiguous(),
         "expanded view copy " .. dt)
    same(gpu.cat({ d, d:slice(1, 2, 4) }), gpu.cat({ h, h:slice(1, 2, 4) }), "cat dim 1 " .. dt)
    same(gpu.cat({ d:transpose(1, 2):transpose(1, 2), d:slice(3, 1, -1, 3) }, 3),
         gpu.cat({ h:transpose(1, 2):transpose(1, 2), h:slice(3, 1, -1, 3) }, 3), "cat dim 3 of strided views " .. dt)
    same(gpu.stack({ d, d, d }, 2), gpu.stack({ h, h, h }, 2), "stack dim 2 " .. dt)
    local o, oh = gpu.zeros({ 6, 12, 7 }, { dtype = dt }), gpu.zeros({ 6, 12, 7 }, { dtype = dt, device = "pinned" })
    gpu.cat({ d, d }, 2, { out = o:slice(2, 2, -2) })
    gpu.cat({ h, h }, 2, { out = oh:slice(2, 2, -2) })
    same(o, oh, "cat into a strided out " .. dt)
  end
end)

-- the tiled transpose of k_copy.cu (in contiguous along one dim, out along
-- another, both at least 16 long); shorter or degenerate ones take the gather
T.test("transposing copies: tails, every element size, batches, strided sides", function()
  for _, dt in ipairs(ALL) do
    for _, s in ipairs { { 1, 70 }, { 70, 1 }, { 33, 65 }, { 1000, 3 }, { 3, 1000 }, { 15, 40 }, { 16, 17 }, { 64, 96 } } do
      local d, h = inputs(dt, s, 141)
      same(d:t():contiguous(), h:t():contiguous(), string.format("transpose copy %dx%d %s", s[1], s[2], dt))
    end
    local d, h = inputs(dt, { 20, 33, 17 }, 142)
    for _, p in ipairs { { 2, 3, 1 }, { 3, 1, 2 }, { 1, 3, 2 }, { 2, 1, 3 } } do
      same(d:permute(p):contiguous(), h:permute(p):contiguous(), "permute " .. T.fmt(p) .. " copy " .. dt)
    end
    same(d:permute { 3, 1, 2 }:reshape { 17, 660 }, h:permute { 3, 1, 2 }:reshape { 17, 660 },
         "reshape of a permuted view " .. dt)
    local w, wh = inputs(dt, { 40, 70 }, 143)
    same(w:narrow(2, 3, 50):t():contiguous(), wh:narrow(2, 3, 50):t():contiguous(),
         "transpose copy of a narrowed view " .. dt)
    same(w:slice(1, 2, -1, 2):t():contiguous(), wh:slice(1, 2, -1, 2):t():contiguous(),
         "transpose copy of a stepped slice " .. dt)
    local o, oh = gpu.empty({ 50, 40 }, { dtype = dt }), gpu.empty({ 50, 40 }, { dtype = dt, device = "pinned" })
    o:copy(w:narrow(2, 3, 50):t())
    oh:copy(wh:narrow(2, 3, 50):t())
    same(o, oh, "out:copy of a transposed narrowed view " .. dt)
    same(gpu.cat({ w:t(), w:narrow(1, 3, 30):t() }, 2), gpu.cat({ wh:t(), wh:narrow(1, 3, 30):t() }, 2),
         "cat dim 2 of transposed views " .. dt)
    local q, qh = inputs(dt, { 40, 40 }, 144)
    q, qh = q:clone(), qh:clone()
    q:copy(q:t())
    qh:copy(qh:t())
    same(q, qh, "a square tensor copied onto its own transpose " .. dt)
  end
  -- more tiles than the grid has blocks, 300 batches: compared on the device
  local d, h = inputs("u8", { 300, 40, 520 }, 145)
  local r = gpu.zeros({ 300, 520, 40 }, { dtype = "u8" })
  r:copy(h:permute { 1, 3, 2 }:contiguous())
  T.ok(d:permute { 1, 3, 2 }:contiguous():eq(r):all():item(), "batched transpose copy of 6M u8")
  d, h = inputs("f64", { 700, 900 }, 146)
  r = gpu.zeros({ 900, 700 }, { dtype = "f64" })
  r:copy(h:t():contiguous())
  T.ok(d:t():contiguous():eq(r):all():item(), "transpose copy of 900x700 f64")
end)

T.test("zero-sized dims", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 4, 6 }, 111)
    local z, zh = gpu.zeros({ 4, 0 }, { dtype = dt }), gpu.zeros({ 4, 0 }, { dtype = dt, device = "pinned" })
    same(gpu.cat({ d, z, d }, 2), gpu.cat({ h, zh, h }, 2), "cat with an empty part " .. dt)
    same(z:t():contiguous(), zh:t():contiguous(), "copy of an empty view " .. dt)
    if dt ~= "bool" then
      same(z + 1, zh + 1, "an elementwise op on an empty tensor " .. dt)
      if dt ~= "u8" then
        same(gpu.matmul(z, z:t()), gpu.matmul(zh, zh:t()), "matmul over k = 0 " .. dt)
      end
    end
  end
  local e = gpu.zeros({ 0, 3 })
  T.is({ e:totable(), tostring(e) }, { {}, "gpu.Tensor(f32, {0,3}, device)\n{}" }, "totable and tostring of an empty tensor")
end)

-- small integers in dtype dt (so that comparisons tie), on the device and pinned
local function ties(dt, shape, seed)
  local d = gpu.rand(shape, { dtype = dt == "bool" and "bool" or "i32", low = dt ~= "bool" and -3 or nil,
                              high = dt ~= "bool" and 3 or nil, seed = seed })
  if dt ~= "bool" and dt ~= "i32" then d = d:to(dt) end
  if dt == "u8" then d = gpu.rand(shape, { dtype = "u8", low = 0, high = 4, seed = seed }) end
  return d, d:to("pinned")
end

T.test("comparisons and logical ops", function()
  for _, dt in ipairs(ALL) do
    local a, ah = ties(dt, { 40, 30 }, 71)
    local b, bh = ties(dt, { 40, 30 }, 72)
    local r, rh = ties(dt, { 30 }, 73)
    local s = dt == "bool" and true or 1
    for _, op in ipairs { "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or" } do
      same(a[op](a, b), ah[op](ah, bh), op .. " " .. dt)
      same(a[op](a, r), ah[op](ah, rh), op .. " " .. dt .. " broadcast")
      same(a[op](a, s), ah[op](ah, s), op .. " " .. dt .. " number")
      same(a:narrow(2, 3, 20)[op](a:narrow(2, 3, 20), b:narrow(2, 5, 20)),
           ah:narrow(2, 3, 20)[op](ah:narrow(2, 3, 20), bh:narrow(2, 5, 20)), op .. " " .. dt .. " strided")
    end
    same(a:logical_not(), ah:logical_not(), "logical_not " .. dt)
    same(a:narrow(2, 2, 7):logical_not(), ah:narrow(2, 2, 7):logical_not(), "logical_not " .. dt .. " strided")
  end
end)

T.test("where and masked_fill", function()
  local c, ch = inputs("bool", { 40, 30 }, 81)
  local cr, crh = inputs("bool", { 40, 1 }, 82)
  for _, dt in ipairs(ALL) do
    local a, ah = inputs(dt, { 40, 30 }, 83)
    local b, bh = inputs(dt, { 40, 30 }, 84)
    local r, rh = inputs(dt, { 30 }, 85)
    local s = dt == "bool" and true or 3
    same(gpu.where(c, a, b), gpu.where(ch, ah, bh), "where " .. dt)
    same(gpu.where(c, s, b), gpu.where(ch, s, bh), "where " .. dt .. " number, tensor")
    same(gpu.where(c, a, s), gpu.where(ch, ah, s), "where " .. dt .. " tensor, number")
    same(gpu.where(c, s, s, { dtype = dt }), gpu.where(ch, s, s, { dtype = dt }), "where " .. dt .. " numbers")
    same(gpu.where(cr, r, b), gpu.where(crh, rh, bh), "where " .. dt .. " broadcast")
    same(gpu.where(c:narrow(2, 2, 20), a:narrow(2, 3, 20), b:narrow(2, 5, 20)),
         gpu.where(ch:narrow(2, 2, 20), ah:narrow(2, 3, 20), bh:narrow(2, 5, 20)), "where " .. dt .. " strided")
    same(a:masked_fill(c, s), ah:masked_fill(ch, s), "masked_fill " .. dt)
    same(a:masked_fill(cr, s), ah:masked_fill(crh, s), "masked_fill " .. dt .. " broadcast mask")
    same(a:clone():masked_fill_(c, s), ah:clone():masked_fill_(ch, s), "masked_fill_ " .. dt)
  end
end)

T.test("clamp", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64" } do
    local a, ah = inputs(dt, { 40, 30 }, 95, -9, 9)
    local lo, loh = inputs(dt, { 30 }, 96, -3, 1)
    local hi, hih = inputs(dt, { 40, 1 }, 97, 1, 5)
    local l, u = dt == "u8" and 2 or -2, 3
    same(a:clamp(l, u), ah:clamp(l, u), "clamp " .. dt .. " numbers")
    same(a:clamp(nil, u), ah:clamp(nil, u), "clamp " .. dt .. " no lower bound")
    same(a:clamp(l), ah:clamp(l), "clamp " .. dt .. " no upper bound")
    same(a:clamp(lo, hi), ah:clamp(loh, hih), "clamp " .. dt .. " tensors, broadcast")
    same(a:clamp(lo, u), ah:clamp(loh, u), "clamp " .. dt .. " tensor, number")
    same(a:narrow(2, 3, 20):clamp(l, u), ah:narrow(2, 3, 20):clamp(l, u), "clamp " .. dt .. " strided")
    same(a:clone():clamp_(l, u), ah:clone():clamp_(l, u), "clamp_ " .. dt)
  end
end)

T.test("any and all, whole and along every dim", function()
  for _, dt in ipairs(ALL) do
    local d, h = ties(dt, { 17, 9, 13 }, 91)
    local m = d:ne(dt == "bool" and false or 0)
    for _, op in ipairs { "any", "all" } do
      same(d[op](d), h[op](h), op .. " " .. dt)
      for dim = 1, 3 do
        same(d[op](d, { dim = dim }), h[op](h, { dim = dim }), op .. " " .. dt .. " dim " .. dim)
      end
    end
    T.ok(m:any():item() == true and m:all():item() == false, "any/all " .. dt .. " of a mixed tensor")
  end
  local big = gpu.zeros({ 1 << 22 }, { dtype = "u8" })
  big:set(3000001, 1)
  T.is({ big:any():item(), big:all():item(), big:eq(0):all():item() }, { true, false, false },
       "any/all of 4M u8 with one nonzero")
end)

T.test("prod, argmin, var, std, norm, logsumexp: whole, along every dim, strided", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 17, 9, 13 }, 101, -4, 4)
    local ops = { { "prod" }, { "argmin" } }
    if isfloat(dt) then
      d, h = inputs(dt, { 17, 9, 13 }, 101, 0.6, 1.4)   -- products of 2000 stay finite
      ops = { { "prod" }, { "argmin" }, { "var" }, { "var", { unbiased = false } }, { "std" }, { "norm" },
              { "norm", { p = 1 } }, { "norm", { p = math.huge } }, { "norm", { p = 3 } }, { "logsumexp" } }
    end
    for _, o in ipairs(ops) do
      local op, opts = o[1], o[2] or {}
      local name = op .. " " .. dt .. (o[2] and " " .. T.fmt(o[2]) or "")
      local tol = isfloat(dt) and RTOL[dt] * 4 or nil
      same(d[op](d, opts), h[op](h, opts), name, tol)
      for dim = 1, 3 do
        local od = { dim = dim }
        for k, v in pairs(opts) do od[k] = v end
        same(d[op](d, od), h[op](h, od), name .. " dim " .. dim, tol)
        same(d:narrow(3, 2, 9)[op](d:narrow(3, 2, 9), od), h:narrow(3, 2, 9)[op](h:narrow(3, 2, 9), od),
             name .. " dim " .. dim .. " strided", tol)
      end
    end
  end
  local big, bigh = inputs("f32", { 1 << 22 }, 103)
  same(big:var(), bigh:var(), "var of 4M f32", 1e-5)
  same(big:logsumexp(), bigh:logsumexp(), "logsumexp of 4M f32", 1e-5)
  same(big:argmin(), bigh:argmin(), "argmin of 4M f32")
  local s = gpu.tensor({ { 0 / 0, 1, -1 }, { 1 / 0, 2, -1 / 0 }, { -1 / 0, -1 / 0, -1 / 0 } })
  for _, op in ipairs { "argmin", "var", "norm", "logsumexp" } do
    same(s[op](s, { dim = 2 }), s:to("pinned")[op](s:to("pinned"), { dim = 2 }), op .. " special values")
  end
end)

T.test("cumprod, sort, argsort, topk, flip, roll, tril, triu: every dtype, the chunk sizes, strided", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 17, 9, 65 }, 121, -2, 3)
    if isfloat(dt) then d, h = inputs(dt, { 17, 9, 65 }, 121, 0.6, 1.5) end
    for dim = 1, 3 do
      same(d:cumprod(dim), h:cumprod(dim), "cumprod " .. dt .. " dim " .. dim, isfloat(dt) and RTOL[dt] * 8 or nil)
    end
    -- small integers and floats for ties; exact: the order is total
    local x, xh = inputs(dt, { 17, 9, 65 }, 122, -9, 9)
    for dim = 1, 3 do
      for _, desc in ipairs { false, true } do
        local v, i = x:sort { dim = dim, descending = desc }
        local vh, ih = xh:sort { dim = dim, descending = desc }
        local tag = string.format(" %s dim %d%s", dt, dim, desc and " descending" or "")
        same(v, vh, "sort values" .. tag, 0)
        same(i, ih, "sort indices" .. tag, 0)
      end
      same(x:narrow(3, 3, 60):argsort(dim), xh:narrow(3, 3, 60):argsort(dim), "argsort strided " .. dt .. " dim " .. dim, 0)
    end
    -- one block, several chunks, global merges; unaligned lengths
    for _, n in ipairs { 1, 31, 2048, 2049, 5000, 70000 } do
      local r, rh = inputs(dt, { 3, n }, 123 + n, -9, 9)
      same(r:argsort(), rh:argsort(), string.format("argsort %s rows of %d", dt, n), 0)
      local k = math.min(n, 16)
      local tv, ti = r:topk(k)
      local tvh, tih = rh:topk(k)
      same(tv, tvh, string.format("topk %d %s rows of %d", k, dt, n), 0)
      same(ti, tih, string.format("topk %d indices %s rows of %d", k, dt, n), 0)
    end
  end
  for _, dt in ipairs(ALL) do
    local x, xh = inputs(dt, { 6, 7, 9 }, 125, -9, 9)
    same(x:flip({ 1, 3 }), xh:flip({ 1, 3 }), "flip " .. dt, 0)
    same(x:roll({ 2, -3 }, { 2, 3 }), xh:roll({ 2, -3 }, { 2, 3 }), "roll " .. dt, 0)
    same(x:narrow(3, 2, 5):roll(4), xh:narrow(3, 2, 5):roll(4), "roll flat strided " .. dt, 0)
    same(x:tril(1), xh:tril(1), "tril " .. dt, 0)
    same(x:triu(-1), xh:triu(-1), "triu " .. dt, 0)
  end
  local big, bigh = inputs("f32", { 1 << 20 }, 124)
  same(big:argsort(), bigh:argsort(), "argsort of 1M f32", 0)
  local s = gpu.tensor({ { 0 / 0, 1, -0.0, 0.0, -1 / 0, 0 / 0, 1 / 0, 1 } })
  for _, desc in ipairs { false, true } do
    same(s:argsort { descending = desc }, s:to("pinned"):argsort { descending = desc }, "argsort special values", 0)
  end
end)

-- values with ties, NaN, both infinities and both zeros (floats), small
-- integers (ties), from a seed: the order's corner cases in every row
local function specials(dt, shape, seed)
  local n, r, x = 1, {}, seed
  for _, s in ipairs(shape) do n = n * s end
  local sp = { 0 / 0, 1 / 0, -1 / 0, 0.0, -0.0, 0.5, -0.5, 2 }
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    local k = x % 11
    if dt == "bool" then r[i] = k % 2 == 0
    elseif isfloat(dt) then r[i] = k < 4 and sp[(x // 11) % #sp + 1] or (k - 7) * 0.25
    elseif dt == "u8" then r[i] = k * 20
    else r[i] = k - 5 end
  end
  local d = gpu.tensor(r, { dtype = dt }):view(shape)
  return d, d:to("pinned")
end

-- sort's paths on the cuda backend: rows of up to 2048 in shared memory; a
-- longer row by a radix sort of 32-bit keys (64-bit: f64, i64); many long
-- rows as one batch (the row in the key) or segments (64-bit keys)
T.test("sort paths: short, one long row, many long rows; NaN, -0, ties; strided; every dtype", function()
  for _, dt in ipairs(ALL) do
    local cases = {
      { { 2048 }, 1, "one row of 2048 (shared memory)" },
      { { 2049 }, 1, "one row of 2049 (radix)" },
      { { 100003 }, 1, "one row of 100003" },
      { { 5, 4099 }, 2, "5 rows of 4099 (batched)" },
      { { 3, 2500, 3 }, 2, "3x3 strided rows of 2500, dim 2" },
    }
    for ci, c in ipairs(cases) do
      local x, xh = specials(dt, c[1], 340 + ci)
      for _, desc in ipairs { false, true } do
        local v, i = x:sort { dim = c[2], descending = desc }
        local vh, ih = xh:sort { dim = c[2], descending = desc }
        local tag = string.format(" %s %s%s", dt, c[3], desc and " descending" or "")
        same(v, vh, "sort values" .. tag, 0)
        same(i, ih, "sort indices" .. tag, 0)
      end
    end
    local x, xh = specials(dt, { 4100, 4 }, 350)
    same(x:t():argsort(), xh:t():argsort(), "argsort of a transposed {4100,4} " .. dt, 0)
    same(x:narrow(1, 2, 4000):argsort(1), xh:narrow(1, 2, 4000):argsort(1), "argsort dim 1 of a narrowed " .. dt, 0)
    local w, wh = specials(dt, { 1, 3000 }, 351)
    w, wh = w:expand({ 70, 3000 }), wh:expand({ 70, 3000 })
    same(w:argsort { descending = true }, wh:argsort { descending = true }, "argsort of 70 expanded rows " .. dt, 0)
  end
  local big, bigh = inputs("f32", { 64, 1 << 16 }, 352)
  same(big:argsort(), bigh:argsort(), "argsort of 64 rows of 64K f32", 0)
  local big64, big64h = inputs("f64", { 1 << 20 }, 353)
  same(big64:argsort { descending = true }, big64h:argsort { descending = true }, "argsort of 1M f64 descending", 0)
end)

-- topk's paths on the cuda backend: a selection in rounds of chunks for k
-- up to 256 (any k on rows of up to 2048), the radix sort's first k past it
T.test("topk paths: selection rounds, short rows, radix; NaN, -0, ties; strided; every dtype", function()
  local function both(x, xh, k, opts, tag)
    local v, i = x:topk(k, opts)
    local vh, ih = xh:topk(k, opts)
    same(v, vh, "topk values " .. tag, 0)
    same(i, ih, "topk indices " .. tag, 0)
  end
  for _, dt in ipairs(ALL) do
    local x, xh = specials(dt, { 3, 9000 }, 360)
    for _, k in ipairs { 1, 16, 256, 257, 1024, 9000 } do
      both(x, xh, k, nil, string.format("%s 3 rows of 9000 k %d", dt, k))
      both(x, xh, k, { largest = false }, string.format("%s 3 rows of 9000 k %d smallest", dt, k))
    end
    local s, sh = specials(dt, { 40, 2048 }, 361)
    both(s, sh, 1000, nil, dt .. " 40 rows of 2048 k 1000 (one round)")
    both(s:t(), sh:t(), 7, { dim = 1 }, dt .. " strided rows of 2048, dim 1, k 7")
    local t, th = specials(dt, { 4500, 3 }, 362)
    both(t, th, 200, { dim = 1, largest = false }, dt .. " {4500,3} dim 1 k 200 smallest (strided, two rounds)")
  end
  local big, bigh = inputs("f32", { 1 << 20 }, 363)
  both(big, bigh, 256, nil, "f32 1M k 256 (four rounds)")
  local m, mh = inputs("f32", { 64, 100000 }, 364)
  both(m, mh, 16, nil, "f32 64 rows of 100000 k 16")
  local r, rh = inputs("f16", { 8, 1 << 16 }, 365, -2, 2)   -- f16: many ties
  both(r, rh, 100, { largest = false }, "f16 8 rows of 64K k 100 smallest")
end)

-- topk's radix select on the cuda backend (rows longer than 2048, k up to
-- 256): digit passes to the k-th key, the gather (all of the equal keys, or
-- the first by position where only some are taken, across the blocks of a
-- row), the candidates sorted; k = 257 goes by rounds
T.test("topk radix select: long rows, ties, NaN, -0, strided, every k path; every dtype", function()
  local function both(x, xh, k, opts, tag)
    for _, largest in ipairs { true, false } do
      local o = { largest = largest }
      for key, v in pairs(opts or {}) do o[key] = v end
      local v, i = x:topk(k, o)
      local vh, ih = xh:topk(k, o)
      local t = string.format("topk %s k %d%s", tag, k, largest and "" or " smallest")
      same(v, vh, t .. " values", 0)
      same(i, ih, t .. " indices", 0)
    end
  end
  -- rows with maxima (and minima) every `step` positions: the k-th key's
  -- equal ones spread over the blocks of a row
  local function spikes(dt, shape, seed, step)
    local d = inputs(dt, shape, seed, -9, 9)
    local n = shape[#shape]
    local v = d:view({ -1, n // step, step })
    v:narrow(3, 7, 1):fill(isfloat(dt) and 100 or 60)
    v:narrow(3, 9, 1):fill(isfloat(dt) and -100 or 0)
    return d, d:to("pinned")
  end
  for _, dt in ipairs(ALL) do
    -- eleven distinct values: the k-th key's equal ones outnumber need
    for ci, shape in ipairs { { 2049 }, { 3, 4099 } } do
      local x, xh = specials(dt, shape, 380 + ci)
      local len = shape[#shape]
      for _, k in ipairs { 1, 16, 255, 256, 257, len - 1 } do
        both(x, xh, k, nil, string.format("%s specials %s", dt, table.concat(shape, "x")))
      end
    end
    local z = gpu.full({ 2, 5000 }, dt == "bool" and 1 or 3, { dtype = dt })
    for _, k in ipairs { 1, 16, 256 } do both(z, z:to("pinned"), k, nil, dt .. " all equal 2x5000") end
    local r, rh = inputs(dt, { 4, 6000 }, 386, -100, 100)
    for _, k in ipairs { 1, 16, 255, 256 } do both(r, rh, k, nil, dt .. " random 4x6000") end
    if dt ~= "bool" then
      local p, ph = spikes(dt, { 2, 70000 }, 387, 1000)
      for _, k in ipairs { 16, 69, 70, 71, 256 } do both(p, ph, k, nil, dt .. " 70 equal maxima, 2x70000") end
    end
    -- strided: dim 1 of a 2-D tensor, a transposed one, a narrowed one
    local s, sh = specials(dt, { 5000, 3 }, 388)
    both(s, sh, 16, { dim = 1 }, dt .. " dim 1 of 5000x3")
    both(s:t(), sh:t(), 200, nil, dt .. " transposed 3x5000")
    both(s:narrow(1, 2, 4990), sh:narrow(1, 2, 4990), 256, { dim = 1 }, dt .. " dim 1 of narrowed 4990x3")
  end
  local big, bigh = inputs("f32", { 1 << 20 }, 389)
  for _, k in ipairs { 1, 16, 255, 256, 257 } do both(big, bigh, k, nil, "f32 1M") end
  local p, ph = spikes("f32", { 1 << 20 }, 390, 4096)
  for _, k in ipairs { 16, 100, 256 } do both(p, ph, k, nil, "f32 1M with 256 equal maxima") end
  local h, hh = inputs("f16", { 1 << 20 }, 391, -2, 2)   -- f16: many ties
  both(h, hh, 256, nil, "f16 1M")
  local d, dh = inputs("f64", { 1 << 20 }, 392)
  both(d, dh, 16, nil, "f64 1M")
  local q, qh = specials("i64", { 1 << 20 }, 393)
  both(q, qh, 256, nil, "i64 specials 1M")
  if gpu.backend == "cuda" then   -- host against host: hours of qsort for nothing
    local m, mh = inputs("f32", { 64, 1 << 20 }, 394)
    both(m, mh, 16, nil, "f32 64 rows of 1M (the bench's)")
    local e, eh = spikes("f32", { 64, 1 << 20 }, 395, 4096)
    both(e, eh, 100, nil, "f32 64 rows of 1M with 256 equal maxima")
    both(m:t(), mh:t(), 16, { dim = 1 }, "f32 dim 1 of 1M x 64")
  end
end)

-- flip is one copy of a view with negative strides: the copy kernel's
-- gather and its tiled transpose (a transposed input) walking back
T.test("flip: one copy walking back; every dtype, strided, transposed, large", function()
  for _, dt in ipairs(ALL) do
    local x, xh = inputs(dt, { 6, 7, 9 }, 370, -9, 9)
    for _, dims in ipairs { { 1 }, { 3 }, { 1, 2, 3 }, { 2, 3 } } do
      local tag = table.concat(dims, ",")
      same(x:flip(dims), xh:flip(dims), "flip " .. tag .. " " .. dt, 0)
      same(x:narrow(3, 2, 6):transpose(1, 3):flip(dims), xh:narrow(3, 2, 6):transpose(1, 3):flip(dims),
           "flip " .. tag .. " of a strided transposed " .. dt, 0)
    end
    local m, mh = inputs(dt, { 300, 500 }, 371, -9, 9)
    same(m:t():flip(2), mh:t():flip(2), "flip of a transposed 300x500 (tiles) " .. dt, 0)
    same(m:flip({ 1, 2 }), mh:flip({ 1, 2 }), "flip both dims of 300x500 " .. dt, 0)
    local e, eh = inputs(dt, { 1, 400 }, 372, -9, 9)
    same(e:expand({ 3, 400 }):flip({ 1, 2 }), eh:expand({ 3, 400 }):flip({ 1, 2 }), "flip of an expanded " .. dt, 0)
  end
  -- a contiguous run backwards: 16 bytes a step where aligned, else one by one
  for _, dt in ipairs(ALL) do
    for _, n in ipairs { 1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 1000, 4099 } do
      local v, vh = inputs(dt, { n + 5 }, 374 + n, -9, 9)
      same(v:flip(1), vh:flip(1), string.format("flip of %d %s", n + 5, dt), 0)
      same(v:narrow(1, 2, n):flip(1), vh:narrow(1, 2, n):flip(1), string.format("flip of %d %s from 2", n, dt), 0)
      same(v:narrow(1, 5, n):flip(1), vh:narrow(1, 5, n):flip(1), string.format("flip of %d %s from 5", n, dt), 0)
    end
  end
  local big, bigh = inputs("f32", { 4096, 1024 }, 373)
  same(big:flip(2), bigh:flip(2), "flip of 4M f32 along the last dim", 0)
  same(big:flip({ 1, 2 }), bigh:flip({ 1, 2 }), "flip of 4M f32 along both dims: one run backwards", 0)
  T.is(big:flip({ 1, 2 }):get(1, 1), big:get(4096, 1024), "the last element first")
end)

T.test("cumsum, softmax, log_softmax along every dim, long rows, strided", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 17, 9, 65 }, 111, -9, 9)
    for dim = 1, 3 do
      same(d:cumsum(dim), h:cumsum(dim), "cumsum " .. dt .. " dim " .. dim, isfloat(dt) and RTOL[dt] * 4 or nil)
      same(d:narrow(3, 3, 60):cumsum(dim), h:narrow(3, 3, 60):cumsum(dim), "cumsum " .. dt .. " dim " .. dim .. " strided",
           isfloat(dt) and RTOL[dt] * 4 or nil)
    end
  end
  for _, dt in ipairs(FLOATS) do
    local d, h = inputs(dt, { 17, 9, 65 }, 112, -9, 9)
    for _, op in ipairs { "softmax", "log_softmax" } do
      for dim = 1, 3 do
        same(d[op](d, dim), h[op](h, dim), op .. " " .. dt .. " dim " .. dim, RTOL[dt] * 4)
        same(d:narrow(3, 2, 63)[op](d:narrow(3, 2, 63), dim), h:narrow(3, 2, 63)[op](h:narrow(3, 2, 63), dim),
             op .. " " .. dt .. " dim " .. dim .. " strided", RTOL[dt] * 4)
      end
      -- the warp, block and long-row paths, aligned or not
      for _, n in ipairs { 31, 512, 513, 4096, 4099, 16384, 20000 } do
        local x, xh = inputs(dt, { 5, n }, 113 + n, -20, 20)
        same(x[op](x, 2), xh[op](xh, 2), string.format("%s %s rows of %d", op, dt, n), RTOL[dt] * 8)
        same(x:narrow(2, 2, n - 1)[op](x:narrow(2, 2, n - 1), 2), xh:narrow(2, 2, n - 1)[op](xh:narrow(2, 2, n - 1), 2),
             string.format("%s %s rows of %d, unaligned", op, dt, n - 1), RTOL[dt] * 8)
      end
      local s = gpu.tensor({ { 0 / 0, 1, -1 }, { 1 / 0, 2, 3 }, { -1 / 0, -1 / 0, -1 / 0 }, { 1000, -1000, 999 } }):to(dt)
      same(s[op](s, 2), s:to("pinned")[op](s:to("pinned"), 2), op .. " " .. dt .. " special values", RTOL[dt] * 4)
    end
  end
end)

T.test("index_select, gather, scatter_add_", function()
  for _, dt in ipairs(ALL) do
    local d, h = inputs(dt, { 17, 9, 13 }, 121)
    for dim = 1, 3 do
      local n = ({ 17, 9, 13 })[dim]
      local i = gpu.rand({ 40 }, { dtype = "i64", low = 1, high = n + 1, seed = 122 + dim })
      same(d:index_select(dim, i), h:index_select(dim, i:to("pinned")), "index_select " .. dt .. " dim " .. dim)
      local shape = { 11, 7, 10 }
      shape[dim] = 30
      local g = gpu.rand(shape, { dtype = "i32", low = 1, high = n + 1, seed = 125 + dim })
      same(d:gather(dim, g), h:gather(dim, g:to("pinned")), "gather " .. dt .. " dim " .. dim)
      local w, wh = inputs(dt, { 17, 9, 20 }, 134)
      same(w:narrow(3, 4, 13):gather(dim, g), wh:narrow(3, 4, 13):gather(dim, g:to("pinned")),
           "gather " .. dt .. " dim " .. dim .. " strided")
      if dim == 3 then
        -- along the last dim with out's outer dims those of the input: rows
        -- staged in shared memory on cuda (k_index.cu, gather_rows_k)
        for _, it in ipairs { "i32", "i64" } do
          local gl = gpu.rand({ 17, 9, 30 }, { dtype = it, low = 1, high = 14, seed = 140 })
          same(d:gather(3, gl), h:gather(3, gl:to("pinned")), "gather " .. dt .. " along the last dim, whole rows (" .. it .. ")")
          local gs = gpu.rand({ 17, 9, 5 }, { dtype = it, low = 1, high = 14, seed = 141 })
          same(d:gather(3, gs), h:gather(3, gs:to("pinned")), "gather " .. dt .. " along the last dim, short rows (" .. it .. ")")
        end
      end
      if dt ~= "bool" then
        local src, srch = inputs(dt, shape, 128 + dim, -3, 3)
        local sc = gpu.rand(shape, { dtype = "i64", low = 1, high = n + 1, seed = 131 + dim })
        -- integer sums are exact in any order; floats within a tolerance
        same(d:clone():scatter_add_(dim, sc, src), h:clone():scatter_add_(dim, sc:to("pinned"), srch),
             "scatter_add_ " .. dt .. " dim " .. dim, isfloat(dt) and RTOL[dt] * 16 or nil)
      end
    end
  end
  local big = gpu.zeros({ 1000 }, { dtype = "i64" })
  big:scatter_add_(1, gpu.ones({ 1 << 20 }, { dtype = "i64" }), gpu.ones({ 1 << 20 }, { dtype = "i64" }))
  T.is(big:get(1), 1 << 20, "scatter_add_: 1M atomic adds to one element")
  local u = gpu.zeros({ 8 }, { dtype = "u8" })
  u:scatter_add_(1, gpu.arange(0, 4096, { dtype = "i64" }) % 8 + 1, gpu.ones({ 4096 }, { dtype = "u8" }))
  T.is(u:totable(), { 0, 0, 0, 0, 0, 0, 0, 0 }, "u8 scatter_add_: 512 adds per byte wrap to 0, neighbours intact")
  local bad2 = gpu.tensor({ { 1, 2, 3 }, { 3, 99, 1 } }, { dtype = "i64" })
  local r2 = gpu.ones({ 2, 4 }):gather(2, bad2)
  local ok2, err2 = pcall(gpu.synchronize)
  T.ok(not ok2 and tostring(err2):find("'gather' failed: index out of range", 1, true),
       "gather along the last dim, an index out of range: raised at the sync, naming the op: " .. tostring(err2))
  T.ok(pcall(gpu.synchronize) and r2, "reported once")
  local bad = gpu.tensor({ 1, 99 }, { dtype = "i64" })
  local r = gpu.ones({ 5 }):index_select(1, bad)
  local ok, err = pcall(gpu.synchronize)
  T.ok(not ok and tostring(err):find("'index_select' failed: index out of range", 1, true),
       "an index out of range: raised at the sync, naming the op: " .. tostring(err))
  T.ok(pcall(gpu.synchronize) and r, "reported once")
end)

T.done()
