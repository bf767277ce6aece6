/* Ops: validation, submission, and the host copies built on them (dev_read,
 * dev_write, dev_memset).
 *
 * - An op is validated whole, on an open stream, before anything is
 *   enqueued or waited for.  Then, in this order: the race check, the fences
 *   of reused blocks (a stream not ordered after one waits for it), the
 *   backend's submit, the race checker's record, and only once the backend
 *   took the op, the buffers' uses (the output a write, the inputs reads; a
 *   launch's per its writes[], plus a read of its module, which so outlives
 *   it).  A refused op records no use.
 * - An op whose buffers are all host-visible (not a launch: a launch always
 *   goes to the device) runs on the calling thread, after a host-access
 *   fence on each buffer (the output's as a write).
 * - A copy between pageable host memory and the device is queued like any
 *   other (submit_staged): staged through pinned slots by dev_stage.c, its
 *   pageable buffer guarded by the same uses and host-access fences as a
 *   pinned one.  A device side that is not contiguous goes through a
 *   contiguous device buffer of the same stream.  Only wrapped pageable
 *   memory not guarded (dev_buf_guard: the application may touch it behind
 *   gpulua's back) keeps the driver's blocking copy: a counted sync, the
 *   host waits for its stream.
 * - dev_read of a device source is a counted sync, whose stream first waits
 *   for the source's last writers on other streams: the host never reads
 *   what queued work has yet to write.
 */
#include <string.h>

#include "devpriv.h"
#include "bufx.h"
#include "capture.h"
#include "cpu_ops.h"
#include "race.h"
#include "stage.h"

/* ---- ops -------------------------------------------------------------- */

static int host_visible(const dev_buf *b) { return b->kind != DEV_MEM_DEVICE; }

static int check_view_signed(dev_ctx *ctx, const dev_view *v, const char *what, int back) {
  if (!v->buf) return dev_fail(ctx, DEV_ERR_INVALID, "%s: no buffer", what);
  if (v->buf->ctx != ctx)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s belongs to another gpulua instance", what);
  for (int d = 0; d < v->ndim && d < DEV_MAXDIM; d++)
    if (v->shape[d] < 0 || (v->stride[d] < 0 && !back))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad shape or stride", what);
  char msg[200];
  if (dev_view_check(v, what, msg, sizeof msg)) return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  return DEV_OK;
}

int dev_check_view(dev_ctx *ctx, const dev_view *v, const char *what) {
  return check_view_signed(ctx, v, what, 0);
}

/* Whether in[i] of op may have negative strides: a copy's input, in memory
 * of the output's kind on its device (flip: one copy of a view that walks back; both
 * backends' copy kernels take any sign, and such a copy is never staged). */
static int walks_back_ok(const dev_kop *op, int i) {
  return op->kind == DEV_OP_COPY && i == 0 && op->in[0].buf && op->out.buf &&
         op->in[0].buf->kind == op->out.buf->kind && op->in[0].buf->device == op->out.buf->device;
}

