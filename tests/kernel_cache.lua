-- Issue 35, items 8 and 9: the host backend's kernel cache and its C++
-- compiler.  A damaged cache entry is found by its checksum, discarded,
-- rebuilt and reported once as a warning (no crash, no temporary file left);
-- GPULUA_KERNEL_CACHE naming a directory whose parent is missing is not
-- created but reported, and kernels compile without the cache; the compiler
-- runs in a process group of its own under a time limit
-- (GPULUA_CXX_TIMEOUT) and a memory limit (GPULUA_CXX_MEMORY), and Ctrl-C
-- stops it: each way, no compiler process and no temporary file is left.
-- Child gpulua processes run with a private TMPDIR, which must be empty
-- after each.  Host backend only: the cuda backend compiles with NVRTC, in
-- the process.
local gpu = require "gpu"
local T = require "gpu.test"

if gpu.backend ~= "host" then
  T.skip("kernel cache and C++ compiler tests", "host backend only (cuda compiles with NVRTC)")
  T.done()
  return
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function mkdtemp()
  local out = T.sh("mktemp -d")
  return (out:gsub("%s+$", ""))
end

-- Names in dir (one level), sorted, as one string ("" when empty).
local function listing(dir)
  local out = T.sh("ls -A " .. q(dir) .. " 2>&1")
  return (out:gsub("%s+$", ""):gsub("\n", " "))
end

-- Processes whose command line names dir (the compiler's temporary
-- directory is under it); a bracket keeps pgrep's own shell out.
local function compilers(dir)
  local pat = dir:gsub("[%^%$%.%*%+%?%(%)%[%]%{%}%|\\]", "\\%0") .. "/gpulua-c[c]-"
  local out = T.sh("pgrep -f " .. q(pat) .. " 2>/dev/null")
  return (out:gsub("%s+$", ""))
end

local SAXPY = [[
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
]]

local RUN = [[
local gpu = require 'gpu'
local m = gpu.compile(%q)
local x, y = gpu.ones({ 8 }), gpu.ones({ 8 })
m.saxpy { grid = 1, block = 8 } (3.0, x, y, 8)
print("sum", y:sum():item())
]]

-- Runs src in a child gpulua (warnings on) with env and a private TMPDIR
-- tmp; its output, whether it succeeded, and the script's path.  (timeout
-- only keeps a hang from stopping the test.)
local function child(src, env, tmp)
  local path = T.tmpfile(src)
  local out, ok = T.run("TMPDIR=" .. q(tmp) .. " " .. (env or "") .. " timeout -s KILL 60",
                        "--device host -W " .. path)
  os.remove(path)
  return out, ok, path
end

local function count(s, pat)
  return select(2, s:gsub(pat, ""))
end

