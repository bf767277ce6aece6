/* Copies between pageable memory and the device, staged through pinned
 * slots: asynchronous and stream-ordered like a copy from pinned memory.
 *
 * A copy is a job: the pageable side (any strides) cut into n chunks of
 * whole elements, the device side contiguous, and nslot pinned slots of one
 * chunk each (one block of the pinned cache that dev_op.c allocates and
 * whose use it records on the stream, so it is reused only once the copy is
 * over).  Chunk k uses slot k % nslot.  The job has a record of three words
 * in pinned memory (stage_flags): host, written by the pool's threads (the
 * chunks filled, or drained, in order), dev and start, written by the
 * stream.  The stream runs, in order (wait: until host >= v; post: write):
 *
 *   pageable -> device:  [post start 1], then for each k:
 *                        wait k + 1, DMA k, post dev k + 1
 *   device -> pageable:  for each k: [wait k - nslot + 1 once k >= nslot],
 *                        DMA k, post dev k + 1; then wait n, post dev n + 1
 *
 * A DMA moves one chunk between its slot and the device (the backend's
 * asynchronous copy); a wait and a post are the stream's own (cuda: stream
 * memory operations, cuStreamWaitValue32 / cuStreamWriteValue32; the host
 * backend's worker looks at and writes the words).  No host function: the
 * stream never waits for a CPU thread to be woken.  The threads of a
 * per-context pool move chunks between the pageable memory and the slots,
 * each chunk in ppc pieces (a piece is one thread's work; a chunk's pieces
 * are taken together, so that every thread helps with the first chunk of
 * an H2D copy and the last of a D2H one):
 *
 *   H2D: chunk k may be filled once the job has started (start, or at
 *        enqueue when no queued work writes the source) and its slot is
 *        free (dev >= k - nslot + 1).
 *   D2H: chunk k may be drained once dev >= k + 1.
 *
 * While some job waits on its stream and no piece is ready, one thread
 * watches the words (spinning briefly, then napping).  So the stream passes
 * the copy only when the pageable memory has given (H2D) or holds (D2H) all
 * its bytes: the device layer's uses and host-access fences guard pageable
 * memory exactly as they guard pinned.
 *
 * What holds here:
 * - The threads never wait for the stream or the script, only for the
 *   mutex: the stream waits for them, never the reverse, so a copy cannot
 *   deadlock, however many are queued on however many streams.  The pool
 *   has one thread at least (dev_stage_new fails otherwise).
 * - Pieces are taken in order (job->next).  Everything a job counts is
 *   under its pool's mutex; the bytes are moved outside it, and host is
 *   written only after the chunks it counts moved their last byte
 *   (streaming stores are fenced first).
 * - A record is reset for a new job only once its last job is freed and
 *   the stream has run that job's last post (dev == final), or the job was
 *   aborted and its stream waited for: no step of an old job can read or
 *   write a reused record.
 * - A job is freed at its last reference: the submitter's, the backend's
 *   while it runs the steps (host backend), the pool's list while it has
 *   pieces to hand out, one per piece a pool thread is copying.
 * - dev_stage_abort (a failed enqueue): no piece is taken any more, host
 *   is set past every wait, and it returns once no thread copies for the
 *   job; the backend then waits for the steps it had enqueued.
 * - A source job (dev_copy_source: H2D, its bytes made by a dev_source,
 *   an inflated file member) has one piece per chunk, and a chunk is taken
 *   only once the one before it is filled: one thread at a time fills it,
 *   in order, while other threads work for other jobs (several members
 *   inflate at once).  A fill that fails is the context's async error,
 *   named with the job's script position; no piece is taken any more and
 *   host is set to n, so the stream passes the job's steps (copying what
 *   the slots hold), and the record is released as any other.  The source
 *   is closed when the job is freed.
 */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "devpriv.h"
