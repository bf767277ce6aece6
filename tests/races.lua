-- The stream race checker (gpulua --check races, GPULUA_CHECK=races,
-- gpu.check_races): planted races raise at the racing op's line, naming both
-- ops, streams and lines, and enqueue nothing; the same code ordered by an
-- event, a wait, the default stream or a sync runs silently; the example
-- scripts run clean under the checker in a child; with the checker off the
-- racy code just runs.  Nothing here depends on timing.
local gpu = require "gpu"
local T = require "gpu.test"

local SRC = debug.getinfo(1, "S").short_src

-- the line of the call
local function here() return debug.getinfo(2, "l").currentline end

local function lit(s) return (s:gsub("%p", "%%%0")) end

local function name(s)
  if s.is_default then return "the default stream" end
  return (s.nonblocking and "nonblocking " or "") .. "stream " .. s.id
end

-- the pattern of a race message: `op` on s at line `l` <verb> a <kind>
-- buffer that `op2` on s2 at line `l2` <verb2>
local function race(op, s, l, verb, kind, op2, s2, l2, verb2)
  return lit(string.format("race: '%s' on %s (%s:%d) %s a %s buffer that '%s' on %s (%s:%d) %s, with no "
                           .. "event or wait ordering them", op, name(s), SRC, l, verb, kind, op2, name(s2),
                           SRC, l2, verb2))
end

local was = gpu.check_races(true)
T.ok(was == false or was == true, "gpu.check_races returns whether it was on")
T.is(gpu.check_races(), true, "gpu.check_races() says it is on")

-- Runs fn, which raises a race; then checks the message against the race
-- pattern that want(line of the racing op in fn) returns.
local function raises_race(fn, want, what)
  local msg = T.raises_at(fn, "race: ", what)
  if msg then
    local line = tonumber(msg:match("^[^:]+:(%d+):"))
    T.ok(line and msg:find(want(line)), "... naming both ops, streams and lines")
    if not (line and msg:find(want(line))) then T.diag(msg) end
  end
  return msg
end

-- a device tensor of n f32 set to v, and a pinned one of ones; setup synced
local function setup(n, v)
  local x = gpu.full({ n }, v or 0, { dtype = "f32" })
  local h = gpu.ones({ n }, { dtype = "f32", device = "pinned" })
  gpu.synchronize()
  return x, h
end

T.test("a read on another stream without the event's wait", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local x, h = setup(1024)
  local l1 = here(); x:copy(h, { stream = s1 })
  local ev <close> = s1:record()
  local before = gpu.stats()
  local msg = raises_race(function()
    x:add(1, { stream = s2 })
  end, function(l) return race("add", s2, l, "reads", "device", "copy", s1, l1, "writes") end,
    "add on s2 without waiting for the copy on s1 raises")
  T.ok(msg and msg:find("(record an event after the 'copy' and make " .. name(s2) .. " wait for it, "
                        .. "s:wait(ev), before the 'add')", 1, true), "... and says how to order them")
  local after = gpu.stats()
  T.is({ after.launches, after.copies }, { before.launches, before.copies }, "nothing was enqueued")
  -- the process goes on: with the wait the same op runs
  s2:wait(ev)
  local y = x:add(1, { stream = s2 })
  T.is(y:sum({ stream = s2 }):item(), 2048.0, "after s2:wait(ev) the add runs and sees the copy")
end)

T.test("a refused op leaves no ordering behind", function()
  local s <close> = gpu.stream()
  local nb2 <close> = gpu.stream { nonblocking = true }
  local nb <close> = gpu.stream { nonblocking = true }
  local x, y = setup(64), setup(64)
  y:fill(1, { stream = nb2 })
  local lx = here(); x:fill(2)                 -- the default stream
  T.raises(function() y:add(1, { stream = s }) end, "race: ", "s reads y unordered with nb2: raises")
  s:synchronize()                               -- s has nothing queued after x's fill
  raises_race(function()
    x:add(1, { stream = nb })
  end, function(l) return race("add", nb, l, "reads", "device", "fill", gpu.default_stream(), lx, "writes") end,
    "the refused op on s did not order the default stream's fill before the host")
  gpu.synchronize()
end)

