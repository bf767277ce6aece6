-- The correctness matrix of gpu.pipeline, shared by tests/pipeline.lua (in
-- its own process) and by its child run under GPULUA_HOST_JITTER=1:
--
--   gpulua -e 'dofile("tests/pipeline/cases.lua").main()'
--
-- prints one "ok ..." or "not ok ...: why" line per case, then "cases N".
--
-- Batch i's input is 2i everywhere but its first element, -i (written by
-- load with host ops, fill and set); compute works out 2x + 1, so batch i's
-- result has min 1 - 2i, max 4i + 1 and a known sum: a batch that read
-- another batch's data, or a sink that read a buffer too early, is caught.
-- The runtime would fence a host op on a buffer that queued work still
-- uses; load and sink also check that it did not have to (the module waited).
local gpu = require "gpu"
local pipeline = require "gpu.pipeline"

local C = {}
C.N = 4096
C.DEPTHS = { 1, 2, 3, 4 }
C.BATCHES = { 1, 3, 7 }
-- "output": D2H and a sink; "result": no output, the sink gets compute's
-- device scalars; "none": no sink, results read after run returns
C.MODES = { "output", "result", "none" }
-- where load's and sink's buffers live: pinned, or pageable ("host")
C.MEMORY = { "pinned", "host" }

local function want(i, n)
  return { min = 1 - 2 * i, max = 4 * i + 1, sum = (n - 1) * (4 * i + 1) + (1 - 2 * i) }
end

