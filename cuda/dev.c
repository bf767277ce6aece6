/* The device layer shared by every backend: context, counters, validation of
 * ops, and buffer lifetime (a buffer is freed only once the streams that used
 * it are past their last use). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devpriv.h"

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
  int internal;                     /* the device layer's own: not in the stats */
  struct bufx *prev, *next;         /* ctx->bufs, ctx->dead or a cache list */
  void (*release)(void *ud, void *ptr);
  void *ud;
  struct race_buf *race;            /* race checker state (race.c) */
  struct bufx *defer_next;          /* ctx->deferred, under defer_mu */
  int async_pending;                /* releases waiting there, under defer_mu */
} bufx;

#define BX(b) ((bufx *)(b))

/* The cache of blocks (see "buffers" below): per memory kind and size class,
 * blocks no queued work uses, and blocks still used by queued work. */
#define MIN_BLOCK 256
#define NCLASS (8 * 56 + 9)
struct dev_memcache {
  bufx *ready[DEV_NMEMKIND][NCLASS];
  bufx *pending[DEV_NMEMKIND][NCLASS];   /* oldest first */
  bufx *ptail[DEV_NMEMKIND][NCLASS];
};

struct race_buf **dev_buf_racep(dev_buf *b) { return &BX(b)->race; }

int dev_fail(dev_ctx *ctx, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
  va_end(ap);
  return code;
}

void dev_async_fail(dev_ctx *ctx, const char *fmt, ...) {
  pthread_mutex_lock(&ctx->async_mu);
  if (!atomic_load(&ctx->async_flag)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->async_err, sizeof ctx->async_err, fmt, ap);
    va_end(ap);
    atomic_store(&ctx->async_flag, 1);
  }
  pthread_mutex_unlock(&ctx->async_mu);
}

void dev_note_running(dev_ctx *ctx, int delta) {
  int now = atomic_fetch_add(&ctx->running, delta) + delta;
  long long m = atomic_load(&ctx->max_running);
  while (now > m && !atomic_compare_exchange_weak(&ctx->max_running, &m, now)) {}
}

int dev_check_async(dev_ctx *ctx) {
  if (!atomic_load(&ctx->async_flag)) return DEV_OK;
  pthread_mutex_lock(&ctx->async_mu);
  snprintf(ctx->err, sizeof ctx->err, "%s", ctx->async_err);
  atomic_store(&ctx->async_flag, 0);
  pthread_mutex_unlock(&ctx->async_mu);
  return DEV_ERR_ASYNC;
}

/* ---- context ---------------------------------------------------------- */

static int parse_spec(const char *spec, int *cuda, int *index) {
  *cuda = 0;
  *index = 0;
  if (!spec || !*spec) return -1;
  if (strcmp(spec, "host") == 0) return 0;
  if (strncmp(spec, "cuda", 4) == 0) {
    *cuda = 1;
    if (spec[4] == 0) return 0;
    if (spec[4] != ':' || spec[5] == 0) return -1;
    /* digits only: strtol would also take "-0", "+0" and " 0" */
    long v = 0;
    for (const char *p = spec + 5; *p; p++) {
      if (*p < '0' || *p > '9') return -1;
      v = v * 10 + (*p - '0');
      if (v > 1024) return -1;
    }
    *index = (int)v;
    return 0;
  }
  return -1;
}

static int stream_new(dev_ctx *ctx, int priority, int nonblocking, int is_default,
                      void *wrap, dev_stream **out) {
  dev_stream *s = calloc(1, sizeof *s);
  if (!s) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory creating a stream");
  s->ctx = ctx;
  s->refs = 1;
  s->priority = priority;
  s->nonblocking = nonblocking;
  s->is_default = is_default;
  s->wrap = wrap;
  s->id = ctx->next_stream_id++;
  int rc = ctx->bk->stream_init(s);
  if (rc) { free(s); return rc; }
  s->next = ctx->streams;
  if (ctx->streams) ctx->streams->prev = s;
  ctx->streams = s;
  *out = s;
  return DEV_OK;
}

/* GPULUA_CHECK: a list of checks to turn on (only "races" so far). */
static int check_env(dev_ctx *ctx) {
  const char *v = getenv("GPULUA_CHECK");
  for (const char *p = v; p && *p;) {
    size_t n = strcspn(p, ", ");
    if (n == 5 && strncmp(p, "races", 5) == 0) {
      int rc = race_set(ctx, 1);
      if (rc) return rc;
    } else if (n > 0 && !(n == 4 && strncmp(p, "none", 4) == 0)) {
      return dev_fail(ctx, DEV_ERR_INVALID, "GPULUA_CHECK: unknown check '%.*s' (expected races or none)",
                      (int)(n > 64 ? 64 : n), p);
    }
    p += n;
    p += strspn(p, ", ");
  }
  return DEV_OK;
}