static int same_shape(const dev_view *a, const dev_view *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* ---- checks, one per op kind (ops.h: DEV_OP_KINDS) ---------------------- */

static int check_launch(dev_ctx *ctx, const dev_kop *op) {
  const dev_launch *l = op->launch;
  if (!l || !l->k || (l->k->sig.nparams > 0 && !l->args))
    return dev_fail(ctx, DEV_ERR_INVALID, "launch: no kernel or arguments");
  if (dev_module_ctx(l->k->mod) != ctx)
    return dev_fail(ctx, DEV_ERR_INVALID, "kernel '%s' belongs to another gpulua instance", l->k->sig.name);
  char msg[256];
  if (dev_launch_check(ctx, l->k, l->grid, l->block, l->shared, msg, sizeof msg))
    return dev_fail(ctx, DEV_ERR_INVALID, "kernel '%s': %s", l->k->sig.name, msg);
  for (int i = 0; i < l->nbufs; i++) {
    if (!l->bufs[i] || l->bufs[i]->ctx != ctx)
      return dev_fail(ctx, DEV_ERR_INVALID, "kernel '%s': a tensor of another gpulua instance", l->k->sig.name);
    if (l->bufs[i]->kind == DEV_MEM_HOST)
      return dev_fail(ctx, DEV_ERR_INVALID, "kernel '%s': a kernel cannot reach pageable host memory",
                      l->k->sig.name);
  }
  return DEV_OK;
}

static int check_sleep(dev_ctx *ctx, const dev_kop *op) {
  if (!(op->ms >= 0 && op->ms <= 1e7))
    return dev_fail(ctx, DEV_ERR_INVALID, "sleep: bad duration");
  return DEV_OK;
}

/* fill and arange: any dtype, any output */
static int check_fill(dev_ctx *ctx, const dev_kop *op) {
  (void)ctx;
  (void)op;
  return DEV_OK;
}
#define check_arange check_fill

static int check_rand(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  int isf = dev_dtype_is_float(t);
  if (op->code == DEV_RAND_NORMAL && !isf)
    return dev_fail(ctx, DEV_ERR_INVALID, "randn needs a floating dtype, got %s",
                    dev_dtype_name(t));
  if (op->code == DEV_RAND_UNIFORM && !isf && t != DEV_BOOL && op->s1.i <= op->s0.i)
    return dev_fail(ctx, DEV_ERR_INVALID, "rand: empty range");
  if (op->code == DEV_RAND_INT && (!op->s0.is_int || !op->s1.is_int || op->s1.i <= op->s0.i))
    return dev_fail(ctx, DEV_ERR_INVALID, "randint: empty range");
  if ((unsigned)op->code > DEV_RAND_INT) return dev_fail(ctx, DEV_ERR_INVALID, "rand: bad kind %d", op->code);
  return DEV_OK;
}

static int check_unary(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  if (op->nin != 1 || (unsigned)op->code >= DEV_NUNOP)
    return dev_fail(ctx, DEV_ERR_INVALID, "unary: bad op");
  if (dev_view_numel(&op->in[0]) != dev_view_numel(&op->out))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: numel mismatch", dev_unop_name(op->code));
  if (op->code == DEV_UN_COPY) return DEV_OK;
  const dev_opinfo *o = dev_unop_info(op->code);
  dev_dtype it = op->in[0].dtype;
  if ((o->to_bool ? t != DEV_BOOL : it != t) || !same_shape(&op->in[0], &op->out))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype or shape mismatch", o->name);
  if (!(dev_dtype_class(it) & o->classes))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s", o->name, dev_dtype_name(it));
  return DEV_OK;
}

static int check_binary(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  int nt = (op->flags & (DEV_F_SCALAR | DEV_F_SCALAR_LEFT)) ? 1 : 2;
  const dev_opinfo *o = dev_binop_info(op->code);
  if (op->nin != nt || !o || ((op->flags & DEV_F_SCALAR_LEFT) && !(o->flags & DEV_OPF_LEFT)))
    return dev_fail(ctx, DEV_ERR_INVALID, "binary: bad operands");
  dev_dtype it = op->in[0].dtype;
  if (o->to_bool && t != DEV_BOOL) return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype or shape mismatch", o->name);
  for (int i = 0; i < nt; i++)
    if (op->in[i].dtype != (o->to_bool ? it : t) || !same_shape(&op->in[i], &op->out))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype or shape mismatch", o->name);
  if (!(dev_dtype_class(it) & o->classes))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s", o->name, dev_dtype_name(it));
  return DEV_OK;
}

static int check_ternary(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  const dev_opinfo *o = dev_terop_info(op->code);
  int nt = 1 + !(op->flags & DEV_F_SCALAR2) + !(op->flags & DEV_F_SCALAR3);
  if (!o || op->nin != nt || (op->flags & ~(DEV_F_SCALAR2 | DEV_F_SCALAR3)))
    return dev_fail(ctx, DEV_ERR_INVALID, "ternary: bad operands");
  for (int i = 0; i < nt; i++)
    if (op->in[i].dtype != (i == 0 && (o->flags & DEV_OPF_COND) ? DEV_BOOL : t) ||
        !same_shape(&op->in[i], &op->out))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype or shape mismatch", o->name);
  if (!(dev_dtype_class(t) & o->classes))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s", o->name, dev_dtype_name(t));
  return DEV_OK;
}

static int check_reduce(dev_ctx *ctx, const dev_kop *op) {
  const dev_view *src = &op->in[0];
  const dev_redinfo *r = dev_redop_info(op->code);
  if (op->nin != 1 || !r || op->dim < -1 || op->dim >= src->ndim)
    return dev_fail(ctx, DEV_ERR_INVALID, "reduce: bad op or dim");
  int64_t n = 1, len = dev_view_numel(src);
  if (op->dim >= 0) {
    len = src->shape[op->dim];
    for (int d = 0; d < src->ndim; d++)
      if (d != op->dim) n *= src->shape[d];
  }
  if (dev_view_numel(&op->out) != n)
    return dev_fail(ctx, DEV_ERR_INVALID, "reduce: output numel mismatch");
  if (!(dev_dtype_class(src->dtype) & r->classes))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s", r->name, dev_dtype_name(src->dtype));
  if (op->code == DEV_RED_NORM && !(op->s0.f > 0))
    return dev_fail(ctx, DEV_ERR_INVALID, "norm: p must be > 0");
  if ((op->code == DEV_RED_VAR || op->code == DEV_RED_STD) && (op->s0.i < 0 || op->s0.i > 1))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad correction", r->name);
  dev_scalar e;
  if (len == 0 && n > 0 && dev_redop_empty(op->code, &e))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s of an empty tensor (no identity)", r->name);
  return DEV_OK;
}

/* cumsum and softmax: along one dim, the shape kept */
static int check_along(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  const dev_view *src = &op->in[0];
  dev_dtype it = src->dtype;
  const char *name = dev_op_name(op);
  if (op->nin != 1 || op->dim < 0 || op->dim >= src->ndim || !same_shape(src, &op->out) ||
      (op->kind == DEV_OP_SOFTMAX && (unsigned)op->code > DEV_LOG_SOFTMAX) ||
      (op->kind == DEV_OP_CUMSUM && (unsigned)op->code > DEV_CUM_PROD))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad dim, shape or op", name);
  if (op->kind == DEV_OP_SOFTMAX && !dev_dtype_is_float(it))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s", name, dev_dtype_name(it));
  if (t != (op->kind == DEV_OP_CUMSUM ? dev_redop_dtype(DEV_RED_SUM, it) : it))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype mismatch", name);
  return DEV_OK;
}
#define check_cumsum check_along
#define check_softmax check_along

static int views_overlap(const dev_view *a, const dev_view *b);

/* sort: the 1-based positions along dim, i64, of in[0]'s shape, or the
 * first k of them (out k long along dim: topk) */
static int check_sort(dev_ctx *ctx, const dev_kop *op) {
  const dev_view *src = &op->in[0];
  int shape_ok = op->nin == 1 && op->dim >= 0 && op->dim < src->ndim && src->ndim == op->out.ndim;
  for (int d = 0; shape_ok && d < src->ndim; d++)
    shape_ok = d == op->dim ? op->out.shape[d] <= src->shape[d] : op->out.shape[d] == src->shape[d];
  if (!shape_ok || (unsigned)op->code > (DEV_SORT_DESCENDING | DEV_SORT_STABLE | DEV_SORT_VALUES))
    return dev_fail(ctx, DEV_ERR_INVALID, "sort: bad dim, shape or flags");
  if (op->out.dtype != DEV_I64) return dev_fail(ctx, DEV_ERR_INVALID, "sort: the result must be i64");
  if (!(op->code & DEV_SORT_VALUES)) return DEV_OK;
  /* the values: a view as the output is checked, of out's shape and the
   * input's dtype, not over the positions */
  const dev_view *v = op->fargs ? &op->fargs->xout[0] : NULL;
  int rc;
  if (!v) return dev_fail(ctx, DEV_ERR_INVALID, "sort: values asked for, no view for them");
  if ((rc = dev_check_view(ctx, v, "values")) || (rc = dev_check_writable(ctx, v))) return rc;
  if (!same_shape(v, &op->out) || v->dtype != src->dtype)
    return dev_fail(ctx, DEV_ERR_INVALID, "sort: the values must have the positions' shape and the input's dtype");
  if (views_overlap(v, &op->out)) return dev_fail(ctx, DEV_ERR_INVALID, "sort: values and positions overlap");
  return DEV_OK;
}

static int check_index(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  const char *name = dev_op_name(op);
  int scatter = op->code == DEV_IDX_SCATTER_ADD;
  const dev_view *idx = &op->in[scatter ? 0 : 1], *val = &op->in[scatter ? 1 : 0];
  /* the view iterated over: out (gather), idx (scatter); the other
   * tensor indexed along dim */
  const dev_view *it = scatter ? idx : &op->out, *other = scatter ? &op->out : val;
  if ((unsigned)op->code >= DEV_NIDX || op->nin != 2 || op->dim < 0 || op->dim >= op->out.ndim ||
      idx->ndim != op->out.ndim || val->ndim != op->out.ndim)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad operands", name);
  if (dev_dtype_class(idx->dtype) != DEV_CLS_I)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: the index must be an integer tensor, not %s", name,
                    dev_dtype_name(idx->dtype));
  if (val->dtype != t) return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype mismatch", name);
  if (scatter && !(dev_dtype_class(t) & DEV_CLASSES_FI))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s", name, dev_dtype_name(t));
  if (!scatter && !same_shape(idx, &op->out))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: shape mismatch", name);
  for (int d = 0; d < op->out.ndim; d++)
    if ((scatter && val->shape[d] < idx->shape[d]) || (d != op->dim && other->shape[d] < it->shape[d]))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: shape mismatch", name);
  return DEV_OK;
}

