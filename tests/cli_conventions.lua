-- The program's conventions (issue 33): -h and --help print the usage on
-- stdout and exit 0, before anything runs; a bad option still prints it on
-- stderr and exits 1.  Child processes run on the host backend.
local T = require "gpu.test"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- stdout alone, stderr alone, and the exit status of `gpulua args`
local function run3(args, env)
  local errf = os.tmpname()
  local out, code = T.sh(string.format("%s %s %s 2>%s", env or "", q(T.gpulua), args, q(errf)))
  local err = T.readfile(errf) or ""
  os.remove(errf)
  return out, err, code
end

T.test("--help and -h: the usage on stdout, exit 0", function()
  for _, args in ipairs({ "--help", "-h", "--device host --help", "-n 2 --help", "-h script.lua" }) do
    local out, err, code = run3(args)
    T.is(code, 0, args .. ": exit status 0")
    T.is(err, "", args .. ": nothing on stderr")
    T.ok(out:find("^usage: gpulua %[options%] %[script %[args%]%]\n"), args .. ": starts with the usage line")
    T.ok(out:find("\n  %-h, %-%-help     show this help and exit\n"), args .. ": lists -h/--help")
    T.ok(out:find("\n  %-%-device DEV ") and out:find("\n  %-n N "), args .. ": lists gpulua's own options")
  end
end)

T.test("--help runs nothing", function()
  local out, _, code = run3("-e 'print(\"side effect\")' --help")
  T.is(code, 0, "exit 0")
  T.ok(not out:find("side effect", 1, true), "-e before --help did not run")
end)

T.test("bad options still go to stderr with exit 1", function()
  for _, args in ipairs({ "-hx", "--helpme", "--help=1" }) do
    local out, err, code = run3(args)
    T.is(code, 1, args .. ": exit status 1")
    T.is(out, "", args .. ": nothing on stdout")
    T.ok(err:find("^gpulua: unrecognized option '" .. args:gsub("%-", "%%-") .. "'\nusage: "), args .. ": " .. err:sub(1, 60))
  end
end)

T.done()
