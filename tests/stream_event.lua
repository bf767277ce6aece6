-- Streams and events: creation options, query/synchronize/record/wait,
-- gpu.using scopes (nested, per coroutine), event timing and its errors.
local gpu = require "gpu"
local T = require "gpu.test"

T.test("stream options", function()
  local s = gpu.stream()
  T.is(s.priority, "normal", "default priority is normal")
  T.is(s.nonblocking, false, "default is blocking")
  for _, p in ipairs { "low", "normal", "high" } do
    local x <close> = gpu.stream { priority = p }
    T.is(x.priority, p, "priority " .. p)
  end
  local nb = gpu.stream { nonblocking = true }
  T.is(nb.nonblocking, true, "nonblocking = true")
  nb:close()
  T.raises_at(function() gpu.stream { priority = "urgent" } end, "priority", "unknown priority raises")
  T.raises_at(function() gpu.stream(5) end, "bad argument", "non-table options raise")
  T.ok(tostring(s):find("Stream"), "tostring names a stream: " .. tostring(s))
  s:close()
  T.is(gpu.stats().streams, 0, "closed streams are not live")
end)

T.test("query, synchronize, record", function()
  local s <close> = gpu.stream()
  T.is(s:query(), true, "a fresh stream is idle")
  gpu.sleep(200, { stream = s })
  T.is(s:query(), false, "busy while a sleep runs")
  local ev = s:record()
  T.is(getmetatable(ev), getmetatable(gpu.event()), "s:record() returns an Event")
  T.is(ev:query(), false, "the recorded event is pending")
  s:synchronize()
  T.is(s:query(), true, "idle after synchronize")
  T.is(ev:query(), true, "the event completed with the stream")
  local ev2 = gpu.event()
  T.is(ev2:query(), true, "a never-recorded event queries true (as CUDA)")
  ev2:record(s)
  ev2:synchronize()
  T.is(ev2:query(), true, "event:synchronize waits for it")
  ev:close(); ev2:close()
end)

T.test("wait on an event and on a stream orders work", function()
  local a <close> = gpu.stream()
  local b <close> = gpu.stream()
  local x = gpu.zeros({1024}, { dtype = "i32" })
  gpu.synchronize()
  -- b must not add before a has filled: a is held by a sleep first
  gpu.sleep(200, { stream = a })
  x:fill(5, { stream = a })
  local ev <close> = a:record()
  b:wait(ev)
  local y = x:add(1, { stream = b })
  T.is(b:query(), false, "b is held by its wait")
  b:synchronize()
  T.is(y:totable()[1024], 6, "b saw a's fill through the event")
  T.is(y:sum():item(), 6 * 1024, "every element")

  gpu.sleep(200, { stream = a })
  x:fill(7, { stream = a })
  b:wait(a)                                   -- wait for all of a's current work
  local z = x:add(1, { stream = b })
  b:synchronize()
  T.is(z:min():item(), 8, "b saw a's fill through s:wait(stream)")
  T.raises_at(function() b:wait(5) end, "bad argument", "wait(number) raises")
  T.raises_at(function() b:wait() end, "bad argument", "wait() raises")
end)

T.test("gpu.using makes a stream current and restores on close", function()
  local def = gpu.default_stream()
  T.is(gpu.current_stream(), def, "the default stream is current at first")
  local s1 = gpu.stream()
  local s2 = gpu.stream()
  do
    local _ <close> = gpu.using(s1)
    T.is(gpu.current_stream(), s1, "using(s1) makes s1 current")
    do
      local _ <close> = gpu.using(s2)
      T.is(gpu.current_stream(), s2, "nested using(s2)")
      -- work without stream= goes to the current stream
      gpu.sleep(200)
      T.is(s2:query(), false, "gpu.sleep() went to s2")
      T.is(s1:query(), true, "... not to s1")
    end
    T.is(gpu.current_stream(), s1, "inner scope exit restores s1")
  end
  T.is(gpu.current_stream(), def, "outer scope exit restores the default stream")
  -- an error inside the scope still restores
  pcall(function()
    local _ <close> = gpu.using(s1)
    error("boom")
  end)
  T.is(gpu.current_stream(), def, "restored after an error in the scope")
  T.raises_at(function() gpu.using("s") end, "bad argument", "using(string) raises")
  s2:synchronize()
  s1:close(); s2:close()
end)