dev_ctx *dev_open(const char *spec, char *err, size_t errlen) {
  const char *env = getenv("GPULUA_DEVICE");
  if (!spec || !*spec) spec = (env && *env) ? env : NULL;
  int cuda = 0, index = 0;
  if (spec && parse_spec(spec, &cuda, &index)) {
    snprintf(err, errlen, "unknown device '%s' (expected host, cuda or cuda:N)", spec);
    return NULL;
  }
  const dev_backend *bk = &dev_host_backend;
#ifdef GPULUA_HAVE_CUDA
  /* Automatic: cuda when a GPU answers, else host. */
  /* the first CUDA call: it also sets up module loading */
  int have = (cuda || !spec) ? dev_cuda_available() : 0;
  if (cuda || (!spec && have)) bk = &dev_cuda_backend;
  /* One GPU per rank: under a launcher, "cuda" (or automatic) means
   * cuda:LOCAL_RANK; an explicit cuda:N wins. */
  if (bk == &dev_cuda_backend && !(spec && strchr(spec, ':'))) {
    const char *lr = getenv("LOCAL_RANK");
    if (!lr || !*lr) lr = getenv("SLURM_LOCALID");
    char *end;
    long v = lr && *lr ? strtol(lr, &end, 10) : -1;
    if (lr && *lr && *end == '\0' && v >= 0 && v < 4096) index = (int)v;
  }
#else
  if (cuda) {
    snprintf(err, errlen, "device '%s': this gpulua was built without the CUDA backend", spec);
    return NULL;
  }
#endif
  dev_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) { snprintf(err, errlen, "out of memory"); return NULL; }
  ctx->bk = bk;
  ctx->refs = 1;
  ctx->device = index;
  const char *j = getenv("GPULUA_HOST_JITTER");
  ctx->jitter = j && *j && strcmp(j, "0") != 0;
  pthread_mutex_init(&ctx->async_mu, NULL);
  pthread_mutex_init(&ctx->progress_mu, NULL);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&ctx->defer_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ctx->progress_cv, &ca);
  pthread_condattr_destroy(&ca);
  ctx->cache = calloc(1, sizeof *ctx->cache);
  int rc = ctx->cache ? check_env(ctx) : DEV_ERR_NOMEM;
  if (!ctx->cache) snprintf(ctx->err, sizeof ctx->err, "out of memory");
  if (rc == DEV_OK) rc = ctx->bk->open(ctx, index);
  if (rc == DEV_OK) rc = stream_new(ctx, DEV_PRIO_NORMAL, 0, 1, NULL, &ctx->dflt);
  if (rc != DEV_OK) {
    snprintf(err, errlen, "%s", ctx->err);
    race_set(ctx, 0);
    if (ctx->bk_state) ctx->bk->close(ctx);
    pthread_mutex_destroy(&ctx->async_mu);
    pthread_mutex_destroy(&ctx->progress_mu);
    pthread_mutex_destroy(&ctx->defer_mu);
    pthread_cond_destroy(&ctx->progress_cv);
    free(ctx->cache);
    free(ctx);
    return NULL;
  }
  return ctx;
}

static void linger_remove(dev_stream *s);

static void stream_destroy(dev_stream *s) {
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

static void cache_free_all(dev_ctx *ctx);

static void ctx_destroy(dev_ctx *ctx) {
  race_set(ctx, 0);
  cache_free_all(ctx);
  free(ctx->cache);
  ctx->cache = NULL;
  while (ctx->streams) {
    dev_stream *s = ctx->streams;
    ctx->bk->pos_wait(s, ctx->bk->stream_pos(s));
    stream_destroy(s);
  }
  dev_trace_free(ctx);
  ctx->bk->close(ctx);
  pthread_mutex_destroy(&ctx->async_mu);
  pthread_mutex_destroy(&ctx->progress_mu);
  pthread_mutex_destroy(&ctx->defer_mu);
  pthread_cond_destroy(&ctx->progress_cv);
  free(ctx);
}

void dev_ctx_retain(dev_ctx *ctx) { ctx->refs++; }

void dev_ctx_release(dev_ctx *ctx) {
  if (ctx->owner_gone) {
    /* after dev_close: DLPack deleters on any thread share refs */
    pthread_mutex_lock(&ctx->defer_mu);
    int last = --ctx->refs == 0;
    pthread_mutex_unlock(&ctx->defer_mu);
    if (last) ctx_destroy(ctx);
    return;
  }
  if (--ctx->refs == 0) ctx_destroy(ctx);
}

static void sweep(dev_ctx *ctx);
static void sweep_all(dev_ctx *ctx);
static void stream_unref(dev_stream *s);
static void buf_release(dev_buf *b);

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

void dev_close(dev_ctx *ctx) {
  if (!ctx || ctx->closing) return;
  dev_interrupt_enable(ctx, 0);
  ctx->sync_policy = DEV_SYNC_ALLOW;   /* closing always waits, quietly */
  ctx->sync_warn = NULL;
  dev_synchronize(ctx);
  ctx->closing = 1;
  /* after the queued collectives: the peers see this rank leave */
  if (ctx->comm && ctx->bk->comm_close) ctx->bk->comm_close(ctx);
  sweep_all(ctx);
  cache_free_all(ctx);
  /* From here on no owner thread drains deferred releases: DLPack exports
   * still alive keep their buffers (and the context) until their deleters,
   * which then release under defer_mu on whatever thread calls them. */
  pthread_mutex_lock(&ctx->defer_mu);
  ctx->owner_gone = 1;
  bufx *left = ctx->deferred;
  ctx->deferred = NULL;
  atomic_store(&ctx->defer_flag, 0);
  pthread_mutex_unlock(&ctx->defer_mu);
  while (left) {
    bufx *x = left;
    left = x->defer_next;
    int n = x->async_pending;
    x->async_pending = 0;
    while (n-- > 0) dev_buf_release(&x->b);
  }
  dev_ctx_release(ctx);
}

const char *dev_backend_name(dev_ctx *ctx) { return ctx->bk->name; }
const char *dev_errmsg(dev_ctx *ctx) { return ctx->err; }
int dev_device_count(dev_ctx *ctx) { return ctx->bk->device_count(ctx); }
int dev_current_device(dev_ctx *ctx) { return ctx->device; }

int dev_device_info(dev_ctx *ctx, int index, dev_info *out) {
  int n = ctx->bk->device_count(ctx);
  if (index < 0 || index >= n)
    return dev_fail(ctx, DEV_ERR_INVALID, "device index %d out of range (%d device%s)",
                    index, n, n == 1 ? "" : "s");
  return ctx->bk->device_info(ctx, index, out);
}

int dev_set_device(dev_ctx *ctx, int index) {
  int n = ctx->bk->device_count(ctx);
  if (index < 0 || index >= n)
    return dev_fail(ctx, DEV_ERR_INVALID, "device index %d out of range (%d device%s)",
                    index, n, n == 1 ? "" : "s");
  /* One interpreter drives one GPU (one process per GPU, as ranks do). */
  if (index != ctx->device)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED,
                    "this interpreter drives device %d; start gpulua with --device cuda:%d",
                    ctx->device, index);
  ctx->device = index;
  return DEV_OK;
}

