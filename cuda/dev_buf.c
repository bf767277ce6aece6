/* Buffers and their lifetime: allocation from the block cache, wrapped
 * (application) memory, the use and fence lists, releases (those deferred
 * from other threads too), the sweep, the ends of the streams the lists
 * name (the lingering and released lists), and the memory figures.
 *
 * What holds here:
 * - A use or fence entry holds one reference to its stream, dropped with
 *   the entry (pruned once the stream is past it, merged into another, or
 *   waited for); a list has at most one entry per stream.  Out of memory
 *   for a new entry, the host waits instead of recording it.
 * - A buffer's memory goes back to the cache only when its last reference
 *   goes, with its uses still queued, its fences merged into them.  A cached
 *   block is "ready" (no use left) or "pending" (uses queued, oldest first);
 *   it has no fences and holds no context reference.
 * - A pending block goes to a new buffer only for a stream ordered after
 *   every one of its uses (ordered_after), and only device memory or a
 *   staging block (dev_buf_alloc_stage, whose user touches it only in that
 *   stream's order); its uses become the new buffer's fences.  Before an op on any other stream
 *   touches the buffer, that stream waits for them (apply_fences); host
 *   access waits for them all.  Host-visible blocks are reused only ready.
 *   So the memory goes to a new owner only when every use recorded on it
 *   is done or ordered before the new owner's work.
 * - An allocation's work does not grow with what is alive: cache_take
 *   probes at most 8 pending blocks from each end of one list.  The sweep
 *   (every allocation) is O(1) unless there are deferred releases, dead
 *   wrapped buffers (walked on every call) or lingering or released streams
 *   (walked every 64th call that finds some, and by dev_sweep_all; each
 *   lingering stream then walks every pending list and every fenced
 *   buffer).  Out of memory, an allocation gives the kind's blocks whose
 *   uses are over back to the backend and tries once more; only
 *   dev_mem_reclaim waits for pending blocks.
 * - Wrapped memory is never cached: released with uses queued, its buffer
 *   waits on ctx->dead (holding the context) until a sweep finds it idle,
 *   then its release callback runs.
 * - Releases from other threads (dev_buf_release_async) are queued under
 *   defer_mu and done by the owner's next sweep; once owner_gone each runs
 *   at once on its own thread, under defer_mu.
 * - A stream whose handle goes while something still names it lingers:
 *   sweeps drop the cached blocks' and fences' entries for it that are over
 *   (live buffers' uses go when those buffers are pruned).  At 0 references
 *   it is released (gives back its context reference) and freed once the
 *   backend says it is idle.  It is on at most one of the two lists, and on
 *   ctx->streams until freed.
 * - The figures: mlive[k], the block bytes of live buffers; mpeak[k], its
 *   high-water mark; mreserved[k], what the backend gave (live and cached).
 *   Wrapped memory is in none of them.
 * - From dev_close on (ctx->closing) nothing is cached or left pending:
 *   a release waits for the uses and frees at once.
 */
#include <stdlib.h>
#include <string.h>

#include "devpriv.h"
#include "bufx.h"
#include "capture.h"
#include "race.h"

struct race_buf **dev_buf_racep(dev_buf *b) { return &BX(b)->race; }

static void buf_release(dev_buf *b);

/* ---- buffers ---------------------------------------------------------- */

/* Memory comes from a cache of blocks, one list per memory kind and size
 * class (8 classes per power of two: at most 12.5% above the request, 256
 * bytes at least).  A buffer whose last reference goes returns its block at
 * once, with its queued uses: the block is "ready" when the streams are past
 * them, "pending" until then.  A pending block goes only to a new buffer made
 * for a stream that is ordered after every one of those uses (the same
 * stream, or CUDA's default-stream rules); the old uses become the new
 * buffer's fences, which work on any other stream waits for (and host access
 * too), so reuse never needs the script's help.  Host-visible blocks are
 * reused only when ready: the host touches them without a stream.  No
 * allocation does work that grows with the number of live buffers. */

