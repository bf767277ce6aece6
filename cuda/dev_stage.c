/* Copies between pageable memory and the device, staged through pinned
 * slots: asynchronous and stream-ordered like a copy from pinned memory.
 *
 * A copy is a job: the pageable side (any strides) cut into n chunks of
 * whole elements, the device side contiguous, and nslot pinned slots of one
 * chunk each (one block of the pinned cache that dev_op.c allocates and
 * whose use it records on the stream, so it is reused only once the copy is
 * over).  Chunk k uses slot k % nslot.  The stream runs, in order:
 *
 *   pageable -> device:  gate 0, DMA 0, gate 1, DMA 1, ..., gate n-1, DMA n-1
 *   device -> pageable:  DMA 0, gate 1, DMA 1, ..., DMA n-1, gate n
 *
 * A DMA moves one chunk between its slot and the device (the backend's
 * asynchronous copy); a gate is a host function in stream order (cuda:
 * cudaLaunchHostFunc; host backend: called by the stream's worker).  The
 * threads of a per-context pool move chunks between the pageable memory and
 * the slots, each chunk in ppc pieces (a piece is one thread's work; a
 * chunk's pieces are taken together, so that every thread helps with the
 * first chunk of an H2D copy and the last of a D2H one):
 *
 *   H2D: chunk k may be filled once the job has started (gate 0, or at
 *        enqueue when no queued work writes the source) and its slot is
 *        free (chunk k - nslot's DMA is done, which gate k - nslot + 1
 *        says).  Gate k returns once chunk k is filled.
 *   D2H: gate k says chunk k - 1's DMA is done: it may be drained.  Gate k
 *        (k < n) returns once chunk k - nslot is drained (DMA k reuses its
 *        slot); gate n once every chunk is.
 *
 * So the stream passes the copy only when the pageable memory has given
 * (H2D) or holds (D2H) all its bytes: the device layer's uses and
 * host-access fences guard pageable memory exactly as they guard pinned.
 *
 * What holds here:
 * - Pieces are taken in order (job->next).  A gate that has to wait for a
 *   piece nobody has taken takes it itself: a gate only ever waits for a
 *   piece a thread is already copying, never for a later host function, so
 *   gates of several copies sharing one CUDA callback thread cannot
 *   deadlock, and a copy completes even with no pool thread at all.
 * - Everything a job counts is under its pool's mutex; the bytes are moved
 *   outside it, and a chunk is done once its ppc pieces are, each counted
 *   only after its last byte moved.
 * - A job is freed at its last reference: the submitter's, one per queued
 *   gate, the pool's list while it has pieces to hand out, one per piece a
 *   pool thread is copying.
 * - dev_stage_abort (a failed enqueue): no piece is taken any more, gates
 *   return at once, and it returns once no thread copies for the job.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "devpriv.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* A copy is cut into at most this many chunks, each a gate: on cuda a host
 * function, and the driver holds only a few dozen of those pending (about
 * 56 seen behind a blocked stream); past that cudaLaunchHostFunc blocks the
 * script until the stream catches up, a wait neither counted nor refused
 * by gpu.nosync.  Two copies queued behind other work stay well under it.
 * The chunks grow for that up to STAGE_MAX_GROWN (the staging memory of a
 * copy of more than 1 GiB stays bounded: it has more chunks). */
#define STAGE_MAX_CHUNKS 16
/* A chunk is copied by the threads in pieces of at least this much, so
 * that one chunk (the first of an H2D copy, the last of a D2H one) is not
 * one thread's alone: at 256 MiB, 37 / 41 GB/s against 29 / 34. */
#define STAGE_MIN_PIECE ((size_t)256 << 10)
/* Slots: one being copied by the threads, one moved by the DMA, and as
 * many ahead (measured: 4 as quick as 10 at 256 MiB). */
#define STAGE_SLOTS 4
#define STAGE_MAX_GROWN ((size_t)64 << 20)

typedef struct stage_step { dev_stage_job *job; int64_t k; } stage_step;

