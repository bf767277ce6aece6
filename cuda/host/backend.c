/* Host backend: the device layer's semantics on CPU threads.
 *
 * Each stream is a worker thread with a FIFO of items (ops, waits, event
 * records), started on first use.  A stream's position is the number of items
 * enqueued; `done` is the number finished.  Waits between streams are items
 * that block the worker until the other stream's `done` reaches a position,
 * so `s:wait(ev)` really holds that stream.  The default stream follows CUDA's
 * legacy rules: before an item goes on it, it waits for the blocking user
 * streams, and an item on a blocking user stream first waits for it. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "devpriv.h"
#include "cpu_ops.h"
#include "shm_comm.h"
#include "stage.h"
#include "hk.h"
#include "util.h"

typedef struct hrec {           /* one event record: its timestamp */
  atomic_int refs;
  uint64_t t_ns;
} hrec;

typedef enum { IT_OP, IT_WAIT, IT_RECORD, IT_COLL, IT_GRAPH } item_kind;

typedef struct item {
  struct item *next;
  item_kind kind;
  uint64_t seq;
  dev_kop op;                   /* IT_OP */
  dev_launch *launch;           /* IT_OP of a launch: the copy op.launch points to */
  dev_fargs *fargs;             /* IT_OP of a fused op: the copy op.fargs points to */
  dev_stage_job *stage;         /* IT_OP of a staged copy (referenced) */
  struct hstream *target;       /* IT_WAIT */
  uint64_t pos;
  hrec *rec;                    /* IT_RECORD */
  dev_coll *coll;               /* IT_COLL: a group of ncoll, numbered seq_coll */
  int ncoll;
  uint64_t seq_coll;            /* IT_GRAPH too: its first collective's number */
  const dev_gexec *gx;          /* IT_GRAPH: kept by the graph's life buffer until done */
  hrec **recs;                  /* IT_GRAPH: per record of a script's event, its timestamp (NULL: none) */
  unsigned tgen;                /* the tracing session it was enqueued in, 0: none */
  char site[DEV_SITE_LEN];
} item;

static item *item_new(void) { return calloc(1, sizeof(item)); }
static void item_free(item *it) { free(it); }

typedef struct hstream {
  dev_ctx *ctx;
  pthread_mutex_t mu;
  pthread_cond_t work, donecv;
  item *head, *tail;
  uint64_t enq;                 /* interpreter thread only */
  _Atomic uint64_t done;
  uint64_t wake_at;             /* under mu: the lowest position a thread waits on donecv for */
  atomic_int waiters;           /* wait items of other streams aimed at this one */
  int started, stop;
  pthread_t th;
  unsigned jitter_seed;
  int64_t sid;                  /* the dev_stream's id, for the trace */
  /* legacy default-stream ordering (interpreter thread only) */
  uint64_t waited_dflt;         /* default-stream position this stream has waited for */
  uint64_t dflt_waited;         /* this stream's position the default stream waited for */
} hstream;

typedef struct hstate {
  size_t capacity;              /* device memory handed out at most */
} hstate;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void rec_release(hrec *r) {
  if (r && atomic_fetch_sub(&r->refs, 1) == 1) free(r);
}