static int size_class(size_t n, size_t *block) {
  if (n <= MIN_BLOCK) { *block = MIN_BLOCK; return 0; }
  int e = 63 - __builtin_clzll((unsigned long long)(n - 1));   /* 2^e < n <= 2^(e+1) */
  size_t unit = (size_t)1 << (e - 3);
  size_t k = (n - ((size_t)1 << e) + unit - 1) / unit;         /* 1..8 */
  *block = ((size_t)1 << e) + k * unit;
  return (e - 8) * 8 + (int)k;
}

/* Onto ctx->fenced (fenced_remove, bufx.h, takes it off). */
static void fenced_add(dev_ctx *ctx, bufx *x) {
  if (x->in_fenced) return;
  x->fprev = NULL;
  x->fnext = ctx->fenced;
  if (ctx->fenced) ctx->fenced->fprev = x;
  ctx->fenced = x;
  x->in_fenced = 1;
}

static void list_push(bufx **head, bufx *x) {
  x->prev = NULL;
  x->next = *head;
  if (*head) (*head)->prev = x;
  *head = x;
}

static void list_unlink(bufx **head, bufx *x) {
  if (x->prev) x->prev->next = x->next; else *head = x->next;
  if (x->next) x->next->prev = x->prev;
  x->prev = x->next = NULL;
}

/* The pending lists keep their order (oldest first): the blocks most likely
 * done are at the head, the ones a stream just used at the tail. */
static void pend_push(dev_ctx *ctx, bufx *x) {
  struct dev_memcache *mc = ctx->cache;
  bufx **tail = &mc->ptail[x->b.kind][x->cls];
  x->next = NULL;
  x->prev = *tail;
  if (*tail) {
    (*tail)->next = x;
  } else {
    mc->pending[x->b.kind][x->cls] = x;
    mc->pmask[x->b.kind][x->cls / 64] |= (uint64_t)1 << (x->cls % 64);
  }
  *tail = x;
}

static void pend_unlink(dev_ctx *ctx, bufx *x) {
  struct dev_memcache *mc = ctx->cache;
  if (x->next == NULL) mc->ptail[x->b.kind][x->cls] = x->prev;
  list_unlink(&mc->pending[x->b.kind][x->cls], x);
  if (!mc->pending[x->b.kind][x->cls])
    mc->pmask[x->b.kind][x->cls / 64] &= ~((uint64_t)1 << (x->cls % 64));
}

/* The next class at or after c whose pending list of kind k is not empty,
 * NCLASS if none: walks of every pending list cost what is pending, not
 * the 457 classes (a stream's close walked them all: 18k instructions). */
static int pend_next(const struct dev_memcache *mc, int k, int c) {
  for (int w = c / 64; w < (NCLASS + 63) / 64; w++) {
    uint64_t m = mc->pmask[k][w];
    if (w == c / 64) m &= ~(uint64_t)0 << (c % 64);
    if (m) return w * 64 + __builtin_ctzll(m);
  }
  return NCLASS;
}

static void account_live(dev_ctx *ctx, dev_memkind kind, size_t bytes, int sign) {
  if (sign > 0) {
    ctx->mlive[kind] += bytes;
    if (ctx->mlive[kind] > ctx->mpeak[kind]) ctx->mpeak[kind] = ctx->mlive[kind];
  } else {
    ctx->mlive[kind] -= bytes;
  }
}

/* A block goes back to the backend: no use of it is queued any more. */
static void block_free(dev_ctx *ctx, bufx *x) {
  ctx->bk->free(ctx, x->b.kind, x->b.ptr, x->block);
  ctx->mreserved[x->b.kind] -= x->block;
  free(x->use);
  free(x->fence);
  free(x);
}

/* Pending blocks of a kind (every kind: -1) whose uses are over become
 * ready (after a sync, before a trim). */
