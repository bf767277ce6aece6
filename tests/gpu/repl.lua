-- The REPL on the cuda backend, typed on a pseudo-terminal (tests/tools/pty):
-- Ctrl-C interrupts waits for the GPU (stream and event synchronize, a
-- device read, the task loop), the queued work runs on, and the session
-- goes on.  tests/repl.lua covers the rest of the REPL on the host backend;
-- this file runs under make test-gpu and skips elsewhere.
local gpu = require "gpu"
local T = require "gpu.test"

local BIN = T.gpulua
local PTY = (BIN:match("^(.*)/[^/]*$") or ".") .. "/tests/tools/pty"

T.test("Ctrl-C in waits for the GPU, in the REPL", function()
  if gpu.backend ~= "cuda" then
    return T.skip("cuda REPL session", "the cuda backend is not in use (" .. gpu.backend .. ")")
  end
  local f = io.open(PTY)
  if not f then return T.ok(false, PTY .. " was built (make tests)") end
  f:close()
  local P = "gpu[cuda:0]> "   -- the session runs --device cuda: device 0
  local script = T.tmpfile(table.concat({
    "expect " .. P,
    -- 'wait' .. 'ing' shows as "waiting" only once it runs, not in the echo
    "type s = gpu.stream(); gpu.sleep(8000, {stream = s}); print('wait' .. 'ing'); s:synchronize()\\n",
    "expect waiting", "sleep 400", "send \\x03", "expect interrupted", "expect " .. P,
    "type print('still', s:query())\\n", "expect still", "expect " .. P,
    "type e = s:record(); print('ev' .. 'ent'); e:synchronize()\\n",
    "expect event", "sleep 300", "send \\x03", "expect interrupted", "expect " .. P,
    "type x = gpu.ones{1}; gpu.sleep(5000); print('read' .. 'ing'); x:item()\\n",
    "expect reading", "sleep 300", "send \\x03", "expect interrupted", "expect " .. P,
    "type gpu.sleep(5000, {stream = s}); gpu.task(function() gpu.await(s) end); print('task' .. 'ing')\\n",
    "expect tasking", "sleep 300", "send \\x03", "expect interrupted", "expect " .. P,
    "type gpu.synchronize(); print('syn' .. 'ced', s:query())\\n", "expect synced", "expect " .. P,
    "send \\x04", "wait", "",
  }, "\n"))
  local h = io.popen(string.format("GPULUA_HISTORY=0 %q -t 40 -- %q --device cuda < %q 2>&1", PTY, BIN, script))
  local out = h:read("a"):gsub("\r\n", "\n")
  h:close()
  os.remove(script)
  local function has(s, what)
    if not T.ok(out:find(s, 1, true), what) then T.diag("expected " .. string.format("%q", s) .. " in:\n" .. out) end
  end
  has("synchronize: interrupted\nstack traceback:\n\t[C]: in method 'synchronize'",
      "Ctrl-C interrupts s:synchronize() waiting for an 8 s op")
  has("still\tfalse", "the op runs on after the interrupt")
  has("event\n", "an event wait starts")
  T.ok(select(2, out:gsub("synchronize: interrupted", "")) == 2, "... and Ctrl-C interrupts it too")
  has("item: interrupted", "Ctrl-C interrupts a device read (t:item())")
  has("(the tasks stay queued; gpu.run() waits for them)", "Ctrl-C interrupts the task loop waiting for the GPU")
  has("synced\ttrue", "gpu.synchronize() afterwards finishes the queued work")
  has("pty: exit 0", "Ctrl-D ends the session with status 0")
end)

T.done()
