/* Compiled host kernels (kcompile.c): loading and running.
 *
 * A module is the compiler's shared object, written to a temporary file
 * and dlopen'ed (each load its own copy, as CUDA modules have their own
 * globals).  A launch runs on the stream's worker thread: its blocks are
 * shared out to a process-wide pool of block workers (GPULUA_HOST_THREADS,
 * default one per CPU, the stream's worker counted), each running whole
 * blocks, one at a time.  A block's threads run one after the other in a
 * loop the compiler sees through (gpulua_hk_kernel.run_blocks), unless the
 * module uses barriers or warp primitives; then they run as fibers that
 * switch at those calls (not yet). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hk.h"
#define GPULUA_HK_ABI_ONLY
#include "host/cuda_device_rt.h"

/* As an H100's: a block of 1024 threads, and dynamic shared memory up to
 * the 227 KiB a kernel may opt in to there (host kernels need no opt-in). */
#define HK_MAX_THREADS 1024
#define HK_MAX_DYN_SHARED ((size_t)232448)

typedef struct hk_mod hk_mod;

typedef struct hk_kern {
  hk_mod *mod;
  const gpulua_hk_kernel *k;
} hk_kern;

struct hk_mod {
  void *dl;
  const gpulua_hk_module *m;
  int fibers;                   /* its threads need fibers */
  hk_kern *ks;                  /* one per kernel of m */
};

/* ---- modules -------------------------------------------------------------- */

int hk_module_load(dev_ctx *ctx, const void *image, size_t len, void **impl)
{
  char path[1100];
  const char *td = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/gpulua-k-XXXXXX", td && *td ? td : "/tmp");
  int fd = mkostemp(path, O_CLOEXEC);
  if (fd < 0) {
    snprintf(path, sizeof path, "/tmp/gpulua-k-XXXXXX");
    fd = mkostemp(path, O_CLOEXEC);
  }
  if (fd < 0) return dev_fail(ctx, DEV_ERR_DEVICE, "load module: cannot create a temporary file: %s", strerror(errno));
  const char *p = image;
  size_t left = len;
  while (left > 0) {
    ssize_t k = write(fd, p, left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = errno;
      close(fd);
      unlink(path);
      return dev_fail(ctx, DEV_ERR_DEVICE, "load module: cannot write %s: %s", path, strerror(e));
    }
    p += k;
    left -= (size_t)k;
  }
  close(fd);
  /* a fresh name per load: dlopen would hand back an object already loaded
   * under the same name */
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const char *why = dl ? NULL : dlerror();
  unlink(path);
  if (!dl) return dev_fail(ctx, DEV_ERR_DEVICE, "load module: %s", why ? why : "dlopen failed");
  const gpulua_hk_module *m = dlsym(dl, "gpulua_hk_mod");
  if (!m || m->abi != GPULUA_HK_ABI) {
    dlclose(dl);
    return dev_fail(ctx, DEV_ERR_DEVICE, "load module: not a module of this gpulua's host kernels (interface %d)",
                    GPULUA_HK_ABI);
  }
  hk_mod *hm = calloc(1, sizeof *hm);
  hk_kern *ks = calloc(m->nkernels > 0 ? (size_t)m->nkernels : 1, sizeof *ks);
  if (!hm || !ks) {
    free(hm);
    free(ks);
    dlclose(dl);
    return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  }
  hm->dl = dl;
  hm->m = m;
  hm->fibers = dlsym(dl, "gpulua_hk_fibers") != NULL;
  hm->ks = ks;
  for (int i = 0; i < m->nkernels; i++) {
    ks[i].mod = hm;
    ks[i].k = m->kernels[i];
  }
  *impl = hm;
  return DEV_OK;
}

void hk_module_unload(dev_ctx *ctx, void *impl)
{
  (void)ctx;
  hk_mod *hm = impl;
  if (!hm) return;
  dlclose(hm->dl);
  free(hm->ks);
  free(hm);
}

int hk_kernel_get(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k, size_t *sizes, int max,
                  int *nparams)
{
  hk_mod *hm = impl;
  const gpulua_hk_kernel *kk = dlsym(hm->dl, symbol);
  hk_kern *found = NULL;
  for (int i = 0; kk && i < hm->m->nkernels; i++)
    if (hm->ks[i].k == kk) found = &hm->ks[i];
  if (!found) return dev_fail(ctx, DEV_ERR_DEVICE, "kernel '%.200s' not found in the module", symbol);
  k->handle = found;
  k->max_threads = HK_MAX_THREADS;
  k->static_shared = 0;
  k->max_dynamic_shared = HK_MAX_DYN_SHARED;
  k->shared_set = HK_MAX_DYN_SHARED;
  int n = kk->nparams < max ? kk->nparams : max;
  for (int i = 0; i < n; i++) sizes[i] = kk->sizes[i];
  *nparams = n;
  return DEV_OK;
}

