/* gpulua host kernels: the reductions of ops.h (whole tensor or along a
 * dim), and the ops along one dim: cumsum, softmax, log_softmax.  Part of
 * the CPU kernels (cuda/cpu_ops.c runs them; cpu_priv.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_priv.h"
#include "ops.h"

/* A reduction's running state: the sums and products (float sources in
 * double, integer and bool ones in wrapping int64), the best value so far
 * and its position, any/all's truth; p is norm's order, shift the mean or
 * the maximum of a first pass. */
typedef struct racc {
  int code, isint;
  double sum, best, prod, p, shift;
  uint64_t isum, iprod;
  int64_t ibest, at, truth;
  double lane[8];   /* sum and mean of floats: element i adds into lane[i % 8] */
} racc;

/* Float sums keep 8 running sums in double, element i going to lane i % 8,
 * in order: independent adds the compiler vectorises (a single running sum
 * waits on each add), the same order whatever the layout, and folded
 * pairwise at the end.  Far tighter than float pairwise summation (NumPy's). */
static void sum_lanes(double *restrict lane, const double *restrict x, int64_t k)
{
  int64_t j, k8 = k & ~(int64_t)7;
  /* named, so that they stay in registers */
  double s0 = lane[0], s1 = lane[1], s2 = lane[2], s3 = lane[3], s4 = lane[4], s5 = lane[5], s6 = lane[6],
         s7 = lane[7];
  for (j = 0; j < k8; j += 8) {
    s0 += x[j]; s1 += x[j + 1]; s2 += x[j + 2]; s3 += x[j + 3];
    s4 += x[j + 4]; s5 += x[j + 5]; s6 += x[j + 6]; s7 += x[j + 7];
  }
  lane[0] = s0; lane[1] = s1; lane[2] = s2; lane[3] = s3; lane[4] = s4; lane[5] = s5; lane[6] = s6; lane[7] = s7;
  for (; j < k; j++) lane[j - k8] += x[j];
}

static void sum_lanes_f32(double *restrict lane, const float *restrict x, int64_t k)
{
  int64_t j, k8 = k & ~(int64_t)7;
  /* named, so that they stay in registers */
  double s0 = lane[0], s1 = lane[1], s2 = lane[2], s3 = lane[3], s4 = lane[4], s5 = lane[5], s6 = lane[6],
         s7 = lane[7];
  for (j = 0; j < k8; j += 8) {
    s0 += (double)x[j]; s1 += (double)x[j + 1]; s2 += (double)x[j + 2]; s3 += (double)x[j + 3];
    s4 += (double)x[j + 4]; s5 += (double)x[j + 5]; s6 += (double)x[j + 6]; s7 += (double)x[j + 7];
  }
  lane[0] = s0; lane[1] = s1; lane[2] = s2; lane[3] = s3; lane[4] = s4; lane[5] = s5; lane[6] = s6; lane[7] = s7;
  for (; j < k; j++) lane[j - k8] += (double)x[j];
}

