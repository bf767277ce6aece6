-- Graphs: gpu.graph captures a step once (recorded, not run), g:launch
-- replays it.  Checked: replays equal the ops run directly (chains, inputs
-- refilled between replays, several streams joined by events, run-time
-- kernels), what the graph owns and keeps alive (tensors dropped after the
-- capture, a graph closed with replays queued), events recorded in a
-- capture (recorded by every replay where the capture did; never recorded
-- before the first), graphs inside tasks, errors
-- in a replay, and the calls that cannot be captured: each raises at its
-- own line, abandons the capture and leaves the runtime usable.  The file
-- runs itself again under GPULUA_HOST_JITTER=1 on the host backend.
local gpu = require "gpu"
local T = require "gpu.test"

local HOST = gpu.backend == "host"
local CHILD = os.getenv("GRAPHS_CHILD") == "1"

-- the step, run directly: y = relu(x * 2 - 3) + x:sum()
local function step(x, s)
  local o = { stream = s }
  local h = x:mul(2, o):sub(3, o):relu(o)
  return h:add(x:sum(o):expand(x.shape), o)
end

T.test("a chain of ops: replays equal the ops run directly", function()
  local x = gpu.arange(16, { dtype = "f32" })
  local g, y = gpu.graph(function(s)
    T.is(gpu.current_stream(), s, "the capture stream is current inside")
    T.is(s.nonblocking, true, "the capture stream is nonblocking")
    return step(x)
  end)
  T.is(gpu.current_stream(), gpu.default_stream(), "the current stream is restored after the capture")
  T.is(getmetatable(g).__name, "gpu.Graph", "gpu.graph returns a gpu.Graph")
  T.is(g.name, "graph", "default name")
  T.ok(g.nodes >= 5, "g.nodes counts the captured ops: " .. g.nodes)
  T.ok(tostring(g):find("gpu.Graph 'graph'", 1, true), "tostring: " .. tostring(g))
  T.ok(g.site:find("graphs.lua:%d+$"), "g.site is the capture line: " .. g.site)
  local r0 = gpu.stats().replays
  g:launch()
  T.is(y:totable(), step(x):totable(), "the first replay gives the direct result")
  for k = 1, 5 do
    x:copy(gpu.arange(16, { dtype = "f32" }):mul(k - 3))
    g:launch()
    T.is(y:totable(), step(x):totable(), "replay " .. k .. " after x:copy(next)")
  end
  T.is(gpu.stats().replays - r0, 6, "gpu.stats().replays counts launches")
  g:close()
  T.is(g.closed, true, "g.closed")
  T.is(tostring(g), "gpu.Graph (closed)", "tostring of a closed graph")
  g:close()
  T.raises_at(function() g:launch() end, "graph is closed", "launch after close raises")
  T.raises_at(function() return g.nodes end, "graph is closed", "fields after close raise")
end)

T.test("results, name, launch on a stream, <close>", function()
  local a = gpu.tensor({ 1, 2, 3 }, { dtype = "i32" })
  local s2 <close> = gpu.stream()
  do
    local g <close>, p, q, n = gpu.graph(function(s)
      return a + 1, a * a, 42
    end, { name = "two" })
    T.is(g.name, "two", "{name =}")
    T.is(n, 42, "non-tensor results come back as they are")
    g:launch(s2)
    s2:synchronize()
    T.is(p:totable(), { 2, 3, 4 }, "first result")
    T.is(q:totable(), { 1, 4, 9 }, "second result")
    a:fill(5)
    -- a replay is ordered on its stream like one op: after the fill there
    local _ <close> = gpu.using(s2)
    s2:wait(gpu.default_stream())
    g:launch()
    T.is(p:totable(), { 6, 6, 6 }, "the replay on the current stream read the refilled input")
  end
  T.raises_at(function() gpu.graph(5) end, "bad argument #1", "a function is required")
  T.raises_at(function() gpu.graph(function() end, { nam = "x" }) end, "unknown option 'nam'",
              "options are checked")
  T.raises_at(function() gpu.graph(function() end, { name = 5 }) end, "bad option 'name'",
              "name must be a string")
end)

