-- Sync debugging: every host-device sync (item, get, totable, tostring of
-- values, the three synchronizes, a host-access fence that has to wait, on
-- pinned or pageable memory) is counted in gpu.stats().syncs, and a copy
-- between pageable memory and the device is not (it is queued); inside
-- gpu.nosync() each one raises, naming the call and the script line, and
-- nothing else does; gpu.sync_debug("warn") reports each once; the CLI's
-- --sync-debug and GPULUA_SYNC_DEBUG set the mode before the script runs.
local gpu = require "gpu"
local T = require "gpu.test"

local function syncs() return gpu.stats().syncs end

-- The sync calls, each as a function of fresh objects (so each really waits
-- or reads), with the name it must be reported under.
local function cases()
  local s = gpu.stream()
  local ev = gpu.event()
  local d = gpu.ones({4})
  local h = gpu.pinned({4})
  local pageable = gpu.zeros({4}, { device = "host" })
  local list = {
    { "item", function() return d:sum():item() end },
    { "get", function() return d:get(1) end },
    { "totable", function() return d:totable() end },
    { "tostring", function() return tostring(d) end },
    { "synchronize", function() gpu.synchronize() end },
    { "synchronize", function() s:synchronize() end },
    { "synchronize", function() ev:record(s); ev:synchronize() end },
    -- pinned memory a queued copy still writes: the host op must wait
    { "add_?", function() gpu.sleep(20, { stream = s }); h:copy(d, { stream = s }); h:add_(1) end },
    -- pageable memory a queued copy still writes: the same (the copy itself
    -- is queued, not a sync)
    { "add_?", function() gpu.sleep(20, { stream = s }); pageable:copy(d, { stream = s }); pageable:add_(1) end },
  }
  local function close()
    gpu.synchronize()
    for _, o in ipairs { s, ev, d, h, pageable } do o:close() end
  end
  return list, close
end

T.test("each sync call is counted once", function()
  local list, close = cases()
  for i, c in ipairs(list) do
    local before = syncs()
    c[2]()
    T.is(syncs() - before, 1, string.format("case %d (%s) counts one sync", i, c[1]))
  end
  close()
end)

T.test("async work is not a sync", function()
  local s <close> = gpu.stream()
  local ev <close> = gpu.event()
  local before = syncs()
  local x <close> = gpu.ones({64}, { stream = s })
  local y <close> = x:mul(2, { stream = s })
  local r <close> = y:sum { stream = s }
  ev:record(s)
  gpu.default_stream():wait(ev)
  s:query(); ev:query()
  local p <close> = gpu.pinned({64})
  p:copy(y, { stream = s })   -- pinned destination: a queued copy, no wait
  T.is(syncs(), before, "enqueue, record, wait, query and a pinned copy make no sync")
  -- pageable memory: staged through pinned memory, queued as well
  local h <close> = gpu.zeros({64}, { device = "host" })
  h:copy(y, { stream = s })
  x:copy(h, { stream = s })
  T.is(syncs(), before, "copies to and from pageable memory make no sync")
  local _ <close> = gpu.nosync()
  local z <close> = x + y
  T.ok(true, "and run inside gpu.nosync() without raising")
  h:copy(y, { stream = s })
  x:copy(h, { stream = s })
  T.ok(true, "pageable copies too")
end)

T.test("inside gpu.nosync() every sync raises with the call and the line", function()
  local list, close = cases()
  for i, c in ipairs(list) do
    local before = syncs()
    do
      local _ <close> = gpu.nosync()
      local ok, msg = pcall(c[2])
      local line = debug.getinfo(c[2], "S").linedefined
      T.ok(not ok and msg:find("^[^\n]*sync_debug%.lua:" .. line .. ": " .. c[1] .. ": [^\n]*host%-device sync, not allowed here"),
           string.format("case %d: %s raises at its line (%d)", i, c[1], line))
      if ok or not msg:find("sync_debug%.lua:" .. line) then T.diag(tostring(msg)) end
    end
    T.is(syncs(), before, string.format("case %d: the refused sync did not happen", i))
  end
  -- after the scope, each call works again, and the state is consistent
  gpu.synchronize()
  for i, c in ipairs(list) do
    T.ok(pcall(c[2]), string.format("case %d (%s) works after the scope", i, c[1]))
  end
  close()
end)

T.test("nosync restores the previous mode, also on error, and nests", function()
  T.is(gpu.sync_debug(), "off", "scripts start with sync debugging off")
  do
    local _ <close> = gpu.nosync()
    T.is(gpu.sync_debug(), "error", "inside nosync: error")
    do
      local _ <close> = gpu.nosync("warn")
      T.is(gpu.sync_debug(), "warn", "nested nosync('warn'): warn")
    end
    T.is(gpu.sync_debug(), "error", "the inner scope restored error")
  end
  T.is(gpu.sync_debug(), "off", "the outer scope restored off")
  local ok = pcall(function()
    local _ <close> = gpu.nosync()
    error("boom")
  end)
  T.ok(not ok, "an error inside the scope propagates")
  T.is(gpu.sync_debug(), "off", "and the scope was still closed")
  T.is(gpu.sync_debug("error"), "off", "sync_debug returns the previous mode")
  T.is(gpu.sync_debug("off"), "error", "... each time")
end)

