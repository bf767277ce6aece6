/* test_share — TAP test of what an application shares with scripts through
 * gpulua.h: its own memory as tensors (gpulua_push_tensor,
 * gpulua_push_tensor_ex and GPULUA_PUSH_GUARDED, gpulua_check_tensor), streams both ways (gpulua_stream_handle,
 * gpulua_push_stream) and C functions launched as kernels
 * (gpulua_register_kernel).  Runs on the device GPULUA_DEVICE names: the
 * host backend in CI, cuda under make test-gpu (then the CUDA paths run too:
 * cudaMalloc'd memory, the application's cudaStream_t, a C kernel that
 * enqueues a copy). */
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "gpulua.h"
#include "tests/tap.h"

#ifdef GPULUA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int contains(const char *s, const char *sub) { return s != NULL && strstr(s, sub) != NULL; }

/* The first line of a message, for a TAP description. */
static const char *line1(const char *msg) {
  static char buf[400];
  snprintf(buf, sizeof buf, "%.*s", (int)strcspn(msg, "\n"), msg);
  return buf;
}

static int is_cuda(gpulua *g) {
  lua_State *L = gpulua_state(g);
  lua_getglobal(L, "gpu");
  lua_getfield(L, -1, "backend");
  int cuda = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "cuda") == 0;
  lua_pop(L, 2);
  return cuda;
}

static int run(gpulua *g, const char *chunk) {
  int rc = gpulua_dostring(g, chunk, "=test");
  if (rc != 0) diag(gpulua_error(g));
  return rc;
}

static double global_num(gpulua *g, const char *name) {
  lua_State *L = gpulua_state(g);
  lua_getglobal(L, name);
  double v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : -12345.0;
  lua_pop(L, 1);
  return v;
}

typedef struct released { int calls; void *last; } released;

static void on_release(void *ud, void *data) {
  released *r = ud;
  r->calls++;
  r->last = data;
}

static gpulua_tensor_info info_c(void *data, gpulua_dtype dt, gpulua_memory mem, int ndim, const int64_t *shape) {
  gpulua_tensor_info t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.memory = mem;
  t.ndim = ndim;
  for (int d = 0; d < ndim; d++) t.shape[d] = shape[d];
  return t;
}

/* ---- tensors ------------------------------------------------------------ */

static void test_push_host(void) {
  gpulua *g = gpulua_open(NULL);
  lua_State *L = gpulua_state(g);
  float *buf = malloc(6 * sizeof *buf);
  for (int i = 0; i < 6; i++) buf[i] = (float)(i + 1);
  released r = {0, NULL};
  int64_t shape[2] = {2, 3};
  gpulua_tensor_info t = info_c(buf, GPULUA_F32, GPULUA_MEM_HOST, 2, shape);
  int top = lua_gettop(L);
  ok(gpulua_push_tensor(g, &t, on_release, &r) == 0 && lua_gettop(L) == top + 1,
     "gpulua_push_tensor pushes one value for application host memory");
  lua_setglobal(L, "x");
  ok(run(g, "assert(x.dtype == 'f32' and x.shape[1] == 2 and x.shape[2] == 3 and x.device == 'host')\n"
            "total = x:sum():item()\n"
            "local d = x:to('device')       -- to the device and back: a pipeline over app memory\n"
            "d:mul_(10)\n"
            "x:copy(d)\n") == 0,
     "a script reads the tensor and writes results back into it");
  ok(gpulua_synchronize(g) == 0, "gpulua_synchronize");
  {
    int c_ = global_num(g, "total") == 21.0;
    ok(c_, "the script saw the application's values (sum %g)", global_num(g, "total"));
  }
  int good = 1;
  for (int i = 0; i < 6; i++) good = good && buf[i] == (float)(10 * (i + 1));
  ok(good, "the application's buffer holds the script's results, in place (no copy)");
  ok(r.calls == 0, "release is not called while the tensor lives");
  ok(run(g, "v = x:view({6}); x = nil; collectgarbage(); collectgarbage()") == 0 && r.calls == 0,
     "a view keeps the memory: release not called");
  ok(run(g, "v = nil; collectgarbage(); collectgarbage()") == 0 && gpulua_synchronize(g) == 0 &&
     r.calls == 1 && r.last == buf,
     "release(ud, data) is called once when the last view is gone (calls %d)", r.calls);
  gpulua_close(g);
  ok(r.calls == 1, "and not again at gpulua_close");
  free(buf);
}

