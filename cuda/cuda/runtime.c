/* CUDA backend: the device layer on the CUDA runtime (cudart linked
 * statically; cuBLAS loaded with dlopen on first use).
 *
 * Positions: a stream's position is the number of ops enqueued on it.  To
 * learn when a position is reached the backend records "markers" (events
 * without timing) at the stream's end: lazily when someone asks (a fence, a
 * buffer release, a wait), and eagerly after ops that touch host memory, so
 * that host-access fences wait for exactly the copy that fills a buffer. */
#include <dlfcn.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include "kernels.h"
#include "cu.h"
#include "rt.h"
#include "cpu_ops.h"   /* strided pageable copies: gathered and scattered on the CPU */
#include "stage.h"
#include "util.h"

/* Errors a kernel leaves behind: the context cannot be used any more. */
static int is_sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress: case cudaErrorAssert: case cudaErrorLaunchFailure:
  case cudaErrorHardwareStackError: case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace: case cudaErrorInvalidPc:
  case cudaErrorLaunchTimeout: case cudaErrorTensorMemoryLeak:
    return 1;
  default:
    return 0;
  }
}

/* The op that failed, per stream with work queued: the first unfinished
 * kernel of the script's or application's own (built-in ops do not assert
 * or fault, and the markers that would tell they are done may lie ahead of
 * them), else the first unfinished op.  With one candidate it is exact;
 * otherwise all are named. */
static void describe_failed(dev_ctx *ctx, char *buf, size_t n) {
  int found = 0;
  size_t k = 0;
  buf[0] = 0;
  for (dev_stream *s = ctx->streams; s && k < n; s = s->next) {
    cstream *c = CST(s);
    if (!c || c->enq <= c->known_done) continue;
    uint64_t pos = c->known_done + 1;
    uint64_t from = c->enq - pos >= NREC ? c->enq - NREC + 1 : pos;   /* the ops still remembered */
    for (uint64_t p = from; p <= c->enq; p++)
      if (c->rec[p % NREC].user) { pos = p; break; }
    const oprec *r = c->enq - pos < NREC ? &c->rec[pos % NREC] : NULL;
    k += (size_t)snprintf(buf + k, n - k, "%s'%s'%s%s", found ? " or " : "",
                          r && r->name ? r->name : "an op",
                          r && *r->site ? " enqueued at " : "", r ? r->site : "");
    found++;
  }
  if (!found) snprintf(buf, n, "queued work");
}

int cuda_fail(dev_ctx *ctx, cudaError_t e, const char *what) {
  cstate *cs = ctx->bk_state;
  cudaGetLastError();
  if (cs && *cs->lost)
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: the CUDA context is unusable after an earlier error "
                    "(%s); restart the process to use the GPU", what, cs->lost);
  if (cs && is_sticky(e)) {
    /* reported at the wait that saw it, naming the op that most likely caused it */
    char who[600];
    describe_failed(ctx, who, sizeof who);
    snprintf(cs->lost, sizeof cs->lost, "%s failed: CUDA error %s: %s", who, cudaGetErrorName(e),
             cudaGetErrorString(e));
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: %s", what, cs->lost);
  }
  return dev_fail(ctx, e == cudaErrorMemoryAllocation ? DEV_ERR_NOMEM : DEV_ERR_DEVICE,
                  "%s: CUDA error %s: %s%s%s", what, cudaGetErrorName(e), cudaGetErrorString(e),
                  *ctx->site ? " (last op enqueued at " : "", *ctx->site ? ctx->site : "");
}

/* Kernels flag integer division by zero in mapped memory; report it once the
 * work that set it has been waited for. */
static void check_flag(dev_ctx *ctx) {
  cstate *cs = CS(ctx);
  int v;
  if (cs->flag_host && (v = *(volatile int *)cs->flag_host)) {
    *(volatile int *)cs->flag_host = 0;
    if (v == 1) {
      dev_async_fail(ctx, "integer division by zero in a queued op");
      return;
    }
    /* an index op's or a fused op's tag: named as the host backend names a
     * failed op */
    for (int i = 0; i < NTAGGED; i++)
      if (cs->tagged[i].tag == v) {
        dev_async_fail(ctx, "%s%s'%s' failed: %s", cs->tagged[i].site, *cs->tagged[i].site ? ": " : "",
                       cs->tagged[i].name, cs->tagged[i].what);
        return;
      }
    dev_async_fail(ctx, "an index out of range or an integer division by zero in a queued op");
  }
}

/* The tag an op sets the flag to, remembered with its name, site and what
 * went wrong (a string that outlives the context). */
int cuda_tag_op(dev_ctx *ctx, const dev_kop *op, const char *what) {
  cstate *cs = CS(ctx);
  int tag = 2 + cs->next_tag, i = cs->next_tag % NTAGGED;
  cs->next_tag = (cs->next_tag + 1) % 1000000000;
  cs->tagged[i].tag = tag;
  cs->tagged[i].name = dev_op_name(op);
  cs->tagged[i].what = what;
  memcpy(cs->tagged[i].site, ctx->site, sizeof cs->tagged[i].site);
  return tag;
}

/* ---- markers ---------------------------------------------------------- */

static int ev_get(dev_ctx *ctx, cudaEvent_t *out) {
  cstate *cs = CS(ctx);
  if (cs->nev > 0) { *out = cs->evpool[--cs->nev]; return DEV_OK; }
  CK(ctx, cudaEventCreateWithFlags(out, cudaEventDisableTiming), "event");
  return DEV_OK;
}

