-- GPULUA_KERNEL_CHECK=1 and shared memory (issue 35, item 15): static
-- __shared__ arrays are checked against their exact sizes (an overrun by
-- one element, into the next array or far away, names the array and the
-- user's file and line), and the host refuses what a GPU refuses: more than
-- 48 KiB of static shared memory in a kernel, more dynamic shared memory
-- than the device allows, and (under the check) misaligned atomics.  Each
-- case runs in a child gpulua.  On the cuda backend the check does not
-- exist and a GPU faults its own way (or not at all, for a small overrun):
-- the host-only cases are skipped there, the others hold on both.
local gpu = require "gpu"
local T = require "gpu.test"

local HOST = gpu.backend == "host"
local ONLY_HOST = "GPULUA_KERNEL_CHECK is the host backend's; a GPU faults differently"

-- Run a Lua script in a child gpulua with env; its output and success.
local function child(src, env)
  local path = T.tmpfile(src)
  local out, ok = T.run(env, "--device " .. gpu.backend .. " " .. path)
  os.remove(path)
  return out, ok
end

local function check_test(name, fn)
  if HOST then T.test(name, fn) else T.skip(name, ONLY_HOST) end
end

check_test("static __shared__ overruns name the array, the file and line, the thread", function()
  local out = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void one_more(float *y)
{
  __shared__ float s[32];
  s[threadIdx.x] = 1.0f;                       /* 33 threads, room for 32 */
  __syncthreads();
  y[threadIdx.x % 32] = s[threadIdx.x % 32];
}
extern "C" __global__ void next_door(float *y)
{
  __shared__ float a[32];
  __shared__ float b[32];
  b[threadIdx.x] = 2.0f;
  a[threadIdx.x + 1] = 1.0f;                   /* thread 31 writes a[32] */
  __syncthreads();
  y[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}
extern "C" __global__ void far_away(float *y, int k)
{
  __shared__ float s[32];
  s[threadIdx.x * k] = 1.0f;
  y[threadIdx.x] = s[0];
}
extern "C" __global__ void before(float *y)
{
  __shared__ double d[8][8];
  y[threadIdx.x] = (float)d[threadIdx.y][(int)threadIdx.x - 1];
}
]], { name = "stat.cu" })
local y = gpu.zeros({ 64 })
local function try(f) local ok, err = pcall(f); print(ok and "ok" or err) end
m.one_more { grid = 1, block = 33 } (y)
try(gpu.synchronize)
m.one_more { grid = 1, block = 64 } (y)
try(gpu.synchronize)
m.next_door { grid = 1, block = 32 } (y)
try(gpu.synchronize)
m.far_away { grid = 1, block = 32 } (y, 1000)
try(gpu.synchronize)
m.before { grid = 1, block = { 4, 2 } } (y)
try(gpu.synchronize)
m.one_more { grid = 1, block = 32 } (y)
try(gpu.synchronize)
print("sum", y:sum():item())
]==], "GPULUA_KERNEL_CHECK=1")
  T.ok(out:find("'one_more' enqueued at [^\n]*:33 failed: illegal memory access %(cudaErrorIllegalAddress%): " ..
                "a 4%-byte write at byte 128 of __shared__ array 's' %(128 bytes%), past its end at stat.cu:4, " ..
                "in block %[0,0,0%], thread %[32,0,0%]"), "one element past a static array: the array, line, thread")
  T.ok(out:find("'one_more' enqueued at [^\n]*:35 failed: illegal memory access %(cudaErrorIllegalAddress%): " ..
                "a 4%-byte write at byte 128 of __shared__ array 's' %(128 bytes%), past its end at stat.cu:4, " ..
                "in block %[0,0,0%], thread %[32,0,0%]"), "a larger overrun: the user's line, not the runtime's")
  T.ok(out:find("'next_door' enqueued at [^\n]*:37 failed: [^\n]*a 4%-byte write at byte 128 of __shared__ array " ..
                "'a' %(128 bytes%), past its end at stat.cu:13, in block %[0,0,0%], thread %[31,0,0%]"),
       "an overrun into the next array is still one")
  T.ok(out:find("'far_away' enqueued at [^\n]*:39 failed: [^\n]* at stat.cu:20, in block %[0,0,0%], thread %[1,0,0%]"),
       "a far overrun: the user's line, not the runtime's")
  T.ok(out:find("'before' enqueued at [^\n]*:41 failed: [^\n]*a 8%-byte read at byte %-8 of __shared__ array 'd' " ..
                "%(512 bytes%), before its start at stat.cu:26, in block %[0,0,0%], thread %[0,0,0%]"),
       "before a two-dimensional array's start")
  T.ok(out:find("\nok\nsum\t32.0", 1, true), "a correct launch of the same module runs, with the right result")
  if not out:find("\nok\nsum", 1, true) then T.diag(out) end
