/* Tracing: a context's record buffer, the host track (syncs, host-run ops,
 * ranges) and what the bindings read back.  The backends time the ops they
 * run (host workers around each op; cuda from events, cuda/timing.c) and
 * append here.  Off, the only cost anywhere is `if (ctx->trace_gen)`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devpriv.h"

typedef struct trange {
  uint64_t id;
  const void *owner;
  uint64_t handle;              /* the backend's (NVTX range id) */
  uint16_t depth;               /* open ranges when it opened: its row */
  unsigned gen;                 /* session it was opened in; 0: none */
  uint64_t t0;
  char name[DEV_TRACE_NAME];
  char site[DEV_SITE_LEN];
} trange;

struct dev_trace {
  pthread_mutex_t mu;           /* gen, origin, stopped, recs, n, cap, max, dropped */
  unsigned gen;                 /* the current or last session; 0 before the first */
  uint64_t origin, stopped;     /* trace clock; stopped is 0 while active */
  dev_trace_rec *recs;
  size_t n, cap, max;
  uint64_t dropped;
  /* interpreter thread only */
  dev_trace_stream *streams;
  int nstreams, capstreams;
  int sync_open;
  unsigned sync_gen;
  uint64_t sync_t0;
  const char *sync_what, *sync_call;
  char sync_site[DEV_SITE_LEN];
  trange *ranges;
  int nranges, capranges;
  uint64_t next_range;
  void *bk;                     /* the backend's timing state */
};

static void copy_str(char *dst, size_t size, const char *src) {
  size_t n = src ? strnlen(src, size - 1) : 0;
  memcpy(dst, src ? src : "", n);
  dst[n] = 0;
}

uint64_t dev_trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct dev_trace *get_tr(dev_ctx *ctx) {
  if (ctx->tr) return ctx->tr;
  struct dev_trace *tr = calloc(1, sizeof *tr);
  if (!tr) return NULL;
  pthread_mutex_init(&tr->mu, NULL);
  ctx->tr = tr;
  return tr;
}

void **dev_trace_backend_state(dev_ctx *ctx) {
  struct dev_trace *tr = get_tr(ctx);
  return tr ? &tr->bk : NULL;
}

void dev_trace_free(dev_ctx *ctx) {
  struct dev_trace *tr = ctx->tr;
  if (!tr) return;
  if (ctx->bk->trace_free) ctx->bk->trace_free(ctx);
  ctx->trace_gen = 0;
  pthread_mutex_destroy(&tr->mu);
  free(tr->recs);
  free(tr->streams);
  free(tr->ranges);
  free(tr);
  ctx->tr = NULL;
}

/* ---- records -------------------------------------------------------- */

static int host_side(const dev_buf *b) { return b->kind != DEV_MEM_DEVICE; }

static uint64_t view_bytes(const dev_view *v) {
  return (uint64_t)dev_view_numel(v) * dev_dtype_size(v->dtype);
}

void dev_trace_fill_op(dev_trace_rec *r, const dev_kop *op, int64_t stream) {
  memset(r, 0, sizeof *r);
  r->kind = DEV_TR_OP;
  r->cls = DEV_TR_COMPUTE;
  r->stream = stream;
  const char *name = dev_op_name(op);
  if (op->kind == DEV_OP_COPY) {
    static const char *const names[] = {"copy", "copy H2D", "copy D2H", "copy D2D", "copy H2H"};
    int hd = host_side(op->out.buf), hs = host_side(op->in[0].buf);
    r->cls = hs ? (hd ? DEV_TR_H2H : DEV_TR_H2D) : (hd ? DEV_TR_D2H : DEV_TR_D2D);
    r->bytes = view_bytes(&op->out);
    name = names[r->cls];
  } else if (op->kind == DEV_OP_UNARY && op->code == DEV_UN_COPY) {
    name = "cast";
    r->bytes = view_bytes(&op->out);
  } else if (op->kind != DEV_OP_SLEEP && op->kind != DEV_OP_LAUNCH) {
    for (int j = 0; j < dev_kop_nout(op); j++) r->bytes += view_bytes(dev_kop_out(op, j));
  }
  copy_str(r->name, sizeof r->name, name);
}

