/* Graphs: a step captured once and replayed (gpu.graph).
 *
 * - A capture records, it runs nothing.  Between dev_graph_begin and
 *   dev_graph_end, an op enqueued on a stream of the capture (its origin,
 *   and the streams joined to it) is validated by dev_submit as usual, then
 *   appended to the graph's nodes instead of going to the backend.  Event
 *   records and waits between those streams are nodes too, so that a
 *   backend can rebuild the fork/join (cuda); the host backend replays the
 *   ops in capture order, which is a topological order of them.
 * - One capture per context (ctx->capture).  While it is open, what cannot
 *   be replayed fails with DEV_ERR_CAPTURE before anything is recorded: a
 *   counted sync (dev_sync_enter), dev_read, host access to a buffer the
 *   capture uses, work on (or a wait by) a stream outside the capture, a
 *   wait for an event recorded outside it, pageable memory and launching a
 *   graph.  Collectives are nodes (graph_coll): a replay runs them numbered
 *   after the collectives before it, as if called there.  Streams join by waiting for an event recorded in
 *   the capture, or for a stream of it, as in CUDA's stream capture.
 * - Joins are checked with vector clocks: clk[m][k] is how many nodes of
 *   member k member m has waited for (clk[m][m]: its own).  At the end the
 *   origin must have waited for every member's last node (CUDA refuses to
 *   end a capture with an unjoined stream, so the host backend does too).
 * - The graph holds a reference on every buffer its ops touch and on every
 *   module they launch from: what was made inside the capture is the
 *   graph's, and what it reads stays alive whatever the script drops.  A
 *   replay is one item on its stream: it records a use of each buffer (as
 *   a write where a node writes it), of each module's life buffer and of
 *   the graph's own life buffer, whose release frees the node list and the
 *   backend's executable.  So a graph released with replays queued keeps
 *   all of that until they are over, through the buffers' use lists.
 * - A refused call abandons the capture even if the script catches it
 *   (graph_fail): dev_graph_end then fails naming it.  Ops whose memory is
 *   all host-visible are not recorded: they run at once, as host work does.
 * - An event the script records in the capture (s:record(), ev:record(s))
 *   is a record node, as CUDA's cudaEventRecordExternal makes one: the
 *   capture does not touch the event (never recorded before a replay, as a
 *   fresh one), and every replay records it where the capture did.  The
 *   graph holds such events until it is freed.  A replay takes a position
 *   of its stream per such record, then one for its end (backend.h), so an
 *   event stands for the replay's work before its record, on both backends
 *   and for the race checker.  The records also serve the fork/join.
 * - The race checker checks and records a replay as the ops it contains,
 *   all on the launch stream, each at the position of its stretch.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "devpriv.h"
#include "bufx.h"
#include "capture.h"
#include "race.h"

#define GMAXS 32   /* streams in one capture */

enum { G_CAPTURE, G_READY, G_FAILED };

/* An event record in the capture: the clock of its stream then. */
typedef struct gslot {
  dev_event *e;            /* held; NULL: a stream's implicit record (s:wait(stream)) */
  uint32_t clk[GMAXS];
} gslot;

struct dev_graph {
  dev_ctx *ctx;
  int state;
  char name[DEV_TRACE_NAME];
  char site[DEV_SITE_LEN];
  /* while capturing: the member streams (referenced) and their clocks */
  dev_stream *mem[GMAXS];
  int nmem;
  uint32_t clk[GMAXS][GMAXS];
  gslot *slots;
  int nslots, capslots;
  dev_gnode *nodes;        /* moved to gx at the end */
  int n, cap, nops, ncolls;
  /* what the graph holds */
  dev_buf **bufs;
  unsigned char *writes;
  int nbufs, capbufs;
  dev_module **mods;
  int nmods, capmods;
  dev_gexec *gx;           /* owned by life once ready */
  dev_buf *life;
  char broken[512];        /* the first refused call, with its site: the capture is abandoned */
};

static int grow(dev_ctx *ctx, void **p, int *cap, int need, size_t elsize) {
  if (need <= *cap) return DEV_OK;
  int nc = *cap ? 2 * *cap : 16;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, (size_t)nc * elsize);
  if (!q) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory capturing a graph");
  *p = q;
  *cap = nc;
  return DEV_OK;
}

