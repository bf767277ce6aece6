-- The documentation checked against the program (issue 33):
--   * every ```lua block of docs/tutorial.md, and the README's example, runs
--     in a child gpulua on the host backend and does what the text says;
--   * docs/lua-api.md documents exactly the names the gpu module and its
--     objects export, and the index in docs/README.md links every one;
--   * every relative link and #anchor in README.md and docs/*.md resolves;
--   * README.md stays a front page.
--
-- Fences of the tutorial: ```lua runs a block as a whole script under
-- `gpulua --device host`; ```lua ranks=N under `gpulua -n N --device host`;
-- ```lua error must fail.  An ```output block right after a block is its
-- exact stdout (for ranks, its lines in any order); an ```error block is
-- text its error output must contain.
--
-- The reference's names: a `###` heading whose text is a signature
-- ("t:add(x [, opts])", several joined by " · "), or a table row whose
-- first cell holds signatures in code spans (`t:exp([opts])`, `s.priority`).
-- `build/gpulua tests/docs.lua --index` prints the function index that
-- docs/README.md must hold between its index markers.
local gpu = require "gpu"
local T = require "gpu.test"

local INDEX_MODE = arg and arg[1] == "--index"

-- Names exported on purpose without an entry in docs/lua-api.md.
local UNDOCUMENTED = {
  ["gpu.trace._collect"] = "private: gpu.trace's Lua half reads the C recorder through it",
  ["gpu.trace._slice"] = "private: as _collect",
  ["gpu.trace._cli_start"] = "private: `gpulua --trace FILE` starts its session through it",
  ["gpu.trace._cli_finish"] = "private: `gpulua --trace FILE` writes FILE through it at exit",
}
-- Names documented that a plain script cannot see.
local NOT_EXPORTED = {
  ["gpu.kernels"] = "exists once an embedding application calls gpulua_register_kernel",
}
-- Files that other branches of issue 33 add; a link to one is not dead.
local PENDING = {
  ["LICENSE"] = true, ["CHANGELOG.md"] = true,
  ["docs/editors.md"] = true, ["docs/gpulua.1"] = true,
}

local function readfile(path)
  local s = T.readfile(path)
  if not s then error("cannot read " .. path .. " (run from the repository's root)", 2) end
  return s
end

-- ---- markdown --------------------------------------------------------------------

