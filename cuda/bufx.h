/* Buffers inside (cuda/dev_buf.c): the use lists, the block cache, the
 * sweep, and the per-op helpers the files that enqueue work share
 * (dev_op.c, dev_coll.c, dev_graph.c, dev_stream.c, dev.c).  No backend
 * includes it. */
#ifndef GPULUA_BUFX_H
#define GPULUA_BUFX_H

#include <stdlib.h>
#include "devpriv.h"

/* cuda/dev_buf.c: pinned staging memory for a copy on s (dev_op.c): a
 * block of the cache, which may be one that queued work ordered before s
 * still uses (then it has fences, and only s's work may touch it), so that
 * copies queued one after another on a stream take turns with one block. */
int dev_buf_alloc_stage(dev_ctx *ctx, size_t bytes, dev_stream *s, dev_buf **out);

/* cuda/dev_buf.c: buffers and their lifetime (its header says what holds).
 * The sweep (deferred releases, dead wrapped buffers, lingering and
 * released streams), and one that checks the streams now; drop a stream
 * reference (released at 0, freed once idle); free a stream (drained,
 * unreferenced, or at the context's end); pending blocks whose uses are
 * over become ready (one kind, or all: -1); every block back to the
 * backend, waiting for queued uses. */
void dev_sweep(dev_ctx *ctx);
void dev_sweep_all(dev_ctx *ctx);
void dev_stream_unref(dev_stream *s);
void dev_stream_destroy(dev_stream *s);
void dev_cache_settle(dev_ctx *ctx, int kind);
void dev_cache_free_all(dev_ctx *ctx);

/* A buffer with its use list: for each stream that touched it, the stream
 * position after its last read and its last write. */
typedef struct buf_use {
  dev_stream *s;
  uint64_t rpos, wpos;
  uint64_t waited;                  /* fences: id + 1 of the last stream made to wait */
} buf_use;

typedef struct bufx {
  dev_buf b;
  buf_use *use;
  int nuse, cap;
  /* a reused block: its previous owners' uses still queued (wpos), which
   * other streams wait for before they touch it */
  buf_use *fence;
  int nfence, fcap;
  struct bufx *fprev, *fnext;       /* ctx->fenced while it has fences */
  int in_fenced;
  size_t block;                     /* bytes of its cache block (0: wrapped) */
  int cls;                          /* its size class */
  int dead;                         /* wrapped, refs hit 0, waiting for its uses */
  int wrapped;                      /* memory owned by someone else */
  int guarded;                      /* ... that only gpulua touches (dev_buf_guard) */
  int internal;                     /* the device layer's own: not in the stats */
  struct bufx *prev, *next;         /* ctx->bufs, ctx->dead or a cache list */
  void (*release)(void *ud, void *ptr);
  void *ud;
  struct race_buf *race;            /* race checker state (race.c) */
  struct bufx *defer_next;          /* ctx->deferred, under defer_mu */
  int async_pending;                /* releases waiting there, under defer_mu */
} bufx;

#define BX(b) ((bufx *)(b))

/* The cache of blocks (dev_buf.c): per memory kind and size class,
 * blocks no queued work uses, and blocks still used by queued work. */
#define MIN_BLOCK 256
#define NCLASS (8 * 56 + 9)
struct dev_memcache {
  bufx *ready[DEV_NMEMKIND][NCLASS];
  bufx *pending[DEV_NMEMKIND][NCLASS];   /* oldest first */
  bufx *ptail[DEV_NMEMKIND][NCLASS];
  /* bit c of kind k: pending[k][c] is not empty (walks skip the rest) */
  uint64_t pmask[DEV_NMEMKIND][(NCLASS + 63) / 64];
};

/* The buffer helpers of every op (dev_op.c, dev_coll.c) and of the
 * lifetime code (dev_buf.c, dev_stream.c), static inline: the per-op path
 * (fences, recording a use) calls into no other file for them. */

/* Work queued on s from now on runs after everything queued on o so far:
 * the same stream, or CUDA's legacy default stream and a blocking stream. */
static inline int ordered_after(const dev_stream *s, const dev_stream *o) {
  return s == o || (s->is_default && !o->nonblocking) || (o->is_default && !s->nonblocking);
}

static inline uint64_t use_last(const buf_use *u) { return u->rpos > u->wpos ? u->rpos : u->wpos; }

/* Drop the uses (or fences) that the streams are already past. */
static inline void prune_uses(dev_ctx *ctx, buf_use *use, int *n) {
  int j = 0;
  for (int i = 0; i < *n; i++) {
    if (ctx->bk->pos_done(use[i].s, use_last(&use[i]))) dev_stream_unref(use[i].s);
    else use[j++] = use[i];
  }
  *n = j;
}

/* Live buffers with fences, so that a closed stream they name can be let
 * go of without a sync (stream_forget, dev_buf.c). */
static inline void fenced_remove(dev_ctx *ctx, bufx *x) {
  if (!x->in_fenced) return;
  if (x->fprev) x->fprev->fnext = x->fnext; else ctx->fenced = x->fnext;
  if (x->fnext) x->fnext->fprev = x->fprev;
  x->fprev = x->fnext = NULL;
  x->in_fenced = 0;
}

static inline void prune(bufx *x) {
  if (x->nuse) prune_uses(x->b.ctx, x->use, &x->nuse);
  if (x->nfence) {
    prune_uses(x->b.ctx, x->fence, &x->nfence);
    if (x->nfence == 0) fenced_remove(x->b.ctx, x);
  }
}

/* Before an op on s touches x: wait for the fences of a reused block that s
 * is not ordered after.  Each stream waits once per fence. */
static inline int apply_fences(bufx *x, dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  int rc = DEV_OK;
  for (int i = 0; i < x->nfence && rc == DEV_OK; i++) {
    buf_use *f = &x->fence[i];
    if (ordered_after(s, f->s) || f->waited == s->id + 1) continue;
    if (!ctx->bk->pos_done(f->s, f->wpos)) rc = ctx->bk->stream_wait(s, f->s, f->wpos);
    if (rc == DEV_OK) f->waited = s->id + 1;
  }
  return rc;
}

static inline int fence_op_bufs(dev_stream *s, dev_buf *const *bufs, int n) {
  for (int i = 0; i < n; i++) {
    bufx *x = BX(bufs[i]);
    if (x->nfence) {
      int rc = apply_fences(x, s);
      if (rc) return rc;
    }
  }
  return DEV_OK;
}

static inline void note_use(bufx *x, dev_stream *s, int write) {
  uint64_t pos = s->ctx->bk->stream_pos(s);
  for (int i = 0; i < x->nuse; i++) {
    if (x->use[i].s != s) continue;
    if (write) x->use[i].wpos = pos; else x->use[i].rpos = pos;
    return;
  }
  prune(x);
  if (x->nuse == x->cap) {
    int cap = x->cap ? 2 * x->cap : 4;
    buf_use *nu = realloc(x->use, (size_t)cap * sizeof *nu);
    /* Out of memory here: fall back to waiting, so lifetime stays correct. */
    if (!nu) { s->ctx->bk->pos_wait(s, pos); return; }
    x->use = nu;
    x->cap = cap;
  }
  s->refs++;
  x->use[x->nuse++] = (buf_use){s, write ? 0 : pos, write ? pos : 0, 0};
}

#endif