T.test("current stream is per coroutine", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local _ <close> = gpu.using(s1)
  local inside
  local co = coroutine.create(function()
    local _ <close> = gpu.using(s2)
    inside = gpu.current_stream()
    coroutine.yield()
    inside = gpu.current_stream()
  end)
  coroutine.resume(co)
  T.is(inside, s2, "the coroutine sees its own using")
  T.is(gpu.current_stream(), s1, "the main thread still has s1 while the coroutine is suspended")
  inside = nil
  coroutine.resume(co)
  T.is(inside, s2, "the coroutine keeps s2 across a yield")
  T.is(coroutine.status(co), "dead", "coroutine finished")
  T.is(gpu.current_stream(), s1, "main thread unaffected")
end)

-- The main thread's current stream is remembered between ops (it is read
-- for every op); every change of it must be seen.  A closed stream left
-- current raises, so an op that still went to a stream no longer current
-- would raise here.
T.test("ops follow the current stream through scopes, errors, coroutines and graphs", function()
  local x <close> = gpu.zeros({ 4 })
  local s1 = gpu.stream()
  do
    local _ <close> = gpu.using(s1)
    x:add_(1)
  end
  s1:close()
  x:add_(1)   -- on the default stream again
  T.is(x:sum():item(), 8.0, "after a using scope ends, ops leave its stream")

  local s2 = gpu.stream()
  T.raises_at(function()
    local _ <close> = gpu.using(s2)
    x:add_(1)
    s2:close()
    x:add_(1)
  end, "current stream", "inside the scope, a closed current stream raises")
  x:add_(1)
  T.is(x:sum():item(), 16.0, "and after it, ops run on the default stream")

  local s3 = gpu.stream()
  local co = coroutine.wrap(function()
    local _ <close> = gpu.using(s3)
    x:add_(1)
    coroutine.yield()
    x:add_(1)
  end)
  x:add_(1)
  co()
  s3:synchronize()
  x:add_(1)   -- the main thread never used s3
  T.is(gpu.current_stream(), gpu.default_stream(), "a coroutine's gpu.using leaves the main thread's stream")
  co()
  s3:synchronize()
  s3:close()
  x:add_(1)
  T.is(x:sum():item(), 36.0, "ops of both threads ran")

  local s4 = gpu.stream()
  local ok = pcall(function()
    local _ <close> = gpu.using(s4)
    x:add_(1)
    error("out of the scope")
  end)
  T.ok(not ok, "the scope raised")
  s4:synchronize()
  s4:close()
  x:add_(1)
  T.is(x:sum():item(), 44.0, "an error leaving a using scope restores the stream")

  local g <close> = gpu.graph(function() x:add_(1) end)
  x:add_(1)
  g:launch()
  gpu.synchronize()
  T.is(x:sum():item(), 52.0, "after a capture, ops go to the current stream again")
end)

T.test("event timing", function()
  local ev1 = gpu.event { timing = true }
  local ev2 = gpu.event { timing = true }
  local s <close> = gpu.stream()
  ev1:record(s)
  gpu.sleep(20, { stream = s })
  ev2:record(s)
  ev2:synchronize()
  local ms = ev2 - ev1
  T.is(math.type(ms), "float", "ev2 - ev1 is a float")
  T.ok(ms > 0, "ev2 - ev1 > 0 after a 20 ms sleep")
  T.diag(string.format("measured %.3f ms for gpu.sleep(20)", ms))
  T.is(ev1:elapsed(ev2), ms, "ev1:elapsed(ev2) equals ev2 - ev1")
  local ev3 = s:record { timing = true }
  ev3:synchronize()
  T.ok(ev3 - ev1 >= ms, "a later event is later")
  ev1:close(); ev2:close(); ev3:close()
end)

