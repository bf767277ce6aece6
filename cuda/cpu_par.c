/* gpulua host kernels: one large built-in op shared out over CPU threads.
 *
 * cpu_par_for splits [0, n) into chunks (multiples of a grain) that the
 * calling stream worker and helper threads take from an atomic counter; it
 * returns when every chunk is done.  The helpers are a process-wide pool of
 * GPULUA_HOST_THREADS - 1 threads (one per CPU by default, as the host
 * kernels' block workers), started at the first large op and joined
 * when the library is unloaded or the process ends (pool_stop).  One op uses the
 * pool at a time: an op of another stream that finds it busy runs by itself
 * on its own thread, so no op waits for another stream's op.  The chunks
 * write disjoint ranges, so the result is the same for any thread count. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_priv.h"
#include "util.h"

/* below this many elements an op runs on its stream's thread alone */
#define PAR_MIN (1 << 16)

typedef struct par_job {
  cpu_par_fn fn;
  void *arg;
  int64_t n, chunk;
  atomic_llong next;            /* the next chunk's first element */
  int active;                   /* helpers inside the job (under pool.mu) */
} par_job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t work, idle;
  par_job *job;                 /* the op being shared out, NULL: none */
  int busy;                     /* an op holds the pool */
  int size;                     /* threads per op, the caller's counted; 0: not read yet */
  int started;
  int stop;                     /* the library is being unloaded: helpers leave */
  char bad[160];                /* GPULUA_HOST_THREADS is not a count */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0, ""};

static void run_chunks(par_job *j)
{
  for (;;) {
    int64_t lo = atomic_fetch_add(&j->next, j->chunk);
    if (lo >= j->n) return;
    j->fn(j->arg, lo, lo + j->chunk < j->n ? lo + j->chunk : j->n);
  }
}

static void *helper(void *unused)
{
  (void)unused;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    par_job *j = pool.job;
    if (pool.stop) break;
    if (!j || atomic_load(&j->next) >= j->n) {
      pthread_cond_wait(&pool.work, &pool.mu);
      continue;
    }
    j->active++;
    pthread_mutex_unlock(&pool.mu);
    run_chunks(j);
    pthread_mutex_lock(&pool.mu);
    if (--j->active == 0) pthread_cond_broadcast(&pool.idle);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

/* The helpers' threads, joined by pool_stop. */
static pthread_t helper_th[1024];

/* gpu.so unloaded by a stock lua5.4 (its state closed, dlclose), or the
 * process ending: the helpers run this library's code, so they leave and
 * are joined first (detached, one parked in pthread_cond_wait woke into
 * unmapped code: 2 in 40 runs of tests/luamod.lua's os.exit(3, true)
 * crashed).  A helper inside a job finishes its chunks first. */
__attribute__((destructor)) static void pool_stop(void)
{
  pthread_mutex_lock(&pool.mu);
  pool.stop = 1;
  int n = pool.started;
  pthread_cond_broadcast(&pool.work);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 0; i < n; i++) pthread_join(helper_th[i], NULL);
}

/* Under pool.mu: the pool's size read once, its helpers started. */
static void pool_start(void)
{
  if (pool.size == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = env_setting("GPULUA_HOST_THREADS");
    pool.size = n > 0 ? (int)n : 1;
    if (env && *env) {
      char *end;
      long v = strtol(env, &end, 10);
      if (*end || v < 1 || v > 1024)
        snprintf(pool.bad, sizeof pool.bad, "GPULUA_HOST_THREADS='%.40s' is not a number of threads (1 to 1024)", env);
      else
        pool.size = (int)v;
    }
  }
  while (!*pool.bad && !pool.stop && pool.started < pool.size - 1 &&
         pool.started < (int)(sizeof helper_th / sizeof helper_th[0])) {
    sigset_t all, old;
    pthread_t th;
    sigfillset(&all);   /* signals go to the interpreter's thread, not here */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&th, NULL, helper, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) break;
    helper_th[pool.started++] = th;
  }
}

int cpu_par_for(int64_t n, int64_t grain, cpu_par_fn fn, void *arg, char *err, size_t errlen)
{
  par_job j = {.fn = fn, .arg = arg, .n = n};
  int shared = 0;
  if (n >= PAR_MIN) {
    pthread_mutex_lock(&pool.mu);
    pool_start();
    if (*pool.bad) {
      pthread_mutex_unlock(&pool.mu);
      return fail_msg(err, errlen, "%s", pool.bad);
    }
    if (!pool.busy && pool.started > 0) {
      /* about 4 chunks a thread: an even share when a thread is held up */
      int64_t per = n / (4 * (int64_t)(pool.started + 1));
      j.chunk = per < grain * 16 ? grain * 16 : per / grain * grain;
      atomic_init(&j.next, 0);
      pool.busy = shared = 1;
      pool.job = &j;
      pthread_cond_broadcast(&pool.work);
    }
    pthread_mutex_unlock(&pool.mu);
  }
  if (!shared) {
    fn(arg, 0, n);
    return 0;
  }
  run_chunks(&j);
  pthread_mutex_lock(&pool.mu);
  pool.job = NULL;
  while (j.active > 0) pthread_cond_wait(&pool.idle, &pool.mu);
  pool.busy = 0;
  pthread_mutex_unlock(&pool.mu);
  return 0;
}