static void jitter(hstream *hs) {
  /* Up to 1 ms, so a missing dependency in a script loses the race. */
  unsigned r = (unsigned)rand_r(&hs->jitter_seed) % 1000;
  struct timespec ts = {0, (long)r * 1000};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* An op or collective of a tracing session, run from t0 to now. */
static void trace_item(hstream *hs, item *it, uint64_t t0) {
  dev_trace_rec r;
  if (it->kind == IT_OP) dev_trace_fill_op(&r, &it->op, hs->sid);
  else dev_trace_fill_coll(&r, it->coll, it->ncoll, hs->sid);
  memcpy(r.site, it->site, sizeof r.site);
  dev_trace_add(hs->ctx, it->tgen, &r, t0, dev_trace_now());
}

/* A staged copy's steps, run by the stream's worker as they come (as a
 * CUDA stream runs its memory operations and copies, in order): a wait
 * looks at the word as the GPU's front end does, a while spinning, then
 * every few microseconds. */
static int run_wait(void *ud, volatile uint32_t *flag, uint32_t value) {
  (void)ud;
  for (int i = 0; (int32_t)(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - value) < 0; i++) {
    if (i < 1000) {
      sched_yield();
    } else {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  return DEV_OK;
}

static int run_post(void *ud, volatile uint32_t *flag, uint32_t value) {
  (void)ud;
  __atomic_store_n(flag, value, __ATOMIC_RELEASE);
  return DEV_OK;
}

static int run_copy(void *ud, void *dst, const void *src, size_t n) {
  hstream *hs = ud;
  /* one step in eight: a copy of many chunks stays quick */
  if (hs->ctx->jitter && rand_r(&hs->jitter_seed) % 8 == 0) jitter(hs);
  memcpy(dst, src, n);
  return DEV_OK;
}

/* An op on this thread: a compiled kernel (*hk set) or a host kernel. */
static int run_op(const dev_kop *op, int *hk, char *msg, size_t n) {
  *hk = op->kind == DEV_OP_LAUNCH && hk_is_compiled(op->launch->k);
  return *hk ? hk_launch(op->launch, msg, n) : dev_cpu_run(op, msg, n < 256 ? n : 256);
}

/* The stream has done everything up to pos: waits and watches see it.
 * The waiters are woken only when one of them is due (wake_at): a script
 * that waits for the last of many queued ops was woken, and the worker
 * paid a futex wake, at every op before it (4 % of the worker's samples
 * in a loop of `x + 1` on 4 MiB, 2026-11-29). */
static void advance(hstream *hs, uint64_t pos) {
  pthread_mutex_lock(&hs->mu);
  atomic_store(&hs->done, pos);
  if (pos >= hs->wake_at) {
    hs->wake_at = UINT64_MAX;
    pthread_cond_broadcast(&hs->donecv);
  }
  pthread_mutex_unlock(&hs->mu);
  dev_progress_signal(hs->ctx);
}

/* Wait on donecv (mu held) until a wake: due at pos or before.  Every
 * waiter says when it is due first, under mu, so advance cannot miss it;
 * a woken waiter whose position is not done yet comes back here. */
static void wait_done(hstream *hs, uint64_t pos, const struct timespec *deadline) {
  if (pos < hs->wake_at) hs->wake_at = pos;
  if (deadline) pthread_cond_timedwait(&hs->donecv, &hs->mu, deadline);
  else pthread_cond_wait(&hs->donecv, &hs->mu);
}

/* The communicator of a collective's process group; NULL: the world's. */
static shm_comm *group_comm(const dev_coll *c) { return c[0].group ? c[0].group->impl : NULL; }

/* A replay: the graph's ops in capture order (a topological order of its
 * nodes; the records and waits between its streams are met by it); the
 * first failure ends it, naming the graph, its capture and the op's line.
 * Its record of a script's event (the k-th) is its position k on the
 * stream (backend.h): the stream is done up to there. */
static void run_graph(hstream *hs, item *it, uint64_t t0) {
  dev_ctx *ctx = hs->ctx;
  const dev_gexec *gx = it->gx;
  char msg[1024];
  int hk, k = 0;
  uint64_t seq = it->seq_coll;
  int failed = 0;
  dev_note_running(ctx, 1);
  for (int i = 0; i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind == DEV_GN_RECORD && gx->events && gx->events[nd->event]) {
      if (it->recs[k]) {
        it->recs[k]->t_ns = now_ns();
        rec_release(it->recs[k]);
      }
      advance(hs, it->seq - (uint64_t)gx->nrec - 1 + (uint64_t)++k);
      continue;
    }
    if (nd->kind == DEV_GN_COLL) {
      /* after a failure the collectives are still taken in turn (failed),
       * so that later ones, on any stream, are not kept waiting */
      if (failed) shm_comm_fail(ctx->comm, seq++, "an op before it in the same replay failed");
      else if (shm_comm_run(ctx->comm, group_comm(nd->coll), seq++, nd->coll, nd->ncoll, msg, sizeof msg)) {
        dev_async_fail(ctx, "%s%sa replay of graph '%s' (captured at %s): '%s' (enqueued at %s) failed: %s",
                       it->site, *it->site ? ": " : "", gx->name, gx->site,
                       nd->ncoll > 1 ? "group" : dev_coll_name(nd->coll[0].kind), nd->site, msg);
        failed = 1;
      }
      continue;
    }
    if (nd->kind != DEV_GN_OP || failed) continue;
    if (ctx->jitter) jitter(hs);
    if (run_op(&nd->op, &hk, msg, sizeof msg)) {
      dev_async_fail(ctx, "%s%sa replay of graph '%s' (captured at %s): '%s' (enqueued at %s) failed: %s",
                     it->site, *it->site ? ": " : "", gx->name, gx->site, dev_op_name(&nd->op), nd->site, msg);
      failed = 1;
    }
  }
  dev_note_running(ctx, -1);
  free(it->recs);
  if (it->tgen) {
    dev_trace_rec r;
    memset(&r, 0, sizeof r);
    r.kind = DEV_TR_OP;
    r.cls = DEV_TR_COMPUTE;
    r.stream = hs->sid;
    snprintf(r.name, sizeof r.name, "%s", gx->name);
    memcpy(r.site, it->site, sizeof r.site);
    dev_trace_add(ctx, it->tgen, &r, t0, dev_trace_now());
  }
}

static void run_item(hstream *hs, item *it) {
  dev_ctx *ctx = hs->ctx;
  uint64_t t0 = it->tgen ? dev_trace_now() : 0;
  switch (it->kind) {
  case IT_OP: {
    if (ctx->jitter) jitter(hs);
    char msg[1024];
    dev_note_running(ctx, 1);
    /* a compiled kernel fails as on cuda: named, with where it was enqueued */
    static const dev_stage_ops stage_ops = {run_wait, run_post, run_copy};
    int hk = 0, rc = it->stage ? dev_stage_emit(it->stage, &stage_ops, hs) : run_op(&it->op, &hk, msg, sizeof msg);
    dev_note_running(ctx, -1);
    if (rc && hk)
      dev_async_fail(ctx, "'%s'%s%s failed: %s", dev_op_name(&it->op), *it->site ? " enqueued at " : "",
                     it->site, msg);
    else if (rc)
      dev_async_fail(ctx, "%s%s'%s' failed: %s", it->site, *it->site ? ": " : "",
                     dev_op_name(&it->op), msg);
    if (it->tgen) trace_item(hs, it, t0);
    free(it->launch);
    free(it->fargs);
    dev_stage_release(it->stage);
    break;
  }
  case IT_WAIT: {
    hstream *t = it->target;
    pthread_mutex_lock(&t->mu);
    while (atomic_load(&t->done) < it->pos) wait_done(t, it->pos, NULL);
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_sub(&t->waiters, 1);
    break;
  }
  case IT_RECORD:
    it->rec->t_ns = now_ns();
    rec_release(it->rec);
    break;
  case IT_COLL: {
    char msg[768];
    dev_note_running(ctx, 1);
    int rc = shm_comm_run(ctx->comm, group_comm(it->coll), it->seq_coll, it->coll, it->ncoll, msg, sizeof msg);
    dev_note_running(ctx, -1);
    if (rc)
      dev_async_fail(ctx, "%s%s'%s' failed: %s", it->site, *it->site ? ": " : "",
                     it->ncoll > 1 ? "group" : dev_coll_name(it->coll[0].kind), msg);
    if (it->tgen) trace_item(hs, it, t0);
    dev_group_release(it->coll[0].group);
    free(it->coll);
    break;
  }
  case IT_GRAPH:
    run_graph(hs, it, t0);
    break;
  }
}

static void *worker(void *arg) {
  hstream *hs = arg;
  for (;;) {
    pthread_mutex_lock(&hs->mu);
    while (!hs->head && !hs->stop) pthread_cond_wait(&hs->work, &hs->mu);
    item *it = hs->head;
    if (!it) { pthread_mutex_unlock(&hs->mu); break; }
    hs->head = it->next;
    if (!hs->head) hs->tail = NULL;
    pthread_mutex_unlock(&hs->mu);

    run_item(hs, it);
    advance(hs, it->seq);
    item_free(it);
  }
  return NULL;
}

/* The stream's worker, started on first use. */
static int start(dev_stream *s) {
  hstream *hs = s->impl;
  if (hs->started) return DEV_OK;
  /* the worker takes no signals: Ctrl-C reaches the interpreter thread */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&hs->th, NULL, worker, hs);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e) return dev_fail(s->ctx, DEV_ERR_DEVICE, "cannot start a stream worker thread: %s", strerror(e));
  hs->started = 1;
  return DEV_OK;
}