struct dev_stage_job {
  struct dev_stage_pool *pool;
  int refs;
  int h2d;
  int evict;                /* D2H: its drained pieces are evicted */
  int abort;
  int listed;
  dev_view host;            /* the pageable side: shape and strides */
  char *hbase;              /* its first element */
  char *dev;                /* the device side, contiguous */
  char *stage;              /* nslot slots of `chunk` bytes */
  size_t chunk, bytes, el;
  int64_t n, nslot;
  int64_t ppc;              /* pieces per chunk: a thread copies one piece */
  int64_t per, pe;          /* elements per chunk, per piece */
  /* under the pool's mutex */
  int started;              /* H2D: chunks may be filled */
  int64_t next;             /* the next piece to take (chunk next / ppc) */
  int64_t freed;            /* H2D: chunks whose DMA is done */
  int64_t posted;           /* D2H: chunks whose DMA is done */
  int64_t ndone;            /* chunks copied */
  int busy;                 /* threads copying a piece of it */
  dev_stage_job *qprev, *qnext;
  unsigned char *done;      /* per chunk: its pieces copied */
  stage_step *steps;        /* gate k's argument */
};

struct dev_stage_pool {
  pthread_mutex_t mu;
  pthread_cond_t work;      /* a chunk may be ready to take, or stop */
  pthread_cond_t done;      /* a chunk was copied, or a job aborted */
  dev_stage_job *head, *tail;   /* jobs with chunks left to take, oldest first */
  int64_t jobs;             /* live jobs */
  int stop, jitter;
  int nthreads;
  pthread_t th[64];
};

/* ---- configuration -------------------------------------------------- */

int dev_parse_size(const char *s, size_t *out) {
  if (!((*s >= '0' && *s <= '9') || *s == '.')) return -1;
  char *end;
  double v = strtod(s, &end);
  if (end == s) return -1;
  for (const char *p = s; p < end; p++)
    if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-'))
      return -1;
  int shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; break;
  case 'm': case 'M': shift = 20; break;
  case 'g': case 'G': shift = 30; break;
  case 't': case 'T': shift = 40; break;
  default: break;
  }
  if (shift) end++;
  if (*end || !isfinite(v)) return -1;
  double bytes = ldexp(v, shift);
  if (!(bytes >= 1) || bytes >= 0x1p63) return -1;
  *out = (size_t)bytes;
  return 0;
}

int dev_stage_config(dev_ctx *ctx, int dma) {
  ctx->stage_chunk = DEV_STAGE_CHUNK;
  ctx->stage_evict = dma;
  /* half the processors, 2 to 8: on an H100 host of 16, 8 threads moved
   * 256 MiB at 27-29 GB/s against 23 for 4; more did worse */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  ctx->stage_threads = ncpu >= 16 ? DEV_STAGE_THREADS : ncpu >= 4 ? (int)(ncpu / 2) : 2;
  const char *c = getenv("GPULUA_STAGE_CHUNK");
  if (c && *c) {
    size_t v;
    if (dev_parse_size(c, &v) || v < 8 || v > ((size_t)1 << 30))
      return dev_fail(ctx, DEV_ERR_INVALID,
                      "GPULUA_STAGE_CHUNK='%s' is not a chunk size (8 bytes to 1G, optionally followed by "
                      "K, M or G, powers of 1024: 8M, 512K)", c);
    ctx->stage_chunk = v;
  }
  const char *t = getenv("GPULUA_STAGE_THREADS");
  if (t && *t) {
    long v = 0;
    const char *p = t;
    for (; *p >= '0' && *p <= '9' && v <= 64; p++) v = v * 10 + (*p - '0');
    if (*p || v < 1 || v > 64)
      return dev_fail(ctx, DEV_ERR_INVALID, "GPULUA_STAGE_THREADS='%s' is not a thread count (an integer "
                      "from 1 to 64)", t);
    ctx->stage_threads = (int)v;
  }
  return DEV_OK;
}

void dev_stage_plan(dev_ctx *ctx, size_t bytes, size_t el, size_t *chunk, int64_t *nslot) {
  size_t c = ctx->stage_chunk;
  /* no finer for more threads: they share a chunk in pieces, and each
   * chunk costs a gate (about 30 us of the stream's time on an H200) */
  if (c > bytes) c = bytes;
  c -= c % el;
  if (c < el) c = el;
  /* few enough chunks: larger ones past the cap */
  size_t least = (bytes + STAGE_MAX_CHUNKS - 1) / STAGE_MAX_CHUNKS;
  if (least > STAGE_MAX_GROWN) least = STAGE_MAX_GROWN;
  if (c < least) c = (least + el - 1) / el * el;
  int64_t n = (int64_t)((bytes + c - 1) / c);
  *nslot = n < STAGE_SLOTS ? n : STAGE_SLOTS;
  *chunk = c;
}

/* ---- the pool --------------------------------------------------------- */

