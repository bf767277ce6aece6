/* Shared helpers of the built-in CUDA kernels (cuda/k_*.cu).
 *
 * The arithmetic is scalar.h's, compiled here as CUDA and in cpu_ops.c as C:
 * the f16/bf16 conversions, Philox and every op of ops.h.  On top of it, this
 * file has what is CUDA's own, __host__ __device__ where it can be checked on
 * a CPU against dev_cpu_run(): the element layer (k_elem.cuh: loads into the
 * compute type and stores from it with cpu_ops.c's conversion rules, the ops
 * of ops.h as templates, strided-view offsets), the random mappings, views as
 * kernels take them and launching.
 * Compute types are float for f32/f16/bf16, double for f64 and int64 for the
 * integers and bool.
 *
 * The kernels are compiled with -fmad=false (Makefile): nvcc would contract
 * a*b+c into an FMA, which rounds once where the host and a fused kernel's
 * two ops round twice.  Where the host's result is exact (arange, rand,
 * integer matmul) products and sums also go through k_dmul/k_dadd, which
 * are never contracted whatever the flags.
 */
#ifndef GPULUA_K_COMMON_CUH
#define GPULUA_K_COMMON_CUH

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "k_elem.cuh"   /* device.h, scalar.h and the element layer first */
#include "kernels.h"
#include "util.h"

/* Runs f(kdtag<T>()) for the run-time dtype t; -2 for a bad dtype. */
template <int T> struct kdtag { static constexpr int value = T; };

template <class F> static inline int k_dispatch(int t, F &&f)
{
  switch (t) {
  case DEV_F32: return f(kdtag<DEV_F32>());
  case DEV_F64: return f(kdtag<DEV_F64>());
  case DEV_F16: return f(kdtag<DEV_F16>());
  case DEV_BF16: return f(kdtag<DEV_BF16>());
  case DEV_I8: return f(kdtag<DEV_I8>());
  case DEV_U8: return f(kdtag<DEV_U8>());
  case DEV_I32: return f(kdtag<DEV_I32>());
  case DEV_I64: return f(kdtag<DEV_I64>());
  case DEV_BOOL: return f(kdtag<DEV_BOOL>());
  default: return -2;
  }
}

/* Element i of a DEV_OP_ARANGE: exact in int64 when both scalars and the
 * dtype are integers, otherwise s0 + i*s1 in double, rounded once each. */
template <int T> KH typename kt<T>::S k_arange_elem(int exact, dev_scalar s0, dev_scalar s1, int64_t i)
{
  if (exact) return k_store_i<T>(sc_wrap64((uint64_t)s0.i + (uint64_t)i * (uint64_t)s1.i));
  return k_store_d<T>(k_dadd(k_scalar_d(s0), k_dmul((double)i, k_scalar_d(s1))));
}

/* The element DEV_OP_FILL writes: the host's store_i for an integer scalar
 * into an integer dtype, store_d otherwise. */
template <int T> KH typename kt<T>::S k_fill_elem(dev_scalar s)
{
  if (s.is_int && kt<T>::cls == KC_INT) return k_store_i<T>(s.i);
  return k_store_d<T>(k_scalar_d(s));
}

/* ---- the random mappings (run_rand; Philox is scalar.h's) -------------- */

/* A uniform draw that rounds up to high in T becomes T's largest value below
 * high.  (The host loops forever on f32 with high = -inf; this stops there.) */
template <int T> KH double k_below_high(double v, double high)
{
  if constexpr (T == DEV_F32) {
    float f = sc_d2f(v);
    while (f >= high && sc_f2u(f) != 0xff800000u) f = k_float_down(f);
    return sc_f2d(f);
  } else if constexpr (T == DEV_F16) {
    uint16_t h = sc_double_to_half(v);
    while (sc_half_to_float(h) >= high) h = sc_step_down16(h);
    return sc_f2d(sc_half_to_float(h));
  } else if constexpr (T == DEV_BF16) {
    uint16_t h = sc_double_to_bf16(v);
    while (sc_bf16_to_float(h) >= high) h = sc_step_down16(h);
    return sc_f2d(sc_bf16_to_float(h));
  } else {
    return v < high ? v : k_double_down(high);
  }
}