void dev_cache_settle(dev_ctx *ctx, int kind) {
  for (int k = 0; k < DEV_NMEMKIND; k++) {
    if (kind >= 0 && k != kind) continue;
    for (int c = pend_next(ctx->cache, k, 0); c < NCLASS; c = pend_next(ctx->cache, k, c + 1))
      for (bufx *x = ctx->cache->pending[k][c], *nx; x; x = nx) {
        nx = x->next;
        prune(x);
        if (x->nuse == 0) {
          pend_unlink(ctx, x);
          list_push(&ctx->cache->ready[k][c], x);
        }
      }
  }
}

/* Return the ready blocks of a kind (of every kind: -1) to the backend;
 * pending blocks whose uses are over first become ready. */
static void cache_trim(dev_ctx *ctx, int kind) {
  if (!ctx->cache) return;
  dev_cache_settle(ctx, kind);
  for (int k = 0; k < DEV_NMEMKIND; k++) {
    if (kind >= 0 && k != kind) continue;
    for (int c = 0; c < NCLASS; c++)
      while (ctx->cache->ready[k][c]) {
        bufx *x = ctx->cache->ready[k][c];
        list_unlink(&ctx->cache->ready[k][c], x);
        block_free(ctx, x);
      }
  }
}

/* A stream's handle is closed: the cached blocks' uses of it that are over
 * let go of it, so that it can be freed once idle. */
static void cache_forget_stream(dev_ctx *ctx, dev_stream *s) {
  for (int k = 0; k < DEV_NMEMKIND; k++)
    for (int c = pend_next(ctx->cache, k, 0); c < NCLASS; c = pend_next(ctx->cache, k, c + 1))
      for (bufx *x = ctx->cache->pending[k][c], *nx; x; x = nx) {
        nx = x->next;
        int j = 0;
        for (int i = 0; i < x->nuse; i++) {
          buf_use *u = &x->use[i];
          if (u->s == s && ctx->bk->pos_done(s, use_last(u))) dev_stream_unref(s);
          else x->use[j++] = *u;
        }
        x->nuse = j;
        if (x->nuse == 0) {
          pend_unlink(ctx, x);
          list_push(&ctx->cache->ready[k][c], x);
        }
      }
}

/* ... and the fences of live buffers that name it and are over. */
static void stream_forget(dev_ctx *ctx, dev_stream *s) {
  cache_forget_stream(ctx, s);
  for (bufx *x = ctx->fenced, *nx; x; x = nx) {
    nx = x->fnext;
    int j = 0;
    for (int i = 0; i < x->nfence; i++) {
      buf_use *f = &x->fence[i];
      if (f->s == s && ctx->bk->pos_done(s, f->wpos)) dev_stream_unref(s);
      else x->fence[j++] = *f;
    }
    x->nfence = j;
    if (j == 0) fenced_remove(ctx, x);
  }
}

/* Every block back to the backend, waiting for the uses still queued
 * (dev_close; the context's end). */
void dev_cache_free_all(dev_ctx *ctx) {
  if (!ctx->cache) return;
  for (int k = 0; k < DEV_NMEMKIND; k++)
    for (int c = 0; c < NCLASS; c++) {
      while (ctx->cache->pending[k][c]) {
        bufx *x = ctx->cache->pending[k][c];
        pend_unlink(ctx, x);
        for (int i = 0; i < x->nuse; i++) {
          ctx->bk->pos_wait(x->use[i].s, use_last(&x->use[i]));
          dev_stream_unref(x->use[i].s);
        }
        x->nuse = 0;
        block_free(ctx, x);
      }
      while (ctx->cache->ready[k][c]) {
        bufx *x = ctx->cache->ready[k][c];
        list_unlink(&ctx->cache->ready[k][c], x);
        block_free(ctx, x);
      }
    }
  if (ctx->bk->trim) ctx->bk->trim(ctx);
}

/* A block for a new buffer of this kind and class, made for stream s (NULL:
 * none in particular), from the cache; NULL when none fits.  ordered: a
 * pending block whose uses s is ordered after may be taken (device memory,
 * and the staging blocks of dev_buf_alloc_stage). */
