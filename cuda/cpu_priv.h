/* What the CPU kernels' files share (cuda/cpu_ops.c, cpu_reduce.c,
 * cpu_matmul.c; private to them): the compute classes and blocks of
 * elements, the loads and stores that convert between a dtype and its
 * compute type, walks over views, fill; and the ops the other two files
 * run for dev_cpu_run.  The helpers are static inline, as they were static
 * in one file: each file gets its own copy, inlined where the compiler
 * sees fit, and the library exports none of their names. */
#ifndef GPULUA_CPU_PRIV_H
#define GPULUA_CPU_PRIV_H

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "device.h"
#include "scalar.h"
#include "util.h"

/* Elements a host loop takes at a time (a block: 4 KiB of f32, 8 KiB of
 * f64 or i64): 1024, not 512, halved the per-node dispatch of a fused op per
 * element; a fused GELU on 2^20 f32 took 567-613 us against 662-700
 * (2 cores, 2026-11-29), the other host rows the same. */
#define BLK 1024

typedef enum { C_FLOAT, C_DOUBLE, C_INT } cclass;

typedef union block { float f[BLK]; double d[BLK]; int64_t i[BLK]; } block;

static inline cclass class_of(dev_dtype t)
{
  switch (t) {
  case DEV_F32: case DEV_F16: case DEV_BF16: return C_FLOAT;
  case DEV_F64: return C_DOUBLE;
  default: return C_INT;
  }
}

static inline size_t class_size(cclass c) { return c == C_FLOAT ? sizeof(float) : 8; }

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int8_t wrap8(int64_t v)
{
  int r = (int)((uint64_t)v & 0xff);
  return (int8_t)(r >= 128 ? r - 256 : r);
}

static inline int32_t wrap32(int64_t v)
{
  int64_t r = (int64_t)((uint64_t)v & 0xffffffffu);
  return (int32_t)(r >= 0x80000000 ? r - 0x100000000 : r);
}

/* Float to integer: truncate toward zero, saturate, NaN to 0.  An out-of-range
 * float-to-int cast is undefined in C, so the range is checked first. */
static inline int64_t sat(double v, int64_t lo, int64_t hi)
{
  if (v != v) return 0;
  if (v <= (double)lo) return lo;
  if (v >= (double)hi) return hi;
  return (int64_t)v;
}

/* Loads and stores of n elements at p, stride s elements, one switch each
 * (a run of the compute type itself is a memcpy).  load_f takes the
 * float-compute dtypes and load_i the integer ones; load_d, store_d and
 * store_i take every dtype. */
static inline void load_d(dev_dtype t, const char *p, int64_t s, int64_t n, double *d)
{
  int64_t i;
  switch (t) {
  case DEV_F32: for (i = 0; i < n; i++) d[i] = ((const float *)p)[i * s]; break;
  case DEV_F64:
    if (s == 1) memcpy(d, p, (size_t)n * 8);
    else for (i = 0; i < n; i++) d[i] = ((const double *)p)[i * s];
    break;
  case DEV_F16: for (i = 0; i < n; i++) d[i] = sc_half_to_float(((const uint16_t *)p)[i * s]); break;
  case DEV_BF16: for (i = 0; i < n; i++) d[i] = sc_bf16_to_float(((const uint16_t *)p)[i * s]); break;
  case DEV_I8: for (i = 0; i < n; i++) d[i] = ((const int8_t *)p)[i * s]; break;
  case DEV_U8: for (i = 0; i < n; i++) d[i] = ((const uint8_t *)p)[i * s]; break;
  case DEV_I32: for (i = 0; i < n; i++) d[i] = ((const int32_t *)p)[i * s]; break;
  case DEV_I64: for (i = 0; i < n; i++) d[i] = (double)((const int64_t *)p)[i * s]; break;
  case DEV_BOOL: for (i = 0; i < n; i++) d[i] = ((const uint8_t *)p)[i * s] != 0; break;
  default: for (i = 0; i < n; i++) d[i] = 0; break;
  }
}

