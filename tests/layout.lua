-- Short functions, short files (issue 31, item 5): no function of our C and
-- CUDA sources over 80 lines and no file over 1000, as tests/tools/lengths.sh
-- measures them (what counts -- interp/, bindings/, cuda/, the C tests of
-- tests/ -- and the `long: <why>` exception are in its header).  The tool
-- is first checked on made-up files, at the limits and past them, so this
-- test can fail.
local T = require "gpu.test"

local TOOL = "tests/tools/lengths.sh"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- the tool's output lines and its exit status
local function lengths(args)
  local out, status = T.sh("sh " .. TOOL .. " " .. args .. " 2>&1")
  local lines = {}
  for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
  return lines, status
end

-- A function `name` of n lines from its brace to its closing one, both
-- counted; `before` goes above it, `first` is its body's first line.
local function func(name, n, before, first)
  local body = { before or "", "static int " .. name .. "(int x) {", first or "  x++;" }
  for _ = 5, n do body[#body + 1] = "  x++;" end
  body[#body + 1] = "  return x;"
  body[#body + 1] = "}"
  return table.concat(body, "\n") .. "\n"
end

T.test("the tool measures functions and files, and honours long: <why>", function()
  local src = table.concat {
    "#include <stdio.h>\n",
    func("at_limit", 80),
    func("past_limit", 81),
    func("excused_above", 90, "/* long: a table of cases, one per op */"),
    func("excused_inside", 90, nil, "  /* long: generated, one line per dtype */"),
    func("no_reason", 90, "/* long: */"),
    "static int knr(int x)\n{\n" .. string.rep("  x++;\n", 85) .. "  return x;\n}\n",
    "static const int table[] = {\n" .. string.rep("  1,\n", 400) .. "};\n",
    "static int two_line(int a,\n                    int b) {\n" .. string.rep("  a++;\n", 90) .. "  return a + b;\n}\n",
  }
  local path = T.tmpfile(src)
  local lines, status = lengths(q(path))
  os.remove(path)
  T.is(status, 1, "exit status 1 with offenders")
  local names = {}
  for _, l in ipairs(lines) do
    local name, n = l:match("^function %S+:%d+ (%S+) (%d+) lines")
    if name then names[name] = tonumber(n) end
  end
  T.is(names, { past_limit = 81, no_reason = 90, knr = 88, two_line = 93 },
       "functions over 80 lines, brace line to closing brace")
  local file = lines[#lines] or ""
  T.ok(file:match("^file %S+ (%d+) lines %(limit 1000%)$") ~= nil, "the file is over 1000 lines: " .. file)
  path = T.tmpfile(func("short", 10))
  lines, status = lengths("-f 100 -l 100000 " .. q(path))
  os.remove(path)
  T.is(status, 0, "no offender: exit status 0")
  T.is(#lines, 0, "and no output")
end)

T.test("lowered limits list offenders in the tree", function()
  local lines, status = lengths("-f 40 -l 500")
  T.is(status, 1, "exit status 1")
  T.ok(#lines > 10, #lines .. " offenders with limits 40 and 500")
end)

T.test("no function over 80 lines, no file over 1000", function()
  local lines, status = lengths("")
  for _, l in ipairs(lines) do T.diag(l) end
  T.is(lines, {}, "no offender (each is listed above)")
  T.is(status, 0, "exit status 0")
end)

T.done()