/* Parameters of one DEV_OP_RAND, prepared on the host. */
typedef struct krand {
  uint64_t seed, offset;
  int normal, randint;  /* DEV_RAND_NORMAL, DEV_RAND_INT */
  double a, b;          /* low/high or mean/std */
  int64_t low;          /* integer dtypes: [low, low + range) */
  uint64_t range;
} krand;

static inline krand k_rand_params(const dev_kop *op)
{
  krand r;
  int64_t high;
  r.seed = op->seed;
  r.offset = op->offset;
  r.normal = op->code == DEV_RAND_NORMAL;
  r.randint = op->code == DEV_RAND_INT;
  r.a = k_scalar_d(op->s0);
  r.b = k_scalar_d(op->s1);
  r.low = op->s0.is_int ? op->s0.i : k_sat(op->s0.f, INT64_MIN, INT64_MAX);
  high = op->s1.is_int ? op->s1.i : k_sat(op->s1.f, INT64_MIN, INT64_MAX);
  r.range = (uint64_t)high - (uint64_t)r.low;
  return r;
}

#define K_TWO_PI 6.283185307179586476925286766559

/* Element idx (flat C order) of a DEV_OP_RAND into T. */
template <int T> KH typename kt<T>::S k_rand_elem(const krand &r, uint64_t idx)
{
  uint32_t x[4];
  sc_philox(r.seed, r.offset + idx, x);
  if (r.randint) {
    uint64_t v = r.range != 0 ? ((uint64_t)x[0] << 32 | x[1]) % r.range : 0;
    return k_store_i<T>(sc_wrap64((uint64_t)r.low + v));
  }
  if constexpr (T == DEV_BOOL) {
    return k_store_i<T>(x[0] & 1);
  } else if constexpr (kt<T>::cls == KC_INT) {
    uint64_t v = r.range != 0 ? ((uint64_t)x[0] << 32 | x[1]) % r.range : 0;
    return k_store_i<T>(sc_wrap64((uint64_t)r.low + v));
  } else {
    if (r.normal) {
      double z = sqrt(-2.0 * log(sc_unit53(x[0], x[1]))) * cos(K_TWO_PI * sc_unit53(x[2], x[3]));
      return k_store_d<T>(k_dadd(r.a, k_dmul(r.b, z)));
    }
    double u = T == DEV_F64 ? sc_unit53(x[0], x[1]) : ((x[0] >> 8) + 0.5) * 0x1p-24;
    return k_store_d<T>(k_below_high<T>(k_dadd(r.a, k_dmul(u, r.b - r.a)), r.b));
  }
}

/* ---- views as kernels take them (kview: k_elem.cuh) ----------------------- */

static inline kview k_view(const dev_view *v)
{
  kview k;
  int64_t numel = 1;
  memset(&k, 0, sizeof k);
  k.p = v->buf != NULL ? (char *)dev_view_ptr(v) : NULL;
  k.dtype = v->dtype;
  for (int d = 0; d < v->ndim; d++) {
    numel *= v->shape[d];
    if (v->shape[d] == 1) continue;
    if (k.ndim > 0 && k.stride[k.ndim - 1] == v->stride[d] * v->shape[d]) {
      k.shape[k.ndim - 1] *= v->shape[d];
      k.stride[k.ndim - 1] = v->stride[d];
    } else {
      k.shape[k.ndim] = v->shape[d];
      k.stride[k.ndim] = v->stride[d];
      k.ndim++;
    }
  }
  if (k.ndim == 0) { k.ndim = 1; k.shape[0] = 1; k.stride[0] = 1; }
  k.contig = numel <= 1 || (k.ndim == 1 && k.stride[0] == 1);
  k.small = numel < ((int64_t)1 << 32);
  return k;
}


static inline int k_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---- launching ------------------------------------------------------------- */

static inline cudaStream_t k_stream(const cuk_env *env) { return (cudaStream_t)env->stream; }

/* Grid of a grid-stride loop over n items: enough blocks to fill the GPU a few
 * times over, no more. */
static inline unsigned k_blocks(int64_t n, const cuk_env *env)
{
  int64_t b = (n + K_THREADS - 1) / K_THREADS, cap = (int64_t)(env->sm_count > 0 ? env->sm_count : 132) * 32;
  if (b > cap) b = cap;
  return b > 0 ? (unsigned)b : 1u;
}

static inline int k_sm(const cuk_env *env) { return env->sm_count > 0 ? env->sm_count : 132; }