static bufx *cache_take(dev_ctx *ctx, dev_memkind kind, int cls, dev_stream *s, int ordered) {
  struct dev_memcache *mc = ctx->cache;
  bufx *x = mc->ready[kind][cls];
  if (x) {
    list_unlink(&mc->ready[kind][cls], x);
    return x;
  }
  if (!mc->pending[kind][cls]) return NULL;
  /* a block the stream is ordered after: no wait, no device query; the
   * newest first (the stream's own last blocks) */
  int probes = 0;
  if (s && ordered) {
    for (x = mc->ptail[kind][cls]; x && probes < 8; x = x->prev, probes++) {
      int ok = 1;
      for (int i = 0; ok && i < x->nuse; i++) ok = ordered_after(s, x->use[i].s);
      if (ok) { pend_unlink(ctx, x); return x; }
    }
  }
  /* the oldest ones, a few: the cost of an allocation stays bounded however
   * many blocks queued work still holds (a sync, or running out of memory,
   * settles them all) */
  probes = 0;
  for (x = mc->pending[kind][cls]; x && probes < 8; x = x->next, probes++) {
    prune(x);
    if (x->nuse == 0) { pend_unlink(ctx, x); return x; }
  }
  return NULL;
}

/* The buffer's last reference is gone and its memory is ours: back to the
 * cache, with the uses still queued (its fences among them). */
static void cache_put(dev_ctx *ctx, bufx *x) {
  for (int i = 0; i < x->nfence; i++) {
    /* a fence is a use of the block like any other */
    buf_use *f = &x->fence[i];
    int j = 0;
    while (j < x->nuse && x->use[j].s != f->s) j++;
    if (j < x->nuse) {
      if (use_last(f) > x->use[j].wpos) x->use[j].wpos = use_last(f);
      dev_stream_unref(f->s);
      continue;
    }
    if (x->nuse == x->cap) {
      int cap = x->cap ? 2 * x->cap : 4;
      buf_use *nu = realloc(x->use, (size_t)cap * sizeof *nu);
      /* out of memory: wait instead, so the block stays safe */
      if (!nu) { ctx->bk->pos_wait(f->s, use_last(f)); dev_stream_unref(f->s); continue; }
      x->use = nu;
      x->cap = cap;
    }
    x->use[x->nuse++] = (buf_use){f->s, 0, use_last(f), 0};
  }
  x->nfence = 0;
  fenced_remove(ctx, x);
  if (x->race) { race_buf_gone(x->race); x->race = NULL; }
  if (ctx->closing) {
    /* no cache past dev_close: wait, then free */
    for (int i = 0; i < x->nuse; i++) {
      ctx->bk->pos_wait(x->use[i].s, use_last(&x->use[i]));
      dev_stream_unref(x->use[i].s);
    }
    x->nuse = 0;
    block_free(ctx, x);
    return;
  }
  if (x->nuse) pend_push(ctx, x);
  else list_push(&ctx->cache->ready[x->b.kind][x->cls], x);
}

/* A wrapped buffer (not ours) or a block leaves for good. */
static void buf_free(bufx *x) {
  dev_ctx *ctx = x->b.ctx;
  for (int i = 0; i < x->nuse; i++) dev_stream_unref(x->use[i].s);
  for (int i = 0; i < x->nfence; i++) dev_stream_unref(x->fence[i].s);
  if (x->race) race_buf_gone(x->race);
  if (x->release) x->release(x->ud, x->b.ptr);
  free(x->use);
  free(x->fence);
  free(x);
  dev_ctx_release(ctx);
}

/* The releases other threads deferred to this one (the owner), one buffer
 * at a time: a release may defer another (an import of our own export). */
static void drain_deferred(dev_ctx *ctx) {
  if (!atomic_load(&ctx->defer_flag)) return;
  for (;;) {
    pthread_mutex_lock(&ctx->defer_mu);
    bufx *x = ctx->deferred;
    if (!x) {
      atomic_store(&ctx->defer_flag, 0);
      pthread_mutex_unlock(&ctx->defer_mu);
      return;
    }
    ctx->deferred = x->defer_next;
    int n = x->async_pending;
    x->async_pending = 0;
    pthread_mutex_unlock(&ctx->defer_mu);
    while (n-- > 0) buf_release(&x->b);
  }
}

