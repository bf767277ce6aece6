-- gpu.test: a small TAP producer for gpulua's test scripts (after luv's
-- tests/tap.lua).  Each script asserts, groups assertions with T.test (each
-- followed by a leak check), and ends with T.done(), which runs the final
-- leak check, prints the plan and exits non-zero on any failure.
--
--   local gpu = require "gpu"
--   local T = require "gpu.test"
--   T.test("add", function()             -- an error inside fails the test, with traceback
--     local t <close> = gpu.ones({3})
--     T.is((t + 1):totable(), {2, 2, 2}, "ones + 1")
--   end)
--   T.done()
--
-- Tests: T.test(name, fn [, {keeps = true}]) (see the leak checks below).
-- Assertions: T.ok(cond, name)  T.is(got, want, name) (deep, NaN == NaN)
-- T.isnt(got, other, name)  T.near(got, want, tol | {rel=, abs=}, name)
-- T.raises(fn, pattern, name)  T.raises_at(fn, pattern, name) (message must
-- also start with fn's file:line)  T.skip(name, why)  T.diag(msg)  T.plan(n).
-- Patterns are Lua patterns, also tried as plain text; a list means any of.
-- Reference arithmetic: T.round_f32/f16/bf16(x)  T.wrap_int(x, bits, signed)
-- T.cast(x, dtype) (the cast rules of docs/lua-api.md)  T.flatten  T.map.
-- Child processes: T.gpulua (the binary running this test)  T.run(env, args
-- [, redirect]) --> output, exited 0  T.tmpfile(contents) --> path.
--
-- Leak checks.  After each T.test, garbage is collected, every stream is
-- synchronized and the live buffers, streams and events (gpu.stats()) are
-- compared with their counts before the test: more is a failed test line,
-- "leak check: test 'add' left 2 buffers, 1 stream" (nothing is printed when
-- none is left, so the plan is the same).  A test that keeps objects on
-- purpose for the tests after it says so: T.test(name, fn, {keeps = true}).
-- T.done checks once more that nothing at all is left: no buffers, streams,
-- events or memory (T.LEAK_TESTS results).  So keep tensors, streams and
-- events inside T.test functions, or close them: neither check can collect
-- what the main chunk still holds.

local T = {}

local out = io.stdout
local count, failures, planned, finished = 0, 0, nil, false
local SELF = debug.getinfo(1, "S").source

-- formatting ---------------------------------------------------------------

local function fmt_number(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  local s = string.format("%.15g", v)
  if tonumber(s) ~= v then s = string.format("%.17g", v) end
  if not s:find("[%.eni]") then s = s .. ".0" end   -- floats look like floats
  return s
end

local function fmt(v, depth)
  depth = depth or 0
  local tv = type(v)
  if tv == "number" then return fmt_number(v) end
  if tv == "string" then return string.format("%q", v) end
  if tv ~= "table" or depth > 3 then return tostring(v) end
  local parts, n = {}, #v
  for i = 1, math.min(n, 24) do parts[#parts + 1] = fmt(v[i], depth + 1) end
  if n > 24 then parts[#parts + 1] = "... (" .. n .. " items)" end
  local extra = 0
  for k, x in pairs(v) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then
      extra = extra + 1
      if extra <= 8 then parts[#parts + 1] = tostring(k) .. "=" .. fmt(x, depth + 1) end
    end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end
T.fmt = fmt

-- output -------------------------------------------------------------------

function T.diag(msg)
  for line in (tostring(msg) .. "\n"):gmatch("(.-)\n") do
    out:write("# ", line, "\n")
  end
  out:flush()
end

-- where the failing assertion was called from (first frame outside this file)
local function caller()
  for level = 3, 30 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.source ~= SELF and info.currentline and info.currentline > 0 then
      return info.short_src .. ":" .. info.currentline
    end
  end
  return "?"
end

local function report(pass, name, directive)
  count = count + 1
  name = tostring(name or ""):gsub("\n", " "):gsub("#", "\\#")
  local line = (pass and "ok " or "not ok ") .. count
  if name ~= "" then line = line .. " - " .. name end
  if directive then line = line .. " # " .. directive end
  out:write(line, "\n")
  if not pass then
    failures = failures + 1
    out:write("#   Failed test at ", caller(), "\n")
  end
  out:flush()
  return pass
end

-- assertions ----------------------------------------------------------------

-- n counts the script's own tests; T.done's leak check adds T.LEAK_TESTS more,
-- which the printed plan includes.
T.LEAK_TESTS = 7

function T.plan(n)
  planned = n + T.LEAK_TESTS
  out:write("1..", planned, "\n")
  out:flush()
end

function T.ok(cond, name)
  return report(cond and true or false, name)
end

-- deep equality; NaN equals NaN, 1 equals 1.0 (use T.is(math.type(x), ...) to
-- tell them apart).  Returns nil or a description of the first difference.
local function diff(got, exp, path)
  if type(got) == "table" and type(exp) == "table" then
    for k, e in pairs(exp) do
      local d = diff(got[k], e, path .. "[" .. fmt(k) .. "]")
      if d then return d end
    end
    for k, g in pairs(got) do
      if exp[k] == nil then
        return path .. "[" .. fmt(k) .. "]: got " .. fmt(g) .. ", expected nothing"
      end
    end
    return nil
  end
  if got == exp then return nil end
  if type(got) == "number" and type(exp) == "number" and got ~= got and exp ~= exp then
    return nil
  end
  return (path ~= "" and path .. ": " or "") .. "got " .. fmt(got) .. ", expected " .. fmt(exp)
end

function T.is(got, expected, name)
  local d = diff(got, expected, "")
  if d == nil then return report(true, name) end
  report(false, name)
  T.diag("  got:      " .. fmt(got))
  T.diag("  expected: " .. fmt(expected))
  if type(got) == "table" or type(expected) == "table" then T.diag("  first difference at " .. d) end
  return false
end

-- Tensors equal bit for bit as values: the same dtype and shape, and
-- element for element equal, NaN equal to NaN, -0 not equal to 0.  nil, or
-- the first difference.
function T.differ(got, want)
  if got.dtype ~= want.dtype then return "dtype " .. got.dtype .. " vs " .. want.dtype end
  local gs, ws = table.concat(got.shape, ","), table.concat(want.shape, ",")
  if gs ~= ws then return "shape {" .. gs .. "} vs {" .. ws .. "}" end
  local x, y = T.flatten(got:totable()), T.flatten(want:totable())
  for i = 1, #x do
    local u, v = x[i], y[i]
    local eq = u == v or (u ~= u and v ~= v)
    if eq and type(u) == "number" and u == 0 and 1 / u ~= 1 / v then eq = false end
    if not eq then return string.format("element %d: %s vs %s", i, fmt(u), fmt(v)) end
  end
  return nil
end

function T.same(got, want, name)
  local d = T.differ(got, want)
  if d == nil then return report(true, name) end
  report(false, name)
  T.diag("  " .. d)
  return false
end

function T.isnt(got, unexpected, name)
  if diff(got, unexpected, "") ~= nil then return report(true, name) end
  report(false, name)
  T.diag("  got: " .. fmt(got) .. " (expected anything else)")
  return false
end

-- tol: a number (relative and absolute) or {rel =, abs =}.  Passes when
-- |got - expected| <= max(abs, rel * |expected|); NaN matches NaN, infinities
-- must match exactly.  got/expected may be nested tables of numbers.
local function neardiff(got, exp, rel, abs, path)
  if type(exp) == "table" then
    if type(got) ~= "table" then return path .. ": got " .. fmt(got) .. ", expected a table" end
    if #got ~= #exp then return path .. ": got " .. #got .. " items, expected " .. #exp end
    for i = 1, #exp do
      local d = neardiff(got[i], exp[i], rel, abs, path .. "[" .. i .. "]")
      if d then return d end
    end
    return nil
  end
  if type(got) ~= "number" or type(exp) ~= "number" then
    return path .. ": got " .. fmt(got) .. ", expected " .. fmt(exp)
  end
  if got ~= got or exp ~= exp then
    if got ~= got and exp ~= exp then return nil end
  elseif got == exp then
    return nil
  elseif math.abs(exp) ~= math.huge and math.abs(got) ~= math.huge
      and math.abs(got - exp) <= math.max(abs, rel * math.abs(exp)) then
    return nil
  end
  return (path ~= "" and path .. ": " or "") .. "got " .. fmt(got) .. ", expected "
      .. fmt(exp) .. " (rel " .. fmt(rel) .. ", abs " .. fmt(abs) .. ")"
end

function T.near(got, expected, tol, name)
  local rel, abs
  if type(tol) == "table" then rel, abs = tol.rel or 0, tol.abs or 0
  else rel, abs = tol or 0, tol or 0 end
  local d = neardiff(got, expected, rel, abs, "")
  if d == nil then return report(true, name) end
  report(false, name)
  T.diag("  " .. d)
  return false
end

-- pattern: nil (any error), a string (matched as a Lua pattern, or failing
-- that as plain text), or a list of such strings (any one may match).
local function matches(msg, pattern)
  if pattern == nil then return true end
  if type(pattern) == "table" then
    for _, p in ipairs(pattern) do
      if matches(msg, p) then return true end
    end
    return false
  end
  local okp, found = pcall(string.find, msg, pattern)
  return (okp and found ~= nil) or msg:find(pattern, 1, true) ~= nil
end

local function check_raise(fn, pattern, name)
  local ok, err = pcall(fn)
  if ok then
    report(false, name)
    T.diag("  no error raised (expected " .. fmt(pattern) .. ")")
    return false, nil
  end
  local msg = tostring(err)
  if not matches(msg, pattern) then
    report(false, name)
    T.diag("  error:    " .. msg)
    T.diag("  expected: " .. fmt(pattern))
    return false, msg
  end
  return true, msg
end

-- Passes when fn() raises an error whose message matches pattern.
-- Returns the message (or nil when nothing was raised).
function T.raises(fn, pattern, name)
  local good, msg = check_raise(fn, pattern, name)
  if good then report(true, name) end
  return msg
end

-- As T.raises, and the message must start with "<fn's file>:<line>:" where
-- the line lies within fn's body: the error points at the script line that
-- made the bad call.
function T.raises_at(fn, pattern, name)
  local good, msg = check_raise(fn, pattern, name)
  if not good then return msg end
  local info = debug.getinfo(fn, "S")
  local src, line = msg:match("^(.-):(%d+): ")
  line = tonumber(line)
  if src == info.short_src and line and line >= info.linedefined
      and line <= info.lastlinedefined then
    report(true, name)
  else
    report(false, name)
    T.diag("  error:    " .. msg)
    T.diag(string.format("  expected it to start with %s:%d:", info.short_src, info.linedefined))
  end
  return msg
end

function T.skip(name, why)
  return report(true, name, "SKIP " .. tostring(why or ""))
end

-- per-test leak check ------------------------------------------------------

local LIVE = { { "buffers", "buffer" }, { "streams", "stream" }, { "events", "event" } }

-- The live counts once garbage is collected (twice: finalizers run by the
-- first may free more) and every stream is past its work (freed buffers are
-- swept then); nil while the gpu module is not loaded.
local function live_counts()
  local gpu = package.loaded.gpu
  if type(gpu) ~= "table" then return nil end
  collectgarbage(); collectgarbage()
  gpu.synchronize()
  local s = gpu.stats()
  local n = {}
  for _, l in ipairs(LIVE) do n[l[1]] = s[l[1]] end
  return n
end

-- Reports a failed test when test `name` left more live objects than
-- `before` counted; true when it left none.
local function leak_check_test(name, before)
  local okc, after = pcall(live_counts)
  if not okc then
    report(false, string.format("leak check: test '%s': collectgarbage + synchronize raised", name))
    T.diag(after)
    return false
  end
  if after == nil then return true end
  local left = {}
  for _, l in ipairs(LIVE) do
    local n = after[l[1]] - (before and before[l[1]] or 0)
    if n > 0 then left[#left + 1] = string.format("%d %s", n, n == 1 and l[2] or l[1]) end
  end
  if #left == 0 then return true end
  report(false, string.format("leak check: test '%s' left %s", name, table.concat(left, ", ")))
  T.diag("  (close them, or say T.test(name, fn, {keeps = true}) when later tests use them)")
  return false
end

-- Runs fn(); an error inside it is reported as a failed test with its
-- traceback.  Then the leak check above, unless opts.keeps: the test keeps
-- buffers, streams or events on purpose (for the tests after it).
function T.test(name, fn, opts)
  T.diag(name)
  local check = not (opts and opts.keeps)
  local before
  if check then
    local okc, n = pcall(live_counts)
    if not okc then
      report(false, string.format("leak check: test '%s': collectgarbage + synchronize raised before it", name))
      T.diag(n)
      check = false
    end
    before = n
  end
  local ok, err = xpcall(fn, debug.traceback)
  if not ok then
    report(false, name .. " (raised an error)")
    T.diag(err)
  end
  if check and not leak_check_test(name, before) then ok = false end
  return ok
end

-- final leak check and exit ------------------------------------------------

-- always reports exactly T.LEAK_TESTS results, so a plan can count them
local LEAKS = {
  { "memory", "allocated", "no device memory allocated" },
  { "memory", "pinned", "no pinned memory held" },
  { "memory", "host", "no pageable host memory held" },
  { "stats", "streams", "no live streams" },
  { "stats", "events", "no live events" },
  { "stats", "buffers", "no live buffers" },
}

local function leak_check(skip)
  local okg, gpu = pcall(require, "gpu")
  if skip or not okg then
    T.skip("leak check: collectgarbage + synchronize", skip or "no gpu module")
    for _, l in ipairs(LEAKS) do T.skip("leak check: " .. l[3], skip or "no gpu module") end
    return
  end
  local ok, err = pcall(function()
    collectgarbage(); collectgarbage(); gpu.synchronize()
  end)
  if not T.ok(ok, "leak check: collectgarbage + synchronize") then T.diag(err) end
  local okm, m = pcall(gpu.memory)
  local oks, s = pcall(gpu.stats)
  local got = { memory = okm and m or {}, stats = oks and s or {} }
  for _, l in ipairs(LEAKS) do T.is(got[l[1]][l[2]], 0, "leak check: " .. l[3]) end
end

-- opts.leak_check = false skips the check; opts.exit = false returns the
-- number of failures instead of exiting.
function T.done(opts)
  opts = opts or {}
  if finished then error("T.done called twice", 2) end
  finished = true
  local ok, err = pcall(leak_check, opts.leak_check == false and "leak_check = false" or nil)
  if not ok then report(false, "leak check raised"); T.diag(err) end
  if planned == nil then
    out:write("1..", count, "\n")
  elseif planned ~= count then
    failures = failures + 1
    T.diag(string.format("planned %d tests but ran %d", planned, count))
  end
  if failures > 0 then T.diag(string.format("failed %d of %d tests", failures, count)) end
  out:flush()
  if opts.exit == false then return failures end
  os.exit(failures == 0 and 0 or 1, true)
end

function T.failures() return failures end

-- How many times slower than usual this run may be: a test whose premise
-- rests on time (the work of a window finishing within a sleep) scales its
-- sleeps by it.  GPULUA_TEST_SLOWDOWN, set by tests/gpu_sanitize.sh, where
-- compute-sanitizer slows every launch; 1 otherwise.
T.slowdown = math.max(1, tonumber(os.getenv("GPULUA_TEST_SLOWDOWN")) or 1)

-- child processes ----------------------------------------------------------

-- The interpreter running this test: the lowest index of arg (its options,
-- such as --device, come between it and the script).
T.gpulua = "build/gpulua"
if arg then
  local i = -1
  while arg[i - 1] do i = i - 1 end
  T.gpulua = arg[i] or T.gpulua
end

-- Run `env gpulua args` through the shell; its output (stdout and stderr
-- unless redirect says otherwise) and whether it exited 0.
function T.run(env, args, redirect)
  local p = assert(io.popen(string.format("%s %s %s %s", env or "", T.gpulua, args, redirect or "2>&1")))
  local out = p:read("a")
  local ok = p:close()
  return out, ok == true
end

-- Run a shell command; its output (stdout only, unless cmd redirects) and
-- its exit status (128 + signal when a signal ended it).
function T.sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local _, how, code = p:close()
  return out, how == "exit" and code or 128 + code
end

-- The whole contents of a file, or nil when it cannot be opened.
function T.readfile(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- A new temporary file holding contents; its path.
function T.tmpfile(contents)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(contents)
  f:close()
  return name
end

-- independent reference arithmetic -----------------------------------------

-- Round x to a binary float with p significant bits, minimum normal exponent
-- emin and largest finite value maxv; nearest, ties to even; subnormals
-- gradual; overflow to inf.  Exact in double arithmetic for p <= 53.
local function round_binary(x, p, emin, maxv)
  if x ~= x or x == 0 or x == math.huge or x == -math.huge then return x + 0.0 end
  local a = math.abs(x)
  local e = math.floor(math.log(a, 2))
  while 2.0 ^ e > a do e = e - 1 end
  while 2.0 ^ (e + 1) <= a do e = e + 1 end
  local q = 2.0 ^ (math.max(e, emin) - (p - 1))
  local r = a / q
  local n = math.floor(r)
  local frac = r - n
  if frac > 0.5 or (frac == 0.5 and n % 2 == 1) then n = n + 1 end
  local v = n * q
  if v > maxv then v = math.huge end
  return x < 0 and -v or v
end

function T.round_f16(x)
  return round_binary(x, 11, -14, 65504.0)
end

function T.round_bf16(x)
  return round_binary(x, 8, -126, (2 - 2.0 ^ -7) * 2.0 ^ 127)
end

function T.round_f32(x)
  return round_binary(x, 24, -126, (2 - 2.0 ^ -23) * 2.0 ^ 127)
end

-- two's-complement wrap of integer x to `bits` bits
function T.wrap_int(x, bits, signed)
  x = math.tointeger(x) or error("wrap_int: not an integer: " .. tostring(x), 2)
  if bits >= 64 then return x end
  local v = x & ((1 << bits) - 1)
  if signed and v >= (1 << (bits - 1)) then v = v - (1 << bits) end
  return v
end

T.dtypes = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" }
T.float_dtypes = { "f32", "f64", "f16", "bf16" }
T.int_dtypes = { "i8", "u8", "i32", "i64" }
T.dtype_size = { f32 = 4, f64 = 8, f16 = 2, bf16 = 2, i8 = 1, u8 = 1, i32 = 4, i64 = 8, bool = 1 }

local INT = {
  i8 = { 8, true, -128, 127 }, u8 = { 8, false, 0, 255 },
  i32 = { 32, true, -2147483648, 2147483647 },
  i64 = { 64, true, math.mininteger, math.maxinteger },
}
local ROUND = { f32 = T.round_f32, f16 = T.round_f16, bf16 = T.round_bf16,
                f64 = function(x) return x + 0.0 end }

function T.is_float(dtype) return ROUND[dtype] ~= nil end
function T.is_int(dtype) return INT[dtype] ~= nil end
function T.int_range(dtype) return INT[dtype][3], INT[dtype][4] end

-- The value a Lua value becomes when stored in / cast to `dtype`, by the
-- rules of docs/lua-api.md ("dtype rules"): floats round to nearest even;
-- float -> integer truncates toward zero and saturates, NaN -> 0; integer -> integer wraps; -> bool is
-- "not zero"; bool -> number is 1/0.  bool results are Lua booleans.
function T.cast(x, dtype)
  if type(x) == "boolean" then x = x and 1 or 0 end
  if dtype == "bool" then return x ~= 0 end
  local round = ROUND[dtype]
  if round then return round(x + 0.0) end
  local bits, signed, lo, hi = table.unpack(INT[dtype])
  if math.type(x) == "integer" then return T.wrap_int(x, bits, signed) end
  if x ~= x then return 0 end
  if x >= hi + 1.0 then return hi end        -- hi + 1.0 is exact: 2^k
  if x <= lo + 0.0 then return lo end
  local t = math.tointeger(x >= 0 and math.floor(x) or math.ceil(x))
  return math.max(lo, math.min(hi, t))
end

-- flatten a nested table (as totable returns) into a list
function T.flatten(t, acc)
  acc = acc or {}
  if type(t) ~= "table" then acc[#acc + 1] = t; return acc end
  for i = 1, #t do T.flatten(t[i], acc) end
  return acc
end

-- apply f to every leaf of a nested table, returning a new nested table
function T.map(t, f)
  if type(t) ~= "table" then return f(t) end
  local r = {}
  for i = 1, #t do r[i] = T.map(t[i], f) end
  return r
end

return T