-- problems (a list of strings, empty when all is right) and the stage log
function C.run(depth, batches, mode, memory)
  local n = C.N
  local log, pos, problems = {}, {}, {}
  local pins, pouts, finals = {}, {}, {}
  local function note(tag, i)
    log[#log + 1] = tag .. i
    pos[tag .. i] = #log
  end
  local function check(i, got, what)
    local w = want(i, n)
    if got.min ~= w.min or got.max ~= w.max or got.sum ~= w.sum or (got.first and got.first ~= w.min) then
      problems[#problems + 1] = string.format("batch %d %s: min %s max %s sum %s first %s (want %d %d %d)", i, what,
                                              got.min, got.max, got.sum, got.first, w.min, w.max, w.sum)
    end
  end
  local function read(r)
    return { min = r.min:item(), max = r.max:item(), sum = r.sum:item() }
  end

  local spec = {
    batches = batches, depth = depth,
    input = { shape = { n }, dtype = "f32", device = memory },
    load = function(i, pin)
      note("L", i)
      if pin.device ~= (memory or "pinned") then problems[#problems + 1] = "load got a " .. pin.device .. " buffer" end
      pins[i] = pin
      -- the runtime's host-access fence counts a sync when it has to wait:
      -- none here means the module handed over a buffer no queued work uses
      local syncs = gpu.stats().syncs
      pin:fill(2 * i)
      if gpu.stats().syncs ~= syncs then problems[#problems + 1] = "load " .. i .. ": its buffer was still in use" end
      pin:set(1, -i)
    end,
    compute = function(i, x, y)
      note("C", i)
      if y then
        x:mul(2, { out = y })
        y:add_(1)
        return nil
      end
      x:mul_(2):add_(1)
      local r = { min = x:min(), max = x:max(), sum = x:sum() }
      if mode == "none" then finals[i] = r end
      return r
    end,
  }
  if mode == "output" then
    spec.output = { shape = { n }, dtype = "f32", device = memory }
    spec.sink = function(i, pout)
      note("S", i)
      pouts[i] = pout
      local syncs = gpu.stats().syncs
      local first = pout:get(1)
      if gpu.stats().syncs ~= syncs then problems[#problems + 1] = "sink " .. i .. ": its buffer was still in use" end
      check(i, { min = pout:min():item(), max = pout:max():item(), sum = pout:sum():item(), first = first }, "sink")
    end
  elseif mode == "result" then
    spec.sink = function(i, pout, r)
      note("S", i)
      if pout ~= nil then problems[#problems + 1] = "sink got a pinned_out without output" end
      check(i, read(r), "sink result")
    end
  end

  local stats = pipeline.run(spec)
  if mode == "none" then
    for i = 1, batches do
      if finals[i] then check(i, read(finals[i]), "after run") end
    end
  end

  local function fail(fmt, ...) problems[#problems + 1] = string.format(fmt, ...) end
  if stats.batches ~= batches then fail("stats.batches %s, want %d", stats.batches, batches) end
  if stats.h2d_bytes ~= batches * n * 4 then fail("stats.h2d_bytes %s", stats.h2d_bytes) end
  if stats.d2h_bytes ~= (mode == "output" and batches * n * 4 or 0) then fail("stats.d2h_bytes %s", stats.d2h_bytes) end
  local sinks = mode ~= "none"
  local count = 0
  for i = 1, batches do
    -- every stage of every batch ran once, load -> compute -> sink
    local l, c, s = pos["L" .. i], pos["C" .. i], pos["S" .. i]
    if not l or not c or (sinks and not s) then fail("batch %d: a stage did not run", i)
    elseif not (l < c and (not sinks or c < s)) then fail("batch %d: stages out of order", i) end
    if i > 1 then
      for _, tag in ipairs { "L", "C", sinks and "S" or nil } do
        if (pos[tag .. i] or 0) < (pos[tag .. (i - 1)] or math.huge) then fail("%s%d before %s%d", tag, i, tag, i - 1) end
      end
    end
    -- depth batches in flight: batch i + depth is loaded before batch i's
    -- sink, and batch i + depth + 1 only after it
    if sinks and i + depth <= batches and not (pos["L" .. (i + depth)] < s) then
      fail("depth %d: L%d not before S%d", depth, i + depth, i)
    end
    if sinks and i + depth + 1 <= batches and not (s < pos["L" .. (i + depth + 1)]) then
      fail("depth %d: S%d not before L%d", depth, i, i + depth + 1)
    end
    -- the buffers are reused every depth batches, and differ within a window
    for j = i + 1, math.min(batches, i + depth) do
      local same = rawequal(pins[i], pins[j])
      if same ~= (j == i + depth) then fail("pinned input of batch %d %s that of %d", j, same and "is" or "is not", i) end
      if mode == "output" and rawequal(pouts[i], pouts[j]) ~= (j == i + depth) then
        fail("pinned output of batch %d vs %d: wrong reuse", j, i)
      end
    end
    count = count + 1
  end
  if #log ~= count * (sinks and 3 or 2) then fail("%d stage calls for %d batches", #log, count) end
  return problems, table.concat(log, " ")
end

function C.name(depth, batches, mode, memory)
  return string.format("depth=%d batches=%d mode=%s memory=%s", depth, batches, mode, memory or "pinned")
end

function C.main()
  local cases = 0
  for _, depth in ipairs(C.DEPTHS) do
    for _, batches in ipairs(C.BATCHES) do
      for _, mode in ipairs(C.MODES) do
        for _, memory in ipairs(C.MEMORY) do
          local ok, problems = pcall(C.run, depth, batches, mode, memory)
          if not ok then problems = { "raised: " .. tostring(problems) } end
          cases = cases + 1
          if #problems == 0 then
            print("ok " .. C.name(depth, batches, mode, memory))
          else
            print("not ok " .. C.name(depth, batches, mode, memory) .. ": " .. table.concat(problems, "; "))
          end
        end
      end
    end
  end
  collectgarbage(); collectgarbage(); gpu.synchronize()
  local st, mem = gpu.stats(), gpu.memory()
  print(string.format("cases %d live: streams %d events %d allocated %d pinned %d", cases, st.streams, st.events,
                      mem.allocated, mem.pinned))
end

return C