/* Work that per allocation must not grow with what is alive: deferred
 * releases, dead wrapped buffers whose uses are over, released streams that
 * are idle (those only every 64th call: their test may ask the device). */
void dev_sweep(dev_ctx *ctx) {
  if (!atomic_load(&ctx->defer_flag) && !ctx->dead && !ctx->released && !ctx->lingering) return;
  ctx->refs++;  /* the frees below may drop the last reference */
  drain_deferred(ctx);
  for (bufx *x = ctx->dead, *nx; x; x = nx) {
    nx = x->next;
    prune(x);
    if (x->nuse == 0 && x->nfence == 0) {
      list_unlink(&ctx->dead, x);
      buf_free(x);
    }
  }
  if ((ctx->released || ctx->lingering) && (ctx->sweeps++ & 63) == 0) {
    for (dev_stream *s = ctx->lingering, *ns; s; s = ns) {
      ns = s->lg_next;
      s->refs++;   /* held while its entries go */
      stream_forget(ctx, s);
      dev_stream_unref(s);
    }
    for (dev_stream *s = ctx->released, *ns; s; s = ns) {
      ns = s->rel_next;
      if (s->refs > 0) continue;
      if (ctx->bk->stream_idle(s)) dev_stream_destroy(s);
    }
  }
  /* a freed import of one of our exports releases the export's buffer */
  drain_deferred(ctx);
  dev_ctx_release(ctx);
}

/* The released streams, every one checked now (a sync, dev_close). */
void dev_sweep_all(dev_ctx *ctx) {
  ctx->sweeps = 0;
  dev_sweep(ctx);
}

static int nomem(dev_ctx *ctx, dev_memkind kind, size_t bytes) {
  size_t total = ctx->bk->mem_total(ctx, kind);
  return dev_fail(ctx, DEV_ERR_NOMEM,
                  "out of memory: cannot allocate %.1f MiB of %s memory (%.1f MiB in use by live "
                  "tensors, %.1f MiB cached, %.1f MiB total)",
                  bytes / 1048576.0, dev_memkind_name(kind), ctx->mlive[kind] / 1048576.0,
                  (ctx->mreserved[kind] - ctx->mlive[kind]) / 1048576.0, total / 1048576.0);
}

static int buf_alloc(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_stream *s, int ordered, dev_buf **out) {
  *out = NULL;
  if ((unsigned)kind >= DEV_NMEMKIND) return dev_fail(ctx, DEV_ERR_INVALID, "alloc: bad memory kind %d", (int)kind);
  if (bytes == 0) bytes = 1;
  /* a graph's ops run on the launch stream, not on the stream of the
   * capture: only blocks no queued work uses */
  if (s && s->capture) s = NULL;
  dev_sweep(ctx);
  size_t block;
  int cls = size_class(bytes, &block);
  bufx *x = cache_take(ctx, kind, cls, s, ordered);
  if (x) {
    /* the previous owner's queued uses: fences of the new buffer */
    buf_use *f = x->fence;
    int fcap = x->fcap;
    x->fence = x->use;
    x->nfence = x->nuse;
    x->fcap = x->cap;
    x->use = f;
    x->cap = fcap;
    x->nuse = 0;
    for (int i = 0; i < x->nfence; i++)
      x->fence[i] = (buf_use){x->fence[i].s, 0, use_last(&x->fence[i]), 0};
    if (x->nfence) fenced_add(ctx, x);
  } else {
    void *p = NULL;
    if (block < bytes) return nomem(ctx, kind, bytes);
    int rc = ctx->bk->alloc(ctx, kind, block, &p);
    if (rc == DEV_ERR_NOMEM) {
      /* the cache's other sizes go back first */
      cache_trim(ctx, kind);
      rc = ctx->bk->alloc(ctx, kind, block, &p);
    }
    if (rc == DEV_ERR_NOMEM) return nomem(ctx, kind, block);
    if (rc) return rc;
    x = calloc(1, sizeof *x);
    if (!x) {
      ctx->bk->free(ctx, kind, p, block);
      return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (buffer header)");
    }
    x->b.ptr = p;
    x->b.kind = kind;
    x->block = block;
    x->cls = cls;
    ctx->mreserved[kind] += block;
  }
  if (!x->b.ctx) {
    /* a new block; a reused one keeps these, which a queued op of its
     * previous owner may still read on a worker thread: the block's size,
     * never the request's */
    x->b.ctx = ctx;
    x->b.bytes = x->block;
    x->b.device = ctx->device;
  }
  x->b.refs = 1;
  x->dead = 0;
  list_push(&ctx->bufs, x);
  account_live(ctx, kind, block, +1);
  ctx->st.buffers++;
  dev_ctx_retain(ctx);
  *out = &x->b;
  return DEV_OK;
}

