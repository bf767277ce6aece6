/* Streams, events, watches and completions.  A stream's references and its
 * end (dev_stream_release, the lingering and released lists) are in
 * dev_buf.c, with the buffer uses that hold most of them.
 *
 * - s->refs counts the handle, the events whose last record is on s, the
 *   watches on s, and the buffers' use and fence entries naming s.  The
 *   default stream is counted but never released.
 * - A closed stream (its handle released) takes no new work: every call
 *   that enqueues on a stream tests check_open first.
 * - The counted syncs here (stream, event and device synchronize) enter the
 *   sync policy before they wait (interruptibly), leave it after, then
 *   sweep.  dev_synchronize also prunes every live buffer and settles the
 *   cache: after it no use or fence names finished work.
 * - Completions: dev_progress_signal (any thread) moves progress_gen, and
 *   only when someone sleeps; a waiter counts itself (dev_progress_begin)
 *   before it tests its watches, so no wakeup is lost.  dev_progress_wait
 *   ends the sleep itself.  A watch holds the context, and its stream unless
 *   it was done when made; once done it stays done.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "devpriv.h"
#include "bufx.h"
#include "capture.h"
#include "race.h"

/* ---- streams and events --------------------------------------------- */

int dev_stream_new(dev_ctx *ctx, int priority, int nonblocking, int is_default,
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

dev_stream *dev_default_stream(dev_ctx *ctx) { return ctx->dflt; }

int dev_stream_create(dev_ctx *ctx, int priority, int nonblocking, dev_stream **out) {
  dev_sweep(ctx);
  int rc = dev_stream_new(ctx, priority, nonblocking, 0, NULL, out);
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
  dev_sweep(ctx);
  int rc = dev_stream_new(ctx, DEV_PRIO_NORMAL, 0, 0, native, out);
  if (rc) return rc;
  ctx->st.streams++;
  dev_ctx_retain(ctx);
  return DEV_OK;
}

void *dev_stream_native(dev_stream *s) {
  return s->ctx->bk->stream_native ? s->ctx->bk->stream_native(s) : NULL;
}

void dev_stream_retain(dev_stream *s) { s->refs++; }

int dev_stream_synchronize(dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  int rc = dev_sync_enter(ctx, "stream synchronize");
  if (rc) return rc;
  rc = dev_sync_wait(ctx, s, ctx->bk->stream_pos(s));
  if (rc) { dev_sync_leave(ctx); return rc; }
  if (ctx->race) race_host_waited(ctx, s, NULL);
  dev_sync_leave(ctx);
  dev_sweep(ctx);
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
  if (s->ctx->capture) return graph_wait(s, other, NULL);
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
  e->refs = 1;
  e->timing = timing;
  int rc = ctx->bk->event_init(e);
  if (rc) { free(e); return rc; }
  ctx->st.events++;
  dev_ctx_retain(ctx);
  *out = e;
  return DEV_OK;
}

void dev_event_retain(dev_event *e) { e->refs++; }

void dev_event_release(dev_event *e) {
  if (!e || --e->refs > 0) return;
  dev_ctx *ctx = e->ctx;
  ctx->bk->event_fini(e);
  if (e->race) race_event_gone(e);
  if (e->stream) dev_stream_unref(e->stream);
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
  if (ctx->capture) return graph_record(e, s);
  rc = ctx->bk->event_record(e, s);
  if (rc) return rc;
  event_mark(e, s, e->pos);
  return DEV_OK;
}

void event_mark(dev_event *e, dev_stream *s, uint64_t pos) {
  dev_stream *old = e->stream;
  s->refs++;
  e->stream = s;
  e->pos = pos;
  e->recorded = 1;
  if (old) dev_stream_unref(old);
  if (s->ctx->race) race_record(e, s);
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
    int rc = ctx->bk->event_sync ? dev_intr_check(ctx, ctx->bk->event_sync(e)) : dev_sync_wait(ctx, e->stream, e->pos);
    if (rc) { dev_sync_leave(ctx); return rc; }
    if (ctx->race) race_host_waited(ctx, NULL, e);
  }
  dev_sync_leave(ctx);
  dev_sweep(ctx);
  return dev_check_async(ctx);
}

int dev_event_recorded(dev_event *e) { return e->recorded; }
int dev_event_timing(dev_event *e) { return e->timing; }

int dev_stream_wait_event(dev_stream *s, dev_event *e) {
  int rc = check_open(s);
  if (rc == DEV_OK && s->ctx->capture) return graph_wait(s, NULL, e);
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
    int rc = dev_sync_wait(ctx, s, ctx->bk->stream_pos(s));
    if (rc) { dev_sync_leave(ctx); return rc; }
  }
  if (ctx->race) race_host_waited(ctx, NULL, NULL);
  dev_sync_leave(ctx);
  for (bufx *x = ctx->bufs; x; x = x->next) prune(x);
  dev_cache_settle(ctx, -1);
  dev_sweep_all(ctx);
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
  if (w->s) dev_stream_unref(w->s);
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
    dev_intr_check(ctx, DEV_ERR_INTERRUPTED);
    return -1;
  }
  return moved;
}
