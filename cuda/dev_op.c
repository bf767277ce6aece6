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
 * - A copy between pageable host memory and the device is a counted sync:
 *   the host waits for its stream.  So is dev_read of a device source,
 *   whose stream first waits for the source's last writers on other
 *   streams: the host never reads what queued work has yet to write.
 */
#include <string.h>

#include "devpriv.h"

/* ---- ops -------------------------------------------------------------- */

static int host_visible(const dev_buf *b) { return b->kind != DEV_MEM_DEVICE; }

int dev_check_view(dev_ctx *ctx, const dev_view *v, const char *what) {
  if (!v->buf) return dev_fail(ctx, DEV_ERR_INVALID, "%s: no buffer", what);
  if (v->buf->ctx != ctx)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s belongs to another gpulua instance", what);
  for (int d = 0; d < v->ndim && d < DEV_MAXDIM; d++)
    if (v->shape[d] <= 0 || v->stride[d] < 0)
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad shape or stride", what);
  char msg[200];
  if (dev_view_check(v, what, msg, sizeof msg)) return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  return DEV_OK;
}

static int same_shape(const dev_view *a, const dev_view *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static int validate_launch(dev_ctx *ctx, const dev_launch *l) {
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

static int validate(dev_ctx *ctx, const dev_kop *op) {
  static const char *const kinds[] = {"fill", "arange", "rand", "unary", "binary", "ternary", "reduce", "matmul",
                                      "copy"};
  _Static_assert(DEV_OP_FILL == 0 && DEV_OP_RAND == 2 && DEV_OP_TERNARY == 5 && DEV_OP_COPY == 8,
                 "kinds[] follows dev_opkind");
  int rc;
  if (op->kind == DEV_OP_LAUNCH) return validate_launch(ctx, op->launch);
  if (op->kind == DEV_OP_SLEEP) {
    if (!(op->ms >= 0 && op->ms <= 1e7))
      return dev_fail(ctx, DEV_ERR_INVALID, "sleep: bad duration");
    return DEV_OK;
  }
  if ((unsigned)op->kind >= sizeof kinds / sizeof kinds[0])
    return dev_fail(ctx, DEV_ERR_INVALID, "bad op kind %d", (int)op->kind);
  /* before anything reads in[]: fill, arange and rand take no input */
  int maxin = op->kind <= DEV_OP_RAND ? 0 : (int)(sizeof op->in / sizeof op->in[0]);
  if (op->nin < 0 || op->nin > maxin)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad operand count %d", kinds[op->kind], op->nin);
  if ((rc = dev_check_view(ctx, &op->out, "output"))) return rc;
  /* an expanded view (t:expand) repeats elements: writing it is refused, as PyTorch */
  for (int d = 0; d < op->out.ndim; d++)
    if (op->out.stride[d] == 0 && op->out.shape[d] > 1)
      return dev_fail(ctx, DEV_ERR_INVALID, "the output is an expanded view (stride 0 along dim %d): several of "
                      "its elements are one memory location; write into t:clone() instead", d + 1);
  for (int i = 0; i < op->nin; i++)
    if ((rc = dev_check_view(ctx, &op->in[i], "input"))) return rc;
  dev_dtype t = op->out.dtype;
  int isf = dev_dtype_is_float(t);
  switch (op->kind) {
  case DEV_OP_FILL: case DEV_OP_ARANGE:
    return DEV_OK;
  case DEV_OP_RAND:
    if (op->code == DEV_RAND_NORMAL && !isf)
      return dev_fail(ctx, DEV_ERR_INVALID, "randn needs a floating dtype, got %s",
                      dev_dtype_name(t));
    if (op->code == DEV_RAND_UNIFORM && !isf && t != DEV_BOOL && op->s1.i <= op->s0.i)
      return dev_fail(ctx, DEV_ERR_INVALID, "rand: empty range");
    return DEV_OK;
  case DEV_OP_UNARY: {
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
  case DEV_OP_BINARY: {
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
  case DEV_OP_TERNARY: {
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
  case DEV_OP_REDUCE: {
    const dev_view *src = &op->in[0];
    if (op->nin != 1 || (unsigned)op->code >= DEV_NREDOP || op->dim < -1 || op->dim >= src->ndim)
      return dev_fail(ctx, DEV_ERR_INVALID, "reduce: bad op or dim");
    int64_t n = op->dim < 0 ? 1 : dev_view_numel(src) / src->shape[op->dim];
    if (dev_view_numel(&op->out) != n)
      return dev_fail(ctx, DEV_ERR_INVALID, "reduce: output numel mismatch");
    return DEV_OK;
  }
  case DEV_OP_MATMUL: {
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
  case DEV_OP_COPY:
    if (op->nin != 1 || op->in[0].dtype != t ||
        dev_view_numel(&op->in[0]) != dev_view_numel(&op->out))
      return dev_fail(ctx, DEV_ERR_INVALID, "copy: dtype or numel mismatch");
    return DEV_OK;
  default:
    return dev_fail(ctx, DEV_ERR_INVALID, "unknown op %d", (int)op->kind);
  }
}

static const char *op_name(const dev_kop *op) {
  switch (op->kind) {
  case DEV_OP_FILL: return "fill";
  case DEV_OP_ARANGE: return "arange";
  case DEV_OP_RAND: return op->code == DEV_RAND_NORMAL ? "randn" : "rand";
  case DEV_OP_UNARY: return dev_unop_name(op->code);
  case DEV_OP_BINARY: return dev_binop_name(op->code);
  case DEV_OP_TERNARY: return dev_terop_name(op->code);
  case DEV_OP_REDUCE: return dev_redop_name(op->code);
  case DEV_OP_MATMUL: return "matmul";
  case DEV_OP_COPY: return "copy";
  case DEV_OP_SLEEP: return "sleep";
  case DEV_OP_LAUNCH: return op->launch && op->launch->k ? op->launch->k->sig.name : "kernel";
  }
  return "op";
}

const char *dev_op_name(const dev_kop *op) { return op_name(op); }

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

int dev_submit(dev_ctx *ctx, dev_stream *s, const dev_kop *op) {
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if ((rc = validate(ctx, op))) return rc;
  if (!s) s = ctx->dflt;
  if ((rc = check_open(s))) return rc;
  if (ctx->capture && graph_records(op)) return graph_submit(s, op);   /* recorded, not run */
  if (op->kind == DEV_OP_LAUNCH) {
    /* Always on the device, even when every tensor is pinned. */
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
  /* the output, then the tensor operands (validated: nin of them) */
  int nb = op->kind == DEV_OP_SLEEP ? 0 : 1 + op->nin;
  const dev_view *views[1 + DEV_MAXIN] = {&op->out};
  for (int i = 0; i < DEV_MAXIN; i++) views[1 + i] = &op->in[i];
  int all_host = nb > 0;
  for (int i = 0; i < nb; i++)
    if (!host_visible(views[i]->buf)) all_host = 0;
  if (all_host) {
    /* Host memory only: run here, once queued work on these buffers is done. */
    for (int i = 0; i < nb; i++)
      if ((rc = dev_buf_fence(views[i]->buf, i == 0))) return rc;
    char msg[256];
    uint64_t t0 = ctx->trace_gen ? dev_trace_now() : 0;
    if (dev_cpu_run(op, msg, sizeof msg))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s", op_name(op), msg);
    if (ctx->trace_gen) dev_trace_host_op(ctx, op, t0);
    count_op(ctx, op);
    return DEV_OK;
  }
  /* Pageable memory and the device: CUDA blocks the host for such a copy,
   * so both backends do, and count it as a sync. */
  int pageable = op->kind == DEV_OP_COPY &&
                 (op->out.buf->kind == DEV_MEM_HOST || op->in[0].buf->kind == DEV_MEM_HOST);
  if (ctx->race && (rc = race_op(ctx, s, op, 0))) return rc;
  dev_buf *bufs[1 + DEV_MAXIN] = {NULL};
  for (int i = 0; i < nb; i++) bufs[i] = views[i]->buf;
  if ((rc = fence_op_bufs(s, bufs, nb))) return rc;
  if (pageable && (rc = dev_sync_enter(ctx, "a copy to or from pageable host memory"))) return rc;
  if ((rc = ctx->bk->submit(s, op))) {
    if (pageable) dev_sync_abandon(ctx);
    return rc;
  }
  if (ctx->race) race_op(ctx, s, op, 1);
  if (ctx->trace_gen) dev_trace_note_stream(ctx, s);
  for (int i = nb - 1; i >= 0; i--) note_use(BX(views[i]->buf), s, i == 0);
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
    st *= shape[d];
  }
}

static void contiguous_view(dev_view *v, dev_buf *b, dev_dtype t, int ndim, const int64_t *shape) {
  memset(v, 0, sizeof *v);
  v->buf = b;
  v->dtype = t;
  dev_view_set_contiguous(v, ndim, shape);
}

int dev_read(dev_ctx *ctx, dev_stream *s, const dev_view *src, void *dst) {
  int rc0 = ctx->capture ? graph_read(ctx, src->buf) : DEV_OK;
  if (rc0) return rc0;
  size_t bytes = (size_t)dev_view_numel(src) * dev_dtype_size(src->dtype);
  dev_buf *tmp;
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
