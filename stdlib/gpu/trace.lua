-- gpu.trace: a timeline of what a run did, to look at.  Also reachable as
-- gpu.trace without a require (the table loads this module on first use).
--
--   gpu.trace.start{max_events = n}    -- a new session (records of the last one are dropped)
--   gpu.trace.stop()                   -- new work is no longer recorded
--   gpu.trace.active()                 -- true while recording
--   gpu.trace.events()                 -- the records as a list (synchronizes first)
--   gpu.trace.json(path)               -- Chrome trace event JSON (Perfetto, chrome://tracing)
--   gpu.trace.svg(path)                -- the same timeline as an SVG picture
--   gpu.trace.write(path)              -- json or svg, by the extension
--
-- The device layer records (cuda/trace.c, bindings/trace.c); the writers are
-- here, in Lua: they are string work (escaping, layout) that Lua does safely
-- and briefly, they run once per trace rather than per op, they read the
-- same tables as gpu.trace.events(), and they stream the records in chunks,
-- so a long trace is never held twice.
local gpu = require "gpu"

local M = gpu.trace
local collect, slice = M._collect, M._slice
local CHUNK = 4096
local io_open = io and io.open

-- the session's records, chunk by chunk, in order of start
local function each_event(info, fn)
  for first = 1, info.records, CHUNK do
    for _, e in ipairs(slice(first, CHUNK)) do fn(e) end
  end
end

local function stream_label(s)
  if s.default then return "default stream" end
  local extra = {}
  if s.priority ~= "normal" then extra[#extra + 1] = s.priority .. " priority" end
  if s.nonblocking then extra[#extra + 1] = "nonblocking" end
  local name = "stream " .. s.id
  if #extra > 0 then name = name .. " (" .. table.concat(extra, ", ") .. ")" end
  return name
end

-- info.streams by id, each named; by_id[id] for every stream an event names
local function tracks(info)
  local list, by_id = {}, {}
  for _, s in ipairs(info.streams) do
    s.name = stream_label(s)
    list[#list + 1] = s
    by_id[s.id] = s
  end
  table.sort(list, function(a, b) return a.id < b.id end)
  return list, by_id
end

local function check_path(path, fname)
  if type(path) ~= "string" then
    error(string.format("bad argument #1 to '%s' (string expected, got %s)", fname, type(path)), 3)
  end
  if path:find("\0", 1, true) then
    error(string.format("bad argument #1 to '%s' (a string with a zero byte)", fname), 3)
  end
end

local function open_out(path, fname)
  if not io_open then error("gpu.trace." .. fname .. " needs the io library", 3) end
  local f, err = io_open(path, "w")
  if not f then error(string.format("gpu.trace.%s: cannot write the trace: %s", fname, err), 3) end
  return f
end

local function close_out(f, path, fname, ok, err)
  local cok, cerr = f:close()
  if not ok then error(string.format("gpu.trace.%s: writing %s failed: %s", fname, path, tostring(err)), 3) end
  if not cok then error(string.format("gpu.trace.%s: writing %s failed: %s", fname, path, tostring(cerr)), 3) end
end

function M.events()
  local info = collect(true, "events")
  local list = {}
  each_event(info, function(e) list[#list + 1] = e end)
  list.streams = tracks(info)
  list.dropped, list.duration, list.backend = info.dropped, info.duration, info.backend
  return list
end

-- ---- JSON ------------------------------------------------------------------

local JESC = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }

local function jstr(s)
  s = tostring(s)
  if not utf8.len(s) then s = s:gsub("[\128-\255]", "?") end
  return '"' .. s:gsub('[%c"\\]', function(c) return JESC[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local function jnum(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  return string.format("%.3f", v)
end

local function process_name(info)
  local who = gpu.world_size and gpu.world_size > 1 and ("rank " .. gpu.rank .. " ") or ""
  return string.format("gpulua %s(%s backend)", who, info.backend)
end

local function write_json(path, counted, call)
  local f = open_out(path, "json")
  local info = collect(counted, call or "json")
  local list, by_id = tracks(info)
  -- pid = rank + 1, tid = 1 for the host, stream id + 2: Perfetto takes
  -- pid and tid 0 for the kernel's idle task
  local pid = (gpu.rank or 0) + 1
  local function tid_of(e) return e.stream and e.stream + 2 or 1 end
  local ok, err = pcall(function()
    f:write('{"displayTimeUnit":"ms","otherData":{"generator":"gpulua","backend":', jstr(info.backend),
            ',"duration_us":', jnum(info.duration), ',"dropped":', jnum(info.dropped),
            ',"max_events":', jnum(info.max), '},\n"traceEvents":[\n')
    local sep = ""
    local function meta(name, tid, args)
      f:write(sep, '{"name":', jstr(name), ',"ph":"M","pid":', pid, ',"tid":', tid, ',"args":{', args, '}}')
      sep = ",\n"
    end
    meta("process_name", 1, '"name":' .. jstr(process_name(info)))
    meta("thread_name", 1, '"name":"host"')
    meta("thread_sort_index", 1, '"sort_index":0')
    for i, s in ipairs(list) do
      meta("thread_name", s.id + 2, '"name":' .. jstr(s.name))
      meta("thread_sort_index", s.id + 2, '"sort_index":' .. i)
    end
    local named = {}
    each_event(info, function(e)
      if e.stream and not by_id[e.stream] and not named[e.stream] then
        named[e.stream] = true
        meta("thread_name", e.stream + 2, '"name":"stream ' .. e.stream .. '"')
      end
      local args = { '"site":' .. jstr(e.site) }
      if e.kind ~= "sync" and e.kind ~= "range" then args[#args + 1] = '"bytes":' .. jnum(e.bytes) end
      if e.stream then args[#args + 1] = '"stream":' .. jnum(e.stream) end
      if e.copy then args[#args + 1] = '"copy":' .. jstr(e.copy) end
      if e.call then args[#args + 1] = '"call":' .. jstr(e.call) end
      if e.depth then args[#args + 1] = '"depth":' .. jnum(e.depth) end
      args[#args + 1] = '"kind":' .. jstr(e.kind)
      f:write(sep, '{"name":', jstr(e.name), ',"cat":', jstr(e.cat), ',"ph":"X","ts":', jnum(e.ts),
              ',"dur":', jnum(e.dur), ',"pid":', pid, ',"tid":', tid_of(e), ',"args":{',
              table.concat(args, ","), '}}')
      sep = ",\n"
    end)
    f:write("\n]}\n")
  end)
  close_out(f, path, "json", ok, err)
  return path
end

-- ---- SVG -------------------------------------------------------------------

local COLORS = {
  h2d = "#4e79a7", d2h = "#59a14f", d2d = "#76b7b2", h2h = "#a0a0a0", compute = "#f28e2b",
  collective = "#b07aa1", sync = "#e15759", range = "#edc948",
}
local LEGEND = {
  { "h2d", "copy H2D" }, { "d2h", "copy D2H" }, { "d2d", "copy D2D" }, { "h2h", "copy H2H" },
  { "compute", "compute" }, { "collective", "collective" }, { "sync", "sync (host waits)" },
  { "range", "gpu.range" },
}
local XESC = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&apos;" }

-- text or attribute value: escaped, no control characters XML 1.0 forbids
local function xml(s)
  s = tostring(s)
  if not utf8.len(s) then s = s:gsub("[\128-\255]", "?") end
  s = s:gsub("[\0-\8\11\12\14-\31\127]", "?")
  return (s:gsub("[&<>\"']", XESC))
end

local function fmt_bytes(n)
  if n >= 1 << 30 then return string.format("%.1f GiB", n / (1 << 30)) end
  if n >= 1 << 20 then return string.format("%.1f MiB", n / (1 << 20)) end
  if n >= 1 << 10 then return string.format("%.1f KiB", n / (1 << 10)) end
  return n .. " B"
end

local function fmt_dur(us)
  if us >= 1e6 then return string.format("%.3f s", us / 1e6) end
  if us >= 1e3 then return string.format("%.3f ms", us / 1e3) end
  return string.format("%.3f µs", us)
end

local function nice_step(span, n)
  local raw = span / n
  local mag = 10 ^ math.floor(math.log(raw, 10))
  for _, m in ipairs { 1, 2, 5 } do
    if m * mag >= raw * (1 - 1e-9) then return m * mag end
  end
  return 10 * mag
end

local function tick_label(us, step)
  if step >= 1e6 then return string.format("%g s", us / 1e6) end
  if step >= 1e3 then return string.format("%g ms", us / 1e3) end
  return string.format("%g µs", us)
end

local function color_key(e) return e.copy or e.cat end

local function write_svg(path, counted, call)
  local f = open_out(path, "svg")
  local info = collect(counted, call or "svg")
  local list, by_id = tracks(info)
  -- the time span, the range depth, and streams named only by events
  local tmax, depth = info.duration, -1
  each_event(info, function(e)
    if e.ts + e.dur > tmax then tmax = e.ts + e.dur end
    if e.depth and e.depth > depth then depth = e.depth end
    if e.stream and not by_id[e.stream] then
      by_id[e.stream] = { id = e.stream, name = "stream " .. e.stream }
      list[#list + 1] = by_id[e.stream]
    end
  end)
  table.sort(list, function(a, b) return a.id < b.id end)
  if tmax <= 0 then tmax = 1 end
  local W, LABEL, RIGHT, TOP, ROW, PAD = 1200, 200, 30, 44, 22, 8
  local PW = W - LABEL - RIGHT
  local function x(t) return LABEL + t / tmax * PW end
  -- lanes: the host (a row per range depth, then one for syncs and host-run ops), then each stream
  local host_rows = 1 + (depth + 1)
  local y, lane_y = TOP, {}
  local lanes = { { key = "host", name = "host", rows = host_rows } }
  for _, s in ipairs(list) do lanes[#lanes + 1] = { key = s.id, name = s.name, rows = 1 } end
  for _, l in ipairs(lanes) do
    l.y = y
    l.h = l.rows * ROW + PAD
    lane_y[l.key] = l
    y = y + l.h
  end
  local plot_bottom = y
  local H = plot_bottom + 56
  local ok, err = pcall(function()
    local w = function(...) f:write(...) end
    w('<?xml version="1.0" encoding="UTF-8"?>\n')
    w(string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
                    .. 'font-family="sans-serif" font-size="11">\n', W, H, W, H))
    w("<title>", xml(string.format("%s: %d events over %s%s", process_name(info), info.records,
                                   fmt_dur(tmax), info.dropped > 0 and (", " .. info.dropped .. " dropped") or "")),
      "</title>\n")
    w(string.format('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>\n', W, H))
    -- the time axis: ticks and grid lines
    w('<g class="axis" stroke="#d0d0d0">\n')
    local step = nice_step(tmax, 8)
    local t = 0
    while t <= tmax * (1 + 1e-9) do
      local tx = x(t)
      w(string.format('<line x1="%.2f" y1="%d" x2="%.2f" y2="%d"/>\n', tx, TOP - 6, tx, plot_bottom))
      w(string.format('<text x="%.2f" y="%d" text-anchor="middle" stroke="none" fill="#333333">%s</text>\n',
                      tx, TOP - 10, xml(tick_label(t, step))))
      t = t + step
    end
    w(string.format('<text x="%d" y="%d" stroke="none" fill="#333333" font-weight="bold">time</text>\n',
                    8, TOP - 10))
    w("</g>\n")
    -- lane backgrounds and labels
    for i, l in ipairs(lanes) do
      w(string.format('<g class="lane" data-track="%s">\n', xml(l.name)))
      w(string.format('<rect class="lane-bg" x="%d" y="%d" width="%d" height="%d" fill="%s"/>\n', 0, l.y, W,
                      l.h, i % 2 == 1 and "#f6f6f6" or "#ececec"))
      w(string.format('<text x="%d" y="%.1f" fill="#222222">%s</text>\n', 8, l.y + l.h / 2 + 4, xml(l.name)))
      w("</g>\n")
    end
    -- one box per event
    w('<g class="events" stroke="#333333" stroke-width="0.3">\n')
    each_event(info, function(e)
      local l = lane_y[e.stream or "host"]
      local row = e.kind == "range" and e.depth or (l.key == "host" and depth + 1 or 0)
      local bx = x(e.ts)
      local bw = math.max(x(e.ts + e.dur) - bx, 0.5)
      local by = l.y + PAD / 2 + row * ROW + 2
      local bh = ROW - 4
      local key = color_key(e)
      local tip = { e.name }
      tip[#tip + 1] = (e.copy and ("copy " .. e.copy:upper()) or e.cat) .. ", " .. fmt_dur(e.dur)
                      .. " at " .. fmt_dur(e.ts)
      if e.kind ~= "sync" and e.kind ~= "range" and e.bytes > 0 then tip[#tip + 1] = fmt_bytes(e.bytes) end
      if e.site ~= "" then tip[#tip + 1] = e.site end
      if e.call then tip[#tip + 1] = "in " .. e.call end
      tip[#tip + 1] = e.stream and (by_id[e.stream].name) or "host"
      w(string.format('<rect class="ev %s" x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"%s><title>%s</title></rect>\n',
                      key, bx, by, bw, bh, COLORS[key] or "#888888",
                      e.kind == "range" and ' fill-opacity="0.6"' or "", xml(table.concat(tip, "\n"))))
      if bw > #e.name * 6.5 + 6 then
        w(string.format('<text x="%.2f" y="%d" fill="#111111" stroke="none" pointer-events="none">%s</text>\n',
                        bx + 3, by + bh - 5, xml(e.name)))
      end
    end)
    w("</g>\n")
    -- legend
    w('<g class="legend">\n')
    local lx, ly = LABEL, plot_bottom + 24
    for _, item in ipairs(LEGEND) do
      w(string.format('<rect x="%d" y="%d" width="12" height="12" fill="%s" stroke="#333333" stroke-width="0.3"/>\n',
                      lx, ly - 10, COLORS[item[1]]))
      w(string.format('<text x="%d" y="%d" fill="#222222">%s</text>\n', lx + 16, ly, xml(item[2])))
      lx = lx + 16 + #item[2] * 6 + 22
    end
    if info.dropped > 0 then
      w(string.format('<text x="%d" y="%d" fill="#b00000">%s</text>\n', LABEL, ly + 20,
                      xml(info.dropped .. " events dropped (over max_events)")))
    end
    w("</g>\n</svg>\n")
  end)
  close_out(f, path, "svg", ok, err)
  return path
end

-- ---- by file name --------------------------------------------------------------

local WRITERS = { json = write_json, svg = write_svg }

local function format_of(path)
  local ext = path:match("%.([%w]+)$")
  local fmt = ext and WRITERS[ext:lower()] and ext:lower()
  if not fmt then
    return nil, string.format("unknown trace format %s (use a .json or .svg file)",
                              ext and ("'." .. ext .. "'") or "(no extension)")
  end
  return fmt
end

function M.json(path)
  check_path(path, "json")
  return write_json(path, true)
end

function M.svg(path)
  check_path(path, "svg")
  return write_svg(path, true)
end

function M.write(path)
  check_path(path, "write")
  local fmt, err = format_of(path)
  if not fmt then error("gpu.trace.write: " .. path .. ": " .. err, 2) end
  return WRITERS[fmt](path, true, "write")
end

-- For `gpulua --trace FILE` (and GPULUA_TRACE): check the file can be
-- written before the script runs, and start.  With several ranks each
-- writes its own file: out.json -> out.rank1.json.
function M._cli_start(path)
  local fmt, err = format_of(path)
  if not fmt then error(path .. ": " .. err, 0) end
  if gpu.world_size and gpu.world_size > 1 then
    path = path:gsub("(%.[%w]+)$", ".rank" .. gpu.rank .. "%1")
  end
  -- not `io_open and io_open(...)`: an `and` keeps only io.open's first
  -- result, and its message (the OS error) would be lost
  local f, oerr = nil, "the io library is not loaded"
  if io_open then f, oerr = io_open(path, "w") end
  if not f then error("cannot write the trace: " .. tostring(oerr), 0) end
  f:close()
  M.start()
  return path
end

-- At exit, after the script's queued work (even when it failed): a quiet
-- wait, not a counted sync, then the file.
function M._cli_finish(path)
  local fmt = assert(format_of(path))
  return WRITERS[fmt](path, false)
end

return M
