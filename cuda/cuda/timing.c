/* The CUDA backend's half of tracing: ops are timed by a pair of timing
 * events recorded around each op on its stream, only while a session is on.
 * A reference event recorded at the session's start on an idle stream,
 * with the host clock read around its completion, puts the GPU's times on
 * the host timeline: t = ref_host + elapsed(ref, start).  Pairs are read
 * back (cudaEventQuery, never a wait) every PAIRS_HARVEST ops and at
 * collection, after a sync.  NVTX ranges (nvtx3, header-only: no-ops unless
 * a tool such as nsys injects itself) serve gpu.range. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include "cu.h"

#define PAIRS_HARVEST 256

typedef struct tpair {
  cudaEvent_t a, b;
  unsigned gen;
  dev_trace_rec rec;
} tpair;

typedef struct ctrace {
  cudaEvent_t ref;
  uint64_t ref_ns;              /* the reference event on the trace clock */
  unsigned gen;                 /* the session ref belongs to */
  tpair *pend;
  size_t npend, cappend;
  unsigned since_harvest;
  cudaEvent_t *pool;            /* spare timing events */
  int npool, cappool;
} ctrace;

static int cfail(dev_ctx *ctx, cudaError_t e, const char *what) {
  cudaGetLastError();
  return dev_fail(ctx, e == cudaErrorMemoryAllocation ? DEV_ERR_NOMEM : DEV_ERR_DEVICE,
                  "trace: %s: CUDA error %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static ctrace *CT(dev_ctx *ctx) {
  void **p = dev_trace_backend_state(ctx);
  return p ? *p : NULL;
}

static int ev_get(dev_ctx *ctx, ctrace *t, cudaEvent_t *out) {
  if (t->npool > 0) {
    *out = t->pool[--t->npool];
    return DEV_OK;
  }
  cudaError_t e = cudaEventCreateWithFlags(out, cudaEventDefault);
  return e == cudaSuccess ? DEV_OK : cfail(ctx, e, "event");
}

static void ev_put(ctrace *t, cudaEvent_t ev) {
  if (t->npool == t->cappool) {
    int cap = t->cappool ? 2 * t->cappool : 64;
    cudaEvent_t *p = realloc(t->pool, (size_t)cap * sizeof *p);
    if (!p) {
      if (cudaEventDestroy(ev) != cudaSuccess) cudaGetLastError();
      return;
    }
    t->pool = p;
    t->cappool = cap;
  }
  t->pool[t->npool++] = ev;
}

/* Pairs whose end event completed become records; the others stay.  A pair
 * whose events report an error (a failed op, a lost context) is dropped. */
static void harvest(dev_ctx *ctx, ctrace *t) {
  size_t j = 0;
  t->since_harvest = 0;
  for (size_t i = 0; i < t->npend; i++) {
    tpair *p = &t->pend[i];
    cudaError_t e = p->gen == t->gen ? cudaEventQuery(p->b) : cudaErrorInvalidResourceHandle;
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      t->pend[j++] = *p;
      continue;
    }
    float off = 0, dur = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&off, t->ref, p->a);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&dur, p->a, p->b);
    if (e == cudaSuccess) {
      /* the offset from the reference loses precision with time (float ms);
       * the duration, between the pair, does not */
      double t0 = (double)t->ref_ns + (double)off * 1e6;
      uint64_t a = t0 > 0 ? (uint64_t)t0 : 0;
      dev_trace_add(ctx, p->gen, &p->rec, a, a + (uint64_t)((double)dur * 1e6));
    } else {
      cudaGetLastError();
    }
    ev_put(t, p->a);
    ev_put(t, p->b);
  }
  t->npend = j;
}

int cuda_trace_begin(dev_ctx *ctx, void *stream, cuda_tmark *m) {
  m->ev = NULL;
  ctrace *t = CT(ctx);
  if (!t) return dev_fail(ctx, DEV_ERR_INVALID, "trace: no session");
  cudaEvent_t ev;
  int rc = ev_get(ctx, t, &ev);
  if (rc) return rc;
  cudaError_t e = cudaEventRecord(ev, (cudaStream_t)stream);
  if (e != cudaSuccess) {
    ev_put(t, ev);
    return cfail(ctx, e, "record");
  }
  m->ev = ev;
  return DEV_OK;
}

/* After the op: its end event and the pair, or the start event back to the
 * pool when the op failed.  Returns the op's status, else this one's. */