static void free_nodes(dev_gnode *nodes, int n) {
  for (int i = 0; i < n; i++) {
    if (nodes[i].kind == DEV_GN_OP && nodes[i].op.kind == DEV_OP_LAUNCH) free((void *)nodes[i].op.launch);
    if (nodes[i].kind == DEV_GN_OP) free((void *)nodes[i].op.fargs);
    if (nodes[i].kind == DEV_GN_COLL) {
      dev_group_release(nodes[i].coll[0].group);
      free(nodes[i].coll);
    }
  }
  free(nodes);
}

/* The life buffer's release: no replay is queued any more. */
static void gexec_free(void *ud, void *ptr) {
  dev_ctx *ctx = ud;
  dev_gexec *gx = ptr;
  if (gx->impl && ctx->bk->graph_free) ctx->bk->graph_free(ctx, gx);
  free_nodes(gx->nodes, gx->n);
  for (int i = 0; gx->events && i < gx->nevents; i++) dev_event_release(gx->events[i]);
  free(gx->events);
  free(gx);
}

/* The capture's end, whatever it was: the streams go back to normal. */
static void capture_close(dev_graph *g) {
  for (int m = 0; m < g->nmem; m++) {
    dev_stream *s = g->mem[m];
    s->capture = NULL;
    s->cap_index = 0;
    g->mem[m] = NULL;
    dev_stream_unref(s);
  }
  if (g->ctx->capture == g) g->ctx->capture = NULL;
  for (int i = 0; i < g->nslots; i++) dev_event_release(g->slots[i].e);
  free(g->slots);
  g->slots = NULL;
  g->nslots = g->capslots = 0;
}

int dev_graph_capturing(dev_ctx *ctx) { return ctx->capture != NULL; }

const dev_graph *dev_graph_open_capture(dev_ctx *ctx) { return ctx->capture; }

int dev_graph_begin(dev_ctx *ctx, dev_stream *s, const char *name, dev_graph **out) {
  *out = NULL;
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if (!ctx->bk->graph_launch)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "graphs are not supported on the %s backend yet", ctx->bk->name);
  if (ctx->capture)
    return graph_fail(ctx, "a capture is already open (graphs do not nest)");
  if (!s || s->is_default)
    return dev_fail(ctx, DEV_ERR_INVALID, "the default stream cannot be captured");
  if ((rc = check_open(s))) return rc;
  dev_graph *g = calloc(1, sizeof *g);
  if (!g) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (graph)");
  g->ctx = ctx;
  snprintf(g->name, sizeof g->name, "%s", name && *name ? name : "graph");
  memcpy(g->site, ctx->site, sizeof g->site);
  dev_ctx_retain(ctx);
  dev_stream_retain(s);
  s->capture = g;
  s->cap_index = 0;
  g->mem[0] = s;
  g->nmem = 1;
  ctx->capture = g;
  *out = g;
  return DEV_OK;
}

/* ---- recording ---------------------------------------------------------- */

/* A refusal: the message, and the capture is abandoned even if the script
 * catches the error (as CUDA invalidates a capture after an illegal call). */
int graph_fail(dev_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
  va_end(ap);
  dev_graph *g = ctx->capture;
  if (g && !g->broken[0]) {
    size_t n = strlen(ctx->site);
    memcpy(g->broken, ctx->site, n);
    if (n) { memcpy(g->broken + n, ": ", 2); n += 2; }
    size_t m = strnlen(ctx->err, sizeof g->broken - 1 - n);
    memcpy(g->broken + n, ctx->err, m);
    g->broken[n + m] = 0;
  }
  return DEV_ERR_CAPTURE;
}

static int not_member(dev_ctx *ctx, dev_stream *s) {
  if (s->is_default)
    return graph_fail(ctx, "the default stream is not part of the capture (work inside "
                    "gpu.graph goes to the capture stream, or to a stream joined to it by an event)");
  return graph_fail(ctx, "stream %llu is not part of the capture (join it first: make it "
                  "wait for an event recorded on the capture stream)", (unsigned long long)s->id);
}

static dev_gnode *add_node(dev_graph *g, int kind, int m) {
  if (grow(g->ctx, (void **)&g->nodes, &g->cap, g->n + 1, sizeof *g->nodes)) return NULL;
  dev_gnode *nd = &g->nodes[g->n++];
  memset(nd, 0, sizeof *nd);
  nd->kind = kind;
  nd->stream = m;
  memcpy(nd->site, g->ctx->site, sizeof nd->site);
  return nd;
}