static inline void load_f(dev_dtype t, const char *p, int64_t s, int64_t n, float *d)
{
  int64_t i, esz = (int64_t)dev_dtype_size(t);
  double v;
  switch (t) {
  case DEV_F32:
    if (s == 1) memcpy(d, p, (size_t)n * 4);
    else for (i = 0; i < n; i++) d[i] = ((const float *)p)[i * s];
    break;
  case DEV_F16: for (i = 0; i < n; i++) d[i] = sc_half_to_float(((const uint16_t *)p)[i * s]); break;
  case DEV_BF16: for (i = 0; i < n; i++) d[i] = sc_bf16_to_float(((const uint16_t *)p)[i * s]); break;
  case DEV_BOOL: for (i = 0; i < n; i++) d[i] = ((const uint8_t *)p)[i * s] != 0; break;
  default:
    for (i = 0; i < n; i++) { load_d(t, p + i * s * esz, 1, 1, &v); d[i] = (float)v; }
    break;
  }
}

static inline void load_i(dev_dtype t, const char *p, int64_t s, int64_t n, int64_t *d)
{
  int64_t i, esz = (int64_t)dev_dtype_size(t);
  double v;
  switch (t) {
  case DEV_I8: for (i = 0; i < n; i++) d[i] = ((const int8_t *)p)[i * s]; break;
  case DEV_U8: for (i = 0; i < n; i++) d[i] = ((const uint8_t *)p)[i * s]; break;
  case DEV_I32: for (i = 0; i < n; i++) d[i] = ((const int32_t *)p)[i * s]; break;
  case DEV_I64:
    if (s == 1) memcpy(d, p, (size_t)n * 8);
    else for (i = 0; i < n; i++) d[i] = ((const int64_t *)p)[i * s];
    break;
  case DEV_BOOL: for (i = 0; i < n; i++) d[i] = ((const uint8_t *)p)[i * s] != 0; break;
  default:
    for (i = 0; i < n; i++) { load_d(t, p + i * s * esz, 1, 1, &v); d[i] = sat(v, INT64_MIN, INT64_MAX); }
    break;
  }
}

static inline void store_d(dev_dtype t, char *p, int64_t s, int64_t n, const double *v)
{
  int64_t i;
  switch (t) {
  case DEV_F32: for (i = 0; i < n; i++) ((float *)p)[i * s] = (float)v[i]; break;
  case DEV_F64:
    if (s == 1) memcpy(p, v, (size_t)n * 8);
    else for (i = 0; i < n; i++) ((double *)p)[i * s] = v[i];
    break;
  case DEV_F16: for (i = 0; i < n; i++) ((uint16_t *)p)[i * s] = sc_double_to_half(v[i]); break;
  case DEV_BF16: for (i = 0; i < n; i++) ((uint16_t *)p)[i * s] = sc_double_to_bf16(v[i]); break;
  case DEV_I8: for (i = 0; i < n; i++) ((int8_t *)p)[i * s] = (int8_t)sat(v[i], INT8_MIN, INT8_MAX); break;
  case DEV_U8: for (i = 0; i < n; i++) ((uint8_t *)p)[i * s] = (uint8_t)sat(v[i], 0, UINT8_MAX); break;
  case DEV_I32: for (i = 0; i < n; i++) ((int32_t *)p)[i * s] = (int32_t)sat(v[i], INT32_MIN, INT32_MAX); break;
  case DEV_I64: for (i = 0; i < n; i++) ((int64_t *)p)[i * s] = sat(v[i], INT64_MIN, INT64_MAX); break;
  case DEV_BOOL: for (i = 0; i < n; i++) ((uint8_t *)p)[i * s] = v[i] != 0; break;   /* NaN -> 1 */
  default: break;
  }
}

