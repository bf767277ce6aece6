-- Views (transpose, t, permute, unsqueeze, squeeze, expand, select, slice,
-- split, chunk, reshape): shapes and values against plain Lua, memory shared
-- with the base (write through a view, read the base), lifetime (the base
-- dropped while a view lives, also under GPULUA_HOST_JITTER=1), the errors.
local gpu = require "gpu"
local T = require "gpu.test"

-- a {2, 3, 4} i64 tensor holding 0..23 in C order, and the same as a Lua table
local function base(opts)
  return gpu.arange(0, 24, opts):view { 2, 3, 4 }
end
local function at(i, j, k) return (i - 1) * 12 + (j - 1) * 4 + (k - 1) end

T.test("transpose, t and permute", function()
  local a = base()
  local tr = a:transpose(1, 3)
  T.is(tr.shape, { 4, 3, 2 }, "transpose(1, 3) shape")
  T.is(tr:is_contiguous(), false, "a transpose is not contiguous")
  T.is(tr:get(2, 3, 1), at(1, 3, 2), "transpose(1, 3)[2][3][1] is a[1][3][2]")
  T.is(a:transpose(-1, 1):totable(), tr:totable(), "negative dims count from the end")
  T.is(a:transpose(2, 2):totable(), a:totable(), "transpose of a dim with itself")
  local m = gpu.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  T.is(m:t():totable(), { { 1, 4 }, { 2, 5 }, { 3, 6 } }, "t() of a 2-D tensor")
  local v = gpu.tensor({ 1, 2, 3 })
  T.ok(rawequal(v:t(), v), "t() of a 1-D tensor is the tensor itself")
  local s = gpu.tensor(5)
  T.ok(rawequal(s:t(), s), "t() of a 0-D tensor is the tensor itself")
  local p = a:permute { 3, 1, 2 }
  T.is(p.shape, { 4, 2, 3 }, "permute{3, 1, 2} shape")
  T.is(p:get(4, 2, 1), at(2, 1, 4), "permute{3, 1, 2}[4][2][1] is a[2][1][4]")
  T.is(a:permute(3, 1, 2):totable(), p:totable(), "permute as arguments")
  T.is(a:permute { -1, 1, 2 }:totable(), p:totable(), "permute with a negative dim")
  T.is(a:permute { 1, 2, 3 }:is_contiguous(), true, "the identity permutation stays contiguous")
  T.is(p:contiguous():totable(), p:totable(), "contiguous() of a permuted view")
  T.is(m:t():matmul(m).shape, { 3, 3 }, "matmul of a transposed view")
  T.is(gpu.tensor(3):permute {}:item(), 3.0, "permute{} of a 0-dim tensor")
end)

T.test("unsqueeze and squeeze", function()
  local a = base()
  T.is(a:unsqueeze(1).shape, { 1, 2, 3, 4 }, "unsqueeze(1)")
  T.is(a:unsqueeze(2).shape, { 2, 1, 3, 4 }, "unsqueeze(2)")
  T.is(a:unsqueeze(4).shape, { 2, 3, 4, 1 }, "unsqueeze(ndim + 1) adds a last dim")
  T.is(a:unsqueeze(-1).shape, { 2, 3, 4, 1 }, "unsqueeze(-1) adds a last dim")
  T.is(a:unsqueeze(-2).shape, { 2, 3, 1, 4 }, "unsqueeze(-2)")
  T.is(a:unsqueeze(3):is_contiguous(), true, "unsqueeze keeps a contiguous tensor contiguous")
  T.is(a:unsqueeze(3):squeeze(3):totable(), a:totable(), "squeeze(d) undoes unsqueeze(d)")
  T.is(gpu.tensor(7):unsqueeze(1):totable(), { 7.0 }, "unsqueeze of a 0-dim tensor")
  local u = gpu.zeros({ 1, 3, 1, 2, 1 })
  T.is(u:squeeze().shape, { 3, 2 }, "squeeze() removes every dim of size 1")
  T.is(u:squeeze(3).shape, { 1, 3, 2, 1 }, "squeeze(3)")
  T.is(u:squeeze(-1).shape, { 1, 3, 1, 2 }, "squeeze(-1)")
  T.is(u:squeeze(2).shape, { 1, 3, 1, 2, 1 }, "squeeze of a dim whose size is not 1 keeps the shape (PyTorch)")
  T.is(gpu.ones({ 1, 1 }):squeeze().shape, {}, "squeeze of {1, 1} is 0-dim")
  T.is(gpu.ones({ 1, 1 }):squeeze():item(), 1.0, "and holds the element")
  local full = gpu.zeros { 8, 1, 1, 1, 1, 1, 1, 1 }
  T.raises_at(function() full:unsqueeze(1) end, "unsqueeze: the tensor has 8 dims already", "unsqueeze past 8 dims")
end)

