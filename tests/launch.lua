-- The rank launcher, `gpulua -n N script.lua`: each rank's environment, the
-- relay of its output (with and without the "[rank R] " prefix), the exit
-- status and summary when a rank fails, Ctrl-C, and bad options.  The ranks
-- are child processes running the helper scripts in tests/launch/ on the host
-- backend; `timeout 60` around each run only guards against a hang.
local T = require "gpu.test"

local BIN = T.gpulua
local DIR = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/launch/"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function helper(name) return q(DIR .. name) end

local sh = T.sh

-- Runs `gpulua <args>` under timeout; redirect defaults to 2>&1.
local function run(args, redirect)
  return sh(string.format("timeout 60 %s %s %s", q(BIN), args, redirect or "2>&1"))
end

local function lines(s)
  local t = {}
  for l in s:gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

-- the number of lines of s that match pattern
local function count(s, pattern)
  local n = 0
  for _, l in ipairs(lines(s)) do
    if l:find(pattern) then n = n + 1 end
  end
  return n
end

-- the env.lua lines of a run, by RANK
local function env_lines(out)
  local by = {}
  for l in out:gmatch("[^\n]+") do
    local e = {}
    for k, v in l:gmatch("([%w_]+)=(%S+)") do e[k] = v end
    if tonumber(e.rank) then by[tonumber(e.rank)] = e end
  end
  return by
end