void dev_trace_fill_coll(dev_trace_rec *r, const dev_coll *c, int n, int64_t stream) {
  memset(r, 0, sizeof *r);
  r->kind = DEV_TR_COLL;
  r->cls = DEV_TR_COMPUTE;
  r->stream = stream;
  for (int i = 0; i < n; i++)
    r->bytes += view_bytes(c[i].kind == DEV_COLL_RECV ? &c[i].recv : &c[i].send);
  copy_str(r->name, sizeof r->name, n > 1 ? "group" : dev_coll_name(c[0].kind));
}

void dev_trace_add(dev_ctx *ctx, unsigned gen, dev_trace_rec *r, uint64_t t0, uint64_t t1) {
  struct dev_trace *tr = ctx->tr;
  if (!tr || !gen) return;
  pthread_mutex_lock(&tr->mu);
  if (gen != tr->gen) goto out;
  if (tr->n >= tr->max) {
    tr->dropped++;
    goto out;
  }
  if (tr->n == tr->cap) {
    size_t cap = tr->cap ? 2 * tr->cap : 256;
    if (cap > tr->max) cap = tr->max;
    dev_trace_rec *nr = cap > tr->cap ? realloc(tr->recs, cap * sizeof *nr) : NULL;
    if (!nr) {
      tr->dropped++;
      goto out;
    }
    tr->recs = nr;
    tr->cap = cap;
  }
  r->t0 = (int64_t)(t0 - tr->origin);
  r->t1 = (int64_t)(t1 - tr->origin);
  tr->recs[tr->n++] = *r;
out:
  pthread_mutex_unlock(&tr->mu);
}

void dev_trace_note_stream(dev_ctx *ctx, dev_stream *s) {
  struct dev_trace *tr = ctx->tr;
  for (int i = 0; i < tr->nstreams; i++)
    if (tr->streams[i].id == (int64_t)s->id) return;
  if (tr->nstreams == tr->capstreams) {
    int cap = tr->capstreams ? 2 * tr->capstreams : 8;
    dev_trace_stream *ns = realloc(tr->streams, (size_t)cap * sizeof *ns);
    if (!ns) return;   /* the writers name a stream they were not told about */
    tr->streams = ns;
    tr->capstreams = cap;
  }
  tr->streams[tr->nstreams++] = (dev_trace_stream){(int64_t)s->id, s->priority, s->nonblocking,
                                                   s->is_default};
}

void dev_trace_host_op(dev_ctx *ctx, const dev_kop *op, uint64_t t0) {
  dev_trace_rec r;
  dev_trace_fill_op(&r, op, -1);
  r.kind = DEV_TR_HOST_OP;
  copy_str(r.site, sizeof r.site, ctx->site);
  dev_trace_add(ctx, ctx->trace_gen, &r, t0, dev_trace_now());
}

/* ---- syncs ------------------------------------------------------------ */

void dev_trace_sync_open(dev_ctx *ctx, const char *what) {
  struct dev_trace *tr = ctx->tr;
  /* One still open was refused or failed before its wait: not a span. */
  tr->sync_open = 1;
  tr->sync_gen = ctx->trace_gen;
  tr->sync_what = what;
  tr->sync_call = ctx->call;
  copy_str(tr->sync_site, sizeof tr->sync_site, ctx->site);
  tr->sync_t0 = dev_trace_now();
}

void dev_sync_abandon(dev_ctx *ctx) {
  ctx->st.syncs--;
  if (ctx->tr) ctx->tr->sync_open = 0;
}

