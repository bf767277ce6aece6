-- gpu.pipeline: a declarative multi-stage pipeline.  Each batch i goes
--
--   load (host) -> H2D copy -> compute (device) -> D2H copy -> sink (host)
--
-- while up to `depth` batches are in flight: batch i+1's H2D runs beside
-- batch i's compute, and batch i's D2H beside batch i+1's compute.  The
-- module makes and reuses the streams, events and buffers, and orders the
-- stages with events alone (no gpu.synchronize before the end).
--
--   local pipeline = require "gpu.pipeline"
--   local stats = pipeline.run {
--     batches = 32, depth = 2,
--     input  = { shape = {n}, dtype = "f32" },          -- one pinned + one device buffer per slot
--     output = { shape = {n}, dtype = "f32" },          -- optional: device + pinned buffer, D2H
--     load    = function(i, pin) pin:fill(i) end,       -- host: fill batch i (1-based)
--     compute = function(i, x, y) x:mul(2, { out = y }) end,   -- enqueue on the current stream
--     sink    = function(i, pout) total = total + pout:sum():item() end,  -- host: batch i's result
--   }
--   print(stats.batches, stats.seconds, stats.gbps)
--
-- Fields of the spec (anything else raises):
--   batches   integer >= 1.  May be left out: then load ends the stream by
--             returning false/nil (and must return true for every batch it
--             filled); with inputs it defaults to #inputs.
--   depth     batches in flight, integer >= 1 (default 2): depth slots, each
--             a host input, a device input, and with output a device and a
--             host output.  depth = 1 has one set, so batches barely overlap.
--   input     { shape = {...} or n, dtype = "f32", device = "pinned" }: one
--             batch's input; device is where load's buffer lives: "pinned"
--             (default) or "host" (ordinary pageable memory: its copies are
--             staged through pinned memory, as asynchronous as pinned ones).
--   inputs    instead of input + load: a list of pinned or host (pageable)
--             tensors filled beforehand, batch i copies inputs[i] (cycled
--             when batches > #inputs).  The host never waits for the H2D
--             copies then, so the timed loop is the device's alone.
--   output    { shape =, dtype =, device = } of one batch's result (device
--             as for input: sink's buffer); needs a sink.
--   load(i, pinned_in)            fills batch i's host buffer (pinned, or
--             pageable with device = "host") on the host.
--   compute(i, dev_in, dev_out)   enqueues batch i's device work on the
--             current stream (the module's compute stream); dev_out is nil
--             without output (work in place on dev_in).  Its first return
--             value is handed to sink.  Work on another stream must be joined
--             back (gpu.current_stream():wait(other)) before it returns.
--   sink(i, pinned_out, result)   consumes batch i on the host once its
--             compute (and D2H) is done; called in batch order.  pinned_out
--             (pinned, or pageable with output.device = "host") is nil
--             without output.  It is reused for batch i + depth: copy
--             what must outlive the call.
--   progress  true/false: a progress line on stderr (default: when stderr is
--             a terminal, redrawn with \r and cleared at the end).
--   timing    true: time every stage with events (stats gain device_ms,
--             h2d_ms, compute_ms, d2h_ms and timeline).
--   name      label of the progress line (default "pipeline").
--   graph     true: each slot's compute is captured once with gpu.graph (at
--             the slot's first batch; compute is called depth times in all,
--             its Lua control flow running then only) and replayed for
--             every batch of the slot, one launch instead of its ops.  What
--             compute returns is the graph's: rewritten by each replay, it
--             shows batch i's values when sink(i) gets it.  A call that
--             cannot be captured (a sync such as item, a stream not joined)
--             raises at its line in compute.
--
-- The buffers are the module's: they are closed when run returns (or
-- raises), as are its streams and events; a stage that closes one it was
-- lent raises, naming the stage.  An error in a stage propagates as it was
-- raised; work already enqueued finishes on its own (an asynchronous
-- failure of it surfaces at a later sync, as for any queued work).  What
-- fails in the module's own work (making its buffers, a copy, a wait that
-- meets an asynchronous error) raises at the script line that called run,
-- naming the batch.  Outside a coroutine a stage cannot yield: that error
-- names the stage and points at the line that yielded.  The host
-- waits (before load refills a pinned buffer, before sink, at the end) use
-- gpu.await where it exists, so inside a gpu.task only that task waits;
-- else ev:synchronize().  load and sink are host stages: device work they
-- put on the default stream is ordered with the module's streams (correct,
-- but the pipeline stalls for it).
--
-- stats: batches, depth, seconds (host wall time of the batches, setup
-- excluded), setup_seconds, bytes (H2D + D2H), h2d_bytes, d2h_bytes, gbps
-- (bytes / seconds / 1e9), load_seconds and sink_seconds (host time in those
-- stages), waits and wait_seconds (times the host blocked on the device
-- before the final drain, and for how long).  With timing: device_ms (first
-- H2D to last stage), h2d_ms, compute_ms, d2h_ms (sums over the batches),
-- and timeline[i] = { h2d = {t0, t1}, compute = {t0, t1}, d2h = {t0, t1} }
-- in ms since the start.
local gpu = require "gpu"

