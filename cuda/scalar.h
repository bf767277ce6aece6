/* The scalar arithmetic of the built-in ops, compiled as C for the host
 * (cpu_ops.c, dtype.c) and as CUDA for the kernels (cuda/k_common.cuh): the
 * f16/bf16 conversions, Philox, and one function per op of ops.h and compute
 * type.  Compute types: float for f32/f16/bf16, double for f64, int64 for the
 * integers and bool.
 *
 * An op's float formula is written once, in a SC_FLOAT* macro that makes its
 * float (sc_<name>_f) and double (sc_<name>_d) functions: the math functions
 * it calls are type-generic (<tgmath.h> in C, the float overloads in CUDA),
 * so keep the literals integers (1, not 1.0) or the float version computes in
 * double.  Integer formulas (sc_<name>_i) wrap in two's complement through
 * uint64.  Comparisons and logical ops return int 0/1.
 */
#ifndef GPULUA_SCALAR_H
#define GPULUA_SCALAR_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define GPULUA_HD static __host__ __device__ __forceinline__
#else
#include <math.h>
#include <tgmath.h>
#define GPULUA_HD static inline
#endif

/* ---- bits ------------------------------------------------------------- */

GPULUA_HD uint32_t sc_f2u(float f)
{
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GPULUA_HD float sc_u2f(uint32_t u)
{
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

GPULUA_HD uint64_t sc_d2u(double d)
{
#ifdef __CUDA_ARCH__
  return (uint64_t)__double_as_longlong(d);
#else
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
#endif
}

GPULUA_HD double sc_u2d(uint64_t u)
{
#ifdef __CUDA_ARCH__
  return __longlong_as_double((long long)u);
#else
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
#endif
}

/* Two's-complement wrapping without relying on implementation-defined casts. */
GPULUA_HD int64_t sc_wrap64(uint64_t u)
{
  return u <= INT64_MAX ? (int64_t)u : -(int64_t)~u - 1;
}

/* ---- float <-> double, NaNs as on x86 ------------------------------------ */
/* A GPU's cvt makes canonical NaNs; x86 keeps the top payload bits and sets
 * the quiet bit.  These give x86's bits everywhere (on the host they are
 * plain casts). */

GPULUA_HD double sc_f2d(float f)
{
  if (f != f) {
    uint32_t u = sc_f2u(f);
    return sc_u2d((uint64_t)(u & 0x80000000u) << 32 | 0x7ff8000000000000ull | (uint64_t)(u & 0x7fffff) << 29);
  }
  return (double)f;
}

GPULUA_HD float sc_d2f(double d)
{
  if (d != d) {
    uint64_t u = sc_d2u(d);
    return sc_u2f(((uint32_t)(u >> 32) & 0x80000000u) | 0x7fc00000u | ((uint32_t)(u >> 29) & 0x7fffff));
  }
  return (float)d;
}

/* ---- f16 and bf16, round to nearest even -------------------------------- */
/* On the host, branch-light (after F. Giesen's "half <-> float" notes): the
 * FPU does the renormalising and rounding of subnormals.  On the GPU, its
 * conversion instructions, which round the same; a NaN takes the host's path
 * (quiet, the payload's top bits kept) where the instruction makes a
 * canonical one. */

/* Exact; a NaN comes back quiet with its payload. */
GPULUA_HD float sc_half_to_float(uint16_t h)
{
#ifdef __CUDA_ARCH__
  if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
    return sc_u2f((uint32_t)(h & 0x8000) << 16 | 0x7fc00000u | (uint32_t)(h & 0x3ff) << 13);
  return __half2float(__ushort_as_half(h));
#else
  uint32_t em = (uint32_t)(h & 0x7fff) << 13, e = em & 0x0f800000, b = em + (112u << 23);
  if (e == 0x0f800000) {          /* inf or NaN: exponent all ones, NaN made quiet */
    b += 112u << 23;
    if (em & 0x7fffff) b |= 0x400000;
  } else if (em == 0) {
    b = 0;
  } else if (e == 0) {            /* subnormal: 2^-14 * (1 + m/1024) - 2^-14 */
    b += 1u << 23;
    b = sc_f2u(sc_u2f(b) - 0x1p-14f);
  }
  return sc_u2f(b | (uint32_t)(h & 0x8000) << 16);
#endif
}

GPULUA_HD uint16_t sc_float_to_half(float f)
{
#ifdef __CUDA_ARCH__
  if (f != f) {
    uint32_t a = sc_f2u(f);
    return (uint16_t)((a >> 16 & 0x8000) | 0x7e00 | (a >> 13 & 0x3ff));
  }
  return __half_as_ushort(__float2half_rn(f));
#else
  uint32_t b = sc_f2u(f), a = b & 0x7fffffff;
  uint16_t sign = (uint16_t)(b >> 16 & 0x8000);
  if (a >= 0x47800000)            /* 2^16 and up: inf, or NaN kept quiet with its top payload */
    return sign | (a > 0x7f800000 ? 0x7e00 | (a >> 13 & 0x3ff) : 0x7c00);
  if (a < 0x38800000) {           /* below 2^-14: half subnormal or zero */
    /* adding 0.5 leaves the value in units of 2^-24 at the bottom of the
     * mantissa, rounded to nearest even by the FPU */
    a = sc_f2u(sc_u2f(a) + 0.5f);
    return sign | (uint16_t)(a - 0x3f000000);
  }
  /* rebias the exponent and round the 13 dropped bits to nearest even; a
   * carry walks into the exponent, so 65520 and up become inf */
  a += 0xfff + (a >> 13 & 1) - (112u << 23);
  return sign | (uint16_t)(a >> 13);
#endif
}

GPULUA_HD float sc_bf16_to_float(uint16_t h)
{
  uint32_t b = (uint32_t)h << 16;
  if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) b |= 0x400000;   /* quiet NaN */
  return sc_u2f(b);
}

GPULUA_HD uint16_t sc_float_to_bf16(float f)
{
  uint32_t b = sc_f2u(f);
  if ((b & 0x7f800000) == 0x7f800000 && (b & 0x7fffff))
    return (uint16_t)(b >> 16 | 0x40);
#ifdef __CUDA_ARCH__
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  /* Same exponent range as float: rounding the low 16 bits away is all there is;
   * a carry walks into the exponent and reaches inf on overflow. */
  b += 0x7fff + (b >> 16 & 1);
  return (uint16_t)(b >> 16);
#endif
}

/* double -> float rounded to odd.  Float keeps more than two extra bits over
 * f16 and bf16, so rounding that result to nearest even again gives exactly
 * the direct double -> f16/bf16 rounding (no double-rounding error). */
GPULUA_HD float sc_round_odd(double x)
{
  float f = sc_d2f(x);
  uint32_t b;
  if ((double)f == x || x != x) return f;
  b = sc_f2u(f);
  if (fabs((double)f) > fabs(x)) b--;   /* truncate toward zero (inf -> FLT_MAX) */
  return sc_u2f(b | 1);
}

GPULUA_HD uint16_t sc_double_to_half(double x)
{
#ifdef __CUDA_ARCH__
  if (x == x) return __half_as_ushort(__double2half(x));
#endif
  return sc_float_to_half(sc_round_odd(x));
}

GPULUA_HD uint16_t sc_double_to_bf16(double x)
{
#ifdef __CUDA_ARCH__
  if (x == x) return __bfloat16_as_ushort(__double2bfloat16(x));
#endif
  return sc_float_to_bf16(sc_round_odd(x));
}

/* ---- Philox-4x32-10 (Salmon et al., SC'11), as in Random123 and cuRAND ---- */

GPULUA_HD void sc_philox(uint64_t seed, uint64_t counter, uint32_t out[4])
{
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* 53 random bits from two words, as a double in (0, 1). */
GPULUA_HD double sc_unit53(uint32_t hi, uint32_t lo)
{
  return ((double)((uint64_t)(hi >> 5) << 26 | lo >> 6) + 0.5) * 0x1p-53;
}

/* The next f16/bf16 value toward -inf, by bits (+-0 -> the smallest negative). */
GPULUA_HD uint16_t sc_step_down16(uint16_t h)
{
  if ((h & 0x7fff) == 0) return 0x8001;
  return (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

/* ---- integer helpers -------------------------------------------------- */

/* Floor division (Lua's //); b == -1 negates so INT_MIN // -1 wraps.  b != 0. */
GPULUA_HD int64_t sc_floordiv(int64_t a, int64_t b)
{
  int64_t q;
  if (b == -1) return sc_wrap64(0 - (uint64_t)a);
  q = a / b;
  if (a % b != 0 && (a < 0) != (b < 0)) q--;
  return q;
}

GPULUA_HD int64_t sc_ipow(int64_t a, int64_t e)
{
  uint64_t r = 1, base = (uint64_t)a;
  if (e < 0) return a == 1 ? 1 : a == -1 ? (e % 2 != 0 ? -1 : 1) : 0;
  for (; e > 0; e >>= 1) {
    if (e & 1) r *= base;
    base *= base;
  }
  return sc_wrap64(r);
}

/* Truncated division's remainder (C's %); b != 0.  b == -1 gives 0, where
 * INT_MIN % -1 would trap. */
GPULUA_HD int64_t sc_imod(int64_t a, int64_t b)
{
  return b == -1 ? 0 : a % b;
}

/* Floored remainder (Lua's integer %): the sign of b; b != 0. */
GPULUA_HD int64_t sc_imodf(int64_t a, int64_t b)
{
  int64_t m = sc_imod(a, b);
  return m != 0 && (m < 0) != (b < 0) ? m + b : m;
}

/* ---- the ops of ops.h ---------------------------------------------------- */

/* One float formula, two functions; C is the compute type inside. */
#define SC_FLOAT1(name, x, expr)                                              \
  GPULUA_HD float sc_##name##_f(float x) { typedef float C; (void)sizeof(C); return (expr); }   \
  GPULUA_HD double sc_##name##_d(double x) { typedef double C; (void)sizeof(C); return (expr); }
#define SC_FLOAT2(name, a, b, expr)                                                              \
  GPULUA_HD float sc_##name##_f(float a, float b) { typedef float C; (void)sizeof(C); return (expr); } \
  GPULUA_HD double sc_##name##_d(double a, double b) { typedef double C; (void)sizeof(C); return (expr); }
#define SC_FLOAT3(name, a, b, c, expr)                                                                          \
  GPULUA_HD float sc_##name##_f(float a, float b, float c) { typedef float C; (void)sizeof(C); return (expr); }   \
  GPULUA_HD double sc_##name##_d(double a, double b, double c) { typedef double C; (void)sizeof(C); return (expr); }
/* The same with a body of statements (that returns) instead of an expression. */
#define SC_FLOAT2S(name, a, b, ...)                                                                       \
  GPULUA_HD float sc_##name##_f(float a, float b) { typedef float C; (void)sizeof(C); __VA_ARGS__ }       \
  GPULUA_HD double sc_##name##_d(double a, double b) { typedef double C; (void)sizeof(C); __VA_ARGS__ }
#define SC_FLOAT3S(name, a, b, c, ...)                                                                           \
  GPULUA_HD float sc_##name##_f(float a, float b, float c) { typedef float C; (void)sizeof(C); __VA_ARGS__ }      \
  GPULUA_HD double sc_##name##_d(double a, double b, double c) { typedef double C; (void)sizeof(C); __VA_ARGS__ }
#define SC_INT1(name, x, expr) GPULUA_HD int64_t sc_##name##_i(int64_t x) { return (expr); }
#define SC_INT2(name, a, b, expr) GPULUA_HD int64_t sc_##name##_i(int64_t a, int64_t b) { return (expr); }
#define SC_INT3(name, a, b, c, expr) \
  GPULUA_HD int64_t sc_##name##_i(int64_t a, int64_t b, int64_t c) { return (expr); }
/* A bool result (0/1), the same formula for every compute type. */
#define SC_BOOL1(name, x, expr)                                      \
  GPULUA_HD int sc_##name##_f(float x) { return (expr); }            \
  GPULUA_HD int sc_##name##_d(double x) { return (expr); }           \
  GPULUA_HD int sc_##name##_i(int64_t x) { return (expr); }
/* A bool result, one formula for floats and one for integers. */
#define SC_BOOL1FI(name, x, fexpr, iexpr)                            \
  GPULUA_HD int sc_##name##_f(float x) { return (fexpr); }           \
  GPULUA_HD int sc_##name##_d(double x) { return (fexpr); }          \
  GPULUA_HD int sc_##name##_i(int64_t x) { (void)x; return (iexpr); }
#define SC_BOOL2(name, a, b, expr)                                   \
  GPULUA_HD int sc_##name##_f(float a, float b) { return (expr); }   \
  GPULUA_HD int sc_##name##_d(double a, double b) { return (expr); } \
  GPULUA_HD int sc_##name##_i(int64_t a, int64_t b) { return (expr); }

/* unary; integers: negation wraps, so abs(INT_MIN) stays INT_MIN once stored */
SC_FLOAT1(neg, x, -x)
SC_INT1(neg, x, sc_wrap64(0 - (uint64_t)x))
SC_FLOAT1(abs, x, fabs(x))
SC_INT1(abs, x, x < 0 ? sc_wrap64(0 - (uint64_t)x) : x)
SC_FLOAT1(exp, x, exp(x))
SC_FLOAT1(log, x, log(x))
SC_FLOAT1(sqrt, x, sqrt(x))
SC_FLOAT1(relu, x, x > 0 || x != x ? x : 0)
SC_INT1(relu, x, x < 0 ? 0 : x)
SC_FLOAT1(sigmoid, x, 1 / (1 + exp(-x)))
SC_FLOAT1(tanh, x, tanh(x))
SC_BOOL1(logical_not, x, x == 0)
/* rounding: round is half to even (as NumPy's); integers are already whole */
SC_FLOAT1(floor, x, floor(x))
SC_INT1(floor, x, x)
SC_FLOAT1(ceil, x, ceil(x))
SC_INT1(ceil, x, x)
SC_FLOAT1(round, x, rint(x))
SC_INT1(round, x, x)
SC_FLOAT1(trunc, x, trunc(x))
SC_INT1(trunc, x, x)
/* sign: -1, 0 or 1 (-0 too gives 0, as NumPy's); NaN stays NaN */
SC_FLOAT1(sign, x, x > 0 ? 1 : x < 0 ? -1 : x != x ? x : 0)
SC_INT1(sign, x, (x > 0) - (x < 0))
SC_FLOAT1(sin, x, sin(x))
SC_FLOAT1(cos, x, cos(x))
SC_FLOAT1(rsqrt, x, 1 / sqrt(x))
SC_FLOAT1(square, x, x * x)
SC_INT1(square, x, sc_wrap64((uint64_t)x * (uint64_t)x))
/* the C library's functions (CUDA's on the GPU: a few ulps apart at most) */
SC_FLOAT1(log1p, x, log1p(x))
SC_FLOAT1(expm1, x, expm1(x))
SC_FLOAT1(log2, x, log2(x))
SC_FLOAT1(log10, x, log10(x))
SC_FLOAT1(exp2, x, exp2(x))
SC_FLOAT1(tan, x, tan(x))
SC_FLOAT1(asin, x, asin(x))
SC_FLOAT1(acos, x, acos(x))
SC_FLOAT1(atan, x, atan(x))
SC_FLOAT1(sinh, x, sinh(x))
SC_FLOAT1(cosh, x, cosh(x))
SC_FLOAT1(erf, x, erf(x))
SC_FLOAT1(reciprocal, x, 1 / x)
/* gelu: PyTorch's exact form x/2 * (1 + erf(x/sqrt 2)), written with erfc,
 * which keeps the negative tail (1 + erf loses it to cancellation); x/2 first,
 * so that a huge x does not overflow */
SC_FLOAT1(gelu, x, x / 2 * erfc(-x * (C)0.70710678118654752440))
/* silu: x * sigmoid(x); softplus: PyTorch's beta 1, threshold 20 */
SC_FLOAT1(silu, x, x / (1 + exp(-x)))
SC_FLOAT1(softplus, x, x > 20 ? x : log1p(exp(x)))
/* x - x is NaN for inf and NaN, 0 for the rest; integers and bool are
 * never NaN or inf */
SC_BOOL1FI(isnan, x, x != x, 0)
SC_BOOL1FI(isinf, x, x == x && x - x != x - x, 0)
SC_BOOL1FI(isfinite, x, x - x == x - x, 1)

/* binary; max/min propagate NaN: a NaN on either side wins.  Integer
 * division by zero gives 0 here; the loops around it report it. */
SC_FLOAT2(add, a, b, a + b)
SC_INT2(add, a, b, sc_wrap64((uint64_t)a + (uint64_t)b))
SC_FLOAT2(sub, a, b, a - b)
SC_INT2(sub, a, b, sc_wrap64((uint64_t)a - (uint64_t)b))
SC_FLOAT2(mul, a, b, a * b)
SC_INT2(mul, a, b, sc_wrap64((uint64_t)a * (uint64_t)b))
SC_FLOAT2(div, a, b, a / b)
SC_INT2(div, a, b, b == 0 ? 0 : sc_floordiv(a, b))
SC_FLOAT2(pow, a, b, pow(a, b))
SC_INT2(pow, a, b, sc_ipow(a, b))
SC_FLOAT2(max, a, b, a > b || a != a ? a : b)
SC_INT2(max, a, b, a > b ? a : b)
SC_FLOAT2(min, a, b, a < b || a != a ? a : b)
SC_INT2(min, a, b, a < b ? a : b)
/* comparisons: NaN is unordered (only ne holds); logical ops: nonzero is true */
SC_BOOL2(eq, a, b, a == b)
SC_BOOL2(ne, a, b, a != b)
SC_BOOL2(lt, a, b, a < b)
SC_BOOL2(le, a, b, a <= b)
SC_BOOL2(gt, a, b, a > b)
SC_BOOL2(ge, a, b, a >= b)
SC_BOOL2(logical_and, a, b, a != 0 && b != 0)
SC_BOOL2(logical_or, a, b, a != 0 || b != 0)
/* fmod: C's, the sign of a.  remainder: Lua's % and NumPy's remainder, the
 * sign of b (a - floor(a/b)*b, computed from fmod, which is exact); a zero
 * takes b's sign, as NumPy's.  floor_divide: Lua's //, floor(a/b) (NumPy's
 * floor_divide rounds (a - fmod(a, b)) / b instead: 1 // 0.1 is 10 here, 9
 * there). */
SC_FLOAT2(fmod, a, b, fmod(a, b))
SC_INT2(fmod, a, b, b == 0 ? 0 : sc_imod(a, b))
SC_FLOAT2S(remainder, a, b,
  C m = fmod(a, b);
  if (m == 0) return copysign((C)0, b);
  return (m < 0) != (b < 0) ? m + b : m;)
SC_INT2(remainder, a, b, b == 0 ? 0 : sc_imodf(a, b))
SC_FLOAT2(floor_divide, a, b, floor(a / b))
SC_INT2(floor_divide, a, b, b == 0 ? 0 : sc_floordiv(a, b))
SC_FLOAT2(atan2, a, b, atan2(a, b))
SC_FLOAT2(hypot, a, b, hypot(a, b))
/* leaky_relu(x, slope): PyTorch's, x > 0 ? x : x * slope (NaN stays NaN) */
SC_FLOAT2(leaky_relu, x, s, x > 0 ? x : x * s)

/* ternary; where's condition arrives as 0/1 in the compute type */
SC_FLOAT3(where, c, a, b, c != 0 ? a : b)
SC_INT3(where, c, a, b, c != 0 ? a : b)
/* clamp: max then min, each NaN-propagating as max/min above */
SC_FLOAT3S(clamp, x, lo, hi,
  C m = x > lo || x != x ? x : lo;
  return m < hi || m != m ? m : hi;)
SC_INT3(clamp, x, lo, hi, (x > lo ? x : lo) < hi ? (x > lo ? x : lo) : hi)
/* lerp: PyTorch's two-sided form, exact at w = 0 and at w = 1 */
SC_FLOAT3(lerp, a, b, w, fabs(w) < (C)0.5 ? a + w * (b - a) : b - (b - a) * (1 - w))

#endif
