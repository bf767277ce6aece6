/* Ranks and collectives: joining the job, the checks NCCL would make (or
 * hang on), and enqueueing a collective or a group of sends/receives.
 *
 * - Submission follows ops (dev_op.c): the checks, the race check, the
 *   fences, the backend, the race checker's record, then the uses (a send
 *   buffer read, a receive buffer written).
 * - ctx->coll_seq counts the collectives (a group is one) the backend took;
 *   the backend gets the next number, which moves only on success, so every
 *   rank numbers a collective alike (messages and the sideband use it).
 * - A group holds sends and receives only; a send to this rank itself needs
 *   its receive in the same group.
 */
#include <stdio.h>
#include <string.h>

#include "devpriv.h"
#include "bufx.h"
#include "capture.h"
#include "race.h"

/* ---- ranks and collectives ------------------------------------------- */

int dev_comm_init(dev_ctx *ctx, const dev_rank_info *want) {
  dev_rank_info r = *want;
  const dev_rank_info *ri = &r;
  if (r.check < 0) r.check = ctx->bk->check_colls;
  if (ctx->comm) {
    if (ri->rank != ctx->ri.rank || ri->world != ctx->ri.world)
      return dev_fail(ctx, DEV_ERR_INVALID, "the communicator is already joined as rank %d of %d",
                      ctx->ri.rank, ctx->ri.world);
    if (ri->defer || !ctx->bk->comm_connect) return DEV_OK;
    ctx->ri.check = ri->check;
    ctx->ri.timeout_s = ri->timeout_s;
    return ctx->bk->comm_connect(ctx, ri);
  }
  if (!ctx->bk->comm_open)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "collectives are not available on the %s backend", ctx->bk->name);
  if (ri->world < 1 || ri->rank < 0 || ri->rank >= ri->world)
    return dev_fail(ctx, DEV_ERR_INVALID, "rank %d of a world of %d", ri->rank, ri->world);
  if (ri->local_world < 1 || ri->local_rank < 0 || ri->local_rank >= ri->local_world)
    return dev_fail(ctx, DEV_ERR_INVALID, "local rank %d of %d", ri->local_rank, ri->local_world);
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  ctx->ri = *ri;
  /* the backend sets ctx->comm once joined */
  return ctx->bk->comm_open(ctx, ri);
}

int dev_comm_ready(dev_ctx *ctx) { return ctx->comm != NULL; }
int dev_comm_world(dev_ctx *ctx) { return ctx->ri.world; }
int dev_comm_rank(dev_ctx *ctx) { return ctx->ri.rank; }

static int coll_count_fail(dev_ctx *ctx, const dev_coll *c, const char *what, int64_t want, int64_t got) {
  return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s has %lld elements, expected %lld", dev_coll_name(c->kind),
                  what, (long long)got, (long long)want);
}

static int coll_view(dev_ctx *ctx, const dev_coll *c, const dev_view *v, int recv) {
  const char *what = recv ? "recv" : "send";
  /* literals, not formatted: this is on the path of every collective */
  static const char *const names[DEV_NCOLL][2] = {
      {"all_reduce: send", "all_reduce: recv"}, {"broadcast: send", "broadcast: recv"},
      {"reduce: send", "reduce: recv"},         {"all_gather: send", "all_gather: recv"},
      {"reduce_scatter: send", "reduce_scatter: recv"}, {"send: send", "send: recv"},
      {"recv: send", "recv: recv"}};
  int rc = dev_check_view(ctx, v, names[c->kind][recv]);
  if (rc) return rc;
  if (!dev_view_contiguous(v))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: the %s tensor must be contiguous (use t:contiguous())",
                    dev_coll_name(c->kind), what);
  return DEV_OK;
}

/* 1 when c (checked) reads an input that overlaps its output other than in
 * one of NCCL's in-place layouts (the same tensor; all_gather's input this
 * rank's block of the output; reduce_scatter's output this rank's block of
 * the input): NCCL would read what it already wrote. */
