-- make install and the example C application (tests/embed/example/).
--
-- `make install DESTDIR= PREFIX=` of this build (NOBUILD=1: it copies what
-- the build dir holds) puts every file where README says, the .pc names the
-- prefix, uninstall removes it all; pkg-config reads the installed
-- gpulua.pc; libgpulua.so exports the functions gpulua.h declares and no
-- more, gpu.so only luaopen_gpu.  The example application, which the
-- Makefile built against $BUILD/stage through pkg-config (shared, and with
-- libgpulua.a and liblua5.4.a inside), wraps its buffer, runs
-- tests/embed/example/pipeline.lua on it and checks every value; on the
-- device the suite runs on (GPULUA_DEVICE=cuda under make test-gpu).
--
-- What needs a tool the machine may lack (make, pkg-config, nm/readelf, the
-- shared liblua5.4 of the shared build: the GPU machines have no Lua) skips
-- with the reason; the static application runs everywhere.
local gpu = require "gpu"
local T = require "gpu.test"

local BUILD = T.gpulua:match("^(.*)/[^/]*$") or "."
local APP_DIR = "tests/embed/example"
local SCRIPT = APP_DIR .. "/pipeline.lua"
local N = 8192

-- A shell command with stderr in its output; output and exit status.
local function sh(cmd) return T.sh(cmd .. " 2>&1") end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function have(tool) return select(2, sh("command -v " .. tool .. " >/dev/null")) == 0 end

local read = T.readfile

local function exists(path) return read(path) ~= nil end

local function mktemp_dir()
  local out, code = sh("mktemp -d")
  assert(code == 0, "mktemp -d: " .. out)
  return (out:gsub("%s+$", ""))
end