T.test("ordered: event, wait on a stream, default stream, syncs, queries, host reads", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local s3 <close> = gpu.stream()
  -- s1 (or write(x)) writes a fresh x, order(x) orders it, then s2 reads and
  -- then overwrites x: neither may raise
  local function case(what, order, write)
    local x = gpu.zeros({ 256 }, { dtype = "f32" })
    gpu.synchronize()
    if write then write(x) else x:fill(1, { stream = s1 }) end
    order(x)
    local ok, err = pcall(function()
      local y = x:add(1, { stream = s2 })
      x:fill(2, { stream = s2 })
      return y
    end)
    T.ok(ok, what)
    if not ok then T.diag(err) end
  end
  case("an event recorded on s1, s2:wait(ev)", function() s2:wait(s1:record()) end)
  case("s2:wait(s1)", function() s2:wait(s1) end)
  case("s1:synchronize()", function() s1:synchronize() end)
  case("ev:synchronize()", function() s1:record():synchronize() end)
  case("gpu.synchronize()", function() gpu.synchronize() end)
  case("ev:query() polled until done", function()
    local ev = s1:record()
    while not ev:query() do end
  end)
  case("s1:query() polled until done", function() while not s1:query() do end end)
  case("a default-stream op in between (it and blocking streams order each other)", function(x) x:neg() end)
  case("item() of a later result of s1", function(x) x:sum({ stream = s1 }):item() end)
  case("a host read of the pinned destination of a later copy on s1", function(x)
    local h = gpu.pinned({ 256 }, { dtype = "f32" })
    h:copy(x, { stream = s1 })
    h:totable()
  end)
  case("s2 waited for s3, which waited for s1", function()
    s3:wait(s1:record())
    local z = gpu.empty({ 1 }, { stream = s3 })
    z:fill(0, { stream = s3 })
    s2:wait(s3:record())
  end)
  case("s1 waited for s3's write, then the host read what s1 wrote later", function(x)
    local h = gpu.pinned({ 256 }, { dtype = "f32" })
    s1:wait(s3:record())
    h:copy(x, { stream = s1 })
    h:totable()
  end, function(x) x:fill(1, { stream = s3 }) end)
  gpu.synchronize()
  collectgarbage()
end)

T.test("overwriting a buffer that a copy on another stream still reads", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local x, h = setup(512, 3)
  local l1 = here(); h:copy(x, { stream = s1 })         -- d2h: reads x
  raises_race(function()
    x:fill(0, { stream = s2 })
  end, function(l) return race("fill", s2, l, "writes", "device", "copy", s1, l1, "reads") end,
    "fill on s2 while s1's copy reads x raises")
  local ev <close> = s1:record()
  s2:wait(ev)
  x:fill(0, { stream = s2 })
  s2:synchronize()
  T.is(h:sum():item(), 1536.0, "with the wait: the copy read x before the fill")
  T.is(x:sum():item(), 0.0, "and the fill happened")
  -- a copy on s1 fills a pinned buffer, a host op then works on it (after a fence)
  h:copy(x, { stream = s1 })
  T.ok(pcall(function() h:add_(1) end), "a host op on the pinned destination waits for the copy: no race")
  T.ok(pcall(function() x:fill(4, { stream = s2 }) end),
       "and the copy that read x is ordered before what the host enqueues after that fence")
  T.is(h:sum():item(), 512.0, "the host op saw the copy's values")
  gpu.synchronize()
end)

T.test("a host wait knows what the stream knew then, not what it learnt later", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local s3 <close> = gpu.stream()
  local s4 <close> = gpu.stream()
  local x, z = setup(64), setup(64)
  local h = gpu.pinned({ 64 }, { dtype = "f32" })
  x:fill(1, { stream = s3 })
  s1:wait(s3:record())
  h:copy(x, { stream = s1 })                    -- s1 knows s3's fill here ...
  local lz = here(); z:fill(2, { stream = s4 })
  s1:wait(s4:record())                           -- ... and s4's fill only after the copy
  T.is(h:totable()[1], 1.0, "the host reads the pinned copy (a fence: waits for that copy only)")
  T.ok(pcall(function() x:fill(3, { stream = s2 }) end), "s2 may overwrite x: the copy had waited for s3's fill")
  raises_race(function()
    z:fill(4, { stream = s2 })
  end, function(l) return race("fill", s2, l, "writes", "device", "fill", s4, lz, "also writes") end,
    "but not z: s1 waited for s4 after the copy the host waited for")
  gpu.synchronize()
end)

