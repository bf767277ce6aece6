-- The rockspec, gpulua-<version>-1.rockspec: `luarocks make` builds the gpu
-- module from a copy of the source tree (the files git tracks, and new
-- ones it does not ignore) into a fresh tree; the stock lua5.4, with
-- the cpath `luarocks path` gives, requires it from there and runs a
-- tensor op; `luarocks remove` takes it away again.
--
-- The build is the host backend alone (NOCUDA=1: the rock's CUDA build is
-- the Makefile's, which the suite already builds), with one make job per
-- processor.  Skips: without luarocks or lua5.4 (the GPU machines have no
-- Lua), and in the sanitizer run (GPULUA_SANITIZE=1: the normal suite
-- runs it; a build of the module there would only cost time).
local T = require "gpu.test"

-- A shell command with stderr in its output; output and exit status.
local function sh(cmd) return T.sh(cmd .. " 2>&1") end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function have(tool) return select(2, sh("command -v " .. tool .. " >/dev/null")) == 0 end

local function rockspecs()
  local list = {}
  for name in sh("ls"):gmatch("[^\n]+") do
    if name:match("%.rockspec$") then list[#list + 1] = name end
  end
  return list
end

local ROCKSPECS = rockspecs()
local ROCKSPEC = ROCKSPECS[1]

local SKIP
if os.getenv("GPULUA_SANITIZE") == "1" then
  SKIP = "sanitizer run: the normal suite builds and installs the rock"
elseif not have("luarocks") then
  SKIP = "luarocks is not installed (Debian: the luarocks package)"
elseif not have("lua5.4") then
  SKIP = "lua5.4 is not installed (the lua5.4 package; the GPU machines have no Lua)"
end

-- luarocks for Lua 5.4 (Debian's defaults to 5.1), with make's variables
-- from the suite's own make taken away.
local function luarocks(args)
  return sh("env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL luarocks --lua-version 5.4 " .. args)
end

T.test("one rockspec, which luarocks accepts", function()
  T.is(#ROCKSPECS, 1, "one rockspec at the root of the tree")
  if not ROCKSPEC then return end
  local text = assert(T.readfile(ROCKSPEC))
  local version = ROCKSPEC:match("^gpulua%-(.-)%.rockspec$")
  T.ok(version, ROCKSPEC .. " is gpulua-<version>.rockspec")
  T.ok(text:find('\nversion = "' .. (version or ""):gsub("%p", "%%%0") .. '"\n'),
       "its version field is the file name's")
  T.ok(text:find('"lua >= 5%.4, < 5%.5"'), "it depends on Lua 5.4")
  -- a new version renames the rockspec (gpulua-<version>-1.rockspec)
  local header = assert(T.readfile("interp/lib/gpulua.h"), "interp/lib/gpulua.h")
  local want = header:match('#define GPULUA_VERSION_STRING "([^"]+)"')
  T.is((version or ""):match("^(.-)%-%d+$"), want, "its version is gpulua.h's")
  if SKIP then return T.skip("luarocks lint", SKIP) end
  local out, code = luarocks("lint " .. q(ROCKSPEC))
  T.is(code, 0, "luarocks lint " .. ROCKSPEC)
  T.is(out, "", "and it says nothing")
end)

T.test("luarocks make into a tree; lua5.4 requires gpu from there", function()
  if SKIP then return T.skip("luarocks make", SKIP) end
  if not T.ok(ROCKSPEC, "a rockspec") then return end
  local out, code = sh("mktemp -d")
  assert(code == 0, "mktemp -d: " .. out)
  local tmp = out:gsub("%s+$", "")
  local src, tree = tmp .. "/src", tmp .. "/tree"
  -- the checkout as a clone would have it, without the build dirs
  local copy = "mkdir " .. q(src) .. " && { git ls-files -z -co --exclude-standard | "
               .. "tar --null --ignore-failed-read -T - -cf - | tar -C " .. q(src) .. " -xf - ; }"
  if select(2, sh("git rev-parse --is-inside-work-tree >/dev/null")) ~= 0 then
    copy = "mkdir " .. q(src) .. " && tar --exclude='./build*' --exclude=./.git -cf - . | tar -C "
           .. q(src) .. " -xf -"
  end
  out, code = sh(copy)
  if not T.is(code, 0, "the source tree copied to " .. src) then T.diag(out) end

  local jobs = tonumber((sh("getconf _NPROCESSORS_ONLN"))) or 2
  local t0 = os.time()
  out, code = sh("cd " .. q(src) .. " && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL NOCUDA=1 MAKEFLAGS=-j"
                 .. jobs .. " luarocks --lua-version 5.4 make --tree " .. q(tree) .. " " .. q(ROCKSPEC))
  T.diag(string.format("luarocks make: %d s, -j%d", os.time() - t0, jobs))
  if not T.is(code, 0, "luarocks make exits 0") then T.diag(out:sub(-3000)) end
  T.ok(out:find("gpulua %S+ is now installed in " .. tree:gsub("%p", "%%%0")), "and says where it installed")
  T.ok(T.readfile(tree .. "/lib/lua/5.4/gpu.so"), "gpu.so is in the tree's lib/lua/5.4")
  T.ok(T.readfile(src .. "/build-rock/gpu.so"), "built in build-rock/ (not in build/)")
  T.is(sh("ls -A " .. q(src) .. " | grep -x build"), "", "and no build/ made")
  T.ok(T.readfile(tree .. "/lib/luarocks/rocks-5.4/gpulua/" .. ROCKSPEC:match("^gpulua%-(.-)%.rockspec$")
                  .. "/docs/gpulua.1"), "the man page is among the rock's docs")
  out = luarocks("list --porcelain --tree " .. q(tree))
  T.ok(out:find("^gpulua\t"), "luarocks list shows gpulua")

  local cpath, c2 = luarocks("path --lr-cpath --tree " .. q(tree))
  T.is(c2, 0, "luarocks path --lr-cpath")
  cpath = cpath:gsub("%s+$", "")
  local script = T.tmpfile([[
local gpu = require "gpu"
print("from", package.searchpath("gpu", package.cpath))
print("sum", (gpu.arange(4) + 1):sum():item())
local x = gpu.arange(1, 5, { dtype = "f32" }) * 2
print("values", table.concat(x:totable(), ","))
]])
  -- from /tmp: nothing of the source tree's build dirs on the way
  out, code = sh("cd /tmp && LUA_CPATH=" .. q(cpath) .. " LUA_PATH=';;' lua5.4 " .. q(script))
  os.remove(script)
  T.is(code, 0, "lua5.4 runs a script that requires gpu")
  if not T.ok(out:find("\nsum\t10\n", 1, true), "(gpu.arange(4) + 1):sum():item() == 10") then T.diag(out) end
  T.ok(out:find("values\t2.0,4.0,6.0,8.0\n", 1, true), "an f32 op's values")
  T.ok(out:find("from\t" .. tree .. "/lib/lua/5.4/gpu.so\n", 1, true), "gpu.so is the tree's")

  out, code = luarocks("remove --tree " .. q(tree) .. " gpulua")
  T.is(code, 0, "luarocks remove gpulua")
  T.ok(not T.readfile(tree .. "/lib/lua/5.4/gpu.so"), "removes gpu.so")
  sh("rm -rf " .. q(tmp))
end)

T.done()