int dev_buf_alloc_on(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_stream *s, dev_buf **out) {
  return buf_alloc(ctx, kind, bytes, s, kind == DEV_MEM_DEVICE, out);
}

int dev_buf_alloc(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_buf **out) {
  return buf_alloc(ctx, kind, bytes, NULL, 0, out);
}

int dev_buf_alloc_stage(dev_ctx *ctx, size_t bytes, dev_stream *s, dev_buf **out) {
  return buf_alloc(ctx, DEV_MEM_PINNED, bytes, s, 1, out);
}

int dev_buf_wrap(dev_ctx *ctx, dev_memkind kind, void *ptr, size_t bytes,
                 void (*release)(void *ud, void *ptr), void *ud, dev_buf **out) {
  *out = NULL;
  if ((unsigned)kind >= DEV_NMEMKIND) return dev_fail(ctx, DEV_ERR_INVALID, "wrap: bad memory kind %d", (int)kind);
  int rc;
  if (ptr && bytes && ctx->bk->check_ptr && (rc = ctx->bk->check_ptr(ctx, kind, ptr, bytes))) return rc;
  dev_sweep(ctx);
  bufx *x = calloc(1, sizeof *x);
  if (!x) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (buffer header)");
  x->b.ctx = ctx;
  x->b.ptr = ptr;
  x->b.bytes = bytes;
  x->b.kind = kind;
  x->b.device = ctx->device;
  x->b.refs = 1;
  x->wrapped = 1;
  x->release = release;
  x->ud = ud;
  list_push(&ctx->bufs, x);
  ctx->st.buffers++;
  dev_ctx_retain(ctx);
  *out = &x->b;
  return DEV_OK;
}

int dev_buf_wrap_internal(dev_ctx *ctx, void *ptr, void (*release)(void *ud, void *ptr),
                          void *ud, dev_buf **out) {
  int rc = dev_buf_wrap(ctx, DEV_MEM_DEVICE, ptr, 0, release, ud, out);
  if (rc) return rc;
  BX(*out)->internal = 1;
  ctx->st.buffers--;
  return DEV_OK;
}

int dev_buf_wrapping(dev_ctx *ctx, void (*release)(void *ud, void *ptr), const void *ud) {
  for (int dead = 0; dead < 2; dead++)
    for (bufx *x = dead ? ctx->dead : ctx->bufs; x; x = x->next)
      if (x->wrapped && x->release == release && x->ud == ud) return 1;
  return 0;
}

void dev_buf_guard(dev_buf *b) { BX(b)->guarded = 1; }

void dev_buf_retain(dev_buf *b) { b->refs++; }

void dev_buf_release(dev_buf *b) {
  if (!b) return;
  if (b->ctx->owner_gone) dev_buf_release_async(b);
  else buf_release(b);
}