/* Copies between pushed pageable memory and the device: blocking, as the
 * driver's, unless pushed with GPULUA_PUSH_GUARDED (then queued, not a
 * sync, behind the host-access fence). */
static void test_push_guarded(void) {
  enum { N = 4096 };
  gpulua *g = gpulua_open(NULL);
  lua_State *L = gpulua_state(g);
  float *a = calloc(N, sizeof *a), *b = calloc(N, sizeof *b);
  int64_t n = N;
  gpulua_tensor_info ta = info_c(a, GPULUA_F32, GPULUA_MEM_HOST, 1, &n);
  gpulua_tensor_info tb = info_c(b, GPULUA_F32, GPULUA_MEM_HOST, 1, &n);
  ok(gpulua_push_tensor(g, &ta, NULL, NULL) == 0, "push pageable memory (not guarded)");
  lua_setglobal(L, "app");
  ok(gpulua_push_tensor_ex(g, &tb, GPULUA_PUSH_GUARDED, NULL, NULL) == 0,
     "gpulua_push_tensor_ex pushes pageable memory with GPULUA_PUSH_GUARDED");
  lua_setglobal(L, "guarded");
  ok(run(g, "s = gpu.stream(); d = gpu.full({4096}, 7); e = gpu.zeros({4096})\n"
            "gpu.synchronize()\n"
            "local s0 = gpu.stats().syncs\n"
            "gpu.sleep(50, { stream = s }); app:copy(d, { stream = s })\n"
            "app_syncs = gpu.stats().syncs - s0\n") == 0,
     "a script copies from the device into the application's memory");
  ok(a[0] == 7.0f && a[N - 1] == 7.0f, "not guarded: the copy was done when the call returned (%g)", a[N - 1]);
  ok(global_num(g, "app_syncs") == 1.0, "and it counted as a sync (%g)", global_num(g, "app_syncs"));
  for (int i = 0; i < N; i++) a[i] = 3.0f;
  ok(run(g, "gpu.sleep(50, { stream = s }); e:copy(app, { stream = s })") == 0, "... and from it to the device");
  for (int i = 0; i < N; i++) a[i] = -1.0f;   /* the copy has read it already */
  {
    int c_ = run(g, "app_min = e:min():item()") == 0;
    double m = global_num(g, "app_min");
    ok(c_ && m == 3.0, "not guarded: the copy had read the memory when the call returned (min %g)", m);
  }
  ok(run(g, "gpu.synchronize()\n"
            "local s0 = gpu.stats().syncs\n"
            "gpu.sleep(50, { stream = s }); guarded:copy(d, { stream = s })\n"
            "g_syncs = gpu.stats().syncs - s0\n"
            "g_val = guarded:get(4096)\n") == 0,
     "a script copies into guarded memory and reads it");
  ok(global_num(g, "g_syncs") == 0.0, "guarded: the copy is queued, not a sync (%g)", global_num(g, "g_syncs"));
  ok(global_num(g, "g_val") == 7.0, "the script's read waited for the copy (%g)", global_num(g, "g_val"));
  ok(gpulua_synchronize(g) == 0 && b[0] == 7.0f && b[N - 1] == 7.0f,
     "after gpulua_synchronize the application sees the values");
  ok(run(g, "local _ <close> = gpu.nosync(); e:copy(guarded, { stream = s }); guarded:copy(d, { stream = s })") == 0,
     "guarded copies run inside gpu.nosync()");
  {
    int c_ = gpulua_dostring(g, "local _ <close> = gpu.nosync(); e:copy(app)", "=t") != 0 &&
             contains(gpulua_error(g), "host-device sync");
    ok(c_, "copies of memory not guarded are refused there: %s", line1(gpulua_error(g)));
  }
  {
    int top = lua_gettop(L);
    int c_ = gpulua_push_tensor_ex(g, &tb, 6, NULL, NULL) != 0 && lua_gettop(L) == top &&
             contains(gpulua_error(g), "gpulua_push_tensor_ex: unknown flags 6");
    ok(c_, "unknown flags are refused, nothing pushed: %s", line1(gpulua_error(g)));
  }
  ok(gpulua_push_tensor_ex(g, &ta, 0, NULL, NULL) == 0, "flags 0: as gpulua_push_tensor");
  lua_setglobal(L, "app2");
  ok(run(g, "local s0 = gpu.stats().syncs; app2:copy(d); assert(gpu.stats().syncs == s0 + 1)") == 0,
     "... blocking copies");
  gpulua_close(g);
  free(a);
  free(b);
}

