/* Raw CUDA C references for `make bench` (bench/run.lua): each row that the
 * Lua scripts in bench/ measure through gpulua, measured here the plain way
 * a C programmer would write it, with the same sizes, repeats and timing.
 *
 *   ref [quick] all | SECTION...    sections: launch copy matmul overlap graph streams
 *   ref first-kernel                one empty kernel, then print when it finished
 *   ref overlap-one BATCHES ELEMENTS [passes=N]   one overlap pipeline
 *
 * Lines printed:  row KEY VALUE UNIT LABEL...   check KEY ok|FAILED [why]
 *                 info KEY TEXT...               note KEY TEXT...
 * Exit status 1 when a check failed or a CUDA call did.
 *
 * Sizes, repeats and row keys are kept in step with bench/benchlib.lua.
 * cuBLAS is loaded with dlopen, as gpulua does, and called the same way
 * (cublasGemmEx, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT). */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_api.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define THREADS 256

typedef struct sizes {
  int quick;
  int launches, launch_reps, roundtrips;   /* µs rows: per repeat, repeats */
  size_t copy_bytes;                       /* copies and the elementwise add */
  int copy_warm, copy_reps;
  size_t page_small;                       /* pageable copies: the small size */
  int page_reps;
  int mm_n, mm_warm_f32, mm_reps_f32, mm_warm_bf16, mm_reps_bf16;
  int mm_bmm_batch, mm_bmm_n;              /* the batched row: batch of n^3 (bf16) */
  int ov_batches, ov_big, ov_small, ov_runs; /* overlap: batches, elements per batch */
  int graph_nodes, graph_replays;          /* graph: kernels captured, replays per timed batch */
  int graph_warm, graph_reps;              /* batches of replays: warm-up, timed */
  int stream_calls, stream_reps;           /* streams: create + destroy pairs per repeat, repeats */
} sizes;

static void sizes_init(sizes *z, int quick) {
  memset(z, 0, sizeof *z);
  z->quick = quick;
  z->launches = quick ? 200 : 2000;
  z->launch_reps = quick ? 5 : 21;
  z->roundtrips = quick ? 50 : 500;
  z->copy_bytes = quick ? (size_t)8 << 20 : (size_t)256 << 20;
  z->copy_warm = 2;
  z->copy_reps = quick ? 3 : 10;
  z->page_small = (size_t)4 << 20;
  z->page_reps = quick ? 5 : 20;
  z->mm_n = quick ? 512 : 8192;
  z->mm_warm_f32 = quick ? 1 : 2;
  z->mm_reps_f32 = quick ? 3 : 5;
  z->mm_warm_bf16 = quick ? 1 : 3;
  z->mm_reps_bf16 = quick ? 3 : 10;
  z->mm_bmm_batch = quick ? 4 : 64;
  z->mm_bmm_n = quick ? 128 : 1024;
  z->ov_batches = quick ? 8 : 32;
  z->ov_big = quick ? 1 << 16 : 1 << 24;
  z->ov_small = quick ? 1 << 12 : 1 << 18;
  z->ov_runs = 3;
  z->graph_nodes = 100;
  z->graph_replays = quick ? 20 : 200;
  z->graph_warm = quick ? 1 : 2;
  z->graph_reps = quick ? 5 : 21;
  z->stream_calls = quick ? 100 : 1000;
  z->stream_reps = quick ? 5 : 11;
}

static int g_failed;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void row(const char *key, double v, const char *unit, const char *label) {
  printf("row %s %.6g %s %s\n", key, v, unit, label);
  fflush(stdout);
}

__attribute__((format(printf, 3, 4)))
static void check(const char *key, int ok, const char *fmt, ...) {
  char why[512] = "";
  if (!ok && fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
  }
  printf("check %s %s%s%s\n", key, ok ? "ok" : "FAILED", *why ? " " : "", why);
  fflush(stdout);
  if (!ok) g_failed = 1;
}

static void cuda_report(const char *what, const char *file, int line, cudaError_t e) {
  printf("check cuda FAILED %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorString(e), cudaGetErrorName(e));
  fflush(stdout);
  g_failed = 1;
}

/* In a function with `int rc` and an `out:` label that frees what was taken. */
#define CK(call)                                                        \
  do {                                                                  \
    cudaError_t e_ = (call);                                            \
    if (e_ != cudaSuccess) {                                            \
      cuda_report(#call, __FILE__, __LINE__, e_);                       \
      rc = -1;                                                          \
      goto out;                                                         \
    }                                                                   \
  } while (0)

#define NEED(p)                                                         \
  do {                                                                  \
    if (!(p)) {                                                         \
      printf("check host FAILED %s:%d: out of memory\n", __FILE__, __LINE__); \
      g_failed = 1;                                                     \
      rc = -1;                                                          \
      goto out;                                                         \
    }                                                                   \
  } while (0)

static int sm_count(void) {
  static int n;
  int dev = 0;
  if (n > 0) return n;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    n = 132;
  }
  return n;
}

/* gpulua's grid for an elementwise kernel: one thread per item, at most 32
 * blocks of 256 per multiprocessor, grid-stride beyond */
static unsigned blocks_for(int64_t items) {
  int64_t b = (items + THREADS - 1) / THREADS, cap = (int64_t)sm_count() * 32;
  if (b > cap) b = cap;
  return b > 0 ? (unsigned)b : 1u;
}

/* ---- kernels ------------------------------------------------------------ */

__global__ void empty_kernel(void) {}

__global__ void fill_kernel(float *p, int64_t n, float v) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

/* x += v in place, as gpulua's add_ of a scalar */
__global__ void add_scalar_kernel(float *p, int64_t n, float v) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

/* uniform in [0, 1) from a hash of the index */
__device__ float u01(int64_t i, uint32_t seed) {
  uint32_t x = (uint32_t)i * 0x9e3779b1u ^ (uint32_t)((uint64_t)i >> 32) * 0x85ebca77u ^ seed * 0xc2b2ae3du;
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return (float)(x >> 8) * (1.0f / 16777216.0f);
}

__device__ void put(float *p, float v) { *p = v; }
__device__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }

template <typename T>
__global__ void rand_kernel(T *p, int64_t n, uint32_t seed) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    put(&p[i], u01(i, seed));
}

/* a[i] and b[i] with few fraction bits: a + b is exact in f32 */
__global__ void add_init(float *a, float *b, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    a[i] = (float)(i & 1023) * 0.5f;
    b[i] = (float)(i % 997) * 0.25f;
  }
}