static int check_matmul(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  /* 2-D, or 3-D with one batch size: an operand's batch stride may be 0
   * (broadcast), the output's only for a batch of one */
  const dev_view *a = &op->in[0], *b = &op->in[1], *c = &op->out;
  int nd = c->ndim, r = nd - 2;
  if (op->nin != 2 || (nd != 2 && nd != 3) || a->ndim != nd || b->ndim != nd ||
      a->shape[r + 1] != b->shape[r] || c->shape[r] != a->shape[r] || c->shape[r + 1] != b->shape[r + 1] ||
      (nd == 3 && (a->shape[0] != c->shape[0] || b->shape[0] != c->shape[0] ||
                   (c->shape[0] > 1 && c->stride[0] == 0))))
    return dev_fail(ctx, DEV_ERR_INVALID, "matmul: shape mismatch");
  if (a->dtype != t || b->dtype != t)
    return dev_fail(ctx, DEV_ERR_INVALID, "matmul: dtype mismatch");
  if (t == DEV_BOOL)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "matmul is not supported for bool");
  return DEV_OK;
}

static int check_copy(dev_ctx *ctx, const dev_kop *op) {
  dev_dtype t = op->out.dtype;
  if (op->nin != 1 || op->in[0].dtype != t ||
      dev_view_numel(&op->in[0]) != dev_view_numel(&op->out))
    return dev_fail(ctx, DEV_ERR_INVALID, "copy: dtype or numel mismatch");
  return DEV_OK;
}

/* The results 2.. of a fused program with several: each a view as the
 * output is checked, of out's shape and its result's dtype dt[j] (a
 * reduction's, for a program that ends in reductions), and no two
 * overlapping (an element written twice in one pass). */
static int check_fused_outs(dev_ctx *ctx, const dev_kop *op, const dev_dtype *dt) {
  const dev_fprog *p = op->fprog;
  int rc;
  if (!op->fargs) return dev_fail(ctx, DEV_ERR_INVALID, "%d results: no arguments", p->nout);
  for (int j = 1; j < p->nout; j++) {
    const dev_view *o = dev_kop_out(op, j);
    if ((rc = dev_check_view(ctx, o, "output")) || (rc = dev_check_writable(ctx, o))) return rc;
    if (!same_shape(o, &op->out)) return dev_fail(ctx, DEV_ERR_INVALID, "result %d: shape mismatch", j + 1);
  }
  for (int j = 0; j < p->nout; j++) {
    const dev_view *o = dev_kop_out(op, j);
    if (o->dtype != dt[j])
      return dev_fail(ctx, DEV_ERR_INVALID, "result %d: the output's dtype is %s, the result's %s", j + 1,
                      dev_dtype_name(o->dtype), dev_dtype_name(dt[j]));
    for (int k = 0; k < j; k++)
      if (views_overlap(o, dev_kop_out(op, k)))
        return dev_fail(ctx, DEV_ERR_INVALID, "results %d and %d are written to overlapping memory",
                        k + 1, j + 1);
  }
  return DEV_OK;
}

/* A program's reductions (DEV_F_FREDUCE, exactly when it has them): a
 * tensor input, whose shape is the values', a dim of it, and out of the
 * reduced size; dt[] become the reductions' dtypes. */
static int check_fused_red(dev_ctx *ctx, const dev_kop *op, dev_dtype *dt) {
  const dev_fprog *p = op->fprog;
  if (!(op->flags & DEV_F_FREDUCE) != !p->nred)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: the reduction flag does not match the program", p->name);
  if (!p->nred) return DEV_OK;
  if (op->nin < 1) return dev_fail(ctx, DEV_ERR_INVALID, "%s: a fused reduction needs a tensor input", p->name);
  const dev_view *shape = dev_kop_in(op, 0);
  if (op->dim < -1 || op->dim >= shape->ndim) return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad dim %d", p->name, op->dim + 1);
  for (int j = 0; j < p->nout; j++) {
    int c = p->red[j];
    if (!(dev_dtype_class(dt[j]) & dev_redop_info(c)->classes))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s is not defined for %s", p->name, dev_redop_name(c),
                      dev_dtype_name(dt[j]));
    dt[j] = dev_redop_dtype(c, dt[j]);
  }
  int64_t nout = 1;
  for (int d = 0; d < shape->ndim; d++)
    if (op->dim >= 0 && d != op->dim) nout *= shape->shape[d];
  if (dev_view_numel(&op->out) != nout)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: out has %lld elements, the reduction makes %lld", p->name,
                    (long long)dev_view_numel(&op->out), (long long)nout);
  return DEV_OK;
}

