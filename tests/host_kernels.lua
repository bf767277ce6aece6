-- Run-time kernels without a GPU: gpu.compile on the host backend builds the
-- CUDA C source with the system C++ compiler and runs its blocks on CPU
-- threads.  Each kernel's results are checked against the built-in ops or
-- a reference computed here in Lua; the kernels are plain CUDA, so on the
-- cuda backend the same file checks that both give the same results (the
-- host-only parts - compiler messages, the cache, GPULUA_HOST_THREADS - are
-- skipped there).
local gpu = require "gpu"
local T = require "gpu.test"

local HOST = gpu.backend == "host"

-- Run a Lua script in a child gpulua with env; its output and success.
local function child(src, env)
  local path = T.tmpfile(src)
  local out, ok = T.run(env, "--device " .. gpu.backend .. " " .. path)
  os.remove(path)
  return out, ok, path
end

local function tmpdir()
  local out = T.sh("mktemp -d")
  return (out:gsub("%s+$", ""))
end

local SAXPY = [[
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
]]

T.test("saxpy: the same result as the built-in ops", function()
  local m = gpu.compile(SAXPY)
  T.is(tostring(m.saxpy), "gpu.Kernel: __global__ void saxpy(float a, const float *x, float *y, int n)",
       "the kernel shows its signature")
  T.is(m.saxpy.max_threads, 1024, "k.max_threads")
  local n = 100003                      -- not a multiple of the block
  local x = gpu.rand({ n })
  local y = gpu.rand({ n })
  local want = x * 2.5 + y
  m.saxpy { grid = (n + 255) // 256, block = 256 } (2.5, x, y, n)
  -- exact on the host; on cuda the kernel's a * x + y is one fused multiply-add
  -- (nvcc's default), the built-in ops round twice: within an ulp (y < 3.5)
  local err = (y - want):abs():max():item()
  if HOST then
    T.is(err, 0, "y = 2.5 x + y over 391 blocks")
  else
    T.ok(err <= 2 ^ -22, "y = 2.5 x + y over 391 blocks, within an ulp of the built-in ops (" .. err .. ")")
  end
end)

T.test("the reference's example (docs/lua-api.md, Run-time kernels), as written", function()
  local n = 1000
  local x, y = gpu.arange(n, { dtype = "f32" }), gpu.ones({ n })
  local s = gpu.stream()
  local m = gpu.compile([[
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
]], {options = {"--use_fast_math"}, name = "saxpy.cu", cache = true})
  m.saxpy{grid = (n + 255) // 256, block = 256, stream = s}(2.0, x, y, n)
  local launch = m.saxpy{grid = {64, 1, 1}, block = {256}, shared = 0}   -- reusable
  s:synchronize()
  launch(2.0, x, y, n)                                                      -- current stream
  T.is(tostring(m.saxpy), "gpu.Kernel: __global__ void saxpy(float a, const float *x, float *y, int n)", "print(m.saxpy)")
  T.is((y - (x * 4 + 1)):abs():max():item(), 0, "y = 2x + (2x + 1) after both launches")
  s:close()
end)

T.test("indices in three dimensions", function()
  local m = gpu.compile([[
extern "C" __global__ void where(int *out, int nx, int ny)
{
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < nx && y < ny)
    out[(z * ny + y) * nx + x] = z * 1000000 + y * 1000 + x + (gridDim.x * blockDim.x >= nx ? 0 : -1);
}
]])
  local nx, ny, nz = 37, 21, 6
  local out = gpu.full({ nz, ny, nx }, -7, { dtype = "i32" })
  m.where { grid = { 5, 3, 2 }, block = { 8, 8, 3 } } (out, nx, ny)
  local got, bad = out:totable(), 0
  for z = 1, nz do
    for y = 1, ny do
      for x = 1, nx do
        if got[z][y][x] ~= (z - 1) * 1000000 + (y - 1) * 1000 + (x - 1) then bad = bad + 1 end
      end
    end
  end
  T.is(bad, 0, "every element of a 6x21x37 grid written with its own coordinates")
end)

T.test("C++ kernels: namespaces, device functions, templates and overloads", function()
  local m = gpu.compile([[
template <typename T> __device__ T twice(T v) { return v + v; }
template <typename T> __global__ void tk(T *x) {}
__global__ void ov(int a) {}
__global__ void ov(float a, int b) {}
namespace inner { __global__ void nk(int *x) { x[0] = twice(21); } }
__global__ void cxx(double *x, long long n) { x[0] = twice(1.25) + n; }
template <typename T> __global__ void fill_t(T *x, T v, int n) { int i = threadIdx.x; if (i < n) x[i] = v; }
extern "C" __global__ void fill_f(float *x, float v, int n) { fill_t(x, v, n); }
]])
  T.raises_at(function() m.tk { grid = 1, block = 1 } end, "is a template", "a template kernel")
  T.raises_at(function() m.ov { grid = 1, block = 1 } end, "is overloaded", "an overloaded kernel")
  local xi, xd, xf = gpu.zeros({ 1 }, { dtype = "i32" }), gpu.zeros({ 1 }, { dtype = "f64" }), gpu.zeros({ 8 })
  m.nk { grid = 1, block = 1 } (xi)
  m.cxx { grid = 1, block = 1 } (xd, 40)
  m.fill_f { grid = 1, block = 8 } (xf, 1.5, 6)
  T.is({ xi:item(), xd:item() }, { 42, 42.5 }, "a kernel in a namespace and a C++ (mangled) kernel")
  T.is(xf:totable(), { 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 0, 0 }, "a template called from an extern \"C\" kernel")
end)

T.test("options: -D, GPU-only options ignored, unknown ones refused", function()
  local src = [[
extern "C" __global__ void k(int *x) { x[threadIdx.x] = SCALE * (int)threadIdx.x; }
]]
  local m = gpu.compile(src, { options = { "-DSCALE=3", "-arch=sm_90", "--use_fast_math", "-lineinfo" } })
  local x = gpu.zeros({ 4 }, { dtype = "i32" })
  m.k { grid = 1, block = 4 } (x)
  T.is(x:totable(), { 0, 3, 6, 9 }, "the macro reaches the kernel")
  T.raises_at(function() gpu.compile(src, { options = { "--no-such-flag" } }) end, "compilation failed",
              "an unknown option raises")
  T.raises_at(function() gpu.compile(src, { options = { 42 } }) end, "item 1: string expected", "a non-string option")
end)

T.test("launch configurations and arguments are checked as on cuda", function()
  local k = gpu.compile(SAXPY).saxpy
  T.raises_at(function() k { grid = 1, block = 2048 } end, "block.x = 2048 is outside [1, 1024]", "block 2048")
  T.raises_at(function() k { grid = 1, block = { 32, 32, 2 } } end, "a block of 2048 threads is more than", "2048 threads")
  T.raises_at(function() k { grid = { 1, 70000 }, block = 1 } end, "grid.y = 70000 is outside [1, 65535]", "grid.y")
  T.raises_at(function() k { grid = 1, block = 1, shared = 1 << 30 } end, "shared = 1073741824 bytes is more than",
              "too much shared memory")
  local l = k { grid = 1, block = 32 }
  T.raises_at(function() l(1.0, gpu.zeros({ 32 }, { dtype = "i32" }), gpu.zeros({ 32 }), 32) end,
              "argument 2 (const float * x): expected a f32 tensor, got i32", "the wrong dtype")
  T.raises_at(function() l(1.0, gpu.zeros({ 32 })) end, "takes 4 arguments, got 2", "too few arguments")
end)

T.test("a kernel and its tensors outlive their handles while the launch is queued", function()
  local s = gpu.stream()
  local out = gpu.zeros({ 1 << 16 })
  do
    local m = gpu.compile([[
extern "C" __global__ void copyk(const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
]])
    local x = gpu.full({ 1 << 16 }, 3)
    gpu.sleep(30, { stream = s })
    m.copyk { grid = 256, block = 256, stream = s } (x, out, 1 << 16)
  end
  collectgarbage()
  collectgarbage()
  s:synchronize()
  T.is({ out:min():item(), out:max():item() }, { 3, 3 }, "the queued launch read its input intact")
  s:close()
end)

-- ---- barriers, shared memory, warp primitives ---------------------------------

-- The sums of blocks of 256 (the last one partial), in Lua, in f64.
local function block_sums(t, n, b)
  local v, out = t:totable(), {}
  for i = 0, (n + b - 1) // b - 1 do
    local acc = 0
    for k = i * b + 1, math.min((i + 1) * b, n) do acc = acc + v[k] end
    out[#out + 1] = acc
  end
  return out
end

local function max_rel(got, want)
  local worst = 0
  for i = 1, #want do
    local d = math.abs(got[i] - want[i]) / math.max(1, math.abs(want[i]))
    if d > worst or d ~= d then worst = d end
  end
  return worst
end

T.test("block reduction: static shared memory and __syncthreads", function()
  local m = gpu.compile([[
extern "C" __global__ void block_sum(const float *x, float *out, int n)
{
  __shared__ float s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
]])
  local n = 50000
  local x = gpu.rand({ n })
  local nb = (n + 255) // 256
  local out = gpu.zeros({ nb })
  m.block_sum { grid = nb, block = 256 } (x, out, n)
  T.ok(max_rel(out:totable(), block_sums(x, n, 256)) < 1e-5, "each block's sum (196 blocks)")
  T.near(out:sum():item(), x:sum():item(), 1e-4, "the total equals t:sum()")
end)

T.test("launches on two streams at once: each block's shared memory stays its own", function()
  local src = [[
extern "C" __global__ void scale_sum(const float *x, float *out, int n, float k)
{
  __shared__ float s[128];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? k * x[i] : 0.0f;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
]]
  local m1, m2 = gpu.compile(src), gpu.compile(src .. "// another module\n")
  local n = 128 * 300
  local x = gpu.ones({ n })
  local s1, s2 = gpu.stream(), gpu.stream()
  local outs = {}
  for r = 1, 6 do
    local o = gpu.zeros({ 300 })
    local m, st = r % 2 == 1 and m1 or m2, r % 2 == 1 and s1 or s2
    m.scale_sum { grid = 300, block = 128, stream = st } (x, o, n, r)
    outs[r] = o
  end
  s1:synchronize()
  s2:synchronize()
  local bad = 0
  for r = 1, 6 do
    if outs[r]:min():item() ~= 128 * r or outs[r]:max():item() ~= 128 * r then bad = bad + 1 end
  end
  T.is(bad, 0, "six launches of 300 blocks, two modules, two streams: every block sum right")
  s1:close()
  s2:close()
end)

T.test("__syncthreads_count, _and, _or; threads that returned early", function()
  local m = gpu.compile([[
extern "C" __global__ void votes(const int *x, int *out)
{
  int v = x[blockIdx.x * blockDim.x + threadIdx.x];
  int c = __syncthreads_count(v > 0);
  int a = __syncthreads_and(v > 0);
  int o = __syncthreads_or(v > 5);
  if (threadIdx.x == 0) { out[3 * blockIdx.x] = c; out[3 * blockIdx.x + 1] = a; out[3 * blockIdx.x + 2] = o; }
}
extern "C" __global__ void early(int *out, int keep)
{
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  if (threadIdx.x >= keep) return;          /* the others still meet at the barrier */
  __syncthreads();
  int c = __syncthreads_count(1);
  if (threadIdx.x == 0) out[0] = c;
}
]])
  local x = gpu.tensor({ 1, 2, 3, 0, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }, { dtype = "i32" })
  local out = gpu.zeros({ 6 }, { dtype = "i32" })
  m.votes { grid = 2, block = 8 } (x, out)
  T.is(out:totable(), { 7, 0, 1, 8, 1, 0 }, "count, and, or per block of 8")
  local o = gpu.zeros({ 1 }, { dtype = "i32" })
  m.early { grid = 1, block = 96 } (o, 40)
  T.is(o:item(), 40, "the 56 threads that returned no longer count at the barriers")
end)

T.test("warp-shuffle reduction and scans: shfl_down, shfl_xor, shfl_up, shfl", function()
  local m = gpu.compile([[
extern "C" __global__ void warp_sums(const float *x, float *out, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  if ((threadIdx.x & 31) == 0 && i < n) out[i / 32] = v;
}
extern "C" __global__ void lanes(int *out)
{
  int lane = threadIdx.x & 31, v = lane * lane;
  int all = v;
  for (int o = 1; o < 32; o <<= 1) all += __shfl_xor_sync(0xffffffff, all, o);   /* butterfly: every lane */
  int scan = lane + 1;
  for (int o = 1; o < 32; o <<= 1) {                                              /* inclusive prefix sum */
    int up = __shfl_up_sync(0xffffffff, scan, o);
    if (lane >= o) scan += up;
  }
  int rot = __shfl_sync(0xffffffff, v, (lane + 1) & 31);                          /* from the next lane */
  int seg = __shfl_sync(0xffffffff, lane, 0, 8);                                   /* width 8: segment heads */
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  out[4 * t] = all; out[4 * t + 1] = scan; out[4 * t + 2] = rot; out[4 * t + 3] = seg;
}
extern "C" __global__ void wide(double *out, long long *lo)
{
  int lane = threadIdx.x & 31;
  double d = __shfl_down_sync(0xffffffff, lane + 0.5, 1);
  long long l = __shfl_down_sync(0xffffffff, (long long)lane << 40, 2);
  out[threadIdx.x] = d; lo[threadIdx.x] = l;
}
]])
  local n = 4096 + 17
  local x = gpu.rand({ n })
  local out = gpu.zeros({ (n + 31) // 32 + 1 })
  m.warp_sums { grid = (n + 255) // 256, block = 256 } (x, out, n)
  local got = out:totable()
  T.ok(max_rel(got, block_sums(x, n, 32)) < 1e-5, "sums of every warp of 32")
  local o = gpu.zeros({ 2 * 64 * 4 }, { dtype = "i32" }):view({ 128, 4 })
  m.lanes { grid = 2, block = 64 } (o)
  local rows, bad = o:totable(), 0
  for t = 1, 128 do
    local lane = (t - 1) % 32
    local want = { 10416, (lane + 1) * (lane + 2) // 2, ((lane + 1) % 32) ^ 2, lane - lane % 8 }
    for k = 1, 4 do if rows[t][k] ~= want[k] then bad = bad + 1 end end
  end
  T.is(bad, 0, "butterfly sum, prefix sum, rotation and width-8 broadcast in 4 warps")
  local d, l = gpu.zeros({ 32 }, { dtype = "f64" }), gpu.zeros({ 32 }, { dtype = "i64" })
  m.wide { grid = 1, block = 32 } (d, l)
  T.is({ d:get(1), d:get(31), d:get(32) }, { 1.5, 31.5, 31.5 }, "a double moves whole; the last lane keeps its own")
  T.is({ l:get(1), l:get(30), l:get(31) }, { 2 << 40, 31 << 40, 30 << 40 }, "64-bit integers move whole")
end)

T.test("votes and matches: ballot, any, all, activemask, match_any, reduce", function()
  local m = gpu.compile([[
extern "C" __global__ void vote(const int *x, unsigned *out)
{
  int lane = threadIdx.x & 31, v = x[threadIdx.x];
  unsigned b = __ballot_sync(0xffffffff, v > 0);
  int any = __any_sync(0xffffffff, v > 100), all = __all_sync(0xffffffff, v >= 0);
  unsigned act = __activemask();
  unsigned same = __match_any_sync(0xffffffff, v % 3);
  unsigned sum = __reduce_add_sync(0xffffffff, (unsigned)v);
  unsigned mx = __reduce_max_sync(0xffffffff, (unsigned)v);
  if (threadIdx.x == 0) { out[0] = b; out[1] = any; out[2] = all; out[3] = act; out[5] = sum; out[6] = mx; }
  if (threadIdx.x == 4) out[4] = same;
  if (lane < 16) {                                   /* half the warp, its own mask */
    unsigned h = __ballot_sync(0x0000ffff, v > 0);
    if (threadIdx.x == 0) out[7] = h;
  }
}
]])
  local v = {}
  for i = 1, 40 do v[i] = (i % 5 == 0) and 0 or i end
  local x = gpu.tensor(v, { dtype = "i32" })
  local out = gpu.zeros({ 8 }, { dtype = "i32" })
  m.vote { grid = 1, block = 40 } (x, out)
  local bal, same3, sum, mx = 0, 0, 0, 0
  for l = 0, 31 do
    if v[l + 1] > 0 then bal = bal | (1 << l) end
    if v[l + 1] % 3 == v[5] % 3 then same3 = same3 | (1 << l) end
    sum = sum + v[l + 1]
    mx = math.max(mx, v[l + 1])
  end
  local got = out:totable()
  local function u32(i) return i < 0 and i + (1 << 32) or i end
  T.is({ u32(got[1]), got[2], got[3], u32(got[4]), u32(got[5]), got[6], got[7], u32(got[8]) },
       { bal, 0, 1, 0xffffffff, same3, sum, mx, bal & 0xffff },
       "ballot, any, all, activemask, match_any, reduce_add/max, a half-warp ballot")
end)

T.test("tiled transpose through shared memory", function()
  local m = gpu.compile([[
#define TILE 32
#define ROWS 8
extern "C" __global__ void transpose(float *out, const float *in, int w, int h)
{
  __shared__ float tile[TILE][TILE + 1];
  int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    if (x < w && y + j < h) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * w + x];
  __syncthreads();
  x = blockIdx.y * TILE + threadIdx.x;
  y = blockIdx.x * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    if (x < h && y + j < w) out[(y + j) * h + x] = tile[threadIdx.x][threadIdx.y + j];
}
]])
  local h, w = 70, 45
  local a = gpu.rand({ h, w })
  local t = gpu.zeros({ w, h })
  m.transpose { grid = { (w + 31) // 32, (h + 31) // 32 }, block = { 32, 8 } } (t, a, w, h)
  local at, tt, bad = a:totable(), t:totable(), 0
  for i = 1, h do
    for j = 1, w do if tt[j][i] ~= at[i][j] then bad = bad + 1 end end
  end
  T.is(bad, 0, "a 70x45 matrix, 32x32 tiles of 32x8 threads")
end)

T.test("dynamic shared memory: extern __shared__, in a function and at file scope", function()
  local m = gpu.compile([[
extern "C" __global__ void rev(const float *x, float *y, int n)
{
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}
extern __shared__ __align__(16) unsigned char smem[];
extern "C" __global__ void halves(const int *x, int *y, int n)
{
  int *a = (int *)smem, *b = reinterpret_cast<int *>(smem) + n;   /* two arrays in one buffer */
  int i = threadIdx.x;
  a[i] = x[i];
  b[i] = 2 * x[i];
  __syncthreads();
  y[i] = a[n - 1 - i] + b[i];
}
]])
  local n = 24 * 1024                          -- 96 KiB
  local x, y = gpu.arange(n, { dtype = "f32" }), gpu.zeros({ n })
  m.rev { grid = 3, block = 256, shared = n * 4 } (x, y, n)
  T.is({ y:get(1), y:get(n), y:sum():item() }, { n - 1, 0, x:sum():item() }, "96 KiB of shared memory reverses")
  local xi, yi = gpu.arange(64, { dtype = "i32" }), gpu.zeros({ 64 }, { dtype = "i32" })
  m.halves { grid = 1, block = 64, shared = 2 * 64 * 4 } (xi, yi, 64)
  T.is({ yi:get(1), yi:get(64) }, { 63, 126 }, "a file-scope extern __shared__ split by casts")
end)

-- ---- atomics, math, 16-bit floats, printf, assert, clock64 -----------------------------

T.test("histogram with atomics: shared-memory bins, then global", function()
  local m = gpu.compile([[
#define BINS 64
extern "C" __global__ void histogram(const int *x, int n, unsigned *bins)
{
  __shared__ unsigned local[BINS];
  for (int b = threadIdx.x; b < BINS; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&local[x[i] % BINS], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < BINS; b += blockDim.x) atomicAdd(&bins[b], local[b]);
}
]])
  local n = 100000
  local x = (gpu.rand({ n }) * 1000):to("i32")
  local bins = gpu.zeros({ 64 }, { dtype = "i32" })
  m.histogram { grid = 40, block = 128 } (x, n, bins)
  local want = {}
  for b = 1, 64 do want[b] = 0 end
  for _, v in ipairs(x:totable()) do want[v % 64 + 1] = want[v % 64 + 1] + 1 end
  T.is(bins:totable(), want, "64 bins of 100000 values over 40 blocks")
end)

T.test("atomics on every type, from many blocks at once", function()
  local m = gpu.compile([[
extern "C" __global__ void hammer(int *i, unsigned *u, unsigned long long *ull, long long *ll, float *f, double *d)
{
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&i[0], 1);
  atomicSub(&i[1], 2);
  atomicMax(&i[2], t);
  atomicMin(&i[3], -t);
  atomicOr(&u[0], 1u << (t % 32));
  atomicAnd(&u[1], ~(1u << (t % 16)));
  atomicXor(&u[2], (unsigned)t);
  atomicInc(&u[3], 9u);               /* counts 0..9 and wraps */
  atomicAdd(&ull[0], (unsigned long long)t);
  atomicMax(&ull[1], (unsigned long long)t << 33);
  atomicMin(&ll[0], (long long)t * -1000000000LL);
  atomicAdd(&f[0], 0.5f);
  atomicAdd(&d[0], 0.25);
  atomicMax((int *)&f[1], __float_as_int((float)t));   /* float max of values >= 0 */
  int old;                            /* a lock-free add through atomicCAS */
  do { old = i[4]; } while (atomicCAS(&i[4], old, old + 3) != old);
  atomicExch(&i[5], 7);
  atomicDec(&u[4], 100u);             /* from 0: wraps to 100, then down */
}
]])
  local nb, bs = 300, 128
  local N = nb * bs
  local i = gpu.zeros({ 6 }, { dtype = "i32" })
  local u = gpu.tensor({ 0, -1, 0, 0, 0 }, { dtype = "i32" })
  local ull, ll = gpu.zeros({ 2 }, { dtype = "i64" }), gpu.zeros({ 1 }, { dtype = "i64" })
  local f, d = gpu.zeros({ 2 }), gpu.zeros({ 1 }, { dtype = "f64" })
  m.hammer { grid = nb, block = bs } (i, u, ull, ll, f, d)
  local xor = 0
  for t = 0, N - 1 do xor = xor ~ t end
  local ui = u:totable()
  T.is(i:totable(), { N, -2 * N, N - 1, -(N - 1), 3 * N, 7 }, "int: add, sub, max, min, a CAS loop, exch")
  T.is({ ui[1], ui[2], ui[3], ui[4], ui[5] }, { -1, -65536, xor, N % 10, 100 - (N - 1) % 101 },
       "unsigned: or, and, xor, inc with wrap, dec with wrap")
  T.is(ull:totable(), { N * (N - 1) // 2, (N - 1) << 33 }, "unsigned long long: add, max")
  T.is(ll:item(), (N - 1) * -1000000000, "long long: min")
  T.is({ f:get(1), f:get(2), d:item() }, { N * 0.5, N - 1.0, N * 0.25 }, "float and double add, float max")
end)

T.test("what CUDA lacks fails on both backends: atomicMax on a float", function()
  T.raises_at(function()
    gpu.compile([[extern "C" __global__ void fm(float *f) { atomicMax(f, 1.0f); }]])
  end, "compilation failed", "atomicMax(float *, float) does not compile")
end)

T.test("the math API against Lua's math", function()
  local m = gpu.compile([[
extern "C" __global__ void fns(const double *x, double *out, float *outf, int n)
{
  int i = threadIdx.x;
  if (i >= n) return;
  double v = x[i];
  float f = (float)v;
  double *o = out + 12 * i;
  o[0] = exp(v); o[1] = log1p(fabs(v)); o[2] = sqrt(fabs(v)); o[3] = tanh(v); o[4] = sin(v) * cos(v);
  o[5] = rsqrt(fabs(v) + 1); o[6] = erfinv(v / 4); o[7] = normcdf(v); o[8] = atan2(v, 2.0);
  o[9] = pow(fabs(v), 1.5); o[10] = fma(v, v, 1.0); o[11] = cbrt(v);
  float *of = outf + 8 * i;
  of[0] = expf(f); of[1] = __expf(f); of[2] = rsqrtf(fabsf(f) + 1); of[3] = tanhf(f); of[4] = __fdividef(f, 3.0f);
  of[5] = erfcinvf(0.5f + f / 8); of[6] = fmaxf(f, 0.0f) + fminf(f, 0.0f); of[7] = __saturatef(f);
}
]])
  local xs = { -3.5, -1, -0.25, 0, 0.3, 1, 2.5, 3.9 }
  local x = gpu.tensor(xs, { dtype = "f64" })
  local out, outf = gpu.zeros({ #xs * 12 }, { dtype = "f64" }), gpu.zeros({ #xs * 8 })
  m.fns { grid = 1, block = 32 } (x, out, outf, #xs)
  local o, of = out:totable(), outf:totable()
  local function erf(v)   -- Abramowitz-Stegun 7.1.26 is too coarse: by series
    local s, term, k = 0, v, 0
    repeat s = s + term / (2 * k + 1); k = k + 1; term = -term * v * v / k until math.abs(term) < 1e-17
    return 2 / math.sqrt(math.pi) * s
  end
  local worst, worstf = 0, 0
  for k, v in ipairs(xs) do
    local want = { math.exp(v), math.log(1 + math.abs(v)), math.sqrt(math.abs(v)),
                   (math.exp(2 * v) - 1) / (math.exp(2 * v) + 1), math.sin(v) * math.cos(v),
                   1 / math.sqrt(math.abs(v) + 1), nil, 0.5 * (1 + erf(v / math.sqrt(2))), math.atan(v, 2.0),
                   math.abs(v) ^ 1.5, v * v + 1, (v < 0 and -1 or 1) * math.abs(v) ^ (1 / 3) }
    local ev = o[12 * (k - 1) + 7]
    want[7] = erf(ev) - v / 4 + ev      -- erfinv checked through erf
    for j = 1, 12 do
      local g = o[12 * (k - 1) + j]
      worst = math.max(worst, math.abs(g - want[j]) / math.max(1, math.abs(want[j])))
    end
    local f = T.round_f32(v)
    local wf = { math.exp(f), math.exp(f), 1 / math.sqrt(math.abs(f) + 1), want[4], f / 3, nil, f, math.max(0, math.min(1, f)) }
    local e = of[8 * (k - 1) + 6]
    wf[6] = e - (1 - erf(e)) + (0.5 + f / 8)   -- erfcinv through erfc
    for j = 1, 8 do
      local g = of[8 * (k - 1) + j]
      worstf = math.max(worstf, math.abs(g - wf[j]) / math.max(1, math.abs(wf[j])))
    end
  end
  T.ok(worst < 1e-13, "double functions within 1e-13 (worst " .. worst .. ")")
  T.ok(worstf < 1e-6, "float functions within 1e-6 (worst " .. worstf .. ")")
end)

T.test("integer intrinsics and conversions with rounding modes", function()
  local m = gpu.compile([[
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void ints(long long *o)
{
  o[0] = __popc(0xf0f0f0f1u); o[1] = __clz(1); o[2] = __clz(0); o[3] = __ffs(0x80); o[4] = __brev(1u);
  o[5] = __byte_perm(0x33221100u, 0x77665544u, 0x7531u); o[6] = __funnelshift_l(0x80000000u, 1u, 1);
  o[7] = __umulhi(0xffffffffu, 0xffffffffu); o[8] = (long long)__umul64hi(1ull << 63, 6ull);
  o[9] = __sad(3, 10, 100u); o[10] = __dp4a(0x01020304, 0x01010101, 5); o[11] = __popcll(~0ull);
  o[12] = __float2int_rn(2.5f); o[13] = __float2int_rn(3.5f); o[14] = __float2int_rz(-2.7f);
  o[15] = __float2int_rd(-2.2f); o[16] = __float2int_ru(2.2f); o[17] = __float2int_rz(1e20f);
  o[18] = __float2uint_rz(-5.0f); o[19] = __double2ll_rn(-0.5); o[20] = __float_as_int(1.0f);
  o[21] = __half_as_ushort(__float2half_rz(1.0009f));                    /* truncated: 1.0 */
  o[22] = __half_as_ushort(__float2half_ru(1.0f + 0.0001f));            /* up: 1 + 2^-10 */
  o[23] = __half_as_ushort(__float2half_rd(-1.0f - 0.0001f));           /* down: -(1 + 2^-10) */
  o[24] = __half_as_ushort(__float2half(70000.0f));                     /* inf */
  o[25] = __half_as_ushort(__float2half_rz(70000.0f));                  /* the largest: 65504 */
  o[26] = __bfloat16_as_ushort(__float2bfloat16(1.00390625f));           /* a tie: to even, 1.0 */
  o[27] = min(-1, 2u) == 2u;                                             /* mixed: as unsigned */
}
]])
  local o = gpu.zeros({ 28 }, { dtype = "i64" })
  m.ints { grid = 1, block = 1 } (o)
  T.is(o:totable(), { 17, 31, 32, 8, 0x80000000, 0x77553311, 3, 0xfffffffe, 3, 107, 15, 64,
                      2, 4, -2, -3, 3, 2147483647, 0, 0, 0x3f800000,
                      0x3c00, 0x3c01, 0xbc01, 0x7c00, 0x7bff, 0x3f80, 1 },
       "bits, dp4a, saturating conversions, f16/bf16 rounding modes")
end)

T.test("f16 and bf16 kernels: conversions and arithmetic as the built-in ops", function()
  local m = gpu.compile([[
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void to16(const float *x, __half *h, __nv_bfloat16 *b, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { h[i] = __float2half(x[i]); b[i] = __float2bfloat16(x[i]); }
}
extern "C" __global__ void axpy16(const __half *x, __half *y, __half a, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __hadd(__hmul(a, x[i]), y[i]);
}
extern "C" __global__ void pairs(const __half2 *x, __half2 *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __hmul2(x[i], __float2half2_rn(2.0f)) + y[i];
}
]])
  local vals = { 0, -0.0, 1, 1 / 3, -2.5, 65504, 65519, 65520, 1e-7, 6e-8, 2.98e-8, -3e-5, 1e30, 3.14159 }
  local n = 4096
  for _, v in ipairs((gpu.randn({ n - #vals }) * 1000):totable()) do vals[#vals + 1] = v end
  local x = gpu.tensor(vals)
  local h, b = gpu.empty({ n }, { dtype = "f16" }), gpu.empty({ n }, { dtype = "bf16" })
  m.to16 { grid = n // 256, block = 256 } (x, h, b, n)
  T.is(h:totable(), x:to("f16"):totable(), "__float2half as t:to(\"f16\"), with subnormals and inf")
  T.is(b:totable(), x:to("bf16"):totable(), "__float2bfloat16 as t:to(\"bf16\")")
  T.is({ h:get(7), h:get(8), h:get(10), h:get(11) }, { 65504, math.huge, 2.0 ^ -24, 0 },
       "65519 rounds down, 65520 to inf, 6e-8 to the smallest subnormal, 2.98e-8 to 0")
  local xs, ys = gpu.rand({ n }):to("f16"), gpu.rand({ n }):to("f16")
  local want = (xs * 0.5 + ys):to("f32")
  m.axpy16 { grid = n // 256, block = 256 } (xs, ys, 0.5, n)
  T.is((ys:to("f32") - want):abs():max():item(), 0, "y = 0.5 x + y in f16, element by element as the built-in ops")
  local p, q = gpu.rand({ n }):to("f16"), gpu.rand({ n }):to("f16")
  local wq = (p * 2 + q):to("f32")
  m.pairs { grid = n // 2 // 256, block = 256 } (p, q, n // 2)
  T.is((q:to("f32") - wq):abs():max():item(), 0, "__half2 arithmetic through an f16 tensor")
end)

T.test("printf, clock64 and __nanosleep", function()
  local out, ok = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void hello(int n, double *dt)
{
  long long t0 = clock64();
  __nanosleep(2000000);
  printf("hello from block %d thread %d of %d (%.2f)\n", blockIdx.x, threadIdx.x, n, 0.5 * threadIdx.x);
  if (threadIdx.x == 0) dt[blockIdx.x] = (double)(clock64() - t0);
}
]])
local dt = gpu.zeros({ 2 }, { dtype = "f64" })
m.hello { grid = 2, block = 3 } (6, dt)
gpu.synchronize()
print("dt", dt:min():item() > 0)
]==])
  T.ok(ok, "the script runs")
  local lines = {}
  for l in out:gmatch("hello from [^\n]*") do lines[#lines + 1] = l end
  table.sort(lines)
  T.is(lines, { "hello from block 0 thread 0 of 6 (0.00)", "hello from block 0 thread 1 of 6 (0.50)",
                "hello from block 0 thread 2 of 6 (1.00)", "hello from block 1 thread 0 of 6 (0.00)",
                "hello from block 1 thread 1 of 6 (0.50)", "hello from block 1 thread 2 of 6 (1.00)" },
       "one line per thread, formatted by the C library")
  T.ok(out:find("dt\ttrue", 1, true), "clock64 moves forward across a __nanosleep")
end)

if not HOST then
  T.done()
  return
end

-- ---- the host backend's own -----------------------------------------------

T.test("fibers only for the kernels whose source reaches a barrier or warp primitive", function()
  -- a local's address: one stack for the whole block in a loop, a stack per
  -- thread as fibers
  local src = [[
__device__ float helper(float v) { __syncthreads(); return v; }
__device__ float indirect(float v) { return helper(v) + 1; }
#define WARP_SUM(v) __shfl_xor_sync(0xffffffff, v, 1)
__device__ void where(unsigned long long *out) { volatile int local = 0; out[threadIdx.x] = (unsigned long long)&local; }
extern "C" __global__ void plain(unsigned long long *out) { where(out); }
extern "C" __global__ void barrier(unsigned long long *out) { where(out); indirect(1.0f); }
extern "C" __global__ void shuffles(unsigned long long *out) { where(out); out[0] += 0 * WARP_SUM(1); }
]]
  local m = gpu.compile(src)
  local function stacks(k, name)
    local out = gpu.zeros({ 4 }, { dtype = "i64" })
    k { grid = 1, block = 4 } (out)
    local t, seen, n = out:totable(), {}, 0
    for i = 2, 4 do if not seen[t[i]] then seen[t[i]] = true; n = n + 1 end end
    return n
  end
  T.is(stacks(m.plain), 1, "a kernel that reaches none runs as a loop (one stack), beside kernels that do")
  T.is(stacks(m.barrier), 3, "through two device functions: fibers (a stack per thread)")
  T.is(stacks(m.shuffles), 3, "through a macro: fibers")
  local msg = T.raises(function()
    gpu.compile([[
#define CAT(a, b) a##b
extern "C" __global__ void hidden(int *x) { CAT(__sy, ncthreads)(); x[threadIdx.x] = 1; }
]]).hidden { grid = 1, block = 4 } (gpu.zeros({ 4 }, { dtype = "i32" }))
    gpu.synchronize()
  end, "kernel 'hidden' reached __syncthreads, which gpulua did not find on its way in the source",
    "a barrier the reading of the source misses fails clearly")
  T.ok(msg ~= nil, "(token pasting)")
end)

T.test("GPULUA_KERNEL_CHECK=1: out-of-bounds accesses name the kernel, its line and the script's", function()
  local script = [==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void twice(const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) y[i] = 2 * x[i < n ? i : 0];           /* one too many */
}
extern "C" __global__ void back(float *y) { y[(int)threadIdx.x - 1] = 0; }
extern "C" __global__ void sneaky(const float *x) { const_cast<float *>(x)[threadIdx.x] = 1; }
extern "C" __global__ void dyn(float *y)
{
  extern __shared__ float buf[];
  buf[threadIdx.x] = threadIdx.x;                    /* 65 threads, room for 64 */
  __syncthreads();
  y[threadIdx.x] = buf[threadIdx.x];
}
]], { name = "bounds.cu" })
local x, y = gpu.ones({ 1000 }), gpu.zeros({ 1000 })
local function try(f) local ok, err = pcall(f); print(ok and "ok" or err) end
m.twice { grid = 4, block = 256 } (x, y, 1000)
try(gpu.synchronize)
m.back { grid = 1, block = 32 } (y)
try(gpu.synchronize)
m.sneaky { grid = 1, block = 4 } (x)
try(gpu.synchronize)
m.dyn { grid = 1, block = 65, shared = 64 * 4 } (y)
try(gpu.synchronize)
m.twice { grid = 4, block = 250 } (x, y, 999)
try(gpu.synchronize)
print("sum", y:sum():item())
]==]
  local out = child(script, "GPULUA_KERNEL_CHECK=1")
  local lines = {}
  for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
  T.ok(out:find(":19: synchronize: 'twice' enqueued at [^\n]*:20 failed: illegal memory access %(cudaErrorIllegalAddress%): " ..
                "a 4%-byte write of element 1000 of argument 2 'y' %(float %*, 1000 elements%), past its end at " ..
                "bounds.cu:4, in block %[3,0,0%], thread %[232,0,0%]"),
       "an off-by-one write: the element, the argument, the kernel's line, the launch's line, the thread")
  T.ok(out:find("'back' enqueued at [^\n]*:22 failed: [^\n]*a 4%-byte write of element %-1 of argument 1 'y' " ..
                "%(float %*, 1000 elements%), before its start at bounds.cu:6"), "a write before the start")
  T.ok(out:find("'sneaky' enqueued at [^\n]*:24 failed: [^\n]*a 4%-byte write to argument 1 'x' %(const float %*, " ..
                "1000 elements%), which the kernel may only read %(a pointer to const%) at bounds.cu:7"),
       "a write through a pointer to const")
  T.ok(out:find("'dyn' enqueued at [^\n]*:26 failed: [^\n]*a 4%-byte write at byte 256 of the dynamic shared " ..
                "memory %(256 bytes%), past its end at bounds.cu:11"), "dynamic shared memory overrun")
  T.is(lines[#lines - 1], "ok", "a correct launch of the same module runs")
  T.ok(out:find("sum\t2000.0", 1, true), "with the right results")
  if not out:find("bounds.cu:4", 1, true) then T.diag(out) end
end)

T.test("GPULUA_KERNEL_CHECK=1: correct kernels with shared memory, fibers and atomics run clean", function()
  local out, ok = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void block_sum(const float *x, float *out, int n)
{
  __shared__ float s[128];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  float v = s[0];
  v = __shfl_sync(0xffffffff, v, 0);
  if (threadIdx.x == 0) atomicAdd(out, v);
}
]])
local x, out = gpu.ones({ 5000 }), gpu.zeros({ 1 })
m.block_sum { grid = 40, block = 128 } (x, out, 5000)
print("sum", out:item())
]==], "GPULUA_KERNEL_CHECK=1")
  T.ok(ok and out:find("sum\t5000.0", 1, true), "no false alarm, the right sum")
  if not ok then T.diag(out) end
end)

T.test("faults in kernel code fail the launch, not the process", function()
  local out, ok = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
extern "C" __global__ void wild(int *p) { p[threadIdx.x] = 1; }
extern "C" __global__ void div0(int *p, int d) { p[threadIdx.x] = 10 / (d - (int)threadIdx.x); }
__device__ int deep(int k) { volatile char buf[4096]; buf[k % 4096] = (char)k; return k > 0 ? deep(k - 1) + buf[0] : 0; }
extern "C" __global__ void rec(int *p) { __syncthreads(); p[threadIdx.x] = deep(1000); }
]])
local p = gpu.zeros({ 32 }, { dtype = "i32" })
local function try(f) local ok, err = pcall(f); print(ok and "ok" or err) end
m.wild { grid = 1, block = 32 } (nil)
try(gpu.synchronize)
m.div0 { grid = 1, block = 32 } (p, 5)
try(gpu.synchronize)
m.rec { grid = 1, block = 4 } (p)
try(gpu.synchronize)
print("after", gpu.ones({ 3 }):sum():item())
]==], "GPULUA_KERNEL_CHECK=0")
  T.ok(ok, "the process goes on")
  T.ok(out:find("'wild' enqueued at [^\n]*:10 failed: illegal memory access %(cudaErrorIllegalAddress%): a fault at " ..
                "address 0x0 %(a null pointer%?%), in block %[0,0,0%] %(GPULUA_KERNEL_CHECK=1 finds the line%)"),
       "a null pointer: SIGSEGV caught")
  T.ok(out:find("'div0' enqueued at [^\n]*:12 failed: integer division by zero [^\n]*, in block %[0,0,0%]\n"),
       "integer division by zero: SIGFPE caught (a kernel run as a loop: the block)")
  T.ok(out:find("'rec' enqueued at [^\n]*:14 failed: a kernel thread overflowed its stack of 128 KiB " ..
                "%(cudaErrorHardwareStackError%)"), "a stack overflow in a fiber")
  T.ok(out:find("after\t3.0", 1, true), "later work runs")
  if not ok or not out:find("overflowed", 1, true) then T.diag(out) end
end)

T.test("a device assert and __trap: the kernel, its line, the script's line", function()
  local out, ok = child([==[
local gpu = require "gpu"
local m = gpu.compile([[
#include <assert.h>
extern "C" __global__ void check(const int *x, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) assert(x[i] >= 0);
}
extern "C" __global__ void boom() { if (threadIdx.x == 5) __trap(); }
]], { name = "check.cu" })
local x = gpu.arange(-3, 61, { dtype = "i32" })
m.check { grid = 4, block = 16 } (gpu.arange(64, { dtype = "i32" }), 64)
gpu.synchronize()
print("passing asserts are silent")
m.check { grid = 4, block = 16 } (x, 64)
local ok, err = pcall(gpu.synchronize)
print("first:", err)
print("after:", gpu.zeros({ 4 }):add(1):sum():item())
m.boom { grid = 1, block = 8 } ()
ok, err = pcall(gpu.synchronize)
print("trap:", err)
]==])
  T.ok(ok and out:find("passing asserts are silent", 1, true), "the script runs on")
  T.ok(out:find("first:%s+[^\n]*:16: synchronize: 'check' enqueued at [^\n]*:15 failed: device%-side assert " ..
                "triggered %(cudaErrorAssert%): check.cu:5: check: block %[0,0,0%], thread %[[0-2],0,0%]: " ..
                "Assertion `x%[i%] >= 0` failed%."),
       "the kernel, the launch's line, the source line, the thread and the expression")
  T.ok(out:find("after:\t4.0", 1, true), "the context stays usable on the host backend")
  T.ok(out:find("trap:%s+[^\n]*'boom' enqueued at [^\n]*:19 failed: an illegal instruction was encountered " ..
                "%(cudaErrorIllegalInstruction%): __trap%(%) in block %[0,0,0%], thread %[5,0,0%]"),
       "__trap() in block [0,0,0], thread [5,0,0]")
  if not out:find("cudaErrorAssert", 1, true) then T.diag(out) end
end)

T.test("a warp operation that cannot complete fails the kernel, naming the block", function()
  local m = gpu.compile([[
extern "C" __global__ void stuck(int *x)
{
  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0xffffffff, 1, 0);
  else __syncthreads();
}
]])
  local x = gpu.zeros({ 32 }, { dtype = "i32" })
  m.stuck { grid = { 1, 2 }, block = 32 } (x)
  local msg = T.raises(function() gpu.synchronize() end, "block %[0,%d,0%] cannot go on", "the sync raises")
  T.ok(msg and msg:find("16 threads wait at __syncthreads and 16 at a warp operation", 1, true),
       "what waits for what: " .. tostring(msg))
  T.ok(msg and msg:find("'stuck' enqueued at ", 1, true), "the kernel and where it was enqueued")
end)