static void test_release_at_close(void) {
  gpulua *g = gpulua_open(NULL);
  static double buf[4];
  released r = {0, NULL};
  int64_t n = 4;
  gpulua_tensor_info t = info_c(buf, GPULUA_F64, GPULUA_MEM_PINNED, 1, &n);
#ifdef GPULUA_HAVE_CUDA
  double *pinned = NULL;
  if (is_cuda(g) && cudaMallocHost((void **)&pinned, sizeof buf) == cudaSuccess) t.data = pinned;
#endif
  ok(gpulua_push_tensor(g, &t, on_release, &r) == 0, "push pinned memory");
  lua_setglobal(gpulua_state(g), "p");
  ok(run(g, "p:fill(2.5); q = p:to('device'); q:add_(1); p:copy(q)") == 0, "work queued on it");
  gpulua_close(g);
  double *data = t.data;
  ok(r.calls == 1 && data[0] == 3.5 && data[3] == 3.5,
     "gpulua_close finishes the work, then releases the memory once (calls %d, value %g)", r.calls, data[0]);
#ifdef GPULUA_HAVE_CUDA
  if (pinned) cudaFreeHost(pinned);
#endif
}

static void test_strided(void) {
  gpulua *g = gpulua_open(NULL);
  lua_State *L = gpulua_state(g);
  int32_t m[6] = {1, 2, 3, 4, 5, 6};   /* 2x3, seen transposed as 3x2 */
  int64_t shape[2] = {3, 2};
  gpulua_tensor_info t = info_c(m, GPULUA_I32, GPULUA_MEM_HOST, 2, shape);
  t.strided = 1;
  t.strides[0] = 1;
  t.strides[1] = 3;
  ok(gpulua_push_tensor(g, &t, NULL, NULL) == 0, "push with strides (a transposed view), release NULL");
  lua_setglobal(L, "mt");
  ok(run(g, "local r = mt:totable()\n"
            "assert(not mt:is_contiguous(), 'strided')\n"
            "assert(r[1][1] == 1 and r[1][2] == 4 and r[3][1] == 3 and r[3][2] == 6, 'values')\n") == 0,
     "the script sees the strided layout");
  ok(gpulua_dostring(g, "return mt", "=get") == 0, "chunk");
  lua_settop(L, 0);
  lua_getglobal(L, "mt");
  gpulua_tensor_info o;
  ok(gpulua_check_tensor(g, -1, &o) == 0 && o.data == m && o.dtype == GPULUA_I32 && o.ndim == 2 &&
     o.shape[0] == 3 && o.shape[1] == 2 && o.strides[0] == 1 && o.strides[1] == 3 && o.strided == 1,
     "gpulua_check_tensor gives back the same pointer, shape and strides");
  lua_pop(L, 1);
  gpulua_close(g);
}

