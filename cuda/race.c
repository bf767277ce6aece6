/* The stream race checker (GPULUA_CHECK=races, gpulua --check races,
 * gpu.check_races): before an op is enqueued, each buffer it reads or writes
 * is compared with the accesses that streams made to the same allocation
 * since its last write; one that is not ordered before the op is a race.
 *
 * Order is happens-before, with vector clocks.  Each stream holds a slot;
 * its clock in the slot is base + its backend position, so the op at
 * position p has clock base + p.  A stream's vector says, per slot, up to
 * which clock that stream's work is ordered before the stream's next item.
 * It grows by joins: the host's knowledge at every enqueue (work the host
 * waited for is done before anything it enqueues later), CUDA's legacy
 * default-stream rule (the default stream joins every blocking stream and
 * they join it), s:wait(ev) (the clock the record captured) and
 * s:wait(other).  The host's vector grows when it waits: synchronize, a
 * query that says done, dev_read, the pageable-copy wait, host-access
 * fences.  A fence or dev_read's wait is for an old op of a stream, so each
 * stream keeps an undo log of its joins, to rebuild its vector as it was at
 * any position.  Host accesses (ops that run on the calling thread after
 * fences) are ordered by the fences and by program order, so they are not
 * recorded.  A stream that is destroyed is done: the host joins its last
 * vector and its slot goes to the next new stream (clocks continue).
 * The checks join nothing: an op is checked against what its stream would
 * know after the joins, which are made only once the op passed, so that a
 * refused op leaves no ordering behind that no queued item stands for.
 *
 * Everything here runs on the interpreter thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devpriv.h"
#include "race.h"

#define OPLEN 40          /* op names in records (kernel names are cut) */
#define LOG_MAX 8192      /* undo entries per stream before the oldest go */

typedef struct vclock { uint64_t *c; uint32_t n; } vclock;   /* n: length, zero-filled */

typedef struct undo { uint64_t after, old; uint32_t slot; } undo;

struct race_stream {
  unsigned gen;
  uint32_t slot;
  uint64_t base;            /* the slot's clock when this stream took it */
  vclock vc;                /* the own slot is set on use (cur) */
  uint64_t ver;             /* bumped when vc gains something */
  uint64_t host_ver;        /* the host's version last joined */
  uint64_t dflt_seen;       /* blocking stream: the default stream's stamp last joined */
  uint64_t seen_by_dflt;    /* blocking stream: own stamp the default stream last joined */
  undo *log;                /* joins, oldest first: entries [lo, nlog) */
  size_t lo, nlog, cap;
  uint64_t cut;             /* entries with after <= cut were dropped: older states unknown */
};

struct race_event { unsigned gen; vclock vc; };

/* One access: which op of which stream, at what clock. */
typedef struct racc {
  uint64_t clock, sid;
  uint32_t slot;
  unsigned char is_default, nonblocking;
  char op[OPLEN];
  char site[DEV_SITE_LEN];
} racc;

struct race_buf {
  unsigned gen;
  int has_w;
  racc w;                 /* the last write */
  racc *r;                /* reads since, the last per slot */
  int nr, cap;
};

typedef struct slot { dev_stream *s; uint64_t top; } slot;

struct race_ctx {
  vclock host;              /* work the host knows to be done */
  uint64_t host_ver;
  slot *slots;
  uint32_t nslots, cap;
  vclock tmp;               /* a stream's vector at an old position */
};

/* ---- vectors ---------------------------------------------------------- */

static int vc_grow(vclock *v, uint32_t n) {
  if (n <= v->n) return 0;
  uint32_t cap = v->n ? v->n : 8;
  while (cap < n) cap *= 2;
  uint64_t *c = realloc(v->c, (size_t)cap * sizeof *c);
  if (!c) return -1;
  memset(c + v->n, 0, (size_t)(cap - v->n) * sizeof *c);
  v->c = c;
  v->n = cap;
  return 0;
}

