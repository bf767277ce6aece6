-- PyTorch habits around shapes and values (issue 34, item 1, the rest):
-- shapes as a table or as numbers, then the options; {} a 0-dim shape in
-- every shape-taking call; gpu.tensor of Lua integers alone is i64 (of
-- booleans alone bool, else f32), as NumPy and PyTorch; index messages
-- show the valid range, so they say that indices start at 1; the dtype
-- synonyms.
local gpu = require "gpu"
local T = require "gpu.test"

T.test("constructors: sizes as numbers, then the options", function()
  for _, name in ipairs({ "zeros", "ones", "empty", "rand", "randn", "pinned" }) do
    local f = gpu[name]
    T.is(f(3, 4).shape, f({ 3, 4 }).shape, name .. "(3, 4) is " .. name .. "{3, 4}")
    T.is(f(2, 3, 4).shape, { 2, 3, 4 }, name .. "(2, 3, 4)")
    T.is(f(5).shape, { 5 }, name .. "(5)")
    T.is(f(3, 4, { dtype = "f16" }).dtype, "f16", name .. "(3, 4, {dtype =})")
  end
  T.is(gpu.zeros(2, 2):totable(), { { 0, 0 }, { 0, 0 } }, "zeros(2, 2) values")
  T.is(gpu.ones(2, 3, { dtype = "i32" }):sum():item(), 6, "ones(2, 3, {dtype = i32})")
  T.is(gpu.rand(3, 4, { seed = 7 }):totable(), gpu.rand({ 3, 4 }, { seed = 7 }):totable(), "rand: same numbers either way")
  T.is(gpu.full(3, 2):totable(), { 2, 2, 2 }, "full keeps (shape, value): full(3, 2) is three 2s")
  T.is(gpu.full({ 3, 2 }, 1).shape, { 3, 2 }, "full{3, 2}")
end)

T.test("views: sizes as numbers, -1 inferred", function()
  local t = gpu.arange(60)
  T.is(t:view(12, 5).shape, { 12, 5 }, "view(12, 5)")
  T.is(t:view(-1, 6).shape, { 10, 6 }, "view(-1, 6)")
  T.is(t:reshape(12, -1).shape, { 12, 5 }, "reshape(12, -1)")
  T.is(t:view(12, 5):permute(2, 1).shape, { 5, 12 }, "permute(2, 1)")
  T.is(gpu.ones(3, 1):expand(3, 4).shape, { 3, 4 }, "expand(3, 4)")
  T.is(t:view(3, 4, 5):tile(1, 2, 1).shape, { 3, 8, 5 }, "tile(1, 2, 1)")
end)

T.test("0-dim shapes in every shape-taking call", function()
  local one = gpu.tensor({ 7.5 })
  for _, name in ipairs({ "zeros", "ones", "empty", "rand", "randn", "pinned" }) do
    local z = gpu[name]({})
    T.is({ z.shape, z:numel() }, { {}, 1 }, name .. "{} is 0-dim, one element")
  end
  T.is(gpu.full({}, 3):item(), 3.0, "full({}, 3)")
  T.is(gpu.randint(0, 5, {}).shape, {}, "randint(0, 5, {})")
  T.is({ one:view({}).shape, one:view({}):item() }, { {}, 7.5 }, "view{} of one element")
  T.is(gpu.ones(1, 1):reshape({}).shape, {}, "reshape{}")
  local s = gpu.tensor(2.5)
  T.is(s:expand({}).shape, {}, "expand{} of a 0-dim tensor")
  T.is(s:expand(2, 3):totable(), { { 2.5, 2.5, 2.5 }, { 2.5, 2.5, 2.5 } }, "expand of a 0-dim tensor")
  T.is(s:view(1, 1).shape, { 1, 1 }, "view of a 0-dim tensor")
  T.is(s:tile({}).shape, {}, "tile{} of a 0-dim tensor")
  T.is(s:permute({}).shape, {}, "permute{} of a 0-dim tensor")
  T.raises_at(function() gpu.ones(2):view({}) end, "shape {} (1 elements) does not match {2} (2 elements)",
              "view{} of two elements")
end)

