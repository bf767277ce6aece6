-- The gpu module's runtime calls: backend, devices, synchronize, memory and
-- stats counters.
local gpu = require "gpu"
local T = require "gpu.test"

local function delta(before, after, key) return after[key] - before[key] end

T.test("backend and devices", function()
  T.ok(gpu.backend == "host" or gpu.backend == "cuda", "gpu.backend is host or cuda: " .. tostring(gpu.backend))
  local n = gpu.device_count()
  T.is(math.type(n), "integer", "device_count is an integer")
  T.ok(n >= 1, "at least one device")
  local info = gpu.device_info(0)
  T.is(type(info), "table", "device_info(0) is a table")
  T.is(type(info.name), "string", "device_info.name")
  T.is(info.backend, gpu.backend, "device_info.backend matches gpu.backend")
  T.is(info.index, 0, "device_info.index")
  T.ok(math.type(info.total_memory) == "integer" and info.total_memory > 0, "device_info.total_memory > 0")
  T.ok(math.type(info.multiprocessors) == "integer" and info.multiprocessors >= 1, "device_info.multiprocessors >= 1")
  T.raises(function() gpu.device_info(n) end, { "device", "index", "range" }, "device_info(device_count()) raises")
  T.raises(function() gpu.device_info(-1) end, { "device", "index", "range" }, "device_info(-1) raises")
  gpu.set_device(0)
  T.raises_at(function() gpu.set_device(n) end, { "device", "index", "range" }, "set_device(bad index) raises")
  T.raises_at(function() gpu.set_device("x") end, "number expected", "set_device(string) raises")
  local t = gpu.ones({4})
  T.is(t:sum():item(), 4.0, "runtime usable after a bad set_device")
  T.is(t.device_index, 0, "tensors land on device 0")
end)

T.test("synchronize is a counted sync", function()
  local s0 = gpu.stats()
  gpu.synchronize()
  T.is(delta(s0, gpu.stats(), "syncs"), 1, "gpu.synchronize adds one sync")
end)

T.test("stats and memory have every documented field", function()
  local m = gpu.memory()
  for _, k in ipairs { "allocated", "reserved", "peak", "pinned", "pinned_peak", "host", "host_peak" } do
    T.is(math.type(m[k]), "integer", "memory()." .. k .. " is an integer")
  end
  local s = gpu.stats()
  for _, k in ipairs { "syncs", "launches", "copies", "h2d_bytes", "d2h_bytes", "d2d_bytes",
                       "h2h_bytes", "streams", "events", "buffers", "max_concurrent" } do
    T.is(math.type(s[k]), "integer", "stats()." .. k .. " is an integer")
  end
  T.ok(m.reserved >= m.allocated, "reserved >= allocated")
end)

T.test("device memory counters follow alloc and free", function()
  collectgarbage(); collectgarbage(); gpu.synchronize()
  local m0 = gpu.memory()
  local b0 = gpu.stats().buffers
  local t = gpu.empty({1000, 250}, { dtype = "f32" })       -- 1,000,000 bytes
  local m1 = gpu.memory()
  T.ok(m1.allocated - m0.allocated >= 1000000, "allocated grows by at least nbytes")
  T.ok(m1.peak >= m1.allocated, "peak >= allocated")
  T.ok(m1.reserved >= m1.allocated, "reserved >= allocated")
  T.is(gpu.stats().buffers, b0 + 1, "one more live buffer")
  local v = t:view({-1})                                    -- a view shares the buffer
  T.is(gpu.stats().buffers, b0 + 1, "a view does not allocate")
  T.is(gpu.memory().allocated, m1.allocated, "a view adds no memory")
  t:close()
  v:close()
  gpu.synchronize()
  T.is(gpu.memory().allocated, m0.allocated, "allocated back to baseline after close + sync")
  T.is(gpu.stats().buffers, b0, "buffer count back to baseline")
  T.ok(gpu.memory().peak >= m1.allocated, "peak remembers the high-water mark")

  local u = gpu.zeros({1 << 18}, { dtype = "f64" })         -- 2 MiB
  T.ok(gpu.memory().allocated - m0.allocated >= 1 << 21, "zeros allocates")
  u = nil                                                   -- luacheck: ignore
  collectgarbage(); collectgarbage(); gpu.synchronize()
  T.is(gpu.memory().allocated, m0.allocated, "allocated back to baseline after collect + sync")
end)

