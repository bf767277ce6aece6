-- gpu.pipeline: results for depths 1-4 and odd batch counts, with and
-- without output (here and in a child under GPULUA_HOST_JITTER=1), stage
-- order per batch, overlap (max_concurrent, structural), the form without
-- `batches`, pre-filled inputs with no host wait before the drain, every bad
-- spec, errors in stages (propagated, nothing leaked), the progress line,
-- gpu.isatty, and scripts/overlap_pipeline.lua as a child.
-- No timing is asserted; event timestamps are compared for order only.
local gpu = require "gpu"
local T = require "gpu.test"
local pipeline = require "gpu.pipeline"
local cases = dofile("tests/pipeline/cases.lua")

local BIN = T.gpulua
local HOST = gpu.backend == "host"

-- run a gpulua command line; combined output (or stdout only), and whether it exited 0
local run = T.run

local function settle()
  collectgarbage(); collectgarbage(); gpu.synchronize()
end

local function live()
  settle()
  local st, m = gpu.stats(), gpu.memory()
  return { streams = st.streams, events = st.events, buffers = st.buffers, allocated = m.allocated,
           pinned = m.pinned, host = m.host }
end

-- max_concurrent is the largest number of ops ever running at once in this
-- process, so the serial case comes first, before anything overlaps.
T.test("depth 1 without output runs its device stages one after another", function()
  if not HOST then return T.skip("max_concurrent", "host backend only") end
  T.ok(gpu.stats().max_concurrent <= 1, "nothing concurrent yet: " .. gpu.stats().max_concurrent)
  local stats = pipeline.run {
    batches = 4, depth = 1, progress = false,
    input = { shape = { 1 << 18 }, dtype = "f32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x) gpu.sleep(20); x:mul_(2) end,
  }
  T.is(stats.batches, 4, "4 batches")
  T.ok(gpu.stats().max_concurrent <= 1, "max_concurrent still <= 1 at depth 1: " .. gpu.stats().max_concurrent)
end)

T.test("depth 2 overlaps a batch's H2D with the previous batch's compute", function()
  if not HOST then return T.skip("max_concurrent", "host backend only") end
  local ins = {}
  for i = 1, 2 do ins[i] = gpu.full({ 1 << 21 }, i, { dtype = "f32", device = "pinned" }) end
  -- Each compute holds its stream 50 ms, and nothing makes the next batch's
  -- 8 MiB copy wait for it.  On a starved CPU the copy's worker, just woken,
  -- can still run the whole copy before the compute's worker gets to its
  -- sleep: a few runs, so one unlucky schedule does not decide.
  local runs, sums = 0, nil
  repeat
    runs = runs + 1
    sums = {}
    pipeline.run {
      inputs = ins, batches = 6, depth = 2, progress = false,
      compute = function(i, x) gpu.sleep(50); sums[i] = x:sum() end,
    }
  until gpu.stats().max_concurrent >= 2 or runs == 3
  T.ok(gpu.stats().max_concurrent >= 2, string.format("max_concurrent >= 2: %d (after %d run%s)",
       gpu.stats().max_concurrent, runs, runs > 1 and "s" or ""))
  T.is(sums[6]:item(), 2.0 * (1 << 21), "and the last batch is right")
end)

T.test("results, stage order and buffer reuse: depths 1-4, 1/3/7 batches, with and without output, "
       .. "pinned and pageable buffers", function()
  for _, depth in ipairs(cases.DEPTHS) do
    for _, batches in ipairs(cases.BATCHES) do
      for _, mode in ipairs(cases.MODES) do
        for _, memory in ipairs(cases.MEMORY) do
          local problems, log = cases.run(depth, batches, mode, memory)
          if not T.is(problems, {}, cases.name(depth, batches, mode, memory)) then T.diag(log) end
        end
      end
    end
  end
end)

T.test("the same under GPULUA_HOST_JITTER=1 (a child)", function()
  if not HOST then return T.skip("jitter", "host backend only") end
  local out, ok = run("GPULUA_HOST_JITTER=1", "-e 'dofile(\"tests/pipeline/cases.lua\").main()'")
  T.ok(ok, "the child exits 0")
  local good, bad = 0, {}
  for line in out:gmatch("[^\n]+") do
    if line:match("^ok ") then good = good + 1 elseif line:match("^not ok ") then bad[#bad + 1] = line end
  end
  T.is(good, #cases.DEPTHS * #cases.BATCHES * #cases.MODES * #cases.MEMORY, "every case ok")
  T.is(bad, {}, "no case failed")
  T.ok(out:find("live: streams 0 events 0 allocated 0 pinned 0", 1, true), "and nothing left alive")
  if not ok or #bad > 0 then T.diag(out) end
end)

T.test("stage timestamps follow the ordering (timing = true)", function()
  local depth, batches = 2, 5
  local stats = pipeline.run {
    batches = batches, depth = depth, timing = true, progress = false,
    input = { shape = { 4096 }, dtype = "f32" },
    output = { shape = { 4096 }, dtype = "f32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x, y) x:add(1, { out = y }) end,
    sink = function() end,
  }
  local tl = stats.timeline
  T.is(#tl, batches, "a timeline entry per batch")
  local bad = {}
  for i = 1, batches do
    local h, c, d = tl[i].h2d, tl[i].compute, tl[i].d2h
    if not (h[1] <= h[2] and h[2] <= c[1] and c[1] <= c[2] and c[2] <= d[1] and d[1] <= d[2]) then
      bad[#bad + 1] = "batch " .. i .. ": h2d, compute, d2h out of order"
    end
    -- slot reuse: batch i + depth's copy starts after batch i's compute
    if i + depth <= batches and tl[i + depth].h2d[1] < c[2] then
      bad[#bad + 1] = "batch " .. (i + depth) .. "'s H2D starts before batch " .. i .. "'s compute ends"
    end
  end
  T.is(bad, {}, "every batch: H2D <= compute <= D2H, and a slot's next H2D after its compute")
  T.ok(stats.device_ms >= tl[batches].d2h[2], "device_ms covers the last D2H")
  T.near(stats.h2d_ms, (function()
    local s = 0
    for i = 1, batches do s = s + tl[i].h2d[2] - tl[i].h2d[1] end
    return s
  end)(), 1e-9, "h2d_ms is the sum of the H2D intervals")
  T.is(type(stats.compute_ms), "number", "compute_ms")
  T.is(type(stats.d2h_ms), "number", "d2h_ms")
end)

T.test("compute runs with the module's stream current", function()
  local seen = {}
  pipeline.run {
    batches = 3, progress = false,
    input = { shape = { 8 }, dtype = "f32" },
    load = function(_, pin) pin:fill(1) end,
    compute = function(i) seen[i] = gpu.current_stream() end,
  }
  T.ok(seen[1] ~= gpu.default_stream(), "not the default stream")
  T.ok(seen[1] == seen[2] and seen[2] == seen[3], "the same stream for every batch")
  T.ok(gpu.current_stream() == gpu.default_stream(), "and the default stream is current again afterwards")
end)

T.test("without batches, load ends the stream", function()
  local sunk = {}
  local stats = pipeline.run {
    depth = 3, progress = false,
    input = { shape = { 256 }, dtype = "i32" },
    output = { shape = { 256 }, dtype = "i32" },
    load = function(i, pin)
      if i > 5 then return false end
      pin:fill(i)
      return true
    end,
    compute = function(_, x, y) x:mul(3, { out = y }) end,
    sink = function(i, pout) sunk[#sunk + 1] = { i, pout:max():item() } end,
  }
  T.is(stats.batches, 5, "stats.batches counts the batches load filled")
  T.is(sunk, { { 1, 3 }, { 2, 6 }, { 3, 9 }, { 4, 12 }, { 5, 15 } }, "every batch sunk, in order, right")
  T.is(stats.bytes, 5 * 2 * 256 * 4, "stats.bytes: H2D + D2H of 5 batches")

  local calls = 0
  local s2 = pipeline.run {
    progress = false, input = { shape = { 4 } },
    load = function() calls = calls + 1 end,          -- nil at once: no batch
    compute = function() error("compute of an empty stream") end,
    sink = function() error("sink of an empty stream") end,
  }
  T.is({ s2.batches, s2.bytes, calls }, { 0, 0, 1 }, "load returning nil at once: 0 batches, no other stage")
end)

T.test("pre-filled inputs: cycled, and no host wait before the drain", function()
  local ins = {}
  -- pinned and pageable mixed: a pageable copy is queued, not a sync
  for k = 1, 3 do ins[k] = gpu.full({ 1024 }, k, { dtype = "f32", device = k == 2 and "host" or "pinned" }) end
  local sums = {}
  settle()
  local syncs = gpu.stats().syncs
  local stats = pipeline.run {
    inputs = ins, batches = 7, depth = 2, progress = false,
    compute = function(i, x) sums[i] = x:mul_(10):sum() end,
  }
  T.is(gpu.stats().syncs - syncs, 1, "one counted sync in the whole run: the final drain")
  T.is(stats.waits, 0, "stats.waits = 0")
  local got = {}
  for i = 1, 7 do got[i] = sums[i]:item() end
  T.is(got, { 10240.0, 20480.0, 30720.0, 10240.0, 20480.0, 30720.0, 10240.0 }, "batch i read inputs[(i-1) % 3 + 1]")
  local got1 = {}
  for k = 1, 3 do got1[k] = ins[k]:max():item() end
  T.is(got1, { 1.0, 2.0, 3.0 }, "the inputs themselves are not written")
  local s2 = pipeline.run { inputs = ins, progress = false, compute = function() end }
  T.is(s2.batches, 3, "batches defaults to #inputs")
  T.ok(not ins[1].closed, "the inputs stay open (they are the caller's)")
end)

T.test("host waits go through gpu.await when it exists", function()
  local saved = gpu.await
  local calls = 0
  gpu.await = function(ev)
    calls = calls + 1
    return ev:synchronize()
  end
  local ok, stats = pcall(pipeline.run, {
    batches = 4, depth = 1, progress = false,
    input = { shape = { 64 }, dtype = "f32" },
    output = { shape = { 64 }, dtype = "f32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x, y) gpu.sleep(10); x:neg({ out = y }) end,
    sink = function() end,
  })
  gpu.await = saved
  T.ok(ok, "run with a gpu.await in place")
  if not ok then return T.diag(stats) end
  T.ok(stats.waits >= 1, "the host had to wait (10 ms computes, depth 1): " .. stats.waits)
  T.is(calls, stats.waits + 1, "every wait, and the final drain, went through gpu.await")
end)

-- each case: { name, pattern, fn }; fn makes the bad call on one line
local function ok_compute() end
local function ok_load() end
T.test("a bad spec raises naming the field, at the caller's line", function()
  local dev <close> = gpu.zeros({ 4 })
  local pin <close> = gpu.pinned({ 4 })
  local pin8 <close> = gpu.pinned({ 8 })
  local pin_i <close> = gpu.pinned({ 4 }, { dtype = "i32" })
  local inp = { shape = { 4 } }
  local before = live()
  for _, c in ipairs {
    { "no table", "pipeline.run: a table expected, got nil", function() pipeline.run() end },
    { "a string", "a table expected, got \"x\"", function() pipeline.run("x") end },
    { "a method call", "called as pipeline:run{...}; call pipeline.run{...}",
      function() pipeline:run { input = inp, load = ok_load, compute = ok_compute } end },
    { "unknown field", "unknown field 'deph' (expected: batches, depth,",
      function() pipeline.run { deph = 2, input = inp, load = ok_load, compute = ok_compute } end },
    { "positional entry", "bad field key (a number;",
      function() pipeline.run { ok_compute, input = inp, load = ok_load, compute = ok_compute } end },
    { "batches 0", "bad field 'batches' (an integer >= 1 expected, got 0)",
      function() pipeline.run { batches = 0, input = inp, load = ok_load, compute = ok_compute } end },
    { "batches 2.5", "bad field 'batches' (an integer >= 1 expected, got 2.5)",
      function() pipeline.run { batches = 2.5, input = inp, load = ok_load, compute = ok_compute } end },
    { "batches a string", "bad field 'batches' (an integer >= 1 expected, got \"3\")",
      function() pipeline.run { batches = "3", input = inp, load = ok_load, compute = ok_compute } end },
    { "depth 0", "bad field 'depth' (an integer >= 1 expected, got 0)",
      function() pipeline.run { depth = 0, input = inp, load = ok_load, compute = ok_compute } end },
    { "depth -1", "bad field 'depth' (an integer >= 1 expected, got -1)",
      function() pipeline.run { depth = -1, input = inp, load = ok_load, compute = ok_compute } end },
    { "no compute", "missing field 'compute'", function() pipeline.run { input = inp, load = ok_load } end },
    { "compute a number", "bad field 'compute' (a function expected, got 5)",
      function() pipeline.run { input = inp, load = ok_load, compute = 5 } end },
    { "no load", "missing field 'load'", function() pipeline.run { input = inp, compute = ok_compute } end },
    { "load a string", "bad field 'load' (a function expected, got \"f\")",
      function() pipeline.run { input = inp, load = "f", compute = ok_compute } end },
    { "sink a table", "bad field 'sink' (a function expected, got {})",
      function() pipeline.run { input = inp, load = ok_load, compute = ok_compute, sink = {} } end },
    { "no input", "missing field 'input'", function() pipeline.run { load = ok_load, compute = ok_compute } end },
    { "input a number", "bad field 'input' (a table {shape =, dtype =} expected, got 4)",
      function() pipeline.run { input = 4, load = ok_load, compute = ok_compute } end },
    { "input without shape", "missing field 'input.shape'",
      function() pipeline.run { input = { dtype = "f32" }, load = ok_load, compute = ok_compute } end },
    { "a zero dimension", "bad field 'input.shape[2]' (a positive integer expected, got 0)",
      function() pipeline.run { input = { shape = { 4, 0 } }, load = ok_load, compute = ok_compute } end },
    { "shape a string", "bad field 'input.shape' (a list of positive integers expected, got \"4x4\")",
      function() pipeline.run { input = { shape = "4x4" }, load = ok_load, compute = ok_compute } end },
    { "empty shape", "bad field 'input.shape' (at least one dimension expected",
      function() pipeline.run { input = { shape = {} }, load = ok_load, compute = ok_compute } end },
    { "bad dtype", "bad field 'input.dtype' (one of f32 f64 f16 bf16 i8 u8 i32 i64 bool expected, got \"float\")",
      function() pipeline.run { input = { shape = 4, dtype = "float" }, load = ok_load, compute = ok_compute } end },
    { "unknown key in input", "unknown field 'input.shap' (expected: shape, dtype, device)",
      function() pipeline.run { input = { shap = 4 }, load = ok_load, compute = ok_compute } end },
    { "input on the device", "bad field 'input.device' (\"pinned\" or \"host\" expected, got \"device\")",
      function() pipeline.run { input = { shape = 4, device = "device" }, load = ok_load, compute = ok_compute } end },
    { "output device a number", "bad field 'output.device' (\"pinned\" or \"host\" expected, got 3)",
      function() pipeline.run { input = inp, output = { shape = 4, device = 3 }, load = ok_load, compute = ok_compute, sink = ok_load } end },
    { "bad output shape", "bad field 'output.shape[1]' (a positive integer expected, got -4)",
      function() pipeline.run { input = inp, output = { shape = -4 }, load = ok_load, compute = ok_compute, sink = ok_load } end },
    { "output without sink", "missing field 'sink' (output needs a sink",
      function() pipeline.run { input = inp, output = inp, load = ok_load, compute = ok_compute } end },
    { "load and inputs", "fields 'load' and 'inputs' exclude each other",
      function() pipeline.run { inputs = { pin }, load = ok_load, compute = ok_compute } end },
    { "inputs empty", "bad field 'inputs' (a non-empty list of pinned tensors expected, got {})",
      function() pipeline.run { inputs = {}, compute = ok_compute } end },
    { "inputs a tensor", "bad field 'inputs' (a non-empty list of pinned tensors expected, got gpu.Tensor)",
      function() pipeline.run { inputs = pin, compute = ok_compute } end },
    { "inputs with a number", "bad field 'inputs[2]' (a gpu.Tensor expected, got 7)",
      function() pipeline.run { inputs = { pin, 7 }, compute = ok_compute } end },
    { "inputs on the device", "bad field 'inputs[1]' (a pinned or host tensor expected, got a device tensor)",
      function() pipeline.run { inputs = { dev }, compute = ok_compute } end },
    { "inputs of two shapes", "bad field 'inputs[2]' ({8} f32, but inputs[1] is {4} f32)",
      function() pipeline.run { inputs = { pin, pin8 }, compute = ok_compute } end },
    { "inputs of two dtypes", "bad field 'inputs[2]' ({4} i32, but inputs[1] is {4} f32)",
      function() pipeline.run { inputs = { pin, pin_i }, compute = ok_compute } end },
    { "inputs unlike input", "bad field 'inputs[1]' ({8} f32, but input is {4} f32)",
      function() pipeline.run { input = inp, inputs = { pin8 }, compute = ok_compute } end },
    { "progress a string", "bad field 'progress' (a boolean expected, got \"yes\")",
      function() pipeline.run { progress = "yes", input = inp, load = ok_load, compute = ok_compute } end },
    { "timing a number", "bad field 'timing' (a boolean expected, got 1)",
      function() pipeline.run { timing = 1, input = inp, load = ok_load, compute = ok_compute } end },
    { "name a number", "bad field 'name' (a string expected, got 5)",
      function() pipeline.run { name = 5, input = inp, load = ok_load, compute = ok_compute } end },
  } do
    T.raises_at(c[3], c[2], c[1])
  end
  T.is(live(), before, "no stream, event or buffer made by a refused spec")
end)

-- a 7-batch run whose stage `stage` raises `err` at batch `at`
local function failing(stage, at, err, extra)
  local spec = {
    batches = 7, depth = 2, progress = false,
    input = { shape = { 1024 }, dtype = "f32" },
    output = { shape = { 1024 }, dtype = "f32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x, y) x:add(1, { out = y }) end,
    sink = function() end,
  }
  local inner = spec[stage]
  spec[stage] = function(i, ...)
    if i == at then error(err, 0) end
    return inner(i, ...)
  end
  for k, v in pairs(extra or {}) do spec[k] = v end
  return spec
end

-- live objects after a synchronize but no garbage collection: what the
-- module closed itself, not what a collection would have released for it
local function live_now()
  gpu.synchronize()
  local st, m = gpu.stats(), gpu.memory()
  return { streams = st.streams, events = st.events, buffers = st.buffers, allocated = m.allocated,
           pinned = m.pinned, host = m.host }
end

T.test("an error in a stage propagates and leaks nothing", function()
  local before = live()
  collectgarbage("stop")
  local _ <close> = setmetatable({}, { __close = function() collectgarbage("restart") end })
  local done = pipeline.run(failing("compute", 99, "never"))
  T.is({ done.batches, live_now() }, { 7, before }, "a run that ends well closes all it made, without a collection")
  for _, c in ipairs {
    { "load", 1 }, { "load", 4 }, { "compute", 1 }, { "compute", 3 }, { "sink", 2 }, { "sink", 7 },
  } do
    local stage, at = c[1], c[2]
    local msg = string.format("boom in %s %d", stage, at)
    local ok, err = pcall(pipeline.run, failing(stage, at, msg))
    T.is({ ok, err }, { false, msg }, string.format("%s raising at batch %d: the same message", stage, at))
    T.ok(gpu.current_stream() == gpu.default_stream(), "... the default stream is current again")
    T.is(live_now(), before, "... and it closed every stream, event and buffer it made")
  end
  -- with timing on, and in the form without batches
  local ok = pcall(pipeline.run, failing("sink", 5, "late", { timing = true }))
  T.ok(not ok, "raises with timing on")
  T.is(live(), before, "... nothing left")
  local spec = failing("load", 3, "streamed")
  spec.batches = nil
  local inner = spec.load
  spec.load = function(i, pin) inner(i, pin); return true end
  local ok2, err2 = pcall(pipeline.run, spec)
  T.is({ ok2, err2 }, { false, "streamed" }, "without batches: the load's error")
  T.is(live(), before, "... nothing left")

  local obj = setmetatable({}, { __tostring = function() return "an error object" end })
  local ok3, err3 = pcall(pipeline.run, failing("compute", 2, obj))
  T.ok(not ok3 and rawequal(err3, obj), "a non-string error value comes through as it is")
  T.is(live(), before, "... nothing left")

  -- the message keeps the position of the raise, inside the stage
  T.raises_at(function() pipeline.run { batches = 2, progress = false, input = { shape = 4 }, load = function() error("no data") end, compute = ok_compute } end,
              "no data", "a stage's error(msg) keeps its file:line")
end)

T.test("graph = true: each slot's compute captured once, replayed for every batch", function()
  local n = 1024
  -- batch i's input: 2i everywhere but element 1, -i; compute: 2x + 1
  local function want(i) return { min = 1 - 2 * i, max = 4 * i + 1, sum = (n - 1) * (4 * i + 1) + (1 - 2 * i) } end
  local before = live()
  for _, depth in ipairs { 1, 2, 3 } do
    for _, batches in ipairs { 1, 5, 8 } do
      for _, mode in ipairs { "output", "result" } do
        local calls, got, graphs = {}, {}, 0
        local spec = {
          batches = batches, depth = depth, graph = true, progress = false, name = "g",
          input = { shape = { n } },
          load = function(i, pin) pin:fill(2 * i); pin:set(1, -i) end,
          compute = function(i, x, y)
            calls[#calls + 1] = i
            if gpu.current_stream() ~= gpu.default_stream() then graphs = graphs + 1 end
            if y then
              x:mul(2, { out = y })
              y:add_(1)
              return nil
            end
            x:mul_(2):add_(1)
            return { min = x:min(), max = x:max(), sum = x:sum() }
          end,
        }
        if mode == "output" then
          spec.output = { shape = { n } }
          spec.sink = function(i, pout)
            got[i] = { min = pout:min():item(), max = pout:max():item(), sum = pout:sum():item() }
          end
        else
          spec.sink = function(i, _, r) got[i] = { min = r.min:item(), max = r.max:item(), sum = r.sum:item() } end
        end
        local stats = pipeline.run(spec)
        local name = string.format("depth %d, %d batches, %s", depth, batches, mode)
        local slots, first = math.min(depth, batches), {}
        for k = 1, slots do first[k] = k end
        T.is(calls, first, name .. ": compute ran once per slot, at its first batch")
        T.is(graphs, slots, name .. ": ... each time on a capture stream")
        local wants = {}
        for i = 1, batches do wants[i] = want(i) end
        T.is(got, wants, name .. ": every batch's result, from the replays")
        T.is(stats.batches, batches, name .. ": stats.batches")
      end
    end
  end
  T.is(live(), before, "the graphs, streams, events and buffers are all closed")
  -- a call that cannot be captured raises at its line in compute
  local line
  local msg = T.raises(function()
    pipeline.run {
      batches = 3, graph = true, progress = false, input = { shape = { 4 } },
      load = function(i, pin) pin:fill(i) end,
      compute = function(_, x)
        line = debug.getinfo(1, "l").currentline + 1
        return x:sum():item()
      end,
    }
  end, "item: .*cannot be captured", "item() in a captured compute raises")
  T.ok(msg and msg:find("pipeline.lua:" .. tostring(line) .. ":", 1, true), "... at its line: " .. tostring(msg))
  T.is(live(), before, "... and nothing is left")
  T.raises_at(function()
    pipeline.run { graph = 1, input = { shape = 4 }, load = ok_load, compute = ok_compute }
  end, "bad field 'graph' %(a boolean expected, got 1%)", "graph must be a boolean")
end)

T.test("graph = true inside a gpu.task", function()
  local sums = {}
  local t = gpu.task(function()
    pipeline.run {
      batches = 6, depth = 2, graph = true, progress = false, input = { shape = { 256 } },
      load = function(i, pin) pin:fill(i) end,
      compute = function(_, x) return x:mul(3):sum() end,
      sink = function(i, _, r) sums[i] = r:item() end,
    }
  end)
  gpu.run()
  t:result()
  T.is(sums, { 768, 1536, 2304, 3072, 3840, 4608 }, "the replays' sums, read by the sinks")
end)

T.test("an asynchronous device error surfaces from run", function()
  local zeros <close> = gpu.zeros({ 16 }, { dtype = "i32" })
  local before = live()
  -- integer division by a zero tensor fails on the stream, not at the call;
  -- only the last batch's fails, so the error comes at the final drain
  local ok, err = pcall(pipeline.run, {
    batches = 3, progress = false,
    input = { shape = { 16 }, dtype = "i32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(i, x) if i == 3 then x:div_(zeros) else x:add_(1) end end,
  })
  T.ok(not ok and tostring(err):find("integer division by zero", 1, true), "raised: " .. tostring(err))
  T.is(live(), before, "... nothing left")
  -- every batch fails: run raises the first failure; work it had enqueued
  -- still runs, and a later failure surfaces at a later sync, as for any
  -- queued work
  local ok2, err2 = pcall(pipeline.run, {
    batches = 3, progress = false,
    input = { shape = { 16 }, dtype = "i32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x) x:div_(zeros) end,
  })
  T.ok(not ok2 and tostring(err2):find("integer division by zero", 1, true), "raised: " .. tostring(err2))
  pcall(gpu.synchronize)
  T.is(live(), before, "... nothing left")
end)

T.test("the progress line", function()
  for _, c in ipairs {
    { "counted on", "counted on", true, "progress%-test: %d/8 batches %[[#.]+%] [%d.]+ GB/s ETA" },
    { "stream on", "stream on", true, "progress%-test: %d batches [%d.]+ GB/s" },
    { "counted, default, stderr a pipe", "counted default", false },
    { "stream, default, stderr a pipe", "stream default", false },
    { "counted off", "counted off", false },
  } do
    -- the device said, so that no fallback note comes on stderr
    local out, ok = run("GPULUA_DEVICE=${GPULUA_DEVICE:-host}", "tests/pipeline/progress.lua " .. c[2])
    local n = c[2]:match("^counted") and 8 or 6
    T.ok(ok and out:find("done " .. n .. "\n", 1, true), c[1] .. ": exits 0, all batches done")
    if c[3] then
      T.ok(out:find("\rprogress-test: ", 1, true) and out:find(c[4]), c[1] .. ": the line, drawn after \\r")
      -- the last thing on stderr is \r, blanks, \r: the line is cleared
      local err = out:gsub("done %d+\n", "")
      T.ok(err:match("\r +\r$"), c[1] .. ": cleared at the end")
    else
      T.is(out, "done " .. n .. "\n", c[1] .. ": nothing on stderr")
    end
    if not ok then T.diag(out) end
  end
  -- a sink's error: the line is cleared before the error is printed
  local out, ok = run("", "tests/pipeline/progress.lua fail on")
  T.ok(not ok, "a failing run exits non-zero")
  local before_err = out:match("^(.-)[^\r\n]*sink fails at batch 5")
  T.ok(before_err and before_err:find("progress-test: ", 1, true) and before_err:match("\r +\r$"),
       "the line was drawn, and cleared before the error message")
  if not before_err then T.diag(out) end

  local have_script = os.execute("command -v script >/dev/null 2>&1")
  if not have_script then return T.skip("on a terminal", "no script(1) to make one") end
  -- script(1) runs the child on a pseudo-terminal: the line is on by default
  local p = assert(io.popen(string.format("script -qec '%s tests/pipeline/progress.lua counted default' /dev/null 2>&1", BIN)))
  local out = p:read("a")
  local ok = p:close() == true
  T.ok(ok and out:find("progress-test: 8/8 batches", 1, true), "on a terminal the line is drawn by default")
  if not ok then T.diag(out) end
end)

T.test("gpu.isatty", function()
  for _, name in ipairs { "stdin", "stdout", "stderr" } do
    T.is(type(gpu.isatty(name)), "boolean", "isatty('" .. name .. "') is a boolean")
  end
  local out, ok = run("GPULUA_DEVICE=${GPULUA_DEVICE:-host}",
                      "-e 'io.write(tostring(gpu.isatty(\"stdout\")), tostring(gpu.isatty(\"stdin\")))' </dev/null")
  T.ok(ok and out == "falsefalse", "stdout a pipe, stdin /dev/null: false, false (" .. out .. ")")
  if os.execute("command -v script >/dev/null 2>&1") then
    local p = assert(io.popen(string.format("script -qec '%s -e \"io.write(tostring(gpu.isatty([[stdout]])))\"' /dev/null", BIN)))
    local o = p:read("a")
    p:close()
    T.ok(o:find("true", 1, true), "stdout a terminal (script(1)): true (" .. o .. ")")
  else
    T.skip("stdout a terminal", "no script(1)")
  end
  T.raises_at(function() gpu.isatty("stdio") end, "bad argument #1 to '.-isatty' %(invalid option 'stdio'%)", "an unknown name")
  T.raises_at(function() gpu.isatty() end, "bad argument #1 to '.-isatty' %(string expected, got no value%)", "no name")
  T.raises_at(function() gpu.isatty(io.stderr) end, "bad argument #1 to '.-isatty' %(string expected", "a file handle")
end)

T.test("scripts/overlap_pipeline.lua", function()
  local out, ok = run("", "scripts/overlap_pipeline.lua 6 65536")
  T.ok(ok, "overlap_pipeline.lua exits 0")
  T.ok(out:find("overlap: 6 batches x [%d.]+ MiB, check ok"), "prints overlap.lua's check line")
  T.ok(out:find("compute: %d+ passes per batch %(calibrated: copy [%d.]+ ms"), "... its calibration")
  T.ok(out:find("time:%s+total [%d.]+ ms%s+copy [%d.]+ ms"), "... its timing line")
  local eff = tonumber(out:match("efficiency: ([%d.]+) %(ideal [%d.]+ ms"))
  T.ok(eff and eff > 0, "... and a positive efficiency")
  T.ok(out:find("pipeline: gpu.pipeline depth 2, 0 host waits before the drain", 1, true), "... with no host wait")
  if not ok then T.diag(out) end
  local out2, ok2 = run("GPULUA_HOST_JITTER=1", "scripts/overlap_pipeline.lua 7 32768 passes=2")
  T.ok(ok2 and out2:find("overlap: 7 batches x 0.1 MiB, check ok", 1, true), "check ok under GPULUA_HOST_JITTER=1")
  T.ok(out2:find("compute: 2 passes per batch (fixed)", 1, true), "... with the passes given")
  if not ok2 then T.diag(out2) end
  local out3, ok3 = run("", "scripts/overlap_pipeline.lua 1 4096")
  T.ok(ok3 and out3:find("overlap: 1 batches x 0.0 MiB, check ok", 1, true), "a single batch works")
  local out4, ok4 = run("", "scripts/overlap_pipeline.lua 2 4096 passes=3")
  T.ok(not ok4 and out4:find("passes must be auto or an even integer", 1, true), "an odd passes= is refused")
  for _, env in ipairs { "", "GPULUA_HOST_JITTER=1" } do
    local out5, ok5 = run(env, "scripts/overlap_pipeline.lua 7 32768 passes=2 graph")
    T.ok(ok5 and out5:find("overlap: 7 batches x 0.1 MiB, check ok", 1, true), "graph: check ok " .. env)
    T.ok(out5:find("compute: 2 passes per batch (fixed), replayed from a graph per slot", 1, true),
         "... replayed from a graph per slot")
    if not ok5 then T.diag(out5) end
  end
end)

T.done()