/* A fused program's inputs: of its input nodes' dtypes, each of out's shape
 * (broadcast; with reductions, of the first input's), and the results of
 * their dtypes (the program checked the rest when it was interned). */
static int check_fused(dev_ctx *ctx, const dev_kop *op) {
  const dev_fprog *p = op->fprog;
  if (!p || op->nin != p->nin || p->nparam > DEV_FPARAMS || ((op->nin > DEV_MAXIN || p->nparam) && !op->fargs))
    return dev_fail(ctx, DEV_ERR_INVALID, "fused: bad program or operands");
  dev_dtype dt[DEV_FMAXOUT];
  for (int j = 0; j < p->nout; j++) dt[j] = p->node[p->res[j]].dtype;
  int rc = check_fused_red(ctx, op, dt);
  if (rc) return rc;
  if (p->nout > 1 && (rc = check_fused_outs(ctx, op, dt))) return rc;
  if (op->out.dtype != dt[0])
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: the output's dtype is %s, the result's %s", p->name,
                    dev_dtype_name(op->out.dtype), dev_dtype_name(dt[0]));
  /* the values' shape: out's, or with reductions the inputs' */
  const dev_view *shape = p->nred ? dev_kop_in(op, 0) : &op->out;
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    if (x->kind != DEV_FN_INPUT) continue;
    const dev_view *v = dev_kop_in(op, x->index);
    if (v->dtype != x->dtype || !same_shape(v, shape))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: input %d: dtype or shape mismatch", p->name, x->index + 1);
  }
  return DEV_OK;
}

/* The op kinds (ops.h), each with its checks: a row of DEV_OP_KINDS and a
 * check_<name> above. */
#define KIND_ROW(E, name, fl) {#name, fl, check_##name},
static const struct {
  const char *name;
  unsigned flags;
  int (*check)(dev_ctx *ctx, const dev_kop *op);
} kinds[] = {DEV_OP_KINDS(KIND_ROW)};
#undef KIND_ROW

/* An expanded view (t:expand) repeats elements: writing it is refused, as PyTorch */
int dev_check_writable(dev_ctx *ctx, const dev_view *v) {
  for (int d = 0; d < v->ndim && dev_view_numel(v) > 0; d++)
    if (v->stride[d] == 0 && v->shape[d] > 1)
      return dev_fail(ctx, DEV_ERR_INVALID, "the output is an expanded view (stride 0 along dim %d): several of "
                      "its elements are one memory location; write into t:clone() instead", d + 1);
  return DEV_OK;
}

/* The checks every kind with views shares: the operand count, the output
 * and input views; then the kind's own. */
static int validate(dev_ctx *ctx, const dev_kop *op) {
  int rc;
  if ((unsigned)op->kind >= sizeof kinds / sizeof kinds[0])
    return dev_fail(ctx, DEV_ERR_INVALID, "bad op kind %d", (int)op->kind);
  unsigned fl = kinds[op->kind].flags;
  if (fl & DEV_OPK_NOVIEWS) return kinds[op->kind].check(ctx, op);
  /* before anything reads in[] */
  int maxin = (fl & DEV_OPK_NOIN) ? 0 : op->kind == DEV_OP_FUSED && op->fargs ? DEV_FMAXIN : DEV_MAXIN;
  if (op->nin < 0 || op->nin > maxin)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad operand count %d", kinds[op->kind].name, op->nin);
  if ((rc = dev_check_view(ctx, &op->out, "output")) || (rc = dev_check_writable(ctx, &op->out))) return rc;
  for (int i = 0; i < op->nin; i++)
    if ((rc = check_view_signed(ctx, dev_kop_in(op, i), "input", walks_back_ok(op, i)))) return rc;
  return kinds[op->kind].check(ctx, op);
}

int dev_check_op(dev_ctx *ctx, const dev_kop *op) { return validate(ctx, op); }

static void count_op(dev_ctx *ctx, const dev_kop *op) {
  if (op->kind != DEV_OP_COPY) { ctx->st.launches++; return; }
  ctx->st.copies++;
  uint64_t n = (uint64_t)dev_view_numel(&op->out) * dev_dtype_size(op->out.dtype);
  int dst_dev = !host_visible(op->out.buf), src_dev = !host_visible(op->in[0].buf);
  if (src_dev && dst_dev) ctx->st.d2d_bytes += n;
  else if (dst_dev) ctx->st.h2d_bytes += n;
  else if (src_dev) ctx->st.d2h_bytes += n;
  else ctx->st.h2h_bytes += n;
}

/* After the backend took an op of these buffers (the nw it writes first)
 * on s. */
static void note_op(dev_ctx *ctx, dev_stream *s, dev_buf *const *bufs, int nb, int nw) {
  if (ctx->trace_gen) dev_trace_note_stream(ctx, s);
  for (int i = nb - 1; i >= 0; i--) note_use(BX(bufs[i]), s, i < nw);
}

/* A contiguous device copy between a view and a packed buffer, on s: the
 * device half of a staged copy whose device side has strides. */