T.test("a stream without the event, and write/write", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local s3 <close> = gpu.stream()
  local x = setup(128)
  local l1 = here(); x:fill(1, { stream = s1 })
  local ev <close> = s1:record()
  s2:wait(ev)
  local ly = here(); local y = x:mul(2, { stream = s2 })
  raises_race(function()
    x:mul(3, { stream = s3 })
  end, function(l) return race("mul", s3, l, "reads", "device", "fill", s1, l1, "writes") end,
    "s3 did not wait for the event: its read of x raises")
  raises_race(function()
    x:fill(5, { stream = s3 })
  end, function(l) return race("fill", s3, l, "writes", "device", "fill", s1, l1, "also writes") end,
    "two fills of x on two streams race")
  raises_race(function()
    y:fill(0, { stream = s1 })
  end, function(l) return race("fill", s1, l, "writes", "device", "mul", s2, ly, "also writes") end,
    "s1 overwrites the result that s2 wrote")
  s3:wait(s2)
  T.ok(pcall(function() x:fill(5, { stream = s3 }) end), "after s3:wait(s2) (s2 waited for s1) s3 may write x")
  gpu.synchronize()
end)

T.test("views race with their base allocation", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local x = setup(64)
  local a, b = x:narrow(1, 1, 32), x:narrow(1, 33, 32)
  local l1 = here(); a:fill(1, { stream = s1 })
  raises_race(function()
    b:fill(2, { stream = s2 })
  end, function(l) return race("fill", s2, l, "writes", "device", "fill", s1, l1, "also writes") end,
    "writes to two views of one allocation on two streams race (the check is per allocation)")
  gpu.synchronize()
end)

T.test("nonblocking streams are not ordered with the default stream", function()
  local nb <close> = gpu.stream { nonblocking = true }
  local dflt = gpu.default_stream()
  local x = setup(64)
  local l1 = here(); x:fill(1, { stream = nb })
  local msg = raises_race(function()
    x:add(1)
  end, function(l) return race("add", dflt, l, "reads", "device", "fill", nb, l1, "writes") end,
    "the default stream reads what a nonblocking stream writes: raises")
  T.ok(msg and msg:find("; a nonblocking stream is not ordered with the default stream)", 1, true),
       "... and the message says why")
  gpu.synchronize()
  local l3 = here(); x:fill(2)
  raises_race(function()
    x:add(1, { stream = nb })
  end, function(l) return race("add", nb, l, "reads", "device", "fill", dflt, l3, "writes") end,
    "a nonblocking stream reads what the default stream writes: raises")
  local blocking <close> = gpu.stream()
  T.ok(pcall(function() x:add(1, { stream = blocking }) end), "a blocking stream may")
  local ev <close> = gpu.default_stream():record()
  nb:wait(ev)
  T.ok(pcall(function() x:add(1, { stream = nb }) end), "and the nonblocking one after waiting for an event")
  gpu.synchronize()
end)

T.test("reads through item(), get() and totable() never race", function()
  local s1 <close> = gpu.stream()
  local nb <close> = gpu.stream { nonblocking = true }
  local x = setup(8)
  x:fill(3, { stream = s1 })
  T.is(x:get(1), 3.0, "get() on the default stream waits for s1's write")
  x:fill(4, { stream = nb })
  T.is(x:totable()[8], 4.0, "totable() waits for a nonblocking stream's write")
  T.ok(pcall(function() x:fill(5, { stream = s1 }) end), "and the host knows both writes are done")
  local y = x:sum({ stream = s1 })
  T.is(y:item(), 40.0, "item() of a result of s1")
  gpu.synchronize()
end)

T.test("a collective races like any op", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local x = setup(16)
  local l1 = here(); x:fill(2, { stream = s1 })
  raises_race(function()
    gpu.all_reduce(x, { stream = s2 })
  end, function(l) return race("all_reduce", s2, l, "reads", "device", "fill", s1, l1, "writes") end,
    "all_reduce on s2 reads what s1 writes: raises")
  s2:wait(s1)
  gpu.all_reduce(x, { stream = s2 })
  T.is(x:sum({ stream = s2 }):item(), 32.0 * gpu.world_size, "with the wait it runs")
  gpu.synchronize()
end)

