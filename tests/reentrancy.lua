-- Lua code that runs in the middle of a binding (finalizers started by an
-- allocation, metamethods of argument tables) may close the very objects the
-- binding is using.  Each case must end in a clean error or a correct result,
-- never a use-after-free (this file also runs under ASan).
local gpu = require "gpu"
local T = require "gpu.test"

-- a GC step on (almost) every allocation, so finalizers run inside bindings
collectgarbage("incremental", 0, 1000)

T.test("a finalizer closes the stream an op is about to use", function()
  local done, closed = 0, 0
  for _ = 1, 2000 do
    local s = gpu.stream()
    setmetatable({}, { __gc = function() s:close() end })
    local ok, err = pcall(gpu.zeros, { 4 }, { stream = s })
    if ok then done = done + 1
    elseif tostring(err):find("closed") then closed = closed + 1
    else T.ok(false, "unexpected error: " .. tostring(err)) break end
  end
  T.is(done + closed, 2000, "each op either ran or raised 'closed' (" .. done .. " ran)")
end)

T.test("a finalizer closes an operand of a binary op", function()
  local right, closed = 0, 0
  for _ = 1, 2000 do
    local a, x = gpu.ones({ 4 }), gpu.ones({ 4 })
    setmetatable({}, { __gc = function() x:close() end })
    local ok, r = pcall(function() return a + x end)
    if ok and r:sum():item() == 8 then right = right + 1
    elseif not ok and tostring(r):find("closed") then closed = closed + 1 end
  end
  T.is(right + closed, 2000, "each a + x was right or raised 'closed' (" .. right .. " right)")
end)

T.test("a finalizer closes the tensor being viewed or copied", function()
  local good = 0
  for _ = 1, 1000 do
    local t = gpu.ones({ 2, 2 })
    setmetatable({}, { __gc = function() t:close() end })
    local ok, err = pcall(function()
      local v = t:narrow(1, 1, 1)
      local c = t:clone()
      return v, c
    end)
    if ok or tostring(err):find("closed") then good = good + 1 end
  end
  T.is(good, 1000, "narrow/clone either worked or raised 'closed'")
end)

collectgarbage("incremental")  -- back to the defaults

T.test("argument tables are read raw: metamethods do not run", function()
  local s = gpu.stream()
  local called = false
  local opts = setmetatable({}, { __index = function() called = true; s:close() end })
  local ev = s:record(opts)
  T.ok(not called, "opts.__index was not called")
  T.ok(ev.timing, "the event has the default timing")
  ev:close(); s:close()
  local shape = setmetatable({}, { __len = function() return -3 end })
  local z = gpu.zeros(shape)
  T.is(z.ndim, 0, "a shape table's __len is ignored (raw length 0: a 0-dim tensor)")
  local huge = setmetatable({ { 1 } }, { __len = function() return 1 << 54 end })
  local h = gpu.tensor(huge)
  T.is(h.shape, { 1, 1 }, "gpu.tensor uses raw lengths")
end)

T.test("a closed stream that is still current raises instead of falling back", function()
  local s = gpu.stream()
  local _ <close> = gpu.using(s)
  s:close()
  T.raises_at(function() return gpu.zeros({ 4 }) end, "current stream .* is closed",
              "op on a closed current stream")
end)

T.test("event record on a stream closed meanwhile", function()
  local s = gpu.stream()
  local ev = gpu.event()
  s:close()
  T.raises_at(function() ev:record(s) end, "closed", "record on a closed stream")
  local base = gpu.stats().streams
  ev:close()
  T.is(gpu.stats().streams, base, "stream count unchanged by closing the event")
end)

T.done()