T.test("expand", function()
  local c = gpu.tensor({ 1, 2, 3 }, { dtype = "f32" }):view { 3, 1 }
  local e = c:expand { 3, 4 }
  T.is(e.shape, { 3, 4 }, "expand{3, 4} shape")
  T.is(e:totable(), { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 3, 3, 3, 3 } }, "expand{3, 4} values")
  T.is(c:expand(2, 3, 4).shape, { 2, 3, 4 }, "expand with a new leading dim, sizes as arguments")
  T.is(c:expand { -1, 5 }.shape, { 3, 5 }, "-1 keeps a size")
  T.is(c:expand { 3, 1 }:totable(), c:totable(), "expand to the same shape")
  T.is(gpu.tensor(2):expand { 2, 2 }:totable(), { { 2.0, 2.0 }, { 2.0, 2.0 } }, "expand of a 0-dim tensor")
  T.is((e + 1):totable(), { { 2, 2, 2, 2 }, { 3, 3, 3, 3 }, { 4, 4, 4, 4 } }, "an expanded view as an operand")
  T.is(e:contiguous():is_contiguous(), true, "contiguous() of an expanded view copies")
  T.is(e:sum():item(), 24.0, "a reduction of an expanded view")
  -- writes through an expanded view are refused, as PyTorch refuses them
  local msg = "expanded view"
  T.raises_at(function() e:fill(0) end, msg, "fill of an expanded view raises")
  T.raises_at(function() e:add_(1) end, msg, "add_ on an expanded view raises")
  T.raises_at(function() e:copy(gpu.zeros { 3, 4 }) end, msg, "copy into an expanded view raises")
  T.raises_at(function() e:zero_() end, msg, "zero_ of an expanded view raises")
  T.raises_at(function() gpu.zeros({ 3, 4 }):add(1, { out = e }) end, msg, "an expanded view as out raises")
  -- issue 35: set wrote through it (all the rows that share the element)
  local full = "the output is an expanded view %(stride 0 along dim 2%): several of its elements are one "
            .. "memory location; write into t:clone%(%) instead"
  T.raises_at(function() e:fill(0) end, "fill: " .. full, "fill's message")
  T.raises_at(function() e:set(1, 1, 5) end, "set: " .. full, "set of an expanded view raises, as fill does")
  for _, kind in ipairs({ "pinned", "host" }) do
    local h = gpu.tensor({ 1, 2, 3 }, { device = kind }):view { 3, 1 }:expand { 3, 4 }
    T.raises_at(function() h:set(2, 3, 5) end, "set: " .. full, "set of an expanded " .. kind .. " view raises")
    T.is(h:totable()[2], { 2, 2, 2, 2 }, "and leaves the " .. kind .. " tensor as it was")
  end
  T.raises_at(function() e:masked_fill_(gpu.ones({ 3, 4 }, { dtype = "bool" }), 2) end, msg, "masked_fill_ raises")
  T.raises_at(function() e:scatter_add_(1, gpu.ones({ 1, 4 }, { dtype = "i64" }), gpu.ones { 1, 4 }) end, msg,
              "scatter_add_ raises")
  T.raises_at(function() e:copy(gpu.zeros({ 3, 4 }, { device = "host" })) end, msg,
              "a copy from pageable memory into an expanded view raises")
  T.raises_at(function() gpu.ones({ 3, 4 }):cumsum(1, { out = e }) end, msg, "cumsum into an expanded out raises")
  T.raises_at(function() gpu.matmul(gpu.ones { 3, 2 }, gpu.ones { 2, 4 }, { out = e }) end, msg,
              "matmul into an expanded out raises")
  T.raises_at(function() gpu.ones({ 3, 4 }):gather(1, gpu.ones({ 3, 4 }, { dtype = "i64" }), { out = e }) end, msg,
              "gather into an expanded out raises")
  T.raises_at(function() gpu.ones({ 3, 4 }):sum({ dim = 1, out = gpu.zeros({ 1 }):expand { 4 } }) end, msg,
              "a reduction into an expanded out raises")
  T.raises(function() e[1] = 5 end, "read%-only", "t[i] = v is not a write (fields are read-only)")
  T.is(e:select(1, 2):totable(), { 2, 2, 2, 2 }, "the view reads as before")
  T.is(c:totable(), { { 1 }, { 2 }, { 3 } }, "the base is untouched")
  T.is(c:expand { 3, 4 }:clone():fill(7):sum():item(), 84.0, "a clone of an expanded view is writable")
  T.is(e:select(2, 1):clone():add_(1):totable(), { 2, 3, 4 }, "a slice of size 1 along the expanded dim")
end)

T.test("select and slice", function()
  local a = base()
  local s = a:select(2, 3)
  T.is(s.shape, { 2, 4 }, "select drops the dim")
  T.is(s:totable(), { { 8, 9, 10, 11 }, { 20, 21, 22, 23 } }, "select(2, 3) values")
  T.is(a:select(2, -1):totable(), s:totable(), "select(2, -1) is the last")
  T.is(a:select(1, 2):select(1, 3):select(1, 4).shape, {}, "select down to a 0-dim tensor")
  T.is(a:select(1, 2):select(1, 3):select(1, 4):item(), 23, "whose item is the element")
  local r = gpu.arange(1, 11)   -- 1..10
  T.is(r:slice(1, 3, 5):totable(), { 3, 4, 5 }, "slice(1, 3, 5) is inclusive")
  T.is(r:slice(1, 8):totable(), { 8, 9, 10 }, "slice without an end runs to the last")
  T.is(r:slice(1, -3):totable(), { 8, 9, 10 }, "a negative start counts from the end")
  T.is(r:slice(1, 2, -2):totable(), { 2, 3, 4, 5, 6, 7, 8, 9 }, "a negative end counts from the end")
  T.is(r:slice(1, -100, 2):totable(), { 1, 2 }, "a start before the first is clipped, as string.sub")
  T.is(r:slice(1, 0, 2):totable(), { 1, 2 }, "start 0 is 1, as string.sub")
  T.is(r:slice(1, 9, 100):totable(), { 9, 10 }, "an end past the last is clipped")
  T.is(r:slice(1, 1, -1, 3):totable(), { 1, 4, 7, 10 }, "every 3rd")
  T.is(r:slice(1, 2, 9, 3):totable(), { 2, 5, 8 }, "every 3rd of 2..9")
  T.is(r:slice(1, 1, -1, 3):is_contiguous(), false, "a stepped slice is strided")
  local cols = a:slice(3, 2, 4, 2)
  T.is(cols.shape, { 2, 3, 2 }, "slice along the last dim")
  T.is(cols:select(1, 2):select(1, 1):totable(), { at(2, 1, 2), at(2, 1, 4) }, "its values")
  T.is(a:slice(-1, 2, 3):totable(), a:narrow(3, 2, 2):totable(), "slice(-1, 2, 3) is narrow(3, 2, 2)")
end)