void dev_buf_release_async(dev_buf *b) {
  if (!b) return;
  dev_ctx *ctx = b->ctx;
  pthread_mutex_lock(&ctx->defer_mu);
  if (!ctx->owner_gone) {
    bufx *x = BX(b);
    if (x->async_pending++ == 0) {
      x->defer_next = ctx->deferred;
      ctx->deferred = x;
    }
    atomic_store(&ctx->defer_flag, 1);
    pthread_mutex_unlock(&ctx->defer_mu);
    return;
  }
  /* the owner is gone: release here, one thread at a time, holding the
   * context so that only the last of us destroys it, after unlocking */
  ctx->refs++;
  buf_release(b);
  int last = --ctx->refs == 0;
  pthread_mutex_unlock(&ctx->defer_mu);
  if (last) dev_ctx_destroy(ctx);
}

static void buf_release(dev_buf *b) {
  if (--b->refs > 0) return;
  bufx *x = BX(b);
  dev_ctx *ctx = b->ctx;
  list_unlink(&ctx->bufs, x);
  if (!x->internal) ctx->st.buffers--;
  if (!x->wrapped) {
    account_live(ctx, b->kind, x->block, -1);
    cache_put(ctx, x);
    dev_ctx_release(ctx);
    return;
  }
  prune(x);
  if (x->nuse == 0 && x->nfence == 0) { buf_free(x); return; }
  if (ctx->closing) {
    for (int i = 0; i < x->nuse; i++) ctx->bk->pos_wait(x->use[i].s, use_last(&x->use[i]));
    for (int i = 0; i < x->nfence; i++) ctx->bk->pos_wait(x->fence[i].s, use_last(&x->fence[i]));
    buf_free(x);
    return;
  }
  x->dead = 1;
  list_push(&ctx->dead, x);
}


static int buf_wait(dev_buf *b, int write, const char *what) {
  bufx *x = BX(b);
  dev_ctx *ctx = b->ctx;
  if (ctx->capture) {
    int rc = graph_host_access(ctx, b, what);
    if (rc) return rc;
  }
  int entered = 0;
  for (int fence = 0; fence < 2; fence++) {
    buf_use *use = fence ? x->fence : x->use;
    int n = fence ? x->nfence : x->nuse;
    for (int i = 0; i < n; i++) {
      buf_use *u = &use[i];
      /* a fence (the previous owner's use) always counts as a write */
      uint64_t pos = fence ? u->wpos : write ? use_last(u) : u->wpos;
      if (pos && !ctx->bk->pos_done(u->s, pos)) {
        int rc = entered ? DEV_OK : dev_sync_enter(ctx, what);
        entered = 1;
        if (rc == DEV_OK) rc = dev_sync_wait(ctx, u->s, pos);
        if (rc) { dev_sync_leave(ctx); return rc; }
      }
    }
  }
  if (ctx->race) race_fence(b, write);
  if (entered) dev_sync_leave(ctx);
  prune(x);
  return dev_check_async(ctx);
}

int dev_buf_fence(dev_buf *b, int write) {
  return buf_wait(b, write, "a host-access fence (queued work still uses the buffer)");
}

int dev_buf_wait(dev_buf *b, const char *what) {
  return buf_wait(b, 1, what ? what : "waiting for queued work on a buffer");
}

int dev_buf_idle(dev_buf *b) {
  prune(BX(b));
  return BX(b)->nuse == 0 && BX(b)->nfence == 0;
}

/* ---- the ends of streams ----------------------------------------------- */

/* Off ctx->lingering, if on it (released, or freed). */
static void linger_remove(dev_stream *s) {
  if (!s->lingering) return;
  dev_ctx *ctx = s->ctx;
  if (s->lg_prev) s->lg_prev->lg_next = s->lg_next; else ctx->lingering = s->lg_next;
  if (s->lg_next) s->lg_next->lg_prev = s->lg_prev;
  s->lingering = 0;
}

void dev_stream_destroy(dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  if (s->race) race_stream_gone(s);
  if (s->prev) s->prev->next = s->next; else ctx->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  linger_remove(s);
  if (s->released) {
    if (s->rel_prev) s->rel_prev->rel_next = s->rel_next; else ctx->released = s->rel_next;
    if (s->rel_next) s->rel_next->rel_prev = s->rel_prev;
  }
  ctx->bk->stream_fini(s);
  free(s);
}