static void test_check_tensor(void) {
  gpulua *g = gpulua_open(NULL);
  lua_State *L = gpulua_state(g);
  int cuda = is_cuda(g);
  ok(run(g, "z = gpu.arange(6, {dtype = 'i64'}):view({2, 3}); zn = z:narrow(2, 2, 2)") == 0, "a script's tensor");
  lua_getglobal(L, "z");
  gpulua_tensor_info o;
  memset(&o, 0x5a, sizeof o);
  int rc = gpulua_check_tensor(g, -1, &o);
  ok(rc == 0 && o.dtype == GPULUA_I64 && o.memory == GPULUA_MEM_DEVICE && o.ndim == 2 && o.shape[0] == 2 &&
     o.shape[1] == 3 && o.strides[0] == 3 && o.strides[1] == 1 && o.device == (cuda ? 0 : -1),
     "gpulua_check_tensor describes a device tensor (device %d)", o.device);
  ok(gpulua_synchronize(g) == 0, "finish the arange");
  int64_t vals[6] = {0};
  if (cuda) {
#ifdef GPULUA_HAVE_CUDA
    cudaMemcpy(vals, o.data, sizeof vals, cudaMemcpyDeviceToHost);
#endif
  } else {
    memcpy(vals, o.data, sizeof vals);
  }
  ok(vals[0] == 0 && vals[5] == 5, "its data pointer holds the values (%lld .. %lld)", (long long)vals[0],
     (long long)vals[5]);
  lua_getglobal(L, "zn");
  ok(gpulua_check_tensor(g, -1, &o) == 0 && o.ndim == 2 && o.shape[1] == 2 && o.strides[0] == 3 &&
     (char *)o.data - (char *)NULL != 0, "a narrowed view: its own shape, the parent's strides");
  lua_settop(L, 0);

  lua_pushinteger(L, 7);
  {
    int c_ = gpulua_check_tensor(g, 1, &o) != 0 && contains(gpulua_error(g), "gpulua_check_tensor") &&
     contains(gpulua_error(g), "expected a gpu.Tensor, got number");
    ok(c_,
     "a number is not a tensor: %s", line1(gpulua_error(g)));
  }
  ok(lua_gettop(L) == 1, "a failed check leaves the stack as it was");
  {
    int c_ = gpulua_check_tensor(g, 5, &o) != 0 && contains(gpulua_error(g), "stack index 5 is not valid");
    ok(c_,
     "an index past the top: %s", line1(gpulua_error(g)));
  }
  ok(gpulua_check_tensor(g, 0, &o) != 0, "index 0 is not a value");
  ok(gpulua_check_tensor(g, 1, NULL) != 0 && contains(gpulua_error(g), "out is NULL"), "out NULL");
  lua_settop(L, 0);
  ok(run(g, "c = gpu.zeros(3); c:close()") == 0, "a closed tensor");
  lua_getglobal(L, "c");
  {
    int c_ = gpulua_check_tensor(g, -1, &o) != 0 && contains(gpulua_error(g), "closed");
    ok(c_, "is refused: %s",
     line1(gpulua_error(g)));
  }
  lua_settop(L, 0);
  gpulua_close(g);
}

#ifdef GPULUA_HAVE_CUDA
/* cuda: memory pushed as the wrong kind */
static void bad_push_kind(gpulua *g, float *buf, int64_t *shape) {
  gpulua_tensor_info t = info_c(buf, GPULUA_F32, GPULUA_MEM_DEVICE, 2, shape);
  {
    int c_ = gpulua_push_tensor(g, &t, NULL, NULL) != 0 && contains(gpulua_error(g), "pageable host memory, not device");
    ok(c_,
     "cuda: pageable memory pushed as device memory is refused: %s", line1(gpulua_error(g)));
  }
  float *dev = NULL;
  cudaMalloc((void **)&dev, 16 * sizeof(float));
  t = info_c(dev, GPULUA_F32, GPULUA_MEM_PINNED, 2, shape);
  {
    int c_ = gpulua_push_tensor(g, &t, NULL, NULL) != 0 && contains(gpulua_error(g), "device memory, not pinned");
    ok(c_,
     "cuda: device memory pushed as pinned is refused: %s", line1(gpulua_error(g)));
  }
  cudaFree(dev);
}
#endif

/* a failed handle, and a NULL one */
static void bad_push_handle(float *buf, int64_t *shape) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  o.version = 99;
  gpulua *g = gpulua_open(&o);
  gpulua_tensor_info t = info_c(buf, GPULUA_F32, GPULUA_MEM_HOST, 2, shape);
  void *h = &h;
  ok(gpulua_push_tensor(g, &t, NULL, NULL) != 0 && gpulua_check_tensor(g, 1, &t) != 0 &&
     gpulua_stream_handle(g, 0, &h) != 0 && gpulua_push_stream(g, NULL) != 0,
     "on a failed handle every call fails harmlessly");
  gpulua_close(g);
  ok(gpulua_push_tensor(NULL, &t, NULL, NULL) != 0 && gpulua_register_kernel(NULL, "k", "", NULL, NULL) != 0,
     "and on a NULL handle");
}

