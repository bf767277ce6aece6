/* Shared helpers of the built-in CUDA kernels (cuda/k_*.cu).
 *
 * The arithmetic is scalar.h's, compiled here as CUDA and in cpu_ops.c as C:
 * the f16/bf16 conversions, Philox and every op of ops.h.  On top of it, this
 * file has what is CUDA's own, __host__ __device__ where it can be checked on
 * a CPU against dev_cpu_run(): strided-view offsets, loads into the compute
 * type and stores from it with cpu_ops.c's conversion rules, the random
 * mappings, and the ops of ops.h as templates (kun, kbin) for the kernels.
 * Compute types are float for f32/f16/bf16, double for f64 and int64 for the
 * integers and bool.
 *
 * nvcc contracts a*b+c into an FMA by default; the host rounds twice.  Where
 * the host's result is exact (arange, rand, integer matmul) products and sums
 * go through k_dmul/k_dadd, which are never contracted.
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

/* device.h is C and has no extern "C" of its own (kernels.h includes it
 * outside its block): included here first, its functions link as C. */
extern "C" {
#include "device.h"
}
#include "kernels.h"
#include "scalar.h"
#include "util.h"

#define KH __host__ __device__ __forceinline__
#define K_THREADS 256

/* gcc sees the host side of __host__ __device__ code and warns on the pragma */
#ifdef __CUDA_ARCH__
#define K_UNROLL _Pragma("unroll")
#else
#define K_UNROLL
#endif

/* ---- bits ------------------------------------------------------------- */

