-- Run-time kernels: gpu.compile (NVRTC on cuda, the system C++ compiler on
-- the host backend) and gpu.load_module (cuda only), argument and
-- launch-configuration checks, compile errors, lifetime of modules and
-- tensors used by queued launches, and asynchronous kernel errors (an
-- illegal address, a device-side assert) reported in a child process with
-- the failed kernel and its script line.  The same file runs on both
-- backends; what only one of them does is marked.
local gpu = require "gpu"
local T = require "gpu.test"

local BIN = arg and arg[-1] or "build/gpulua"
local CUDA = gpu.backend == "cuda"

local SAXPY = [[
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
]]

T.test("compile and launch saxpy", function()
  local m = gpu.compile(SAXPY)
  T.is(tostring(m.saxpy), "gpu.Kernel: __global__ void saxpy(float a, const float *x, float *y, int n)",
       "the kernel shows its signature")
  T.is(m.saxpy.name, "saxpy", "k.name")
  T.is(#m.saxpy.params, 4, "k.params lists 4 parameters")
  T.is(m.saxpy.params[2].type, "const float *", "k.params[2].type")
  T.ok(m.saxpy.max_threads >= 256, "k.max_threads " .. m.saxpy.max_threads)
  local n = 1000
  local x = gpu.arange(n, { dtype = "f32" })
  local y = gpu.full({ n }, 1, { dtype = "f32" })
  local s = gpu.stream()
  m.saxpy { grid = math.ceil(n / 256), block = 256, stream = s } (2.0, x, y, n)
  s:synchronize()
  local got = y:totable()
  local bad = 0
  for i = 1, n do if got[i] ~= 2 * (i - 1) + 1 then bad = bad + 1 end end
  T.is(bad, 0, "y = 2x + 1 for all 1000 elements")
  -- a launcher is reusable, and runs on the current stream when it names none
  local launch = m.saxpy { grid = { math.ceil(n / 128) }, block = { 128, 1, 1 } }
  do
    local _ <close> = gpu.using(s)
    launch(1.0, x, y, n)
    launch(1.0, x, y, n)
  end
  T.is(y:get(11), 2 * 10 + 1 + 2 * 10, "two more launches on the current stream")
  s:close()
end)

T.test("every scalar parameter type reaches the kernel", function()
  local m = gpu.compile([[
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void echo(double *o, long long *io, int a, unsigned b, long long c,
                                size_t d, float e, double f, __half g, __nv_bfloat16 h, bool i,
                                short j, unsigned char k, signed char l)
{
  io[0] = a; io[1] = b; io[2] = c; io[3] = (long long)d; io[4] = i; io[5] = j; io[6] = k; io[7] = l;
  o[0] = e; o[1] = f; o[2] = __half2float(g); o[3] = __bfloat162float(h);
}
]])
  local o, io = gpu.zeros({ 4 }, { dtype = "f64" }), gpu.zeros({ 8 }, { dtype = "i64" })
  m.echo { grid = 1, block = 1 } (o, io, -7, 4000000000, -(1 << 40), (1 << 50), 1.5, 1 / 3, 0.25, -2.5,
                                  true, -300, 255, -128)
  T.is(io:totable(), { -7, 4000000000, -(1 << 40), 1 << 50, 1, -300, 255, -128 }, "integers and bool")
  T.is(o:totable(), { 1.5, 1 / 3, 0.25, -2.5 }, "float, double, __half, __nv_bfloat16")
end)

T.test("argument checks name the parameter", function()
  local m = gpu.compile(SAXPY)
  local k = m.saxpy { grid = 1, block = 32 }
  local x, y = gpu.zeros({ 32 }), gpu.zeros({ 32 })
  T.raises_at(function() k(1.0, x, y) end,
              "kernel 'saxpy' takes 4 arguments, got 3: __global__ void saxpy(float a, const float *x, float *y, int n)",
              "a missing argument raises with the signature")
  T.raises_at(function() k(1.0, x, y, 32, 5) end, "takes 4 arguments, got 5", "an extra argument raises")
  T.raises_at(function() k("two", x, y, 32) end, "argument 1 (float a): expected a number, got string",
              "a string for float")
  T.raises_at(function() k(1.0, gpu.zeros({ 32 }, { dtype = "i32" }), y, 32) end,
              "argument 2 (const float * x): expected a f32 tensor, got i32", "the wrong dtype")
  T.raises_at(function() k(1.0, 3, y, 32) end, "argument 2 (const float * x): expected a tensor, got number",
              "a number for a pointer")
  T.raises_at(function() k(1.0, x, y, 2.5) end, "argument 4 (int n): expected an integer, got 2.5",
              "a fraction for int")
  T.raises_at(function() k(1.0, x, y, 1 << 40) end, "argument 4 (int n): 1099511627776 is outside [-2^31, 2^31)",
              "an int out of range")
  T.raises_at(function() k(1.0, x:to("host"), y, 32) end, "argument 2 (const float * x): a host tensor",
              "a pageable host tensor")
  local closed = gpu.zeros({ 32 })
  closed:close()
  T.raises_at(function() k(1.0, closed, y, 32) end, "argument 2 (const float * x): tensor is closed",
              "a closed tensor")
  local wide = gpu.zeros({ 4, 8 })
  T.raises_at(function() k(1.0, wide:narrow(2, 1, 4), y, 32) end, "not contiguous", "a strided view")
  local u = gpu.compile([[extern "C" __global__ void u(unsigned n, bool b, unsigned char c) {}]])
  T.raises_at(function() u.u { grid = 1, block = 1 } (-1, true, 0) end, "argument 1 (unsigned n): -1 is outside [0, 2^32)",
              "a negative unsigned")
  T.raises_at(function() u.u { grid = 1, block = 1 } (1, 1, 0) end, "argument 2 (bool b): expected a boolean, got number",
              "a number for bool")
  T.raises_at(function() u.u { grid = 1, block = 1 } (1, true, 256) end, "argument 3 (unsigned char c): 256 is outside [0, 2^8)",
              "unsigned char out of range")
  local st = gpu.compile([[struct P { int a; }; extern "C" __global__ void s(P p) {}]])
  T.raises_at(function() st.s { grid = 1, block = 1 } (1) end, "argument 1 (P p): gpulua cannot pass this type",
              "a struct parameter")
  -- nothing was enqueued by the failed calls: y is untouched
  T.is(y:sum():item(), 0, "failed launches enqueue nothing")
end)

T.test("launch configurations are checked before launch", function()
  local k = gpu.compile(SAXPY).saxpy
  T.raises_at(function() k { block = 32 } end, "'grid' is missing", "no grid")
  T.raises_at(function() k { grid = 1 } end, "'block' is missing", "no block")
  T.raises_at(function() k { grid = 0, block = 32 } end, "grid.x must be a positive integer, got 0", "grid 0")
  T.raises_at(function() k { grid = 1, block = 2048 } end, "block.x = 2048 is outside [1, 1024]", "block 2048")
  T.raises_at(function() k { grid = 1, block = { 32, 32, 2 } } end, "a block of 2048 threads is more than", "2048 threads")
  T.raises_at(function() k { grid = { 1, 70000 }, block = 1 } end, "grid.y = 70000 is outside [1, 65535]", "grid.y")
  T.raises_at(function() k { grid = { 1, 1, 1, 1 }, block = 1 } end, "1 to 3 dimensions", "4 dimensions")
  T.raises_at(function() k { grid = 1, block = 1, shared = 1 << 30 } end, "shared = 1073741824 bytes is more than",
              "too much shared memory")
  T.raises_at(function() k { grid = 1, block = 1, strem = 1 } end, "unknown option 'strem'", "a misspelt key")
  T.raises_at(function() k { grid = 1, block = 1, stream = 3 } end, "'stream' must be a gpu.Stream", "a bad stream")
  T.raises_at(function() k(1.0) end, "call it with a launch configuration first", "calling without a configuration")
  local s = gpu.stream()
  local launch = k { grid = 1, block = 1, stream = s }
  s:close()
  T.raises_at(function() launch(1.0, gpu.zeros({ 1 }), gpu.zeros({ 1 }), 1) end, "stream is closed",
              "a launcher whose stream was closed")
end)

T.test("dynamic shared memory above 48 KiB", function()
  local m = gpu.compile([[
extern "C" __global__ void rev(const float *x, float *y, int n)
{
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}
]])
  local n = 24 * 1024                          -- 96 KiB of shared memory
  local x, y = gpu.arange(n, { dtype = "f32" }), gpu.zeros({ n })
  m.rev { grid = 1, block = 256, shared = n * 4 } (x, y, n)
  T.is({ y:get(1), y:get(n) }, { n - 1, 0 }, "a 96 KiB shared buffer reverses the input")
end)

T.test("compile errors carry the compiler's log and the script line", function()
  local msg = T.raises_at(function()
    gpu.compile("extern \"C\" __global__ void k(float *x)\n{\n  x[0] = undefined_name;\n}\n", { name = "broken.cu" })
  end, "gpu.compile: compilation failed", "a compile error raises at the calling line")
  T.ok(msg and msg:find(CUDA and "broken.cu(3): error" or "broken.cu:3:", 1, true) and msg:find("undefined_name", 1, true),
       "the message has the program name, the source line and the identifier")
  T.raises_at(function() gpu.compile(SAXPY, { options = { "--no-such-flag" } }) end, "compilation failed",
              "an unknown compiler option raises")
  T.raises_at(function() gpu.compile(SAXPY, { options = { 42 } }) end, "item 1: string expected", "a non-string option")
  T.raises_at(function() gpu.compile("__global__ void k(int a, {}") end, "unbalanced parentheses", "a broken signature")
  local m = gpu.compile(SAXPY, { options = { "-DUNUSED=1", "--use_fast_math" }, cache = false })
  T.ok(m.saxpy ~= nil, "options and cache = false compile")
end)

T.test("templates, overloads, namespaces and missing kernels", function()
  local m = gpu.compile([[
template <typename T> __global__ void tk(T *x) {}
__global__ void ov(int a) {}
__global__ void ov(float a, int b) {}
namespace inner { __global__ void nk(int *x) { x[0] = 5; } }
__global__ void cxx(float *x) { x[0] = 3; }
]])
  T.raises_at(function() m.tk { grid = 1, block = 1 } end, "is a template", "a template kernel")
  T.raises_at(function() m.ov { grid = 1, block = 1 } end, "is overloaded", "an overloaded kernel")
  T.raises_at(function() return m.nope end, "the module has no kernel 'nope' (kernels: ", "a missing kernel")
  local xi, xf = gpu.zeros({ 1 }, { dtype = "i32" }), gpu.zeros({ 1 })
  m.nk { grid = 1, block = 1 } (xi)
  m.cxx { grid = 1, block = 1 } (xf)
  T.is({ xi:item(), xf:item() }, { 5, 3 }, "a kernel in a namespace and a C++ (mangled) kernel launch")
end)

local PTX = [[
.version 8.0
.target sm_90
.address_size 64
.visible .entry fill7(.param .u64 p, .param .u32 n)
{
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  .reg .pred %q;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %tid.x;
  setp.ge.u32 %q, %r2, %r1;
  @%q bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r2, 4;
  add.s64 %rd2, %rd2, %rd3;
  mov.u32 %r3, 7;
  st.global.u32 [%rd2], %r3;
DONE:
  ret;
}
]]

T.test("load_module: PTX from a string and a file, with and without declarations", function()
  if not CUDA then
    T.raises_at(function() gpu.load_module(PTX) end, "gpu.load_module: run-time kernels need the cuda backend",
                "gpu.load_module is cuda's (PTX, cubin, fatbin)")
    return
  end
  local m = gpu.load_module(PTX)
  local x = gpu.zeros({ 8 }, { dtype = "i32" })
  m.fill7 { grid = 1, block = 8 } (x, 6)
  T.is(x:totable(), { 7, 7, 7, 7, 7, 7, 0, 0 }, "a PTX kernel (parameters from .entry) fills 6 of 8")
  T.raises_at(function() m.fill7 { grid = 1, block = 8 } (x, 2.5) end, "argument 2 (.u32 n): expected an integer, got 2.5",
              "a fraction for .u32")
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(PTX)
  f:close()
  local mf = gpu.load_module(path, { declare = [[extern "C" __global__ void fill7(int *p, unsigned n);]] })
  T.is(tostring(mf.fill7), "gpu.Kernel: __global__ void fill7(int *p, unsigned n)", "declare gives the types")
  T.raises_at(function() mf.fill7 { grid = 1, block = 8 } (gpu.zeros({ 8 }), 8) end, "expected a i32 tensor, got f32",
              "declared types are checked")
  os.remove(path)
  T.raises_at(function() gpu.load_module("/nonexistent/k.ptx") end, "cannot open '/nonexistent/k.ptx'", "a missing file")
  T.raises_at(function() gpu.load_module(PTX, { declare = [[extern "C" __global__ void fill7(int *p, int n, int m);]] }) end,
              "has 3 parameters but the compiled kernel has 2", "a declaration with too many parameters")
  T.raises_at(function() gpu.load_module(PTX, { declare = [[extern "C" __global__ void fill7(int *p, short n);]] }) end,
              "parameter 2 (short n): read as 2 bytes but compiled as 4", "a declaration with a wrong size")
  T.raises_at(function() gpu.load_module(".version 8.0\n.target sm_90\n.entry k( { ret; }") end,
              "gpu.load_module", "malformed PTX raises")
end)

T.test("pinned tensors: a kernel writes, the host read waits for it", function()
  local m = gpu.compile([[
extern "C" __global__ void slow_fill(float *x, int n, float v)
{
  long long t0 = clock64();
  while (clock64() - t0 < 20000000) {}
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = v;
}
]])
  local p = gpu.pinned({ 64 })
  local s = gpu.stream()
  m.slow_fill { grid = 1, block = 64, stream = s } (p, 64, 9)
  T.is(p:get(64), 9, "the host read of pinned memory waits for the kernel that writes it")
  s:close()
end)

T.test("lifetime: modules and tensors outlive their handles while launches are queued", function()
  local s1, s2 = gpu.stream(), gpu.stream()
  local out = gpu.zeros({ 1 << 20 })
  do
    local m = gpu.compile([[
extern "C" __global__ void copyk(const float *x, float *y, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
]])
    local x = gpu.full({ 1 << 20 }, 3)
    gpu.sleep(50, { stream = s1 })                    -- the launch waits behind this
    m.copyk { grid = 4096, block = 256, stream = s1 } (x, out, 1 << 20)
    local done = s1:record()
    s2:wait(done)
    -- drop the module, the kernel handle and x while the launch is queued
  end
  collectgarbage()
  collectgarbage()
  -- new allocations on another stream must not get x's memory while it is read
  local junk = {}
  for i = 1, 4 do junk[i] = gpu.full({ 1 << 20 }, -1, { stream = s2 }) end
  s1:synchronize()
  s2:synchronize()
  T.is(out:min():item(), 3, "the queued kernel read its input intact (min)")
  T.is(out:max():item(), 3, "the queued kernel read its input intact (max)")
  junk = nil
  s1:close()
  s2:close()
end)

-- Asynchronous errors, each in a child gpulua so the lost context ends there.
local function child(src, env)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  local p = assert(io.popen(string.format("%s %s %s 2>&1; echo \"exit=$?\"", env or "", BIN, path)))
  local out = p:read("a")
  p:close()
  os.remove(path)
  return out, path
end

local ILLEGAL = [[
local gpu = require "gpu"
local m = gpu.compile('extern "C" __global__ void wild(int *p) { p[threadIdx.x] = 1; }')
gpu.synchronize()
m.wild { grid = 1, block = 32 } (nil)
print("enqueued")
local ok, err = pcall(gpu.synchronize)
print("first:", err)
local ok2, err2 = pcall(function() return gpu.zeros({ 4 }):sum():item() end)
print("second:", err2)
error("done", 0)
]]

T.test("an illegal address: reported at the next sync, naming the kernel and its line", function()
  local out, path = child(ILLEGAL)
  local short = path:match("[^/]+$")
  T.ok(out:find("enqueued\n", 1, true), "the launch returns at once")
  T.ok(out:find("first:%s+[^\n]*'wild' enqueued at [^\n]*" .. short:gsub("%p", "%%%0") .. ":4[^\n]*cudaErrorIllegalAddress"),
       "the sync names the kernel, its script line and the CUDA error")
  if CUDA then
    T.ok(out:find("second:%s+[^\n]*unusable after an earlier error"), "later calls say the context is lost")
  else
    T.ok(out:find("second:\t0.0", 1, true), "the host backend's context stays usable (the fault was caught)")
  end
  T.ok(out:find("exit=1", 1, true), "the process exits with status 1, no hang, no crash")
  if not out:find("cudaErrorIllegalAddress", 1, true) then T.diag(out) end
end)

local ASSERT = [[
local gpu = require "gpu"
local m = gpu.compile([==[
extern "C" __device__ void __assertfail(const char *msg, const char *file, unsigned line,
                                        const char *fn, size_t charsize);
extern "C" __global__ void check(int v) { if (v != 42) __assertfail("v == 42", "check.cu", 3, "check", 1); }
]==])
m.check { grid = 1, block = 1 } (42)
gpu.synchronize()
print("42 passes")
m.check { grid = 1, block = 1 } (7)
gpu.synchronize()
print("not reached")
]]

T.test("a device-side assert: the error text and the line", function()
  local out = child(ASSERT)
  T.ok(out:find("42 passes", 1, true), "a passing assert is silent")
  T.ok(out:find("'check' enqueued at [^\n]*:10[^\n]*cudaErrorAssert"), "the failed assert names the kernel, line 10 and cudaErrorAssert")
  T.ok(not out:find("not reached", 1, true), "the script stops at the sync")
  T.ok(out:find("exit=1", 1, true), "exit status 1")
  if not out:find("cudaErrorAssert", 1, true) then T.diag(out) end
end)

-- Built-in ops queued before the failing kernel and not yet known to be done
-- must not take the blame (issue 21, item 4).
local ASSERT_AFTER = [[
local gpu = require "gpu"
local m = gpu.compile([==[
extern "C" __device__ void __assertfail(const char *msg, const char *file, unsigned line,
                                        const char *fn, size_t charsize);
extern "C" __global__ void positive(const int *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && x[i] < 0) __assertfail("x[i] >= 0", "positive.cu", 5, "positive", 1);
}
]==])
gpu.synchronize()
local bad = gpu.arange(-5, 5, { dtype = "i32" })
local doubled = bad * 2
m.positive { grid = 1, block = 32 } (doubled, 10)
local ok, err = pcall(gpu.synchronize)
print("first:", err)
]]

T.test("a device-side assert after built-in ops: the kernel is blamed, not the ops before it", function()
  local out = child(ASSERT_AFTER)
  T.ok(out:find("first:%s+[^\n]*'positive' enqueued at [^\n]*:13[^\n]*cudaErrorAssert"),
       "the error names the kernel and its line (13)")
  T.ok(not out:find("'arange' enqueued", 1, true) and not out:find("'mul' enqueued", 1, true),
       "not the arange or the mul queued before it")
  if not out:find("'positive' enqueued", 1, true) then T.diag(out) end
end)

-- Issue 35, item 7: after a caught device-side assert the end must always
-- report the lost context and exit 1.  The background kernel loader could
-- still be loading at exit(), racing the runtime's teardown: 4 runs in 160
-- crashed (SIGSEGV or an abort in malloc) on an H200.  Many runs, so a race
-- that is left has a good chance to show.
T.test("a caught device-side assert, then the end: exit 1 every time, never a crash", function()
  if not CUDA then return T.skip("lost context at exit", "the cuda backend's context") end
  local runs = 40
  local bad = {}
  for i = 1, runs do
    local out = child(ASSERT_AFTER)
    if not (out:find("exit=1\n", 1, true) and out:find("the CUDA context is unusable after an earlier error", 1, true)) then
      bad[#bad + 1] = out
    end
    if #bad > 0 and i >= 10 then break end
  end
  T.is(#bad, 0, "every run exits 1 with the lost context's message")
  if bad[1] then T.diag(bad[1]) end
end)

T.test("GPULUA_LAUNCH_BLOCKING=1: the error is raised by the launch itself", function()
  if not CUDA then return T.skip("GPULUA_LAUNCH_BLOCKING", "a cuda backend setting") end
  local out = child(ILLEGAL, "GPULUA_LAUNCH_BLOCKING=1")
  T.ok(not out:find("enqueued\n", 1, true), "the launch line raises")
  T.ok(out:find(":4: kernel 'wild': GPULUA_LAUNCH_BLOCKING: 'wild' enqueued at [^\n]*:4[^\n]*cudaErrorIllegalAddress"),
       "the error names the launch line")
  T.ok(out:find("exit=1", 1, true), "exit status 1")
  if not out:find("cudaErrorIllegalAddress", 1, true) then T.diag(out) end
end)

T.done()
