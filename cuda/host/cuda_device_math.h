/* cuda_device_math.h: part of the device vocabulary of host-compiled
 * kernels (cuda_device_rt.h, part 2, which includes it where it stands;
 * the build copies it there in the copy libgpulua embeds): the math API,
 * __half and __nv_bfloat16.  C++; no include guard of its own (only
 * cuda_device_rt.h includes it).  Kept free of the character pair that C
 * trigraphs start with, as cuda_device_rt.h. */

/* ---- the math API ------------------------------------------------------------------- */
/* The C library has most (expf, tanhf, erff, sincosf, exp10f, ...); these
 * are CUDA's own.  Operations with a rounding suffix round to nearest unless
 * it is _rn... for the rest: _rz/_rd/_ru are computed exactly in double and
 * then rounded as asked. */

namespace gpulua_rt {
inline double erfinv(double y)
{
  if (y != y || y < -1 || y > 1) return NAN;
  if (y == 1) return INFINITY;
  if (y == -1) return -INFINITY;
  /* M. Giles' single-precision approximation, then Newton on erf */
  double w = -log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    double p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w; p = 1.50140941 + p * w;
    x = p * y;
  } else {
    w = sqrt(w) - 3.0;
    double p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w; p = 2.83297682 + p * w;
    x = p * y;
  }
  for (int i = 0; i < 3; i++) {
    double e = erf(x) - y;
    x -= e / (1.1283791670955126 * exp(-x * x));
  }
  return x;
}
inline double erfcinv(double y)
{
  if (y != y || y < 0 || y > 2) return NAN;
  if (y == 0) return INFINITY;
  if (y == 2) return -INFINITY;
  if (y > 1) return -erfcinv(2 - y);
  if (y > 0.0625) return erfinv(1.0 - y);
  /* the tail: Newton on log(erfc(x)) = log(y) */
  double x = sqrt(-log(y)), ly = log(y);
  for (int i = 0; i < 100; i++) {
    double ec = erfc(x), d = -1.1283791670955126 * exp(-x * x) / ec;
    if (!(ec > 0) || !(d < 0)) break;
    double nx = x - (log(ec) - ly) / d;
    if (fabs(nx - x) <= 1e-16 * x) { x = nx; break; }
    x = nx;
  }
  return x;
}
inline double erfcx(double x)
{
  if (x < 25) return exp(x * x) * erfc(x);
  double r = 1 / (x * x);
  return 0.5641895835477563 / x * (1 - 0.5 * r + 0.75 * r * r - 1.875 * r * r * r);
}
} /* namespace gpulua_rt */

