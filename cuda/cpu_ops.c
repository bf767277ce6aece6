/* gpulua host kernels: the CPU implementation of every built-in op.
 *
 * Stream workers and the interpreter thread call in at the same time, so
 * nothing here keeps state between calls (but OpenBLAS, loaded once), and
 * nothing prints, exits or aborts.
 *
 * Elementwise ops work in blocks: the next BLK elements of each operand are
 * gathered (in flat C order, whatever the strides) into an array of the
 * compute type -- float for f32/f16/bf16, double for f64, int64 for the
 * integers and bool -- the op runs over the arrays, and the result is
 * converted and scattered into the output.  The dtype switch thus runs once per
 * strided run rather than per element, and a contiguous view is a single run.
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L   /* nanosleep */
#endif

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef GPULUA_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#endif

/* A neutral module (cpu_ops.h), not the host backend's: dev_op.c and both backends run ops with it. */
#include "cpu_ops.h"
#include "devpriv.h"   /* dev_cfunc_run */
#include "scalar.h"
#include "util.h"

#define BLK 512
#define TWO_PI 6.283185307179586476925286766559

typedef enum { C_FLOAT, C_DOUBLE, C_INT } cclass;

typedef union block { float f[BLK]; double d[BLK]; int64_t i[BLK]; } block;

static cclass class_of(dev_dtype t)
{
  switch (t) {
  case DEV_F32: case DEV_F16: case DEV_BF16: return C_FLOAT;
  case DEV_F64: return C_DOUBLE;
  default: return C_INT;
  }
}

static size_t class_size(cclass c) { return c == C_FLOAT ? sizeof(float) : 8; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

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
static void load_d(dev_dtype t, const char *p, int64_t s, int64_t n, double *d)
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

static void load_f(dev_dtype t, const char *p, int64_t s, int64_t n, float *d)
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

static void load_i(dev_dtype t, const char *p, int64_t s, int64_t n, int64_t *d)
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

static void store_d(dev_dtype t, char *p, int64_t s, int64_t n, const double *v)
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

static void store_f(dev_dtype t, char *p, int64_t s, int64_t n, const float *v)
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
static void store_i(dev_dtype t, char *p, int64_t s, int64_t n, const int64_t *v)
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

static void load_run(cclass c, dev_dtype t, const char *p, int64_t s, int64_t n, void *d)
{
  switch (c) {
  case C_FLOAT: load_f(t, p, s, n, d); break;
  case C_DOUBLE: load_d(t, p, s, n, d); break;
  case C_INT: load_i(t, p, s, n, d); break;
  }
}

static void store_run(cclass c, dev_dtype t, char *p, int64_t s, int64_t n, const void *v)
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

static void walk_init(walk *w, const dev_view *v)
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

static void walk_1d(walk *w, char *p, int64_t esz, int64_t n, int64_t stride)
{
  w->p = p;
  w->esz = esz;
  w->nd = 1;
  w->shape[0] = n;
  w->stride[0] = stride;
  w->idx[0] = 0;
  w->off = 0;
}

static int64_t walk_avail(const walk *w) { return w->shape[w->nd - 1] - w->idx[w->nd - 1]; }

/* The next run of at most max elements: its start and stride.  Advances past it. */
static int64_t walk_run(walk *w, int64_t max, char **p, int64_t *stride)
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

static void walk_load(walk *w, dev_dtype t, cclass c, int64_t n, void *dst)
{
  char *d = dst, *p;
  int64_t s, k, csz = (int64_t)class_size(c);
  for (; n > 0; n -= k, d += k * csz) {
    k = walk_run(w, n, &p, &s);
    load_run(c, t, p, s, k, d);
  }
}

static void walk_store(walk *w, dev_dtype t, cclass c, int64_t n, const void *src)
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
static void copy_run(int64_t esz, char *d, int64_t ds, const char *s, int64_t ss, int64_t n)
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
static int check_view(const dev_view *v, const char *what, char *err, size_t errlen)
{
  return dev_view_check(v, what, err, errlen);
}

static double scalar_d(dev_scalar s) { return s.is_int ? (double)s.i : s.f; }

/* A scalar operand in t's compute type.  Integer dtypes take an integer scalar
 * exactly; a float one, and anything for bool, goes through t's store rule. */
static void scalar_to(dev_scalar s, dev_dtype t, block *b)
{
  char elem[8];
  int64_t v;
  switch (class_of(t)) {
  case C_FLOAT: for (int i = 0; i < BLK; i++) b->f[i] = (float)scalar_d(s); break;
  case C_DOUBLE: for (int i = 0; i < BLK; i++) b->d[i] = scalar_d(s); break;
  case C_INT:
    v = s.i;
    if (!s.is_int || t == DEV_BOOL) {
      if (s.is_int) store_i(t, elem, 1, 1, &s.i);
      else store_d(t, elem, 1, 1, &s.f);
      load_i(t, elem, 1, 1, &v);
    }
    for (int i = 0; i < BLK; i++) b->i[i] = v;
    break;
  }
}

/* The bytes [*lo, *hi) a view's elements span (strides of any sign). */
static void view_span(const dev_view *v, const char **lo, const char **hi)
{
  int64_t a = 0, b = 0, esz = (int64_t)dev_dtype_size(v->dtype);
  for (int d = 0; d < v->ndim; d++) {
    int64_t e = (v->shape[d] - 1) * v->stride[d];
    if (e < 0) a += e; else b += e;
  }
  *lo = (const char *)dev_view_ptr(v) + a * esz;
  *hi = (const char *)dev_view_ptr(v) + (b + 1) * esz;
}

static int views_overlap(const dev_view *x, const dev_view *y)
{
  const char *xl, *xh, *yl, *yh;
  view_span(x, &xl, &xh);
  view_span(y, &yl, &yh);
  return xl < yh && yl < xh;
}

static int run_copy(const dev_view *out, const dev_view *in, char *err, size_t errlen)
{
  walk wo, wi;
  char *po, *pi;
  int64_t n = dev_view_numel(out), k, so, si;
  if (check_view(out, "out", err, errlen) || check_view(in, "in[0]", err, errlen)) return -1;
  if (in->dtype != out->dtype)
    return fail_msg(err, errlen, "copy: dtype %s does not match %s", dev_dtype_name(in->dtype), dev_dtype_name(out->dtype));
  if (dev_view_numel(in) != n) return fail_msg(err, errlen, "copy: element counts differ");
  if (n == 0) return 0;
  if (dev_view_contiguous(out) && dev_view_contiguous(in)) {
    memmove(dev_view_ptr(out), dev_view_ptr(in), (size_t)n * dev_dtype_size(out->dtype));
    return 0;
  }
  if (views_overlap(out, in)) {
    /* read everything before writing anything, as memmove (and the CUDA
     * backend's copy) does: through a packed copy of in */
    size_t esz = dev_dtype_size(out->dtype);
    char *tmp = malloc((size_t)n * esz);
    if (tmp == NULL) return fail_msg(err, errlen, "copy: out of memory staging an overlapping copy");
    walk_init(&wi, in);
    for (int64_t left = n, off = 0; left > 0; left -= k, off += k) {
      k = walk_run(&wi, left, &pi, &si);
      copy_run(wi.esz, tmp + (size_t)off * esz, 1, pi, si, k);
    }
    walk_init(&wo, out);
    for (int64_t left = n, off = 0; left > 0; left -= k, off += k) {
      k = walk_run(&wo, left, &po, &so);
      copy_run(wo.esz, po, so, tmp + (size_t)off * esz, 1, k);
    }
    free(tmp);
    return 0;
  }
  walk_init(&wo, out);
  walk_init(&wi, in);
  for (; n > 0; n -= k) {
    k = min64(walk_avail(&wo), walk_avail(&wi));
    walk_run(&wo, k, &po, &so);
    walk_run(&wi, k, &pi, &si);
    copy_run(wo.esz, po, so, pi, si, k);
  }
  return 0;
}

static int run_fill(const dev_kop *op, char *err, size_t errlen)
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

static int run_arange(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  int exact = op->s0.is_int && op->s1.is_int && class_of(out->dtype) == C_INT;
  double a = scalar_d(op->s0), step = scalar_d(op->s1);
  int64_t n = dev_view_numel(out), done, k, j;
  block b;
  walk w;
  if (check_view(out, "out", err, errlen)) return -1;
  walk_init(&w, out);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    for (j = 0; j < k; j++) {
      if (exact) b.i[j] = sc_wrap64((uint64_t)op->s0.i + (uint64_t)(done + j) * (uint64_t)op->s1.i);
      else b.d[j] = a + (double)(done + j) * step;
    }
    walk_store(&w, out->dtype, exact ? C_INT : C_DOUBLE, k, &b);
  }
  return 0;
}

