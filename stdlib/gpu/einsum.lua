-- gpu.einsum, gpu.bmm, gpu.outer, gpu.dot: compositions of permute,
-- reshape, sum and the (batched) matmul, no kernels of their own.  The C
-- entries (bindings/tensor_matmul.c) check that the operands are tensors,
-- call these and raise their messages at the script's line, so errors here
-- carry no position (level 0).
local gpu = require "gpu"

local M = {}

local function fail(fmt, ...) error(string.format(fmt, ...), 0) end

local function shape_str(t) return "{" .. table.concat(t.shape, ",") .. "}" end

local function prod(sizes, labels)
  local n = 1
  for _, l in ipairs(labels) do n = n * sizes[l] end
  return n
end

local function sizes_of(sizes, labels)
  local s = {}
  for i, l in ipairs(labels) do s[i] = sizes[l] end
  return s
end

-- t with its dims (named by labels) put in the order of want; a view
local function arrange(t, labels, want)
  local pos, order, same = {}, {}, true
  for i, l in ipairs(labels) do pos[l] = i end
  for i, l in ipairs(want) do
    order[i] = pos[l]
    if order[i] ~= i then same = false end
  end
  if same then return t end
  return t:permute(order)
end

-- t with the dims whose labels are not in keep summed out (the dtype kept,
-- as NumPy's einsum keeps it: integer sums wrap); returns t, its labels
local function reduce(t, labels, keep)
  local left, dt = {}, t.dtype
  for i = #labels, 1, -1 do
    if not keep[labels[i]] then t = t:sum(i) else table.insert(left, 1, labels[i]) end
  end
  if t.dtype ~= dt then t = t:to(dt) end
  return t, left
end

-- the contraction of x and y (labels lx, ly), keeping the labels in keep:
-- shared kept labels are the batch, shared others are summed by matmul
local function contract(x, lx, y, ly, keep, sizes)
  local iny, inx = {}, {}
  for _, l in ipairs(ly) do iny[l] = true end
  for _, l in ipairs(lx) do inx[l] = true end
  local kx, ky = {}, {}
  for l in pairs(keep) do kx[l], ky[l] = true, true end
  for l in pairs(iny) do kx[l] = true end
  for l in pairs(inx) do ky[l] = true end
  x, lx = reduce(x, lx, kx)
  y, ly = reduce(y, ly, ky)
  local batch, left, con, right = {}, {}, {}, {}
  for _, l in ipairs(lx) do
    if not iny[l] then left[#left + 1] = l
    elseif keep[l] then batch[#batch + 1] = l
    else con[#con + 1] = l end
  end
  for _, l in ipairs(ly) do
    if not inx[l] then right[#right + 1] = l end
  end
  local xs, ys = {}, {}
  for _, g in ipairs({ batch, left, con }) do for _, l in ipairs(g) do xs[#xs + 1] = l end end
  for _, g in ipairs({ batch, con, right }) do for _, l in ipairs(g) do ys[#ys + 1] = l end end
  local pb, pl, pc, pr = prod(sizes, batch), prod(sizes, left), prod(sizes, con), prod(sizes, right)
  local a = arrange(x, lx, xs):reshape({ pb, pl, pc })
  local b = arrange(y, ly, ys):reshape({ pb, pc, pr })
  local out = {}
  for _, g in ipairs({ batch, left, right }) do for _, l in ipairs(g) do out[#out + 1] = l end end
  return gpu.matmul(a, b):reshape(sizes_of(sizes, out)), out
end

-- The labels of the '...' dims: E1, E2, ... from the left of the widest
-- operand's ellipsis, right-aligned in each operand as NumPy broadcasts
-- them; never letters, so never confused with an index
local ELL = "..."
local function ell_label(k) return "\1" .. k end
local function is_ell(l) return l:sub(1, 1) == "\1" end

-- the labels of a term, "..." as one ELL entry
local function term_labels(spec, term, what)
  local labels, rest, dots = {}, term, 0
  while #rest > 0 do
    if rest:sub(1, 3) == "..." then
      dots = dots + 1
      if dots > 1 then fail("einsum: '%s': '...' appears twice in %s", spec, what) end
      labels[#labels + 1], rest = ELL, rest:sub(4)
    else
      local c = rest:sub(1, 1)
      if not c:match("%a") then
        if c == "." then fail("einsum: '%s': a '.' outside '...'", spec) end
        fail("einsum: '%s': '%s' is not an index (letters a-z, A-Z)", spec, c)
      end
      labels[#labels + 1], rest = c, rest:sub(2)
    end
  end
  return labels, dots > 0
end

-- "ij,jk->ik" as the operands' label lists and the output's ("..." still
-- one ELL entry in each); implicit is true without '->'
local function parse(spec, n)
  if type(spec) ~= "string" then fail("bad argument #1 to 'einsum' (string expected, got %s)", type(spec)) end
  local s = spec:gsub("%s", "")
  local lhs, rhs = s:match("^([^>]*)%->(.*)$")
  if not lhs then lhs = s end
  if s:find("->", 1, true) and (rhs or ""):find("->", 1, true) then fail("einsum: '%s': more than one '->'", spec) end
  if lhs:find("[-<>]") or (rhs and rhs:find("[-<>]")) then fail("einsum: '%s': a '-' or '>' outside '->'", spec) end
  local terms, any_ell = {}, false
  for term in (lhs .. ","):gmatch("([^,]*),") do
    local labels, e = term_labels(spec, term, "operand " .. (#terms + 1))
    terms[#terms + 1], any_ell = labels, any_ell or e
  end
  if #terms ~= n then fail("einsum: '%s' names %d operand(s), %d tensor(s) given", spec, #terms, n) end
  local count = {}
  for _, t in ipairs(terms) do for _, l in ipairs(t) do count[l] = (count[l] or 0) + 1 end end
  local out = {}
  if rhs then
    local labels, e = term_labels(spec, rhs, "the output")
    if e and not any_ell then fail("einsum: '%s': '...' in the output but in no operand", spec) end
    local seen = {}
    for _, c in ipairs(labels) do
      if seen[c] then fail("einsum: '%s': output index '%s' appears twice", spec, c) end
      if not count[c] then fail("einsum: '%s': output index '%s' is in no operand", spec, c) end
      seen[c], out[#out + 1] = true, c
    end
  else
    -- implicit: '...' first, then the indices that appear once, in
    -- alphabetical order
    for l, k in pairs(count) do if k == 1 and l ~= ELL then out[#out + 1] = l end end
    table.sort(out)
    if any_ell then table.insert(out, 1, ELL) end
  end
  return terms, out
end

-- The '...' of each term replaced by the labels of the dims it covers,
-- with their broadcast sizes in sizes; an operand whose '...' dim has size
-- 1 where another's is larger has it squeezed out (the label is then not
-- in that operand: the contraction repeats it, which is the broadcast).
-- Returns the operands and the width of the widest '...'.
local function expand_ellipsis(spec, ops, terms, sizes)
  local width, cover = 0, {}
  for i, labels in ipairs(terms) do
    local named = #labels
    for _, l in ipairs(labels) do if l == ELL then named = named - 1 end end
    if named == #labels then
      cover[i] = 0
    else
      cover[i] = ops[i].ndim - named
      if cover[i] < 0 then
        fail("einsum: '%s': operand %d has %d dim(s) %s, its term names %d besides '...'", spec, i, ops[i].ndim,
             shape_str(ops[i]), named)
      end
      if cover[i] > width then width = cover[i] end
    end
  end
  for i, labels in ipairs(terms) do
    local t, new = ops[i], {}
    for d, l in ipairs(labels) do
      if l == ELL then
        for k = 1, cover[i] do
          local lab, n = ell_label(width - cover[i] + k), t.shape[d + k - 1]
          local had = sizes[lab]
          if had and had ~= n and had ~= 1 and n ~= 1 then
            fail("einsum: '%s': the '...' dims of operand %d %s do not broadcast: size %d against %d", spec, i,
                 shape_str(t), n, had)
          end
          if not had or had == 1 then sizes[lab] = n end
          new[#new + 1] = lab
        end
      else
        new[#new + 1] = l
      end
    end
    terms[i] = new
  end
  -- the squeeze, from the last dim so the earlier dims keep their numbers
  for i, labels in ipairs(terms) do
    local t = ops[i]
    for d = #labels, 1, -1 do
      local l = labels[d]
      if is_ell(l) and t.shape[d] == 1 and sizes[l] ~= 1 then
        t = t:squeeze(d)
        table.remove(labels, d)
      end
    end
    ops[i] = t
  end
  return width
end

-- An index repeated in one operand ("ii", "bii") is its diagonal: a view
-- (t:diagonal) with the index once, as the last dim
local function take_diagonals(spec, i, t, labels)
  local d1, d2
  repeat
    d1, d2 = nil, nil
    local at = {}
    for d, l in ipairs(labels) do
      if at[l] then d1, d2 = at[l], d break end
      at[l] = d
    end
    if d1 then
      local l = labels[d1]
      if t.shape[d1] ~= t.shape[d2] then
        fail("einsum: '%s': index '%s' repeats in operand %d %s with sizes %d and %d", spec, l, i, shape_str(t),
             t.shape[d1], t.shape[d2])
      end
      t = t:diagonal(0, d1, d2)
      table.remove(labels, d2)
      table.remove(labels, d1)
      labels[#labels + 1] = l
    end
  until not d1
  return t, labels
end

-- gpu.einsum(spec, a, b, ...): operands contracted left to right, each
-- pair as one (batched) matmul; indices in one operand only and not in the
-- output are summed first
function M.einsum(spec, ...)
  local ops = table.pack(...)
  local terms, out = parse(spec, ops.n)
  if ops.n == 0 then fail("einsum: needs at least one tensor") end
  local sizes, dt = {}, nil
  for i = 1, ops.n do
    local t = ops[i]
    dt = dt or t.dtype
    if t.dtype ~= dt then fail("einsum: operand %d is %s, operand 1 %s (cast with :to(\"%s\"))", i, t.dtype, dt, dt) end
    if t.dtype == "bool" then fail("einsum: not supported for bool") end
    local labels, has_ell = terms[i], false
    for _, l in ipairs(labels) do if l == ELL then has_ell = true end end
    if not has_ell and #labels ~= t.ndim then
      fail("einsum: '%s': operand %d has %d dim(s) %s, its term '%s' names %d", spec, i, t.ndim, shape_str(t),
           table.concat(labels), #labels)
    end
  end
  local width = expand_ellipsis(spec, ops, terms, sizes)
  -- the output's '...': the labels of the widest one; without it, NumPy
  -- refuses operands whose '...' covers any dim
  local o, out_ell = {}, false
  for _, l in ipairs(out) do
    if l == ELL then
      out_ell = true
      for k = 1, width do o[#o + 1] = ell_label(k) end
    else
      o[#o + 1] = l
    end
  end
  if width > 0 and not out_ell then
    fail("einsum: '%s': the '...' covers %d dim(s) but the output has no '...' to put them", spec, width)
  end
  out = o
  for i = 1, ops.n do
    local t, labels = take_diagonals(spec, i, ops[i], terms[i])
    ops[i], terms[i] = t, labels
    for d, l in ipairs(labels) do
      local n = t.shape[d]
      if not is_ell(l) then
        if sizes[l] and sizes[l] ~= n then
          fail("einsum: '%s': index '%s' has size %d in operand %d %s but %d before", spec, l, n, i, shape_str(t), sizes[l])
        end
        sizes[l] = n
      end
    end
  end
  local keep = {}
  for _, l in ipairs(out) do keep[l] = true end
  local acc, la = ops[1], terms[1]
  for i = 2, ops.n do
    local k = {}
    for l in pairs(keep) do k[l] = true end
    for j = i + 1, ops.n do for _, l in ipairs(terms[j]) do k[l] = true end end
    acc, la = contract(acc, la, ops[i], terms[i], k, sizes)
  end
  acc, la = reduce(acc, la, keep)
  return arrange(acc, la, out)
end

local function same_dtype(name, a, b)
  if a.dtype ~= b.dtype then
    fail("%s: dtype %s does not match %s (cast with :to(\"%s\"))", name, b.dtype, a.dtype, a.dtype)
  end
end

-- gpu.bmm(a, b): {B,n,k} x {B,k,m} -> {B,n,m}, no broadcasting (torch.bmm)
function M.bmm(a, b)
  if a.ndim ~= 3 then fail("bmm: a must be 3-D {batch, n, k}, got %s", shape_str(a)) end
  if b.ndim ~= 3 then fail("bmm: b must be 3-D {batch, k, m}, got %s", shape_str(b)) end
  if a.shape[1] ~= b.shape[1] then
    fail("bmm: a %s @ b %s: batch sizes %d and %d differ", shape_str(a), shape_str(b), a.shape[1], b.shape[1])
  end
  if a.shape[3] ~= b.shape[2] then
    fail("bmm: a %s @ b %s: a's dim 3 (%d) differs from b's dim 2 (%d)", shape_str(a), shape_str(b), a.shape[3], b.shape[2])
  end
  same_dtype("bmm", a, b)
  return gpu.matmul(a, b)
end

-- gpu.outer(a, b): r[i][j] = a[i] * b[j] for 1-D a and b (torch.outer)
function M.outer(a, b)
  if a.ndim ~= 1 or b.ndim ~= 1 then fail("outer: needs two 1-D tensors, got %s and %s", shape_str(a), shape_str(b)) end
  same_dtype("outer", a, b)
  return a:reshape({ a.shape[1], 1 }):mul(b:reshape({ 1, b.shape[1] }))
end

-- gpu.dot(a, b): the sum of a[i] * b[i] for 1-D a and b, a 0-dim tensor
function M.dot(a, b)
  if a.ndim ~= 1 or b.ndim ~= 1 then fail("dot: needs two 1-D tensors, got %s and %s", shape_str(a), shape_str(b)) end
  if a.shape[1] ~= b.shape[1] then fail("dot: sizes %d and %d differ", a.shape[1], b.shape[1]) end
  same_dtype("dot", a, b)
  if a.dtype == "bool" then fail("dot: not supported for bool") end
  local n = a.shape[1]
  return gpu.matmul(a:reshape({ 1, n }), b:reshape({ n, 1 })):reshape({})
end

return M
