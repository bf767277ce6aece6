/* Process groups: communicators over some ranks of the world.
 *
 * - Making one is collective over the world: every rank's (colour, key,
 *   agree) goes to every rank with a world all_gather, so every rank
 *   computes the same members, in the same order, from the same table; a
 *   rank whose agree value differs (new_group's list) fails on every rank.
 * - The backend opens the group's own communicator (host: a shared-memory
 *   segment of the members; cuda: ncclCommSplit on the world's).
 * - Queued and captured collectives hold a reference, so closing a group
 *   with work in flight frees it after that work. */
#include <stdio.h>
#include <string.h>

#include "devpriv.h"

/* Every rank's {colour, key, agree}, in world-rank order, into all (3 x world). */
static int gather3(dev_ctx *ctx, const int64_t mine[3], int64_t *all) {
  int w = ctx->ri.world;
  size_t bytes = (size_t)w * 3 * sizeof(int64_t);
  dev_stream *s = ctx->dflt;
  dev_buf *d = NULL, *h = NULL;
  int rc = dev_buf_alloc(ctx, DEV_MEM_DEVICE, bytes, &d);
  if (rc == DEV_OK) rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, bytes, &h);
  if (rc) goto done;
  /* a fresh block: no queued work uses it */
  memcpy(h->ptr, mine, 3 * sizeof(int64_t));
  int64_t three = 3, n = 3 * (int64_t)w;
  dev_view hv = {.buf = h, .dtype = DEV_I64}, dv = {.buf = d, .dtype = DEV_I64};
  dev_view_set_contiguous(&hv, 1, &three);
  dev_view_set_contiguous(&dv, 1, &n);
  dev_coll c = {.kind = DEV_COLL_ALL_GATHER, .recv = dv, .send = dv};
  c.send.offset = (size_t)ctx->ri.rank * 3 * sizeof(int64_t);
  dev_view_set_contiguous(&c.send, 1, &three);
  dev_kop cp = {.kind = DEV_OP_COPY, .nin = 1, .out = c.send};
  cp.in[0] = hv;
  if ((rc = dev_submit(ctx, s, &cp))) goto done;
  if ((rc = dev_collective(ctx, s, &c, 1))) goto done;
  dev_view_set_contiguous(&hv, 1, &n);
  dev_kop back = {.kind = DEV_OP_COPY, .nin = 1, .out = hv};
  back.in[0] = dv;
  if ((rc = dev_submit(ctx, s, &back))) goto done;
  if ((rc = dev_stream_synchronize(s))) goto done;
  memcpy(all, h->ptr, bytes);
done:
  if (d) dev_buf_release(d);
  if (h) dev_buf_release(h);
  return rc;
}

/* "group {0,2,5}", cut with "..." where long */
static void default_label(dev_group *g) {
  size_t len = sizeof g->label, at = (size_t)snprintf(g->label, len, "group {");
  for (int i = 0; i < g->size && at < len; i++) {
    int k = snprintf(g->label + at, len - at, "%s%d", i ? "," : "", g->members[i]);
    if (k < 0 || at + (size_t)k + 5 >= len) {
      snprintf(g->label + (at < len - 5 ? at : len - 5), 5, "...}");
      return;
    }
    at += (size_t)k;
  }
  if (at + 1 < len) snprintf(g->label + at, len - at, "}");
}

/* The members of this rank's colour, by key then world rank. */
static int members_of(const int64_t *all, int world, int color, int *out) {
  int n = 0;
  for (int q = 0; q < world; q++) {
    if (all[3 * q] != color) continue;
    int at = n++;
    /* insertion: keys ascending, ties in world-rank order */
    while (at > 0 && all[3 * out[at - 1] + 1] > all[3 * q + 1]) {
      out[at] = out[at - 1];
      at--;
    }
    out[at] = q;
  }
  return n;
}

int dev_group_split(dev_ctx *ctx, int color, int key, uint64_t agree, const char *label, dev_group **out) {
  *out = NULL;
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if (!ctx->comm) return dev_fail(ctx, DEV_ERR_INVALID, "new_group: the communicator is not joined");
  if (ctx->capture) return dev_fail(ctx, DEV_ERR_INVALID, "a group cannot be made while a graph is captured");
  if (!ctx->bk->group_open)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "process groups are not available on the %s backend", ctx->bk->name);
  int w = ctx->ri.world;
  int64_t mine[3] = {color < 0 ? -1 : color, key, (int64_t)agree};
  int64_t *all = malloc((size_t)w * 3 * sizeof *all);
  dev_group *g = calloc(1, sizeof *g);
  int *members = malloc((size_t)w * sizeof *members);
  if (!all || !g || !members) {
    rc = dev_fail(ctx, DEV_ERR_NOMEM, "out of memory making a group");
    goto fail;
  }
  if ((rc = gather3(ctx, mine, all))) goto fail;
  for (int q = 1; q < w; q++)
    if (all[3 * q + 2] != all[2]) {
      rc = dev_fail(ctx, DEV_ERR_INVALID, "ranks disagree on the group made #%llu: rank %d passed other ranks "
                    "than rank 0 (every rank passes the same list)", (unsigned long long)ctx->groups_made + 1, q);
      goto fail;
    }
  ctx->groups_made++;
  if (color < 0) {
    /* not a member: it still takes part where the library splits (NCCL) */
    rc = ctx->bk->group_open(ctx, NULL, -1, key);
    goto fail;
  }
  g->refs = 1;
  g->id = ctx->groups_made;
  g->members = members;
  g->size = members_of(all, w, color, members);
  for (int i = 0; i < g->size; i++)
    if (members[i] == ctx->ri.rank) g->rank = i;
  if (label && *label) snprintf(g->label, sizeof g->label, "group '%s'", label);
  else default_label(g);
  free(all);
  if ((rc = ctx->bk->group_open(ctx, g, color, key))) {
    free(members);
    free(g);
    return rc;
  }
  *out = g;
  return DEV_OK;
fail:
  free(all);
  free(g);
  free(members);
  return rc;
}

int dev_group_rank(const dev_group *g) { return g->rank; }
int dev_group_size(const dev_group *g) { return g->size; }
const int *dev_group_members(const dev_group *g) { return g->members; }
const char *dev_group_label(const dev_group *g) { return g->label; }

void dev_group_retain(dev_group *g) {
  if (g) atomic_fetch_add(&g->refs, 1);
}

void dev_group_release(dev_group *g) {
  if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
  if (g->free_impl) g->free_impl(g->impl);
  free(g->members);
  free(g);
}
