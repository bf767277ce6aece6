-- gpu.nosync scopes that do not end in order: each scope belongs to the
-- task that opened it (or the main program), and closing it ends that
-- scope only, whichever task runs, in whatever order scopes close; a scope
-- never closed ends when it is collected; gpu.sync_debug(mode) ends the
-- scopes of a coroutine that died of an error with them open.  After every
-- scope has ended, a sync works again.
local gpu = require "gpu"
local T = require "gpu.test"

-- a sync (an item) that the mode in force allows: true, or false and why
local function item_ok(d)
  local ok, err = pcall(function() return d:sum():item() end)
  return ok, not ok and tostring(err) or nil
end

local function close_scope(s) getmetatable(s).__close(s) end

T.test("scopes of two coroutines close out of order", function()
  local d <close> = gpu.ones({4})
  local a = coroutine.wrap(function() local _ <close> = gpu.nosync(); coroutine.yield(); end)
  local b = coroutine.wrap(function() local _ <close> = gpu.nosync("warn"); coroutine.yield(); end)
  a()   -- opens error
  b()   -- opens warn, on top
  T.is(gpu.sync_debug(), "warn", "the newest scope is in force")
  a()   -- the older scope ends first
  T.is(gpu.sync_debug(), "warn", "the older scope ended: the newer one is still in force")
  b()
  T.is(gpu.sync_debug(), "off", "both ended: the base mode again")
  local ok, err = item_ok(d)
  T.ok(ok, "item works after both scopes ended")
  if not ok then T.diag(err) end
end)

T.test("three scopes, the middle one closed first, then the others", function()
  local d <close> = gpu.ones({4})
  local s1 = gpu.nosync("warn")
  local s2 = gpu.nosync("error")
  local s3 = gpu.nosync("warn")
  close_scope(s2)
  T.is(gpu.sync_debug(), "warn", "the innermost open scope (warn) is in force")
  close_scope(s3)
  T.is(gpu.sync_debug(), "warn", "then the outermost (warn), not the closed middle one")
  close_scope(s1)
  close_scope(s1)   -- closing twice does nothing
  T.is(gpu.sync_debug(), "off", "all closed: off")
  T.ok(item_ok(d), "item works")
end)

T.test("a scope closed from another task ends in its own task only", function()
  local d <close> = gpu.ones({4})
  local shared
  local seen = {}
  local a, b
  a = gpu.task(function()
    shared = gpu.nosync()
    gpu.await(b)                 -- b closes the scope meanwhile
    seen.a_mode = gpu.sync_debug()
    seen.a_item = item_ok(d)
  end)
  b = gpu.task(function()
    local _ <close> = gpu.nosync("warn")
    close_scope(shared)          -- a's scope, closed while b runs
    seen.b_mode = gpu.sync_debug()
  end)
  gpu.run()
  T.is(seen.b_mode, "warn", "closing a's scope left b's own scope in force")
  T.is(seen.a_mode, "off", "a's scope is over for a")
  T.ok(seen.a_item, "and a's item works")
  T.ok(a.done and not a.failed and b.done and not b.failed, "both tasks finished")
  T.is(gpu.sync_debug(), "off", "the main program's mode is untouched")
  T.ok(item_ok(d), "item works in the main program")
end)

T.test("a scope opened by a coroutine inside a task belongs to the task", function()
  local d <close> = gpu.ones({4})
  local co = coroutine.create(function() local _ <close> = gpu.nosync(); coroutine.yield() end)
  local inside
  gpu.task(function()
    coroutine.resume(co)         -- opens, and is left suspended
    inside = item_ok(d)
  end)
  gpu.run()
  T.is(inside, false, "the task's sync after the coroutine opened the scope raises")
  T.is(gpu.sync_debug(), "off", "the main program is not under the task's scope")
  local ok, err = item_ok(d)
  T.ok(ok, "item works in the main program")
  if not ok then T.diag(err) end
  coroutine.close(co)
end)

T.test("a coroutine abandoned with a scope open: the scope ends when collected", function()
  local d <close> = gpu.ones({4})
  do
    local co = coroutine.wrap(function() local _ <close> = gpu.nosync(); coroutine.yield() end)
    co()
  end
  T.is(item_ok(d), false, "while the coroutine lives, its scope is in force")
  collectgarbage(); collectgarbage()
  T.is(gpu.sync_debug(), "off", "collected: the base mode again")
  local ok, err = item_ok(d)
  T.ok(ok, "item works")
  if not ok then T.diag(err) end
  -- a scope never closed and dropped is collected the same way
  gpu.nosync()
  collectgarbage(); collectgarbage()
  T.ok(item_ok(d), "a dropped scope ends when collected")
end)

T.test("gpu.sync_debug ends the scopes of a coroutine that died of an error", function()
  local d <close> = gpu.ones({4})
  local co = coroutine.create(function() local _ <close> = gpu.nosync(); error("dies") end)
  T.ok(not coroutine.resume(co), "the coroutine died (its scope is still pending)")
  T.is(gpu.sync_debug("off"), "off", "sync_debug('off') reports the mode without the dead scope")
  local ok, err = item_ok(d)
  T.ok(ok, "item works after sync_debug('off')")
  if not ok then T.diag(err) end
  coroutine.close(co)            -- closing it later changes nothing
  T.is(gpu.sync_debug(), "off", "off")
  T.ok(item_ok(d), "item still works")
  -- sync_debug() without a mode ends such scopes too
  local co2 = coroutine.create(function() local _ <close> = gpu.nosync(); error("dies") end)
  coroutine.resume(co2)
  T.is(gpu.sync_debug(), "off", "sync_debug() reports the mode without the dead scope")
  T.ok(item_ok(d), "and item works after it")
end)

T.test("a cancelled task's scope ends with it", function()
  local d <close> = gpu.ones({4})
  local s <close> = gpu.stream()
  local t = gpu.task(function()
    local _ <close> = gpu.nosync()
    gpu.sleep(50, { stream = s })
    gpu.await(s)
  end)
  gpu.run(0)   -- one round: t opens its scope and waits
  t:cancel()
  T.is(gpu.sync_debug(), "off", "the main program's mode")
  T.ok(item_ok(d), "item works")
  gpu.synchronize()
end)

T.test("nosync and sync_debug still nest and restore as before", function()
  T.is(gpu.sync_debug(), "off", "off")
  do
    local _ <close> = gpu.nosync()
    do
      local _ <close> = gpu.nosync("warn")
      T.is(gpu.sync_debug(), "warn", "inner")
    end
    T.is(gpu.sync_debug(), "error", "outer")
    T.is(gpu.sync_debug("warn"), "error", "sync_debug inside a scope returns the scope's mode")
    T.is(gpu.sync_debug(), "error", "and the open scope still wins over the base mode")
  end
  T.is(gpu.sync_debug(), "warn", "after the scope: the base mode that was set inside it")
  gpu.sync_debug("off")
  T.raises_at(function() local _ <close> = gpu.nosync("loud") end, "bad argument #1 to 'nosync'",
              "a bad mode")
end)

T.done()