T.test("run-time kernels: a pointer parameter is a read if const, else a write", function()
  local m = gpu.compile([[
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
]])
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local n = 256
  local x, y = setup(n, 1), setup(n, 2)
  local lx = here(); x:fill(3, { stream = s1 })
  raises_race(function()
    m.saxpy { grid = 1, block = n, stream = s2 } (2.0, x, y, n)
  end, function(l) return race("saxpy", s2, l, "reads", "device", "fill", s1, lx, "writes") end,
    "a kernel reading (const) what another stream writes raises")
  s2:wait(s1)
  local ls = here(); m.saxpy { grid = 1, block = n, stream = s2 } (2.0, x, y, n)
  T.ok(pcall(function() x:sum({ stream = s1 }) end), "another stream may read the kernel's const input")
  raises_race(function()
    y:sum({ stream = s1 })
  end, function(l) return race("sum", s1, l, "reads", "device", "saxpy", s2, ls, "writes") end,
    "reading the kernel's output on another stream raises")
  s1:wait(s2)
  T.is(y:sum({ stream = s1 }):item(), n * (2 * 3 + 2.0), "with the wait: y = 2x + y")
  gpu.synchronize()
end)

T.test("freed and reallocated memory has no history", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  for i = 1, 4 do
    local x = gpu.empty({ 4096 }, { dtype = "f32" })
    x:fill(1, { stream = s1 })
    x = nil -- luacheck: ignore
    collectgarbage(); collectgarbage()
    local y = gpu.empty({ 4096 }, { dtype = "f32" })
    T.ok(pcall(function() y:fill(2, { stream = s2 }) end), "a new allocation written on s2 (" .. i .. ")")
  end
  gpu.synchronize()
end)

T.test("with the checker off the racy code runs", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local x, h = setup(64)
  local y = setup(64)
  T.is(gpu.check_races(false), true, "gpu.check_races(false) returns that it was on")
  x:copy(h, { stream = s1 })
  T.ok(pcall(function() x:add(1, { stream = s2 }) end), "the unordered read runs")
  T.ok(pcall(function() x:fill(1, { stream = s1 }) end), "the unordered write runs")
  -- on again: history starts over, work from before it is not known
  y:fill(3, { stream = s1 })
  T.is(gpu.check_races(true), false, "gpu.check_races(true) returns that it was off")
  T.ok(pcall(function() y:add(1, { stream = s2 }) end), "work from before the checker was on is not checked")
  gpu.synchronize()
  local l1 = here(); y:fill(4, { stream = s1 })
  raises_race(function()
    y:add(1, { stream = s2 })
  end, function(l) return race("add", s2, l, "reads", "device", "fill", s1, l1, "writes") end,
    "work from after it is")
  gpu.synchronize()
end)

T.test("bad input", function()
  T.raises_at(function() gpu.check_races("yes") end, "boolean expected", "gpu.check_races takes a boolean")
end)

-- ---- in a child gpulua ---------------------------------------------------

local run = T.run

local RACY = [[local gpu = require "gpu"
local s1, s2 = gpu.stream(), gpu.stream()
local x = gpu.zeros({64})
local h = gpu.ones({64}, {device = "pinned"})
gpu.synchronize()
x:copy(h, {stream = s1})
local y = x:add(1, {stream = s2})
gpu.synchronize()
print("done", y:sum():item() >= 64)
]]

