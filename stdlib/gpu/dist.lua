-- gpu.dist: the pieces that data-parallel scripts share (scripts/zero.lua,
-- scripts/ddp_mlp.lua's pattern): flat buffers with per-parameter views,
-- split into buckets of whole parameters; the bucketed asynchronous
-- collectives on a communication stream with their events; and which block
-- of each bucket a rank owns (ZeRO's shards).
--
--   local dist = require "gpu.dist"
--   local lay = dist.layout({ { {D, D}, {D} }, ... }, { world = N })  -- buckets of shapes
--   local P = lay:new()            -- P.bucket[i] flat; P.views[i][j] its parameters
--   local S = lay:new_shard()      -- this rank's block of every bucket, one flat
--   lay:block(P.bucket[i], i)      -- rank's block of bucket i (a view)
--   local red = dist.reducer({ stream = comm })
--   red:reduce_scatter(S.bucket[i], P.bucket[i], cs)  -- after cs's work so far
--   red:wait(cs)                   -- cs waits for every collective launched
--
-- Each bucket is an allocation of its own: a collective on the comm stream
-- writes bucket i while the compute stream writes bucket i - 1, and the race
-- checker (and the allocator) know memory by allocation, not by byte range.
-- A shard buffer, written and read a bucket at a time on one stream each
-- way, is one allocation; one that is read bucket by bucket while a
-- collective writes the next blocks is split (new_shard{split = true}).
--
-- Every bucket is padded to a multiple of the world size, so that it splits
-- into equal blocks: reduce_scatter and all_gather need them, and the
-- padding (zeros in every buffer) stays zero through sums and Adam.
local gpu = require "gpu"

local M = {}

local Layout = {}
Layout.__index = Layout

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

local function check_shape(shape, where)
  if type(shape) ~= "table" or #shape == 0 then error(where .. " is not a shape (a list of sizes)", 3) end
  for _, s in ipairs(shape) do
    if math.type(s) ~= "integer" or s < 1 then error(where .. " has a size that is not a positive integer", 3) end
  end
end

---buckets: a list of buckets, each a list of shapes; opts.world (default
---gpu.world_size), opts.rank (default gpu.rank), opts.dtype (default f32)
function M.layout(buckets, opts)
  opts = opts or {}
  local world = opts.world or gpu.world_size or 1
  local rank = opts.rank or gpu.rank or 0
  if math.type(world) ~= "integer" or world < 1 then error("dist.layout: world must be a positive integer", 2) end
  if math.type(rank) ~= "integer" or rank < 0 or rank >= world then
    error("dist.layout: rank must be an integer in [0, world)", 2)
  end
  if type(buckets) ~= "table" or #buckets == 0 then error("dist.layout: buckets must be a non-empty list", 2) end
  local lay = setmetatable({ world = world, rank = rank, dtype = opts.dtype or "f32", buckets = {} }, Layout)
  local off = 0
  for i, shapes in ipairs(buckets) do
    if type(shapes) ~= "table" or #shapes == 0 then
      error(string.format("dist.layout: bucket %d must be a non-empty list of shapes", i), 2)
    end
    local b = { offset = off, shapes = shapes, offsets = {} }
    local n = 0
    for j, shape in ipairs(shapes) do
      check_shape(shape, string.format("dist.layout: bucket %d, parameter %d", i, j))
      b.offsets[j] = n
      n = n + numel(shape)
    end
    b.used = n
    b.numel = (n + world - 1) // world * world
    b.block = b.numel // world
    lay.buckets[i] = b
    off = off + b.numel
  end
  lay.numel = off
  lay.shard_numel = off // world
  return lay
end

-- views of one bucket's parameters in t, a tensor of the bucket's elements
local function bucket_views(b, t)
  local v = {}
  for j, shape in ipairs(b.shapes) do
    v[j] = t:narrow(1, b.offsets[j] + 1, numel(shape)):view(shape)
  end
  return v
end

---Zeroed buffers of the whole layout: bucket[i] (flat), views[i][j]
function Layout:new()
  local f = { bucket = {}, views = {} }
  for i, b in ipairs(self.buckets) do
    f.bucket[i] = gpu.zeros({ b.numel }, { dtype = self.dtype })
    f.views[i] = bucket_views(b, f.bucket[i])
  end
  return f
end

---Every bucket of f (from :new) in one new flat tensor, in layout order
function Layout:flatten(f)
  return gpu.cat(f.bucket, 1)
end

---Copies t (a tensor of the layout's numel elements, as :flatten gives) into f's buckets
function Layout:load(f, t)
  if t:numel() ~= self.numel then
    error(string.format("dist: the layout has %d elements, the tensor %d", self.numel, t:numel()), 2)
  end
  for i, b in ipairs(self.buckets) do f.bucket[i]:copy(t:narrow(1, b.offset + 1, b.numel)) end
  return f
end

---A buffer of bucket i alone: data, views[j] (its padding zeroed)
function Layout:new_bucket(i)
  local b = self.buckets[i] or error("dist: no bucket " .. tostring(i), 2)
  local data = gpu.empty({ b.numel }, { dtype = self.dtype })
  if b.numel > b.used then data:narrow(1, b.used + 1, b.numel - b.used):zero_() end
  return { data = data, views = bucket_views(b, data) }
end

---A zeroed flat buffer of this rank's shard: data, bucket[i] (its block of
---bucket i).  opts.split: each block an allocation of its own (no data), for
---a shard that a collective writes a bucket at a time while another stream
---reads the blocks already written (ZeRO-2's gradient shard, updated
---bucket by bucket as the reduce_scatters land)
function Layout:new_shard(opts)
  local split = opts and opts.split
  if split ~= nil and type(split) ~= "boolean" then error("dist: new_shard: split must be a boolean", 2) end
  local f = { bucket = {} }
  if split then
    for i, b in ipairs(self.buckets) do f.bucket[i] = gpu.zeros({ b.block }, { dtype = self.dtype }) end
    return f
  end
  f.data = gpu.zeros({ self.shard_numel }, { dtype = self.dtype })
  for i, b in ipairs(self.buckets) do
    f.bucket[i] = f.data:narrow(1, b.offset // self.world + 1, b.block)
  end
  return f
end

---Block `rank` (default this rank's) of bucket i, a view of t (the bucket's elements)
function Layout:block(t, i, rank)
  local b = self.buckets[i] or error("dist: no bucket " .. tostring(i), 2)
  rank = rank or self.rank
  if t:numel() ~= b.numel then
    error(string.format("dist: bucket %d has %d elements, the tensor %d", i, b.numel, t:numel()), 2)
  end
  return t:narrow(1, rank * b.block + 1, b.block)
end

-- ---- collectives on a communication stream, each after the work so far -----

local Reducer = {}
Reducer.__index = Reducer

---opts.stream: the communication stream (a new one by default); opts.op
---(default "avg"); opts.group: a process group
function M.reducer(opts)
  opts = opts or {}
  return setmetatable({ stream = opts.stream or gpu.stream(), op = opts.op or "avg",
                        group = opts.group, pending = {} }, Reducer)
end

-- the comm stream waits for cs's work so far, runs fn, and records the event
-- after which its result may be read
local function launch(self, cs, fn)
  self.stream:wait((cs or gpu.current_stream()):record())
  fn({ op = self.op, stream = self.stream, group = self.group })
  local ev = self.stream:record()
  self.pending[#self.pending + 1] = ev
  return ev
end

function Reducer:all_reduce(t, cs)
  return launch(self, cs, function(o) gpu.all_reduce(t, o) end)
end

function Reducer:reduce_scatter(out, t, cs)
  return launch(self, cs, function(o) gpu.reduce_scatter(out, t, o) end)
end

function Reducer:all_gather(out, t, cs)
  return launch(self, cs, function(o) gpu.all_gather(out, t, { stream = o.stream, group = o.group }) end)
end

---cs (default the current stream) waits for every collective launched since the last wait
function Reducer:wait(cs)
  cs = cs or gpu.current_stream()
  for _, ev in ipairs(self.pending) do cs:wait(ev) end
  self.pending = {}
end

return M
