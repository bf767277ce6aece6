---@meta gpu.dist
-- LuaLS annotations for `require "gpu.dist"`.  Checked by
-- tests/annotations.lua.  docs/lua-api.md, "Data parallelism (gpu.dist)";
-- stdlib/gpu/dist.lua.

---One bucket of a layout.
---@class gpu.DistBucket
---@field offset integer its first element in the flattened layout (0-based)
---@field numel integer its elements, padded to a multiple of the world size
---@field used integer its parameters' elements (the rest is zero padding)
---@field block integer numel / world: one rank's block
---@field shapes integer[][] its parameters' shapes
---@field offsets integer[] each parameter's first element in the bucket (0-based)

---Buffers of a whole layout (`lay:new()`): one allocation per bucket.
---@class gpu.DistFlat
---@field bucket gpu.Tensor[] bucket i, flat
---@field views gpu.Tensor[][] views[i][j]: parameter j of bucket i, in its shape

---One bucket's buffer (`lay:new_bucket(i)`).
---@class gpu.DistBucketBuffer
---@field data gpu.Tensor the bucket, flat (its padding zero)
---@field views gpu.Tensor[] its parameters, in their shapes

---This rank's shard (`lay:new_shard()`): one allocation, or one per block with `split`.
---@class gpu.DistShard
---@field data? gpu.Tensor the shard, flat (nil when split)
---@field bucket gpu.Tensor[] this rank's block of bucket i

---Parameters split into buckets, each padded to a multiple of the world size.
---@class gpu.DistLayout
---@field world integer ranks
---@field rank integer this rank
---@field dtype string the buffers' dtype
---@field numel integer elements of all buckets
---@field shard_numel integer numel / world
---@field buckets gpu.DistBucket[]
local Layout = {}

---Zeroed buffers of every bucket, with a view per parameter.
---@return gpu.DistFlat
function Layout:new() end

---A buffer of bucket i alone (its padding zeroed), e.g. a gradient kept until its reduce_scatter.
---@param i integer
---@return gpu.DistBucketBuffer
function Layout:new_bucket(i) end

---Options of `lay:new_shard`.
---@class gpu.DistShardOpts
---@field split? boolean each block an allocation of its own (no `data`)

---A zeroed buffer of this rank's block of every bucket.
---@param opts? gpu.DistShardOpts
---@return gpu.DistShard
function Layout:new_shard(opts) end

---Block `rank` (default this rank's) of bucket i, a view of t (the bucket's elements).
---@param t gpu.Tensor
---@param i integer
---@param rank? integer
---@return gpu.Tensor
function Layout:block(t, i, rank) end

---Every bucket of f in one new flat tensor.
---@param f gpu.DistFlat
---@return gpu.Tensor
function Layout:flatten(f) end

---Copies t (numel elements, as flatten gives) into f's buckets; returns f.
---@param f gpu.DistFlat
---@param t gpu.Tensor
---@return gpu.DistFlat
function Layout:load(f, t) end

---Options of `dist.layout`.
---@class gpu.DistLayoutOpts
---@field world? integer ranks (default gpu.world_size)
---@field rank? integer this rank (default gpu.rank)
---@field dtype? string the buffers' dtype (default "f32")

---Options of `dist.reducer`.
---@class gpu.DistReducerOpts
---@field stream? gpu.Stream the communication stream (default: a new one)
---@field op? "sum"|"avg"|"max"|"min"|"prod" the reduction (default "avg")
---@field group? gpu.Group a process group (default: every rank)

---Collectives on a communication stream, each after the work so far of a given stream.
---@class gpu.DistReducer
---@field stream gpu.Stream
---@field op string
---@field group? gpu.Group
---@field pending gpu.Event[] events of the collectives not yet waited for
local Reducer = {}

---all_reduce t in place after cs's work so far (default the current stream); returns the event after it.
---@param t gpu.Tensor
---@param cs? gpu.Stream
---@return gpu.Event
function Reducer:all_reduce(t, cs) end

---reduce_scatter t into out after cs's work so far; returns the event after it.
---@param out gpu.Tensor
---@param t gpu.Tensor
---@param cs? gpu.Stream
---@return gpu.Event
function Reducer:reduce_scatter(out, t, cs) end

---all_gather t into out after cs's work so far; returns the event after it.
---@param out gpu.Tensor
---@param t gpu.Tensor
---@param cs? gpu.Stream
---@return gpu.Event
function Reducer:all_gather(out, t, cs) end

---cs (default the current stream) waits for every collective launched since the last wait.
---@param cs? gpu.Stream
function Reducer:wait(cs) end

---Flat buffers with views, bucketed asynchronous collectives, shards.
---@class gpulua.dist
local dist = {}

---A layout of buckets, each a list of parameter shapes.
---@param buckets integer[][][]
---@param opts? gpu.DistLayoutOpts
---@return gpu.DistLayout
function dist.layout(buckets, opts) end

---A reducer on a communication stream.
---@param opts? gpu.DistReducerOpts
---@return gpu.DistReducer
function dist.reducer(opts) end

return dist
