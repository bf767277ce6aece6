-- Run-time kernels (gpu.compile) against the built-in ops of the same work:
-- c = a + b in f32 as a kernel of one thread per element and as a:add(b),
-- and a sum as a shared-memory block reduction (grid-stride loads, a tree
-- in __shared__ with __syncthreads, one atomicAdd per block) and as
-- t:sum().  On the host backend this times the compiled host kernels (the
-- blocks on every CPU, the reduction's threads as fibers); on a GPU, NVRTC's
-- code.  Event timing around each op, warm-up, median of the repeats,
-- every result checked: as bench/copy.lua.  GB/s count the bytes read and
-- written; the *_time rows are the kernel's time over the built-in op's.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

local n = Z.kernel_elems
local s = gpu.stream()
local o = { stream = s }

-- median ms of what fn enqueues on s, between two timing events
local function timed(fn)
  local t = {}
  for r = 1 - Z.kernel_warm, Z.kernel_reps do
    local e0 = s:record { timing = true }
    fn()
    local e1 = s:record { timing = true }
    e1:synchronize()
    if r > 0 then t[r] = e1 - e0 end
  end
  return B.median(t)
end

local function gbps(moved, ms) return moved / (ms * 1e6) end

local m
B.guard("kernel_add", function()
  m = gpu.compile([[
extern "C" __global__ void add(const float *a, const float *b, float *c, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void block_sum(const float *x, float *out, int n)
{
  __shared__ float s[256];
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, s[0]);
}
]], { name = "bench_kernels.cu" })
end)

if m then
  local a = gpu.rand({ n }, o)
  local b = gpu.rand({ n }, o)
  local c, c2 = gpu.empty({ n }, o), gpu.empty({ n }, o)
  local label = B.size_label("", n * 4):sub(2)

  B.guard("kernel_add", function()
    local launch = m.add { grid = (n + 255) // 256, block = 256, stream = s }
    local ms = timed(function() launch(a, b, c, n) end)
    local bms = timed(function() a:add(b, { out = c2, stream = s }) end)
    B.row("kernel_add", gbps(3 * n * 4, ms), "GB/s", "c = a + b, f32 " .. label .. ", run-time kernel")
    B.row("kernel_add_builtin", gbps(3 * n * 4, bms), "GB/s", "c = a + b, f32 " .. label .. ", built-in add")
    B.row("kernel_add_time", ms / bms, "x", "c = a + b: kernel time / built-in time")
    local diff = (c - c2):abs():max({ stream = s }):item()
    B.check("kernel_add", diff == 0, string.format("the kernel's c differs from the built-in's by %s", diff))
  end)

  B.guard("kernel_reduce", function()
    local out = gpu.zeros({ 1 }, o)
    local blocks = math.min(128, (n + 255) // 256)   -- a grid-stride loop: a block per SM or so
    local launch = m.block_sum { grid = blocks, block = 256, stream = s }
    local ms = timed(function()
      out:fill(0, o)
      launch(a, out, n)
    end)
    local r
    local bms = timed(function() r = a:sum(o) end)
    B.row("kernel_reduce", gbps(n * 4, ms), "GB/s", string.format("sum, f32 %s, kernel: %d blocks of 256 in __shared__", label, blocks))
    B.row("kernel_reduce_builtin", gbps(n * 4, bms), "GB/s", "sum, f32 " .. label .. ", t:sum()")
    B.row("kernel_reduce_time", ms / bms, "x", "sum: kernel time / t:sum() time")
    local got, want = out:item(), r:item()
    B.check("kernel_reduce", math.abs(got - want) <= 1e-4 * math.abs(want),
            string.format("the kernel's sum %s, t:sum() %s", got, want))
  end)
end

s:close()
B.finish()