/* Uniform draws are in [low, high): a value that rounds up to high in a
 * narrow dtype becomes the largest value of that dtype below high. */
static double below_high(double v, double high, dev_dtype t)
{
  float f;
  uint16_t h;
  switch (t) {
  case DEV_F32:
    for (f = (float)v; f >= high;) f = nextafterf(f, -INFINITY);
    return f;
  case DEV_F16:
    for (h = sc_double_to_half(v); sc_half_to_float(h) >= high;) h = sc_step_down16(h);
    return sc_half_to_float(h);
  case DEV_BF16:
    for (h = sc_double_to_bf16(v); sc_bf16_to_float(h) >= high;) h = sc_step_down16(h);
    return sc_bf16_to_float(h);
  default:
    return v < high ? v : nextafter(high, -INFINITY);
  }
}

static int run_rand(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  dev_dtype t = out->dtype;
  int isint = class_of(t) == C_INT, normal = op->code == DEV_RAND_NORMAL, randint = op->code == DEV_RAND_INT;
  double a = scalar_d(op->s0), b = scalar_d(op->s1), u;
  int64_t low = op->s0.is_int ? op->s0.i : sat(op->s0.f, INT64_MIN, INT64_MAX);
  int64_t high = op->s1.is_int ? op->s1.i : sat(op->s1.f, INT64_MIN, INT64_MAX);
  uint64_t range = (uint64_t)high - (uint64_t)low, r;
  int64_t n = dev_view_numel(out), done, k, j;
  uint32_t x[4];
  block v;
  walk w;
  if (check_view(out, "out", err, errlen)) return -1;
  if (op->code != DEV_RAND_UNIFORM && !normal && !randint) return fail_msg(err, errlen, "rand: bad kind %d", op->code);
  if (normal && isint) return fail_msg(err, errlen, "randn needs a float dtype, not %s", dev_dtype_name(t));
  walk_init(&w, out);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    for (j = 0; j < k; j++) {
      dev_philox(op->seed, op->offset + (uint64_t)(done + j), x);
      if (randint) {
        r = range != 0 ? ((uint64_t)x[0] << 32 | x[1]) % range : 0;
        v.i[j] = sc_wrap64((uint64_t)low + r);
      } else if (t == DEV_BOOL) {
        v.i[j] = x[0] & 1;
      } else if (isint) {
        r = range != 0 ? ((uint64_t)x[0] << 32 | x[1]) % range : 0;
        v.i[j] = sc_wrap64((uint64_t)low + r);
      } else if (normal) {
        double z = sqrt(-2.0 * log(sc_unit53(x[0], x[1]))) * cos(TWO_PI * sc_unit53(x[2], x[3]));
        v.d[j] = a + b * z;
      } else {
        u = t == DEV_F64 ? sc_unit53(x[0], x[1]) : ((x[0] >> 8) + 0.5) * 0x1p-24;
        v.d[j] = below_high(a + u * (b - a), b, t);
      }
    }
    walk_store(&w, t, isint || randint ? C_INT : C_DOUBLE, k, &v);
  }
  return 0;
}

/* The ops of ops.h over a block: one case per row and compute type, each a
 * plain loop over the row's scalar function (scalar.h).  The loops run over
 * whole groups of 8 elements, which lets the compiler vectorise them at -O2
 * (no scalar remainder): pad8 zeroes an operand's slots past n up to there.
 * A bool result (0/1) goes to r's int64 array.  Kept out of line: inlined
 * into the walkers' loops, gcc (12, -O2) no longer vectorises them. */
#define RES_SAME(m) m
#define RES_BOOL(m) i
#define BLOCK_FN __attribute__((noinline)) static

static inline int64_t round8(int64_t n) { return (n + 7) & ~(int64_t)7; }

static void pad8(cclass c, block *b, int64_t n)
{
  size_t sz = class_size(c);
  memset((char *)b + (size_t)n * sz, 0, (size_t)(round8(n) - n) * sz);
}

BLOCK_FN void unop_block(int code, cclass c, const block *restrict x, block *restrict r, int64_t n)
{
  int64_t i;
  n = round8(n);
  switch (c) {
  case C_FLOAT:
    switch (code) {
#define U(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_UN_##E: \
      for (i = 0; i < n; i++) r->RES_##res(f)[i] = sc_##name##_f(x->f[i]); break;)
    DEV_UNARY_OPS(U)
#undef U
    default: break;
    }
    break;
  case C_DOUBLE:
    switch (code) {
#define U(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_UN_##E: \
      for (i = 0; i < n; i++) r->RES_##res(d)[i] = sc_##name##_d(x->d[i]); break;)
    DEV_UNARY_OPS(U)
#undef U
    default: break;
    }
    break;
  case C_INT:
    switch (code) {
#define U(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_UN_##E: \
      for (i = 0; i < n; i++) r->i[i] = sc_##name##_i(x->i[i]); break;)
    DEV_UNARY_OPS(U)
#undef U
    default: break;
    }
    break;
  }
}