static void test_bad_push(void) {
  gpulua *g = gpulua_open(NULL);
  lua_State *L = gpulua_state(g);
  static float buf[16];
  int64_t shape[2] = {2, 3};
  gpulua_tensor_info t;
  released r = {0, NULL};
  struct { const char *what, *expect; } cases[] = {
    {"NULL data", "data is NULL"},
    {"a negative dim", "shape[1] is -3"},
    {"a zero dim", "shape[0] is 0"},
    {"ndim 9", "ndim 9 is outside [0, 8]"},
    {"ndim -1", "ndim -1 is outside"},
    {"dtype 99", "dtype 99 is not a gpulua_dtype"},
    {"memory 7", "memory 7 is not a gpulua_memory"},
    {"a negative stride", "strides[1] is -1"},
    {"a misaligned pointer", "is not aligned"},
    {"strides that overflow", "the strides reach too far"},
    {"a shape that overflows", "too many elements"},
  };
  int n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) {
    t = info_c(buf, GPULUA_F32, GPULUA_MEM_HOST, 2, shape);
    switch (i) {
    case 0: t.data = NULL; break;
    case 1: t.shape[1] = -3; break;
    case 2: t.shape[0] = 0; break;
    case 3: t.ndim = 9; break;
    case 4: t.ndim = -1; break;
    case 5: t.dtype = (gpulua_dtype)99; break;
    case 6: t.memory = (gpulua_memory)7; break;
    case 7: t.strided = 1; t.strides[0] = 3; t.strides[1] = -1; break;
    case 8: t.data = (char *)buf + 1; break;
    case 9: t.strided = 1; t.strides[0] = INT64_MAX / 2; t.strides[1] = 1; t.shape[0] = 8; break;
    case 10: t.ndim = 8; for (int d = 0; d < 8; d++) t.shape[d] = 1 << 20; break;
    }
    int top = lua_gettop(L);
    int rc = gpulua_push_tensor(g, &t, on_release, &r);
    {
      int c_ = rc != 0 && lua_gettop(L) == top && contains(gpulua_error(g), "gpulua_push_tensor") &&
       contains(gpulua_error(g), cases[i].expect);
      ok(c_,
       "push with %s fails, pushes nothing: %s", cases[i].what, line1(gpulua_error(g)));
    }
  }
  {
    int c_ = gpulua_push_tensor(g, NULL, NULL, NULL) != 0 && contains(gpulua_error(g), "description is NULL");
    ok(c_,
     "a NULL description fails: %s", line1(gpulua_error(g)));
  }
  ok(r.calls == 0, "no failed push calls release");
  ok(run(g, "assert(gpu.zeros(2):sum():item() == 0)") == 0, "the instance goes on after the failures");
#ifdef GPULUA_HAVE_CUDA
  if (is_cuda(g)) bad_push_kind(g, buf, shape);
#endif
  gpulua_close(g);
  bad_push_handle(buf, shape);
}

#ifdef GPULUA_HAVE_CUDA
static void test_cuda_memory(gpulua *g) {
  lua_State *L = gpulua_state(g);
  float *dev = NULL;
  ok(cudaMalloc((void **)&dev, 1024 * sizeof(float)) == cudaSuccess, "cudaMalloc");
  released r = {0, NULL};
  int64_t n = 1024;
  gpulua_tensor_info t = info_c(dev, GPULUA_F32, GPULUA_MEM_DEVICE, 1, &n);
  ok(gpulua_push_tensor(g, &t, on_release, &r) == 0, "cuda: push cudaMalloc'd memory");
  lua_setglobal(L, "dv");
  ok(run(g, "dv:fill(0.5); dv:add_(dv); dsum = dv:sum():item(); dv = nil; collectgarbage()") == 0,
     "cuda: ops on the application's device memory");
  {
    int c_ = gpulua_synchronize(g) == 0 && global_num(g, "dsum") == 1024.0 && r.calls == 1;
    ok(c_,
     "cuda: results right (%g), released once", global_num(g, "dsum"));
  }
  float host[4];
  cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost);
  ok(host[0] == 1.0f && host[3] == 1.0f, "cuda: the values are in the application's allocation");
  cudaFree(dev);
}
#endif

/* ---- streams ------------------------------------------------------------ */