static int find_buf(const dev_graph *g, const dev_buf *b) {
  /* newest first: a step's ops mostly touch what the ops before made */
  for (int i = g->nbufs - 1; i >= 0; i--)
    if (g->bufs[i] == b) return i;
  return -1;
}

static int hold_buf(dev_graph *g, dev_buf *b, int write) {
  int i = find_buf(g, b);
  if (i >= 0) {
    g->writes[i] |= (unsigned char)(write != 0);
    return DEV_OK;
  }
  int cap = g->capbufs, rc = grow(g->ctx, (void **)&g->bufs, &cap, g->nbufs + 1, sizeof *g->bufs);
  if (rc == DEV_OK) rc = grow(g->ctx, (void **)&g->writes, &g->capbufs, g->nbufs + 1, 1);
  if (rc) return rc;
  dev_buf_retain(b);
  g->bufs[g->nbufs] = b;
  g->writes[g->nbufs++] = (unsigned char)(write != 0);
  return DEV_OK;
}

static int hold_module(dev_graph *g, dev_module *m) {
  for (int i = 0; i < g->nmods; i++)
    if (g->mods[i] == m) return DEV_OK;
  int rc = grow(g->ctx, (void **)&g->mods, &g->capmods, g->nmods + 1, sizeof *g->mods);
  if (rc) return rc;
  dev_module_retain(m);
  g->mods[g->nmods++] = m;
  return DEV_OK;
}

/* dev_submit runs an op whose memory is all host-visible on the calling
 * thread: at capture too, as the rest of the host's work in it.  Its
 * fences refuse memory the capture uses (graph_host_access). */
int graph_records(const dev_kop *op) {
  if (op->kind == DEV_OP_LAUNCH || op->kind == DEV_OP_SLEEP) return 1;
  for (int j = 0; j < dev_kop_nout(op); j++)
    if (dev_kop_out(op, j)->buf->kind == DEV_MEM_DEVICE) return 1;
  for (int i = 0; i < op->nin; i++)
    if (dev_kop_in(op, i)->buf->kind == DEV_MEM_DEVICE) return 1;
  return 0;
}

int graph_submit(dev_stream *s, const dev_kop *op) {
  dev_ctx *ctx = s->ctx;
  dev_graph *g = ctx->capture;
  if (s->capture != g) return not_member(ctx, s);
  dev_buf *bufs[DEV_FMAXOUT + DEV_FMAXIN];
  unsigned char wr[DEV_FMAXOUT + DEV_FMAXIN];
  int nb = 0;
  const dev_launch *l = op->kind == DEV_OP_LAUNCH ? op->launch : NULL;
  if (!l && op->kind != DEV_OP_SLEEP) {
    for (int j = 0; j < dev_kop_nout(op); j++) {
      bufs[nb] = dev_kop_out(op, j)->buf;
      wr[nb++] = 1;
    }
    for (int i = 0; i < op->nin; i++) {
      bufs[nb] = dev_kop_in(op, i)->buf;
      wr[nb++] = 0;
    }
  }
  for (int i = 0; i < nb; i++)
    if (bufs[i]->kind == DEV_MEM_HOST)
      return graph_fail(ctx, "%s: pageable host memory cannot be captured in a graph (a "
                      "replay cannot wait for the host; use pinned memory)", dev_op_name(op));
  int m = s->cap_index, rc;
  dev_gnode *nd = add_node(g, DEV_GN_OP, m);
  if (!nd) return DEV_ERR_NOMEM;
  nd->op = *op;
  nd->op.fargs = NULL;
  if (op->fargs) {
    /* the caller's, as a launch's arguments: the node owns a copy */
    dev_fargs *fa = malloc(sizeof *fa);
    if (!fa) {
      g->n--;
      return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory capturing a fused op");
    }
    *fa = *op->fargs;
    nd->op.fargs = fa;
  }
  if (l) {
    /* the caller's argument arrays go when it returns: the node owns a copy */
    if (!(nd->op.launch = dev_launch_dup(l))) {
      free((void *)nd->op.fargs);
      g->n--;
      return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory capturing a launch");
    }
    for (int i = 0; i < l->nbufs; i++)
      if ((rc = hold_buf(g, l->bufs[i], l->writes[i]))) goto fail;
    if ((rc = hold_module(g, l->k->mod))) goto fail;
  }
  for (int i = 0; i < nb; i++)
    if ((rc = hold_buf(g, bufs[i], wr[i]))) goto fail;
  g->clk[m][m]++;
  g->nops++;
  return DEV_OK;
fail:
  /* what was held stays held (released with the graph); the node goes */
  if (l) free((void *)nd->op.launch);
  free((void *)nd->op.fargs);
  g->n--;
  return rc;
}