static uint64_t vc_get(const vclock *v, uint32_t i) { return i < v->n ? v->c[i] : 0; }

/* Out of memory in a join only loses knowledge: more reports, never fewer. */
static void join_host(struct race_ctx *rc, const vclock *src) {
  if (vc_grow(&rc->host, src->n)) return;
  int changed = 0;
  for (uint32_t i = 0; i < src->n; i++)
    if (src->c[i] > rc->host.c[i]) { rc->host.c[i] = src->c[i]; changed = 1; }
  if (changed) rc->host_ver++;
}

static int live(const dev_ctx *ctx, const dev_stream *s) {
  return s->race && s->race->gen == ctx->race_gen;
}

static const vclock *cur(dev_stream *s) {
  struct race_stream *rs = s->race;
  rs->vc.c[rs->slot] = rs->base + s->ctx->bk->stream_pos(s);
  return &rs->vc;
}

/* Changes whenever the stream's vector or position does. */
static uint64_t stamp(dev_stream *s) { return s->race->ver + s->ctx->bk->stream_pos(s); }

static void log_add(struct race_ctx *rc, struct race_stream *rs, uint64_t after, uint32_t i, uint64_t old) {
  /* Entries the host already knows are never undone: whoever looks a state
   * up knows at least what the host knows, so looks up a later one. */
  uint64_t known = vc_get(&rc->host, rs->slot);
  known = known > rs->base ? known - rs->base : 0;
  while (rs->lo < rs->nlog && rs->log[rs->lo].after <= known) rs->lo++;
  if (rs->nlog == rs->cap) {
    if (rs->lo == 0 && rs->cap >= LOG_MAX) {
      rs->lo = rs->cap / 2;
      rs->cut = rs->log[rs->lo - 1].after;
    }
    if (rs->lo > 0) {
      memmove(rs->log, rs->log + rs->lo, (rs->nlog - rs->lo) * sizeof *rs->log);
      rs->nlog -= rs->lo;
      rs->lo = 0;
    } else {
      size_t cap = rs->cap ? 2 * rs->cap : 16;
      undo *l = realloc(rs->log, cap * sizeof *l);
      if (!l) {   /* forget every older state */
        rs->cut = after;
        rs->lo = rs->nlog = 0;
        return;
      }
      rs->log = l;
      rs->cap = cap;
    }
  }
  rs->log[rs->nlog++] = (undo){after, old, i};
}

/* s's items after position `after` are ordered after src. */
static void join_stream(struct race_ctx *rc, dev_stream *s, const vclock *src, uint64_t after) {
  struct race_stream *rs = s->race;
  if (vc_grow(&rs->vc, src->n)) return;
  int changed = 0;
  for (uint32_t i = 0; i < src->n; i++) {
    if (i == rs->slot || src->c[i] <= rs->vc.c[i]) continue;
    log_add(rc, rs, after, i, rs->vc.c[i]);
    rs->vc.c[i] = src->c[i];
    changed = 1;
  }
  if (changed) rs->ver++;
}

/* s's vector as it was for its item at position p (in rc->tmp). */
static const vclock *vc_at(struct race_ctx *rc, dev_stream *s, uint64_t p) {
  struct race_stream *rs = s->race;
  vclock *t = &rc->tmp;
  if (vc_grow(t, rs->vc.n)) return NULL;
  memset(t->c, 0, (size_t)t->n * sizeof *t->c);
  if (p > rs->cut) {
    memcpy(t->c, rs->vc.c, (size_t)rs->vc.n * sizeof *t->c);
    for (size_t j = rs->nlog; j > rs->lo && rs->log[j - 1].after >= p; j--)
      t->c[rs->log[j - 1].slot] = rs->log[j - 1].old;
  }
  t->c[rs->slot] = rs->base + p;
  return t;
}

/* The vector of the stream that made access a, as it was then; NULL when
 * everyone knows it already (its stream is gone). */