/* Called for every op: a plain bounded copy, no printf. */
void dev_set_site(dev_ctx *ctx, const char *site) {
  size_t n = site ? strnlen(site, sizeof ctx->site - 1) : 0;
  memcpy(ctx->site, site ? site : "", n);
  ctx->site[n] = 0;
}

void dev_count_sync(dev_ctx *ctx) { ctx->st.syncs++; }

/* ---- interrupts --------------------------------------------------------- */

void dev_interrupt_enable(dev_ctx *ctx, int on) {
  atomic_store(&ctx->intr_on, on != 0);
  if (!on) atomic_store(&ctx->intr, 0);
}

/* Async-signal-safe: lock-free atomics only. */
void dev_interrupt(dev_ctx *ctx) {
  if (ctx && atomic_load(&ctx->intr_on)) atomic_store(&ctx->intr, 1);
}

int dev_interrupt_take(dev_ctx *ctx) { return atomic_exchange(&ctx->intr, 0) != 0; }

/* A backend wait that gave up: the interrupt is taken, the message set. */
static int intr_check(dev_ctx *ctx, int rc) {
  if (rc != DEV_ERR_INTERRUPTED) return rc;
  atomic_store(&ctx->intr, 0);
  return dev_fail(ctx, DEV_ERR_INTERRUPTED, "interrupted");
}

/* The wait of a counted sync: interruptible while enabled. */
static int sync_wait(dev_ctx *ctx, dev_stream *s, uint64_t pos) {
  if (ctx->bk->pos_wait_intr && atomic_load(&ctx->intr_on))
    return intr_check(ctx, ctx->bk->pos_wait_intr(s, pos));
  return ctx->bk->pos_wait(s, pos);
}

void dev_set_sync_policy(dev_ctx *ctx, dev_sync_policy p) { ctx->sync_policy = p; }
dev_sync_policy dev_get_sync_policy(dev_ctx *ctx) { return ctx->sync_policy; }
void dev_set_call(dev_ctx *ctx, const char *call) { ctx->call = call; }

void dev_set_sync_warn(dev_ctx *ctx, void (*warn)(void *ud, const char *msg), void *ud) {
  ctx->sync_warn = warn;
  ctx->sync_warn_ud = ud;
}

int dev_sync_enter(dev_ctx *ctx, const char *what) {
  if (ctx->sync_policy == DEV_SYNC_ALLOW) {
    ctx->st.syncs++;
    if (ctx->trace_gen) dev_trace_sync_open(ctx, what);
    return DEV_OK;
  }
  char msg[sizeof ctx->site + 192];
  snprintf(msg, sizeof msg, "%s%s%s%s%s waits for the device (a host-device sync)", ctx->site,
           *ctx->site ? ": " : "", ctx->call ? ctx->call : "", ctx->call ? ": " : "", what);
  if (ctx->sync_policy == DEV_SYNC_REFUSE) {
    /* the bindings add the script line and the call themselves */
    return dev_fail(ctx, DEV_ERR_SYNC, "%s waits for the device: a host-device sync, not "
                    "allowed here (gpu.nosync() or sync debugging set to \"error\")", what);
  }
  ctx->st.syncs++;   /* refused ones did not happen */
  if (ctx->trace_gen) dev_trace_sync_open(ctx, what);
  if (ctx->sync_warn) ctx->sync_warn(ctx->sync_warn_ud, msg);
  return DEV_OK;
}

void dev_get_stats(dev_ctx *ctx, dev_stats *out) {
  *out = ctx->st;
  out->max_concurrent = atomic_load(&ctx->max_running);
}

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

/* Work queued on s from now on runs after everything queued on o so far:
 * the same stream, or CUDA's legacy default stream and a blocking stream. */
static int ordered_after(const dev_stream *s, const dev_stream *o) {
  return s == o || (s->is_default && !o->nonblocking) || (o->is_default && !s->nonblocking);
}

static uint64_t use_last(const buf_use *u) { return u->rpos > u->wpos ? u->rpos : u->wpos; }

/* Drop the uses (or fences) that the streams are already past. */
static void prune_uses(dev_ctx *ctx, buf_use *use, int *n) {
  int j = 0;
  for (int i = 0; i < *n; i++) {
    if (ctx->bk->pos_done(use[i].s, use_last(&use[i]))) stream_unref(use[i].s);
    else use[j++] = use[i];
  }
  *n = j;
}

/* Live buffers with fences, so that a closed stream they name can be let
 * go of without a sync (stream_forget). */
static void fenced_remove(dev_ctx *ctx, bufx *x) {
  if (!x->in_fenced) return;
  if (x->fprev) x->fprev->fnext = x->fnext; else ctx->fenced = x->fnext;
  if (x->fnext) x->fnext->fprev = x->fprev;
  x->fprev = x->fnext = NULL;
  x->in_fenced = 0;
}

static void fenced_add(dev_ctx *ctx, bufx *x) {
  if (x->in_fenced) return;
  x->fprev = NULL;
  x->fnext = ctx->fenced;
  if (ctx->fenced) ctx->fenced->fprev = x;
  ctx->fenced = x;
  x->in_fenced = 1;
}

