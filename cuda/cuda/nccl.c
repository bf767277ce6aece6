/* Collectives of the CUDA backend over NCCL.
 *
 * libnccl.so.2 is loaded with dlopen on first use; the few types and entry
 * points we call are declared here from NCCL's documentation, so building
 * needs no nccl.h.  The communicator is created with NCCL's own bootstrap:
 * NCCL_COMM_ID=MASTER_ADDR:MASTER_PORT (unless already set) makes every rank's
 * ncclGetUniqueId return the same id, and rank 0's ncclCommInitRank listens
 * there.  NCCL's calls on a communicator block only while they set up
 * connections with the peers, so all of that happens before the interpreter
 * uses it: a helper thread creates the communicator with every connection
 * made up front (NCCL_RUNTIME_CONNECT=0 unless set) and runs a warm-up that
 * connects each pair of ranks for send and recv, while the interpreter thread
 * waits for it with the job's timeout, watching for a rank that is gone.
 * After that an NCCL call only enqueues.  (A non-blocking communicator would
 * make that wait simpler, but NCCL then runs every collective's group
 * through a thread of its own: 80 us per call instead of 9.)
 *
 * NCCL does not notice a peer on the same node that died or whose script
 * ended: its kernels would spin for ever.  So ranks of one node also join a
 * sideband (cuda/shm_comm.c's segment without data slots), which names a
 * rank that left or died, and which compares each collective across ranks
 * when the check is on (GPULUA_COMM_CHECK=1 or gpu.init_comm{check = true}:
 * it costs a meeting of the ranks' host threads per collective).
 *
 * A watchdog thread follows every enqueued collective through an event.  It
 * aborts the communicator (ncclCommAbort, which makes NCCL's kernels return)
 * and reports an asynchronous error when NCCL reports one, when a rank the
 * collective needs is gone, or when the collective has not finished within
 * the timeout.  The interpreter thread, blocked in a wait on the stream, is
 * then released and raises that error. */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cu.h"
#include "shm_comm.h"
#include "util.h"

/* ---- NCCL's interface, as documented ------------------------------------- */

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;
enum { NC_SUCCESS = 0, NC_IN_PROGRESS = 7 };
enum { NC_INT8 = 0, NC_UINT8 = 1, NC_INT32 = 2, NC_INT64 = 4, NC_F16 = 6, NC_F32 = 7, NC_F64 = 8, NC_BF16 = 9 };
enum { NC_SUM = 0, NC_PROD = 1, NC_MAX = 2, NC_MIN = 3, NC_AVG = 4 };

/* ncclConfig_t as of NCCL 2.18; newer NCCL reads the fields this version has
 * (size, magic and version say which) and defaults the rest. */
#define NC_VERSION(x, y, z) ((x) * 10000 + (y) * 100 + (z))
#define NC_UNDEF_INT (-2147483647 - 1)
typedef struct nc_config {
  size_t size;
  unsigned magic, version;
  int blocking, cga_cluster_size, min_ctas, max_ctas;
  const char *net_name;
  int split_share;
} nc_config;

static struct {
  void *lib;
  int version;
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, nc_config *);
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*abort)(ncclComm_t);
  const char *(*error_string)(ncclResult_t);
  const char *(*last_error)(ncclComm_t);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce)(const void *, void *, size_t, int, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
  /* process groups; NULL where the library lacks them */
  ncclResult_t (*split)(ncclComm_t, int, int, ncclComm_t *, nc_config *);
  ncclResult_t (*destroy)(ncclComm_t);
} nc;
static pthread_mutex_t nc_mu = PTHREAD_MUTEX_INITIALIZER;

#define NC_MIN_VERSION NC_VERSION(2, 18, 0)

static int nc_load(char *err, size_t errlen) {
  pthread_mutex_lock(&nc_mu);
  int ok = nc.lib != NULL;
  if (!ok) {
    const char *env = env_setting("GPULUA_NCCL");
    const char *names[] = {env && *env ? env : "libnccl.so.2", "libnccl.so", NULL};
    void *lib = NULL;
    char why[256] = "";
    for (int i = 0; names[i] && !lib; i++) {
      lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
      if (!lib && i == 0) snprintf(why, sizeof why, "%s", dlerror());
      if (env && *env) break;
    }
    if (!lib) {
      snprintf(err, errlen, "collectives on the cuda backend need NCCL: cannot load %s%s%s (%s)",
               env && *env ? "GPULUA_NCCL='" : "", env && *env ? env : "libnccl.so.2", env && *env ? "'" : "", why);
      goto out;
    }
    ncclResult_t (*get_version)(int *) = (ncclResult_t (*)(int *))dlsym(lib, "ncclGetVersion");
#define SYM(field, name) (*(void **)&nc.field = dlsym(lib, name))
    int found = SYM(get_unique_id, "ncclGetUniqueId") && SYM(init_rank_config, "ncclCommInitRankConfig") &&
                SYM(async_error, "ncclCommGetAsyncError") && SYM(abort, "ncclCommAbort") &&
                SYM(error_string, "ncclGetErrorString") && SYM(last_error, "ncclGetLastError") &&
                SYM(all_reduce, "ncclAllReduce") && SYM(broadcast, "ncclBroadcast") && SYM(reduce, "ncclReduce") &&
                SYM(all_gather, "ncclAllGather") && SYM(reduce_scatter, "ncclReduceScatter") &&
                SYM(send, "ncclSend") && SYM(recv, "ncclRecv") && SYM(group_start, "ncclGroupStart") &&
                SYM(group_end, "ncclGroupEnd");
    /* optional: without them only process groups are refused */
    if (found && !(SYM(split, "ncclCommSplit") && SYM(destroy, "ncclCommDestroy"))) nc.split = NULL;
#undef SYM
    int v = 0;
    if (!get_version || get_version(&v) != NC_SUCCESS) v = 0;
    if (!found || v < NC_MIN_VERSION) {
      if (v && v < NC_MIN_VERSION)
        snprintf(err, errlen, "collectives on the cuda backend need NCCL 2.18 or newer, not %d.%d.%d", v / 10000,
                 v / 100 % 100, v % 100);
      else
        snprintf(err, errlen, "collectives on the cuda backend need NCCL: %s lacks NCCL's entry points",
                 env && *env ? env : "libnccl.so.2");
      dlclose(lib);
      memset(&nc, 0, sizeof nc);
      goto out;
    }
    nc.version = v;
    nc.lib = lib;
    ok = 1;
  }
out:
  pthread_mutex_unlock(&nc_mu);
  return ok ? 0 : -1;
}

