-- Copies between every pair of memory kinds (with their byte counters),
-- to(), host-access fences on pinned/host tensors, and item/get/set/totable.
local gpu = require "gpu"
local T = require "gpu.test"

local KINDS = { "device", "pinned", "host" }
local COUNTER = {
  device = { device = "d2d_bytes", pinned = "d2h_bytes", host = "d2h_bytes" },
  pinned = { device = "h2d_bytes", pinned = "h2h_bytes", host = "h2h_bytes" },
  host = { device = "h2d_bytes", pinned = "h2h_bytes", host = "h2h_bytes" },
}

T.test("copy between every pair of memory kinds", function()
  local vals = { { 1.5, -2, 3 }, { 4, 5.25, -6 } }
  for _, from in ipairs(KINDS) do
    for _, to in ipairs(KINDS) do
      local src = gpu.tensor(vals, { dtype = "f64", device = from })
      local dst = gpu.zeros({2, 3}, { dtype = "f64", device = to })
      gpu.synchronize()
      local s0 = gpu.stats()
      local r = dst:copy(src)
      local s1 = gpu.stats()
      local key = COUNTER[from][to]
      local name = from .. " -> " .. to
      T.ok(rawequal(r, dst), name .. ": copy returns the destination")
      T.is(s1[key] - s0[key], 48, name .. ": " .. key .. " += 48")
      T.is(s1.copies - s0.copies, 1, name .. ": one copy counted")
      local moved = 0
      for _, k in ipairs { "h2d_bytes", "d2h_bytes", "d2d_bytes", "h2h_bytes" } do
        moved = moved + s1[k] - s0[k]
      end
      T.is(moved, 48, name .. ": no other byte counter moved")
      T.is(dst:totable(), vals, name .. ": values")
    end
  end
end)

T.test("copy across dtypes and shapes", function()
  local a = gpu.arange(6, { dtype = "i32" })
  local b = gpu.zeros({2, 3}, { dtype = "i32" })
  b:copy(a)
  T.is(b:totable(), { { 0, 1, 2 }, { 3, 4, 5 } }, "same numel, other shape: flat element order")
  local s <close> = gpu.stream()
  local c = gpu.zeros({3, 2}, { dtype = "i32", device = "pinned" })
  c:copy(b, { stream = s })
  T.is(c:totable(), { { 0, 1 }, { 2, 3 }, { 4, 5 } }, "copy{stream=} into pinned, then read (fenced)")
  T.raises_at(function() b:copy(gpu.zeros({6}, { dtype = "f32" })) end, "dtype", "copy between dtypes raises")
  T.raises_at(function() b:copy(gpu.zeros({7}, { dtype = "i32" })) end, { "numel", "shape" }, "numel mismatch raises")
end)

T.test("to()", function()
  local t = gpu.tensor({ 1, 2, 3 }, { dtype = "i32" })
  for _, kind in ipairs(KINDS) do
    local u = t:to(kind)
    T.is({ u.device, u.dtype, u:totable() }, { kind, "i32", { 1, 2, 3 } }, "to('" .. kind .. "')")
  end
  local f = t:to("f64")
  T.is({ f.device, f.dtype, f:totable() }, { "device", "f64", { 1.0, 2.0, 3.0 } }, "to('f64')")
  local g = t:to { device = "host", dtype = "u8" }
  T.is({ g.device, g.dtype, g:totable() }, { "host", "u8", { 1, 2, 3 } }, "to{device=, dtype=}")
  local h = t:to("cuda")
  T.is(h.device, "device", "to('cuda') means device memory")
  h:fill(9)
  T.is(t:totable(), { 1, 2, 3 }, "to() makes a new tensor")
  T.raises_at(function() t:to("f128") end, { "dtype", "device" }, "to(unknown) raises")
end)

T.test("host-access fence: reading a pinned tensor that a copy is filling", function()
  local n = 1 << 16
  local s <close> = gpu.stream()
  local d = gpu.full({n}, 7, { dtype = "f32" })
  local p = gpu.zeros({n}, { dtype = "f32", device = "pinned" })
  gpu.synchronize()
  gpu.sleep(200, { stream = s })
  p:copy(d, { stream = s })
  local syncs = gpu.stats().syncs
  T.is(p:get(n), 7.0, "get() sees the copied value")
  T.ok(gpu.stats().syncs > syncs, "the fence counted a sync")
  T.is(s:query(), true, "the copy is done once the host has read")

  gpu.sleep(200, { stream = s })
  p:copy(d:mul(2, { stream = s }), { stream = s })
  T.is(p:totable()[1], 14.0, "totable() waits for the copy too")
  gpu.sleep(200, { stream = s })
  p:copy(d:mul(3, { stream = s }), { stream = s })
  T.is(p:sum():item(), 21.0 * n, "a host-side op on pinned memory waits for the copy")
end)

