/* The CUDA backend's graphs.  A capture (cuda/dev_graph.c) records nodes
 * without running them; once it ends, the nodes are rebuilt here under CUDA
 * stream capture and instantiated, and a replay is one cudaGraphLaunch.
 * - The build enqueues the nodes on private nonblocking streams, one per
 *   stream of the capture: ops through the backend's own launch code
 *   (cuda_capture_op: built-in kernels, copies, cuBLAS, run-time kernels,
 *   the application's C kernels, which enqueue on the stream they are
 *   given), records and waits as cudaEventRecord and cudaStreamWaitEvent
 *   on private events, so that the capture's fork/join becomes the graph's
 *   edges; a record of the script's event also as cudaEventRecordWithFlags
 *   (cudaEventRecordExternal): an event-record node, which records that
 *   event on every replay (the device layer marks it: dev_graph.c);
 *   collectives as NCCL's own calls (cuda/cuda/nccl.c), which NCCL
 *   turns into nodes.  Nothing else runs on this thread meanwhile, so the script never
 *   runs with CUDA in capture mode, and nothing in the runtime can break a
 *   capture.
 * - Memory: the graph's tensors were allocated from the block cache at
 *   capture time, outside CUDA's capture; only matmul's scratch is
 *   allocated inside it (cudaMallocAsync on the capturing stream: the
 *   graph's own allocation nodes).  What allocates outside stream order
 *   (cuBLAS's handle) is done before the capture begins; relaxed mode in
 *   case a library call still does.
 * - A replay is named in the stream's records "graph 'name' (captured at
 *   file:line)", so an error that stops the device names it and the line
 *   that launched it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cu.h"

typedef struct cgraph {
  cuda_comm_graph link;     /* first: holding collectives, registered with the communicator */
  cuda_comm *comm;          /* set: registered */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int host;                 /* an op touches pinned memory: a marker after each replay */
  char label[DEV_TRACE_NAME + DEV_SITE_LEN + 32];
} cgraph;

static int op_touches_host(const dev_kop *op) {
  if (op->kind == DEV_OP_SLEEP) return 0;
  if (op->kind == DEV_OP_LAUNCH) {
    for (int i = 0; i < op->launch->nbufs; i++)
      if (op->launch->bufs[i]->kind != DEV_MEM_DEVICE) return 1;
    return 0;
  }
  for (int j = 0; j < dev_kop_nout(op); j++)
    if (dev_kop_out(op, j)->buf->kind != DEV_MEM_DEVICE) return 1;
  for (int i = 0; i < op->nin; i++)
    if (dev_kop_in(op, i)->buf->kind != DEV_MEM_DEVICE) return 1;
  return 0;
}

static void cgraph_destroy(cgraph *cg) {
  if (cg->exec) cudaGraphExecDestroy(cg->exec);
  if (cg->graph) cudaGraphDestroy(cg->graph);
  cg->exec = NULL;
  cg->graph = NULL;
}

/* the communicator closes first: NCCL's work goes before it */
static void cgraph_kill(cuda_comm_graph *g) { cgraph_destroy((cgraph *)g); }

static void cgraph_free(cgraph *cg) {
  if (!cg) return;
  int leak = 0;
  if (cg->comm) leak = cg->link.gone ? cg->link.leak : cuda_comm_graph_drop(cg->comm, &cg->link);
  if (!leak) cgraph_destroy(cg);
  free(cg);
}

/* A record or wait of the capture's fork/join, on s; a record of the
 * script's event records that event too (an event-record node). */
static cudaError_t build_sync(cudaStream_t s, const dev_gexec *gx, const dev_gnode *nd, cudaEvent_t *ev) {
  if (nd->kind == DEV_GN_WAIT) return cudaStreamWaitEvent(s, ev[nd->event], 0);
  /* the script's record first: a join waits on the capture's own event, so
   * the record node is joined too (after it, a forked stream's record node
   * would be unjoined work and end the capture with an error) */
  dev_event *user = gx->events ? gx->events[nd->event] : NULL;
  cudaError_t e = user ? cudaEventRecordWithFlags((cudaEvent_t)user->impl, s, cudaEventRecordExternal)
                       : cudaSuccess;
  if (e == cudaSuccess) e = cudaEventRecord(ev[nd->event], s);
  return e;
}

/* One node of the capture on its private stream: an op, a group of
 * collectives, or a record or wait as an event. */
static int capture_node(dev_ctx *ctx, const dev_gexec *gx, const dev_gnode *nd, cudaStream_t *st, cudaEvent_t *ev) {
  cudaStream_t s = st[nd->stream];
  if (nd->kind == DEV_GN_OP) {
    int rc = cuda_capture_op(ctx, s, &nd->op);
    if (rc) {
      /* the message is the op's: say where it was captured */
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", dev_errmsg(ctx));
      rc = dev_fail(ctx, rc, "%s (enqueued at %s): %s", dev_op_name(&nd->op), nd->site, msg);
    }
    return rc;
  }
  if (nd->kind == DEV_GN_COLL) {
    int rc = cuda_comm_capture(ctx->comm, s, nd);
    if (rc) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", dev_errmsg(ctx));
      rc = dev_fail(ctx, rc, "%s (enqueued at %s): %s", nd->ncoll > 1 ? "group" : dev_coll_name(nd->coll[0].kind),
                    nd->site, msg);
    }
    return rc;
  }
  cudaError_t e = build_sync(s, gx, nd, ev);
  return e == cudaSuccess ? DEV_OK : cuda_error(ctx, e, nd->kind == DEV_GN_RECORD ? "graph: record" : "graph: wait");
}