static int push(dev_stream *s, item *it) {
  hstream *hs = s->impl;
  int rc = start(s);
  if (rc) {
    free(it->launch);
    free(it->fargs);
    item_free(it);
    return rc;
  }
  memcpy(it->site, s->ctx->site, sizeof it->site);  /* both DEV_SITE_LEN, NUL-terminated */
  if (it->kind == IT_OP || it->kind == IT_COLL || it->kind == IT_GRAPH) it->tgen = s->ctx->trace_gen;
  /* a replay takes a position per record of a script's event, then its own */
  it->seq = hs->enq += 1 + (it->kind == IT_GRAPH ? (uint64_t)it->gx->nrec : 0);
  pthread_mutex_lock(&hs->mu);
  if (hs->tail) hs->tail->next = it; else hs->head = it;
  hs->tail = it;
  pthread_cond_signal(&hs->work);
  pthread_mutex_unlock(&hs->mu);
  return DEV_OK;
}

static int push_wait(dev_stream *s, hstream *target, uint64_t pos) {
  if (atomic_load(&target->done) >= pos) return DEV_OK;
  item *it = item_new();
  if (!it) return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a wait");
  it->kind = IT_WAIT;
  it->target = target;
  it->pos = pos;
  atomic_fetch_add(&target->waiters, 1);
  int rc = push(s, it);
  if (rc) atomic_fetch_sub(&target->waiters, 1);
  return rc;
}