static int nc_dtype(dev_dtype t) {
  switch (t) {
  case DEV_F32: return NC_F32;
  case DEV_F64: return NC_F64;
  case DEV_F16: return NC_F16;
  case DEV_BF16: return NC_BF16;
  case DEV_I8: return NC_INT8;
  case DEV_I32: return NC_INT32;
  case DEV_I64: return NC_INT64;
  case DEV_U8: case DEV_BOOL: default: return NC_UINT8;   /* bool moves as bytes; it is never reduced */
  }
}

static int nc_red(dev_cred r) {
  static const int map[DEV_NCRED] = {NC_SUM, NC_PROD, NC_MAX, NC_MIN, NC_AVG};
  return map[r];
}

/* ---- the communicator ------------------------------------------------------ */

#define WATCH_TICK_NS 10000000L     /* the watchdog's look at pending collectives */
#define GONE_GRACE_S 2.0            /* a send/recv whose peer left may still finish */

/* A collective being watched.  The interpreter thread only appends it (no
 * CUDA call, no formatting: this is on the path of every collective); the
 * watchdog records one event per stream after the unmarked ones it finds. */
typedef struct pending {
  cudaStream_t st;
  cudaEvent_t ev;                   /* NULL until the watchdog marks it */
  int owner;                        /* this entry owns ev (others share it) */
  dev_coll_kind kind;
  int n;
  uint64_t seq;
  double t0, gone_seen;
  uint64_t need;                    /* whole-job collectives a rank must have done; ~0: p2p */
  uint64_t mask[4];                 /* the peers of a group of sends and receives, or of a process group */
  char site[DEV_SITE_LEN];
  char group[64];                   /* a process group's collective: its label */
} pending;

static void describe(const pending *p, char *out, size_t len) {
  dev_coll_describe(out, len, p->kind, p->n, p->seq);
  if (p->group[0]) snprintf(out + strlen(out), len - strlen(out), " of %s", p->group);
}

/* A process group's communicator (ncclCommSplit of the world's), listed in
 * the world's, which aborts it with itself and at its close. */
typedef struct cuda_group {
  ncclComm_t comm;                  /* NULL once aborted */
  shm_comm *side;                   /* its members' sideband, where the world's has one */
  struct cuda_comm *world;          /* NULL once the world's is closed */
  struct cuda_group *next;
} cuda_group;

