/* Private to the device layer: the backend interface and the shared structs.
 * The cuda/dev*.c files hold what both backends share (the context, buffer
 * lifetime, streams, validation, collectives, counters; see the section
 * "the device layer's own files" below); a backend implements dev_backend. */
#ifndef GPULUA_DEVPRIV_H
#define GPULUA_DEVPRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "device.h"

struct race_ctx;
struct race_stream;
struct race_event;
struct race_buf;

struct dev_kimage;
typedef struct dev_stage_job dev_stage_job;
typedef struct dev_stage_pool dev_stage_pool;
struct dev_gexec;

typedef struct dev_backend {
  const char *name;
  /* Bytes of new tensors after which a loop's temporaries are best
   * collected, so that their blocks are reused while still in the caches
   * the backend's ops go through; 0: no such size (bindings/memory.c). */
  size_t warm_bytes;
  int (*open)(dev_ctx *ctx, int device);
  void (*close)(dev_ctx *ctx);
  int (*device_count)(dev_ctx *ctx);
  int (*device_info)(dev_ctx *ctx, int index, dev_info *out);

  int (*stream_init)(dev_stream *s);
  void (*stream_fini)(dev_stream *s);      /* drained, unreferenced */
  int (*stream_idle)(dev_stream *s);       /* no queued work, nobody waits on it */
  uint64_t (*stream_pos)(dev_stream *s);   /* position after the last enqueued item */
  int (*pos_done)(dev_stream *s, uint64_t pos);
  int (*pos_wait)(dev_stream *s, uint64_t pos);
  /* optional: pos_wait that returns DEV_ERR_INTERRUPTED (no message) when
   * dev_intr_pending, checked at least every 50 ms */
  int (*pos_wait_intr)(dev_stream *s, uint64_t pos);
  int (*stream_wait)(dev_stream *s, dev_stream *other, uint64_t pos);

  int (*event_init)(dev_event *e);
  void (*event_fini)(dev_event *e);
  int (*event_record)(dev_event *e, dev_stream *s);   /* sets e->stream, e->pos */
  int (*event_query)(dev_event *e);   /* optional: 1 done, 0 pending, <0 error */
  int (*event_sync)(dev_event *e);    /* optional; interruptible as pos_wait_intr
                                         when dev_intr_enabled */
  int (*event_wait)(dev_stream *s, dev_event *e);   /* optional: s waits for e's last record */
  int (*event_elapsed)(dev_event *a, dev_event *b, double *ms);
  /* optional: a completion signal for stream s at pos, or for e's last
   * record (e not NULL); the backend calls dev_progress_signal when it is
   * reached and watch_done says so from then on.  Without these the device
   * layer tests pos_done, and the backend signals progress for every item. */
  int (*watch)(dev_ctx *ctx, dev_stream *s, uint64_t pos, dev_event *e, void **impl);
  int (*watch_done)(dev_ctx *ctx, void *impl);
  void (*watch_free)(dev_ctx *ctx, void *impl);

  /* Memory for the device layer's cache (dev_buf.c), which calls alloc only
   * when no cached block fits, and free only for blocks no queued work uses.
   * alloc fails with DEV_ERR_NOMEM (no message needed) when memory of the
   * kind is exhausted; mem_total is what the kind has in all; trim, optional,
   * returns what the backend itself keeps (a driver pool) to the system. */
  int (*alloc)(dev_ctx *ctx, dev_memkind kind, size_t bytes, void **out);
  void (*free)(dev_ctx *ctx, dev_memkind kind, void *p, size_t bytes);
  size_t (*mem_total)(dev_ctx *ctx, dev_memkind kind);
  void (*trim)(dev_ctx *ctx);
  int (*submit)(dev_stream *s, const dev_kop *op);
  /* A copy between pageable memory and the device, staged (dev_stage.c):
   * enqueue the job's steps on s (dev_stage_emit) as one op at one
   * position.  A failure leaves nothing of it running: the backend aborts
   * the job (dev_stage_abort) and waits for the steps it had enqueued. */
  int (*stage_copy)(dev_stream *s, const dev_kop *op, dev_stage_job *j);

  /* Run-time kernels; NULL on a backend without them.  compile turns
   * source into an image module_load takes (for arch; the lowered names of
   * the name expressions exprs), from the on-disk cache where use_cache. */
  int (*compile)(const char *src, const char *name, const char *arch, const char *const *opts, int nopts,
                 const char *const *exprs, int nexprs, int use_cache, struct dev_kimage *img, char **log,
                 char *err, size_t errlen);
  int (*module_load)(dev_ctx *ctx, const void *image, size_t len, void **impl);
  void (*module_unload)(dev_ctx *ctx, void *impl);
  /* Handle and limits of the kernel named `symbol`, and the sizes of its
   * first parameters, at most max (*nparams: how many it has, up to max). */
  int (*kernel_get)(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k,
                    size_t *sizes, int max, int *nparams);
  /* Names of every kernel in the image (malloc'd array of malloc'd names). */
  int (*kernel_names)(dev_ctx *ctx, void *impl, char ***names, int *n);
  /* Set where compile's images are the backend's own: no PTX, cubin or
   * fatbin is loaded (gpu.load_module). */
  int compile_only;

  /* Collectives; NULL on a backend without them.  coll takes a checked
   * group of n (copied) with its sequence number in the job. */
  int (*comm_open)(dev_ctx *ctx, const dev_rank_info *ri);
  /* optional: joined already; create the communicator if deferred, take
   * ri's timeout and check */
  int (*comm_connect)(dev_ctx *ctx, const dev_rank_info *ri);
  void (*comm_close)(dev_ctx *ctx);
  int (*coll)(dev_stream *s, const dev_coll *c, int n, uint64_t seq);

  /* Tracing, optional (cuda/trace.c): the clock reference of a new session,
   * finished op timings into records, the timing resources freed; ranges
   * for external profilers (NVTX). */
  int (*trace_start)(dev_ctx *ctx);
  void (*trace_flush)(dev_ctx *ctx);
  void (*trace_free)(dev_ctx *ctx);
  uint64_t (*range_start)(dev_ctx *ctx, const char *name);   /* may overlap others */
  void (*range_end)(dev_ctx *ctx, uint64_t handle);

  /* Application objects, optional: is ptr memory of this kind (dev_buf_wrap);
   * the native handle of a stream (dev_stream_native).  stream_init wraps
   * s->wrap when it is set (dev_stream_wrap); a backend without
   * stream_native cannot. */
  int (*check_ptr)(dev_ctx *ctx, dev_memkind kind, void *ptr, size_t bytes);
  void *(*stream_native)(dev_stream *s);

  /* Graphs (cuda/dev_graph.c); NULL: the backend has none.  graph_build,
   * optional, makes the backend's executable of a captured node list
   * (gx->impl) once the capture ends; graph_launch enqueues one replay of
   * it on s, ordered there as one op, its collectives numbered from seq
   * on (gx->ncolls of them); graph_free frees gx->impl once no replay is
   * queued (interpreter thread). */
  int (*graph_build)(dev_ctx *ctx, struct dev_gexec *gx);
  int (*graph_launch)(dev_stream *s, const struct dev_gexec *gx, uint64_t seq);
  void (*graph_free)(dev_ctx *ctx, struct dev_gexec *gx);
} dev_backend;