T.test("pinned and host memory counters", function()
  collectgarbage(); collectgarbage(); gpu.synchronize()
  local m0 = gpu.memory()
  local p = gpu.pinned({4096}, { dtype = "i32" })
  local h = gpu.empty({4096}, { dtype = "f64", device = "host" })
  local m1 = gpu.memory()
  T.ok(m1.pinned - m0.pinned >= 16384, "pinned grows by at least nbytes")
  T.ok(m1.host - m0.host >= 32768, "host grows by at least nbytes")
  T.is(m1.allocated, m0.allocated, "device memory unchanged by pinned/host tensors")
  T.ok(m1.pinned_peak >= m1.pinned and m1.host_peak >= m1.host, "pinned/host peaks")
  p:close(); h:close()
  gpu.synchronize()
  local m2 = gpu.memory()
  T.is(m2.pinned, m0.pinned, "pinned back to baseline")
  T.is(m2.host, m0.host, "host back to baseline")
end)

T.test("copy byte counters are exact", function()
  local n = 12345
  local p = gpu.full({n}, 3, { dtype = "f32", device = "pinned" })
  local d = gpu.empty({n}, { dtype = "f32" })
  local d2 = gpu.empty({n}, { dtype = "f32" })
  local h = gpu.empty({n}, { dtype = "f32", device = "host" })
  gpu.synchronize()

  local s0 = gpu.stats()
  d:copy(p)
  local s1 = gpu.stats()
  T.is(delta(s0, s1, "h2d_bytes"), 4 * n, "pinned -> device adds nbytes to h2d_bytes")
  T.is(delta(s0, s1, "d2h_bytes"), 0, "... and nothing to d2h_bytes")
  T.is(delta(s0, s1, "copies"), 1, "... and one copy")

  d2:copy(d)
  local s2 = gpu.stats()
  T.is(delta(s1, s2, "d2d_bytes"), 4 * n, "device -> device adds nbytes to d2d_bytes")

  h:copy(d2)
  local s3 = gpu.stats()
  T.is(delta(s2, s3, "d2h_bytes"), 4 * n, "device -> host adds nbytes to d2h_bytes")
  T.is(delta(s2, s3, "h2d_bytes"), 0, "... and nothing to h2d_bytes")

  p:copy(h)
  local s4 = gpu.stats()
  T.is(delta(s3, s4, "h2h_bytes"), 4 * n, "host -> pinned adds nbytes to h2h_bytes")
  T.is(p:get(n), 3.0, "data made the round trip")

  -- an f64 tensor of 1000 elements copied from pageable memory: 8000 bytes
  local hv = gpu.zeros({1000}, { dtype = "f64", device = "host" })
  local dv = gpu.empty({1000}, { dtype = "f64" })
  local s5 = gpu.stats()
  dv:copy(hv)
  T.is(delta(s5, gpu.stats(), "h2d_bytes"), 8000, "host -> device f64 adds 8 bytes per element")
end)

T.test("launches and syncs move with the work", function()
  local t = gpu.ones({256})
  gpu.synchronize()
  local s0 = gpu.stats()
  local u = t + 1
  local s1 = gpu.stats()
  T.ok(delta(s0, s1, "launches") >= 1, "an elementwise op counts a launch")
  T.is(delta(s0, s1, "syncs"), 0, "an elementwise op does not sync")
  local r = u:sum()
  local s2 = gpu.stats()
  T.ok(delta(s1, s2, "launches") >= 1, "a reduction counts a launch")
  T.is(delta(s1, s2, "syncs"), 0, "a reduction does not sync")
  T.is(r:item(), 512.0, "sum of ones + 1")
  local s3 = gpu.stats()
  T.ok(delta(s2, s3, "syncs") >= 1, "item() counts at least one sync")
  T.ok(delta(s2, s3, "d2h_bytes") >= 4, "item() moves the value device -> host")
  local _ = u:get(1)
  T.ok(delta(s3, gpu.stats(), "syncs") >= 1, "get() counts a sync")
  local s4 = gpu.stats()
  local _ = u:totable()
  T.ok(delta(s4, gpu.stats(), "syncs") >= 1, "totable() counts a sync")
end)