static void ev_put(dev_ctx *ctx, cudaEvent_t ev) {
  cstate *cs = CS(ctx);
  if (cs->nev == cs->capev) {
    int cap = cs->capev ? 2 * cs->capev : 32;
    cudaEvent_t *p = realloc(cs->evpool, (size_t)cap * sizeof *p);
    if (!p) { cudaEventDestroy(ev); return; }
    cs->evpool = p;
    cs->capev = cap;
  }
  cs->evpool[cs->nev++] = ev;
}

/* Retire completed markers; the known-done position moves forward. */
static void retire(dev_stream *s) {
  cstream *c = CST(s);
  while (c->n > 0) {
    marker *m = &c->mk[c->head];
    if (cudaEventQuery(m->ev) != cudaSuccess) { cudaGetLastError(); break; }
    if (m->covered > c->known_done) c->known_done = m->covered;
    ev_put(s->ctx, m->ev);
    c->head = (c->head + 1) % MAXMARK;
    c->n--;
  }
}

/* A marker at the stream's current end (or the newest one if it covers it). */
static int mark(dev_stream *s, marker **out) {
  cstream *c = CST(s);
  if (c->n > 0) {
    marker *last = &c->mk[(c->head + c->n - 1) % MAXMARK];
    if (last->covered == c->enq) { *out = last; return DEV_OK; }
  }
  if (c->n == MAXMARK) {
    /* Full: wait for the oldest rather than lose track. */
    marker *m = &c->mk[c->head];
    cudaEventSynchronize(m->ev);
    retire(s);
    if (c->n == MAXMARK) {
      if (m->covered > c->known_done) c->known_done = m->covered;
      ev_put(s->ctx, m->ev);
      c->head = (c->head + 1) % MAXMARK;
      c->n--;
    }
  }
  cudaEvent_t ev;
  int rc = ev_get(s->ctx, &ev);
  if (rc) return rc;
  cudaError_t e = cudaEventRecord(ev, c->st);
  if (e != cudaSuccess) { ev_put(s->ctx, ev); return cuda_fail(s->ctx, e, "record"); }
  marker *m = &c->mk[(c->head + c->n) % MAXMARK];
  m->ev = ev;
  m->covered = c->enq;
  c->n++;
  *out = m;
  return DEV_OK;
}

/* The oldest marker that covers pos, or a new one at the end. */
static int marker_for(dev_stream *s, uint64_t pos, marker **out) {
  cstream *c = CST(s);
  for (int i = 0; i < c->n; i++) {
    marker *m = &c->mk[(c->head + i) % MAXMARK];
    if (m->covered >= pos) { *out = m; return DEV_OK; }
  }
  return mark(s, out);
}

/* ---- backend interface ----------------------------------------------- */

static int c_device_count(dev_ctx *ctx) {
  (void)ctx;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
}

static int c_open(dev_ctx *ctx, int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_fail(ctx, e, "no CUDA device");
  if (device < 0 || device >= n)
    return dev_fail(ctx, DEV_ERR_INVALID, "CUDA device %d out of range (%d device%s)", device, n,
                    n == 1 ? "" : "s");
  cstate *cs = calloc(1, sizeof *cs);
  if (!cs) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  ctx->bk_state = cs;
  cs->device = device;
  /* kernels load in the background unless GPULUA_KERNEL_LOADER is off */
  int bg_load = 1;
  if (env_flag("GPULUA_LAUNCH_BLOCKING", &cs->launch_blocking, ctx->err, sizeof ctx->err) ||
      env_flag("GPULUA_KERNEL_LOADER", &bg_load, ctx->err, sizeof ctx->err))
    return DEV_ERR_INVALID;
  CK(ctx, cudaSetDevice(device), "set device");
  CK(ctx, cudaDeviceGetAttribute(&cs->sm_count, cudaDevAttrMultiProcessorCount, device), "device attribute");
  CK(ctx, cudaDeviceGetAttribute(&cs->optin_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
     "device attribute");
  CK(ctx, cudaDeviceGetStreamPriorityRange(&cs->prio_least, &cs->prio_greatest), "stream priorities");
  CK(ctx, cudaStreamCreateWithFlags(&cs->side, cudaStreamNonBlocking), "stream");
  /* Keep freed device memory in the pool: no release back to the driver. */
  cudaMemPool_t pool;
  CK(ctx, cudaDeviceGetDefaultMemPool(&pool, device), "memory pool");
  uint64_t thresh = UINT64_MAX;
  CK(ctx, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thresh), "memory pool");
  CK(ctx, cudaHostAlloc((void **)&cs->flag_host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable), "pinned flag");
  *cs->flag_host = 0;
  CK(ctx, cudaHostGetDevicePointer((void **)&cs->flag_dev, cs->flag_host, 0), "pinned flag");
  cs->loader = bg_load ? cuda_loader_new(device) : NULL;
  void *w = NULL, *v = NULL;
  enum cudaDriverEntryPointQueryResult qw, qv;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &w, 12000, cudaEnableDefault, &qw) == cudaSuccess &&
      qw == cudaDriverEntryPointSuccess &&
      cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &v, 12000, cudaEnableDefault, &qv) == cudaSuccess &&
      qv == cudaDriverEntryPointSuccess && w && v) {
    cs->wait_value = (CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))w;
    cs->write_value = (CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))v;
  } else {
    cudaGetLastError();
  }
  int rc = dev_stage_config(ctx, 1);
  ctx->stage_off = !cs->wait_value;
  return rc;
}

