/* The raw NCCL reference of the all_reduce sweep of `make bench`
 * (bench/run.lua): bench/allreduce.lua's sweep written the plain way, one
 * process per GPU, nccl-tests style.  f32 sum, out of place, 8 B to 1 GiB in
 * steps of 8 (quick: to 256 KiB).  Per size: warm-up calls, a barrier (a
 * one-byte all_reduce and a stream sync, as gpu.barrier), then back-to-back
 * ncclAllReduce on one stream timed with events: time = elapsed / calls,
 * algbw = bytes / time, busbw = algbw * 2(n-1)/n.  Then every rank checks
 * every element of its result on the host; the count of ranks with a wrong
 * result is all-reduced and rank 0 reports for the job.  Then the 8-byte
 * all_reduce captured in a CUDA graph (NCCL's stream capture), replayed
 * back-to-back with cudaGraphLaunch (KEY_graph).
 *
 *   nccl_ref N [quick]      (BENCH_QUICK=1 as quick)
 *
 * The parent picks a free port for NCCL_COMM_ID=127.0.0.1:PORT (every rank
 * then gets the same unique id; rank 0 serves it), sets NCCL_NVLS_ENABLE=0
 * unless it is set, and forks the N ranks before any CUDA call; rank r uses
 * GPU r.  When a rank fails the parent ends the others.
 *
 * Rank 0 prints, per size (KEY: allreduce_nN_SIZE, e.g. allreduce_n2_128M):
 *   row KEY_time US us LABEL   row KEY_algbw X GB/s LABEL   row KEY_busbw X GB/s LABEL
 *   check KEY ok
 * A rank with a wrong result or a failed call prints `check KEY FAILED rank R: why`.
 * Exit status 1 when a check or a rank failed.
 *
 * Sizes, warm-up and call counts are kept in step with allreduce_plan in
 * bench/benchlib.lua. */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cuda_runtime.h>
#include <nccl.h>

#define THREADS 256

static int g_rank;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void row(const char *key, const char *suffix, double v, const char *unit, const char *label,
                const char *what) {
  printf("row %s_%s %.6g %s %s %s\n", key, suffix, v, unit, label, what);
  fflush(stdout);
}

__attribute__((format(printf, 3, 4)))
static void check(const char *key, int ok, const char *fmt, ...) {
  char why[512] = "";
  if (!ok && fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
  }
  printf("check %s %s%s%s\n", key, ok ? "ok" : "FAILED", *why ? " " : "", why);
  fflush(stdout);
}

/* In a function with `int rc`, `const char *key` and an `out:` label that
 * frees what was taken. */
#define CK(call)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      check(key, 0, "rank %d: %s:%d: %s: %s (%s)", g_rank, __FILE__, __LINE__, #call,  \
            cudaGetErrorString(e_), cudaGetErrorName(e_));                             \
      rc = -1;                                                                         \
      goto out;                                                                        \
    }                                                                                  \
  } while (0)

#define NK(call)                                                                       \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      check(key, 0, "rank %d: %s:%d: %s: %s (%s)", g_rank, __FILE__, __LINE__, #call,  \
            ncclGetErrorString(r_), ncclGetLastError(comm));                           \
      rc = -1;                                                                         \
      goto out;                                                                        \
    }                                                                                  \
  } while (0)

#define NEED(p)                                                                        \
  do {                                                                                 \
    if (!(p)) {                                                                        \
      check(key, 0, "rank %d: %s:%d: out of host memory", g_rank, __FILE__, __LINE__);  \
      rc = -1;                                                                         \
      goto out;                                                                        \
    }                                                                                  \
  } while (0)

/* ---- the plan (benchlib.lua's allreduce_plan) --------------------------- */

static int latency_only = 0;   /* `latency`: the 8-byte size only (more rounds of it) */
static size_t plan_top(int quick) {
  return latency_only ? 8 : quick ? (size_t)256 << 10 : (size_t)1 << 30;
}
static int plan_warm(int quick) { return quick ? 2 : 5; }

/* calls that make a timed loop last about 100 ms at 10 us + bytes at
 * 300 GB/s busbw a call; at least 20, at most 1000 */
static int plan_iters(size_t bytes, int n, int quick) {
  if (quick) return 10;
  double est_us = 10.0 + (double)bytes * 2.0 * (n - 1) / n / 3e5;
  double k = floor(1e5 / est_us);
  return k < 20 ? 20 : k > 1000 ? 1000 : (int)k;
}

/* 8B "8 B", 32K "32 KiB", 1G "1 GiB" (benchlib.lua's bytes_names) */
static void bytes_names(size_t bytes, char *key, size_t klen, char *label, size_t llen) {
  static const char *const units[] = {"B", "K", "M", "G"}, *const names[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  size_t v = bytes;
  while (u < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    u++;
  }
  snprintf(key, klen, "%zu%s", v, units[u]);
  snprintf(label, llen, "%zu %s", v, names[u]);
}

/* ---- one rank ------------------------------------------------------------ */

/* p[i] = factor * (1 + i % 7): small integers, so the f32 sum is exact */
__global__ void pattern_kernel(float *p, int64_t n, float factor) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = factor * (float)(1 + i % 7);
}