KH double k_dmul(double a, double b)
{
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

KH double k_dadd(double a, double b)
{
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

/* ---- float to integer, and one step down (conversions: scalar.h) ------- */

/* Float to integer: truncate toward zero, saturate, NaN to 0. */
KH int64_t k_sat(double v, int64_t lo, int64_t hi)
{
  if (v != v) return 0;
  if (v <= (double)lo) return lo;
  if (v >= (double)hi) return hi;
  return (int64_t)v;
}

/* nextafter(x, -inf) by bits, the same on both sides. */
KH float k_float_down(float f)
{
  uint32_t u = sc_f2u(f);
  if (f != f || u == 0xff800000u) return f;
  if ((u & 0x7fffffffu) == 0) return sc_u2f(0x80000001u);
  return sc_u2f(u & 0x80000000u ? u + 1 : u - 1);
}

KH double k_double_down(double d)
{
  uint64_t u = sc_d2u(d);
  if (d != d || u == 0xfff0000000000000ull) return d;
  if ((u & 0x7fffffffffffffffull) == 0) return sc_u2d(0x8000000000000001ull);
  return sc_u2d(u & 0x8000000000000000ull ? u + 1 : u - 1);
}

/* ---- dtypes ------------------------------------------------------------ */

enum { KC_FLOAT, KC_DOUBLE, KC_INT };

template <int T> struct kt;
template <> struct kt<DEV_F32> { typedef float S; typedef float C; static constexpr int cls = KC_FLOAT; };
template <> struct kt<DEV_F64> { typedef double S; typedef double C; static constexpr int cls = KC_DOUBLE; };
template <> struct kt<DEV_F16> { typedef uint16_t S; typedef float C; static constexpr int cls = KC_FLOAT; };
template <> struct kt<DEV_BF16> { typedef uint16_t S; typedef float C; static constexpr int cls = KC_FLOAT; };
template <> struct kt<DEV_I8> { typedef int8_t S; typedef int64_t C; static constexpr int cls = KC_INT; };
template <> struct kt<DEV_U8> { typedef uint8_t S; typedef int64_t C; static constexpr int cls = KC_INT; };
template <> struct kt<DEV_I32> { typedef int32_t S; typedef int64_t C; static constexpr int cls = KC_INT; };
template <> struct kt<DEV_I64> { typedef int64_t S; typedef int64_t C; static constexpr int cls = KC_INT; };
template <> struct kt<DEV_BOOL> { typedef uint8_t S; typedef int64_t C; static constexpr int cls = KC_INT; };

/* cpu_ops.c's load_d: every dtype, exactly, as double */
template <int T> KH double k_load_d(typename kt<T>::S s)
{
  if constexpr (T == DEV_F32) return sc_f2d(s);
  else if constexpr (T == DEV_F64) return s;
  else if constexpr (T == DEV_F16) return sc_f2d(sc_half_to_float(s));
  else if constexpr (T == DEV_BF16) return sc_f2d(sc_bf16_to_float(s));
  else if constexpr (T == DEV_BOOL) return s != 0;
  else return (double)s;
}

/* load_f: float-compute dtypes exactly, the others through double */
template <int T> KH float k_load_f(typename kt<T>::S s)
{
  if constexpr (T == DEV_F32) return s;
  else if constexpr (T == DEV_F16) return sc_half_to_float(s);
  else if constexpr (T == DEV_BF16) return sc_bf16_to_float(s);
  else return sc_d2f(k_load_d<T>(s));
}

/* load_i: integers exactly, bool as 0/1, floats saturated */
template <int T> KH int64_t k_load_i(typename kt<T>::S s)
{
  if constexpr (T == DEV_BOOL) return s != 0;
  else if constexpr (kt<T>::cls == KC_INT) return (int64_t)s;
  else return k_sat(k_load_d<T>(s), INT64_MIN, INT64_MAX);
}

/* store_d: every dtype; integers saturate, bool is v != 0 (NaN -> 1) */
template <int T> KH typename kt<T>::S k_store_d(double v)
{
  if constexpr (T == DEV_F32) return sc_d2f(v);
  else if constexpr (T == DEV_F64) return v;
  else if constexpr (T == DEV_F16) return sc_double_to_half(v);
  else if constexpr (T == DEV_BF16) return sc_double_to_bf16(v);
  else if constexpr (T == DEV_I8) return (int8_t)k_sat(v, INT8_MIN, INT8_MAX);
  else if constexpr (T == DEV_U8) return (uint8_t)k_sat(v, 0, UINT8_MAX);
  else if constexpr (T == DEV_I32) return (int32_t)k_sat(v, INT32_MIN, INT32_MAX);
  else if constexpr (T == DEV_I64) return k_sat(v, INT64_MIN, INT64_MAX);
  else return (uint8_t)(v != 0);
}

template <int T> KH typename kt<T>::S k_store_f(float v)
{
  if constexpr (T == DEV_F32) return v;
  else if constexpr (T == DEV_F16) return sc_float_to_half(v);
  else if constexpr (T == DEV_BF16) return sc_float_to_bf16(v);
  else return k_store_d<T>(sc_f2d(v));
}

/* store_i: integers wrap to the width; int64 -> bf16 goes through double */
template <int T> KH typename kt<T>::S k_store_i(int64_t v)
{
  if constexpr (T == DEV_F32) return (float)v;
  else if constexpr (T == DEV_F64) return (double)v;
  else if constexpr (T == DEV_F16) return sc_float_to_half((float)v);
  else if constexpr (T == DEV_BF16) return sc_double_to_bf16((double)v);
  else if constexpr (T == DEV_BOOL) return (uint8_t)(v != 0);
  else return (typename kt<T>::S)(uint64_t)v;
}

/* In and out of T's own compute type. */
template <int T> KH typename kt<T>::C k_load(typename kt<T>::S s)
{
  if constexpr (kt<T>::cls == KC_FLOAT) return k_load_f<T>(s);
  else if constexpr (kt<T>::cls == KC_DOUBLE) return s;
  else return k_load_i<T>(s);
}

template <int T> KH typename kt<T>::S k_store(typename kt<T>::C c)
{
  if constexpr (kt<T>::cls == KC_FLOAT) return k_store_f<T>(c);
  else if constexpr (kt<T>::cls == KC_DOUBLE) return c;
  else return k_store_i<T>(c);
}

KH int k_esize(int t)
{
  switch (t) {
  case DEV_F64: case DEV_I64: return 8;
  case DEV_F32: case DEV_I32: return 4;
  case DEV_F16: case DEV_BF16: return 2;
  default: return 1;
  }
}

/* Stores into a dtype known only at run time (reduction results). */
KH void k_store_d_rt(int t, char *p, double v)
{
  switch (t) {
  case DEV_F32: *(float *)p = k_store_d<DEV_F32>(v); break;
  case DEV_F64: *(double *)p = v; break;
  case DEV_F16: *(uint16_t *)p = k_store_d<DEV_F16>(v); break;
  case DEV_BF16: *(uint16_t *)p = k_store_d<DEV_BF16>(v); break;
  case DEV_I8: *(int8_t *)p = k_store_d<DEV_I8>(v); break;
  case DEV_U8: *(uint8_t *)p = k_store_d<DEV_U8>(v); break;
  case DEV_I32: *(int32_t *)p = k_store_d<DEV_I32>(v); break;
  case DEV_I64: *(int64_t *)p = k_store_d<DEV_I64>(v); break;
  case DEV_BOOL: *(uint8_t *)p = k_store_d<DEV_BOOL>(v); break;
  default: break;
  }
}

KH void k_store_i_rt(int t, char *p, int64_t v)
{
  switch (t) {
  case DEV_F32: *(float *)p = k_store_i<DEV_F32>(v); break;
  case DEV_F64: *(double *)p = k_store_i<DEV_F64>(v); break;
  case DEV_F16: *(uint16_t *)p = k_store_i<DEV_F16>(v); break;
  case DEV_BF16: *(uint16_t *)p = k_store_i<DEV_BF16>(v); break;
  case DEV_I8: *(int8_t *)p = k_store_i<DEV_I8>(v); break;
  case DEV_U8: *(uint8_t *)p = k_store_i<DEV_U8>(v); break;
  case DEV_I32: *(int32_t *)p = k_store_i<DEV_I32>(v); break;
  case DEV_I64: *(int64_t *)p = v; break;
  case DEV_BOOL: *(uint8_t *)p = k_store_i<DEV_BOOL>(v); break;
  default: break;
  }
}

KH double k_scalar_d(dev_scalar s) { return s.is_int ? (double)s.i : s.f; }

/* A scalar operand in T's compute type (the host's scalar_to): integer dtypes
 * take an integer scalar exactly; a float one, and anything for bool, goes
 * through T's store rule. */
template <int T> KH typename kt<T>::C k_scalar(dev_scalar s)
{
  if constexpr (kt<T>::cls == KC_FLOAT) return sc_d2f(k_scalar_d(s));
  else if constexpr (kt<T>::cls == KC_DOUBLE) return k_scalar_d(s);
  else {
    if (s.is_int && T != DEV_BOOL) return s.i;
    return k_load_i<T>(s.is_int ? k_store_i<T>(s.i) : k_store_d<T>(s.f));
  }
}

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

/* ---- the ops of ops.h ------------------------------------------------------ */

/* A dtype's class bit (DEV_CLS_*), for the table's classes column. */
template <int T> constexpr unsigned k_class()
{
  return T == DEV_BOOL ? DEV_CLS_B : kt<T>::cls == KC_INT ? DEV_CLS_I : DEV_CLS_F;
}

/* kun<OP>::f(x), kbin<OP>::f(a, b), kter<OP>::f(a, b, c): the row's scalar
 * function for the compute type of x (float, double, int64); classes,
 * to_bool and flags are the row's columns.  Integer division by zero gives
 * 0: the kernels report it. */
template <int OP> struct kun;
template <int OP> struct kbin;
template <int OP> struct kter;
#define K_UNOP(E, name, cls, res, fl)                                                  \
  template <> struct kun<DEV_UN_##E> {                                                  \
    static constexpr unsigned classes = DEV_CLASSES(cls);                               \
    static constexpr bool to_bool = DEV_RESULT(res);                                    \
    DEV_IF_F(cls, static KH auto f(float x) { return sc_##name##_f(x); }                \
                  static KH auto f(double x) { return sc_##name##_d(x); })              \
    DEV_IF_I(cls, static KH auto f(int64_t x) { return sc_##name##_i(x); })             \
  };
#define K_BINOP(E, name, cls, res, fl)                                                 \
  template <> struct kbin<DEV_BIN_##E> {                                                \
    static constexpr unsigned classes = DEV_CLASSES(cls);                               \
    static constexpr bool to_bool = DEV_RESULT(res);                                    \
    static constexpr unsigned flags = fl;                                               \
    DEV_IF_F(cls, static KH auto f(float a, float b) { return sc_##name##_f(a, b); }    \
                  static KH auto f(double a, double b) { return sc_##name##_d(a, b); }) \
    DEV_IF_I(cls, static KH auto f(int64_t a, int64_t b) { return sc_##name##_i(a, b); }) \
  };
#define K_TEROP(E, name, cls, res, fl)                                                          \
  template <> struct kter<DEV_TER_##E> {                                                         \
    static constexpr unsigned classes = DEV_CLASSES(cls);                                        \
    static constexpr unsigned flags = fl;                                                        \
    DEV_IF_F(cls, static KH auto f(float a, float b, float c) { return sc_##name##_f(a, b, c); }  \
                  static KH auto f(double a, double b, double c) { return sc_##name##_d(a, b, c); }) \
    DEV_IF_I(cls, static KH auto f(int64_t a, int64_t b, int64_t c) { return sc_##name##_i(a, b, c); }) \
  };
DEV_UNARY_OPS(K_UNOP)
DEV_BINARY_OPS(K_BINOP)
DEV_TERNARY_OPS(K_TEROP)
#undef K_UNOP
#undef K_BINOP
#undef K_TEROP

/* The cast of UNARY/COPY between different dtypes: integer sources stay
 * exact as int64, every float is exact in double. */
template <int TI, int TO> KH typename kt<TO>::S k_cast(typename kt<TI>::S s)
{
  if constexpr (kt<TI>::cls == KC_INT) return k_store_i<TO>(k_load_i<TI>(s));
  /* a float is exact in double, so rounding it once from float is the same */
  else if constexpr (kt<TI>::cls == KC_FLOAT && kt<TO>::cls == KC_FLOAT) return k_store_f<TO>(k_load_f<TI>(s));
  else return k_store_d<TO>(k_load_d<TI>(s));
}

/* ---- strided views ------------------------------------------------------- */

/* A dev_view as kernels take it, by value: dims of size 1 dropped and dims
 * that nest exactly merged (as the host's walk), so a contiguous view is one
 * run and its element offset is the flat index. */
typedef struct kview {
  char *p;                     /* element 0 */
  int64_t shape[DEV_MAXDIM];
  int64_t stride[DEV_MAXDIM];  /* in elements */
  int ndim;                    /* >= 1 */
  int dtype;
  int contig;                  /* offset == flat index */
  int small;                   /* numel < 2^32: 32-bit index arithmetic */
} kview;

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

/* Element offset of flat (C order) index i. */
KH int64_t k_off(const kview &v, int64_t i)
{
  int64_t off = 0;
  if (v.contig) return i;
  if (v.small) {
    uint32_t j = (uint32_t)i;
K_UNROLL
    for (int d = DEV_MAXDIM - 1; d > 0; d--) {
      if (d < v.ndim) {
        uint32_t s = (uint32_t)v.shape[d], q = j / s;
        off += (int64_t)(j - q * s) * v.stride[d];
        j = q;
      }
    }
    return off + (int64_t)j * v.stride[0];
  }
K_UNROLL
  for (int d = DEV_MAXDIM - 1; d > 0; d--) {
    if (d < v.ndim) {
      int64_t s = v.shape[d], q = i / s;
      off += (i - q * s) * v.stride[d];
      i = q;
    }
  }
  return off + i * v.stride[0];
}

template <typename S> KH S *k_at(const kview &v, int64_t i) { return (S *)v.p + k_off(v, i); }

/* 16 bytes of S, for vector loads and stores of contiguous runs. */
template <typename S> union kvec {
  uint4 u;
  S x[16 / sizeof(S)];
};

/* n elements of S as one aligned load or store (n * sizeof(S) of 2..16). */
template <typename S, int N> struct alignas(sizeof(S) * N) kpack {
  S x[N];
};

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