/* CUDA's legacy default stream, before an item goes on s. */
static int legacy_order(dev_stream *s) {
  if (s->nonblocking) return DEV_OK;
  dev_ctx *ctx = s->ctx;
  hstream *hs = s->impl;
  int rc;
  if (s->is_default) {
    for (dev_stream *u = ctx->streams; u; u = u->next) {
      hstream *hu = u->impl;
      if (u == s || u->nonblocking || hu->enq <= hu->dflt_waited) continue;
      if ((rc = push_wait(s, hu, hu->enq))) return rc;
      hu->dflt_waited = hu->enq;
    }
    return DEV_OK;
  }
  hstream *hd = ctx->dflt->impl;
  if (hd->enq > hs->waited_dflt) {
    if ((rc = push_wait(s, hd, hd->enq))) return rc;
    hs->waited_dflt = hd->enq;
  }
  return DEV_OK;
}

/* ---- backend interface ----------------------------------------------- */

static int h_open(dev_ctx *ctx, int device) {
  if (device != 0)
    return dev_fail(ctx, DEV_ERR_INVALID, "host backend has one device (0), not %d", device);
  hstate *st = calloc(1, sizeof *st);
  if (!st) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  st->capacity = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : (size_t)8 << 30;
  const char *env = env_setting("GPULUA_HOST_MEMORY");
  if (env && *env && dev_parse_size(env, &st->capacity)) {
    free(st);
    return dev_fail(ctx, DEV_ERR_INVALID,
                    "GPULUA_HOST_MEMORY='%s' is not a size (a positive number of bytes, optionally "
                    "followed by K, M, G or T, powers of 1024: 8G, 1.5T, 512M)", env);
  }
  ctx->bk_state = st;
  return dev_stage_config(ctx, 0);
}

static void h_close(dev_ctx *ctx) {
  dev_stage_shutdown(ctx);
  free(ctx->bk_state);
  ctx->bk_state = NULL;
}