static void c_close(dev_ctx *ctx) {
  cstate *cs = CS(ctx);
  if (!cs) return;
  /* The last release may come from another thread (a DLPack deleter after
   * gpulua_close), whose current device need not be ours. */
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (prev != cs->device) cudaSetDevice(cs->device);
  cuda_loader_stop(cs->loader);
  cudaDeviceSynchronize();
  /* every staged copy's host functions have run: its threads may go */
  dev_stage_shutdown(ctx);
  cuda_fused_free(ctx);
  for (int i = 0; i < cs->nev; i++) cudaEventDestroy(cs->evpool[i]);
  free(cs->evpool);
  if (cs->cublas) cs->cublas_destroy(cs->cublas);
  if (cs->cublas_lib) dlclose(cs->cublas_lib);
  if (cs->flag_host) cudaFreeHost(cs->flag_host);
  if (cs->side) cudaStreamDestroy(cs->side);
  for (int nb = 0; nb < 2; nb++)
    for (int hi = 0; hi < 2; hi++)
      for (int i = 0; i < cs->nspare[nb][hi]; i++) cudaStreamDestroy(cs->spare[nb][hi][i]);
  for (int i = 0; i < cs->nnotify; i++) cudaStreamDestroy(cs->notify[i]);
  if (prev >= 0 && prev != cs->device) cudaSetDevice(prev);
  cudaGetLastError();
  free(cs);
  ctx->bk_state = NULL;
}

static int c_device_info(dev_ctx *ctx, int index, dev_info *out) {
  struct cudaDeviceProp p;
  CK(ctx, cudaGetDeviceProperties(&p, index), "device info");
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%.127s", p.name);
  out->backend = "cuda";
  out->index = index;
  out->total_memory = p.totalGlobalMem;
  out->multiprocessors = p.multiProcessorCount;
  out->cc_major = p.major;
  out->cc_minor = p.minor;
  return DEV_OK;
}

static int c_stream_init(dev_stream *s) {
  cstream *c = calloc(1, sizeof *c);
  if (!c) return dev_fail(s->ctx, DEV_ERR_NOMEM, "out of memory creating a stream");
  s->impl = c;
  if (s->is_default) {
    c->st = cudaStreamLegacy;
    return DEV_OK;
  }
  /* work on two streams must not meet a kernel still to load (loader.c) */
  cuda_loader_wait(CS(s->ctx)->loader);
  if (s->wrap) {
    /* the application's stream: its flags and priority, and it is not ours to destroy */
    cudaStream_t st = (cudaStream_t)s->wrap;
    unsigned flags = 0;
    int prio = 0, least = CS(s->ctx)->prio_least, greatest = CS(s->ctx)->prio_greatest;
    cudaError_t e = cudaStreamGetFlags(st, &flags);
    if (e == cudaSuccess) e = cudaStreamGetPriority(st, &prio);
    if (e != cudaSuccess) {
      free(c);
      s->impl = NULL;
      return cuda_fail(s->ctx, e, "wrap a stream (is the handle a live cudaStream_t of this device?)");
    }
    c->st = st;
    s->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    s->priority = greatest < least && prio <= greatest ? DEV_PRIO_HIGH : DEV_PRIO_NORMAL;
    return DEV_OK;
  }
  cstate *cs = CS(s->ctx);
  int nb = s->nonblocking != 0, hi = s->priority > 0;
  if (cs->nspare[nb][hi] > 0) {
    c->st = cs->spare[nb][hi][--cs->nspare[nb][hi]];
    return DEV_OK;
  }
  int prio = hi ? cs->prio_greatest : cs->prio_least;
  cudaError_t e = cudaStreamCreateWithPriority(
      &c->st, s->nonblocking ? cudaStreamNonBlocking : cudaStreamDefault, prio);
  if (e != cudaSuccess) {
    free(c);
    s->impl = NULL;
    return cuda_fail(s->ctx, e, "stream");
  }
  return DEV_OK;
}

static void c_stream_fini(dev_stream *s) {
  cstream *c = CST(s);
  if (!c) return;
  for (int i = 0; i < c->n; i++) ev_put(s->ctx, c->mk[(c->head + i) % MAXMARK].ev);
  if (s->ctx->comm) cuda_comm_forget_stream(s->ctx->comm, c->st);
  if (!s->is_default && !s->wrap) {
    /* kept only with nothing queued, so that a new stream starts empty */
    cstate *cs = CS(s->ctx);
    int nb = s->nonblocking != 0, hi = s->priority > 0;
    cudaError_t q = cs->nspare[nb][hi] < NSPARE ? cudaStreamQuery(c->st) : cudaErrorNotReady;
    if (q == cudaSuccess) {
      cs->spare[nb][hi][cs->nspare[nb][hi]++] = c->st;
    } else {
      cudaGetLastError();
      cudaStreamDestroy(c->st);
    }
  }
  free(c);
}

static void *c_stream_native(dev_stream *s) { return CST(s)->st; }

/* Memory handed over by the application: is it what it claims to be? */
static int c_check_ptr(dev_ctx *ctx, dev_memkind kind, void *ptr, size_t bytes) {
  (void)bytes;
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e != cudaSuccess) return cuda_fail(ctx, e, "wrap memory");
  int dev = CS(ctx)->device;
  const char *is = a.type == cudaMemoryTypeDevice ? "device memory"
                   : a.type == cudaMemoryTypeManaged ? "managed memory"
                   : a.type == cudaMemoryTypeHost ? "pinned host memory" : "pageable host memory";
  int ok;
  switch (kind) {
  case DEV_MEM_DEVICE:
    ok = (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) && a.device == dev;
    break;
  case DEV_MEM_PINNED: ok = a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeManaged; break;
  default: ok = a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost; break;
  }
  if (ok) return DEV_OK;
  if (kind == DEV_MEM_DEVICE && (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged))
    return dev_fail(ctx, DEV_ERR_INVALID, "wrap memory: %p is %s of cuda:%d, not of this context's cuda:%d",
                    ptr, is, a.device, dev);
  return dev_fail(ctx, DEV_ERR_INVALID, "wrap memory: %p is %s, not %s memory", ptr, is,
                  dev_memkind_name(kind));
}