/* Returns how many integer divisions by zero there were. */
BLOCK_FN int64_t binop_block(int code, cclass c, const block *restrict x, const block *restrict y,
                             block *restrict r, int64_t n)
{
  int64_t i, zeros = 0, n0 = n;
  n = round8(n);
  switch (c) {
  case C_FLOAT:
    switch (code) {
#define B(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_BIN_##E: \
      for (i = 0; i < n; i++) r->RES_##res(f)[i] = sc_##name##_f(x->f[i], y->f[i]); break;)
    DEV_BINARY_OPS(B)
#undef B
    default: break;
    }
    break;
  case C_DOUBLE:
    switch (code) {
#define B(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_BIN_##E: \
      for (i = 0; i < n; i++) r->RES_##res(d)[i] = sc_##name##_d(x->d[i], y->d[i]); break;)
    DEV_BINARY_OPS(B)
#undef B
    default: break;
    }
    break;
  case C_INT:
    switch (code) {
#define B(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_BIN_##E: \
      for (i = 0; i < n; i++) r->i[i] = sc_##name##_i(x->i[i], y->i[i]); \
      if ((fl) & DEV_OPF_ZDIV) for (i = 0; i < n0; i++) zeros += y->i[i] == 0; \
      break;)
    DEV_BINARY_OPS(B)
#undef B
    default: break;
    }
    break;
  }
  return zeros;
}

BLOCK_FN void terop_block(int code, cclass c, const block *restrict x, const block *restrict y,
                          const block *restrict z, block *restrict r, int64_t n)
{
  int64_t i;
  n = round8(n);
  switch (c) {
  case C_FLOAT:
    switch (code) {
#define T(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_TER_##E: \
      for (i = 0; i < n; i++) r->f[i] = sc_##name##_f(x->f[i], y->f[i], z->f[i]); break;)
    DEV_TERNARY_OPS(T)
#undef T
    default: break;
    }
    break;
  case C_DOUBLE:
    switch (code) {
#define T(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_TER_##E: \
      for (i = 0; i < n; i++) r->d[i] = sc_##name##_d(x->d[i], y->d[i], z->d[i]); break;)
    DEV_TERNARY_OPS(T)
#undef T
    default: break;
    }
    break;
  case C_INT:
    switch (code) {
#define T(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_TER_##E: \
      for (i = 0; i < n; i++) r->i[i] = sc_##name##_i(x->i[i], y->i[i], z->i[i]); break;)
    DEV_TERNARY_OPS(T)
#undef T
    default: break;
    }
    break;
  }
}

/* The op's dtype rule (ops.h), as dev_op.c's validate has it. */
static int check_classes(const dev_opinfo *o, dev_dtype t, char *err, size_t errlen)
{
  if (!(dev_dtype_class(t) & o->classes))
    return fail_msg(err, errlen, "%s is not defined for %s", o->name, dev_dtype_name(t));
  return 0;
}

static int run_unary(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out, *in = &op->in[0];
  dev_dtype t = out->dtype;
  const dev_opinfo *o = dev_unop_info(op->code);
  cclass c = class_of(in->dtype), rc;
  int64_t n = dev_view_numel(out), done, k;
  block x, r;
  walk wo, wi;
  if ((unsigned)op->code >= DEV_NUNOP) return fail_msg(err, errlen, "unary: bad op %d", op->code);
  if (op->code == DEV_UN_COPY && in->dtype == t) return run_copy(out, in, err, errlen);
  if (check_view(out, "out", err, errlen) || check_view(in, "in[0]", err, errlen)) return -1;
  if (dev_view_numel(in) != n) return fail_msg(err, errlen, "%s: element counts differ", dev_unop_name(op->code));
  walk_init(&wo, out);
  walk_init(&wi, in);
  if (op->code == DEV_UN_COPY) {
    /* a cast: integers stay exact as int64, every float is exact in double */
    c = class_of(in->dtype) == C_INT ? C_INT : C_DOUBLE;
    for (done = 0; done < n; done += k) {
      k = min64(BLK, n - done);
      walk_load(&wi, in->dtype, c, k, &x);
      walk_store(&wo, t, c, k, &x);
    }
    return 0;
  }
  if (o->to_bool ? t != DEV_BOOL : in->dtype != t)
    return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(in->dtype), dev_dtype_name(t));
  if (check_classes(o, in->dtype, err, errlen)) return -1;
  rc = o->to_bool ? C_INT : c;
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    walk_load(&wi, in->dtype, c, k, &x);
    pad8(c, &x, k);
    unop_block(op->code, c, &x, &r, k);
    walk_store(&wo, t, rc, k, &r);
  }
  return 0;
}

static int run_binary(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  const dev_opinfo *o = dev_binop_info(op->code);
  dev_dtype t = op->in[0].dtype;
  cclass c = class_of(t), rc;
  int scalar = (op->flags & (DEV_F_SCALAR | DEV_F_SCALAR_LEFT)) != 0;
  int left = (op->flags & DEV_F_SCALAR_LEFT) != 0;
  int64_t n = dev_view_numel(out), done, k, zeros = 0;
  block x, y, r;
  walk wo, wa, wb;
  if (o == NULL) return fail_msg(err, errlen, "binary: bad op %d", op->code);
  if (check_view(out, "out", err, errlen) || check_view(&op->in[0], "in[0]", err, errlen) ||
      (!scalar && check_view(&op->in[1], "in[1]", err, errlen)))
    return -1;
  if (o->to_bool && out->dtype != DEV_BOOL)
    return fail_msg(err, errlen, "%s: the result is bool, not %s", o->name, dev_dtype_name(out->dtype));
  for (int i = 0; i < (scalar ? 1 : 2); i++) {
    if (op->in[i].dtype != (o->to_bool ? t : out->dtype))
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name,
                  dev_dtype_name(op->in[i].dtype), dev_dtype_name(o->to_bool ? t : out->dtype));
    if (dev_view_numel(&op->in[i]) != n)
      return fail_msg(err, errlen, "%s: element counts differ", o->name);
  }
  if (check_classes(o, t, err, errlen)) return -1;
  rc = o->to_bool ? C_INT : c;
  walk_init(&wo, out);
  walk_init(&wa, &op->in[0]);
  if (scalar) scalar_to(op->s0, t, left ? &x : &y);
  else walk_init(&wb, &op->in[1]);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    walk_load(&wa, t, c, k, left ? &y : &x);
    pad8(c, left ? &y : &x, k);
    if (!scalar) {
      walk_load(&wb, t, c, k, &y);
      pad8(c, &y, k);
    }
    zeros += binop_block(op->code, c, &x, &y, &r, k);
    walk_store(&wo, out->dtype, rc, k, &r);
  }
  if (zeros > 0) return fail_msg(err, errlen, "integer division by zero");
  return 0;
}