#include "stage.h"
#include "util.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* A copy is cut into at most this many chunks: each is three steps on the
 * stream, and the stream's queue is bounded (past it an enqueue waits for
 * the stream, a wait neither counted nor refused by gpu.nosync); chunks of
 * 8 to 16 MiB moved 256 MiB fastest anyway (H200: 1 MiB chunks 20-45%
 * slower).  The chunks grow for that up to STAGE_MAX_GROWN (the staging
 * memory of a copy of more than 1 GiB stays bounded: it has more chunks). */
#define STAGE_MAX_CHUNKS 16
/* A chunk is copied by the threads in pieces of at least this much, so
 * that one chunk (the first of an H2D copy, the last of a D2H one) is not
 * one thread's alone: at 256 MiB, 37 / 41 GB/s against 29 / 34. */
#define STAGE_MIN_PIECE ((size_t)256 << 10)
#define STAGE_MIN_CHUNK ((size_t)1 << 20)   /* a copy is not cut finer for the pipeline */
/* Slots: one being copied by the threads, one moved by the DMA, and as
 * many ahead (measured: 4 as quick as 10 at 256 MiB). */
#define STAGE_SLOTS 4
#define STAGE_MAX_GROWN ((size_t)64 << 20)

/* A job's words shared with the stream, in pinned memory both sides reach:
 * host is written by the pool (H2D: chunks filled; D2H: chunks drained, in
 * order), dev and start by the stream (chunks whose DMA is done, then n + 1
 * once a D2H copy's last wait passed; start: an H2D copy's turn came).  On
 * their own cache lines: the device polls one, the host the other. */
typedef struct stage_flags {
  volatile uint32_t host;
  uint32_t pad0[15];
  volatile uint32_t dev;
  volatile uint32_t start;
  uint32_t pad1[14];
} stage_flags;

/* Records of flags, STAGE_ARENA to a block of pinned memory.  A record is
 * free (0), a live job's (1), or released (2): its job is freed and the
 * stream may still be before the job's last step, which writes final to
 * dev; it is free again once dev says so.  So a record is reset only when
 * no step of its last job can still read or write it. */
#define STAGE_ARENA 512
typedef struct stage_arena {
  struct stage_arena *next;
  stage_flags *rec;
  uint32_t final[STAGE_ARENA];
  unsigned char state[STAGE_ARENA];
} stage_arena;

struct dev_stage_job {
  struct dev_stage_pool *pool;
  int refs;
  int h2d;
  int evict;                /* D2H: its drained pieces are evicted */
  int abort;
  int failed;               /* a source's fill failed */
  int listed;
  dev_source src;           /* a source job's (fill NULL otherwise) */
  dev_ctx *ctx;
  char site[DEV_SITE_LEN];  /* where a source job was queued */
  dev_view host;            /* the pageable side: shape and strides */
  char *hbase;              /* its first element */
  char *dev;                /* the device side, contiguous */
  char *stage;              /* nslot slots of `chunk` bytes */
  size_t chunk, bytes, el;
  int64_t n, nslot;
  int64_t ppc;              /* pieces per chunk: a thread copies one piece */
  int64_t per, pe;          /* elements per chunk, per piece */
  stage_flags *fl;          /* its record, in arena ar at idx */
  stage_arena *ar;
  int idx;
  uint32_t final;           /* the last value its steps write to fl->dev */
  /* under the pool's mutex */
  int started;              /* H2D: chunks may be filled */
  int64_t next;             /* the next piece to take (chunk next / ppc) */
  int64_t freed;            /* H2D: chunks whose DMA is done */
  int64_t posted;           /* D2H: chunks whose DMA is done */
  int64_t ndone;            /* chunks copied, in order (what fl->host says) */
  int busy;                 /* threads copying a piece of it */
  dev_stage_job *qprev, *qnext;
  unsigned char *done;      /* per chunk: its pieces copied */
};