/* c = a + b, 16 bytes at a time (n % 4 == 0, buffers from cudaMalloc) */
__global__ void add_kernel(float4 *c, const float4 *a, const float4 *b, int64_t n4) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 x = a[i], y = b[i];
    c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

/* the overlap compute: in-place x*s, x+s, relu, as gpulua's mul_/sub_/relu_ */
enum { EW_MUL, EW_ADD, EW_RELU };

template <int OP>
__global__ void ew_kernel(float4 *x, int64_t n4, float s) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 v = x[i];
    if (OP == EW_MUL) { v.x *= s; v.y *= s; v.z *= s; v.w *= s; }
    if (OP == EW_ADD) { v.x += s; v.y += s; v.z += s; v.w += s; }
    if (OP == EW_RELU) { v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f); }
    x[i] = v;
  }
}

enum { RD_SUM, RD_MIN, RD_MAX };

template <int OP>
__device__ double rd_join(double a, double b) {
  return OP == RD_SUM ? a + b : OP == RD_MIN ? fmin(a, b) : fmax(a, b);
}

template <int OP>
__device__ double rd_block(double v) {
  __shared__ double sh[THREADS];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = THREADS / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] = rd_join<OP>(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
  return sh[0];
}

/* reduction in two launches: per-block partials, then one block */
template <int OP>
__global__ void rd_partial(const float *x, int64_t n, double *part) {
  double acc = OP == RD_SUM ? 0.0 : OP == RD_MIN ? INFINITY : -INFINITY;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    acc = rd_join<OP>(acc, (double)x[i]);
  double r = rd_block<OP>(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = r;
}

template <int OP>
__global__ void rd_final(const double *part, int np, double *out) {
  double acc = OP == RD_SUM ? 0.0 : OP == RD_MIN ? INFINITY : -INFINITY;
  for (int i = threadIdx.x; i < np; i += blockDim.x) acc = rd_join<OP>(acc, part[i]);
  double r = rd_block<OP>(acc);
  if (threadIdx.x == 0) *out = r;
}

/* ---- launch rows ------------------------------------------------------- */

static int bench_launch(const sizes *z) {
  int rc = 0, N = z->launches, R = z->launch_reps, NR = z->roundtrips;
  cudaStream_t s = NULL;
  float *p = NULL, got = 0;
  double *t = (double *)malloc(sizeof(double) * (size_t)R);
  NEED(t);
  CK(cudaStreamCreate(&s));
  CK(cudaMalloc((void **)&p, sizeof(float)));

  /* back-to-back enqueue: host wall time of N launches; the stream is
   * drained between repeats, outside the timed part; r = -1 warms up */
  for (int r = -1; r < R; r++) {
    double t0 = now_s();
    for (int i = 0; i < N; i++) empty_kernel<<<1, 1, 0, s>>>();
    double t1 = now_s();
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    if (r >= 0) t[r] = (t1 - t0) / N * 1e6;
  }
  row("enqueue_empty", median(t, R), "us", "enqueue, empty kernel");
  check("enqueue_empty", 1, NULL);

  for (int r = -1; r < R; r++) {
    double t0 = now_s();
    for (int i = 0; i < N; i++) fill_kernel<<<1, THREADS, 0, s>>>(p, 1, (float)(i + 1));
    double t1 = now_s();
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    if (r >= 0) t[r] = (t1 - t0) / N * 1e6;
  }
  CK(cudaMemcpy(&got, p, sizeof got, cudaMemcpyDeviceToHost));
  row("enqueue_fill", median(t, R), "us", "enqueue, fill of 1 element");
  check("enqueue_fill", got == (float)N, "element is %g, want %d", got, N);

  /* round trip: launch, then wait for the stream; NR of them per repeat */
  for (int r = -1; r < R; r++) {
    double t0 = now_s();
    for (int i = 0; i < NR; i++) {
      empty_kernel<<<1, 1, 0, s>>>();
      CK(cudaStreamSynchronize(s));
    }
    double t1 = now_s();
    CK(cudaGetLastError());
    if (r >= 0) t[r] = (t1 - t0) / NR * 1e6;
  }
  row("roundtrip_empty", median(t, R), "us", "launch + stream sync, empty kernel");
  check("roundtrip_empty", 1, NULL);

  for (int r = -1; r < R; r++) {
    double t0 = now_s();
    for (int i = 0; i < NR; i++) {
      fill_kernel<<<1, THREADS, 0, s>>>(p, 1, (float)(i + 1));
      CK(cudaStreamSynchronize(s));
    }
    double t1 = now_s();
    CK(cudaGetLastError());
    if (r >= 0) t[r] = (t1 - t0) / NR * 1e6;
  }
  CK(cudaMemcpy(&got, p, sizeof got, cudaMemcpyDeviceToHost));
  row("roundtrip_fill", median(t, R), "us", "launch + stream sync, fill of 1 element");
  check("roundtrip_fill", got == (float)NR, "element is %g, want %d", got, NR);
out:
  if (p) cudaFree(p);
  if (s) cudaStreamDestroy(s);
  free(t);
  return rc;
}

/* ---- copies and the elementwise add ------------------------------------ */

/* median ms of `reps` timed runs of a copy on stream s, after `warm` */
static int time_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s,
                     int warm, int reps, double *ms_out) {
  int rc = 0;
  cudaEvent_t e0 = NULL, e1 = NULL;
  float ms = 0;
  double *t = (double *)malloc(sizeof(double) * (size_t)reps);
  NEED(t);
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int r = -warm; r < reps; r++) {
    CK(cudaEventRecord(e0, s));
    CK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 0) t[r] = ms;
  }
  *ms_out = median(t, reps);
out:
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  free(t);
  return rc;
}

static void size_label(char *buf, size_t len, const char *what, size_t bytes) {
  if (bytes >= (size_t)1 << 20) snprintf(buf, len, "%s %zu MiB", what, bytes >> 20);
  else snprintf(buf, len, "%s %zu KiB", what, bytes >> 10);
}