static int submit_packed(dev_ctx *ctx, dev_stream *s, const dev_view *v, dev_buf *packed, int to_packed) {
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1};
  dev_view pv;
  memset(&pv, 0, sizeof pv);
  pv.buf = packed;
  pv.dtype = v->dtype;
  int64_t n = dev_view_numel(v);
  dev_view_set_contiguous(&pv, 1, &n);
  op.out = to_packed ? pv : *v;
  op.in[0] = to_packed ? *v : pv;
  dev_buf *bufs[2] = {op.out.buf, op.in[0].buf};
  int rc = fence_op_bufs(s, bufs, 2);
  if (rc == DEV_OK) rc = ctx->bk->submit(s, &op);
  if (rc == DEV_OK) note_op(ctx, s, bufs, 2, 1);
  return rc;
}

/* 1 when queued work still writes b. */
static int writes_queued(dev_buf *b) {
  bufx *x = BX(b);
  prune(x);
  for (int i = 0; i < x->nuse; i++)
    if (x->use[i].wpos && !b->ctx->bk->pos_done(x->use[i].s, x->use[i].wpos)) return 1;
  return x->nfence > 0;
}

/* A copy between pageable memory and the device, validated, on an open
 * stream: queued, staged through pinned slots (dev_stage.c).  The slots are
 * a block of the pinned cache with a use on s: reused once the copy is over,
 * or by a later copy on a stream ordered after it (the staging memory of
 * copies queued one after another stays one block).  An H2D copy starts
 * reading its source at once (before the stream reaches it) when no queued
 * work writes the source and none still uses the slots. */
static int submit_staged(dev_ctx *ctx, dev_stream *s, const dev_kop *op) {
  int h2d = op->in[0].buf->kind == DEV_MEM_HOST;
  const dev_view *hv = h2d ? &op->in[0] : &op->out, *dv = h2d ? &op->out : &op->in[0];
  size_t el = dev_dtype_size(hv->dtype), bytes = (size_t)dev_view_numel(hv) * el;
  dev_buf *bufs[2] = {op->out.buf, op->in[0].buf};
  dev_buf *packed = NULL, *stage = NULL;
  dev_stage_job *job = NULL;
  int rc;
  if (ctx->race && (rc = race_op(ctx, s, op, 0))) return rc;
  if ((rc = fence_op_bufs(s, bufs, 2))) return rc;
  size_t chunk;
  int64_t nslot;
  dev_stage_plan(ctx, bytes, el, &chunk, &nslot);
  if ((rc = dev_buf_alloc_stage(ctx, chunk * (size_t)nslot, s, &stage))) return rc;
  char *dev = dev_view_ptr(dv);
  if (!dev_view_contiguous(dv)) {
    if ((rc = dev_buf_alloc_on(ctx, DEV_MEM_DEVICE, bytes, s, &packed))) goto out;
    dev = packed->ptr;
    if (!h2d && (rc = submit_packed(ctx, s, dv, packed, 1))) goto out;
  }
  if ((rc = dev_stage_new(ctx, h2d, hv, dev, stage->ptr, chunk, nslot, &job))) goto out;
  if (h2d && dev_buf_idle(stage) && !writes_queued(hv->buf)) dev_stage_start(job);
  if ((rc = ctx->bk->stage_copy(s, op, job))) {
    dev_stage_abort(job);
    goto out;
  }
  /* the copy's output first: it is written */
  dev_buf *dst = h2d ? (packed ? packed : dv->buf) : hv->buf, *src = h2d ? hv->buf : (packed ? packed : dv->buf);
  dev_buf *used[3] = {dst, src, stage};
  note_op(ctx, s, used, 2, 1);
  note_use(BX(stage), s, 1);
  if (h2d && packed) rc = submit_packed(ctx, s, dv, packed, 0);
  if (rc == DEV_OK) {
    if (ctx->race) race_op(ctx, s, op, 1);
    count_op(ctx, op);
  }
out:
  dev_stage_release(job);
  dev_buf_release(packed);
  dev_buf_release(stage);
  return rc;
}

/* A launch, validated, on an open stream: always on the device, even when
 * every tensor is pinned. */
static int submit_launch(dev_ctx *ctx, dev_stream *s, const dev_kop *op) {
  int rc;
  const dev_launch *l = op->launch;
  if (ctx->race && (rc = race_op(ctx, s, op, 0))) return rc;
  if ((rc = fence_op_bufs(s, l->bufs, l->nbufs))) return rc;
  if ((rc = ctx->bk->submit(s, op))) return rc;
  if (ctx->race) race_op(ctx, s, op, 1);
  if (ctx->trace_gen) dev_trace_note_stream(ctx, s);
  for (int i = 0; i < l->nbufs; i++) note_use(BX(l->bufs[i]), s, l->writes[i]);
  note_use(BX(dev_module_life(l->k->mod)), s, 0);
  ctx->st.launches++;
  return DEV_OK;
}

/* ---- an output that overlaps an input: NumPy's rule --------------------- */

static void contiguous_view(dev_view *v, dev_buf *b, dev_dtype t, int ndim, const int64_t *shape) {
  memset(v, 0, sizeof *v);
  v->buf = b;
  v->dtype = t;
  dev_view_set_contiguous(v, ndim, shape);
}

/* The addresses [*lo, *hi) that v's elements span (strides of any sign: a
 * copy's input may walk back, dev_check_view).  Addresses, not buffers:
 * two wrappings of one memory are seen too. */
static void view_span(const dev_view *v, uintptr_t *lo, uintptr_t *hi) {
  int64_t first = 0, last = 0, esz = (int64_t)dev_dtype_size(v->dtype);
  for (int d = 0; d < v->ndim; d++) {
    int64_t e = (v->shape[d] - 1) * v->stride[d];
    if (e < 0) first += e; else last += e;
  }
  *lo = (uintptr_t)dev_view_ptr(v) + (uintptr_t)(first * esz);
  *hi = (uintptr_t)dev_view_ptr(v) + (uintptr_t)((last + 1) * esz);
}