/* Operands 2 and 3 are the next tensors of in[] or, flagged, s0 and s1; a
 * condition (DEV_OPF_COND) is loaded as 0/1 in the compute type. */
static int run_ternary(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out, *v[3] = {&op->in[0], NULL, NULL};
  const dev_opinfo *o = dev_terop_info(op->code);
  dev_dtype t = out->dtype;
  cclass c = class_of(t);
  int s2 = (op->flags & DEV_F_SCALAR2) != 0, s3 = (op->flags & DEV_F_SCALAR3) != 0;
  int64_t n = dev_view_numel(out), done, k;
  block b[3], r;
  walk wo, w[3];
  static const char *const names[] = {"in[0]", "in[1]", "in[2]"};
  if (o == NULL) return fail_msg(err, errlen, "ternary: bad op %d", op->code);
  if (op->nin != 1 + !s2 + !s3) return fail_msg(err, errlen, "%s: bad operands", o->name);
  if (!s2) v[1] = &op->in[1];
  if (!s3) v[2] = &op->in[s2 ? 1 : 2];
  if (check_view(out, "out", err, errlen)) return -1;
  for (int j = 0, i = 0; j < 3; j++) {
    dev_dtype want = j == 0 && (o->flags & DEV_OPF_COND) ? DEV_BOOL : t;
    if (!v[j]) continue;
    if (check_view(v[j], names[i++], err, errlen)) return -1;
    if (v[j]->dtype != want)
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(v[j]->dtype),
                  dev_dtype_name(want));
    if (dev_view_numel(v[j]) != n) return fail_msg(err, errlen, "%s: element counts differ", o->name);
  }
  if (check_classes(o, t, err, errlen)) return -1;
  walk_init(&wo, out);
  for (int j = 0; j < 3; j++)
    if (v[j]) walk_init(&w[j], v[j]);
  if (s2) scalar_to(op->s0, t, &b[1]);
  if (s3) scalar_to(op->s1, t, &b[2]);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    for (int j = 0; j < 3; j++) {
      if (!v[j]) continue;
      walk_load(&w[j], v[j]->dtype, c, k, &b[j]);
      pad8(c, &b[j], k);
    }
    terop_block(op->code, c, &b[0], &b[1], &b[2], &r, k);
    walk_store(&wo, t, c, k, &r);
  }
  return 0;
}

/* Reduces the len elements w yields.  Float sources are read as double,
 * integer and bool ones as int64.  The result goes to *d or *i (see
 * red_class); argmax/argmin give the 1-based position of the first maximum
 * (minimum), or of the first NaN.  var, std and logsumexp walk twice (a
 * copy of w): the mean, or the maximum, first. */
static void reduce_walk(walk *w, dev_dtype t, int code, int64_t len, dev_scalar opt, double *d, int64_t *i)
{
  int isint = class_of(t) == C_INT;
  double sum = 0, best = 0, prod = 1, p = opt.f, shift = 0;
  uint64_t isum = 0, iprod = 1;
  int64_t ibest = 0, at = 0, done, k, j, truth = code == DEV_RED_ALL;
  int pass, npass = code == DEV_RED_VAR || code == DEV_RED_STD || code == DEV_RED_LOGSUMEXP ? 2 : 1;
  walk w0 = *w;
  block b;
  for (pass = 0; pass < npass; pass++) {
    if (pass == 1) {
      *w = w0;
      shift = code == DEV_RED_LOGSUMEXP ? best : sum / (double)len;
      if (code == DEV_RED_LOGSUMEXP && (best != best || isinf(best))) break;   /* NaN, or +-inf: the max */
      sum = 0;
    }
    for (done = 0; done < len; done += k) {
      k = min64(BLK, len - done);
      walk_load(w, t, isint ? C_INT : C_DOUBLE, k, &b);
      if (done == 0 && pass == 0) {
        if (isint) ibest = b.i[0];
        else best = b.d[0];
      }
      switch (code) {
      case DEV_RED_SUM: case DEV_RED_MEAN:
        if (!isint) for (j = 0; j < k; j++) sum += b.d[j];
        else if (code == DEV_RED_SUM) for (j = 0; j < k; j++) isum += (uint64_t)b.i[j];
        else for (j = 0; j < k; j++) sum += (double)b.i[j];
        break;
      case DEV_RED_PROD:
        if (!isint) for (j = 0; j < k; j++) prod *= b.d[j];
        else for (j = 0; j < k; j++) iprod *= (uint64_t)b.i[j];
        break;
      case DEV_RED_MAX: case DEV_RED_ARGMAX: case DEV_RED_LOGSUMEXP:
        if (pass == 1) {
          for (j = 0; j < k; j++) sum += exp(b.d[j] - shift);
        } else if (!isint) {
          for (j = 0; j < k && best == best; j++)
            if (b.d[j] > best || b.d[j] != b.d[j]) { best = b.d[j]; at = done + j; }
        } else {
          for (j = 0; j < k; j++)
            if (b.i[j] > ibest) { ibest = b.i[j]; at = done + j; }
        }
        break;
      case DEV_RED_MIN: case DEV_RED_ARGMIN:
        if (!isint) {
          for (j = 0; j < k && best == best; j++)
            if (b.d[j] < best || b.d[j] != b.d[j]) { best = b.d[j]; at = done + j; }
        } else {
          for (j = 0; j < k; j++)
            if (b.i[j] < ibest) { ibest = b.i[j]; at = done + j; }
        }
        break;
      case DEV_RED_VAR: case DEV_RED_STD:
        if (pass == 0) for (j = 0; j < k; j++) sum += b.d[j];
        else for (j = 0; j < k; j++) sum += (b.d[j] - shift) * (b.d[j] - shift);
        break;
      case DEV_RED_NORM:
        /* inf: the largest magnitude, NaN winning as for max */
        if (isinf(p)) {
          if (done == 0) best = fabs(best);
          for (j = 0; j < k && best == best; j++)
            if (fabs(b.d[j]) > best || b.d[j] != b.d[j]) best = fabs(b.d[j]);
        } else if (p == 1) {
          for (j = 0; j < k; j++) sum += fabs(b.d[j]);
        } else if (p == 2) {
          for (j = 0; j < k; j++) sum += b.d[j] * b.d[j];
        } else {
          for (j = 0; j < k; j++) sum += pow(fabs(b.d[j]), p);
        }
        break;
      case DEV_RED_ANY: case DEV_RED_ALL:
        /* any: a nonzero (NaN is one) decides; all: a zero */
        for (j = 0; j < k && truth == (code == DEV_RED_ALL); j++)
          if ((isint ? b.i[j] != 0 : b.d[j] != 0) != truth) truth = !truth;
        break;
      default: break;
      }
      if ((code == DEV_RED_ANY || code == DEV_RED_ALL) && truth != (code == DEV_RED_ALL)) break;
    }
  }
  switch (code) {
  case DEV_RED_SUM: if (isint) *i = sc_wrap64(isum); else *d = sum; break;
  case DEV_RED_PROD: if (isint) *i = sc_wrap64(iprod); else *d = prod; break;
  case DEV_RED_MEAN: *d = sum / (double)len; break;
  case DEV_RED_ARGMAX: case DEV_RED_ARGMIN: *i = at + 1; break;
  case DEV_RED_ANY: case DEV_RED_ALL: *i = truth; break;
  case DEV_RED_VAR: *d = sum / (double)(len - opt.i); break;
  case DEV_RED_STD: *d = sqrt(sum / (double)(len - opt.i)); break;
  case DEV_RED_NORM: *d = isinf(p) ? best : p == 1 ? sum : p == 2 ? sqrt(sum) : pow(sum, 1 / p); break;
  case DEV_RED_LOGSUMEXP: *d = best != best || isinf(best) ? best : best + log(sum); break;
  default: if (isint) *i = ibest; else *d = best; break;
  }
}