T.test("elapsed errors", function()
  local s <close> = gpu.stream()
  local a = gpu.event { timing = false }
  local b = gpu.event { timing = false }
  a:record(s); b:record(s); s:synchronize()
  T.raises_at(function() return b - a end, "timing", "elapsed without timing raises")
  local c = gpu.event { timing = true }
  local d = gpu.event { timing = true }
  T.raises_at(function() return d - c end, "record", "elapsed on never-recorded events raises")
  c:record(s)
  gpu.sleep(300, { stream = s })
  d:record(s)
  T.raises_at(function() return c:elapsed(d) end, "complet", "elapsed before the event completed raises")
  d:synchronize()
  T.ok(d - c > 0, "elapsed works once completed")
  T.raises_at(function() return c - 1 end, "bad argument", "event - number raises")
  a:close(); b:close(); c:close(); d:close()
end)

T.test("closed stream and event raise", function()
  local s = gpu.stream()
  s:close()
  s:close()                                   -- idempotent
  T.raises_at(function() s:synchronize() end, "closed", "synchronize on a closed stream")
  T.raises_at(function() s:query() end, "closed", "query on a closed stream")
  T.raises_at(function() s:record() end, "closed", "record on a closed stream")
  T.raises_at(function() gpu.sleep(1, { stream = s }) end, "closed", "stream= a closed stream")
  T.raises_at(function() gpu.ones({2}, { stream = s }) end, "closed", "constructor on a closed stream")
  T.raises_at(function() gpu.using(s) end, "closed", "using a closed stream")
  local ev = gpu.event()
  ev:close()
  T.raises_at(function() ev:record() end, "closed", "record on a closed event")
  T.raises_at(function() ev:synchronize() end, "closed", "synchronize on a closed event")
  local s2 <close> = gpu.stream()
  T.raises_at(function() s2:wait(ev) end, "closed", "waiting on a closed event")
  T.raises_at(function() s2:wait(s) end, "closed", "waiting on a closed stream")
  T.is(gpu.ones({3}):sum():item(), 3.0, "runtime still works")
end)

T.test("a stream closed with queued work still runs it", function()
  local x = gpu.zeros({64}, { dtype = "i64" })
  gpu.synchronize()
  do
    local s <close> = gpu.stream()
    gpu.sleep(100, { stream = s })
    x:fill(9, { stream = s })
  end
  gpu.synchronize()
  T.is(x:max():item(), 9, "work queued before close completed")
end)

-- cuda keeps closed streams for reuse (runtime.c), but only those with
-- nothing queued: a new stream never inherits a closed one's work.
T.test("a new stream starts empty after closing busy and idle ones", function()
  for round = 1, 3 do
    local busy = gpu.stream()
    gpu.sleep(1500, { stream = busy })
    busy:close()
    local idle = gpu.stream()
    idle:close()
    local s = gpu.stream()
    T.ok(s:query(), "round " .. round .. ": the new stream has nothing queued")
    local y = gpu.full({ 8 }, round, { stream = s })
    s:synchronize()
    T.is(y:sum():item(), 8 * round, "round " .. round .. ": work on it runs")
    s:close()
  end
  gpu.synchronize()
end)

T.test("gc of streams and events", function()
  for _ = 1, 20 do
    local s = gpu.stream()
    local e = s:record()
    gpu.sleep(1, { stream = s })
    e = nil -- luacheck: ignore
  end
  collectgarbage(); collectgarbage(); gpu.synchronize()
  T.is(gpu.stats().streams, 0, "collected streams are released")
  T.is(gpu.stats().events, 0, "collected events are released")
end)

T.done()