local HEADER = assert(read("interp/lib/gpulua.h"), "interp/lib/gpulua.h")
local VERSION = HEADER:match('#define GPULUA_VERSION_STRING "([^"]+)"')
local SOVERSION = VERSION:match("^(%d+)")
local STDLIB = {}
for name in sh("cd stdlib && find . -name '*.lua' | sort"):gmatch("%./([^\n]+)") do
  STDLIB[#STDLIB + 1] = name
end
-- The LuaLS annotations, installed to share/gpulua/types/ as the tree
-- under docs/types/ is (gpu.lua, gpu/trace.lua, ...).
local TYPES = {}
for name in sh("cd docs/types 2>/dev/null && find . -name '*.lua' | sort"):gmatch("%./([^\n]+)") do
  TYPES[#TYPES + 1] = name
end

-- The public functions: declarations in gpulua.h (not typedefs or comments).
local API = {}
for line in HEADER:gmatch("[^\n]+") do
  if not line:match("^typedef") then
    local name = line:match("^[%a_][%w_ ]*[ %*](gpulua_[%w_]+)%(")
    if name then API[#API + 1] = name end
  end
end
table.sort(API)

-- `make install` of this build, without building (NOBUILD=1); the parent
-- make's variables (MAKEFLAGS: BUILD, SANITIZE) are not passed on.
local function make(target, vars)
  return sh("env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL GPULUA_QUIET=1 make --no-print-directory -s "
            .. target .. " NOBUILD=1 BUILD=" .. q(BUILD) .. " " .. vars)
end

local HAVE_MAKE = have("make")
local PREFIX_DIR   -- an install with PREFIX=<it> (no DESTDIR), for pkg-config

T.test("make install DESTDIR=... PREFIX=/usr/local, then uninstall", function()
  if not HAVE_MAKE then return T.skip("make install", "make is not installed") end
  local dest = mktemp_dir()
  local out, code = make("install", "DESTDIR=" .. q(dest) .. " PREFIX=/usr/local")
  if not T.is(code, 0, "make install exits 0") then T.diag(out) end
  local root = dest .. "/usr/local"
  local files = { "bin/gpulua", "lib/libgpulua.a", "lib/libgpulua.so." .. VERSION, "include/gpulua.h",
                  "lib/lua/5.4/gpu.so", "lib/pkgconfig/gpulua.pc" }
  for _, m in ipairs(STDLIB) do files[#files + 1] = "share/lua/5.4/" .. m end
  files[#files + 1] = "share/man/man1/gpulua.1"
  for _, t in ipairs(TYPES) do files[#files + 1] = "share/gpulua/types/" .. t end
  for _, f in ipairs(files) do T.ok(exists(root .. "/" .. f), "installed: " .. f) end
  T.is(sh("readlink " .. q(root .. "/lib/libgpulua.so")), "libgpulua.so." .. SOVERSION .. "\n",
       "libgpulua.so -> libgpulua.so." .. SOVERSION)
  T.is(sh("readlink " .. q(root .. "/lib/libgpulua.so." .. SOVERSION)), "libgpulua.so." .. VERSION .. "\n",
       "libgpulua.so." .. SOVERSION .. " -> libgpulua.so." .. VERSION)
  T.is(read(root .. "/include/gpulua.h"), HEADER, "the installed header is interp/lib/gpulua.h")
  T.is(sh("ls " .. q(root .. "/include")), "gpulua.h\n", "gpulua.h is the only installed header")
  for _, m in ipairs(STDLIB) do
    T.is(read(root .. "/share/lua/5.4/" .. m), read("stdlib/" .. m), "share/lua/5.4/" .. m .. " is stdlib/" .. m)
  end
  T.is(read(root .. "/share/man/man1/gpulua.1"), read("docs/gpulua.1"), "share/man/man1/gpulua.1 is docs/gpulua.1")
  for _, t in ipairs(TYPES) do
    T.is(read(root .. "/share/gpulua/types/" .. t), read("docs/types/" .. t),
         "share/gpulua/types/" .. t .. " is docs/types/" .. t)
  end
  local pc = read(root .. "/lib/pkgconfig/gpulua.pc") or ""
  T.ok(pc:find("\nprefix=/usr/local\n", 1, true), "gpulua.pc: prefix=/usr/local (not DESTDIR)")
  T.ok(not pc:find(dest, 1, true), "gpulua.pc does not mention DESTDIR")
  T.ok(pc:find("\nVersion: " .. VERSION .. "\n", 1, true), "gpulua.pc: Version " .. VERSION)
  T.ok(not pc:find("@%u[%u_]*@"), "gpulua.pc: every @VAR@ filled in")
  -- the installed interpreter runs a script with the embedded stdlib
  local script = T.tmpfile('local p = require "gpu.pipeline"; local T = require "gpu.test"\n'
                           .. 'print(type(p.run), type(T.is), gpu.backend)\n')
  out, code = sh(q(root .. "/bin/gpulua") .. " --device " .. gpu.backend .. " " .. q(script))
  os.remove(script)
  T.is(out, "function\tfunction\t" .. gpu.backend .. "\n", "the installed gpulua runs a script")
  T.is(code, 0, "the installed gpulua exits 0")

  out, code = make("uninstall", "DESTDIR=" .. q(dest) .. " PREFIX=/usr/local")
  if not T.is(code, 0, "make uninstall exits 0") then T.diag(out) end
  T.is(sh("cd " .. q(dest) .. " && find . ! -type d"), "", "uninstall removes every installed file")
  T.is(sh("cd " .. q(dest) .. " && find . -path '*lua*'"), "", "and the Lua directories it made")
  T.is(sh("cd " .. q(dest) .. " && find . -path '*/share/man*'"), "", "and the man directories")
  sh("rm -rf " .. q(dest))

  -- for the pkg-config test: PREFIX alone, as `make install PREFIX=$HOME/gpulua`
  local prefix = mktemp_dir()
  out, code = make("install", "PREFIX=" .. q(prefix))
  if T.is(code, 0, "make install PREFIX=<dir> exits 0") then PREFIX_DIR = prefix else T.diag(out) end
end)

T.test("pkg-config reads the installed gpulua.pc", function()
  if not PREFIX_DIR then return T.skip("pkg-config", "no install (make is not installed)") end
  if not have("pkg-config") then return T.skip("pkg-config", "pkg-config is not installed") end
  local pc = "PKG_CONFIG_PATH=" .. q(PREFIX_DIR .. "/lib/pkgconfig") .. " pkg-config "
  local luaflags, code = sh("pkg-config --cflags lua5.4")
  if code ~= 0 then return T.skip("pkg-config", "lua5.4.pc is not installed (liblua5.4-dev)") end
  local function words(s)
    local set = {}
    for w in s:gmatch("%S+") do set[w] = true end
    return set
  end
  local function has_all(got, want, name)
    local g, missing = words(got), {}
    for w in want:gmatch("%S+") do
      if not g[w] then missing[#missing + 1] = w end
    end
    if not T.ok(#missing == 0, name) then T.diag("  got: " .. got .. "  missing: " .. table.concat(missing, " ")) end
  end
  T.is(sh(pc .. "--modversion gpulua"), VERSION .. "\n", "--modversion is gpulua.h's version")
  has_all(sh(pc .. "--cflags gpulua"), "-I" .. PREFIX_DIR .. "/include " .. luaflags,
          "--cflags: the installed include dir and lua5.4's (gpulua.h includes <lua.h>)")
  local libs = sh(pc .. "--libs gpulua")
  has_all(libs, "-L" .. PREFIX_DIR .. "/lib -lgpulua -llua5.4", "--libs: -lgpulua and -llua5.4")
  T.ok(not words(libs)["-lm"], "--libs (shared): not the private dependencies")
  local static = sh(pc .. "--static --libs gpulua")
  has_all(static, "-lgpulua -llua5.4 -lm -ldl", "--static --libs: the dependencies of libgpulua.a and liblua5.4.a too")
  T.ok(words(static)["-pthread"] or words(static)["-lpthread"], "--static --libs: threads")
  T.is(sh(pc .. "--variable=luacmoddir gpulua"), PREFIX_DIR .. "/lib/lua/5.4\n", "luacmoddir: where gpu.so is")
  T.ok(exists(PREFIX_DIR .. "/lib/lua/5.4/gpu.so"), "gpu.so is in luacmoddir")
  T.is(sh(pc .. "--variable=lualmoddir gpulua"), PREFIX_DIR .. "/share/lua/5.4\n", "lualmoddir: the stdlib's root")
end)
if PREFIX_DIR then sh("rm -rf " .. q(PREFIX_DIR)) end

T.test("libgpulua.so exports the public API alone; gpu.so luaopen_gpu alone", function()
  if not have("nm") then return T.skip("exports", "nm is not installed") end
  T.ok(#API >= 10, "gpulua.h declares the API (" .. #API .. " functions)")
  local function exported(path)
    local out, code = sh("nm -D --defined-only " .. q(path))
    local names = {}
    for name in out:gmatch("%x+ [TDBRVW] ([%w_]+)") do names[#names + 1] = name end
    table.sort(names)
    return names, code
  end
  local so = BUILD .. "/libgpulua.so." .. VERSION
  local names, code = exported(so)
  T.is(code, 0, "nm -D " .. so)
  T.is(names, API, "libgpulua.so exports exactly gpulua.h's functions")
  T.is((exported(BUILD .. "/gpu.so")), { "luaopen_gpu" }, "gpu.so exports luaopen_gpu alone")
  if not have("readelf") then return T.skip("soname", "readelf is not installed") end
  T.ok(sh("readelf -d " .. q(so)):find("Library soname: [libgpulua.so." .. SOVERSION .. "]", 1, true),
       "libgpulua.so's soname is libgpulua.so." .. SOVERSION)
  local needed = sh("readelf -d " .. q(BUILD .. "/gpu.so"))
  T.ok(not needed:find("liblua", 1, true), "gpu.so links no Lua (the loading lua5.4 has it)")
end)

-- The device the application should get: GPULUA_DEVICE, else what this
-- interpreter got (both choose the same way).
local WANT_BACKEND = os.getenv("GPULUA_DEVICE") or ""
if WANT_BACKEND == "" or WANT_BACKEND == "auto" then WANT_BACKEND = gpu.backend end
WANT_BACKEND = WANT_BACKEND:match("^(%a+)")

local function check_app(name, cmd)
  local out, code = sh(cmd .. " " .. q(SCRIPT))
  local ok = T.is(code, 0, name .. " exits 0")
  ok = T.ok(out:find("app: " .. N .. " values checked, ok", 1, true), name .. " checked every value") and ok
  ok = T.ok(out:find("app: backend " .. WANT_BACKEND .. "\n", 1, true), name .. " ran on " .. WANT_BACKEND) and ok
  if not ok then T.diag(out) end
end

local function lua_so_present()
  for _, dir in ipairs { "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                         "/usr/lib64", "/usr/lib", "/usr/local/lib" } do
    if exists(dir .. "/liblua5.4.so.0") then return true end
  end
  return false
end

T.test("the example application, shared: libgpulua.so and liblua5.4.so", function()
  local app = BUILD .. "/example/app"
  if not exists(app) then return T.ok(false, app .. " was built (make tests)") end
  if not lua_so_present() then
    return T.skip("shared example", "no liblua5.4.so.0 on this machine (the GPU machines have no Lua)")
  end
  if not exists(BUILD .. "/stage/lib/libgpulua.so." .. SOVERSION) then
    return T.ok(false, BUILD .. "/stage/lib holds libgpulua.so." .. SOVERSION .. " (make tests)")
  end
  -- a prefix outside the loader's paths: gpulua.pc's rpath finds the
  -- library, with no LD_LIBRARY_PATH to set
  check_app("the shared application", "env -u LD_LIBRARY_PATH " .. q(app))
  if not have("readelf") then return T.skip("NEEDED", "readelf is not installed") end
  local d = sh("readelf -d " .. q(app))
  local stage_lib = T.sh("cd " .. q(BUILD .. "/stage/lib") .. " && pwd -P"):gsub("\n$", "")
  T.ok(d:find("(RUNPATH)", 1, true) and d:find("[" .. stage_lib .. "]", 1, true),
       "its run path is the prefix's lib/, from gpulua.pc")
  T.ok(d:find("[libgpulua.so." .. SOVERSION .. "]", 1, true), "it needs libgpulua.so." .. SOVERSION)
  T.ok(d:find("[liblua5.4.so.0]", 1, true), "it needs liblua5.4.so.0 (the same Lua as libgpulua.so)")
end)

local STATIC = BUILD .. "/example/app-static"

T.test("the example application, static: libgpulua.a and liblua5.4.a inside", function()
  if not exists(STATIC) then return T.ok(false, STATIC .. " was built (make tests)") end
  check_app("the static application", q(STATIC))
  if not have("readelf") then return T.skip("NEEDED", "readelf is not installed") end
  local d = sh("readelf -d " .. q(STATIC))
  T.ok(not d:find("libgpulua", 1, true), "it needs no libgpulua.so")
  T.ok(not d:find("liblua", 1, true), "it needs no liblua5.4.so")
end)

T.test("the example application reports a failing script, and checks its buffer", function()
  if not exists(STATIC) then return T.ok(false, STATIC .. " was built (make tests)") end
  local function run(name, script, env, want)
    local path = T.tmpfile(script)
    local out, code = sh((env or "") .. " " .. q(STATIC) .. " " .. q(path))
    os.remove(path)
    T.is(code, 1, name .. ": exit status 1")
    if not T.ok(out:find(want:gsub("PATH", path), 1, true), name .. ": " .. want) then T.diag(out) end
  end
  run("an error in the script", "local x = 1\nerror('no pipeline today')\n", nil,
      "app: PATH:2: no pipeline today")
  run("a bad call in the script", "\n\ninput:narrow(1, 0, 4)\n", nil,
      "app: PATH:3: bad argument #2 to 'narrow'")
  run("a script that leaves the buffer alone", "-- does nothing\n", nil, "app: buf[0] = 0, expected 1")
  run("a script that is not Lua", "return function(\n", nil, "app: PATH:2:")
  run("a device that cannot be opened", "", "GPULUA_DEVICE=nodevice", "app: gpu: ")
  local out, code = sh(q(STATIC) .. " " .. q(BUILD .. "/no/such/script.lua"))
  T.is(code, 1, "a missing script: exit status 1")
  T.ok(out:find("app: cannot open " .. BUILD .. "/no/such/script.lua", 1, true), "a missing script: cannot open")
end)

T.done()
