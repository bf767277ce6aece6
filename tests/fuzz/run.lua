-- `make fuzz`: runs the fuzzers of tests/fuzz/ for a given time on a fixed
-- set of seeds, and on a failure prints the seed and a minimal reproducer.
--
--   gpulua tests/fuzz/run.lua [api] [npy] [safetensors] [npz] [kernel_sig] [kcache]   (default: all)
--
-- npy, safetensors, npz, kernel_sig, kcache: the libFuzzer targets fuzz_<name>.c (built by `make fuzz`
--   with clang -fsanitize=fuzzer,address,undefined), started from their seed
--   corpus and crashes (tests/fuzz/corpus/<name>, tests/fuzz/crashes/<name>);
--   a failure is libFuzzer's (a crash, a sanitizer report, a leak, an input
--   slower than 10 s), minimized with -minimize_crash.
-- api: tests/fuzz/api.lua under the ASan+UBSan gpulua; a failure is a crash,
--   a sanitizer report, a hang, a leak or a non-zero exit, reduced to the
--   fewest statements of its log that still fail the same way.
--
-- Environment (the Makefile passes its variables of the same names):
--   FUZZ_SECONDS           time of each fuzzer, split over the seeds (60)
--   FUZZ_ITERS             the API fuzzer: this many statements per seed
--                          instead of a time
--   FUZZ_SEEDS             the seeds ("1 2 3")
--   FUZZ_MINIMIZE_SECONDS  time to reduce one failure (120)
--   FUZZ_GPULUA            the gpulua the API fuzzer runs (build-asan/gpulua)
--   FUZZ_DIR               where the libFuzzer binaries are and the results
--                          go (build/fuzz)
-- Exit status: 0 when no fuzzer failed.
local env = os.getenv
local SECONDS = tonumber(env("FUZZ_SECONDS") or "60") or error("FUZZ_SECONDS: a number expected")
local ITERS = env("FUZZ_ITERS") and (math.tointeger(tonumber(env("FUZZ_ITERS"))) or error("FUZZ_ITERS: an integer expected"))
local MINIMIZE = tonumber(env("FUZZ_MINIMIZE_SECONDS") or "120") or error("FUZZ_MINIMIZE_SECONDS: a number expected")
local GPULUA = env("FUZZ_GPULUA") or "build-asan/gpulua"
local DIR = env("FUZZ_DIR") or "build/fuzz"
local SEEDS = {}
for s in (env("FUZZ_SEEDS") or "1 2 3"):gmatch("%S+") do
  SEEDS[#SEEDS + 1] = math.tointeger(tonumber(s)) or error("FUZZ_SEEDS: integers expected, got " .. s)
end
assert(#SEEDS > 0, "FUZZ_SEEDS: no seed")
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local PER_SEED = math.max(1, math.floor(SECONDS / #SEEDS))
-- The sanitizers as the suite's ASan run sets them (Makefile SUITE_ENV);
-- the allocation cap keeps a huge but valid pinned tensor from taking the
-- machine's memory (it fails as out of memory instead).
-- ASAN_OPTIONS and UBSAN_OPTIONS set outside replace these.
local SAN_ENV = "ASAN_OPTIONS=" .. q(env("ASAN_OPTIONS") or "allocator_may_return_null=1:detect_leaks=1:max_allocation_size_mb=2048") ..
                " UBSAN_OPTIONS=" .. q(env("UBSAN_OPTIONS") or "halt_on_error=1:print_stacktrace=1") .. " GPULUA_SANITIZE=1"
local API_ENV = SAN_ENV .. " GPULUA_DEVICE=host GPULUA_HOST_MEMORY=1G GPULUA_SYNC_DEBUG=off"

local function sh(cmd)
  local ok, how, code = os.execute(cmd)
  if how == "signal" then return 128 + code end
  return ok and 0 or code
end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

local function spit(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- Absolute paths: the API fuzzer runs in a directory of its own, where
-- whatever files its calls write go.
local ROOT = io.popen("pwd"):read("l")
local function abs(p) return p:sub(1, 1) == "/" and p or ROOT .. "/" .. p end
local API = abs("tests/fuzz/api.lua")
-- the interpreter running this script (the lowest index of arg)
local SELF = "build/gpulua"
do
  local i = -1
  while arg[i - 1] do i = i - 1 end
  SELF = abs(arg[i] or SELF)
end
GPULUA = abs(GPULUA)
DIR = abs(DIR)

local function say(...)
  io.stdout:write(...)
  io.stdout:write("\n")
  io.stdout:flush()
end

-- The lines of s around the first sanitizer report, or its tail.
local function report_of(s)
  local lines = {}
  for l in s:gmatch("[^\n]*") do lines[#lines + 1] = l end
  for i, l in ipairs(lines) do
    if l:find("ERROR: %a+Sanitizer") or l:find("runtime error:") or l:find("^fuzz: ") then
      return table.concat(lines, "\n", i, math.min(#lines, i + 24))
    end
  end
  return table.concat(lines, "\n", math.max(1, #lines - 20))
end

-- What went wrong in a run: nil when nothing did.
local function classify(rc, out)
  if out:find("ERROR: AddressSanitizer") then return "AddressSanitizer report" end
  if out:find("ERROR: LeakSanitizer") then return "LeakSanitizer report (a leak)" end
  if out:find("runtime error:") or out:find("UndefinedBehaviorSanitizer") then return "UBSan report" end
  if rc == 124 or rc == 137 then return "hang (killed after the time limit)" end
  if rc == 3 and out:find("fuzz: leak:") then return "leak" end
  if rc > 128 then return "crash (signal " .. (rc - 128) .. ")" end
  if rc ~= 0 then return "exit status " .. rc end
  return nil
end

-- ---- the API fuzzer ------------------------------------------------------------

local function statements(path)
  local t = {}
  for l in io.lines(path) do
    if l ~= "" and not l:match("^%-%-") then t[#t + 1] = l end
  end
  return t
end

-- Runs the API fuzzer in work (made empty first) with the given variables.
local function run_api(work, vars, limit, out)
  sh("rm -rf " .. q(work) .. " && mkdir -p " .. q(work))
  return sh(string.format("cd %s && %s %s FUZZ_TMP=%s timeout -s KILL %d %s %s >%s 2>&1 </dev/null",
                          q(work), API_ENV, vars, q(work), limit, q(GPULUA), q(API), q(out)))
end

local function replay(lines, file, limit)
  spit(file, table.concat(lines, "\n") .. "\n")
  local out = file .. ".out"
  local rc = run_api(file .. ".work", "FUZZ_REPLAY=" .. q(file), limit, out)
  return classify(rc, slurp(out)), slurp(out)
end

-- The fewest statements that still fail as `kind`: the shortest tail first
-- (what killed it ran last), then chunks left out while it still fails.
local function minimize(lines, kind, base)
  local deadline = os.time() + MINIMIZE
  local tries = 0
  local limit = kind:find("^hang") and 15 or 120
  local function fails(cand)
    tries = tries + 1
    return replay(cand, base .. ".try.lua", limit) == kind
  end
  local cur = lines
  if not kind:find("leak") then
    local n = 1
    while n < #lines and os.time() < deadline do
      local tail = table.move(lines, #lines - n + 1, #lines, 1, {})
      if fails(tail) then cur = tail break end
      n = n * 4
    end
  end
  local chunks = 2
  while #cur > 1 and os.time() < deadline do
    local size = math.ceil(#cur / chunks)
    local removed = false
    for start = 1, #cur, size do
      if os.time() >= deadline then break end
      local cand = {}
      for i, l in ipairs(cur) do
        if i < start or i >= start + size then cand[#cand + 1] = l end
      end
      if #cand > 0 and fails(cand) then
        cur, removed = cand, true
        break
      end
    end
    if not removed then
      if size == 1 then break end
      chunks = math.min(#cur, chunks * 2)
    else
      chunks = math.max(chunks - 1, 2)
    end
  end
  sh("rm -rf " .. q(base .. ".try.lua") .. "*")
  return cur, tries, os.time() >= deadline
end

local function fuzz_api(seed)
  local out_dir = DIR .. "/api"
  sh("mkdir -p " .. q(out_dir))
  local base = string.format("%s/seed-%d", out_dir, seed)
  local log, out = base .. ".log", base .. ".out"
  local t0 = os.time()
  local how = ITERS and "FUZZ_ITERS=" .. ITERS or "FUZZ_SECONDS=" .. PER_SEED
  local rc = run_api(base .. ".work", string.format("FUZZ_SEED=%d %s FUZZ_LOG=%s", seed, how, q(log)),
                     (ITERS and 600 or PER_SEED) + 120, out)
  local text = slurp(out)
  local kind = classify(rc, text)
  local lines = statements(log)
  if not kind then
    sh("rm -rf " .. q(base .. ".work"))
    say(string.format("api seed %d: %d statements in %d s: no crash, hang or leak", seed, #lines, os.time() - t0))
    return true
  end
  say(string.format("api seed %d: FAILED: %s after %d statements (%s)", seed, kind, #lines, out))
  say(report_of(text))
  say(string.format("-- the last calls (of %s):", log))
  for i = math.max(1, #lines - 9), #lines do say(lines[i]) end
  say(string.format("-- reducing them (up to %d s) ...", MINIMIZE))
  local min, tries, out_of_time = minimize(lines, kind, base)
  local again = replay(min, base .. ".min.log", kind:find("^hang") and 15 or 120)
  if again ~= kind then
    say(string.format("api seed %d: the log does not reproduce it on its own (%s); rerun: FUZZ_SEED=%d %s %s %s",
                      seed, again or "it passed", seed, how, GPULUA, API))
    return false
  end
  local script = base .. ".repro.lua"
  -- written by this interpreter, not by the one that just failed
  sh(string.format("FUZZ_REPLAY=%s FUZZ_SCRIPT=%s %s %s", q(base .. ".min.log"), q(script), q(SELF), q(API)))
  say(string.format("-- minimal reproducer: %d statements (%d tries%s); seed %d; %s", #min, tries,
                    out_of_time and ", out of time: maybe not minimal" or "", seed, script))
  for _, l in ipairs(min) do say(l) end
  say(string.format("-- replay: FUZZ_REPLAY=%s %s %s   (stand-alone: %s %s)",
                    base .. ".min.log", GPULUA, API, GPULUA, script))
  return false
end

-- ---- the libFuzzer targets --------------------------------------------------------

local function fuzz_lib(name, seed)
  local bin = DIR .. "/fuzz_" .. name
  if sh("test -x " .. q(bin)) ~= 0 then
    say(string.format("%s: %s is not built (make fuzz builds it)", name, bin))
    return false
  end
  local out_dir = DIR .. "/" .. name
  local corpus = out_dir .. "/corpus"
  sh("mkdir -p " .. q(corpus) .. " " .. q(out_dir .. "/crashes"))
  local out = string.format("%s/seed-%d.out", out_dir, seed)
  -- new inputs go to the first directory; the seeds and old crashes are read
  local dirs = q(corpus) .. " tests/fuzz/corpus/" .. name
  if sh("test -d tests/fuzz/crashes/" .. name) == 0 then dirs = dirs .. " tests/fuzz/crashes/" .. name end
  local rc = sh(string.format("%s %s -seed=%d -max_total_time=%d -timeout=10 -rss_limit_mb=2048 -max_len=4096 " ..
                              "-print_final_stats=1 -artifact_prefix=%s/ %s >%s 2>&1",
                              SAN_ENV, q(bin), seed, PER_SEED, q(out_dir .. "/crashes"), dirs, q(out)))
  local text = slurp(out)
  if rc == 0 then
    local runs = text:match("Done (%d+) runs") or "?"
    local cov = "?"
    for c in text:gmatch("cov: (%d+)") do cov = c end
    say(string.format("%s seed %d: %s inputs in %d s, coverage %s: no crash", name, seed, runs, PER_SEED, cov))
    return true
  end
  local artifact = text:match("Test unit written to (%S+)")
  say(string.format("%s seed %d: FAILED (exit status %d; %s)", name, seed, rc, out))
  say(report_of(text))
  if not artifact then return false end
  local min = artifact .. ".min"
  sh(string.format("%s %s -minimize_crash=1 -max_total_time=%d -timeout=10 -exact_artifact_path=%s %s >%s.out 2>&1",
                   SAN_ENV, q(bin), math.max(1, MINIMIZE // 2), q(min), q(artifact), q(min)))
  if slurp(min) == "" then min = artifact end
  local bytes = slurp(min)
  say(string.format("-- minimal reproducer (%d bytes, seed %d): %s", #bytes, seed, min))
  say(string.format("%q", bytes:sub(1, 600)))
  say(string.format("-- replay: %s %s; keep it as a regression: cp %s tests/fuzz/crashes/%s/", bin, min, min, name))
  return false
end

-- ---- main ---------------------------------------------------------------------------

local which = #arg > 0 and arg or { "npy", "safetensors", "npz", "kernel_sig", "kcache", "api" }
local ok = true
for _, name in ipairs(which) do
  for _, seed in ipairs(SEEDS) do
    local good
    if name == "api" then
      good = fuzz_api(seed)
    elseif name == "npy" or name == "safetensors" or name == "npz" or name == "kernel_sig" or name == "kcache" then
      good = fuzz_lib(name, seed)
    else
      error("unknown fuzzer " .. name .. " (api, npy, safetensors, npz, kernel_sig or kcache)")
    end
    ok = ok and good
  end
end
say(ok and "fuzz: no failure" or "fuzz: FAILED (see above)")
os.exit(ok and 0 or 1)