T.test("gpu.tensor: integers make i64, booleans bool, a float f32", function()
  T.is(gpu.tensor({ 1, 5, 11 }).dtype, "i64", "{1, 5, 11} is i64")
  T.is(gpu.tensor({ { 1, 2 }, { 3, 4 } }).dtype, "i64", "nested integers are i64")
  T.is(gpu.tensor(3).dtype, "i64", "one integer is i64")
  T.is(gpu.tensor({ 1, 2.5 }).dtype, "f32", "a float anywhere: f32")
  T.is(gpu.tensor({ { 1, 2 }, { 3, 4.0 } }).dtype, "f32", "4.0 is a float: f32")
  T.is(gpu.tensor(2.0).dtype, "f32", "one float is f32")
  T.is(gpu.tensor({ true, false }).dtype, "bool", "booleans are bool")
  T.is(gpu.tensor({}).dtype, "f32", "no values: f32")
  T.is(gpu.tensor({ 1, 2 }, { dtype = "f64" }).dtype, "f64", "opts.dtype wins")
  T.is(gpu.tensor({ 2 ^ 53 + 1 | 0 }):item(), 2 ^ 53 + 1 | 0, "i64 keeps integers past 2^53")
  local src = gpu.arange(10, 60, 10)
  T.is(src:index_select(1, gpu.tensor({ 1, 5, 3 })):totable(), { 10, 50, 30 }, "index_select takes such a tensor")
  T.raises_at(function() gpu.tensor({ true, 1 }) end, "number expected, got boolean", "booleans and numbers mixed")
end)

T.test("index messages show the range: indices start at 1", function()
  local t = gpu.zeros(3, 4)
  T.raises_at(function() t:get(0, 1) end, "index 0 out of range for dim 1 of size 3 %(1..3%)", "get(0, 1)")
  T.raises_at(function() t:get(1, 5) end, "index 5 out of range for dim 2 of size 4 %(1..4%)", "get(1, 5)")
  T.raises_at(function() t:set(4, 1, 0) end, "index 4 out of range for dim 1 of size 3 %(1..3%)", "set(4, 1)")
  T.raises_at(function() t:select(1, 0) end, "index 0 out of range for dim 1 of size 3 %(1..3, or %-3..%-1%)",
              "select(1, 0)")
  T.raises_at(function() t:narrow(2, 0, 1) end, "start 0 out of range for dim 2 of size 4 %(1..4%)", "narrow(2, 0)")
  T.raises_at(function() gpu.zeros(0):get(1) end, "index 1 out of range for dim 1 of size 0 %(empty%)", "an empty dim")
  -- asynchronous: at the next sync; the host backend shows the range, the
  -- CUDA flag carries no value
  local want = gpu.backend == "host" and "'index_select' failed: index out of range %(0 not in 1%.%.3%)"
               or "'index_select' failed: index out of range"
  T.raises(function() t:index_select(1, gpu.tensor({ 0 })):sum():item() end, want, "index_select: 0")
  T.raises_at(function() t:size(0) end, "dim 0 out of range for a 2%-dim tensor %(1..2, or %-2..%-1%)", "size(0)")
end)

T.test("dtype synonyms", function()
  local syn = { float32 = "f32", float = "f32", float64 = "f64", double = "f64", float16 = "f16", half = "f16",
                bfloat16 = "bf16", int8 = "i8", uint8 = "u8", int32 = "i32", int = "i32", int64 = "i64",
                long = "i64" }
  for name, short in pairs(syn) do
    T.is(gpu.zeros(2, { dtype = name }).dtype, short, name .. " is " .. short)
  end
  for _, short in ipairs(T.dtypes) do T.is(gpu.zeros(1, { dtype = short }).dtype, short, short) end
  T.raises_at(function() gpu.zeros(2, { dtype = "float128" }) end, "float128", "an unknown name is refused")
end)

T.test("bad shapes: clear errors", function()
  T.raises_at(function() gpu.zeros(3, -1) end, "shape%[2%] must be non%-negative, got %-1", "a negative size")
  T.raises_at(function() gpu.zeros(3, 1.5) end, "shape%[2%] must be an integer, got 1.5", "a fractional size")
  T.raises_at(function() gpu.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1) end, "shape has 9 dims %(at most 8%)", "nine sizes")
  T.raises_at(function() gpu.zeros(3, "f16") end, "table expected, got string", "a string after the sizes")
  T.raises_at(function() gpu.arange(6):view(4, -1) end, "cannot infer %-1", "view(4, -1) of 6")
  T.raises_at(function() gpu.arange(6):view(2, "x") end, "shape%[2%] must be an integer, got string", "view(2, 'x')")
  T.raises_at(function() gpu.arange(6):view() end, "shape expected", "view()")
end)

T.done()