/* 1 when a and b may share a byte (their spans overlap: conservative). */
static int views_overlap(const dev_view *a, const dev_view *b) {
  if (dev_view_numel(a) == 0 || dev_view_numel(b) == 0) return 0;
  uintptr_t alo, ahi, blo, bhi;
  view_span(a, &alo, &ahi);
  view_span(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

/* 1 when a and b are one view: the same elements at the same positions. */
static int same_view(const dev_view *a, const dev_view *b) {
  if (dev_view_ptr(a) != dev_view_ptr(b) || a->dtype != b->dtype || !same_shape(a, b)) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->stride[d] != b->stride[d] && a->shape[d] > 1) return 0;
  return 1;
}

enum { ALIAS_NONE, ALIAS_OUT, ALIAS_IN };

/* How op reads every input before it writes out, whatever the overlap
 * (NumPy's rule, docs/lua-api.md "Outputs that overlap inputs"): as it is,
 * unless out overlaps an input other than by being exactly it for a kind
 * that reads each element where it writes it (DEV_OPK_INPLACE: the plain
 * in-place op, no copy); then into a temporary copied to out (ALIAS_OUT),
 * or, for scatter_add, which reads out too, on copies of the inputs that
 * overlap out (ALIAS_IN). */
static int alias_plan(const dev_kop *op) {
  unsigned fl = kinds[op->kind].flags;
  if (fl & (DEV_OPK_NOIN | DEV_OPK_NOVIEWS | DEV_OPK_MEMMOVE)) return ALIAS_NONE;
  for (int j = 0; j < dev_kop_nout(op); j++)
    for (int i = 0; i < op->nin; i++) {
      const dev_view *o = dev_kop_out(op, j), *v = dev_kop_in(op, i);
      if (views_overlap(o, v) && !((fl & DEV_OPK_INPLACE) && !(op->flags & DEV_F_FREDUCE) && same_view(o, v)))
        return op->kind == DEV_OP_INDEX && op->code == DEV_IDX_SCATTER_ADD ? ALIAS_IN : ALIAS_OUT;
    }
  return ALIAS_NONE;
}

/* *t: a contiguous view of v's dtype and shape, of a new buffer *b of the
 * kind given, from the pool for stream s. */
static int temp_view(dev_ctx *ctx, dev_stream *s, const dev_view *v, dev_memkind kind, dev_view *t, dev_buf **b) {
  int rc = dev_buf_alloc_on(ctx, kind, (size_t)dev_view_numel(v) * dev_dtype_size(v->dtype), s, b);
  if (rc == DEV_OK) contiguous_view(t, *b, v->dtype, v->ndim, v->shape);
  return rc;
}

static int copy_view(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const dev_view *src) {
  dev_kop c = {.kind = DEV_OP_COPY, .nin = 1, .out = *dst};
  c.in[0] = *src;
  return dev_submit(ctx, s, &c);
}

/* op, validated, of a plan other than ALIAS_NONE, on s: through temporaries
 * of the device (of out's memory when all of op's memory is host-visible:
 * then it runs here, as op would), with one copy more, queued on s after op
 * (no sync).  In a capture both are recorded, and the graph holds the
 * temporaries. */
static int submit_unaliased(dev_ctx *ctx, dev_stream *s, const dev_kop *op, int plan) {
  dev_kop k = *op;
  dev_fargs fa;   /* a fused op's: its inputs and outputs may change too */
  if (op->fargs) {
    fa = *op->fargs;
    k.fargs = &fa;
  }
  int nout = dev_kop_nout(op);
  dev_view *kin[DEV_FMAXIN];
  for (int i = 0; i < op->nin; i++) kin[i] = (dev_view *)dev_kop_in(&k, i);
  dev_buf *tmp[DEV_FMAXOUT + DEV_FMAXIN] = {NULL};
  dev_memkind kind = host_visible(op->out.buf) ? op->out.buf->kind : DEV_MEM_DEVICE;
  int rc = DEV_OK;
  for (int i = 0; i < op->nin; i++)
    if (!host_visible(dev_kop_in(op, i)->buf)) kind = DEV_MEM_DEVICE;
  for (int j = 1; j < nout; j++)
    if (!host_visible(dev_kop_out(op, j)->buf)) kind = DEV_MEM_DEVICE;
  if (plan == ALIAS_OUT) {
    /* every output into a temporary (a fused op's several, all written in
     * its one pass), then copied where it goes */
    for (int j = 0; j < nout && rc == DEV_OK; j++)
      rc = temp_view(ctx, s, dev_kop_out(op, j), kind, (dev_view *)dev_kop_out(&k, j), &tmp[j]);
    if (rc == DEV_OK) rc = dev_submit(ctx, s, &k);
    for (int j = 0; j < nout && rc == DEV_OK; j++) rc = copy_view(ctx, s, dev_kop_out(op, j), dev_kop_out(&k, j));
  } else {
    for (int i = 0; i < op->nin && rc == DEV_OK; i++)
      if (views_overlap(&op->out, dev_kop_in(op, i)) &&
          (rc = temp_view(ctx, s, dev_kop_in(op, i), kind, kin[i], &tmp[DEV_FMAXOUT + i])) == DEV_OK)
        rc = copy_view(ctx, s, kin[i], dev_kop_in(op, i));
    if (rc == DEV_OK) rc = dev_submit(ctx, s, &k);
  }
  for (int i = 0; i < DEV_FMAXOUT + DEV_FMAXIN; i++) dev_buf_release(tmp[i]);
  return rc;
}

int dev_submit(dev_ctx *ctx, dev_stream *s, const dev_kop *op) {
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if ((rc = validate(ctx, op))) return rc;
  if (!s) s = ctx->dflt;
  if ((rc = check_open(s))) return rc;
  if (op->kind != DEV_OP_LAUNCH && op->kind != DEV_OP_SLEEP) {
    /* Zero-sized: nothing to write, nothing enqueued, no memory touched.  A
     * matmul over k = 0 is a fill of zeros. */
    if (dev_view_numel(&op->out) == 0) return DEV_OK;
    if (op->kind == DEV_OP_MATMUL && op->in[0].shape[op->in[0].ndim - 1] == 0) {
      dev_kop z = {.kind = DEV_OP_FILL, .out = op->out, .s0 = {1, 0, 0}};
      return dev_submit(ctx, s, &z);
    }
    int plan = alias_plan(op);
    if (plan != ALIAS_NONE) return submit_unaliased(ctx, s, op, plan);
  }
  if (ctx->capture && graph_records(op)) return graph_submit(s, op);   /* recorded, not run */
  if (op->kind == DEV_OP_LAUNCH) return submit_launch(ctx, s, op);
  /* the outputs, then the tensor operands (validated: nin of them) */
  const dev_view *views[DEV_FMAXOUT + DEV_FMAXIN];
  int nw = op->kind == DEV_OP_SLEEP ? 0 : dev_kop_nout(op), nb = nw ? nw + op->nin : 0;
  for (int i = 0; i < nb; i++) views[i] = i < nw ? dev_kop_out(op, i) : dev_kop_in(op, i - nw);
  int all_host = nb > 0;
  for (int i = 0; i < nb; i++)
    if (!host_visible(views[i]->buf)) all_host = 0;
  if (all_host) {
    /* Host memory only: run here, once queued work on these buffers is done. */
    for (int i = 0; i < nb; i++)
      if ((rc = dev_buf_fence(views[i]->buf, i < nw))) return rc;
    char msg[256];
    uint64_t t0 = ctx->trace_gen ? dev_trace_now() : 0;
    if (dev_cpu_run(op, msg, sizeof msg))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s", dev_op_name(op), msg);
    if (ctx->trace_gen) dev_trace_host_op(ctx, op, t0);
    count_op(ctx, op);
    return DEV_OK;
  }
  /* Pageable memory and the device: staged and queued, unless it is the
   * application's memory, not guarded: then the host waits for the copy, as
   * CUDA's driver makes it, and that counts as a sync. */
  int pageable = 0;
  if (op->kind == DEV_OP_COPY) {
    dev_buf *hb = op->out.buf->kind == DEV_MEM_HOST ? op->out.buf
                  : op->in[0].buf->kind == DEV_MEM_HOST ? op->in[0].buf : NULL;
    if (hb && (!BX(hb)->wrapped || BX(hb)->guarded) && ctx->bk->stage_copy && !ctx->stage_off)
      return submit_staged(ctx, s, op);
    pageable = hb != NULL;
  }
  if (ctx->race && (rc = race_op(ctx, s, op, 0))) return rc;
  dev_buf *bufs[DEV_FMAXOUT + DEV_FMAXIN] = {NULL};
  for (int i = 0; i < nb; i++) bufs[i] = views[i]->buf;
  if ((rc = fence_op_bufs(s, bufs, nb))) return rc;
  if (pageable && (rc = dev_sync_enter(ctx, "a copy to or from pageable host memory"))) return rc;
  if ((rc = ctx->bk->submit(s, op))) {
    if (pageable) dev_sync_abandon(ctx);
    return rc;
  }
  if (ctx->race) race_op(ctx, s, op, 1);
  note_op(ctx, s, bufs, nb, nw);
  count_op(ctx, op);
  if (pageable) {
    if ((rc = dev_sync_wait(ctx, s, ctx->bk->stream_pos(s)))) { dev_sync_leave(ctx); return rc; }
    if (ctx->race) race_host_waited(ctx, s, NULL);
    dev_sync_leave(ctx);
    prune(BX(op->out.buf));
    prune(BX(op->in[0].buf));
    return dev_check_async(ctx);
  }
  return DEV_OK;
}

void dev_view_set_contiguous(dev_view *v, int ndim, const int64_t *shape) {
  v->ndim = ndim;
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    v->shape[d] = shape[d];
    v->stride[d] = st;
    st *= shape[d] ? shape[d] : 1;   /* as PyTorch: a zero-sized dim keeps the others' strides */
  }
}

