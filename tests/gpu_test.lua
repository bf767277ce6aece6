-- gpu.test itself: the leak check after each T.test.  A test that leaves
-- buffers, streams or events behind fails with a line naming it and what it
-- left; one that keeps them on purpose says {keeps = true}; a test that
-- releases what an earlier one kept, or leaves nothing, adds no line, so the
-- plan is the same as without the check.  Each case is a child gpu.test
-- script (on the device this suite runs on); its TAP output is read here.
local T = require "gpu.test"

-- Runs `code` (the body of a gpu.test script) in a child gpulua; its output
-- and whether it exited 0.
local function child(code)
  local path = T.tmpfile('local gpu = require "gpu"\nlocal T = require "gpu.test"\n' .. code)
  local out, ok = T.run("", path)
  os.remove(path)
  return out, ok
end

-- The child's result lines and its plan.
local function results(out)
  local lines, plan = {}, nil
  for line in out:gmatch("[^\n]+") do
    if line:match("^n?o?t? ?ok %d+") then lines[#lines + 1] = line end
    plan = plan or tonumber(line:match("^1%.%.(%d+)$"))
  end
  return lines, plan
end

local function has(out, text, name)
  if not T.ok(out:find(text, 1, true), name) then T.diag(out) end
end

T.test("a leak fails the test that made it, by name", function()
  local out, ok = child([[
local kept = {}
T.test("clean", function() local t <close> = gpu.ones({4}); T.ok(true, "one") end)
T.test("leaky", function()
  kept[1] = gpu.ones({3}); kept[2] = gpu.zeros({2}); kept[3] = gpu.stream()
  T.ok(true, "two")
end)
T.test("one event", function() kept[4] = gpu.event(); T.ok(true, "three") end)
T.test("after", function() kept = nil; T.ok(true, "four") end)
T.done()
]])
  T.is(ok, false, "the child exits non-zero")
  local lines, plan = results(out)
  T.is(lines[1], "ok 1 - one", "a test that leaves nothing: no extra line")
  T.is(lines[2], "ok 2 - two", "the leaky test's own result")
  T.is(lines[3], "not ok 3 - leak check: test 'leaky' left 2 buffers, 1 stream",
       "then a failed line: the test's name and what it left")
  T.is(lines[5], "not ok 5 - leak check: test 'one event' left 1 event", "one of a kind is singular")
  T.is(lines[6], "ok 6 - four", "a test that releases what others left: no line")
  T.is(plan, #lines, "the plan counts the leak lines")
  has(out, "# failed 2 of " .. #lines .. " tests", "two failures")
  has(out, "#   Failed test at ", "the failure names the file and line of the T.test call")
end)

T.test("{keeps = true}: a test keeps objects for the tests after it", function()
  local out, ok = child([[
local shared
T.plan(3)
T.test("setup", function() shared = { t = gpu.full({8}, 2), s = gpu.stream(), e = gpu.event() } T.ok(true, "kept") end,
       { keeps = true })
T.test("uses it", function() T.is(shared.t:sum():item(), 16.0, "sum") end)
T.test("closes it", function()
  shared.t:close(); shared.s:close(); shared = nil
  T.ok(true, "closed")
end)
T.done()
]])
  if not T.ok(ok, "the child exits 0") then T.diag(out) end
  local lines, plan = results(out)
  T.is(plan, 3 + T.LEAK_TESTS, "T.plan(n) still counts n and T.done's leak check")
  T.is(#lines, plan, "every planned result, no more")
  T.is(lines[1], "ok 1 - kept", "the keeping test passes")
end)

T.test("a test that raises still gets its leak check", function()
  local out, ok = child([[
local kept
T.test("raises", function() kept = gpu.ones({2}); error("boom") end)
kept = nil
T.done()
]])
  T.is(ok, false, "the child exits non-zero")
  local lines = results(out)
  T.is(lines[1], "not ok 1 - raises (raised an error)", "the error first")
  T.is(lines[2], "not ok 2 - leak check: test 'raises' left 1 buffer", "then what it left")
  has(out, "ok 3 - leak check: collectgarbage + synchronize", "T.done's check follows")
end)

T.done()