/* A captured graph as the backends see it: its nodes in capture order (a
 * topological order: the host backend replays the ops in it, one after the
 * other), with the fork/join between the capture's streams as records and
 * waits (stream 0 is the one the capture began on), for a backend that
 * rebuilds it (cuda). */
typedef enum { DEV_GN_OP, DEV_GN_RECORD, DEV_GN_WAIT, DEV_GN_COLL } dev_gnode_kind;
typedef struct dev_gnode {
  int kind;                  /* dev_gnode_kind */
  int stream;                /* the capture's stream it was enqueued on */
  int event;                 /* RECORD: its slot; WAIT: the slot of the record waited for */
  dev_kop op;                /* OP; a launch points to a copy the graph owns */
  dev_coll *coll;            /* COLL: a collective or a group (ncoll), the graph's copy */
  int ncoll;
  char site[DEV_SITE_LEN];   /* the script line that enqueued it */
} dev_gnode;

typedef struct dev_gexec {
  dev_gnode *nodes;
  int n, nops, nstreams, nevents;
  int ncolls;                /* COLL nodes: the collectives (groups count one) of a replay */
  char name[DEV_TRACE_NAME];
  char site[DEV_SITE_LEN];   /* of the capture */
  void *impl;                /* the backend's executable (graph_build) */
} dev_gexec;