static void jitter(unsigned *seed) {
  /* one chunk in four, up to 0.5 ms: a gate that does not wait for its
   * chunk loses the race, and a copy of many chunks stays quick */
  unsigned r = (unsigned)rand_r(seed);
  if (r % 4) return;
  struct timespec ts = {0, (long)(r / 4 % 500) * 1000};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* memcpy whose stores bypass the caches (x86-64, from 64 KiB): a DMA that
 * reads a slot the CPU has just written through its caches runs at half
 * speed (H200, 1 MiB: 26 GB/s against 46 after streaming stores or from
 * an idle slot), and a pageable destination is not read for its
 * ownership first */
static void move_bytes(char *d, const char *s, size_t n) {
#if defined(__x86_64__)
  if (n >= ((size_t)64 << 10)) {
    size_t head = (size_t)(-(uintptr_t)d & 63);
    memcpy(d, s, head);
    d += head; s += head; n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
      __m128i a = _mm_loadu_si128((const __m128i *)s);
      __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
      __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
      __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
      _mm_stream_si128((__m128i *)d, a);
      _mm_stream_si128((__m128i *)(d + 16), b);
      _mm_stream_si128((__m128i *)(d + 32), c);
      _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
    _mm_sfence();
    return;
  }
#endif
  memcpy(d, s, n);
}

/* A slot drained by the threads stays in their caches, and a DMA writing
 * lines a core holds runs at a fraction of its speed (H200, a 4 MiB copy
 * drained by 8 threads: the next DMA into the slot took 230-500 us against
 * 85).  The pieces of a small copy (its slots fit the cores' caches) are
 * evicted once drained; a large copy's slots have left them by the time
 * they are written again, and evicting them costs more than it saves
 * (256 MiB: 30 GB/s against 42). */
#define STAGE_EVICT_MAX ((size_t)16 << 20)

static void evict(const char *a, size_t n) {
#if defined(__x86_64__)
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("clflushopt") != 0;
  }
  if (!have) return;
  for (const char *x = (const char *)((uintptr_t)a & ~(uintptr_t)63); x < a + n; x += 64)
    __asm__ volatile("clflushopt %0" : "+m"(*(volatile char *)x));
  _mm_sfence();
#else
  (void)a; (void)n;
#endif
}

/* Elements [e0, e1) of the view v in C order, to (pack) or from the packed
 * bytes at p. */
