-- tests/gpu_sanitize.sh (make test-gpu-sanitize) without a GPU: a stand-in
-- SANITIZER runs the last two words it is given (gpulua and the test file)
-- on the host backend and prints a summary line, so the script's loop,
-- report lines and exit status are checked wherever the suite runs.
local T = require "gpu.test"

local FAKE = [[
#!/bin/bash
# stand-in for compute-sanitizer: runs its arguments' last two words
args=("$@"); n=${#args[@]}
GPULUA_DEVICE=host "${args[n-2]}" "${args[n-1]}"; rc=$?
echo "========= ERROR SUMMARY: 0 errors (${args[1]})"
[ $rc -eq 0 ] || exit 97
]]

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs the script over `memcheck` and `race` (lists of files); its output
-- and exit status.
local function sanitize(fake, memcheck, race)
  return T.sh(string.format("SANITIZER=%s GPULUA=%s SANITIZE_MEMCHECK=%s SANITIZE_RACE=%s bash tests/gpu_sanitize.sh 2>&1",
                            q("bash " .. fake), q(T.gpulua), q(table.concat(memcheck, " ")),
                            q(table.concat(race, " "))))
end

T.test("one line per file and tool; a failing run shows its output and fails the script", function()
  local fake = T.tmpfile(FAKE)
  local pass = T.tmpfile('local T = require "gpu.test"\nT.test("p", function() T.ok(true, "fine") end)\nT.done()\n')
  local fail = T.tmpfile('local T = require "gpu.test"\nT.test("f", function() T.ok(false, "broken") end)\nT.done()\n')

  local out, status = sanitize(fake, { pass, fail }, { pass })
  T.is(status, 1, "exit status 1: a run failed")
  local lines = {}
  for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
  local function row(tool, f, rc, failed)
    return string.format("%-10s %-28s rc=%-3s ========= ERROR SUMMARY: 0 errors (%s); %d failed tests",
                         tool, f, rc, tool, failed)
  end
  T.is(lines[1], row("memcheck", pass, 0, 0), "memcheck on the first file: passes")
  T.is(lines[2], row("memcheck", fail, 97, 1), "then the failing file: its status, its failures")
  T.is(lines[3], "# f", "its output follows, ok lines left out")
  T.is(lines[4], "not ok 1 - broken", "the failed result")
  T.ok(not out:find("\nok ", 1, true), "no ok line is shown")
  T.is(lines[#lines - 1], row("racecheck", pass, 0, 0), "racecheck on the race list")
  T.is(lines[#lines], row("synccheck", pass, 0, 0), "then synccheck, last")

  out, status = sanitize(fake, { pass }, {})
  T.is(status, 0, "exit status 0 when every run passes")
  T.is(out, row("memcheck", pass, 0, 0) .. "\n", "an empty race list runs no racecheck")
  for _, f in ipairs({ fake, pass, fail }) do os.remove(f) end
end)

T.done()
