-- Issue 35, items 6 and 10: the end of a run.  os.exit finishes the queued
-- work as the normal end does and reports a failure in it (under gpulua and
-- under stock lua5.4 with gpu.so); a failure left in queued work is shown
-- after the script's own error ("also: ..."); a script without GPU work
-- exits as under stock Lua; after a Ctrl-C the wait at exit says what it
-- waits for, as the REPL does.  Child processes run on the host backend;
-- `timeout` only guards against a hang of the test itself.
local T = require "gpu.test"

local BIN = T.gpulua
local BUILD = BIN:match("^(.*)/[^/]*$") or "."

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Runs `prog` on a script with the body: stdout, stderr, exit status, the
-- script's path (removed by then).
local function runscript(prog, body, env)
  local path = T.tmpfile(body)
  local errf = os.tmpname()
  local out, code = T.sh(string.format("%s timeout 60 %s %s 2>%s", env or "", prog, q(path), q(errf)))
  local err = T.readfile(errf) or ""
  os.remove(errf)
  os.remove(path)
  return out, err, code, path
end

local function gpulua(body, args) return runscript(q(BIN) .. " --device host " .. (args or ""), body) end

local function count(s, sub)
  local n, i = 0, 1
  while true do
    local a, b = s:find(sub, i, true)
    if not a then return n end
    n, i = n + 1, b + 1
  end
end

local function has(s, sub, name)
  if not T.ok(s:find(sub, 1, true) ~= nil, name) then
    T.diag("expected " .. string.format("%q", sub) .. " in:\n" .. s)
    return false
  end
  return true
end

-- an integer division by zero, queued at line 3; it fails on the device
local DIV = [[
local a = gpu.ones({4}, {dtype = "i32"})
local z = gpu.zeros({4}, {dtype = "i32"})
local c = a:div(z)
print("queued")
]]

-- ---- item 6: gpulua ----------------------------------------------------------

T.test("gpulua: os.exit reports a failure left in queued work", function()
  for _, case in ipairs {
    { "os.exit(0)", 1 }, { "os.exit()", 1 }, { "os.exit(true)", 1 }, { "os.exit(0, true)", 1 },
    { "os.exit(false)", 1 }, { "os.exit(3)", 3 }, { "os.exit(3, true)", 3 },
    { "gpu.task(function() os.exit(0) end)", 1 },
  } do
    local out, err, code, path = gpulua(DIV .. case[1] .. "\n")
    local ok = T.is(out, "queued\n", case[1] .. ": the script ran to its end")
    ok = has(err, "gpulua: " .. path .. ":3: 'div' failed: integer division by zero\n",
             case[1] .. ": the failure is reported with its op and line") and ok
    ok = T.is(count(err, "'div' failed"), 1, case[1] .. ": once") and ok
    ok = T.is(code, case[2], case[1] .. ": exit status " .. case[2]) and ok
    if not ok then T.diag(err) end
  end
end)

T.test("gpulua: os.exit waits for queued work that succeeds, and writes the trace", function()
  local trace = os.tmpname() .. ".json"
  local out, err, code = gpulua("local x = gpu.ones{4}\ngpu.sleep(200)\nprint((x + 1):sum():item())\n"
                                .. "gpu.sleep(100)\nlocal y = x * 2\nos.exit(0)\n", "--trace " .. q(trace))
  T.is({ out, err, code }, { "8.0\n", "", 0 }, "exit status 0, nothing on stderr")
  local text = T.readfile(trace)
  T.ok(text ~= nil and text:find("\"mul\"", 1, true) ~= nil, "the --trace file is written, with the last op")
  os.remove(trace)
end)