T.test("several streams joined by events (fork/join)", function()
  local x = gpu.arange(1000, { dtype = "f64" })
  local t1 <close> = gpu.stream()
  local t2 <close> = gpu.stream()
  local g, y = gpu.graph(function(s)
    local a = x:mul(3)                          -- on s
    local fork = s:record()
    t1:wait(fork)                               -- t1 joins the capture
    t2:wait(s)                                  -- t2 too, through the stream
    local b = a:add(1, { stream = t1 })
    local c = a:sub(1, { stream = t2 })
    local j1 = t1:record()
    s:wait(j1)
    s:wait(t2)                                  -- joined back
    fork:close(); j1:close()
    return b * c
  end)
  for k = 1, 4 do
    x:fill(k)
    g:launch()
    T.is(y:sum():item(), 1000 * (3 * k + 1) * (3 * k - 1), "replay " .. k .. " of the fork/join")
  end
  g:close()
  -- a joined stream not joined back: the capture fails at gpu.graph's line
  local msg = T.raises_at(function()
    gpu.graph(function(s)
      t1:wait(s)
      x:add_(1, { stream = t1 })
    end)
  end, "was not joined back", "an unjoined stream fails the capture")
  T.ok(msg and msg:find("graph: stream %d+ joined the capture"), "the message names the stream: " .. tostring(msg))
  x:fill(1, { stream = t1 })
  t1:synchronize()
  T.is(x:sum():item(), 1000, "the streams work normally afterwards")
end)

T.test("tensors dropped after the capture stay the graph's", function()
  local x = gpu.ones({ 256 }, { dtype = "f32" })
  local buffers0 = gpu.stats().buffers
  local g, y = gpu.graph(function()
    local t = x
    for _ = 1, 10 do t = (t * 2):sub(1) end    -- temporaries, dropped at once
    return t
  end)
  collectgarbage(); collectgarbage()
  T.ok(gpu.stats().buffers > buffers0 + 1, "the temporaries are held by the graph")
  local xr = x
  x = nil
  collectgarbage(); collectgarbage()           -- the script's input handle is gone too
  for _ = 1, 3 do g:launch() end
  T.is(y:min():item(), 1, "1 -> 2*1-1 ten times, over three replays")
  xr:fill(2)
  g:launch()
  T.is(y:max():item(), 1025, "the input is the same buffer: refilled, replayed")
  xr = nil
  g:close()
  y = nil
  collectgarbage(); collectgarbage()
  gpu.synchronize()
  T.is(gpu.stats().buffers, buffers0 - 1, "closing the graph released everything it held")
end)

T.test("a graph closed with replays queued", function()
  local x = gpu.zeros({ 64 }, { dtype = "i64" })
  local s <close> = gpu.stream()
  local g, y = gpu.graph(function(cs)
    gpu.sleep(20, { stream = cs })
    local z = x:add(1)
    x:copy(z)
    return z
  end)
  local t0 = gpu.clock()
  for _ = 1, 5 do g:launch(s) end
  g:close()
  T.ok(gpu.clock() - t0 < 0.09, "launch and close do not wait for the replays")
  x = nil
  collectgarbage(); collectgarbage()
  s:synchronize()
  T.is(y:totable()[64], 5, "five replays ran after the close, each reading the last")
  T.is(y:sum():item(), 5 * 64, "every element")
end)

