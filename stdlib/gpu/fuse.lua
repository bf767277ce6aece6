-- gpu.fuse(fn [, opts]): fn's elementwise ops, and the reductions its
-- results may end in, as one op per group of results.
--
-- Called with tensors and numbers, the callable runs fn once per new
-- signature (each tensor's dtype, rank and which of its dims are 1; which
-- arguments are numbers) with tracers: stand-ins whose methods and
-- metamethods (the rows of cuda/ops.h, :to, clamp, lerp, gpu.where) record
-- nodes instead of running.  Each result's nodes become one program
-- (gpu._fuse's program, interned in C) and each call submits ONE op per
-- group (gpu._fuse's run: results of one shape, or reductions of one dim,
-- keepdim and dtype, up to four): streams, graphs, traces and the race
-- checker see one op.  Numbers passed as arguments are parameters (a new value reuses the
-- program); number literals in fn are constants.  Anything that is not
-- elementwise raises at its own line, naming the fused function.  Lua
-- control flow runs while tracing: a branch on an argument's dtype is
-- taken once per signature.  See docs/lua-api.md (gpu.fuse).
local gpu = require "gpu"

local core = require "gpu._fuse"
local rows, tensor_methods = core.ops()
local run, program = core.run, core.program
local INPUT, CONST, PARAM, UNARY, BINARY, TERNARY, CAST = 0, 1, 2, 3, 4, 5, 6
local FLOATS = { f32 = true, f64 = true, f16 = true, bf16 = true }
local RANGE = { i8 = { -128, 127 }, u8 = { 0, 255 }, i32 = { -2147483648, 2147483647 } }
local DTYPES = { f32 = 1, f64 = 1, f16 = 1, bf16 = 1, i8 = 1, u8 = 1, i32 = 1, i64 = 1, bool = 1 }

local Tracer, Param, Reduced = {}, {}, {}
local current   -- the trace in progress
local SELF = debug.getinfo(1, "S").source
local SELF_AT = "^" .. debug.getinfo(1, "S").short_src:gsub("%p", "%%%0") .. ":%d+: "

local function class(dt) return FLOATS[dt] and "F" or dt == "bool" and "B" or "I" end

-- An error at the nearest line outside this module (the fused body's).
local function raise(fmt, ...)
  local msg = string.format(fmt, ...)
  for level = 2, 40 do
    local info = debug.getinfo(level, "Slt")
    if not info then break end
    if info.source ~= SELF and info.currentline > 0 then
      msg = info.short_src .. ":" .. info.currentline .. ": " .. msg
      break
    end
    if info.istailcall and current then
      -- the body's line went with its frame: the body's own first line
      msg = current.where .. ": " .. msg
      break
    end
  end
  error(msg, 0)
end

local function refuse(what)
  raise("%s cannot be used inside a fused function (%s): gpu.fuse fuses elementwise ops only", what,
        current and current.name or "gpu.fuse")
end

local function node(t)
  local tr = current
  tr.n = tr.n + 1
  tr.nodes[tr.n] = t
  return tr.n
end

local function tracer(id, dtype, ndim)
  return setmetatable({ id = id, dtype = dtype, ndim = ndim, trace = current }, Tracer)
end

local function is_tracer(v)
  if getmetatable(v) ~= Tracer then return false end
  if v.trace ~= current then refuse("a tensor traced by another call") end
  return true
end

-- A number as an op of dtype dt takes it, checked as the unfused op checks
-- it: integers exact and in range, bool 0/1 or true/false.
local function number_for(v, dt, what)
  if type(v) == "boolean" and dt == "bool" then return v and 1 or 0 end
  if type(v) ~= "number" then raise("%s: gpu.Tensor or number expected, got %s", what, type(v)) end
  if FLOATS[dt] then return v end
  local i = math.tointeger(v)
  if dt == "bool" then
    if i ~= 0 and i ~= 1 then raise("%s: bool tensor takes true/false or 0/1, got %s", what, tostring(v)) end
    return i
  end
  if not i then raise("%s: number %s has no integer representation for %s", what, tostring(v), dt) end
  local r = RANGE[dt]
  if r and (i < r[1] or i > r[2]) then raise("%s: %d does not fit in %s", what, i, dt) end
  return i
end

-- A number operand's node: a parameter (an argument), or a constant.
local function number_node(v, dt, what, zdiv_right)
  if getmetatable(v) == Param then
    current.uses[#current.uses + 1] = { v.arg, dt, what, zdiv_right }
    return v.id
  end
  local k = number_for(v, dt, what)
  if zdiv_right and class(dt) ~= "F" and k == 0 then raise("%s: integer division by zero", what) end
  return node { kind = CONST, k = k }
end

local function check_class(row, dt, name)
  if not row[class(dt)] then raise("%s: not supported for %s", name or row.name, dt) end
end

local function no_opts(o, name)
  if o ~= nil then raise("%s: options (out, stream) are not taken inside a fused function", name) end
end

local function unary(row, x, o)
  no_opts(o, row.name)
  check_class(row, x.dtype)
  return tracer(node { kind = UNARY, code = row.code, dtype = row.to_bool and "bool" or x.dtype, x.id },
                row.to_bool and "bool" or x.dtype, x.ndim)
end

local function same_dtype(y, dt)
  if y.dtype ~= dt then raise("dtype %s does not match %s (cast with :to(\"%s\"))", y.dtype, dt, dt) end
end

-- a op b, a or b a tracer (left: the number is on the left)
local function binary(row, a, b, left)
  local x, y = a, b
  if left then x, y = b, a end
  check_class(row, x.dtype)
  local rdt = row.to_bool and "bool" or x.dtype
  local ids, nd = nil, x.ndim
  if is_tracer(y) then
    same_dtype(y, x.dtype)
    ids = { x.id, y.id }
    if y.ndim > nd then nd = y.ndim end
  else
    if left and not row.left then raise("%s takes no number on its left", row.name) end
    local k = number_node(y, x.dtype, row.name, row.zdiv and not left)
    ids = left and { k, x.id } or { x.id, k }
  end
  return tracer(node { kind = BINARY, code = row.code, dtype = rdt, ids[1], ids[2] }, rdt, nd)
end

-- op(a, b, c): a the tensor of the op's dtype (where: the condition)
local function ternary(row, dt, a, b, c)
  check_class(row, dt)
  local ids, nd = {}, 0
  for j, v in ipairs { a, b, c } do
    if is_tracer(v) then
      if not (j == 1 and row.name == "where") then same_dtype(v, dt) end
      ids[j] = v.id
      if v.ndim > nd then nd = v.ndim end
    else
      ids[j] = number_node(v, dt, row.name)
    end
  end
  return tracer(node { kind = TERNARY, code = row.code, dtype = dt, ids[1], ids[2], ids[3] }, dt, nd)
end

local traced = {}   -- the tracer's methods, by name
local by_name = {}
for _, row in ipairs(rows) do
  by_name[row.name] = row
  if row.kind == "unary" then
    traced[row.name] = function(x, o) return unary(row, x, o) end
  elseif row.kind == "binary" then
    traced[row.name] = function(x, y, o)
      if y == nil and row.default then y = row.default end
      if type(y) == "table" and getmetatable(y) == nil then o, y = y, row.default end
      no_opts(o, row.name)
      return binary(row, x, y, false)
    end
  end
end
-- A trailing reduction (sum, mean, prod; max and min without an operand),
-- with its dim first or in the options: t:sum(2), t:sum{dim = 2, keepdim =
-- true}.  The fused op reduces its result in the same pass, by the
-- built-in reduction's tree, so it is the unfused call's bit for bit.
-- Nothing may follow it.
local function reduction(name)
  return function(x, d, o)
    if type(d) ~= "number" then d, o = nil, d end
    if o ~= nil and (type(o) ~= "table" or getmetatable(o) ~= nil) then
      raise("%s: options table expected (dim, keepdim)", name)
    end
    for k in pairs(o or {}) do
      if k ~= "dim" and k ~= "keepdim" then
        raise("%s: option '%s' is not taken inside a fused function (dim, keepdim)", name, tostring(k))
      end
    end
    if d ~= nil then
      if o and o.dim ~= nil and o.dim ~= d then raise("%s: dim given twice (%s, and %s in the options)", name, d, o.dim) end
      o = { dim = d, keepdim = o and o.keepdim }
    end
    return setmetatable({ reduce = name, opts = o, src = x, trace = current }, Reduced)
  end
end
for _, name in ipairs { "sum", "mean", "prod" } do traced[name] = reduction(name) end
for _, name in ipairs { "max", "min" } do
  local f, r = traced[name], reduction(name)
  traced[name] = function(x, y, o)
    if y == nil or (type(y) == "table" and getmetatable(y) == nil) then return r(x, y) end
    return f(x, y, o)
  end
end
function traced.clamp(x, lo, hi, o)
  no_opts(o, "clamp")
  if lo == nil and hi == nil then raise("clamp: give lo, hi or both") end
  local float = FLOATS[x.dtype]
  if lo == nil then lo = float and -math.huge or math.mininteger end
  if hi == nil then hi = float and math.huge or math.maxinteger end
  if not float and (lo == math.mininteger or hi == math.maxinteger) then
    -- the unfused missing bound: no range check (the whole int64 range)
    local r = RANGE[x.dtype]
    if r then
      if lo == math.mininteger then lo = r[1] end
      if hi == math.maxinteger then hi = r[2] end
    end
  end
  return ternary(by_name.clamp, x.dtype, x, lo, hi)
end
function traced.lerp(x, b, w, o)
  no_opts(o, "lerp")
  return ternary(by_name.lerp, x.dtype, x, b, w)
end
function traced.to(x, dt, o)
  no_opts(o, "to")
  if type(dt) == "table" then dt = dt.dtype end
  if not DTYPES[dt] then refuse("x:to(" .. tostring(dt) .. ") (only a cast to a dtype is elementwise)") end
  if dt == x.dtype then return x end
  return tracer(node { kind = CAST, dtype = dt, x.id }, dt, x.ndim)
end

local function where(c, a, b, o)
  no_opts(o, "where")
  if not is_tracer(c) then refuse("gpu.where with a condition that is not a traced tensor") end
  if c.dtype ~= "bool" then
    raise("where: condition must be a bool tensor, got %s (make one with t:ne(0), t:gt(x), ...)", c.dtype)
  end
  local first = is_tracer(a) and a or is_tracer(b) and b
  if not first then refuse("gpu.where of two numbers (give a tensor operand)") end
  return tracer(ternary(by_name.where, first.dtype, c, a, b).id, first.dtype,
                math.max(c.ndim, is_tracer(a) and a.ndim or 0, is_tracer(b) and b.ndim or 0))
end

Tracer.__index = function(x, k)
  local f = traced[k]
  if f then return f end
  if k == "shape" or k == "numel" then refuse("x." .. k .. " (shapes are not part of a fused function's signature)") end
  if tensor_methods[k] ~= nil then return function() refuse("x:" .. k .. "()") end end
  return nil
end
local function meta(name, left_ok)
  local row = by_name[name]
  return function(a, b)
    if getmetatable(a) == Tracer and is_tracer(a) then return binary(row, a, b, false) end
    if getmetatable(b) == Tracer and is_tracer(b) then
      if not left_ok then refuse(name .. " with a number on its left") end
      return binary(row, a, b, true)
    end
    refuse("arithmetic between numbers passed to the fused function (compute it outside and pass the result)")
  end
end
for mm, name in pairs { __add = "add", __sub = "sub", __mul = "mul", __div = "div", __pow = "pow",
                        __mod = "remainder", __idiv = "floor_divide" } do
  Tracer[mm] = meta(name, true)
  Param[mm] = meta(name, true)
end
Tracer.__unm = function(x) return unary(by_name.neg, x) end
Param.__unm = function() refuse("-n of a number argument (negate it outside)") end
Tracer.__tostring = function() refuse("printing a traced tensor") end
Tracer.__len = function() refuse("#x") end
Tracer.__concat = function() refuse("..") end
Tracer.__call = function() refuse("calling a tensor") end
Tracer.__eq = function() refuse("== on tensors (use x:eq(y))") end
Tracer.__lt = function() refuse("< on tensors (use x:lt(y))") end
Tracer.__le = function() refuse("<= on tensors (use x:le(y))") end
Param.__index = function() refuse("a method of a number argument") end
local function after_reduction() refuse("an op after a reduction (a reduction ends a fused function)") end
for _, mm in ipairs { "__index", "__add", "__sub", "__mul", "__div", "__pow", "__mod", "__idiv", "__unm", "__tostring",
                      "__len", "__concat", "__call", "__eq", "__lt", "__le" } do
  Reduced[mm] = after_reduction
end
Param.__tostring = function(p) return "fused parameter #" .. p.arg end
for _, mm in ipairs { "__lt", "__le", "__eq", "__concat", "__len", "__call" } do
  Param[mm] = function() refuse("comparing or using a number argument as a Lua value while tracing") end
end

-- gpu's functions while tracing: where traced, the rest refused (a sync, a
-- new stream, matmul, a new tensor...), restored afterwards.
local function swap_gpu()
  local saved = {}
  for k, v in pairs(gpu) do
    if type(v) == "function" and k:sub(1, 1) ~= "_" then
      saved[k] = v
      gpu[k] = k == "where" and where or function() refuse("gpu." .. k) end
    end
  end
  return function()
    for k, v in pairs(saved) do gpu[k] = v end
  end
end

-- The program of the results roots (tracers): the nodes they read,
-- renumbered; its tensor and number arguments in the order of its INPUT and
-- PARAM nodes; res, the results' nodes; reds, nil or the reduction of each
-- root.  nil and a message when it reads too many tensors or numbers for
-- one op.
local function make_program(tr, roots, reds)
  local need, stack = {}, {}
  for k, r in ipairs(roots) do stack[k] = r.id end
  while #stack > 0 do
    local i = table.remove(stack)
    if not need[i] then
      need[i] = true
      for j = 1, 3 do
        if tr.nodes[i][j] then stack[#stack + 1] = tr.nodes[i][j] end
      end
    end
  end
  local newid, nodes, ins, params = {}, {}, {}, {}
  for i = 1, tr.n do
    if need[i] then
      local src, x = tr.nodes[i], {}
      for k, v in pairs(src) do x[k] = v end
      for j = 1, 3 do x[j] = src[j] and newid[src[j]] end
      if x.kind == INPUT then ins[#ins + 1] = src.arg; x.index = #ins - 1 end
      if x.kind == PARAM then params[#params + 1] = src.arg; x.index = #params - 1 end
      nodes[#nodes + 1] = x
      newid[i] = #nodes
    end
  end
  if #ins > 8 then return nil, string.format("%s: a result reads %d tensors (at most 8 in one fused op)", tr.name, #ins) end
  if #params > 8 then return nil, string.format("%s: a result reads %d number arguments (at most 8)", tr.name, #params) end
  local res = {}
  for k, r in ipairs(roots) do res[k] = newid[r.id] end
  return { p = program(tr.name, nodes, res, reds), nodes = nodes, ins = ins, params = params, res = res }
end

-- The shape a program's result has, as far as the signature tells: per
-- dim (aligned from the right, as broadcasting), "1" where every tensor it
-- reads has size 1 or no such dim, "*" elsewhere.
local function pattern(pr, args)
  local rank = 0
  for _, a in ipairs(pr.ins) do rank = math.max(rank, #args[a].shape) end
  local p = {}
  for d = 1, rank do
    p[d] = "1"
    for _, a in ipairs(pr.ins) do
      local sh = args[a].shape
      local k = #sh - rank + d
      if k >= 1 and sh[k] ~= 1 then p[d] = "*" end
    end
  end
  return table.concat(p)
end

-- What may share one op with result j: the same shape pattern, and for a
-- reduced result the same dim, keepdim and dtype of the values it reduces
-- (one pass reduces them on one plan).
local function group_key(pr, args, root)
  local key = pattern(pr, args)
  if not pr.reduce then return "=" .. key end
  local ro = pr.ropts or {}
  local d = ro.dim
  -- dim -1 of a 2-dim value is its dim 2 (a bad dim raises when run)
  if math.type(d) == "integer" and d < 0 and d >= -root.ndim then d = d + root.ndim + 1 end
  return string.format("%s/%s/%s/%s", key, tostring(d), ro.keepdim and "k" or "", root.dtype)
end

-- The results of one group key made into programs of up to 4 results: one
-- op, one pass, that reads every input before it writes (and, for
-- reductions, reduces every result on one plan).  The plan: steps in the
-- order of their first result, each {pr =, members =, ropts =} (a group)
-- or {members = {j}} (result j alone).
local MAXOUT = 4
local function plan(tr, args, results, progs)
  local by, order = {}, {}
  for j, pr in ipairs(progs) do
    local key = group_key(pr, args, results[j])
    if not by[key] then by[key] = {}; order[#order + 1] = key end
    local b = by[key]
    if #b == 0 or #b[#b] == MAXOUT then b[#b + 1] = {} end
    local c = b[#b]
    c[#c + 1] = j
  end
  local step_of = {}
  for _, key in ipairs(order) do
    for _, members in ipairs(by[key]) do
      if #members > 1 then
        local roots, reds = {}, nil
        for k, j in ipairs(members) do
          roots[k] = results[j]
          if progs[j].reduce then
            reds = reds or {}
            reds[k] = progs[j].reduce
          end
        end
        local pr = make_program(tr, roots, reds)
        if pr then
          local g = { pr = pr, members = members, ropts = progs[members[1]].ropts, reds = reds }
          for _, j in ipairs(members) do step_of[j] = g end
        end
      end
    end
  end
  local steps, seen = {}, {}
  for j = 1, #progs do
    local g = step_of[j]
    if not g then steps[#steps + 1] = { members = { j } }
    elseif not seen[g] then seen[g] = true; steps[#steps + 1] = g end
  end
  return steps
end

local function trace(self, args, n)
  local def = debug.getinfo(self.fn, "S")
  current = { n = 0, nodes = {}, uses = {}, name = self.name, where = def.short_src .. ":" .. def.linedefined }
  local tr = current
  local targs = {}
  for i = 1, n do
    local v = args[i]
    if type(v) == "number" then
      targs[i] = setmetatable({ id = node { kind = PARAM, arg = i }, arg = i }, Param)
    else
      targs[i] = tracer(node { kind = INPUT, dtype = v.dtype, arg = i }, v.dtype, #v.shape)
    end
  end
  local restore = swap_gpu()
  local ok, res = pcall(function() return table.pack(self.fn(table.unpack(targs, 1, n))) end)
  restore()
  current = nil
  if not ok then error(res, 0) end
  current = tr
  local progs, roots = {}, {}
  if res.n == 0 then raise("%s returned nothing (return the tensors it computes)", tr.name) end
  for j = 1, res.n do
    local r, red = res[j], nil
    if getmetatable(r) == Reduced and rawget(r, "trace") == tr then red, r = r, rawget(r, "src") end
    if getmetatable(r) ~= Tracer or r.trace ~= tr then
      current = nil
      raise("%s: result %d is not a tensor computed from its arguments", tr.name, j)
    end
    local pr, why = make_program(tr, { r }, red and { rawget(red, "reduce") })
    if not pr then current = nil; raise("%s", why) end
    progs[j], roots[j] = pr, r
    if red then progs[j].reduce, progs[j].ropts = rawget(red, "reduce"), rawget(red, "opts") end
  end
  local steps = plan(tr, args, roots, progs)
  current = nil
  self.traces = self.traces + 1
  -- one op (one result, or a group of them all) whose numbers need no check
  -- (float ops take any number): the C side of a call (gpu._fuse's caller)
  -- runs it without this module, and comes back here when a group's inputs
  -- do not broadcast together
  local fast = #steps == 1 and (steps[1].pr or progs[1])
  for _, u in ipairs(tr.uses) do
    if class(u[2]) ~= "F" then fast = nil end
  end
  if fast then
    local ro = steps[1].pr and steps[1].ropts or progs[1].ropts
    fast = { p = fast.p, ins = fast.ins, params = fast.params, dim = ro and ro.dim, keepdim = ro and ro.keepdim }
  end
  return { progs = progs, steps = steps, uses = tr.uses, fast = fast }
end

-- The program's ops one by one, the unfused calls themselves (the same
-- results; one op each): what a fused call must equal.  Tests take this
-- path with require("gpu._fuse").unfused = true.
local by_code = { [UNARY] = {}, [BINARY] = {}, [TERNARY] = {} }
for _, row in ipairs(rows) do
  by_code[row.kind == "unary" and UNARY or row.kind == "binary" and BINARY or TERNARY][row.code] = row
end
local SYMBOL = { add = "+", sub = "-", mul = "*", div = "/", pow = "^", remainder = "%", floor_divide = "//" }
local left_op = {}
for name, sym in pairs(SYMBOL) do left_op[name] = load("local k, a = ... return k " .. sym .. " a") end

local function replay(pr, args, all)
  local v = {}
  for i, x in ipairs(pr.nodes) do
    local k = x.kind
    if k == INPUT then v[i] = args[pr.ins[x.index + 1]]
    elseif k == PARAM then v[i] = args[pr.params[x.index + 1]]
    elseif k == CONST then v[i] = x.k
    elseif k == CAST then v[i] = v[x[1]]:to(x.dtype)
    else
      local row = by_code[k][x.code]
      local a, b, c = v[x[1]], x[2] and v[x[2]], x[3] and v[x[3]]
      if k == UNARY then v[i] = a[row.name](a)
      elseif k == BINARY and type(a) ~= "userdata" then v[i] = left_op[row.name](a, b)
      elseif k == BINARY then v[i] = a[row.name](a, b)
      elseif row.name == "where" then v[i] = gpu.where(a, b, c)
      else v[i] = a[row.name](a, b, c) end
    end
  end
  if all then
    local r = {}
    for k, i in ipairs(pr.res) do r[k] = v[i] end
    return r
  end
  return v[#pr.nodes]
end

local function run_unfused(pr, args, out, stream)
  local scope <close> = stream and gpu.using(stream) or nil
  local r = replay(pr, args)
  if out then
    -- the fused op's own check, so that both paths say the same
    local so, sr = table.concat(out.shape, ","), table.concat(r.shape, ",")
    if so ~= sr or out.dtype ~= r.dtype then
      error(string.format("bad option 'out' (%s {%s} does not match the result %s {%s})", out.dtype, so, r.dtype, sr), 0)
    end
    out:copy(r)
    return out
  end
  return r
end

-- A group's results unfused: all computed, then written to out (the fused
-- op reads every input before it writes).
local function run_unfused_group(pr, args, out, stream)
  local scope <close> = stream and gpu.using(stream) or nil
  local r = replay(pr, args, true)
  if not out then return table.unpack(r) end
  for k = 1, #r do
    local so, sr = table.concat(out[k].shape, ","), table.concat(r[k].shape, ",")
    if so ~= sr or out[k].dtype ~= r[k].dtype then
      error(string.format("bad option 'out' (%s {%s} does not match the result %s {%s})", out[k].dtype, so,
                          r[k].dtype, sr), 0)
    end
  end
  for k = 1, #r do out[k]:copy(r[k]) end
  return table.unpack(out, 1, #r)
end

-- The trailing reduction (name red, options ropts) of a result r, unfused
-- (the reference path).
local function reduce(red, ropts, r, out, stream)
  local o = { out = out, stream = stream }
  for k, v in pairs(ropts or {}) do o[k] = v end
  return r[red](r, o)
end

-- A group's reduced results unfused: every value computed and reduced,
-- then written to out (the fused op reads every input before it writes;
-- slow_call checked out first).
local function run_unfused_rgroup(g, args, out, stream)
  local scope <close> = stream and gpu.using(stream) or nil
  local r = replay(g.pr, args, true)
  local res = {}
  for k = 1, #r do res[k] = reduce(g.reds[k], g.ropts, r[k], nil, stream) end
  if not out then return table.unpack(res, 1, #r) end
  for k = 1, #r do out[k]:copy(res[k]) end
  return table.unpack(out, 1, #r)
end

local Fused = {}
Fused.__index = Fused

function Fused:stats()
  return { traces = self.traces, calls = self.calls }
end

-- One result of a call, its trailing reduction included: one op; ok,
-- result or error.  The site of the op: the first line from 4 levels up
-- from run (pcall, this function, the slow call, gpu._fuse's caller (C, no
-- line), the call's line).
local function run_one(pr, args, out, stream)
  if not core.unfused then
    local ro = pr.ropts
    return pcall(run, pr.p, args, pr.ins, pr.params, out, stream, 4, ro and ro.dim, ro and ro.keepdim)
  end
  local ok, r = pcall(run_unfused, pr, args, not pr.reduce and out or nil, stream)
  if ok and pr.reduce then ok, r = pcall(reduce, pr.reduce, pr.ropts, r, out, stream) end
  return ok, r
end

-- A group of results: one op; ok, then the results or false (the inputs
-- do not broadcast together this call).  The site as run_one's.
local function run_group(g, args, out, stream)
  local pr, ro = g.pr, g.ropts
  if not core.unfused then return pcall(run, pr.p, args, pr.ins, pr.params, out, stream, 4, ro and ro.dim, ro and ro.keepdim) end
  if g.reds then return pcall(run_unfused_rgroup, g, args, out, stream) end
  return pcall(run_unfused_group, pr, args, out, stream)
end

-- The outputs of a call of several ops, each op checked as it would run
-- (gpu._fuse's run, dry) before the first writes anything: a bad out
-- raises with every out as it was.  The reference path checks the same, so
-- that both paths refuse what the fused op refuses.
local function dry(pr, ro, args, out, stream)
  local ok, r = pcall(run, pr.p, args, pr.ins, pr.params, out, stream, 5, ro and ro.dim, ro and ro.keepdim, true)
  if not ok then error((tostring(r):gsub(SELF_AT, "")), 5) end
  return r
end
local function check_outs(steps, progs, args, out, stream)
  for s = 1, #steps do
    local g = steps[s]
    local members = g.members
    local shared = false
    if g.pr then
      local gout = {}
      for k, j in ipairs(members) do gout[k] = out[j] end
      shared = dry(g.pr, g.ropts, args, gout, stream) ~= false
    end
    if not shared then
      for _, j in ipairs(members) do dry(progs[j], progs[j].ropts, args, out[j], stream) end
    end
  end
end

-- A call's slow path (gpu._fuse's caller takes the hot one in C): the
-- first call of a signature, several ops, numbers to check, the unfused
-- reference path.  Called from C: its caller's line is 3 levels up.
local function slow_call(self, ...)
  local n = select("#", ...)
  local args = { ... }
  local o = args[n]
  if type(o) == "table" and getmetatable(o) == nil then
    args[n] = nil
    n = n - 1
  else
    o = nil
  end
  -- the signature (the trace cache's key): each argument's dtype, rank and
  -- dims of size 1, "n" for a number
  local key, bad = core.key(args, n)
  if not key then
    for i = 1, n do
      -- called inside another fused function: traced into it
      if getmetatable(args[i]) == Tracer or getmetatable(args[i]) == Param then
        if o then refuse("options (out, stream) of a fused call inside another") end
        return self.fn(...)
      end
    end
    raise("argument %d: gpu.Tensor or number expected, got %s", bad, type(args[bad]))
  end
  local out, stream
  if o then
    for k in pairs(o) do
      if k ~= "out" and k ~= "stream" then raise("%s: unknown option '%s' (expected: out, stream)", self.name, tostring(k)) end
    end
    out, stream = o.out, o.stream
  end
  local entry = self.cache[key]
  if not entry then
    entry = trace(self, args, n)
    self.cache[key] = entry
  end
  self.calls = self.calls + 1
  local uses = entry.uses
  for i = 1, #uses do
    local u = uses[i]
    local v = number_for(args[u[1]], u[2], u[3])
    if u[4] and class(u[2]) ~= "F" and v == 0 then raise("%s: integer division by zero", u[3]) end
  end
  local progs = entry.progs
  local np = #progs
  if np == 1 then
    local ok, r = run_one(progs[1], args, out, stream)
    if not ok then error((tostring(r):gsub(SELF_AT, "")), 3) end
    return r
  end
  if out ~= nil and (type(out) ~= "table" or #out ~= np) then
    raise("%s: out must be a list of %d tensors (one per result)", self.name, np)
  end
  local results, steps = {}, entry.steps
  if out and (#steps > 1 or core.unfused) then check_outs(steps, progs, args, out, stream) end
  for s = 1, #steps do
    local g = steps[s]
    local rs
    if g.pr then
      local gout
      if out then
        gout = {}
        for k, j in ipairs(g.members) do gout[k] = out[j] end
      end
      rs = table.pack(run_group(g, args, gout, stream))
      if not rs[1] then error((tostring(rs[2]):gsub(SELF_AT, "")), 3) end
      if rs[2] ~= false then
        for k, j in ipairs(g.members) do results[j] = rs[k + 1] end
      end
    end
    if not g.pr or rs[2] == false then
      -- one op each: a single result, or a group whose inputs' shapes differ
      for _, j in ipairs(g.members) do
        local ok, r = run_one(progs[j], args, out and out[j], stream)
        if not ok then error((tostring(r):gsub(SELF_AT, "")), 3) end
        results[j] = r
      end
    end
  end
  return table.unpack(results, 1, np)
end

Fused.__call = core.caller(slow_call, core)

-- gpu.fuse(fn [, opts]): opts.name names the op in traces and messages
-- (default: fused@<fn's source:line>).
return function(fn, opts)
  if type(fn) ~= "function" then error("bad argument #1 to 'fuse' (function expected, got " .. type(fn) .. ")", 2) end
  if opts ~= nil and type(opts) ~= "table" then error("bad argument #2 to 'fuse' (table expected)", 2) end
  local name = opts and opts.name
  for k in pairs(opts or {}) do
    if k ~= "name" then error("unknown option '" .. tostring(k) .. "' (expected: name)", 2) end
  end
  if name ~= nil and type(name) ~= "string" then error("bad argument #2 to 'fuse' (name must be a string)", 2) end
  if not name then
    local info = debug.getinfo(fn, "S")
    name = "fused@" .. info.short_src .. ":" .. info.linedefined
  end
  return setmetatable({ fn = fn, name = name, cache = {}, traces = 0, calls = 0 }, Fused)
end