static inline void store_f(dev_dtype t, char *p, int64_t s, int64_t n, const float *v)
{
  int64_t i, esz = (int64_t)dev_dtype_size(t);
  double d;
  switch (t) {
  case DEV_F32:
    if (s == 1) memcpy(p, v, (size_t)n * 4);
    else for (i = 0; i < n; i++) ((float *)p)[i * s] = v[i];
    break;
  case DEV_F16: for (i = 0; i < n; i++) ((uint16_t *)p)[i * s] = sc_float_to_half(v[i]); break;
  case DEV_BF16: for (i = 0; i < n; i++) ((uint16_t *)p)[i * s] = sc_float_to_bf16(v[i]); break;
  default:
    for (i = 0; i < n; i++) { d = v[i]; store_d(t, p + i * s * esz, 1, 1, &d); }
    break;
  }
}

/* Integers wrap to the dtype's width.  int64 -> bf16 goes through double, so
 * it is correctly rounded up to 2^53. */
static inline void store_i(dev_dtype t, char *p, int64_t s, int64_t n, const int64_t *v)
{
  int64_t i;
  switch (t) {
  case DEV_F32: for (i = 0; i < n; i++) ((float *)p)[i * s] = (float)v[i]; break;
  case DEV_F64: for (i = 0; i < n; i++) ((double *)p)[i * s] = (double)v[i]; break;
  case DEV_F16: for (i = 0; i < n; i++) ((uint16_t *)p)[i * s] = sc_float_to_half((float)v[i]); break;
  case DEV_BF16: for (i = 0; i < n; i++) ((uint16_t *)p)[i * s] = sc_double_to_bf16((double)v[i]); break;
  case DEV_I8: for (i = 0; i < n; i++) ((int8_t *)p)[i * s] = wrap8(v[i]); break;
  case DEV_U8: for (i = 0; i < n; i++) ((uint8_t *)p)[i * s] = (uint8_t)((uint64_t)v[i] & 0xff); break;
  case DEV_I32: for (i = 0; i < n; i++) ((int32_t *)p)[i * s] = wrap32(v[i]); break;
  case DEV_I64:
    if (s == 1) memcpy(p, v, (size_t)n * 8);
    else for (i = 0; i < n; i++) ((int64_t *)p)[i * s] = v[i];
    break;
  case DEV_BOOL: for (i = 0; i < n; i++) ((uint8_t *)p)[i * s] = v[i] != 0; break;
  default: break;
  }
}

static inline void load_run(cclass c, dev_dtype t, const char *p, int64_t s, int64_t n, void *d)
{
  switch (c) {
  case C_FLOAT: load_f(t, p, s, n, d); break;
  case C_DOUBLE: load_d(t, p, s, n, d); break;
  case C_INT: load_i(t, p, s, n, d); break;
  }
}

static inline void store_run(cclass c, dev_dtype t, char *p, int64_t s, int64_t n, const void *v)
{
  switch (c) {
  case C_FLOAT: store_f(t, p, s, n, v); break;
  case C_DOUBLE: store_d(t, p, s, n, v); break;
  case C_INT: store_i(t, p, s, n, v); break;
  }
}

/* Walks a view in flat C order as a sequence of 1-D strided runs.  Size-1 dims
 * are dropped and dims that nest exactly are merged, so a contiguous view (or
 * a fully broadcast one) is a single run. */
typedef struct walk {
  char *p;
  int64_t esz;
  int nd;
  int64_t shape[DEV_MAXDIM], stride[DEV_MAXDIM], idx[DEV_MAXDIM];
  int64_t off;   /* element offset of the current position */
} walk;

static inline void walk_init(walk *w, const dev_view *v)
{
  w->p = v->buf != NULL ? dev_view_ptr(v) : NULL;   /* NULL only for empty views */
  w->esz = (int64_t)dev_dtype_size(v->dtype);
  w->nd = 0;
  w->off = 0;
  for (int d = 0; d < v->ndim; d++) {
    if (v->shape[d] == 1) continue;
    if (w->nd > 0 && w->stride[w->nd - 1] == v->stride[d] * v->shape[d]) {
      w->shape[w->nd - 1] *= v->shape[d];
      w->stride[w->nd - 1] = v->stride[d];
    } else {
      w->shape[w->nd] = v->shape[d];
      w->stride[w->nd] = v->stride[d];
      w->nd++;
    }
  }
  if (w->nd == 0) { w->nd = 1; w->shape[0] = 1; w->stride[0] = 1; }
  memset(w->idx, 0, sizeof w->idx);
}