T.test("graphs inside tasks", function()
  local got = {}
  for k = 1, 3 do
    gpu.task(function()
      local x = gpu.full({ 100 }, k, { dtype = "i32" })
      local g <close>, y = gpu.graph(function() return x * x + k end)
      local s = gpu.current_stream()
      for i = 1, 3 do
        x:fill(k * i)
        g:launch()
        gpu.await(s)
        got[#got + 1] = { k, i, y:sum():item() }
      end
    end)
  end
  T.is(gpu.run(), 0, "every task finished")
  local bad = 0
  for _, r in ipairs(got) do
    local v = r[1] * r[2]
    if r[3] ~= 100 * (v * v + r[1]) then bad = bad + 1 end
  end
  T.is(#got, 9, "3 tasks x 3 replays")
  T.is(bad, 0, "each replay in a task gave its own results")
end)

T.test("run-time kernels are captured like built-in ops", function()
  local okc, m = pcall(gpu.compile, [[
extern "C" __global__ void axpb(float *y, const float *x, float a, float b, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
]])
  if not okc then return T.skip("gpu.compile", tostring(m)) end
  local n = 1000
  local x = gpu.arange(n, { dtype = "f32" })
  local g, y = gpu.graph(function()
    local y = gpu.empty({ n }, { dtype = "f32" })
    m.axpb { grid = (n + 127) // 128, block = 128 } (y, x, 2, 1, n)
    return y:add(x)
  end)
  m = nil
  collectgarbage(); collectgarbage()            -- the module stays with the graph
  g:launch()
  T.is(y:totable(), x:mul(3):add(1):totable(), "kernel + op, replayed")
  x:fill(1)
  g:launch()
  T.is(y:max():item(), 4, "replayed after the input changed")
  g:close()
end)

T.test("an error in a replay names the graph and its capture line", function()
  local a = gpu.tensor({ 6, 8 }, { dtype = "i64" })
  local b = gpu.tensor({ 2, 4 }, { dtype = "i64" })
  local g <close>, q = gpu.graph(function() return a // b end, { name = "divide" })
  g:launch()
  T.is(q:totable(), { 3, 2 }, "a good replay")
  b:fill(0)
  g:launch()
  local msg = T.raises(function() gpu.synchronize() end, "division by zero", "the replay fails at the next sync")
  if HOST then
    T.ok(msg and msg:find("graph 'divide' (captured at ", 1, true), "names the graph: " .. tostring(msg))
    T.ok(msg and msg:find("graphs.lua:%d+%).*'floor_divide' %(enqueued at tests/graphs.lua:%d+%)"),
         "the capture line and the op's: " .. tostring(msg))
  else
    T.skip("the graph and the op named", "cuda flags integer division by zero for any queued op")
  end
  b:fill(1)
  g:launch()
  T.is(q:totable(), { 6, 8 }, "the graph replays again afterwards")
end)

T.test("the race checker sees a replay as its ops", function()
  local was = gpu.check_races(true)
  local a <close> = gpu.stream()
  local b <close> = gpu.stream()
  local x = gpu.zeros({ 1000 })
  local g <close>, y = gpu.graph(function() return x * 2 end)
  gpu.synchronize()
  gpu.sleep(20, { stream = a })
  x:fill(3, { stream = a })
  local msg = T.raises_at(function() g:launch(b) end, "race", "a replay reading what another stream writes, no event")
  T.ok(msg and msg:find("mul"), "the message names the op inside the replay: " .. tostring(msg))
  b:wait(a:record())
  g:launch(b)
  b:synchronize()
  T.is(y:max():item(), 6, "with the event the replay runs and reads the fill")
  gpu.check_races(was)
end)

T.test("a trace shows a replay as one span named by the graph", function()
  local s <close> = gpu.stream()
  local x = gpu.zeros({ 64 })
  local g <close> = gpu.graph(function() x:add_(1) end, { name = "bump" })
  gpu.synchronize()
  gpu.trace.start()
  local line = debug.getinfo(1, "l").currentline
  g:launch(s)                                   -- line + 1
  gpu.trace.stop()
  local found
  for _, e in ipairs(gpu.trace.events()) do
    if e.kind == "op" and e.name == "bump" then found = e end
  end
  T.ok(found, "a span named 'bump'")
  T.is(found and found.stream, s.id, "on the launch stream")
  T.is(found and found.site, debug.getinfo(1, "S").short_src .. ":" .. (line + 1), "with the launch line")
end)

-- issue 35: an event recorded inside a capture is an event-record node (as
-- CUDA's cudaEventRecordExternal): each replay records it where the
-- capture did; before the first replay it was never recorded
T.test("an event recorded in a capture is recorded by every replay", function()
  local x = gpu.ones({ 1000 })
  local ev
  local g <close>, y = gpu.graph(function(s)
    gpu.sleep(200)                              -- b would read zeros if not ordered
    local r = x:mul(2)
    ev = s:record()
    return r
  end)
  local a <close> = gpu.stream()
  local b <close> = gpu.stream{ nonblocking = true }
  T.is(ev.recorded, false, "before any replay the event was never recorded")
  T.is(ev:query(), true, "so it queries true, as a fresh gpu.event() (and CUDA)")
  ev:synchronize()                              -- returns at once, as for a fresh event
  b:wait(ev)                                    -- orders nothing
  T.is(b:query(), true, "a wait for it holds nothing")
  gpu.sleep(300, { stream = a })                -- holds the replay behind it
  g:launch(a)
  T.is(ev.recorded, true, "a replay records it")
  T.is(ev:query(), false, "pending while the replay has not reached the record")
  b:wait(ev)
  local r = y:add(0, { stream = b })
  T.is(r:sum({ stream = b }):item({ stream = b }), 2000, "a stream that waits for it sees the replay's result")
  T.is(ev:query(), true, "done once the waiting stream's work is (ordered by the event)")
  -- a second replay records it again
  x:fill(3, { stream = a })
  gpu.sleep(300, { stream = a })
  g:launch(a)
  T.is(ev:query(), false, "the next replay records it again: pending")
  ev:synchronize()
  T.is(ev:query(), true, "done after ev:synchronize()")
  T.is(y:add(0, { stream = b }):sum({ stream = b }):item({ stream = b }), 6000, "and the replay's result is there")
  a:synchronize()
  ev:close()
  g:launch(a)                                   -- a closed event: replays go on
  a:synchronize()
  T.is(y:sum():item(), 6000, "replays go on after the script closed the event")
end)

T.test("a replay records the event where the capture did, not at its end", function()
  local x = gpu.ones({ 100 })
  local mid, fresh = nil, gpu.event()
  fresh:record()                                -- recorded outside, then inside
  local g <close>, y1, y2 = gpu.graph(function(s)
    local r1 = x:mul(2)
    mid = s:record()
    fresh:record(s)
    gpu.sleep(500)                              -- the rest of the replay is held
    return r1, x:mul(3)
  end)
  fresh:synchronize()
  T.is(fresh:query(), true, "the capture left the earlier record as it was")
  local a <close> = gpu.stream()
  local b <close> = gpu.stream{ nonblocking = true }
  g:launch(a)
  b:wait(mid)
  local r = y1:add(1, { stream = b })
  T.is(r:totable({ stream = b })[100], 3.0, "the work before the record is seen")
  T.is(mid:query(), true, "the record was reached")
  T.is(a:query(), false, "while the replay's stream is still held after it")
  T.is(fresh:query(), true, "an event recorded outside, then inside: recorded by the replay too")
  a:synchronize()
  T.is(y2:sum():item(), 300, "the replay ends as captured")
  mid:close(); fresh:close()
end)

T.test("timing events recorded in a capture measure a replay", function()
  local e1, e2
  local g <close> = gpu.graph(function(s)
    e1 = s:record()
    gpu.sleep(20)
    e2 = gpu.event{ timing = true }
    e2:record(s)
  end)
  T.raises_at(function() return e2 - e1 end, "never recorded", "before a replay they were never recorded")
  local a <close> = gpu.stream()
  g:launch(a)
  e2:synchronize()
  local ms = e2 - e1
  T.is(math.type(ms), "float", "after it, e2 - e1 is a number of milliseconds")
  e1:close(); e2:close()
end)

T.test("the race checker orders a replay's record with its ops", function()
  local was = gpu.check_races(true)
  local x = gpu.ones({ 64 })
  local mid
  local g <close>, y1, y2 = gpu.graph(function(s)
    local r1 = x:mul(2)
    mid = s:record()
    return r1, x:mul(3)
  end)
  local a <close> = gpu.stream()
  local b <close> = gpu.stream()
  gpu.synchronize()
  g:launch(a)
  b:wait(mid)
  T.is(y1:add(1, { stream = b }):sum({ stream = b }):item({ stream = b }), 192,
       "work before the record is ordered by the wait")
  local msg = T.raises_at(function() y2:add(1, { stream = b }) end, "race",
                          "work after the record is not ordered by it")
  T.ok(msg and msg:find("'mul'"), "naming the op of the replay: " .. tostring(msg))
  a:synchronize()
  mid:close()
  gpu.check_races(was)
end)

T.test("the issue's script runs clean under --check races (a child)", function()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write([[
local x = gpu.ones({1000}); local ev
local g, y = gpu.graph(function(s) gpu.sleep(200); local r = x:mul(2); ev = s:record(); return r end)
local a, b = gpu.stream(), gpu.stream(); g:launch(a); b:wait(ev)
print("sum", y:add(0, {stream = b}):sum({stream = b}):item({stream = b}))
]])
  f:close()
  local out, ok = T.run("GPULUA_CHECK=", "--check races " .. path)
  os.remove(path)
  T.ok(ok and out:find("sum\t2000", 1, true), "b sees the replay's result and no race is reported")
  if not ok then T.diag(out) end
end)

-- what cannot be replayed raises at its line and abandons the capture
T.test("calls that cannot be captured raise at their line", function()
  local x = gpu.ones({ 8 })
  local other <close> = gpu.stream()
  local outside <close> = gpu.event()
  outside:record()
  local h = gpu.empty({ 8 }, { device = "host" })
  local cases = {
    { "item", "item: .*cannot be captured", function() x:sum():item() end },
    { "print", "tostring: .*cannot be captured", function() tostring(x + 1) end },
    { "synchronize", "synchronize: .*cannot be captured", function() gpu.synchronize() end },
    { "s:synchronize", "synchronize: .*cannot be captured", function(s) s:synchronize() end },
    { "ev:synchronize", "synchronize: .*cannot be captured", function(s) s:record():synchronize() end },
    { "a stream not joined", "is not part of the capture", function() x:add(1, { stream = other }) end },
    { "the default stream", "default stream is not part", function() x:add(1, { stream = gpu.default_stream() }) end },
    { "an event from outside", "recorded outside the capture", function(s) s:wait(outside) end },
    { "pageable memory", "pageable host memory cannot be captured", function() h:copy(x) end },
    { "nested", "does not nest", function() gpu.graph(function() end) end },
  }
  for _, c in ipairs(cases) do
    local line = debug.getinfo(c[3], "S").linedefined
    local msg = T.raises(function()
      gpu.graph(function(s)
        x:add(1)
        c[3](s)
        error("not reached")
      end)
    end, c[2], c[1] .. " raises")
    T.ok(msg and msg:find("graphs.lua:" .. tostring(line) .. ": ", 1, true),
         c[1] .. ": at its own line (" .. tostring(msg) .. ")")
    T.is(gpu.current_stream(), gpu.default_stream(), c[1] .. ": the current stream is restored")
  end
  -- a graph launched inside a capture
  local g <close> = gpu.graph(function() x:add_(1) end)
  T.raises(function() gpu.graph(function() g:launch() end) end, "cannot be launched inside a capture",
           "launching a graph inside a capture")
  -- the runtime works afterwards: ops, syncs, a new capture
  T.is((x + 1):sum():item(), 16, "ops and syncs work after abandoned captures")
  local g2 <close>, y = gpu.graph(function() return x * 3 end)
  g2:launch()
  T.is(y:sum():item(), 24, "a new capture works")
  g:launch()
  T.is(x:sum():item(), 16, "the earlier graph too")
end)

T.test("host memory in a capture", function()
  local p = gpu.pinned({ 4 })
  p:fill(1)
  local d = gpu.zeros({ 4 })
  local msg = T.raises(function() gpu.graph(function()
    -- made and filled at capture (host work runs once, there): the graph's constant
    local c = gpu.tensor({ 1, 2, 3, 4 }, { dtype = "f32", device = "pinned" })
    local q = gpu.pinned({ 4 })
    q:copy(c)                                   -- host memory only: runs now
    T.is(q:totable(), { 1, 2, 3, 4 }, "an op on host memory alone ran at capture")
    d:copy(p)                                   -- a device op reading p: recorded
    local e = gpu.empty({ 4 })
    e:copy(c)                                   -- recorded: replays copy the constant
    d:add_(e)
    T.raises_at(function() p:fill(2) end, "fill: .*the host cannot touch memory the capture uses",
                "host work on memory the capture uses raises")
    T.raises_at(function() return d:get(1) end, "get: .*cannot be captured", "reading a value raises")
    return c
  end) end, "abandoned at a call that cannot be captured", "a refused call abandons the capture, even caught")
  T.ok(msg and msg:find("^tests/graphs.lua:%d+: graph: .*%(tests/graphs.lua:%d+: .*the host cannot touch"),
       "at gpu.graph's line, naming the first refused call and its line: " .. tostring(msg))
  T.is(p:totable(), { 1, 1, 1, 1 }, "the pinned input is usable afterwards")
  p:fill(2)
  T.is(p:sum():item(), 8, "and writable")
end)

if HOST and not CHILD then
  T.test("the same under GPULUA_HOST_JITTER=1 (a child)", function()
    local out, ok = T.run("GPULUA_DEVICE=host GPULUA_HOST_JITTER=1 GRAPHS_CHILD=1", "tests/graphs.lua")
    T.ok(ok, "tests/graphs.lua under GPULUA_HOST_JITTER=1 exits 0")
    if not ok then T.diag(out) end
  end)
end

T.done()