struct cuda_comm {
  dev_ctx *ctx;
  int device, rank, world, check;
  double timeout;
  char addr[300];                   /* NCCL_COMM_ID we set, for messages */
  ncclComm_t comm;                  /* NULL until connected, and after an abort */
  shm_comm *side;                  /* ranks of one node: the sideband */
  uint64_t whole;                   /* whole-job collectives enqueued */
  pthread_mutex_t mu;               /* NCCL calls, the pending list, the state */
  pthread_cond_t cv;
  pthread_t watchdog;
  int has_watchdog, stop;
  pending *pend;
  int npend, cappend;
  cudaEvent_t *spare;
  int nspare, capspare;
  char broken[900];                 /* why the communicator cannot be used */
  cuda_comm_graph *graphs;          /* executables holding NCCL's captured work */
  cuda_group *groups;               /* the process groups split from it */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* NCCL's words for a failed call: its last error when it has one. */
static void nc_why(ncclComm_t comm, ncclResult_t r, char *out, size_t len) {
  const char *last = nc.last_error ? nc.last_error(comm) : NULL;
  snprintf(out, len, "%s%s%s", nc.error_string(r), last && *last ? ": " : "", last && *last ? last : "");
}

/* Called with mu held: abort the communicator and keep why. */
static void abort_locked(cuda_comm *c, const char *why) {
  if (!c->broken[0]) snprintf(c->broken, sizeof c->broken, "%s", why);
  for (cuda_comm_graph *g = c->graphs; g; g = g->next) g->leak = 1;
  if (c->comm) {
    nc.abort(c->comm);
    c->comm = NULL;
  }
  /* a group's kernels may wait on a rank the world lost */
  for (cuda_group *g = c->groups; g; g = g->next)
    if (g->comm) {
      nc.abort(g->comm);
      g->comm = NULL;
    }
  for (int i = 0; i < c->npend; i++)
    if (c->pend[i].owner) cudaEventDestroy(c->pend[i].ev);
  c->npend = 0;
}

/* ---- the watchdog ---------------------------------------------------------- */

/* Whether a peer of a pending collective may be gone: the test of every
 * entry at once, a kill(pid, 0) per peer at most.  Asking shm_comm_gone
 * entry by entry cost a syscall per peer per entry, with mu held: ~1000
 * entries a tick at 10 us a collective, and the interpreter thread waited
 * on mu for each collective it enqueued.  A peer gone for one entry is gone
 * for the union: the larger `need` of later whole-job entries and the union
 * of the groups' peers only fail more; the entries are then looked at one
 * by one for the first that fails. */
static int peers_maybe_gone(cuda_comm *c) {
  uint64_t need = 0, mask[4] = {0};
  int p2p = 0;
  for (int i = 0; i < c->npend; i++) {
    const pending *p = &c->pend[i];
    if (p->need == UINT64_MAX) {
      p2p = 1;
      for (int w = 0; w < 4; w++) mask[w] |= p->mask[w];
    } else if (p->need > need) {
      need = p->need;
    }
  }
  char msg[16];
  return (need && shm_comm_gone(c->side, NULL, need, "", msg, sizeof msg) >= 0) ||
         (p2p && shm_comm_gone(c->side, mask, UINT64_MAX, "", msg, sizeof msg) >= 0);
}

/* The world's communicator's asynchronous error, else a process group's;
 * *bad: whose. */
static ncclResult_t async_errors(cuda_comm *c, ncclComm_t *bad) {
  ncclResult_t r = NC_SUCCESS;
  nc.async_error(c->comm, &r);
  *bad = c->comm;
  for (cuda_group *g = c->groups; g && (r == NC_SUCCESS || r == NC_IN_PROGRESS); g = g->next)
    if (g->comm) {
      nc.async_error(g->comm, &r);
      *bad = g->comm;
    }
  return r;
}

static void watch_mark(cuda_comm *c) {
  /* mark: an event after the unmarked collectives of each stream (a stream
   * is not destroyed under us: cuda_comm_forget_stream takes mu) */
  for (int i = 0; i < c->npend; i++) {
    pending *p = &c->pend[i];
    if (p->ev) continue;
    cudaEvent_t ev = NULL;
    if (c->nspare > 0) ev = c->spare[--c->nspare];
    else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) ev = NULL;
    if (ev && cudaEventRecord(ev, p->st) != cudaSuccess) {
      cudaEventDestroy(ev);
      ev = NULL;
    }
    if (!ev) { cudaGetLastError(); continue; }   /* tried again next tick */
    p->ev = ev;
    p->owner = 1;
    for (int k = i + 1; k < c->npend; k++)
      if (!c->pend[k].ev && c->pend[k].st == p->st) c->pend[k].ev = ev;
  }
}

static void watch_reap(cuda_comm *c) {
  /* forget the collectives that finished (entries sharing an event finish
   * together; the owner comes first) */
  int k = 0;
  cudaEvent_t last = NULL;     /* one query per event, however many share it */
  cudaError_t last_e = cudaErrorNotReady;
  for (int i = 0; i < c->npend; i++) {
    pending *p = &c->pend[i];
    cudaError_t e = cudaErrorNotReady;
    if (p->ev && p->ev == last) e = last_e;
    else if (p->ev) last = p->ev, e = last_e = cudaEventQuery(p->ev);
    if (e == cudaErrorNotReady) { c->pend[k++] = *p; continue; }
    cudaGetLastError();   /* a failed kernel is reported by the waits */
    if (!p->owner) continue;
    if (c->nspare < c->capspare) c->spare[c->nspare++] = p->ev;
    else cudaEventDestroy(p->ev);
  }
  c->npend = k;
}

/* Why the communicator must be aborted (in why), or 0: NCCL reported an
 * error, a peer is gone, or a collective timed out. */
static int watch_why(cuda_comm *c, char *why, size_t n) {
  char msg[700], what[192];
  pending *p = &c->pend[0];
  ncclComm_t bad;
  ncclResult_t r = async_errors(c, &bad);
  if (r != NC_SUCCESS && r != NC_IN_PROGRESS) {
    nc_why(bad, r, msg, sizeof msg);
    describe(p, what, sizeof what);
    snprintf(why, n, "NCCL reported an error while rank %d waits in %s (enqueued at %s): %.500s", c->rank,
             what, p->site, msg);
    return 1;
  }
  double t = now_s();
  int scan = c->side && peers_maybe_gone(c);
  for (int i = 0; scan && i < c->npend; i++) {
    p = &c->pend[i];
    int p2p = p->need == UINT64_MAX;
    describe(p, what, sizeof what);
    if (shm_comm_gone(c->side, p2p ? p->mask : NULL, p->need, what, msg, sizeof msg) < 0) continue;
    /* a peer that left after its part of a send or receive: that may still finish */
    if (p2p && !p->gone_seen) p->gone_seen = t;
    if (p2p && t - p->gone_seen < GONE_GRACE_S) continue;
    snprintf(why, n, "%s (enqueued at %s)", msg, p->site);
    return 1;
  }
  for (int i = 0; i < c->npend; i++) {
    p = &c->pend[i];
    if (t - p->t0 <= c->timeout) continue;
    /* collectives marked together finish together: the last of them is
     * not done, and maybe not those before it */
    const pending *last = p;
    for (int k = i + 1; k < c->npend; k++)
      if (c->pend[k].ev == p->ev && p->ev) last = &c->pend[k];
    char first[96] = "", alsofrom[300] = "";
    describe(last, what, sizeof what);
    if (last != p) {
      describe(p, first, sizeof first);
      snprintf(alsofrom, sizeof alsofrom, ", or one before it on its stream back to %s (enqueued at %s),", first,
               p->site);
    }
    snprintf(why, n, "timed out: %s (enqueued at %s)%s did not finish within %.0f s; a rank did not call it "
             "or called another collective (GPULUA_COMM_CHECK=1 compares every collective across ranks; "
             "GPULUA_COMM_TIMEOUT waits longer)", what, last->site, alsofrom, c->timeout);
    if (c->side) shm_comm_where(c->side, why, n);
    return 1;
  }
  return 0;
}

