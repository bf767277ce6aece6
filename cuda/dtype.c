/* gpulua device layer: dtype, op and memory-kind names; f16/bf16 conversions;
 * view helpers.  Pure functions, no state. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "device.h"

static const struct { const char *name; size_t size; int is_float; } dtypes[DEV_NDTYPE] = {
  [DEV_F32] = {"f32", 4, 1}, [DEV_F64] = {"f64", 8, 1},
  [DEV_F16] = {"f16", 2, 1}, [DEV_BF16] = {"bf16", 2, 1},
  [DEV_I8] = {"i8", 1, 0},   [DEV_U8] = {"u8", 1, 0},
  [DEV_I32] = {"i32", 4, 0}, [DEV_I64] = {"i64", 8, 0},
  [DEV_BOOL] = {"bool", 1, 0},
};

static const struct { const char *name; dev_dtype t; } aliases[] = {
  {"float32", DEV_F32}, {"float", DEV_F32},
  {"float64", DEV_F64}, {"double", DEV_F64},
  {"float16", DEV_F16}, {"half", DEV_F16},
  {"bfloat16", DEV_BF16},
  {"int8", DEV_I8}, {"uint8", DEV_U8},
  {"int32", DEV_I32}, {"int", DEV_I32},
  {"int64", DEV_I64}, {"long", DEV_I64},
};

static int valid_dtype(dev_dtype t) { return (unsigned)t < DEV_NDTYPE; }

const char *dev_dtype_name(dev_dtype t)
{
  return valid_dtype(t) ? dtypes[t].name : "?";
}

int dev_dtype_parse(const char *name, dev_dtype *out)
{
  if (name == NULL) return -1;
  for (int t = 0; t < DEV_NDTYPE; t++)
    if (strcmp(name, dtypes[t].name) == 0) { *out = (dev_dtype)t; return 0; }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].name) == 0) { *out = aliases[i].t; return 0; }
  return -1;
}

size_t dev_dtype_size(dev_dtype t) { return valid_dtype(t) ? dtypes[t].size : 0; }

int dev_dtype_is_float(dev_dtype t) { return valid_dtype(t) && dtypes[t].is_float; }

const char *dev_memkind_name(dev_memkind k)
{
  static const char *const names[] = {"device", "pinned", "host"};
  return (unsigned)k < 3 ? names[k] : "?";
}

const char *dev_unop_name(dev_unop op)
{
  static const char *const names[DEV_NUNOP] = {
    "copy", "neg", "abs", "exp", "log", "sqrt", "relu", "sigmoid", "tanh"};
  return (unsigned)op < DEV_NUNOP ? names[op] : "?";
}

const char *dev_binop_name(dev_binop op)
{
  static const char *const names[DEV_NBINOP] = {"add", "sub", "mul", "div", "pow", "max", "min"};
  return (unsigned)op < DEV_NBINOP ? names[op] : "?";
}

const char *dev_redop_name(dev_redop op)
{
  static const char *const names[DEV_NREDOP] = {"sum", "mean", "max", "min", "argmax"};
  return (unsigned)op < DEV_NREDOP ? names[op] : "?";
}

/* Branch-light conversions (after F. Giesen's "half <-> float" notes): the
 * FPU does the renormalising and rounding of subnormals. */
float dev_half_to_float(uint16_t h)
{
  uint32_t em = (uint32_t)(h & 0x7fff) << 13, e = em & 0x0f800000, b = em + (112u << 23);
  float f;
  if (e == 0x0f800000) {          /* inf or NaN: exponent all ones, NaN made quiet */
    b += 112u << 23;
    if (em & 0x7fffff) b |= 0x400000;
  } else if (em == 0) {
    b = 0;
  } else if (e == 0) {            /* subnormal: 2^-14 * (1 + m/1024) - 2^-14 */
    b += 1u << 23;
    memcpy(&f, &b, sizeof f);
    f -= 0x1p-14f;
    memcpy(&b, &f, sizeof b);
  }
  b |= (uint32_t)(h & 0x8000) << 16;
  memcpy(&f, &b, sizeof f);
  return f;
}