static int coll_aliased(dev_ctx *ctx, const dev_coll *c) {
  if (c->kind == DEV_COLL_SEND || c->kind == DEV_COLL_RECV) return 0;
  size_t esz = dev_dtype_size(c->send.dtype);
  uintptr_t so = (uintptr_t)dev_view_ptr(&c->send), ro = (uintptr_t)dev_view_ptr(&c->recv);
  uintptr_t sb = (uintptr_t)dev_view_numel(&c->send) * esz, rb = (uintptr_t)dev_view_numel(&c->recv) * esz;
  if (!(so < ro + rb && ro < so + sb)) return 0;
  uintptr_t rank = (uintptr_t)(c->group ? c->group->rank : ctx->ri.rank);
  if (c->kind == DEV_COLL_ALL_GATHER) return so != ro + rank * sb;
  if (c->kind == DEV_COLL_REDUCE_SCATTER) return ro != so + rank * rb;
  return so != ro;
}

static int coll_check(dev_ctx *ctx, const dev_coll *g, int n) {
  /* in a group, ranks (roots, peers, blocks) are the group's */
  int rc, world = g[0].group ? g[0].group->size : ctx->ri.world, self_send = 0, self_recv = 0;
  int me = g[0].group ? g[0].group->rank : ctx->ri.rank;
  for (int i = 0; i < n; i++) {
    const dev_coll *c = &g[i];
    if ((unsigned)c->kind >= DEV_NCOLL) return dev_fail(ctx, DEV_ERR_INVALID, "collective: bad kind");
    const char *name = dev_coll_name(c->kind);
    if (c->group != g[0].group)
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: the sends and receives of a gpu.group go through one process group",
                      name);
    int p2p = c->kind == DEV_COLL_SEND || c->kind == DEV_COLL_RECV;
    if (n > 1 && !p2p)
      return dev_fail(ctx, DEV_ERR_INVALID, "%s cannot be grouped: a group holds sends and receives", name);
    int has_send = c->kind != DEV_COLL_RECV, has_recv = c->kind != DEV_COLL_SEND;
    if (has_send && (rc = coll_view(ctx, c, &c->send, 0))) return rc;
    if (has_recv && (rc = coll_view(ctx, c, &c->recv, 1))) return rc;
    if (has_send && has_recv && c->send.dtype != c->recv.dtype)
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtypes differ (%s and %s)", name,
                      dev_dtype_name(c->send.dtype), dev_dtype_name(c->recv.dtype));
    int64_t ns = has_send ? dev_view_numel(&c->send) : 0, nr = has_recv ? dev_view_numel(&c->recv) : 0;
    switch (c->kind) {
    case DEV_COLL_ALL_REDUCE: case DEV_COLL_BROADCAST: case DEV_COLL_REDUCE:
      if (nr != ns) return coll_count_fail(ctx, c, "the output", ns, nr);
      break;
    case DEV_COLL_ALL_GATHER:
      if (nr != ns * world) return coll_count_fail(ctx, c, "the output", ns * world, nr);
      break;
    case DEV_COLL_REDUCE_SCATTER:
      if (ns != nr * world) return coll_count_fail(ctx, c, "the input", nr * world, ns);
      break;
    default:
      break;
    }
    if (c->kind == DEV_COLL_ALL_REDUCE || c->kind == DEV_COLL_REDUCE || c->kind == DEV_COLL_REDUCE_SCATTER) {
      dev_dtype t = c->recv.dtype;
      if ((unsigned)c->red >= DEV_NCRED) return dev_fail(ctx, DEV_ERR_INVALID, "%s: bad reduction", name);
      if (t == DEV_BOOL)
        return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s: bool tensors cannot be reduced (use u8)", name);
      if (c->red == DEV_CRED_AVG && !dev_dtype_is_float(t))
        return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s: avg needs a floating dtype, got %s (use sum)", name,
                        dev_dtype_name(t));
    }
    if (c->kind != DEV_COLL_ALL_REDUCE && c->kind != DEV_COLL_ALL_GATHER && c->kind != DEV_COLL_REDUCE_SCATTER &&
        (c->peer < 0 || c->peer >= world))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s %d is not a rank (%s of %d)", name, p2p ? "peer" : "root",
                      c->peer, c->group ? c->group->label : "world", world);
    if (p2p && c->peer == me) {
      if (c->kind == DEV_COLL_SEND) self_send++; else self_recv++;
    }
  }
  /* NCCL's rule: a rank sends to itself only with the matching receive in
   * the same group */
  if (self_send != self_recv)
    return dev_fail(ctx, DEV_ERR_INVALID, "%s to this rank itself needs a matching %s in the same gpu.group",
                    self_send > self_recv ? "send" : "recv", self_send > self_recv ? "recv" : "send");
  return DEV_OK;
}