static int bench_copy(const sizes *z) {
  int rc = 0;
  size_t bytes = z->copy_bytes, nw = bytes / 4;
  int64_t n4 = (int64_t)(nw / 4);
  uint32_t *h = NULL, *h2 = NULL;
  void *d = NULL, *d2 = NULL, *d3 = NULL;
  cudaStream_t s = NULL, s2 = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL, e2 = NULL;
  double ms = 0, *t = NULL;
  float fms = 0;
  char label[128];
  int reps = z->copy_reps, bad = 0;
  t = (double *)malloc(sizeof(double) * (size_t)reps);
  NEED(t);
  CK(cudaStreamCreate(&s));
  CK(cudaStreamCreate(&s2));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  CK(cudaHostAlloc((void **)&h, bytes, cudaHostAllocPortable));
  CK(cudaHostAlloc((void **)&h2, bytes, cudaHostAllocPortable));
  CK(cudaMalloc(&d, bytes));
  CK(cudaMalloc(&d2, bytes));
  CK(cudaMalloc(&d3, bytes));
  for (size_t i = 0; i < nw; i++) h[i] = (uint32_t)i * 2654435761u ^ 0x5bd1e995u;

  /* H2D pinned */
  if ((rc = time_copy(d, h, bytes, cudaMemcpyHostToDevice, s, z->copy_warm, reps, &ms))) goto out;
  size_label(label, sizeof label, "H2D pinned", bytes);
  row("h2d", bytes / (ms * 1e6), "GB/s", label);
  memset(h2, 0, bytes);
  CK(cudaMemcpy(h2, d, bytes, cudaMemcpyDeviceToHost));
  check("h2d", memcmp(h, h2, bytes) == 0, "device data differs from the source");

  /* D2H pinned */
  memset(h2, 0, bytes);
  if ((rc = time_copy(h2, d, bytes, cudaMemcpyDeviceToHost, s, z->copy_warm, reps, &ms))) goto out;
  size_label(label, sizeof label, "D2H pinned", bytes);
  row("d2h", bytes / (ms * 1e6), "GB/s", label);
  check("d2h", memcmp(h, h2, bytes) == 0, "host data differs from the source");

  /* both at once: H2D on s, D2H on s2, from the start event on s to the
   * stop event on s after s has waited for s2 */
  CK(cudaMemcpy(d2, d, bytes, cudaMemcpyDeviceToDevice));
  memset(h2, 0, bytes);
  for (int r = -z->copy_warm; r < reps; r++) {
    CK(cudaEventRecord(e0, s));
    CK(cudaStreamWaitEvent(s2, e0, 0));
    CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(h2, d2, bytes, cudaMemcpyDeviceToHost, s2));
    CK(cudaEventRecord(e2, s2));
    CK(cudaStreamWaitEvent(s, e2, 0));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&fms, e0, e1));
    if (r >= 0) t[r] = fms;
  }
  ms = median(t, reps);
  size_label(label, sizeof label, "H2D + D2H at once, pinned", bytes);
  row("bidir", 2.0 * bytes / (ms * 1e6), "GB/s", label);
  check("bidir", memcmp(h, h2, bytes) == 0, "D2H data differs from the source");

  /* D2D: bytes read + bytes written */
  CK(cudaMemset(d2, 0, bytes));
  if ((rc = time_copy(d2, d, bytes, cudaMemcpyDeviceToDevice, s, z->copy_warm, reps, &ms))) goto out;
  size_label(label, sizeof label, "D2D copy (read + write)", bytes);
  row("d2d", 2.0 * bytes / (ms * 1e6), "GB/s", label);
  memset(h2, 0, bytes);
  CK(cudaMemcpy(h2, d2, bytes, cudaMemcpyDeviceToHost));
  check("d2d", memcmp(h, h2, bytes) == 0, "copy differs from the source");

  /* c = a + b, f32: 2 reads + 1 write */
  {
    float *a = (float *)d, *b = (float *)d2, *c = (float *)d3, *hc = (float *)h2;
    add_init<<<blocks_for((int64_t)nw), THREADS, 0, s>>>(a, b, (int64_t)nw);
    CK(cudaGetLastError());
    CK(cudaMemsetAsync(c, 0xff, bytes, s));
    for (int r = -z->copy_warm; r < reps; r++) {
      CK(cudaEventRecord(e0, s));
      add_kernel<<<blocks_for(n4), THREADS, 0, s>>>((float4 *)c, (const float4 *)a, (const float4 *)b, n4);
      CK(cudaGetLastError());
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&fms, e0, e1));
      if (r >= 0) t[r] = fms;
    }
    ms = median(t, reps);
    size_label(label, sizeof label, "add f32 a+b->c, raw kernel", bytes);
    row("add_kernel", 3.0 * bytes / (ms * 1e6), "GB/s", label);
    CK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < nw && bad < 1; i++)
      if (hc[i] != (float)(i & 1023) * 0.5f + (float)(i % 997) * 0.25f) bad = 1 + (int)(i & 0x3fffffff);
    check("add_kernel", bad == 0, "c[%d] wrong", bad - 1);
  }
out:
  if (h) cudaFreeHost(h);
  if (h2) cudaFreeHost(h2);
  if (d) cudaFree(d);
  if (d2) cudaFree(d2);
  if (d3) cudaFree(d3);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (e2) cudaEventDestroy(e2);
  if (s) cudaStreamDestroy(s);
  if (s2) cudaStreamDestroy(s2);
  free(t);
  return rc;
}

/* Pageable memory (malloc'd, touched beforehand): the driver's own copy,
 * which blocks the host.  Wall time of the copy and a wait for its stream,
 * as bench/copy.lua times gpulua's; median of the repeats. */
static int bench_pageable(const sizes *z) {
  int rc = 0;
  size_t big = z->copy_bytes;
  uint32_t *h = NULL, *h2 = NULL;
  void *d = NULL;
  cudaStream_t s = NULL;
  double *t = NULL;
  char label[128];
  int maxreps = z->copy_reps > z->page_reps ? z->copy_reps : z->page_reps;
  t = (double *)malloc(sizeof(double) * (size_t)maxreps);
  h = (uint32_t *)malloc(big);
  h2 = (uint32_t *)malloc(big);
  NEED(t && h && h2);
  CK(cudaStreamCreate(&s));
  CK(cudaMalloc(&d, big));
  for (size_t i = 0; i < big / 4; i++) h[i] = (uint32_t)i * 2654435761u ^ 0x5bd1e995u;
  memset(h2, 0, big);
  for (int pass = 0; pass < 2; pass++) {
    size_t bytes = pass ? z->page_small : big;
    int reps = pass ? z->page_reps : z->copy_reps;
    const char *tag = pass ? "_4m" : "";
    for (int dir = 0; dir < 2; dir++) {
      for (int r = -z->copy_warm; r < reps; r++) {
        double t0 = now_s();
        if (dir == 0) CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s));
        else CK(cudaMemcpyAsync(h2, d, bytes, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        if (r >= 0) t[r] = (now_s() - t0) * 1e3;
      }
      double ms = median(t, reps);
      char key[64];
      snprintf(key, sizeof key, "%s_pageable%s", dir ? "d2h" : "h2d", tag);
      size_label(label, sizeof label, dir ? "D2H pageable" : "H2D pageable", bytes);
      row(key, bytes / (ms * 1e6), "GB/s", label);
      if (dir == 1) check(key, memcmp(h, h2, bytes) == 0, "host data differs from the source");
      else check(key, 1, NULL);
    }
  }
out:
  free(h);
  free(h2);
  if (d) cudaFree(d);
  if (s) cudaStreamDestroy(s);
  free(t);
  return rc;
}