static int c_stream_idle(dev_stream *s) {
  cstream *c = CST(s);
  cudaError_t e = cudaStreamQuery(c->st);
  if (e == cudaSuccess) { c->known_done = c->enq; return 1; }
  cudaGetLastError();
  return 0;
}

static uint64_t c_stream_pos(dev_stream *s) { return CST(s)->enq; }

static int c_pos_done(dev_stream *s, uint64_t pos) {
  cstream *c = CST(s);
  if (pos <= c->known_done) return 1;
  retire(s);
  if (pos <= c->known_done) return 1;
  return c_stream_idle(s);
}

/* cudaStreamSynchronize (ev NULL) or cudaEventSynchronize; interruptible
 * (intr): polls instead, returning cudaErrorNotReady once dev_interrupt is
 * pending.  It yields between polls and never sleeps: that is what the
 * runtime's own wait does by default (cudaDeviceScheduleAuto spins or yields
 * while the machine has a core per context), so a sync wakes as soon. */
static cudaError_t c_sync(dev_ctx *ctx, cudaStream_t st, cudaEvent_t ev, int intr) {
  if (!intr) return ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(st);
  for (;;) {
    cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(st);
    if (e != cudaErrorNotReady) return e;
    cudaGetLastError();
    if (dev_intr_pending(ctx)) return e;
    sched_yield();
  }
}

#define CK_SYNC(ctx, e, intr)                                                   \
  do {                                                                          \
    if ((e) == cudaErrorNotReady && (intr)) return DEV_ERR_INTERRUPTED;         \
    if ((e) != cudaSuccess) return cuda_fail((ctx), (e), "synchronize");        \
  } while (0)

static int c_wait(dev_stream *s, uint64_t pos, int intr) {
  cstream *c = CST(s);
  if (pos <= c->known_done) {
    /* done already (a watch saw it, say): its kernels' flag is read here all the same */
    check_flag(s->ctx);
    return DEV_OK;
  }
  if (pos >= c->enq) {
    /* everything queued: one call, no marker to record (the round trip) */
    cudaError_t e = c_sync(s->ctx, c->st, NULL, intr);
    CK_SYNC(s->ctx, e, intr);
    c->known_done = c->enq;
    while (c->n > 0) {
      ev_put(s->ctx, c->mk[c->head].ev);
      c->head = (c->head + 1) % MAXMARK;
      c->n--;
    }
    check_flag(s->ctx);
    return DEV_OK;
  }
  marker *m;
  int rc = marker_for(s, pos, &m);
  if (rc) return rc;
  uint64_t covered = m->covered;
  cudaError_t e = c_sync(s->ctx, NULL, m->ev, intr);
  CK_SYNC(s->ctx, e, intr);
  if (covered > c->known_done) c->known_done = covered;
  retire(s);
  check_flag(s->ctx);
  return DEV_OK;
}

static int c_pos_wait(dev_stream *s, uint64_t pos) { return c_wait(s, pos, 0); }
static int c_pos_wait_intr(dev_stream *s, uint64_t pos) { return c_wait(s, pos, 1); }

static int c_stream_wait(dev_stream *s, dev_stream *other, uint64_t pos) {
  if (c_pos_done(other, pos)) return DEV_OK;
  marker *m;
  int rc = marker_for(other, pos, &m);
  if (rc) return rc;
  CK(s->ctx, cudaStreamWaitEvent(CST(s)->st, m->ev, 0), "wait");
  return DEV_OK;
}

static int c_event_wait(dev_stream *s, dev_event *e) {
  CK(s->ctx, cudaStreamWaitEvent(CST(s)->st, (cudaEvent_t)e->impl, 0), "wait");
  return DEV_OK;
}

static int c_event_init(dev_event *e) {
  cudaEvent_t ev;
  CK(e->ctx, cudaEventCreateWithFlags(&ev, e->timing ? cudaEventDefault : cudaEventDisableTiming), "event");
  e->impl = ev;
  return DEV_OK;
}

static void c_event_fini(dev_event *e) {
  if (e->impl) cudaEventDestroy((cudaEvent_t)e->impl);
}

static int c_event_record(dev_event *e, dev_stream *s) {
  CK(e->ctx, cudaEventRecord((cudaEvent_t)e->impl, CST(s)->st), "record");
  e->pos = CST(s)->enq;
  return DEV_OK;
}

static int c_event_query(dev_event *e) {
  cudaError_t r = cudaEventQuery((cudaEvent_t)e->impl);
  if (r == cudaSuccess) return 1;
  if (r == cudaErrorNotReady) { cudaGetLastError(); return 0; }
  cuda_fail(e->ctx, r, "query");
  return -1;
}

static int c_event_sync(dev_event *e) {
  int intr = dev_intr_enabled(e->ctx);
  cudaError_t r = c_sync(e->ctx, NULL, (cudaEvent_t)e->impl, intr);
  CK_SYNC(e->ctx, r, intr);
  check_flag(e->ctx);
  return DEV_OK;
}