T.test("compile errors: the compiler's message, the kernel's line, the script's line", function()
  local msg = T.raises_at(function()
    gpu.compile("extern \"C\" __global__ void k(float *x)\n{\n  x[0] = undefined_name;\n}\n", { name = "broken.cu" })
  end, "gpu.compile: compilation failed", "a compile error raises at the calling line")
  T.ok(msg and msg:find("broken.cu:3:", 1, true) and msg:find("undefined_name", 1, true),
       "the message has the program name, the kernel's line and the identifier")
  T.ok(msg and not msg:find("gpulua-cc-", 1, true), "no temporary path in the message")
  msg = T.raises_at(function()
    gpu.compile("#include <cooperative_groups.h>\n__global__ void k() {}\n", { name = "cg.cu" })
  end, "compilation failed", "a header the host backend does not supply")
  T.ok(msg and msg:find("cg.cu:1:", 1, true) and msg:find("cooperative_groups.h", 1, true),
       "names the header and the line")
  msg = T.raises_at(function()
    gpu.compile("__global__ void k(int *x) {\n  asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(x[0]));\n}\n", { name = "ptx.cu" })
  end, "compilation failed", "inline PTX")
  T.ok(msg and msg:find("ptx.cu:2:", 1, true) and msg:find("inline_PTX_asm_cannot_run_on_the_host_backend", 1, true),
       "inline PTX fails at its line, saying why")
  T.raises_at(function() gpu.compile("__global__ void k(int a, {}") end, "unbalanced parentheses", "a broken signature")
  T.raises_at(function()
    gpu.load_module(".version 8.0\n.target sm_90\n.entry k() { ret; }")
  end, "gpu.load_module: run-time kernels need the cuda backend", "PTX stays cuda's")
end)

