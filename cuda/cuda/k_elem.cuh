/* The element layer of the CUDA kernels: dtypes in and out of their compute
 * types, number operands, the ops of ops.h as templates (kun, kbin, kter),
 * casts and strided-view offsets.  Included by k_common.cuh for the built-in
 * kernels, and compiled by NVRTC into the kernels of fused programs
 * (fgen.c), with the same headers: a fused program's each op is, bit for
 * bit, the built-in op's element function.  So nothing here may need a
 * host-only header; under NVRTC (__CUDACC_RTC__) the C headers it includes
 * are the small stand-ins of fgen.c.
 */
#ifndef GPULUA_K_ELEM_CUH
#define GPULUA_K_ELEM_CUH

#include <limits.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* device.h is C and has no extern "C" of its own (kernels.h includes it
 * outside its block): included here first, its functions link as C. */
extern "C" {
#include "device.h"
}
#include "scalar.h"

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

/* k_load<T>(k_store<T>(c)): c rounded to T and back in T's compute type,
 * as an op that stores its result and the next op that loads it see it.
 * Fused kernels (fgen.c) keep each node's value so.  For bf16 and f16 the
 * hardware's conversions alone, without the store's and the load's NaN
 * cases (which keep a NaN's payload bits): a NaN stays a NaN, of whatever
 * payload.  Those cases cost a bf16 GELU of 9 fused ops a third of its
 * speed (bench/RESULTS.md, 2026-11-29). */
template <int T> KH typename kt<T>::C k_round(typename kt<T>::C c)
{
  if constexpr (T == DEV_F32 || T == DEV_F64 || T == DEV_I64) {
    return c;
  }
#ifdef __CUDA_ARCH__
  else if constexpr (T == DEV_BF16) {
    return __bfloat162float(__float2bfloat16_rn(c));
  } else if constexpr (T == DEV_F16) {
    return __half2float(__float2half_rn(c));
  }
#endif
  else {
    return k_load<T>(k_store<T>(c));
  }
}

/* k_round of two values at once: for bf16 and f16 one packed conversion
 * each way, as two of k_round's (the same rounding, to nearest even). */
template <int T> KH void k_round2(typename kt<T>::C &a, typename kt<T>::C &b)
{
#ifdef __CUDA_ARCH__
  if constexpr (T == DEV_BF16) {
    float2 f = __bfloat1622float2(__floats2bfloat162_rn(a, b));
    a = f.x;
    b = f.y;
    return;
  } else if constexpr (T == DEV_F16) {
    float2 f = __half22float2(__floats2half2_rn(a, b));
    a = f.x;
    b = f.y;
    return;
  }
#endif
  a = k_round<T>(a);
  b = k_round<T>(b);
}

/* ---- bf16 and f16 pairs: exact shortcuts of fused kernels (fgen.c) -----
 * A fused program's op whose result is bf16 or f16 computes in float and
 * rounds (k_round2).  Where that rounding makes a cheaper way exact,
 * fgen.c's contiguous kernel takes it, and keeps each such node also as a
 * packed pair (kp2<T>), unpacked only for the ops that read floats.
 * Device-only: the built-in kernels never call these.  Why each is exact:
 * docs/internals.md, "bf16 and f16 pairs". */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KD __device__ __forceinline__