static cclass red_class(int code, dev_dtype src)
{
  switch (dev_redop_info(code)->result) {
  case DEV_RRES_INDEX: case DEV_RRES_BOOL: return C_INT;
  case DEV_RRES_MEAN: return C_DOUBLE;
  default: return class_of(src) == C_INT ? C_INT : C_DOUBLE;
  }
}

/* The dims of v but dim, for a walk over the starts of the runs along dim
 * (each len elements at stride *rstride). */
static void outer_of(const dev_view *v, int dim, dev_view *outer, int64_t *len, int64_t *rstride)
{
  *outer = *v;
  *len = v->shape[dim];
  *rstride = v->stride[dim];
  for (int d = dim; d + 1 < v->ndim; d++) {
    outer->shape[d] = v->shape[d + 1];
    outer->stride[d] = v->stride[d + 1];
  }
  outer->ndim--;
}

/* dim >= 0: out element j (C order) reduces src along dim at the j-th index
 * of the other dims, so an outer walk over src without dim gives each run's
 * start.  Results are buffered and stored a block at a time. */
static int run_reduce(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  int dim = op->dim, code = op->code;
  cclass rc;
  int64_t nout = 1, len, rstride = 0, k, s, j, nbuf = 0;
  dev_view outer;
  walk wo, wouter, inner;
  block res;
  char *p;
  if ((unsigned)code >= DEV_NREDOP) return fail_msg(err, errlen, "reduce: bad op %d", code);
  if (check_view(out, "out", err, errlen) || check_view(src, "in[0]", err, errlen)) return -1;
  if (dim < -1 || dim >= src->ndim) return fail_msg(err, errlen, "%s: bad dim %d", dev_redop_name(code), dim);
  if (!(dev_dtype_class(src->dtype) & dev_redop_info(code)->classes))
    return fail_msg(err, errlen, "%s is not defined for %s", dev_redop_name(code), dev_dtype_name(src->dtype));
  rc = red_class(code, src->dtype);
  if (dim >= 0) {
    outer_of(src, dim, &outer, &len, &rstride);
    nout = dev_view_numel(&outer);
  } else {
    len = dev_view_numel(src);
  }
  if (dev_view_numel(out) != nout)
    return fail_msg(err, errlen, "%s: out has %lld elements, expected %lld", dev_redop_name(code),
                (long long)dev_view_numel(out), (long long)nout);
  if (nout == 0) return 0;
  if (len == 0) {
    dev_kop fill = {.kind = DEV_OP_FILL, .out = *out};
    if (dev_redop_empty(code, &fill.s0))
      return fail_msg(err, errlen, "%s of an empty tensor", dev_redop_name(code));
    return run_fill(&fill, err, errlen);
  }
  walk_init(&wo, out);
  if (dim < 0) {
    walk_init(&inner, src);
    reduce_walk(&inner, src->dtype, code, len, op->s0, &res.d[0], &res.i[0]);
    walk_store(&wo, out->dtype, rc, 1, &res);
    return 0;
  }
  walk_init(&wouter, &outer);
  for (int64_t left = nout; left > 0; left -= k) {
    k = walk_run(&wouter, left, &p, &s);
    for (j = 0; j < k; j++) {
      walk_1d(&inner, p + j * s * wouter.esz, wouter.esz, len, rstride);
      reduce_walk(&inner, src->dtype, code, len, op->s0, &res.d[nbuf], &res.i[nbuf]);
      if (++nbuf == BLK) { walk_store(&wo, out->dtype, rc, nbuf, &res); nbuf = 0; }
    }
  }
  walk_store(&wo, out->dtype, rc, nbuf, &res);
  return 0;
}

/* ---- along one dim: cumsum, softmax ----------------------------------- */

/* f(a's run, b's run) for each pair of runs along dim of a and b, which have
 * one shape (in C order of the other dims). */
typedef int (*row_fn)(char *a, int64_t sa, char *b, int64_t sb, int64_t len, const dev_kop *op, char *err,
                      size_t errlen);

static int each_row(const dev_kop *op, row_fn f, char *err, size_t errlen)
{
  const dev_view *a = &op->in[0], *b = &op->out;
  dev_view oa, ob;
  int64_t len, sa, sb, n, k, j, ka, kb;
  walk wa, wb;
  char *pa, *pb;
  outer_of(a, op->dim, &oa, &len, &sa);
  outer_of(b, op->dim, &ob, &len, &sb);
  n = dev_view_numel(&oa);
  if (n == 0 || len == 0) return 0;
  walk_init(&wa, &oa);
  walk_init(&wb, &ob);
  for (; n > 0; n -= k) {
    k = min64(walk_avail(&wa), walk_avail(&wb));
    walk_run(&wa, k, &pa, &ka);
    walk_run(&wb, k, &pb, &kb);
    for (j = 0; j < k; j++)
      if (f(pa + j * ka * wa.esz, sa, pb + j * kb * wb.esz, sb, len, op, err, errlen)) return -1;
  }
  return 0;
}

