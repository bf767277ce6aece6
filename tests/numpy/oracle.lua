-- The NumPy oracle of tests/*_numpy.lua: gpulua's results are saved as
-- .npy files (t:save), each case is one line of Python, and a python3 child
-- loads them with numpy.load, works out NumPy's answer and compares.
--
--   local O = dofile("tests/numpy/oracle.lua").open()   -- skips the file when no numpy
--   O:case("add f32", string.format("C(%q, %s, %s)", name, O:save(a), O:save(result)))
--   O:check("every op against NumPy", ORACLE)           -- one test, a line per case
--   O:close()                                           -- before T.done()
--
-- The oracle's script gets the cases file as sys.argv[1] and prints, per
-- case, "ok\tNAME" or "fail\tNAME\tDETAIL".  GPULUA_PYTHON names the
-- python3 to use (else python3 on the PATH, then /usr/bin/python3).
local T = require "gpu.test"

local M = {}

-- a python3 that imports numpy, or nil
function M.python()
  for _, py in ipairs { os.getenv("GPULUA_PYTHON") or "", "python3", "/usr/bin/python3" } do
    if py ~= "" then
      local _, code = T.sh(py .. " -c 'import numpy' >/dev/null 2>&1")
      if code == 0 then return py end
    end
  end
end

-- a Lua value as a Python literal: numbers (nan and the infinities too),
-- booleans, nil, strings, lists
function M.pyval(v)
  if type(v) == "table" then
    local r = {}
    for i, x in ipairs(v) do r[i] = M.pyval(x) end
    return "[" .. table.concat(r, ", ") .. "]"
  end
  if type(v) == "boolean" then return v and "True" or "False" end
  if v == nil then return "None" end
  if type(v) == "string" then return string.format("%q", v) end
  if v ~= v then return "float('nan')" end
  if v == 1 / 0 then return "float('inf')" end
  if v == -1 / 0 then return "float('-inf')" end
  if math.type(v) == "integer" then return string.format("%d", v) end
  return string.format("%.17g", v)
end

local O = {}
O.__index = O

-- The harness of one test file, its files in a fresh directory (in memory,
-- /dev/shm, where it can be: every save ends with an fsync).  Without a
-- python3 with numpy the file is skipped and ends here (T.done).
function M.open()
  local py = M.python()
  if not py then
    T.skip("the NumPy comparison", "no python3 with numpy found (apt install python3-numpy, or set GPULUA_PYTHON)")
    T.done()
  end
  local dir = (T.sh("mktemp -d -p /dev/shm 2>/dev/null || mktemp -d 2>/dev/null"):gsub("%s+$", ""))
  assert(dir ~= "", "mktemp -d failed")
  return setmetatable({ py = py, dir = dir, lines = {}, names = {}, nfile = 0 }, O)
end

-- t saved; the Python literal (path, dtype) of it
function O:save(t)
  self.nfile = self.nfile + 1
  local p = string.format("%s/t%d.npy", self.dir, self.nfile)
  t:save(p)
  return string.format("(%q, %q)", p, t.dtype)
end

-- a case: its name (what the oracle prints) and its line of Python
function O:case(name, line)
  self.names[#self.names + 1] = name
  self.lines[#self.lines + 1] = line
end

-- One test named title: the cases through the oracle script, a check per
-- case (a failure shows the oracle's detail).
function O:check(title, oracle)
  T.test(title, function()
    local cfile, ofile = self.dir .. "/cases.py", self.dir .. "/oracle.py"
    local f = assert(io.open(cfile, "w"))
    f:write(table.concat(self.lines, "\n"), "\n")
    f:close()
    f = assert(io.open(ofile, "w"))
    f:write(oracle)
    f:close()
    local out, code = T.sh(string.format("%s %s %s 2>&1", self.py, ofile, cfile))
    if code ~= 0 then
      T.ok(false, "the oracle ran (" .. self.py .. ")")
      T.diag(out)
      return
    end
    local got = {}
    for line in out:gmatch("[^\n]+") do
      local st, name, detail = line:match("^(%a+)\t([^\t]*)\t?(.*)$")
      if st then got[name] = { st, detail } end
    end
    for _, name in ipairs(self.names) do
      local r = got[name]
      if not T.ok(r and r[1] == "ok", name) then T.diag(r and r[2] or "no result from the oracle") end
    end
  end)
end

function O:close()
  T.sh("rm -rf '" .. self.dir .. "'")
end

return M