T.test("gpulua: a failure in queued work after the script's own error: 'also: ...'", function()
  local out, err, code, path = gpulua(DIV .. "error('mine')\n")
  T.is(out, "queued\n", "the script ran to its error")
  local mine = err:find("gpulua: " .. path .. ":5: mine", 1, true)
  local also = err:find("gpulua: also: " .. path .. ":3: 'div' failed: integer division by zero\n", 1, true)
  if not T.ok(mine and also and mine < also, "its own error first, then the queued failure after 'also: '") then
    T.diag(err)
  end
  T.is(code, 1, "exit status 1")
  -- a failure the script itself saw is not reported twice
  out, err, code = gpulua(DIV .. "gpu.synchronize()\n")
  T.is(count(err, "'div' failed"), 1, "raised by the script's own sync: reported once")
  T.ok(not err:find("also:", 1, true), "with no 'also:'")
  T.is(code, 1, "exit status 1")
end)

-- stock Lua's own behaviour, for scripts with no GPU work
local BODIES = {
  "os.exit(5)", "os.exit(true)", "os.exit(false)", "os.exit()", "print('x') os.exit(0)",
  "setmetatable({}, {__gc = function() print('collected') end}) os.exit(0)",
  "setmetatable({}, {__gc = function() print('collected') end}) os.exit(0, true)",
  "local x <close> = setmetatable({}, {__close = function() print('closed') end}) os.exit(2, true)",
  "local x <close> = setmetatable({}, {__close = function() print('closed') end}) os.exit(2)",
}
local EXPECT = { { "", 5 }, { "", 0 }, { "", 1 }, { "", 0 }, { "x\n", 0 }, { "", 0 },
                 { "collected\n", 0 }, { "closed\n", 2 }, { "", 2 } }

T.test("gpulua: os.exit in a script without GPU work is stock Lua's", function()
  local stock = select(2, T.sh("command -v lua5.4 >/dev/null")) == 0
  for i, body in ipairs(BODIES) do
    local out, err, code = gpulua(body .. "\n")
    local want = EXPECT[i]
    if stock then
      local o, e, c = runscript("lua5.4", body .. "\n")
      want = { o, c }
      T.is(e, "", body .. ": lua5.4 prints nothing on stderr (the test's premise)")
    end
    T.is({ out, err, code }, { want[1], "", want[2] }, body .. ": the same output and exit status")
  end
end)

-- ---- item 6: stock lua5.4 with gpu.so --------------------------------------------

local NO_LUA
if os.getenv("GPULUA_SANITIZE") == "1" then
  NO_LUA = "sanitizer build: its gpu.so needs the ASan runtime first in the process (tests/luamod.lua)"
elseif select(2, T.sh("command -v lua5.4 >/dev/null")) ~= 0 then
  NO_LUA = "lua5.4 is not installed"
elseif not exists(BUILD .. "/gpu.so") then
  NO_LUA = BUILD .. "/gpu.so was not built"
end

local function lua54(body)
  return runscript("lua5.4", body, string.format("LUA_CPATH=%s LUA_PATH=';;'", q(BUILD .. "/?.so")))
end

T.test("lua5.4 + gpu.so: os.exit reports a failure left in queued work", function()
  if NO_LUA then return T.skip("lua5.4 + gpu.so", NO_LUA) end
  for _, case in ipairs {
    { "os.exit(0)", 1 }, { "os.exit()", 1 }, { "os.exit(true)", 1 }, { "os.exit(true, true)", 1 },
    { "os.exit(false)", 1 }, { "os.exit(4)", 4 }, { "os.exit(4, true)", 4 },
  } do
    local out, err, code, path = lua54('local gpu = require "gpu"\n' .. DIV .. case[1] .. "\n")
    local ok = T.is(out, "queued\n", case[1] .. ": the script ran to its end")
    ok = has(err, "gpu: " .. path .. ":4: 'div' failed: integer division by zero\n",
             case[1] .. ": the failure is reported with its op and line") and ok
    ok = T.is(count(err, "'div' failed"), 1, case[1] .. ": once") and ok
    ok = T.is(code, case[2], case[1] .. ": exit status " .. case[2]) and ok
    if not ok then T.diag(err) end
  end
end)

