-- The fuzzers of tests/fuzz/ (make fuzz): what they found, kept as
-- regressions, and their own machinery (a short fixed-seed run of the API
-- fuzzer, its leak check, its logs and reproducers, and run.lua's report
-- of a failure: the seed and the fewest statements that still fail).
--
-- Inputs that crashed the libFuzzer targets are files in
-- tests/fuzz/crashes/<target>/, replayed by the C tests
-- build/tests/fuzz/replay_<target> of the same suite.  A crash the API
-- fuzzer finds goes here as a test that replays its minimal reproducer
-- (the statements of run.lua's seed-N.min.log) and expects status 0.
local gpu = require "gpu"
local T = require "gpu.test"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Absolute paths: the fuzzer runs in a directory of its own, where the files
-- its calls write go (run.lua does the same).
local ROOT = io.popen("pwd"):read("l")
local BIN = T.gpulua:sub(1, 1) == "/" and T.gpulua or ROOT .. "/" .. T.gpulua
local API = ROOT .. "/tests/fuzz/api.lua"
-- A valid but huge pinned tensor fails as out of memory instead of taking
-- the machine's: an address-space limit, or ASan's cap on one allocation.
-- Under the limit OpenBLAS (loaded at the fuzzer's first matmul) gets two
-- threads: with one per CPU on a 64-CPU host they could not all map their
-- buffers within 8 GB and spun, and the fuzzer never exited.
local CAP = os.getenv("GPULUA_SANITIZE") == "1"
  and "ASAN_OPTIONS=" .. q((os.getenv("ASAN_OPTIONS") or "") .. ":allocator_may_return_null=1:max_allocation_size_mb=2048")
  or "ulimit -v 8000000; OPENBLAS_NUM_THREADS=2"

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p " .. q(d)))
  return d
end

local function write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

-- Runs the API fuzzer (host backend) in dir with the given variables; its
-- output and exit status.  `timeout` only guards against a hang.
local function api(dir, vars)
  return T.sh(string.format("cd %s && %s GPULUA_DEVICE=host GPULUA_HOST_MEMORY=1G FUZZ_TMP=%s %s timeout -s KILL 300 %s %s 2>&1 </dev/null",
                            q(dir), CAP, q(dir), vars, q(BIN), q(API)))
end

-- Runs statements as the API fuzzer's log holds them, in a directory of
-- their own; output and exit status.
local function replay(statements)
  local dir = tmpdir()
  local log = dir .. "/statements.log"
  write(log, table.concat(statements, "\n") .. "\n")
  local out, status = api(dir, "FUZZ_REPLAY=" .. q(log))
  os.execute("rm -rf " .. q(dir))
  return out, status
end

T.test("API fuzzer: a fixed seed runs clean and leaves nothing", function()
  local dir = tmpdir()
  local out, status = api(dir, "FUZZ_SEED=2 FUZZ_ITERS=400 FUZZ_LOG=" .. q(dir .. "/log"))
  if not T.is(status, 0, "exit status 0") then T.diag(out) end
  T.ok(out:find("fuzz: seed 2: 400 statements, no crash, hang or leak", 1, true), "it says so")
  local n = 0
  for l in io.lines(dir .. "/log") do
    if not l:match("^%-%-") then n = n + 1 end
  end
  T.is(n, 400, "every statement is in the log before it runs")
  os.execute("rm -rf " .. q(dir))
end)

T.test("API fuzzer: a leak fails with status 3 and says what is left", function()
  local out, status = replay({ 'P[1] = gpu.ones({2})', 'rawset(_G, "kept", P[1])' })
  T.is(status, 3, "exit status 3")
  T.ok(out:find("fuzz: leak:", 1, true) and out:find("1 buffers", 1, true), "the leak is named: " .. out)
  out, status = replay({ 'P[1] = gpu.ones({2})', 'P[2] = P[1]:narrow(1, 1, 1)', 'P[1]:close()' })
  T.is(status, 0, "without the global: no leak")
end)

T.test("API fuzzer: errors are fine, and a log becomes a stand-alone script", function()
  local dir = tmpdir()
  local statements = { 'P[1] = gpu.zeros({2, 3}, {dtype = "i32"})', 'P[2] = P[1]:narrow(9, 1, 1)',
                       'P[1]:close()', 'P[3] = P[1] + 1', 'error("raised on purpose")',
                       'P[4] = gpu.task(F.await, gpu.stream())', 'P[5] = gpu.run()' }
  local log, script = dir .. "/min.log", dir .. "/repro.lua"
  write(log, "-- a comment line\n" .. table.concat(statements, "\n") .. "\n")
  local out, status = api(dir, "FUZZ_REPLAY=" .. q(log))
  if not T.is(status, 0, "the statements replay, their errors caught") then T.diag(out) end
  out, status = api(dir, "FUZZ_REPLAY=" .. q(log) .. " FUZZ_SCRIPT=" .. q(script))
  T.is(status, 0, "FUZZ_SCRIPT writes the script")
  local text = T.readfile(script) or ""
  T.ok(text:find("pcall(function() P[2] = P[1]:narrow(9, 1, 1) end)", 1, true), "one pcall per statement")
  T.ok(not text:find("a comment line", 1, true), "comments are left out")
  out, status = T.sh(string.format("cd %s && GPULUA_DEVICE=host %s %s 2>&1", q(dir), q(BIN), q(script)))
  if not T.is(status, 0, "the script runs on its own") then T.diag(out) end
  os.execute("rm -rf " .. q(dir))
end)

T.test("run.lua: a crash is reported with its seed and reduced to the statement", function()
  local dir = tmpdir()
  -- a gpulua that dies of SIGSEGV once a `gpu.synchronize()` statement has run
  local fake = dir .. "/gpulua"
  write(fake, table.concat({
    "#!/bin/sh",
    'if [ -n "$FUZZ_REPLAY" ]; then',
    '  grep -qxF "gpu.synchronize()" "$FUZZ_REPLAY" && kill -SEGV $$',
    '  exec ' .. q(BIN) .. ' "$@"',
    "fi",
    q(BIN) .. ' "$@" || exit $?',
    'grep -qxF "gpu.synchronize()" "$FUZZ_LOG" && kill -SEGV $$',
    "exit 0", "" }, "\n"))
  assert(os.execute("chmod +x " .. q(fake)))
  local out, status = T.sh(string.format(
    "%s GPULUA_DEVICE=host FUZZ_GPULUA=%s FUZZ_DIR=%s FUZZ_SEEDS=3 FUZZ_ITERS=2000 FUZZ_MINIMIZE_SECONDS=600 %s %s api 2>&1",
    CAP, q(fake), q(dir), q(BIN), q(ROOT .. "/tests/fuzz/run.lua")))
  T.is(status, 1, "run.lua fails")
  T.ok(out:find("api seed 3: FAILED: crash (signal 11)", 1, true), "names the seed and what happened")
  T.ok(out:find("-- the last calls", 1, true), "shows the last calls")
  local min = out:match("%-%- minimal reproducer: (%d+) statements")
  T.is(min, "1", "reduced to one statement")
  T.ok(out:find("statements[^\n]*\ngpu%.synchronize%(%)\n"), "the one that crashed")
  T.is(T.readfile(dir .. "/api/seed-3.min.log"), "gpu.synchronize()\n", "kept as a log to replay")
  T.ok((T.readfile(dir .. "/api/seed-3.repro.lua") or ""):find("pcall(function() gpu.synchronize() end)", 1, true),
       "and as a stand-alone script")
  if not min then T.diag(out) end
  os.execute("rm -rf " .. q(dir))
end)

T.done()