int cuda_graph_build(dev_ctx *ctx, dev_gexec *gx) {
  int rc = DEV_OK;
  cudaError_t e = cudaSuccess;
  int ns = gx->nstreams > 0 ? gx->nstreams : 1, ne = gx->nevents;
  cgraph *cg = calloc(1, sizeof *cg);
  cudaStream_t *st = calloc((size_t)ns, sizeof *st);
  cudaEvent_t *ev = calloc((size_t)(ne > 0 ? ne : 1), sizeof *ev);
  if (!cg || !st || !ev) {
    rc = dev_fail(ctx, DEV_ERR_NOMEM, "out of memory building a graph");
    goto done;
  }
  snprintf(cg->label, sizeof cg->label, "graph '%s' (captured at %s)", gx->name, gx->site);
  for (int i = 0; i < gx->n && rc == DEV_OK; i++)
    if (gx->nodes[i].kind == DEV_GN_OP) {
      rc = cuda_capture_prepare(ctx, &gx->nodes[i].op);
      if (op_touches_host(&gx->nodes[i].op)) cg->host = 1;
    }
  /* collectives: NCCL connected before the capture (the ranks meet) */
  if (rc == DEV_OK && gx->ncolls) {
    if (!ctx->comm) rc = dev_fail(ctx, DEV_ERR_INVALID, "graph: the communicator is gone");
    else rc = cuda_comm_ready(ctx->comm, "graph");
  }
  if (rc) goto done;
  for (int i = 0; i < ns && e == cudaSuccess; i++) e = cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking);
  for (int i = 0; i < ne && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaStreamBeginCapture(st[0], cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    rc = cuda_error(ctx, e, "graph: begin capture");
    goto done;
  }
  for (int i = 0; i < gx->n && rc == DEV_OK; i++) rc = capture_node(ctx, gx, &gx->nodes[i], st, ev);
  /* always ended, failed or not: the streams leave capture mode */
  e = cudaStreamEndCapture(st[0], &cg->graph);
  if (rc == DEV_OK && e != cudaSuccess) rc = cuda_error(ctx, e, "graph: end capture");
  if (rc == DEV_OK && (e = cudaGraphInstantiate(&cg->exec, cg->graph, 0)) != cudaSuccess)
    rc = cuda_error(ctx, e, "graph: instantiate");
done:
  cudaGetLastError();
  for (int i = 0; ev && i < ne; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  for (int i = 0; st && i < ns; i++)
    if (st[i]) cudaStreamDestroy(st[i]);
  free(ev);
  free(st);
  if (rc) {
    cgraph_free(cg);
    return rc;
  }
  if (gx->ncolls) {
    cg->comm = ctx->comm;
    cg->link.kill = cgraph_kill;
    cuda_comm_graph_add(cg->comm, &cg->link);
  }
  gx->impl = cg;
  return DEV_OK;
}

/* A replay is on s: its positions, one per record of a script's event and
 * then its end (backend.h); the events themselves are recorded by their
 * nodes, and answer queries and waits exactly. */
static int replay_enqueued(dev_stream *s, const dev_gexec *gx, const cgraph *cg) {
  int rc = DEV_OK;
  for (int k = 0; k < gx->nrec && rc == DEV_OK; k++) rc = cuda_enqueued(s, cg->label, 0);
  return rc == DEV_OK ? cuda_enqueued(s, cg->label, cg->host) : rc;
}

/* One replay on s; while tracing, one span on s named by the graph. */
int cuda_graph_launch(dev_stream *s, const dev_gexec *gx, uint64_t seq) {
  cgraph *cg = gx->impl;
  dev_ctx *ctx = s->ctx;
  cudaStream_t st = (cudaStream_t)ctx->bk->stream_native(s);
  cuda_tmark tm = {NULL};
  int rc;
  if (ctx->trace_gen && (rc = cuda_trace_begin(ctx, st, &tm))) return rc;
  if (!cg->exec) {
    rc = dev_fail(ctx, DEV_ERR_INVALID, "%s: its communicator was closed", cg->label);
  } else if (cg->comm) {
    /* checked and watched as its collectives, launched under the communicator's lock */
    rc = cuda_comm_replay(cg->comm, st, cg->exec, gx, seq, cg->label);
    if (rc == DEV_OK) rc = replay_enqueued(s, gx, cg);
  } else {
    cudaError_t e = cudaGraphLaunch(cg->exec, st);
    rc = e != cudaSuccess ? cuda_error(ctx, e, cg->label) : replay_enqueued(s, gx, cg);
  }
  if (!tm.ev) return rc;
  dev_trace_rec r;
  memset(&r, 0, sizeof r);
  r.kind = DEV_TR_OP;
  r.cls = DEV_TR_COMPUTE;
  r.stream = (int64_t)s->id;
  snprintf(r.name, sizeof r.name, "%s", gx->name);
  memcpy(r.site, ctx->site, sizeof r.site);
  return cuda_trace_rec(ctx, st, &tm, &r, rc);
}

void cuda_graph_free(dev_ctx *ctx, dev_gexec *gx) {
  (void)ctx;
  cgraph_free(gx->impl);
  gx->impl = NULL;
}