static const vclock *vc_of(dev_ctx *ctx, const racc *a) {
  struct race_ctx *rc = ctx->race;
  if (a->slot >= rc->nslots) return NULL;
  dev_stream *s = rc->slots[a->slot].s;
  if (!s || !live(ctx, s) || a->clock <= s->race->base) return NULL;
  return vc_at(rc, s, a->clock - s->race->base);
}

/* ---- per-object state ------------------------------------------------- */

static void stream_free(struct race_stream *rs) {
  free(rs->vc.c);
  free(rs->log);
  free(rs);
}

/* s's state, made (with a slot) on first use; NULL when out of memory. */
static struct race_stream *stream_state(dev_ctx *ctx, dev_stream *s) {
  if (live(ctx, s)) return s->race;
  struct race_ctx *rc = ctx->race;
  if (s->race) { stream_free(s->race); s->race = NULL; }
  uint32_t k = 0;
  while (k < rc->nslots && rc->slots[k].s) k++;
  if (k == rc->cap) {
    uint32_t cap = rc->cap ? 2 * rc->cap : 8;
    slot *sl = realloc(rc->slots, cap * sizeof *sl);
    if (!sl) return NULL;
    rc->slots = sl;
    rc->cap = cap;
  }
  struct race_stream *rs = calloc(1, sizeof *rs);
  if (!rs || vc_grow(&rs->vc, k + 1)) { free(rs); return NULL; }
  if (k == rc->nslots) rc->slots[rc->nslots++] = (slot){NULL, 0};
  rc->slots[k].s = s;
  rs->gen = ctx->race_gen;
  rs->slot = k;
  rs->base = rc->slots[k].top;
  rs->host_ver = (uint64_t)-1;
  rs->dflt_seen = rs->seen_by_dflt = (uint64_t)-1;
  s->race = rs;
  return rs;
}

static struct race_buf *buf_state(dev_ctx *ctx, dev_buf *b, int make) {
  struct race_buf **p = dev_buf_racep(b), *rb = *p;
  if (rb && rb->gen == ctx->race_gen) return rb;
  if (rb) {   /* from an earlier time the checker was on */
    rb->has_w = 0;
    rb->nr = 0;
    rb->gen = ctx->race_gen;
    return rb;
  }
  if (!make) return NULL;
  rb = calloc(1, sizeof *rb);
  if (!rb) return NULL;
  rb->gen = ctx->race_gen;
  *p = rb;
  return rb;
}

/* Everything s's items after position `after` (its next item, or the op
 * just enqueued) are ordered after: the host's knowledge, and CUDA's legacy
 * default stream in both directions. */
static struct race_stream *item_after(dev_ctx *ctx, dev_stream *s, uint64_t after) {
  struct race_ctx *rc = ctx->race;
  struct race_stream *rs = stream_state(ctx, s);
  if (!rs) return NULL;
  if (rs->host_ver != rc->host_ver) {
    join_stream(rc, s, &rc->host, after);
    rs->host_ver = rc->host_ver;
  }
  if (s->nonblocking) return rs;
  if (s->is_default) {
    for (dev_stream *u = ctx->streams; u; u = u->next) {
      if (u == s || u->nonblocking || !live(ctx, u)) continue;
      uint64_t st = stamp(u);
      if (st == u->race->seen_by_dflt) continue;
      join_stream(rc, s, cur(u), after);
      u->race->seen_by_dflt = st;
    }
  } else if (live(ctx, ctx->dflt)) {
    uint64_t st = stamp(ctx->dflt);
    if (st != rs->dflt_seen) {
      join_stream(rc, s, cur(ctx->dflt), after);
      rs->dflt_seen = stamp(ctx->dflt);
    }
  }
  return rs;
}

static struct race_stream *item(dev_ctx *ctx, dev_stream *s) {
  return item_after(ctx, s, ctx->bk->stream_pos(s));
}

/* ---- checks ----------------------------------------------------------- */

static void stream_name(char *out, size_t len, uint64_t id, int is_default, int nonblocking) {
  if (is_default) snprintf(out, len, "the default stream");
  else snprintf(out, len, "%sstream %llu", nonblocking ? "nonblocking " : "", (unsigned long long)id);
}