static void watch_once(cuda_comm *c) {
  watch_mark(c);
  watch_reap(c);
  if (!c->npend || !c->comm) return;
  char why[1600];
  if (!watch_why(c, why, sizeof why)) return;
  strncat(why, "; the communicator is aborted", sizeof why - strlen(why) - 1);
  /* reported first: the abort ends NCCL's kernels, and a thread waiting on
   * the stream must find the error when its wait returns */
  dev_async_fail(c->ctx, "%s", why);
  abort_locked(c, why);
}

static void *watchdog(void *arg) {
  cuda_comm *c = arg;
  cudaSetDevice(c->device);
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    if (c->npend == 0) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    watch_once(c);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WATCH_TICK_NS;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* ---- joining ---------------------------------------------------------------- */

int cuda_comm_open(dev_ctx *ctx, int device, const dev_rank_info *ri, cuda_comm **out) {
  char err[512];
  if (nc_load(err, sizeof err)) return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "%s", err);
  cuda_comm *c = calloc(1, sizeof *c);
  if (!c) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  c->ctx = ctx;
  c->device = device;
  c->rank = ri->rank;
  c->world = ri->world;
  c->check = ri->check;
  c->timeout = ri->timeout_s > 0 ? ri->timeout_s : 300;
  c->capspare = 64;
  c->spare = calloc((size_t)c->capspare, sizeof *c->spare);
  if (!c->spare) { free(c); return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory"); }
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  /* ranks of one node meet in the sideband (up to its size) */
  if (ri->world > 1 && ri->local_world == ri->world && ri->world <= 256 &&
      shm_comm_open(ri, 1, &c->side, err, sizeof err)) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->spare);
    free(c);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s", err);
  }
  *out = c;
  return DEV_OK;
}

/* Pairs of ranks connected for send and recv by the warm-up; past this,
 * a pair connects at its first exchange (NCCL's call then blocks until the
 * peer comes). */
#define WARM_P2P_MAX 16

/* The helper thread's job: create the communicator and connect it. */
typedef struct init_job {
  pthread_mutex_t mu;
  int done, abandoned;
  int device, rank, world;
  ncclUniqueId id;
  ncclComm_t comm;
  char err[700];
} init_job;

static void job_free(init_job *j) {
  pthread_mutex_destroy(&j->mu);
  free(j);
}

static void *init_main(void *arg) {
  init_job *j = arg;
  char err[700] = "";
  ncclComm_t comm = NULL;
  void *buf = NULL;
  cudaStream_t st = NULL;
  cudaError_t e = cudaSetDevice(j->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&buf, 2 * (size_t)j->world);
  if (e != cudaSuccess) {
    snprintf(err, sizeof err, "CUDA error %s before creating the communicator", cudaGetErrorName(e));
    cudaGetLastError();
    goto out;
  }
  nc_config cfg = {sizeof cfg, 0xcafebeef, NC_MIN_VERSION, 1 /* blocking */, NC_UNDEF_INT, NC_UNDEF_INT,
                   NC_UNDEF_INT, NULL, NC_UNDEF_INT};
  ncclResult_t r = nc.init_rank_config(&comm, j->world, j->id, j->rank, &cfg);
  const char *step = "could not create the communicator";
  /* warm-up: a byte to and from every other rank, then a 1-byte all_reduce */
  if (r == NC_SUCCESS && j->world > 1 && j->world <= WARM_P2P_MAX) {
    step = "connecting the ranks for send and recv";
    unsigned char *b = buf;
    r = nc.group_start();
    for (int q = 0; q < j->world && r == NC_SUCCESS; q++) {
      if (q == j->rank) continue;
      r = nc.send(b + q, 1, NC_UINT8, q, comm, st);
      if (r == NC_SUCCESS) r = nc.recv(b + j->world + q, 1, NC_UINT8, q, comm, st);
    }
    ncclResult_t r2 = nc.group_end();
    if (r == NC_SUCCESS) r = r2;
  }
  if (r == NC_SUCCESS) {
    step = "the first all_reduce";
    r = nc.all_reduce(buf, buf, 1, NC_UINT8, NC_MAX, comm, st);
  }
  if (r != NC_SUCCESS) {
    char nw[600];
    nc_why(comm, r, nw, sizeof nw);
    snprintf(err, sizeof err, "NCCL %s: %s", step, nw);
  } else if ((e = cudaStreamSynchronize(st)) != cudaSuccess) {
    snprintf(err, sizeof err, "CUDA error %s in NCCL's first all_reduce", cudaGetErrorName(e));
    cudaGetLastError();
  }
out:
  if (err[0] && comm) {
    nc.abort(comm);
    comm = NULL;
  }
  if (buf) cudaFree(buf);
  if (st) cudaStreamDestroy(st);
  pthread_mutex_lock(&j->mu);
  int abandoned = j->abandoned;
  j->comm = comm;
  snprintf(j->err, sizeof j->err, "%s", err);
  j->done = 1;
  pthread_mutex_unlock(&j->mu);
  /* the interpreter gave up waiting: what was made is ours to undo */
  if (abandoned) {
    if (comm) nc.abort(comm);
    job_free(j);
    dev_note_detached(-1);
  }
  return NULL;
}