end)

T.test("static shared arrays of every shape run clean (and right) under the check", function()
  local out, ok = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
template <int N> __device__ float tile_sum(const float *x)
{
  __shared__ float t[N];
  t[threadIdx.x % N] = x[threadIdx.x];
  __syncthreads();
  float s = 0;
  for (int i = 0; i < N; i++) s += t[i];
  __syncthreads();
  return s;
}
struct pair { int a; float b; };
extern "C" __global__ void shapes(const float *x, float *y)
{
  static __shared__ int counts[4];
  volatile __shared__ float v[2][16];
  __shared__ __align__(16) float4 q[8];
  __shared__ pair p;
  __shared__ unsigned flag;
  if (threadIdx.x < 4) counts[threadIdx.x] = 0;
  if (threadIdx.x == 0) { p.a = 3; p.b = 0.5f; flag = 0; }
  v[threadIdx.x / 16][threadIdx.x % 16] = x[threadIdx.x];
  if (threadIdx.x < 8) q[threadIdx.x] = make_float4(1, 2, 3, 4);
  __syncthreads();
  atomicAdd(&counts[threadIdx.x % 4], 1);
  atomicOr(&flag, 1u);
  __syncthreads();
  float r = tile_sum<32>(x) + tile_sum<8>(x);
  y[threadIdx.x] = v[threadIdx.x / 16][threadIdx.x % 16] * p.a + p.b + q[threadIdx.x % 8].w
                   + counts[threadIdx.x % 4] + flag + r;
}
]])
local x = gpu.ones({ 32 })
local y = gpu.zeros({ 32 })
m.shapes { grid = 3, block = 32 } (x, y)
print("y", y:get(1), y:get(32))
]==], "GPULUA_KERNEL_CHECK=1")
  -- 1*3 + 0.5 + 4 + 8 + 1 + 32 + 8
  T.ok(ok and out:find("y\t56.5\t56.5", 1, true), "no false alarm, the right result")
  if not ok or not out:find("y\t56.5") then T.diag(out) end
end)

local BIG = [==[
local gpu = require "gpu"
local ok, err = pcall(function()
  local m = gpu.compile([[
extern "C" __global__ void fits(float *y)
{
  __shared__ float a[12288];
  a[threadIdx.x] = 1;
  __syncthreads();
  y[threadIdx.x] = a[threadIdx.x];
}
]])
  local y = gpu.zeros({ 32 })
  m.fits { grid = 1, block = 32 } (y)
  gpu.synchronize()
  print("fits", y:sum():item(), m.fits.static_shared)
  m = gpu.compile([[
extern "C" __global__ void big(float *y)
{
  __shared__ float a[8192];
  __shared__ float b[4097];
  a[threadIdx.x] = 1; b[threadIdx.x] = 2;
  __syncthreads();
  y[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}
]], { name = "big.cu" })
  m.big { grid = 1, block = 32 } (y)
  gpu.synchronize()
end)
print(ok and "ok" or err)
]==]

T.test("more than 48 KiB of static shared memory is refused, naming the kernel", function()
  local out = child(BIG, "GPULUA_KERNEL_CHECK=0")
  T.ok(out:find("fits\t32.0\t49152", 1, true), "exactly 48 KiB is allowed, and k.static_shared says so")
  if HOST then
    T.ok(out:find(":16: gpu.compile: kernel 'big' uses too much shared data: 49156 bytes of static __shared__ " ..
                  "memory, more than the 48 KiB (49152 bytes) a GPU allows a kernel", 1, true),
         "one byte past: the compilation is refused, naming the kernel")
  else
    T.ok(out:find("big") and out:find("shared") and not out:find("\nok"), "the GPU's compiler refuses it")
  end
  if not out:find("fits\t32", 1, true) then T.diag(out) end
end)

check_test("GPULUA_KERNEL_CHECK=1: more than 48 KiB of static shared memory fails the launch", function()
  local out = child(BIG, "GPULUA_KERNEL_CHECK=1")
  T.ok(out:find("fits\t32.0", 1, true), "exactly 48 KiB is allowed")
  T.ok(out:find("'big' enqueued at [^\n]*:26 failed: kernel 'big' uses too much shared data: 49156 bytes of " ..
                "static __shared__ memory %(array 'b' of 16388 bytes passed the limit%), more than the 48 KiB " ..
                "%(49152 bytes%) a GPU allows a kernel at big.cu:4"), "one byte past: refused, with the array")
  if not out:find("big.cu:4", 1, true) then T.diag(out) end
end)

local DYN = [==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void dyn(float *y)
{
  extern __shared__ float buf[];
  buf[threadIdx.x] = 1;
  __syncthreads();
  y[threadIdx.x] = buf[threadIdx.x];
}
]])
local y = gpu.zeros({ 32 })
print(pcall(function() m.dyn { grid = 1, block = 32, shared = m.dyn.max_shared + 1 } (y) end))
m.dyn { grid = 1, block = 32, shared = 64 * 1024 } (y)
gpu.synchronize()
print("sum", y:sum():item())
local m2 = gpu.compile([[
extern "C" __global__ void both(float *y)
{
  __shared__ float s[10240];
  extern __shared__ float buf[];
  s[threadIdx.x] = 1;
  buf[threadIdx.x] = 1;
  __syncthreads();
  y[threadIdx.x] = s[threadIdx.x] + buf[threadIdx.x];
}
]])
print("together", pcall(function()
  m2.both { grid = 1, block = 32, shared = 200 * 1024 } (y)
  gpu.synchronize()
end))
]==]