T.test("--check races and GPULUA_CHECK=races in a child", function()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(RACY)
  f:close()
  local out, ok = run("GPULUA_CHECK=", "--device host " .. path)
  T.ok(ok and out:find("done\ttrue", 1, true), "without the checker the racy script runs")
  if not ok then T.diag(out) end
  for _, how in ipairs { { "GPULUA_CHECK=", "--check races" }, { "GPULUA_CHECK=races", "" },
                         { "GPULUA_CHECK=", "--check=races" } } do
    out, ok = run(how[1], "--device host " .. how[2] .. " " .. path)
    local what = how[1] .. " " .. how[2]
    T.ok(not ok, what .. ": the racy script exits non-zero")
    T.ok(out:find(":7: add: race: 'add' on stream 2 (" .. path .. ":7) reads a device buffer that 'copy' on "
                  .. "stream 1 (" .. path .. ":6) writes", 1, true), what .. ": naming both lines")
    T.ok(not out:find("done", 1, true), what .. ": stopped at the race")
  end
  os.remove(path)

  out, ok = run("", "--check frobnicate -e 'print(1)'")
  T.ok(not ok and out:find("unknown --check value 'frobnicate' (expected races)", 1, true)
       and out:find("usage:", 1, true), "--check with an unknown value: a usage error")
  out, ok = run("", "--check")
  T.ok(not ok and out:find("'--check' needs argument", 1, true), "--check without a value: a usage error")
  out, ok = run("", "-n 2 --check nope -e 'print(1)'")
  T.ok(not ok and out:find("unknown --check value 'nope'", 1, true), "... also under -n")
  out, ok = run("GPULUA_CHECK=rice", "-e 'print(1)'")
  T.ok(not ok and out:find("GPULUA_CHECK: unknown check 'rice' (expected races or none)", 1, true),
       "GPULUA_CHECK with an unknown value: a clear error")
  out, ok = run("GPULUA_CHECK=none", "-e 'print(gpu.check_races())'")
  T.ok(ok and out:find("false", 1, true), "GPULUA_CHECK=none: off")
  out, ok = run("GPULUA_CHECK=", "--check races -e 'print(gpu.check_races())'")
  T.ok(ok and out:find("true", 1, true), "--check races turns it on before the script runs")
end)

T.test("the example scripts are race-free under the checker", function()
  local cases = {
    { "", "scripts/overlap.lua" },
    { "", "scripts/overlap.lua 6 65536" },
    { "", "scripts/overlap.lua 8 4096 passes=2" },
    { "", "scripts/overlap_pipeline.lua 6 65536" },
    { "", "scripts/overlap_pipeline.lua 7 4096 passes=2" },
    { "-n 2", "scripts/data_parallel.lua 4096" },
    { "-n 4", "scripts/data_parallel.lua 4096" },
    { "-n 2", "scripts/ring.lua 1000" },
    { "-n 4", "scripts/ring.lua 1000" },
    { "-n 2", "scripts/rank_pipeline.lua 9 1000" },
    { "-n 2", "scripts/ddp_mlp.lua 20" },
    { "-n 2", "scripts/tensor_parallel.lua 20" },
    { "-n 4", "scripts/tensor_parallel.lua 20" },
    { "-n 2", "scripts/ddp_mlp.lua 5 16 accum=3" },
    { "-n 2", "scripts/zero.lua stage=1 width=64 layers=3 steps=4 batch=8" },
    { "-n 4", "scripts/zero.lua stage=2 width=64 layers=3 steps=4 batch=8" },
    { "-n 2", "scripts/zero.lua stage=2 width=64 layers=3 steps=4 batch=8 graph=1" },
    { "-n 4", "scripts/zero.lua stage=1 width=64 layers=3 steps=4 batch=8 graph=1" },
  }
  for _, c in ipairs(cases) do
    for _, how in ipairs { { "GPULUA_CHECK=", "--check races" }, { "GPULUA_CHECK=races", "" } } do
      local args = string.format("%s --device host %s %s", c[1], how[2], c[2])
      local out, ok = run(how[1] .. " GPULUA_HOST_JITTER=1", args)
      T.ok(ok and out:find("check ok", 1, true) and not out:find("race", 1, true),
           how[1] .. " " .. args .. ": exits 0, checks ok, no race")
      if not ok then T.diag(out) end
    end
  end
  -- overlap.lua's unsafe variant is a real race: caught at once, every time
  local out, ok = run("GPULUA_CHECK=", "--device host --check races scripts/overlap.lua 4 4096 unsafe passes=2")
  T.ok(not ok and out:find("race: '[%w_]+' on stream 2 %(scripts/overlap%.lua:%d+%) reads a device buffer "
                           .. "that 'copy' on stream 1 %(scripts/overlap%.lua:%d+%) writes"),
       "overlap.lua unsafe: the compute stream's read of the copy's buffer is refused")
  if ok then T.diag(out) end
end)

gpu.check_races(was)
T.done()
