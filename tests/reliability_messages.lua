-- Messages that help (issue 21, item 7): --trace with a file that cannot be
-- written says why (the OS message); errors that gpu.pipeline meets point at
-- the script line that called pipeline.run, or at the stage's own line, and
-- name the stage; send and recv name themselves and the argument; the docs
-- name no function that does not exist.
local gpu = require "gpu"
local T = require "gpu.test"
local pipeline = require "gpu.pipeline"

-- ---- --trace ------------------------------------------------------------------

T.test("--trace to a file that cannot be written gives the OS message", function()
  local path = "/nonexistent-dir/x.json"
  local _, oserr = io.open(path, "w")
  local out, ok = T.run("", "--device host --trace " .. path .. " -e 'print(1)'")
  T.ok(not ok, "gpulua exits non-zero")
  T.ok(out:find("cannot write the trace: " .. oserr, 1, true) ~= nil,
       "the message has io.open's: " .. (out:match("[^\n]*") or ""))
  T.ok(not out:find("trace: nil", 1, true), "not 'nil'")
  out, ok = T.run("GPULUA_TRACE=" .. path, "--device host -e 'print(1)'")
  T.ok(not ok and out:find(oserr, 1, true) ~= nil, "GPULUA_TRACE too: " .. (out:match("[^\n]*") or ""))
end)

-- ---- gpu.pipeline -------------------------------------------------------------

local function spec(extra)
  local s = {
    batches = 5, depth = 2, progress = false,
    input = { shape = { 16 }, dtype = "f32" },
    output = { shape = { 16 }, dtype = "f32" },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x, y) x:add(1, { out = y }) end,
    sink = function() end,
  }
  for k, v in pairs(extra) do s[k] = v end
  return s
end

local function live()
  collectgarbage(); collectgarbage(); gpu.synchronize()
  local st, m = gpu.stats(), gpu.memory()
  return { st.streams, st.events, st.buffers, m.allocated, m.pinned, m.host }
end

T.test("a stage that closes a buffer it was lent: the caller's line and the stage", function()
  local before = live()
  T.raises_at(function() pipeline.run(spec { load = function(_, pin) pin:close() end }) end,
              "pipeline%.run: load %(batch 1, defined at [^)]*reliability_messages%.lua:%d+%) closed its pinned input",
              "load closes its pinned buffer")
  T.raises_at(function() pipeline.run(spec { compute = function(_, x) x:close() end }) end,
              "pipeline%.run: compute %(batch 1, defined at [^)]*%) closed its device input",
              "compute closes its device input")
  T.raises_at(function() pipeline.run(spec { compute = function(_, _, y) y:close() end }) end,
              "pipeline%.run: compute %(batch 1, defined at [^)]*%) closed its device output",
              "compute closes its device output")
  T.raises_at(function() pipeline.run(spec { sink = function(i, p) if i == 2 then p:close() end end }) end,
              "pipeline%.run: sink %(batch 2, defined at [^)]*%) closed its pinned output",
              "sink closes its pinned output")
  local ins = { gpu.pinned({ 16 }), gpu.pinned({ 16 }) }
  T.raises_at(function()
    pipeline.run { inputs = ins, batches = 4, progress = false,
                   compute = function(i) if i == 1 then ins[2]:close() end end }
  end, "pipeline%.run: inputs%[2%] is closed %(batch 2%)", "an input closed before its batch")
  ins[1]:close()
  T.is(live(), before, "nothing left behind")
end)

T.test("a pipeline too big for memory: the caller's line", function()
  local before = live()
  local msg = T.raises_at(function()
    pipeline.run(spec { input = { shape = { 1 << 20, 1 << 20, 1 << 10 } } })
  end, "pipeline%.run: [^\n]*buffers[^\n]*out of memory", "a huge input")
  T.ok(msg and not msg:find("pipeline.lua", 1, true), "the message does not point into the module")
  T.is(live(), before, "nothing left behind")
end)

T.test("coroutine.yield in a stage outside a coroutine: the stage's line, and the stage", function()
  local before = live()
  local line
  local msg = T.raises_at(function()
    pipeline.run(spec {
      load = function()
        line = debug.getinfo(1, "l").currentline + 1
        coroutine.yield()
      end,
    })
  end, "pipeline%.run: load %(batch 1%): attempt to yield from outside a coroutine", "yield in load")
  T.ok(msg and msg:find("^[^\n]*reliability_messages%.lua:" .. tostring(line) .. ":"),
       "the message points at the yield's line (" .. tostring(line) .. ")")
  -- inside a task a stage may yield: the task lets others run
  local other = 0
  local t = gpu.task(function()
    return pipeline.run(spec { sink = function() coroutine.yield() end }).batches
  end)
  gpu.task(function() for _ = 1, 3 do other = other + 1; coroutine.yield() end end)
  gpu.run()
  T.is(t:result(), 5, "in a task, a sink that yields runs every batch")
  T.is(other, 3, "... while another task ran")
  T.is(live(), before, "nothing left behind")
end)