static double fold_lanes(const double *l)
{
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The largest (max, argmax, logsumexp's first pass) or smallest element of
 * a block, the first NaN winning for floats; at counts from done. */
static void acc_best(racc *a, const block *b, int64_t done, int64_t k, int max)
{
  int64_t j;
  if (!a->isint) {
    for (j = 0; j < k && a->best == a->best; j++)
      if ((max ? b->d[j] > a->best : b->d[j] < a->best) || b->d[j] != b->d[j]) {
        a->best = b->d[j];
        a->at = done + j;
      }
  } else {
    for (j = 0; j < k; j++)
      if (max ? b->i[j] > a->ibest : b->i[j] < a->ibest) { a->ibest = b->i[j]; a->at = done + j; }
  }
}

/* norm of order p: inf the largest magnitude (NaN winning as for max), else
 * the sum of |x|^p */
static void acc_norm(racc *a, const block *b, int64_t done, int64_t k)
{
  int64_t j;
  double p = a->p;
  if (isinf(p)) {
    if (done == 0) a->best = fabs(a->best);
    for (j = 0; j < k && a->best == a->best; j++)
      if (fabs(b->d[j]) > a->best || b->d[j] != b->d[j]) a->best = fabs(b->d[j]);
  } else if (p == 1) {
    for (j = 0; j < k; j++) a->sum += fabs(b->d[j]);
  } else if (p == 2) {
    for (j = 0; j < k; j++) a->sum += b->d[j] * b->d[j];
  } else {
    for (j = 0; j < k; j++) a->sum += pow(fabs(b->d[j]), p);
  }
}

/* One block of k elements, the done-th to the (done+k-1)-th, of pass pass. */
static void acc_block(racc *a, const block *b, int64_t done, int64_t k, int pass)
{
  int code = a->code, isint = a->isint;
  int64_t j;
  switch (code) {
  case DEV_RED_SUM: case DEV_RED_MEAN:
    if (!isint) sum_lanes(a->lane, b->d, k);
    else if (code == DEV_RED_SUM) for (j = 0; j < k; j++) a->isum += (uint64_t)b->i[j];
    else for (j = 0; j < k; j++) a->sum += (double)b->i[j];
    break;
  case DEV_RED_PROD:
    if (!isint) for (j = 0; j < k; j++) a->prod *= b->d[j];
    else for (j = 0; j < k; j++) a->iprod *= (uint64_t)b->i[j];
    break;
  case DEV_RED_MAX: case DEV_RED_ARGMAX: case DEV_RED_LOGSUMEXP:
    if (pass == 1) for (j = 0; j < k; j++) a->sum += exp(b->d[j] - a->shift);
    else acc_best(a, b, done, k, 1);
    break;
  case DEV_RED_MIN: case DEV_RED_ARGMIN:
    acc_best(a, b, done, k, 0);
    break;
  case DEV_RED_VAR: case DEV_RED_STD:
    if (pass == 0) for (j = 0; j < k; j++) a->sum += b->d[j];
    else for (j = 0; j < k; j++) a->sum += (b->d[j] - a->shift) * (b->d[j] - a->shift);
    break;
  case DEV_RED_NORM:
    acc_norm(a, b, done, k);
    break;
  case DEV_RED_ANY: case DEV_RED_ALL:
    /* any: a nonzero (NaN is one) decides; all: a zero */
    for (j = 0; j < k && a->truth == (code == DEV_RED_ALL); j++)
      if ((isint ? b->i[j] != 0 : b->d[j] != 0) != a->truth) a->truth = !a->truth;
    break;
  default: break;
  }
}

/* The result of len elements, in *d or *i (see red_class). */
static void acc_result(const racc *a, int64_t len, dev_scalar opt, double *d, int64_t *i)
{
  double sum = a->sum, best = a->best, p = a->p;
  int isint = a->isint;
  if (!isint && (a->code == DEV_RED_SUM || a->code == DEV_RED_MEAN)) sum = fold_lanes(a->lane);
  switch (a->code) {
  case DEV_RED_SUM: if (isint) *i = sc_wrap64(a->isum); else *d = sum; break;
  case DEV_RED_PROD: if (isint) *i = sc_wrap64(a->iprod); else *d = a->prod; break;
  case DEV_RED_MEAN: *d = sum / (double)len; break;
  case DEV_RED_ARGMAX: case DEV_RED_ARGMIN: *i = a->at + 1; break;
  case DEV_RED_ANY: case DEV_RED_ALL: *i = a->truth; break;
  case DEV_RED_VAR: *d = sum / (double)(len - opt.i); break;
  case DEV_RED_STD: *d = sqrt(sum / (double)(len - opt.i)); break;
  case DEV_RED_NORM: *d = isinf(p) ? best : p == 1 ? sum : p == 2 ? sqrt(sum) : pow(sum, 1 / p); break;
  case DEV_RED_LOGSUMEXP: *d = best != best || isinf(best) ? best : best + log(sum); break;
  default: if (isint) *i = a->ibest; else *d = best; break;
  }
}

/* Reduces the len elements w yields.  Float sources are read as double,
 * integer and bool ones as int64.  The result goes to *d or *i (see
 * red_class); argmax/argmin give the 1-based position of the first maximum
 * (minimum), or of the first NaN.  var, std and logsumexp walk twice (a
 * copy of w): the mean, or the maximum, first. */
static void reduce_walk(walk *w, dev_dtype t, int code, int64_t len, dev_scalar opt, double *d, int64_t *i)
{
  racc a = {.code = code, .isint = class_of(t) == C_INT, .prod = 1, .p = opt.f, .iprod = 1,
            .truth = code == DEV_RED_ALL};
  int64_t done, k;
  int pass, npass = code == DEV_RED_VAR || code == DEV_RED_STD || code == DEV_RED_LOGSUMEXP ? 2 : 1;
  walk w0 = *w;
  block b;
  for (pass = 0; pass < npass; pass++) {
    if (pass == 1) {
      *w = w0;
      a.shift = code == DEV_RED_LOGSUMEXP ? a.best : a.sum / (double)len;
      if (code == DEV_RED_LOGSUMEXP && (a.best != a.best || isinf(a.best))) break;   /* NaN, or +-inf: the max */
      a.sum = 0;
    }
    for (done = 0; done < len; done += k) {
      k = min64(BLK, len - done);
      walk_load(w, t, a.isint ? C_INT : C_DOUBLE, k, &b);
      if (done == 0 && pass == 0) {
        if (a.isint) a.ibest = b.i[0];
        else a.best = b.d[0];
      }
      acc_block(&a, &b, done, k, pass);
      if ((code == DEV_RED_ANY || code == DEV_RED_ALL) && a.truth != (code == DEV_RED_ALL)) break;
    }
  }
  acc_result(&a, len, opt, d, i);
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
int cpu_run_reduce(const dev_kop *op, char *err, size_t errlen)
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
  if (dim < 0 && (code == DEV_RED_SUM || code == DEV_RED_MEAN) && (src->dtype == DEV_F32 || src->dtype == DEV_F64) &&
      dev_view_contiguous(src)) {
    /* the walk's order (lane i % 8), read in place: no conversion into blocks */
    racc a = {.code = code};
    if (src->dtype == DEV_F32) sum_lanes_f32(a.lane, dev_view_ptr(src), len);
    else sum_lanes(a.lane, dev_view_ptr(src), len);
    acc_result(&a, len, op->s0, &res.d[0], &res.i[0]);
    walk_store(&wo, out->dtype, rc, 1, &res);
    return 0;
  }
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
int cpu_each_row(const dev_kop *op, cpu_row_fn f, char *err, size_t errlen)
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

/* Floats add up (or multiply) in double, integers and bool in wrapping
 * int64. */
static int cumsum_row(char *a, int64_t sa, char *b, int64_t sb, int64_t len, const dev_kop *op, char *err,
                      size_t errlen)
{
  dev_dtype ti = op->in[0].dtype, to = op->out.dtype;
  cclass c = class_of(ti) == C_INT ? C_INT : C_DOUBLE;
  int prod = op->code == DEV_CUM_PROD;
  double acc = prod;
  uint64_t iacc = (uint64_t)prod;
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
    if (prod && c == C_INT) for (j = 0; j < k; j++) x.i[j] = sc_wrap64(iacc *= (uint64_t)x.i[j]);
    else if (prod) for (j = 0; j < k; j++) x.d[j] = acc *= x.d[j];
    else if (c == C_INT) for (j = 0; j < k; j++) x.i[j] = sc_wrap64(iacc += (uint64_t)x.i[j]);
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

int cpu_run_rows(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  const char *name = dev_op_name(op);
  if (check_view(out, "out", err, errlen) || check_view(src, "in[0]", err, errlen)) return -1;
  if (op->nin != 1 || op->dim < 0 || op->dim >= src->ndim || src->ndim != out->ndim)
    return fail_msg(err, errlen, "%s: bad dim or shape", name);
  for (int d = 0; d < src->ndim; d++)
    if (src->shape[d] != out->shape[d]) return fail_msg(err, errlen, "%s: shapes differ", name);
  if (op->kind == DEV_OP_CUMSUM) {
    if (out->dtype != (class_of(src->dtype) == C_INT ? DEV_I64 : src->dtype))
      return fail_msg(err, errlen, "%s: bad result dtype %s", name, dev_dtype_name(out->dtype));
    return cpu_each_row(op, cumsum_row, err, errlen);
  }
  if (class_of(src->dtype) == C_INT || out->dtype != src->dtype)
    return fail_msg(err, errlen, "%s: needs a float dtype, not %s", name, dev_dtype_name(src->dtype));
  return cpu_each_row(op, softmax_row, err, errlen);
}

/* DEV_OP_FUSED with trailing reductions (DEV_F_FREDUCE): the program's
 * values into new contiguous tensors of the inputs' shape, then the
 * reduction of each, as the unfused calls make them (the same bits).  One
 * op of the queue; the cuda backend does it in one pass. */
int cpu_run_fused_reduce(const dev_kop *op, char *err, size_t errlen)
{
  const dev_fprog *p = op->fprog;
  if (!p || op->nin < 1 || p->nred != p->nout || (p->nout > 1 && !op->fargs))
    return fail_msg(err, errlen, "fused: bad program");
  const dev_view *shape = dev_kop_in(op, 0);
  if (check_view(shape, "in", err, errlen)) return -1;
  dev_dtype t = p->node[p->res[0]].dtype;
  int64_t n = dev_view_numel(shape);
  size_t bytes = (size_t)(n > 0 ? n : 1) * dev_dtype_size(t);
  struct dev_buf tmp[DEV_FMAXOUT];
  dev_fargs fa;
  dev_kop ew = *op;
  ew.flags &= ~DEV_F_FREDUCE;
  if (op->fargs) {
    fa = *op->fargs;
    ew.fargs = &fa;
  }
  memset(tmp, 0, sizeof tmp);
  int rc = 0;
  for (int j = 0; j < p->nout && rc == 0; j++) {
    tmp[j].ptr = malloc(bytes);
    tmp[j].bytes = bytes;
    tmp[j].kind = DEV_MEM_HOST;
    if (!tmp[j].ptr) {
      rc = fail_msg(err, errlen, "%s: out of memory (%zu bytes for the values it reduces)", p->name, bytes);
      break;
    }
    dev_view *v = j == 0 ? &ew.out : &fa.xout[j - 1];
    memset(v, 0, sizeof *v);
    v->buf = &tmp[j];
    v->dtype = t;
    v->ndim = shape->ndim;
    int64_t step = 1;
    for (int d = shape->ndim - 1; d >= 0; d--) {
      v->shape[d] = shape->shape[d];
      v->stride[d] = step;
      step *= shape->shape[d];
    }
  }
  if (rc == 0) rc = cpu_run_fused(&ew, err, errlen);
  for (int j = 0; j < p->nout && rc == 0; j++) {
    dev_kop red = {.kind = DEV_OP_REDUCE, .code = p->red[j], .nin = 1, .dim = op->dim, .out = *dev_kop_out(op, j)};
    red.in[0] = j == 0 ? ew.out : fa.xout[j - 1];
    rc = cpu_run_reduce(&red, err, errlen);
  }
  for (int j = 0; j < p->nout; j++) free(tmp[j].ptr);
  return rc;
}