static int h_device_count(dev_ctx *ctx) { (void)ctx; return 1; }

static int h_device_info(dev_ctx *ctx, int index, dev_info *out) {
  hstate *st = ctx->bk_state;
  memset(out, 0, sizeof *out);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(out->name, sizeof out->name, "host (%ld CPU threads)", n > 0 ? n : 1);
  out->backend = "host";
  out->index = index;
  out->total_memory = st->capacity;
  out->multiprocessors = n > 0 ? (int)n : 1;
  return DEV_OK;
}

static int h_stream_init(dev_stream *s) {
  hstream *hs = calloc(1, sizeof *hs);
  if (!hs) return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory creating a stream");
  hs->ctx = s->ctx;
  pthread_mutex_init(&hs->mu, NULL);
  pthread_cond_init(&hs->work, NULL);
  pthread_cond_init(&hs->donecv, NULL);
  hs->wake_at = UINT64_MAX;
  hs->jitter_seed = (unsigned)(s->id * 2654435761u) ^ (unsigned)now_ns();
  hs->sid = (int64_t)s->id;
  s->impl = hs;
  return DEV_OK;
}

static void h_stream_fini(dev_stream *s) {
  hstream *hs = s->impl;
  if (hs->started) {
    pthread_mutex_lock(&hs->mu);
    hs->stop = 1;
    pthread_cond_signal(&hs->work);
    pthread_mutex_unlock(&hs->mu);
    pthread_join(hs->th, NULL);
  }
  pthread_mutex_destroy(&hs->mu);
  pthread_cond_destroy(&hs->work);
  pthread_cond_destroy(&hs->donecv);
  free(hs);
}

static int h_stream_idle(dev_stream *s) {
  hstream *hs = s->impl;
  return atomic_load(&hs->done) >= hs->enq && atomic_load(&hs->waiters) == 0;
}

static uint64_t h_stream_pos(dev_stream *s) { return ((hstream *)s->impl)->enq; }

static int h_pos_done(dev_stream *s, uint64_t pos) {
  return atomic_load(&((hstream *)s->impl)->done) >= pos;
}

static int h_pos_wait(dev_stream *s, uint64_t pos) {
  hstream *hs = s->impl;
  if (atomic_load(&hs->done) >= pos) return DEV_OK;
  pthread_mutex_lock(&hs->mu);
  while (atomic_load(&hs->done) < pos) wait_done(hs, pos, NULL);
  pthread_mutex_unlock(&hs->mu);
  return DEV_OK;
}

/* Wakes at every finished item, and every 50 ms to see an interrupt. */
static int h_pos_wait_intr(dev_stream *s, uint64_t pos) {
  hstream *hs = s->impl;
  if (atomic_load(&hs->done) >= pos) return DEV_OK;
  int rc = DEV_OK;
  pthread_mutex_lock(&hs->mu);
  while (atomic_load(&hs->done) < pos) {
    if (dev_intr_pending(s->ctx)) { rc = DEV_ERR_INTERRUPTED; break; }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);   /* the condition variable's clock */
    dl.tv_nsec += 50000000;
    if (dl.tv_nsec >= 1000000000) { dl.tv_sec++; dl.tv_nsec -= 1000000000; }
    wait_done(hs, pos, &dl);
  }
  pthread_mutex_unlock(&hs->mu);
  return rc;
}

static int h_stream_wait(dev_stream *s, dev_stream *other, uint64_t pos) {
  int rc = legacy_order(s);
  if (rc) return rc;
  return push_wait(s, other->impl, pos);
}

static int h_event_init(dev_event *e) { e->impl = NULL; return DEV_OK; }

static void h_event_fini(dev_event *e) { rec_release(e->impl); }

static int h_event_record(dev_event *e, dev_stream *s) {
  int rc = legacy_order(s);
  if (rc) return rc;
  if (!e->timing) {
    e->pos = ((hstream *)s->impl)->enq;
    return DEV_OK;
  }
  hrec *r = calloc(1, sizeof *r);
  item *it = item_new();
  if (!r || !it) {
    free(r);
    item_free(it);
    return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory recording an event");
  }
  atomic_init(&r->refs, 2);     /* the event and the queued item */
  it->kind = IT_RECORD;
  it->rec = r;
  if ((rc = push(s, it))) { free(r); return rc; }
  rec_release(e->impl);
  e->impl = r;
  e->pos = ((hstream *)s->impl)->enq;
  return DEV_OK;
}