T.test("split and chunk return tables of views", function()
  local r = gpu.arange(0, 10)
  local parts = r:split(4)
  T.is(#parts, 3, "split(4) of 10 makes 3 pieces")
  T.is({ parts[1]:totable(), parts[2]:totable(), parts[3]:totable() }, { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9 } },
       "the last is shorter")
  local sizes = r:split({ 2, 3, 5 })
  T.is({ sizes[1]:numel(), sizes[2]:numel(), sizes[3]:numel() }, { 2, 3, 5 }, "split({2, 3, 5})")
  T.is(sizes[3]:totable(), { 5, 6, 7, 8, 9 }, "split({2, 3, 5})[3]")
  local a = base()
  local cols = a:split(3, -1)
  T.is({ cols[1].shape, cols[2].shape }, { { 2, 3, 3 }, { 2, 3, 1 } }, "split along the last dim")
  T.is(cols[2]:totable(), a:narrow(3, 4, 1):totable(), "split's pieces are narrow views")
  local ch = r:chunk(3)
  T.is({ #ch, ch[1]:numel(), ch[2]:numel(), ch[3]:numel() }, { 3, 4, 4, 2 }, "chunk(3) of 10: ceil(10/3) each")
  T.is(#gpu.arange(0, 4):chunk(3), 2, "chunk(3) of 4 gives 2 pieces of 2 (as PyTorch)")
  T.is(#r:chunk(20), 10, "chunk(n) of fewer than n elements: one each")
  local rows = a:chunk(2, 2)
  T.is({ rows[1].shape, rows[2].shape }, { { 2, 2, 4 }, { 2, 1, 4 } }, "chunk along dim 2")
  local x, y = table.unpack(a:chunk(2))
  T.is({ x.shape, y.shape }, { { 1, 3, 4 }, { 1, 3, 4 } }, "table.unpack gives the pieces as values")
end)

T.test("reshape: a view when the strides allow, else a copy", function()
  local a = base()
  local r = a:reshape { 6, 4 }
  T.is(r.shape, { 6, 4 }, "reshape of a contiguous tensor")
  r:set(1, 2, 100)
  T.is(a:get(1, 1, 2), 100, "is a view: a write through it shows in the base")
  r:set(1, 2, 1)
  T.is(a:reshape(4, -1).shape, { 4, 6 }, "-1 infers a size")
  T.is(a:reshape { -1 }:totable(), gpu.arange(0, 24):totable(), "reshape{-1} flattens")
  T.is(gpu.tensor({ 5 }):reshape({}).shape, {}, "reshape{} of one element is 0-dim")
  T.is(gpu.tensor(5):reshape { 1, 1 }.shape, { 1, 1 }, "reshape of a 0-dim tensor")
  local tr = a:transpose(1, 2)                 -- {3, 2, 4}, not contiguous
  local f = tr:reshape { 3, 8 }                -- merges dims 2 and 3: needs a copy
  T.is(f:totable(), tr:contiguous():view { 3, 8 }:totable(), "reshape of a transposed view (a copy)")
  f:set(1, 1, 99)
  T.is(a:get(1, 1, 1), 0, "the copy does not share the base's memory")
  local keep = tr:reshape { 3, 2, 2, 2 }         -- splits the last dim: a view
  keep:set(1, 1, 1, 2, 77)
  T.is(a:get(1, 1, 2), 77, "splitting one dim of a transposed view is a view")
  local cols = a:slice(3, 1, -1, 2)            -- {2, 3, 2}, stride 2 along the last
  T.is(cols:reshape { 6, 2 }:totable(), cols:contiguous():view { 6, 2 }:totable(), "reshape of a stepped slice")
  local e = gpu.tensor({ 1, 2 }):view { 2, 1 }:expand { 2, 3 }
  T.is(e:reshape { 6 }:totable(), { 1, 1, 1, 2, 2, 2 }, "reshape of an expanded view")
  T.is(e:reshape { 2, 3, 1 }:is_contiguous(), false, "which stays a view where it can")
end)

T.test("views share memory and outlive their base", function()
  local a = base()
  a:transpose(1, 3):select(1, 2):fill(-1)     -- a[:, :, 2] = -1
  T.is(a:select(3, 2):totable(), { { -1, -1, -1 }, { -1, -1, -1 } }, "fill through a transposed select")
  a:slice(2, 1, 3, 2):add_(1000)               -- rows 1 and 3
  T.is(a:get(2, 3, 4), at(2, 3, 4) + 1000, "add_ through a stepped slice")
  T.is(a:get(2, 2, 4), at(2, 2, 4), "skips the rows between")
  local p = a:permute { 2, 3, 1 }
  p:copy(gpu.zeros({ 3, 4, 2 }, { dtype = "i64" }))
  T.is(a:sum():item(), 0, "copy into a permuted view writes the base")
  for _, kind in ipairs { "device", "pinned", "host" } do
    local v
    do
      local b = gpu.arange(0, 1000, { device = kind }):view { 10, 100 }
      v = b:t():slice(1, 3, 5):select(2, 4)    -- b[4][3..5]
    end
    collectgarbage()
    collectgarbage()
    T.is(v:totable(), { 302, 303, 304 }, kind .. ": a view keeps its base's memory alive")
  end
end)

T.test("lifetime under GPULUA_HOST_JITTER=1", function()
  if gpu.backend ~= "host" then return T.skip("jitter", "host backend only") end
  local code = [[
local gpu = require "gpu"
local s = gpu.stream()
local bad = 0
for i = 1, 40 do
  local v
  do
    local b = gpu.arange(0, 4096, { stream = s }):view { 64, 64 }
    v = b:t():slice(1, 2, -1, 2):unsqueeze(1):expand { 3, 32, 64 }
  end
  collectgarbage()
  local w = (v + i):sum({ stream = s })
  local want = 0
  for col = 2, 64, 2 do for row = 1, 64 do want = want + (row - 1) * 64 + (col - 1) + i end end
  if w:item() ~= 3 * want then bad = bad + 1 end
end
print("bad=" .. bad)
]]
  local f = T.tmpfile(code)
  local out, ok = T.run("GPULUA_HOST_JITTER=1", f)
  os.remove(f)
  T.ok(ok, "the child exits 0")
  T.is(out:match("bad=(%d+)"), "0", "views of dropped bases read the right values under jitter")
  if not ok then T.diag(out) end
end)

T.test("bad arguments name the method and the argument", function()
  local a = base()
  T.raises_at(function() a:transpose(1, 4) end, "bad argument #2 to 'transpose' (dim 4 out of range for a 3-dim tensor",
              "transpose dim out of range")
  T.raises_at(function() a:transpose(0, 1) end, "bad argument #1 to 'transpose' (dim 0 out of range", "dim 0")
  T.raises_at(function() a:transpose("x", 1) end, "bad argument #1 to 'transpose' (integer dim expected, got string)",
              "a dim that is no number")
  T.raises_at(function() a:transpose(1.5, 1) end, "integer dim expected, got 1.5", "a non-integer dim")
  T.raises_at(function() a:t() end, "t: needs a tensor of at most 2 dims, got 3", "t() of a 3-D tensor")
  T.raises_at(function() a:permute { 1, 2 } end, "bad argument #1 to 'permute' (2 dims given for a 3-dim tensor",
              "permute with too few dims")
  T.raises_at(function() a:permute { 1, 1, 2 } end, "dim 1 appears twice", "permute with a repeated dim")
  T.raises_at(function() a:permute { 1, 2, 4 } end, "dims[3] = 4 out of range", "permute with a dim out of range")
  T.raises_at(function() a:permute { 1, 2, "x" } end, "dims[3] must be an integer, got string", "permute with a string")
  T.raises_at(function() a:unsqueeze(5) end, "bad argument #1 to 'unsqueeze' (dim 5 out of range for a 4-dim tensor",
              "unsqueeze past ndim + 1")
  T.raises_at(function() a:squeeze(4) end, "bad argument #1 to 'squeeze' (dim 4 out of range", "squeeze dim")
  T.raises_at(function() a:expand { 3, 3, 4 } end, "cannot expand dim 1 of {2,3,4} from size 2 to 3", "expand a dim > 1")
  T.raises_at(function() a:expand { 3, 4 } end, "2 sizes given for a 3-dim tensor", "expand to fewer dims")
  T.raises_at(function() a:expand { -1, 2, 3, 4 } end, "shape[1] = -1 for a new leading dim", "-1 for a new dim")
  T.raises_at(function() a:expand { 2, 3, -2 } end, "shape[3] must be non-negative or -1, got -2", "expand to -2")
  T.raises_at(function() a:select(2, 4) end, "bad argument #2 to 'select' (index 4 out of range for dim 2 of size 3 (1..3, or -3..-1))",
              "select index past the end")
  T.raises_at(function() a:select(2, -4) end, "index -4 out of range", "select index before the start")
  T.raises_at(function() a:select(2, 0) end, "index 0 out of range", "select index 0")
  T.raises_at(function() gpu.tensor(1):select(1, 1) end, "dim 1 out of range for a 0-dim tensor", "select of 0-dim")
  T.raises_at(function() a:slice(1, 1, 2, 0) end, "bad argument #4 to 'slice' (step must be positive, got 0)", "step 0")
  T.raises_at(function() a:slice(1, 1, 2, -1) end, "step must be positive, got -1", "negative step")
  T.raises_at(function() a:slice(1, 1.5) end, "integer start expected, got 1.5", "slice start 1.5")
  T.raises_at(function() a:split(0) end, "bad argument #1 to 'split' (size must be positive, got 0)", "split(0)")
  T.raises_at(function() a:split({ 1, 2 }, 1) end, "sizes sum to 3, dim 1 has size 2", "split sizes too many")
  T.raises_at(function() a:split({ 1 }, 2) end, "sizes sum to 1, dim 2 has size 3", "split sizes too few")
  T.raises_at(function() a:split(1, 4) end, "bad argument #2 to 'split' (dim 4 out of range", "split dim")
  T.raises_at(function() a:chunk(0) end, "chunk count must be positive, got 0", "chunk(0)")
  T.raises_at(function() gpu.tensor(1):chunk(2) end, "chunk: a 0-dim tensor has no dim to split", "chunk of 0-dim")
  T.raises_at(function() a:reshape { 5, -1 } end, "cannot infer -1: 24 elements are not divisible by 5", "reshape -1")
  T.raises_at(function() a:reshape { 5, 5 } end, "shape {5,5} (25 elements) does not match {2,3,4} (24 elements)",
              "reshape to a wrong count")
  T.raises_at(function() a:reshape { -1, -1 } end, "only one size may be -1", "reshape with two -1")
  T.raises_at(function() a:reshape() end, "bad argument #1 to 'reshape' (shape expected", "reshape without a shape")
  local closed = base()
  closed:close()
  T.raises_at(function() closed:transpose(1, 2) end, "tensor is closed", "a view of a closed tensor")
end)

T.test("gpu.cat and gpu.stack", function()
  local a, b = gpu.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "f32" }), gpu.tensor({ { 5, 6 } }, { dtype = "f32" })
  T.is(gpu.cat { a, b }:totable(), { { 1, 2 }, { 3, 4 }, { 5, 6 } }, "cat along dim 1")
  T.is(gpu.cat({ a, b:t() }, 2):totable(), { { 1, 2, 5 }, { 3, 4, 6 } }, "cat along dim 2 of a transposed view")
  T.is(gpu.cat({ a, a }, -1).shape, { 2, 4 }, "cat along dim -1")
  T.is(gpu.cat({ a }):totable(), a:totable(), "cat of one tensor is a copy")
  T.ok(not rawequal(gpu.cat({ a }), a), "a new tensor")
  T.is(gpu.stack { a, a + 10 }:totable(), { { { 1, 2 }, { 3, 4 } }, { { 11, 12 }, { 13, 14 } } }, "stack along dim 1")
  T.is(gpu.stack({ a, a + 10 }, 3):totable(), { { { 1, 11 }, { 2, 12 } }, { { 3, 13 }, { 4, 14 } } }, "stack along dim 3")
  T.is(gpu.stack({ a, a }, -1).shape, { 2, 2, 2 }, "stack along dim -1 (a new last dim)")
  T.is(gpu.stack({ gpu.tensor(1.0), gpu.tensor(2.0) }):totable(), { 1.0, 2.0 }, "stack of 0-dim tensors")
  local o = gpu.zeros { 3, 2 }
  T.ok(rawequal(gpu.cat({ a, b }, { out = o }), o), "cat{out =} returns out")
  T.is(o:totable(), { { 1, 2 }, { 3, 4 }, { 5, 6 } }, "and fills it")
  local big = gpu.zeros { 4, 5 }
  gpu.stack({ gpu.tensor { 1.0, 2 }, gpu.tensor { 3.0, 4 } }, 2, { out = big:slice(1, 2, 3):slice(2, 1, 4, 2) })
  T.is(big:totable(), { { 0, 0, 0, 0, 0 }, { 1, 0, 3, 0, 0 }, { 2, 0, 4, 0, 0 }, { 0, 0, 0, 0, 0 } },
       "stack into a strided view of a bigger tensor")
  local halves = gpu.arange(0, 8, { dtype = "i32" })
  gpu.cat({ halves:slice(1, 1, 2), halves:slice(1, 3, 4) }, { out = halves:slice(1, 5, 8) })
  T.is(halves:totable(), { 0, 1, 2, 3, 0, 1, 2, 3 }, "out may share a buffer with the inputs where they do not overlap")
  local big = gpu.arange(1, 13, { dtype = "f32" }):view { 4, 3 }
  gpu.cat({ gpu.zeros { 2, 3 }, big:slice(1, 1, 2) }, { out = big })
  T.is(big:totable(), { { 0, 0, 0 }, { 0, 0, 0 }, { 1, 2, 3 }, { 4, 5, 6 } },
       "out overlapping an input: every input is read before out is written")
  local s = gpu.stream()
  local r = gpu.cat({ a, b }, 1, { stream = s })
  s:synchronize()
  T.is(r:totable(), { { 1, 2 }, { 3, 4 }, { 5, 6 } }, "on a stream")
  for _, kind in ipairs { "pinned", "host" } do
    local h = gpu.cat { a:to(kind), b:to(kind) }
    T.is({ h.device, h:totable() }, { kind, { { 1, 2 }, { 3, 4 }, { 5, 6 } } }, "cat in " .. kind .. " memory")
  end
  T.is(gpu.cat({ a:to("pinned"), b:to("host") }).device, "pinned", "pinned and pageable mix (list[1]'s memory)")
  for _, dt in ipairs(T.dtypes) do
    local x = gpu.ones({ 2, 3 }, { dtype = dt })
    T.is(gpu.cat({ x, x }, 2).dtype, dt, "cat of " .. dt)
  end
end)

T.test("gpu.cat and gpu.stack: bad arguments", function()
  local a, b = gpu.zeros { 2, 3 }, gpu.zeros { 2, 4 }
  T.raises_at(function() gpu.cat {} end, "bad argument #1 to 'cat' (the list is empty", "an empty list")
  T.raises_at(function() gpu.cat(a) end, "bad argument #1 to 'cat' (table expected, got gpu.Tensor)", "a tensor, no list")
  T.raises_at(function() gpu.cat { a, 3 } end, "list[2]: gpu.Tensor expected, got number", "a number in the list")
  T.raises_at(function() gpu.cat { a, a:to("f64") } end, 'list[2] has dtype f64, list[1] f32 (cast with :to("f32"))',
              "mixed dtypes")
  T.raises_at(function() gpu.cat { a, a:to("pinned") } end, "list[2] is in pinned memory, list[1] in device",
              "device and host memory")
  T.raises_at(function() gpu.cat { a, b } end, "list[2] has shape {2,4}, list[1] {2,3}: sizes must match except in dim 1",
              "cat shapes")
  T.raises_at(function() gpu.cat({ a, gpu.zeros { 2 } }, 2) end, "list[2] has shape {2}, list[1] {2,3}", "cat ndims")
  T.raises_at(function() gpu.stack { a, b } end, "list[2] has shape {2,4}, list[1] {2,3}: stack needs equal shapes",
              "stack shapes")
  T.raises_at(function() gpu.cat({ a, a }, 3) end, "bad argument #2 to 'cat' (dim 3 out of range for a 2-dim tensor",
              "cat dim out of range")
  T.raises_at(function() gpu.stack({ a, a }, 4) end, "bad argument #2 to 'stack' (dim 4 out of range for a 3-dim", "stack dim")
  T.raises_at(function() gpu.cat { gpu.tensor(1), gpu.tensor(2) } end, "list[1] is a 0-dim tensor", "cat of 0-dim")
  T.raises_at(function() gpu.cat({ a, a }, { dim = 2 }) end, "unknown option 'dim'", "dim is an argument, not an option")
  T.raises_at(function() gpu.cat({ a, a }, { out = gpu.zeros { 4, 4 } }) end,
              "bad option 'out' to 'cat' (f32 {4,4} does not match the result f32 {4,3})", "out of the wrong shape")
  T.raises_at(function() gpu.cat({ a, a }, { out = gpu.zeros({ 4, 3 }, { dtype = "f64" }) }) end,
              "does not match the result f32 {4,3}", "out of the wrong dtype")
  T.raises_at(function() gpu.cat({ a, a }, { out = gpu.zeros({ 4, 3 }, { device = "host" }) }) end,
              "bad option 'out' to 'cat' (tensor is in host memory, the list in device)", "out in other memory")
  T.raises_at(function() gpu.cat({ a, a }, { out = gpu.zeros { 1, 3 }:expand { 4, 3 } }) end, "expanded view",
              "an expanded out")
  local c = gpu.zeros { 2, 3 }
  c:close()
  T.raises_at(function() gpu.cat { a, c } end, "list[2]: tensor is closed", "a closed tensor in the list")
end)

T.test("linspace and eye", function()
  T.is(gpu.linspace(0, 1, 5):totable(), { 0, 0.25, 0.5, 0.75, 1 }, "linspace(0, 1, 5)")
  T.is(gpu.linspace(0, 1, 5).dtype, "f32", "f32 by default")
  local l = gpu.linspace(0.1, 0.7, 13, { dtype = "f64" }):totable()
  T.is({ l[1], l[13] }, { 0.1, 0.7 }, "the first is a and the last exactly b")
  T.is(gpu.linspace(3, -3, 4, { dtype = "i32" }):totable(), { 3, 1, -1, -3 }, "decreasing, integers")
  T.is(gpu.linspace(-3, 3.5, 5, { dtype = "i64" }):totable(), { -3, -2, 0, 1, 3 }, "integer dtypes floor (as NumPy)")
  T.is(gpu.linspace(2, 9, 1):totable(), { 2.0 }, "one value is a")
  T.is(gpu.linspace(0, 1, 3, { device = "host" }).device, "host", "opts.device")
  T.is(gpu.eye(3):totable(), { { 1, 0, 0 }, { 0, 1, 0 }, { 0, 0, 1 } }, "eye(3)")
  T.is(gpu.eye(2, 3, { dtype = "i8" }):totable(), { { 1, 0, 0 }, { 0, 1, 0 } }, "eye(2, 3)")
  T.is(gpu.eye(3, 2):totable(), { { 1, 0 }, { 0, 1 }, { 0, 0 } }, "eye(3, 2)")
  T.is(gpu.eye(2, nil, { dtype = "bool" }):totable(), { { true, false }, { false, true } }, "eye(2, nil, opts)")
  T.is(gpu.eye(2, { dtype = "f64" }).dtype, "f64", "eye(n, opts)")
  T.raises_at(function() gpu.linspace(0, 1, -1) end, "bad argument #3 to 'linspace' (count must be non-negative, got -1)",
              "linspace count -1")
  T.raises_at(function() gpu.linspace(0, 1, 2.5) end, "integer count expected, got 2.5", "linspace count 2.5")
  T.raises_at(function() gpu.linspace(0, "x", 2) end, "bad argument #2 to 'linspace' (number expected", "linspace b")
  T.raises_at(function() gpu.eye(-1) end, "bad argument #1 to 'eye' (row count must be non-negative, got -1)", "eye(-1)")
  T.raises_at(function() gpu.eye(2, -1) end, "bad argument #2 to 'eye' (column count must be non-negative", "eye(2, -1)")
  T.raises_at(function() gpu.eye(2, 2, { dtyp = "f32" }) end, "unknown option 'dtyp'", "eye with a misspelt option")
end)

T.test("randint", function()
  local r = gpu.randint(-5, 5, { 100, 100 })
  T.is({ r.dtype, r.shape }, { "i64", { 100, 100 } }, "i64 by default")
  T.is({ r:min():item(), r:max():item() }, { -5, 4 }, "in [lo, hi): hi is exclusive")
  local counts = {}
  for _, v in ipairs(T.flatten(r:totable())) do counts[v] = (counts[v] or 0) + 1 end
  local spread = true
  for v = -5, 4 do spread = spread and (counts[v] or 0) > 800 and counts[v] < 1200 end
  T.ok(spread, "about uniform: each of 10 values 800..1200 times in 10000")
  T.is(gpu.randint(0, 10, 50, { seed = 7 }):totable(), gpu.randint(0, 10, 50, { seed = 7 }):totable(),
       "opts.seed: the same numbers")
  gpu.seed(123)
  local a = gpu.randint(0, 1000, 20):totable()
  gpu.seed(123)
  T.is(gpu.randint(0, 1000, 20):totable(), a, "gpu.seed makes it reproducible")
  T.isnt(gpu.randint(0, 1000, 20):totable(), a, "the generator moves on")
  T.is(gpu.randint(0, 100, 64, { seed = 9, dtype = "f32" }):totable(),
       gpu.randint(0, 100, 64, { seed = 9 }):to("f32"):totable(), "a float dtype holds the same integers")
  for _, dt in ipairs(T.dtypes) do
    local lo, hi = -3, 4
    if dt == "u8" then lo = 250 hi = 256 end
    if dt == "bool" then lo, hi = 0, 2 end
    local x = gpu.randint(lo, hi, 500, { dtype = dt, seed = 1 })
    T.is(x.dtype, dt, "randint " .. dt)
    if dt ~= "bool" then
      T.ok(x:min():item() >= lo and x:max():item() <= hi - 1, "randint " .. dt .. " in range")
    else
      T.is({ x:any():item(), x:all():item() }, { true, false }, "randint bool: both values")
    end
  end
  local big = gpu.randint(math.mininteger, math.maxinteger, 1000, { seed = 3 })
  T.ok(big:min():item() < -(1 << 60) and big:max():item() > (1 << 60), "the whole i64 range")
  T.is(gpu.randint(7, 8, { 2, 2 }):totable(), { { 7, 7 }, { 7, 7 } }, "a range of one value")
  T.raises_at(function() gpu.randint(5, 5, 3) end, "bad argument #2 to 'randint' (high (5) must be greater than low (5))",
              "an empty range")
  T.raises_at(function() gpu.randint(0, 300, 3, { dtype = "u8" }) end, "randint: [0, 300) is beyond u8's range [0, 255]",
              "beyond the dtype")
  T.raises_at(function() gpu.randint(-1, 1, 3, { dtype = "bool" }) end, "beyond bool's range", "bool from -1")
  T.raises_at(function() gpu.randint(0, 1.5, 3) end, "bad argument #2 to 'randint' (integer high expected, got 1.5)",
              "a float bound")
  T.raises_at(function() gpu.randint(0, 5) end, "bad argument #3 to 'randint' (shape table or integer expected",
              "no shape")
  T.raises_at(function() gpu.randint(0, 5, { 2, -1 }) end, "shape[2] must be non-negative, got -1", "a bad shape")
end)

T.test("empty_like, zeros_like, ones_like, full_like", function()
  local t = gpu.rand({ 2, 3 }, { dtype = "f64" }):t()
  local z = gpu.zeros_like(t)
  T.is({ z.shape, z.dtype, z.device, z:is_contiguous() }, { { 3, 2 }, "f64", "device", true },
       "zeros_like: t's shape, dtype and memory, contiguous")
  T.is(z:totable(), { { 0, 0 }, { 0, 0 }, { 0, 0 } }, "zeros_like values")
  T.is(gpu.ones_like(t, { dtype = "i32" }):totable(), { { 1, 1 }, { 1, 1 }, { 1, 1 } }, "ones_like with a dtype")
  local f = gpu.full_like(t, 2.5, { device = "host" })
  T.is({ f.device, f:totable() }, { "host", { { 2.5, 2.5 }, { 2.5, 2.5 }, { 2.5, 2.5 } } }, "full_like on the host")
  local e = gpu.empty_like(gpu.zeros({ 4 }, { dtype = "u8", device = "pinned" }))
  T.is({ e.shape, e.dtype, e.device }, { { 4 }, "u8", "pinned" }, "empty_like")
  local s = gpu.stream()
  local o = gpu.ones_like(t, { stream = s })
  s:synchronize()
  T.is(o:sum():item(), 6.0, "on a stream")
  T.is(gpu.full_like(gpu.zeros({ 2 }, { dtype = "bool" }), true):totable(), { true, true }, "full_like of bool")
  T.raises_at(function() gpu.full_like(gpu.zeros({ 2 }, { dtype = "i8" }), 1000) end, "bad argument #2 to 'full_like'",
              "a value out of the dtype's range")
  T.raises_at(function() gpu.full_like(t) end, "bad argument #2 to 'full_like' (number expected, got no value)",
              "full_like without a value")
  T.raises_at(function() gpu.zeros_like(3) end, "bad argument #1 to 'zeros_like' (gpu.Tensor expected, got number)",
              "zeros_like of a number")
  T.raises_at(function() gpu.ones_like(t, { dtype = "f128" }) end, "unknown dtype 'f128'", "a bad dtype")
end)

T.test("zero-sized dims", function()
  for _, kind in ipairs { "device", "pinned", "host" } do
    local o = { device = kind }
    local z = gpu.zeros({ 3, 0, 2 }, o)
    T.is({ z.shape, z:numel(), z:nbytes(), #z, z:is_contiguous() }, { { 3, 0, 2 }, 0, 0, 3, true }, kind .. ": zeros{3, 0, 2}")
    T.is(z:totable(), { {}, {}, {} }, kind .. ": totable gives empty tables")
    T.is(tostring(z), "gpu.Tensor(f32, {3,0,2}, " .. kind .. ")\n{}", kind .. ": tostring")
    for _, mk in ipairs { gpu.empty, gpu.ones, gpu.rand, gpu.randn } do T.is(mk({ 0 }, o).shape, { 0 }, kind .. ": {0}") end
    T.is(gpu.full({ 2, 0 }, 7, o).shape, { 2, 0 }, kind .. ": full")
    T.is(gpu.randint(0, 5, { 0, 4 }, o).shape, { 0, 4 }, kind .. ": randint")
    T.is((z + 1):totable(), { {}, {}, {} }, kind .. ": an elementwise op")
    T.is(z:eq(0).dtype, "bool", kind .. ": a comparison")
    T.is(z:fill(3):add_(1).shape, { 3, 0, 2 }, kind .. ": in place")
    T.is(z:transpose(1, 3):contiguous().shape, { 2, 0, 3 }, kind .. ": a copy of a view")
    T.is(z:to("i32").dtype, "i32", kind .. ": a cast")
    local p = os.tmpname()
    z:save(p)
    local back = gpu.load(p, { device = kind })
    os.remove(p)
    T.is({ back.shape, back.device }, { { 3, 0, 2 }, kind }, kind .. ": save and load")
    T.is(gpu.matmul(gpu.ones({ 2, 0 }, o), gpu.ones({ 0, 3 }, o)):totable(), { { 0, 0, 0 }, { 0, 0, 0 } },
         kind .. ": matmul over k = 0 is zeros")
    T.is(gpu.matmul(gpu.ones({ 0, 4 }, o), gpu.ones({ 4, 3 }, o)).shape, { 0, 3 }, kind .. ": matmul with m = 0")
  end
  T.is(gpu.tensor({}).shape, { 0 }, "gpu.tensor{} is {0}")
  T.is(gpu.tensor({ {}, {} }).shape, { 2, 0 }, "gpu.tensor{{}, {}} is {2, 0}")
  T.raises_at(function() gpu.tensor({ {}, { 1 } }) end, "ragged nested table", "ragged with an empty row")
  T.is(gpu.arange(3, 3).shape, { 0 }, "arange of an empty range")
  T.is({ gpu.eye(0).shape, gpu.eye(2, 0).shape, gpu.linspace(0, 1, 0).shape }, { { 0, 0 }, { 2, 0 }, { 0 } },
       "eye and linspace")
  local x = gpu.arange(0, 12):view { 3, 4 }
  T.is(x:narrow(2, 2, 0).shape, { 3, 0 }, "narrow of length 0")
  T.is(x:narrow(2, 5, 0).shape, { 3, 0 }, "narrow of length 0 just past the end")
  T.is(x:slice(1, 3, 2).shape, { 0, 4 }, "an empty slice (i > j, as string.sub)")
  T.is(x:slice(2, 9).shape, { 3, 0 }, "a slice past the end")
  local e = x:slice(1, 2, 1)
  T.is(e:view { 0, 2, 2 }:numel(), 0, "view of an empty slice")
  T.is({ e:view { 0 }.shape, e:reshape { 4, 0, 7 }.shape, e:unsqueeze(1).shape }, { { 0 }, { 4, 0, 7 }, { 1, 0, 4 } },
       "views of an empty tensor")
  T.is(gpu.ones({ 1, 3 }):expand { 0, 3 }.shape, { 0, 3 }, "expand of a size 1 to 0")
  T.is(#gpu.zeros({ 0, 3 }):split(2), 1, "split of a zero-sized dim: one empty piece (PyTorch)")
  T.is(#gpu.zeros({ 0, 3 }):chunk(3), 3, "chunk(3) of a zero-sized dim: three empty pieces (PyTorch, NumPy)")
  T.is({ #x:split({ 2, 0, 1 }), x:split({ 2, 0, 1 })[2].shape }, { 3, { 0, 4 } }, "split with a size of 0")
  T.is(gpu.cat({ x, x:slice(1, 2, 1) }):totable(), x:totable(), "cat with an empty part")
  T.is(gpu.stack({ e, e }).shape, { 2, 0, 4 }, "stack of empty tensors")
  local z = gpu.zeros({ 4, 0 })
  T.is(z:sum { dim = 1 }.shape, { 0 }, "a reduction to an empty result")
  T.is(z:sum():item(), 0.0, "sum of nothing is 0 (NumPy)")
  T.is(z:sum { dim = 2 }:totable(), { 0.0, 0.0, 0.0, 0.0 }, "sums along an empty dim are 0")
  T.raises_at(function() z:max { dim = 2 } end, "max: the reduction of an empty tensor has no identity %(dim 2 has size 0%)",
              "max of nothing raises")
  T.raises_at(function() z:item() end, "item: tensor has 0 elements", "item of an empty tensor")
  T.raises_at(function() gpu.zeros({ 0 }):get(1) end, "index 1 out of range for dim 1 of size 0", "get")
  T.raises_at(function() x:view { 0, -1 } end, "cannot infer -1 beside a zero-sized dim", "view{0, -1}")
  T.raises_at(function() e:reshape { -1, 0 } end, "cannot infer -1 beside a zero-sized dim", "reshape{-1, 0}")
  -- nothing is enqueued, no host wait
  local dz, dx = gpu.zeros({ 0, 5 }), gpu.zeros({ 5, 0 })
  gpu.synchronize()
  local before = gpu.stats()
  local _ = dz + 1, dz:eq(dz), gpu.where(dz:eq(dz), dz, 2), dz:clone(), gpu.cat({ dz, dz }), dz:fill(2), dz:totable()
  local _ = gpu.matmul(dz, dx), gpu.ones({ 0 }), gpu.rand({ 3, 0 }), gpu.linspace(0, 1, 0), dz:to("host")
  local after = gpu.stats()
  T.is({ after.launches - before.launches, after.copies - before.copies, after.syncs - before.syncs }, { 0, 0, 0 },
       "ops on empty tensors enqueue nothing and never wait")
  T.is(gpu.matmul(dz, dx):totable(), {}, "matmul {0, 5} @ {5, 0}")
end)

-- A copy between overlapping views reads everything before it writes
-- anything (memmove; NumPy's `q[...] = q.T` copies the source first), on
-- both backends alike (tests/gpu/compare.lua checks cuda against this).
T.test("copying a tensor onto its own transpose reads it all first", function()
  local vals = {}
  for i = 1, 5 do
    vals[i] = {}
    for j = 1, 5 do vals[i][j] = 10 * i + j end
  end
  local q = gpu.tensor(vals)
  q:copy(q:t())
  local want = {}
  for i = 1, 5 do
    want[i] = {}
    for j = 1, 5 do want[i][j] = 10.0 * j + i end
  end
  T.is(q:totable(), want, "q:copy(q:t()) is the transpose")
  local r = gpu.arange(1, 11, { dtype = "f32" })
  r:narrow(1, 2, 9):copy(r:narrow(1, 1, 9))
  T.is(r:totable(), { 1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0 }, "a shifted overlap moves as memmove does")
  local s = gpu.arange(1, 9, { dtype = "f32" })
  s:slice(1, 1, -1, 2):copy(s:slice(1, 2, -1, 2))
  T.is(s:totable(), { 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 8.0, 8.0 }, "interleaved strided views")
end)

T.test("views make no device op", function()
  local a = base()
  gpu.synchronize()
  local before = gpu.stats()
  for _ = 1, 100 do
    local _ = a:transpose(1, 2):permute { 3, 1, 2 }:unsqueeze(1):squeeze():select(1, 2):slice(1, 1, 2)
    local _ = a:expand { 5, 2, 3, 4 }:reshape { 5, 2, 12 }
    local _ = a:split(1), a:chunk(2, 3)
  end
  local after = gpu.stats()
  T.is({ after.launches - before.launches, after.copies - before.copies }, { 0, 0 }, "no launch, no copy")
end)

T.done()