int hk_kernel_names(dev_ctx *ctx, void *impl, char ***names, int *n)
{
  hk_mod *hm = impl;
  int count = hm->m->nkernels;
  char **out = calloc(count > 0 ? (size_t)count : 1, sizeof *out);
  if (!out) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  for (int i = 0; i < count; i++) {
    if (!(out[i] = strdup(hm->m->kernels[i]->name))) {
      for (int j = 0; j < i; j++) free(out[j]);
      free(out);
      return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
    }
  }
  *names = out;
  *n = count;
  return DEV_OK;
}

int hk_is_compiled(const dev_kernel *k)
{
  return k && k->handle && !dev_kernel_is_cfunc(k);
}

/* ---- launches ------------------------------------------------------------- */

typedef struct hk_job {
  struct hk_job *next;          /* the pool's list, under pool.mu */
  const dev_launch *l;
  const hk_kern *hk;
  gpulua_hk_block tmpl;
  unsigned long long nblocks, chunk;
  _Atomic unsigned long long next_block;
  atomic_int failed;
  int active;                   /* pool workers in it (pool.mu) */
  pthread_cond_t idle;          /* active fell to 0 */
  pthread_mutex_t emu;
  char err[1024];               /* the first failure (emu) */
} hk_job;

/* The state of a thread that runs blocks: a pool worker or a stream's. */
typedef struct hk_worker {
  jmp_buf jb;                   /* a failing thread leaves its block through here */
  hk_job *job;
  void *dyn;                    /* dynamic shared memory */
  size_t dyn_cap;
} hk_worker;

static pthread_key_t worker_key;
static pthread_once_t worker_once = PTHREAD_ONCE_INIT;

static void worker_free(void *p)
{
  hk_worker *w = p;
  if (!w) return;
  free(w->dyn);
  free(w);
}

static void worker_key_init(void) { pthread_key_create(&worker_key, worker_free); }

static hk_worker *worker_self(void)
{
  pthread_once(&worker_once, worker_key_init);
  hk_worker *w = pthread_getspecific(worker_key);
  if (w) return w;
  w = calloc(1, sizeof *w);
  if (w && pthread_setspecific(worker_key, w)) { free(w); w = NULL; }
  return w;
}

static void job_fail(hk_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_fail(hk_job *j, const char *fmt, ...)
{
  pthread_mutex_lock(&j->emu);
  if (!atomic_load(&j->failed)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof j->err, fmt, ap);
    va_end(ap);
    atomic_store(&j->failed, 1);
  }
  pthread_mutex_unlock(&j->emu);
}

/* ---- the callbacks of compiled code ------------------------------------------ */

static void rt_fail(void *wp, int kind, const char *msg)
{
  hk_worker *w = wp;
  switch (kind) {
  case GPULUA_FAIL_ASSERT:
    job_fail(w->job, "device-side assert triggered (cudaErrorAssert): %s", msg);
    break;
  case GPULUA_FAIL_TRAP:
    job_fail(w->job, "an illegal instruction was encountered (cudaErrorIllegalInstruction): %s", msg);
    break;
  default:
    job_fail(w->job, "%s", msg);
    break;
  }
  longjmp(w->jb, 1);
}

static int rt_barrier(void *wp, int kind, int pred)
{
  (void)kind;
  (void)pred;
  rt_fail(wp, GPULUA_FAIL_OTHER, "internal error: a barrier in a kernel run without fibers");
  return 0;
}

static unsigned long long rt_warp(void *wp, int op, unsigned mask, unsigned long long v, int arg, int width)
{
  (void)op; (void)mask; (void)v; (void)arg; (void)width;
  rt_fail(wp, GPULUA_FAIL_OTHER, "internal error: a warp primitive in a kernel run without fibers");
  return 0;
}

static void rt_bad_access(void *wp, unsigned long long addr, unsigned long long size, int write, void *pc)
{
  (void)pc;
  char msg[200];
  snprintf(msg, sizeof msg, "illegal memory access: a %llu-byte %s at 0x%llx", size, write ? "write" : "read", addr);
  rt_fail(wp, GPULUA_FAIL_OTHER, msg);
}

static const gpulua_hk_rt rt = {rt_barrier, rt_warp, rt_fail, rt_bad_access};

/* ---- running blocks ------------------------------------------------------- */

static int ensure_dyn(hk_worker *w, size_t bytes)
{
  if (bytes <= w->dyn_cap && w->dyn) return 0;
  size_t cap = (bytes + 255) & ~(size_t)255;
  void *p = aligned_alloc(256, cap ? cap : 256);
  if (!p) return -1;
  free(w->dyn);
  w->dyn = p;
  w->dyn_cap = cap;
  return 0;
}

/* Blocks [b0, b1) on this thread: 0, or -1 once the kernel failed. */
static int run_range(hk_job *j, hk_worker *w, unsigned long long b0, unsigned long long b1)
{
  gpulua_hk_block blk = j->tmpl;
  blk.w = w;
  blk.dyn = w->dyn;
  blk.first = b0;
  blk.last = b1;
  w->job = j;
  if (setjmp(w->jb)) return -1;
  j->hk->k->run_blocks(&blk);
  return 0;
}

