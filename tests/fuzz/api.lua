-- A random API fuzzer for the gpu bindings (not a TAP test: `make fuzz`
-- runs it through tests/fuzz/run.lua, under the ASan+UBSan build).
--
-- Each step generates one Lua statement as text (a call with random and
-- boundary arguments: tensors of every dtype and kind of memory, views,
-- closed objects, streams, events, tasks, scopes, coroutines, pipelines,
-- collectives, traces, .npy files, wrong types, huge, negative and zero
-- shapes, NaN, NUL bytes ...), writes it to FUZZ_LOG (flushed), then runs it
-- under pcall.  Any Lua error is fine.  What is not: a crash, a sanitizer
-- report, a hang (run.lua's timeout) or a leak: at the end everything is
-- dropped, the tasks run, the device synchronized and the garbage collected,
-- and gpu.memory() and gpu.stats() must show nothing left (LeakSanitizer
-- checks the C side at exit).  The log replays what ran, statement for
-- statement, so a failure reduces to a few statements (run.lua does that).
--
-- Environment:
--   FUZZ_SEED     the seed (default 1); the same seed makes the same calls
--   FUZZ_ITERS    statements to run (default 2000), or
--   FUZZ_SECONDS  run for that long instead
--   FUZZ_LOG      file that gets every statement before it runs
--   FUZZ_TMP      directory for the files it writes and reads (default: a
--                 new one, removed at the end)
--   FUZZ_SPECIAL  1: also hand special files (/dev/zero, a FIFO) to gpu.load
--                 and gpu.load_module (off by default: they block on them
--                 until they read regular files only, issue 21)
--   FUZZ_REPLAY   a log (or any file of statements, one a line): run those
--                 instead of generating; with FUZZ_SCRIPT=out.lua, write them
--                 as a stand-alone script instead of running them
--   FUZZ_STATS    1: print per call how often it ran and raised, and its most
--                 frequent error (to see what the generator reaches)
-- Exit status: 0 fine, 3 a leak, 1 the fuzzer itself failed.
--
-- Run it in a directory of its own (run.lua does): a call handed a string
-- where a path goes (t.save("x")) writes that file in the current directory.
-- Paths it writes on purpose are inside FUZZ_TMP; absolute paths elsewhere
-- are only read.
local gpu = require "gpu"
local pipeline = require "gpu.pipeline"

local env = os.getenv
local SEED = math.tointeger(tonumber(env("FUZZ_SEED") or "1")) or error("FUZZ_SEED: an integer expected")
local SECONDS = tonumber(env("FUZZ_SECONDS") or "")
local ITERS = math.tointeger(tonumber(env("FUZZ_ITERS") or "")) or (not SECONDS and 2000) or nil
local SPECIAL = env("FUZZ_SPECIAL") == "1"
local STATS = env("FUZZ_STATS") == "1" and {} or nil

-- ---- the world the statements run in -------------------------------------

-- Functions the statements pass (task bodies, pipeline stages, group bodies);
-- source text, so that a stand-alone reproducer can carry them.  Each ends.
local F_SRC = [==[
local gpu, D = ...
local F = {}
function F.noop(...) return ... end
function F.err() error("raised on purpose") end
function F.yield(...) coroutine.yield() return ... end
function F.yields() for _ = 1, 3 do coroutine.yield() end end
function F.await(x) return gpu.await(x) end
function F.await2(x, y) gpu.await(x) return gpu.await(y) end
function F.sync() gpu.synchronize() end
function F.item(t) return t:item() end
function F.nosync(mode, x) local _ <close> = gpu.nosync(mode) coroutine.yield() return gpu.await(x) end
function F.nosync_item(t) local _ <close> = gpu.nosync() return t:item() end
function F.using(s, t) local _ <close> = gpu.using(s) coroutine.yield() return t:add(1) end
function F.range(name) local _ <close> = gpu.range(name) coroutine.yield() end
function F.run() return gpu.run(0) end
function F.task(...) return gpu.task(F.noop, ...) end
function F.cancel(t) return t:cancel() end
function F.fill(i, t) t:fill(i) end
function F.load3(i, t) t:fill(i) return i < 3 end
function F.load_yield(i) coroutine.yield() return i < 2 end
function F.compute(i, x, y) if y then x:mul(2, {out = y}) else x:mul_(2) end return i end
function F.sink(i, p) if p then return p:sum():item() end end
function F.close(i, x) x:close() end
function F.big(i, x) return gpu.empty({2^40}) end
function F.sendrecv(t, peer) gpu.send(t, peer) gpu.recv(t, peer) end
function F.collective(t) gpu.all_reduce(t) end
function F.write(path, s) local f = assert(io.open(path, "wb")) f:write(s) f:close() end
return F
]==]

local D = env("FUZZ_TMP")
local own_tmp = not D
if own_tmp then
  D = os.tmpname()
  os.remove(D)
  assert(os.execute("mkdir -p '" .. D .. "'"), "cannot make " .. D)
end
if SPECIAL then os.execute("mkfifo '" .. D .. "/fifo' 2>/dev/null") end

local F = assert(load(F_SRC, "=F", "t"))(gpu, D)
local P = {}
local E = setmetatable({ P = P, F = F, D = D, gpu = gpu, pipeline = pipeline }, { __index = _G })

local function exec(stmt)
  local fn, err = load(stmt, "=fuzz", "t", E)
  if not fn then
    io.stderr:write("fuzz: generated a statement that does not compile: ", err, "\n", stmt, "\n")
    os.exit(1)
  end
  return pcall(fn)
end

-- ---- literals ---------------------------------------------------------------

local R = math.random
local function pick(t) return t[R(#t)] end
local function chance(p) return R() < p end

-- One line of Lua source for a value.
local function lit(v)
  if type(v) == "string" then return (string.format("%q", v):gsub("\\\n", "\\n")) end
  if type(v) == "number" then return string.format("%q", v) end
  return tostring(v)
end

local INTS = { 0, 1, 2, 3, 4, 5, 7, 8, -1, -2, 127, 128, 255, 256, -128, -129, 65535, 65536,
               2147483647, 2147483648, -2147483648, -2147483649, 4294967295, 4294967296,
               9007199254740993, math.maxinteger, math.mininteger }
local FLOATS = { "0.0", "-0.0", "0.5", "-0.5", "1.5", "1e-45", "1e-310", "65504.0", "65520.0", "3.5e38",
                 "1e308", "1e9999", "-1e9999", "(0/0)", "2^53", "2^63", "-2^63", "2^64", "2^31", "1e7" }
local STRINGS = { '""', '"x"', '"f32"', '"sum"', '"error"', '"off"', '"warn"', '"host"', '"device"',
                  'string.rep("a", 300)', '"f32\\0junk"', '"\\255\\254"', '"%s%s%n"', '"cuda:0"', '"1"', '"-1"',
                  '"0x10"', '" 2"', '"nan"', '"inf"' }
local DTYPES = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" }
local BAD_DTYPES = { '"f32\\0junk"', '"complex"', '""', '"F32"', '"float32"', '"half"', '"int"', '"uint8"', "5",
                     '"bfloat16"', '"u4"' }
local DEVICES = { "device", "pinned", "host", "cuda", "cuda:0", "cpu" }
local BAD_DEVICES = { '"cuda:1"', '"cuda:-1"', '"cuda:-0"', '"cuda:+0"', '"cuda:"', '"host\\0x"', '"gpu"',
                      '"cuda:99999999999999999999"', '"cuda:0x0"', "0", "true" }

local function small_int() return tostring(R(-2, 8)) end
local function num()
  local r = R()
  if r < 0.6 then return small_int() end
  if r < 0.85 then return lit(pick(INTS)) end
  return pick(FLOATS)
end

local function dtype()
  if chance(0.85) then return lit(pick(DTYPES)) end
  return pick(BAD_DTYPES)
end

local function device()
  if chance(0.85) then return lit(pick(DEVICES)) end
  return pick(BAD_DEVICES)
end

-- Huge shapes are far past any machine's memory (2^40 elements and up), so
-- that they fail as out of memory instead of taking it.
local BAD_SHAPES = { "{0}", "{-1}", "{2, 0}", "{1.5}", '{"2"}', "{0/0}", "{1e9999}", "{2^42}", "{2^62, 4}",
                     "{2^40}", "{1099511627776, 1099511627776}", "{3037000500, 3037000500}", "{1, 1, 1, 1, 1, 1, 1, 1, 1}",
                     "{1, 1, 1, 1, 1, 1, 1, 2}", "-3", "0", "{{2}}", "{n = 2}", "{math.maxinteger}",
                     "{math.mininteger}", "nil", '"big"', "{2, nil, 3}", "{true}", "2^41", "{1048576, 1048576}" }
-- Shapes for expand: a view costs no memory, so a huge but valid one
-- (2^42 elements) succeeds, and every later op on it then runs for hours
-- (`P[24] = P[12]:expand({2^42}); P[18] = P[24]:min()` was reported as a
-- hang, CI 2026-11-26).  Expand gets the bad shapes that fail as such.
local BAD_EXPAND = { "{0/0}", "{1e9999}", "{2^62, 4}", "{1099511627776, 1099511627776}", "{3037000500, 3037000500}",
                     "{1.5}", '{"2"}', "-3", "{{2}}", "{n = 2}", "{math.mininteger}", "nil", '"big"', "{2, nil, 3}",
                     "{true}", "{1, 1, 1, 1, 1, 1, 1, 1, 1}" }
local function shape(bad)
  local r = R()
  if r < 0.75 then
    local dims = {}
    for i = 1, R(0, 3) do dims[i] = R(1, 5) end
    return "{" .. table.concat(dims, ", ") .. "}"
  end
  if r < 0.83 then return tostring(R(1, 6)) end
  return pick(bad or BAD_SHAPES)
end

-- Values for gpu.tensor.
local VALUES = { "{1, 2, 3}", "{{1, 2}, {3, 4}}", "{{1}, {2, 3}}", "{}", "{{}}", "5", "2.5", "{true, false}",
                 "{0/0, 1e9999, -1e9999}", '{"a"}', "{{{{{{{{{1}}}}}}}}}", "{1, nil, 3}", "{{1, 2}, 3}",
                 "{math.maxinteger, math.mininteger}", "{2^63, -2^63}", "{300, -300}", "{65520.0}",
                 "setmetatable({}, {__len = function() return 2^40 end})", "{[1] = 1, [3] = 3}", "{-0.0}" }

-- ---- the pool -----------------------------------------------------------------

local NSLOT = 32

local function kind_of(v)
  local tv = type(v)
  if tv ~= "userdata" then return tv end
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__name") or "userdata"
end

local function slot() return "P[" .. R(NSLOT) .. "]" end

-- An expression made fit to index or call: (5):close(), not 5:close().
local function pre(e)
  if e:match("^P%[%d+%]$") then return e end
  return "(" .. e .. ")"
end

local any

-- A slot holding a value of one of the kinds (a set), mostly; else anything.
local function ref(kinds, p)
  if chance(p or 0.9) then
    local found = {}
    for i = 1, NSLOT do
      if P[i] ~= nil and kinds[kind_of(P[i])] then found[#found + 1] = i end
    end
    if #found > 0 then return "P[" .. pick(found) .. "]" end
  end
  return any()
end

local TENSOR = { ["gpu.Tensor"] = true }
local STREAM = { ["gpu.Stream"] = true }
local EVENT = { ["gpu.Event"] = true }
local TASK = { ["gpu.Task"] = true }
local AWAITABLE = { ["gpu.Event"] = true, ["gpu.Stream"] = true, ["gpu.Task"] = true }
local THREAD = { thread = true }
local function tensor(p) return pre(ref(TENSOR, p)) end

-- A tensor expression and, when it is a live one in the pool, its shape.
local function sized()
  local t = tensor()
  local i = math.tointeger(t:match("^P%[(%d+)%]$"))
  local ok, shp = pcall(function() return P[i].shape end)
  if ok and type(shp) == "table" then return t, shp end
  return t, nil
end
local function stream(p) return pre(ref(STREAM, p)) end
local function event() return pre(ref(EVENT)) end
local function task() return pre(ref(TASK)) end

local FUNCS = { "F.noop", "F.err", "F.yield", "F.yields", "F.await", "F.await2", "F.sync", "F.item", "F.nosync",
                "F.nosync_item", "F.using", "F.range", "F.run", "F.task", "F.cancel", "F.sendrecv",
                "F.collective", "print", "coroutine.yield", "error" }

function any(depth)
  local r = R()
  if r < 0.45 then return "P[" .. R(NSLOT) .. "]" end
  if r < 0.62 then return num() end
  if r < 0.70 then return pick(STRINGS) end
  if r < 0.76 then return pick({ "nil", "true", "false" }) end
  if r < 0.82 then return pick(FUNCS) end
  if r < 0.88 then return shape() end
  if r < 0.92 then return pick({ "io.stdout", "coroutine.running()", "setmetatable({}, {__index = function() error('no') end})",
                                 "{n = -1}", "gpu.nothing" }) end
  if (depth or 0) < 1 then return "{" .. any(1) .. ", " .. any(1) .. "}" end
  return "nil"
end

-- ---- options --------------------------------------------------------------------

local OPT = {
  dtype = dtype, device = device,
  stream = function() return stream() end,
  out = function() return tensor() end,
  dim = function() return chance(0.8) and tostring(R(-3, 3)) or num() end,
  keepdim = function() return pick({ "true", "false", "1" }) end,
  op = function() return lit(pick({ "sum", "prod", "max", "min", "avg", "mean", "", "SUM" })) end,
  root = function() return pick({ "0", "1", "-1", "0.5", "2^31", '"0"' }) end,
  timing = function() return pick({ "true", "false", "nil", "0" }) end,
  priority = function() return pick({ '"low"', '"normal"', '"high"', "-1", "0", "1", "7", '"x"', "0/0" }) end,
  nonblocking = function() return pick({ "true", "false", '"yes"' }) end,
  low = num, high = num, mean = num, std = num, seed = num,
  max_events = function() return pick({ "1", "10", "1000", "0", "-1", "1e9", "2^40", "0.5" }) end,
  timeout = function() return pick({ "0.01", "1", "0", "-1", "(0/0)", "1e9999", '"soon"' }) end,
  check = function() return pick({ "true", "false", "1" }) end,
  declare = function() return pick({ '"__global__ void k(float *x, int n);"', '""', "5", '"void ("' }) end,
  options = function() return pick({ '{"-O3"}', "{}", "{5}", '"-O3"' }) end,
  name = function() return pick(STRINGS) end,
  cache = function() return pick({ "true", "false" }) end,
}

-- A table of some of the named options (or not a table at all).
local function opts(...)
  local r = R()
  if r < 0.25 then return "nil" end
  if r < 0.28 then return any() end
  local keys, parts = { ... }, {}
  for _, k in ipairs(keys) do
    if chance(0.5) then parts[#parts + 1] = k .. " = " .. (chance(0.9) and OPT[k]() or any()) end
  end
  if chance(0.04) then parts[#parts + 1] = "bogus = 1" end
  if chance(0.02) then parts[#parts + 1] = "[1] = 1" end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- ---- files ------------------------------------------------------------------------

-- A path to read, or to write: then only inside D (it writes what it is
-- given, and `make fuzz` may run as root).
local function path(for_writing)
  local names = { "a.npy", "b.npy", "junk.npy", "t.json", "t.svg", "t.txt" }
  if chance(0.7) then return 'D .. "/' .. pick(names) .. '"' end
  local odd = { "D", 'D .. "/missing/x.npy"', 'D .. "/a.npy\\0x"', 'D .. "/"', '""' }
  if not for_writing then
    for _, p in ipairs({ '"/dev/null"', '"/proc/self/status"', '"/nonexistent/x.npy"', "5" }) do odd[#odd + 1] = p end
    if SPECIAL then odd[#odd + 1] = pick({ '"/dev/zero"', 'D .. "/fifo"' }) end
  end
  return pick(odd)
end

-- The bytes of a .npy file, mostly well formed, sometimes damaged.
local function npy_bytes()
  local descr = pick({ "<f4", "<f8", "<f2", "<V2", "|i1", "|u1", "<i4", "<i8", "|b1", ">f4", ">i8", "bfloat16", "<c8",
                       "f4", "<f4\0x", "" })
  local dims = {}
  for i = 1, R(0, 3) do dims[i] = R(0, 3) end
  local shp = #dims == 1 and "(" .. dims[1] .. ",)" or "(" .. table.concat(dims, ", ") .. ")"
  local n = 1
  for _, d in ipairs(dims) do n = n * d end
  local size = tonumber(descr:match("%d+")) or 1
  local dict = string.format("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
                             chance(0.9) and "False" or "True", shp)
  local major = pick({ 1, 1, 1, 2, 3, 0, 4 })
  local hl = #dict + 1
  local s = "\x93NUMPY" .. string.char(major, 0) .. (major == 1 and string.pack("<I2", hl) or string.pack("<I4", hl))
            .. dict .. "\n" .. string.rep("\1", n * size + (chance(0.8) and 0 or R(-2, 2)))
  local r = R()
  if r < 0.1 then
    s = s:sub(1, R(0, #s))
  elseif r < 0.2 then
    local i = R(1, #s)
    s = s:sub(1, i - 1) .. string.char(R(0, 255)) .. s:sub(i + 1)
  end
  return lit(s)
end

-- ---- statements ---------------------------------------------------------------------

local CTORS = { "empty", "zeros", "ones", "rand", "randn", "pinned" }
local BINARY = { "add", "sub", "mul", "div", "pow", "max", "min" }
local UNARY = { "neg", "abs", "exp", "log", "sqrt", "relu", "sigmoid", "tanh" }
local REDUCE = { "sum", "mean", "max", "min", "argmax" }
local OPERATORS = { "+", "-", "*", "/", "^", "..", "==", "<", "<=", "%", "//", "&" }
local METHODS = { "numel", "nbytes", "is_contiguous", "item", "totable", "contiguous", "clone", "zero_", "close" }
local FIELDS = { '"shape"', '"dtype"', '"device"', '"device_index"', '"ndim"', '"foo"', '"__gc"', "1", "0/0", "true" }

local gen = {}
local statement

local function args(n, f)
  local t = {}
  for i = 1, n do t[i] = (f or any)() end
  return table.concat(t, ", ")
end

-- Tensors
gen[#gen + 1] = { 12, function()
  local r = R()
  if r < 0.6 then
    local ctor = pick(CTORS)
    local o = ctor == "pinned" and opts("dtype") or ctor == "rand" and opts("dtype", "device", "stream", "low", "high", "seed")
              or ctor == "randn" and opts("dtype", "device", "stream", "mean", "std", "seed") or opts("dtype", "device", "stream")
    return slot() .. " = gpu." .. ctor .. "(" .. shape() .. ", " .. o .. ")"
  end
  if r < 0.7 then return slot() .. " = gpu.full(" .. shape() .. ", " .. num() .. ", " .. opts("dtype", "device", "stream") .. ")" end
  if r < 0.85 then
    -- a valid range stays small (a huge but possible one would take memory
    -- for nothing); out of range ones overflow
    local a = { args(R(1, 3), function()
      return chance(0.75) and small_int()
             or pick({ "0.5", "-0.5", "(0/0)", "1e9999", "math.maxinteger", "math.mininteger", "2^63", "1e308", "2^62" })
    end) }
    if chance(0.5) then a[#a + 1] = opts("dtype", "device", "stream") end
    return slot() .. " = gpu.arange(" .. table.concat(a, ", ") .. ")"
  end
  return slot() .. " = gpu.tensor(" .. pick(VALUES) .. ", " .. opts("dtype", "device", "stream") .. ")"
end }
gen[#gen + 1] = { 6, function()
  local r = R()
  if r < 0.35 then
    local t, dims = sized()
    if dims and #dims > 0 and chance(0.7) then
      local d = R(#dims)
      local start = dims[d] > 0 and R(1, dims[d]) or 1   -- a zero-sized dim: narrow(d, 1, 0)
      return slot() .. " = " .. t .. ":narrow(" .. d .. ", " .. start .. ", " .. R(dims[d] > 0 and 1 or 0, dims[d] - start + 1) .. ")"
    end
    return slot() .. " = " .. t .. ":narrow(" .. OPT.dim() .. ", " .. num() .. ", " .. num() .. ")"
  end
  if r < 0.6 then return slot() .. " = " .. tensor() .. ":view(" .. (chance(0.2) and "{-1}" or shape()) .. ")" end
  if r < 0.8 then return slot() .. " = " .. tensor() .. ":to(" .. pick({ dtype(), device(), "{dtype = " .. dtype() .. ", device = " .. device() .. "}", any() }) .. ", " .. opts("stream") .. ")" end
  return slot() .. " = " .. tensor() .. ":" .. pick({ "contiguous", "clone" }) .. "()"
end }
-- views (tensor_view.c), joins and the creation ops (tensor_new.c)
local VIEWS = { "transpose", "t", "permute", "unsqueeze", "squeeze", "expand", "select", "slice", "split", "chunk",
                "reshape" }
gen[#gen + 1] = { 5, function()
  local r = R()
  local small = function() return chance(0.85) and tostring(R(-3, 4)) or any() end
  if r < 0.45 then
    -- expand's sizes stay small here too (BAD_EXPAND, above)
    local f = pick(VIEWS)
    local arg = f == "expand" and function() return tostring(R(-3, 4)) end or small
    return slot() .. " = " .. tensor() .. ":" .. f .. "(" .. args(R(0, 4), arg) .. ")"
  end
  if r < 0.6 then
    local f = pick({ "expand", "reshape", "permute" })
    return slot() .. " = " .. tensor() .. ":" .. f .. "(" .. shape(f == "expand" and BAD_EXPAND or nil) .. ")"
  end
  if r < 0.8 then
    return slot() .. " = gpu." .. pick({ "cat", "stack" }) .. "({" .. args(R(0, 3), tensor) .. "}, "
           .. (chance(0.6) and small() or opts("out", "stream")) .. ", " .. opts("out", "stream") .. ")"
  end
  local f = pick({ "linspace", "eye", "randint", "empty_like", "zeros_like", "ones_like", "full_like" })
  local a = f:match("like$") and { tensor(), num() } or { small(), small(), chance(0.5) and shape() or small() }
  return slot() .. " = gpu." .. f .. "(" .. table.concat(a, ", ") .. ", " .. opts("dtype", "device", "stream", "seed") .. ")"
end }
gen[#gen + 1] = { 10, function()
  local op = pick(BINARY)
  local x = chance(0.6) and tensor() or num()
  if chance(0.3) then return tensor() .. ":" .. op .. "_(" .. x .. ", " .. opts("stream") .. ")" end
  return slot() .. " = " .. tensor() .. ":" .. op .. "(" .. x .. ", " .. opts("out", "stream") .. ")"
end }
gen[#gen + 1] = { 5, function()
  local op = pick(UNARY)
  if chance(0.3) then return tensor() .. ":" .. op .. "_(" .. opts("stream") .. ")" end
  return slot() .. " = " .. tensor() .. ":" .. op .. "(" .. opts("out", "stream") .. ")"
end }
gen[#gen + 1] = { 5, function()
  return slot() .. " = " .. tensor() .. ":" .. pick(REDUCE) .. "(" .. opts("dim", "keepdim", "stream") .. ")"
end }
-- outs that overlap the input (issue 35): computed through a temporary,
-- which must be released; the tensor itself, its transpose, or the two
-- views of it shifted by one along dim 1
local ALIASED = { "%s:add(1, {out = %s})", "%s:mul(%s, {out = %s})", "%s:neg({out = %s})",
                  "%s:cumsum(1, {out = %s})", "%s:softmax(1, {out = %s})", "%s:clamp(0, 1, {out = %s})",
                  "%s:index_select(1, gpu.arange(%d, 0, -1), {out = %s})", "gpu.matmul(%s, %s, {out = %s})",
                  "gpu.where(%s:gt(0), %s, 0, {out = %s})", "%s:sum({dim = 1, keepdim = true, out = %s})",
                  "gpu.cat({%s}, {out = %s})", "%s:scatter_add_(1, gpu.arange(%d, 0, -1), %s)" }
gen[#gen + 1] = { 3, function()
  local t, dims = sized()
  local n = dims and dims[1] or 2
  local a, o = t, pick({ t, pre(t) .. ":t()" })
  if chance(0.5) and n >= 2 then
    a, o = pre(t) .. ":narrow(1, 1, " .. (n - 1) .. ")", pre(t) .. ":narrow(1, 2, " .. (n - 1) .. ")"
    if chance(0.5) then a, o = o, a end
    n = n - 1
  end
  local f = pick(ALIASED)
  local v = {}
  for k in f:gmatch("%%(%a)") do v[#v + 1] = k == "d" and n or a end
  v[#v] = o
  return slot() .. " = " .. string.format(f, table.unpack(v))
end }
gen[#gen + 1] = { 2, function()
  if chance(0.3) then
    local m, k, n, dt = R(1, 4), R(1, 4), R(1, 4), dtype()
    return string.format("%s = gpu.matmul(gpu.rand({%d, %d}, {dtype = %s}), gpu.rand({%d, %d}, {dtype = %s}), %s)",
                         slot(), m, k, dt, k, n, dt, opts("out", "stream"))
  end
  if chance(0.5) then return slot() .. " = gpu.matmul(" .. tensor() .. ", " .. tensor() .. ", " .. opts("out", "stream") .. ")" end
  return slot() .. " = " .. tensor() .. ":matmul(" .. tensor() .. ")"
end }
gen[#gen + 1] = { 5, function()
  local r = R()
  if r < 0.5 then return tensor() .. ":copy(" .. tensor() .. ", " .. opts("stream") .. ")" end
  if r < 0.85 then return tensor() .. ":fill(" .. num() .. ", " .. opts("stream") .. ")" end
  return tensor() .. ":zero_()"
end }
gen[#gen + 1] = { 6, function()
  local r = R()
  local idx = function() return chance(0.85) and tostring(R(-2, 4)) or any() end
  local t, dims = sized()
  if dims and chance(0.6) then
    local at = {}
    for i, n in ipairs(dims) do at[i] = n > 0 and R(1, n) or 1 end
    idx = function() return tostring(table.remove(at, 1) or R(-2, 4)) end
  end
  if r < 0.3 then return slot() .. " = " .. t .. ":get(" .. args(dims and chance(0.8) and #dims or R(0, 3), idx) .. ")" end
  if r < 0.5 then
    local a = args(dims and chance(0.8) and #dims or R(1, 3), idx)
    return t .. ":set(" .. a .. (a ~= "" and ", " or "") .. num() .. ")"
  end
  if r < 0.75 then return slot() .. " = " .. tensor() .. ":" .. pick(METHODS) .. "()" end
  if r < 0.85 then return slot() .. " = " .. tensor() .. "[" .. pick(FIELDS) .. "]" end
  if r < 0.9 then return tensor() .. "[" .. pick(FIELDS) .. "] = " .. any() end
  if r < 0.95 then return slot() .. " = tostring(" .. tensor() .. ")" end
  return slot() .. " = #" .. tensor()
end }
gen[#gen + 1] = { 4, function()
  if chance(0.15) then return slot() .. " = -" .. pre(tensor()) end
  local a = chance(0.8) and tensor() or num()
  local b = chance(0.6) and tensor() or chance(0.5) and num() or any()
  return slot() .. " = " .. a .. " " .. pick(OPERATORS) .. " " .. b
end }
-- Closing, finalizers and metamethods called by hand, methods on other things
gen[#gen + 1] = { 3, function()
  local r = R()
  if r < 0.5 then return "P[" .. R(NSLOT) .. "]:close()" end
  if r < 0.75 then return "do local _ <close> = P[" .. R(NSLOT) .. "] end" end
  if r < 0.85 then return "getmetatable(P[" .. R(NSLOT) .. "])." .. pick({ "__gc", "__close", "__tostring", "__len", "__unm" }) .. "(" .. any() .. ")" end
  return slot() .. " = " .. tensor() .. "." .. pick({ "add", "narrow", "copy", "item", "save", "close" }) .. "(" .. args(R(0, 3)) .. ")"
end }
-- Streams and events
gen[#gen + 1] = { 8, function()
  local r = R()
  if r < 0.15 then return slot() .. " = gpu.stream(" .. opts("priority", "nonblocking") .. ")" end
  if r < 0.25 then return slot() .. " = gpu.event(" .. opts("timing") .. ")" end
  if r < 0.35 then return stream() .. ":wait(" .. ref(AWAITABLE) .. ")" end
  if r < 0.45 then return slot() .. " = " .. stream() .. ":record(" .. opts("timing") .. ")" end
  if r < 0.5 then return slot() .. " = " .. stream() .. ":" .. pick({ "synchronize", "query" }) .. "()" end
  if r < 0.6 then return event() .. ":record(" .. (chance(0.8) and stream() or "") .. ")" end
  if r < 0.68 then return slot() .. " = " .. event() .. ":" .. pick({ "synchronize", "query" }) .. "()" end
  if r < 0.76 then return slot() .. " = " .. event() .. ":elapsed(" .. event() .. ")" end
  if r < 0.82 then return slot() .. " = " .. event() .. " - " .. event() end
  if r < 0.9 then return slot() .. " = gpu." .. pick({ "default_stream", "current_stream" }) .. "()" end
  return slot() .. " = " .. stream() .. "." .. pick({ "priority", "nonblocking", "id", "x" })
end }
-- The runtime
gen[#gen + 1] = { 5, function()
  local r = R()
  if r < 0.15 then return "gpu.synchronize()" end
  if r < 0.25 then return "gpu.sync_debug(" .. pick({ '"off"', '"warn"', '"error"', '"x"', "nil", "1" }) .. ")" end
  if r < 0.35 then return slot() .. " = gpu." .. pick({ "stats", "memory", "empty_cache", "reset_peak_memory", "device_count", "clock" }) .. "()" end
  if r < 0.45 then return "gpu.check_races(" .. pick({ "true", "false", "nil", "1" }) .. ")" end
  if r < 0.55 then return "gpu.seed(" .. num() .. ")" end
  if r < 0.7 then return "gpu.sleep(" .. pick({ "0", "0.5", "1", "3", "-1", "1e7 + 1", "(0/0)", '"x"', "nil" }) .. ", " .. opts("stream") .. ")" end
  if r < 0.8 then return slot() .. " = gpu.device_info(" .. num() .. ")" end
  if r < 0.9 then return "gpu.set_device(" .. num() .. ")" end
  return slot() .. " = gpu.isatty(" .. pick({ '"stdin"', '"stdout"', '"stderr"', '"x"', "1" }) .. ")"
end }
-- Tasks and coroutines
gen[#gen + 1] = { 6, function(d)
  local r = R()
  if r < 0.3 then return slot() .. " = gpu.task(" .. pick(FUNCS) .. (chance(0.7) and ", " .. args(R(1, 2)) or "") .. ")" end
  if r < 0.4 then return slot() .. " = gpu.task(function(...) " .. statement(d + 1) .. "; end)" end
  if r < 0.55 then return slot() .. " = gpu.await(" .. ref(AWAITABLE) .. ")" end
  if r < 0.65 then return slot() .. " = gpu.run(" .. pick({ "", "0", "0.01", "-1", "(0/0)", '"x"' }) .. ")" end
  if r < 0.8 then return slot() .. " = " .. task() .. "." .. pick({ "done", "failed", "state", "error", "id", "x" }) end
  return slot() .. " = " .. task() .. ":" .. pick({ "result", "cancel" }) .. "()"
end }
gen[#gen + 1] = { 3, function(d)
  local r = R()
  if r < 0.3 then return slot() .. " = coroutine.create(" .. pick(FUNCS) .. ")" end
  if r < 0.4 then return slot() .. " = coroutine.create(function(...) " .. statement(d + 1) .. "; coroutine.yield() end)" end
  if r < 0.8 then return "coroutine.resume(" .. ref(THREAD) .. (chance(0.7) and ", " .. args(R(1, 2)) or "") .. ")" end
  return "coroutine.close(" .. ref(THREAD) .. ")"
end }
-- Scopes: kept open in the pool, closed out of order, collected open
gen[#gen + 1] = { 4, function(d)
  local r = R()
  if r < 0.1 then return slot() .. " = gpu.nosync(" .. pick({ "", '"error"', '"warn"', '"off"', '"x"' }) .. ")" end
  if r < 0.4 then return slot() .. " = gpu.range(" .. pick(STRINGS) .. ")" end
  if r < 0.5 then return slot() .. " = gpu.using(" .. stream() .. ")" end
  local scope = pick({ "gpu.nosync()", 'gpu.nosync("warn")', "gpu.using(" .. stream() .. ")", 'gpu.range("r")' })
  return "do local _ <close> = " .. scope .. "; " .. statement(d + 1) .. " end"
end }
-- .npy files
gen[#gen + 1] = { 3, function()
  local r = R()
  if r < 0.35 then return tensor() .. ":save(" .. path(true) .. ", " .. opts("stream") .. ")" end
  if r < 0.75 then return slot() .. " = gpu.load(" .. path() .. ", " .. opts("device", "stream") .. ")" end
  return "F.write(" .. path(true) .. ", " .. npy_bytes() .. ")"
end }
-- Ranks (a job of one rank)
gen[#gen + 1] = { 3, function()
  local r = R()
  if r < 0.2 then return "gpu.all_reduce(" .. tensor() .. ", " .. opts("op", "stream", "out") .. ")" end
  if r < 0.3 then return "gpu." .. pick({ "broadcast", "reduce" }) .. "(" .. tensor() .. ", " .. opts("root", "op", "stream") .. ")" end
  if r < 0.45 then return "gpu." .. pick({ "all_gather", "reduce_scatter" }) .. "(" .. tensor() .. ", " .. tensor() .. ", " .. opts("op", "stream") .. ")" end
  if r < 0.6 then return "gpu." .. pick({ "send", "recv" }) .. "(" .. tensor() .. ", " .. pick({ "0", "1", "-1", "0.5", '"0"', "nil", "2^31" }) .. ")" end
  if r < 0.75 then return "gpu.group(" .. pick({ "F.sendrecv", "F.collective", "F.err", "F.yield", "F.noop", "5" }) .. ", " .. tensor() .. ", 0)" end
  if r < 0.85 then return "gpu.barrier()" end
  return "gpu.init_comm(" .. opts("timeout", "check") .. ")"
end }
-- Tracing
gen[#gen + 1] = { 2, function()
  local r = R()
  if r < 0.3 then return "gpu.trace.start(" .. opts("max_events") .. ")" end
  if r < 0.5 then return "gpu.trace.stop()" end
  if r < 0.6 then return slot() .. " = gpu.trace.active()" end
  if r < 0.75 then return slot() .. " = gpu.trace.events()" end
  return "gpu.trace." .. pick({ "json", "svg", "write" }) .. "(" .. path(true) .. ")"
end }
-- Run-time kernels and DLPack (the host backend refuses them)
gen[#gen + 1] = { 1, function()
  local r = R()
  local src = pick({ '"extern \\"C\\" __global__ void k(float *x, int n) {}"', '""', '"__global__ void ("', "5",
                     '".version 8.0\\n.target sm_90\\n.visible .entry k(.param .u64 p)\\n{ ret; }\\n"' })
  if r < 0.4 then return slot() .. " = gpu.compile(" .. src .. ", " .. opts("options", "name", "cache") .. ")" end
  if r < 0.8 then return slot() .. " = gpu.load_module(" .. (chance(0.5) and src or path()) .. ", " .. opts("declare") .. ")" end
  return slot() .. " = gpu.from_dlpack(" .. any() .. ")"
end }
-- Pipelines
gen[#gen + 1] = { 2, function()
  local fields = {}
  local function add(k, v) if chance(0.8) then fields[#fields + 1] = k .. " = " .. v end end
  add("batches", pick({ "1", "2", "3", "0", "-1", "1.5", '"2"' }))
  add("depth", pick({ "1", "2", "3", "0", "4" }))
  local spec = function() return "{shape = " .. shape() .. ", dtype = " .. dtype() .. "}" end
  if chance(0.8) then add("input", spec()) else add("inputs", "{" .. tensor() .. ", " .. tensor() .. "}") end
  add("output", spec())
  -- load ends the batches when batches is left out: only loads that end
  add("load", pick({ "F.fill", "F.load3", "F.load_yield", "F.err", "F.close", "5" }))
  add("compute", pick({ "F.compute", "F.err", "F.close", "F.noop", "F.yield", "F.big", "F.sync", "F.nosync_item" }))
  add("sink", pick({ "F.sink", "F.err", "F.close", "F.noop" }))
  add("timing", pick({ "true", "false" }))
  if chance(0.05) then add("bogus", "1") end
  local call = slot() .. " = pipeline.run{" .. table.concat(fields, ", ") .. "}"
  if chance(0.2) then return slot() .. " = gpu.task(function() " .. call .. "; end)" end
  return call
end }
-- The collector
gen[#gen + 1] = { 2, function()
  return "collectgarbage(" .. pick({ "", '"step"', '"incremental"', '"generational"', '"step", 100' }) .. ")"
end }

local total_weight = 0
for _, g in ipairs(gen) do total_weight = total_weight + g[1] end

-- One statement; depth > 0 inside another (a task or scope body).
function statement(depth)
  depth = depth or 0
  if depth > 1 then return "gpu.synchronize()" end
  local w = R() * total_weight
  for _, g in ipairs(gen) do
    w = w - g[1]
    if w <= 0 then return g[2](depth) end
  end
  return gen[#gen][2](depth)
end

-- ---- the end: drop everything and look for what is left --------------------

local function finish()
  local function drop() for i = 1, NSLOT do P[i] = nil end end
  drop()
  pcall(gpu.trace.stop)
  pcall(gpu.sync_debug, "off")
  -- a gpu.using scope never closed keeps its stream current (the script's
  -- choice, not a leak): close that stream
  local cur = gpu.current_stream()
  if cur ~= gpu.default_stream() then pcall(cur.close, cur) end
  -- tasks still queued hold what they use: run them out (a failing task
  -- raises from gpu.run; the others are still there for the next round)
  for _ = 1, 100 do
    local ok, left = pcall(gpu.run, 1)
    if ok and left == 0 then break end
  end
  drop()   -- what the tasks put there
  for _ = 1, 2 do
    collectgarbage()
    collectgarbage()
    -- in a task of its own: no gpu.nosync scope of the main chunk applies
    pcall(gpu.run, 10)
    local t = gpu.task(function() gpu.synchronize() end)
    pcall(gpu.run, 10)
    pcall(gpu.await, t)
  end
  collectgarbage()
  collectgarbage()
  local m, s = gpu.memory(), gpu.stats()
  local left = {}
  for _, k in ipairs({ "allocated", "pinned", "host" }) do
    if m[k] ~= 0 then left[#left + 1] = string.format("%s memory %d bytes", k, m[k]) end
  end
  for _, k in ipairs({ "streams", "events", "buffers" }) do
    if s[k] ~= 0 then left[#left + 1] = string.format("%d %s", s[k], k) end
  end
  if own_tmp then os.execute("rm -rf '" .. D .. "'") end
  if #left > 0 then
    io.stderr:write("fuzz: leak: left after everything was dropped, collected and synchronized: ",
                    table.concat(left, ", "), "\n")
    os.exit(3)
  end
end

-- ---- main ------------------------------------------------------------------------------

local replay = env("FUZZ_REPLAY")
if replay then
  local lines = {}
  for line in io.lines(replay) do
    if line ~= "" and not line:match("^%-%-") then lines[#lines + 1] = line end
  end
  local script = env("FUZZ_SCRIPT")
  if script then
    -- the same statements as a stand-alone script: gpulua script.lua
    local f = assert(io.open(script, "w"))
    f:write("-- ", #lines, " statements of the API fuzzer (tests/fuzz/api.lua), stand-alone: gpulua ",
            script, "\n")
    f:write('local gpu = require "gpu"\nlocal pipeline = require "gpu.pipeline"\n',
            'local D = os.tmpname()\nos.remove(D)\nos.execute("mkdir -p \'" .. D .. "\'")\n',
            SPECIAL and 'os.execute("mkfifo \'" .. D .. "/fifo\'")\n' or "",
            "local F = load([==[\n", F_SRC, "]==])(gpu, D)\nlocal P = {}\n")
    for _, l in ipairs(lines) do f:write("pcall(function() ", l, " end)\n") end
    f:close()
    if own_tmp then os.execute("rm -rf '" .. D .. "'") end
    os.exit(0)
  end
  for _, l in ipairs(lines) do exec(l) end
  finish()
  os.exit(0)
end

math.randomseed(SEED)
local log = env("FUZZ_LOG") and assert(io.open(env("FUZZ_LOG"), "w"))
if log then log:write("-- tests/fuzz/api.lua FUZZ_SEED=", SEED, "\n") end
local deadline = SECONDS and gpu.clock() + SECONDS
local n = 0
while (ITERS and n < ITERS) or (deadline and gpu.clock() < deadline) do
  n = n + 1
  local stmt = statement(0)
  if log then
    log:write(stmt, "\n")
    log:flush()
  end
  local ok, err = exec(stmt)
  if STATS then
    local key = stmt:match("gpu%.[%w_%.]+") or stmt:match(":([%w_]+)%(") or stmt:match("^[%w_%.]+") or "?"
    local e = STATS[key] or { 0, 0, {} }
    STATS[key] = e
    if ok then e[1] = e[1] + 1 else e[2] = e[2] + 1; local m = tostring(err):gsub("^fuzz:1: ", ""):sub(1, 60); e[3][m] = (e[3][m] or 0) + 1 end
  end
end
if STATS then
  local keys = {}
  for k in pairs(STATS) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local e = STATS[k]
    local top, tn = "", 0
    for m, c in pairs(e[3]) do if c > tn then top, tn = m, c end end
    io.stderr:write(string.format("%-28s ok %6d  raised %6d  (%s x%d)\n", k, e[1], e[2], top, tn))
  end
end
if log then log:close() end
finish()
io.stderr:write(string.format("fuzz: seed %d: %d statements, no crash, hang or leak\n", SEED, n))
os.exit(0)
