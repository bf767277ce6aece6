-- gpu.so: the bindings as a Lua C module in the stock lua5.4 (Debian's
-- lua5.4 package): `LUA_CPATH=$BUILD/?.so lua5.4 -e 'local gpu = require "gpu"'`.
-- Tensors and ops, the embedded stdlib modules (gpu.test, gpu.pipeline,
-- gpu.trace) through the module, errors at script lines, a device that
-- cannot be opened, a clean exit with work still queued; and two lua_States
-- of one process requiring it (build/tests/luamod/twostates, linked with
-- liblua5.4.so).
--
-- Skips: without lua5.4 (the GPU machines have no Lua), and in the
-- sanitizer build, whose gpu.so needs the ASan runtime loaded first (the
-- uninstrumented lua5.4 does not have it); twostates, an ASan program
-- there, runs in both.
local gpu = require "gpu"
local T = require "gpu.test"

local BUILD = T.gpulua:match("^(.*)/[^/]*$") or "."
local MOD = BUILD .. "/gpu.so"

-- A shell command with stderr in its output; output and exit status.
local function sh(cmd) return T.sh(cmd .. " 2>&1") end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local SKIP
if os.getenv("GPULUA_SANITIZE") == "1" then
  SKIP = "sanitizer build: its gpu.so needs the ASan runtime first in the process, "
         .. "which the stock lua5.4 does not load (the normal suite runs this)"
elseif select(2, sh("command -v lua5.4 >/dev/null")) ~= 0 then
  SKIP = "lua5.4 is not installed (the lua5.4 package; the GPU machines have no Lua)"
end

