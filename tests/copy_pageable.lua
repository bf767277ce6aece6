-- Copies between pageable ("host") memory and the device (issue 20): staged
-- through pinned memory in chunks, queued like any op, never a host-device
-- sync; the host-access fence guards the pageable tensor (item, get,
-- totable, host ops, save, a host-side copy wait for exactly the copies
-- that use it).  Every size class (below one chunk, one chunk, many chunks,
-- not a multiple), both directions, views and strides on either side, copies
-- in flight on several streams, tensors dropped or closed mid-copy, the
-- start-up variables.
--
-- The cases run here with the default chunk, then in children with small
-- chunks (GPULUA_STAGE_CHUNK, GPULUA_STAGE_THREADS) so that small tensors
-- make many chunks, and under GPULUA_HOST_JITTER=1 on the host backend
-- (random delays in the copies' steps and threads: a missing wait shows up
-- as a wrong value).  A child inherits the device, so on the GPU machine the
-- staged CUDA path runs them too.  The application's own memory
-- (gpulua_push_tensor) is tested in tests/embed/test_share.c.
local gpu = require "gpu"
local T = require "gpu.test"

local CHILD = os.getenv("COPY_PAGEABLE_CHILD")
local HOST = gpu.backend == "host"

local function parse_size(s)
  if not s or s == "" then return 8 << 20 end
  local v, u = s:match("^([%d%.]+)([KkMmGg]?)$")
  local shift = ({ k = 10, m = 20, g = 30 })[u:lower()] or 0
  return math.floor(tonumber(v) * (1 << shift))
end
local CHUNK = parse_size(os.getenv("GPULUA_STAGE_CHUNK"))

