-- The LuaLS annotations in docs/types against the module they describe, so
-- that they cannot drift: every name the gpu module (and gpu.trace,
-- gpu.pipeline, gpu.test) exports is annotated and every annotated name
-- exists; each userdata type's methods, fields and operators match its
-- metatable; the tables functions return have the annotated fields; each
-- option class names exactly the keys its function accepts (the function's
-- own "unknown option 'x' (expected: ...)" says which).  Without
-- lua-language-server here, the files are also checked to load as Lua and
-- to name only types they define.
local gpu = require "gpu"
local T = require "gpu.test"

local HERE = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local ROOT = HERE .. "/.."
local TYPES = ROOT .. "/docs/types"

-- annotation file -> the module it describes (its ---@meta name)
local FILES = {
  { path = "gpu.lua", module = "gpu" },
  { path = "gpu/trace.lua", module = "gpu.trace" },
  { path = "gpu/pipeline.lua", module = "gpu.pipeline" },
  { path = "gpu/dist.lua", module = "gpu.dist" },
  { path = "gpu/test.lua", module = "gpu.test" },
}

-- Exported names deliberately not annotated, with the reason.
local PRIVATE = {
  ["gpu.trace"] = {
    _collect = "the C half's reader for the Lua writers (stdlib/gpu/trace.lua)",
    _slice = "the C half's reader for the Lua writers (stdlib/gpu/trace.lua)",
    _cli_start = "gpulua --trace FILE's hook, called by the CLI only",
    _cli_finish = "gpulua --trace FILE's hook, called by the CLI only",
  },
}

-- Userdata types the runtime registers that scripts never hold.
local INTERNAL_TYPES = {
  ["gpu.State"] = "the per-interpreter state, in the registry",
  ["gpu.ModuleRef"] = "holds a module while gpu.compile makes it",
  ["gpu.ModuleFile"] = "a file gpu.load_module is reading",
  ["gpu.NpyFile"] = "a file gpu.load is reading",
  ["gpu.SafetensorsHeader"] = "the parsed header gpu.load_safetensors is reading",
}

-- The C function that reads each type's fields (names compared with strcmp).
local FIELD_GETTERS = {
  ["gpu.Tensor"] = { "bindings/tensor.c", "t_fields" },
  ["gpu.Stream"] = { "bindings/stream.c", "stream_fields" },
  ["gpu.Event"] = { "bindings/event.c", "event_fields" },
  ["gpu.Graph"] = { "bindings/graph.c", "graph_fields" },
  ["gpu.Group"] = { "bindings/group.c", "group_fields" },
  ["gpu.Task"] = { "bindings/task.c", "task_fields" },
  ["gpu.Kernel"] = { "bindings/kernel.c", "kernel_fields" },
  ["gpu.Module"] = { "bindings/kernel.c", "module_index" },   -- none: kernels are raw fields
}

-- Builtin LuaLS types (and keywords of type expressions).
local BUILTIN = {}
for w in ([[nil boolean number integer string table function userdata thread any
            lightuserdata unknown self fun true false]]):gmatch("%S+") do BUILTIN[w] = true end

local OPERATORS = { __add = "add", __sub = "sub", __mul = "mul", __div = "div", __mod = "mod",
                    __pow = "pow", __unm = "unm", __idiv = "idiv", __band = "band", __bor = "bor",
                    __bxor = "bxor", __shl = "shl", __shr = "shr", __bnot = "bnot",
                    __concat = "concat", __len = "len" }

-- ---- helpers ------------------------------------------------------------------