/* Floats add up in double, integers and bool in wrapping int64. */
static int cumsum_row(char *a, int64_t sa, char *b, int64_t sb, int64_t len, const dev_kop *op, char *err,
                      size_t errlen)
{
  dev_dtype ti = op->in[0].dtype, to = op->out.dtype;
  cclass c = class_of(ti) == C_INT ? C_INT : C_DOUBLE;
  double acc = 0;
  uint64_t iacc = 0;
  int64_t done, k, j;
  walk wi, wo;
  block x;
  (void)err;
  (void)errlen;
  walk_1d(&wi, a, (int64_t)dev_dtype_size(ti), len, sa);
  walk_1d(&wo, b, (int64_t)dev_dtype_size(to), len, sb);
  for (done = 0; done < len; done += k) {
    k = min64(BLK, len - done);
    walk_load(&wi, ti, c, k, &x);
    if (c == C_INT) for (j = 0; j < k; j++) x.i[j] = sc_wrap64(iacc += (uint64_t)x.i[j]);
    else for (j = 0; j < k; j++) x.d[j] = acc += x.d[j];
    walk_store(&wo, to, c, k, &x);
  }
  return 0;
}

/* Three walks over the row in double: the max, the sum of exp(x - max),
 * the results.  A NaN anywhere makes the row NaN, as an inf max does. */
static int softmax_row(char *a, int64_t sa, char *b, int64_t sb, int64_t len, const dev_kop *op, char *err,
                       size_t errlen)
{
  dev_dtype t = op->in[0].dtype;
  int64_t esz = (int64_t)dev_dtype_size(t), done, k, j;
  double m = -INFINITY, sum = 0, ls;
  walk wi, wo;
  block x;
  (void)err;
  (void)errlen;
  walk_1d(&wi, a, esz, len, sa);
  for (done = 0; done < len; done += k) {
    k = min64(BLK, len - done);
    walk_load(&wi, t, C_DOUBLE, k, &x);
    for (j = 0; j < k; j++) m = x.d[j] > m || x.d[j] != x.d[j] ? x.d[j] : m;
  }
  walk_1d(&wi, a, esz, len, sa);
  for (done = 0; done < len; done += k) {
    k = min64(BLK, len - done);
    walk_load(&wi, t, C_DOUBLE, k, &x);
    for (j = 0; j < k; j++) sum += exp(x.d[j] - m);
  }
  ls = log(sum);
  walk_1d(&wi, a, esz, len, sa);
  walk_1d(&wo, b, esz, len, sb);
  for (done = 0; done < len; done += k) {
    k = min64(BLK, len - done);
    walk_load(&wi, t, C_DOUBLE, k, &x);
    if (op->code == DEV_LOG_SOFTMAX) for (j = 0; j < k; j++) x.d[j] = x.d[j] - m - ls;
    else for (j = 0; j < k; j++) x.d[j] = exp(x.d[j] - m) / sum;
    walk_store(&wo, t, C_DOUBLE, k, &x);
  }
  return 0;
}

static int run_rows(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  const char *name = op->kind == DEV_OP_CUMSUM ? "cumsum" : op->code == DEV_LOG_SOFTMAX ? "log_softmax" : "softmax";
  if (check_view(out, "out", err, errlen) || check_view(src, "in[0]", err, errlen)) return -1;
  if (op->nin != 1 || op->dim < 0 || op->dim >= src->ndim || src->ndim != out->ndim)
    return fail_msg(err, errlen, "%s: bad dim or shape", name);
  for (int d = 0; d < src->ndim; d++)
    if (src->shape[d] != out->shape[d]) return fail_msg(err, errlen, "%s: shapes differ", name);
  if (op->kind == DEV_OP_CUMSUM) {
    if (out->dtype != (class_of(src->dtype) == C_INT ? DEV_I64 : src->dtype))
      return fail_msg(err, errlen, "cumsum: bad result dtype %s", dev_dtype_name(out->dtype));
    return each_row(op, cumsum_row, err, errlen);
  }
  if (class_of(src->dtype) == C_INT || out->dtype != src->dtype)
    return fail_msg(err, errlen, "%s: needs a float dtype, not %s", name, dev_dtype_name(src->dtype));
  return each_row(op, softmax_row, err, errlen);
}

/* ---- indexing ----------------------------------------------------------- */

/* v seen over shape (its strides kept), with stride 0 along dim: the
 * offset of a position but for its index along dim. */
static dev_view base_view(const dev_view *v, const dev_view *shape, int dim)
{
  dev_view r = *v;
  for (int d = 0; d < v->ndim; d++) r.shape[d] = shape->shape[d];
  r.stride[dim] = 0;
  return r;
}

static int index_fail(char *err, size_t errlen, int64_t i, int64_t n)
{
  return fail_msg(err, errlen, "index out of range (%lld not in 1..%lld)", (long long)i, (long long)n);
}

/* gather, index_select: out[p] = src[p with p[dim] = idx[p]]; scatter_add:
 * out[p with p[dim] = idx[p]] += src[p], in C order of idx's positions, so
 * the sums come out the same every time.  Indices are 1-based. */
static int run_index(const dev_kop *op, char *err, size_t errlen)
{
  int scatter = op->code == DEV_IDX_SCATTER_ADD, dim = op->dim;
  const dev_view *out = &op->out, *idx = &op->in[scatter ? 0 : 1], *val = &op->in[scatter ? 1 : 0];
  /* iterated over: where the positions come from (out, or idx) */
  const dev_view *it = scatter ? idx : out, *tgt = scatter ? out : val;
  dev_view base = base_view(tgt, it, dim), vals = base_view(val, it, dim);
  int64_t n = dev_view_numel(it), bound = tgt->shape[dim], sd = tgt->stride[dim], esz, done, k, j, ka, kb;
  dev_dtype t = out->dtype;
  cclass c = class_of(t);
  walk wi, wb, wv;
  char *pb, *pv;
  block ix;
  if (check_view(out, "out", err, errlen) || check_view(&op->in[0], "in[0]", err, errlen) ||
      check_view(&op->in[1], "in[1]", err, errlen))
    return -1;
  if (op->nin != 2 || dim < 0 || dim >= out->ndim || idx->ndim != out->ndim || val->ndim != out->ndim ||
      class_of(idx->dtype) != C_INT || idx->dtype == DEV_BOOL || val->dtype != t)
    return fail_msg(err, errlen, "index: bad operands");
  esz = (int64_t)dev_dtype_size(t);
  vals.stride[dim] = val->stride[dim];   /* src is read at p itself */
  if (n == 0) return 0;
  walk_init(&wi, idx);
  walk_init(&wb, &base);
  walk_init(&wv, scatter ? &vals : out);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, min64(walk_avail(&wb), walk_avail(&wv)));
    walk_load(&wi, idx->dtype, C_INT, k, &ix);
    walk_run(&wb, k, &pb, &ka);
    walk_run(&wv, k, &pv, &kb);
    for (j = 0; j < k; j++) {
      int64_t i = ix.i[j];
      if (i < 1 || i > bound) return index_fail(err, errlen, i, bound);
      char *at = pb + (j * ka + (i - 1) * sd) * esz, *v = pv + j * kb * esz;
      if (!scatter) {
        copy_run(esz, v, 1, at, 1, 1);
      } else {
        union { float f; double d; int64_t i; } x, y;
        load_run(c, t, at, 1, 1, &x);
        load_run(c, t, v, 1, 1, &y);
        if (c == C_FLOAT) x.f += y.f;
        else if (c == C_DOUBLE) x.d += y.d;
        else x.i = sc_wrap64((uint64_t)x.i + (uint64_t)y.i);
        store_run(c, t, at, 1, 1, &x);
      }
    }
  }
  return 0;
}

