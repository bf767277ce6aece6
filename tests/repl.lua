-- The REPL: typed on a pseudo-terminal (tests/tools/pty: prompts, results,
-- continuation lines, errors, tensors, completion, history, Ctrl-C at the
-- prompt, in Lua code and in waits for the device, Ctrl-D), and driven
-- through pipes off a terminal (`gpulua -i < input`).
local gpu = require "gpu"
local T = require "gpu.test"

local BIN = T.gpulua
local DIR = BIN:match("^(.*)/[^/]*$")
local PTY = DIR and DIR .. "/tests/tools/pty"
local f = PTY and io.open(PTY)
if f then f:close() else PTY = nil end
local NO_PTY = "no pty driver beside " .. BIN .. " (make tests builds it)"
-- A machine without pseudo-terminals (a container with no /dev/pts) skips
-- the terminal sessions, saying why; any other failure of the driver fails.
if PTY then
  local probe = T.tmpfile("wait\n")
  local h = io.popen(string.format("%q -t 10 -- /bin/sh -c true < %q 2>&1", PTY, probe))
  local out = h:read("a")
  h:close()
  os.remove(probe)
  if out:find("pty: posix_openpt", 1, true) then
    PTY, NO_PTY = nil, "this machine has no pseudo-terminals: " .. out:gsub("%s+$", "")
  end
end

local version = T.run("", "-v")
local LIBEDIT = version:find("line editing: libedit", 1, true) ~= nil
local NO_EDIT = "gpulua was built without libedit (" .. version:gsub("%s+$", "") .. ")"

local HOST = "gpu[host]> "
-- A fresh prompt: after a newline (a redrawn line starts with \r and an erase)
local FRESH = "\n" .. HOST

-- pty script text for a string: C escapes for what is not printable
local function esc(s)
  return (s:gsub("[%c\\]", function(c)
    if c == "\\" then return "\\\\" end
    return string.format("\\x%02x", c:byte())
  end))
end