local M = {}

local FIELDS = { "batches", "depth", "input", "inputs", "output", "load", "compute", "sink",
                 "progress", "timing", "name", "graph" }
local DTYPES = { "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool" }

-- ---- checking the spec ---------------------------------------------------

local function is_in(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "table" and getmetatable(v) == nil then
    local parts = {}
    for i, x in ipairs(v) do
      if i > 8 then parts[#parts + 1] = "..."; break end
      parts[#parts + 1] = show(x)
    end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  if type(v) == "number" or type(v) == "boolean" then return tostring(v) end
  local mt = getmetatable(v)
  return type(mt) == "table" and type(mt.__name) == "string" and mt.__name or type(v)
end

local function is_tensor(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__name == "gpu.Tensor"
end

local function callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

-- Raises from the checks below are caught by M.run and raised again at the
-- caller's line: one error() level to get right, not one per check.
local Bad = {}
local function bad(fmt, ...)
  error(setmetatable({ msg = "pipeline.run: " .. string.format(fmt, ...) }, Bad))
end

-- ---- errors met while running ------------------------------------------------

local getinfo = debug and debug.getinfo

-- "file:line: " of the function `level` levels up from where()'s caller,
-- as error(msg, level) would prefix it ("" where there is no line)
local function where(level)
  local info = getinfo and getinfo(level + 1, "Sl")
  if info and info.currentline and info.currentline > 0 then
    return info.short_src .. ":" .. info.currentline .. ": "
  end
  return ""
end

-- Raised at the script line that called run: a position inside this file
-- tells the script nothing.
local function raise(P, msg)
  error(P.where .. "pipeline.run: " .. msg, 0)
end

local function fail(P, what, err)
  if type(err) ~= "string" then error(err, 0) end
  raise(P, what .. ": " .. (err:gsub("^[^\n]-pipeline%.lua:%d+: ", "", 1)))
end

local function checked(P, what, arg, ok, ...)
  if not ok then fail(P, string.format(what, arg), (...)) end
  return ...
end

-- fn(...), the module's own work: a failure is raised as fail() says, what
-- (a format of one argument, arg) naming what was being done
local function guard(P, what, arg, fn, ...)
  return checked(P, what, arg, pcall(fn, ...))
end

local function stage_name(P, name, i)
  local fn = P[name]
  local info = type(fn) == "function" and getinfo and getinfo(fn, "S")
  if info and info.linedefined > 0 then
    return string.format("%s (batch %d, defined at %s:%d)", name, i, info.short_src, info.linedefined)
  end
  return string.format("%s (batch %d)", name, i)
end

-- the buffer a stage was lent must still be open when it returns
local function check_open(P, name, i, buf, what)
  if buf and buf.closed then
    raise(P, string.format("%s closed its %s buffer, which the module only lends it for the batch "
                           .. "(copy what must outlive the stage; leave the buffer open)",
                           stage_name(P, name, i), what))
  end
end

-- coroutine.yield raises with no position where nothing can yield: point
-- at the stage's line that yielded, and name the stage
local function on_stage_error(P)
  return function(e)
    if type(e) ~= "string" or not e:find("^attempt to yield") or not getinfo then return e end
    local raiser = getinfo(2, "S")
    if not raiser or raiser.what ~= "C" then return e end
    for level = 3, 40 do
      local info = getinfo(level, "Sl")
      if not info then break end
      if info.currentline > 0 then
        return string.format("%s:%d: pipeline.run: %s (batch %d): %s (a stage can yield only when "
                             .. "pipeline.run runs in a coroutine, such as a gpu.task)",
                             info.short_src, info.currentline, P.stage, P.batch, e)
      end
    end
    return e
  end
end

local function stage_done(ok, ...)
  if not ok then error((...), 0) end
  return ...
end

-- P[name](i, ...).  Where a yield cannot work (the main program, or across
-- a C call) the stage runs under xpcall, so a yield's error can be told.
local function call_stage(P, name, i, ...)
  if coroutine.isyieldable() then return P[name](i, ...) end
  P.stage, P.batch = name, i
  return stage_done(xpcall(P[name], P.on_error, i, ...))
end

local function pos_int(v)
  local i = math.type(v) == "float" and math.tointeger(v) or v
  return math.type(i) == "integer" and i >= 1 and i or nil
end

local function check_keys(t, allowed, prefix)
  for k in pairs(t) do
    if type(k) ~= "string" then
      bad("bad %s key (a %s; fields are named: %s)", prefix == "" and "field" or "field in '" .. prefix .. "'",
          type(k), table.concat(allowed, ", "))
    elseif not is_in(allowed, k) then
      bad("unknown field '%s%s' (expected: %s)", prefix == "" and "" or prefix .. ".", k, table.concat(allowed, ", "))
    end
  end
end

-- {shape =, dtype =, device =} -> shape list, dtype, host memory kind
local function check_buffer_spec(v, field)
  if type(v) ~= "table" or getmetatable(v) ~= nil then
    bad("bad field '%s' (a table {shape =, dtype =} expected, got %s)", field, show(v))
  end
  check_keys(v, { "shape", "dtype", "device" }, field)
  local shape = v.shape
  if shape == nil then bad("missing field '%s.shape' (a list of positive integers, or one)", field) end
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or getmetatable(shape) ~= nil then
    bad("bad field '%s.shape' (a list of positive integers expected, got %s)", field, show(shape))
  end
  local dims = {}
  for j = 1, #shape do
    dims[j] = pos_int(shape[j])
    if not dims[j] then
      bad("bad field '%s.shape[%d]' (a positive integer expected, got %s)", field, j, show(shape[j]))
    end
  end
  if #dims == 0 then bad("bad field '%s.shape' (at least one dimension expected, got {})", field) end
  local dtype = v.dtype == nil and "f32" or v.dtype
  if not is_in(DTYPES, dtype) then
    bad("bad field '%s.dtype' (one of %s expected, got %s)", field, table.concat(DTYPES, " "), show(v.dtype))
  end
  local device = v.device == nil and "pinned" or v.device
  if device ~= "pinned" and device ~= "host" then
    bad("bad field '%s.device' (\"pinned\" or \"host\" expected, got %s)", field, show(v.device))
  end
  return dims, dtype, device
end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for j = 1, #a do if a[j] ~= b[j] then return false end end
  return true
end

local function check(spec, extra)
  if rawequal(spec, M) then bad("called as pipeline:run{...}; call pipeline.run{...} (a dot)") end
  if extra ~= nil then bad("one argument expected (the spec table), got a second: %s", show(extra)) end
  if type(spec) ~= "table" or getmetatable(spec) ~= nil then
    bad("a table expected, got %s", show(spec))
  end
  check_keys(spec, FIELDS, "")
  local P = {}
  for _, f in ipairs { "batches", "depth" } do
    if spec[f] ~= nil then
      P[f] = pos_int(spec[f])
      if not P[f] then bad("bad field '%s' (an integer >= 1 expected, got %s)", f, show(spec[f])) end
    end
  end
  P.depth = P.depth or 2
  for _, f in ipairs { "load", "compute", "sink" } do
    if spec[f] ~= nil and not callable(spec[f]) then
      bad("bad field '%s' (a function expected, got %s)", f, show(spec[f]))
    end
    P[f] = spec[f]
  end
  for _, f in ipairs { "progress", "timing", "graph" } do
    if spec[f] ~= nil and type(spec[f]) ~= "boolean" then
      bad("bad field '%s' (a boolean expected, got %s)", f, show(spec[f]))
    end
  end
  if spec.name ~= nil and type(spec.name) ~= "string" then
    bad("bad field 'name' (a string expected, got %s)", show(spec.name))
  end
  P.name = spec.name or "pipeline"
  P.timing = spec.timing == true
  P.graph = spec.graph == true
  if spec.progress == nil then P.progress = gpu.isatty("stderr") else P.progress = spec.progress end

  if not P.compute then bad("missing field 'compute' (a function that enqueues batch i's device work)") end
  if spec.input ~= nil then P.in_shape, P.in_dtype, P.in_device = check_buffer_spec(spec.input, "input") end
  if spec.output ~= nil then
    P.out_shape, P.out_dtype, P.out_device = check_buffer_spec(spec.output, "output")
    if not P.sink then bad("missing field 'sink' (output needs a sink to consume it)") end
  end

  if spec.inputs ~= nil then
    if P.load then bad("fields 'load' and 'inputs' exclude each other (inputs are filled beforehand)") end
    local list = spec.inputs
    if type(list) ~= "table" or getmetatable(list) ~= nil or #list == 0 then
      bad("bad field 'inputs' (a non-empty list of pinned tensors expected, got %s)", show(list))
    end
    for j = 1, #list do
      local t = list[j]
      if not is_tensor(t) then
        bad("bad field 'inputs[%d]' (a gpu.Tensor expected, got %s)", j, show(t))
      end
      local okt, dev = pcall(function() return t.device end)
      if not okt then bad("bad field 'inputs[%d]' (%s)", j, tostring(dev):gsub("^.-: ", "")) end
      if dev ~= "pinned" and dev ~= "host" then
        bad("bad field 'inputs[%d]' (a pinned or host tensor expected, got a %s tensor)", j, dev)
      end
      local shape, dtype = t.shape, t.dtype
      P.in_shape = P.in_shape or shape
      P.in_dtype = P.in_dtype or dtype
      if not same_shape(shape, P.in_shape) or dtype ~= P.in_dtype then
        bad("bad field 'inputs[%d]' (%s %s, but %s is %s %s)", j, show(shape), dtype,
            spec.input and "input" or "inputs[1]", show(P.in_shape), P.in_dtype)
      end
    end
    P.inputs = list
    P.batches = P.batches or #list
  else
    if not P.load then
      bad("missing field 'load' (a function that fills batch i's pinned buffer; or give inputs)")
    end
    if not P.in_shape then bad("missing field 'input' ({shape =, dtype =} of one batch)") end
  end
  return P
end

-- ---- resources -------------------------------------------------------------

-- Everything run makes is registered here and closed by one <close>, on
-- every path: a stage's error, a failed allocation, or the normal end.
local Owned = {}
Owned.__index = Owned
Owned.__close = function(R)
  if R.progress then R.progress:clear() end
  for j = R.n, 1, -1 do
    R[j]:close()      -- tensors, events, streams: idempotent, never raise
    R[j] = nil
  end
  R.n = 0
end

local function own(R, x)
  R.n = R.n + 1
  R[R.n] = x
  return x
end

-- Block until ev is done; inside a gpu.task only that task waits (gpu.await
-- yields there).  True when it had to wait.
local function wait_for(ev)
  if ev:query() then return false end
  local await = gpu.await
  if await then await(ev) else ev:synchronize() end
  return true
end

-- The final drain always goes to the device, which also raises an
-- asynchronous error of the queued work (query() alone does not).
local function drain(ev)
  local await = gpu.await
  if await then await(ev) else ev:synchronize() end
end

-- ---- progress line -----------------------------------------------------------

local Progress = {}
Progress.__index = Progress

local function new_progress(P, bytes_per_batch)
  return setmetatable({ name = P.name, total = P.batches, bpb = bytes_per_batch,
                        t0 = gpu.clock(), last = -1, width = 0 }, Progress)
end

local function fmt_secs(s)
  if s >= 3600 then return string.format("%dh%02dm", s // 3600, s % 3600 // 60) end
  if s >= 60 then return string.format("%dm%02ds", s // 60, s % 60) end
  return string.format("%.1fs", s)
end

-- Redrawn at most 10 times a second (and for the last batch): a terminal
-- write per batch would cost more than a small batch.
function Progress:update(done)
  local now = gpu.clock()
  if now - self.last < 0.1 and done ~= self.total then return end
  self.last = now
  local dt = now - self.t0
  local rate = dt > 0 and done * self.bpb / dt / 1e9 or 0
  local line
  if self.total then
    local w = 24
    local fill = math.floor(w * done / self.total)
    local eta = done > 0 and (self.total - done) * dt / done or nil
    line = string.format("%s: %d/%d batches [%s%s] %.2f GB/s ETA %s", self.name, done, self.total,
                         string.rep("#", fill), string.rep(".", w - fill), rate, eta and fmt_secs(eta) or "?")
  else
    line = string.format("%s: %d batches %.2f GB/s %s", self.name, done, rate, fmt_secs(dt))
  end
  local pad = math.max(0, self.width - #line)
  self.width = #line
  io.stderr:write("\r", line, string.rep(" ", pad))
  io.stderr:flush()
end

function Progress:clear()
  if self.width > 0 then
    io.stderr:write("\r", string.rep(" ", self.width), "\r")
    io.stderr:flush()
    self.width = 0
  end
end

-- ---- the run -----------------------------------------------------------------

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

local DTYPE_SIZE = { f32 = 4, f64 = 8, f16 = 2, bf16 = 2, i8 = 1, u8 = 1, i32 = 4, i64 = 8, bool = 1 }

local function run(P, R)
  local t_setup = gpu.clock()
  local output = P.out_shape ~= nil
  local nslots = P.batches and math.min(P.depth, P.batches) or P.depth
  local in_bytes = numel(P.in_shape) * DTYPE_SIZE[P.in_dtype]
  local out_bytes = output and numel(P.out_shape) * DTYPE_SIZE[P.out_dtype] or 0

  local h2d, comp, d2h, slots = guard(P, "making its streams, events and %d sets of buffers", nslots, function()
    local h2d = own(R, gpu.stream())
    local comp = own(R, gpu.stream())
    local d2h = output and own(R, gpu.stream()) or nil
    -- slot k serves batches k, k + nslots, ...; its events mark where its
    -- latest batch is, so the next batch in the slot can wait for exactly that
    local slots = {}
    for k = 1, nslots do
      local s = {
        dev_in = own(R, gpu.empty(P.in_shape, { dtype = P.in_dtype })),
        h2d_done = own(R, gpu.event { timing = false }),
        comp_done = own(R, gpu.event { timing = false }),
      }
      if not P.inputs then s.pin_in = own(R, gpu.empty(P.in_shape, { dtype = P.in_dtype, device = P.in_device })) end
      if output then
        s.dev_out = own(R, gpu.empty(P.out_shape, { dtype = P.out_dtype }))
        s.pin_out = own(R, gpu.empty(P.out_shape, { dtype = P.out_dtype, device = P.out_device }))
        s.d2h_done = own(R, gpu.event { timing = false })
      end
      slots[k] = s
    end
    return h2d, comp, d2h, slots
  end)
  local last = d2h or comp                     -- the stream of each batch's last stage

  local stats = { depth = P.depth, load_seconds = 0, sink_seconds = 0, waits = 0, wait_seconds = 0 }
  local function host_wait(ev)
    local t0 = gpu.clock()
    if wait_for(ev) then
      stats.waits = stats.waits + 1
      stats.wait_seconds = stats.wait_seconds + (gpu.clock() - t0)
    end
  end

  local progress = P.progress and new_progress(P, in_bytes + out_bytes) or nil
  R.progress = progress
  local done = 0
  -- Without a sink nothing else tells the host how far the device is: each
  -- batch then records an event for the progress line (from a pool).
  -- track[head..tail] are the batches not yet seen done, in order.
  local track, head, tail, pool = progress and not P.sink and {} or nil, 1, 0, {}
  local function poll()
    while track and head <= tail and track[head]:query() do
      pool[#pool + 1] = track[head]
      track[head] = nil
      head = head + 1
      done = done + 1
    end
    progress:update(done)
  end

  -- batch j's sink, once its last stage is done; slot k's events are still
  -- j's, as nothing of batch j + nslots has been enqueued yet
  local function retire(j)
    local s = slots[(j - 1) % nslots + 1]
    guard(P, "waiting for batch %d to finish", j, host_wait, output and s.d2h_done or s.comp_done)
    local t0 = gpu.clock()
    local result = s.result
    s.result = nil
    call_stage(P, "sink", j, s.pin_out, result)
    check_open(P, "sink", j, s.pin_out, (P.out_device or "pinned") .. " output")
    stats.sink_seconds = stats.sink_seconds + (gpu.clock() - t0)
    done = done + 1
  end

  local timeline = P.timing and {} or nil
  local function mark(stream)
    return timeline and own(R, stream:record { timing = true }) or nil
  end

  -- batch i's H2D: dev_in is free once batch i - nslots's compute is done reading it
  local function enqueue_h2d(i, s, src)
    if i > nslots then h2d:wait(s.comp_done) end
    local h0 = mark(h2d)
    s.dev_in:copy(src, { stream = h2d })
    local h1 = mark(h2d)
    s.h2d_done:record(h2d)
    return h0, h1
  end

  local function enqueue_d2h(s)
    d2h:wait(s.comp_done)
    local d0 = mark(d2h)
    s.pin_out:copy(s.dev_out, { stream = d2h })
    local d1 = mark(d2h)
    s.d2h_done:record(d2h)
    return d0, d1
  end

  stats.setup_seconds = gpu.clock() - t_setup
  local t_start = gpu.clock()
  local start = mark(h2d)
  local b = 0
  while not P.batches or b < P.batches do
    local i = b + 1
    local k = (i - 1) % nslots + 1
    local s = slots[k]
    local src
    if P.inputs then
      local j = (i - 1) % #P.inputs + 1
      src = P.inputs[j]
      if src.closed then raise(P, string.format("inputs[%d] is closed (batch %d)", j, i)) end
    else
      -- the pinned buffer may still be read by batch i - nslots's H2D: load
      -- gets it once that is done, whatever it writes the buffer with (not
      -- only through ops, which the runtime's host-access fence would stop)
      if i > nslots then guard(P, "waiting to load batch %d", i, host_wait, s.h2d_done) end
      local t0 = gpu.clock()
      local more = call_stage(P, "load", i, s.pin_in)
      check_open(P, "load", i, s.pin_in, (P.in_device or "pinned") .. " input")
      stats.load_seconds = stats.load_seconds + (gpu.clock() - t0)
      if not P.batches and not more then break end
      src = s.pin_in
    end
    b = i
    -- batch i - nslots's sink reads pin_out, which batch i's D2H overwrites
    if P.sink and i > nslots then retire(i - nslots) end

    local tl = timeline and {} or nil
    local h0, h1 = guard(P, "the H2D copy of batch %d", i, enqueue_h2d, i, s, src)

    -- compute: after its data has arrived, and (output) after batch
    -- i - nslots's D2H has read dev_out (the host has seen that D2H done in
    -- retire above; the wait keeps the device's order explicit all the same)
    comp:wait(s.h2d_done)
    if output and i > nslots then comp:wait(s.d2h_done) end
    local c0, c1
    do
      local _ <close> = gpu.using(comp)
      c0 = mark(comp)
      local result
      if P.graph then
        -- the slot's compute is captured at its first batch and replayed
        -- from then on: its results are the graph's, rewritten by each
        -- replay (sink(i) sees batch i's: the slot's next replay is batch
        -- i + nslots, enqueued after sink(i))
        if not s.graph then
          local got = table.pack(gpu.graph(function()
            return call_stage(P, "compute", i, s.dev_in, s.dev_out)
          end, { name = string.format("%s compute, slot %d", P.name, k) }))
          s.graph = own(R, got[1])
          s.graph_result = got[2]
        end
        s.graph:launch(comp)
        result = s.graph_result
      else
        result = call_stage(P, "compute", i, s.dev_in, s.dev_out)
      end
      check_open(P, "compute", i, s.dev_in, "device input")
      check_open(P, "compute", i, s.dev_out, "device output")
      c1 = mark(comp)
      if P.sink then s.result = result end
    end
    s.comp_done:record(comp)

    local d0, d1
    if output then d0, d1 = guard(P, "the D2H copy of batch %d", i, enqueue_d2h, s) end
    if tl then
      tl.h2d, tl.compute, tl.d2h = { h0, h1 }, { c0, c1 }, d0 and { d0, d1 } or nil
      timeline[i] = tl
    end
    if track then
      local ev = table.remove(pool) or own(R, gpu.event { timing = false })
      ev:record(last)
      tail = tail + 1
      track[tail] = ev
    end
    if progress then poll() end
  end

  -- Everything is enqueued.  stop follows every batch's last stage, and is
  -- recorded before the sinks below could put work on the default stream,
  -- which the module's (blocking) streams would then wait for.
  local stop = b > 0 and own(R, last:record { timing = P.timing }) or nil
  -- drain: the last batches' sinks in order, then the rest of the queue
  if P.sink then
    for j = math.max(1, b - nslots + 1), b do
      retire(j)
      if progress then progress:update(done) end
    end
  end
  if track then
    for j = head, tail do
      guard(P, "waiting for batch %d to finish", j, drain, track[j])   -- track[j] is batch j's
      done = done + 1
      progress:update(done)
    end
  end
  if stop then guard(P, "finishing its %d batches", b, drain, stop) end

  stats.seconds = gpu.clock() - t_start
  stats.batches = b
  stats.h2d_bytes = b * in_bytes
  stats.d2h_bytes = b * out_bytes
  stats.bytes = stats.h2d_bytes + stats.d2h_bytes
  stats.gbps = stats.seconds > 0 and stats.bytes / stats.seconds / 1e9 or 0
  if timeline then
    local sums = { h2d = 0, compute = 0, d2h = 0 }
    for j = 1, b do
      local tl = timeline[j]
      for _, stage in ipairs { "h2d", "compute", "d2h" } do
        local pair = tl[stage]
        if pair then
          tl[stage] = { pair[1] - start, pair[2] - start }
          sums[stage] = sums[stage] + (tl[stage][2] - tl[stage][1])
        end
      end
    end
    stats.device_ms = stop and stop - start or 0
    stats.h2d_ms, stats.compute_ms, stats.d2h_ms = sums.h2d, sums.compute, sums.d2h
    stats.timeline = timeline
  end
  return stats
end

function M.run(spec, ...)
  local ok, P = pcall(check, spec, (...))
  if not ok then
    if getmetatable(P) == Bad then error(P.msg, 2) end
    error(P, 0)
  end
  P.where = where(2)
  P.on_error = on_stage_error(P)
  local R <close> = setmetatable({ n = 0 }, Owned)
  return run(P, R)
end

return M