T.test("seed and sleep", function()
  gpu.seed(1234)
  local a = gpu.rand({16}):totable()
  gpu.seed(1234)
  local b = gpu.rand({16}):totable()
  T.is(a, b, "gpu.seed(n) resets the generator")
  T.isnt(gpu.rand({16}):totable(), b, "the offset advances between draws")
  local s = gpu.stream()
  gpu.sleep(1, { stream = s })
  gpu.sleep(0)
  s:synchronize()
  T.ok(s:query(), "gpu.sleep on a stream completes")
  T.raises_at(function() gpu.sleep(-5) end, "bad argument", "gpu.sleep(negative) raises")
  T.raises_at(function() gpu.sleep("x") end, "bad argument", "gpu.sleep(string) raises")
  s:close()
end)

T.test("gpu.clock", function()
  local t0 = gpu.clock()
  T.is(math.type(t0), "float", "gpu.clock() returns a float number of seconds")
  local s = gpu.stream()
  gpu.sleep(20, { stream = s })
  s:synchronize()
  local dt = gpu.clock() - t0
  T.ok(dt >= 0.019, string.format("a 20 ms sleep, waited for, advances gpu.clock() by at least 19 ms (%.4f s)", dt))
  s:close()
end)

-- OpenBLAS (the host backend's f32/f64 matmul) is loaded at the first host
-- matmul, not at start-up: linked, it started a thread per CPU in every
-- process, and under `ulimit -v` on a 64-CPU host gpulua -e "print(1)" hung
-- at exit.  GPULUA_HOST_BLAS=0 keeps the built-in loops, which must agree.
T.test("OpenBLAS is loaded at the first host matmul; the built-in loops agree", function()
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write([[
local function blas()
  for l in io.lines("/proc/self/maps") do
    if l:find("libopenblas", 1, true) then return "yes" end
  end
  return "no"
end
print("start " .. blas())
local gpu = require "gpu"
local x = gpu.ones({ 4 }) + 1
print("after an op " .. blas())
local out = {}
for _, dt in ipairs { "f32", "f64" } do
  local a = (gpu.arange(12, { dtype = dt }) - 5):reshape({ 3, 4 })
  local b = (gpu.arange(20, { dtype = dt }) % 7 - 3):reshape({ 4, 5 })
  local bt = (gpu.arange(20, { dtype = dt }) % 5 - 2):reshape({ 5, 4 }):t()   -- a transposed view
  for _, c in ipairs { gpu.matmul(a, b), gpu.matmul(a, bt), gpu.matmul(b:t(), a:t()) } do
    for _, v in ipairs(c:totable()) do
      for _, e in ipairs(type(v) == "table" and v or { v }) do out[#out + 1] = string.format("%g", e) end
    end
  end
end
print("after matmul " .. blas())
print("values " .. table.concat(out, " "))
]])
  f:close()
  local have = T.sh("(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | grep -c 'libopenblas.so.0 '")
  have = tonumber(have:match("%d+") or "0") > 0
  local with, ok1 = T.run("GPULUA_DEVICE=host", "--device host " .. script)
  local without, ok2 = T.run("GPULUA_DEVICE=host GPULUA_HOST_BLAS=0", "--device host " .. script)
  os.remove(script)
  T.ok(ok1 and ok2, "both runs exit 0: " .. with .. without)
  T.ok(with:find("start no\n", 1, true), "not in the process at start-up: " .. with)
  T.ok(with:find("after an op no\n", 1, true), "nor after an elementwise op")
  T.ok(with:find("after matmul " .. (have and "yes" or "no") .. "\n", 1, true),
       "after a matmul, loaded where the system has libopenblas.so.0 (" .. tostring(have) .. ")")
  T.ok(without:find("after matmul no\n", 1, true), "GPULUA_HOST_BLAS=0: never loaded")
  local v1, v2 = with:match("values ([^\n]*)"), without:match("values ([^\n]*)")
  T.ok(v1 and #v1 > 100, "the products came out")
  T.is(v2, v1, "the built-in loops give the same products (transposed views included)")
end)

T.done()
