/* The built-in kernels, loaded in the background.
 *
 * Loading all of them when the context is made (CUDA_MODULE_LOADING=EAGER)
 * costs 110-130 ms of start-up on an H100 for some 1400 kernels.  Loading
 * each on its first launch (LAZY, the driver's default) starts fast, but a
 * kernel's first launch then waits on the device for all work already
 * running there (measured: a first launch on one stream did not finish
 * before a running kernel on another stream did), silently serialising a
 * script's first use of every op.
 *
 * So the backend runs LAZY and loads every built-in kernel from a thread
 * started after the context's first op: that op's kernel loads on demand
 * (one kernel: cheap), the rest behind it.  Until the thread is done the
 * device may serialise work, which only matters once streams run side by
 * side: making a stream (cuda_loader_wait) waits for the thread, so work
 * on two streams never meets a kernel still to load.
 * Run-time kernels (gpu.compile) are loaded by their own call, as before.
 * GPULUA_KERNEL_LOADER=0 leaves every kernel to load on its first use.
 *
 * Measured on an H100 (bench/RESULTS.md, 2026-11-25, nine runs each):
 * process start to the first finished kernel 1.08x raw C's with the
 * loader, 1.10x without it, 1.08x with the fatbin uncompressed, 1.63x
 * eager; holding the thread back until the first op had finished on the
 * device gained nothing (1.10x).
 *
 * The kernels are found through one kernel of each module (cuk_modules),
 * its module (cuFuncGetModule) and the module's kernels
 * (cuModuleEnumerateFunctions), loaded with cuFuncLoad: driver entry points
 * of CUDA 12.4, reached through the runtime (no link against libcuda).
 *
 * A context that is never closed (os.exit, a context lost to an error whose
 * buffers stay referenced, an application that exits without closing)
 * leaves the thread loading while exit() tears the runtime down: on an H200
 * 4 runs in 160 crashed in the driver (issue 35, item 7).  So the running
 * loaders are listed, and an exit hook, registered after the runtime's own
 * and so run before it, stops and joins them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "kernels.h"
#include "cu.h"

typedef CUresult (*get_module_t)(CUmodule *, CUfunction);
typedef CUresult (*count_t)(unsigned int *, CUmodule);
typedef CUresult (*enumerate_t)(CUfunction *, unsigned int, CUmodule);
typedef CUresult (*is_loaded_t)(CUfunctionLoadingState *, CUfunction);
typedef CUresult (*load_t)(CUfunction);

struct cuda_loader {
  pthread_t th;
  int device;
  atomic_int started;        /* kick was called (set under mu) */
  int running;               /* ... and the thread runs, until joined */
  atomic_int stop;           /* the context is closing: leave the rest */
  atomic_int settled;        /* started and joined: wait has nothing to do */
  pthread_mutex_t mu;
  cuda_loader *next;         /* in the list of live loaders (live_mu) */
};

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static cuda_loader *live;
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;

/* Stop the thread (it leaves the kernels still to load) and join it. */
static void halt(cuda_loader *l) {
  atomic_store(&l->stop, 1);
  pthread_mutex_lock(&l->mu);
  if (l->running) {
    pthread_join(l->th, NULL);
    l->running = 0;
  }
  atomic_store(&l->settled, 1);
  pthread_mutex_unlock(&l->mu);
}

static void halt_all(void) {
  pthread_mutex_lock(&live_mu);
  for (cuda_loader *l = live; l; l = l->next) halt(l);
  pthread_mutex_unlock(&live_mu);
}

static void register_hook(void) { atexit(halt_all); }

static void *entry(const char *name) {
  void *p = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12040, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void *loader_main(void *arg) {
  cuda_loader *l = arg;
  get_module_t get_module = (get_module_t)entry("cuFuncGetModule");
  count_t count = (count_t)entry("cuModuleGetFunctionCount");
  enumerate_t enumerate = (enumerate_t)entry("cuModuleEnumerateFunctions");
  is_loaded_t is_loaded = (is_loaded_t)entry("cuFuncIsLoaded");
  load_t load = (load_t)entry("cuFuncLoad");
  if (!get_module || !count || !enumerate || !is_loaded || !load || cudaSetDevice(l->device) != cudaSuccess)
    goto out;   /* an older driver: kernels load on first use */
  const void *anchors[32];
  int na = cuk_modules(anchors, 32);
  for (int m = 0; m < na && !atomic_load(&l->stop); m++) {
    cudaFunction_t f;
    CUmodule mod;
    unsigned n = 0;
    if (cudaGetFuncBySymbol(&f, anchors[m]) != cudaSuccess) { cudaGetLastError(); continue; }
    if (get_module(&mod, (CUfunction)f) != CUDA_SUCCESS || count(&n, mod) != CUDA_SUCCESS || n == 0) continue;
    CUfunction *fs = malloc(n * sizeof *fs);
    if (!fs) break;
    if (enumerate(fs, n, mod) == CUDA_SUCCESS) {
      for (unsigned i = 0; i < n && !atomic_load(&l->stop); i++) {
        CUfunctionLoadingState st;
        if (is_loaded(&st, fs[i]) == CUDA_SUCCESS && st == CU_FUNCTION_LOADING_STATE_LOADED) continue;
        load(fs[i]);   /* a kernel that fails to load fails again, and says so, when launched */
      }
    }
    free(fs);
  }
out:
  cudaGetLastError();   /* this thread's last error is nobody else's */
  return NULL;
}

cuda_loader *cuda_loader_new(int device) {
  cuda_loader *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->device = device;
  pthread_mutex_init(&l->mu, NULL);
  pthread_once(&hook_once, register_hook);
  pthread_mutex_lock(&live_mu);
  l->next = live;
  live = l;
  pthread_mutex_unlock(&live_mu);
  return l;
}

void cuda_loader_kick(cuda_loader *l) {
  if (!l || atomic_load(&l->started)) return;
  pthread_mutex_lock(&l->mu);
  if (!atomic_load(&l->started)) {
    atomic_store(&l->started, 1);
    l->running = pthread_create(&l->th, NULL, loader_main, l) == 0;   /* else: load on first use */
    if (!l->running) atomic_store(&l->settled, 1);
  }
  pthread_mutex_unlock(&l->mu);
}

void cuda_loader_wait(cuda_loader *l) {
  if (!l || atomic_load(&l->settled)) return;
  cuda_loader_kick(l);
  pthread_mutex_lock(&l->mu);
  if (l->running) {
    pthread_join(l->th, NULL);
    l->running = 0;
  }
  atomic_store(&l->settled, 1);
  pthread_mutex_unlock(&l->mu);
}

void cuda_loader_stop(cuda_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&live_mu);
  for (cuda_loader **p = &live; *p; p = &(*p)->next)
    if (*p == l) { *p = l->next; break; }
  pthread_mutex_unlock(&live_mu);
  halt(l);
  pthread_mutex_destroy(&l->mu);
  free(l);
}
