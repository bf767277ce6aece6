/* gpulua device layer: dtype, op and memory-kind names, the op table's rows;
 * f16/bf16 conversions; view helpers.  Pure functions, no state. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "scalar.h"
#include "util.h"

const char *const dev_dtype_names[DEV_NDTYPE + 1] = {
  [DEV_F32] = "f32", [DEV_F64] = "f64", [DEV_F16] = "f16", [DEV_BF16] = "bf16",
  [DEV_I8] = "i8",   [DEV_U8] = "u8",   [DEV_I32] = "i32", [DEV_I64] = "i64",
  [DEV_BOOL] = "bool", [DEV_NDTYPE] = NULL,
};

static const struct { size_t size; int is_float; } dtypes[DEV_NDTYPE] = {
  [DEV_F32] = {4, 1}, [DEV_F64] = {8, 1}, [DEV_F16] = {2, 1}, [DEV_BF16] = {2, 1},
  [DEV_I8] = {1, 0},  [DEV_U8] = {1, 0},  [DEV_I32] = {4, 0}, [DEV_I64] = {8, 0},
  [DEV_BOOL] = {1, 0},
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
  return valid_dtype(t) ? dev_dtype_names[t] : "?";
}

int dev_dtype_parse(const char *name, dev_dtype *out)
{
  if (name == NULL) return -1;
  for (int t = 0; t < DEV_NDTYPE; t++)
    if (strcmp(name, dev_dtype_names[t]) == 0) { *out = (dev_dtype)t; return 0; }
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

/* The rows of ops.h as data, for validation and the bindings' checks. */
#define OPINFO(E, name, cls, res, fl) [DEV_UN_##E] = {#name, DEV_CLASSES(cls), DEV_RESULT(res), fl},
static const dev_opinfo unops[DEV_NUNOP] = {DEV_UNARY_OPS(OPINFO)};
#undef OPINFO
#define OPINFO(E, name, cls, res, fl) [DEV_BIN_##E] = {#name, DEV_CLASSES(cls), DEV_RESULT(res), fl},
static const dev_opinfo binops[DEV_NBINOP] = {DEV_BINARY_OPS(OPINFO)};
#undef OPINFO
#define OPINFO(E, name, cls, res, fl) [DEV_TER_##E] = {#name, DEV_CLASSES(cls), DEV_RESULT(res), fl},
static const dev_opinfo terops[DEV_NTEROP] = {DEV_TERNARY_OPS(OPINFO)};
#undef OPINFO

const dev_opinfo *dev_unop_info(int code)
{
  return code > DEV_UN_COPY && code < DEV_NUNOP ? &unops[code] : NULL;
}

const dev_opinfo *dev_binop_info(int code)
{
  return code >= 0 && code < DEV_NBINOP ? &binops[code] : NULL;
}

const dev_opinfo *dev_terop_info(int code)
{
  return code >= 0 && code < DEV_NTEROP ? &terops[code] : NULL;
}

unsigned dev_dtype_class(dev_dtype t)
{
  if (!valid_dtype(t)) return 0;
  return t == DEV_BOOL ? DEV_CLS_B : dtypes[t].is_float ? DEV_CLS_F : DEV_CLS_I;
}

const char *dev_unop_name(dev_unop op)
{
  if (op == DEV_UN_COPY) return "copy";
  return (unsigned)op < DEV_NUNOP ? unops[op].name : "?";
}

const char *dev_binop_name(dev_binop op)
{
  return (unsigned)op < DEV_NBINOP ? binops[op].name : "?";
}

const char *dev_terop_name(dev_terop op)
{
  return (unsigned)op < DEV_NTEROP ? terops[op].name : "?";
}

#define REDROW(E, name, cls, res) [DEV_RED_##E] = {#name, DEV_CLASSES(cls), DEV_RRESULT(res)},
static const dev_redinfo redops[DEV_NREDOP] = {DEV_REDUCE_OPS(REDROW)};
#undef REDROW

const char *dev_redop_name(dev_redop op)
{
  return (unsigned)op < DEV_NREDOP ? redops[op].name : "?";
}

const dev_redinfo *dev_redop_info(int code)
{
  return (unsigned)code < DEV_NREDOP ? &redops[code] : NULL;
}

dev_dtype dev_redop_dtype(int code, dev_dtype src)
{
  int isf = dev_dtype_is_float(src);
  switch ((unsigned)code < DEV_NREDOP ? redops[code].result : DEV_RRES_SAME) {
  case DEV_RRES_ACC: return isf ? src : DEV_I64;
  case DEV_RRES_MEAN: return isf ? src : DEV_F64;
  case DEV_RRES_INDEX: return DEV_I64;
  case DEV_RRES_BOOL: return DEV_BOOL;
  default: return src;
  }
}

int dev_redop_empty(int code, dev_scalar *s)
{
  dev_scalar z = {1, 0, 0};
  switch (code) {
  case DEV_RED_SUM: case DEV_RED_ANY: case DEV_RED_NORM: break;
  case DEV_RED_PROD: case DEV_RED_ALL: z.i = 1; z.f = 1; break;
  case DEV_RED_MEAN: case DEV_RED_VAR: case DEV_RED_STD: z = (dev_scalar){0, 0, NAN}; break;   /* 0/0 */
  case DEV_RED_LOGSUMEXP: z = (dev_scalar){0, 0, -INFINITY}; break;                          /* log 0 */
  default: return -1;
  }
  *s = z;
  return 0;
}