static int c_event_elapsed(dev_event *a, dev_event *b, double *ms) {
  float f = 0;
  CK(a->ctx, cudaEventElapsedTime(&f, (cudaEvent_t)a->impl, (cudaEvent_t)b->impl), "elapsed");
  *ms = f;
  return DEV_OK;
}

/* ---- completion signals ------------------------------------------------ */

typedef struct cwatch {
  atomic_int refs;             /* the watch and the host function */
  atomic_int done;
  dev_ctx *ctx;
  int notify;                  /* index of the stream it waits on */
} cwatch;

static void cwatch_unref(cwatch *w) {
  if (atomic_fetch_sub(&w->refs, 1) == 1) free(w);
}

/* A host function: no CUDA calls here, only the flag and the wakeup. */
static void CUDART_CB watch_fired(void *arg) {
  cwatch *w = arg;
  cstate *cs = CS(w->ctx);
  atomic_store(&w->done, 1);
  atomic_fetch_sub(&cs->notify_pending[w->notify], 1);
  dev_progress_signal(w->ctx);
  cwatch_unref(w);
}

static int c_watch(dev_ctx *ctx, dev_stream *s, uint64_t pos, dev_event *e, void **impl) {
  cstate *cs = CS(ctx);
  cudaEvent_t at;
  if (e) {
    at = (cudaEvent_t)e->impl;
  } else {
    marker *m;
    int rc = marker_for(s, pos, &m);
    if (rc) return rc;
    at = m->ev;
  }
  int k = -1;
  for (int i = 0; i < cs->nnotify && k < 0; i++)
    if (atomic_load(&cs->notify_pending[i]) == 0) k = i;
  if (k < 0 && cs->nnotify < NNOTIFY) {
    CK(ctx, cudaStreamCreateWithFlags(&cs->notify[cs->nnotify], cudaStreamNonBlocking), "stream");
    atomic_init(&cs->notify_pending[cs->nnotify], 0);
    k = cs->nnotify++;
  }
  if (k < 0) {
    /* all busy: the one with the fewest pending signals */
    k = 0;
    for (int i = 1; i < cs->nnotify; i++)
      if (atomic_load(&cs->notify_pending[i]) < atomic_load(&cs->notify_pending[k])) k = i;
  }
  cwatch *w = calloc(1, sizeof *w);
  if (!w) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (watch)");
  atomic_init(&w->refs, 2);
  atomic_init(&w->done, 0);
  w->ctx = ctx;
  w->notify = k;
  /* the wait takes the event's state now: a later record does not move it */
  cudaError_t err = cudaStreamWaitEvent(cs->notify[k], at, 0);
  if (err == cudaSuccess) {
    atomic_fetch_add(&cs->notify_pending[k], 1);
    err = cudaLaunchHostFunc(cs->notify[k], watch_fired, w);
    if (err != cudaSuccess) atomic_fetch_sub(&cs->notify_pending[k], 1);
  }
  if (err != cudaSuccess) {
    free(w);
    return cuda_fail(ctx, err, "await");
  }
  *impl = w;
  return DEV_OK;
}

static int c_watch_done(dev_ctx *ctx, void *impl) {
  (void)ctx;
  return atomic_load(&((cwatch *)impl)->done);
}

static void c_watch_free(dev_ctx *ctx, void *impl) {
  (void)ctx;
  cwatch_unref(impl);
}

static size_t phys_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  return pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : 0;
}

/* The device layer caches blocks above this (dev_buf.c), and asks only when none
 * fits.  Device memory comes from the device's stream-ordered pool. */
static int c_alloc(dev_ctx *ctx, dev_memkind kind, size_t bytes, void **out) {
  cstate *cs = CS(ctx);
  cudaError_t e;
  /* Host memory beyond RAM would only fail later, page by page. */
  size_t phys = phys_memory();
  if (kind != DEV_MEM_DEVICE && phys && bytes > phys) return DEV_ERR_NOMEM;
  switch (kind) {
  case DEV_MEM_DEVICE:
    e = cudaMallocAsync(out, bytes, cs->side);
    break;
  case DEV_MEM_PINNED:
    e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    break;
  default: {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, rounded);
    return *out ? DEV_OK : DEV_ERR_NOMEM;
  }
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return DEV_ERR_NOMEM;
  }
  if (e != cudaSuccess) return cuda_fail(ctx, e, kind == DEV_MEM_DEVICE ? "allocate" : "allocate pinned");
  return DEV_OK;
}

static void c_free(dev_ctx *ctx, dev_memkind kind, void *p, size_t bytes) {
  (void)bytes;
  switch (kind) {
  case DEV_MEM_DEVICE:
    /* dev_buf.c frees only once every use is over, so the side stream may free now. */
    if (cudaFreeAsync(p, CS(ctx)->side) != cudaSuccess) cudaGetLastError();
    break;
  case DEV_MEM_PINNED:
    if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
    break;
  default:
    free(p);
  }
}

static size_t c_mem_total(dev_ctx *ctx, dev_memkind kind) {
  if (kind != DEV_MEM_DEVICE) return phys_memory();
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
  (void)ctx;
  return tot;
}

/* The pool keeps what was freed into it (release threshold: all): give it
 * back once the side stream's frees are done. */
static void c_trim(dev_ctx *ctx) {
  cstate *cs = CS(ctx);
  cudaMemPool_t pool;
  if (cudaStreamSynchronize(cs->side) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, cs->device) == cudaSuccess)
    cudaMemPoolTrimTo(pool, 0);
  cudaGetLastError();
}

/* ---- ops -------------------------------------------------------------- */

static int host_visible(const dev_buf *b) { return b->kind != DEV_MEM_DEVICE; }