T.test("host-access fence: writing a pinned tensor that a copy still reads", function()
  local n = 1 << 16
  local s <close> = gpu.stream()
  local src = gpu.full({n}, 1, { dtype = "i32", device = "pinned" })
  local dst = gpu.zeros({n}, { dtype = "i32" })
  gpu.synchronize()
  gpu.sleep(200, { stream = s })
  dst:copy(src, { stream = s })
  src:fill(2)                               -- must wait for the copy to read src
  s:synchronize()
  T.is(dst:max():item(), 1, "the copy read the old contents (max)")
  T.is(src:min():item(), 2, "then the host wrote the new ones")
  gpu.sleep(200, { stream = s })
  dst:copy(src, { stream = s })
  src:set(1, 5)                             -- a single element write is fenced too
  s:synchronize()
  T.is(dst:get(1), 2, "set() on pinned memory waits for the copy reading it")
  local h = gpu.full({n}, 3, { dtype = "i32", device = "host" })
  gpu.sleep(200, { stream = s })
  dst:copy(h, { stream = s })
  h:add_(1)
  s:synchronize()
  T.is(dst:min():item(), 3, "pageable memory is fenced as well")
end)

T.test("item, get, set, totable", function()
  local t = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "i32" })
  T.is(t:get(1, 1), 1, "get(1, 1) is the first element (1-based)")
  T.is(t:get(2, 3), 6, "get(2, 3) is the last element")
  T.is(math.type(t:get(1, 2)), "integer", "integer dtype gives Lua integers")
  t:set(2, 1, -40)
  T.is(t:get(2, 1), -40, "set then get")
  T.is(t:totable(), { { 1, 2, 3 }, { -40, 5, 6 } }, "set changed exactly one element")
  local f = gpu.tensor({ 0.5, 0.25 }, { dtype = "f16" })
  T.is(math.type(f:get(2)), "float", "float dtype gives Lua floats")
  f:set(1, 0.1)
  T.is(f:get(1), T.round_f16(0.1), "set rounds to f16")
  local one = gpu.tensor({ 42 }, { dtype = "i64" })
  T.is(one:item(), 42, "item() of a one-element tensor")
  T.is(gpu.tensor(3.5):item(), 3.5, "item() of a 0-dim tensor")
  local b = gpu.zeros({2, 2}, { dtype = "bool" })
  b:set(1, 2, true)
  T.is(b:totable(), { { false, true }, { false, false } }, "bool set/totable")
  local c = gpu.arange(24, { dtype = "i64" }):view({2, 3, 4})
  T.is(c:get(2, 3, 4), 23, "3-D get")
  T.is(c:get(1, 2, 1), 4, "3-D get middle")
  c:set(2, 1, 1, 100)
  T.is(c:totable()[2][1][1], 100, "3-D set")
  local p = gpu.zeros({3}, { device = "pinned" })
  p:set(3, 2.5)
  T.is(p:totable(), { 0.0, 0.0, 2.5 }, "set/totable on pinned")
  for _, kind in ipairs(KINDS) do
    local x = gpu.tensor({ 9, 8 }, { dtype = "u8", device = kind })
    T.is({ x:get(2), x:totable() }, { 8, { 9, 8 } }, "get/totable on " .. kind)
  end
  local s <close> = gpu.stream()
  local d = gpu.zeros({4}, { dtype = "i32" })
  gpu.synchronize()
  gpu.sleep(100, { stream = s })
  do
    local _ <close> = gpu.using(s)
    d:set(4, 77)
  end
  T.is(s:query(), false, "set() on a device tensor is enqueued on the current stream")
  s:synchronize()
  T.is(d:get(4), 77, "and lands after the sleep")
  T.raises_at(function() return t:item() end, { "one element", "numel", "item" }, "item() of a multi-element tensor raises")
end)

T.test("ops mixing kinds of memory", function()
  local d = gpu.ones({3})
  local p = gpu.pinned({3}):fill(2)
  local h = gpu.tensor({ 1, 2, 3 }, { dtype = "f32", device = "host" })
  T.raises_at(function() return d + p end, "pinned memory, expected device", "device + pinned raises, naming both")
  T.raises_at(function() return gpu.matmul(d:view { 1, 3 }, h:view { 3, 1 }) end, "host memory",
              "matmul of device and host raises")
  local r = p + h
  T.is({ r.device, r:totable() }, { "pinned", { 3.0, 4.0, 5.0 } }, "pinned + host runs on the host, result pinned")
  T.is((h * p):totable(), { 2.0, 4.0, 6.0 }, "host * pinned")
  T.is(gpu.matmul(p:view { 1, 3 }, h:view { 3, 1 }):item(), 12.0, "matmul of pinned and host")
end)

T.done()