static inline void walk_1d(walk *w, char *p, int64_t esz, int64_t n, int64_t stride)
{
  w->p = p;
  w->esz = esz;
  w->nd = 1;
  w->shape[0] = n;
  w->stride[0] = stride;
  w->idx[0] = 0;
  w->off = 0;
}

static inline int64_t walk_avail(const walk *w) { return w->shape[w->nd - 1] - w->idx[w->nd - 1]; }

/* The next run of at most max elements: its start and stride.  Advances past it. */
static inline int64_t walk_run(walk *w, int64_t max, char **p, int64_t *stride)
{
  int d = w->nd - 1;
  int64_t n = min64(max, walk_avail(w));
  *p = w->p + w->off * w->esz;
  *stride = w->stride[d];
  w->idx[d] += n;
  w->off += n * w->stride[d];
  for (; d > 0 && w->idx[d] == w->shape[d]; d--) {
    w->off += w->stride[d - 1] - w->shape[d] * w->stride[d];
    w->idx[d] = 0;
    w->idx[d - 1]++;
  }
  return n;
}

static inline void walk_load(walk *w, dev_dtype t, cclass c, int64_t n, void *dst)
{
  char *d = dst, *p;
  int64_t s, k, csz = (int64_t)class_size(c);
  for (; n > 0; n -= k, d += k * csz) {
    k = walk_run(w, n, &p, &s);
    load_run(c, t, p, s, k, d);
  }
}

static inline void walk_store(walk *w, dev_dtype t, cclass c, int64_t n, const void *src)
{
  const char *v = src;
  char *p;
  int64_t s, k, csz = (int64_t)class_size(c);
  for (; n > 0; n -= k, v += k * csz) {
    k = walk_run(w, n, &p, &s);
    store_run(c, t, p, s, k, v);
  }
}

/* Raw element moves by size: copies that need no conversion. */
static inline void copy_run(int64_t esz, char *d, int64_t ds, const char *s, int64_t ss, int64_t n)
{
  int64_t i;
  switch (esz) {
  case 1: for (i = 0; i < n; i++) d[i * ds] = s[i * ss]; break;
  case 2: for (i = 0; i < n; i++) memcpy(d + i * ds * 2, s + i * ss * 2, 2); break;
  case 4: for (i = 0; i < n; i++) memcpy(d + i * ds * 4, s + i * ss * 4, 4); break;
  default: for (i = 0; i < n; i++) memcpy(d + i * ds * 8, s + i * ss * 8, 8); break;
  }
}

/* Views arrive validated by the device layer; this is cheap insurance that a
 * bad one becomes an error rather than a wild write. */
static inline int check_view(const dev_view *v, const char *what, char *err, size_t errlen)
{
  return dev_view_check(v, what, err, errlen);
}

/* The bytes [*lo, *hi) a view's elements span (strides of any sign). */
static inline void view_span(const dev_view *v, const char **lo, const char **hi)
{
  int64_t a = 0, b = 0, esz = (int64_t)dev_dtype_size(v->dtype);
  for (int d = 0; d < v->ndim; d++) {
    int64_t e = (v->shape[d] - 1) * v->stride[d];
    if (e < 0) a += e; else b += e;
  }
  *lo = (const char *)dev_view_ptr(v) + a * esz;
  *hi = (const char *)dev_view_ptr(v) + (b + 1) * esz;
}