/* NCCL's bootstrap for a job of several ranks: the same address for every
 * rank (NCCL_COMM_ID, else MASTER_ADDR and MASTER_PORT); rank 0 listens. */
static int bootstrap_addr(cuda_comm *c, const char *what) {
  const dev_rank_info *jr = &c->ctx->ri;
  if (jr->world <= 1) return DEV_OK;
  /* NCCL's bootstrap: the same address for every rank; rank 0 listens */
  const char *set = getenv("NCCL_COMM_ID");
  if (set && *set) {
    snprintf(c->addr, sizeof c->addr, "NCCL_COMM_ID=%.250s", set);
  } else {
    if (jr->master_port <= 0)
      return dev_fail(c->ctx, DEV_ERR_INVALID, "%s: MASTER_PORT is not set: start the job with gpulua -n, torchrun "
                      "or Slurm, or set NCCL_COMM_ID=host:port", what);
    char id[300];
    snprintf(id, sizeof id, strchr(jr->master_addr, ':') ? "[%s]:%d" : "%s:%d", jr->master_addr, jr->master_port);
    setenv("NCCL_COMM_ID", id, 1);
    snprintf(c->addr, sizeof c->addr, "NCCL_COMM_ID=%.250s from MASTER_ADDR and MASTER_PORT", id);
  }
  return DEV_OK;
}

/* Waits for the thread that creates the communicator (the ranks meet in
 * there), at most the timeout and while no peer is gone; c->comm is set
 * when it made one, else why says why not. */
static void await_init(cuda_comm *c, init_job *j, const char *what, char *why, size_t n) {
  char w[128];
  snprintf(w, sizeof w, "%s (creating the NCCL communicator)", what);
  double t0 = now_s();
  for (long i = 0;; i++) {
    pthread_mutex_lock(&j->mu);
    int done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (done) break;
    if (c->side && i % 20 == 19 && shm_comm_gone(c->side, NULL, 1, w, why, n) >= 0) break;
    if (now_s() - t0 > c->timeout) {
      snprintf(why, n, "timed out after %.0f s in %s waiting for the other ranks (set GPULUA_COMM_TIMEOUT "
               "to wait longer)", c->timeout, w);
      break;
    }
    nanosleep(&(struct timespec){0, i < 100 ? 200000L : 1000000L}, NULL);
  }
  pthread_mutex_lock(&j->mu);
  int done = j->done;
  if (!done) {
    j->abandoned = 1;   /* the thread frees the job */
    dev_note_detached(1);
  }
  pthread_mutex_unlock(&j->mu);
  if (done) {
    if (j->err[0]) snprintf(why, n, "%s: %.400s%s%.150s%s", w, j->err, c->addr[0] ? " (" : "", c->addr,
                            c->addr[0] ? ")" : "");
    pthread_mutex_lock(&c->mu);
    c->comm = j->comm;
    pthread_mutex_unlock(&c->mu);
    job_free(j);
  }
}

int cuda_comm_connect(cuda_comm *c, const dev_rank_info *ri, const char *what) {
  dev_ctx *ctx = c->ctx;
  if (ri) {
    c->check = ri->check;
    if (ri->timeout_s > 0) c->timeout = ri->timeout_s;
  }
  if (c->comm) return DEV_OK;
  if (c->broken[0]) return dev_fail(ctx, DEV_ERR_DEVICE, "%s: the communicator failed earlier: %s", what, c->broken);
  int rc = bootstrap_addr(c, what);
  if (rc) return rc;
  /* every connection at creation: later calls only enqueue */
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  init_job *j = calloc(1, sizeof *j);
  if (!j) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&j->mu, NULL);
  j->device = c->device;
  j->rank = c->rank;
  j->world = c->world;
  ncclResult_t r = nc.get_unique_id(&j->id);
  if (r != NC_SUCCESS) {
    char nw[600];
    nc_why(NULL, r, nw, sizeof nw);
    job_free(j);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: ncclGetUniqueId failed: %.400s (%s)", what, nw, c->addr);
  }
  pthread_t th;
  if (pthread_create(&th, NULL, init_main, j) != 0) {
    job_free(j);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: cannot start a thread: %s", what, strerror(errno));
  }
  pthread_detach(th);
  char why[800] = "";
  await_init(c, j, what, why, sizeof why);
  if (!c->comm) {
    snprintf(c->broken, sizeof c->broken, "%s", why);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s", why);
  }
  if (!c->has_watchdog) {
    if (pthread_create(&c->watchdog, NULL, watchdog, c) == 0) {
      c->has_watchdog = 1;
    } else {
      pthread_mutex_lock(&c->mu);
      abort_locked(c, "cannot start the collectives' watchdog thread");
      pthread_mutex_unlock(&c->mu);
      return dev_fail(ctx, DEV_ERR_DEVICE, "%s: cannot start the collectives' watchdog thread: %s", what,
                      strerror(errno));
    }
  }
  return DEV_OK;
}