void dev_sync_leave(dev_ctx *ctx) {
  struct dev_trace *tr = ctx->tr;
  if (!tr || !tr->sync_open) return;
  tr->sync_open = 0;
  dev_trace_rec r;
  memset(&r, 0, sizeof r);
  r.kind = DEV_TR_SYNC;
  r.stream = -1;
  r.call = tr->sync_call;
  copy_str(r.name, sizeof r.name, tr->sync_what);
  memcpy(r.site, tr->sync_site, sizeof r.site);
  dev_trace_add(ctx, tr->sync_gen, &r, tr->sync_t0, dev_trace_now());
}

/* ---- sessions --------------------------------------------------------- */

int dev_trace_start(dev_ctx *ctx, size_t max_records) {
  if (ctx->trace_gen) return dev_fail(ctx, DEV_ERR_INVALID, "tracing is already on");
  struct dev_trace *tr = get_tr(ctx);
  if (!tr) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory starting a trace");
  pthread_mutex_lock(&tr->mu);
  if (++tr->gen == 0) tr->gen = 1;
  tr->n = 0;
  tr->dropped = 0;
  tr->max = max_records ? max_records : DEV_TRACE_DEFAULT_MAX;
  tr->origin = dev_trace_now();
  tr->stopped = 0;
  pthread_mutex_unlock(&tr->mu);
  tr->nstreams = 0;
  tr->sync_open = 0;
  /* the backend's reference belongs to the new session */
  ctx->trace_gen = tr->gen;
  int rc = ctx->bk->trace_start ? ctx->bk->trace_start(ctx) : DEV_OK;
  if (rc) {
    ctx->trace_gen = 0;
    pthread_mutex_lock(&tr->mu);
    tr->stopped = dev_trace_now();
    pthread_mutex_unlock(&tr->mu);
  }
  return rc;
}

void dev_trace_stop(dev_ctx *ctx) {
  if (!ctx->trace_gen) return;
  ctx->trace_gen = 0;
  pthread_mutex_lock(&ctx->tr->mu);
  ctx->tr->stopped = dev_trace_now();
  pthread_mutex_unlock(&ctx->tr->mu);
}

int dev_trace_active(dev_ctx *ctx) { return ctx->trace_gen != 0; }

static int rec_cmp(const void *a, const void *b) {
  const dev_trace_rec *x = a, *y = b;
  if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
  if (x->stream != y->stream) return x->stream < y->stream ? -1 : 1;
  if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1;   /* the enclosing span first */
  return x->depth < y->depth ? -1 : x->depth > y->depth;
}

int dev_trace_collect(dev_ctx *ctx, int counted) {
  int rc = DEV_OK;
  if (counted) {
    rc = dev_synchronize(ctx);
  } else {
    for (dev_stream *s = ctx->streams; s; s = s->next) ctx->bk->pos_wait(s, ctx->bk->stream_pos(s));
  }
  struct dev_trace *tr = ctx->tr;
  if (!tr) return rc;
  if (ctx->bk->trace_flush) ctx->bk->trace_flush(ctx);
  pthread_mutex_lock(&tr->mu);
  /* no records: recs may be NULL, which qsort must not be given */
  if (tr->n > 1) qsort(tr->recs, tr->n, sizeof *tr->recs, rec_cmp);
  pthread_mutex_unlock(&tr->mu);
  return rc;
}

void dev_trace_get_info(dev_ctx *ctx, dev_trace_info *out) {
  memset(out, 0, sizeof *out);
  struct dev_trace *tr = ctx->tr;
  out->active = ctx->trace_gen != 0;
  if (!tr) return;
  pthread_mutex_lock(&tr->mu);
  out->records = tr->n;
  out->max = tr->max;
  out->dropped = tr->dropped;
  /* to the stop, or to the end of the last op enqueued before it */
  if (tr->gen) out->duration = (int64_t)((tr->stopped ? tr->stopped : dev_trace_now()) - tr->origin);
  for (size_t i = 0; i < tr->n; i++)
    if (tr->recs[i].t1 > out->duration) out->duration = tr->recs[i].t1;
  pthread_mutex_unlock(&tr->mu);
  out->nstreams = tr->nstreams;
}