T.test("a stage's own errors are not rewritten", function()
  local ok, err = pcall(pipeline.run, spec { compute = function() error("mine", 0) end })
  T.is({ ok, err }, { false, "mine" }, "error(msg, 0) comes through as it is")
  local obj = {}
  ok, err = pcall(pipeline.run, spec { sink = function() error(obj) end })
  T.ok(not ok and rawequal(err, obj), "an error object comes through as it is")
end)

-- ---- send and recv ------------------------------------------------------------

T.test("send and recv name the function and the argument", function()
  local t <close> = gpu.ones({ 4 })
  T.raises_at(function() gpu.send(t, 0.5) end,
              "bad argument #2 to 'send' %(number has no integer representation%)", "send(t, 0.5)")
  T.raises_at(function() gpu.recv(t, 0.5) end,
              "bad argument #2 to 'recv' %(number has no integer representation%)", "recv(t, 0.5)")
  T.raises_at(function() gpu.send(t, "one") end, "bad argument #2 to 'send' %(number expected, got string%)",
              "send(t, 'one')")
  T.raises_at(function() gpu.recv(t) end, "bad argument #2 to 'recv' %(number expected, got no value%)",
              "recv(t)")
  T.raises_at(function() gpu.send(t, 3) end, "bad argument #2 to 'send' %(3 is not a rank: the world has 1%)",
              "send(t, 3)")
  T.raises_at(function() gpu.recv(t, -1) end, "bad argument #2 to 'recv' %(%-1 is not a rank: the world has 1%)",
              "recv(t, -1)")
  T.raises_at(function() gpu.broadcast(t, { root = 0.5 }) end,
              "bad option 'root' %(number has no integer representation%)", "broadcast root = 0.5")
end)

T.test("send and recv argument errors in a job of 2 ranks", function()
  local script = T.tmpfile([[
local t = gpu.ones({4})
local peer = 1 - gpu.rank
for _, c in ipairs {
  { "send", function() gpu.send(t, 0.5) end },
  { "recv", function() gpu.recv(t, 2) end },
} do
  local ok, err = pcall(c[2])
  print("msg", c[1], err)
end
-- the job is still fine
if gpu.rank == 0 then gpu.send(gpu.full({4}, 7), peer) else gpu.recv(t, peer) end
gpu.synchronize()
print("value", t:get(1))
]])
  local out, ok = T.run("", "-n 2 --prefix --device host " .. script)
  T.ok(ok, "the job exits 0")
  for rank = 0, 1 do
    T.ok(out:find("[rank " .. rank .. "] msg\tsend\t" .. script
                  .. ":4: bad argument #2 to 'send' (number has no integer representation)", 1, true) ~= nil,
         "rank " .. rank .. ": send(t, 0.5) at its line")
    T.ok(out:find("[rank " .. rank .. "] msg\trecv\t" .. script
                  .. ":5: bad argument #2 to 'recv' (2 is not a rank: the world has 2)", 1, true) ~= nil,
         "rank " .. rank .. ": recv(t, 2) at its line")
  end
  T.ok(out:find("[rank 1] value\t7.0", 1, true) ~= nil, "a good send and recv still work")
  if not ok then T.diag(out) end
  os.remove(script)
end)

-- ---- the docs --------------------------------------------------------------------

T.test("the docs name only gpu.try_ functions that exist", function()
  for _, path in ipairs { "README.md", "docs/lua-api.md", "docs/tutorial.md" } do
    local text = T.readfile(path)
    if not text then return T.skip(path, "not found from " .. os.getenv("PWD")) end
    local missing = {}
    for name in text:gmatch("gpu%.(try_[%w_]*)") do
      if gpu[name] == nil then missing[#missing + 1] = "gpu." .. name end
    end
    T.is(missing, {}, path .. ": every gpu.try_ function mentioned exists")
  end
end)

T.test("one dim reader: every dim-taking method gives the same range message", function()
  local t = gpu.zeros({2, 3})
  local idx = gpu.tensor({1}, {dtype = "i64"})
  local RANGE2 = "dim 3 out of range for a 2-dim tensor (1..2, or -2..-1)"
  local RANGE3 = "dim 4 out of range for a 3-dim tensor (1..3, or -3..-1)"  -- unsqueeze: one more
  for _, c in ipairs {
    {"sum{dim = 3}", function() return t:sum{dim = 3} end, RANGE2},
    {"narrow(3, 1, 1)", function() return t:narrow(3, 1, 1) end, RANGE2},
    {"select(3, 1)", function() return t:select(3, 1) end, RANGE2},
    {"index_select(3, idx)", function() return t:index_select(3, idx) end, RANGE2},
    {"softmax(3)", function() return t:softmax(3) end, RANGE2},
    {"transpose(1, 3)", function() return t:transpose(1, 3) end, RANGE2},
    {"unsqueeze(4)", function() return t:unsqueeze(4) end, RANGE3},
  } do
    local ok, err = pcall(c[2])
    T.ok(not ok and tostring(err):find(c[3], 1, true) ~= nil, c[1] .. ": " .. tostring(err))
  end
  local ok, err = pcall(function() return t:sum{dim = 1.5} end)
  T.ok(not ok and tostring(err):find("integer dim expected, got 1.5", 1, true) ~= nil, "a fraction is shown: " .. tostring(err))
end)

T.done()