static void test_streams(void) {
  gpulua *g = gpulua_open(NULL);
  lua_State *L = gpulua_state(g);
  int cuda = is_cuda(g);
  void *h = &h;
  ok(gpulua_stream_handle(g, 0, &h) == 0 && (cuda ? h != NULL : h == NULL),
     "gpulua_stream_handle(g, 0): the current stream's handle (%s)", cuda ? "cuda: not NULL" : "host: NULL");
  ok(gpulua_push_stream(g, NULL) == 0, "gpulua_push_stream(g, NULL)");
  lua_setglobal(L, "ds");
  ok(run(g, "assert(ds == gpu.default_stream() or tostring(ds) == tostring(gpu.default_stream()), tostring(ds))") == 0,
     "NULL is the default stream, as in CUDA");
  ok(run(g, "s2 = gpu.stream()") == 0, "a script's stream");
  lua_getglobal(L, "s2");
  ok(gpulua_stream_handle(g, -1, &h) == 0 && (cuda ? h != NULL : h == NULL), "its handle");
  lua_pop(L, 1);
  lua_pushboolean(L, 1);
  {
    int c_ = gpulua_stream_handle(g, -1, &h) != 0 && contains(gpulua_error(g), "expected a gpu.Stream, got boolean");
    ok(c_,
     "a boolean is not a stream: %s", line1(gpulua_error(g)));
  }
  lua_pop(L, 1);
  ok(gpulua_stream_handle(g, 0, NULL) != 0, "out NULL fails");
  ok(run(g, "s2:close()") == 0, "close it");
  lua_getglobal(L, "s2");
  {
    int c_ = gpulua_stream_handle(g, -1, &h) != 0 && contains(gpulua_error(g), "closed");
    ok(c_, "a closed stream: %s",
     line1(gpulua_error(g)));
  }
  lua_pop(L, 1);
  if (!cuda) {
    int top = lua_gettop(L);
    {
      int c_ = gpulua_push_stream(g, (void *)0x1000) != 0 && lua_gettop(L) == top &&
       contains(gpulua_error(g), "host backend has no native streams");
      ok(c_,
       "host: wrapping a handle fails clearly: %s", line1(gpulua_error(g)));
    }
  }
#ifdef GPULUA_HAVE_CUDA
  if (cuda) {
    cudaStream_t mine;
    ok(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess, "cuda: the application's stream");
    ok(gpulua_push_stream(g, mine) == 0, "cuda: gpulua_push_stream wraps it");
    lua_pushvalue(L, -1);
    lua_setglobal(L, "as");
    ok(gpulua_stream_handle(g, -1, &h) == 0 && h == (void *)mine, "cuda: its handle is the application's");
    lua_pop(L, 1);
    ok(run(g, "local t = gpu.zeros(1 << 20, {stream = as}); t:add_(3, {stream = as})\n"
              "ev = as:record(); asum = t:sum({stream = as}):item({stream = as})\n"
              "assert(as.nonblocking == true, 'flags read from the handle')\n"
              "as:close(); as = nil; collectgarbage()") == 0,
       "cuda: a script enqueues on the application's stream");
    {
      int c_ = global_num(g, "asum") == 3.0 * (1 << 20);
      ok(c_, "cuda: results (%g)", global_num(g, "asum"));
    }
    ok(gpulua_synchronize(g) == 0, "synchronize");
    ok(cudaStreamQuery(mine) == cudaSuccess, "cuda: the stream is still the application's after gpulua let go");
    /* the handle must outlive the instance (an event recorded on it still refers to it) */
    gpulua_close(g);
    ok(cudaStreamDestroy(mine) == cudaSuccess, "cuda: gpulua never destroyed it: the application can");
    return;
  }
#endif
  gpulua_close(g);
}

/* ---- C function kernels ------------------------------------------------- */

/* scale(float *x, float a, long long n): x *= a.  Host backend only. */
static int k_scale(const gpulua_kernel_call *c) {
  float *x = *(float **)c->args[0];
  float a = *(float *)c->args[1];
  long long n = *(long long *)c->args[2];
  int *calls = c->ud;
  (*calls)++;
  if (c->stream != NULL) {
    snprintf(c->err, c->errlen, "scale runs on the host backend only");
    return 1;
  }
  for (long long i = 0; i < n; i++) x[i] *= a;
  return 0;
}

/* copy(const float *src, float *dst, int n): both backends, the way an
 * application's launcher is written: enqueue on the stream, or compute. */