/* A collective (checked by dev_collective): a node of its own, which the
 * backend replays through its transport (NCCL captures into CUDA graphs).
 * Every rank must capture it: the check (GPULUA_COMM_CHECK) compares that
 * too, as NCCL requires a captured collective to be captured everywhere. */
int graph_coll(dev_stream *s, const dev_coll *c, int n) {
  dev_ctx *ctx = s->ctx;
  dev_graph *g = ctx->capture;
  if (s->capture != g) return not_member(ctx, s);
  for (int i = 0; i < n; i++) {
    const dev_view *v[2] = {c[i].kind != DEV_COLL_RECV ? &c[i].send : NULL, c[i].kind != DEV_COLL_SEND ? &c[i].recv : NULL};
    for (int k = 0; k < 2; k++)
      if (v[k] && v[k]->buf->kind == DEV_MEM_HOST)
        return graph_fail(ctx, "%s: pageable host memory cannot be captured in a graph (use device "
                        "or pinned memory)", dev_coll_name(c[i].kind));
  }
  dev_coll *copy = malloc((size_t)n * sizeof *copy);
  if (!copy) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory capturing a collective");
  memcpy(copy, c, (size_t)n * sizeof *copy);
  for (int i = 0; i < n; i++) copy[i].graph = 1;
  int m = s->cap_index, rc;
  for (int i = 0; i < n; i++) {
    if (c[i].kind != DEV_COLL_RECV && (rc = hold_buf(g, c[i].send.buf, 0))) goto fail;
    if (c[i].kind != DEV_COLL_SEND && (rc = hold_buf(g, c[i].recv.buf, 1))) goto fail;
  }
  dev_gnode *nd = add_node(g, DEV_GN_COLL, m);
  if (!nd) {
    rc = DEV_ERR_NOMEM;
    goto fail;
  }
  nd->coll = copy;
  nd->ncoll = n;
  dev_group_retain(copy[0].group);
  g->clk[m][m]++;
  g->nops++;
  g->ncolls++;
  return DEV_OK;
fail:
  free(copy);
  return rc;
}

static int new_slot(dev_graph *g, dev_event *e, int m) {
  int rc = grow(g->ctx, (void **)&g->slots, &g->capslots, g->nslots + 1, sizeof *g->slots);
  if (rc) return -1;
  gslot *sl = &g->slots[g->nslots];
  sl->e = e;
  memcpy(sl->clk, g->clk[m], sizeof sl->clk);
  dev_gnode *nd = add_node(g, DEV_GN_RECORD, m);
  if (!nd) return -1;
  nd->event = g->nslots;
  if (e) dev_event_retain(e);   /* held: the replays record it (take_events) */
  return g->nslots++;
}

int graph_record(dev_event *e, dev_stream *s) {
  dev_ctx *ctx = s->ctx;
  if (s->capture != ctx->capture) return not_member(ctx, s);
  return new_slot(ctx->capture, e, s->cap_index) < 0 ? DEV_ERR_NOMEM : DEV_OK;
}

int graph_wait(dev_stream *s, dev_stream *other, dev_event *e) {
  dev_ctx *ctx = s->ctx;
  dev_graph *g = ctx->capture;
  int slot = -1;
  if (e) {
    for (int i = g->nslots - 1; i >= 0 && slot < 0; i--)
      if (g->slots[i].e == e) slot = i;
    if (slot < 0 && !e->recorded) return DEV_OK;   /* as outside a capture: nothing to wait for */
    if (slot < 0 && s->capture != g) return not_member(ctx, s);
    if (slot < 0)
      return graph_fail(ctx, "the event was recorded outside the capture: a replay cannot "
                      "wait for it (record it inside, on a stream of the capture)");
  } else if (other->capture != g) {
    if (s->capture != g) return not_member(ctx, s);
    return graph_fail(ctx, "stream %llu is not part of the capture: a replay cannot wait "
                    "for its work", (unsigned long long)other->id);
  }
  if (s->capture != g) {
    /* s joins the capture */
    if (s->is_default)
      return graph_fail(ctx, "the default stream cannot join a capture (use a stream of "
                      "gpu.stream())");
    if (g->nmem == GMAXS)
      return graph_fail(ctx, "a capture joins at most %d streams", GMAXS);
    int m = g->nmem;
    memset(g->clk[m], 0, sizeof g->clk[m]);
    dev_stream_retain(s);
    s->capture = g;
    s->cap_index = m;
    g->mem[m] = s;
    g->nmem++;
  }
  if (slot < 0 && (slot = new_slot(g, NULL, other->cap_index)) < 0) return DEV_ERR_NOMEM;
  int m = s->cap_index;
  dev_gnode *nd = add_node(g, DEV_GN_WAIT, m);
  if (!nd) return DEV_ERR_NOMEM;
  nd->event = slot;
  const uint32_t *src = g->slots[slot].clk;
  for (int k = 0; k < GMAXS; k++)
    if (src[k] > g->clk[m][k]) g->clk[m][k] = src[k];
  g->clk[m][m]++;   /* the wait is a node of s: a joined stream must be joined back */
  return DEV_OK;
}