-- The lines of a markdown file, each {text =, code = (inside a fence),
-- fence = info string of an opening fence line}.
local function md_lines(src)
  local lines, infence = {}, false
  for text in (src .. "\n"):gmatch("(.-)\n") do
    local l = { text = text }
    local info = text:match("^```(.*)$")
    if info then
      if infence then l.close = true; infence = false
      else l.fence = info; infence = true end
    elseif infence then
      l.code = true
    end
    lines[#lines + 1] = l
  end
  return lines
end

-- GitHub's heading anchors: lowercase, punctuation dropped, spaces to '-',
-- a repeated anchor gets -1, -2 ...
local DROP_UTF8 = { "·", "—", "–", "→", "×", "…", "≥", "≤", "µ" }
local function slug(heading)
  local s = heading:lower():gsub("`", "")
  for _, u in ipairs(DROP_UTF8) do s = s:gsub(u, "") end
  s = s:gsub("[^%w%s%-_\128-\255]", ""):gsub(" ", "-")
  return s
end

-- Headings of a file (outside fences): a list of {level, text, anchor, line}
-- and the set of anchors.
local function headings(lines)
  local list, set, seen = {}, {}, {}
  for i, l in ipairs(lines) do
    if not l.code and not l.fence and not l.close then
      local hashes, text = l.text:match("^(#+)%s+(.-)%s*$")
      if hashes then
        local a = slug(text)
        if seen[a] then
          seen[a] = seen[a] + 1
          a = a .. "-" .. seen[a]
        else
          seen[a] = 0
        end
        list[#list + 1] = { level = #hashes, text = text, anchor = a, line = i }
        set[a] = true
      end
    end
  end
  return list, set
end

-- The code blocks of a file: {info =, body =, line =}.
local function blocks(lines)
  local list, cur = {}, nil
  for i, l in ipairs(lines) do
    if l.fence then cur = { info = l.fence, body = {}, line = i }
    elseif l.close and cur then
      cur.body = table.concat(cur.body, "\n")
      list[#list + 1] = cur
      cur = nil
    elseif cur then
      cur.body[#cur.body + 1] = l.text
    end
  end
  return list
end

-- ---- the reference's names -------------------------------------------------------

-- What an object's name in a signature stands for.
local OBJECTS = {
  t = "gpu.Tensor", s = "gpu.Stream", ev = "gpu.Event", g = "gpu.Graph",
  task = "gpu.Task", k = "gpu.Kernel", r = "gpu.range",
}

-- The qualified name a signature documents ("gpu.Tensor:add", "gpu.trace.start",
-- "gpu.empty", "pipeline.run", "T.is"), or nil when it is none.
local function sig_name(sig)
  sig = sig:gsub("^%s+", "")
  local n = sig:match("^gpu%.trace%.([%a_][%w_]*)")
  if n then return "gpu.trace." .. n end
  n = sig:match("^gpu%.([%a_][%w_]*)")
  if n then return "gpu." .. n end
  n = sig:match("^pipeline%.([%a_][%w_]*)")
  if n then return "pipeline." .. n end
  n = sig:match("^T%.([%a_][%w_]*)")
  if n then return "T." .. n end
  n = sig:match("^dist%.([%a_][%w_]*)")
  if n then return "dist." .. n end
  n = sig:match("^lay:([%a_][%w_]*)")
  if n then return "dist.Layout:" .. n end
  n = sig:match("^red:([%a_][%w_]*)")
  if n then return "dist.Reducer:" .. n end
  local obj, sep, m = sig:match("^(%a+)([:.])([%a_][%w_]*)")
  if obj and OBJECTS[obj] then return OBJECTS[obj] .. sep .. m end
  return nil
end

-- Every name docs/lua-api.md documents: a list of {name =, anchor =, line =}
-- (in file order) and a map name -> entry.
local function documented(path)
  local lines = md_lines(readfile(path))
  local hs = headings(lines)
  local byline = {}
  for _, h in ipairs(hs) do byline[h.line] = h end
  local list, map, current = {}, {}, nil
  local function add(name, line)
    if name and not map[name] then
      local e = { name = name, anchor = current and current.anchor, line = line }
      list[#list + 1] = e
      map[name] = e
    end
  end
  for i, l in ipairs(lines) do
    local h = byline[i]
    if h then
      current = h
      if h.level == 3 then
        for part in (h.text .. " · "):gmatch("(.-) · ") do add(sig_name(part), i) end
      end
    elseif not l.code and l.text:match("^|") and not l.text:match("^|%s*%-") then
      local first = l.text:match("^|([^|]*)|")
      for span in (first or ""):gmatch("`([^`]+)`") do add(sig_name(span), i) end
    end
  end
  return list, map
end

-- ---- what the module exports -----------------------------------------------------

-- The names of a table's string keys, as "prefix" .. key.
local function keys_of(t, prefix, out, skip)
  for k in pairs(t) do
    if type(k) == "string" and not (skip and skip[k]) then out[#out + 1] = prefix .. k end
  end
end

-- The field names a C __index getter answers: strcmp(k, "name") in its body.
local function c_fields(file, fn)
  local src = readfile(file)
  local body = src:match("\nstatic int " .. fn .. "%(lua_State %*L%) {\n(.-)\n}\n")
  assert(body, "no function " .. fn .. " in " .. file)
  local out = {}
  for name in body:gmatch('strcmp%(%a+, "([%w_]+)"%)') do out[#out + 1] = name end
  assert(#out > 0, "no fields found in " .. fn .. " of " .. file)
  return out
end

local FIELD_GETTERS = {
  ["gpu.Tensor"] = { "bindings/tensor.c", "t_fields" },
  ["gpu.Stream"] = { "bindings/stream.c", "stream_fields" },
  ["gpu.Event"] = { "bindings/event.c", "event_fields" },
  ["gpu.Graph"] = { "bindings/graph.c", "graph_fields" },
  ["gpu.Task"] = { "bindings/task.c", "task_fields" },
  ["gpu.Kernel"] = { "bindings/kernel.c", "kernel_fields" },
}

-- Every name the module exports, qualified as sig_name qualifies them.
-- Makes one object of each type (closed before it returns).
local function exported()
  local out = {}
  require "gpu.trace"   -- gpu.trace's writers come from its Lua half, loaded on first use
  keys_of(gpu, "gpu.", out, { trace = true })
  keys_of(gpu.trace, "gpu.trace.", out)
  keys_of(require "gpu.pipeline", "pipeline.", out)
  keys_of(T, "T.", out)
  local dist = require "gpu.dist"
  keys_of(dist, "dist.", out)
  keys_of(getmetatable(dist.layout({ { { 1 } } })), "dist.Layout:", out, { __index = true })
  local red = dist.reducer()
  keys_of(getmetatable(red), "dist.Reducer:", out, { __index = true })
  red.stream:close()
  local t = gpu.zeros({2})
  local s = gpu.stream()
  local ev = gpu.event()
  local g = gpu.graph(function() t:add_(1) end)
  local task = gpu.task(function() return 1 end)
  gpu.run()
  local r = gpu.range("docs")
  local m = gpu.compile([[extern "C" __global__ void k(float *x) { x[threadIdx.x] = 1; }]])
  local objects = { ["gpu.Tensor"] = t, ["gpu.Stream"] = s, ["gpu.Event"] = ev, ["gpu.Graph"] = g,
                    ["gpu.Task"] = task, ["gpu.range"] = r, ["gpu.Kernel"] = m.k }
  for ty, obj in pairs(objects) do
    local mt = getmetatable(obj)
    T.ok(type(mt) == "table" and type(mt.__methods) == "table", ty .. " lists its methods in __methods")
    keys_of(mt.__methods or {}, ty .. ":", out)
    local getter = FIELD_GETTERS[ty]
    if getter then
      for _, f in ipairs(c_fields(getter[1], getter[2])) do
        -- a kernel's close is read through its getter, but it is a method
        out[#out + 1] = ty .. ((mt.__methods[f] or f == "close") and ":" or ".") .. f
      end
    end
  end
  r:close(); g:close(); ev:close(); s:close(); t:close(); m.k:close()
  table.sort(out)
  return out
end

-- "gpu.Tensor:add" and "gpu.Tensor.add" are the same name for the comparison.
local function plain(name) return (name:gsub("^(gpu%.%u%a*):", "%1.")) end

-- ---- the function index ----------------------------------------------------------

local GROUPS = {
  { "The gpu module", "^gpu%.[%a_][%w_]*$" },
  { "gpu.trace", "^gpu%.trace%." },
  { "gpu.Tensor", "^gpu%.Tensor" }, { "gpu.Stream", "^gpu%.Stream" },
  { "gpu.Event", "^gpu%.Event" }, { "gpu.Graph", "^gpu%.Graph" },
  { "gpu.Task", "^gpu%.Task" }, { "gpu.Kernel", "^gpu%.Kernel" },
  { "ranges (gpu.range)", "^gpu%.range[:.]" },
  { "gpu.pipeline", "^pipeline%." }, { "gpu.dist", "^dist[.:]" }, { "gpu.test", "^T%." },
}
local SHOWN = { ["gpu.Tensor"] = "t", ["gpu.Stream"] = "s", ["gpu.Event"] = "ev", ["gpu.Graph"] = "g",
                ["gpu.Task"] = "task", ["gpu.Kernel"] = "k", ["gpu.range"] = "r" }

-- The index docs/README.md holds: every documented name, by group,
-- alphabetically, each a link to its entry.
local function make_index(list)
  local out = { "<!-- index start: generated by `build/gpulua tests/docs.lua --index` -->" }
  local placed = {}
  for _, grp in ipairs(GROUPS) do
    local names = {}
    for _, e in ipairs(list) do
      if not placed[e.name] and e.name:match(grp[2]) then
        names[#names + 1] = e
        placed[e.name] = true
      end
    end
    table.sort(names, function(a, b) return a.name < b.name end)
    if #names > 0 then
      local items = {}
      for _, e in ipairs(names) do
        local shown = e.name:gsub("^(gpu%.%u%a*)([:.])", function(ty, sep) return SHOWN[ty] .. sep end)
        shown = shown:gsub("^(gpu%.range)([:.])", function(ty, sep) return SHOWN[ty] .. sep end)
        shown = shown:gsub("^pipeline%.", "pipeline.")
        shown = shown:gsub("^dist%.Layout:", "lay:"):gsub("^dist%.Reducer:", "red:")
        items[#items + 1] = string.format("[`%s`](lua-api.md#%s)", shown, e.anchor)
      end
      out[#out + 1] = ""
      out[#out + 1] = "**" .. grp[1] .. "**: " .. table.concat(items, " · ")
    end
  end
  for _, e in ipairs(list) do
    assert(placed[e.name], "no index group for " .. e.name)
  end
  out[#out + 1] = ""
  out[#out + 1] = "<!-- index end -->"
  return table.concat(out, "\n")
end

if INDEX_MODE then
  io.write(make_index((documented("docs/lua-api.md"))), "\n")
  os.exit(0)
end

-- ---- running blocks ----------------------------------------------------------------

-- Runs a Lua chunk in a child gpulua; returns stdout, stderr, exit status.
local function run_chunk(body, ranks)
  local script = T.tmpfile(body .. "\n")
  local errf = os.tmpname()
  local launcher = ranks and string.format("-n %d --no-prefix ", ranks) or ""
  -- the blocks show the defaults: no sync or race policy from the suite's environment
  local cmd = string.format("env -u GPULUA_SYNC_DEBUG -u GPULUA_CHECK -u GPULUA_TRACE timeout 60 %s %s--device host %s 2>%s",
                            T.gpulua, launcher, script, errf)
  local out, code = T.sh(cmd)
  local err = T.readfile(errf) or ""
  os.remove(script)
  os.remove(errf)
  return out, err, code
end

local function sorted_lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  table.sort(t)
  return t
end

T.test("every lua block of docs/tutorial.md runs as the text says", function()
  local bl = blocks(md_lines(readfile("docs/tutorial.md")))
  local ran = 0
  for i, b in ipairs(bl) do
    local lang, opts = b.info:match("^(%S*)%s*(.*)$")
    if lang == "lua" then
      ran = ran + 1
      local ranks = tonumber(opts:match("ranks=(%d+)"))
      local fails = opts:match("%f[%w]error%f[%W]") ~= nil
      local nextb = bl[i + 1]
      local want_out = nextb and nextb.info == "output" and nextb.body or nil
      local want_err = nextb and nextb.info == "error" and nextb.body or nil
      local where = string.format("docs/tutorial.md:%d", b.line)
      local clock = gpu.clock()
      local out, err, code = run_chunk(b.body, ranks)
      local secs = gpu.clock() - clock
      if fails then
        T.ok(code ~= 0, where .. ": the block fails, as it shows")
        T.ok(want_err ~= nil, where .. ": an ```error block follows it")
        if want_err then
          T.ok(err:find(want_err, 1, true) ~= nil, where .. ": with the error shown: " .. want_err)
        end
      else
        T.is(code, 0, where .. " runs")
        if code ~= 0 then T.diag(err) end
        if want_out then
          if ranks then
            T.is(sorted_lines(out), sorted_lines(want_out .. "\n"), where .. ": its output, in any order")
          else
            T.is(out, want_out .. "\n", where .. ": its output as shown")
          end
        end
      end
      -- quick: under 2 s each on the 2-core machine the suite was written on
      T.ok(secs < 10, string.format("%s: in %.2f s", where, secs))
    end
  end
  T.ok(ran >= 10, "the tutorial has its blocks (" .. ran .. ")")
end)

T.test("the README's example runs", function()
  local n = 0
  for _, b in ipairs(blocks(md_lines(readfile("README.md")))) do
    if b.info == "lua" then
      n = n + 1
      local out, err, code = run_chunk(b.body)
      T.is(code, 0, "README.md:" .. b.line .. " runs")
      if code ~= 0 then T.diag(err) end
      T.ok(out:find("8 batches on host: total 5242880", 1, true) ~= nil, "... and prints its total")
    end
  end
  T.is(n, 1, "the README has one example")
end)

T.test("every lua block of the docs is Lua", function()
  local files = { "README.md", "docs/lua-api.md", "docs/tutorial.md", "docs/interop.md", "docs/cli.md" }
  for _, f in ipairs(files) do
    for _, b in ipairs(blocks(md_lines(readfile(f)))) do
      if b.info:match("^lua") then
        local fn, err = load(b.body, "=" .. f .. ":" .. b.line)
        T.ok(fn ~= nil, f .. ":" .. b.line .. " parses" .. (fn and "" or (": " .. err)))
      end
    end
  end
end)

-- ---- the reference ---------------------------------------------------------------

T.test("docs/lua-api.md documents exactly what the module exports", function()
  local list, map = documented("docs/lua-api.md")
  local have, doc = {}, {}
  for _, n in ipairs(exported()) do have[plain(n)] = n end
  for _, e in ipairs(list) do doc[plain(e.name)] = e end
  local missing, extra, stale = {}, {}, {}
  for p, n in pairs(have) do
    if not doc[p] and not UNDOCUMENTED[n] then missing[#missing + 1] = n end
  end
  for p, e in pairs(doc) do
    if not have[p] and not NOT_EXPORTED[e.name] then
      extra[#extra + 1] = e.name .. " (docs/lua-api.md:" .. e.line .. ")"
    end
  end
  for n in pairs(UNDOCUMENTED) do
    if not have[plain(n)] then stale[#stale + 1] = n .. " is listed as undocumented but does not exist" end
    if doc[plain(n)] then stale[#stale + 1] = n .. " is listed as undocumented but is documented" end
  end
  for n in pairs(NOT_EXPORTED) do
    if have[plain(n)] then stale[#stale + 1] = n .. " is listed as not exported but is" end
  end
  table.sort(missing); table.sort(extra); table.sort(stale)
  T.is(missing, {}, "every exported name has an entry")
  T.is(extra, {}, "every entry names something that exists")
  T.is(stale, {}, "the lists of exceptions are exact")
  T.ok(#list > 200, "the reference's names were found (" .. #list .. ")")
  T.ok(map["gpu.Tensor:zero_"] ~= nil, "t:zero_ is documented")
  local api = readfile("docs/lua-api.md")
  for _, syn in ipairs { "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64" } do
    T.ok(api:find("`" .. syn .. "`", 1, true) ~= nil, "the dtype synonym " .. syn .. " is documented")
    local ok = pcall(gpu.zeros, { 1 }, { dtype = syn })
    T.ok(ok, "... and accepted")
  end
end)

T.test("the index links every function to its entry", function()
  local list = documented("docs/lua-api.md")
  local want = make_index(list)
  local index = readfile("docs/README.md")
  local s = index:find("<!-- index start", 1, true)
  local e = select(2, index:find("<!-- index end -->", 1, true))
  T.ok(s and e, "docs/README.md has the index markers")
  local got = s and e and index:sub(s, e) or ""
  T.ok(got == want, "docs/README.md's index is current (regenerate: build/gpulua tests/docs.lua --index)")
  if got ~= want then
    -- the links one has and the other lacks
    local function items(s)
      local set = {}
      for item in s:gmatch("%[`[^`]+`%]%([^)]+%)") do set[item] = true end
      return set
    end
    local gi, wi = items(got), items(want)
    for item in pairs(wi) do if not gi[item] then T.diag("the index lacks " .. item) end end
    for item in pairs(gi) do if not wi[item] then T.diag("the index should not have " .. item) end end
  end
end)

-- ---- links -----------------------------------------------------------------------

local function docs_files()
  local files = { "README.md" }
  local p = assert(io.popen("ls docs/*.md 2>/dev/null"))
  for f in p:lines() do files[#files + 1] = f end
  p:close()
  return files
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

local function normalize(path)
  local parts = {}
  for seg in path:gmatch("[^/]+") do
    if seg == ".." then table.remove(parts) elseif seg ~= "." then parts[#parts + 1] = seg end
  end
  return table.concat(parts, "/")
end

T.test("no dead links or anchors in README.md and docs/", function()
  local files = docs_files()
  T.ok(#files >= 8, "the docs are there (" .. #files .. " files)")
  local anchors = {}
  local function anchors_of(path)
    if not anchors[path] then
      local _, set = headings(md_lines(readfile(path)))
      anchors[path] = set
    end
    return anchors[path]
  end
  local dead, pending, nlinks = {}, {}, 0
  for _, f in ipairs(files) do
    local dir = f:match("^(.*)/") or ""
    for i, l in ipairs(md_lines(readfile(f))) do
      if not l.code and not l.fence then
        local text = l.text:gsub("``.-``", ""):gsub("`[^`]*`", "")
        for target in text:gmatch("%]%(([^)%s]+)%)") do
          if not target:match("^%a+:") then
            nlinks = nlinks + 1
            local path, anchor = target:match("^([^#]*)#?(.*)$")
            local full = path == "" and f or normalize((dir ~= "" and dir .. "/" or "") .. path)
            local where = string.format("%s:%d: %s", f, i, target)
            if not exists(full) then
              if PENDING[full] then pending[full] = true else dead[#dead + 1] = where .. " (no such file)" end
            elseif anchor ~= "" and full:match("%.md$") and not anchors_of(full)[anchor] then
              dead[#dead + 1] = where .. " (no such heading)"
            end
          end
        end
      end
    end
  end
  T.is(dead, {}, "every relative link points to a file, every anchor to a heading (" .. nlinks .. " links)")
  for path in pairs(pending) do T.skip("link to " .. path, "not in this tree yet (added by another branch)") end
  local design = {}
  for _, f in ipairs(files) do
    if readfile(f):find("DESIGN.md", 1, true) then design[#design + 1] = f end
  end
  T.is(design, {}, "no document cites DESIGN.md, which is not in the repository")
end)

T.test("README.md is a front page", function()
  local src = readfile("README.md")
  local lines = md_lines(src)
  local n = select(2, src:gsub("\n", ""))
  T.ok(n <= 300, "at most 300 lines (" .. n .. ")")
  local first
  for i, b in ipairs(blocks(lines)) do
    if i == 1 then first = b end
  end
  T.ok(first and first.line <= 15, "a code block near the top")
  T.is(first and first.info, "sh", "... of shell commands")
  T.is(first and first.body,
       "make deps && make && build/gpulua scripts/overlap.lua   # install what is missing, build, run a real pipeline\n" ..
       "make test                                               # the whole suite (also under ASan+UBSan)",
       "... the two commands")
end)

T.done()