-- Runs a script file under the stock lua5.4 with gpu.so on its cpath (and
-- nothing else, so only this build's gpu.so can be found).
local function lua54(script, env)
  local path = T.tmpfile(script)
  local out, code = sh(string.format("%s LUA_CPATH=%s LUA_PATH=';;' lua5.4 %s", env or "",
                                     q(BUILD .. "/?.so"), q(path)))
  os.remove(path)
  return out, code, path
end

local function test(name, fn)
  T.test(name, function()
    if SKIP then return T.skip(name, SKIP) end
    T.ok(exists(MOD), MOD .. " was built")
    fn()
  end)
end

test("require 'gpu' in lua5.4: tensors and ops", function()
  local out, code = lua54([[
local gpu = require "gpu"
assert(require "gpu" == gpu and package.loaded.gpu == gpu, "one module table")
print("global", rawget(_G, "gpu"))
local x = gpu.arange(1, 5, { dtype = "f32" })
local y = x * 2 + 1
print("values", table.concat(y:totable(), ","))
print("sum", y:sum():item())
local h = gpu.zeros({4}, { device = "pinned" })
h:copy(y)
gpu.synchronize()
print("pinned", h:get(4))
print("backend", gpu.backend)
]])
  T.is(code, 0, "exits 0")
  if not T.ok(out:find("values\t3.0,5.0,7.0,9.0\n", 1, true), "(arange(1, 5) * 2 + 1):totable()") then T.diag(out) end
  T.ok(out:find("sum\t24.0\n", 1, true), "sum")
  T.ok(out:find("pinned\t9.0\n", 1, true), "a copy to pinned memory")
  T.ok(out:find("global\tnil\n", 1, true), "the module sets no global `gpu`")
  T.ok(out:find("backend\t" .. gpu.backend .. "\n", 1, true), "the device chosen as gpulua's: " .. gpu.backend)
end)

test("the embedded stdlib modules through gpu.so", function()
  local out, code = lua54([[
local gpu = require "gpu"
local pipeline = require "gpu.pipeline"
print("pipeline source", debug.getinfo(pipeline.run, "S").source)
print("trace", type(require("gpu.trace")))
local sums = {}
pipeline.run {
  batches = 3, depth = 2, progress = false,
  input = { shape = { 64 }, dtype = "f32" },
  load = function(i, pin) pin:fill(i) end,
  compute = function(_, x) x:mul_(2) end,
  sink = function(i) sums[#sums + 1] = i end,
}
print("batches", table.concat(sums, ","))
local T = require "gpu.test"
T.test("inside lua5.4", function() T.is(gpu.ones({2}):sum():item(), 2.0, "gpu.test runs") end)
T.done()
]])
  T.is(code, 0, "exits 0 (gpu.test's T.done: no failure, no leak)")
  if not T.ok(out:find("pipeline source\t@stdlib/gpu/pipeline.lua\n", 1, true),
              "gpu.pipeline is the embedded module (not a file on package.path)") then T.diag(out) end
  T.ok(out:find("trace\ttable\n", 1, true), "gpu.trace")
  T.ok(out:find("batches\t1,2,3\n", 1, true), "pipeline.run ran every batch in order")
  T.ok(out:find("ok 1 - gpu.test runs\n", 1, true), "gpu.test's TAP from lua5.4")
  T.ok(out:find("\n1..8\n", 1, true), "its plan (1 test and the leak check's 7)")

  out, code = lua54([[
package.preload["gpu.test"] = function() return "the application's own" end
local gpu = require "gpu"
print((require "gpu.test"))
]])
  T.is(out, "the application's own\n", "a package.preload entry already there is kept")
  T.is(code, 0, "exits 0")
end)

test("errors carry the script line", function()
  local out, code, path = lua54([[
local gpu = require "gpu"
local ok, err = pcall(function()
  gpu.zeros({2}, { dtype = "f33" })
end)
print("pcall", err)
gpu.ones({2}):narrow(1, 0, 1)
]])
  T.ok(code ~= 0, "an uncaught error: lua5.4 exits non-zero")
  if not T.ok(out:find("pcall\t" .. path .. ":3: ", 1, true), "a caught error names its line") then T.diag(out) end
  T.ok(out:find("f33", 1, true), "and the bad dtype")
  T.ok(out:find(path .. ":6: bad argument #2 to 'narrow'", 1, true), "the uncaught one: line 6, the argument")
end)

test("a device that cannot be opened: require raises", function()
  local out, code = lua54([[
local ok, err = pcall(require, "gpu")
print(ok, err)
]], "GPULUA_DEVICE=nodevice")
  T.is(code, 0, "no crash")
  if not T.ok(out:find("^false\tgpu: "), "require 'gpu' raises 'gpu: ...'") then T.diag(out) end
end)

test("lua5.4 exits cleanly with work still queued", function()
  local queue = [[
local gpu = require "gpu"
local s = gpu.stream()
gpu.sleep(100, { stream = s })
local x = gpu.ones({ 1 << 20 }, { stream = s })
x:add_(1, { stream = s })
local p = gpu.zeros({ 1 << 20 }, { device = "pinned" })
p:copy(x, { stream = s })
]]
  local out, code = lua54(queue)
  T.is(code, 0, "end of script: exit status 0")
  T.is(out, "", "no output (the state closes, queued work finishes, gpu.so unloads)")
  out, code = lua54(queue .. "os.exit(3, true)\n")
  T.is(code, 3, "os.exit(3, true): closes the state, exit status 3")
  T.is(out, "", "no output")
  out, code = lua54(queue .. "os.exit(4)\n")
  T.is(code, 4, "os.exit(4) without closing the state: exit status 4")
  T.is(out, "", "no output")
end)

T.test("two lua_States of one process each require gpu.so", function()
  local prog = BUILD .. "/tests/luamod/twostates"
  if not exists(prog) then
    return T.skip("twostates", "not built: no liblua5.4.so at build time")
  end
  local out, code = sh(q(prog) .. " " .. q(BUILD .. "/?.so"))
  if out:find("liblua5.4.so.0: cannot open", 1, true) then
    return T.skip("twostates", "no liblua5.4.so.0 on this machine (the GPU machines have no Lua)")
  end
  T.is(code, 0, "exit status 0")
  if not T.ok(out:find("twostates: all ok\n", 1, true), "every step passes") then T.diag(out) end
  T.ok(not out:find("not ok", 1, true), "no step failed")
end)

test("lua5.4 -E: gpu.so ignores gpulua's GPULUA_* settings too", function()
  local path = T.tmpfile('package.cpath = ' .. string.format("%q", BUILD .. "/?.so") ..
                         ' local gpu = require "gpu" print("backend", gpu.backend)')
  local out, code = sh("GPULUA_DEVICE=bogus lua5.4 " .. q(path))
  T.ok(code ~= 0 and out:find("GPULUA_DEVICE='bogus'", 1, true), "without -E the setting is read: " .. out)
  out, code = sh("GPULUA_DEVICE=bogus lua5.4 -E " .. q(path))
  T.is(code, 0, "with -E it is ignored: " .. out)
  T.ok(out:find("backend\t", 1, true), "... and the module opens")
  os.remove(path)
end)

T.done()