int dev_read(dev_ctx *ctx, dev_stream *s, const dev_view *src, void *dst) {
  int rc0 = ctx->capture ? graph_read(ctx, src->buf) : DEV_OK;
  if (rc0) return rc0;
  size_t bytes = (size_t)dev_view_numel(src) * dev_dtype_size(src->dtype);
  dev_buf *tmp;
  if (bytes == 0) return dev_check_async(ctx);   /* nothing to read: no wait */
  int rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, bytes, &tmp);
  if (rc) return rc;
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1};
  contiguous_view(&op.out, tmp, src->dtype, src->ndim, src->shape);
  op.in[0] = *src;
  /* A host source is copied here after its fence; a device source is a
   * queued copy and then a wait, always counted as a sync.  The copy first
   * waits for the source's last writers on other streams: the host never
   * reads a value that queued work has yet to write. */
  if (!s) s = ctx->dflt;
  int dev_src = !host_visible(src->buf);
  if (dev_src && (rc = dev_sync_enter(ctx, "a device-to-host read"))) {
    dev_buf_release(tmp);
    return rc;
  }
  if (dev_src && !s->closed) {
    bufx *sx = BX(src->buf);
    if (ctx->race) race_read_wait(s, src->buf);
    prune(sx);
    for (int i = 0; i < sx->nuse && rc == DEV_OK; i++) {
      buf_use *u = &sx->use[i];
      if (u->s != s && u->wpos && !ctx->bk->pos_done(u->s, u->wpos))
        rc = ctx->bk->stream_wait(s, u->s, u->wpos);
    }
  }
  if (rc == DEV_OK) rc = dev_submit(ctx, s, &op);
  /* refused (race, closed stream) or failed before the wait: no sync */
  if (rc != DEV_OK && dev_src) dev_sync_abandon(ctx);
  if (rc == DEV_OK && dev_src) {
    bufx *x = BX(tmp);
    for (int i = 0; i < x->nuse && rc == DEV_OK; i++)
      rc = dev_sync_wait(ctx, x->use[i].s, x->use[i].wpos);
    if (rc == DEV_OK && ctx->race) race_host_waited(ctx, s, NULL);
    prune(x);
    dev_sync_leave(ctx);
    if (rc == DEV_OK) rc = dev_check_async(ctx);
  }
  if (rc == DEV_OK) memcpy(dst, tmp->ptr, bytes);
  dev_buf_release(tmp);
  return rc;
}

