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
  T.is((y - want):abs():max():item(), 0, "y = 2.5 x + y over 391 blocks")
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

if not HOST then
  T.done()
  return
end

-- ---- the host backend's own -----------------------------------------------

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