struct dev_stage_pool {
  dev_ctx *ctx;             /* its backend's memory, for the arenas */
  pthread_mutex_t mu;
  pthread_cond_t work;      /* a piece may be ready to take, or stop */
  pthread_cond_t done;      /* a job aborted and a thread left it */
  dev_stage_job *head, *tail;   /* jobs with pieces left to take, oldest first */
  int64_t jobs;             /* live jobs */
  size_t source_bytes;      /* the slots of live source jobs */
  stage_arena *arenas;
  int polling;              /* a thread watches the streams' words */
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

static int can_evict(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("clflushopt") != 0;
#else
  return 0;
#endif
}

int dev_stage_config(dev_ctx *ctx, int dma) {
  ctx->stage_chunk = DEV_STAGE_CHUNK;
  ctx->stage_evict = dma && can_evict();
  /* half the processors, 2 to 8: on an H100 host of 16, 8 threads moved
   * 256 MiB at 27-29 GB/s against 23 for 4; more did worse */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  ctx->stage_threads = ncpu >= 16 ? DEV_STAGE_THREADS : ncpu >= 4 ? (int)(ncpu / 2) : 2;
  const char *c = env_setting("GPULUA_STAGE_CHUNK");
  if (c && *c) {
    size_t v;
    if (dev_parse_size(c, &v) || v < 8 || v > ((size_t)1 << 30))
      return dev_fail(ctx, DEV_ERR_INVALID,
                      "GPULUA_STAGE_CHUNK='%s' is not a chunk size (8 bytes to 1G, optionally followed by "
                      "K, M or G, powers of 1024: 8M, 512K)", c);
    ctx->stage_chunk = v;
  }
  const char *t = env_setting("GPULUA_STAGE_THREADS");
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
  /* four chunks or more where they can be 1 MiB: the threads work on one
   * while the DMA engine moves another (H200, 4 MiB D2H in 1 MiB chunks
   * 19.7-22.6 GB/s against 17.3-18.0 in one; H2D the same either way) */
  size_t quarter = (bytes / 4 + 65535) & ~(size_t)65535;
  if (quarter < STAGE_MIN_CHUNK) quarter = STAGE_MIN_CHUNK;
  if (quarter < c) c = quarter;
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

static void release_record(dev_stage_job *j) {
  if (!j->ar) return;
  /* aborted: the backend waited for the steps it had enqueued */
  j->ar->state[j->idx] = j->abort ? 0 : 2;
  j->ar->final[j->idx] = j->final;
  j->ar = NULL;
}

/* Under the pool's mutex: the last reference frees the job. */
static void job_unref(dev_stage_job *j) {
  if (--j->refs > 0) return;
  release_record(j);
  j->pool->jobs--;
  if (j->src.fill) j->pool->source_bytes -= j->chunk * (size_t)j->nslot;
  if (j->src.close) j->src.close(j->src.ud);
  free(j);
}

/* the next piece may be taken */
static int piece_ready(const dev_stage_job *j) {
  if (j->abort || j->failed || j->next >= j->n * j->ppc) return 0;
  int64_t k = j->next / j->ppc;
  if (j->src.fill && (j->busy || k != j->ndone)) return 0;   /* in order, one at a time */
  if (j->h2d) return j->started && k < j->freed + j->nslot;
  return k < j->posted;
}

/* Under the mutex: what the stream has said since (0: nothing new). */
static int refresh(dev_stage_job *j) {
  uint32_t d = __atomic_load_n(&j->fl->dev, __ATOMIC_ACQUIRE);
  int64_t v = d > (uint32_t)j->n ? j->n : (int64_t)d;
  if (j->h2d) {
    int got = 0;
    if (!j->started && __atomic_load_n(&j->fl->start, __ATOMIC_ACQUIRE)) j->started = got = 1;
    if (v > j->freed) j->freed = v, got = 1;
    return got;
  }
  if (v > j->posted) { j->posted = v; return 1; }
  return 0;
}

/* Under the mutex, which it drops while moving the bytes: piece job->next
 * (ready) is copied by the calling thread.  A chunk's last piece tells the
 * stream, through fl->host, how many chunks are done in order. */
static void take_piece(dev_stage_pool *p, dev_stage_job *j, unsigned *seed) {
  int64_t g = j->next++, k = g / j->ppc;
  if (j->next == j->n * j->ppc) unlist(j);
  j->busy++;
  pthread_mutex_unlock(&p->mu);
  int64_t total = (int64_t)(j->bytes / j->el), c0 = k * j->per;
  int64_t c1 = c0 + j->per < total ? c0 + j->per : total;
  int64_t e0 = c0 + (g % j->ppc) * j->pe, e1 = e0 + j->pe < c1 ? e0 + j->pe : c1;
  char err[400];
  int failed = 0;
  if (e0 < e1) {   /* the last pieces of a short chunk may be empty */
    if (p->jitter) jitter(seed);
    char *slot = j->stage + (size_t)(k % j->nslot) * j->chunk + (size_t)(e0 - c0) * j->el;
    if (j->src.fill) failed = j->src.fill(j->src.ud, slot, (size_t)(e1 - e0) * j->el, err, sizeof err) != 0;
    else span_copy(&j->host, j->hbase, j->el, e0, e1, slot, j->h2d);
    if (j->evict) evict(slot, (size_t)(e1 - e0) * j->el);
  }
  pthread_mutex_lock(&p->mu);
  if (failed) {
    j->failed = 1;
    unlist(j);
    dev_async_fail(j->ctx, "%s%s%s", j->site, *j->site ? ": " : "", err);
    if (!j->abort) __atomic_store_n(&j->fl->host, (uint32_t)j->n, __ATOMIC_RELEASE);
  } else if (++j->done[k] == j->ppc && k == j->ndone) {
    while (j->ndone < j->n && j->done[j->ndone] == j->ppc) j->ndone++;
    if (!j->abort) __atomic_store_n(&j->fl->host, (uint32_t)j->ndone, __ATOMIC_RELEASE);
  }
  j->busy--;
  if (j->abort) pthread_cond_broadcast(&p->done);
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

/* Waiting for the streams: a pool thread watches the words of the jobs
 * listed while none has a piece ready.  It spins for STAGE_SPIN_US after
 * the last news (a chunk's DMA is tens of us), then looks every
 * STAGE_NAP_US, and every STAGE_SLEEP_US once nothing came for
 * STAGE_QUIET_US (a copy queued behind long work). */
#define STAGE_SPIN_US 200
#define STAGE_NAP_US 20
#define STAGE_QUIET_US 20000
#define STAGE_SLEEP_US 200

static void *pool_thread(void *arg) {
  dev_stage_pool *p = arg;
  unsigned seed = (unsigned)(uintptr_t)&seed ^ (unsigned)time(NULL);
  uint64_t news = dev_trace_now();   /* ns */
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (p->stop) break;
    dev_stage_job *j, *ready = NULL;
    int waiting = 0, got = 0;
    for (j = p->head; j; j = j->qnext) {
      if (!piece_ready(j) && refresh(j)) got = 1;
      if (piece_ready(j)) { if (!ready) ready = j; }
      else if (!j->abort) waiting = 1;
    }
    if (got) {
      pthread_cond_broadcast(&p->work);
      news = dev_trace_now();
    }
    if (ready) {
      ready->refs++;
      take_piece(p, ready, &seed);
      job_unref(ready);
      news = dev_trace_now();
      continue;
    }
    if (!waiting || p->polling) {
      pthread_cond_wait(&p->work, &p->mu);
      news = dev_trace_now();
      continue;
    }
    /* this thread watches; the others sleep until it or a new job wakes them */
    p->polling = 1;
    pthread_mutex_unlock(&p->mu);
    uint64_t quiet = (dev_trace_now() - news) / 1000;   /* us */
    if (quiet < STAGE_SPIN_US) {
#if defined(__x86_64__)
      for (int i = 0; i < 64; i++) _mm_pause();
#else
      sched_yield();
#endif
    } else {
      struct timespec ts = {0, (quiet < STAGE_QUIET_US ? STAGE_NAP_US : STAGE_SLEEP_US) * 1000L};
      nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&p->mu);
    p->polling = 0;
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* The pool, with its threads started on the first staged copy.  It needs
 * one thread at least: the stream waits for what the threads copy. */
static dev_stage_pool *pool_get(dev_ctx *ctx) {
  if (ctx->stage) return ctx->stage;
  dev_stage_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->ctx = ctx;
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
  if (!p->nthreads) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    free(p);
    return NULL;
  }
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
  /* Every stream has drained, so no step reads a record any more; jobs
   * left are those of a CUDA context that died with copies queued, whose
   * records it may still name: the pool is then kept. */
  if (left) return;
  for (stage_arena *a = p->arenas, *next; a; a = next) {
    next = a->next;
    ctx->bk->free(ctx, DEV_MEM_PINNED, a->rec, sizeof(stage_flags) * STAGE_ARENA);
    free(a);
  }
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  free(p);
}

/* Under the mutex: a record no step can still touch, reset.  A new arena
 * is allocated outside the mutex (a pinned allocation may wait for the
 * device, whose streams may wait for the threads, which need the mutex). */
static int take_record(dev_stage_pool *p, dev_stage_job *j) {
  for (int pass = 0; pass < 2; pass++) {
    for (stage_arena *a = p->arenas; a; a = a->next) {
      for (int i = 0; i < STAGE_ARENA; i++) {
        if (a->state[i] == 1) continue;
        if (a->state[i] == 2 && (int32_t)(__atomic_load_n(&a->rec[i].dev, __ATOMIC_ACQUIRE) - a->final[i]) < 0)
          continue;
        a->state[i] = 1;
        stage_flags *f = &a->rec[i];
        f->host = 0;
        f->dev = 0;
        f->start = 0;
        j->fl = f;
        j->ar = a;
        j->idx = i;
        return DEV_OK;
      }
    }
    if (pass) break;
    pthread_mutex_unlock(&p->mu);
    stage_arena *a = calloc(1, sizeof *a);
    void *mem = NULL;
    int bad = !a || p->ctx->bk->alloc(p->ctx, DEV_MEM_PINNED, sizeof(stage_flags) * STAGE_ARENA, &mem);
    pthread_mutex_lock(&p->mu);
    if (bad) {
      free(a);
      return DEV_ERR_NOMEM;
    }
    a->rec = mem;
    a->next = p->arenas;
    p->arenas = a;
  }
  return DEV_ERR_NOMEM;
}

/* ---- jobs ------------------------------------------------------------- */

/* A job of bytes (whole elements of el bytes to a piece, ppc pieces to a
 * chunk), its pageable side host or its bytes made by src, listed in its
 * pool; or NULL, the message set. */
static dev_stage_job *job_new(dev_ctx *ctx, int h2d, const dev_view *host, const dev_source *src, size_t bytes,
                              size_t el, void *dev, void *stage, size_t chunk, int64_t nslot, int64_t ppc) {
  dev_stage_pool *p = pool_get(ctx);
  if (!p) {
    dev_fail(ctx, DEV_ERR_NOMEM, "cannot start the threads of a staged copy");
    return NULL;
  }
  int64_t n = (int64_t)((bytes + chunk - 1) / chunk);
  dev_stage_job *j = calloc(1, sizeof *j + (size_t)n);
  if (!j) {
    dev_fail(ctx, DEV_ERR_NOMEM, "out of memory (a staged copy)");
    return NULL;
  }
  j->done = (unsigned char *)(j + 1);
  j->pool = p;
  j->ctx = ctx;
  j->refs = 2;   /* the submitter's and the list's */
  j->h2d = h2d;
  j->evict = !h2d && ctx->stage_evict && bytes <= STAGE_EVICT_MAX;
  if (host) {
    j->host = *host;
    j->hbase = dev_view_ptr(host);
  }
  if (src) {
    j->src = *src;
    snprintf(j->site, sizeof j->site, "%s", ctx->site);
  }
  j->dev = dev;
  j->stage = stage;
  j->chunk = chunk;
  j->bytes = bytes;
  j->el = el;
  j->n = n;
  j->nslot = nslot;
  j->per = (int64_t)(chunk / el);
  j->pe = (j->per + ppc - 1) / ppc;
  j->ppc = ppc;
  pthread_mutex_lock(&p->mu);
  if (take_record(p, j)) {
    pthread_mutex_unlock(&p->mu);
    free(j);
    dev_fail(ctx, DEV_ERR_NOMEM, "out of pinned memory (a staged copy's flags)");
    return NULL;
  }
  p->jobs++;
  if (src) p->source_bytes += chunk * (size_t)nslot;
  j->listed = 1;
  j->qprev = p->tail;
  if (p->tail) p->tail->qnext = j; else p->head = j;
  p->tail = j;
  pthread_cond_broadcast(&p->work);   /* a thread watches its words */
  pthread_mutex_unlock(&p->mu);
  return j;
}

int dev_stage_new(dev_ctx *ctx, int h2d, const dev_view *host, void *dev, void *stage, size_t chunk,
                  int64_t nslot, dev_stage_job **out) {
  size_t el = dev_dtype_size(host->dtype);
  size_t bytes = (size_t)dev_view_numel(host) * el;
  /* a chunk is shared by the threads, in pieces of at least STAGE_MIN_PIECE,
   * so that the first (H2D) or last (D2H) is not one thread's alone */
  int64_t ppc = (int64_t)(chunk / STAGE_MIN_PIECE);
  if (ppc > ctx->stage_threads) ppc = ctx->stage_threads;
  if (ppc < 1) ppc = 1;
  *out = job_new(ctx, h2d, host, NULL, bytes, el, dev, stage, chunk, nslot, ppc);
  return *out ? DEV_OK : DEV_ERR_NOMEM;
}

int dev_stage_new_source(dev_ctx *ctx, const dev_source *src, size_t bytes, void *dev, void *stage,
                         size_t chunk, int64_t nslot, dev_stage_job **out) {
  *out = job_new(ctx, 1, NULL, src, bytes, 1, dev, stage, chunk, nslot, 1);
  return *out ? DEV_OK : DEV_ERR_NOMEM;
}

size_t dev_stage_source_bytes(dev_ctx *ctx) {
  dev_stage_pool *p = ctx->stage;
  if (!p) return 0;
  pthread_mutex_lock(&p->mu);
  size_t n = p->source_bytes;
  pthread_mutex_unlock(&p->mu);
  return n;
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
  /* every wait it enqueued passes */
  __atomic_store_n(&j->fl->host, (uint32_t)j->n + 1, __ATOMIC_RELEASE);
  while (j->busy) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/* The steps, in stream order (see the top of the file).  What a failed
 * call did not enqueue never runs; the caller aborts the job. */
int dev_stage_emit(dev_stage_job *j, const dev_stage_ops *ops, void *ud) {
  stage_flags *f = j->fl;
  int rc = DEV_OK;
  int started;
  pthread_mutex_lock(&j->pool->mu);
  started = j->started;
  j->final = j->h2d ? (uint32_t)j->n : (uint32_t)j->n + 1;
  pthread_mutex_unlock(&j->pool->mu);
  if (j->h2d && !started) rc = ops->post(ud, &f->start, 1);
  for (int64_t k = 0; k < j->n && rc == DEV_OK; k++) {
    char *slot = j->stage + (size_t)(k % j->nslot) * j->chunk;
    size_t off = (size_t)k * j->chunk;
    size_t len = j->bytes - off < j->chunk ? j->bytes - off : j->chunk;
    if (j->h2d) {
      rc = ops->wait(ud, &f->host, (uint32_t)k + 1);
      if (rc == DEV_OK) rc = ops->copy(ud, j->dev + off, slot, len);
    } else {
      if (k >= j->nslot) rc = ops->wait(ud, &f->host, (uint32_t)(k - j->nslot) + 1);
      if (rc == DEV_OK) rc = ops->copy(ud, slot, j->dev + off, len);
    }
    if (rc == DEV_OK) rc = ops->post(ud, &f->dev, (uint32_t)k + 1);
  }
  if (!j->h2d && rc == DEV_OK) rc = ops->wait(ud, &f->host, (uint32_t)j->n);
  if (!j->h2d && rc == DEV_OK) rc = ops->post(ud, &f->dev, (uint32_t)j->n + 1);
  return rc;
}