static int c_copy(dev_stream *s, const dev_kop *op) {
  dev_ctx *ctx = s->ctx;
  cstream *c = CST(s);
  const dev_view *dst = &op->out, *src = &op->in[0];
  size_t bytes = (size_t)dev_view_numel(dst) * dev_dtype_size(dst->dtype);
  if (dev_view_contiguous(dst) && dev_view_contiguous(src)) {
    CK(ctx, cudaMemcpyAsync(dev_view_ptr(dst), dev_view_ptr(src), bytes, cudaMemcpyDefault, c->st), "copy");
    return DEV_OK;
  }
  if (dst->buf->kind != DEV_MEM_HOST && src->buf->kind != DEV_MEM_HOST) {
    cuk_env env = {c->st, CS(ctx)->flag_dev, CS(ctx)->sm_count, 0};
    char msg[256];
    if (cuk_launch(op, &env, msg, sizeof msg)) return dev_fail(ctx, DEV_ERR_DEVICE, "copy: %s", msg);
    return DEV_OK;
  }
  /* A strided view of pageable memory: the GPU cannot reach it.  Rare, so
   * done synchronously through a pinned staging buffer. */
  void *stage = NULL;
  CK(ctx, cudaHostAlloc(&stage, bytes, cudaHostAllocDefault), "copy staging");
  dev_buf sb = {.ptr = stage, .bytes = bytes, .kind = DEV_MEM_PINNED};
  dev_view sv;
  memset(&sv, 0, sizeof sv);
  sv.buf = &sb;
  sv.dtype = dst->dtype;
  dev_view_set_contiguous(&sv, src->ndim, src->shape);
  dev_kop a = {.kind = DEV_OP_COPY, .nin = 1, .out = sv}, b = {.kind = DEV_OP_COPY, .nin = 1, .out = *dst};
  a.in[0] = *src;
  b.in[0] = sv;
  char msg[256];
  int rc = DEV_OK;
  cudaError_t e = cudaStreamSynchronize(c->st);
  if (e != cudaSuccess) { rc = cuda_fail(ctx, e, "copy"); goto out; }
  if (src->buf->kind == DEV_MEM_HOST) {
    if (dev_cpu_run(&a, msg, sizeof msg)) { rc = dev_fail(ctx, DEV_ERR_DEVICE, "copy: %s", msg); goto out; }
    cuk_env env = {c->st, CS(ctx)->flag_dev, CS(ctx)->sm_count, 0};
    if (cuk_launch(&b, &env, msg, sizeof msg)) { rc = dev_fail(ctx, DEV_ERR_DEVICE, "copy: %s", msg); goto out; }
  } else {
    cuk_env env = {c->st, CS(ctx)->flag_dev, CS(ctx)->sm_count, 0};
    if (cuk_launch(&a, &env, msg, sizeof msg)) { rc = dev_fail(ctx, DEV_ERR_DEVICE, "copy: %s", msg); goto out; }
    e = cudaStreamSynchronize(c->st);
    if (e != cudaSuccess) { rc = cuda_fail(ctx, e, "copy"); goto out; }
    if (dev_cpu_run(&b, msg, sizeof msg)) { rc = dev_fail(ctx, DEV_ERR_DEVICE, "copy: %s", msg); goto out; }
  }
  e = cudaStreamSynchronize(c->st);
  if (e != cudaSuccess) rc = cuda_fail(ctx, e, "copy");
out:
  cudaFreeHost(stage);
  return rc;
}

static int c_launch(dev_stream *s, const dev_launch *l) {
  dev_ctx *ctx = s->ctx;
  dev_kernel *k = l->k;
  if (dev_kernel_is_cfunc(k)) {
    /* the application's function enqueues its own work on the stream */
    char msg[512];
    if (dev_cfunc_run(l, CST(s)->st, msg, sizeof msg))
      return dev_fail(ctx, DEV_ERR_DEVICE, "kernel '%s': %s", k->sig.name, msg);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      char what[200];
      snprintf(what, sizeof what, "kernel '%s' (a CUDA call of its C function)", k->sig.name);
      return cuda_fail(ctx, e, what);
    }
    return DEV_OK;
  }
  if (l->shared > k->shared_set) {
    CK(ctx, cudaFuncSetAttribute(k->handle, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)l->shared),
       "kernel shared memory");
    k->shared_set = l->shared;
  }
  dim3 g = {l->grid[0], l->grid[1], l->grid[2]}, b = {l->block[0], l->block[1], l->block[2]};
  cudaError_t e = cudaLaunchKernel(k->handle, g, b, l->args, l->shared, CST(s)->st);
  if (e != cudaSuccess) {
    char what[200];
    snprintf(what, sizeof what, "kernel '%s'", k->sig.name);
    return cuda_fail(ctx, e, what);
  }
  return DEV_OK;
}

static int touches_host(const dev_kop *op) {
  if (op->kind == DEV_OP_SLEEP) return 0;
  if (op->kind == DEV_OP_LAUNCH) {
    for (int i = 0; i < op->launch->nbufs; i++)
      if (host_visible(op->launch->bufs[i])) return 1;
    return 0;
  }
  int nw = dev_kop_nout(op);
  for (int i = 0; i < nw + op->nin; i++)   /* the outputs, then the inputs */
    if (host_visible((i < nw ? dev_kop_out(op, i) : dev_kop_in(op, i - nw))->buf)) return 1;
  return 0;
}

/* Bookkeeping after an op is on the stream: its position and name, a marker
 * after it when it touches host memory, and GPULUA_LAUNCH_BLOCKING's wait. */
