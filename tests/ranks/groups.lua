-- Run by tests/groups.lua under `gpulua -n 4`: process groups.  Two groups
-- of two ({0,2} and {1,3}) run every collective at the same time with
-- different values; a split by colour and key; a group in a graph; a rank
-- outside a group refused; close.  Each rank prints its own TAP lines.
local gpu = require "gpu"
local T = require "gpu.test"

local r, w = gpu.rank, gpu.world_size
assert(w == 4, "run under -n 4")
local evens, odds = gpu.new_group({ 0, 2 }), gpu.new_group({ 1, 3 }, { name = "odds" })
local mine = r % 2 == 0 and evens or odds
-- the world ranks of my group, in group-rank order
local members = r % 2 == 0 and { 0, 2 } or { 1, 3 }

T.test("new_group: rank, size, ranks; nil on a rank outside", function()
  T.is(mine.rank, r // 2, "g.rank numbers the members in list order")
  T.is(mine.size, 2, "g.size")
  T.is(mine.ranks, members, "g.ranks: the members' world ranks")
  local other = r % 2 == 0 and odds or evens
  T.is(other.rank, nil, "a rank outside: g.rank is nil")
  T.is(other.size, nil, "a rank outside: g.size is nil")
  T.is(odds.name, "group 'odds'", "the name option names it")
  T.is(evens.name, "group {0,2}", "else its ranks do")
  T.raises(function() other:all_reduce(gpu.ones({ 2 })) end,
           "all_reduce: this rank %(" .. r .. "%) is not in group", "a rank outside is refused a collective")
  T.raises(function() gpu.broadcast(gpu.ones({ 2 }), { group = other }) end, "is not in group",
           "... through the option too")
end)

-- my group's values differ from the other group's: a mix-up shows
local function val(q, i) return (q + 1) * 10 + i end

T.test("two groups run every collective at the same time", function()
  local n = 3
  local function mk(q) local t = {} for i = 1, n do t[i] = val(q, i) end return gpu.tensor(t, { dtype = "f32" }) end
  local t = mk(r)
  mine:all_reduce(t)
  local want = {}
  for i = 1, n do want[i] = val(members[1], i) + val(members[2], i) end
  T.is(t:totable(), want, "all_reduce sums over the group's ranks only")
  local m = mk(r)
  gpu.all_reduce(m, { op = "max", group = mine })
  for i = 1, n do want[i] = val(members[2], i) end
  T.is(m:totable(), want, "all_reduce{op = 'max', group =}")
  local b = mk(r)
  mine:broadcast(b, { root = 1 })
  T.is(b:totable(), mk(members[2]):totable(), "broadcast's root is a group rank (1: the second member)")
  local red = mk(r)
  mine:reduce(red, { root = 0 })
  if mine.rank == 0 then
    for i = 1, n do want[i] = val(members[1], i) + val(members[2], i) end
    T.is(red:totable(), want, "reduce to group rank 0")
  end
  local out = gpu.empty({ 2 * n })
  mine:all_gather(out, mk(r))
  local g = mk(members[1]):totable()
  for i, v in ipairs(mk(members[2]):totable()) do g[n + i] = v end
  T.is(out:totable(), g, "all_gather: blocks in group-rank order")
  local rs = gpu.empty({ n })
  local src = {}
  for i = 1, 2 * n do src[i] = r * 100 + i end
  mine:reduce_scatter(rs, gpu.tensor(src, { dtype = "f32" }))
  for i = 1, n do want[i] = members[1] * 100 + members[2] * 100 + 2 * (mine.rank * n + i) end
  T.is(rs:totable(), want, "reduce_scatter: block g.rank of the group's sum")
  local got = gpu.empty({ n })
  local peer = 1 - mine.rank
  gpu.group(function()
    mine:send(mk(r), peer)
    mine:recv(got, peer)
  end)
  T.is(got:totable(), mk(members[peer + 1]):totable(), "send/recv: peers are group ranks")
  mine:barrier()
  T.ok(true, "a group's barrier")
end)

T.test("world collectives between group collectives", function()
  local t = gpu.full({ 2 }, r + 1)
  mine:all_reduce(t)
  gpu.all_reduce(t)
  -- each group's sum, then summed over the world: 2 * (1 + 2 + 3 + 4)... per group pair
  T.is(t:totable(), { 20, 20 }, "a world all_reduce after a group's")
end)

T.test("split_group: colour picks the group, key orders it", function()
  -- colour: r < 2; key: descending world rank
  local s <close> = gpu.split_group(r < 2 and 0 or 1, -r)
  local want = r < 2 and { 1, 0 } or { 3, 2 }
  T.is(s.ranks, want, "members ordered by key")
  T.is(s.rank, r < 2 and 1 - r or 3 - r, "g.rank follows the key")
  local out = gpu.empty({ 2 })
  s:all_gather(out, gpu.full({ 1 }, r))
  T.is(out:totable(), want, "all_gather in key order")
  local none <close> = gpu.split_group(r == 3 and 0 or nil)
  T.is(none.rank, r == 3 and 0 or nil, "colour nil: in no group")
  T.is(none.size, r == 3 and 1 or nil, "a group of one")
end)

T.test("a group's collective in a graph", function()
  local a = gpu.empty({ 2 })
  local g <close> = gpu.graph(function() mine:all_reduce(a) end)
  for k = 1, 3 do
    a:fill(r + k)
    g:launch()
    local s = members[1] + members[2] + 2 * k
    T.is(a:totable(), { s, s }, "replay " .. k)
  end
  -- captured on one group while the other group's ranks replay theirs
  gpu.synchronize()
end)

T.test("close: twice is fine, use after close refused", function()
  local g = gpu.new_group({ 0, 1, 2, 3 })
  T.is(g.size, 4, "a group of the whole world")
  local t = gpu.ones({ 2 })
  g:all_reduce(t)
  T.is(t:totable(), { 4, 4 }, "its all_reduce")
  g:close()
  g:close()
  T.ok(g.closed, "g.closed")
  T.raises(function() g:all_reduce(t) end, "all_reduce: group {0,1,2,3} is closed", "a collective after close")
  T.raises(function() return g.rank end, "is closed", "g.rank after close")
end)

T.test("bad arguments", function()
  T.raises(function() gpu.new_group({ 0, 0 }) end, "rank 0 is listed twice", "a rank twice")
  T.raises(function() gpu.new_group({ 0, 9 }) end, "entry 2 is not a rank of the world of 4", "a rank past the world")
  T.raises(function() gpu.new_group({}) end, "at least one rank", "an empty list")
  T.raises(function() gpu.all_reduce(gpu.ones({ 1 }), { group = 5 }) end, "bad option 'group' %(gpu.Group expected",
           "a group option that is not one")
  T.raises(function() mine:broadcast(gpu.ones({ 1 }), { root = 2 }) end, "2 is not a rank of", "a root past the group")
  T.raises(function() mine:send(gpu.ones({ 1 }), 3) end, "3 is not a rank of", "a peer past the group")
end)

gpu.synchronize()
T.done()
