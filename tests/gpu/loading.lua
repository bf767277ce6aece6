-- The first use of an op does not wait for other streams' work.  On cuda
-- the built-in kernels load in the background from the context's creation
-- (cuda/cuda/loader.c); a kernel loaded on its first launch would wait on
-- the device for every kernel already running, so making a stream waits
-- for the loader.  Here the first use of many kinds of op, on one stream,
-- must finish while another stream still sleeps.  The host backend runs
-- each stream on its own worker: the same holds there.
local gpu = require "gpu"
local T = require "gpu.test"

T.test("first uses of ops on one stream while another sleeps", function()
  local s1, s2 = gpu.stream(), gpu.stream()
  gpu.sleep(2000 * T.slowdown, { stream = s1 })   -- far longer than the work below
  local _ <close> = gpu.using(s2)
  local sums = {}
  for _, dt in ipairs { "f64", "i32", "bf16" } do
    local a = gpu.arange(1, 65, { dtype = dt })
    local b = gpu.full({ 64 }, 2, { dtype = dt })
    local m = (a * b + a):abs():reshape({ 8, 8 })
    local v = gpu.where(a:gt(b), a, b):max()
    local c = gpu.cat({ m:t():contiguous(), m }, 1):sum({ dim = 2 })
    local r = gpu.rand({ 64 }):gather(1, gpu.arange(1, 9, { dtype = "i64" }))
    sums[#sums + 1] = { m, v, c, r, m:to("f32"):softmax({ dim = 2 }), m:to("f32"):cumsum(1) }
  end
  s2:synchronize()
  T.ok(not s1:query(), "the second stream's work finished while the first still slept")
  T.is(sums[1][2]:item(), 64, "results are right: max(where(a > b, a, b)) of f64")
  T.is(sums[2][1]:sum():item(), 3 * 64 * 65 / 2, "results are right: (a * 2 + a):abs() of i32")
  s1:synchronize()
end)

T.done()