/* ---- matmul (cuBLAS) --------------------------------------------------- */

typedef cublasStatus_t (*cublas_create_t)(cublasHandle_t *);
typedef cublasStatus_t (*cublas_destroy_t)(cublasHandle_t);
typedef cublasStatus_t (*cublas_setstream_t)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*cublas_gemmex_t)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                          const void *, const void *, cudaDataType, int, const void *,
                                          cudaDataType, int, const void *, void *, cudaDataType, int,
                                          cublasComputeType_t, cublasGemmAlgo_t);

static double host_value(const void *p, int bf16) {
  if (bf16) return (double)__bfloat162float(*(const __nv_bfloat16 *)p);
  return (double)*(const float *)p;
}

static int matmul_one(const sizes *z, int bf16, void *lib) {
  int rc = 0, n = z->mm_n, warm = bf16 ? z->mm_warm_bf16 : z->mm_warm_f32;
  int reps = bf16 ? z->mm_reps_bf16 : z->mm_reps_f32;
  size_t es = bf16 ? 2 : 4, bytes = (size_t)n * n * es;
  const char *key = bf16 ? "matmul_bf16" : "matmul_f32";
  cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublas_create_t create = (cublas_create_t)dlsym(lib, "cublasCreate_v2");
  cublas_destroy_t destroy = (cublas_destroy_t)dlsym(lib, "cublasDestroy_v2");
  cublas_setstream_t setstream = (cublas_setstream_t)dlsym(lib, "cublasSetStream_v2");
  cublas_gemmex_t gemmex = (cublas_gemmex_t)dlsym(lib, "cublasGemmEx");
  cublasHandle_t handle = NULL;
  cudaStream_t s = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  char *A = NULL, *B = NULL, *C = NULL;
  unsigned char *hrow = NULL, *hcol = NULL;
  double *t = NULL, ms = 0, worst = 0;
  float fms = 0, one = 1, zero = 0;
  int pos[4][2] = {{0, 0}, {n - 1, n - 1}, {n / 3, 2 * n / 3}, {n / 2 + 1, 7}};
  char label[128];
  int st;
  t = (double *)malloc(sizeof(double) * (size_t)reps);
  hrow = (unsigned char *)malloc((size_t)n * es);
  hcol = (unsigned char *)malloc((size_t)n * es);
  NEED(t && hrow && hcol);
  if (!create || !destroy || !setstream || !gemmex) {
    check(key, 0, "cuBLAS lacks cublasCreate_v2/cublasGemmEx");
    rc = -1;
    goto out;
  }
  if ((st = create(&handle)) != CUBLAS_STATUS_SUCCESS) {
    check(key, 0, "cublasCreate failed (status %d)", st);
    handle = NULL;
    rc = -1;
    goto out;
  }
  CK(cudaStreamCreate(&s));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMalloc((void **)&A, bytes));
  CK(cudaMalloc((void **)&B, bytes));
  CK(cudaMalloc((void **)&C, bytes));
  if (bf16) {
    rand_kernel<<<blocks_for((int64_t)n * n), THREADS, 0, s>>>((__nv_bfloat16 *)A, (int64_t)n * n, 1);
    rand_kernel<<<blocks_for((int64_t)n * n), THREADS, 0, s>>>((__nv_bfloat16 *)B, (int64_t)n * n, 2);
  } else {
    rand_kernel<<<blocks_for((int64_t)n * n), THREADS, 0, s>>>((float *)A, (int64_t)n * n, 1);
    rand_kernel<<<blocks_for((int64_t)n * n), THREADS, 0, s>>>((float *)B, (int64_t)n * n, 2);
  }
  CK(cudaGetLastError());
  CK(cudaMemsetAsync(C, 0xff, bytes, s));   /* NaN until written */
  setstream(handle, s);
  for (int r = -warm; r < reps; r++) {
    CK(cudaEventRecord(e0, s));
    /* row-major C = A B as column-major C^T = B^T A^T, as gpulua calls it */
    st = gemmex(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, B, type, n, A, type, n, &zero, C, type, n,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      check(key, 0, "cublasGemmEx failed (status %d)", st);
      rc = -1;
      goto out;
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&fms, e0, e1));
    if (r >= 0) t[r] = fms;
  }
  ms = median(t, reps);
  snprintf(label, sizeof label, "matmul %d^3 %s (cuBLAS)", n, bf16 ? "bf16" : "f32");
  row(key, 2.0 * n * (double)n * n / (ms * 1e9), "TFLOP/s", label);
  /* spot check: a few entries against dot products on the host */
  for (int q = 0; q < 4; q++) {
    int i = pos[q][0], j = pos[q][1];
    unsigned char cij[4];
    double ref = 0, mag = 0;
    CK(cudaMemcpy(hrow, A + (size_t)i * n * es, (size_t)n * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy2D(hcol, es, B + (size_t)j * es, (size_t)n * es, es, (size_t)n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(cij, C + ((size_t)i * n + j) * es, es, cudaMemcpyDeviceToHost));
    for (int k = 0; k < n; k++) {
      double p = host_value(hrow + (size_t)k * es, bf16) * host_value(hcol + (size_t)k * es, bf16);
      ref += p;
      mag += fabs(p);
    }
    double err = fabs(host_value(cij, bf16) - ref) / (mag > 0 ? mag : 1);
    if (!(err <= worst)) worst = err;   /* NaN sticks */
  }
  check(key, worst <= (bf16 ? 1e-2 : 1e-4), "relative error %.3g at a spot-checked entry", worst);
out:
  if (handle) destroy(handle);
  if (A) cudaFree(A);
  if (B) cudaFree(B);
  if (C) cudaFree(C);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) cudaStreamDestroy(s);
  free(t);
  free(hrow);
  free(hcol);
  return rc;
}