local function sorted_keys(t)
  local r = {}
  for k in pairs(t) do r[#r + 1] = k end
  table.sort(r)
  return r
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

-- names in a but not in b (both sets), sorted
local function minus(a, b)
  local r = {}
  for k in pairs(a) do if not b[k] then r[#r + 1] = k end end
  table.sort(r)
  return r
end

local readfile = T.readfile

-- ---- parsing the annotation files ---------------------------------------------

-- A type expression starting at s[i]: up to white space outside brackets and
-- quotes, unless the type goes on ("a | b", "fun(): R").  Returns it and the
-- position after it.
local function read_type(s, i)
  i = s:find("%S", i)
  if not i then return nil, #s + 1 end
  local depth, j, n = 0, i, #s
  while j <= n do
    local c = s:sub(j, j)
    if c == "(" or c == "[" or c == "{" or c == "<" then
      depth = depth + 1
    elseif c == ")" or c == "]" or c == "}" or c == ">" then
      depth = depth - 1
    elseif c == '"' or c == "'" or c == "`" then
      j = s:find(c, j + 1, true) or n
    elseif c:match("%s") and depth <= 0 then
      local prev = s:sub(1, j - 1):match("(%S)%s*$")
      local nxt = s:match("^%s*(%S)", j)
      if prev ~= "|" and prev ~= ":" and prev ~= "," and nxt ~= "|" then break end
    end
    j = j + 1
  end
  return s:sub(i, j - 1), j
end

-- The type names a type expression refers to (not literals, parameter names
-- or table keys).
local function type_names(ty)
  local names = {}
  local s = ty:gsub('"[^"]*"', '""'):gsub("'[^']*'", "''"):gsub("`[^`]*`", "``")
  for pos, word, after in s:gmatch("()([%a_][%w_%.]*)()") do
    local prevc = pos > 1 and s:sub(pos - 1, pos - 1) or ""
    local named = s:match("^%??%s*:", after)   -- a parameter name or a table key
    if not named and not prevc:match("[%w_%.]") then names[#names + 1] = word end
  end
  return names
end

-- The alternatives of a union at depth 0.
local function alternatives(ty)
  local alts, depth, start = {}, 0, 1
  local i, n = 1, #ty
  while i <= n do
    local c = ty:sub(i, i)
    if c == "(" or c == "[" or c == "{" or c == "<" then depth = depth + 1
    elseif c == ")" or c == "]" or c == "}" or c == ">" then depth = depth - 1
    elseif c == '"' or c == "'" then i = ty:find(c, i + 1, true) or n
    elseif c == "|" and depth == 0 then
      alts[#alts + 1] = ty:sub(start, i - 1):match("^%s*(.-)%s*$")
      start = i + 1
    end
    i = i + 1
  end
  alts[#alts + 1] = ty:sub(start):match("^%s*(.-)%s*$")
  return alts
end

--[[ The parse of all files:
  classes[name] = { name, parent = type or nil, file, line, fields = {name = {type, optional}},
                    functions = {name = fn}, operators = {op = true}, call = bool }
  aliases[name] = { file, line }
  refs = { {name, where} }          every type name used
  params = { {fn, where, problem} } @param lines that do not match their function
  files[path] = { meta, loads, err, returns = class name } ]]
local function parse(files)
  local P = { classes = {}, aliases = {}, refs = {}, problems = {}, files = {} }
  for _, f in ipairs(files) do
    local path = TYPES .. "/" .. f.path
    local src = readfile(path)
    local info = { path = f.path }
    P.files[f.path] = info
    if not src then
      info.missing = true
    else
      local chunk, err = loadfile(path)
      info.loads, info.err = chunk ~= nil, err
      info.meta = src:match("^%-%-%-@meta[ \t]+([%w_%.]+)") or (src:match("^%-%-%-@meta") and "")
      local vars = {}            -- local name -> class
      local block = {}           -- annotation lines since the last code line
      local class = nil          -- class whose block this is
      local lineno = 0
      local function where() return f.path .. ":" .. lineno end
      local function ref(ty)
        if ty then
          for _, name in ipairs(type_names(ty)) do P.refs[#P.refs + 1] = { name = name, where = where() } end
        end
      end
      for line in (src .. "\n"):gmatch("(.-)\r?\n") do
        lineno = lineno + 1
        local ann = line:match("^%-%-%-(.*)$")
        if ann then
          block[#block + 1] = { text = ann, where = where() }
          local tag, rest = ann:match("^@(%w+)%s*(.*)$")
          if tag == "class" then
            local name, after = rest:match("^([%w_%.]+)%s*(.*)$")
            class = { name = name, file = f.path, line = lineno, fields = {}, functions = {},
                      operators = {}, call = false, where = where() }
            if P.classes[name] then
              P.problems[#P.problems + 1] = where() .. ": class " .. name .. " defined twice"
            end
            P.classes[name] = class
            if after:match("^:") then
              class.parent = read_type(after, 2)
              ref(class.parent)
            end
          elseif tag == "alias" then
            local name, after = rest:match("^([%w_%.]+)%s*(.*)$")
            P.aliases[name] = { where = where() }
            if after ~= "" then ref((read_type(after, 1))) end
            class = nil
          elseif tag == "field" then
            local name, ty
            if rest:match("^%[") then
              local key, after = rest:match("^(%b[])%s*(.*)$")
              ref(key:sub(2, -2))
              ty = read_type(after, 1)
            else
              local after
              name, after = rest:match("^([%w_]+%??)%s*(.*)$")
              ty = read_type(after, 1)
            end
            ref(ty)
            if class and name then
              local opt = name:match("%?$") ~= nil
              class.fields[(name:gsub("%?$", ""))] = { type = ty, optional = opt, where = where() }
            elseif not class then
              P.problems[#P.problems + 1] = where() .. ": ---@field outside a class"
            end
          elseif tag == "operator" then
            local op, after = rest:match("^(%w+)(.*)$")
            local arg, rty = after:match("^(%b())%s*:(.*)$")
            if arg then ref(arg:sub(2, -2)) else rty = after:match("^%s*:(.*)$") end
            ref(rty and (read_type(rty, 1)))
            if class then class.operators[op] = true end
          elseif tag == "overload" then
            ref((read_type(rest, 1)))
            if class then class.call = true end
          elseif tag == "param" then
            local after = rest:match("^[%w_%.]+%??%s*(.*)$")
            ref(after and (read_type(after, 1)))
          elseif tag == "return" or tag == "type" then
            ref((read_type(rest, 1)))
          end
          if ann:match("^|") then ref((read_type(ann:sub(2), 1))) end
        else
          local var = line:match("^local%s+([%w_]+)%s*=%s*{%s*}")
          local owner, sep, fname, args = line:match("^function%s+([%w_]+)([%.:])([%w_]+)%s*(%b())")
          if var and class then
            vars[var] = class.name
          elseif owner then
            local cname = vars[owner]
            if not cname then
              P.problems[#P.problems + 1] = where() .. ": function " .. owner .. sep .. fname
                .. " of a table with no ---@class"
            else
              local fn = { name = fname, method = sep == ":", where = where(), params = {}, ptypes = {} }
              local plist = {}
              for p in args:sub(2, -2):gmatch("[^,%s]+") do plist[#plist + 1] = p end
              fn.plist = plist
              local declared = set_of(plist)
              for _, b in ipairs(block) do
                local pname, after = b.text:match("^@param%s+([%w_%.]+)%??%s*(.*)$")
                if pname then
                  if not declared[pname] then
                    P.problems[#P.problems + 1] = b.where .. ": @param " .. pname .. " is not a parameter of "
                      .. fname .. args
                  end
                  fn.params[pname] = true
                  fn.ptypes[pname] = (read_type(after, 1))
                end
              end
              for _, p in ipairs(plist) do
                if not fn.params[p] then
                  P.problems[#P.problems + 1] = fn.where .. ": parameter " .. p .. " of " .. fname
                    .. " has no @param"
                end
              end
              P.classes[cname].functions[fname] = fn
            end
          end
          local ret = line:match("^return%s+([%w_]+)%s*$")
          if ret then info.returns = vars[ret] end
          if line:match("%S") then block, class = {}, nil end
        end
      end
    end
  end
  return P
end

local A = parse(FILES)

-- The named fields of a class and of its parents (a parent that is a table
-- literal adds none).
local function all_fields(cname, acc)
  acc = acc or {}
  local c = A.classes[cname]
  if not c then return acc end
  for k, v in pairs(c.fields) do if acc[k] == nil then acc[k] = v end end
  if c.parent and A.classes[c.parent] then all_fields(c.parent, acc) end
  return acc
end

-- The member names of a class: its named fields and its functions.
local function members(cname)
  local m = {}
  local c = A.classes[cname]
  for k in pairs(all_fields(cname)) do m[k] = "field" end
  for k in pairs(c and c.functions or {}) do m[k] = "function" end
  return m
end

-- Whether value v fits type expression ty (roughly: builtins, literals,
-- arrays, gpu.* userdata by name, aliases of those).
local function conforms(v, ty, depth)
  depth = depth or 0
  if depth > 8 then return true end
  for _, alt in ipairs(alternatives(ty)) do
    local base = alt:gsub("%?$", "")
    if alt:match("%?$") and v == nil then return true end
    local lit = base:match('^"(.*)"$')
    if lit then
      if v == lit then return true end
    elseif math.tointeger(tonumber(base)) then
      if v == tonumber(base) then return true end
    elseif base == "any" or base == "unknown" then
      return true
    elseif base == "integer" then
      if math.type(v) == "integer" then return true end
    elseif base == "number" or base == "string" or base == "boolean" or base == "table"
        or base == "function" or base == "nil" or base == "userdata" then
      if type(v) == base then return true end
    elseif base:match("%[%]$") or base:match("^{") or base:match("^table<") then
      if type(v) == "table" then return true end
    elseif A.aliases[base] then
      return true   -- checked where it matters (dtype names) by other tests
    elseif A.classes[base] then
      local mt = getmetatable(v)
      if type(v) == "userdata" and mt and mt.__name == base then return true end
      if type(v) == "table" and not (mt and mt.__name) then return true end
    end
  end
  return false
end

-- ---- the files themselves ----------------------------------------------------------

T.test("each annotation file exists, is ---@meta <module> and loads as Lua", function()
  for _, f in ipairs(FILES) do
    local info = A.files[f.path]
    if info.missing then
      T.ok(false, f.path .. " exists")
    else
      T.is(info.meta, f.module, f.path .. " starts with ---@meta " .. f.module)
      T.ok(info.loads, f.path .. " loads as Lua" .. (info.err and (": " .. info.err) or ""))
      T.ok(info.returns ~= nil, f.path .. " ends with `return <the module's table>`")
    end
  end
end)

T.test("docs/types holds these files alone, and .luarc.json points at it", function()
  local out, status = T.sh("cd '" .. TYPES .. "' && find . -name '*.lua' | sort")
  if status ~= 0 then return T.skip("the files under docs/types", "find failed") end
  local listed, found = {}, {}
  for _, f in ipairs(FILES) do listed[f.path] = true end
  for path in out:gmatch("%./([^\n]+)") do found[path] = true end
  T.is(minus(found, listed), {}, "every .lua file under docs/types is checked here (add it to FILES)")
  local luarc = readfile(ROOT .. "/.luarc.json")
  T.ok(luarc and luarc:match('"workspace%.library"%s*:%s*%[[^%]]*"docs/types"'),
       ".luarc.json has docs/types in workspace.library")
end)

T.test("every type the annotations name is defined", function()
  local undefined = {}
  for _, r in ipairs(A.refs) do
    if not BUILTIN[r.name] and not A.classes[r.name] and not A.aliases[r.name] then
      undefined[#undefined + 1] = r.name .. " (" .. r.where .. ")"
    end
  end
  T.is(undefined, {}, "no type is used without a ---@class or ---@alias")
end)

T.test("@param lines match the functions they annotate", function()
  T.is(A.problems, {}, "each @param names a parameter, each parameter has one")
end)

-- ---- modules ---------------------------------------------------------------------

local function check_module(modname, mod)
  local file
  for _, f in ipairs(FILES) do if f.module == modname then file = A.files[f.path] end end
  local cname = file and file.returns
  if not T.ok(cname and A.classes[cname], modname .. ": the annotation file returns a ---@class table") then
    return
  end
  local ann = members(cname)
  local real, private = {}, PRIVATE[modname] or {}
  for k in pairs(mod) do
    if type(k) == "string" and not private[k] then real[k] = true end
  end
  T.is(minus(real, ann), {}, modname .. ": every exported name is annotated (" .. cname .. ")")
  T.is(minus(ann, real), {}, modname .. ": every annotated name is exported")
  for _, k in ipairs(sorted_keys(private)) do
    T.ok(mod[k] ~= nil, modname .. "." .. k .. " left out on purpose (" .. private[k] .. ") still exists")
  end
  local wrong = {}
  for name, kind in pairs(ann) do
    local v = mod[name]
    if v ~= nil then
      if (kind == "function") ~= (type(v) == "function") then
        wrong[#wrong + 1] = name .. " is a " .. type(v) .. ", annotated as a " .. kind
      elseif kind == "field" and not conforms(v, all_fields(cname)[name].type) then
        wrong[#wrong + 1] = name .. " = " .. tostring(v) .. " does not fit " .. all_fields(cname)[name].type
      end
    end
  end
  table.sort(wrong)
  T.is(wrong, {}, modname .. ": functions are functions and fields fit their types")
end

T.test("module gpu", function() check_module("gpu", gpu) end)
T.test("module gpu.trace", function()
  T.ok(require "gpu.trace" == gpu.trace, "require 'gpu.trace' is gpu.trace")
  check_module("gpu.trace", gpu.trace)
end)
T.test("module gpu.pipeline", function() check_module("gpu.pipeline", require "gpu.pipeline") end)
T.test("module gpu.test", function() check_module("gpu.test", T) end)
T.test("module gpu.dist", function() check_module("gpu.dist", require "gpu.dist") end)

-- ---- userdata types --------------------------------------------------------------

local REG = debug.getregistry()

-- Field names the C getter of a type compares its key with.
local function c_fields(tname)
  local g = FIELD_GETTERS[tname]
  if not g then return nil end
  local src = readfile(ROOT .. "/" .. g[1])
  if not src then return nil, g[1] .. " not found" end
  local body = src:match("\nstatic int " .. g[2] .. "%(lua_State %*L%) {\n(.-)\n}\n")
  if not body then return nil, g[2] .. " not found in " .. g[1] end
  local names = {}
  for name in body:gmatch('strcmp%(%w+, "([%w_]+)"%)') do names[name] = true end
  return names
end

T.test("every userdata type a script can hold is a ---@class", function()
  local types = {}
  for k, v in pairs(REG) do
    if type(k) == "string" and k:match("^gpu%.") and type(v) == "table" and rawget(v, "__name") == k then
      types[#types + 1] = k
    end
  end
  table.sort(types)
  T.ok(#types >= 10, "the registry holds the gpu.* metatables (" .. #types .. ")")
  local missing = {}
  for _, k in ipairs(types) do
    if not INTERNAL_TYPES[k] and not A.classes[k] then missing[#missing + 1] = k end
  end
  T.is(missing, {}, "each gpu.* metatable has a ---@class of its name")
  for _, k in ipairs(sorted_keys(INTERNAL_TYPES)) do
    T.ok(REG[k] ~= nil, k .. " left out on purpose (" .. INTERNAL_TYPES[k] .. ") still exists")
  end
end)

local checked = {}   -- types check_type has seen

local function check_type(tname, obj)
  checked[tname] = true
  local mt = REG[tname]
  if not T.ok(type(mt) == "table", tname .. " is registered") then return end
  if obj ~= nil then T.ok(getmetatable(obj) == mt, tname .. ": a real object has the registered metatable") end
  local c = A.classes[tname]
  if not T.ok(c ~= nil, tname .. " is annotated") then return end
  local real = {}
  local methods = rawget(mt, "__methods")
  if type(methods) ~= "table" and type(rawget(mt, "__index")) == "table" then methods = rawget(mt, "__index") end
  for k in pairs(type(methods) == "table" and methods or {}) do real[k] = true end
  -- bindings/type.c: __index is a C closure whose second upvalue, when
  -- present, is the type's field getter
  local index = rawget(mt, "__index")
  local has_getter = type(index) == "function" and select(2, debug.getupvalue(index, 2)) ~= nil
  T.is(has_getter, FIELD_GETTERS[tname] ~= nil,
       tname .. ": has a field getter exactly when FIELD_GETTERS names it")
  local fields, err = c_fields(tname)
  if fields then
    for k in pairs(fields) do real[k] = true end
  elseif err then
    T.ok(false, tname .. ": its fields from the C source: " .. err)
  end
  local ann = members(tname)
  local label = fields and "methods and fields" or "methods"
  T.is(minus(real, ann), {}, tname .. ": every one of its " .. label .. " is annotated")
  T.is(minus(ann, real), {}, tname .. ": every annotated member exists")
  -- operators
  local ops, annops = {}, {}
  for mm, op in pairs(OPERATORS) do if rawget(mt, mm) then ops[op] = true end end
  for op in pairs(c.operators) do if op ~= "call" then annops[op] = true end end
  T.is(sorted_keys(ops), sorted_keys(annops), tname .. ": ---@operator lines match the metamethods")
  T.is(c.call or c.operators.call or false, rawget(mt, "__call") ~= nil,
       tname .. ": callable (__call) exactly when annotated with ---@overload or ---@operator call")
  -- fields read on a real object fit their types
  if obj ~= nil then
    local wrong = {}
    for name, f in pairs(all_fields(tname)) do
      local ok, v = pcall(function() return obj[name] end)
      if not ok then
        wrong[#wrong + 1] = name .. ": " .. tostring(v)
      elseif not conforms(v, f.type) and not (v == nil and f.type:match("any")) then
        wrong[#wrong + 1] = name .. " = " .. tostring(v) .. " does not fit " .. f.type
      end
    end
    table.sort(wrong)
    T.is(wrong, {}, tname .. ": each annotated field of a real one reads and fits its type")
  end
end

T.test("gpu.Tensor", function()
  local t <close> = gpu.zeros({2, 3})
  check_type("gpu.Tensor", t)
end)

T.test("gpu.Stream", function()
  local s <close> = gpu.stream()
  check_type("gpu.Stream", s)
end)

T.test("gpu.Event", function()
  local e <close> = gpu.event()
  check_type("gpu.Event", e)
end)

T.test("gpu.Graph", function()
  local x <close> = gpu.zeros({ 2 })
  local g <close> = gpu.graph(function() x:fill(1) end, { name = "annotations" })
  check_type("gpu.Graph", g)
end)

T.test("gpu.Group", function()
  local g <close> = gpu.new_group({ 0 })
  check_type("gpu.Group", g)
end)

T.test("gpu.Task", function()
  local task = gpu.task(function() return 1 end)
  gpu.run()
  check_type("gpu.Task", task)
end)

T.test("gpu.Range, gpu.Using, gpu.NoSync", function()
  do
    local r <close> = gpu.range("annotations")
    check_type("gpu.Range", r)
  end
  do
    local u <close> = gpu.using(gpu.default_stream())
    check_type("gpu.Using", u)
  end
  do
    local n <close> = gpu.nosync("warn")
    check_type("gpu.NoSync", n)
  end
end)

T.test("gpu.DLPack (made by an application only: its metatable)", function()
  check_type("gpu.DLPack")
end)

-- A compiled module needs a compiler (NVRTC, or c++ on the host backend).
local KSRC = [[extern "C" __global__ void annotated(float *x, int n) { (void)x; (void)n; }]]

T.test("gpu.Module, gpu.Kernel, gpu.Launcher", function()
  local ok, m = pcall(gpu.compile, KSRC, { name = "annotations.cu" })
  if not ok then
    T.diag("gpu.compile failed, checking the registered metatables only: " .. tostring(m))
    check_type("gpu.Module")
    check_type("gpu.Kernel")
    check_type("gpu.Launcher")
    return
  end
  check_type("gpu.Module", m)
  local k = m.annotated
  check_type("gpu.Kernel", k)
  local launcher <close> = k { grid = 1, block = 1 }
  check_type("gpu.Launcher", launcher)
  local params = k.params
  T.is(sorted_keys(params[1]), sorted_keys(members("gpu.KernelParam")), "k.params[i] has gpu.KernelParam's fields")
  k:close()
end)

T.test("every other gpu.* type, by its metatable", function()
  local n = 0
  for k, v in pairs(REG) do
    if type(k) == "string" and k:match("^gpu%.") and type(v) == "table" and rawget(v, "__name") == k
        and not INTERNAL_TYPES[k] and not checked[k] then
      check_type(k)
      n = n + 1
    end
  end
  T.ok(true, n .. " gpu.* types not made above, checked by their metatable")
end)

-- ---- tables that functions return ------------------------------------------------

local function check_table(cname, t, what)
  local fields = all_fields(cname)
  local real, required = {}, {}
  for k in pairs(t) do if type(k) == "string" then real[k] = true end end
  for k, f in pairs(fields) do if not f.optional then required[k] = true end end
  T.is(minus(real, fields), {}, what .. ": every key is a field of " .. cname)
  T.is(minus(required, real), {}, what .. ": every required field of " .. cname .. " is there")
  local wrong = {}
  for k, v in pairs(t) do
    if fields[k] and not conforms(v, fields[k].type) then
      wrong[#wrong + 1] = k .. " = " .. tostring(v) .. " does not fit " .. fields[k].type
    end
  end
  table.sort(wrong)
  T.is(wrong, {}, what .. ": values fit their types")
end

T.test("gpu.memory, gpu.stats, gpu.device_info", function()
  check_table("gpu.MemoryInfo", gpu.memory(), "gpu.memory()")
  check_table("gpu.Stats", gpu.stats(), "gpu.stats()")
  check_table("gpu.DeviceInfo", gpu.device_info(0), "gpu.device_info(0)")
end)

T.test("gpu.trace.events", function()
  gpu.trace.start()
  do
    local _ <close> = gpu.range("annotations")
    local t <close> = gpu.ones({4})
    local h <close> = t:to("pinned")
  end
  gpu.trace.stop()
  local ev = gpu.trace.events()
  T.ok(#ev >= 3, "a few records (" .. #ev .. ")")
  check_table("gpu.TraceEvents", ev, "gpu.trace.events()")
  local kinds = {}
  for i, e in ipairs(ev) do
    local before = #kinds
    local fields = all_fields("gpu.TraceEvent")
    for k in pairs(e) do if not fields[k] then kinds[#kinds + 1] = "record " .. i .. " has " .. k end end
    for k, f in pairs(fields) do
      if not f.optional and e[k] == nil then kinds[#kinds + 1] = "record " .. i .. " lacks " .. k end
      if e[k] ~= nil and not conforms(e[k], f.type) then
        kinds[#kinds + 1] = "record " .. i .. ": " .. k .. " = " .. tostring(e[k]) .. " does not fit " .. f.type
      end
    end
    if #kinds > before + 3 then break end
  end
  T.is(kinds, {}, "each record fits gpu.TraceEvent")
  T.ok(#ev.streams >= 1, "at least one stream")
  if ev.streams[1] then check_table("gpu.TraceStream", ev.streams[1], "events().streams[1]") end
end)

T.test("gpu.pipeline.run's stats", function()
  local pipeline = require "gpu.pipeline"
  local stats = pipeline.run {
    batches = 2, depth = 2, timing = true, progress = false,
    input = { shape = { 4 } }, output = { shape = { 4 } },
    load = function(i, pin) pin:fill(i) end,
    compute = function(_, x, y) x:mul(2, { out = y }) end,
    sink = function() end,
  }
  check_table("gpu.PipelineStats", stats, "pipeline.run(...) with timing")
  check_table("gpu.PipelineTimeline", stats.timeline[1], "stats.timeline[1]")
end)

-- ---- options ---------------------------------------------------------------------

-- The classes of option tables (their names end in Opts or Spec), among the
-- alternatives of a type.
local function option_class(ty)
  for _, alt in ipairs(alternatives((ty or ""):gsub("%?$", ""))) do
    if A.classes[alt] and (alt:match("Opts$") or alt:match("Spec$")) then return alt end
  end
end

-- A value for a parameter before the options, so that the call reaches the
-- option check (which comes before any work).
local function sample(pname, ty, keep)
  for _, alt in ipairs(alternatives((ty or ""):gsub("%?$", ""))) do
    if not option_class(alt) then
      if alt == "gpu.Tensor" then
        local dt = (pname == "mask" or pname == "cond") and "bool" or pname == "idx" and "i64" or "f32"
        local t = gpu.zeros({ 1 }, { dtype = dt })
        keep[#keep + 1] = t
        return true, t
      elseif alt == "table<string, gpu.Tensor>" then
        local t = gpu.zeros({ 1 })
        keep[#keep + 1] = t
        return true, { a = t }
      elseif alt == "gpu.Tensor[]" then
        local t = gpu.zeros({ 1 })
        keep[#keep + 1] = t
        return true, { t }
      elseif alt == "integer" then
        return true, (pname == "peer" or pname == "root") and 0 or 1
      elseif alt == "number" or alt == "gpu.scalar" then
        return true, 1
      elseif alt == "gpu.shape" or alt == "integer[]" or alt == "table" then
        return true, { 1 }
      elseif alt == "string" then
        return true, "annotations-probe"
      elseif alt == "gpu.dtype" then
        return true, "f32"
      elseif alt == "gpu.device" then
        return true, "device"
      elseif alt == "function" or alt:match("^fun%(") then
        return true, function() end
      elseif alt == "gpu.Stream" then
        return true, gpu.default_stream()
      end
    end
  end
  return false
end

-- The keys a call accepts: it is given an unknown one, and its error names them.
local function accepted(call)
  local ok, err = pcall(call, { annotations_probe = true })
  if ok then return nil, "accepted an unknown option" end
  local list = tostring(err):match("%(expected: (.-)%)%s*$")
  if not list then return nil, "raised " .. tostring(err) end
  local keys = {}
  for w in list:gmatch("[%w_%.]+") do keys[w] = true end
  return keys
end

local function check_options(what, cname, call)
  local keys, err = accepted(call)
  if not keys then
    T.ok(false, what .. ": " .. err)
    return
  end
  local ann = {}
  for k in pairs(all_fields(cname)) do ann[k] = true end
  T.is(sorted_keys(ann), sorted_keys(keys), what .. ": " .. cname .. " names the keys it accepts")
end

-- Every parameter typed with an option class, on the modules and types whose
-- options are checked (gpu.test's are not: it reads what it knows).
local PROBED = { "gpulua.gpu", "gpu.Tensor", "gpu.Stream", "gpu.Event", "gpu.Graph", "gpu.Group", "gpulua.trace",
                 "gpulua.pipeline" }

-- Probed otherwise, with the reason.
local NOT_PROBED = {
  ["gpu.Tensor:contiguous"] = "a contiguous tensor returns itself before reading its options",
}

T.test("option classes name exactly the keys each function accepts", function()
  local objects = {
    ["gpulua.gpu"] = gpu, ["gpulua.trace"] = gpu.trace, ["gpulua.pipeline"] = require "gpu.pipeline",
  }
  local keep = {}
  local t <close> = gpu.zeros({ 1 })
  local s <close> = gpu.stream()
  local e <close> = gpu.event()
  local g <close> = gpu.graph(function() t:fill(1) end)
  objects["gpu.Tensor"], objects["gpu.Stream"], objects["gpu.Event"], objects["gpu.Graph"] = t, s, e, g
  local pg <close> = gpu.new_group({ 0 })
  objects["gpu.Group"] = pg
  local probed = 0
  for _, cname in ipairs(PROBED) do
    local c = A.classes[cname]
    local obj = objects[cname]
    for _, fname in ipairs(sorted_keys(c and c.functions or {})) do
      local fn = c.functions[fname]
      for k, pname in ipairs(fn.plist) do
        local oc = option_class(fn.ptypes[pname])
        if oc then
          local args, ok = {}, true
          for j = 1, k - 1 do
            local p = fn.plist[j]
            local good, v = sample(p, fn.ptypes[p], keep)
            if not good then ok = false; break end
            args[j] = v
          end
          local what = cname .. (fn.method and ":" or ".") .. fname .. " (" .. pname .. ")"
          if NOT_PROBED[cname .. (fn.method and ":" or ".") .. fname] then
            ok = nil
          elseif not ok then
            T.ok(false, what .. ": no sample value for the parameters before the options")
          elseif ok then
            probed = probed + 1
            check_options(what, oc, function(o)
              args[k] = o
              local f = obj[fname]
              if fn.method then return f(obj, table.unpack(args, 1, k)) end
              return f(table.unpack(args, 1, k))
            end)
          end
        end
      end
    end
  end
  T.ok(probed >= 60, "probed " .. probed .. " option parameters")
  -- the ones no function declaration carries, or not on any tensor
  local tt <close> = gpu.zeros({ 2, 3 }):t()
  check_options("gpu.Tensor:contiguous (opts) of a transposed tensor", "gpu.StreamOpts",
                function(o) return tt:contiguous(o) end)
  check_options("pipeline.run's input", "gpu.PipelineBufferSpec", function(o)
    return (require "gpu.pipeline").run { input = o, compute = function() end }
  end)
  local ok, m = pcall(gpu.compile, KSRC, { name = "annotations.cu" })
  if ok then
    check_options("k{...} (a kernel's launch)", "gpu.LaunchOpts", function(o) return m.annotated(o) end)
    m.annotated:close()
  else
    T.skip("k{...} (a kernel's launch)", "gpu.compile failed: " .. tostring(m))
  end
  for _, x in ipairs(keep) do x:close() end
end)

T.test("dtype names: gpu.dtype lists every name a tensor accepts", function()
  local src = readfile(ROOT .. "/cuda/dtype.c")
  if not src then return T.skip("dtype names", "cuda/dtype.c not found") end
  local names = {}
  -- the one list of names (dev_dtype_names), then the synonyms
  local list = src:match("dev_dtype_names%[[^%]]*%] = {(.-)};") or ""
  for name in list:gmatch('%[DEV_[%w_]+%] = "([%w_]+)"') do names[name] = true end
  local aliases = src:match("aliases%[%] = {(.-)};")
  for name in (aliases or ""):gmatch('{"([%w_]+)", DEV_') do names[name] = true end
  local ann = {}
  local gsrc = readfile(TYPES .. "/gpu.lua") or ""
  local block = gsrc:match("%-%-%-@alias gpu%.dtype\n(.-)\n\n") or ""
  for name in block:gmatch('%-%-%-| "([%w_]+)"') do ann[name] = true end
  T.ok(next(names) ~= nil, "names read from cuda/dtype.c")
  T.is(sorted_keys(ann), sorted_keys(names), "gpu.dtype is the names of cuda/dtype.c")
  local bad = {}
  for _, name in ipairs(sorted_keys(names)) do
    local ok, err = pcall(function()
      local x <close> = gpu.empty({ 1 }, { dtype = name })
    end)
    if not ok then bad[#bad + 1] = name .. ": " .. tostring(err) end
  end
  T.is(bad, {}, "each of them makes a tensor")
end)

T.done()