T.test("bad arguments", function()
  T.raises_at(function() gpu.sync_debug("loud") end, "bad argument #1 to 'sync_debug' %(invalid option 'loud'%)",
              "sync_debug refuses an unknown mode")
  T.raises_at(function() gpu.sync_debug(3) end, "bad argument #1 to 'sync_debug'", "... and a number")
  T.raises_at(function() local _ <close> = gpu.nosync("off!") end, "bad argument #1 to 'nosync'",
              "nosync refuses an unknown mode")
  T.is(gpu.sync_debug(), "off", "a refused mode changes nothing")
end)

local run, tmpscript = T.run, T.tmpfile

T.test("warn mode reports each sync site once, with its line", function()
  local name = tmpscript(table.concat({
    "local t = gpu.ones({4})",
    "gpu.sync_debug('warn')",
    "for i = 1, 3 do t:sum():item() end",
    "gpu.synchronize()",
    "print('syncs', gpu.stats().syncs)",
  }, "\n"))
  local out, ok = run("", "--device host " .. name)
  T.ok(ok, "the script runs to the end")
  local short = name:match("[^/]*$")
  local _, nitem = out:gsub("gpulua: [^\n]*" .. short .. ":3: item: a device%-to%-host read waits for the device", "")
  T.is(nitem, 1, "the item in a loop of 3 warns once, naming line 3")
  T.ok(out:find(short .. ":4: synchronize: device synchronize waits for the device", 1, false),
       "gpu.synchronize warns, naming line 4")
  T.ok(out:find("syncs\t4", 1, true), "every sync is still counted (3 items + 1 synchronize)")
  if not ok then T.diag(out) end
  os.remove(name)
end)

T.test("--sync-debug and GPULUA_SYNC_DEBUG", function()
  local name = tmpscript("local t = gpu.ones({4})\nprint(t:sum():item())\n")
  local short = name:match("[^/]*$")
  local out, ok = run("", "--device host --sync-debug error " .. name)
  T.ok(not ok, "--sync-debug error: a script that syncs fails")
  T.ok(out:find(short .. ":2: item: a device%-to%-host read") ~= nil, "... at the item's line")
  out, ok = run("GPULUA_SYNC_DEBUG=error", "--device host " .. name)
  T.ok(not ok and out:find(short .. ":2: item:") ~= nil, "GPULUA_SYNC_DEBUG=error does the same")
  out, ok = run("GPULUA_SYNC_DEBUG=error", "--device host --sync-debug off " .. name)
  T.ok(ok and out:find("4.0", 1, true), "--sync-debug off wins over the environment")
  out, ok = run("", "--device host --sync-debug=warn " .. name)
  T.ok(ok and out:find("gpulua: .*:2: item:") ~= nil, "--sync-debug=warn warns and runs")
  out, ok = run("", "--device host --sync-debug error -e 'gpu.ones{2}:add(1)'")
  T.ok(ok, "queued work at exit is finished without tripping the mode")
  out, ok = run("", "--sync-debug loud -e 'print(1)'")
  T.ok(not ok and out:find("'--sync-debug' needs argument off, warn or error", 1, true),
       "an unknown mode is a usage error")
  out, ok = run("", "--sync-debug")
  T.ok(not ok and out:find("needs argument", 1, true), "a missing mode is a usage error")
  out, ok = run("GPULUA_SYNC_DEBUG=loud", "--device host -e 'print(1)'")
  T.ok(not ok and out:find("GPULUA_SYNC_DEBUG='loud' (expected off, warn or error)", 1, true),
       "a bad GPULUA_SYNC_DEBUG is a clear error")
  os.remove(name)
end)

T.test("the REPL warns by default, but not for printing results", function()
  local out, ok = run("", "--device host -i < /dev/null")
  T.ok(ok, "gpulua -i with no input exits 0")
  local input = tmpscript("t = gpu.ones({3})\nt\nx = t:sum():item()\nprint('syncs', gpu.stats().syncs)\n")
  out, ok = run("", "--device host -i < " .. input)
  T.ok(ok, "the session runs")
  T.ok(out:find("gpu.Tensor(f32, {3}, device) {1, 1, 1}", 1, true), "the tensor is printed")
  local _, nwarn = out:gsub("gpulua: [^\n]*waits for the device", "")
  T.is(nwarn, 1, "only the item warns, not the printing")
  T.ok(out:find("stdin:1: item:", 1, true), "naming the REPL line")
  T.ok(out:find("syncs\t2", 1, true), "both syncs are counted")
  out, ok = run("", "--device host --sync-debug off -i < " .. input)
  T.ok(ok and not out:find("waits for the device", 1, true), "--sync-debug off silences the REPL")
  os.remove(input)
end)

T.done()