/* OpenBLAS, loaded with dlopen at the first matmul; without it, the built-in
 * loops.  Linked, its constructor started its threads (one per CPU) in
 * every gpulua process, whether it multiplied or not, and under an
 * address-space limit (ulimit -v 8000000) on a host of 64 CPUs they spun
 * in mmap for their buffers and the process hung at exit even after
 * `gpulua -e "print(1)"` (OPENBLAS_NUM_THREADS=1 did not hang). */
#ifdef GPULUA_HAVE_OPENBLAS
static struct {
  pthread_once_t once;
  __typeof__(cblas_sgemm) *sgemm;
  __typeof__(cblas_dgemm) *dgemm;
  char bad[160];   /* GPULUA_HOST_BLAS is neither on nor off: every matmul says so */
} blas = {PTHREAD_ONCE_INIT, NULL, NULL, ""};

static void blas_load(void)
{
  /* off: the built-in loops (tests/runtime.lua) */
  int on = 1;
  if (env_flag("GPULUA_HOST_BLAS", &on, blas.bad, sizeof blas.bad) || !on) return;
  const char *names[] = {"libopenblas.so.0", "libopenblas.so", NULL};
  void *lib = NULL;
  for (int i = 0; names[i] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  if (!(*(void **)&blas.sgemm = dlsym(lib, "cblas_sgemm")) || !(*(void **)&blas.dgemm = dlsym(lib, "cblas_dgemm"))) {
    blas.sgemm = NULL;
    blas.dgemm = NULL;
    dlclose(lib);
  }
}

static int have_blas(void)
{
  pthread_once(&blas.once, blas_load);
  return blas.sgemm != NULL;
}

static const char *blas_bad(void)
{
  pthread_once(&blas.once, blas_load);
  return blas.bad[0] ? blas.bad : NULL;
}
#else
static int have_blas(void) { return 0; }
static const char *blas_bad(void) { return NULL; }
#endif

/* A 2-D matmul operand as BLAS takes it: row-major, or transposed, with a
 * leading dimension.  It points into the view when dtype and layout allow,
 * otherwise into a packed copy in the compute type. */
typedef struct mat { char *p; int64_t ld; int trans; void *tmp; } mat;

static int mat_in(mat *m, const dev_view *v, dev_dtype ct, cclass c)
{
  int64_t r = v->shape[0], cols = v->shape[1];
  walk w;
  m->tmp = NULL;
  m->trans = 0;
  if (v->dtype == ct) {
    if ((cols == 1 || v->stride[1] == 1) && (r == 1 || v->stride[0] >= cols)) {
      m->p = dev_view_ptr(v);
      m->ld = r == 1 ? cols : v->stride[0];
      if (m->ld <= INT_MAX) return 0;
    }
    if (have_blas() && (r == 1 || v->stride[0] == 1) && (cols == 1 || v->stride[1] >= r)) {
      m->p = dev_view_ptr(v);
      m->ld = cols == 1 ? r : v->stride[1];
      m->trans = 1;
      if (m->ld <= INT_MAX) return 0;
    }
  }
  m->tmp = malloc((size_t)(r * cols) * class_size(c));
  if (m->tmp == NULL) return -1;
  walk_init(&w, v);
  walk_load(&w, v->dtype, c, r * cols, m->tmp);
  m->p = m->tmp;
  m->ld = cols;
  m->trans = 0;
  return 0;
}

/* i-k-j order: the inner loop runs along rows of b and c. */
static void gemm_f(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float *c, int64_t ldc)
{
  for (int64_t i = 0; i < m; i++) {
    float *ci = c + i * ldc;
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      float aip = a[i * lda + p];
      const float *bp = b + p * ldb;
      for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
    }
  }
}

static void gemm_d(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda,
                   const double *b, int64_t ldb, double *c, int64_t ldc)
{
  for (int64_t i = 0; i < m; i++) {
    double *ci = c + i * ldc;
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      double aip = a[i * lda + p];
      const double *bp = b + p * ldb;
      for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
    }
  }
}

/* Integers: the exact sum modulo 2^64 (unsigned arithmetic wraps), stored
 * wrapped to the dtype's width, as elementwise integer arithmetic does. */
static void gemm_i(int64_t m, int64_t n, int64_t k, const mat *a, const mat *b, int64_t *c, int64_t ldc)
{
  const int64_t *ap = (const int64_t *)a->p, *bp = (const int64_t *)b->p;
  for (int64_t i = 0; i < m; i++) {
    uint64_t *ci = (uint64_t *)(c + i * ldc);
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      uint64_t aip = (uint64_t)(a->trans ? ap[p * a->ld + i] : ap[i * a->ld + p]);
      for (int64_t j = 0; j < n; j++)
        ci[j] += aip * (uint64_t)(b->trans ? bp[j * b->ld + p] : bp[p * b->ld + j]);
    }
  }
}

static int overlaps(const dev_buf *x, const dev_buf *y)
{
  const char *a = x->ptr, *b = y->ptr;
  return x == y || (a < b + y->bytes && b < a + x->bytes);
}

/* f32 and f64 run in their own precision; f16/bf16 in f32; integers in
 * int64, wrapping (gemm_i). */