typedef cublasStatus_t (*cublas_gemmsb_t)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                          const void *, const void *, cudaDataType, int, long long,
                                          const void *, cudaDataType, int, long long, const void *, void *,
                                          cudaDataType, int, long long, int, cublasComputeType_t,
                                          cublasGemmAlgo_t);

/* The two layouts gpulua's matmul takes without a copy, in bf16, called as
 * gpulua calls cuBLAS (bench/matmul.lua times the same):
 *   matmul_t_bf16    a:t() @ b, n x n: cublasGemmEx with op T on a;
 *   matmul_bmm_bf16  {batch, n, n} @ {batch, n, n}: cublasGemmStridedBatchedEx. */
static int matmul_layout(const sizes *z, int bmm, void *lib) {
  int rc = 0, warm = z->mm_warm_bf16, reps = z->mm_reps_bf16;
  int n = bmm ? z->mm_bmm_n : z->mm_n, nb = bmm ? z->mm_bmm_batch : 1;
  size_t es = 2, mat = (size_t)n * n, bytes = mat * nb * es;
  const char *key = bmm ? "matmul_bmm_bf16" : "matmul_t_bf16";
  cublas_create_t create = (cublas_create_t)dlsym(lib, "cublasCreate_v2");
  cublas_destroy_t destroy = (cublas_destroy_t)dlsym(lib, "cublasDestroy_v2");
  cublas_setstream_t setstream = (cublas_setstream_t)dlsym(lib, "cublasSetStream_v2");
  cublas_gemmex_t gemmex = (cublas_gemmex_t)dlsym(lib, "cublasGemmEx");
  cublas_gemmsb_t gemmsb = (cublas_gemmsb_t)dlsym(lib, "cublasGemmStridedBatchedEx");
  cublasHandle_t handle = NULL;
  cudaStream_t s = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  char *A = NULL, *B = NULL, *C = NULL;
  unsigned char *ha = NULL, *hb = NULL;
  double *t = NULL, ms = 0, worst = 0;
  float fms = 0, one = 1, zero = 0;
  int pos[4][3] = {{0, 0, 0}, {nb - 1, n - 1, n - 1}, {nb / 2, n / 3, 2 * n / 3}, {nb / 3, n / 2 + 1, 7}};
  char label[128];
  int st;
  t = (double *)malloc(sizeof(double) * (size_t)reps);
  ha = (unsigned char *)malloc((size_t)n * es);
  hb = (unsigned char *)malloc((size_t)n * es);
  NEED(t && ha && hb);
  if (!create || !destroy || !setstream || !gemmex || !gemmsb) {
    check(key, 0, "cuBLAS lacks cublasGemmEx/cublasGemmStridedBatchedEx");
    rc = -1;
    goto out;
  }
  if ((st = create(&handle)) != CUBLAS_STATUS_SUCCESS) {
    check(key, 0, "cublasCreate failed (status %d)", st);
    handle = NULL;
    rc = -1;
    goto out;
  }
  CK(cudaStreamCreate(&s));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMalloc((void **)&A, bytes));
  CK(cudaMalloc((void **)&B, bytes));
  CK(cudaMalloc((void **)&C, bytes));
  rand_kernel<<<blocks_for((int64_t)(mat * nb)), THREADS, 0, s>>>((__nv_bfloat16 *)A, (int64_t)(mat * nb), 3);
  rand_kernel<<<blocks_for((int64_t)(mat * nb)), THREADS, 0, s>>>((__nv_bfloat16 *)B, (int64_t)(mat * nb), 4);
  CK(cudaGetLastError());
  CK(cudaMemsetAsync(C, 0xff, bytes, s));   /* NaN until written */
  setstream(handle, s);
  for (int r = -warm; r < reps; r++) {
    CK(cudaEventRecord(e0, s));
    /* row-major C = A B as column-major C^T = B^T A^T; a:t() is op T on A */
    if (bmm)
      st = gemmsb(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, B, CUDA_R_16BF, n, (long long)mat, A,
                  CUDA_R_16BF, n, (long long)mat, &zero, C, CUDA_R_16BF, n, (long long)mat, nb,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
      st = gemmex(handle, CUBLAS_OP_N, CUBLAS_OP_T, n, n, n, &one, B, CUDA_R_16BF, n, A, CUDA_R_16BF, n, &zero,
                  C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      check(key, 0, "cuBLAS failed (status %d)", st);
      rc = -1;
      goto out;
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&fms, e0, e1));
    if (r >= 0) t[r] = fms;
  }
  ms = median(t, reps);
  if (bmm) snprintf(label, sizeof label, "matmul %d x %d^3 bf16, batched (cuBLAS)", nb, n);
  else snprintf(label, sizeof label, "matmul a:t() @ b %d^3 bf16 (cuBLAS)", n);
  row(key, 2.0 * nb * n * (double)n * n / (ms * 1e9), "TFLOP/s", label);
  /* spot check: row i of a (column i of A when transposed), column j of b */
  for (int q = 0; q < 4; q++) {
    int bi = pos[q][0], i = pos[q][1], j = pos[q][2];
    size_t base = (size_t)bi * mat * es;
    unsigned char cij[2];
    double ref = 0, mag = 0;
    if (bmm) CK(cudaMemcpy(ha, A + base + (size_t)i * n * es, (size_t)n * es, cudaMemcpyDeviceToHost));
    else CK(cudaMemcpy2D(ha, es, A + (size_t)i * es, (size_t)n * es, es, (size_t)n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy2D(hb, es, B + base + (size_t)j * es, (size_t)n * es, es, (size_t)n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(cij, C + base + ((size_t)i * n + j) * es, es, cudaMemcpyDeviceToHost));
    for (int k = 0; k < n; k++) {
      double p = host_value(ha + (size_t)k * es, 1) * host_value(hb + (size_t)k * es, 1);
      ref += p;
      mag += fabs(p);
    }
    double err = fabs(host_value(cij, 1) - ref) / (mag > 0 ? mag : 1);
    if (!(err <= worst)) worst = err;   /* NaN sticks */
  }
  check(key, worst <= 1e-2, "relative error %.3g at a spot-checked entry", worst);
out:
  if (handle) destroy(handle);
  if (A) cudaFree(A);
  if (B) cudaFree(B);
  if (C) cudaFree(C);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) cudaStreamDestroy(s);
  free(t);
  free(ha);
  free(hb);
  return rc;
}