/* Compiled code and the lowered (mangled) names of the name expressions. */
typedef struct dev_kimage {
  void *data;
  size_t size;
  char **lowered;
  int n;
  int from_cache;
} dev_kimage;

void dev_kimage_free(dev_kimage *img);   /* module.c */
/* module.c: the on-disk cache of compiled kernels that both backends'
 * compilers use (cuda/cuda/nvrtc.c, cuda/host/kcompile.c): a key's hash
 * (FNV-1a), the directory (GPULUA_KERNEL_CACHE, "0"/"off"/"": none; else
 * $XDG_CACHE_HOME/gpulua or ~/.cache/gpulua; NULL when off or unknown),
 * and mkdir -p (0, or -1 with errno). */
uint64_t dev_kcache_hash(const void *p, size_t n);
const char *dev_kcache_dir(char *buf, size_t n);
int dev_mkdirs(char *path);

extern const dev_backend dev_host_backend;
#ifdef GPULUA_HAVE_CUDA   /* its private API: cuda/cuda/cu.h */
extern const dev_backend dev_cuda_backend;
int dev_cuda_available(void);
#endif

struct dev_stream {
  dev_ctx *ctx;
  int refs;               /* handle, events recorded on it, buffer uses */
  int closed;             /* the handle is gone: no new work */
  int released;           /* no references left: free once idle */
  int priority, nonblocking, is_default;
  uint64_t id;
  dev_stream *next, *prev;          /* all streams of the context */
  dev_stream *rel_next, *rel_prev;  /* released ones, waiting to drain */
  dev_stream *lg_next, *lg_prev;    /* closed ones still named by fences or cached blocks */
  int lingering;
  void *impl;
  struct race_stream *race;   /* race checker state (race.c), NULL when unused */
  void *wrap;             /* dev_stream_wrap: the application's handle (not ours to destroy) */
  dev_graph *capture;     /* the capture it belongs to (dev_graph.c), NULL: none */
  int cap_index;          /* its number in that capture (0: the one it began on) */
};

struct dev_event {
  dev_ctx *ctx;
  int timing;
  int recorded;
  dev_stream *stream;     /* of the last record (referenced) */
  uint64_t pos;
  void *impl;
  struct race_event *race;    /* race checker: the clock the last record captured */
};

struct dev_ctx {
  const dev_backend *bk;
  void *bk_state;
  int refs;               /* owner + live buffers, streams, events */
  int closing;
  int device;
  char err[2048];
  char site[DEV_SITE_LEN];
  dev_stream *dflt;
  dev_stream *streams;
  dev_stream *released;   /* released streams, freed once idle */
  dev_stream *lingering;  /* closed streams that buffers still name (dev_buf.c) */
  struct bufx *fenced;    /* live buffers with fences */
  unsigned sweeps;
  uint64_t next_stream_id;
  struct bufx *bufs;      /* every live buffer */
  struct bufx *dead;      /* wrapped buffers released, waiting for their uses */
  struct dev_memcache *cache;   /* cached blocks per kind and size class (dev_buf.c) */
  /* bytes per memory kind: held by live buffers, their high-water mark,
   * and taken from the backend (live + cached) */
  size_t mlive[DEV_NMEMKIND], mpeak[DEV_NMEMKIND], mreserved[DEV_NMEMKIND];
  int jitter;             /* GPULUA_HOST_JITTER */
  /* staged pageable copies (dev_stage.c): GPULUA_STAGE_CHUNK and
   * GPULUA_STAGE_THREADS, and the threads' pool (made on first use) */
  size_t stage_chunk;
  int stage_threads;
  int stage_evict;          /* drained slots are evicted from the caches (a DMA writes them) */
  int stage_off;            /* the backend cannot stage: pageable copies are the driver's */
  dev_stage_pool *stage;

  dev_stats st;           /* interpreter-thread counters */
  dev_sync_policy sync_policy;
  void (*sync_warn)(void *ud, const char *msg);
  void *sync_warn_ud;
  const char *call;       /* the API call now running, for sync messages */
  atomic_int running;     /* ops running now (host workers) */
  atomic_llong max_running;