static int report(dev_ctx *ctx, dev_stream *s, const char *op, int write, const dev_buf *b,
                  const racc *a, int a_write) {
  char me[48], them[48], site[DEV_SITE_LEN + 4] = "", asite[DEV_SITE_LEN + 4] = "";
  stream_name(me, sizeof me, s->id, s->is_default, s->nonblocking);
  stream_name(them, sizeof them, a->sid, a->is_default, a->nonblocking);
  if (*ctx->site) snprintf(site, sizeof site, " (%s)", ctx->site);
  if (*a->site) snprintf(asite, sizeof asite, " (%s)", a->site);
  int legacy = (s->is_default && a->nonblocking) || (s->nonblocking && a->is_default);
  return dev_fail(ctx, DEV_ERR_RACE,
                  "race: '%s' on %s%s %s a %s buffer that '%s' on %s%s %s, with no event or wait "
                  "ordering them (record an event after the '%s' and make %s wait for it, "
                  "s:wait(ev), before the '%s'%s)",
                  op, me, site, write ? "writes" : "reads", dev_memkind_name(b->kind), a->op, them,
                  asite, a_write ? (write ? "also writes" : "writes") : "reads", a->op, me, op,
                  legacy ? "; a nonblocking stream is not ordered with the default stream" : "");
}

/* Whether s's next item is ordered after clock c of slot k: the join that
 * item() would make, without making it; the op makes it once enqueued, so
 * that a refused op leaves s's clock as it was (no item stands for it). */
static int known(dev_ctx *ctx, dev_stream *s, uint32_t k, uint64_t c) {
  if ((live(ctx, s) && vc_get(cur(s), k) >= c) || vc_get(&ctx->race->host, k) >= c) return 1;
  if (s->nonblocking) return 0;
  if (!s->is_default) return live(ctx, ctx->dflt) && vc_get(cur(ctx->dflt), k) >= c;
  for (dev_stream *u = ctx->streams; u; u = u->next)
    if (u != s && !u->nonblocking && live(ctx, u) && vc_get(cur(u), k) >= c) return 1;
  return 0;
}

static int check(dev_ctx *ctx, dev_stream *s, dev_buf *b, int write, const char *op) {
  struct race_buf *rb = buf_state(ctx, b, 0);
  if (!rb) return DEV_OK;
  if (rb->has_w && !known(ctx, s, rb->w.slot, rb->w.clock)) return report(ctx, s, op, write, b, &rb->w, 1);
  if (write)
    for (int i = 0; i < rb->nr; i++)
      if (!known(ctx, s, rb->r[i].slot, rb->r[i].clock)) return report(ctx, s, op, write, b, &rb->r[i], 0);
  return DEV_OK;
}

/* The access of s's item at position pos. */
static void note(dev_ctx *ctx, dev_stream *s, dev_buf *b, int write, const char *op, uint64_t pos) {
  struct race_buf *rb = buf_state(ctx, b, 1);
  if (!rb) return;   /* out of memory: this access goes unrecorded */
  struct race_stream *rs = s->race;
  racc *a = NULL;
  if (write) {
    rb->has_w = 1;
    rb->nr = 0;
    a = &rb->w;
  } else {
    for (int i = 0; i < rb->nr && !a; i++)
      if (rb->r[i].slot == rs->slot) a = &rb->r[i];
    if (!a) {
      if (rb->nr == rb->cap) {
        int cap = rb->cap ? 2 * rb->cap : 2;
        racc *r = realloc(rb->r, (size_t)cap * sizeof *r);
        if (!r) return;
        rb->r = r;
        rb->cap = cap;
      }
      a = &rb->r[rb->nr++];
    }
  }
  a->clock = rs->base + pos;
  a->sid = s->id;
  a->slot = rs->slot;
  a->is_default = (unsigned char)s->is_default;
  a->nonblocking = (unsigned char)s->nonblocking;
  snprintf(a->op, sizeof a->op, "%s", op);
  memcpy(a->site, ctx->site, sizeof a->site);
}