int dev_memset(dev_ctx *ctx, dev_stream *s, dev_buf *b, size_t offset, int value, size_t bytes) {
  if (offset > b->bytes || bytes > b->bytes - offset)
    return dev_fail(ctx, DEV_ERR_INVALID, "memset: range exceeds the buffer");
  if (bytes == 0) return DEV_OK;
  dev_kop op = {.kind = DEV_OP_FILL, .s0 = {1, (uint8_t)value, (double)(uint8_t)value}};
  int64_t n = (int64_t)bytes;
  contiguous_view(&op.out, b, DEV_U8, 1, &n);
  op.out.offset = offset;
  return dev_submit(ctx, s, &op);
}

int dev_write(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const void *src) {
  size_t bytes = (size_t)dev_view_numel(dst) * dev_dtype_size(dst->dtype);
  dev_buf *tmp;
  if (bytes == 0) return dev_check_async(ctx);
  int rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, bytes, &tmp);
  if (rc) return rc;
  memcpy(tmp->ptr, src, bytes);
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1};
  op.out = *dst;
  contiguous_view(&op.in[0], tmp, dst->dtype, dst->ndim, dst->shape);
  rc = dev_submit(ctx, s, &op);
  dev_buf_release(tmp);
  return rc;
}

/* ---- copies of bytes made on the host (dev_copy_source) ------------------ */

/* The bytes made here, into host-visible dst or into a pinned buffer whose
 * copy to dst is then queued: where nothing is staged. */
static int source_here(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const dev_source *src, size_t bytes) {
  char err[400];
  dev_buf *tmp = NULL;
  int rc, here = host_visible(dst->buf);
  if (here) rc = dev_buf_fence(dst->buf, 1);
  else rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, bytes, &tmp);
  if (rc) return rc;
  if (src->fill(src->ud, here ? dev_view_ptr(dst) : tmp->ptr, bytes, err, sizeof err)) {
    dev_buf_release(tmp);
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", err);
  }
  if (here) return DEV_OK;
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1, .out = *dst};
  contiguous_view(&op.in[0], tmp, dst->dtype, dst->ndim, dst->shape);
  rc = dev_submit(ctx, s, &op);
  dev_buf_release(tmp);
  return rc;
}

/* Staged: a source job filling slots.  A fill is slow (an inflate: a few
 * hundred MB/s a thread) and in order, and the copies of one stream go to
 * the device one after the other: the sources of several copies are filled
 * at once only when each has a slot for every chunk, in an idle pinned
 * block of its own (it starts at once, and never waits for the stream).
 * That holds while the slots of the live sources stay within
 * SOURCE_PINNED; past it a copy takes the stream's staging block with two
 * slots, reused in stream order (it starts once the stream's last copy is
 * done), so that the pinned memory of many copies queued at once stays
 * bounded.  The op seen by the race checker writes dst only; the one
 * traced and counted reads the slots (a copy H2D of dst's bytes). */
#define SOURCE_PINNED ((size_t)512 << 20)
static int source_staged(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const dev_source *src, size_t bytes,
                         int *taken) {
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 0, .out = *dst};
  dev_buf *stage = NULL;
  dev_stage_job *job = NULL;
  int rc;
  if (ctx->race && (rc = race_op(ctx, s, &op, 0))) return rc;
  if ((rc = fence_op_bufs(s, &dst->buf, 1))) return rc;
  size_t chunk;
  int64_t nslot;
  dev_stage_plan(ctx, bytes, dev_dtype_size(dst->dtype), &chunk, &nslot);
  int64_t n = (int64_t)((bytes + chunk - 1) / chunk);
  if (dev_stage_source_bytes(ctx) + chunk * (size_t)n <= SOURCE_PINNED) {
    nslot = n;
    rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, chunk * (size_t)nslot, &stage);
  } else {
    nslot = nslot < 2 ? nslot : 2;
    rc = dev_buf_alloc_stage(ctx, chunk * (size_t)nslot, s, &stage);
  }
  if (rc) return rc;
  if ((rc = dev_stage_new_source(ctx, src, bytes, dev_view_ptr(dst), stage->ptr, chunk, nslot, &job))) goto out;
  *taken = 1;
  if (dev_buf_idle(stage)) dev_stage_start(job);
  dev_kop traced = op;
  int64_t sb = (int64_t)(chunk * (size_t)nslot);
  traced.nin = 1;
  contiguous_view(&traced.in[0], stage, DEV_U8, 1, &sb);
  if ((rc = ctx->bk->stage_copy(s, &traced, job))) {
    dev_stage_abort(job);
    goto out;
  }
  note_op(ctx, s, &op.out.buf, 1, 1);
  note_use(BX(stage), s, 1);
  if (ctx->race) race_op(ctx, s, &op, 1);
  count_op(ctx, &traced);
out:
  dev_stage_release(job);
  dev_buf_release(stage);
  return rc;
}

int dev_copy_source(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const dev_source *src) {
  int rc = dev_check_async(ctx), taken = 0;
  size_t bytes = dst->buf ? (size_t)dev_view_numel(dst) * dev_dtype_size(dst->dtype) : 0;
  if (!rc) rc = dev_check_view(ctx, dst, "copy output");
  if (!rc) rc = dev_check_writable(ctx, dst);
  if (!rc && !dev_view_contiguous(dst)) rc = dev_fail(ctx, DEV_ERR_INVALID, "copy output: not contiguous");
  if (!s) s = ctx->dflt;
  if (!rc) rc = check_open(s);
  if (!rc && bytes) {
    int staged = !host_visible(dst->buf) && !ctx->capture && ctx->bk->stage_copy && !ctx->stage_off;
    rc = staged ? source_staged(ctx, s, dst, src, bytes, &taken) : source_here(ctx, s, dst, src, bytes);
  }
  if (!taken && src->close) src->close(src->ud);
  return rc;
}