T.test("every rank gets its environment and the script's arguments", function()
  local out, code = run("-n 4 --device host " .. helper("env.lua") .. " hello")
  T.is(code, 0, "-n 4: exit status 0 when every rank exits 0")
  local by = env_lines(out)
  local ranks, port = {}, nil
  for r = 0, 3 do
    local e = by[r]
    if T.ok(e ~= nil, "rank " .. r .. " printed its line") then
      ranks[#ranks + 1] = r
      T.is({e.world, e.local_world, e["local"], e.addr, e.launcher, e.arg1},
           {"4", "4", tostring(r), "127.0.0.1", "1", "hello"},
           "rank " .. r .. ": WORLD_SIZE, LOCAL_WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, GPULUA_LAUNCHER, arg[1]")
      port = port or e.port
      T.is(e.port, port, "rank " .. r .. ": the same MASTER_PORT as rank 0")
    end
  end
  T.is(ranks, {0, 1, 2, 3}, "four distinct ranks 0..3")
  local p = tonumber(port)
  T.ok(math.type(p) == "integer" and p > 0 and p < 65536, "MASTER_PORT is a port number: " .. tostring(port))
  T.is(#lines(out), 4, "one line per rank, nothing else")
  if code ~= 0 then T.diag(out) end
end)

T.test("-n forms, options passed through, -n 1", function()
  local out, code = run("-n2 --device host -e X=7 " .. helper("env.lua"))
  local by = env_lines(out)
  T.is(code, 0, "-n2 exits 0")
  T.ok(by[0] and by[1] and not by[2], "-n2 runs ranks 0 and 1")
  T.ok(by[0] and by[0].x == "7" and by[1] and by[1].x == "7", "-e reaches every rank")
  out, code = run("--device host -n=3 " .. helper("env.lua"))
  by = env_lines(out)
  T.ok(code == 0 and by[2] and by[2].world == "3", "-n=3 after another option runs 3 ranks")
  out, code = run("-n 1 --device host " .. helper("env.lua"))
  by = env_lines(out)
  T.ok(code == 0 and by[0] and by[0].world == "1" and by[0].local_world == "1" and by[0]["local"] == "0",
       "-n 1: RANK 0, WORLD_SIZE 1, LOCAL_RANK 0")
  out, code = run("--device host " .. helper("env.lua") .. " -n 2")
  by = env_lines(out)
  T.ok(code == 0 and by[0] == nil and out:find("rank=nil", 1, true) and out:find("arg1=-n", 1, true),
       "-n after the script is the script's argument: no launcher")
  out, code = run("-n 2 --device host -e 'print(\"r\" .. os.getenv(\"RANK\"), io.read(\"l\"))'",
                  "2>&1 <<'EOF'\nfrom stdin\nEOF")
  T.ok(code == 0 and out:find("r0\tfrom stdin", 1, true) and out:find("r1\tnil", 1, true),
       "rank 0 reads the launcher's stdin, rank 1 reads /dev/null")
  if code ~= 0 then T.diag(out) end
end)

T.test("several nodes: global ranks from --node-rank", function()
  local out, code = run("--nnodes 2 --node-rank 1 --master 127.0.0.1:29999 -n 2 --device host "
                        .. helper("env.lua"))
  T.is(code, 0, "exit status 0")
  local by = env_lines(out)
  for l, r in ipairs { 2, 3 } do
    local e = by[r]
    if T.ok(e ~= nil, "rank " .. r .. " ran") then
      T.is({e.world, e["local"], e.local_world, e.addr, e.port},
           {"4", tostring(l - 1), "2", "127.0.0.1", "29999"},
           "rank " .. r .. ": WORLD_SIZE 4, LOCAL_RANK " .. (l - 1) .. ", LOCAL_WORLD_SIZE 2, --master's address")
    end
  end
  T.ok(by[0] == nil and by[1] == nil, "no ranks 0 or 1 on node 1")
  out = run("--master [::1]:1234 -n 1 --device host " .. helper("env.lua"))
  T.ok(out:find("addr=::1 port=1234", 1, true), "--master [::1]:1234 on one node")
end)

T.test("output prefix", function()
  local cmd = "-n 2 --device host --prefix " .. helper("lines.lua")
  local out, code = run(cmd, "2>/dev/null")
  T.is(code, 0, "--prefix: exit status 0")
  local got = lines(out)
  T.is(#got, 6, "three stdout lines per rank, the last one ended by the launcher")
  local all = true
  for _, l in ipairs(got) do
    local r, text = l:match("^%[rank (%d)%] (.*)$")
    all = all and r ~= nil and (text == "out " .. r .. " a" or text == "out " .. r .. " b" or text == "tail " .. r)
  end
  T.ok(all, "every stdout line is '[rank R] ' and that rank's own line")
  for r = 0, 1 do
    local a = out:find("[rank " .. r .. "] out " .. r .. " a\n", 1, true)
    local b = out:find("[rank " .. r .. "] out " .. r .. " b\n", 1, true)
    local t = out:find("[rank " .. r .. "] tail " .. r .. "\n", 1, true)
    T.ok(a and b and t and a < b and b < t, "rank " .. r .. "'s lines in order, the partial last line ended")
  end
  local err = run(cmd, "2>&1 >/dev/null")
  local e = lines(err); table.sort(e)
  T.is(e, {"[rank 0] err 0", "[rank 1] err 1"}, "stderr lines go to stderr, prefixed")

  out = run("-n 2 --device host --no-prefix " .. helper("lines.lua"), "2>/dev/null")
  local o = lines(out); table.sort(o)
  T.is(o, {"out 0 a", "out 0 b", "out 1 a", "out 1 b", "tail 0", "tail 1"}, "--no-prefix: the lines as written")
  out = run("-n 2 --device host " .. helper("lines.lua"))
  o = lines(out); table.sort(o)
  T.is(o, {"err 0", "err 1", "out 0 a", "out 0 b", "out 1 a", "out 1 b", "tail 0", "tail 1"},
       "default with output to a pipe: no prefix")
end)

T.test("a rank that exits non-zero stops the others", function()
  local out, code = run("-n 3 --device host " .. helper("fail.lua") .. " exit3")
  T.is(code, 3, "the launcher exits with the rank's status 3")
  T.ok(out:find("gpulua: rank 2 failed: exit status 3\n", 1, true), "the summary names rank 2 and its status")
  T.ok(out:find("\n  rank 2: rank 2 fails by exit3\n", 1, true), "... followed by its last stderr line")
  T.is(count(out, "survived"), 0, "the sleeping ranks were stopped (none printed 'survived')")
  if code ~= 3 then T.diag(out) end
end)

T.test("a Lua error in a rank", function()
  local out, code = run("-n 2 --device host " .. helper("fail.lua") .. " error")
  T.is(code, 1, "exit status 1")
  local line
  local n = 0
  for l in io.lines(DIR .. "fail.lua") do
    n = n + 1
    if l:find('error("rank "', 1, true) then line = n end
  end
  local where = DIR .. "fail.lua:" .. line .. ": rank 1 gives up"
  T.ok(out:find("gpulua: rank 1 failed: exit status 1\n", 1, true), "the summary names rank 1")
  T.ok(out:find("\n  rank 1: gpulua: " .. where .. "\n", 1, true),
       "the summary shows the error with the script's name and line: " .. where)
  T.ok(out:find("\n  rank 1: stack traceback:", 1, true), "... and its traceback")
  T.is(count(out, "survived"), 0, "rank 0 was stopped")
  if code ~= 1 then T.diag(out) end
end)

T.test("a rank killed by SIGKILL", function()
  local out, code = run("-n 2 --device host " .. helper("fail.lua") .. " kill9")
  T.is(code, 137, "exit status 128 + 9")
  T.ok(out:find("gpulua: rank 1 failed: killed by signal 9 (Killed)\n", 1, true), "the summary says killed by signal 9")
  T.ok(out:find("\n  rank 1: rank 1 fails by kill9\n", 1, true), "... with its last stderr line")
  T.is(count(out, "survived"), 0, "rank 0 was stopped")
  if code ~= 137 then T.diag(out) end
end)

T.test("SIGINT to the launcher stops every rank", function()
  local log = os.tmpname()
  local script = string.format([[
%s -n 2 --device host %s >%s 2>&1 & p=$!
i=0
while [ "$(grep -c '^ready' %s)" -lt 2 ] && [ $i -lt 500 ]; do sleep 0.1; i=$((i+1)); done
kill -INT $p; wait $p; echo status=$?]], q(BIN), helper("spin.lua"), q(log), q(log))
  local st = sh("timeout 60 sh -c " .. q(script))
  local f = assert(io.open(log))
  local out = f:read("a")
  f:close()
  os.remove(log)
  T.is(st, "status=130\n", "the launcher exits 130")
  T.is(count(out, "^ready %d$"), 2, "both ranks had started")
  T.is(count(out, "interrupted!"), 2, "each rank got the SIGINT (its Lua code was interrupted)")
  T.is(count(out, "survived"), 0, "no rank ran on")
  T.ok(out:find("gpulua: stopped all ranks on signal 2 (Interrupt)", 1, true), "the launcher says why it stopped")
  if st ~= "status=130\n" then T.diag(out) end
end)

T.test("a rank that cannot start", function()
  -- 20 descriptors: the launcher runs out of them for its pipes after a few ranks
  local out, code = sh(string.format("ulimit -n 20 && timeout 60 %s -n 12 --device host %s sleep 2>&1",
                                     q(BIN), helper("fail.lua")))
  T.is(code, 1, "exit status 1")
  T.ok(out:find("gpulua: cannot start rank %d+: Too many open files\n"), "the launcher names the rank and the error")
  T.is(count(out, "survived"), 0, "the ranks that had started were stopped")
  if code ~= 1 then T.diag(out) end
  -- rank 0 made the job's shared memory and was stopped while waiting for
  -- the others: the launcher removes it
  local port = 20000 + os.time() % 20000
  sh(string.format("ulimit -n 20 && timeout 60 %s --master 127.0.0.1:%d -n 12 --device host %s sleep 2>&1",
                   q(BIN), port, helper("fail.lua")))
  local uid = sh("id -u"):match("%d+")
  local left = sh(string.format("ls /dev/shm/gpulua-%s-%d-* 2>/dev/null", uid, port))
  T.is(left, "", "no shared memory segment of the job is left in /dev/shm")
end)

T.test("bad launcher options", function()
  local env = helper("env.lua")
  local cases = {
    { "-n 0 " .. env, "gpulua: -n needs a positive integer, got '0'" },
    { "-n -1 " .. env, "gpulua: -n needs a positive integer, got '-1'" },
    { "-n x " .. env, "gpulua: -n needs a positive integer, got 'x'" },
    { "-n", "gpulua: -n needs a positive integer\n" },
    { "-n 5000 " .. env, "gpulua: -n 5000: at most 1024 ranks per node" },
    { "-n 2 -n 3 " .. env, "gpulua: -n given twice" },
    { "-n 2", "gpulua: -n needs a script (or -e) to run on each rank" },
    { "-n 2 --device host", "gpulua: -n needs a script (or -e) to run on each rank" },
    { "-n 2 -i " .. env, "gpulua: -n cannot be used with -i" },
    { "-n 2 -", "gpulua: -n cannot read the script from stdin" },
    { "-n 2 -x " .. env, "gpulua: unrecognized option '-x'" },
    { "--nnodes 2 -n 2 " .. env, "gpulua: --nnodes 2 needs --master host:port" },
    { "--nnodes 0 -n 2 " .. env, "gpulua: --nnodes needs a positive integer, got '0'" },
    { "--nnodes 2 --node-rank 2 --master 127.0.0.1:29999 -n 2 " .. env,
      "gpulua: --node-rank needs an integer from 0 to 1 (--nnodes 2), got '2'" },
    { "--node-rank 1 -n 2 " .. env, "gpulua: --node-rank needs an integer from 0 to 0 (--nnodes 1), got '1'" },
    { "--master 127.0.0.1 -n 2 " .. env, "gpulua: --master needs host:port, got '127.0.0.1'" },
    { "--master 127.0.0.1:x -n 2 " .. env, "gpulua: --master needs host:port, got '127.0.0.1:x'" },
    { "--prefix " .. env, "gpulua: --prefix needs -n N" },
  }
  for _, c in ipairs(cases) do
    local out, code = run(c[1] .. " </dev/null")
    local ok = code == 1 and out:find(c[2], 1, true) == 1 and out:find("\nusage: ", 1, true) ~= nil
               and not out:find("rank=", 1, true)
    local shown = c[1]:gsub("'[^']*/launch/", "'"):gsub("\n", "")
    T.ok(ok, "gpulua " .. shown .. ": " .. c[2]:gsub("\n", ""))
    if not ok then T.diag("exit status " .. tostring(code) .. ", output:\n" .. out) end
  end
end)

T.done()