-- Overwrite n bytes at the middle of the file with 0xff.
local function damage(path, n)
  local f = assert(io.open(path, "r+b"))
  local size = f:seek("end")
  f:seek("set", math.max(0, size // 2 - n // 2))
  f:write(string.rep("\255", math.min(n, size)))
  f:close()
  return size
end

local function entries(dir)
  local out = T.sh("ls " .. q(dir) .. "/*.hk 2>/dev/null")
  local list = {}
  for line in out:gmatch("[^\n]+") do list[#list + 1] = line end
  return list
end

-- ---- item 8: damaged entries ------------------------------------------------

T.test("a damaged cache entry is rebuilt, with one warning and no crash", function()
  local dir, tmp = mkdtemp(), mkdtemp()
  local env = "GPULUA_KERNEL_CACHE=" .. q(dir .. "/kc")
  local out, ok = child(RUN:format(SAXPY), env, tmp)
  T.ok(ok and out:find("sum\t32.0", 1, true), "compiled and ran: " .. out)
  local list = entries(dir .. "/kc")
  T.is(#list, 1, "one cache entry")
  local size = damage(list[1], 4096)
  T.ok(size > 8192, "the entry is bigger than the damage (" .. size .. " bytes)")
  out, ok = child(RUN:format(SAXPY), env, tmp)
  T.ok(ok and out:find("sum\t32.0", 1, true), "4 KiB of 0xff in the middle: compiled again and ran: " .. out)
  T.is(count(out, "damaged"), 1, "one warning says the entry was damaged: " .. out)
  T.ok(out:find("Lua warning: gpulua: ", 1, true) ~= nil, "as a Lua warning")
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  out, ok = child(RUN:format(SAXPY), env, tmp)
  T.ok(ok and out:find("sum\t32.0", 1, true) and not out:find("warning", 1, true),
       "the rebuilt entry is whole: no warning the next time: " .. out)
  -- a truncated entry, and one damaged in its first bytes after the magic
  T.sh("for f in " .. q(dir) .. "/kc/*.hk; do head -c 100 \"$f\" > \"$f.x\"; mv \"$f.x\" \"$f\"; done")
  out, ok = child(RUN:format(SAXPY), env, tmp)
  T.ok(ok and out:find("sum\t32.0", 1, true) and count(out, "damaged") == 1, "truncated: rebuilt, one warning: " .. out)
  local f = assert(io.open(entries(dir .. "/kc")[1], "r+b"))
  f:seek("set", 20)
  f:write("\255\255\255\255")
  f:close()
  out, ok = child(RUN:format(SAXPY), env, tmp)
  T.ok(ok and out:find("sum\t32.0", 1, true) and count(out, "damaged") == 1, "its lengths damaged: rebuilt, one warning: " .. out)
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  T.sh("rm -rf " .. q(dir) .. " " .. q(tmp))
end)

T.test("GPULUA_KERNEL_CACHE: the last directory is made, never its parents", function()
  local dir, tmp = mkdtemp(), mkdtemp()
  local missing = dir .. "/no/such/dir"
  local script = RUN:format(SAXPY) .. "gpu.compile(" .. string.format("%q", SAXPY .. "// two\n") .. ")\n"
  local out, ok = child(script, "GPULUA_KERNEL_CACHE=" .. q(missing), tmp)
  T.ok(ok and out:find("sum\t32.0", 1, true), "the kernels compile and run without the cache: " .. out)
  T.ok(io.open(dir .. "/no") == nil, "no directory is made: " .. listing(dir))
  T.is(count(out, "GPULUA_KERNEL_CACHE"), 1, "one warning for two compiles: " .. out)
  T.ok(out:find("GPULUA_KERNEL_CACHE='" .. missing .. "'", 1, true) and out:find("without the cache", 1, true),
       "it names the variable and says kernels compile without the cache: " .. out)
  out, ok = child(RUN:format(SAXPY), "GPULUA_KERNEL_CACHE=" .. q(dir .. "/kc"), tmp)
  T.ok(ok and not out:find("warning", 1, true), "its parent exists: no warning: " .. out)
  T.is(#entries(dir .. "/kc"), 1, "... and the directory is made, with the entry")
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  T.sh("rm -rf " .. q(dir) .. " " .. q(tmp))
end)

-- ---- item 9: the compiler's limits and Ctrl-C --------------------------------

local FIFO_SRC = [[
#include "%s"
extern "C" __global__ void k(float *x) { x[0] = 1; }
]]

T.test("GPULUA_CXX_TIMEOUT: a compile that hangs fails at the time limit", function()
  local dir, tmp = mkdtemp(), mkdtemp()
  local fifo = dir .. "/fifo"
  assert(T.sh("mkfifo " .. q(fifo) .. " && echo made"):find("made"))
  local script = "local gpu = require 'gpu'\ngpu.compile(" .. string.format("%q", FIFO_SRC:format(fifo)) .. ")\n"
  local out, ok, path = child(script, "GPULUA_KERNEL_CACHE=0 GPULUA_CXX_TIMEOUT=1", tmp)
  T.ok(not ok, "the compile fails")
  T.ok(out:find(path .. ":2: gpu.compile: the C++ compiler ran past the time limit of 1 s (GPULUA_CXX_TIMEOUT)",
                1, true) ~= nil, "the message, at the script line: " .. out)
  T.is(compilers(tmp), "", "no compiler process is left")
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  -- a fractional limit is taken as written
  out = child(script, "GPULUA_KERNEL_CACHE=0 GPULUA_CXX_TIMEOUT=0.5", tmp)
  T.ok(out:find("time limit of 0.5 s (GPULUA_CXX_TIMEOUT)", 1, true) ~= nil, "0.5 s: " .. out)
  T.is(compilers(tmp), "", "no compiler process is left")
  -- a writer lets any compiler still reading the FIFO finish
  T.sh("timeout 2 sh -c ': > " .. fifo .. "' 2>/dev/null")
  T.sh("rm -rf " .. q(dir) .. " " .. q(tmp))
end)

T.test("GPULUA_CXX_TIMEOUT and GPULUA_CXX_MEMORY: malformed values are named", function()
  local tmp = mkdtemp()
  local script = RUN:format(SAXPY)
  for _, v in ipairs { "soon", "-1", "1e400", "5s", "0x10", "nan" } do
    local out, ok = child(script, "GPULUA_KERNEL_CACHE=0 GPULUA_CXX_TIMEOUT=" .. q(v), tmp)
    T.ok(not ok and out:find("GPULUA_CXX_TIMEOUT='" .. v .. "' is not a number of seconds", 1, true) ~= nil,
         "GPULUA_CXX_TIMEOUT=" .. v .. ": " .. out)
  end
  for _, v in ipairs { "lots", "-5G", "4X" } do
    local out, ok = child(script, "GPULUA_KERNEL_CACHE=0 GPULUA_CXX_MEMORY=" .. q(v), tmp)
    T.ok(not ok and out:find("GPULUA_CXX_MEMORY='" .. v .. "' is not a size", 1, true) ~= nil,
         "GPULUA_CXX_MEMORY=" .. v .. ": " .. out)
  end
  for _, env in ipairs { "GPULUA_CXX_TIMEOUT=0 GPULUA_CXX_MEMORY=0", "GPULUA_CXX_TIMEOUT=off GPULUA_CXX_MEMORY=off",
                         "GPULUA_CXX_TIMEOUT=120 GPULUA_CXX_MEMORY=2G" } do
    local out, ok = child(script, "GPULUA_KERNEL_CACHE=0 " .. env, tmp)
    T.ok(ok and out:find("sum\t32.0", 1, true), env .. ": compiles: " .. out)
  end
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  T.sh("rm -rf " .. q(tmp))
end)

T.test("GPULUA_CXX_MEMORY: a compiler that grows without end fails at the limit", function()
  local tmp = mkdtemp()
  local script = "local gpu = require 'gpu'\ngpu.compile(" ..
                 string.format("%q", FIFO_SRC:format("/dev/zero")) .. ")\n"
  local out, ok, path = child(script, "GPULUA_KERNEL_CACHE=0 GPULUA_CXX_MEMORY=512M", tmp)
  T.ok(not ok, "the compile fails")
  T.ok(out:find(path .. ":2: gpu.compile: ", 1, true) and
       out:find("the C++ compiler ran out of memory under the limit of 512M (GPULUA_CXX_MEMORY)", 1, true),
       "the message names the limit, at the script line: " .. out)
  T.is(compilers(tmp), "", "no compiler process is left")
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  T.sh("rm -rf " .. q(tmp))
end)

T.test("SIGINT (Ctrl-C) stops a compile: the compiler's processes and files go", function()
  local dir, tmp = mkdtemp(), mkdtemp()
  local fifo = dir .. "/fifo"
  assert(T.sh("mkfifo " .. q(fifo) .. " && echo made"):find("made"))
  local script = T.tmpfile("local gpu = require 'gpu'\nprint('compiling')\ngpu.compile(" ..
                           string.format("%q", FIFO_SRC:format(fifo)) .. ")\nprint('compiled')\n")
  local pat = tmp:gsub("[%^%$%.%*%+%?%(%)%[%]%{%}%|\\]", "\\%0") .. "/gpulua-c[c]-"
  -- start it; once its compiler runs, SIGINT; then its exit status (or
  -- "hung" when it does not end, and it is killed)
  local sh = string.format([[
TMPDIR=%s GPULUA_KERNEL_CACHE=0 %s --device host %s > %s.out 2>&1 &
pid=$!
i=0; while [ $i -lt 300 ] && ! pgrep -f %s > /dev/null; do sleep 0.1; i=$((i+1)); done
pgrep -f %s > /dev/null && echo started
kill -INT $pid
i=0; while [ $i -lt 100 ] && kill -0 $pid 2>/dev/null; do sleep 0.1; i=$((i+1)); done
if kill -0 $pid 2>/dev/null; then echo hung; kill -KILL $pid; fi
wait $pid; echo "status $?"
]], q(tmp), q(T.gpulua), q(script), q(dir), q(pat), q(pat))
  local res = T.sh(sh)
  local out = T.readfile(dir .. ".out") or ""
  T.ok(res:find("started", 1, true) ~= nil, "the compiler started: " .. res)
  T.ok(not res:find("hung", 1, true) and res:find("status 1\n", 1, true) ~= nil, "gpulua ends, exit status 1: " .. res)
  T.ok(out:find(script .. ":3: gpu.compile: interrupted", 1, true) ~= nil, "it says so at the script line: " .. out)
  T.ok(not out:find("compiled", 1, true), "the script stopped there")
  T.is(compilers(tmp), "", "no compiler process is left")
  T.is(listing(tmp), "", "no temporary file left in TMPDIR")
  T.sh("timeout 2 sh -c ': > " .. fifo .. "' 2>/dev/null")
  os.remove(script)
  os.remove(dir .. ".out")
  T.sh("rm -rf " .. q(dir) .. " " .. q(tmp))
end)

T.done()