/* One access of an op: checked (commit 0) or recorded at position pos
 * (commit 1; reads in pass 0, writes in pass 1, so that a write clears the
 * op's own reads). */
static int one(dev_ctx *ctx, dev_stream *s, dev_buf *b, int write, const char *op, int commit, int pass,
               uint64_t pos) {
  if (!commit) return check(ctx, s, b, write, op);
  if (pass == write) note(ctx, s, b, write, op, pos);
  return DEV_OK;
}

/* The item just enqueued at position pos (the stream's now, or one of a
 * replay's): the joins that the checks assumed, made for it and later
 * items.  Out of memory: false, and its accesses go unrecorded. */
static int enqueued(dev_ctx *ctx, dev_stream *s, uint64_t pos) {
  return item_after(ctx, s, pos - 1) != NULL;
}

static int op_at(dev_ctx *ctx, dev_stream *s, const dev_kop *op, int commit, uint64_t pos) {
  if (commit && !enqueued(ctx, s, pos)) return DEV_OK;
  const char *name = dev_op_name(op);
  int rc;
  for (int pass = 0; pass < 1 + commit; pass++) {
    if (op->kind == DEV_OP_LAUNCH) {
      const dev_launch *l = op->launch;
      for (int i = 0; i < l->nbufs; i++)
        if ((rc = one(ctx, s, l->bufs[i], l->writes[i] != 0, name, commit, pass, pos))) return rc;
    } else if (op->kind != DEV_OP_SLEEP) {
      for (int i = 0; i < op->nin; i++)
        if ((rc = one(ctx, s, dev_kop_in(op, i)->buf, 0, name, commit, pass, pos))) return rc;
      for (int j = 0; j < dev_kop_nout(op); j++)
        if ((rc = one(ctx, s, dev_kop_out(op, j)->buf, 1, name, commit, pass, pos))) return rc;
    }
  }
  return DEV_OK;
}

static int coll_at(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n, int commit, uint64_t pos) {
  if (commit && !enqueued(ctx, s, pos)) return DEV_OK;
  const char *name = n > 1 ? "group" : dev_coll_name(c->kind);
  int rc;
  for (int pass = 0; pass < 1 + commit; pass++)
    for (int i = 0; i < n; i++) {
      if (c[i].kind != DEV_COLL_RECV && (rc = one(ctx, s, c[i].send.buf, 0, name, commit, pass, pos)))
        return rc;
      if (c[i].kind != DEV_COLL_SEND && (rc = one(ctx, s, c[i].recv.buf, 1, name, commit, pass, pos)))
        return rc;
    }
  return DEV_OK;
}

int race_op(dev_ctx *ctx, dev_stream *s, const dev_kop *op, int commit) {
  return op_at(ctx, s, op, commit, ctx->bk->stream_pos(s));
}

int race_coll(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n, int commit) {
  return coll_at(ctx, s, c, n, commit, ctx->bk->stream_pos(s));
}

void race_op_at(dev_ctx *ctx, dev_stream *s, const dev_kop *op, uint64_t pos) { op_at(ctx, s, op, 1, pos); }

void race_coll_at(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n, uint64_t pos) {
  coll_at(ctx, s, c, n, 1, pos);
}

/* ---- order ------------------------------------------------------------ */

void race_wait(dev_stream *s, dev_stream *other, dev_event *e) {
  dev_ctx *ctx = s->ctx;
  if (!item(ctx, s)) return;
  uint64_t after = ctx->bk->stream_pos(s);
  if (other && live(ctx, other)) join_stream(ctx->race, s, cur(other), after);
  if (e && e->race && e->race->gen == ctx->race_gen) join_stream(ctx->race, s, &e->race->vc, after);
}