/* c (checked, alone: not in a group), whose input overlaps its output
 * otherwise than in place: its input first goes to a device temporary, on
 * s, so that it is read before the output is written (the rule of every op
 * with an output, docs/lua-api.md).  Only this rank copies: the collective
 * is the same on every rank. */
static int coll_unaliased(dev_ctx *ctx, dev_stream *s, const dev_coll *c) {
  dev_coll k = *c;
  dev_buf *tmp;
  int64_t n = dev_view_numel(&c->send);
  int rc = dev_buf_alloc_on(ctx, DEV_MEM_DEVICE, (size_t)n * dev_dtype_size(c->send.dtype), s, &tmp);
  if (rc) return rc;
  memset(&k.send, 0, sizeof k.send);
  k.send.buf = tmp;
  k.send.dtype = c->send.dtype;
  dev_view_set_contiguous(&k.send, 1, &n);
  dev_kop cp = {.kind = DEV_OP_COPY, .nin = 1, .out = k.send};
  cp.in[0] = c->send;
  rc = dev_submit(ctx, s, &cp);
  if (rc == DEV_OK) rc = dev_collective(ctx, s, &k, 1);
  dev_buf_release(tmp);
  return rc;
}

int dev_collective(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n) {
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if (n < 1) return DEV_OK;
  if (!ctx->comm) return dev_fail(ctx, DEV_ERR_INVALID, "%s: the communicator is not joined", dev_coll_name(c->kind));
  if (!s) s = ctx->dflt;
  if ((rc = check_open(s))) return rc;
  if ((rc = coll_check(ctx, c, n))) return rc;
  if (n == 1 && coll_aliased(ctx, c)) return coll_unaliased(ctx, s, c);
  if (ctx->capture) return graph_coll(s, c, n);
  if (ctx->race && (rc = race_coll(ctx, s, c, n, 0))) return rc;
  for (int i = 0; i < n; i++) {
    dev_buf *bufs[2] = {NULL, NULL};
    int k = 0;
    if (c[i].kind != DEV_COLL_RECV) bufs[k++] = c[i].send.buf;
    if (c[i].kind != DEV_COLL_SEND) bufs[k++] = c[i].recv.buf;
    if ((rc = fence_op_bufs(s, bufs, k))) return rc;
  }
  if ((rc = ctx->bk->coll(s, c, n, ctx->coll_seq + 1))) return rc;
  if (ctx->race) race_coll(ctx, s, c, n, 1);
  if (ctx->trace_gen) dev_trace_note_stream(ctx, s);
  ctx->coll_seq++;
  for (int i = 0; i < n; i++) {
    if (c[i].kind != DEV_COLL_RECV) note_use(BX(c[i].send.buf), s, 0);
    if (c[i].kind != DEV_COLL_SEND) note_use(BX(c[i].recv.buf), s, 1);
  }
  return DEV_OK;
}