static int enqueued(dev_stream *s, const char *name, int host, int user) {
  dev_ctx *ctx = s->ctx;
  cstream *c = CST(s);
  c->enq++;
  oprec *r = &c->rec[c->enq % NREC];
  r->name = name;
  r->user = user;
  memcpy(r->site, ctx->site, sizeof r->site);
  if (host) {
    marker *m;
    int rc = mark(s, &m);
    if (rc) return rc;
  }
  if (CS(ctx)->launch_blocking) {
    cudaError_t e = cudaStreamSynchronize(c->st);
    if (e != cudaSuccess) return cuda_fail(ctx, e, "GPULUA_LAUNCH_BLOCKING");
    c->known_done = c->enq;
    check_flag(ctx);
  }
  return DEV_OK;
}

/* The op's work on the stream, without the bookkeeping. */
static int c_dispatch(dev_stream *s, const dev_kop *op) {
  dev_ctx *ctx = s->ctx;
  cstate *cs = CS(ctx);
  cstream *c = CST(s);
  if (op->kind == DEV_OP_LAUNCH) return c_launch(s, op->launch);
  if (op->kind == DEV_OP_COPY) return c_copy(s, op);
  if (op->kind == DEV_OP_MATMUL && dev_dtype_is_float(op->out.dtype)) return cuda_matmul(s, op);
  if (op->kind == DEV_OP_FUSED) return cuda_fused_launch(ctx, c->st, op);
  cuk_env env = {c->st, cs->flag_dev, cs->sm_count, 1 /* checked by dev_submit */};
  char msg[256];
  dev_kop tagged;
  if (op->kind == DEV_OP_INDEX) {
    /* its tag rides in s0, which the index ops do not use */
    tagged = *op;
    tagged.s0 = (dev_scalar){1, cuda_tag_op(ctx, op, "index out of range (indices start at 1)"), 0};
    op = &tagged;
  }
  return cuk_launch(op, &env, msg, sizeof msg) ? dev_fail(ctx, DEV_ERR_DEVICE, "%s: %s", dev_op_name(op), msg)
                                               : DEV_OK;
}

static int c_submit(dev_stream *s, const dev_kop *op) {
  dev_ctx *ctx = s->ctx;
  cstream *c = CST(s);
  cuda_tmark tm = {NULL};
  int rc;
  if (ctx->trace_gen && (rc = cuda_trace_begin(ctx, c->st, &tm))) return rc;
  rc = c_dispatch(s, op);
  rc = rc ? rc : enqueued(s, dev_op_name(op), touches_host(op), op->kind == DEV_OP_LAUNCH);
  cuda_loader_kick(CS(ctx)->loader);   /* the first op's kernel loaded: the rest follow */
  return tm.ev ? cuda_trace_op(ctx, c->st, &tm, (int64_t)s->id, op, rc) : rc;
}

/* A staged copy's steps (dev_stage.c): its waits and posts as stream
 * memory operations on words of pinned memory (no host function: each of
 * those costs the stream about 30 us), its chunks as copies between pinned
 * slots and the device, all on s. */
static int c_stage_wait(void *ud, volatile uint32_t *flag, uint32_t value) {
  dev_stream *s = ud;
  CUresult r = CS(s->ctx)->wait_value(CST(s)->st, (CUdeviceptr)(uintptr_t)flag, value, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) return dev_fail(s->ctx, DEV_ERR_DEVICE, "copy (stream wait): CUDA driver error %d", (int)r);
  return DEV_OK;
}

static int c_stage_post(void *ud, volatile uint32_t *flag, uint32_t value) {
  dev_stream *s = ud;
  CUresult r = CS(s->ctx)->write_value(CST(s)->st, (CUdeviceptr)(uintptr_t)flag, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) return dev_fail(s->ctx, DEV_ERR_DEVICE, "copy (stream write): CUDA driver error %d", (int)r);
  return DEV_OK;
}

static int c_stage_chunk(void *ud, void *dst, const void *src, size_t n) {
  dev_stream *s = ud;
  CK(s->ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, CST(s)->st), "copy");
  return DEV_OK;
}

/* One op at one position, with a marker after it: a host-access fence on
 * the pageable buffer waits for exactly this copy. */
static int c_stage_copy(dev_stream *s, const dev_kop *op, dev_stage_job *j) {
  dev_ctx *ctx = s->ctx;
  cstream *c = CST(s);
  cuda_tmark tm = {NULL};
  int rc = ctx->trace_gen ? cuda_trace_begin(ctx, c->st, &tm) : DEV_OK;
  static const dev_stage_ops ops = {c_stage_wait, c_stage_post, c_stage_chunk};
  int emitted = rc == DEV_OK;
  if (rc == DEV_OK) rc = dev_stage_emit(j, &ops, s);
  if (rc == DEV_OK) rc = enqueued(s, "copy", 1, 0);
  if (tm.ev) rc = cuda_trace_op(ctx, c->st, &tm, (int64_t)s->id, op, rc);
  if (rc && emitted) {
    /* however far it got, nothing of it may run on once this returns (its
     * record is then reused at once): the waits enqueued pass, then the
     * steps enqueued are waited for */
    dev_stage_abort(j);
    if (cudaStreamSynchronize(c->st) != cudaSuccess) cudaGetLastError();
  }
  return rc;
}

/* ---- for graphs (cuda/cuda/graph.c) ------------------------------------- */

/* What an op needs before a capture begins: cuBLAS's handle (its creation
 * allocates outside stream order). */