static inline float rsqrtf(float x) { return (float)(1.0 / sqrt((double)x)); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return (float)(1.0 / cbrt((double)x)); }
static inline double rcbrt(double x) { return 1.0 / cbrt(x); }
static inline double sinpi(double x) { return fmod(x, 1.0) == 0 ? copysign(0.0, x) : sin(M_PI * x); }
static inline double cospi(double x) { return fmod(x + 0.5, 1.0) == 0 ? 0.0 : cos(M_PI * x); }
static inline float sinpif(float x) { return (float)sinpi(x); }
static inline float cospif(float x) { return (float)cospi(x); }
static inline void sincospi(double x, double *s, double *c) { *s = sinpi(x); *c = cospi(x); }
static inline void sincospif(float x, float *s, float *c) { *s = sinpif(x); *c = cospif(x); }
static inline double normcdf(double x) { return 0.5 * erfc(-x * 0.7071067811865476); }
static inline float normcdff(float x) { return (float)normcdf(x); }
static inline double erfinv(double x) { return gpulua_rt::erfinv(x); }
static inline float erfinvf(float x) { return (float)gpulua_rt::erfinv(x); }
static inline double erfcinv(double x) { return gpulua_rt::erfcinv(x); }
static inline float erfcinvf(float x) { return (float)gpulua_rt::erfcinv(x); }
static inline double normcdfinv(double x) { return -1.4142135623730951 * gpulua_rt::erfcinv(2 * x); }
static inline float normcdfinvf(float x) { return (float)normcdfinv(x); }
static inline double erfcx(double x) { return gpulua_rt::erfcx(x); }
static inline float erfcxf(float x) { return (float)gpulua_rt::erfcx(x); }
static inline double rhypot(double x, double y) { return 1 / hypot(x, y); }
static inline float rhypotf(float x, float y) { return (float)(1 / hypot((double)x, (double)y)); }
static inline double norm3d(double a, double b, double c) { return sqrt(a * a + b * b + c * c); }
static inline float norm3df(float a, float b, float c) { return (float)norm3d(a, b, c); }
static inline double rnorm3d(double a, double b, double c) { return 1 / norm3d(a, b, c); }
static inline float rnorm3df(float a, float b, float c) { return (float)rnorm3d(a, b, c); }
static inline double norm4d(double a, double b, double c, double d) { return sqrt(a * a + b * b + c * c + d * d); }
static inline float norm4df(float a, float b, float c, float d) { return (float)norm4d(a, b, c, d); }
static inline double rnorm4d(double a, double b, double c, double d) { return 1 / norm4d(a, b, c, d); }
static inline float rnorm4df(float a, float b, float c, float d) { return (float)rnorm4d(a, b, c, d); }
static inline double norm(int n, const double *a)
{
  double s = 0;
  for (int i = 0; i < n; i++) s += a[i] * a[i];
  return sqrt(s);
}
static inline float normf(int n, const float *a)
{
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)a[i] * a[i];
  return (float)sqrt(s);
}
static inline double rnorm(int n, const double *a) { return 1 / norm(n, a); }
static inline float rnormf(int n, const float *a) { return 1 / normf(n, a); }
static inline float fdividef(float a, float b) { return a / b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; }
/* the C library declares these names itself (its internal aliases) */
#define __expf expf
#define __exp10f exp10f
#define __logf logf
#define __log2f log2f
#define __log10f log10f
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __sincosf sincosf
#define __powf powf
#define __tanhf tanhf
#define GPULUA_FOP4(name, expr) \
  static inline float name##_rn(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RN); } \
  static inline float name##_rz(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RZ); } \
  static inline float name##_rd(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RD); } \
  static inline float name##_ru(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RU); }
GPULUA_FOP4(__fadd, (long double)a + b)
GPULUA_FOP4(__fsub, (long double)a - b)
GPULUA_FOP4(__fmul, (long double)a * b)
GPULUA_FOP4(__fdiv, (long double)a / b)
#define GPULUA_FUN4(name, expr) \
  static inline float name##_rn(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RN); } \
  static inline float name##_rz(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RZ); } \
  static inline float name##_rd(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RD); } \
  static inline float name##_ru(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RU); }