T.test("no C++ compiler: a clear error", function()
  local out, ok = child("local gpu = require 'gpu'\ngpu.compile('__global__ void k() {}')\n",
                        "GPULUA_CXX=/nonexistent/c++")
  T.ok(not ok and out:find(":2: gpu.compile: GPULUA_CXX='/nonexistent/c++': no such executable", 1, true),
       "GPULUA_CXX naming nothing")
  out, ok = child("local gpu = require 'gpu'\ngpu.compile('__global__ void k() {}')\n", "PATH=/nonexistent")
  T.ok(not ok and out:find("needs a C++ compiler", 1, true) and out:find("apt-get install g++", 1, true),
       "none on PATH: says what to install")
  if ok or not out:find("C++ compiler", 1, true) then T.diag(out) end
end)

T.test("the on-disk cache: keyed by source and options, the compiler not run on a hit", function()
  local dir = tmpdir()
  -- a compiler that refuses to compile once `deny` exists (--version still answers)
  local cxx = dir .. "/cxx.sh"
  local f = assert(io.open(cxx, "w"))
  f:write("#!/bin/sh\n[ \"$1\" = --version ] && exec c++ --version\n[ -e '" .. dir ..
          "/deny' ] && { echo 'compiler called' >&2; exit 3; }\nexec c++ \"$@\"\n")
  f:close()
  T.sh("chmod +x " .. cxx)
  local env = "GPULUA_CXX=" .. cxx .. " GPULUA_KERNEL_CACHE=" .. dir .. "/cache"
  local script = [[
local gpu = require 'gpu'
local m = gpu.compile(%q, { options = { %s } })
local x, y = gpu.ones({ 8 }), gpu.ones({ 8 })
m.saxpy { grid = 1, block = 8 } (3.0, x, y, 8)
print("sum", y:sum():item())
]]
  local out, ok = child(script:format(SAXPY, ""), env)
  T.ok(ok and out:find("sum\t32.0", 1, true), "compiled and ran")
  local function entries() return select(2, T.sh("ls " .. dir .. "/cache/*.hk 2>/dev/null"):gsub("\n", "")) end
  T.is(entries(), 1, "one cache entry")
  T.sh("touch " .. dir .. "/deny")
  out, ok = child(script:format(SAXPY, ""), env)
  T.ok(ok and out:find("sum\t32.0", 1, true), "the same source and options: from the cache, no compiler run")
  if not ok then T.diag(out) end
  out, ok = child(script:format(SAXPY, '"-DX=1"'), env)
  T.ok(not ok and out:find("exited with status 3", 1, true), "other options: compiled again")
  out, ok = child(script:format(SAXPY .. "// changed\n", ""), env)
  T.ok(not ok and out:find("exited with status 3", 1, true), "another source: compiled again")
  out, ok = child(script:format(SAXPY, ""), env:gsub("GPULUA_KERNEL_CACHE=%S+", "GPULUA_KERNEL_CACHE=0"))
  T.ok(not ok and out:find("exited with status 3", 1, true), "GPULUA_KERNEL_CACHE=0: no cache")
  -- a damaged entry is a miss, never a wrong module
  T.sh("rm " .. dir .. "/deny; for f in " .. dir .. "/cache/*.hk; do head -c 100 \"$f\" > \"$f.x\"; mv \"$f.x\" \"$f\"; done")
  out, ok = child(script:format(SAXPY, ""), env)
  T.ok(ok and out:find("sum\t32.0", 1, true), "a damaged entry is compiled again")
  T.sh("rm -rf " .. dir)
end)

T.test("GPULUA_HOST_THREADS: the result does not depend on the workers", function()
  local script = [[
local gpu = require 'gpu'
local m = gpu.compile(%q)
local n = 1 << 18
local x, y = gpu.arange(n, { dtype = "f32" }), gpu.ones({ n })
m.saxpy { grid = n // 128, block = 128 } (2.0, x, y, n)
print("err", (y - (x * 2 + 1)):abs():max():item())
]]
  local want = "err\t0.0"
  for _, n in ipairs({ 1, 3 }) do
    local out, ok = child(script:format(SAXPY), "GPULUA_HOST_THREADS=" .. n)
    T.ok(ok and out:find(want, 1, true), "GPULUA_HOST_THREADS=" .. n)
    if not ok then T.diag(out) end
  end
  local out, ok = child(script:format(SAXPY), "GPULUA_HOST_THREADS=zero")
  T.ok(not ok and out:find("GPULUA_HOST_THREADS='zero' is not a number of threads (1 to 1024)", 1, true),
       "a bad value fails the launch, saying why")
end)

T.done()