static inline int cpu_views_overlap(const dev_view *x, const dev_view *y)
{
  const char *xl, *xh, *yl, *yh;
  if (dev_view_numel(x) == 0 || dev_view_numel(y) == 0) return 0;
  view_span(x, &xl, &xh);
  view_span(y, &yl, &yh);
  return xl < yh && yl < xh;
}

static inline double scalar_d(dev_scalar s) { return s.is_int ? (double)s.i : s.f; }

static inline int run_fill(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  char elem[8], *p;
  double v = scalar_d(op->s0);
  int64_t n = dev_view_numel(out), k, s;
  walk w;
  if (check_view(out, "out", err, errlen)) return -1;
  if (op->s0.is_int && class_of(out->dtype) == C_INT) store_i(out->dtype, elem, 1, 1, &op->s0.i);
  else store_d(out->dtype, elem, 1, 1, &v);
  walk_init(&w, out);
  for (; n > 0; n -= k) {
    k = walk_run(&w, n, &p, &s);
    copy_run(w.esz, p, s, elem, 0, k);
  }
  return 0;
}

/* cpu_reduce.c: DEV_OP_REDUCE; DEV_OP_CUMSUM and DEV_OP_SOFTMAX */
int cpu_run_reduce(const dev_kop *op, char *err, size_t errlen);
int cpu_run_rows(const dev_kop *op, char *err, size_t errlen);
/* f(a's run, b's run) for each pair of runs along op->dim of in[0] and out,
 * which have one shape (in C order of the other dims); strides in elements */
typedef int (*cpu_row_fn)(char *a, int64_t sa, char *b, int64_t sb, int64_t len, const dev_kop *op, char *err,
                          size_t errlen);
int cpu_each_row(const dev_kop *op, cpu_row_fn f, char *err, size_t errlen);
/* cpu_sort.c: DEV_OP_SORT */
int cpu_run_sort(const dev_kop *op, char *err, size_t errlen);
/* cpu_ops.c: a number operand in t's compute type, over a whole block;
 * zeroes b's slots from n up to the next multiple of 8; the ops of ops.h
 * over a block of n (binop_block: how many integer divisions by zero) */
void cpu_scalar_to(dev_scalar s, dev_dtype t, block *b);
void cpu_pad8(cclass c, block *b, int64_t n);
void cpu_unop_block(int code, cclass c, const block *restrict x, block *restrict r, int64_t n);
int64_t cpu_binop_block(int code, cclass c, const block *restrict x, const block *restrict y, block *restrict r,
                        int64_t n);
int64_t cpu_binop_block_k(int code, cclass c, const block *restrict x, const block *kb, int left,
                          block *restrict r, int64_t n);
/* f32 blocks: (x code1 y) code2 k (left: k code2 (...)) in one loop; 0 when
 * the pair is not among add, sub, mul, div (then nothing ran) */
int cpu_binop_pair_f(int code1, int code2, int left, const block *restrict x, const block *restrict y,
                     const block *kb, block *restrict r, int64_t n);
void cpu_terop_block(int code, cclass c, const block *restrict x, const block *restrict y, const block *restrict z,
                     block *restrict r, int64_t n);
/* cpu_fuse.c: DEV_OP_FUSED */
int cpu_run_fused(const dev_kop *op, char *err, size_t errlen);
/* cpu_reduce.c: DEV_OP_FUSED with DEV_F_FREDUCE */
int cpu_run_fused_reduce(const dev_kop *op, char *err, size_t errlen);
/* fn(arg, lo, hi) over [0, n) in chunks of a multiple of grain (cpu_par.c),
 * shared out over the host's threads when n is large; -1 and err when
 * GPULUA_HOST_THREADS is not a count. */
typedef void (*cpu_par_fn)(void *arg, int64_t lo, int64_t hi);
int cpu_par_for(int64_t n, int64_t grain, cpu_par_fn fn, void *arg, char *err, size_t errlen);
/* cpu_matmul.c: DEV_OP_MATMUL */
int cpu_run_matmul(const dev_kop *op, char *err, size_t errlen);

#endif