uint16_t dev_float_to_half(float f)
{
  uint32_t b, a;
  memcpy(&b, &f, sizeof b);
  uint16_t sign = (uint16_t)(b >> 16 & 0x8000);
  a = b & 0x7fffffff;
  if (a >= 0x47800000)            /* 2^16 and up: inf, or NaN kept quiet with its top payload */
    return sign | (a > 0x7f800000 ? 0x7e00 | (a >> 13 & 0x3ff) : 0x7c00);
  if (a < 0x38800000) {           /* below 2^-14: half subnormal or zero */
    /* adding 0.5 leaves the value in units of 2^-24 at the bottom of the
     * mantissa, rounded to nearest even by the FPU */
    memcpy(&f, &a, sizeof f);
    f += 0.5f;
    memcpy(&a, &f, sizeof a);
    return sign | (uint16_t)(a - 0x3f000000);
  }
  /* rebias the exponent and round the 13 dropped bits to nearest even; a
   * carry walks into the exponent, so 65520 and up become inf */
  a += 0xfff + (a >> 13 & 1) - (112u << 23);
  return sign | (uint16_t)(a >> 13);
}

float dev_bf16_to_float(uint16_t h)
{
  uint32_t b = (uint32_t)h << 16;
  float f;
  if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) b |= 0x400000;   /* quiet NaN */
  memcpy(&f, &b, sizeof f);
  return f;
}

uint16_t dev_float_to_bf16(float f)
{
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  if ((b & 0x7f800000) == 0x7f800000 && (b & 0x7fffff))
    return (uint16_t)(b >> 16 | 0x40);
  /* Same exponent range as float: rounding the low 16 bits away is all there is;
   * a carry walks into the exponent and reaches inf on overflow. */
  b += 0x7fff + (b >> 16 & 1);
  return (uint16_t)(b >> 16);
}

int64_t dev_view_numel(const dev_view *v)
{
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

int dev_view_contiguous(const dev_view *v)
{
  int64_t expect = 1;
  if (dev_view_numel(v) == 0) return 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    if (v->shape[d] != 1 && v->stride[d] != expect) return 0;
    expect *= v->shape[d];
  }
  return 1;
}

static int view_fail(char *err, size_t errlen, const char *fmt, ...)
{
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* Shared by the host and CUDA kernels: a bad view becomes an error, never a
 * wild access.  0 when the view lies inside its buffer, aligned. */
int dev_view_check(const dev_view *v, const char *what, char *err, size_t errlen)
{
  int64_t numel = 1, lo = 0, hi = 0;
  uint64_t esz, off, need;
  if ((unsigned)v->dtype >= DEV_NDTYPE) return view_fail(err, errlen, "%s: bad dtype %d", what, (int)v->dtype);
  if (v->ndim < 0 || v->ndim > DEV_MAXDIM) return view_fail(err, errlen, "%s: bad ndim %d", what, v->ndim);
  for (int d = 0; d < v->ndim; d++) {
    if (v->shape[d] < 0) return view_fail(err, errlen, "%s: negative size in dim %d", what, d);
    if (v->shape[d] == 0) return 0;
    if (__builtin_mul_overflow(numel, v->shape[d], &numel))
      return view_fail(err, errlen, "%s: too many elements", what);
  }
  /* Runs for every op: no divisions (element sizes are powers of two). */
  esz = dev_dtype_size(v->dtype);
  for (int d = 0; d < v->ndim; d++) {
    uint64_t mag = v->stride[d] < 0 ? 0 - (uint64_t)v->stride[d] : (uint64_t)v->stride[d];
    uint64_t span = (uint64_t)(v->shape[d] - 1), ext;
    /* each extent below INT64_MAX / 16 keeps the sums of up to 8 from overflowing */
    if (__builtin_mul_overflow(span, mag, &ext) || ext > (uint64_t)(INT64_MAX / 16))
      return view_fail(err, errlen, "%s: stride too large in dim %d", what, d);
    if (v->stride[d] > 0) hi += (int64_t)ext;
    else lo -= (int64_t)ext;
  }
  if (v->buf == NULL || v->buf->ptr == NULL) return view_fail(err, errlen, "%s: no memory", what);
  if ((uintptr_t)dev_view_ptr(v) & (uintptr_t)(esz - 1)) return view_fail(err, errlen, "%s: misaligned", what);
  /* elements [lo, hi] around offset: lo * esz bytes before it, (hi + 1) * esz
   * from it, all inside the buffer (lo, hi < INT64_MAX / 2, esz <= 16: the
   * products fit in 64 unsigned bits only when checked) */
  off = v->offset;
  if (__builtin_mul_overflow((uint64_t)-lo, esz, &need) || need > off ||
      __builtin_mul_overflow((uint64_t)hi + 1, esz, &need) || off > v->buf->bytes || need > v->buf->bytes - off)
    return view_fail(err, errlen, "%s: view exceeds its buffer", what);
  return 0;
}