int cuda_capture_prepare(dev_ctx *ctx, const dev_kop *op) {
  if (op->kind == DEV_OP_MATMUL && dev_dtype_is_float(op->out.dtype)) return cuda_load_cublas(ctx);
  if (op->kind == DEV_OP_FUSED) return cuda_fused_prepare(ctx, op);
  return DEV_OK;
}

/* The op's work on a capturing stream: a node of the graph being built (a
 * stream of no context: no position, marker or trace). */
int cuda_capture_op(dev_ctx *ctx, void *stream, const dev_kop *op) {
  cstream *c = calloc(1, sizeof *c);
  if (!c) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory building a graph");
  c->st = stream;
  dev_stream s;
  memset(&s, 0, sizeof s);
  s.ctx = ctx;
  s.impl = c;
  int rc = c_dispatch(&s, op);
  free(c);
  return rc;
}

int cuda_enqueued(dev_stream *s, const char *name, int host) { return enqueued(s, name, host, 1); }
int cuda_error(dev_ctx *ctx, int err, const char *what) { return cuda_fail(ctx, (cudaError_t)err, what); }

/* ---- collectives (cuda/cuda/nccl.c) ------------------------------------- */

static int c_comm_open(dev_ctx *ctx, const dev_rank_info *ri) {
  cuda_comm *cc;
  int rc = cuda_comm_open(ctx, CS(ctx)->device, ri, &cc);
  if (rc) return rc;
  ctx->comm = cc;
  if (!ri->defer && (rc = cuda_comm_connect(cc, ri, "init_comm"))) {
    cuda_comm_close(cc);
    ctx->comm = NULL;
  }
  return rc;
}

static int c_comm_connect(dev_ctx *ctx, const dev_rank_info *ri) {
  return cuda_comm_connect(ctx->comm, ri, "init_comm");
}

static void c_comm_close(dev_ctx *ctx) {
  cuda_comm_close(ctx->comm);
  ctx->comm = NULL;
}

static int c_group_open(dev_ctx *ctx, dev_group *g, int color, int key) {
  return cuda_comm_split(ctx->comm, g, color, key);
}

static int c_coll(dev_stream *s, const dev_coll *g, int n, uint64_t seq) {
  dev_ctx *ctx = s->ctx;
  for (int i = 0; i < n; i++) {
    const dev_view *v[2] = {g[i].kind == DEV_COLL_RECV ? NULL : &g[i].send,
                            g[i].kind == DEV_COLL_SEND ? NULL : &g[i].recv};
    for (int k = 0; k < 2; k++)
      if (v[k] && v[k]->buf->kind != DEV_MEM_DEVICE)
        return dev_fail(ctx, DEV_ERR_INVALID, "%s: the %s tensor is in %s memory; NCCL needs device tensors",
                        dev_coll_name(g[i].kind), k ? "output" : "input", dev_memkind_name(v[k]->buf->kind));
  }
  cuda_tmark tm = {NULL};
  int rc = ctx->trace_gen ? cuda_trace_begin(ctx, CST(s)->st, &tm) : DEV_OK;
  if (rc == DEV_OK) rc = cuda_comm_run(ctx->comm, CST(s)->st, g, n, seq);
  rc = rc ? rc : enqueued(s, n > 1 ? "group" : dev_coll_name(g[0].kind), 0, 0);
  return tm.ev ? cuda_trace_coll(ctx, CST(s)->st, &tm, (int64_t)s->id, g, n, rc) : rc;
}

const dev_backend dev_cuda_backend = {
  .name = "cuda",
  .open = c_open,
  .close = c_close,
  .device_count = c_device_count,
  .device_info = c_device_info,
  .stream_init = c_stream_init,
  .stream_fini = c_stream_fini,
  .stream_idle = c_stream_idle,
  .stream_pos = c_stream_pos,
  .check_ptr = c_check_ptr,
  .stream_native = c_stream_native,
  .pos_done = c_pos_done,
  .pos_wait = c_pos_wait,
  .pos_wait_intr = c_pos_wait_intr,
  .watch = c_watch,
  .watch_done = c_watch_done,
  .watch_free = c_watch_free,
  .stream_wait = c_stream_wait,
  .event_init = c_event_init,
  .event_fini = c_event_fini,
  .event_record = c_event_record,
  .event_query = c_event_query,
  .event_sync = c_event_sync,
  .event_wait = c_event_wait,
  .event_elapsed = c_event_elapsed,
  .alloc = c_alloc,
  .free = c_free,
  .mem_total = c_mem_total,
  .trim = c_trim,
  .submit = c_submit,
  .stage_copy = c_stage_copy,
  .compile = dev_nvrtc_compile,
  .module_load = cuda_module_load,
  .module_unload = cuda_module_unload,
  .kernel_get = cuda_kernel_get,
  .kernel_names = cuda_kernel_names,
  .comm_open = c_comm_open,
  .comm_connect = c_comm_connect,
  .comm_close = c_comm_close,
  .coll = c_coll,
  .group_open = c_group_open,
  .trace_start = cuda_trace_start,
  .trace_flush = cuda_trace_flush,
  .trace_free = cuda_trace_free,
  .range_start = cuda_range_start,
  .range_end = cuda_range_end,
  .graph_build = cuda_graph_build,
  .graph_launch = cuda_graph_launch,
  .graph_free = cuda_graph_free,
};

/* Whether a usable GPU answers (for automatic selection).  Called before any
 * other CUDA call. */
int dev_cuda_available(void) {
  /* Kernels load on first use, and the built-in ones from a thread started
   * after the context's first op (loader.c), unless the user chose
   * otherwise. */
  setenv("CUDA_MODULE_LOADING", "LAZY", 0);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n > 0;
}