  void *comm;             /* the backend's communicator, once joined */
  dev_rank_info ri;
  uint64_t coll_seq;      /* collectives enqueued (interpreter thread) */

  pthread_mutex_t async_mu;
  atomic_int async_flag;
  char async_err[1024];

  /* completions: waiters sleep on progress_cv until progress_gen moves */
  pthread_mutex_t progress_mu;
  pthread_cond_t progress_cv;
  uint64_t progress_gen;        /* under progress_mu */
  atomic_int progress_sleepers; /* begun and not ended */

  unsigned trace_gen;     /* the tracing session, 0 when off (interpreter thread) */
  struct dev_trace *tr;   /* cuda/trace.c; lives until the context goes */

  dev_graph *capture;     /* the capture open now (dev_graph.c), NULL: none */
  struct race_ctx *race;  /* the race checker, while it is on (one branch per hook when off) */
  unsigned race_gen;      /* times it was turned on: older per-object state is stale */

  /* dev_buf_release_async (DLPack deleters, any thread): buffers whose
   * releases wait for the owner thread, under defer_mu (recursive); once
   * owner_gone (dev_close returned) every release and every change of refs
   * happens under defer_mu instead. */
  pthread_mutex_t defer_mu;
  struct bufx *deferred;  /* linked through bufx.defer_next */
  atomic_int defer_flag;  /* deferred is not empty: a lock-free test for sweeps */
  int owner_gone;
  /* dev_interrupt: set from a signal handler, taken by a wait */
  atomic_int intr_on;     /* interruptible waits enabled */
  atomic_int intr;        /* an interrupt is pending */
};

static inline int dev_intr_enabled(dev_ctx *ctx) { return atomic_load(&ctx->intr_on); }
static inline int dev_intr_pending(dev_ctx *ctx) { return atomic_load(&ctx->intr); }

/* From any thread: queued work finished; wakes dev_progress_wait (cheap when
 * nobody waits: one atomic load). */
void dev_progress_signal(dev_ctx *ctx);

/* Every counted sync starts here, before it waits: counts it and applies the
 * sync policy.  `what` names the kind of wait ("stream synchronize"). */
int dev_sync_enter(dev_ctx *ctx, const char *what);
/* ... and ends there, once the wait is over (the span on the trace). */
/* A sync entered that failed before it waited (the op it waits for was
 * refused): not counted, no span.  dev_sync_leave is a no-op after it. */
void dev_sync_abandon(dev_ctx *ctx);
void dev_sync_leave(dev_ctx *ctx);

/* cuda/trace.c, for the backends: the trace clock (CLOCK_MONOTONIC ns); a
 * record of an op or collective (name, class, bytes; site and times are the
 * caller's); append one (t0, t1 on the trace clock, any thread: dropped
 * unless gen is the session's); the stream an op of the session went to (interpreter
 * thread); a host-run op; a sync's span opening (dev_sync_enter); the
 * backend's trace state. */
uint64_t dev_trace_now(void);
void dev_trace_fill_op(dev_trace_rec *r, const dev_kop *op, int64_t stream);
void dev_trace_fill_coll(dev_trace_rec *r, const dev_coll *c, int n, int64_t stream);
void dev_trace_add(dev_ctx *ctx, unsigned gen, dev_trace_rec *r, uint64_t t0, uint64_t t1);
void dev_trace_note_stream(dev_ctx *ctx, dev_stream *s);
void dev_trace_host_op(dev_ctx *ctx, const dev_kop *op, uint64_t t0);
void dev_trace_sync_open(dev_ctx *ctx, const char *what);
void **dev_trace_backend_state(dev_ctx *ctx);
void dev_trace_free(dev_ctx *ctx);

int dev_fail(dev_ctx *ctx, int code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
/* Called from any thread: first async failure wins until reported. */
void dev_async_fail(dev_ctx *ctx, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));
void dev_note_running(dev_ctx *ctx, int delta);
/* A buffer that only tracks uses (e.g. a module's launches): not counted in
 * the stats; release(ud, ptr) runs once its last use is over. */
int dev_buf_wrap_internal(dev_ctx *ctx, void *ptr, void (*release)(void *ud, void *ptr),
                          void *ud, dev_buf **out);