GPULUA_FUN4(__frcp, 1.0L / a)
GPULUA_FUN4(__fsqrt, sqrtl((long double)a))
static inline float __frsqrt_rn(float a) { return (float)(1.0 / sqrt((double)a)); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmaf_rz(float a, float b, float c) { return gpulua_rt::to_float(fmal(a, b, c), gpulua_rt::RZ); }
static inline float __fmaf_rd(float a, float b, float c) { return gpulua_rt::to_float(fmal(a, b, c), gpulua_rt::RD); }
static inline float __fmaf_ru(float a, float b, float c) { return gpulua_rt::to_float(fmal(a, b, c), gpulua_rt::RU); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

/* math_constants.h */
#define CUDART_INF_F INFINITY
#define CUDART_NAN_F NAN
#define CUDART_MIN_DENORM_F 1.40129846e-45f
#define CUDART_MAX_NORMAL_F FLT_MAX
#define CUDART_NEG_ZERO_F (-0.0f)
#define CUDART_ZERO_F 0.0f
#define CUDART_ONE_F 1.0f
#define CUDART_SQRT_HALF_F 0.707106781f
#define CUDART_SQRT_TWO_F 1.414213562f
#define CUDART_THIRD_F 0.333333333f
#define CUDART_PIO4_F 0.785398163f
#define CUDART_PIO2_F 1.570796327f
#define CUDART_3PIO4_F 2.356194490f
#define CUDART_2_OVER_PI_F 0.636619772f
#define CUDART_PI_F 3.141592654f
#define CUDART_L2E_F 1.442695041f
#define CUDART_L2T_F 3.321928094f
#define CUDART_LG2_F 0.301029996f
#define CUDART_LGE_F 0.434294482f
#define CUDART_LN2_F 0.693147181f
#define CUDART_LNT_F 2.302585093f
#define CUDART_LNPI_F 1.144729886f
#define CUDART_TWO_TO_M126_F 1.175494351e-38f
#define CUDART_TWO_TO_126_F 8.507059173e37f
#define CUDART_NORM_HUGE_F 3.402823466e38f
#define CUDART_TWO_TO_23_F 8388608.0f
#define CUDART_TWO_TO_24_F 16777216.0f
#define CUDART_TWO_TO_31_F 2147483648.0f
#define CUDART_TWO_TO_32_F 4294967296.0f
#define CUDART_REMQUO_BITS_F 3
#define CUDART_TRIG_PLOSS_F 105615.0f
#define CUDART_INF INFINITY
#define CUDART_NAN NAN
#define CUDART_NEG_ZERO (-0.0)
#define CUDART_ZERO 0.0
#define CUDART_ONE 1.0
#define CUDART_SQRT_TWO 1.4142135623730951
#define CUDART_SQRT_HALF 0.7071067811865476
#define CUDART_SQRT_2PI 2.5066282746310002
#define CUDART_SQRT_PIO2 1.2533141373155003
#define CUDART_SQRT_2OPI 0.7978845608028654
#define CUDART_THIRD 0.3333333333333333
#define CUDART_TWOTHIRD 0.6666666666666666
#define CUDART_PIO4 0.7853981633974483
#define CUDART_PIO2 1.5707963267948966
#define CUDART_3PIO4 2.356194490192345
#define CUDART_PI 3.141592653589793
#define CUDART_2PI 6.283185307179586
#define CUDART_L2E 1.4426950408889634
#define CUDART_L2T 3.321928094887362
#define CUDART_LG2 0.3010299956639812
#define CUDART_LGE 0.4342944819032518
#define CUDART_LN2 0.6931471805599453
#define CUDART_LNT 2.302585092994046
#define CUDART_LNPI 1.1447298858494002
#define CUDART_TWO_TO_53 9007199254740992.0
#define CUDART_TWO_TO_54 18014398509481984.0
#define CUDART_TWO_TO_63 9223372036854775808.0
#define CUDART_TWO_TO_64 18446744073709551616.0

/* ---- __half and __nv_bfloat16 ---------------------------------------------------------- */

namespace gpulua_rt {
/* x rounded by mode to a binary float with p significant bits, minimum
 * normal exponent emin and largest finite value fmax; its bits (sign,
 * exponent, p-1 mantissa bits).  Exact arithmetic in long double. */
inline unsigned short to_f16_bits(long double x, int mode, int p, int emin, int ebits)
{
  if (x != x) return 0x7fff;                /* the canonical NaN, as CUDA's */
  unsigned short sign = signbit(x) ? (unsigned short)(1u << (p - 1 + ebits)) : 0;
  unsigned short expmask = (unsigned short)(((1u << ebits) - 1) << (p - 1));
  int m = p - 1, bias = 1 - emin, emax = (1 << ebits) - 2 - bias;
  long double a = fabsl(x), fmax = ldexpl(2.0L - ldexpl(1.0L, -m), emax);
  /* on the magnitude: toward -inf is away from zero for a negative x */
  int md = sign && mode == RD ? RU : sign && mode == RU ? RD : mode;
  if (a == INFINITY) return (unsigned short)(sign | expmask);
  if (a == 0) return sign;
  int e;
  frexpl(a, &e);
  e -= 1;                                   /* a in [2^e, 2^(e+1)) */
  int q = e < emin ? emin - m : e - m;      /* the weight of the last mantissa bit */
  long double r = ldexpl(round_mode_l(ldexpl(a, -q), md), q);
  if (r > fmax) {
    if (md == RN || md == RU) return (unsigned short)(sign | expmask);
    r = fmax;
  }
  if (r == 0) return sign;
  frexpl(r, &e);
  e -= 1;
  if (e < emin) return (unsigned short)(sign | (unsigned short)ldexpl(r, m - emin));
  unsigned short mant = (unsigned short)(ldexpl(r, m - e) - ldexpl(1.0L, m));
  return (unsigned short)(sign | (unsigned short)((e + bias) << m) | mant);
}
inline float from_f16_bits(unsigned short b, int p, int emin, int ebits)
{
  int m = p - 1, bias = 1 - emin;
  unsigned e = (unsigned)(b >> m) & ((1u << ebits) - 1), mant = b & ((1u << m) - 1);
  float s = (b >> (m + ebits)) ? -1.0f : 1.0f;
  if (e == (1u << ebits) - 1) return mant ? NAN : s * INFINITY;
  if (e == 0) return s * ldexpf((float)mant, emin - m);
  return s * ldexpf((float)(mant | (1u << m)), (int)e - bias - m);
}
inline unsigned short h_bits(long double x, int mode) { return to_f16_bits(x, mode, 11, -14, 5); }
inline unsigned short b_bits(long double x, int mode) { return to_f16_bits(x, mode, 8, -126, 8); }
inline float h_float(unsigned short b) { return from_f16_bits(b, 11, -14, 5); }
inline float b_float(unsigned short b)
{
  unsigned u = (unsigned)b << 16;
  if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) u |= 0x400000;
  return bit_cast<float>(u);
}
struct raw16 { unsigned short x; };
} /* namespace gpulua_rt */

typedef struct __half_raw { unsigned short x; } __half_raw;
typedef struct __nv_bfloat16_raw { unsigned short x; } __nv_bfloat16_raw;

/* T: the type; B: its bits from a long double by mode; F: its value */
#define GPULUA_F16_TYPE(T, RAW, B, F) \
  struct __attribute__((aligned(2))) T { \
    unsigned short __x; \
    T() = default; \
    constexpr T(RAW r) : __x(r.x) {} \
    T(float f) : __x(gpulua_rt::B(f, gpulua_rt::RN)) {} \
    T(double d) : __x(gpulua_rt::B(d, gpulua_rt::RN)) {} \
    T(int i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(unsigned i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(long long i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(unsigned long long i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(short i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(unsigned short i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    operator float() const { return gpulua_rt::F(__x); } \
    operator RAW() const { RAW r; r.x = __x; return r; } \
    T &operator=(float f) { __x = gpulua_rt::B(f, gpulua_rt::RN); return *this; } \
    T &operator=(double d) { __x = gpulua_rt::B(d, gpulua_rt::RN); return *this; } \
    T &operator=(RAW r) { __x = r.x; return *this; } \
  };
GPULUA_F16_TYPE(__half, __half_raw, h_bits, h_float)
GPULUA_F16_TYPE(__nv_bfloat16, __nv_bfloat16_raw, b_bits, b_float)
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct __attribute__((aligned(4))) __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(__half a, __half b) : x(a), y(b) {}
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

namespace gpulua_rt {
inline __half mkh(unsigned short b) { __half h; h.__x = b; return h; }
inline __nv_bfloat16 mkb(unsigned short b) { __nv_bfloat16 h; h.__x = b; return h; }
inline __half rnd(__half, long double x) { return mkh(h_bits(x, RN)); }
inline __nv_bfloat16 rnd(__nv_bfloat16, long double x) { return mkb(b_bits(x, RN)); }
} /* namespace gpulua_rt */

/* conversions of __half */
static inline float __half2float(__half h) { return gpulua_rt::h_float(h.__x); }
static inline __half __float2half(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RN)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline __half __float2half_rz(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RZ)); }
static inline __half __float2half_rd(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RD)); }
static inline __half __float2half_ru(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RU)); }
static inline __half __double2half(double d) { return gpulua_rt::mkh(gpulua_rt::h_bits(d, gpulua_rt::RN)); }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __short_as_half(short s) { return gpulua_rt::mkh((unsigned short)s); }
static inline __half __ushort_as_half(unsigned short s) { return gpulua_rt::mkh(s); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half(a), __float2half(b)); }
static inline __half2 __float2half2_rn(float a) { return __half2(__float2half(a), __float2half(a)); }
static inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline __half2 make_half2(__half a, __half b) { return __half2(a, b); }
/* conversions of __nv_bfloat16 */
static inline float __bfloat162float(__nv_bfloat16 h) { return gpulua_rt::b_float(h.__x); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RN)); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RZ)); }
static inline __nv_bfloat16 __float2bfloat16_rd(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RD)); }
static inline __nv_bfloat16 __float2bfloat16_ru(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RU)); }
static inline __nv_bfloat16 __double2bfloat16(double d) { return gpulua_rt::mkb(gpulua_rt::b_bits(d, gpulua_rt::RN)); }
static inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __short_as_bfloat16(short s) { return gpulua_rt::mkb((unsigned short)s); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { return gpulua_rt::mkb(s); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
  return __nv_bfloat162(__float2bfloat16(a), __float2bfloat16(b));
}
static inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __floats2bfloat162_rn(a, a); }
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h)
{
  return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
static inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }

/* integers to and from both, with rounding modes */
#define GPULUA_H_FROM(name, I, B, MK, mode) \
  static inline decltype(gpulua_rt::MK(0)) name(I i) { return gpulua_rt::MK(gpulua_rt::B((long double)i, gpulua_rt::mode)); }
#define GPULUA_H_TO(name, T, I, F, mode) \
  static inline I name(T h) { return gpulua_rt::to_int<I>(gpulua_rt::F(h.__x), gpulua_rt::mode); }
#define GPULUA_H_INTS(T, S, B, MK, F) \
  GPULUA_H_FROM(__int2##S##_rn, int, B, MK, RN) GPULUA_H_FROM(__int2##S##_rz, int, B, MK, RZ) \
  GPULUA_H_FROM(__int2##S##_rd, int, B, MK, RD) GPULUA_H_FROM(__int2##S##_ru, int, B, MK, RU) \
  GPULUA_H_FROM(__uint2##S##_rn, unsigned, B, MK, RN) GPULUA_H_FROM(__short2##S##_rn, short, B, MK, RN) \
  GPULUA_H_FROM(__ushort2##S##_rn, unsigned short, B, MK, RN) GPULUA_H_FROM(__ll2##S##_rn, long long, B, MK, RN) \
  GPULUA_H_FROM(__ull2##S##_rn, unsigned long long, B, MK, RN) \
  GPULUA_H_TO(__##S##2int_rn, T, int, F, RN) GPULUA_H_TO(__##S##2int_rz, T, int, F, RZ) \
  GPULUA_H_TO(__##S##2int_rd, T, int, F, RD) GPULUA_H_TO(__##S##2int_ru, T, int, F, RU) \
  GPULUA_H_TO(__##S##2uint_rn, T, unsigned, F, RN) GPULUA_H_TO(__##S##2uint_rz, T, unsigned, F, RZ) \
  GPULUA_H_TO(__##S##2short_rn, T, short, F, RN) GPULUA_H_TO(__##S##2short_rz, T, short, F, RZ) \
  GPULUA_H_TO(__##S##2ushort_rn, T, unsigned short, F, RN) GPULUA_H_TO(__##S##2ushort_rz, T, unsigned short, F, RZ) \
  GPULUA_H_TO(__##S##2ll_rn, T, long long, F, RN) GPULUA_H_TO(__##S##2ll_rz, T, long long, F, RZ) \
  GPULUA_H_TO(__##S##2ull_rn, T, unsigned long long, F, RN) GPULUA_H_TO(__##S##2ull_rz, T, unsigned long long, F, RZ)
GPULUA_H_INTS(__half, half, h_bits, mkh, h_float)
GPULUA_H_INTS(__nv_bfloat16, bfloat16, b_bits, mkb, b_float)

/* Arithmetic shared by both (CUDA overloads the names): each operation is
 * exact in long double and rounded once. */
#define GPULUA_F16_OPS(T, T2) \
  static inline float gpulua_f(T a) { return (float)a; } \
  static inline T __hadd(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a + (float)b); } \
  static inline T __hsub(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a - (float)b); } \
  static inline T __hmul(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a * (float)b); } \
  static inline T __hdiv(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a / (float)b); } \
  static inline T __hfma(T a, T b, T c) { return gpulua_rt::rnd(a, fmal((float)a, (float)b, (float)c)); } \
  static inline T __hadd_rn(T a, T b) { return __hadd(a, b); } \
  static inline T __hsub_rn(T a, T b) { return __hsub(a, b); } \
  static inline T __hmul_rn(T a, T b) { return __hmul(a, b); } \
  static inline T gpulua_sat(T a) { float f = (float)a; return T(f != f ? 0.0f : f < 0 ? 0.0f : f > 1 ? 1.0f : f); } \
  static inline T __hadd_sat(T a, T b) { return gpulua_sat(__hadd(a, b)); } \
  static inline T __hsub_sat(T a, T b) { return gpulua_sat(__hsub(a, b)); } \
  static inline T __hmul_sat(T a, T b) { return gpulua_sat(__hmul(a, b)); } \
  static inline T __hfma_sat(T a, T b, T c) { return gpulua_sat(__hfma(a, b, c)); } \
  static inline T __hneg(T a) { T r = a; r.__x ^= 0x8000; return r; } \
  static inline T __habs(T a) { T r = a; r.__x &= 0x7fff; return r; } \
  static inline bool __hisnan(T a) { float f = (float)a; return f != f; } \
  static inline int __hisinf(T a) { float f = (float)a; return f == INFINITY ? 1 : f == -INFINITY ? -1 : 0; } \
  static inline T __hmax(T a, T b) { return T(fmaxf((float)a, (float)b)); } \
  static inline T __hmin(T a, T b) { return T(fminf((float)a, (float)b)); } \
  static inline T __hmax_nan(T a, T b) { return __hisnan(a) ? a : __hisnan(b) ? b : __hmax(a, b); } \
  static inline T __hmin_nan(T a, T b) { return __hisnan(a) ? a : __hisnan(b) ? b : __hmin(a, b); } \
  static inline bool __heq(T a, T b) { return (float)a == (float)b; } \
  static inline bool __hne(T a, T b) { return !__hisnan(a) && !__hisnan(b) && (float)a != (float)b; } \
  static inline bool __hlt(T a, T b) { return (float)a < (float)b; } \
  static inline bool __hle(T a, T b) { return (float)a <= (float)b; } \
  static inline bool __hgt(T a, T b) { return (float)a > (float)b; } \
  static inline bool __hge(T a, T b) { return (float)a >= (float)b; } \
  static inline bool __hequ(T a, T b) { return !((float)a != (float)b); } \
  static inline bool __hneu(T a, T b) { return (float)a != (float)b; } \
  static inline bool __hltu(T a, T b) { return !((float)a >= (float)b); } \
  static inline bool __hleu(T a, T b) { return !((float)a > (float)b); } \
  static inline bool __hgtu(T a, T b) { return !((float)a <= (float)b); } \
  static inline bool __hgeu(T a, T b) { return !((float)a < (float)b); } \
  static inline T hsqrt(T a) { return gpulua_rt::rnd(a, sqrtl((float)a)); } \
  static inline T hrsqrt(T a) { return T(1.0 / sqrt((double)(float)a)); } \
  static inline T hrcp(T a) { return gpulua_rt::rnd(a, 1.0L / (float)a); } \
  static inline T hexp(T a) { return T(exp((double)(float)a)); } \
  static inline T hexp2(T a) { return T(exp2((double)(float)a)); } \
  static inline T hexp10(T a) { return T(exp10((double)(float)a)); } \
  static inline T hlog(T a) { return T(log((double)(float)a)); } \
  static inline T hlog2(T a) { return T(log2((double)(float)a)); } \
  static inline T hlog10(T a) { return T(log10((double)(float)a)); } \
  static inline T hsin(T a) { return T(sin((double)(float)a)); } \
  static inline T hcos(T a) { return T(cos((double)(float)a)); } \
  static inline T htanh(T a) { return T(tanh((double)(float)a)); } \
  static inline T hceil(T a) { return T(ceilf((float)a)); } \
  static inline T hfloor(T a) { return T(floorf((float)a)); } \
  static inline T htrunc(T a) { return T(truncf((float)a)); } \
  static inline T hrint(T a) { return T(rintf((float)a)); } \
  static inline T operator+(const T &a, const T &b) { return __hadd(a, b); } \
  static inline T operator-(const T &a, const T &b) { return __hsub(a, b); } \
  static inline T operator*(const T &a, const T &b) { return __hmul(a, b); } \
  static inline T operator/(const T &a, const T &b) { return __hdiv(a, b); } \
  static inline T &operator+=(T &a, const T &b) { return a = __hadd(a, b); } \
  static inline T &operator-=(T &a, const T &b) { return a = __hsub(a, b); } \
  static inline T &operator*=(T &a, const T &b) { return a = __hmul(a, b); } \
  static inline T &operator/=(T &a, const T &b) { return a = __hdiv(a, b); } \
  static inline T operator+(const T &a) { return a; } \
  static inline T operator-(const T &a) { return __hneg(a); } \
  static inline bool operator==(const T &a, const T &b) { return __heq(a, b); } \
  static inline bool operator!=(const T &a, const T &b) { return __hneu(a, b); } \
  static inline bool operator<(const T &a, const T &b) { return __hlt(a, b); } \
  static inline bool operator<=(const T &a, const T &b) { return __hle(a, b); } \
  static inline bool operator>(const T &a, const T &b) { return __hgt(a, b); } \
  static inline bool operator>=(const T &a, const T &b) { return __hge(a, b); } \
  static inline T2 __hadd2(T2 a, T2 b) { return T2(__hadd(a.x, b.x), __hadd(a.y, b.y)); } \
  static inline T2 __hsub2(T2 a, T2 b) { return T2(__hsub(a.x, b.x), __hsub(a.y, b.y)); } \
  static inline T2 __hmul2(T2 a, T2 b) { return T2(__hmul(a.x, b.x), __hmul(a.y, b.y)); } \
  static inline T2 __h2div(T2 a, T2 b) { return T2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); } \
  static inline T2 __hfma2(T2 a, T2 b, T2 c) { return T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); } \
  static inline T2 __hneg2(T2 a) { return T2(__hneg(a.x), __hneg(a.y)); } \
  static inline T2 __habs2(T2 a) { return T2(__habs(a.x), __habs(a.y)); } \
  static inline T2 __hmax2(T2 a, T2 b) { return T2(__hmax(a.x, b.x), __hmax(a.y, b.y)); } \
  static inline T2 __hmin2(T2 a, T2 b) { return T2(__hmin(a.x, b.x), __hmin(a.y, b.y)); } \
  static inline T2 h2sqrt(T2 a) { return T2(hsqrt(a.x), hsqrt(a.y)); } \
  static inline T2 h2exp(T2 a) { return T2(hexp(a.x), hexp(a.y)); } \
  static inline T2 h2log(T2 a) { return T2(hlog(a.x), hlog(a.y)); } \
  static inline T2 operator+(const T2 &a, const T2 &b) { return __hadd2(a, b); } \
  static inline T2 operator-(const T2 &a, const T2 &b) { return __hsub2(a, b); } \
  static inline T2 operator*(const T2 &a, const T2 &b) { return __hmul2(a, b); } \
  static inline T2 operator/(const T2 &a, const T2 &b) { return __h2div(a, b); } \
  static inline T2 &operator+=(T2 &a, const T2 &b) { return a = __hadd2(a, b); } \
  static inline T2 &operator*=(T2 &a, const T2 &b) { return a = __hmul2(a, b); } \
  GPULUA_ATOMIC T atomicAdd(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicAdd"); \
    return gpulua_rt::atomic_rmw<T, unsigned short>(a, [v](T o) { return __hadd(o, v); }); \
  } \
  GPULUA_ATOMIC T2 atomicAdd(T2 *a, T2 v) \
  { \
    GPULUA_ALIGNED(a, "atomicAdd"); \
    return gpulua_rt::atomic_rmw<T2, unsigned>(a, [v](T2 o) { return __hadd2(o, v); }); \
  }
GPULUA_F16_OPS(__half, __half2)
GPULUA_F16_OPS(__nv_bfloat16, __nv_bfloat162)

static inline __half __low2half(__half2 a) { return a.x; }
static inline __half __high2half(__half2 a) { return a.y; }
static inline float __low2float(__half2 a) { return __half2float(a.x); }
static inline float __high2float(__half2 a) { return __half2float(a.y); }
static inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
static inline __half2 __half2half2(__half a) { return __half2(a, a); }
static inline __half2 __lowhigh2highlow(__half2 a) { return __half2(a.y, a.x); }
static inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
static inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 a) { return a.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 a) { return a.y; }
static inline float __low2float(__nv_bfloat162 a) { return __bfloat162float(a.x); }
static inline float __high2float(__nv_bfloat162 a) { return __bfloat162float(a.y); }
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
static inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162(a, a); }
static inline __nv_bfloat162 __lowhigh2highlow(__nv_bfloat162 a) { return __nv_bfloat162(a.y, a.x); }
