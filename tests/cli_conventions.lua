-- The program's conventions (issue 33): -h and --help print the usage on
-- stdout and exit 0, before anything runs; a bad option still prints it on
-- stderr and exits 1.  When the device is chosen automatically and it is
-- the host, one line on stderr says so, once per job (ranks included), and
-- saying where to run silences it.  Child processes run on the host backend
-- unless the test says otherwise.
local gpu = require "gpu"
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

-- What the automatic choice is on this machine: host without a GPU (CI),
-- cuda on a GPU machine, where no note may be printed at all.
local AUTO = (run3("-e 'io.write(gpu.backend)'", "env -u GPULUA_DEVICE"))
local NOTE = "^gpulua: running on the host backend %(CPU threads%): [^\n]+; %-%-device host %(or auto%) silences this\n"

local function count_notes(err)
  local n = 0
  for _ in err:gmatch("running on the host backend") do n = n + 1 end
  return n
end

T.test("the host fallback is said once on stderr", function()
  local input = T.tmpfile('print("out")\n')
  local cases = {
    { "a script", "-e 'print(\"out\")'", "out\n" },
    { "stdin", "- < " .. q(input), "out\n" },
    { "-i off a terminal", "-i < " .. q(input), "out\n" },
    { "2 ranks", "-n 2 --no-prefix -e 'print(\"out\")'", "out\nout\n" },
  }
  -- on cuda, rank 1 takes cuda:1: 2 ranks need 2 GPUs
  if AUTO ~= "host" and gpu.device_count() < 2 then
    cases[#cases] = nil
    T.skip("2 ranks", "one GPU: rank 1 would need cuda:1")
  end
  for _, c in ipairs(cases) do
    local out, err, code = run3(c[2], "env -u GPULUA_DEVICE")
    T.is(code, 0, c[1] .. ": exit 0")
    T.ok(out:find(c[3], 1, true) ~= nil, c[1] .. ": stdout as before")
    if AUTO == "host" then
      T.is(count_notes(err), 1, c[1] .. ": one note")
      T.ok(err:find(NOTE), c[1] .. ": the note first on stderr, with its reason: " .. err)
    else
      T.is(count_notes(err), 0, c[1] .. ": no note on " .. AUTO)
    end
  end
  os.remove(input)
end)

T.test("saying where to run silences the note", function()
  for _, c in ipairs({ { "--device host", "--device host -e 'print(1)'", "env -u GPULUA_DEVICE" },
                       { "GPULUA_DEVICE=host", "-e 'print(1)'", "env GPULUA_DEVICE=host" },
                       { "--device auto", "--device auto -e 'print(1)'", "env -u GPULUA_DEVICE" },
                       { "GPULUA_DEVICE=auto", "-e 'print(1)'", "env GPULUA_DEVICE=auto" },
                       { "-n 2 --device host", "-n 2 --device host -e 'print(1)'", "env -u GPULUA_DEVICE" } }) do
    local out, err, code = run3(c[2], c[3])
    T.is(code, 0, c[1] .. ": exit 0")
    T.ok(out:find("1\n", 1, true), c[1] .. ": ran")
    T.is(count_notes(err), 0, c[1] .. ": no note")
  end
end)

T.test("auto is the automatic choice, by name", function()
  for _, c in ipairs({ { "--device auto", "--device auto", "env -u GPULUA_DEVICE" },
                       { "GPULUA_DEVICE=auto", "", "env GPULUA_DEVICE=auto" } }) do
    local out, _, code = run3(c[2] .. " -e 'io.write(gpu.backend)'", c[3])
    T.is(code, 0, c[1] .. ": exit 0")
    T.is(out, AUTO, c[1] .. ": the backend the automatic choice takes")
  end
  local _, err, code = run3("--device automatic -e ''", "env -u GPULUA_DEVICE")
  T.is(code, 1, "an unknown device: exit 1")
  T.ok(err:find("unknown device 'automatic' (expected auto, host, cuda or cuda:N)", 1, true), "... naming the choices: " .. err)
end)

T.test("the REPL's first sync warning says how to silence it", function()
  local input = T.tmpfile('t = gpu.ones({3})\nprint(t:sum():item())\nprint(#t:totable())\n')
  local out, err, code = run3("--device host -i < " .. q(input))
  os.remove(input)
  T.is(code, 0, "exit 0")
  T.ok(out:find("\n3.0\n3\n$"), "the values, after the banner")
  local hint = '[gpu.sync_debug("off") or GPULUA_SYNC_DEBUG=off silences these]'
  local first, second = err:match("^Lua warning: gpulua: ([^\n]*)\nLua warning: gpulua: ([^\n]*)\n$")
  T.ok(first and first:find("stdin:1: item: a device-to-host read waits for the device", 1, true), "the first warning: " .. err)
  T.ok(first and first:sub(-#hint) == hint, "... ends with how to silence it")
  T.ok(second and second:find("stdin:1: totable:", 1, true) and not second:find(hint, 1, true),
       "the second names its call, without the hint")
end)

T.done()