T.test("more dynamic shared memory than the device allows is refused at the launch", function()
  for _, env in ipairs(HOST and { "GPULUA_KERNEL_CHECK=1", "GPULUA_KERNEL_CHECK=0" } or { "" }) do
    local out = child(DYN, env)
    T.ok(out:find("false\t[^\n]*shared = %d+ bytes is more than the %d+ bytes of dynamic shared memory this kernel can " ..
                  "have"), "past the device's limit: refused before anything is enqueued")
    T.ok(out:find("sum\t32.0", 1, true), "64 KiB (above 48, with the opt-in gpulua makes) runs")
    T.ok(out:find("together\tfalse\t[^\n]*too much shared data") or out:find("together\tfalse\t[^\n]*it declares"),
         "static and dynamic together past the limit: refused")
    if not out:find("sum\t32") then T.diag(out) end
  end
end)

check_test("misaligned atomics fail, naming the operation and the line", function()
  local out = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void crooked(int *p, int off)
{
  int *q = (int *)((char *)p + off);
  atomicAdd(q, 1);
}
extern "C" __global__ void crooked_f(double *p)
{
  __shared__ double s[4];
  atomicAdd((double *)((char *)s + 4), 1.0);
  p[0] = s[0];
}
]], { name = "atom.cu" })
local p = gpu.zeros({ 16 }, { dtype = "i32" })
local function try(f) local ok, err = pcall(f); print(ok and "ok" or err) end
m.crooked { grid = 1, block = 1 } (p, 2)
try(gpu.synchronize)
m.crooked_f { grid = 1, block = 1 } (gpu.zeros({ 4 }, { dtype = "f64" }))
try(gpu.synchronize)
m.crooked { grid = 1, block = 1 } (p, 4)
try(gpu.synchronize)
print("p", p:get(2))
]==], "GPULUA_KERNEL_CHECK=1")
  T.ok(out:find("'crooked' enqueued at [^\n]*:17 failed: misaligned address %(cudaErrorMisalignedAddress%): " ..
                "a 4%-byte atomicAdd at byte 2 of argument 1 'p' %(int %*, 16 elements%), not aligned to 4 bytes " ..
                "at atom.cu:4, in block %[0,0,0%], thread %[0,0,0%]"), "an int atomicAdd 2 bytes off")
  T.ok(out:find("'crooked_f' enqueued at [^\n]*:19 failed: misaligned address %(cudaErrorMisalignedAddress%): " ..
                "a 8%-byte atomicAdd at byte 4 of __shared__ array 's' %(32 bytes%), not aligned to 8 bytes " ..
                "at atom.cu:9"), "a double atomicAdd in shared memory")
  T.ok(out:find("ok\np\t1", 1, true), "an aligned one runs")
  if not out:find("atom.cu:4") then T.diag(out) end
end)

T.done()
