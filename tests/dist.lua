-- gpu.dist, the module of scripts/zero.lua: layouts of buckets padded to the
-- world size, views that alias their bucket, blocks, shards, flatten/load;
-- the reducer's collectives after a stream's work (run alone: local copies;
-- tests/scripts.lua runs zero.lua with -n 2 and -n 4); bad input raises at
-- the caller's line.
local gpu = require "gpu"
local T = require "gpu.test"
local dist = require "gpu.dist"

T.test("a layout: buckets padded to a multiple of the world", function()
  local lay = dist.layout({ { { 3, 2 }, { 2 } }, { { 5 } } }, { world = 4, rank = 1 })
  T.is(lay.numel, 8 + 8, "bucket 1 (6 + 2) needs no padding, bucket 2 (5) pads to 8")
  T.is(lay.shard_numel, 4, "a shard is numel / world")
  T.is({ lay.buckets[1].offset, lay.buckets[2].offset }, { 0, 8 }, "the buckets' offsets")
  T.is({ lay.buckets[2].used, lay.buckets[2].block }, { 5, 2 }, "used elements, block")
  T.is(lay.buckets[1].offsets, { 0, 6 }, "parameters' offsets in their bucket")
  local P = lay:new()
  T.is(P.views[1][1].shape, { 3, 2 }, "a view has its parameter's shape")
  P.views[1][2]:fill(7)
  T.is(P.bucket[1]:totable(), { 0, 0, 0, 0, 0, 0, 7, 7 }, "a view writes its bucket")
  T.is(lay:block(P.bucket[1], 1):totable(), { 0, 0 }, "this rank's block of bucket 1: elements 3, 4")
  T.is(lay:block(P.bucket[1], 1, 3):totable(), { 7, 7 }, "rank 3's block: elements 7, 8")
  local S = lay:new_shard()
  T.is({ S.data:numel(), S.bucket[1]:numel(), S.bucket[2]:numel() }, { 4, 2, 2 }, "the shard's blocks")
  S.bucket[2]:fill(1)
  T.is(S.data:totable(), { 0, 0, 1, 1 }, "a shard's blocks are views of one buffer")
  local b = lay:new_bucket(2)
  b.views[1]:fill(3)
  T.is(b.data:totable(), { 3, 3, 3, 3, 3, 0, 0, 0 }, "a bucket buffer alone: its padding zero")
  P.views[2][1]:copy(gpu.arange(1, 6, { dtype = "f32" }))
  local flat = lay:flatten(P)
  T.is(flat:totable(), { 0, 0, 0, 0, 0, 0, 7, 7, 1, 2, 3, 4, 5, 0, 0, 0 }, "flatten: every bucket in order")
  local Q = lay:load(lay:new(), flat)
  T.is(lay:flatten(Q):totable(), flat:totable(), "load: flatten's inverse")
end)

T.test("a reducer runs after the given stream's work, on its own stream", function()
  local cs, comm = gpu.stream(), gpu.stream()
  local red = dist.reducer({ stream = comm, op = "sum" })
  local lay = dist.layout({ { { 4 } } })   -- run alone: world 1
  local P, S = lay:new(), lay:new_shard()
  P.bucket[1]:fill(2, { stream = cs })
  local ev = red:reduce_scatter(S.bucket[1], P.bucket[1], cs)
  T.ok(ev ~= nil and #red.pending == 1, "reduce_scatter returns its event, pending")
  red:all_reduce(P.bucket[1], cs)
  red:all_gather(P.bucket[1], S.bucket[1], cs)
  red:wait(cs)
  T.is(#red.pending, 0, "wait: nothing pending")
  T.is(P.bucket[1]:totable({ stream = cs }), { 2, 2, 2, 2 }, "the collectives of one rank: copies, in order")
end)

T.test("a split shard: a block per allocation, for work beside a collective", function()
  local lay = dist.layout({ { { 3, 2 }, { 2 } }, { { 5 } } }, { world = 4, rank = 1 })
  local S = lay:new_shard({ split = true })
  T.is(S.data, nil, "no one buffer")
  T.is({ S.bucket[1]:numel(), S.bucket[2]:numel() }, { 2, 2 }, "the blocks")
  S.bucket[2]:fill(1)
  T.is({ S.bucket[1]:totable(), S.bucket[2]:totable() }, { { 0, 0 }, { 1, 1 } }, "zeroed, apart")
  -- the race checker knows memory by allocation: a stream reading block 1
  -- beside another writing block 2 is refused in one buffer, not in split ones
  local was = gpu.check_races(true)
  local a, b = gpu.stream(), gpu.stream()
  local function beside(shard)
    shard.bucket[2]:fill(2, { stream = a })
    return pcall(function() return shard.bucket[1]:sum({ stream = b }) end)
  end
  local ok1, err1 = beside(lay:new_shard())
  local ok2, err2 = beside(lay:new_shard({ split = true }))
  gpu.synchronize()
  gpu.check_races(was)
  T.ok(not ok1 and tostring(err1):find("race", 1, true) ~= nil, "one buffer: a race")
  T.ok(ok2, "split: none")
  if not ok2 then T.diag(tostring(err2)) end
  local ok, err = pcall(function() lay:new_shard({ split = 1 }) end)
  T.ok(not ok and err:find("^tests/dist.lua:%d+: dist: new_shard: split must be a boolean") ~= nil,
       "a split that is not a boolean raises at the caller's line")
  if ok or not err:find("split must", 1, true) then T.diag(tostring(err)) end
end)

T.test("bad input raises at the caller's line", function()
  local function raises(fn, want, what)
    local ok, err = pcall(fn)
    T.ok(not ok and err:find(want, 1, true) ~= nil and err:find("^tests/dist.lua:%d+:") ~= nil, what)
    if ok or not err:find(want, 1, true) then T.diag(tostring(err)) end
  end
  raises(function() dist.layout({}) end, "buckets must be a non-empty list", "no buckets")
  raises(function() dist.layout({ {} }) end, "bucket 1 must be a non-empty list of shapes", "an empty bucket")
  raises(function() dist.layout({ { { 0 } } }) end, "bucket 1, parameter 1 has a size that is not a positive integer", "a size 0")
  raises(function() dist.layout({ { "x" } }) end, "bucket 1, parameter 1 is not a shape", "not a shape")
  raises(function() dist.layout({ { { 2 } } }, { world = 0 }) end, "world must be a positive integer", "world 0")
  raises(function() dist.layout({ { { 2 } } }, { world = 2, rank = 2 }) end, "rank must be an integer in [0, world)", "rank = world")
  local lay = dist.layout({ { { 4 } } }, { world = 2, rank = 0 })
  raises(function() lay:block(gpu.zeros({ 3 }), 1) end, "bucket 1 has 4 elements, the tensor 3", "a block of the wrong tensor")
  raises(function() lay:block(gpu.zeros({ 4 }), 2) end, "no bucket 2", "no such bucket")
  raises(function() lay:load(lay:new(), gpu.zeros({ 5 })) end, "the layout has 4 elements, the tensor 5", "load of the wrong size")
end)

T.done()