static void span_copy(const dev_view *v, char *base, size_t el, int64_t e0, int64_t e1, char *p, int pack) {
  if (dev_view_contiguous(v)) {
    char *q = base + (size_t)e0 * el;
    size_t n = (size_t)(e1 - e0) * el;
    if (pack) move_bytes(p, q, n); else move_bytes(q, p, n);
    return;
  }
  int nd = v->ndim, last = nd - 1;
  int64_t idx[DEV_MAXDIM], r = e0;
  for (int d = last; d >= 0; d--) {
    idx[d] = r % v->shape[d];
    r /= v->shape[d];
  }
  for (int64_t e = e0; e < e1;) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * v->stride[d];
    int64_t run = v->shape[last] - idx[last];
    if (run > e1 - e) run = e1 - e;
    char *q = base + (size_t)off * el;
    size_t step = (size_t)v->stride[last] * el;
    if (v->stride[last] == 1) {
      if (pack) move_bytes(p, q, (size_t)run * el); else move_bytes(q, p, (size_t)run * el);
      p += (size_t)run * el;
    } else {
      /* one element at a time, at a size the compiler knows */
#define STRIDED(N)                                                        \
      for (int64_t i = 0; i < run; i++, p += N, q += step) {             \
        if (pack) memcpy(p, q, N); else memcpy(q, p, N);                 \
      }
      switch (el) {
      case 1: STRIDED(1) break;
      case 2: STRIDED(2) break;
      case 4: STRIDED(4) break;
      default: STRIDED(8) break;
      }
#undef STRIDED
    }
    e += run;
    idx[last] += run;
    for (int d = last; d > 0 && idx[d] == v->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

static void unlist(dev_stage_job *j);

/* Under the pool's mutex: the last reference frees the job. */
static void job_unref(dev_stage_job *j) {
  if (--j->refs > 0) return;
  j->pool->jobs--;
  free(j);
}

/* the next piece may be taken */
static int piece_ready(const dev_stage_job *j) {
  if (j->abort || j->next >= j->n * j->ppc) return 0;
  int64_t k = j->next / j->ppc;
  if (j->h2d) return j->started && k < j->freed + j->nslot;
  return k < j->posted;
}

/* Under the mutex, which it drops while moving the bytes: piece job->next
 * (ready) is copied by the calling thread. */
static void take_piece(dev_stage_pool *p, dev_stage_job *j, unsigned *seed) {
  int64_t g = j->next++, k = g / j->ppc;
  if (j->next == j->n * j->ppc) unlist(j);
  j->busy++;
  pthread_mutex_unlock(&p->mu);
  int64_t total = (int64_t)(j->bytes / j->el), c0 = k * j->per;
  int64_t c1 = c0 + j->per < total ? c0 + j->per : total;
  int64_t e0 = c0 + (g % j->ppc) * j->pe, e1 = e0 + j->pe < c1 ? e0 + j->pe : c1;
  if (e0 < e1) {   /* the last pieces of a short chunk may be empty */
    if (p->jitter) jitter(seed);
    char *slot = j->stage + (size_t)(k % j->nslot) * j->chunk + (size_t)(e0 - c0) * j->el;
    span_copy(&j->host, j->hbase, j->el, e0, e1, slot, j->h2d);
    if (j->evict) evict(slot, (size_t)(e1 - e0) * j->el);
  }
  pthread_mutex_lock(&p->mu);
  if (++j->done[k] == j->ppc) j->ndone++;
  j->busy--;
  pthread_cond_broadcast(&p->done);
}

static void unlist(dev_stage_job *j) {
  dev_stage_pool *p = j->pool;
  if (!j->listed) return;
  if (j->qprev) j->qprev->qnext = j->qnext; else p->head = j->qnext;
  if (j->qnext) j->qnext->qprev = j->qprev; else p->tail = j->qprev;
  j->qprev = j->qnext = NULL;
  j->listed = 0;
  job_unref(j);   /* never the last: the caller holds one */
}

static void *pool_thread(void *arg) {
  dev_stage_pool *p = arg;
  unsigned seed = (unsigned)(uintptr_t)&seed ^ (unsigned)time(NULL);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    dev_stage_job *j = NULL;
    while (!p->stop) {
      for (j = p->head; j && !piece_ready(j); j = j->qnext) {}
      if (j) break;
      pthread_cond_wait(&p->work, &p->mu);
    }
    if (p->stop) break;
    j->refs++;
    take_piece(p, j, &seed);
    job_unref(j);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* The pool, with its threads started on the first staged copy.  A thread
 * that cannot start is done without: gates copy what no thread takes. */
static dev_stage_pool *pool_get(dev_ctx *ctx) {
  if (ctx->stage) return ctx->stage;
  dev_stage_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  p->jitter = ctx->jitter;
  /* no signals: Ctrl-C reaches the interpreter thread */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (int i = 0; i < ctx->stage_threads && i < 64; i++) {
    if (pthread_create(&p->th[p->nthreads], NULL, pool_thread, p)) break;
    p->nthreads++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  ctx->stage = p;
  return p;
}

void dev_stage_shutdown(dev_ctx *ctx) {
  dev_stage_pool *p = ctx->stage;
  if (!p) return;
  ctx->stage = NULL;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->th[i], NULL);
  pthread_mutex_lock(&p->mu);
  while (p->head) {
    dev_stage_job *j = p->head;
    j->refs++;
    unlist(j);
    job_unref(j);
  }
  int64_t left = p->jobs;
  pthread_mutex_unlock(&p->mu);
  /* Every stream has drained, so every gate has run; jobs left are those of
   * a CUDA context that died with gates queued, which may name the pool:
   * it is then kept. */
  if (left) return;
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  free(p);
}

/* ---- jobs ------------------------------------------------------------- */

int dev_stage_new(dev_ctx *ctx, int h2d, const dev_view *host, void *dev, void *stage, size_t chunk,
                  int64_t nslot, dev_stage_job **out) {
  *out = NULL;
  dev_stage_pool *p = pool_get(ctx);
  size_t el = dev_dtype_size(host->dtype);
  size_t bytes = (size_t)dev_view_numel(host) * el;
  int64_t n = (int64_t)((bytes + chunk - 1) / chunk);
  dev_stage_job *j = p ? calloc(1, sizeof *j + (size_t)(n + 1) * sizeof(stage_step) + (size_t)n) : NULL;
  if (!j) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (a staged copy)");
  j->steps = (stage_step *)(j + 1);
  j->done = (unsigned char *)(j->steps + n + 1);
  for (int64_t k = 0; k <= n; k++) j->steps[k] = (stage_step){j, k};
  j->pool = p;
  j->refs = 2;   /* the submitter's and the list's */
  j->h2d = h2d;
  j->evict = !h2d && ctx->stage_evict && bytes <= STAGE_EVICT_MAX;
  j->host = *host;
  j->hbase = dev_view_ptr(host);
  j->dev = dev;
  j->stage = stage;
  j->chunk = chunk;
  j->bytes = bytes;
  j->el = el;
  j->n = n;
  j->nslot = nslot;
  /* a chunk is shared by the threads, in pieces of at least STAGE_MIN_PIECE,
   * so that the first (H2D) or last (D2H) is not one thread's alone */
  j->per = (int64_t)(chunk / el);
  int64_t ppc = (int64_t)(chunk / STAGE_MIN_PIECE);
  if (ppc > ctx->stage_threads) ppc = ctx->stage_threads;
  if (ppc < 1) ppc = 1;
  j->pe = (j->per + ppc - 1) / ppc;
  j->ppc = ppc;
  pthread_mutex_lock(&p->mu);
  p->jobs++;
  j->listed = 1;
  j->qprev = p->tail;
  if (p->tail) p->tail->qnext = j; else p->head = j;
  p->tail = j;
  pthread_mutex_unlock(&p->mu);
  *out = j;
  return DEV_OK;
}

void dev_stage_start(dev_stage_job *j) {
  dev_stage_pool *p = j->pool;
  pthread_mutex_lock(&p->mu);
  j->started = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
}

void dev_stage_retain(dev_stage_job *j) {
  dev_stage_pool *p = j->pool;
  pthread_mutex_lock(&p->mu);
  j->refs++;
  pthread_mutex_unlock(&p->mu);
}

void dev_stage_release(dev_stage_job *j) {
  if (!j) return;
  dev_stage_pool *p = j->pool;
  pthread_mutex_lock(&p->mu);
  job_unref(j);
  pthread_mutex_unlock(&p->mu);
}

void dev_stage_abort(dev_stage_job *j) {
  dev_stage_pool *p = j->pool;
  pthread_mutex_lock(&p->mu);
  j->abort = 1;
  unlist(j);
  pthread_cond_broadcast(&p->done);
  while (j->busy) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/* Under the mutex: until chunk m is copied (m < 0: every chunk), taking
 * the pieces up to it that no thread has taken. */
static void wait_chunk(dev_stage_pool *p, dev_stage_job *j, int64_t m, unsigned *seed) {
  for (;;) {
    if (j->abort || (m < 0 ? j->ndone == j->n : j->done[m] == j->ppc)) return;
    if (piece_ready(j) && (m < 0 || j->next / j->ppc <= m)) take_piece(p, j, seed);
    else pthread_cond_wait(&p->done, &p->mu);
  }
}

/* A gate: a host function in stream order (see the top of the file). */
static void gate(void *arg) {
  stage_step *st = arg;
  dev_stage_job *j = st->job;
  dev_stage_pool *p = j->pool;
  int64_t k = st->k;
  unsigned seed = (unsigned)(uintptr_t)arg ^ (unsigned)k;
  pthread_mutex_lock(&p->mu);
  if (j->h2d) {
    if (k == 0) j->started = 1;
    else j->freed = k;
    pthread_cond_broadcast(&p->work);
    wait_chunk(p, j, k, &seed);
  } else {
    j->posted = k;
    pthread_cond_broadcast(&p->work);
    if (k == j->n) wait_chunk(p, j, -1, &seed);
    else if (k >= j->nslot) wait_chunk(p, j, k - j->nslot, &seed);
  }
  job_unref(j);
  pthread_mutex_unlock(&p->mu);
}

static int emit_gate(dev_stage_job *j, int64_t k, dev_stage_fn fn, void *ud) {
  dev_stage_retain(j);
  int rc = fn(ud, gate, &j->steps[k]);
  if (rc) dev_stage_release(j);   /* it will not run */
  return rc;
}

int dev_stage_emit(dev_stage_job *j, dev_stage_fn fn, dev_stage_copy copy, void *ud) {
  int rc = DEV_OK;
  for (int64_t k = 0; k < j->n && rc == DEV_OK; k++) {
    char *slot = j->stage + (size_t)(k % j->nslot) * j->chunk;
    size_t off = (size_t)k * j->chunk;
    size_t len = j->bytes - off < j->chunk ? j->bytes - off : j->chunk;
    if (j->h2d) {
      rc = emit_gate(j, k, fn, ud);
      if (rc == DEV_OK) rc = copy(ud, j->dev + off, slot, len);
    } else {
      rc = copy(ud, slot, j->dev + off, len);
      if (rc == DEV_OK) rc = emit_gate(j, k + 1, fn, ud);
    }
  }
  return rc;
}

int64_t dev_stage_chunks(const dev_stage_job *j) { return j->n; }
