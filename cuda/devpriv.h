/* Private to the device layer: the context, its streams and events, and
 * the services of the neutral files (errors, syncs, completions, traces)
 * that both backends and the cuda/dev*.c files call.  The backend table is
 * cuda/backend.h; the parts used apart have their own headers: bufx.h
 * (buffers and the block cache), stage.h (staged pageable copies),
 * capture.h (graph capture hooks), race.h (race checker hooks), shm_comm.h
 * (the shared-memory transport); each backend's private API is in its own
 * folder (cuda/cuda/cu.h, cuda/host/hk.h). */
#ifndef GPULUA_DEVPRIV_H
#define GPULUA_DEVPRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "backend.h"
#include "device.h"

struct race_ctx;
struct race_stream;
struct race_event;
struct race_buf;

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
  int refs;               /* the handle, and each graph that records it (dev_graph.c) */
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
  void (*warn)(void *ud, const char *msg);   /* dev_warn's (dev_set_warn) */
  void *warn_ud;
  const char *call;       /* the API call now running, for sync messages */
  atomic_int running;     /* ops running now (host workers) */
  atomic_llong max_running;

  void *comm;             /* the backend's communicator, once joined */
  dev_rank_info ri;
  uint64_t coll_seq;      /* collectives enqueued (interpreter thread) */
  uint64_t groups_made;   /* dev_group_split calls: alike on every rank */

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
/* A warning to the warn callback (dev_set_warn), if one is set; the
 * interpreter thread, during the call it belongs to. */
void dev_warn(dev_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Called from any thread: first async failure wins until reported. */
void dev_async_fail(dev_ctx *ctx, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));
void dev_note_running(dev_ctx *ctx, int delta);
/* A backend's thread left running work the caller gave up on (+1), or
 * done with it (-1): dev_detached_threads counts them (any context). */
void dev_note_detached(int delta);
/* A buffer that only tracks uses (e.g. a module's launches): not counted in
 * the stats; release(ud, ptr) runs once its last use is over. */
int dev_buf_wrap_internal(dev_ctx *ctx, void *ptr, void (*release)(void *ud, void *ptr),
                          void *ud, dev_buf **out);
dev_buf *dev_module_life(dev_module *m);
dev_ctx *dev_module_ctx(const dev_module *m);
/* C function kernels (module.c): run the launch's function with stream (the
 * cudaStream_t, NULL on host); 0, or -1 with its message in err.  A copy of
 * a launch that owns its argument values (one free() releases it), for a
 * backend that runs it later. */
int dev_cfunc_run(const dev_launch *l, void *stream, char *err, size_t errlen);
dev_launch *dev_launch_dup(const dev_launch *l);

/* ---- the device layer's own files (cuda/dev*.c) ------------------------ */

/* cuda/dev.c: free a context whose last reference went */
void dev_ctx_destroy(dev_ctx *ctx);

/* cuda/dev_sync.c: the wait of a counted sync (interruptible while
 * interrupts are enabled); cuda/dev_err.c: a backend wait's (or compile's)
 * status, the interrupt taken and the message set if it gave up for one */
int dev_sync_wait(dev_ctx *ctx, dev_stream *s, uint64_t pos);
int dev_intr_check(dev_ctx *ctx, int rc);

/* cuda/dev_stream.c: a stream of the context (the default one at open) */
int dev_stream_new(dev_ctx *ctx, int priority, int nonblocking, int is_default,
                   void *wrap, dev_stream **out);

/* cuda/dev_stream.c: events.  A graph holds the events its replays record
 * (dev_event_retain; dev_event_release drops a reference); event_mark
 * makes e stand for position pos of s (a record, or a replay's record of
 * it), for the race checker too. */
void dev_event_retain(dev_event *e);
void event_mark(dev_event *e, dev_stream *s, uint64_t pos);

/* Every call that enqueues work on s tests this first. */
static inline int check_open(dev_stream *s) {
  if (s->closed) return dev_fail(s->ctx, DEV_ERR_INVALID, "stream is closed");
  return DEV_OK;
}

/* cuda/dev_op.c: a view of this context, of a sane shape, within its buffer */
int dev_check_view(dev_ctx *ctx, const dev_view *v, const char *what);

/* A process group (dev_group_split).  Freed, with the backend's impl, when
 * refs reaches 0: from any thread (a worker's queued collective). */
struct dev_group {
  _Atomic int refs;
  void (*free_impl)(void *impl);
  void *impl;
  int rank, size;
  int *members;              /* world ranks, in group-rank order */
  uint64_t id;               /* the world's count of groups made, alike on every rank */
  char label[96];
};

#endif
