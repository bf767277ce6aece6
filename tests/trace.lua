-- Traces: `gpulua --trace X.json|X.svg` on a small two-stream script (read
-- back with a JSON parser and an XML checker written here, not trusting the
-- writers), the gpu.trace API, gpu.range, and the errors.  Times are only
-- checked for ordering sanity, never for speed.
local gpu = require "gpu"
local T = require "gpu.test"

local HOST = gpu.backend == "host"

-- ---- helpers ---------------------------------------------------------------

local function run(env, args)
  local t0 = gpu.clock()
  local out, ok = T.run(env, args)
  return out, ok, (gpu.clock() - t0) * 1e6
end

local slurp = T.readfile

local function spit(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

-- A JSON parser (RFC 8259, without surrogate pairs): the value, or raises.
local function json_decode(s)
  local pos = 1
  local function fail(what) error(string.format("JSON: %s at byte %d", what, pos), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    pos = pos + 1
    local buf = {}
    while true do
      local c = s:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1; break end
      if c:byte() < 32 then fail("control character in a string") end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local simple = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
        if simple[e] then
          buf[#buf + 1] = simple[e]
          pos = pos + 2
        elseif e == "u" then
          local hex = s:match("^%x%x%x%x", pos + 2) or fail("bad \\u escape")
          buf[#buf + 1] = utf8.char(tonumber(hex, 16))
          pos = pos + 6
        else
          fail("bad escape")
        end
      else
        buf[#buf + 1] = c
        pos = pos + 1
      end
    end
    return table.concat(buf)
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local obj = {}
      pos = pos + 1
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("object key expected") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then fail("':' expected") end
        pos = pos + 1
        obj[k] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then fail("',' or '}' expected") end
      end
    elseif c == "[" then
      local arr = {}
      pos = pos + 1
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return arr end
      while true do
        arr[#arr + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then fail("',' or ']' expected") end
      end
    elseif c == '"' then
      return str()
    elseif s:find("^true", pos) then pos = pos + 4; return true
    elseif s:find("^false", pos) then pos = pos + 5; return false
    elseif s:find("^null", pos) then pos = pos + 4; return nil
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if not num or num == "" or not tonumber(num) then fail("value expected") end
      pos = pos + #num
      return tonumber(num)
    end
  end
  local v = value()
  ws()
  if pos <= #s then fail("trailing characters") end
  return v
end

-- An XML well-formedness check: one root, balanced tags, quoted attributes,
-- entities only where allowed.  Returns the elements ({name, attrs, parent})
-- or raises.
local function xml_check(s)
  local pos, stack, elems, roots = 1, {}, {}, 0
  local function fail(what) error(string.format("XML: %s at byte %d", what, pos), 0) end
  local function check_text(t, where)
    if t:find("<", 1, true) then fail("'<' in " .. where) end
    for amp in t:gmatch("&[^;]*;?") do
      if not (amp:match("^&[lg]t;$") or amp:match("^&amp;$") or amp:match("^&quot;$") or amp:match("^&apos;$")
              or amp:match("^&#%d+;$") or amp:match("^&#x%x+;$")) then
        fail("bad entity " .. amp .. " in " .. where)
      end
    end
    if not utf8.len(t) then fail("invalid UTF-8 in " .. where) end
  end
  if s:sub(1, 5) == "<?xml" then
    pos = (s:find("?>", 1, true) or fail("unterminated declaration")) + 2
  end
  while pos <= #s do
    local lt = s:find("<", pos, true)
    local text = s:sub(pos, (lt or #s + 1) - 1)
    check_text(text, "text")
    if #stack == 0 and text:find("%S") then fail("text outside the root") end
    if not lt then break end
    pos = lt
    if s:sub(pos, pos + 3) == "<!--" then
      pos = (s:find("-->", pos + 4, true) or fail("unterminated comment")) + 3
    elseif s:sub(pos, pos + 1) == "</" then
      local name, e = s:match("^</([%a_][%w_:%.%-]*)%s*>()", pos)
      if not name then fail("bad end tag") end
      local top = table.remove(stack)
      if not top or top.name ~= name then fail("</" .. name .. "> closes " .. (top and top.name or "nothing")) end
      pos = e
    else
      local name, e = s:match("^<([%a_][%w_:%.%-]*)()", pos)
      if not name then fail("bad start tag") end
      if #stack == 0 then
        roots = roots + 1
        if roots > 1 then fail("a second root element") end
      end
      pos = e
      local el = { name = name, attrs = {}, parent = stack[#stack] }
      while true do
        local k, v, e2 = s:match('^%s+([%a_][%w_:%.%-]*)="([^"]*)"()', pos)
        if not k then break end
        if el.attrs[k] then fail("attribute " .. k .. " twice") end
        check_text(v, "attribute " .. k)
        el.attrs[k] = v
        pos = e2
      end
      local close = s:match("^%s*(/?)>", pos)
      if not close then fail("bad attribute or unterminated tag <" .. name .. ">") end
      pos = s:find(">", pos, true) + 1
      elems[#elems + 1] = el
      if close == "" then stack[#stack + 1] = el end
    end
  end
  if #stack > 0 then fail("<" .. stack[#stack].name .. "> not closed") end
  if roots ~= 1 then fail("no root element") end
  return elems
end

local function have_xmllint()
  local p = io.popen("command -v xmllint 2>/dev/null")
  local path = p:read("a")
  p:close()
  return path:find("%S") ~= nil
end

-- ---- the child script ------------------------------------------------------

-- Two streams: an H2D copy on one overlapping a long op on the other, a
-- range, an event wait, two syncs, a D2H copy.  Lines marked --@name are
-- the sites the trace must name.  Prints the two streams' ids.
local N = 1 << 16
local SCRIPT = [[
local gpu = require "gpu"
local n = ]] .. N .. [[

local h = gpu.pinned({n})
local d = gpu.empty({n})
local copy_s = gpu.stream()
local comp_s = gpu.stream{priority = "high"}
print("ids", copy_s.id, comp_s.id)
h:fill(1)                                        --@fill
do
  local _ <close> = gpu.range("pipeline")        --@range
  d:copy(h, {stream = copy_s})                   --@h2d
  local ev = copy_s:record()
  gpu.sleep(60, {stream = comp_s})               --@sleep_comp
  comp_s:wait(ev)
  d:mul(2, {stream = comp_s, out = d})           --@mul
  gpu.sleep(30, {stream = copy_s})               --@sleep_copy
  comp_s:synchronize()                           --@sync
end
h:copy(d, {stream = copy_s})                     --@d2h
gpu.synchronize()                                --@sync2
]]

local function line_of(script, mark)
  local i = 0
  for line in (script .. "\n"):gmatch("(.-)\n") do
    i = i + 1
    if line:find("--@" .. mark, 1, true) then return i end
  end
  error("no mark " .. mark)
end

local base = os.tmpname()
local script_path = base .. "_two.lua"
spit(script_path, SCRIPT)
local function site(mark) return script_path .. ":" .. line_of(SCRIPT, mark) end

-- the ops the script enqueues, in the order each stream runs them
local function expected_ops(copy_id, comp_id)
  return {
    [copy_id] = {
      { name = "copy H2D", cat = "copy", copy = "h2d", bytes = 4 * N, site = site("h2d") },
      { name = "sleep", cat = "compute", bytes = 0, site = site("sleep_copy") },
      { name = "copy D2H", cat = "copy", copy = "d2h", bytes = 4 * N, site = site("d2h") },
    },
    [comp_id] = {
      { name = "sleep", cat = "compute", bytes = 0, site = site("sleep_comp") },
      { name = "mul", cat = "compute", bytes = 4 * N, site = site("mul") },
    },
  }
end

-- ---- --trace X.json -----------------------------------------------------------

T.test("--trace X.json: a Chrome trace of the two-stream script", function()
  local path = base .. "_two.json"
  local out, ok, wall = run("", string.format("--device host --trace %s %s", path, script_path))
  T.ok(ok, "the script exits 0 with --trace")
  if not ok then T.diag(out) end
  local copy_id, comp_id = out:match("ids%s+(%d+)%s+(%d+)")
  copy_id, comp_id = tonumber(copy_id), tonumber(comp_id)
  local text = slurp(path)
  T.ok(text ~= nil, "the trace file is written")
  if not text then return end
  local okp, doc = pcall(json_decode, text)
  T.ok(okp and type(doc) == "table" and type(doc.traceEvents) == "table", "it parses as JSON with traceEvents")
  if not okp then T.diag(doc); return end
  local evs = doc.traceEvents
  local span = doc.otherData and doc.otherData.duration_us
  T.ok(type(span) == "number" and span > 0 and span <= wall, "otherData.duration_us lies within the run: "
       .. tostring(span) .. " <= " .. wall)

  -- tracks: thread_name metadata, one per stream used, plus the host
  local names, pids = {}, {}
  for _, e in ipairs(evs) do
    pids[e.pid] = true
    if e.ph == "M" and e.name == "thread_name" then names[e.tid] = e.args.name end
  end
  local tracks = {}
  for tid, n in pairs(names) do tracks[#tracks + 1] = tid .. "=" .. n end
  table.sort(tracks)
  T.is(tracks, { "1=host", string.format("%d=stream %d", copy_id + 2, copy_id),
                 string.format("%d=stream %d (high priority)", comp_id + 2, comp_id) },
       "three tracks: the host (tid 1) and the two streams (tid id + 2; named, with priority)")
  local np = 0
  for _ in pairs(pids) do np = np + 1 end
  T.is(np, 1, "one process")
  T.ok(pids[1], "pid 1 (rank 0 + 1: Perfetto takes pid 0 for the idle task)")
  local pname
  for _, e in ipairs(evs) do
    if e.ph == "M" and e.name == "process_name" then pname = e.args.name end
  end
  T.ok(pname and pname:find("gpulua", 1, true) and pname:find("host", 1, true), "the process is named: " .. tostring(pname))

  -- the ops, per stream, in order
  local per, host, by_kind = {}, {}, {}
  for _, e in ipairs(evs) do
    if e.ph == "X" then
      T.ok(type(e.ts) == "number" and type(e.dur) == "number", "X event has ts and dur")
      by_kind[e.args.kind] = (by_kind[e.args.kind] or 0) + 1
      if e.tid == 1 then
        host[#host + 1] = e
      else
        per[e.tid - 2] = per[e.tid - 2] or {}
        table.insert(per[e.tid - 2], e)
      end
    end
  end
  T.is(by_kind, { op = 5, host_op = 1, sync = 3, range = 1 },
       "exactly the 5 ops enqueued, 1 host-run op, 3 syncs and 1 range")
  local want = expected_ops(copy_id, comp_id)
  for sid, list in pairs(want) do
    local got = {}
    for i, e in ipairs(per[sid] or {}) do
      got[i] = { name = e.name, cat = e.cat, copy = e.args.copy, bytes = e.args.bytes, site = e.args.site }
      T.is(e.args.stream, sid, "op " .. e.name .. " names its stream")
    end
    T.is(got, list, "stream " .. sid .. ": names, bytes and script lines")
  end
  for _, e in ipairs(evs) do
    if e.ph == "X" then
      local okt = e.ts >= 0 and e.dur >= 0 and e.ts + e.dur <= span + 1e-3
      if not okt or (e.args.kind ~= "range" and not (e.dur > 0)) then
        T.ok(false, string.format("%s: start %.3f < end %.3f within [0, %.3f]", e.name, e.ts, e.ts + e.dur, span))
      end
    end
  end
  T.ok(true, "every event starts before it ends, within the run")

  -- ordering: each stream's ops one after another; the mul after the H2D
  -- copy it waits for; the two sleeps overlap (two streams at once)
  local function ends(e) return e.ts + e.dur end
  for sid, list in pairs(per) do
    for i = 2, #list do
      T.ok(list[i].ts >= ends(list[i - 1]) - 1e-3, string.format("stream %d: op %d starts after op %d ends", sid, i, i - 1))
    end
  end
  local c, k = per[copy_id] or {}, per[comp_id] or {}
  if c[1] and k[2] then T.ok(k[2].ts >= ends(c[1]) - 1e-3, "mul starts after the H2D copy it waits for") end
  if c[2] and k[1] then
    T.ok(c[2].ts < ends(k[1]) and k[1].ts < ends(c[2]), "the sleeps on the two streams overlap")
  end

  -- the host track: the host-run fill, the range, the syncs
  -- (the final wait, after the script, is checked below)
  local hs, final = {}, nil
  for _, e in ipairs(host) do
    if e.args.call == "finishing queued work" then
      final = e
    else
      hs[#hs + 1] = { name = e.name, cat = e.cat, kind = e.args.kind, site = e.args.site }
    end
  end
  table.sort(hs, function(a, b) return a.site .. a.name < b.site .. b.name end)
  local want_host = {
    { name = "fill", cat = "compute", kind = "host_op", site = site("fill") },
    { name = "pipeline", cat = "range", kind = "range", site = site("range") },
    { name = "stream synchronize", cat = "sync", kind = "sync", site = site("sync") },
    { name = "device synchronize", cat = "sync", kind = "sync", site = site("sync2") },
  }
  table.sort(want_host, function(a, b) return a.site .. a.name < b.site .. b.name end)
  T.is(hs, want_host, "host track: the host-run fill, the range and the syncs with their lines")
  T.ok(final and final.cat == "sync" and final.name == "device synchronize",
       "the wait at the end of the script is a sync on the host track, call 'finishing queued work'")
  local range, sync
  for _, e in ipairs(host) do
    if e.name == "pipeline" then range = e end
    if e.name == "stream synchronize" then sync = e end
  end
  if range and sync then
    T.ok(range.ts <= sync.ts and ends(sync) <= ends(range), "the sync lies inside the range around it")
    T.ok(range.args.depth == 0, "the range has depth 0")
  end
  os.remove(path)
end)

-- ---- --trace X.svg -------------------------------------------------------------

T.test("--trace X.svg: the same timeline as a well-formed picture", function()
  local path = base .. "_two.svg"
  local out, ok = run("", string.format("--device host --trace %s %s", path, script_path))
  T.ok(ok, "the script exits 0 with --trace X.svg")
  if not ok then T.diag(out) end
  local copy_id, comp_id = out:match("ids%s+(%d+)%s+(%d+)")
  local text = slurp(path)
  T.ok(text ~= nil, "the SVG file is written")
  if not text then return end
  local okx, elems = pcall(xml_check, text)
  T.ok(okx, "it is well-formed XML")
  if not okx then T.diag(elems); return end
  T.is(elems[1].name, "svg", "the root is <svg>")
  T.is(elems[1].attrs.xmlns, "http://www.w3.org/2000/svg", "with the SVG namespace")
  local lanes, evs, kinds, titled = {}, 0, {}, 0
  for _, el in ipairs(elems) do
    if el.name == "g" and el.attrs.class == "lane" then lanes[#lanes + 1] = el.attrs["data-track"] end
    local cls = el.name == "rect" and el.attrs.class and el.attrs.class:match("^ev (%S+)")
    if cls then
      evs = evs + 1
      kinds[cls] = (kinds[cls] or 0) + 1
      T.ok(tonumber(el.attrs.width) > 0 and tonumber(el.attrs.x) >= 0, "an event box has a position and width")
    end
    if el.name == "title" and el.parent and el.parent.name == "rect" then titled = titled + 1 end
  end
  T.is(lanes, { "host", "stream " .. copy_id, "stream " .. comp_id .. " (high priority)" },
       "one lane per stream used, and the host's")
  T.is(evs, 10, "a box per event: 5 ops, 1 host-run op, 3 syncs, 1 range")
  T.is(kinds, { h2d = 1, d2h = 1, compute = 4, sync = 3, range = 1 }, "boxes coloured by kind")
  T.is(titled, 10, "every box has a <title> tooltip")
  T.ok(text:find("copy H2D", 1, true) and text:find(site("h2d"), 1, true), "a tooltip names the op and its line")
  T.ok(text:find(">0 ms<", 1, true) or text:find(">0 µs<", 1, true), "the time axis has labelled ticks")
  if have_xmllint() then
    T.ok(os.execute("xmllint --noout " .. path .. " 2>&1"), "xmllint --noout accepts it")
  else
    T.skip("xmllint --noout", "xmllint is not installed")
  end
  os.remove(path)
end)

-- ---- the API ----------------------------------------------------------------

T.test("tracing off records nothing", function()
  T.is(gpu.trace.active(), false, "off unless started")
  local s <close> = gpu.stream()
  local x = gpu.ones({256}, { stream = s })
  x:add_(1, { stream = s })
  local before = gpu.stats().syncs
  local ev = gpu.trace.events()
  T.is(#ev, 0, "no events without a session")
  T.is(gpu.stats().syncs, before + 1, "events() is a counted sync")
end)

T.test("gpu.trace.start / stop / events", function()
  T.is(require "gpu.trace", gpu.trace, "require 'gpu.trace' is gpu.trace")
  local s <close> = gpu.stream()
  local x = gpu.empty({1024}, { dtype = "f64" })
  local h = gpu.pinned({1024}, { dtype = "f64" })
  gpu.synchronize()
  gpu.trace.start()
  T.is(gpu.trace.active(), true, "active after start")
  T.raises(function() gpu.trace.start() end, "tracing is already on", "start twice raises")
  local line = debug.getinfo(1, "l").currentline
  x:fill(3, { stream = s })           -- line + 1
  h:copy(x, { stream = s })           -- line + 2
  gpu.trace.stop()
  T.is(gpu.trace.active(), false, "inactive after stop")
  x:fill(4, { stream = s })           -- not recorded
  local ev = gpu.trace.events()
  local ops = {}
  for _, e in ipairs(ev) do
    if e.kind == "op" then ops[#ops + 1] = { e.name, e.cat, e.copy, e.stream, e.bytes, e.site } end
  end
  local src = debug.getinfo(1, "S").short_src
  T.is(ops, { { "fill", "compute", nil, s.id, 8192, src .. ":" .. (line + 1) },
              { "copy D2H", "copy", "d2h", s.id, 8192, src .. ":" .. (line + 2) } },
       "the two ops enqueued while on, with stream, bytes and line; none after stop")
  T.is(#ev.streams, 1, "one stream in the session")
  T.is(ev.streams[1].id, s.id, "... the one used")
  T.ok(ev.streams[1].name == "stream " .. s.id, "... named " .. tostring(ev.streams[1].name))
  T.is(ev.dropped, 0, "nothing dropped")
  for _, e in ipairs(ev) do
    T.ok(e.ts >= 0 and e.dur >= 0 and (e.dur > 0 or not HOST) and e.ts + e.dur <= ev.duration + 1e-3,
         "ordering sanity: " .. e.name)
  end
  T.is(#gpu.trace.events(), #ev, "events() again: the same session")
end)

T.test("max_events bounds a session", function()
  gpu.trace.start { max_events = 3 }
  local x = gpu.zeros({16})
  for _ = 1, 5 do x:add_(1) end
  gpu.trace.stop()
  local ev = gpu.trace.events()
  T.is(#ev, 3, "3 records kept")
  T.ok(ev.dropped >= 3, "the others counted as dropped: " .. ev.dropped)
  T.raises(function() gpu.trace.start { max_events = 0 } end, "max_events", "max_events = 0 raises")
  T.raises(function() gpu.trace.start { max_events = "x" } end, "max_events", "a non-number raises")
  T.raises(function() gpu.trace.start { max = 3 } end, "unknown option 'max'", "a misspelt option raises")
  T.is(gpu.trace.active(), false, "none of them started a session")
end)

T.test("gpu.range", function()
  gpu.trace.start()
  do
    local _ <close> = gpu.range("outer")
    do
      local _ <close> = gpu.range("inner")
      gpu.synchronize()
    end
  end
  local a = gpu.range("a")
  local b = gpu.range("b")
  local msg = T.raises(function() a:close() end, "ranges nest", "closing an outer range first raises")
  T.ok(msg and msg:find("'a'", 1, true) and msg:find("'b'", 1, true) and msg:find("opened at", 1, true),
       "... naming both ranges and where they were opened: " .. tostring(msg))
  b:close()
  a:close()
  a:close()
  T.ok(tostring(a):find("closed", 1, true), "closing twice is harmless: " .. tostring(a))
  -- an error leaving both scopes ends both ranges and keeps its own message
  local ok, err = pcall(function()
    local _ <close> = gpu.range("e1")
    local _ = gpu.range("e2")           -- not <close>: still open when e1 closes
    error("boom", 0)
  end)
  T.is({ ok, err }, { false, "boom" }, "an error inside ranges is not replaced")
  gpu.trace.stop()
  local got = {}
  for _, e in ipairs(gpu.trace.events()) do
    if e.kind == "range" then got[#got + 1] = e.name .. "@" .. e.depth end
  end
  table.sort(got)
  T.is(got, { "a@0", "b@1", "e1@0", "e2@1", "inner@1", "outer@0" }, "every range recorded, with its depth")
  T.raises(function() return gpu.range(42) end, "string expected, got number", "a non-string name raises")
  T.raises(function() return gpu.range() end, "string expected, got no value", "no name raises")
  T.raises(function() return gpu.range("x", 1) end, "name only", "an extra argument raises")
  local r = gpu.range("off")
  r:close()
  T.ok(true, "ranges work with tracing off")
end)

T.test("names are escaped in both formats", function()
  local name = 'a<b>&"c\'\n\1é'
  gpu.trace.start()
  do local _ <close> = gpu.range(name) end
  gpu.trace.stop()
  local jpath, spath = base .. "_esc.json", base .. "_esc.svg"
  T.is(gpu.trace.json(jpath), jpath, "json(path) returns the path")
  T.is(gpu.trace.svg(spath), spath, "svg(path) returns the path")
  local okp, doc = pcall(json_decode, slurp(jpath) or "")
  T.ok(okp, "the JSON parses")
  local found
  for _, e in ipairs(okp and doc.traceEvents or {}) do if e.cat == "range" then found = e.name end end
  T.is(found, name, "the name reads back exactly")
  local okx, err = pcall(xml_check, slurp(spath) or "")
  T.ok(okx, "the SVG is well-formed: " .. tostring(okx or err))
  gpu.trace.start()
  do local _ <close> = gpu.range(string.rep("x", 100)) end
  gpu.trace.stop()
  local ev = gpu.trace.events()
  T.is(#ev[1].name, 63, "a long name is cut to 63 bytes")
  os.remove(jpath)
  os.remove(spath)
end)

T.test("writer errors", function()
  T.raises(function() gpu.trace.json(42) end, "bad argument #1 to 'json' (string expected, got number)", "json(42)")
  T.raises(function() gpu.trace.svg() end, "bad argument #1 to 'svg' (string expected, got nil)", "svg()")
  T.raises(function() gpu.trace.json("/nonexistent-dir/x.json") end, "cannot write the trace", "an unwritable path")
  T.raises(function() gpu.trace.write(base .. ".txt") end, "unknown trace format '.txt'", "write() with a bad extension")
end)

-- ---- the command line -------------------------------------------------------

T.test("--trace errors", function()
  local out, ok = run("", "--device host --trace")
  T.ok(not ok and out:find("'--trace' needs argument", 1, true), "--trace without a file: " .. out:match("[^\n]*"))
  out, ok = run("", "--device host --trace " .. base .. ".txt -e 'print(1)'")
  T.ok(not ok and out:find("--trace: .*unknown trace format '%.txt' %(use a %.json or %.svg file%)"),
       "a bad extension: " .. out:match("[^\n]*"))
  T.ok(not out:find("^1\n"), "... and the script does not run")
  out, ok = run("", "--device host --trace /nonexistent-dir/t.json -e 'print(1)'")
  T.ok(not ok and out:find("cannot write the trace", 1, true), "an unwritable file: " .. out:match("[^\n]*"))
  out, ok = run("GPULUA_TRACE=" .. base .. ".bad", "--device host -e 'print(1)'")
  T.ok(not ok and out:find("GPULUA_TRACE: .*unknown trace format"), "GPULUA_TRACE with a bad extension: "
       .. out:match("[^\n]*"))
end)

T.test("t:sort and t:topk are one op each: the values come with the positions", function()
  local path = base .. "_sort.json"
  local out, ok = run("GPULUA_TRACE=" .. path, "--device host -e 'local x = gpu.tensor({3, 1, 2}); "
    .. "local v, i = x:sort(); local w, j = x:topk(2); local k = x:argsort()'")
  T.ok(ok, "exit 0: " .. out)
  local doc = select(2, pcall(json_decode, slurp(path) or ""))
  local names = {}
  for _, e in ipairs(type(doc) == "table" and doc.traceEvents or {}) do
    if e.ph == "X" and e.args.kind == "op" then names[#names + 1] = e.name end
  end
  T.is(names, { "copy H2D", "sort", "sort", "sort" }, "an upload, then one sort op per call, no gather")
  os.remove(path)
end)

T.test("GPULUA_TRACE, --trace=FILE, and a failing script", function()
  local path = base .. "_env.json"
  local out, ok = run("GPULUA_TRACE=" .. path, "--device host -e 'gpu.ones({8}):add_(1)'")
  T.ok(ok, "GPULUA_TRACE: exit 0")
  local doc = select(2, pcall(json_decode, slurp(path) or ""))
  local names = {}
  for _, e in ipairs(type(doc) == "table" and doc.traceEvents or {}) do
    if e.ph == "X" and e.args.kind == "op" then names[#names + 1] = e.name end
  end
  T.is(names, { "fill", "add" }, "the ops of -e are traced")
  os.remove(path)
  path = base .. "_fail.json"
  out, ok = run("", "--device host --trace=" .. path .. " -e 'gpu.sleep(5); gpu.ones({8}); error(\"stop here\")'")
  T.ok(not ok and out:find("stop here", 1, true), "a failing script exits 1 with its error")
  doc = select(2, pcall(json_decode, slurp(path) or ""))
  names = {}
  for _, e in ipairs(type(doc) == "table" and doc.traceEvents or {}) do
    if e.ph == "X" and e.args.kind == "op" then names[#names + 1] = e.name end
  end
  T.is(names, { "sleep", "fill" }, "its trace is written anyway, with the work it queued")
  os.remove(path)
end)

T.test("--trace under -n 2: a file per rank", function()
  local path = base .. "_ranks.json"
  local out, ok = run("", "-n 2 --no-prefix --device host --trace " .. path .. " -e 'gpu.all_reduce(gpu.ones({64}))'")
  T.ok(ok, "-n 2 --trace exits 0")
  if not ok then T.diag(out) end
  for r = 0, 1 do
    local p = base .. "_ranks.rank" .. r .. ".json"
    local doc = select(2, pcall(json_decode, slurp(p) or ""))
    local coll, pname
    for _, e in ipairs(type(doc) == "table" and doc.traceEvents or {}) do
      if e.ph == "X" and e.cat == "collective" then coll = e end
      if e.ph == "M" and e.name == "process_name" then pname = e.args.name end
    end
    T.ok(coll and coll.name == "all_reduce" and coll.args.bytes == 256, "rank " .. r .. ": all_reduce on its stream")
    T.ok(pname and pname:find("rank " .. r, 1, true), "rank " .. r .. ": the process is named by rank")
    T.is(doc and doc.traceEvents and doc.traceEvents[1].pid, r + 1, "rank " .. r .. ": pid is the rank + 1")
    os.remove(p)
  end
  T.ok(slurp(path) == nil, "no shared file")
end)

os.remove(script_path)
os.remove(base)
T.done()