/* One 2-D product out = a @ b; run_matmul calls it per batch. */
static int matmul_2d(const dev_view *av, const dev_view *bv, const dev_view *ov, char *err, size_t errlen)
{
  dev_dtype t = ov->dtype;
  int sp = class_of(t) == C_FLOAT, in = class_of(t) == C_INT;
  dev_dtype ct = sp ? DEV_F32 : in ? DEV_I64 : DEV_F64;
  cclass c = sp ? C_FLOAT : in ? C_INT : C_DOUBLE;
  mat a = {0}, b = {0};
  char *cp;
  void *ctmp = NULL;
  int64_t m, n, k, ldc;
  int rc = -1;
  walk w;
  m = av->shape[0];
  k = av->shape[1];
  n = bv->shape[1];
  if (bv->shape[0] != k || ov->shape[0] != m || ov->shape[1] != n)
    return fail_msg(err, errlen, "matmul: shapes {%lld,%lld} @ {%lld,%lld} -> {%lld,%lld} do not match",
                (long long)m, (long long)k, (long long)bv->shape[0], (long long)n,
                (long long)ov->shape[0], (long long)ov->shape[1]);
  if (av->dtype != t || bv->dtype != t) return fail_msg(err, errlen, "matmul: dtypes differ");
  if (t == DEV_BOOL) return fail_msg(err, errlen, "matmul does not support bool");
  if (blas_bad()) return fail_msg(err, errlen, "matmul: %s", blas_bad());
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return fail_msg(err, errlen, "matmul: matrix too large");
  if (m == 0 || n == 0) return 0;
  if (k == 0) {
    dev_kop zero = {.kind = DEV_OP_FILL, .out = *ov, .s0 = {.is_int = 1, .i = 0}};
    return run_fill(&zero, err, errlen);
  }
  if (mat_in(&a, av, ct, c) || mat_in(&b, bv, ct, c)) { fail_msg(err, errlen, "out of memory"); goto done; }
  /* write straight into out unless it needs converting, is laid out otherwise
   * or shares memory with an operand */
  if (t == ct && (n == 1 || ov->stride[1] == 1) && (m == 1 || (ov->stride[0] >= n && ov->stride[0] <= INT_MAX)) &&
      !overlaps(ov->buf, av->buf) && !overlaps(ov->buf, bv->buf)) {
    cp = dev_view_ptr(ov);
    ldc = m == 1 ? n : ov->stride[0];
  } else {
    if ((ctmp = malloc((size_t)(m * n) * class_size(c))) == NULL) { fail_msg(err, errlen, "out of memory"); goto done; }
    cp = ctmp;
    ldc = n;
  }
  if (in) gemm_i(m, n, k, &a, &b, (int64_t *)cp, ldc);
#ifdef GPULUA_HAVE_OPENBLAS
  else if (have_blas() && sp)
    blas.sgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, 1.0f, (const float *)a.p, (int)a.ld, (const float *)b.p, (int)b.ld,
                0.0f, (float *)cp, (int)ldc);
  else if (have_blas())
    blas.dgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, 1.0, (const double *)a.p, (int)a.ld, (const double *)b.p, (int)b.ld,
                0.0, (double *)cp, (int)ldc);
#endif
  else if (sp) gemm_f(m, n, k, (const float *)a.p, a.ld, (const float *)b.p, b.ld, (float *)cp, ldc);
  else gemm_d(m, n, k, (const double *)a.p, a.ld, (const double *)b.p, b.ld, (double *)cp, ldc);
  if (ctmp != NULL) {
    walk_init(&w, ov);
    walk_store(&w, t, c, m * n, ctmp);
  }
  rc = 0;
done:
  free(a.tmp);
  free(b.tmp);
  free(ctmp);
  return rc;
}

/* out = in[0] @ in[1]: 2-D, or 3-D with one batch size (an operand's batch
 * stride may be 0: broadcast), one product per batch. */
static int run_matmul(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *av = &op->in[0], *bv = &op->in[1], *ov = &op->out;
  if (check_view(ov, "out", err, errlen) || check_view(av, "in[0]", err, errlen) ||
      check_view(bv, "in[1]", err, errlen))
    return -1;
  if (av->ndim != ov->ndim || bv->ndim != ov->ndim || (ov->ndim != 2 && ov->ndim != 3))
    return fail_msg(err, errlen, "matmul needs 2-D tensors, or 3-D ones of one batch size");
  if (ov->ndim == 2) return matmul_2d(av, bv, ov, err, errlen);
  if (av->shape[0] != ov->shape[0] || bv->shape[0] != ov->shape[0])
    return fail_msg(err, errlen, "matmul: batch sizes %lld, %lld -> %lld differ", (long long)av->shape[0],
                (long long)bv->shape[0], (long long)ov->shape[0]);
  for (int64_t i = 0; i < ov->shape[0]; i++) {
    dev_view a = dev_view_batch(av, i), b = dev_view_batch(bv, i), o = dev_view_batch(ov, i);
    if (matmul_2d(&a, &b, &o, err, errlen)) return -1;
  }
  return 0;
}

static int run_sleep(double ms)
{
  struct timespec ts;
  if (!(ms > 0)) return 0;
  if (ms > 1e12) ms = 1e12;   /* keeps the conversion to time_t defined */
  ts.tv_sec = (time_t)(ms / 1000);
  ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
  if (ts.tv_nsec < 0) ts.tv_nsec = 0;
  if (ts.tv_nsec > 999999999L) ts.tv_nsec = 999999999L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  return 0;
}

int dev_cpu_run(const dev_kop *op, char *err, size_t errlen)
{
  if (op == NULL) return fail_msg(err, errlen, "no op");
  switch (op->kind) {
  case DEV_OP_FILL: return run_fill(op, err, errlen);
  case DEV_OP_ARANGE: return run_arange(op, err, errlen);
  case DEV_OP_RAND: return run_rand(op, err, errlen);
  case DEV_OP_UNARY: return run_unary(op, err, errlen);
  case DEV_OP_BINARY: return run_binary(op, err, errlen);
  case DEV_OP_TERNARY: return run_ternary(op, err, errlen);
  case DEV_OP_REDUCE: return run_reduce(op, err, errlen);
  case DEV_OP_MATMUL: return run_matmul(op, err, errlen);
  case DEV_OP_COPY: return run_copy(&op->out, &op->in[0], err, errlen);
  case DEV_OP_CUMSUM: case DEV_OP_SOFTMAX: return run_rows(op, err, errlen);
  case DEV_OP_INDEX: return run_index(op, err, errlen);
  case DEV_OP_SLEEP: return run_sleep(op->ms);
  case DEV_OP_LAUNCH:
    if (op->launch && dev_kernel_is_cfunc(op->launch->k)) return dev_cfunc_run(op->launch, NULL, err, errlen);
    return fail_msg(err, errlen, "run-time kernels need the cuda backend");
  }
  return fail_msg(err, errlen, "unknown op kind %d", (int)op->kind);
}

/* Philox-4x32-10: scalar.h's, which the kernels share. */
void dev_philox(uint64_t seed, uint64_t counter, uint32_t out[4])
{
  sc_philox(seed, counter, out);
}
