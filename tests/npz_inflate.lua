-- gpu.load_npz inflates deflated members on the staging threads (issue 34,
-- item 3: "stages it to the device without blocking the script"): the
-- member's .npy header is inflated and checked at the call; its elements
-- are inflated chunk by chunk into the pinned slots of a staged copy while
-- the script goes on, several members at once; the rest of the member is
-- inflated for its CRC-32.  Data found corrupt after the call is an
-- asynchronous error: the next sync raises it, naming the load's line.
-- map = false, and host or pinned loads, inflate at the call.
--
-- The cases run here, then in children with tiny chunks, one or three
-- threads and GPULUA_HOST_JITTER=1 (random delays in the copies' steps and
-- threads: a chunk given out of order shows up as a wrong value).
local gpu = require "gpu"
local T = require "gpu.test"

local CHILD = os.getenv("NPZ_INFLATE_CHILD")
local N_BIG = CHILD and (1 << 16) or (1 << 22)   -- 16 MiB of f32 here: several chunks

local files = {}
local function tmppath()
  local p = os.tmpname()
  files[#files + 1] = p
  return p
end
local function file(bytes)
  local p = T.tmpfile(bytes)
  files[#files + 1] = p
  return p
end

-- The members of a zip (no zip64): name -> {cd = its central entry's
-- first byte, lh = its local header's, data = its data's, csize =}
local function members(raw)
  local out, at = {}, 1
  while true do
    local cd = raw:find("PK\1\2", at, true)
    if not cd then return out end
    local method, crc, csize, nlen, xlen, clen, lho = string.unpack("<I2 xxxx I4 I4 xxxx I2 I2 I2 xxxxxxxx I4",
      raw, cd + 10)
    local name = raw:sub(cd + 46, cd + 45 + nlen)
    local lnlen, lxlen = string.unpack("<I2I2", raw, lho + 1 + 26)
    out[name] = { cd = cd, lh = lho + 1, data = lho + 1 + 30 + lnlen + lxlen, csize = csize, method = method,
                  crc = crc }
    at = cd + 46 + nlen + xlen + clen
  end
end

-- T.same, element by element on the device for the big member (no NaN
-- or -0 in it): T.same reads every element into Lua
local function same(got, want, name)
  if want:numel() < 100000 then return T.same(got, want, name) end
  T.is({ got.dtype, got.shape, got:to("device"):ne(want):sum():item() }, { want.dtype, want.shape, 0 }, name)
end

-- raw with n bytes at i replaced by s
local function patch(raw, i, s) return raw:sub(1, i - 1) .. s .. raw:sub(i + #s) end

local ARCHIVE
-- One archive of every dtype (written once: deflating 16 MiB takes a
-- while), and the tensors it holds (made anew each time)
local function archive()
  local t = {
    big = gpu.arange(N_BIG, { dtype = "f32" }):mul(0.5),
    f64 = gpu.tensor({ 1.5, -2.25, 1e300 }, { dtype = "f64" }),
    f16 = gpu.tensor({ 0.5, 65504, -1 }, { dtype = "f16" }),
    bf16 = gpu.tensor({ 1, 2, 3.5 }, { dtype = "bf16" }),
    i8 = gpu.tensor({ -128, 0, 127 }, { dtype = "i8" }),
    u8 = gpu.tensor({ 0, 255 }, { dtype = "u8" }),
    i32 = gpu.arange(1000, { dtype = "i32" }):reshape({ 10, 100 }),
    i64 = gpu.tensor({ -(1 << 62), 1 << 62 }, { dtype = "i64" }),
    scalar = gpu.tensor(2.5, { dtype = "f32" }),
    empty = gpu.zeros({ 0, 3 }),
    mask = gpu.tensor({ true, false, true }),
  }
  if not ARCHIVE then
    ARCHIVE = tmppath()
    gpu.save_npz(ARCHIVE, t, { compress = true })
  end
  return ARCHIVE, t
end

T.test("npz: deflated members load to the device as they are, every dtype", function()
  local p, want = archive()
  for name, m in pairs(members(T.readfile(p))) do
    T.is(m.method, 8, name .. " is deflated")
  end
  local got = gpu.load_npz(p)
  local now = gpu.load_npz(p, { map = false })   -- inflated at the call
  local host = gpu.load_npz(p, { device = "host" })
  for name, t in pairs(want) do
    T.is({ got[name].dtype, got[name].shape }, { t.dtype, t.shape }, name .. ": dtype and shape")
    same(got[name], t, name .. ": the values, bit for bit")
    same(now[name], t, name .. ": the same with map = false")
    same(host[name], t, name .. ": the same to host memory")
  end
end)

T.test("npz: several deflated members queue on a stream behind its work", function()
  local p, want = archive()
  local s <close> = gpu.stream()
  gpu.sleep(50, { stream = s })
  local got = gpu.load_npz(p, { stream = s, names = { "big", "i32", "f64" } })
  -- work queued after the loads on the same stream sees their values
  local sum = got.big:sum({ stream = s })
  local last = got.i32:add(1, { stream = s })
  s:synchronize()
  T.is(sum:item(), want.big:sum():item(), "a sum queued behind the big member's copy")
  T.same(last, want.i32 + 1, "an add queued behind another's")
  T.is(got.f16, nil, "only the selection is loaded")
end)

T.test("npz: the file may go once the call returns", function()
  local p, want = archive()
  local raw = T.readfile(p)
  local q = file(raw)
  local got = gpu.load_npz(q, { names = { "big" } })
  os.remove(q)                       -- the loader reads through a descriptor of its own
  local q2 = file(raw:reverse())     -- and a new file at the path is not read
  os.rename(q2, q)
  same(got.big, want.big, "the values of the file the call opened")
end)

-- the data of member name in raw, spoiled in its middle
local function spoil_middle(raw, name)
  local m = members(raw)[name]
  return patch(raw, m.data + m.csize // 2, string.rep("\255", 64))
end

-- raw with member name's CRC-32 (central and local) made wrong
local function wrong_crc(raw, name)
  local m = members(raw)[name]
  local bad = string.pack("<I4", m.crc ~ 0x5A5A5A5A)
  return patch(patch(raw, m.cd + 16, bad), m.lh + 14, bad)
end

T.test("npz: corrupt deflated data raises at the next sync, naming the load's line", function()
  local p = archive()
  local raw = T.readfile(p)
  local cases = {
    { "corrupt in the middle", spoil_middle(raw, "big.npy"), { "corrupt deflate data", "CRC%-32 mismatch" } },
    { "a wrong CRC-32", wrong_crc(raw, "big.npy"), { "CRC%-32 mismatch" } },
  }
  for _, c in ipairs(cases) do
    local what, bad, patterns = c[1], file(c[2]), c[3]
    local line = debug.getinfo(1, "l").currentline + 1
    local got = gpu.load_npz(bad, { names = { "big" } })   -- returns: the elements are not inflated yet
    T.ok(got.big ~= nil, what .. ": the call returns the tensor")
    local ok, err = pcall(gpu.synchronize)
    local site = "npz_inflate.lua:" .. line .. ": load_npz: " .. bad:gsub("%p", "%%%0") .. ": member 'big.npy': "
    local named = false
    for _, pat in ipairs(patterns) do named = named or (not ok and err:find(site .. pat) ~= nil) end
    T.ok(named, what .. ": the sync raises, naming the load's line, the file and the member")
    if not named then T.diag("  got: " .. tostring(err)) end
    T.ok(pcall(gpu.synchronize), what .. ": raised once, then the context goes on")
    -- map = false inflates at the call: the call raises
    T.raises_at(function() gpu.load_npz(bad, { names = { "big" }, map = false }) end, patterns,
      what .. ": map = false raises at the call")
    -- dropped before the sync: still raised
    local _ = gpu.load_npz(bad, { names = { "big" } })
    _ = nil
    collectgarbage()
    T.raises(gpu.synchronize, patterns, what .. ": the tensor dropped, the sync still raises")
  end
  same(gpu.load_npz(p).big, gpu.load_npz(p, { map = false }).big, "a good archive loads after")
end)

T.test("npz: a deflated member's corrupt header raises at the call", function()
  local p = archive()
  local raw = T.readfile(p)
  local m = members(raw)["big.npy"]
  -- the deflate stream's first bytes: a block type that does not exist
  local bad = file(patch(raw, m.data, "\255\255\255\255"))
  T.raises_at(function() gpu.load_npz(bad, { names = { "big" } }) end,
    "load_npz: .-: member 'big.npy': corrupt deflate data", "raised at the call, nothing queued")
  T.ok(pcall(gpu.synchronize), "and nothing is raised later")
end)

T.test("npz: loading deflated members is not a sync (gpu.nosync)", function()
  local p, want = archive()
  local got
  do
    local _ <close> = gpu.nosync()
    got = gpu.load_npz(p, { names = { "i32", "big" } })
  end
  T.same(got.i32, want.i32, "loading a deflated member is not a sync")
  same(got.big, want.big, "the big one too")
end)

T.test("npz: many deflated members in flight hold one descriptor", function()
  local t = {}
  for i = 1, 300 do t["a" .. i] = gpu.tensor({ i, -i }, { dtype = "i32" }) end
  local p = tmppath()
  gpu.save_npz(p, t, { compress = true })
  -- a child with 64 descriptors at most loads all 300 behind a sleep on
  -- their stream: every copy is alive at once (a descriptor each would
  -- run out)
  local code = T.tmpfile(string.format([[
    local gpu = require "gpu"
    local s = gpu.stream()
    gpu.sleep(300, { stream = s })
    local got = gpu.load_npz(%q, { stream = s })
    local bad = 0
    for i = 1, 300 do
      local v = got["a" .. i]:totable()
      if v[1] ~= i or v[2] ~= -i then bad = bad + 1 end
    end
    print("bad " .. bad)
  ]], p))
  files[#files + 1] = code
  local out = T.sh(string.format("ulimit -n 64 && %s %s 2>&1", T.gpulua, code))
  T.is(out:match("bad %d+"), "bad 0", "300 members load under a limit of 64 descriptors")
  if not out:match("bad 0") then T.diag(out) end
end)

if not CHILD then
  T.test("the same with tiny chunks, few threads and jitter (children)", function()
    local me = debug.getinfo(1, "S").short_src
    for _, env in ipairs { "GPULUA_STAGE_CHUNK=100 GPULUA_STAGE_THREADS=1 GPULUA_HOST_JITTER=1",
                           "GPULUA_STAGE_CHUNK=4K GPULUA_STAGE_THREADS=3 GPULUA_HOST_JITTER=1" } do
      local out, ok = T.run("NPZ_INFLATE_CHILD=1 " .. env, me)
      local bad = out:match("\nnot ok[^\n]*") or out:match("^not ok[^\n]*")
      T.ok(ok and not bad and out:find("\nok ", 1, true), env .. ": the child passes")
      if not ok or bad then T.diag(out) end
    end
  end)
end

for _, p in ipairs(files) do os.remove(p) end
T.done()
