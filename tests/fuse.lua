-- gpu.fuse (issue 32): a fused call means what the unfused ops mean, bit for
-- bit, for every op of the table (gpu._fuse's ops(), so a new row is covered
-- with no edit here) and every dtype it takes; broadcasting and views;
-- numbers as parameters (no new trace); a new trace per signature; the
-- refusals at their own lines; writing into given tensors; one op for
-- gpu.stats, graphs, tasks and the race checker; integer division by zero
-- raised at the next sync naming the call; NumPy as the oracle of GELU.
local gpu = require "gpu"
local T = require "gpu.test"

local core = require "gpu._fuse"
local rows = core.ops()
local FLOATS = { f32 = true, f64 = true, f16 = true, bf16 = true }
local function class(dt) return FLOATS[dt] and "F" or dt == "bool" and "B" or "I" end

-- values of each dtype (2 x 600: more than one 512-element block), and a
-- second operand with no zero (a divisor)
local VALS = {
  F = { -2.5, -1, -0.5, -0.0, 0, 0.25, 0.5, 1, 1.5, 2, 3.75, 7, 100, -300, 1e30, 0 / 0, math.huge, -math.huge },
  I = { -7, -3, -1, 0, 1, 2, 3, 5, 9, 100, 120, -100 },
  U = { 0, 1, 2, 3, 5, 7, 9, 100, 200, 255 },
  B = { 0, 1, 1, 0, 0, 1 },
}
local function vals(dt, nonzero, shift)
  local v = dt == "u8" and VALS.U or VALS[class(dt)]
  local r = {}
  for i = 1, 3000 do
    local x = v[(i * 7 + (shift or 0)) % #v + 1]
    -- floats: the specials, then values that do not round exactly
    if class(dt) == "F" and i > 40 then x = (math.random() - 0.5) * 8 end
    if nonzero and x == 0 then x = dt == "bool" and 1 or 3 end
    r[i] = dt == "bool" and x ~= 0 or x
  end
  return r
end
math.randomseed(32)
local function tensor(dt, shape, nonzero, shift)
  local flat = vals(dt, nonzero, shift)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local t = gpu.tensor({ table.unpack(flat, 1, n) }, { dtype = dt })
  return t:view(shape)
end

-- equal element for element: NaN equals NaN, -0 is not 0
local check = T.same

local function takes(row, dt) return row[class(dt)] end
local SYMBOL = { add = "+", sub = "-", mul = "*", div = "/", pow = "^", remainder = "%", floor_divide = "//" }

local function every_op()
  for _, row in ipairs(rows) do
    for _, dt in ipairs(T.dtypes) do
      if takes(row, dt) then
        local name = row.name .. " " .. dt
        local x = tensor(dt, { 2, 600 })
        local y = tensor(dt, { 600 }, true, 3)          -- broadcast along dim 1
        local w = tensor(dt, { 2, 1 }, true, 5)
        if row.kind == "unary" then
          local f = gpu.fuse(function(a) return a[row.name](a) end)
          check(f(x), x[row.name](x), name)
        elseif row.kind == "binary" then
          local f = gpu.fuse(function(a, b) return a[row.name](a, b) end)
          check(f(x, y), x[row.name](x, y), name .. " (tensors, broadcast)")
          if not row.to_bool then
            -- two nodes: the first's result rounds to dt as the unfused op's
            local function chain(a, b)
              local r = a[row.name](a, b)
              return r[row.name](r, b)
            end
            check(gpu.fuse(chain)(x, y), chain(x, y), name .. " (a chain)")
          end
          local k = dt == "bool" and 1 or FLOATS[dt] and 1.7 or 3
          local c = gpu.fuse(function(a) return a[row.name](a, k) end)
          check(c(x), x[row.name](x, k), name .. " (a constant)")
          local p = gpu.fuse(function(a, s) return a[row.name](a, s) end)
          check(p(x, k), x[row.name](x, k), name .. " (a parameter)")
          if row.left and SYMBOL[row.name] then
            local expr = assert(load("local k, a = ... return k " .. SYMBOL[row.name] .. " a"))
            local l = gpu.fuse(function(a) return expr(k, a) end)
            local yy = tensor(dt, { 2, 600 }, true)
            check(l(yy), expr(k, yy), name .. " (a number on the left)")
          end
        else
          local f
          local unf
          if row.name == "where" then
            local cnd = tensor("bool", { 2, 1 })
            f = gpu.fuse(function(c, a, b) return gpu.where(c, a, b) end)
            check(f(cnd, x, y), gpu.where(cnd, x, y), name)
            local g = gpu.fuse(function(c, a) return gpu.where(c, a, dt == "bool" and 1 or 2) end)
            check(g(cnd, x), gpu.where(cnd, x, dt == "bool" and 1 or 2), name .. " (a number)")
          else
            f = gpu.fuse(function(a, b, c) return a[row.name](a, b, c) end)
            unf = x[row.name](x, y, w)
            check(f(x, y, w), unf, name)
            local g = gpu.fuse(function(a, b) return a[row.name](a, b, 2) end)
            check(g(x, y), x[row.name](x, y, 2), name .. " (a number)")
          end
        end
      end
    end
  end
end

T.test("every op of the table x every dtype it takes: fused == unfused, bit for bit", every_op)
T.test("the same through the unfused replay (what a fused call must equal)", function()
  core.unfused = true
  local ok, err = pcall(every_op)
  core.unfused = false
  if not ok then error(err, 0) end
end)

T.test("casts between every pair of dtypes, and a cast inside a chain", function()
  for _, a in ipairs(T.dtypes) do
    local x = tensor(a, { 2, 600 })
    for _, b in ipairs(T.dtypes) do
      local f = gpu.fuse(function(t) return t:to(b) end)
      check(f(x), x:to(b), "cast " .. a .. " -> " .. b)
    end
  end
  local x = tensor("f32", { 1200 })
  local f = gpu.fuse(function(t) return t:to("bf16"):mul(3):to("f32"):add(t) end)
  check(f(x), x:to("bf16"):mul(3):to("f32"):add(x), "f32 -> bf16 -> f32 chain")
end)

T.test("views and broadcasting: transposed, narrowed, expanded inputs", function()
  local m = tensor("f32", { 40, 40 })
  local v = tensor("f32", { 40 }, true, 1)
  local f = gpu.fuse(function(a, b) return (a * 2 + b):tanh() end)
  local n = tensor("f32", { 40, 50 }):narrow(2, 3, 40)
  check(f(m:t(), n), (m:t() * 2 + n):tanh(), "transposed + narrowed")
  check(f(m, v), (m * 2 + v):tanh(), "a row broadcast")
  check(f(v:view({ 40, 1 }), v), (v:view({ 40, 1 }) * 2 + v):tanh(), "outer broadcast")
  T.raises(function() f(m, tensor("f32", { 7 })) end, "cannot be broadcast", "shapes that do not broadcast raise")
end)

T.test("numbers are parameters: a new value, no new trace; a new signature, a new trace", function()
  local f = gpu.fuse(function(x, s) return (x * s + 1):relu() end)
  local x = tensor("f32", { 2, 600 })
  for _, s in ipairs { 2, -0.5, 3.25, 7 } do check(f(x, s), (x * s + 1):relu(), "s = " .. s) end
  T.is(f:stats().traces, 1, "four values of s: one trace")
  local before = core.count()
  f(x, 9)
  T.is(core.count(), before, "no new program for a new value")
  f(tensor("f32", { 5, 600 }), 2)
  T.is(f:stats().traces, 1, "another shape of the same rank and broadcast pattern: no new trace")
  f(tensor("f64", { 2, 600 }), 2)
  T.is(f:stats().traces, 2, "a new dtype: a new trace")
  f(tensor("f32", { 1200 }), 2)
  T.is(f:stats().traces, 3, "a new rank: a new trace")
  f(tensor("f32", { 1, 600 }), 2)
  T.is(f:stats().traces, 4, "a new broadcast pattern: a new trace")
  f(tensor("f32", { 2, 600 }), 2)
  T.is(f:stats().traces, 4, "the first signature again: cached")
  T.is(f:stats().calls, 10, "calls counted")
  -- an integer parameter checked as the unfused op checks it
  local g = gpu.fuse(function(x, s) return x:add(s) end)
  T.raises(function() g(tensor("i8", { 4 }), 300) end, "300 does not fit in i8", "a parameter out of range")
  T.raises(function() g(tensor("i32", { 4 }), 0.5) end, "no integer representation", "a fractional integer parameter")
end)

T.test("one op: gpu.stats counts one launch for a chain of nine", function()
  local gelu = gpu.fuse(function(x)
    return x:mul(x):mul(x):mul(0.044715):add(x):mul(0.7978845608):tanh():add(1):mul(x):mul(0.5)
  end, { name = "gelu" })
  local x = tensor("f32", { 2, 600 })
  gelu(x)
  local l0 = gpu.stats().launches
  gelu(x)
  T.is(gpu.stats().launches - l0, 1, "one launch")
end)

T.test("writing into given tensors: out = w, in place and otherwise", function()
  local step = gpu.fuse(function(w, g, lr) return w - g * lr end, { name = "sgd" })
  local w, g = tensor("f32", { 2, 600 }), tensor("f32", { 2, 600 }, false, 4)
  local expect = w - g * 0.1
  local r = step(w, g, 0.1, { out = w })
  T.ok(rawequal(r, w) or r:data_ptr() == w:data_ptr(), "returns out")
  check(w, expect, "w updated in place")
  local o = gpu.empty({ 2, 600 })
  step(w, g, 0.1, { out = o })
  check(o, w - g * 0.1, "into another tensor")
  local two = gpu.fuse(function(a) return a + 1, a:lt(0) end)
  local p, q = gpu.empty({ 2, 600 }), gpu.empty({ 2, 600 }, { dtype = "bool" })
  local rp, rq = two(w, { out = { p, q } })
  T.ok(rp == p and rq == q, "both outs returned")
  check(p, w + 1, "first of two results")
  check(q, w:lt(0), "second of two results")
  T.raises(function() two(w, { out = p }) end, "out must be a list of 2 tensors", "two results need a list")
  T.raises(function() step(w, g, 0.1, { out = gpu.empty({ 3 }) }) end, "does not match the result", "an out of the wrong shape")
  T.raises(function() step(w, g, 0.1, { out = gpu.empty({ 2, 600 }, { dtype = "f64" }) }) end, "does not match the result",
           "an out of the wrong dtype")
end)

T.test("what cannot be fused raises at its own line, naming the call", function()
  local x = tensor("f32", { 4, 4 })
  local function fz(body) return gpu.fuse(body, { name = "step" })(x) end
  local ctx = "cannot be used inside a fused function %(step%)"
  T.raises_at(function() fz(function(a) local r = gpu.matmul(a, a) return r end) end, "gpu.matmul " .. ctx, "gpu.matmul")
  T.raises_at(function() fz(function(a) local r = a:matmul(a) return r end) end, "x:matmul%(%) " .. ctx, "x:matmul()")
  T.raises_at(function() fz(function(a) local r = a:sum() + 1 return r end) end, "an op after a reduction %(a reduction ends a fused function%) " .. ctx,
              "an op after a reduction")
  T.raises_at(function() fz(function(a) local r = a:max():exp() return r end) end, "an op after a reduction %(a reduction ends a fused function%) " .. ctx,
              "a method after a reduction")
  T.raises_at(function() fz(function(a) local r = a:argmax() return r end) end, "x:argmax%(%) " .. ctx,
              "a reduction not fused (argmax)")
  T.raises_at(function() fz(function(a) local r = a:item() return r end) end, "x:item%(%) " .. ctx, "item")
  T.raises_at(function() fz(function(a) local r = a:narrow(1, 1, 2) return r end) end, "x:narrow%(%) " .. ctx, "a view")
  T.raises_at(function() fz(function(a) gpu.synchronize() return a end) end, "gpu.synchronize " .. ctx, "a sync")
  T.raises_at(function() fz(function(a) gpu.stream() return a end) end, "gpu.stream " .. ctx, "a new stream")
  T.raises_at(function() fz(function(a) print(a) return a end) end, "printing a traced tensor " .. ctx, "printing")
  T.raises_at(function() fz(function(a) local r = a:add(1, { out = a }) return r end) end,
              "options %(out, stream%) are not taken", "options")
  T.raises_at(function() fz(function(a) local r = a:to("host") return r end) end, "x:to%(host%)", "a move to other memory")
  T.raises_at(function() fz(function(a) local r = a.shape return r end) end, "x.shape", "reading the shape")
  T.raises_at(function() fz(function(a) local r = a:to("i32"):div(0) return r end) end, "div: integer division by zero",
              "a constant zero divisor")
  T.raises_at(function() fz(function(a) local r = a:exp():to("i32"):exp() return r end) end, "exp: not supported for i32",
              "an op's dtype rule")
  T.raises_at(function() fz(function(a) local r = a:add(a:to("f64")) return r end) end, "dtype f64 does not match f32",
              "mixed dtypes")
  T.raises_at(function() gpu.fuse(function() return 1 end, { name = "step" })(x) end, "result 1 is not a tensor",
              "a number result")
  -- a tail call leaves no line of the body: the body's first line then
  T.raises_at(function() fz(function(a) return a:matmul(a) end) end, "x:matmul%(%) " .. ctx, "in a tail call")
  T.is(gpu.synchronize ~= nil and type(gpu.synchronize), "function", "gpu's functions are back after a trace")
  gpu.synchronize()
  T.raises(function() gpu.fuse(function(a) return a end)({}, x) end, "argument 1: gpu.Tensor or number expected",
           "a table argument")
  local inner = gpu.fuse(function(a) return a:exp() end)
  local outer = gpu.fuse(function(a) return inner(a) + 1 end)
  check(outer(x), x:exp() + 1, "a fused function inside another is traced into it")
end)

T.test("trailing reductions: sum, mean, prod, max, min, all or over a dim, as the unfused calls", function()
  for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i32", "i64", "u8" } do
    local x = tensor(dt, { 4, 300 })
    for _, red in ipairs { "sum", "mean", "prod", "max", "min" } do
      for _, opts in ipairs { false, { dim = 2 }, { dim = 1, keepdim = true } } do
        local function body(a)
          local r = a:abs():add(1)
          return opts and r[red](r, opts) or r[red](r)
        end
        local name = string.format("%s %s %s", red, dt, opts and ("dim " .. opts.dim .. (opts.keepdim and " keepdim" or "")) or "all")
        check(gpu.fuse(body)(x), body(x), name)
      end
    end
  end
  local x = tensor("f32", { 4, 300 })
  local two = gpu.fuse(function(a) local r = (a * 2 + 1):relu() return r:sum(), r:max({ dim = 2 }) end)
  local s, m = two(x)
  local r = (x * 2 + 1):relu()
  check(s, r:sum(), "several results: a sum")
  check(m, r:max({ dim = 2 }), "several results: a max over dim 2")
  local o = gpu.empty({})
  T.ok(gpu.fuse(function(a) return (a * 2):sum() end)(x, { out = o }) == o, "out is the reduction's")
  check(o, (x * 2):sum(), "the reduction into out")
end)

-- The cuda backend reduces a fused program's values in the same pass, on
-- the built-in reduction's plan: these shapes take each of its paths (one
-- long run split over many groups, runs along memory, columns, strided
-- runs; vector and scalar loads, broadcast and transposed inputs).
T.test("trailing reductions in one op: every layout of the reduction, as the unfused calls", function()
  local function run(name, body, ...)
    local f = gpu.fuse(body)
    f(...)
    local l0 = gpu.stats().launches
    local got = f(...)
    T.is(gpu.stats().launches - l0, 1, name .. ": one op")
    check(got, body(...), name)
  end
  local big = gpu.rand({ 200003 }, { seed = 1 }) - 0.5
  run("sum of 200003, one run", function(a) return (a * 2 + 1):relu():sum() end, big)
  run("mean of 200003 bf16", function(a) return (a * 3):exp():mean() end, big:to("bf16"))
  run("max of 200003 f16", function(a) return (a * a):max() end, big:to("f16"))
  local m = gpu.rand({ 3, 70001 }, { seed = 2 })
  run("rows: sum over dim 2 of 3 x 70001", function(a) return (a - 0.5):abs():sum(2) end, m)
  run("rows keepdim: prod over the last dim", function(a) return (a * 0.1 + 0.95):prod(-1, { keepdim = true }) end, m)
  local c = gpu.rand({ 9000, 70 }, { seed = 3 })
  run("columns: sum over dim 1 of 9000 x 70", function(a) return (a * a):sum { dim = 1 } end, c)
  run("columns: min over dim 1, keepdim", function(a) return (a - 0.25):min { dim = 1, keepdim = true } end, c)
  local s = gpu.rand({ 5000, 1, 3 }, { seed = 4 })
  run("strided runs: sum over dim 1 of 5000 x 1 x 3", function(a) return (a + 1):sum(1) end, s)
  run("one output of a strided run", function(a) return (a + 1):sum(1) end, gpu.rand({ 5000, 1 }, { seed = 5 }))
  local row, col = gpu.rand({ 1, 3000 }, { seed = 6 }), gpu.rand({ 40, 1 }, { seed = 7 })
  run("broadcast inputs", function(a, b) return (a * b):sum(2) end, row, col)
  run("a transposed input", function(a) return (a * 2):sum(1) end, c:t())
  run("a narrowed, unaligned input", function(a) return (a + 2):sum() end, big:narrow(1, 2, 199999))
  local i = gpu.arange(1, 100001, { dtype = "i32" })
  run("i32: sum of floor divisions (wrapping int64)", function(a, d) return (a * 7919 // d):sum() end, i, 3)
  run("i64 prod over a dim", function(a) return (a % 5 + 1):prod(2) end, i:to("i64"):view(100, 1000))
  run("bool: sum of a comparison", function(a) return a:gt(0):sum() end, big)
  run("0-dim input", function(a) return (a + 1):sum() end, gpu.tensor(2.5))
  run("empty: sum", function(a) return (a + 1):sum() end, gpu.zeros({ 0, 4 }))
  run("empty along dim 1: sum over dim 1", function(a) return (a + 1):sum(1) end, gpu.zeros({ 0, 4 }))
  T.raises(function() gpu.fuse(function(a) return (a + 1):max() end)(gpu.zeros({ 0 })) end,
           "max: the reduction of an empty tensor has no identity", "an empty max raises as unfused")
  T.raises(function() gpu.fuse(function(a) return (a + 1):sum(3) end)(m) end, "dim 3 out of range for a 2%-dim tensor",
           "a dim out of range")
  T.raises(function() gpu.fuse(function(a) return (a + 1):sum(2, 1) end)(m) end, "options table expected",
           "a second dim")
  T.raises(function() gpu.fuse(function(a) return (a + 1):sum(2, { dim = 1 }) end)(m) end, "dim given twice",
           "a dim twice")
  T.raises(function() gpu.fuse(function(a) return (a + 1):sum(2) end)(m, { out = gpu.empty({ 2 }) }) end,
           "", "an out of the wrong shape")
  local o = gpu.empty({ 3 })
  T.ok(gpu.fuse(function(a) return (a + 1):sum(2) end)(m, { out = o }) == o, "out along a dim")
  check(o, (m + 1):sum(2), "the reduction along a dim into out")
  -- integer division by zero inside a reduced program: at the next sync
  local f = gpu.fuse(function(a, b) return (a // b):sum() end, { name = "idivsum" })
  local line = debug.getinfo(1, "l").currentline + 1
  local ok, err = pcall(function() f(i, i - 5); gpu.synchronize() end)
  T.ok(not ok and tostring(err):find("integer division by zero", 1, true), "a zero divisor raises at the sync")
  T.ok(tostring(err):find("fuse.lua:" .. line, 1, true) ~= nil, "at the call's line")
  -- in a graph: replayed with new values
  local x = gpu.rand({ 4, 5000 }, { seed = 8 })
  local y = gpu.empty({ 4 })
  local sq = gpu.fuse(function(a, k) return (a * k):square():sum(2) end)
  local g = gpu.graph(function() sq(x, 3, { out = y }) end)
  y:fill(0)
  x:copy(gpu.rand({ 4, 5000 }, { seed = 9 }))
  g:launch()
  gpu.synchronize()
  check(y, (x * 3):square():sum(2), "a graph's replay reduces the new values")
  g:close()
end)

T.test("integer division by zero raises at the next sync, naming the call's line and the op", function()
  local f = gpu.fuse(function(a, b) return (a + 1) // b end, { name = "idiv" })
  local a, b = gpu.tensor({ 1, 2, 3 }, { dtype = "i32" }), gpu.tensor({ 1, 0, 1 }, { dtype = "i32" })
  local line = debug.getinfo(1, "l").currentline + 1
  local ok, err = pcall(function() f(a, b); gpu.synchronize() end)
  T.ok(not ok, "raised")
  err = tostring(err)
  T.ok(err:find("floor_divide: integer division by zero", 1, true), "names the op")
  T.ok(err:find("idiv", 1, true), "names the fused call")
  T.ok(err:find("fuse.lua:" .. line, 1, true) ~= nil, "names the call's line")
  if not ok then T.diag(err) end
  local g = gpu.fuse(function(x, s) return x // s end)
  T.raises(function() g(a, 0) end, "integer division by zero", "a zero parameter raises at the call")
end)

T.test("inside gpu.graph: one node, replayed", function()
  local f = gpu.fuse(function(a, s) return (a * s):sigmoid() end, { name = "sig" })
  local x = tensor("f32", { 2, 600 })
  local y = gpu.empty({ 2, 600 })
  local g = gpu.graph(function() f(x, 3, { out = y }) end)
  T.is(g.nodes, 1, "one node in the capture")
  y:fill(0)
  g:launch()
  gpu.synchronize()
  check(y, (x * 3):sigmoid(), "the replay's result")
  g:close()
end)

-- A fused op's operands past the first three and its parameters are kept
-- apart from the op (device.h: dev_fargs): queued, captured and replayed
-- they must be the call's own, not whatever the caller's stack holds next.
T.test("eight inputs and eight parameters: queued, captured, replayed", function()
  local f = gpu.fuse(function(a, b, c, d, e, g, h, k, p1, p2, p3, p4, p5, p6, p7, p8)
    return a * p1 + b * p2 + c * p3 + d * p4 + e * p5 + g * p6 + h * p7 + k * p8
  end, { name = "wide" })
  local function unfused(x, p)
    local r = x[1] * p[1]
    for i = 2, 8 do r = r + x[i] * p[i] end
    return r
  end
  local x = {}
  for i = 1, 8 do x[i] = tensor("f32", { 3, 700 }, false, i) end
  local p = { 1.5, -2, 3, 0.25, 7, -1, 2.5, 11 }
  local function call(out)
    local args = { x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], table.unpack(p) }
    if out then args[#args + 1] = { out = out } end
    return f(table.unpack(args))
  end
  local want = unfused(x, p)
  local rs = {}
  for i = 1, 4 do rs[i] = call() end   -- several queued at once
  for i = 1, 4 do check(rs[i], want, "queued call " .. i) end
  local y = gpu.empty({ 3, 700 })
  local g = gpu.graph(function() call(y) end)
  T.is(g.nodes, 1, "one node in the capture")
  for round = 1, 2 do
    y:fill(0)
    g:launch()
    gpu.synchronize()
    check(y, want, "the replay's result, round " .. round)
  end
  -- the capture holds its own parameters: a later call with others leaves it
  p[8] = -4
  check(call(), unfused(x, p), "a call with another parameter")
  y:fill(0)
  g:launch()
  gpu.synchronize()
  check(y, want, "the replay keeps the captured parameters")
  g:close()
end)

T.test("in tasks, on their streams", function()
  local f = gpu.fuse(function(a, b) return a * b + 1 end)
  local x, y = tensor("f32", { 2, 600 }), tensor("f32", { 2, 600 }, false, 2)
  local res = {}
  for i = 1, 3 do
    gpu.task(function()
      local s = gpu.stream()
      local _ <close> = gpu.using(s)
      res[i] = f(x, y)
      gpu.await(s)
    end)
  end
  gpu.run()
  for i = 1, 3 do check(res[i], x * y + 1, "task " .. i) end
end)

T.test("under --check races: a fused op is one op to the race checker", function()
  local script = T.tmpfile([[
local gpu = require "gpu"
local f = gpu.fuse(function(a) return a:exp():add(1) end, { name = "expadd" })
local x = gpu.ones({ 1000 })
local s1, s2 = gpu.stream(), gpu.stream()
local y
do local _ <close> = gpu.using(s1); y = f(x) end
s2:wait(s1)
do local _ <close> = gpu.using(s2); f(y, { out = x }) end
gpu.synchronize()
print("ordered ok", x:sum():item() > 0)
do local _ <close> = gpu.using(s1); f(x, { out = y }) end
do local _ <close> = gpu.using(s2); f(y, { out = x }) end
gpu.synchronize()
print("unreachable")
]])
  local out = T.run("", "--check races " .. script)
  T.ok(out:find("ordered ok\ttrue", 1, true), "an ordered script runs")
  T.ok(out:find("expadd", 1, true) and out:find("race", 1, true) and not out:find("unreachable", 1, true),
       "the race is refused, naming the call")
  if not out:find("expadd", 1, true) then T.diag(out) end
end)

T.test("GELU and a softmax-style chain against NumPy", function()
  local N = dofile("tests/numpy/oracle.lua")
  local O = N.open()
  local gelu = gpu.fuse(function(x)
    return x:mul(x):mul(x):mul(0.044715):add(x):mul(0.7978845608):tanh():add(1):mul(x):mul(0.5)
  end)
  local soft = gpu.fuse(function(x, m) return (x - m):exp() end)
  for _, dt in ipairs { "f32", "f64", "bf16", "f16" } do
    local x = gpu.randn({ 5000 }, { dtype = "f32" }):mul(3):to(dt)
    local tol = ({ f32 = 1e-5, f64 = 1e-12, bf16 = 4e-2, f16 = 4e-3 })[dt]
    O:case("gelu " .. dt, string.format("C('gelu %s', 'gelu', %s, %s, %s)", dt, O:save(x:to("f64")), O:save(gelu(x):to("f64")), tol))
    O:case("exp(x - m) " .. dt, string.format("C('exp(x - m) %s', 'soft', %s, %s, %s)", dt, O:save(x:to("f64")),
                                              O:save(soft(x, 1.5):to("f64")), tol))
  end
  O:check("the oracle", [[
import sys, numpy as np
def load(p):
    a = np.load(p[0])
    return a.astype(np.float64)
def C(name, what, x, got, tol):
    x = load(x); g = load(got)
    if what == 'gelu':
        e = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
    else:
        e = np.exp(x - 1.5)
    ok = np.allclose(g, e, rtol=tol, atol=tol)
    print(("ok\t%s" % name) if ok else ("fail\t%s\tmax err %g" % (name, np.max(np.abs(g - e)))))
exec(open(sys.argv[1]).read())
]])
  O:close()
end)

T.done()