int graph_refuse(dev_ctx *ctx, const char *what) {
  return graph_fail(ctx, "%s waits for the device: a host-device sync cannot be captured "
                  "in a graph", what);
}

int graph_host_access(dev_ctx *ctx, dev_buf *b, const char *what) {
  if (find_buf(ctx->capture, b) < 0) return DEV_OK;
  return graph_fail(ctx, "%s: the host cannot touch memory the capture uses until a "
                  "replay has run (not inside gpu.graph)", what);
}

int graph_read(dev_ctx *ctx, dev_buf *b) {
  if (b->kind == DEV_MEM_DEVICE) return graph_refuse(ctx, "a device-to-host read");
  return graph_host_access(ctx, b, "a read of a tensor's values");
}

/* ---- the graph ---------------------------------------------------------- */

/* The script's events of the capture's records move from its slots to the
 * graph (the capture's close releases what stays); *nrec: their RECORD
 * nodes, each a position of a replay.  An event only the slots hold (the
 * script closed it, as a fork's event often is) stays: nothing can look
 * at it, so its records are only the capture's fork/join. */
static int take_events(dev_graph *g, dev_event ***out, int *nrec) {
  *out = NULL;
  *nrec = 0;
  if (g->nslots == 0) return DEV_OK;
  dev_event **ev = calloc((size_t)g->nslots, sizeof *ev);
  if (!ev) return dev_fail(g->ctx, DEV_ERR_NOMEM, "out of memory (graph)");
  for (int i = 0; i < g->nslots; i++) {
    dev_event *e = g->slots[i].e;
    int held = 0;
    for (int j = 0; e && j < g->nslots; j++) held += g->slots[j].e == e;
    ev[i] = e && e->refs > held ? e : NULL;
  }
  for (int i = 0; i < g->nslots; i++)
    if (ev[i]) g->slots[i].e = NULL;
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].kind == DEV_GN_RECORD && ev[g->nodes[i].event]) (*nrec)++;
  *out = ev;
  return DEV_OK;
}

int dev_graph_end(dev_graph *g) {
  dev_ctx *ctx = g->ctx;
  if (g->state != G_CAPTURE) return dev_fail(ctx, DEV_ERR_INVALID, "the graph's capture is not open");
  int rc = DEV_OK, nstreams = g->nmem, nevents = g->nslots;
  if (g->broken[0])
    rc = dev_fail(ctx, DEV_ERR_CAPTURE, "the capture was abandoned at a call that cannot be captured (%s)",
                  g->broken);
  for (int m = 1; m < g->nmem && rc == DEV_OK; m++)
    if (g->clk[0][m] < g->clk[m][m])
      rc = dev_fail(ctx, DEV_ERR_CAPTURE, "stream %llu joined the capture, but its last work was not joined "
                    "back into the capture stream (record an event on it after that work and make the "
                    "capture stream wait for it)", (unsigned long long)g->mem[m]->id);
  dev_event **events = NULL;
  int nrec = 0;
  if (rc == DEV_OK) rc = take_events(g, &events, &nrec);
  capture_close(g);
  g->state = G_FAILED;
  if (rc) return rc;
  dev_gexec *gx = calloc(1, sizeof *gx);
  if (!gx) {
    for (int i = 0; i < nevents; i++) dev_event_release(events[i]);
    free(events);
    return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (graph)");
  }
  gx->events = events;
  gx->nrec = nrec;
  gx->nodes = g->nodes;
  gx->n = g->n;
  gx->nops = g->nops;
  gx->ncolls = g->ncolls;
  gx->nstreams = nstreams;
  gx->nevents = nevents;
  memcpy(gx->name, g->name, sizeof gx->name);
  memcpy(gx->site, g->site, sizeof gx->site);
  g->nodes = NULL;
  g->n = g->cap = 0;
  if ((rc = dev_buf_wrap_internal(ctx, gx, gexec_free, ctx, &g->life))) {
    gexec_free(ctx, gx);
    return rc;
  }
  g->gx = gx;
  if (ctx->bk->graph_build && (rc = ctx->bk->graph_build(ctx, gx))) return rc;
  g->state = G_READY;
  return DEV_OK;
}