/* A failed CUDA call: its text with file:line, in err; -1. */
#define K_CUDA(call)                                                                   \
  do {                                                                                 \
    cudaError_t k_e_ = (call);                                                         \
    if (k_e_ != cudaSuccess)                                                           \
      return fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(k_e_)); \
  } while (0)

/* Launch Fn through its kernel handle, looked up once: cudaLaunchKernel on
 * a handle skips the runtime's lookup from the host stub to the function
 * that <<<>>> does on every launch.  For the ops whose cost is their launch;
 * falls back to the stub where the handle cannot be had. */
template <auto Fn>
static cudaError_t k_launch(dim3 grid, dim3 block, void **args, size_t shared, const cuk_env *env)
{
  static const cudaKernel_t handle = [] {
    cudaKernel_t h = nullptr;
    if (cudaGetKernel(&h, (const void *)Fn) != cudaSuccess) {
      cudaGetLastError();
      h = nullptr;
    }
    return h;
  }();
  const void *f = handle ? (const void *)handle : (const void *)Fn;
  return cudaLaunchKernel(f, grid, block, args, shared, k_stream(env));
}

/* After a launch. */
#define K_LAUNCHED() K_CUDA(cudaGetLastError())

/* The shared checker: cuk_launch runs it on the views of an op a backend
 * built itself (ops from dev_submit were checked there, once), and
 * k_copy_views on its own, since launchers pass it derived views. */
static inline int k_check_view(const dev_view *v, const char *what, char *err, size_t errlen)
{
  return dev_view_check(v, what, err, errlen);
}

/* Byte range [*lo, *hi) that a non-empty view touches. */
static inline void k_extent(const dev_view *v, uintptr_t *lo, uintptr_t *hi)
{
  int64_t esz = (int64_t)dev_dtype_size(v->dtype), a = 0, b = 0;
  for (int d = 0; d < v->ndim; d++) {
    if (v->stride[d] > 0) b += (v->shape[d] - 1) * v->stride[d];
    else a += (v->shape[d] - 1) * v->stride[d];
  }
  *lo = (uintptr_t)dev_view_ptr(v) + (uintptr_t)(a * esz);
  *hi = (uintptr_t)dev_view_ptr(v) + (uintptr_t)((b + 1) * esz);
}

static inline int k_views_overlap(const dev_view *x, const dev_view *y)
{
  uintptr_t xl, xh, yl, yh;
  k_extent(x, &xl, &xh);
  k_extent(y, &yl, &yh);
  return xl < yh && yl < xh;
}

/* ---- launchers, one per file ------------------------------------------------ */

/* K_MODULE(name): the file's entry in cuk_modules (k_launch.cu), an empty
 * kernel through which the loader finds the file's module */
#define K_MODULE(name) \
  __global__ void k_anchor_##name(void) {} \
  const void *k_module_##name(void) { return (const void *)k_anchor_##name; }
const void *k_module_fill(void);
const void *k_module_copy(void);
const void *k_module_binary(void);
const void *k_module_unary(void);
const void *k_module_reduce(void);
const void *k_module_ternary(void);
const void *k_module_index(void);
const void *k_module_rand(void);
const void *k_module_rows(void);
const void *k_module_matmul_int(void);
const void *k_module_sleep(void);
const void *k_module_sort(void);

int k_fill(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);     /* k_fill.cu */
int k_arange(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);   /* k_fill.cu */
int k_rand(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);     /* k_rand.cu */
int k_unary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);    /* k_unary.cu */
int k_binary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);   /* k_binary.cu */
int k_ternary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);  /* k_ternary.cu */
int k_reduce(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);   /* k_reduce.cu */
int k_copy(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);     /* k_copy.cu */
int k_matmul_int(const dev_kop *op, const cuk_env *env, char *err, size_t errlen); /* k_matmul_int.cu */
int k_sleep(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);    /* k_sleep.cu */
int k_rows(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);     /* k_softmax.cu: CUMSUM, SOFTMAX */
int k_index(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);    /* k_index.cu */
int k_sort(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);     /* k_sort.cu */

/* Shared by the files: out = in (same dtype and numel) and out = s. */
int k_copy_views(const dev_view *out, const dev_view *in, const cuk_env *env, char *err, size_t errlen);
int k_fill_view(const dev_view *out, dev_scalar s, const cuk_env *env, char *err, size_t errlen);

#endif