static int end_pair(dev_ctx *ctx, void *stream, cuda_tmark *m, const dev_trace_rec *r, int rc) {
  ctrace *t = CT(ctx);
  cudaEvent_t a = m->ev, b = NULL;
  m->ev = NULL;
  if (!a || !t) return rc;
  int rc2 = rc ? rc : ev_get(ctx, t, &b);
  if (rc2 == DEV_OK) {
    cudaError_t e = cudaEventRecord(b, (cudaStream_t)stream);
    if (e != cudaSuccess) {
      ev_put(t, b);
      rc2 = cfail(ctx, e, "record");
    }
  }
  if (rc2 == DEV_OK && t->npend == t->cappend) {
    size_t cap = t->cappend ? 2 * t->cappend : 256;
    tpair *np = realloc(t->pend, cap * sizeof *np);
    if (np) {
      t->pend = np;
      t->cappend = cap;
    } else {
      ev_put(t, b);
      rc2 = dev_fail(ctx, DEV_ERR_NOMEM, "trace: out of memory");
    }
  }
  if (rc2 != DEV_OK) {
    ev_put(t, a);
    return rc ? rc : rc2;
  }
  tpair *p = &t->pend[t->npend++];
  p->a = a;
  p->b = b;
  p->gen = ctx->trace_gen;
  p->rec = *r;
  if (++t->since_harvest >= PAIRS_HARVEST) harvest(ctx, t);
  return DEV_OK;
}

int cuda_trace_op(dev_ctx *ctx, void *stream, cuda_tmark *m, int64_t sid, const dev_kop *op, int rc) {
  if (!m->ev) return rc;
  dev_trace_rec r;
  dev_trace_fill_op(&r, op, sid);
  memcpy(r.site, ctx->site, sizeof r.site);
  return end_pair(ctx, stream, m, &r, rc);
}

/* A record the caller filled (a graph's replay: one span named by it). */
int cuda_trace_rec(dev_ctx *ctx, void *stream, cuda_tmark *m, const dev_trace_rec *r, int rc) {
  if (!m->ev) return rc;
  return end_pair(ctx, stream, m, r, rc);
}

int cuda_trace_coll(dev_ctx *ctx, void *stream, cuda_tmark *m, int64_t sid, const dev_coll *g, int n,
                    int rc) {
  if (!m->ev) return rc;
  dev_trace_rec r;
  dev_trace_fill_coll(&r, g, n, sid);
  memcpy(r.site, ctx->site, sizeof r.site);
  return end_pair(ctx, stream, m, &r, rc);
}

/* The reference: recorded on a fresh stream with nothing queued, so it
 * completes as soon as the GPU sees it, between the two host clock reads. */
int cuda_trace_start(dev_ctx *ctx) {
  void **slot = dev_trace_backend_state(ctx);
  if (!slot) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory starting a trace");
  ctrace *t = *slot;
  if (!t) {
    if (!(t = calloc(1, sizeof *t))) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory starting a trace");
    *slot = t;
  }
  /* pairs of the last session that were never read back */
  t->gen = 0;
  harvest(ctx, t);
  cudaError_t e;
  if (!t->ref && (e = cudaEventCreateWithFlags(&t->ref, cudaEventDefault)) != cudaSuccess) {
    t->ref = NULL;
    return cfail(ctx, e, "reference event");
  }
  cudaStream_t st;
  if ((e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != cudaSuccess)
    return cfail(ctx, e, "reference stream");
  uint64_t h0 = dev_trace_now();
  e = cudaEventRecord(t->ref, st);
  if (e == cudaSuccess) e = cudaEventSynchronize(t->ref);
  uint64_t h1 = dev_trace_now();
  cudaError_t e2 = cudaStreamDestroy(st);
  if (e == cudaSuccess) e = e2;
  if (e != cudaSuccess) return cfail(ctx, e, "reference event");
  t->ref_ns = h0 + (h1 - h0) / 2;
  t->gen = ctx->trace_gen;   /* the new session's, set by dev_trace_start */
  return DEV_OK;
}

void cuda_trace_flush(dev_ctx *ctx) {
  ctrace *t = CT(ctx);
  if (t) harvest(ctx, t);
}

void cuda_trace_free(dev_ctx *ctx) {
  void **slot = dev_trace_backend_state(ctx);
  ctrace *t = slot ? *slot : NULL;
  if (!t) return;
  for (size_t i = 0; i < t->npend; i++) {
    cudaEventDestroy(t->pend[i].a);
    cudaEventDestroy(t->pend[i].b);
  }
  for (int i = 0; i < t->npool; i++) cudaEventDestroy(t->pool[i]);
  if (t->ref) cudaEventDestroy(t->ref);
  cudaGetLastError();
  free(t->pend);
  free(t->pool);
  free(t);
  *slot = NULL;
}

/* Start/end ranges rather than push/pop: tasks on the one interpreter
 * thread open ranges that overlap without nesting. */
uint64_t cuda_range_start(dev_ctx *ctx, const char *name) {
  (void)ctx;
  return (uint64_t)nvtxRangeStartA(name);
}

void cuda_range_end(dev_ctx *ctx, uint64_t handle) {
  (void)ctx;
  nvtxRangeEnd((nvtxRangeId_t)handle);
}