static int k_copy(const gpulua_kernel_call *c) {
  const float *src = *(const float **)c->args[0];
  float *dst = *(float **)c->args[1];
  int n = *(int *)c->args[2];
  if (c->stream == NULL) {
    memcpy(dst, src, (size_t)n * sizeof *dst);
    return 0;
  }
#ifdef GPULUA_HAVE_CUDA
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * sizeof *dst, cudaMemcpyDeviceToDevice,
                                  (cudaStream_t)c->stream);
  if (e != cudaSuccess) {
    snprintf(c->err, c->errlen, "%s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
#else
  snprintf(c->err, c->errlen, "built without CUDA");
  return 1;
#endif
}

static int k_fail(const gpulua_kernel_call *c) {
  snprintf(c->err, c->errlen, "boom from C (grid %u, block %u)", c->grid[0], c->block[0]);
  return 7;
}

/* arguments are checked against the declaration */
static void kernels_bad_args(gpulua *g) {
  {
    int c_ = gpulua_dostring(g, "gpu.kernels.copy{grid = 1, block = 1}(gpu.zeros(4, {dtype = 'i32'}), gpu.zeros(4), 4)",
                     "=badarg") != 0 &&
     contains(gpulua_error(g), "argument 1") && contains(gpulua_error(g), "badarg:1");
    ok(c_,
     "a tensor of the wrong dtype: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_dostring(g, "gpu.kernels.copy{grid = 1, block = 1}(gpu.zeros(4), gpu.zeros(4))", "=nargs") != 0 &&
     contains(gpulua_error(g), "takes 3 arguments, got 2");
    ok(c_, "too few arguments: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_dostring(g, "gpu.kernels.copy{grid = 1, block = 2048}", "=block") != 0 &&
     contains(gpulua_error(g), "block.x");
    ok(c_, "a block too big: %s", line1(gpulua_error(g)));
  }
}

/* a failing function: at the launch on cuda, at the next sync on the host;
 * on the host, a function's arguments as they were at the launch */
static void kernels_failing(gpulua *g, int *calls) {
  int cuda = is_cuda(g);
  {
    int c_ = gpulua_dostring(g, "local x = gpu.zeros(4)\n"
                        "gpu.kernels.fail{grid = 3, block = 2}(x)\n"
                        "gpu.synchronize()\n", "=failing") != 0 &&
     contains(gpulua_error(g), "boom from C (grid 3, block 2)") && contains(gpulua_error(g), "failing:2") &&
     contains(gpulua_error(g), "fail");
    ok(c_,
     "a function's error names the kernel and the launch's line: %s", line1(gpulua_error(g)));
  }
  ok(run(g, "gpu.synchronize()") == 0, "the instance goes on");

  if (!cuda) {
    ok(gpulua_register_kernel(g, "scale", "float *x, float a, long long n", k_scale, calls) == 0,
       "register scale (host)");
    {
      int c_ = run(g, "local x = gpu.arange(8, {dtype = 'f32'})\n"
              "gpu.kernels.scale{grid = 1, block = 1}(x, 0.5, 8)\n"
              "gpu.kernels.scale{grid = 1, block = 1}(x, 4, 8)\n"
              "hsum = x:sum():item()") == 0 && global_num(g, "hsum") == 56.0 && *calls == 2;
      ok(c_,
       "host: the function runs on the worker, twice, in order (%g, %d calls)", global_num(g, "hsum"), *calls);
    }
    /* values outlive the Lua call: the worker sees the arguments as they were */
    {
      int c_ = run(g, "local s = gpu.stream(); local x = gpu.ones(4, {stream = s})\n"
              "gpu.sleep(30, {stream = s})\n"
              "for i = 1, 3 do gpu.kernels.scale{grid = 1, block = 1, stream = s}(x, i + 1, 4) end\n"
              "qsum = x:sum({stream = s}):item({stream = s})") == 0 && global_num(g, "qsum") == 96.0;
      ok(c_,
       "host: queued launches keep their own argument values (%g)", global_num(g, "qsum"));
    }
  }
}

/* the race checker sees a C kernel's reads and writes */
static void kernels_races(gpulua *g) {
  {
    int c_ = gpulua_dostring(g, "gpu.check_races(true)\n"
                        "local s1, s2 = gpu.stream(), gpu.stream()\n"
                        "local a, b = gpu.ones(16, {stream = s1}), gpu.zeros(16, {stream = s2})\n"
                        "gpu.kernels.copy{grid = 1, block = 16, stream = s2}(a, b, 16)\n", "=race") != 0 &&
     contains(gpulua_error(g), "race");
    ok(c_,
     "an unordered read of another stream's write is a race: %.200s", line1(gpulua_error(g)));
  }
  ok(run(g, "gpu.check_races(false); gpu.synchronize()") == 0, "race checker off");
}

/* registration errors */
static void kernels_bad_register(gpulua *g) {
  {
    int c_ = gpulua_register_kernel(g, "copy", "float *x", k_copy, NULL) != 0 &&
     contains(gpulua_error(g), "already registered");
    ok(c_, "a taken name: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_register_kernel(g, "1abc", "float *x", k_copy, NULL) != 0 &&
     contains(gpulua_error(g), "C identifier");
    ok(c_, "a bad name: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_register_kernel(g, NULL, "float *x", k_copy, NULL) != 0 && contains(gpulua_error(g), "name is NULL");
    ok(c_,
     "a NULL name: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_register_kernel(g, "nofn", "float *x", NULL, NULL) != 0 &&
     contains(gpulua_error(g), "function is NULL");
    ok(c_, "a NULL function: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_register_kernel(g, "strukt", "struct pair p", k_copy, NULL) != 0 &&
     contains(gpulua_error(g), "cannot be passed from Lua");
    ok(c_, "a struct parameter: %s", line1(gpulua_error(g)));
  }
  {
    int c_ = gpulua_register_kernel(g, "broken", "float *x,, int", k_copy, NULL) != 0 &&
     contains(gpulua_error(g), "broken");
    ok(c_, "a declaration that does not parse: %s", line1(gpulua_error(g)));
  }
  ok(run(g, "assert(gpu.kernels.nofn == nil and gpu.kernels.broken == nil)") == 0,
     "failed registrations leave nothing behind");
  ok(gpulua_register_kernel(g, "noargs", NULL, k_fail, NULL) == 0 &&
     run(g, "assert(#gpu.kernels.noargs.params == 0)") == 0, "params NULL: no parameters");
}

static void test_kernels(void) {
  gpulua *g = gpulua_open(NULL);
  int calls = 0;   /* k_scale's, registered in kernels_failing */
  ok(gpulua_register_kernel(g, "copy", "const float *src, float *dst, int n", k_copy, NULL) == 0,
     "register copy");
  ok(gpulua_register_kernel(g, "fail", "float *x", k_fail, NULL) == 0, "register fail");
  ok(run(g, "local a = gpu.arange(1000, {dtype = 'f32'}); local b = gpu.zeros(1000)\n"
            "gpu.kernels.copy{grid = 4, block = 256}(a, b, 1000)\n"
            "csum = b:sum():item()\n"
            "assert(tostring(gpu.kernels.copy):find('copy'))\n") == 0,
     "Lua launches a C kernel like any other kernel");
  {
    int c_ = global_num(g, "csum") == 499500.0;
    ok(c_, "it ran in stream order before the read (%g)", global_num(g, "csum"));
  }
  {
    int c_ = run(g, "local s = gpu.stream(); local a = gpu.ones(64, {stream = s}); local b = gpu.zeros(64, {stream = s})\n"
            "gpu.kernels.copy{grid = 1, block = 64, stream = s}(a, b, 64)\n"
            "ssum = b:sum({stream = s}):item({stream = s})") == 0 && global_num(g, "ssum") == 64.0;
    ok(c_,
     "on a script stream (%g)", global_num(g, "ssum"));
  }
  {
    /* captured once in a graph (on cuda the function enqueues into the capture), run at each replay */
    int c_ = run(g, "local a = gpu.zeros(1000); local b = gpu.zeros(1000)\n"
                    "local gr <close> = gpu.graph(function() gpu.kernels.copy{grid = 4, block = 256}(a, b, 1000) end)\n"
                    "a:fill(2); gr:launch(); gsum1 = b:sum():item()\n"
                    "a:fill(3); gr:launch(); gsum2 = b:sum():item()") == 0 &&
             global_num(g, "gsum1") == 2000.0 && global_num(g, "gsum2") == 3000.0;
    ok(c_, "a C kernel captured by gpu.graph runs at each replay (%g, %g)", global_num(g, "gsum1"),
       global_num(g, "gsum2"));
  }
  kernels_bad_args(g);
  kernels_failing(g, &calls);
  kernels_races(g);
  kernels_bad_register(g);

  /* another instance has its own kernels */
  gpulua *g2 = gpulua_open(NULL);
  ok(run(g2, "assert(gpu.kernels == nil)") == 0, "a second instance does not see the first's kernels");
  gpulua_close(g2);
  gpulua_close(g);
}

int main(void) {
  test_push_host();
  test_push_guarded();
  test_release_at_close();
  test_strided();
  test_check_tensor();
  test_bad_push();
  test_streams();
  test_kernels();
#ifdef GPULUA_HAVE_CUDA
  gpulua *g = gpulua_open(NULL);
  if (is_cuda(g)) test_cuda_memory(g);
  gpulua_close(g);
#endif
  return done_testing();
}