dev_buf *dev_module_life(dev_module *m);
dev_ctx *dev_module_ctx(const dev_module *m);
const char *dev_op_name(const dev_kop *op);
/* C function kernels (module.c): run the launch's function with stream (the
 * cudaStream_t, NULL on host); 0, or -1 with its message in err.  A copy of
 * a launch that owns its argument values (one free() releases it), for a
 * backend that runs it later. */
int dev_cfunc_run(const dev_launch *l, void *stream, char *err, size_t errlen);
dev_launch *dev_launch_dup(const dev_launch *l);
/* "all_reduce #3", or "a group of 2 sends/receives (#4)": the collectives
 * numbered seq in messages */
void dev_coll_describe(char *out, size_t len, dev_coll_kind kind, int n, uint64_t seq);

/* ---- the device layer's own files (cuda/dev*.c) ------------------------ */

/* cuda/dev.c: free a context whose last reference went */
void dev_ctx_destroy(dev_ctx *ctx);

/* cuda/dev_sync.c: the wait of a counted sync (interruptible while
 * interrupts are enabled); a backend wait's status, the interrupt taken and
 * the message set if it gave up for one */
int dev_sync_wait(dev_ctx *ctx, dev_stream *s, uint64_t pos);
int dev_intr_check(dev_ctx *ctx, int rc);

/* cuda/dev_stage.c: copies between pageable memory and the device through
 * pinned slots (its header says how).  config reads GPULUA_STAGE_CHUNK and
 * GPULUA_STAGE_THREADS (a backend's open); shutdown joins the pool's
 * threads (a backend's close, every stream drained).  plan: the chunk
 * (whole elements) and slots of a copy of bytes.  new: a job moving host's
 * elements to or from dev (contiguous) through nslot slots of chunk bytes
 * at stage; start: an H2D job may read its source now (no queued work
 * writes it).  emit: the steps in stream order, through the backend's
 * ops (wait, post, copy: each asynchronous in stream order; a step a call
 * failed to enqueue never runs).  abort:
 * after a failed enqueue, once no thread copies for the job any more.
 * retain/release: a reference (the submitter has one).  dev_parse_size: "8M", "1.5G" (0, or
 * -1 when not a size of at least one byte). */
#define DEV_STAGE_CHUNK ((size_t)8 << 20)
#define DEV_STAGE_THREADS 8   /* at most, by default: half the processors (dev_stage_config) */
typedef struct dev_stage_ops {
  /* the stream waits until (int32_t)(*flag - value) >= 0 (host memory) */
  int (*wait)(void *ud, volatile uint32_t *flag, uint32_t value);
  /* the stream writes value to *flag once the steps before it are done */
  int (*post)(void *ud, volatile uint32_t *flag, uint32_t value);
  /* an asynchronous copy in stream order */
  int (*copy)(void *ud, void *dst, const void *src, size_t n);
} dev_stage_ops;
int dev_stage_config(dev_ctx *ctx, int dma);
void dev_stage_shutdown(dev_ctx *ctx);
void dev_stage_plan(dev_ctx *ctx, size_t bytes, size_t el, size_t *chunk, int64_t *nslot);
int dev_stage_new(dev_ctx *ctx, int h2d, const dev_view *host, void *dev, void *stage, size_t chunk,
                  int64_t nslot, dev_stage_job **out);
void dev_stage_start(dev_stage_job *j);
int dev_stage_emit(dev_stage_job *j, const dev_stage_ops *ops, void *ud);
void dev_stage_abort(dev_stage_job *j);
void dev_stage_retain(dev_stage_job *j);
void dev_stage_release(dev_stage_job *j);
int dev_parse_size(const char *s, size_t *out);

/* cuda/dev_stream.c: a stream of the context (the default one at open) */
int dev_stream_new(dev_ctx *ctx, int priority, int nonblocking, int is_default,
                   void *wrap, dev_stream **out);

/* Every call that enqueues work on s tests this first. */
static inline int check_open(dev_stream *s) {
  if (s->closed) return dev_fail(s->ctx, DEV_ERR_INVALID, "stream is closed");
  return DEV_OK;
}

/* cuda/dev_op.c: a view of this context, of a sane shape, within its buffer */
int dev_check_view(dev_ctx *ctx, const dev_view *v, const char *what);

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