/* The packed type of T (bf16 or f16) and its intrinsics. */
template <int T> struct kp16;
template <> struct kp16<DEV_BF16> {
  typedef __nv_bfloat162 P;
  typedef __nv_bfloat16 H;
  static KD P cvt(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static KD P join(H a, H b) { return __halves2bfloat162(a, b); }
  static KD H lo(P p) { return __low2bfloat16(p); }
  static KD H hi(P p) { return __high2bfloat16(p); }
  static KD H of(uint16_t u) { return __ushort_as_bfloat16(u); }
  static KD uint16_t bits(H h) { return __bfloat16_as_ushort(h); }
  static KD float f(H h) { return __bfloat162float(h); }
  /* the halves as floats: a bf16's float is its bits in the high half, so
   * one integer op each, not an extraction and a conversion */
  static KD float flo(P p) { return __uint_as_float(*reinterpret_cast<const uint32_t *>(&p) << 16); }
  static KD float fhi(P p) { return __uint_as_float(*reinterpret_cast<const uint32_t *>(&p) & 0xffff0000u); }
  /* the _rn forms: an explicit rounding, never contracted into an FMA */
  static KD P add(P a, P b) { return __hadd2_rn(a, b); }
  static KD P sub(P a, P b) { return __hsub2_rn(a, b); }
  static KD P mul(P a, P b) { return __hmul2_rn(a, b); }
};
template <> struct kp16<DEV_F16> {
  typedef __half2 P;
  typedef __half H;
  static KD P cvt(float a, float b) { return __floats2half2_rn(a, b); }
  static KD P join(H a, H b) { return __halves2half2(a, b); }
  static KD H lo(P p) { return __low2half(p); }
  static KD H hi(P p) { return __high2half(p); }
  static KD H of(uint16_t u) { return __ushort_as_half(u); }
  static KD uint16_t bits(H h) { return __half_as_ushort(h); }
  static KD float f(H h) { return __half2float(h); }
  static KD float flo(P p) { return __low2float(p); }
  static KD float fhi(P p) { return __high2float(p); }
  static KD P add(P a, P b) { return __hadd2_rn(a, b); }
  static KD P sub(P a, P b) { return __hsub2_rn(a, b); }
  static KD P mul(P a, P b) { return __hmul2_rn(a, b); }
};
template <int T> using kp2 = typename kp16<T>::P;

template <int T> KD uint32_t k_p2_u(kp2<T> h) { return *reinterpret_cast<const uint32_t *>(&h); }

/* One element of a pair: a float where an op reads it, its own bits where
 * it is stored (k_store below), not the float store's NaN test and
 * conversion: the same bits (a packed op's NaN is the canonical one, as the
 * float store makes of the float ops' NaN).  bf16 keeps the float itself
 * (its bits are the element's, shifted: no rounding, NaNs included); f16
 * its half, converted where read. */
template <int T> struct kp1;
template <> struct kp1<DEV_BF16> {
  float f;
  KD operator float() const { return f; }
  KD uint16_t bits() const { return (uint16_t)(__float_as_uint(f) >> 16); }
};
template <> struct kp1<DEV_F16> {
  __half h;
  KD operator float() const { return __half2float(h); }
  KD uint16_t bits() const { return __half_as_ushort(h); }
};
template <int T> KD kp1<T> k_p2_lo(kp2<T> h)
{
  if constexpr (T == DEV_BF16) return kp1<T>{kp16<T>::flo(h)};
  else return kp1<T>{kp16<T>::lo(h)};
}
template <int T> KD kp1<T> k_p2_hi(kp2<T> h)
{
  if constexpr (T == DEV_BF16) return kp1<T>{kp16<T>::fhi(h)};
  else return kp1<T>{kp16<T>::hi(h)};
}

/* k_store of a kp1: an exact match, so chosen over k_store(float) */
template <int T, int U> KD typename kt<T>::S k_store(kp1<U> v)
{
  if constexpr (T == U) return v.bits();
  else return k_store<T>((typename kt<T>::C)(float)v);
}

/* a pair's elements into two stored values (a low, b high): b is the
 * element after a, and a 4-byte aligned (fgen.c's calls: two elements j,
 * j + 1 of a 16-byte pack, j even), so one 32-bit word.  (Apart, the
 * compiler unpacks the word and packs it again.) */
template <int T> KD void k_p2_put(uint16_t &a, uint16_t &b, kp2<T> h)
{
  (void)b;
  *reinterpret_cast<kp2<T> *>(&a) = h;
}

/* two stored values as a pair (a low, b high) */
template <int T> KD kp2<T> k_p2_bits(uint16_t a, uint16_t b) { return kp16<T>::join(kp16<T>::of(a), kp16<T>::of(b)); }

/* whether a number (a kernel parameter) is exactly a T value */
template <int T> KD bool k_p2_exact(float f) { return f == f && (float)kp16<T>::f(kp16<T>::lo(kp16<T>::cvt(f, f))) == f; }

/* a number exactly representable in T, in both halves; two floats that
 * hold T values, packed (exactly) */
template <int T> KD kp2<T> k_p2_num(float f) { return kp16<T>::cvt(f, f); }
template <int T> KD kp2<T> k_p2_pack(float a, float b) { return kp16<T>::cvt(a, b); }

/* k_round2<T>, keeping the packed pair */
template <int T> KD kp2<T> k_p2_round(float &a, float &b)
{
  kp2<T> h = kp16<T>::cvt(a, b);
  a = kp16<T>::flo(h);
  b = kp16<T>::fhi(h);
  return h;
}

/* + - x of two T pairs, rounded once to T: the float op rounded to T, bit
 * for bit (float's 24 bits >= 2 p + 2 for bf16's p = 8 and f16's 11: its
 * rounding before T's is innocuous; a product of two T values is exact in
 * float). */
template <int T> KD kp2<T> k_p2_add(kp2<T> a, kp2<T> b) { return kp16<T>::add(a, b); }
template <int T> KD kp2<T> k_p2_sub(kp2<T> a, kp2<T> b) { return kp16<T>::sub(a, b); }
template <int T> KD kp2<T> k_p2_mul(kp2<T> a, kp2<T> b) { return kp16<T>::mul(a, b); }

KD float k_ex2_approx(float x)
{
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

KD float k_rcp_approx(float x)
{
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/* tanh(t) for t >= 0: 1 - 2 / (2^(2 t log2 e) + 1), from ex2.approx (2
 * ulp) and rcp.approx (1 ulp); t = inf gives 1.  Within 2^-20.5 absolute
 * of tanh for t >= 2^-6 (docs/internals.md). */
KD float k_tanh_pos(float t)
{
  float e = k_ex2_approx(t * 2.88539004f);
  return __fmaf_rn(-2.0f, k_rcp_approx(e + 1.0f), 1.0f);
}

/* tanh of a bf16 pair h, rounded to bf16: the bf16 rounding of tanhf
 * (sc_tanh_f, the unfused op), bit for bit, with no test and no fallback.
 * |x| < 2^-6: x itself (tanhf(x) is within |x|^3 / 3 + 2 ulp of x, far
 * less than half the gap to the bf16 value below x; -0 and the subnormals
 * included).  Larger |x|: k_tanh_pos(|x|), whose bf16 rounding is tanhf's
 * for every one of the 17152 finite bf16 values there and inf, under
 * those error bounds: an exhaustive check (docs/internals.md,
 * tests/fuse_tanh_bf16.lua).
 * |x| is x's bits less the sign, and the sign goes back into the packed
 * result: tanh is odd, rounding to nearest symmetric.  A NaN stays a NaN. */
KD kp2<DEV_BF16> k_p2_tanh_bf16(kp2<DEV_BF16> h)
{
  uint32_t u = k_p2_u<DEV_BF16>(h), m = u & 0x7fff7fffu;
  float ta = __uint_as_float(m << 16), tb = __uint_as_float(m & 0xffff0000u);
  ta = ta < 0x1p-6f ? ta : k_tanh_pos(ta);
  tb = tb < 0x1p-6f ? tb : k_tanh_pos(tb);
  uint32_t r = k_p2_u<DEV_BF16>(kp16<DEV_BF16>::cvt(ta, tb)) | (u & 0x80008000u);
  return *reinterpret_cast<const kp2<DEV_BF16> *>(&r);
}

/* exp(x) for a bf16 or f16 x, |x| < 80, within 2^-20.5 relative of
 * expf(x) (2 ulp): 2^(x L) as 2^(x Lh) (x Lh exact: at most 11 by 13
 * significant bits, from ex2.approx, 2 ulp) times 2^(x Ll) = 1 + t +
 * t^2/2 + t^3/6 (|t| < 2^-8). */
KD float k_exp_near(float x)
{
  float t = x * 4.7194842e-5f;   /* (log2 e - Lh) ln 2, Lh = 5909 / 4096 */
  float p = __fmaf_rn(__fmaf_rn(__fmaf_rn(t, 0x1.555556p-3f, 0.5f), t, 1.0f), t, 1.0f);
  return k_ex2_approx(x * 1.442626953125f) * p;
}

/* exp of a pair, rounded to T.  Rounding is monotone, so when y - b and
 * y + b round to the same T value, expf(x), between them, rounds to it
 * too (b = 2^-19 |y|); else (rare: a rounding boundary within b) the
 * accurate function, as for |x| >= 80 or NaN (results out of
 * ex2.approx.ftz's range). */
template <int T> KD kp2<T> k_p2_exp(float a, float b)
{
  float ya = k_exp_near(a), yb = k_exp_near(b);
  const float dn = 1.0f - 0x1p-19f, up = 1.0f + 0x1p-19f;
  kp2<T> lo = kp16<T>::cvt(ya * dn, yb * dn), hi = kp16<T>::cvt(ya * up, yb * up);
  if (k_p2_u<T>(lo) == k_p2_u<T>(hi) && fabsf(a) < 80.0f && fabsf(b) < 80.0f) return lo;
  return kp16<T>::cvt(sc_exp_f(a), sc_exp_f(b));
}
#undef KD
#endif

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

#endif