static int bench_matmul(const sizes *z) {
  const char *names[] = {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so", NULL};
  void *lib = NULL;
  int rc = 0;
  for (int i = 0; names[i] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    check("matmul_f32", 0, "cannot load libcublas.so.13 (%s)", dlerror());
    return -1;
  }
  if (matmul_one(z, 0, lib)) rc = -1;
  if (matmul_one(z, 1, lib)) rc = -1;
  if (matmul_layout(z, 0, lib)) rc = -1;
  if (matmul_layout(z, 1, lib)) rc = -1;
  dlclose(lib);
  return rc;
}

/* ---- overlap: the schedule of scripts/overlap.lua ---------------------- */

typedef struct ovl {
  int nb;
  int64_t n;
  float **src;                 /* nb pinned batches */
  float *dev[2];
  double *res;                 /* device: per batch sum, min, max */
  double *part;                /* device: reduction partials */
  int nparts;
  cudaStream_t cs, ks;         /* copy stream, compute stream */
  cudaEvent_t copy_done[2], comp_done[2];
} ovl;

static int ov_compute(ovl *o, float *x, int passes, int b) {
  int rc = 0;
  int64_t n4 = o->n / 4;
  unsigned g = blocks_for(n4);
  cudaStream_t s = o->ks;
  ew_kernel<EW_MUL><<<g, THREADS, 0, s>>>((float4 *)x, n4, 2.0f);
  ew_kernel<EW_ADD><<<g, THREADS, 0, s>>>((float4 *)x, n4, -1.0f);
  ew_kernel<EW_RELU><<<g, THREADS, 0, s>>>((float4 *)x, n4, 0.0f);
  for (int p = 1; p <= passes; p++) ew_kernel<EW_MUL><<<g, THREADS, 0, s>>>((float4 *)x, n4, p % 2 ? 2.0f : 0.5f);
  rd_partial<RD_SUM><<<o->nparts, THREADS, 0, s>>>(x, o->n, o->part);
  rd_final<RD_SUM><<<1, THREADS, 0, s>>>(o->part, o->nparts, o->res + 3 * b);
  rd_partial<RD_MIN><<<o->nparts, THREADS, 0, s>>>(x, o->n, o->part);
  rd_final<RD_MIN><<<1, THREADS, 0, s>>>(o->part, o->nparts, o->res + 3 * b + 1);
  rd_partial<RD_MAX><<<o->nparts, THREADS, 0, s>>>(x, o->n, o->part);
  rd_final<RD_MAX><<<1, THREADS, 0, s>>>(o->part, o->nparts, o->res + 3 * b + 2);
  CK(cudaGetLastError());
out:
  return rc;
}

/* median of 3 event timings on stream s of what `what` enqueues:
 * 0 one batch's copy, 1 one batch's compute without passes, 2 a pair of passes */
static int ov_time(ovl *o, int what, double *ms_out) {
  int rc = 0;
  cudaStream_t s = what == 0 ? o->cs : o->ks;
  cudaEvent_t e0 = NULL, e1 = NULL;
  double t[3];
  float ms = 0;
  int64_t n4 = o->n / 4;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int r = 0; r < 3; r++) {
    CK(cudaEventRecord(e0, s));
    if (what == 0) {
      CK(cudaMemcpyAsync(o->dev[0], o->src[0], (size_t)o->n * 4, cudaMemcpyHostToDevice, s));
    } else if (what == 1) {
      if ((rc = ov_compute(o, o->dev[0], 0, 0))) goto out;
    } else {
      ew_kernel<EW_MUL><<<blocks_for(n4), THREADS, 0, s>>>((float4 *)o->dev[0], n4, 2.0f);
      ew_kernel<EW_MUL><<<blocks_for(n4), THREADS, 0, s>>>((float4 *)o->dev[0], n4, 0.5f);
      CK(cudaGetLastError());
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t[r] = ms;
  }
  *ms_out = median(t, 3);
out:
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  return rc;
}

/* One timed pipeline; *eff = ideal / measured, as scripts/overlap.lua. */
static int ov_run(ovl *o, int passes, double *eff, double *total_out, double *copy_out, double *comp_out) {
  int rc = 0, nb = o->nb, bad = 0;
  int64_t n = o->n;
  cudaEvent_t start = NULL, stop = NULL, *ev = NULL;   /* 4 per batch: copy0 copy1 comp0 comp1 */
  double *res = NULL, copy_ms = 0, comp_ms = 0, total = 0, ideal;
  float a = 0, b2 = 0;
  ev = (cudaEvent_t *)calloc((size_t)4 * nb, sizeof *ev);
  res = (double *)malloc(sizeof(double) * 3 * (size_t)nb);
  NEED(ev && res);
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  for (int i = 0; i < 4 * nb; i++) CK(cudaEventCreate(&ev[i]));
  CK(cudaMemset(o->res, 0xff, sizeof(double) * 3 * (size_t)nb));
  CK(cudaDeviceSynchronize());

  CK(cudaEventRecord(start, o->cs));
  CK(cudaStreamWaitEvent(o->ks, start, 0));
  for (int b = 0; b < nb; b++) {
    int k = b % 2;
    if (b >= 2) CK(cudaStreamWaitEvent(o->cs, o->comp_done[k], 0));
    CK(cudaEventRecord(ev[4 * b], o->cs));
    CK(cudaMemcpyAsync(o->dev[k], o->src[b], (size_t)n * 4, cudaMemcpyHostToDevice, o->cs));
    CK(cudaEventRecord(ev[4 * b + 1], o->cs));
    CK(cudaEventRecord(o->copy_done[k], o->cs));
    CK(cudaStreamWaitEvent(o->ks, o->copy_done[k], 0));
    CK(cudaEventRecord(ev[4 * b + 2], o->ks));
    if ((rc = ov_compute(o, o->dev[k], passes, b))) goto out;
    CK(cudaEventRecord(ev[4 * b + 3], o->ks));
    CK(cudaEventRecord(o->comp_done[k], o->ks));
  }
  CK(cudaEventRecord(stop, o->ks));
  CK(cudaDeviceSynchronize());

  CK(cudaMemcpy(res, o->res, sizeof(double) * 3 * (size_t)nb, cudaMemcpyDeviceToHost));
  for (int b = 1; b <= nb; b++) {
    double sum = res[3 * (b - 1)], lo = res[3 * (b - 1) + 1], hi = res[3 * (b - 1) + 2];
    double want_sum = 2.0 * (double)n * b - 1, want_hi = 2.0 * b - 1 + 2.0 * (double)(n - 1) / (double)n;
    int ok = lo == 2.0 * b - 1 && fabs(hi - want_hi) <= 4 * ldexp(1, -23) * want_hi &&
             fabs(sum - want_sum) <= 1e-4 * want_sum;
    if (!ok && bad++ < 3)
      printf("info overlap batch %d wrong: sum %.9g (want %.9g) min %.9g (want %d) max %.9g (want %.9g)\n", b, sum,
             want_sum, lo, 2 * b - 1, hi, want_hi);
  }
  for (int b = 0; b < nb; b++) {
    CK(cudaEventElapsedTime(&a, ev[4 * b], ev[4 * b + 1]));
    CK(cudaEventElapsedTime(&b2, ev[4 * b + 2], ev[4 * b + 3]));
    copy_ms += a;
    comp_ms += b2;
  }
  CK(cudaEventElapsedTime(&a, start, stop));
  total = a;
  ideal = fmax(copy_ms, comp_ms) + fmin(copy_ms, comp_ms) / nb;
  *eff = ideal / total;
  *total_out = total;
  *copy_out = copy_ms;
  *comp_out = comp_ms;
  if (bad) {
    printf("info overlap check FAILED for %d of %d batches\n", bad, nb);
    rc = 1;
  }
out:
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (ev)
    for (int i = 0; i < 4 * nb; i++)
      if (ev[i]) cudaEventDestroy(ev[i]);
  free(ev);
  free(res);
  return rc;
}

/* fixed_passes < 0: calibrate as scripts/overlap.lua does */
static int bench_overlap(int nb, int64_t n, int fixed_passes, int runs, const char *key) {
  int rc = 0, passes = fixed_passes, nbad = 0;
  ovl o;
  double copy_ms = 0, fixed_ms = 0, pair_ms = 0, *effs = NULL;
  float *ramp = NULL;
  char label[128];
  memset(&o, 0, sizeof o);
  o.nb = nb;
  o.n = n;
  o.nparts = sm_count() * 2;
  effs = (double *)malloc(sizeof(double) * (size_t)runs);
  o.src = (float **)calloc((size_t)nb, sizeof *o.src);
  NEED(effs && o.src);
  if (n % 4 != 0 || n < 4) {
    check(key, 0, "elements per batch must be a multiple of 4");
    rc = -1;
    goto out;
  }
  CK(cudaStreamCreate(&o.cs));
  CK(cudaStreamCreate(&o.ks));
  for (int k = 0; k < 2; k++) {
    CK(cudaEventCreateWithFlags(&o.copy_done[k], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&o.comp_done[k], cudaEventDisableTiming));
    CK(cudaMalloc((void **)&o.dev[k], (size_t)n * 4));
  }
  CK(cudaMalloc((void **)&o.res, sizeof(double) * 3 * (size_t)nb));
  CK(cudaMalloc((void **)&o.part, sizeof(double) * (size_t)o.nparts));
  /* batch b (1-based) holds b + (j-1)/n, rounded as gpulua's f32 ops round */
  ramp = (float *)malloc((size_t)n * 4);
  NEED(ramp);
  for (int64_t j = 0; j < n; j++) ramp[j] = (float)j / (float)n;
  for (int b = 0; b < nb; b++) {
    CK(cudaHostAlloc((void **)&o.src[b], (size_t)n * 4, cudaHostAllocPortable));
    for (int64_t j = 0; j < n; j++) o.src[b][j] = (float)(b + 1) + ramp[j];
  }
  if (passes < 0) {
    if ((rc = ov_time(&o, 0, &copy_ms)) || (rc = ov_time(&o, 1, &fixed_ms)) || (rc = ov_time(&o, 2, &pair_ms))) goto out;
    passes = 2 * (int)fmax(0, floor((copy_ms - fixed_ms) / (2 * pair_ms) + 0.5));
    if (passes > 4096) passes = 4096;
    printf("info %s calibrated: copy %.3f ms, fixed part %.3f ms, pass %.4f ms -> %d passes\n", key, copy_ms,
           fixed_ms, pair_ms / 2, passes);
  }
  for (int r = 0; r < runs; r++) {
    double total = 0, cm = 0, km = 0;
    int st = ov_run(&o, passes, &effs[r], &total, &cm, &km);
    if (st < 0) { rc = -1; goto out; }
    if (st > 0) nbad++;
    printf("info %s run %d: total %.3f ms, copy %.3f ms, compute %.3f ms, efficiency %.4f\n", key, r + 1, total, cm,
           km, effs[r]);
  }
  if ((size_t)n * 4 >= (size_t)1 << 20) snprintf(label, sizeof label, "overlap %d x %lld MiB, efficiency", nb, (long long)(n * 4 >> 20));
  else snprintf(label, sizeof label, "overlap %d x %lld KiB, efficiency", nb, (long long)(n * 4 >> 10));
  row(key, median(effs, runs), "eff", label);
  printf("note %s raw C: %d compute passes per batch; median of %d runs\n", key, passes, runs);
  check(key, nbad == 0, "closed-form check failed in %d of %d runs", nbad, runs);
out:
  for (int b = 0; o.src && b < nb; b++)
    if (o.src[b]) cudaFreeHost(o.src[b]);
  free(o.src);
  for (int k = 0; k < 2; k++) {
    if (o.dev[k]) cudaFree(o.dev[k]);
    if (o.copy_done[k]) cudaEventDestroy(o.copy_done[k]);
    if (o.comp_done[k]) cudaEventDestroy(o.comp_done[k]);
  }
  if (o.res) cudaFree(o.res);
  if (o.part) cudaFree(o.part);
  if (o.cs) cudaStreamDestroy(o.cs);
  if (o.ks) cudaStreamDestroy(o.ks);
  free(ramp);
  free(effs);
  return rc;
}

/* ---- graph replay -------------------------------------------------------- */

/* A CUDA graph of graph_nodes small kernels (x += 1 on one f32 element, in
 * sequence on one stream), captured with cudaStreamBeginCapture/EndCapture,
 * instantiated, then replayed: event timing around a batch of graph_replays
 * launches, after graph_warm batches; the row is the time per node (a
 * batch's time / replays / nodes), median of graph_reps batches.  The check:
 * the element holds the number of kernels run. */
static int bench_graph(const sizes *z) {
  int rc = 0, R = z->graph_reps, N = z->graph_nodes, NR = z->graph_replays;
  cudaStream_t s = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  float *p = NULL, got = -1, ms = 0;
  size_t nodes = 0;
  char label[96];
  double *t = (double *)malloc(sizeof(double) * (size_t)R);
  NEED(t);
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMalloc((void **)&p, sizeof(float)));
  CK(cudaMemsetAsync(p, 0, sizeof(float), s));
  CK(cudaStreamSynchronize(s));

  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < N; i++) add_scalar_kernel<<<1, THREADS, 0, s>>>(p, 1, 1.0f);
  {
    cudaError_t le = cudaGetLastError();
    cudaError_t ee = cudaStreamEndCapture(s, &graph);
    CK(le);
    CK(ee);
  }
  CK(cudaGraphGetNodes(graph, NULL, &nodes));
  CK(cudaGraphInstantiateWithFlags(&exec, graph, 0));

  for (int r = -z->graph_warm; r < R; r++) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < NR; i++) CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 0) t[r] = (double)ms * 1e3 / ((double)NR * N);
  }
  CK(cudaMemcpy(&got, p, sizeof got, cudaMemcpyDeviceToHost));
  snprintf(label, sizeof label, "graph replay, time per node (%d kernels)", N);
  row("graph_node", median(t, R), "us", label);
  printf("note graph_node graph_node raw C: a CUDA graph of %zu kernels (x += 1, 1 element), %d replays per batch, "
         "median of %d batches after %d\n", nodes, NR, R, z->graph_warm);
  {
    double want = (double)N * NR * (z->graph_warm + R);
    check("graph_node", got == (float)want && nodes == (size_t)N, "element is %g, want %.0f; %zu nodes, want %d",
          got, want, nodes, N);
  }
out:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (p) cudaFree(p);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) cudaStreamDestroy(s);
  free(t);
  return rc;
}

/* ---- main --------------------------------------------------------------- */

static int first_kernel(void) {
  empty_kernel<<<1, 1>>>();
  cudaError_t e = cudaDeviceSynchronize();
  double t = now_s();
  if (e != cudaSuccess) {
    printf("check first_kernel FAILED %s\n", cudaGetErrorString(e));
    return 1;
  }
  printf("first_kernel %.9f\n", t);
  return 0;
}

static void device_info(void) {
  struct cudaDeviceProp p;
  int dev = 0, drv = 0, rt = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  printf("info device %s, %d SMs, CUDA driver %d.%d, runtime %d.%d\n", p.name, p.multiProcessorCount, drv / 1000,
         drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
}

/* ---- streams -------------------------------------------------------------- */

/* cudaStreamCreate + cudaStreamDestroy beside 1k and 100k live streams that
 * are never used, as bench/alloc.lua's stream rows: the driver's own cost of
 * what is alive. */
static void bench_streams(const sizes *z) {
  static const int live[2] = {1000, 100000};
  static const char *const keys[2] = {"stream_live_1k", "stream_live_100k"};
  double us[2] = {0, 0};
  int rc = 0, n = 0;
  cudaStream_t *keep = (cudaStream_t *)calloc((size_t)live[1], sizeof *keep);
  double *t = (double *)calloc((size_t)z->stream_reps, sizeof *t);
  if (!keep || !t) {
    printf("check host FAILED %s:%d: out of memory\n", __FILE__, __LINE__);
    g_failed = 1;
    free(keep);
    free(t);
    return;
  }
  for (int k = 0; k < 2; k++) {
    for (; n < live[k]; n++) CK(cudaStreamCreate(&keep[n]));
    for (int r = 0; r < z->stream_reps; r++) {
      double t0 = now_s();
      for (int i = 0; i < z->stream_calls; i++) {
        cudaStream_t s;
        CK(cudaStreamCreate(&s));
        CK(cudaStreamDestroy(s));
      }
      t[r] = (now_s() - t0) / z->stream_calls * 1e6;
    }
    us[k] = median(t, z->stream_reps);
    char label[96];
    snprintf(label, sizeof label, "cudaStreamCreate + cudaStreamDestroy, %d live", live[k]);
    row(keys[k], us[k], "us", label);
  }
  row("stream_live_ratio", us[1] / us[0], "x", "stream create + destroy, 100k live / 1k live");
  printf("note streams raw C: %d create + destroy pairs per repeat, median of %d; the live streams are never used\n",
         z->stream_calls, z->stream_reps);
out:
  for (int i = 0; i < n; i++) cudaStreamDestroy(keep[i]);
  free(keep);
  free(t);
  if (rc) g_failed = 1;
}

static int usage(void) {
  fprintf(stderr, "usage: ref [quick] all | launch copy matmul overlap graph streams ...\n"
                  "       ref first-kernel\n"
                  "       ref overlap-one BATCHES ELEMENTS [passes=N]\n");
  return 2;
}

int main(int argc, char **argv) {
  sizes z;
  int quick = 0, nsec = 0, want[6] = {0, 0, 0, 0, 0, 0};
  const char *secs[] = {"launch", "copy", "matmul", "overlap", "graph", "streams"};
  const char *q = getenv("BENCH_QUICK");
  if (argc >= 2 && strcmp(argv[1], "first-kernel") == 0) return first_kernel();
  if (argc >= 4 && strcmp(argv[1], "overlap-one") == 0) {
    int passes = argc >= 5 && strncmp(argv[4], "passes=", 7) == 0 ? atoi(argv[4] + 7) : -1;
    int rc = bench_overlap(atoi(argv[2]), atoll(argv[3]), passes, 1, "overlap");
    return rc || g_failed;
  }
  if (q && *q && strcmp(q, "0") != 0) quick = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "quick") == 0) { quick = 1; continue; }
    int found = 0;
    for (int j = 0; j < 6; j++)
      if (strcmp(argv[i], secs[j]) == 0 || strcmp(argv[i], "all") == 0) { want[j] = 1; found = 1; }
    if (!found) return usage();
    nsec++;
  }
  if (nsec == 0) return usage();
  sizes_init(&z, quick);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    printf("check cuda FAILED no CUDA device answers: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 1;
  }
  device_info();
  if (want[0]) bench_launch(&z);
  if (want[1]) {
    bench_copy(&z);
    bench_pageable(&z);
  }
  if (want[2]) bench_matmul(&z);
  if (want[3]) {
    bench_overlap(z.ov_batches, z.ov_big, -1, z.ov_runs, "overlap_big");
    bench_overlap(z.ov_batches, z.ov_small, -1, z.ov_runs, "overlap_small");
  }
  if (want[4]) bench_graph(&z);
  if (want[5]) bench_streams(&z);
  return g_failed;
}