/* ---- collectives ------------------------------------------------------------ */

static ncclResult_t issue(cuda_comm *c, const dev_coll *x, cudaStream_t st) {
  ncclComm_t comm = x->group ? ((cuda_group *)x->group->impl)->comm : c->comm;
  if (!comm) return 5;   /* ncclInvalidUsage: the group was aborted */
  const void *s = x->kind == DEV_COLL_RECV ? NULL : dev_view_ptr(&x->send);
  void *d = x->kind == DEV_COLL_SEND ? NULL : dev_view_ptr(&x->recv);
  const dev_view *v = x->kind == DEV_COLL_RECV ? &x->recv : &x->send;
  int t = nc_dtype(v->dtype);
  size_t n = (size_t)dev_view_numel(v);
  switch (x->kind) {
  case DEV_COLL_ALL_REDUCE: return nc.all_reduce(s, d, n, t, nc_red(x->red), comm, st);
  case DEV_COLL_BROADCAST: return nc.broadcast(s, d, n, t, x->peer, comm, st);
  case DEV_COLL_REDUCE: return nc.reduce(s, d, n, t, nc_red(x->red), x->peer, comm, st);
  case DEV_COLL_ALL_GATHER: return nc.all_gather(s, d, n, t, comm, st);
  case DEV_COLL_REDUCE_SCATTER:
    return nc.reduce_scatter(s, d, (size_t)dev_view_numel(&x->recv), t, nc_red(x->red), comm, st);
  case DEV_COLL_SEND: return nc.send(s, n, t, x->peer, comm, st);
  case DEV_COLL_RECV: return nc.recv(d, n, t, x->peer, comm, st);
  default: return 4;   /* ncclInvalidArgument */
  }
}

/* The world ranks p waits for: the peers of sends and receives, or the
 * members of a process group (but this rank); its label. */
static void watch_peers(pending *p, const dev_coll *g, int n, int me) {
  if (g[0].group) {
    const dev_group *pg = g[0].group;
    snprintf(p->group, sizeof p->group, "%.63s", pg->label);
    for (int i = 0; i < pg->size; i++) {
      int q = pg->members[i];
      if (q != me && q < 256) p->mask[q / 64] |= (uint64_t)1 << (q % 64);
    }
    return;
  }
  for (int i = 0; i < n; i++)
    if ((g[i].kind == DEV_COLL_SEND || g[i].kind == DEV_COLL_RECV) && g[i].peer < 256)
      p->mask[g[i].peer / 64] |= (uint64_t)1 << (g[i].peer % 64);
}