T.test("lua5.4 + gpu.so: os.exit without GPU work is stock Lua's", function()
  if NO_LUA then return T.skip("lua5.4 + gpu.so", NO_LUA) end
  for _, body in ipairs(BODIES) do
    local o, e, c = runscript("lua5.4", body .. "\n")
    local out, err, code = lua54('local gpu = require "gpu"\n' .. body .. "\n")
    T.is({ out, err, code }, { o, e, c }, body .. ": as without gpu")
  end
  local out, err, code = lua54('local gpu = require "gpu"\nlocal x = gpu.ones{4} + 1\nos.exit(6)\n')
  T.is({ out, err, code }, { "", "", 6 }, "queued work that succeeds: nothing on stderr, the script's status")
end)

-- ---- item 10: Ctrl-C, then the wait at exit ----------------------------------------

local PTY = BUILD .. "/tests/tools/pty"
local NO_PTY
if not exists(PTY) then
  PTY, NO_PTY = nil, "no pty driver beside " .. BIN .. " (make tests builds it)"
else
  local probe = T.tmpfile("wait\n")
  local out = T.sh(string.format("%s -t 10 -- /bin/sh -c true < %s 2>&1", q(PTY), q(probe)))
  os.remove(probe)
  if out:find("pty: posix_openpt", 1, true) then
    PTY, NO_PTY = nil, "this machine has no pseudo-terminals: " .. out:gsub("%s+$", "")
  end
end

-- Runs `gpulua args` on a pseudo-terminal through the pty script lines; the
-- transcript (\r\n as \n), ending with pty's "pty: exit N" line.
local function session(lines, args)
  local script = T.tmpfile(table.concat(lines, "\n") .. "\n")
  local out = T.sh(string.format("%s -t 20 -- %s %s < %s 2>&1", q(PTY), q(BIN), args, q(script)))
  os.remove(script)
  return (out:gsub("\r\n", "\n"))
end

T.test("Ctrl-C in a script, then the wait at exit says what it waits for", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local script = T.tmpfile("gpu.sleep(8000)\nprint('wait' .. 'ing')\ngpu.synchronize()\n")
  local out = session({ "expect waiting", "sleep 300", "send \\x03", "expect interrupted",
                        "expect (Ctrl-C to stop waiting)", "sleep 200", "send \\x03", "wait" },
                      "--device host " .. q(script))
  has(out, "synchronize: interrupted", "the script's wait is interrupted")
  has(out, "gpulua: waiting for the queued work to finish (Ctrl-C to stop waiting)",
      "then a line says the program waits for the queued work")
  has(out, "gpulua: interrupted while finishing queued work", "a second Ctrl-C stops that wait")
  has(out, "pty: exit 1", "exit status 1")
  -- the same through os.exit
  local script2 = T.tmpfile("gpu.sleep(8000)\nprint('wait' .. 'ing')\npcall(gpu.synchronize)\nos.exit(0)\n")
  out = session({ "expect waiting", "sleep 300", "send \\x03", "expect (Ctrl-C to stop waiting)", "sleep 200",
                  "send \\x03", "wait" }, "--device host " .. q(script2))
  has(out, "gpulua: waiting for the queued work to finish (Ctrl-C to stop waiting)", "os.exit after Ctrl-C: the same line")
  has(out, "pty: exit 1", "exit status 1")
  os.remove(script)
  os.remove(script2)
end)

T.test("without a Ctrl-C the wait at the end of a script is silent", function()
  local out, err, code = gpulua("gpu.sleep(300)\nprint('end')\n")
  T.is({ out, err, code }, { "end\n", "", 0 }, "no line about waiting")
  out, err, code = gpulua("gpu.sleep(300)\nos.exit(0)\n")
  T.is({ out, err, code }, { "", "", 0 }, "nor with os.exit")
end)

T.done()