size_t dev_trace_copy(dev_ctx *ctx, size_t first, size_t n, dev_trace_rec *out) {
  struct dev_trace *tr = ctx->tr;
  if (!tr) return 0;
  pthread_mutex_lock(&tr->mu);
  if (first >= tr->n) n = 0;
  else if (n > tr->n - first) n = tr->n - first;
  if (n) memcpy(out, tr->recs + first, n * sizeof *out);
  pthread_mutex_unlock(&tr->mu);
  return n;
}

int dev_trace_stream_at(dev_ctx *ctx, int i, dev_trace_stream *out) {
  struct dev_trace *tr = ctx->tr;
  if (!tr || i < 0 || i >= tr->nstreams)
    return dev_fail(ctx, DEV_ERR_INVALID, "trace stream %d out of range", i);
  *out = tr->streams[i];
  return DEV_OK;
}

/* ---- ranges ----------------------------------------------------------- */

int dev_range_push(dev_ctx *ctx, const char *name, const void *owner, uint64_t *id) {
  struct dev_trace *tr = get_tr(ctx);
  if (!tr) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory opening a range");
  if (tr->nranges == tr->capranges) {
    int cap = tr->capranges ? 2 * tr->capranges : 8;
    trange *nr = realloc(tr->ranges, (size_t)cap * sizeof *nr);
    if (!nr) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory opening a range");
    tr->ranges = nr;
    tr->capranges = cap;
  }
  trange *r = &tr->ranges[tr->nranges];
  r->id = ++tr->next_range;
  r->owner = owner;
  r->depth = (uint16_t)(tr->nranges < 65535 ? tr->nranges : 65535);
  tr->nranges++;
  r->gen = ctx->trace_gen;
  copy_str(r->name, sizeof r->name, name);
  copy_str(r->site, sizeof r->site, ctx->site);
  r->handle = ctx->bk->range_start ? ctx->bk->range_start(ctx, name) : 0;
  r->t0 = dev_trace_now();
  *id = r->id;
  return DEV_OK;
}

/* "'name' (opened at script.lua:3)" */
static void describe_range(char *out, size_t len, const trange *r) {
  if (*r->site) snprintf(out, len, "'%s' (opened at %s)", r->name, r->site);
  else snprintf(out, len, "'%s'", r->name);
}

int dev_range_pop(dev_ctx *ctx, uint64_t id, int force) {
  struct dev_trace *tr = ctx->tr;
  int i = tr ? tr->nranges - 1 : -1;
  while (i >= 0 && tr->ranges[i].id != id) i--;
  if (i < 0) return DEV_OK;
  const void *owner = tr->ranges[i].owner;
  int inner = tr->nranges - 1;   /* the owner's innermost */
  while (tr->ranges[inner].owner != owner) inner--;
  if (inner != i && !force) {
    char a[DEV_TRACE_NAME + DEV_SITE_LEN + 20], b[sizeof a];
    describe_range(a, sizeof a, &tr->ranges[i]);
    describe_range(b, sizeof b, &tr->ranges[inner]);
    return dev_fail(ctx, DEV_ERR_INVALID, "range %s is closed while %s is still open: ranges nest, "
                    "close the inner one first", a, b);
  }
  uint64_t t1 = dev_trace_now();
  int k = i;
  for (int j = i; j < tr->nranges; j++) {
    trange *r = &tr->ranges[j];
    if (r->owner != owner) {   /* another owner's: stays open */
      tr->ranges[k++] = *r;
      continue;
    }
    if (ctx->bk->range_end) ctx->bk->range_end(ctx, r->handle);
    if (!r->gen) continue;
    dev_trace_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.kind = DEV_TR_RANGE;
    rec.stream = -1;
    rec.depth = r->depth;
    memcpy(rec.name, r->name, sizeof rec.name);
    memcpy(rec.site, r->site, sizeof rec.site);
    dev_trace_add(ctx, r->gen, &rec, r->t0, t1);
  }
  tr->nranges = k;
  return DEV_OK;
}