void race_record(dev_event *e, dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  struct race_event *re = e->race;
  if (!re && !(re = e->race = calloc(1, sizeof *re))) return;
  re->gen = ctx->race_gen;
  if (re->vc.c) memset(re->vc.c, 0, (size_t)re->vc.n * sizeof *re->vc.c);
  struct race_stream *rs = item(ctx, s);
  /* out of memory: an empty clock, so waiting on the event orders nothing */
  if (!rs || vc_grow(&re->vc, rs->vc.n)) return;
  memcpy(re->vc.c, cur(s)->c, (size_t)rs->vc.n * sizeof *re->vc.c);
  re->vc.c[rs->slot] = rs->base + e->pos;
}

void race_host_waited(dev_ctx *ctx, dev_stream *s, dev_event *e) {
  struct race_ctx *rc = ctx->race;
  if (s && live(ctx, s)) join_host(rc, cur(s));
  if (e && e->race && e->race->gen == ctx->race_gen) join_host(rc, &e->race->vc);
  if (!s && !e)
    for (dev_stream *u = ctx->streams; u; u = u->next)
      if (live(ctx, u)) join_host(rc, cur(u));
}

/* A task's await saw s reach pos (dev_watch_done): the host knows what s
 * knew there. */
void race_host_reached(dev_ctx *ctx, dev_stream *s, uint64_t pos) {
  if (!live(ctx, s)) return;
  const vclock *v = vc_at(ctx->race, s, pos);
  if (v) join_host(ctx->race, v);
}

void race_fence(dev_buf *b, int write) {
  dev_ctx *ctx = b->ctx;
  struct race_ctx *rc = ctx->race;
  struct race_buf *rb = buf_state(ctx, b, 0);
  if (!rb) return;
  const vclock *v;
  if (rb->has_w && vc_get(&rc->host, rb->w.slot) < rb->w.clock && (v = vc_of(ctx, &rb->w)))
    join_host(rc, v);
  for (int i = 0; write && i < rb->nr; i++)
    if (vc_get(&rc->host, rb->r[i].slot) < rb->r[i].clock && (v = vc_of(ctx, &rb->r[i])))
      join_host(rc, v);
}

void race_read_wait(dev_stream *s, dev_buf *b) {
  dev_ctx *ctx = s->ctx;
  struct race_buf *rb = buf_state(ctx, b, 0);
  if (!rb || !rb->has_w || !item(ctx, s)) return;
  const vclock *v;
  if (vc_get(cur(s), rb->w.slot) < rb->w.clock && (v = vc_of(ctx, &rb->w)))
    join_stream(ctx->race, s, v, ctx->bk->stream_pos(s));
}

/* ---- lifetime --------------------------------------------------------- */

void race_stream_gone(dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  struct race_stream *rs = s->race;
  if (ctx->race && rs->gen == ctx->race_gen) {
    /* destroyed only once idle: its work, and all it waited for, is done */
    join_host(ctx->race, cur(s));
    ctx->race->slots[rs->slot] = (slot){NULL, rs->vc.c[rs->slot]};
  }
  stream_free(rs);
  s->race = NULL;
}

void race_event_gone(dev_event *e) {
  free(e->race->vc.c);
  free(e->race);
  e->race = NULL;
}

void race_buf_gone(struct race_buf *rb) {
  free(rb->r);
  free(rb);
}

int race_set(dev_ctx *ctx, int on) {
  if (!on == !ctx->race) return DEV_OK;
  if (on) {
    struct race_ctx *rc = calloc(1, sizeof *rc);
    if (!rc) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (race checker)");
    ctx->race = rc;
    ctx->race_gen++;
    return DEV_OK;
  }
  struct race_ctx *rc = ctx->race;
  ctx->race = NULL;
  free(rc->host.c);
  free(rc->tmp.c);
  free(rc->slots);
  free(rc);
  return DEV_OK;
}

int dev_check_races(dev_ctx *ctx, int on) { return race_set(ctx, on); }
int dev_races_checked(dev_ctx *ctx) { return ctx->race != NULL; }