/* cuda/shm_comm.c: collectives between the processes of one node through
 * shared memory (the host backend's).  shm_comm_run runs the group numbered
 * seq after every earlier one, from any thread.  With side set, the segment
 * is a sideband only (another transport moves the data): shm_comm_check
 * compares a collective across ranks (every rank calls it, in order), or a
 * group's sends with their receives (each send's header goes to its
 * receiver, which compares it with what it expects), and
 * shm_comm_gone names a rank of mask (a bit per rank; NULL: all) that died,
 * or that left having done fewer than `need` collectives (its count is set
 * with shm_comm_set_done before shm_comm_close), returning its number with
 * the reason in err, or -1. */
typedef struct shm_comm shm_comm;
int shm_comm_open(const dev_rank_info *ri, int side, shm_comm **out, char *err, size_t errlen);
void shm_comm_close(shm_comm *c);
int shm_comm_run(shm_comm *c, uint64_t seq, const dev_coll *g, int n, char *err, size_t errlen);
int shm_comm_check(shm_comm *c, uint64_t seq, const dev_coll *g, int n, char *err, size_t errlen);
/* collective seq is not run (what came before it in a replay failed): its
 * turn is taken, and the communicator fails from then on */
int shm_comm_fail(shm_comm *c, uint64_t seq, const char *why);
int shm_comm_gone(shm_comm *c, const uint64_t *mask, uint64_t need, const char *what, char *err, size_t errlen);
void shm_comm_set_done(shm_comm *c, uint64_t done);
/* a later gpu.init_comm's options, for the collectives enqueued after it */
void shm_comm_set_options(shm_comm *c, int check, double timeout_s);

/* cuda/dev_graph.c: what the device layer's files call while ctx->capture
 * is set (one branch each when it is not).  Enqueueing on s records into
 * the capture instead (submit: a validated op, unless all its memory is
 * host-visible: that one runs at once, as host work does in a capture,
 * after the host-access fences; record: e recorded on s;
 * wait: s waits for other's work or for e); refuse fails with `what`
 * cannot be captured; a host wait for b fails if the capture uses b; an
 * event that goes leaves the capture's records. */
int graph_records(const dev_kop *op);   /* not an op that runs on the host at once */
int graph_submit(dev_stream *s, const dev_kop *op);
int graph_coll(dev_stream *s, const dev_coll *c, int n);   /* a checked collective, recorded */
int graph_record(dev_event *e, dev_stream *s);
int graph_wait(dev_stream *s, dev_stream *other, dev_event *e);
int graph_refuse(dev_ctx *ctx, const char *what);
/* a refusal (DEV_ERR_CAPTURE): the capture is abandoned whatever the caller does */
int graph_fail(dev_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int graph_host_access(dev_ctx *ctx, dev_buf *b, const char *what);
int graph_read(dev_ctx *ctx, dev_buf *b);   /* dev_read of b: a sync, or host access */
void graph_event_gone(dev_event *e);

/* cuda/race.c: the stream race checker (GPULUA_CHECK=races).  The hooks
 * below are called by the dev*.c files only while ctx->race is set, except
 * the *_gone ones, which free an object's checker state whenever it has
 * some. */
int race_set(dev_ctx *ctx, int on);
/* commit 0: before enqueueing, DEV_ERR_RACE if the op's accesses conflict
 * with unordered work of other streams; commit 1: after, record them */
int race_op(dev_ctx *ctx, dev_stream *s, const dev_kop *op, int commit);
int race_coll(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n, int commit);
/* s now waits for other's queued work, or for e's record */
void race_wait(dev_stream *s, dev_stream *other, dev_event *e);
void race_record(dev_event *e, dev_stream *s);
/* the host waited for s's queued work, for e, or (both NULL) for every stream */
void race_host_waited(dev_ctx *ctx, dev_stream *s, dev_event *e);
/* a host-access fence; and dev_read's wait for the last writer of b on s */
void race_fence(dev_buf *b, int write);
void race_host_reached(dev_ctx *ctx, dev_stream *s, uint64_t pos);
void race_read_wait(dev_stream *s, dev_buf *b);
void race_stream_gone(dev_stream *s);
void race_event_gone(dev_event *e);
void race_buf_gone(struct race_buf *rb);
/* dev_buf.c: where a buffer keeps its checker state */
struct race_buf **dev_buf_racep(dev_buf *b);

#endif
