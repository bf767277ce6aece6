/* The device layer's context: the backend's choice, open and close, device
 * queries and the counters (its error message: dev_err.c).  The
 * rest of the layer: dev_buf.c (buffers, the block cache, the ends of
 * streams), dev_stream.c (streams, events, watches, completions), dev_op.c
 * (ops), dev_coll.c (ranks and collectives), dev_sync.c (sync policy,
 * interrupts); their shared parts are in devpriv.h and the headers it names.
 *
 * What holds here:
 * - ctx->refs counts the owner (until dev_close), live buffers, dead wrapped
 *   buffers, non-default streams with references, events, watches, and a
 *   sweep or an owner-gone release in progress.  Cached blocks and released
 *   streams hold none: dev_ctx_destroy (at 0) waits for and frees them.
 * - dev_close is a quiet device sync (whatever the policy), then leaves the
 *   communicator and empties the cache; from then on (ctx->closing) releases
 *   wait for queued uses instead of caching, and once owner_gone any thread
 *   may release, under defer_mu.
 * - ctx->err is the message of the last failure (dev_fail, dev_err.c).  The first
 *   async failure (any thread) is kept until dev_check_async reports it;
 *   every call that enqueues work checks it first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devpriv.h"
#include "bufx.h"
#include "race.h"
#include "util.h"

/* ---- context ---------------------------------------------------------- */

static int parse_spec(const char *spec, int *cuda, int *index) {
  *cuda = 0;
  *index = 0;
  if (!spec || !*spec) return -1;
  if (strcmp(spec, "host") == 0) return 0;
  if (strncmp(spec, "cuda", 4) == 0) {
    *cuda = 1;
    if (spec[4] == 0) return 0;
    if (spec[4] != ':' || spec[5] == 0) return -1;
    /* digits only: strtol would also take "-0", "+0" and " 0" */
    long v = 0;
    for (const char *p = spec + 5; *p; p++) {
      if (*p < '0' || *p > '9') return -1;
      v = v * 10 + (*p - '0');
      if (v > 1024) return -1;
    }
    *index = (int)v;
    return 0;
  }
  return -1;
}

/* GPULUA_CHECK: a list of checks to turn on (only "races" so far). */
static int check_env(dev_ctx *ctx) {
  const char *v = env_setting("GPULUA_CHECK");
  for (const char *p = v; p && *p;) {
    size_t n = strcspn(p, ", ");
    if (n == 5 && strncmp(p, "races", 5) == 0) {
      int rc = race_set(ctx, 1);
      if (rc) return rc;
    } else if (n > 0 && !(n == 4 && strncmp(p, "none", 4) == 0)) {
      return dev_fail(ctx, DEV_ERR_INVALID, "GPULUA_CHECK: unknown check '%.*s' (expected races or none)",
                      (int)(n > 64 ? 64 : n), p);
    }
    p += n;
    p += strspn(p, ", ");
  }
  return DEV_OK;
}

int dev_job_env(dev_job_var what, long *out, const char **var) {
  static const char *const names[][2] = {
    [DEV_JOB_RANK] = {"RANK", "SLURM_PROCID"}, [DEV_JOB_WORLD] = {"WORLD_SIZE", "SLURM_NTASKS"},
    [DEV_JOB_LOCAL_RANK] = {"LOCAL_RANK", "SLURM_LOCALID"},
    [DEV_JOB_LOCAL_WORLD] = {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"},
  };
  for (int k = 0; k < 2; k++) {
    const char *v = getenv(names[what][k]);
    if (!v || !*v) continue;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 1000000) {
      if (var) *var = names[what][k];
      return -1;
    }
    *out = x;
    return 1;
  }
  return 0;
}

dev_ctx *dev_open(const char *spec, char *err, size_t errlen) {
  const char *env = env_setting("GPULUA_DEVICE");
  int from_env = (!spec || !*spec) && env && *env;
  if (!spec || !*spec) spec = from_env ? env : NULL;
  /* "auto": the automatic choice, asked for by name */
  if (spec && strcmp(spec, "auto") == 0) spec = NULL;
  int cuda = 0, index = 0;
  if (spec && parse_spec(spec, &cuda, &index)) {
    snprintf(err, errlen, "unknown device %s'%s' (expected auto, host, cuda or cuda:N)",
             from_env ? "GPULUA_DEVICE=" : "", spec);
    return NULL;
  }
  const dev_backend *bk = &dev_host_backend;
#ifdef GPULUA_HAVE_CUDA
  /* Automatic: cuda when a GPU answers, else host. */
  /* the first CUDA call: it also sets up module loading */
  int have = (cuda || !spec) ? dev_cuda_available() : 0;
  if (cuda || (!spec && have)) bk = &dev_cuda_backend;
  /* One GPU per rank: under a launcher, "cuda" (or automatic) means
   * cuda:LOCAL_RANK; an explicit cuda:N wins.  A malformed LOCAL_RANK is
   * the bindings' to report, when the script joins the job. */
  long lr;
  if (bk == &dev_cuda_backend && !(spec && strchr(spec, ':')) &&
      dev_job_env(DEV_JOB_LOCAL_RANK, &lr, NULL) > 0)
    index = (int)lr;
#else
  if (cuda) {
    snprintf(err, errlen, "device '%s': this gpulua was built without the CUDA backend", spec);
    return NULL;
  }
#endif
  int jitter = 0;
  if (env_flag("GPULUA_HOST_JITTER", &jitter, err, errlen)) return NULL;
  dev_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) { snprintf(err, errlen, "out of memory"); return NULL; }
  ctx->bk = bk;
  ctx->refs = 1;
  ctx->device = index;
  ctx->jitter = jitter;
  pthread_mutex_init(&ctx->async_mu, NULL);
  pthread_mutex_init(&ctx->progress_mu, NULL);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&ctx->defer_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ctx->progress_cv, &ca);
  pthread_condattr_destroy(&ca);
  ctx->cache = calloc(1, sizeof *ctx->cache);
  int rc = ctx->cache ? check_env(ctx) : DEV_ERR_NOMEM;
  if (!ctx->cache) snprintf(ctx->err, sizeof ctx->err, "out of memory");
  if (rc == DEV_OK) rc = ctx->bk->open(ctx, index);
  if (rc == DEV_OK) rc = dev_stream_new(ctx, DEV_PRIO_NORMAL, 0, 1, NULL, &ctx->dflt);
  if (rc != DEV_OK) {
    snprintf(err, errlen, "%s", ctx->err);
    race_set(ctx, 0);
    if (ctx->bk_state) ctx->bk->close(ctx);
    pthread_mutex_destroy(&ctx->async_mu);
    pthread_mutex_destroy(&ctx->progress_mu);
    pthread_mutex_destroy(&ctx->defer_mu);
    pthread_cond_destroy(&ctx->progress_cv);
    free(ctx->cache);
    free(ctx);
    return NULL;
  }
  return ctx;
}

