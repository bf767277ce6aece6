-- Tasks: gpu.task runs a function as a coroutine on the interpreter thread,
-- gpu.await yields it until an event, a stream or another task is done (and
-- outside a task waits), gpu.run drives them.  Checked: results and ordering
-- under host jitter, interleaving while a task waits for the device, each
-- task's own current stream, errors with the task's traceback, and misuse.
local gpu = require "gpu"
local T = require "gpu.test"

T.test("await returns when the awaited work is done", function()
  local s <close> = gpu.stream()
  local results = {}
  for k = 1, 4 do
    gpu.task(function()
      local x = gpu.zeros({1000}, { stream = s })
      for i = 1, 3 do
        x:add_(k, { stream = s })
        local ev = s:record()
        gpu.await(ev)
        ev:close()
        -- what the event follows is finished: a pinned copy of it is exact
        local h = gpu.pinned({1000})
        h:copy(x, { stream = s })
        gpu.await(s)
        results[#results + 1] = { k, i, h:sum():item() }
        h:close()
      end
      x:close()
      return k * 10
    end)
  end
  T.is(gpu.run(), 0, "gpu.run() returns 0: every task finished")
  T.is(#results, 12, "4 tasks x 3 steps")
  local bad = 0
  for _, r in ipairs(results) do
    if r[3] ~= r[1] * r[2] * 1000 then bad = bad + 1 end
  end
  T.is(bad, 0, "every awaited result holds the values written before the await")
end)

T.test("tasks run while one waits for the device", function()
  local s1 <close> = gpu.stream()
  local log = {}
  local slow = gpu.task(function()
    gpu.sleep(300, { stream = s1 })
    log[#log + 1] = "slow waits"
    gpu.await(s1)
    log[#log + 1] = "slow resumes"
  end)
  local seen
  local quick = gpu.task(function()
    seen = slow.state
    for i = 1, 3 do
      log[#log + 1] = "quick " .. i
      coroutine.yield()   -- a plain yield lets the others run
    end
  end)
  local before = gpu.stats().syncs
  gpu.run()
  T.is(seen, "waiting for the device", "the second task ran while the first awaited the device")
  T.is(log[1], "slow waits", "the first task ran first")
  T.is(log[#log], "slow resumes", "and resumed after the other finished its steps")
  T.is(#log, 5, "every step ran once")
  T.is(gpu.stats().syncs, before, "awaiting in a task is not a host-device sync")
  T.ok(slow.done and quick.done and not slow.failed, "both tasks are done")
end)

T.test("await on a task: results, and from outside a task", function()
  local a = gpu.task(function(x, y) return x + y, "sum" end, 2, 3)
  local b = gpu.task(function()
    local v, w = gpu.await(a)
    return v * 10, w
  end)
  local v, w = gpu.await(b)   -- outside a task: runs the loop until b is done
  T.is({ v, w }, { 50, "sum" }, "await(task) returns the task's results, across tasks")
  T.is({ a:result() }, { 5, "sum" }, "t:result() of a finished task")
  T.is(tostring(a), "gpu.Task " .. a.id .. " (done)", "tostring names the task and its state")
  local n = gpu.task(function() return nil, nil, 3 end)
  T.is(select("#", gpu.await(n)), 3, "trailing nils are kept")
  local c = gpu.task(function() end)
  T.raises_at(function() c:result() end, "is not done %(new%): use gpu.await", "result() of a task not run yet")
  gpu.run()
end)

T.test("await outside a task waits (a counted sync)", function()
  local s <close> = gpu.stream()
  gpu.sleep(20, { stream = s })
  local ev <close> = s:record()
  local before = gpu.stats().syncs
  gpu.await(ev)
  T.ok(ev:query(), "the event is done after await")
  gpu.sleep(20, { stream = s })
  gpu.await(s)
  T.ok(s:query(), "the stream is idle after await")
  T.is(gpu.stats().syncs - before, 2, "each outside await is a sync")
  local never <close> = gpu.event()
  gpu.task(function() gpu.await(never) end)
  T.is(gpu.run(), 0, "an event never recorded is done at once, in a task too")
end)

T.test("each task has its own current stream", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local seen = {}
  do
  local _ <close> = gpu.using(s1)
  gpu.task(function()
    seen.inherited = gpu.current_stream() == s1
    local _ <close> = gpu.using(s2)
    gpu.sleep(30, { stream = s2 })
    gpu.await(s2)
    seen.after_await = gpu.current_stream() == s2
  end)
  end
  gpu.task(function()
    seen.other = gpu.current_stream()
  end)
  gpu.run()
  T.ok(seen.inherited, "a task starts on the stream current where it was made")
  T.ok(seen.after_await, "its gpu.using scope survives an await")
  T.ok(seen.other == gpu.default_stream(), "another task is not affected by it")
  T.ok(gpu.current_stream() == gpu.default_stream(), "nor is the main chunk")
end)

T.test("errors: the task's traceback, awaited failures, cycles", function()
  local function boom() error("kaboom") end
  local t = gpu.task(function() boom() end)
  local ok, msg = pcall(gpu.run)
  T.ok(not ok, "gpu.run raises a failure no task awaits")
  T.ok(msg:find("^task " .. t.id .. " failed: [^\n]*tasks%.lua:%d+: kaboom"), "naming the task and the error line")
  T.ok(msg:find("stack traceback:", 1, true) and msg:find("in upvalue 'boom'", 1, true),
       "with the task's own traceback")
  T.ok(t.failed and t.done and t.error == msg, "the task is failed, its error kept")
  T.raises(function() t:result() end, "kaboom", "result() raises its error")
  T.is(gpu.run(), 0, "the loop goes on after a failure")

  local inner = gpu.task(function() error("inner") end)
  local caught
  gpu.task(function()
    local ok2, e = pcall(gpu.await, inner)
    caught = not ok2 and e
  end)
  T.is(gpu.run(), 0, "a failure awaited by another task is not raised by gpu.run")
  T.ok(caught and caught:find("inner", 1, true), "the awaiting task got the error (and could catch it)")

  local x, y
  x = gpu.task(function() gpu.await(y) end)
  y = gpu.task(function() gpu.await(x) end)
  T.raises(gpu.run, "2 tasks await each other and nothing else", "a cycle is an error, not a hang")
  T.ok(not x.done and not y.done, "the cycle's tasks are left waiting")
  x:cancel()
  T.ok(x.failed and x.error:find("task " .. x.id .. " was cancelled", 1, true), "t:cancel() ends a task")
  local y_err
  local z = gpu.task(function() y_err = select(2, pcall(gpu.await, y)) end)
  y:cancel()
  T.is(gpu.run(), 0, "cancelled tasks are not raised by gpu.run")
  T.ok(z.done and y_err and y_err:find("was cancelled", 1, true), "awaiting a cancelled task raises")

  local closed = false
  local s <close> = gpu.stream()
  local c = gpu.task(function()
    local _ <close> = setmetatable({}, { __close = function() closed = true end })
    gpu.sleep(50, { stream = s })
    gpu.await(s)
  end)
  gpu.run(0)
  c:cancel()
  T.ok(closed, "cancel closes the task's to-be-closed variables")
  T.is(gpu.run(), 0, "and the loop is empty")
end)

T.test("misuse gives clear errors", function()
  T.raises_at(function() gpu.task(42) end, "bad argument #1 to 'task' %(function expected, got number%)",
              "gpu.task needs a function")
  T.raises_at(function() gpu.await("x") end,
              "bad argument #1 to 'await' %(gpu.Event, gpu.Stream or gpu.Task expected, got string%)",
              "gpu.await refuses other values")
  T.raises_at(function() gpu.await() end, "bad argument #1 to 'await'", "gpu.await needs an argument")
  T.raises_at(function() gpu.run(-1) end, "timeout must be >= 0", "gpu.run refuses a negative timeout")
  local self_err, run_err
  local me
  me = gpu.task(function()
    self_err = select(2, pcall(gpu.await, me))
    run_err = select(2, pcall(gpu.run))
  end)
  local s = gpu.stream()
  s:close()
  local closed_err
  gpu.task(function() closed_err = select(2, pcall(gpu.await, s)) end)
  local ev = gpu.event()
  ev:close()
  local ev_err
  gpu.task(function() ev_err = select(2, pcall(gpu.await, ev)) end)
  gpu.run()
  T.ok(self_err and self_err:find("a task cannot await itself", 1, true), "a task cannot await itself")
  T.ok(run_err and run_err:find("gpu.run cannot be called from a task", 1, true), "gpu.run inside a task")
  T.ok(closed_err and closed_err:find("stream is closed", 1, true), "await on a closed stream")
  T.ok(ev_err and ev_err:find("event is closed", 1, true), "await on a closed event")
end)

T.test("the race checker knows what a task awaited", function()
  gpu.check_races(true)
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream()
  local h <close> = gpu.ones({1024}, { device = "pinned" })
  local d <close> = gpu.empty({1024})
  local d2 <close> = gpu.empty({1024})
  local outcome = {}
  gpu.task(function()
    d:copy(h, { stream = s1 })
    gpu.await(s1:record())
    -- the copy is done and the host knows it: reading on s2 is ordered
    outcome.after_await = pcall(function() return d:sum { stream = s2 } end)
    d2:copy(h, { stream = s1 })
    outcome.no_await = select(2, pcall(function() return d2:sum { stream = s2 } end))
  end)
  gpu.run()
  gpu.synchronize()
  gpu.check_races(false)
  T.ok(outcome.after_await, "no race reported after gpu.await of the copy's event")
  T.ok(outcome.no_await and outcome.no_await:find("race: 'sum' on stream", 1, true),
       "the same read without the await is a race")
end)

T.test("each task nests its own gpu.range", function()
  local s <close> = gpu.stream()
  gpu.trace.start()
  for k = 1, 2 do
    gpu.task(function()
      local _ <close> = gpu.range("task " .. k)
      gpu.sleep(20, { stream = s })
      gpu.await(s:record())   -- the other task opens its range meanwhile
      do
        local _ <close> = gpu.range("inner " .. k)
        coroutine.yield()
      end
    end)
  end
  local ok, err = pcall(gpu.run)
  T.ok(ok, "ranges of interleaved tasks overlap without a nesting error")
  if not ok then T.diag(err) end
  local names = {}
  for _, e in ipairs(gpu.trace.events()) do
    if e.kind == "range" then names[#names + 1] = e.name end
  end
  gpu.trace.stop()
  table.sort(names)
  T.is(names, { "inner 1", "inner 2", "task 1", "task 2" }, "all four ranges are in the trace")
  local a = gpu.range("a")
  local b = gpu.range("b")
  T.raises(function() a:close() end, "ranges nest", "within one coroutine, ranges still nest")
  b:close()
  a:close()
end)

T.test("a gpu.pipeline inside a task lets other tasks run", function()
  local pipeline = require "gpu.pipeline"
  local sums, steps_while_busy, pipe = {}, 0, nil
  local before = gpu.stats().syncs
  pipe = gpu.task(function()
    return pipeline.run {
      batches = 7, depth = 2,
      input = { shape = { 256 }, dtype = "f32" },
      output = { shape = { 256 }, dtype = "f32" },
      load = function(i, pin) pin:fill(i) end,
      compute = function(i, x, y)
        gpu.sleep(5)            -- on the compute stream: the host stages must wait
        x:mul(2, { out = y })
      end,
      sink = function(i, pout) sums[i] = pout:get(1) end,
    }
  end)
  gpu.task(function()
    while not pipe.done do
      steps_while_busy = steps_while_busy + 1
      coroutine.yield()
    end
  end)
  gpu.run()
  T.ok(pipe.done and not pipe.failed, "the pipeline task finished")
  local want = {}
  for i = 1, 7 do want[i] = 2.0 * i end
  T.is(sums, want, "every batch's result, in order")
  T.ok(steps_while_busy > 1, "the other task ran while the pipeline waited (" .. steps_while_busy .. " steps)")
  T.is(pipe:result().batches, 7, "the task's result is the pipeline's stats")
  T.ok(gpu.stats().syncs - before <= 2, "the pipeline's waits in a task are awaits, not syncs (" ..
       (gpu.stats().syncs - before) .. ")")
end)

T.test("each task has its own gpu.nosync scopes", function()
  local s <close> = gpu.stream()
  local d <close> = gpu.ones({4})
  local seen = {}
  local a = gpu.task(function()
    local _ <close> = gpu.nosync()
    gpu.sleep(20, { stream = s })
    gpu.await(s:record())
    seen.a = gpu.sync_debug()
  end)
  local b = gpu.task(function()
    seen.b_before = gpu.sync_debug()
    seen.b_item = pcall(function() return d:get(1) end)   -- a's scope must not refuse this
    local _ <close> = gpu.nosync("warn")
    gpu.sleep(40, { stream = s })
    gpu.await(s:record())
    seen.b = gpu.sync_debug()
  end)
  gpu.run()
  T.is(seen.b_before, "off", "a task does not see another task's open nosync scope")
  T.ok(seen.b_item, "so its sync is allowed")
  T.is({ seen.a, seen.b }, { "error", "warn" }, "each task keeps its own scope across awaits")
  T.is(gpu.sync_debug(), "off", "the scopes ended out of order: the main program's mode is untouched")
  T.ok(a.done and b.done, "both tasks finished")
  gpu.sync_debug("off")
end)

T.test("await where a task cannot yield, and cancel of a running task", function()
  collectgarbage(); collectgarbage(); gpu.synchronize()
  local streams_before = gpu.stats().streams
  local s = gpu.stream()
  local msg, cancel_msg, later
  local t
  t = gpu.task(function()
    gpu.sleep(10, { stream = s })
    local ok, e = pcall(table.sort, { 3, 2, 1 }, function(x, y) gpu.await(s); return x < y end)
    msg = not ok and e
    cancel_msg = select(2, pcall(function() t:cancel() end))
    gpu.await(s)   -- the task is still consistent: a real await works
    later = t.state
  end)
  gpu.run()
  T.ok(msg and msg:find("gpu.await cannot yield here", 1, true), "await inside table.sort: a clear error")
  T.ok(cancel_msg and cancel_msg:find("is running: a task cannot cancel itself", 1, true),
       "a task cannot cancel itself")
  T.is(later, "running", "the task went on and awaited normally")
  s:close()
  collectgarbage(); collectgarbage(); gpu.synchronize()
  T.is(gpu.stats().streams, streams_before, "no stream is held by a lost watch")
end)

-- the error of a call that fails, or nil when it succeeds
local function perr(f, ...)
  local ok, e = pcall(f, ...)
  if not ok then return tostring(e) end
end

T.test("a yield inside a gpu.graph capture names the capture and the line", function()
  local co_msg, aw_msg
  local src = debug.getinfo(1, "S").short_src
  local cap_line, yield_line, await_line
  gpu.task(function()
    co_msg = perr(function()
      cap_line = debug.getinfo(1, "l").currentline + 1
      gpu.graph(function(s)
        gpu.zeros({4}, { stream = s })
        yield_line = debug.getinfo(1, "l").currentline + 1
        coroutine.yield()
      end)
    end)
    aw_msg = perr(gpu.graph, function(s)
      await_line = debug.getinfo(1, "l").currentline + 1
      gpu.await(s)
    end)
  end)
  gpu.run()
  local where = src .. ":" .. tostring(yield_line) .. ": "
  if not T.ok(co_msg and co_msg:find(where .. "coroutine.yield cannot yield inside a gpu.graph capture", 1, true),
              "coroutine.yield: the error names the capture at the yield's line") then T.diag(tostring(co_msg)) end
  T.ok(co_msg and co_msg:find("(captured at " .. src .. ":" .. tostring(cap_line) .. ")", 1, true),
       "... and where the capture began")
  T.ok(co_msg and not co_msg:find("C-call boundary", 1, true), "not Lua's bare 'C-call boundary' message")
  where = src .. ":" .. tostring(await_line) .. ": "
  if not T.ok(aw_msg and aw_msg:find(where .. "gpu.await cannot yield inside a gpu.graph capture", 1, true),
              "gpu.await names the capture too") then T.diag(tostring(aw_msg)) end
  T.is(gpu.graph(function() coroutine.wrap(function() coroutine.yield() end)() return 1 end) ~= nil, true,
       "a coroutine of its own inside a capture still yields")
end)

T.test("gpu.run and gpu.await(task) are refused during a capture", function()
  local ran = false
  local t = gpu.task(function() ran = true end)
  local src = debug.getinfo(1, "S").short_src
  local line
  local msg = perr(gpu.graph, function()
    line = debug.getinfo(1, "l").currentline + 1
    gpu.run(0)
  end)
  if not T.ok(msg and msg:find(src .. ":" .. tostring(line) .. ": gpu.run cannot run tasks during a gpu.graph capture", 1, true),
              "gpu.run(0) inside a capture: a clear error at its line") then T.diag(tostring(msg)) end
  T.ok(msg and msg:find("(captured at " .. src .. ":", 1, true), "naming the capture")
  msg = perr(gpu.graph, function() gpu.await(t) end)
  T.ok(msg and msg:find("gpu.await cannot run tasks during a gpu.graph capture", 1, true),
       "gpu.await(task) from outside a task, inside a capture: refused too")
  T.ok(not ran, "the task did not run inside the capture")
  gpu.run()
  T.ok(ran and t.done, "it runs once the capture is over")
end)

T.test("gpu.run(timeout) returns in time while a task keeps yielding", function()
  local stop = false
  local t = gpu.task(function()
    while not stop do coroutine.yield() end
  end)
  T.is(gpu.run(0), 1, "gpu.run(0) runs one round and returns, the spinning task left")
  T.is(gpu.run(0.01), 1, "gpu.run(0.01) returns too")
  stop = true
  T.is(gpu.run(), 0, "and the task ends once it may")
  T.ok(t.done, "done")
end)

T.test("gpu.run(timeout) returns what is left", function()
  local s <close> = gpu.stream()
  gpu.sleep(200, { stream = s })
  local ev = s:record()
  local t = gpu.task(function() gpu.await(ev) end)
  local left = gpu.run(0)
  T.ok(left >= 1 and not t.done, "gpu.run(0) returns without waiting, the task still pending")
  gpu.run()
  T.ok(t.done, "gpu.run() then finishes it")
  ev:close()
end)

local function run(args) return T.run("", args) end
local tmpscript = T.tmpfile

T.test("the CLI runs queued tasks after the main chunk", function()
  local name = tmpscript(table.concat({
    "local s = gpu.stream()",
    "gpu.task(function() gpu.sleep(10, {stream = s}); gpu.await(s); print('task ran') end)",
    "print('main chunk ends')",
  }, "\n"))
  local out, ok = run("--device host " .. name)
  T.ok(ok, "exit 0")
  T.ok(out:find("main chunk ends\ntask ran", 1, true), "the task ran after the main chunk")
  local bad = tmpscript("gpu.task(function()\n  local x = nil\n  return x.field\nend)\n")
  out, ok = run("--device host " .. bad)
  T.ok(not ok, "a failing task makes the exit status 1")
  T.ok(out:find("task 1 failed: [^\n]*:3: attempt to index a nil value") ~= nil, "naming the task's line")
  if ok or not out:find("task 1 failed") then T.diag(out) end
  out, ok = run("--device host -e \"gpu.task(function() print('from -e') end)\"")
  T.ok(ok and out:find("from -e", 1, true), "tasks queued by -e run too")
  os.remove(name)
  os.remove(bad)
end)

T.done()