int cuda_comm_run(cuda_comm *c, void *stream, const dev_coll *g, int n, uint64_t seq) {
  dev_ctx *ctx = c->ctx;
  cudaStream_t st = stream;
  int p2p = g[0].kind == DEV_COLL_SEND || g[0].kind == DEV_COLL_RECV;
  /* a process group's collective is watched as sends and receives to its members */
  int whole = !p2p && !g[0].group;
  pending p = {.st = st, .kind = g[0].kind, .n = n, .seq = seq, .need = whole ? c->whole + 1 : UINT64_MAX};
  char what[192], err[700];
  int rc;
  if (!c->comm) {
    describe(&p, what, sizeof what);
    if ((rc = cuda_comm_connect(c, NULL, what))) return rc;
  }
  /* a process group's in its members' own sideband */
  shm_comm *side = g[0].group ? ((cuda_group *)g[0].group->impl)->side : c->side;
  if (c->check && side && shm_comm_check(side, seq, g, n, err, sizeof err)) {
    pthread_mutex_lock(&c->mu);
    abort_locked(c, err);
    pthread_mutex_unlock(&c->mu);
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", err);
  }
  p.t0 = now_s();
  memcpy(p.site, ctx->site, sizeof p.site);
  watch_peers(&p, g, n, c->rank);

  pthread_mutex_lock(&c->mu);
  if (!c->comm) {
    pthread_mutex_unlock(&c->mu);
    describe(&p, what, sizeof what);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: the communicator failed earlier: %s", what, c->broken);
  }
  ncclResult_t r = NC_SUCCESS;
  if (n > 1) r = nc.group_start();
  for (int i = 0; i < n && r == NC_SUCCESS; i++) r = issue(c, &g[i], st);
  if (n > 1) {
    ncclResult_t r2 = nc.group_end();
    if (r == NC_SUCCESS) r = r2;
  }
  if (r != NC_SUCCESS) {
    char nw[600];
    nc_why(c->comm, r, nw, sizeof nw);
    describe(&p, what, sizeof what);
    snprintf(err, sizeof err, "NCCL failed in %.140s: %.540s", what, nw);
    abort_locked(c, err);
    rc = dev_fail(ctx, DEV_ERR_DEVICE, "%s", err);
  } else {
    rc = DEV_OK;
  }
  if (rc == DEV_OK) {
    if (c->npend == c->cappend) {
      int cap = c->cappend ? 2 * c->cappend : 64;
      pending *np = realloc(c->pend, (size_t)cap * sizeof *np);
      if (np) { c->pend = np; c->cappend = cap; }
    }
    if (c->npend == c->cappend) {
      /* enqueued but not watched: the job cannot be trusted to end */
      describe(&p, what, sizeof what);
      snprintf(err, sizeof err, "%s: out of memory watching the collective", what);
      abort_locked(c, err);
      rc = dev_fail(ctx, DEV_ERR_NOMEM, "%s", err);
    } else {
      c->pend[c->npend++] = p;
      if (c->npend == 1) pthread_cond_signal(&c->cv);
      if (whole) c->whole++;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

/* ---- collectives in graphs ------------------------------------------------------
 * A graph's collectives are captured (cuda/cuda/graph.c) by the same NCCL
 * calls into a capturing stream; NCCL makes its own graph nodes.  Such an
 * executable refers to the communicator's resources, so it is destroyed
 * before the communicator is; after an abort it is leaked (NCCL's
 * resources are gone, and so may be what its destructor would touch).
 * A replay is checked and watched as its collectives called one by one,
 * and is launched under mu, so that it never runs on an aborted
 * communicator. */

int cuda_comm_capture(cuda_comm *c, void *stream, const dev_gnode *nd) {
  dev_ctx *ctx = c->ctx;
  pthread_mutex_lock(&c->mu);
  ncclResult_t r = NC_SUCCESS;
  if (!c->comm) {
    pthread_mutex_unlock(&c->mu);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: the communicator failed earlier: %s", dev_coll_name(nd->coll[0].kind),
                    c->broken);
  }
  if (nd->ncoll > 1) r = nc.group_start();
  for (int i = 0; i < nd->ncoll && r == NC_SUCCESS; i++) r = issue(c, &nd->coll[i], stream);
  if (nd->ncoll > 1) {
    ncclResult_t r2 = nc.group_end();
    if (r == NC_SUCCESS) r = r2;
  }
  int rc = DEV_OK;
  if (r != NC_SUCCESS) {
    char nw[600];
    nc_why(c->comm, r, nw, sizeof nw);
    rc = dev_fail(ctx, DEV_ERR_DEVICE, "NCCL failed capturing %s: %.550s", nd->ncoll > 1 ? "a group" :
                  dev_coll_name(nd->coll[0].kind), nw);
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

int cuda_comm_ready(cuda_comm *c, const char *what) {
  return c->comm ? DEV_OK : cuda_comm_connect(c, NULL, what);
}

void cuda_comm_graph_add(cuda_comm *c, cuda_comm_graph *g) {
  pthread_mutex_lock(&c->mu);
  g->leak = g->gone = 0;
  g->next = c->graphs;
  c->graphs = g;
  pthread_mutex_unlock(&c->mu);
}

int cuda_comm_graph_drop(cuda_comm *c, cuda_comm_graph *g) {
  pthread_mutex_lock(&c->mu);
  for (cuda_comm_graph **p = &c->graphs; *p; p = &(*p)->next)
    if (*p == g) { *p = g->next; break; }
  int leak = g->leak || c->broken[0];
  pthread_mutex_unlock(&c->mu);
  return leak;
}

int cuda_comm_replay(cuda_comm *c, void *stream, void *exec, const dev_gexec *gx, uint64_t seq, const char *label) {
  dev_ctx *ctx = c->ctx;
  char err[700];
  uint64_t k = seq;
  for (int i = 0; c->check && c->side && i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind != DEV_GN_COLL) continue;
    shm_comm *side = nd->coll[0].group ? ((cuda_group *)nd->coll[0].group->impl)->side : c->side;
    if (side && shm_comm_check(side, k++, nd->coll, nd->ncoll, err, sizeof err)) {
      pthread_mutex_lock(&c->mu);
      abort_locked(c, err);
      pthread_mutex_unlock(&c->mu);
      return dev_fail(ctx, DEV_ERR_INVALID, "%s: %s", label, err);
    }
  }
  pthread_mutex_lock(&c->mu);
  if (!c->comm) {
    pthread_mutex_unlock(&c->mu);
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s: the communicator failed earlier: %s", label, c->broken);
  }
  if (c->npend + gx->ncolls > c->cappend) {
    int cap = c->cappend ? c->cappend : 64;
    while (cap < c->npend + gx->ncolls) cap *= 2;
    pending *np = realloc(c->pend, (size_t)cap * sizeof *np);
    if (!np) {
      pthread_mutex_unlock(&c->mu);
      return dev_fail(ctx, DEV_ERR_NOMEM, "%s: out of memory watching its collectives", label);
    }
    c->pend = np;
    c->cappend = cap;
  }
  cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
  if (e != cudaSuccess) {
    pthread_mutex_unlock(&c->mu);
    return cuda_error(ctx, e, label);
  }
  double t0 = now_s();
  k = seq;
  for (int i = 0; i < gx->n; i++) {
    const dev_gnode *nd = &gx->nodes[i];
    if (nd->kind != DEV_GN_COLL) continue;
    int whole = nd->coll[0].kind != DEV_COLL_SEND && nd->coll[0].kind != DEV_COLL_RECV && !nd->coll[0].group;
    pending p = {.st = stream, .kind = nd->coll[0].kind, .n = nd->ncoll, .seq = k++, .t0 = t0,
                 .need = whole ? c->whole + 1 : UINT64_MAX};
    snprintf(p.site, sizeof p.site, "%s", nd->site);
    watch_peers(&p, nd->coll, nd->ncoll, c->rank);
    c->pend[c->npend++] = p;
    if (whole) c->whole++;
  }
  if (c->npend == gx->ncolls) pthread_cond_signal(&c->cv);   /* the list was empty */
  pthread_mutex_unlock(&c->mu);
  return DEV_OK;
}

/* A stream about to be destroyed: it has drained, so its collectives are
 * done; the watchdog must not mark it any more. */
void cuda_comm_forget_stream(cuda_comm *c, void *stream) {
  pthread_mutex_lock(&c->mu);
  int k = 0;
  for (int i = 0; i < c->npend; i++) {
    pending *p = &c->pend[i];
    if (p->st != (cudaStream_t)stream) { c->pend[k++] = *p; continue; }
    if (p->owner) cudaEventDestroy(p->ev);
  }
  c->npend = k;
  pthread_mutex_unlock(&c->mu);
}

/* ---- leaving ----------------------------------------------------------------- */

void cuda_comm_close(cuda_comm *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->has_watchdog) pthread_join(c->watchdog, NULL);
  /* the graphs holding NCCL's work go before the communicator (the work
   * is done: the context synchronized first); after an abort they leak */
  pthread_mutex_lock(&c->mu);
  cuda_comm_graph *gl = c->graphs;
  int aborted = c->broken[0] != 0;
  c->graphs = NULL;
  pthread_mutex_unlock(&c->mu);
  for (cuda_comm_graph *g = gl, *next; g; g = next) {
    next = g->next;
    g->next = NULL;
    g->gone = 1;
    if (!aborted) g->kill(g);
    g->leak = 1;   /* freed here or never: the graph's own free skips it */
  }
  pthread_mutex_lock(&c->mu);
  /* The queued work is done (the context synchronized first).  Destroying
   * would first flush NCCL's state, which can wait for ever after a receive
   * that got less than it expected; aborting frees the same without waiting. */
  if (c->comm) {
    nc.abort(c->comm);
    c->comm = NULL;
  }
  /* groups still open: aborted as the world's, and cut loose from it */
  for (cuda_group *g = c->groups, *next; g; g = next) {
    next = g->next;
    if (g->comm) nc.abort(g->comm);
    g->comm = NULL;
    g->world = NULL;
    g->next = NULL;
  }
  c->groups = NULL;
  for (int i = 0; i < c->npend; i++)
    if (c->pend[i].owner) cudaEventDestroy(c->pend[i].ev);
  for (int i = 0; i < c->nspare; i++) cudaEventDestroy(c->spare[i]);
  pthread_mutex_unlock(&c->mu);
  if (c->side) {
    shm_comm_set_done(c->side, c->whole);
    shm_comm_close(c->side);
  }
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c->pend);
  free(c->spare);
  free(c);
}

/* ---- process groups ------------------------------------------------------------ */

/* Unlisted from the world's (if still open), then destroyed: NCCL first
 * finishes the work queued on it.  An aborted one has nothing left. */
static void group_free(void *impl) {
  cuda_group *g = impl;
  cuda_comm *c = g->world;
  if (c) pthread_mutex_lock(&c->mu);
  if (c)
    for (cuda_group **p = &c->groups; *p; p = &(*p)->next)
      if (*p == g) { *p = g->next; break; }
  ncclComm_t comm = g->comm;
  g->comm = NULL;
  if (c) pthread_mutex_unlock(&c->mu);
  if (comm) nc.destroy(comm);
  shm_comm_close(g->side);
  free(g);
}

int cuda_comm_split(cuda_comm *c, dev_group *pg, int color, int key) {
  dev_ctx *ctx = c->ctx;
  if (!nc.split)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "process groups on the cuda backend need NCCL's ncclCommSplit and "
                    "ncclCommDestroy (NCCL 2.18 or newer)");
  int rc = cuda_comm_ready(c, "new_group");
  if (rc) return rc;
  cuda_group *g = pg ? calloc(1, sizeof *g) : NULL;
  if (pg && !g) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory making a group");
  /* collective over the world: every rank got here (the dev layer's
   * all_gather of the colours was synchronized); the new communicator
   * inherits the world's configuration (config NULL) */
  pthread_mutex_lock(&c->mu);
  ncclComm_t comm = NULL;
  ncclResult_t r = c->comm ? nc.split(c->comm, color < 0 ? -1 : color, key, &comm, NULL) : 5;
  char nw[600] = "";
  if (r != NC_SUCCESS) {
    if (c->comm) nc_why(c->comm, r, nw, sizeof nw);
    else snprintf(nw, sizeof nw, "the communicator failed earlier: %.500s", c->broken);
  } else if (g) {
    g->comm = comm;
    g->world = c;
    g->next = c->groups;
    c->groups = g;
  }
  pthread_mutex_unlock(&c->mu);
  if (r != NC_SUCCESS) {
    free(g);
    return dev_fail(ctx, DEV_ERR_DEVICE, "ncclCommSplit failed making %s: %.550s", pg ? pg->label : "a group", nw);
  }
  if (pg && !comm) {
    free(g);
    return dev_fail(ctx, DEV_ERR_DEVICE, "ncclCommSplit made no communicator for %s", pg->label);
  }
  if (pg) {
    pg->impl = g;
    pg->free_impl = group_free;
  }
  /* the members meet in a sideband of their own, as the world's ranks do */
  char serr[512];
  if (pg && c->side && shm_comm_open_group(&ctx->ri, pg->members, pg->size, pg->rank, pg->id, pg->label, 1, &g->side,
                                           serr, sizeof serr)) {
    group_free(g);
    pg->impl = NULL;
    pg->free_impl = NULL;
    return dev_fail(ctx, DEV_ERR_DEVICE, "%s", serr);
  }
  return DEV_OK;
}