-- Run gpulua on a pseudo-terminal through the steps ({"send", text},
-- {"expect", text}, {"sleep", ms}, {"wait"}); returns the transcript (\r\n
-- as \n) and whether every step passed and gpulua exited 0.
local function session(steps, opts)
  opts = opts or {}
  local lines = {}
  for _, st in ipairs(steps) do
    local arg = st[2] and tostring(st[2])
    -- the terminal writes a newline as \r\n
    if arg and st[1] == "expect" then arg = arg:gsub("\n", "\r\n") end
    lines[#lines + 1] = st[1] .. (arg and " " .. esc(arg) or "")
  end
  local script = T.tmpfile(table.concat(lines, "\n") .. "\n")
  local cmd = string.format("%s -t 20 -e GPULUA_HISTORY=%s -- %s %s < %s 2>&1", PTY,
                            opts.history or "0", BIN, opts.args or "--device host", script)
  local p = assert(io.popen(cmd))
  local out = p:read("a"):gsub("\r\n", "\n")
  local ok = p:close()
  os.remove(script)
  return out, ok == true
end

-- typed at the prompt: once libedit reads the terminal (else, while the
-- terminal is still in line mode, its echo and Ctrl-D would come from it)
local function send(s) return { LIBEDIT and "type" or "send", s } end
-- sent while a statement runs (Ctrl-C)
local function key(s) return { "send", s } end
local function expect(s) return { "expect", s } end
local function prompt() return { "expect", FRESH } end

-- assert that the transcript has s, showing it when it does not
local function has(out, s, name)
  local ok = out:find(s, 1, true) ~= nil
  if not T.ok(ok, name) then T.diag("expected " .. string.format("%q", s) .. " in:\n" .. out) end
  return ok
end

T.test("prompt, expressions, several results, statements", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local out, ok = session {
    prompt(),
    send "1 + 1\n", expect "\n2", prompt(),
    send "1, 'two', nil\n", expect "1\ttwo\tnil", prompt(),
    send "x = 6 * 7\n", prompt(),
    send "x\n", expect "42", prompt(),
    send "=x + 1\n", expect "43", prompt(),
    send "\4", { "wait" },
  }
  if not T.ok(ok, "the session ran and exited 0") then T.diag(out) end
  has(out, HOST, "the prompt names the device: " .. HOST)
  has(out, "\n2\n", "1 + 1 prints 2")
  has(out, "1\ttwo\tnil", "several results print tab-separated")
  T.ok(out:find("x = 6 * 7\n" .. HOST, 1, true), "an assignment prints nothing (the next prompt follows its echo)")
  has(out, "pty: exit 0", "Ctrl-D exits with status 0")
end)

T.test("continuation lines, syntax and runtime errors", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local out, ok = session {
    prompt(),
    send "for i = 1, 3 do\n", expect "...> ",
    send "io.write('n', i, ' ')\n", expect "...> ",
    send "end print()\n", expect "n1 n2 n3", prompt(),
    send "function sq(x)\n", expect "...> ", send "return x * x end\n", prompt(),
    send "sq(12)\n", expect "144", prompt(),
    send "x = = 1\n", expect "unexpected symbol", prompt(),
    send "print('still' .. ' here')\n", expect "still here", prompt(),
    send "error('bo' .. 'om')\n", expect "traceback", prompt(),
    send "print('goes' .. ' on')\n", expect "goes on", prompt(),
    send "local t = {\n", expect "...> ", send "\4", expect "near <eof>", prompt(),
    send "\4", { "wait" },
  }
  if not T.ok(ok, "the session ran and exited 0") then T.diag(out) end
  has(out, "      ...> ", "the continuation prompt lines up under " .. HOST)
  has(out, "n1 n2 n3", "a statement over three lines runs")
  has(out, "144", "a function defined over two lines")
  has(out, "stdin:1: unexpected symbol near '='", "a syntax error prints the parser's message")
  has(out, "still here", "the session goes on after a syntax error")
  has(out, "stdin:1: boom\nstack traceback:", "a runtime error prints with its traceback")
  has(out, "goes on", "the session goes on after a runtime error")
  has(out, "stdin:1: unexpected symbol near <eof>", "Ctrl-D inside a statement reports it unfinished")
end)

T.test("tensors show shape, dtype, device and values", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local out, ok = session {
    prompt(),
    send "gpu.arange(6, {dtype = 'i32'}):view{2, 3}\n", expect "{3, 4, 5}}", prompt(),
    send "gpu.ones{3}\n", expect "{1, 1, 1}", prompt(),
    send "s0 = gpu.stats().syncs; big = gpu.arange(1000 * 1000, {dtype = 'i32'}):view{1000, 1000}\n", prompt(),
    send "big\n", expect "999999}}", prompt(),
    send "print('syncs ' .. gpu.stats().syncs - s0)\n", expect "syncs ", prompt(),
    send "\4", { "wait" },
  }
  if not T.ok(ok, "the session ran and exited 0") then T.diag(out) end
  has(out, "gpu.Tensor(i32, {2,3}, device)\n{{0, 1, 2},\n {3, 4, 5}}", "a matrix prints a row per line")
  has(out, "gpu.Tensor(f32, {3}, device) {1, 1, 1}", "a vector prints on one line")
  has(out, "gpu.Tensor(i32, {1000,1000}, device)\n{{     0,      1,      2, ...,    997,    998,    999},",
      "a big tensor shows the first and last values of each dim")
  has(out, " ...,\n {997000,", "... and elides the rows between")
  local syncs = tonumber(out:match("syncs (%d+)"))
  T.is(syncs, 4, "showing it read its four corners: four counted syncs")
  T.ok(not out:find("waits for the device", 1, true), "printing a result does not warn of its syncs")
end)

T.test("tab completion of globals, fields and methods", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  if not LIBEDIT then return T.skip("completion", NO_EDIT) end
  local out, ok = session {
    prompt(),
    send "type(gpu.synchro\t)\n", expect "function", prompt(),
    send "gpu.s\t\t", expect "gpu.synchronize", { "sleep", 100 }, send "\3", prompt(),
    send "string.for\t('%d', 7)\n", expect "\n7", prompt(),
    send "type(gpu.trace.sta\t)\n", expect "function", prompt(),
    send "t = gpu.ones{2, 3}\n", prompt(),
    send "t:num\t()\n", expect "\n6", prompt(),
    -- a prefix: past 100 candidates libedit asks before listing them all
    send "t:co\t\t", expect "t:contiguous", { "sleep", 100 }, send "\3", prompt(),
    send "s = gpu.stream()\n", prompt(),
    send "s:sync\t() print('synced' .. '!')\n", expect "synced!", prompt(),
    send "pri\t('bare' .. 'word')\n", expect "bareword", prompt(),
    send "probe = setmetatable({}, {__index = function() touched = true end})\n", prompt(),
    send "probe.x\t\t", { "sleep", 200 }, send "\3", prompt(),
    send "print('touched ' .. tostring(touched))\n", expect "touched ", prompt(),
    send "\4", { "wait" },
  }
  if not T.ok(ok, "the session ran and exited 0") then T.diag(out) end
  has(out, "function", "gpu.synchro<TAB> completes to gpu.synchronize")
  has(out, "gpu.stream", "a second TAB lists the candidates: gpu.stream")
  has(out, "gpu.sleep", "... gpu.sleep")
  has(out, "\n7\n", "string.for<TAB> completes a library field")
  has(out, "\n6\n", "t:num<TAB> completes a tensor method (numel)")
  has(out, "t:copy", "t:co<TAB><TAB> lists tensor methods")
  has(out, "synced!", "s:sync<TAB> completes a stream method")
  has(out, "bareword", "a bare word completes a global (print)")
  has(out, "touched nil", "completion never calls an __index function")
end)

T.test("Ctrl-C: at the prompt, in Lua code, in waits for the device", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local out, ok = session {
    prompt(),
    send "abc def", { "sleep", 100 }, send "\3", prompt(),
    send "for i = 1, 2 do\n", expect "...> ", send "\3", prompt(),
    send "print('fresh' .. ' statement')\n", expect "fresh statement", prompt(),
    send "print('loop' .. 'ing'); while true do end\n", expect "looping", { "sleep", 200 }, key "\3",
    expect "interrupted!", prompt(),
    -- 'wait' .. 'ing' shows as "waiting" only once it runs, not in the echo
    send "s = gpu.stream(); gpu.sleep(3000, {stream = s}); print('wait' .. 'ing'); s:synchronize()\n",
    expect "waiting", { "sleep", 300 }, key "\3", expect "interrupted", prompt(),
    send "print('still ' .. tostring(s:query()))\n", expect "still ", prompt(),
    send "x = gpu.ones{1}; gpu.sleep(3000); print('read' .. 'ing'); x:item()\n",
    expect "reading", { "sleep", 300 }, key "\3", expect "interrupted", prompt(),
    send "gpu.sleep(3000, {stream = s}); gpu.task(function() gpu.await(s) end); print('task' .. 'ing')\n",
    expect "tasking", { "sleep", 300 }, key "\3", expect "interrupted", prompt(),
    send "print('after' .. ' interrupts')\n", expect "after interrupts", prompt(),
    send "\4", { "wait" },
  }
  if not T.ok(ok, "the session ran and exited 0") then T.diag(out) end
  has(out, "fresh statement", "Ctrl-C at the prompt drops the line (and a continued statement)")
  has(out, "interrupted!\nstack traceback:", "Ctrl-C interrupts a Lua loop")
  has(out, "synchronize: interrupted", "Ctrl-C interrupts s:synchronize() waiting for a long op")
  has(out, "still false", "the queued op runs on after the interrupt")
  has(out, "item: interrupted", "Ctrl-C interrupts a device read (t:item())")
  -- the REPL runs the tasks through gpulua_poll, which the traceback names
  T.ok(out:find("tasking\n[^\n]*interrupted", 1) and out:find("in function 'gpulua_poll'", 1, true),
       "Ctrl-C interrupts the task loop waiting for the device")
  has(out, "(the tasks stay queued; gpu.run() waits for them)", "... leaving the tasks queued")
  has(out, "after interrupts", "the session goes on")
end)

T.test("after an interrupt the device context is consistent", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local out, ok = session {
    prompt(),
    send "s = gpu.stream(); t = gpu.zeros{4}; gpu.sleep(1500, {stream = s}); t:fill(7, {stream = s}); print('wait' .. 'ing'); s:synchronize()\n",
    expect "waiting", { "sleep", 200 }, key "\3", expect "interrupted", prompt(),
    send "gpu.synchronize(); print('sum ' .. t:sum():item())\n", expect "sum ", prompt(),
    send "\4", { "wait" },
  }
  if not T.ok(ok, "the session ran and exited 0") then T.diag(out) end
  has(out, "sum 28", "the queued work finished normally and a later synchronize works")
end)

T.test("history is kept in GPULUA_HISTORY and recalled", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  if not LIBEDIT then return T.skip("history", NO_EDIT) end
  local hist = os.tmpname()
  os.remove(hist)
  local out, ok = session({
    prompt(),
    send "hist_value = 12345\n", prompt(),
    send "for i = 1, 2 do\n", expect "...> ", send "io.write('m', i)\n", expect "...> ", send "end print()\n",
    expect "m1m2", prompt(),
    send "\4", { "wait" },
  }, { history = hist })
  T.ok(ok, "the first session ran and exited 0")
  local fh = io.open(hist)
  local text = fh and fh:read("a") or ""
  if fh then fh:close() end
  T.ok(text:find("hist_value", 1, true), "the history file was written")
  T.ok(not text:find("\nend\n", 1, true), "a multi-line statement is one entry")
  out, ok = session({
    prompt(),
    send "\27[A\27[A\n", prompt(),
    send "print('recalled ' .. hist_value)\n", expect "recalled ", prompt(),
    send "\4", { "wait" },
  }, { history = hist })
  T.ok(ok, "the second session ran and exited 0")
  has(out, "recalled 12345", "up-arrow recalls statements of the last session")
  os.remove(hist)
  out, ok = session({
    prompt(), send "print('no' .. ' history')\n", expect "no history", prompt(), send "\4", { "wait" },
  }, { history = "/nonexistent-dir/gpulua_history" })
  T.ok(ok and out:find("no history", 1, true), "an unwritable history file is no error")
end)

T.test("a script interrupted in a wait for the device", function()
  if not PTY then return T.skip("pty session", NO_PTY) end
  local script = T.tmpfile("local s = gpu.stream()\ngpu.sleep(3000, {stream = s})\n"
                           .. "print('wait' .. 'ing')\ns:synchronize()\nprint('not reached')\n")
  local out, ok = session({
    expect "waiting", { "sleep", 300 }, key "\3", { "wait" },
  }, { args = "--device host " .. script })
  T.ok(not ok, "the script fails")
  has(out, script:match("[^/]*$") .. ":4: synchronize: interrupted", "with 'interrupted' at the line of the wait")
  T.ok(not out:find("not reached", 1, true), "and stops there")
  has(out, "pty: exit 1", "exit status 1")
  os.remove(script)
end)

T.test("off a terminal: statements from stdin, results to stdout", function()
  local input = T.tmpfile("1 + 1\nx = 5\nx * 2, 'b'\nfor i = 1, 2 do\n  io.write(i, ';')\nend\n"
                          .. "x = = 2\nerror('oops')\ngpu.ones{2}\nprint('end')\n")
  local out, ok = T.run("", "--device host -i < " .. input, "2>/dev/null")
  T.ok(ok, "exit status 0 at the end of input")
  T.ok(not out:find(HOST, 1, true), "no prompts")
  T.ok(out:find("\n2\n10\tb\n1;2;", 1, true), "each result printed as its statement ends: " .. out)
  T.ok(out:find("gpu.Tensor(f32, {2}, device) {1, 1}\nend\n", 1, true), "the session went on after errors")
  local err = T.run("", "--device host -i < " .. input, "2>&1 >/dev/null")
  T.ok(err:find("stdin:1: unexpected symbol near '='", 1, true), "a syntax error goes to stderr")
  T.ok(err:find("stdin:1: oops\nstack traceback:", 1, true), "a runtime error goes to stderr with its traceback")
  os.remove(input)
  local script = T.tmpfile("print('as' .. ' a script')\n")
  out, ok = T.run("", "--device host < " .. script)
  T.ok(ok and out:find("as a script", 1, true), "gpulua < file without -i still runs it as a script")
  out, ok = T.run("", "--device host - < " .. script)
  T.ok(ok and out:find("as a script", 1, true), "... as does gpulua - < file")
  os.remove(script)
end)

T.test("tensor format through print in scripts", function()
  T.is(tostring(gpu.tensor({{1, 2}, {3, 4}}, {dtype = "i32"})), "gpu.Tensor(i32, {2,2}, device)\n{{1, 2},\n {3, 4}}",
       "a matrix")
  T.is(tostring(gpu.tensor({1, 20, 300}, {dtype = "i32"})), "gpu.Tensor(i32, {3}, device) {  1,  20, 300}",
       "a vector, aligned")
  T.is(tostring(gpu.tensor(2.5)), "gpu.Tensor(f32, {}, device) 2.5", "a scalar")
  T.is(tostring(gpu.arange(200, {dtype = "i32"})), "gpu.Tensor(i32, {200}, device) {  0,   1,   2, ..., 197, 198, 199}",
       "a long vector is elided")
  T.is(tostring(gpu.arange(8, {dtype = "i32"}):view{2, 2, 2}),
       "gpu.Tensor(i32, {2,2,2}, device)\n{{{0, 1},\n  {2, 3}},\n\n {{4, 5},\n  {6, 7}}}", "3 dims: blank lines between matrices")
  T.is(tostring(gpu.tensor({true, false}, {dtype = "bool"})), "gpu.Tensor(bool, {2}, device) { true, false}", "booleans")
  local t = gpu.arange(30, {dtype = "i32"}):view{5, 6}:narrow(2, 2, 3)
  T.is(tostring(t), "gpu.Tensor(i32, {5,3}, device)\n{{ 1,  2,  3},\n { 7,  8,  9},\n {13, 14, 15},\n {19, 20, 21},\n {25, 26, 27}}",
       "a strided view shows its own elements")
  local big = gpu.arange(2000, {dtype = "i32"}):view{100, 20}:narrow(2, 5, 10)
  local s = tostring(big)
  T.ok(s:find("{{   4,    5,    6, ...,   11,   12,   13},", 1, true)
       and s:find("{1984, 1985, 1986, ..., 1991, 1992, 1993}}", 1, true), "an elided strided view: " .. s)
  t:close()
  T.is(tostring(t), "gpu.Tensor (closed)", "a closed tensor")
end)

T.done()