static int h_event_elapsed(dev_event *a, dev_event *b, double *ms) {
  hrec *ra = a->impl, *rb = b->impl;
  *ms = ((double)rb->t_ns - (double)ra->t_ns) / 1e6;
  return DEV_OK;
}

/* Every kind of memory comes from RAM here, each capped at the capacity
 * (GPULUA_HOST_MEMORY): what the cache holds counts, as a driver's would. */
static int h_alloc(dev_ctx *ctx, dev_memkind kind, size_t bytes, void **out) {
  hstate *st = ctx->bk_state;
  size_t held = ctx->mreserved[kind];
  if (bytes > st->capacity || held > st->capacity - bytes) return DEV_ERR_NOMEM;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, rounded);
  if (!p) return DEV_ERR_NOMEM;
  *out = p;
  return DEV_OK;
}

static void h_free(dev_ctx *ctx, dev_memkind kind, void *p, size_t bytes) {
  (void)ctx; (void)kind; (void)bytes;
  free(p);
}

static size_t h_mem_total(dev_ctx *ctx, dev_memkind kind) {
  (void)kind;
  return ((hstate *)ctx->bk_state)->capacity;
}

static int h_comm_open(dev_ctx *ctx, const dev_rank_info *ri) {
  char err[512];
  shm_comm *c;
  if (shm_comm_open(ri, 0, &c, err, sizeof err)) return dev_fail(ctx, DEV_ERR_DEVICE, "%s", err);
  ctx->comm = c;
  return DEV_OK;
}

static int h_comm_connect(dev_ctx *ctx, const dev_rank_info *ri) {
  shm_comm_set_options(ctx->comm, ri->check, ri->timeout_s);
  return DEV_OK;
}

static void h_comm_close(dev_ctx *ctx) {
  shm_comm_close(ctx->comm);
  ctx->comm = NULL;
}

static int h_coll(dev_stream *s, const dev_coll *c, int n, uint64_t seq) {
  int rc = legacy_order(s);
  if (rc) return rc;
  item *it = item_new();
  dev_coll *copy = malloc((size_t)n * sizeof *copy);
  if (!it || !copy) {
    item_free(it);
    free(copy);
    return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a collective");
  }
  memcpy(copy, c, (size_t)n * sizeof *copy);
  dev_group_retain(copy[0].group);
  it->kind = IT_COLL;
  it->coll = copy;
  it->ncoll = n;
  it->seq_coll = seq;
  if ((rc = push(s, it))) {
    dev_group_release(copy[0].group);
    free(copy);
  }
  return rc;
}

static void h_group_free(void *impl) { shm_comm_close(impl); }

/* A group: a shared-memory segment of its members. */
static int h_group_open(dev_ctx *ctx, dev_group *g, int color, int key) {
  (void)color; (void)key;
  if (!g) return DEV_OK;
  char err[512];
  shm_comm *c;
  if (shm_comm_open_group(&ctx->ri, g->members, g->size, g->rank, g->id, g->label, 0, &c, err, sizeof err))
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s", err);
  g->impl = c;
  g->free_impl = h_group_free;
  return DEV_OK;
}

static int h_submit(dev_stream *s, const dev_kop *op) {
  int rc = legacy_order(s);
  if (rc) return rc;
  item *it = item_new();
  if (!it) return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing an op");
  it->kind = IT_OP;
  it->op = *op;
  if (op->kind == DEV_OP_LAUNCH) {
    /* runs later: the argument values must outlive the caller's arrays */
    if (!(it->launch = dev_launch_dup(op->launch))) {
      item_free(it);
      return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a launch");
    }
    it->op.launch = it->launch;
  }
  if (op->fargs) {
    if (!(it->fargs = malloc(sizeof *it->fargs))) {
      item_free(it);
      return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a fused op");
    }
    *it->fargs = *op->fargs;
    it->op.fargs = it->fargs;
  }
  return push(s, it);
}