dev_scalar dev_scalar_as(dev_scalar s, dev_dtype t)
{
  double v = s.is_int ? (double)s.i : s.f;
  dev_scalar r = {1, 0, 0};
  switch (t) {
  case DEV_F32: r.f = (double)(float)v; break;
  case DEV_F64: return s;
  case DEV_F16: r.f = (double)sc_half_to_float(sc_double_to_half(v)); break;
  case DEV_BF16: r.f = (double)sc_bf16_to_float(sc_double_to_bf16(v)); break;
  case DEV_BOOL: r.i = s.is_int ? s.i != 0 : v != 0; r.f = (double)r.i; return r;
  default:
    /* integers wrap to the width (a float truncates first, saturating) */
    r.i = s.is_int ? s.i : v != v ? 0 : v <= -0x1p63 ? INT64_MIN : v >= 0x1p63 ? INT64_MAX : (int64_t)v;
    switch (t) {
    case DEV_I8: r.i = (int64_t)((uint64_t)r.i & 0xff); if (r.i >= 128) r.i -= 256; break;
    case DEV_U8: r.i = (int64_t)((uint64_t)r.i & 0xff); break;
    case DEV_I32: r.i = (int64_t)((uint64_t)r.i & 0xffffffffu); if (r.i >= 0x80000000) r.i -= 0x100000000; break;
    default: break;
    }
    r.f = (double)r.i;
    return r;
  }
  r.is_int = 0;
  return r;
}

/* The conversions are scalar.h's, which the kernels share. */
float dev_half_to_float(uint16_t h) { return sc_half_to_float(h); }
uint16_t dev_float_to_half(float f) { return sc_float_to_half(f); }
float dev_bf16_to_float(uint16_t h) { return sc_bf16_to_float(h); }
uint16_t dev_float_to_bf16(float f) { return sc_float_to_bf16(f); }

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

dev_view dev_view_batch(const dev_view *v, int64_t i)
{
  dev_view s = *v;
  s.ndim = 2;
  s.offset = v->offset + (size_t)(i * v->stride[0]) * dev_dtype_size(v->dtype);
  for (int d = 0; d < 2; d++) {
    s.shape[d] = v->shape[d + 1];
    s.stride[d] = v->stride[d + 1];
  }
  return s;
}

/* Shared by the host and CUDA kernels: a bad view becomes an error, never a
 * wild access.  0 when the view lies inside its buffer, aligned. */
int dev_view_check(const dev_view *v, const char *what, char *err, size_t errlen)
{
  int64_t numel = 1, lo = 0, hi = 0;
  uint64_t esz, off, need;
  if ((unsigned)v->dtype >= DEV_NDTYPE) return fail_msg(err, errlen, "%s: bad dtype %d", what, (int)v->dtype);
  if (v->ndim < 0 || v->ndim > DEV_MAXDIM) return fail_msg(err, errlen, "%s: bad ndim %d", what, v->ndim);
  for (int d = 0; d < v->ndim; d++) {
    if (v->shape[d] < 0) return fail_msg(err, errlen, "%s: negative size in dim %d", what, d);
    if (v->shape[d] == 0) return 0;
    if (__builtin_mul_overflow(numel, v->shape[d], &numel))
      return fail_msg(err, errlen, "%s: too many elements", what);
  }
  /* Runs for every op: no divisions (element sizes are powers of two). */
  esz = dev_dtype_size(v->dtype);
  for (int d = 0; d < v->ndim; d++) {
    uint64_t mag = v->stride[d] < 0 ? 0 - (uint64_t)v->stride[d] : (uint64_t)v->stride[d];
    uint64_t span = (uint64_t)(v->shape[d] - 1), ext;
    /* each extent below INT64_MAX / 16 keeps the sums of up to 8 from overflowing */
    if (__builtin_mul_overflow(span, mag, &ext) || ext > (uint64_t)(INT64_MAX / 16))
      return fail_msg(err, errlen, "%s: stride too large in dim %d", what, d);
    if (v->stride[d] > 0) hi += (int64_t)ext;
    else lo -= (int64_t)ext;
  }
  if (v->buf == NULL || v->buf->ptr == NULL) return fail_msg(err, errlen, "%s: no memory", what);
  if ((uintptr_t)dev_view_ptr(v) & (uintptr_t)(esz - 1)) return fail_msg(err, errlen, "%s: misaligned", what);
  /* elements [lo, hi] around offset: lo * esz bytes before it, (hi + 1) * esz
   * from it, all inside the buffer (lo, hi < INT64_MAX / 2, esz <= 16: the
   * products fit in 64 unsigned bits only when checked) */
  off = v->offset;
  if (__builtin_mul_overflow((uint64_t)-lo, esz, &need) || need > off ||
      __builtin_mul_overflow((uint64_t)hi + 1, esz, &need) || off > v->buf->bytes || need > v->buf->bytes - off)
    return fail_msg(err, errlen, "%s: view exceeds its buffer", what);
  return 0;
}