/* After a replay went on s: each record of a script's event marks it, and
 * the race checker notes each op at the position of its stretch of the
 * replay (the replay's positions: backend.h, graph_launch). */
static void replayed(dev_ctx *ctx, dev_stream *s, const dev_gexec *gx) {
  uint64_t at = ctx->bk->stream_pos(s) - (uint64_t)gx->nrec;
  for (int i = 0; i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind == DEV_GN_OP && ctx->race) race_op_at(ctx, s, &nd->op, at);
    else if (nd->kind == DEV_GN_COLL && ctx->race) race_coll_at(ctx, s, nd->coll, nd->ncoll, at);
    else if (nd->kind == DEV_GN_RECORD && gx->events && gx->events[nd->event])
      event_mark(gx->events[nd->event], s, at++);
  }
}

int dev_graph_launch(dev_graph *g, dev_stream *s) {
  dev_ctx *ctx = g->ctx;
  int rc = dev_check_async(ctx);
  if (rc) return rc;
  if (g->state == G_CAPTURE) return dev_fail(ctx, DEV_ERR_INVALID, "the graph is still being captured");
  if (g->state != G_READY) return dev_fail(ctx, DEV_ERR_INVALID, "the graph's capture failed: it cannot be launched");
  if (ctx->capture)
    return graph_fail(ctx, "a graph cannot be launched inside a capture");
  if (!s) s = ctx->dflt;
  if ((rc = check_open(s))) return rc;
  const dev_gexec *gx = g->gx;
  if (gx->ncolls && !ctx->comm)
    return dev_fail(ctx, DEV_ERR_INVALID, "graph '%s' holds collectives, and the communicator is gone", g->name);
  /* the race checker sees a replay as its ops, all on s */
  for (int i = 0; ctx->race && i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind == DEV_GN_OP) rc = race_op(ctx, s, &nd->op, 0);
    else if (nd->kind == DEV_GN_COLL) rc = race_coll(ctx, s, nd->coll, nd->ncoll, 0);
    if (rc) return rc;
  }
  if ((rc = fence_op_bufs(s, g->bufs, g->nbufs))) return rc;
  if ((rc = ctx->bk->graph_launch(s, gx, ctx->coll_seq + 1))) return rc;
  ctx->coll_seq += (uint64_t)gx->ncolls;
  replayed(ctx, s, gx);
  if (ctx->trace_gen) dev_trace_note_stream(ctx, s);
  for (int i = 0; i < g->nbufs; i++) note_use(BX(g->bufs[i]), s, g->writes[i]);
  for (int i = 0; i < g->nmods; i++)
    if (dev_module_life(g->mods[i])) note_use(BX(dev_module_life(g->mods[i])), s, 0);
  note_use(BX(g->life), s, 0);
  ctx->st.replays++;
  return DEV_OK;
}

void dev_graph_release(dev_graph *g) {
  if (!g) return;
  dev_ctx *ctx = g->ctx;
  if (g->state == G_CAPTURE) capture_close(g);
  free_nodes(g->nodes, g->n);
  for (int i = 0; i < g->nbufs; i++) dev_buf_release(g->bufs[i]);
  for (int i = 0; i < g->nmods; i++) dev_module_release(g->mods[i]);
  if (g->life) dev_buf_release(g->life);
  free(g->bufs);
  free(g->writes);
  free(g->mods);
  free(g);
  dev_ctx_release(ctx);
}

int dev_graph_nodes(const dev_graph *g) { return g->state == G_CAPTURE ? g->nops : g->gx ? g->gx->nops : 0; }
const char *dev_graph_name(const dev_graph *g) { return g->name; }
const char *dev_graph_site(const dev_graph *g) { return g->site; }
