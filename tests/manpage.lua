-- The man page, docs/gpulua.1: it renders without a warning (groff -ww);
-- every option `gpulua --help` prints has an entry under OPTIONS (or
-- LAUNCHER OPTIONS for the launcher's) and the page lists no option the
-- program lacks; every GPULUA_* variable the sources read is under
-- ENVIRONMENT; and `man` finds the page in the suite's install
-- ($BUILD/stage, made by `make tests`).  A check that needs a tool the
-- machine lacks (groff, man: the GPU machines have neither) skips with the
-- reason.
local T = require "gpu.test"

local BUILD = T.gpulua:match("^(.*)/[^/]*$") or "."
local PAGE = "docs/gpulua.1"
local STAGE = BUILD .. "/stage"

-- A shell command with stderr in its output; output and exit status.
local function sh(cmd) return T.sh(cmd .. " 2>&1") end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function have(tool) return select(2, sh("command -v " .. tool .. " >/dev/null")) == 0 end

local SOURCE = assert(T.readfile(PAGE), PAGE)

-- The roff lines of section `name` (from its .SH to the next).
local function section(roff, name)
  local lines, inside = {}, false
  for line in roff:gmatch("[^\n]*") do
    local sh_name = line:match('^%.SH%s+"?([^"]*)"?%s*$')
    if sh_name then
      inside = sh_name == name
    elseif inside then
      lines[#lines + 1] = line
    end
  end
  return lines
end

-- roff to plain text: escapes for dashes, fonts and quotes, macro names.
local function plain(line)
  line = line:gsub("^%.%a+%s*", ""):gsub("\\%-", "-"):gsub("\\f[BIRP]", ""):gsub("\\%(aq", "'")
  return (line:gsub('"', ""))
end

-- The options a section documents: the first word of each .TP/.TQ tag.
local function man_options(roff, name)
  local opts, tag = {}, false
  for _, line in ipairs(section(roff, name)) do
    if line:match("^%.T[PQ]%s*$") then
      tag = true
    elseif tag then
      tag = false
      local opt = plain(line):match("^(%-%S*)")
      if opt then opts[opt] = true end
    end
  end
  return opts
end

-- The options of the usage text: `  -x ...` and `  -h, --help ...` lines,
-- before the "Launcher options" line (main) and after it (launcher).
local function help_options(text)
  local sets, cur = { main = {}, launcher = {} }, "main"
  for line in text:gmatch("[^\n]*") do
    if line:match("^Launcher options") then cur = "launcher" end
    local first, rest = line:match("^  (%-%S*)(.*)$")
    if first then
      sets[cur][(first:gsub(",$", ""))] = true
      local second = first:match(",$") and rest:match("^ (%-%S+)")
      if second then sets[cur][second] = true end
    end
  end
  return sets
end

local function sorted(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- What `want` has that `got` lacks.
local function missing(want, got)
  local out = {}
  for _, k in ipairs(sorted(want)) do
    if not got[k] then out[#out + 1] = k end
  end
  return out
end

-- The page's OPTIONS and LAUNCHER OPTIONS against the usage: what each lacks.
local function compare(help, roff)
  local h = help_options(help)
  local m = { main = man_options(roff, "OPTIONS"), launcher = man_options(roff, "LAUNCHER OPTIONS") }
  return {
    main_undocumented = missing(h.main, m.main), main_extra = missing(m.main, h.main),
    launcher_undocumented = missing(h.launcher, m.launcher), launcher_extra = missing(m.launcher, h.launcher),
    help = h,
  }
end

T.test("the page's sections", function()
  local header = assert(T.readfile("interp/lib/gpulua.h"), "interp/lib/gpulua.h")
  local version = header:match('#define GPULUA_VERSION_STRING "([^"]+)"')
  T.is(SOURCE:match('\n%.TH GPULUA 1 %S+ "gpulua ([^"]*)"'), version,
       ".TH GPULUA 1 <date> \"gpulua <gpulua.h's version>\"")
  local names = {}
  for name in SOURCE:gmatch('\n%.SH%s+"?([^"\n]*)') do names[#names + 1] = name end
  T.is(names, { "NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "LAUNCHER OPTIONS", "ENVIRONMENT", "EXIT STATUS",
                "FILES", "EXAMPLES", "SEE ALSO" }, "the sections, in order")
  T.ok(SOURCE:find("\n%.SS The REPL\n"), "a subsection on the REPL")
  T.is(section(SOURCE, "NAME")[1], "gpulua \\- Lua 5.4 interpreter for GPU pipelines",
       "NAME: `gpulua \\- summary` (what whatis and apropos read)")
  local desc = table.concat(section(SOURCE, "DESCRIPTION"), "\n")
  T.ok(plain(desc):find("gpulua: running on the host backend (CPU threads): ", 1, true),
       "DESCRIPTION quotes the line an automatic fall back to the host prints")
  local examples = table.concat(section(SOURCE, "EXAMPLES"), "\n"):gsub("\\%-", "-")
  T.ok(examples:find("\ngpulua [%w_]+%.lua"), "an example runs a script")
  T.ok(examples:find("\ngpulua %-n %d"), "an example runs ranks (-n)")
  T.ok(examples:find("\ngpulua %-%-trace %S+%.json"), "an example writes a trace (--trace)")
end)

T.test("the page renders without warnings", function()
  if not have("groff") then return T.skip("groff", "groff is not installed (groff-base)") end
  local out, code = sh("groff -man -ww -z " .. q(PAGE))
  T.is(code, 0, "groff -man -ww -z exits 0")
  T.is(out, "", "and warns of nothing")
  -- the checker itself: a page with an unknown macro is warned about
  local bad = T.tmpfile(SOURCE:gsub("\n%.SH OPTIONS\n", "\n.SH OPTIONS\n.XX\n", 1))
  out = sh("groff -man -ww -z " .. q(bad))
  os.remove(bad)
  T.ok(out:find("XX", 1, true), "(an undefined macro in a copy of the page is warned about)")
  if not have("man") then return T.skip("man -l", "man is not installed (man-db)") end
  out, code = sh("MANWIDTH=80 man --warnings -l " .. q(PAGE) .. " 2>&1 >/dev/null")
  T.is(code, 0, "man -l exits 0")
  T.is(out, "", "man --warnings -l: no warning")
end)

T.test("every option of gpulua --help is documented under OPTIONS", function()
  local help, code = T.sh(q(T.gpulua) .. " --help")
  T.is(code, 0, "gpulua --help exits 0")
  local r = compare(help, SOURCE)
  T.ok(#sorted(r.help.main) >= 14, "the usage lists the options (" .. #sorted(r.help.main) .. ")")
  T.ok(#sorted(r.help.launcher) >= 6, "and the launcher's (" .. #sorted(r.help.launcher) .. ")")
  T.is(r.main_undocumented, {}, "OPTIONS has every option of the usage")
  T.is(r.main_extra, {}, "OPTIONS lists no option the usage lacks")
  T.is(r.launcher_undocumented, {}, "LAUNCHER OPTIONS has every launcher option of the usage")
  T.is(r.launcher_extra, {}, "LAUNCHER OPTIONS lists no option the usage lacks")
  -- the checker itself: an option added to the usage, one dropped from the page
  local more = compare((help:gsub("\nLauncher options", "\n  --bogus X      nothing%0", 1)), SOURCE)
  T.is(more.main_undocumented, { "--bogus" }, "(an option only the usage has is found)")
  local fewer = compare(help, (SOURCE:gsub("\n%.TP\n%.BI \\%-\\%-device [^\n]*", "", 1)))
  T.is(fewer.main_undocumented, { "--device" }, "(an option dropped from the page is found)")
end)

-- Read by the launcher and its ranks only, set by the launcher: not for users.
local INTERNAL = { GPULUA_LAUNCHER = true, GPULUA_LAUNCHER_FD = true }

T.test("every GPULUA_* variable the sources read is under ENVIRONMENT", function()
  local out, code = sh("grep -rhoE '(getenv|env_setting|cli_setting|env_flag)\\(\"GPULUA_[A-Z_]+\"' interp cuda bindings")
  T.is(code, 0, "grep the readers in interp/ cuda/ bindings/")
  local read = {}
  for name in out:gmatch('"(GPULUA_[%u_]+)"') do
    if not INTERNAL[name] then read[name] = true end
  end
  T.ok(read.GPULUA_DEVICE and read.GPULUA_SYNC_DEBUG and read.GPULUA_HISTORY, "found the variables")
  local env = {}
  for _, line in ipairs(section(SOURCE, "ENVIRONMENT")) do
    for name in plain(line):gmatch("GPULUA_[%u_]+") do env[name] = true end
  end
  T.is(missing(read, env), {}, "ENVIRONMENT names every one")
  local text = table.concat(section(SOURCE, "ENVIRONMENT"), "\n")
  for _, name in ipairs { "LUA_INIT", "LUA_PATH", "LUA_CPATH" } do
    T.ok(text:find(name, 1, true), "and " .. name)
  end
end)

T.test("man finds the page in the staged install", function()
  local installed = STAGE .. "/share/man/man1/gpulua.1"
  if not T.ok(T.readfile(installed) ~= nil, installed .. " was installed (make tests)") then return end
  T.is(T.readfile(installed), SOURCE, "it is docs/gpulua.1")
  if not have("man") then return T.skip("man", "man is not installed (man-db)") end
  -- a minimized Ubuntu (the GPU machines) has a stub `man` that prints
  -- that it was minimized and exits 0 to anything; man-db's names its
  -- version ("man 2.11.2")
  if not sh("man --version"):find("^man %d") then
    return T.skip("man", "this man is not man-db's (a minimized system's stub)")
  end
  local mandir = STAGE .. "/share/man"
  -- man names the page by its absolute path
  local abs = sh("realpath " .. q(installed))
  local out, code = sh("man -M " .. q(mandir) .. " -w gpulua")
  T.is(code, 0, "man -M <stage>/share/man -w gpulua exits 0")
  T.is(out, abs, "and names the installed page")
  out = sh("MANPATH=" .. q(mandir) .. " man -w gpulua")
  T.is(out, abs, "MANPATH=<stage>/share/man man -w gpulua, too")
  out = sh("MANWIDTH=80 MANPATH=" .. q(mandir) .. " man gpulua")
  if not T.ok(out:find("\n%s+gpulua %- Lua 5%.4 interpreter for GPU pipelines\n"), "man gpulua shows it") then
    T.diag(out:sub(1, 500))
  end
end)

T.done()