/* The last reference of a closed stream: free it once its queue drains. */
void dev_stream_unref(dev_stream *s) {
  if (--s->refs > 0 || s->is_default) return;
  dev_ctx *ctx = s->ctx;
  linger_remove(s);
  s->released = 1;
  s->rel_prev = NULL;
  s->rel_next = ctx->released;
  if (ctx->released) ctx->released->rel_prev = s;
  ctx->released = s;
  ctx->st.streams--;
  if (ctx->closing) {
    ctx->bk->pos_wait(s, ctx->bk->stream_pos(s));
    dev_stream_destroy(s);
  }
  /* else: freed by a later sweep once its queue is drained */
  dev_ctx_release(ctx);
}

void dev_stream_release(dev_stream *s) {
  if (!s || s->is_default) return;
  s->closed = 1;
  dev_ctx *ctx = s->ctx;
  stream_forget(ctx, s);
  if (s->refs > 1 && !s->lingering && !ctx->closing) {
    /* still named by work in flight: sweeps let go of it as that ends */
    s->lg_prev = NULL;
    s->lg_next = ctx->lingering;
    if (ctx->lingering) ctx->lingering->lg_prev = s;
    ctx->lingering = s;
    s->lingering = 1;
  }
  dev_stream_unref(s);
}

/* ---- memory figures and the cache ------------------------------------- */

void dev_get_meminfo(dev_ctx *ctx, dev_meminfo *out) {
  memset(out, 0, sizeof *out);
  out->allocated = ctx->mlive[DEV_MEM_DEVICE];
  out->peak = ctx->mpeak[DEV_MEM_DEVICE];
  out->reserved = ctx->mreserved[DEV_MEM_DEVICE];
  out->pinned = ctx->mlive[DEV_MEM_PINNED];
  out->pinned_peak = ctx->mpeak[DEV_MEM_PINNED];
  out->pinned_reserved = ctx->mreserved[DEV_MEM_PINNED];
  out->host = ctx->mlive[DEV_MEM_HOST];
  out->host_peak = ctx->mpeak[DEV_MEM_HOST];
  out->host_reserved = ctx->mreserved[DEV_MEM_HOST];
}

size_t dev_mem_live(dev_ctx *ctx, dev_memkind kind) {
  return (unsigned)kind < DEV_NMEMKIND ? ctx->mlive[kind] : 0;
}

size_t dev_mem_total(dev_ctx *ctx, dev_memkind kind) {
  return (unsigned)kind < DEV_NMEMKIND ? ctx->bk->mem_total(ctx, kind) : 0;
}

void dev_reset_peak(dev_ctx *ctx) {
  for (int k = 0; k < DEV_NMEMKIND; k++) ctx->mpeak[k] = ctx->mlive[k];
}

void dev_empty_cache(dev_ctx *ctx) {
  dev_sweep(ctx);
  cache_trim(ctx, -1);
  if (ctx->bk->trim) ctx->bk->trim(ctx);
}

int dev_mem_reclaim(dev_ctx *ctx, dev_memkind kind) {
  if ((unsigned)kind >= DEV_NMEMKIND) return DEV_OK;
  dev_sweep_all(ctx);
  int waited = 0, rc = DEV_OK;
  for (int c = 0; c < NCLASS; c++) {
    for (bufx *x = ctx->cache->pending[kind][c]; x; x = x->next) {
      for (int i = 0; i < x->nuse && rc == DEV_OK; i++) {
        if (ctx->bk->pos_done(x->use[i].s, use_last(&x->use[i]))) continue;
        waited = 1;
        rc = dev_sync_wait(ctx, x->use[i].s, use_last(&x->use[i]));
      }
    }
  }
  /* not refused under gpu.nosync (running out of memory is worse), but counted */
  if (waited) ctx->st.syncs++;
  cache_trim(ctx, kind);
  if (ctx->bk->trim) ctx->bk->trim(ctx);
  return rc ? rc : dev_check_async(ctx);
}