static int run_rank(int n, int quick) {
  int rc = 0, ndev = 0, warm = plan_warm(quick), tri = n * (n + 1) / 2;
  char key[64], label[96], skey[16], slabel[32];
  ncclComm_t comm = NULL;
  ncclUniqueId id;
  cudaStream_t s = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  float *x = NULL, *y = NULL, *h = NULL;
  int *dbad = NULL;
  unsigned char *flag = NULL;
  size_t maxb = plan_top(quick), maxn = maxb / 4;
  snprintf(key, sizeof key, "allreduce_n%d", n);
  CK(cudaGetDeviceCount(&ndev));
  if (g_rank >= ndev) {
    check(key, 0, "rank %d: %d GPU%s here", g_rank, ndev, ndev == 1 ? "" : "s");
    rc = -1;
    goto out;
  }
  CK(cudaSetDevice(g_rank));
  NK(ncclGetUniqueId(&id));
  NK(ncclCommInitRank(&comm, n, id, g_rank));
  CK(cudaStreamCreate(&s));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMalloc((void **)&x, maxb));
  CK(cudaMalloc((void **)&y, maxb));
  CK(cudaMalloc((void **)&dbad, sizeof(int)));
  CK(cudaMalloc((void **)&flag, 1));
  h = (float *)malloc(maxb);
  NEED(h);
  pattern_kernel<<<(unsigned)((maxn + THREADS - 1) / THREADS < 4096 ? (maxn + THREADS - 1) / THREADS : 4096),
                   THREADS, 0, s>>>(x, (int64_t)maxn, (float)(g_rank + 1));
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));

  for (size_t bytes = 8; bytes <= maxb; bytes *= 8) {
    size_t cnt = bytes / 4;
    int iters = plan_iters(bytes, n, quick), bad = 0, nbad = 0;
    float ms = 0;
    ncclResult_t async = ncclSuccess;
    bytes_names(bytes, skey, sizeof skey, slabel, sizeof slabel);
    snprintf(key, sizeof key, "allreduce_n%d_%s", n, skey);
    snprintf(label, sizeof label, "all_reduce n=%d %s", n, slabel);
    /* all ones: a NaN, so a result never written is seen */
    CK(cudaMemsetAsync(y, 0xff, bytes, s));
    for (int i = 0; i < warm; i++) NK(ncclAllReduce(x, y, cnt, ncclFloat, ncclSum, comm, s));
    /* the barrier: the warm-up is done everywhere */
    CK(cudaMemsetAsync(flag, 0, 1, s));
    NK(ncclAllReduce(flag, flag, 1, ncclUint8, ncclMax, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(e0, s));
    double h0 = now_s();
    for (int i = 0; i < iters; i++) NK(ncclAllReduce(x, y, cnt, ncclFloat, ncclSum, comm, s));
    double host_us = (now_s() - h0) * 1e6 / iters;
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    /* an error of the queued calls themselves */
    NK(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess) {
      check(key, 0, "rank %d: ncclAllReduce failed asynchronously: %s (%s)", g_rank, ncclGetErrorString(async),
            ncclGetLastError(comm));
      rc = -1;
      goto out;
    }
    double us = (double)ms * 1e3 / iters;

    /* every element, on the host */
    CK(cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt; i++) {
      float want = (float)(tri * (int)(1 + i % 7));
      if (h[i] != want) {
        check(key, 0, "rank %d: element %zu is %g, want %g", g_rank, i, (double)h[i], (double)want);
        bad = 1;
        break;
      }
    }
    CK(cudaMemcpyAsync(dbad, &bad, sizeof bad, cudaMemcpyHostToDevice, s));
    NK(ncclAllReduce(dbad, dbad, 1, ncclInt32, ncclSum, comm, s));
    CK(cudaMemcpyAsync(&nbad, dbad, sizeof nbad, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    if (nbad > 0) rc = 1;
    if (g_rank == 0) {
      double algbw = (double)bytes / (us * 1e3);
      row(key, "time", us, "us", label, "time");
      row(key, "algbw", algbw, "GB/s", label, "algbw");
      row(key, "busbw", algbw * 2 * (n - 1) / n, "GB/s", label, "busbw");
      if (bytes == 8) row(key, "host", host_us, "us", label, "host time per call");
      if (nbad == 0) check(key, 1, NULL);
    }
  }
  /* the 8-byte all_reduce captured in a CUDA graph, replayed back-to-back */
  {
    size_t bytes = 8, cnt = bytes / 4;
    int iters = plan_iters(bytes, n, quick), bad = 0, nbad = 0;
    float ms = 0;
    bytes_names(bytes, skey, sizeof skey, slabel, sizeof slabel);
    snprintf(key, sizeof key, "allreduce_n%d_%s_graph", n, skey);
    snprintf(label, sizeof label, "all_reduce n=%d %s in a graph", n, slabel);
    CK(cudaMemsetAsync(y, 0xff, bytes, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ncclResult_t cr = ncclAllReduce(x, y, cnt, ncclFloat, ncclSum, comm, s);
    cudaError_t ce = cudaStreamEndCapture(s, &graph);
    NK(cr);
    CK(ce);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < warm; i++) CK(cudaGraphLaunch(exec, s));
    CK(cudaMemsetAsync(flag, 0, 1, s));
    NK(ncclAllReduce(flag, flag, 1, ncclUint8, ncclMax, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; i++) CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    double us = (double)ms * 1e3 / iters;
    CK(cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt; i++) {
      float want = (float)(tri * (int)(1 + i % 7));
      if (h[i] != want) {
        check(key, 0, "rank %d: element %zu is %g, want %g", g_rank, i, (double)h[i], (double)want);
        bad = 1;
        break;
      }
    }
    CK(cudaMemcpyAsync(dbad, &bad, sizeof bad, cudaMemcpyHostToDevice, s));
    NK(ncclAllReduce(dbad, dbad, 1, ncclInt32, ncclSum, comm, s));
    CK(cudaMemcpyAsync(&nbad, dbad, sizeof nbad, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    if (nbad > 0) rc = 1;
    if (g_rank == 0) {
      row(key, "time", us, "us", label, "time (a replay)");
      if (nbad == 0) check(key, 1, NULL);
    }
  }
  /* nobody exits (and gets its peers ended) before rank 0 has printed */
  snprintf(key, sizeof key, "allreduce_n%d", n);
  NK(ncclAllReduce(flag, flag, 1, ncclUint8, ncclMax, comm, s));
  CK(cudaStreamSynchronize(s));
out:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (comm) {
    if (rc < 0) ncclCommAbort(comm);
    else ncclCommDestroy(comm);
  }
  if (x) cudaFree(x);
  if (y) cudaFree(y);
  if (dbad) cudaFree(dbad);
  if (flag) cudaFree(flag);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) cudaStreamDestroy(s);
  free(h);
  return rc;
}

/* ---- the parent ------------------------------------------------------------ */

/* a TCP port free on 127.0.0.1 now: bind port 0, read it back, close */
static int free_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
  if (fd < 0) return -1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int usage(void) {
  fprintf(stderr, "usage: nccl_ref N [quick] [latency]     N ranks, one per GPU (GPU r for rank r)\n");
  return 2;
}

int main(int argc, char **argv) {
  int n = 0, quick = 0, failed = 0, left = 0;
  const char *q = getenv("BENCH_QUICK");
  char id[64];
  pid_t *pids;
  if (q && *q && strcmp(q, "0") != 0) quick = 1;
  for (int i = 1; i < argc; i++) {
    char *end;
    if (strcmp(argv[i], "quick") == 0) {
      quick = 1;
      continue;
    }
    if (strcmp(argv[i], "latency") == 0) {
      latency_only = 1;
      continue;
    }
    long v = strtol(argv[i], &end, 10);
    if (n != 0 || *end != '\0' || v < 1 || v > 1024) return usage();
    n = (int)v;
  }
  if (n == 0) return usage();

  int port = free_port();
  if (port < 0) {
    printf("check allreduce_n%d FAILED no free TCP port on 127.0.0.1 for NCCL_COMM_ID\n", n);
    return 1;
  }
  snprintf(id, sizeof id, "127.0.0.1:%d", port);
  setenv("NCCL_COMM_ID", id, 1);
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  printf("info allreduce_n%d %d ranks, NCCL_COMM_ID=%s, NCCL_NVLS_ENABLE=%s\n", n, n, id, getenv("NCCL_NVLS_ENABLE"));
  fflush(stdout);
  fflush(stderr);

  pids = (pid_t *)calloc((size_t)n, sizeof *pids);
  if (!pids) return 1;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p == 0) {
      g_rank = r;
      int rc = run_rank(n, quick);
      fflush(stdout);
      fflush(stderr);
      _exit(rc != 0);
    }
    if (p < 0) {
      perror("nccl_ref: fork");
      failed = 1;
      break;
    }
    pids[r] = p;
    left++;
  }
  if (failed)
    for (int r = 0; r < n; r++)
      if (pids[r] > 0) kill(pids[r], SIGTERM);

  /* the first rank that fails ends the others: they would wait for it */
  while (left > 0) {
    int st, r = 0;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0) break;
    while (r < n && pids[r] != p) r++;
    if (r == n) continue;
    pids[r] = 0;
    left--;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    if (!failed) {
      if (WIFSIGNALED(st)) fprintf(stderr, "nccl_ref: rank %d failed: killed by signal %d\n", r, WTERMSIG(st));
      else fprintf(stderr, "nccl_ref: rank %d failed: exit status %d\n", r, WEXITSTATUS(st));
      for (int k = 0; k < n; k++)
        if (pids[k] > 0) kill(pids[k], SIGTERM);
    }
    failed = 1;
  }
  free(pids);
  return failed;
}