static void prune(bufx *x) {
  if (x->nuse) prune_uses(x->b.ctx, x->use, &x->nuse);
  if (x->nfence) {
    prune_uses(x->b.ctx, x->fence, &x->nfence);
    if (x->nfence == 0) fenced_remove(x->b.ctx, x);
  }
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
  if (*tail) (*tail)->next = x; else mc->pending[x->b.kind][x->cls] = x;
  *tail = x;
}

static void pend_unlink(dev_ctx *ctx, bufx *x) {
  struct dev_memcache *mc = ctx->cache;
  if (x->next == NULL) mc->ptail[x->b.kind][x->cls] = x->prev;
  list_unlink(&mc->pending[x->b.kind][x->cls], x);
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
static void cache_settle(dev_ctx *ctx, int kind) {
  for (int k = 0; k < DEV_NMEMKIND; k++) {
    if (kind >= 0 && k != kind) continue;
    for (int c = 0; c < NCLASS; c++)
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
  cache_settle(ctx, kind);
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
    for (int c = 0; c < NCLASS; c++)
      for (bufx *x = ctx->cache->pending[k][c], *nx; x; x = nx) {
        nx = x->next;
        int j = 0;
        for (int i = 0; i < x->nuse; i++) {
          buf_use *u = &x->use[i];
          if (u->s == s && ctx->bk->pos_done(s, use_last(u))) stream_unref(s);
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
      if (f->s == s && ctx->bk->pos_done(s, f->wpos)) stream_unref(s);
      else x->fence[j++] = *f;
    }
    x->nfence = j;
    if (j == 0) fenced_remove(ctx, x);
  }
}

/* Every block back to the backend, waiting for the uses still queued
 * (dev_close; the context's end). */
static void cache_free_all(dev_ctx *ctx) {
  if (!ctx->cache) return;
  for (int k = 0; k < DEV_NMEMKIND; k++)
    for (int c = 0; c < NCLASS; c++) {
      while (ctx->cache->pending[k][c]) {
        bufx *x = ctx->cache->pending[k][c];
        pend_unlink(ctx, x);
        for (int i = 0; i < x->nuse; i++) {
          ctx->bk->pos_wait(x->use[i].s, use_last(&x->use[i]));
          stream_unref(x->use[i].s);
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
 * none in particular), from the cache; NULL when none fits. */
static bufx *cache_take(dev_ctx *ctx, dev_memkind kind, int cls, dev_stream *s) {
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
  if (s && kind == DEV_MEM_DEVICE) {
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
      stream_unref(f->s);
      continue;
    }
    if (x->nuse == x->cap) {
      int cap = x->cap ? 2 * x->cap : 4;
      buf_use *nu = realloc(x->use, (size_t)cap * sizeof *nu);
      /* out of memory: wait instead, so the block stays safe */
      if (!nu) { ctx->bk->pos_wait(f->s, use_last(f)); stream_unref(f->s); continue; }
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
      stream_unref(x->use[i].s);
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
  for (int i = 0; i < x->nuse; i++) stream_unref(x->use[i].s);
  for (int i = 0; i < x->nfence; i++) stream_unref(x->fence[i].s);
  if (x->race) race_buf_gone(x->race);
  if (x->release) x->release(x->ud, x->b.ptr);
  free(x->use);
  free(x->fence);
  free(x);
  dev_ctx_release(ctx);
}

/* Work that per allocation must not grow with what is alive: deferred
 * releases, dead wrapped buffers whose uses are over, released streams that
 * are idle (those only every 64th call: their test may ask the device). */
static void sweep(dev_ctx *ctx) {
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
      stream_unref(s);
    }
    for (dev_stream *s = ctx->released, *ns; s; s = ns) {
      ns = s->rel_next;
      if (s->refs > 0) continue;
      if (ctx->bk->stream_idle(s)) stream_destroy(s);
    }
  }
  /* a freed import of one of our exports releases the export's buffer */
  drain_deferred(ctx);
  dev_ctx_release(ctx);
}

/* The released streams, every one checked now (a sync, dev_close). */
static void sweep_all(dev_ctx *ctx) {
  ctx->sweeps = 0;
  sweep(ctx);
}

static int nomem(dev_ctx *ctx, dev_memkind kind, size_t bytes) {
  size_t total = ctx->bk->mem_total(ctx, kind);
  return dev_fail(ctx, DEV_ERR_NOMEM,
                  "out of memory: cannot allocate %.1f MiB of %s memory (%.1f MiB in use by live "
                  "tensors, %.1f MiB cached, %.1f MiB total)",
                  bytes / 1048576.0, dev_memkind_name(kind), ctx->mlive[kind] / 1048576.0,
                  (ctx->mreserved[kind] - ctx->mlive[kind]) / 1048576.0, total / 1048576.0);
}

int dev_buf_alloc_on(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_stream *s, dev_buf **out) {
  *out = NULL;
  if ((unsigned)kind >= DEV_NMEMKIND) return dev_fail(ctx, DEV_ERR_INVALID, "alloc: bad memory kind %d", (int)kind);
  if (bytes == 0) bytes = 1;
  sweep(ctx);
  size_t block;
  int cls = size_class(bytes, &block);
  bufx *x = cache_take(ctx, kind, cls, s);
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

int dev_buf_alloc(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_buf **out) {
  return dev_buf_alloc_on(ctx, kind, bytes, NULL, out);
}

int dev_buf_wrap(dev_ctx *ctx, dev_memkind kind, void *ptr, size_t bytes,
                 void (*release)(void *ud, void *ptr), void *ud, dev_buf **out) {
  *out = NULL;
  if ((unsigned)kind >= DEV_NMEMKIND) return dev_fail(ctx, DEV_ERR_INVALID, "wrap: bad memory kind %d", (int)kind);
  int rc;
  if (ptr && bytes && ctx->bk->check_ptr && (rc = ctx->bk->check_ptr(ctx, kind, ptr, bytes))) return rc;
  sweep(ctx);
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
  if (last) ctx_destroy(ctx);
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

/* Before an op on s touches x: wait for the fences of a reused block that s
 * is not ordered after.  Each stream waits once per fence. */
static int apply_fences(bufx *x, dev_stream *s) {
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

static int fence_op_bufs(dev_stream *s, dev_buf *const *bufs, int n) {
  for (int i = 0; i < n; i++) {
    bufx *x = BX(bufs[i]);
    if (x->nfence) {
      int rc = apply_fences(x, s);
      if (rc) return rc;
    }
  }
  return DEV_OK;
}

static void note_use(bufx *x, dev_stream *s, int write) {
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

static int buf_wait(dev_buf *b, int write, const char *what) {
  bufx *x = BX(b);
  dev_ctx *ctx = b->ctx;
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
        if (rc == DEV_OK) rc = sync_wait(ctx, u->s, pos);
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
  sweep(ctx);
  cache_trim(ctx, -1);
  if (ctx->bk->trim) ctx->bk->trim(ctx);
}

int dev_mem_reclaim(dev_ctx *ctx, dev_memkind kind) {
  if ((unsigned)kind >= DEV_NMEMKIND) return DEV_OK;
  sweep_all(ctx);
  int waited = 0, rc = DEV_OK;
  for (int c = 0; c < NCLASS; c++) {
    for (bufx *x = ctx->cache->pending[kind][c]; x; x = x->next) {
      for (int i = 0; i < x->nuse && rc == DEV_OK; i++) {
        if (ctx->bk->pos_done(x->use[i].s, use_last(&x->use[i]))) continue;
        waited = 1;
        rc = sync_wait(ctx, x->use[i].s, use_last(&x->use[i]));
      }
    }
  }
  /* not refused under gpu.nosync (running out of memory is worse), but counted */
  if (waited) ctx->st.syncs++;
  cache_trim(ctx, kind);
  if (ctx->bk->trim) ctx->bk->trim(ctx);
  return rc ? rc : dev_check_async(ctx);
}

/* ---- streams and events --------------------------------------------- */

dev_stream *dev_default_stream(dev_ctx *ctx) { return ctx->dflt; }

int dev_stream_create(dev_ctx *ctx, int priority, int nonblocking, dev_stream **out) {
  sweep(ctx);
  int rc = stream_new(ctx, priority, nonblocking, 0, NULL, out);
  if (rc) return rc;
  ctx->st.streams++;
  dev_ctx_retain(ctx);
  return DEV_OK;
}

int dev_stream_wrap(dev_ctx *ctx, void *native, dev_stream **out) {
  *out = NULL;
  if (!ctx->bk->stream_native)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED,
                    "the %s backend has no native streams to wrap (only the NULL stream, "
                    "which is gpulua's default stream)", ctx->bk->name);
  if (!native) return dev_fail(ctx, DEV_ERR_INVALID, "wrap a stream: the handle is NULL");
  sweep(ctx);
  int rc = stream_new(ctx, DEV_PRIO_NORMAL, 0, 0, native, out);
  if (rc) return rc;
  ctx->st.streams++;
  dev_ctx_retain(ctx);
  return DEV_OK;
}

void *dev_stream_native(dev_stream *s) {
  return s->ctx->bk->stream_native ? s->ctx->bk->stream_native(s) : NULL;
}

void dev_stream_retain(dev_stream *s) { s->refs++; }

/* The last reference of a closed stream: free it once its queue drains. */
static void linger_remove(dev_stream *s) {
  if (!s->lingering) return;
  dev_ctx *ctx = s->ctx;
  if (s->lg_prev) s->lg_prev->lg_next = s->lg_next; else ctx->lingering = s->lg_next;
  if (s->lg_next) s->lg_next->lg_prev = s->lg_prev;
  s->lingering = 0;
}

static void stream_unref(dev_stream *s) {
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
    stream_destroy(s);
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
  stream_unref(s);
}

static int check_open(dev_stream *s) {
  if (s->closed) return dev_fail(s->ctx, DEV_ERR_INVALID, "stream is closed");
  return DEV_OK;
}

int dev_stream_synchronize(dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  int rc = dev_sync_enter(ctx, "stream synchronize");
  if (rc) return rc;
  rc = sync_wait(ctx, s, ctx->bk->stream_pos(s));
  if (rc) { dev_sync_leave(ctx); return rc; }
  if (ctx->race) race_host_waited(ctx, s, NULL);
  dev_sync_leave(ctx);
  sweep(ctx);
  return dev_check_async(ctx);
}

int dev_stream_query(dev_stream *s) {
  int done = s->ctx->bk->pos_done(s, s->ctx->bk->stream_pos(s));
  if (done > 0 && s->ctx->race) race_host_waited(s->ctx, s, NULL);
  return done;
}

int dev_stream_wait_stream(dev_stream *s, dev_stream *other) {
  int rc = check_open(s);
  if (rc == DEV_OK) rc = check_open(other);
  if (rc || s == other) return rc;
  rc = dev_check_async(s->ctx);
  if (rc) return rc;
  rc = s->ctx->bk->stream_wait(s, other, other->ctx->bk->stream_pos(other));
  if (rc == DEV_OK && s->ctx->race) race_wait(s, other, NULL);
  return rc;
}

int dev_stream_priority(dev_stream *s) { return s->priority; }
int dev_stream_nonblocking(dev_stream *s) { return s->nonblocking; }
int dev_stream_is_default(dev_stream *s) { return s->is_default; }
dev_ctx *dev_stream_ctx(const dev_stream *s) { return s->ctx; }
uint64_t dev_stream_id(dev_stream *s) { return s->id; }

int dev_event_create(dev_ctx *ctx, int timing, dev_event **out) {
  dev_event *e = calloc(1, sizeof *e);
  if (!e) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory creating an event");
  e->ctx = ctx;
  e->timing = timing;
  int rc = ctx->bk->event_init(e);
  if (rc) { free(e); return rc; }
  ctx->st.events++;
  dev_ctx_retain(ctx);
  *out = e;
  return DEV_OK;
}

void dev_event_release(dev_event *e) {
  if (!e) return;
  dev_ctx *ctx = e->ctx;
  ctx->bk->event_fini(e);
  if (e->race) race_event_gone(e);
  if (e->stream) stream_unref(e->stream);
  ctx->st.events--;
  free(e);
  dev_ctx_release(ctx);
}

int dev_event_record(dev_event *e, dev_stream *s) {
  dev_ctx *ctx = e->ctx;
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if (!s) s = ctx->dflt;
  if ((rc = check_open(s))) return rc;
  dev_stream *old = e->stream;
  rc = ctx->bk->event_record(e, s);
  if (rc) return rc;
  s->refs++;
  e->stream = s;
  e->recorded = 1;
  if (old) stream_unref(old);
  if (ctx->race) race_record(e, s);
  return DEV_OK;
}

int dev_event_query(dev_event *e) {
  if (!e->recorded) return 1;
  int done = e->ctx->bk->event_query ? e->ctx->bk->event_query(e) : e->ctx->bk->pos_done(e->stream, e->pos);
  if (done > 0 && e->ctx->race) race_host_waited(e->ctx, NULL, e);
  return done;
}

int dev_event_synchronize(dev_event *e) {
  dev_ctx *ctx = e->ctx;
  int rc0 = dev_sync_enter(ctx, "event synchronize");
  if (rc0) return rc0;
  if (e->recorded) {
    int rc = ctx->bk->event_sync ? intr_check(ctx, ctx->bk->event_sync(e)) : sync_wait(ctx, e->stream, e->pos);
    if (rc) { dev_sync_leave(ctx); return rc; }
    if (ctx->race) race_host_waited(ctx, NULL, e);
  }
  dev_sync_leave(ctx);
  sweep(ctx);
  return dev_check_async(ctx);
}

int dev_event_recorded(dev_event *e) { return e->recorded; }
int dev_event_timing(dev_event *e) { return e->timing; }

int dev_stream_wait_event(dev_stream *s, dev_event *e) {
  int rc = check_open(s);
  if (rc || !e->recorded || e->stream == s) return rc;
  rc = dev_check_async(s->ctx);
  if (rc) return rc;
  /* The event marks its position exactly; a backend marker may lie past it
   * and would make s wait for later work too. */
  if (s->ctx->bk->event_wait && !s->ctx->bk->pos_done(e->stream, e->pos))
    rc = s->ctx->bk->event_wait(s, e);
  else
    rc = s->ctx->bk->stream_wait(s, e->stream, e->pos);
  if (rc == DEV_OK && s->ctx->race) race_wait(s, NULL, e);
  return rc;
}

int dev_event_elapsed(dev_event *a, dev_event *b, double *ms) {
  dev_ctx *ctx = a->ctx;
  dev_event *ev[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    const char *which = i ? "end" : "start";
    if (!ev[i]->timing)
      return dev_fail(ctx, DEV_ERR_INVALID,
                      "%s event was created without timing (use gpu.event{timing = true})", which);
    if (!ev[i]->recorded)
      return dev_fail(ctx, DEV_ERR_INVALID, "%s event was never recorded", which);
    if (!dev_event_query(ev[i]))
      return dev_fail(ctx, DEV_ERR_INVALID,
                      "%s event has not completed yet (synchronize it first)", which);
  }
  return ctx->bk->event_elapsed(a, b, ms);
}

int dev_synchronize(dev_ctx *ctx) {
  int rc0 = dev_sync_enter(ctx, "device synchronize");
  if (rc0) return rc0;
  for (dev_stream *s = ctx->streams; s; s = s->next) {
    int rc = sync_wait(ctx, s, ctx->bk->stream_pos(s));
    if (rc) { dev_sync_leave(ctx); return rc; }
  }
  if (ctx->race) race_host_waited(ctx, NULL, NULL);
  dev_sync_leave(ctx);
  for (bufx *x = ctx->bufs; x; x = x->next) prune(x);
  cache_settle(ctx, -1);
  sweep_all(ctx);
  return dev_check_async(ctx);
}

/* ---- completions ------------------------------------------------------ */

struct dev_watch {
  dev_ctx *ctx;
  dev_stream *s;          /* referenced; NULL: done from the start */
  uint64_t pos;
  void *impl;             /* the backend's signal, if it has watches */
  int done;
};

static int watch_new(dev_ctx *ctx, dev_stream *s, uint64_t pos, dev_event *e, dev_watch **out) {
  dev_watch *w = calloc(1, sizeof *w);
  if (!w) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (watch)");
  w->ctx = ctx;
  dev_ctx_retain(ctx);
  if (s && !ctx->bk->pos_done(s, pos)) {
    if (ctx->bk->watch) {
      int rc = ctx->bk->watch(ctx, s, pos, e, &w->impl);
      if (rc) { dev_ctx_release(ctx); free(w); return rc; }
    }
    s->refs++;
    w->s = s;
    w->pos = pos;
  } else {
    w->done = 1;
    if (s && ctx->race) race_host_reached(ctx, s, pos);
  }
  *out = w;
  return DEV_OK;
}

int dev_watch_stream(dev_stream *s, dev_watch **out) {
  return watch_new(s->ctx, s, s->ctx->bk->stream_pos(s), NULL, out);
}

int dev_watch_event(dev_event *e, dev_watch **out) {
  return watch_new(e->ctx, e->recorded ? e->stream : NULL, e->pos, e, out);
}

int dev_watch_done(dev_watch *w) {
  if (w->done) return 1;
  dev_ctx *ctx = w->ctx;
  w->done = w->impl ? ctx->bk->watch_done(ctx, w->impl) : ctx->bk->pos_done(w->s, w->pos);
  if (w->done && ctx->race) race_host_reached(ctx, w->s, w->pos);
  return w->done;
}

void dev_watch_release(dev_watch *w) {
  if (!w) return;
  dev_ctx *ctx = w->ctx;
  if (w->impl) ctx->bk->watch_free(ctx, w->impl);
  if (w->s) stream_unref(w->s);
  free(w);
  dev_ctx_release(ctx);
}

void dev_progress_signal(dev_ctx *ctx) {
  if (atomic_load(&ctx->progress_sleepers) == 0) return;
  pthread_mutex_lock(&ctx->progress_mu);
  ctx->progress_gen++;
  pthread_cond_broadcast(&ctx->progress_cv);
  pthread_mutex_unlock(&ctx->progress_mu);
}

/* The sleeper count goes up before the caller tests its watches, and a
 * signaller reads it after the work is marked done (both sequentially
 * consistent): one of them sees the other, so no wakeup is lost. */
uint64_t dev_progress_begin(dev_ctx *ctx) {
  atomic_fetch_add(&ctx->progress_sleepers, 1);
  pthread_mutex_lock(&ctx->progress_mu);
  uint64_t gen = ctx->progress_gen;
  pthread_mutex_unlock(&ctx->progress_mu);
  return gen;
}

void dev_progress_end(dev_ctx *ctx) { atomic_fetch_sub(&ctx->progress_sleepers, 1); }

int dev_progress_wait(dev_ctx *ctx, uint64_t gen, double timeout_s) {
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_s < 0) timeout_s = 0;
  if (timeout_s > 3600) timeout_s = 3600;
  long long ns = (long long)(timeout_s * 1e9) + dl.tv_nsec;
  dl.tv_sec += (time_t)(ns / 1000000000);
  dl.tv_nsec = (long)(ns % 1000000000);
  pthread_mutex_lock(&ctx->progress_mu);
  int rc = 0, intr = 0;
  /* in slices of 50 ms while an interrupt may come (nothing signals it) */
  while (ctx->progress_gen == gen && rc == 0 && !(intr = dev_intr_pending(ctx))) {
    struct timespec until = dl;
    if (atomic_load(&ctx->intr_on)) {
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_nsec += 50000000;
      if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
      if (until.tv_sec > dl.tv_sec || (until.tv_sec == dl.tv_sec && until.tv_nsec > dl.tv_nsec)) until = dl;
    }
    rc = pthread_cond_timedwait(&ctx->progress_cv, &ctx->progress_mu, &until);
    if (rc == ETIMEDOUT && (until.tv_sec != dl.tv_sec || until.tv_nsec != dl.tv_nsec)) rc = 0;
  }
  int moved = ctx->progress_gen != gen;
  pthread_mutex_unlock(&ctx->progress_mu);
  dev_progress_end(ctx);
  if (!moved && intr) {
    intr_check(ctx, DEV_ERR_INTERRUPTED);
    return -1;
  }
  return moved;
}

/* ---- ops -------------------------------------------------------------- */

static int host_visible(const dev_buf *b) { return b->kind != DEV_MEM_DEVICE; }

static int check_view(dev_ctx *ctx, const dev_view *v, const char *what) {
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
  int rc;
  if (op->kind == DEV_OP_LAUNCH) return validate_launch(ctx, op->launch);
  if (op->kind == DEV_OP_SLEEP) {
    if (!(op->ms >= 0 && op->ms <= 1e7))
      return dev_fail(ctx, DEV_ERR_INVALID, "sleep: bad duration");
    return DEV_OK;
  }
  if ((rc = check_view(ctx, &op->out, "output"))) return rc;
  for (int i = 0; i < op->nin; i++)
    if ((rc = check_view(ctx, &op->in[i], "input"))) return rc;
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
  case DEV_OP_UNARY:
    if (op->nin != 1 || (unsigned)op->code >= DEV_NUNOP)
      return dev_fail(ctx, DEV_ERR_INVALID, "unary: bad op");
    if (dev_view_numel(&op->in[0]) != dev_view_numel(&op->out))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: numel mismatch", dev_unop_name(op->code));
    if (op->code == DEV_UN_COPY) return DEV_OK;
    if (op->in[0].dtype != t || !same_shape(&op->in[0], &op->out))
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype or shape mismatch", dev_unop_name(op->code));
    if (t == DEV_BOOL || (!isf && op->code >= DEV_UN_EXP && op->code != DEV_UN_RELU))
      return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for %s",
                      dev_unop_name(op->code), dev_dtype_name(t));
    return DEV_OK;
  case DEV_OP_BINARY: {
    int nt = (op->flags & DEV_F_SCALAR) ? 1 : 2;
    if (op->nin != nt || (unsigned)op->code >= DEV_NBINOP)
      return dev_fail(ctx, DEV_ERR_INVALID, "binary: bad operands");
    for (int i = 0; i < nt; i++)
      if (op->in[i].dtype != t || !same_shape(&op->in[i], &op->out))
        return dev_fail(ctx, DEV_ERR_INVALID, "%s: dtype or shape mismatch",
                        dev_binop_name(op->code));
    if (t == DEV_BOOL && op->code != DEV_BIN_MAX && op->code != DEV_BIN_MIN)
      return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s is not supported for bool",
                      dev_binop_name(op->code));
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
    const dev_view *a = &op->in[0], *b = &op->in[1], *c = &op->out;
    if (op->nin != 2 || a->ndim != 2 || b->ndim != 2 || c->ndim != 2 ||
        a->shape[1] != b->shape[0] || c->shape[0] != a->shape[0] || c->shape[1] != b->shape[1])
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
  int nb = op->kind == DEV_OP_SLEEP ? 0 : 1 + op->nin;
  if (op->kind == DEV_OP_BINARY && (op->flags & DEV_F_SCALAR)) nb = 2;
  const dev_view *views[3] = {&op->out, &op->in[0], &op->in[1]};
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
  dev_buf *bufs[3] = {NULL, NULL, NULL};
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
    if ((rc = sync_wait(ctx, s, ctx->bk->stream_pos(s)))) { dev_sync_leave(ctx); return rc; }
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
      rc = sync_wait(ctx, x->use[i].s, x->use[i].wpos);
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

/* ---- ranks and collectives ------------------------------------------- */

const char *dev_coll_name(dev_coll_kind k) {
  static const char *const names[DEV_NCOLL] = {"all_reduce", "broadcast", "reduce", "all_gather",
                                               "reduce_scatter", "send", "recv"};
  return (unsigned)k < DEV_NCOLL ? names[k] : "?";
}

void dev_coll_describe(char *out, size_t len, dev_coll_kind kind, int n, uint64_t seq) {
  if (n > 1) snprintf(out, len, "a group of %d sends/receives (#%llu)", n, (unsigned long long)seq);
  else snprintf(out, len, "%s #%llu", dev_coll_name(kind), (unsigned long long)seq);
}

const char *dev_cred_name(dev_cred r) {
  static const char *const names[DEV_NCRED] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)r < DEV_NCRED ? names[r] : "?";
}

int dev_comm_init(dev_ctx *ctx, const dev_rank_info *want) {
  dev_rank_info r = *want;
  const dev_rank_info *ri = &r;
  if (r.check < 0) r.check = ctx->bk == &dev_host_backend;
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

static int coll_count_fail(dev_ctx *ctx, const dev_coll *c, const char *what, int64_t want, int64_t got) {
  return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s has %lld elements, expected %lld", dev_coll_name(c->kind),
                  what, (long long)got, (long long)want);
}

static int coll_view(dev_ctx *ctx, const dev_coll *c, const dev_view *v, const char *what) {
  char w[64];
  snprintf(w, sizeof w, "%s: %s", dev_coll_name(c->kind), what);
  int rc = check_view(ctx, v, w);
  if (rc) return rc;
  if (!dev_view_contiguous(v))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s: the %s tensor must be contiguous (use t:contiguous())",
                    dev_coll_name(c->kind), what);
  return DEV_OK;
}

static int coll_check(dev_ctx *ctx, const dev_coll *g, int n) {
  int rc, world = ctx->ri.world, self_send = 0, self_recv = 0;
  for (int i = 0; i < n; i++) {
    const dev_coll *c = &g[i];
    if ((unsigned)c->kind >= DEV_NCOLL) return dev_fail(ctx, DEV_ERR_INVALID, "collective: bad kind");
    const char *name = dev_coll_name(c->kind);
    int p2p = c->kind == DEV_COLL_SEND || c->kind == DEV_COLL_RECV;
    if (n > 1 && !p2p)
      return dev_fail(ctx, DEV_ERR_INVALID, "%s cannot be grouped: a group holds sends and receives", name);
    int has_send = c->kind != DEV_COLL_RECV, has_recv = c->kind != DEV_COLL_SEND;
    if (has_send && (rc = coll_view(ctx, c, &c->send, "send"))) return rc;
    if (has_recv && (rc = coll_view(ctx, c, &c->recv, "recv"))) return rc;
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
    if (has_send && has_recv && c->send.buf == c->recv.buf) {
      /* overlapping input and output: only NCCL's in-place layouts */
      size_t esz = dev_dtype_size(c->send.dtype), so = c->send.offset, ro = c->recv.offset;
      size_t sb = (size_t)ns * esz, rb = (size_t)nr * esz, at = so;
      int overlap = so < ro + rb && ro < so + sb;
      if (c->kind == DEV_COLL_ALL_GATHER) at = ro + (size_t)ctx->ri.rank * sb;
      else if (c->kind == DEV_COLL_REDUCE_SCATTER) at = so + (size_t)ctx->ri.rank * rb;
      int ok = c->kind == DEV_COLL_ALL_GATHER ? so == at : c->kind == DEV_COLL_REDUCE_SCATTER ? ro == at : so == ro;
      if (overlap && !ok)
        return dev_fail(ctx, DEV_ERR_INVALID, "%s: the input and output overlap; in place, %s", name,
                        c->kind == DEV_COLL_ALL_GATHER ? "the input is this rank's block of the output"
                        : c->kind == DEV_COLL_REDUCE_SCATTER ? "the output is this rank's block of the input"
                                                             : "they are the same tensor");
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
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s %d is not a rank (world of %d)", name, p2p ? "peer" : "root",
                      c->peer, world);
    if (p2p && c->peer == ctx->ri.rank) {
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

int dev_collective(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n) {
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if (n < 1) return DEV_OK;
  if (!ctx->comm) return dev_fail(ctx, DEV_ERR_INVALID, "%s: the communicator is not joined", dev_coll_name(c->kind));
  if (!s) s = ctx->dflt;
  if ((rc = check_open(s))) return rc;
  if ((rc = coll_check(ctx, c, n))) return rc;
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