/* The whole staged copy is one item: its worker runs the steps in order. */
static int h_stage_copy(dev_stream *s, const dev_kop *op, dev_stage_job *j) {
  int rc = legacy_order(s);
  if (rc) return rc;
  item *it = item_new();
  if (!it) return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a copy");
  it->kind = IT_OP;
  it->op = *op;
  it->stage = j;
  dev_stage_retain(j);
  if ((rc = push(s, it))) dev_stage_release(j);
  return rc;
}

/* The timestamps of a replay's records of the script's timing events
 * (each held by the item and by its event), NULL for an event without
 * timing; *out NULL when the graph records none. */
static int graph_recs(dev_stream *s, const dev_gexec *gx, hrec ***out) {
  *out = NULL;
  if (gx->nrec == 0) return DEV_OK;
  hrec **recs = calloc((size_t)gx->nrec, sizeof *recs);
  int k = 0, ok = recs != NULL;
  for (int i = 0; ok && i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind != DEV_GN_RECORD || !gx->events[nd->event]) continue;
    if (gx->events[nd->event]->timing && (ok = (recs[k] = calloc(1, sizeof **recs)) != NULL))
      atomic_init(&recs[k]->refs, 2);
    k++;
  }
  if (!ok) {
    for (int i = 0; recs && i < gx->nrec; i++) free(recs[i]);
    free(recs);
    return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a graph replay");
  }
  *out = recs;
  return DEV_OK;
}

static int h_graph_launch(dev_stream *s, const dev_gexec *gx, uint64_t seq) {
  /* started first: then push cannot fail once the events hold the new records */
  int rc = legacy_order(s);
  if (rc == DEV_OK) rc = start(s);
  if (rc) return rc;
  item *it = item_new();
  if (!it) return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory queueing a graph replay");
  if ((rc = graph_recs(s, gx, &it->recs))) {
    item_free(it);
    return rc;
  }
  for (int i = 0, k = 0; it->recs && i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind != DEV_GN_RECORD || !gx->events[nd->event]) continue;
    dev_event *e = gx->events[nd->event];
    if (it->recs[k]) {
      rec_release(e->impl);
      e->impl = it->recs[k];
    }
    k++;
  }
  it->kind = IT_GRAPH;
  it->gx = gx;
  it->seq_coll = seq;
  return push(s, it);
}

const dev_backend dev_host_backend = {
  .name = "host",
  /* the ops run on the CPU: a loop of 1 MiB temporaries (`local u = t + 1`)
   * ran at 99-112 us per op with a young collection every 8 MiB, 135-146
   * with one every 256 MiB (2-core host, 2026-11-25) */
  .warm_bytes = (size_t)8 << 20,
  .open = h_open,
  .close = h_close,
  .device_count = h_device_count,
  .device_info = h_device_info,
  .stream_init = h_stream_init,
  .stream_fini = h_stream_fini,
  .stream_idle = h_stream_idle,
  .stream_pos = h_stream_pos,
  .pos_done = h_pos_done,
  .pos_wait = h_pos_wait,
  .pos_wait_intr = h_pos_wait_intr,
  .stream_wait = h_stream_wait,
  .event_init = h_event_init,
  .event_fini = h_event_fini,
  .event_record = h_event_record,
  .event_elapsed = h_event_elapsed,
  .alloc = h_alloc,
  .free = h_free,
  .mem_total = h_mem_total,
  .submit = h_submit,
  .stage_copy = h_stage_copy,
  .comm_open = h_comm_open,
  .comm_connect = h_comm_connect,
  .comm_close = h_comm_close,
  .coll = h_coll,
  .group_open = h_group_open,
  .check_colls = 1,
  .compile = hk_compile,
  .module_load = hk_module_load,
  .module_unload = hk_module_unload,
  .kernel_get = hk_kernel_get,
  .kernel_names = hk_kernel_names,
  .compile_only = 1,
  .graph_launch = h_graph_launch,
};