-- Element counts of every size class for dtype: relative to the chunk when
-- it is small (a child), else a few fixed ones (the default chunk is cut
-- into pieces of at least 256 KiB, so 300001 f32 elements make several).
local function sizes(dtype)
  local el = T.dtype_size[dtype]
  if CHUNK > 65536 then return { 1, 3, 1000, 300001 } end
  local per = math.max(1, CHUNK // el)
  local list = { 1, per, 7 * per, 7 * per + 3, 300 * per + 7 }
  if per > 2 then table.insert(list, 2, per - 1) end
  return list
end

local function settle()
  collectgarbage(); collectgarbage(); gpu.synchronize()
end

-- 0 when a and b (host tensors of one shape) hold the same values
local function maxdiff(a, b)
  return (a - b):abs():max():item()
end

-- i % 251 as dtype, on the device: distinct values in every chunk
local function pattern(n, dtype)
  return (gpu.arange(n, { dtype = "i64" }) % 251):to(dtype)
end

T.test("both directions, every size class and dtype, with no sync", function()
  for _, dtype in ipairs { "f32", "f64", "u8", "i64", "f16" } do
    for _, n in ipairs(sizes(dtype)) do
      local d = pattern(n, dtype)
      local h = gpu.empty({n}, { dtype = dtype, device = "host" })
      local d2 = gpu.zeros({n}, { dtype = dtype })
      settle()
      local s0 = gpu.stats()
      h:copy(d)                 -- device -> pageable
      d2:copy(h)                -- pageable -> device, after it on the same stream
      local s1 = gpu.stats()
      local name = string.format("%s x %d", dtype, n)
      T.is(s1.syncs - s0.syncs, 0, name .. ": no sync")
      T.is({ s1.h2d_bytes - s0.h2d_bytes, s1.d2h_bytes - s0.d2h_bytes, s1.copies - s0.copies },
           { n * T.dtype_size[dtype], n * T.dtype_size[dtype], 2 }, name .. ": bytes and copies counted once")
      local back = d2:to("host")
      T.is(maxdiff(back, d:to("host")), 0, name .. ": the round trip keeps every value")
      T.is(maxdiff(h, back), 0, name .. ": the pageable tensor holds them (its fence waited)")
    end
  end
end)

-- A copy to the device of 1 to 8 MiB (the default chunk) whose source no
-- queued work writes starts reading it at once, in pieces the threads take
-- in parallel.  Every piece must arrive, and what the script writes to the
-- source next must not reach the device.
if not CHILD then
  T.test("copies of 1 to 8 MiB: every piece, and only the values before the next write", function()
    for _, case in ipairs { { "f32", (3 << 20) // 4 + 5 }, { "f64", (5 << 20) // 8 }, { "u8", 8 << 20 },
                            { "f32", (1 << 20) // 4 + 1 } } do
      local dtype, n = case[1], case[2]
      for round = 1, 4 do
        local src = gpu.arange(n, { dtype = "i64", device = "host" }):remainder(251 - round):to(dtype)
        local want = src:clone()
        local d = gpu.zeros({n}, { dtype = dtype })
        settle()
        local s0 = gpu.stats()
        d:copy(src)             -- pageable -> device
        local name = string.format("%s x %d, round %d", dtype, n, round)
        T.is(gpu.stats().syncs - s0.syncs, 0, name .. ": no sync")
        src:fill(7)             -- the script's next write to the source (it waits for the copy)
        T.is(maxdiff(d:to("host"), want), 0, name .. ": the device holds every value the source had")
        local h = gpu.empty({n}, { dtype = dtype, device = "host" })
        h:copy(d)               -- device -> pageable
        T.is(maxdiff(h, want), 0, name .. ": and the way back too")
      end
    end
  end)
end

T.test("views and strides on the pageable side and on the device side", function()
  local rows, cols = 37, 41
  local n = rows * cols
  local base = gpu.arange(n, { dtype = "i32" }):view({rows, cols})
  local hbase = base:to("host")
  -- strided pageable source (a column block), contiguous device destination
  local hv = hbase:narrow(2, 5, 30)
  local d = gpu.zeros({rows, 30}, { dtype = "i32" })
  d:copy(hv)
  T.is(d:totable(), hv:totable(), "strided pageable -> device")
  -- offset view (a row block: contiguous, not at the start)
  local d3 = gpu.zeros({20, cols}, { dtype = "i32" })
  d3:copy(hbase:narrow(1, 10, 20))
  T.is(d3:totable(), hbase:narrow(1, 10, 20):totable(), "offset pageable view -> device")
  -- strided device source, strided pageable destination
  local hdst = gpu.full({rows, cols}, -1, { dtype = "i32", device = "host" })
  hdst:narrow(2, 3, 30):copy(base:narrow(2, 7, 30))
  local want = hbase:narrow(2, 7, 30):totable()
  T.is(hdst:narrow(2, 3, 30):totable(), want, "strided device -> strided pageable")
  T.is(hdst:narrow(2, 1, 2):totable(), gpu.full({rows, 2}, -1, { dtype = "i32" }):totable(),
       "the columns outside the view are untouched")
  -- strided pageable source into a strided device destination
  local ddst = gpu.full({rows, cols}, -1, { dtype = "i32" })
  local s0 = gpu.stats()
  ddst:narrow(2, 2, 30):copy(hbase:narrow(2, 11, 30))
  local s1 = gpu.stats()
  T.is(ddst:narrow(2, 2, 30):totable(), hbase:narrow(2, 11, 30):totable(), "strided pageable -> strided device")
  T.is({ s1.copies - s0.copies, s1.h2d_bytes - s0.h2d_bytes, s1.d2d_bytes - s0.d2d_bytes },
       { 1, rows * 30 * 4, 0 }, "one copy counted, its bytes as H2D only")
  -- a different shape of the same numel (flat order)
  local flat = gpu.zeros({n}, { dtype = "i32", device = "host" })
  flat:copy(base)
  T.is(flat:get(n), n - 1, "device {37, 41} -> pageable {1517}: flat order")
end)

T.test("the host never reads a pageable tensor before the copy that fills it", function()
  local s <close> = gpu.stream()
  local n = 4099
  local d = gpu.full({n}, 7, { dtype = "f32" })
  local reads = {
    { "item", function(h) return h:narrow(1, n, 1):item() end },
    { "get", function(h) return h:get(n) end },
    { "totable", function(h) return h:totable()[n] end },
    { "host op", function(h) return h:max():item() end },
    { "host-side copy", function(h) local p = gpu.pinned({n}); p:copy(h); return p:get(n) end },
    { "to device on another stream", function(h)
        local d2 = gpu.zeros({n})
        d2:copy(h)                    -- default stream: ordered after s
        return d2:get(n)
      end },
  }
  for _, r in ipairs(reads) do
    local h = gpu.zeros({n}, { device = "host" })
    gpu.sleep(30, { stream = s })
    h:copy(d, { stream = s })
    T.is(r[2](h), 7.0, r[1] .. " sees the copied value")
  end
  -- save writes the file from the copied bytes
  local h = gpu.zeros({n}, { device = "host" })
  gpu.sleep(30, { stream = s })
  h:copy(d, { stream = s })
  local path = os.tmpname()
  h:save(path)
  local back = gpu.load(path, { device = "host" })
  os.remove(path)
  T.is(back:get(n), 7.0, "save waits for the copy")
end)

T.test("the host never overwrites a pageable tensor a queued copy still reads", function()
  local s <close> = gpu.stream()
  local n = 5000
  local writes = {
    { "fill", function(h) h:fill(-1) end },
    { "set", function(h) h:set(n, -1) end },
    { "add_", function(h) h:add_(-100) end },
    { "host-side copy", function(h) h:copy(gpu.full({n}, -1, { device = "pinned" })) end },
    { "device -> pageable on another stream", function(h)
        h:copy(gpu.full({n}, -1))      -- default stream: ordered after s
      end },
  }
  for _, w in ipairs(writes) do
    local h = gpu.full({n}, 3, { device = "host" })
    local d = gpu.zeros({n})
    gpu.sleep(30, { stream = s })
    d:copy(h, { stream = s })
    w[2](h)
    s:synchronize()
    T.is({ d:min():item(), d:max():item() }, { 3.0, 3.0 }, w[1] .. " waited for the copy reading the tensor")
  end
end)

T.test("copies on one stream, and across streams with events, stay in order", function()
  local s1 <close> = gpu.stream()
  local s2 <close> = gpu.stream { nonblocking = true }
  local n = 3001
  local h = gpu.zeros({n}, { dtype = "i32", device = "host" })
  local a = gpu.full({n}, 11, { dtype = "i32" })
  local b = gpu.zeros({n}, { dtype = "i32" })
  for round = 1, 4 do
    gpu.sleep(5, { stream = s1 })
    a:fill(round, { stream = s1 })
    h:copy(a, { stream = s1 })            -- device -> pageable
    b:copy(h, { stream = s1 })            -- pageable -> device: reads what the first wrote
    T.is(b:min({ stream = s1 }):item(), round, "round " .. round .. ": one stream")
  end
  -- s2 (ordered with nothing) waits for an event after the D2H on s1
  local ev <close> = gpu.event()
  gpu.sleep(20, { stream = s1 })
  a:fill(42, { stream = s1 })
  h:copy(a, { stream = s1 })
  ev:record(s1)
  s2:wait(ev)
  local c = gpu.empty({n}, { dtype = "i32" })   -- no fill: s2 is not ordered after the default stream
  c:copy(h, { stream = s2 })
  s2:synchronize()
  T.is({ c:min():item(), c:max():item() }, { 42, 42 }, "an event orders a pageable copy on another stream")
end)

T.test("many copies in flight on several streams", function()
  -- nonblocking streams and tensors made beforehand: the copies really
  -- overlap (the default stream would order them all)
  local streams, hs, ds, back = {}, {}, {}, {}
  for i = 1, 4 do streams[i] = gpu.stream { nonblocking = true } end
  for i = 1, 12 do
    local n = 1000 + 97 * i
    ds[i] = gpu.full({n}, i, { dtype = "i64" })
    hs[i] = gpu.zeros({n}, { dtype = "i64", device = "host" })
    back[i] = gpu.empty({n}, { dtype = "i64" })
  end
  gpu.synchronize()
  for i = 1, 12 do
    local s = streams[(i - 1) % 4 + 1]
    gpu.sleep(i % 3, { stream = s })
    hs[i]:copy(ds[i], { stream = s })
  end
  for i = 1, 12 do
    local s = streams[(i + 1) % 4 + 1]
    s:wait(streams[(i - 1) % 4 + 1])
    back[i]:copy(hs[i], { stream = s })
  end
  gpu.synchronize()
  for i = 1, 12 do
    T.is({ back[i]:min():item(), back[i]:max():item(), hs[i]:sum():item() }, { i, i, i * (1000 + 97 * i) },
         "copy " .. i)
  end
  for _, s in ipairs(streams) do s:close() end
end)

T.test("more copies queued than one block of flag records holds, then reused", function()
  -- every queued copy holds a record of words shared with its stream (512
  -- to a block of pinned memory): 600 at once take a second block, and the
  -- records of finished copies serve the next ones
  local s <close> = gpu.stream { nonblocking = true }
  local n = 64
  local hs, ds = {}, {}
  for i = 1, 600 do
    hs[i] = gpu.full({n}, i, { dtype = "i32", device = "host" })
    ds[i] = gpu.empty({n}, { dtype = "i32" })
  end
  gpu.synchronize()
  for round = 1, 2 do
    gpu.sleep(20, { stream = s })
    for i = 1, 600 do ds[i]:copy(hs[i], { stream = s }) end
    for i = 1, 600 do hs[i]:copy(ds[i]:add(round, { stream = s }), { stream = s }) end
    s:synchronize()
    local ok = true
    for i = 1, 600 do
      local want = i + (round == 1 and 1 or 3)
      ok = ok and hs[i]:min():item() == want and hs[i]:max():item() == want
    end
    T.ok(ok, string.format("round %d: 1200 copies queued behind a sleep, every one right", round))
  end
end)

T.test("staging memory is not reused under a queued copy", function()
  -- copies queued one after another read sources no queued work writes:
  -- each may start filling its staging memory at once, so two of them
  -- sharing it would mix their values
  local s <close> = gpu.stream()
  local n = 6007
  local hs, ds = {}, {}
  for i = 1, 6 do
    hs[i] = gpu.full({n}, i, { dtype = "i32", device = "host" })
    ds[i] = gpu.zeros({n}, { dtype = "i32" })
  end
  gpu.synchronize()
  gpu.sleep(30, { stream = s })
  for i = 1, 6 do ds[i]:copy(hs[i], { stream = s }) end
  s:synchronize()
  for i = 1, 6 do
    T.is({ ds[i]:min():item(), ds[i]:max():item() }, { i, i }, "copy " .. i .. " has its own values")
  end
end)

T.test("copies queued one after another take turns with one staging block", function()
  local s <close> = gpu.stream()
  local n = CHUNK > 65536 and 1 << 18 or 16 * CHUNK   -- 1 MiB of f32 a copy, or 64 small chunks
  local h = gpu.full({n}, 4, { device = "host" })
  local ds = {}
  for i = 1, 40 do ds[i] = gpu.empty({n}) end
  settle()
  gpu.empty_cache()
  local before = gpu.memory().pinned_reserved
  gpu.sleep(50, { stream = s })
  for i = 1, 40 do ds[i]:copy(h, { stream = s }) end
  local grew = gpu.memory().pinned_reserved - before
  s:synchronize()
  T.ok(grew <= 4 << 20, string.format("40 queued copies of %d bytes hold %.2f MiB of pinned memory", 4 * n,
                                      grew / 2 ^ 20))
  local ok = true
  for i = 1, 40 do ok = ok and ds[i]:min():item() == 4 and ds[i]:max():item() == 4 end
  T.ok(ok, "and every copy is right")
end)

T.test("a pageable tensor dropped or closed mid-copy keeps its memory", function()
  local s <close> = gpu.stream()
  local n = 8011
  -- pageable -> device: the source goes away before the copy has read it
  local d = gpu.zeros({n}, { dtype = "i32" })
  do
    local h = gpu.full({n}, 5, { dtype = "i32", device = "host" })
    gpu.sleep(40, { stream = s })
    d:copy(h, { stream = s })
  end
  collectgarbage(); collectgarbage()
  local junk = {}
  for i = 1, 6 do junk[i] = gpu.full({n}, -9, { dtype = "i32", device = "host" }) end
  s:synchronize()
  T.is({ d:min():item(), d:max():item() }, { 5, 5 }, "dropped source: the copy read its values, not new tensors'")
  -- ... closed instead of dropped
  local h2 = gpu.full({n}, 6, { dtype = "i32", device = "host" })
  gpu.sleep(40, { stream = s })
  d:copy(h2, { stream = s })
  h2:close()
  for i = 1, 6 do junk[i] = gpu.full({n}, -9, { dtype = "i32", device = "host" }) end
  s:synchronize()
  T.is({ d:min():item(), d:max():item() }, { 6, 6 }, "closed source: the same")
  -- device -> pageable: the destination goes away before the copy wrote it
  local src = gpu.full({n}, 8, { dtype = "i32" })
  do
    local h = gpu.zeros({n}, { dtype = "i32", device = "host" })
    gpu.sleep(40, { stream = s })
    h:copy(src, { stream = s })
  end
  collectgarbage(); collectgarbage()
  local fresh = {}
  for i = 1, 6 do fresh[i] = gpu.full({n}, -9, { dtype = "i32", device = "host" }) end
  s:synchronize()
  local ok = true
  for i = 1, 6 do ok = ok and fresh[i]:min():item() == -9 and fresh[i]:max():item() == -9 end
  T.ok(ok, "dropped destination: the copy wrote no tensor made after it")
end)

T.test("inside gpu.nosync(), pageable copies run and only a wait raises", function()
  local s <close> = gpu.stream()
  local h = gpu.zeros({1000}, { device = "host" })
  local d = gpu.ones({1000})
  local before = gpu.stats().syncs
  do
    local _ <close> = gpu.nosync()
    gpu.sleep(30, { stream = s })
    h:copy(d, { stream = s })
    d:copy(h, { stream = s })
    T.ok(true, "both directions enqueue inside gpu.nosync()")
    T.raises(function() return h:get(1) end, "host%-device sync, not allowed here",
             "reading the tensor while the copy runs is a sync, refused")
  end
  T.is(gpu.stats().syncs, before, "nothing was counted")
  T.is(h:get(1), 1.0, "after the scope the read waits and sees the copy")
end)

T.test("copies of many chunks queued behind other work return at once", function()
  -- Each chunk is three steps on the stream, whose queue is bounded: past
  -- it the enqueue itself waits for the stream (neither counted nor refused
  -- by gpu.nosync), so a copy is cut into few enough chunks that two queued
  -- behind a sleep fit.
  local s <close> = gpu.stream()
  local n = CHUNK > 65536 and 1 << 22 or 300 * math.max(1, CHUNK // 4) + 7   -- 300 chunks' worth
  local h = gpu.zeros({n}, { device = "host" })
  local d = gpu.ones({n})
  h:copy(d, { stream = s })   -- once before: the staging memory is in the pinned cache
  settle()
  gpu.sleep(500, { stream = s })
  local slept = s:record()
  h:copy(d, { stream = s })
  d:copy(h, { stream = s })
  -- an order, not a duration: had an enqueue waited for the stream, the
  -- sleep before it would be over
  T.ok(not slept:query(), string.format("both directions, %d bytes each, enqueued while the sleep before "
                                        .. "them still runs", 4 * n))
  s:synchronize()
  T.is({ h:get(1), h:get(n), d:min():item() }, { 1.0, 1.0, 1.0 }, "and the copies are right")
end)

T.test("errors: closed stream, mismatches", function()
  local s = gpu.stream()
  s:close()
  local h = gpu.zeros({8}, { device = "host" })
  local d = gpu.zeros({8})
  T.raises(function() d:copy(h, { stream = s }) end, "stream is closed", "a closed stream raises")
  T.raises(function() gpu.zeros({9}):copy(h) end, "", "a numel mismatch raises")
  T.raises(function() gpu.zeros({8}, { dtype = "f64" }):copy(h) end, "", "a dtype mismatch raises")
  T.is(h:get(1), 0.0, "and nothing was copied")
end)

local function relay(what, env, file, code)
  local path = code and T.tmpfile(code)
  local out, ok = T.run(env, path or file)
  if path then os.remove(path) end
  local results = 0
  for line in out:gmatch("[^\n]+") do
    local st, desc = line:match("^(not ok) %d+%s*%-?%s*(.*)$")
    if not st then st, desc = line:match("^(ok) %d+%s*%-?%s*(.*)$") end
    if st then
      results = results + 1
      T.ok(st == "ok", what .. ": " .. desc)
    elseif not line:match("^1%.%.%d+$") then
      T.diag("  " .. line:gsub("^# ?", ""))
    end
  end
  T.ok(ok and results > 0, what .. ": the child exits 0 with results (" .. results .. ")")
end

if not CHILD then
  T.test("the same with tiny chunks, threads and jitter (children)", function()
    local me = debug.getinfo(1, "S").short_src
    relay("64-byte chunks, 3 threads, jitter",
          "COPY_PAGEABLE_CHILD=1 GPULUA_STAGE_CHUNK=64 GPULUA_STAGE_THREADS=3 GPULUA_HOST_JITTER=1", me)
    relay("100-byte chunks, 1 thread, jitter",
          "COPY_PAGEABLE_CHILD=1 GPULUA_STAGE_CHUNK=100 GPULUA_STAGE_THREADS=1 GPULUA_HOST_JITTER=1", me)
    relay("4K chunks, 8 threads", "COPY_PAGEABLE_CHILD=1 GPULUA_STAGE_CHUNK=4K GPULUA_STAGE_THREADS=8", me)
  end)

  T.test("GPULUA_STAGE_CHUNK and GPULUA_STAGE_THREADS are checked at start-up", function()
    for _, bad in ipairs { "GPULUA_STAGE_CHUNK=abc", "GPULUA_STAGE_CHUNK=4", "GPULUA_STAGE_CHUNK=2G",
                           "GPULUA_STAGE_CHUNK=-1M", "GPULUA_STAGE_CHUNK='8M '" } do
      local out, ok = T.run(bad, "-e 'print(1)'")
      T.ok(not ok and out:find("GPULUA_STAGE_CHUNK='", 1, true) and out:find("is not a chunk size", 1, true),
           bad .. " is refused, naming the variable")
      if ok or not out:find("is not a chunk size", 1, true) then T.diag(out) end
    end
    for _, bad in ipairs { "GPULUA_STAGE_THREADS=0", "GPULUA_STAGE_THREADS=65", "GPULUA_STAGE_THREADS=two",
                           "GPULUA_STAGE_THREADS=4x", "GPULUA_STAGE_THREADS=-2" } do
      local out, ok = T.run(bad, "-e 'print(1)'")
      T.ok(not ok and out:find("is not a thread count", 1, true), bad .. " is refused")
      if ok then T.diag(out) end
    end
    for _, good in ipairs { "GPULUA_STAGE_CHUNK=8", "GPULUA_STAGE_CHUNK=1.5M", "GPULUA_STAGE_CHUNK=1G",
                            "GPULUA_STAGE_THREADS=1", "GPULUA_STAGE_THREADS=64", "GPULUA_STAGE_CHUNK=" } do
      -- the device said, so that no fallback note comes on stderr
      local out, ok = T.run(good .. " GPULUA_DEVICE=${GPULUA_DEVICE:-host}", "-e 'print(1)'")
      T.ok(ok and out == "1\n", good .. " is taken")
    end
  end)

  T.test("copies in flight at exit finish; nothing hangs or crashes", function()
    local code = [[
      local gpu = require "gpu"
      local s = gpu.stream()
      local d = gpu.ones({1 << 16})
      for i = 1, 8 do
        local h = gpu.zeros({1 << 16}, { device = "host" })
        gpu.sleep(10, { stream = s })
        h:copy(d, { stream = s })
        d:copy(h, { stream = s })
      end
      print("enqueued")
    ]]
    for _, tail in ipairs { "", "os.exit(0)", "os.exit(0, true)", "error('boom')" } do
      local path = T.tmpfile(code .. tail)
      local out, ok = T.run("GPULUA_STAGE_CHUNK=4K GPULUA_HOST_JITTER=1", path)
      os.remove(path)
      local want_ok = tail ~= "error('boom')"
      T.ok(ok == want_ok and out:find("enqueued", 1, true) ~= nil,
           string.format("ending with %q: exit %s", tail, want_ok and "0" or "1"))
      if ok ~= want_ok then T.diag(out) end
    end
  end)
end

T.done()