void dev_ctx_destroy(dev_ctx *ctx) {
  race_set(ctx, 0);
  dev_cache_free_all(ctx);
  free(ctx->cache);
  ctx->cache = NULL;
  while (ctx->streams) {
    dev_stream *s = ctx->streams;
    ctx->bk->pos_wait(s, ctx->bk->stream_pos(s));
    dev_stream_destroy(s);
  }
  dev_trace_free(ctx);
  ctx->bk->close(ctx);
  pthread_mutex_destroy(&ctx->async_mu);
  pthread_mutex_destroy(&ctx->progress_mu);
  pthread_mutex_destroy(&ctx->defer_mu);
  pthread_cond_destroy(&ctx->progress_cv);
  free(ctx);
}

void dev_ctx_retain(dev_ctx *ctx) { ctx->refs++; }

void dev_ctx_release(dev_ctx *ctx) {
  if (ctx->owner_gone) {
    /* after dev_close: DLPack deleters on any thread share refs */
    pthread_mutex_lock(&ctx->defer_mu);
    int last = --ctx->refs == 0;
    pthread_mutex_unlock(&ctx->defer_mu);
    if (last) dev_ctx_destroy(ctx);
    return;
  }
  if (--ctx->refs == 0) dev_ctx_destroy(ctx);
}

void dev_close(dev_ctx *ctx) {
  if (!ctx || ctx->closing) return;
  dev_interrupt_enable(ctx, 0);
  ctx->sync_policy = DEV_SYNC_ALLOW;   /* closing always waits, quietly */
  ctx->sync_warn = NULL;
  ctx->warn = NULL;
  dev_synchronize(ctx);
  ctx->closing = 1;
  /* after the queued collectives: the peers see this rank leave */
  if (ctx->comm && ctx->bk->comm_close) ctx->bk->comm_close(ctx);
  dev_sweep_all(ctx);
  dev_cache_free_all(ctx);
  /* From here on no owner thread drains deferred releases: DLPack exports
   * still alive keep their buffers (and the context) until their deleters,
   * which then release under defer_mu on whatever thread calls them. */
  pthread_mutex_lock(&ctx->defer_mu);
  ctx->owner_gone = 1;
  bufx *left = ctx->deferred;
  ctx->deferred = NULL;
  atomic_store(&ctx->defer_flag, 0);
  pthread_mutex_unlock(&ctx->defer_mu);
  while (left) {
    bufx *x = left;
    left = x->defer_next;
    int n = x->async_pending;
    x->async_pending = 0;
    while (n-- > 0) dev_buf_release(&x->b);
  }
  dev_ctx_release(ctx);
}

const char *dev_backend_name(dev_ctx *ctx) { return ctx->bk->name; }
size_t dev_warm_bytes(dev_ctx *ctx) { return ctx->bk->warm_bytes; }
int dev_device_count(dev_ctx *ctx) { return ctx->bk->device_count(ctx); }
int dev_current_device(dev_ctx *ctx) { return ctx->device; }

int dev_device_info(dev_ctx *ctx, int index, dev_info *out) {
  int n = ctx->bk->device_count(ctx);
  if (index < 0 || index >= n)
    return dev_fail(ctx, DEV_ERR_INVALID, "device index %d out of range (%d device%s)",
                    index, n, n == 1 ? "" : "s");
  return ctx->bk->device_info(ctx, index, out);
}

int dev_set_device(dev_ctx *ctx, int index) {
  int n = ctx->bk->device_count(ctx);
  if (index < 0 || index >= n)
    return dev_fail(ctx, DEV_ERR_INVALID, "device index %d out of range (%d device%s)",
                    index, n, n == 1 ? "" : "s");
  /* One interpreter drives one GPU (one process per GPU, as ranks do). */
  if (index != ctx->device)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED,
                    "this interpreter drives device %d; start gpulua with --device cuda:%d",
                    ctx->device, index);
  ctx->device = index;
  return DEV_OK;
}

/* Called for every op: a plain bounded copy, no printf. */
void dev_set_site(dev_ctx *ctx, const char *site) {
  size_t n = site ? strnlen(site, sizeof ctx->site - 1) : 0;
  memcpy(ctx->site, site ? site : "", n);
  ctx->site[n] = 0;
}

void dev_get_stats(dev_ctx *ctx, dev_stats *out) {
  *out = ctx->st;
  out->max_concurrent = atomic_load(&ctx->max_running);
}