static void run_job(hk_job *j, hk_worker *w)
{
  if (ensure_dyn(w, j->l->shared)) {
    job_fail(j, "out of memory for %zu bytes of dynamic shared memory", j->l->shared);
    return;
  }
  while (!atomic_load(&j->failed)) {
    unsigned long long b0 = atomic_fetch_add(&j->next_block, j->chunk);
    if (b0 >= j->nblocks) break;
    unsigned long long b1 = b0 + j->chunk < j->nblocks ? b0 + j->chunk : j->nblocks;
    if (run_range(j, w, b0, b1)) break;
  }
}

/* ---- the pool of block workers ------------------------------------------------ */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t work;
  hk_job *jobs;                 /* launches with blocks to hand out */
  int size;                     /* workers per launch, its own thread counted; 0: not read yet */
  int started;                  /* pool threads running */
  char bad[160];                /* GPULUA_HOST_THREADS is not a count */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, ""};

static void *pool_main(void *arg)
{
  (void)arg;
  hk_worker *w = worker_self();
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    hk_job *j = pool.jobs;
    while (j && (atomic_load(&j->failed) || atomic_load(&j->next_block) >= j->nblocks)) j = j->next;
    if (!j || !w) {
      pthread_cond_wait(&pool.work, &pool.mu);
      if (!w) w = worker_self();
      continue;
    }
    j->active++;
    pthread_mutex_unlock(&pool.mu);
    run_job(j, w);
    pthread_mutex_lock(&pool.mu);
    if (--j->active == 0) pthread_cond_broadcast(&j->idle);
  }
  return NULL;
}

/* Under pool.mu: the pool threads for a launch of nblocks, started as
 * needed; how many there are. */
static int pool_grow(unsigned long long nblocks)
{
  if (pool.size == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    pool.size = n > 0 ? (int)n : 1;
    const char *env = getenv("GPULUA_HOST_THREADS");
    if (env && *env) {
      char *end;
      long v = strtol(env, &end, 10);
      if (*end || v < 1 || v > 1024)
        snprintf(pool.bad, sizeof pool.bad, "GPULUA_HOST_THREADS='%.40s' is not a number of threads (1 to 1024)", env);
      else
        pool.size = (int)v;
    }
  }
  unsigned long long want = (unsigned long long)pool.size - 1;
  if (want > nblocks - 1) want = nblocks - 1;
  while ((unsigned long long)pool.started < want) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    int e = pthread_create(&th, NULL, pool_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) break;
    pthread_detach(th);
    pool.started++;
  }
  return pool.started;
}

int hk_launch(const dev_launch *l, char *err, size_t errlen)
{
  const hk_kern *hk = l->k->handle;
  hk_worker *w = worker_self();
  if (!w) { snprintf(err, errlen, "out of memory"); return -1; }
  if (hk->mod->fibers) {
    snprintf(err, errlen, "barriers and warp primitives are not supported yet on the host backend");
    return -1;
  }
  hk_job j;
  memset(&j, 0, sizeof j);
  j.l = l;
  j.hk = hk;
  j.tmpl.rt = &rt;
  j.tmpl.args = l->args;
  memcpy(j.tmpl.grid, l->grid, sizeof j.tmpl.grid);
  memcpy(j.tmpl.block, l->block, sizeof j.tmpl.block);
  j.tmpl.shared = l->shared;
  j.nblocks = (unsigned long long)l->grid[0] * l->grid[1] * l->grid[2];
  atomic_init(&j.next_block, 0);
  atomic_init(&j.failed, 0);
  pthread_mutex_init(&j.emu, NULL);
  pthread_cond_init(&j.idle, NULL);

  pthread_mutex_lock(&pool.mu);
  int helpers = j.nblocks > 1 ? pool_grow(j.nblocks) : 0;
  if (*pool.bad) {
    snprintf(err, errlen, "%s", pool.bad);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_destroy(&j.emu);
    pthread_cond_destroy(&j.idle);
    return -1;
  }
  unsigned long long per = j.nblocks / (8ull * (unsigned long long)(helpers + 1));
  j.chunk = per < 1 ? 1 : per > 64 ? 64 : per;
  if (helpers > 0) {
    j.next = pool.jobs;
    pool.jobs = &j;
    pthread_cond_broadcast(&pool.work);
  }
  pthread_mutex_unlock(&pool.mu);

  run_job(&j, w);

  if (helpers > 0) {
    pthread_mutex_lock(&pool.mu);
    for (hk_job **pp = &pool.jobs; *pp; pp = &(*pp)->next)
      if (*pp == &j) { *pp = j.next; break; }
    while (j.active > 0) pthread_cond_wait(&j.idle, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
  }
  int failed = atomic_load(&j.failed);
  if (failed) snprintf(err, errlen, "%s", j.err);
  pthread_mutex_destroy(&j.emu);
  pthread_cond_destroy(&j.idle);
  return failed ? -1 : 0;
}
