/* The CUDA runtime backend's state (cuda/cuda/runtime.c), shared with the
 * files split off it: cublas.c (matmul through cuBLAS) and modules.c (the
 * modules of run-time kernels).  Private to those three; what the other
 * files of cuda/cuda/ call is in cu.h. */
#ifndef GPULUA_CUDA_RT_H
#define GPULUA_CUDA_RT_H

#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cu.h"

#define MAXMARK 64
#define NREC 64                /* ops remembered per stream, to name a failed one */
#define NNOTIFY 16
#define NTAGGED 64             /* index ops remembered, to name one given a bad index */
#define NSPARE 16              /* closed streams kept for reuse, per kind */
#define NFUSED 64              /* buckets of the fused programs' kernels */

typedef struct marker { cudaEvent_t ev; uint64_t covered; } marker;

/* What enqueued the op at a position: its name and script line, and
 * whether it runs the application's or the script's own code (a kernel that
 * can assert or fault; the built-in ops cannot). */
typedef struct oprec { const char *name; char site[DEV_SITE_LEN]; int user; } oprec;

typedef struct cstream {
  cudaStream_t st;
  uint64_t enq, known_done;
  marker mk[MAXMARK];          /* ring, oldest first, covered increasing */
  int head, n;
  oprec rec[NREC];             /* op at position p is rec[p % NREC] */
} cstream;

/* cuBLAS, resolved at run time */
typedef int (*cublas_create_t)(void **);
typedef int (*cublas_destroy_t)(void *);
typedef int (*cublas_setstream_t)(void *, cudaStream_t);
typedef int (*cublas_gemmex_t)(void *, int, int, int, int, int, const void *, const void *,
                               int, int, const void *, int, int, const void *, void *, int,
                               int, int, int);
typedef int (*cublas_gemmsb_t)(void *, int, int, int, int, int, const void *, const void *, int, int,
                               long long, const void *, int, int, long long, const void *, void *, int,
                               int, long long, int, int, int);

typedef struct cstate {
  int device;
  cudaStream_t side;           /* allocations and frees (nonblocking, no kernels) */
  int *flag_host, *flag_dev;   /* mapped pinned: set by kernels on integer division by zero (1),
                                  or to an index op's tag (an index out of range), or to a
                                  fused op's (a division by zero in it) */
  struct { int tag; const char *name, *what; char site[DEV_SITE_LEN]; } tagged[NTAGGED];
  int next_tag;                /* the index ops enqueued so far: tags 2, 3, ... */
  int sm_count;
  int launch_blocking;
  cudaEvent_t *evpool;         /* spare marker events */
  int nev, capev;
  void *cublas_lib, *cublas;
  cublas_setstream_t cublas_setstream;
  cublas_gemmex_t cublas_gemmex;
  cublas_gemmsb_t cublas_gemmsb;   /* cublasGemmStridedBatchedEx */
  cublas_destroy_t cublas_destroy;
  int optin_shared;            /* dynamic + static shared memory a block may opt in to */
  /* completion signals: each watch waits on one of these streams and then
   * runs a host function; a stream with no watch pending is reused, so one
   * late watch does not hold up the signal of an early one */
  cudaStream_t notify[NNOTIFY];
  atomic_int notify_pending[NNOTIFY];
  int nnotify;
  char lost[768];              /* the error that made the context unusable */
  cuda_loader *loader;         /* loads the built-in kernels in the background */
  int prio_least, prio_greatest;
  /* stream memory operations (staged copies), from the driver; NULL on a
   * driver without them: pageable copies are then the driver's own */
  CUresult (*wait_value)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  CUresult (*write_value)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  /* Closed streams with nothing queued, kept for the next gpu.stream() of
   * their kind [nonblocking][high priority]: creating a CUDA stream costs
   * more the more streams are alive (3.4 us with 1k, 20.4 us with 100k, raw
   * C on an H100, bench/RESULTS.md 2026-11-25). */
  cudaStream_t spare[2][2][NSPARE];
  int nspare[2][2];
  /* fused programs' kernels (modules.c), by program: each compiled once
   * per process run (then from the disk cache) and loaded once here */
  struct cfused *fused[NFUSED];
} cstate;

static inline cstream *CST(dev_stream *s) { return s->impl; }

#define CK(ctx, call, what) \
  do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return cuda_fail((ctx), e_, (what)); } while (0)

static inline cstate *CS(dev_ctx *ctx) { return ctx->bk_state; }

/* A CUDA error as the backend reports every one (a sticky one makes the
 * context unusable, naming the op that most likely caused it). */
int cuda_fail(dev_ctx *ctx, cudaError_t e, const char *what);

/* cublas.c: out = a @ b for the float dtypes; cuBLAS loaded (also before a
 * capture: cuda_capture_prepare) */
int cuda_matmul(dev_stream *s, const dev_kop *op);

/* The tag an op's kernel sets the flag to when it fails, remembered with
 * its name, site and `what` went wrong (a string that outlives the context):
 * the error names them. */
int cuda_tag_op(dev_ctx *ctx, const dev_kop *op, const char *what);

/* modules.c: a fused op (DEV_OP_FUSED) on stream st, its kernel (of the
 * op's layout) compiled and loaded on first use (cuda_fused_prepare: before
 * a capture). */
int cuda_fused_prepare(dev_ctx *ctx, const dev_kop *op);
int cuda_fused_launch(dev_ctx *ctx, cudaStream_t st, const dev_kop *op);
void cuda_fused_free(dev_ctx *ctx);
int cuda_load_cublas(dev_ctx *ctx);

/* modules.c: the backend's module_load, module_unload, kernel_get and
 * kernel_names (cuda/backend.h) */
int cuda_module_load(dev_ctx *ctx, const void *image, size_t len, void **impl);
void cuda_module_unload(dev_ctx *ctx, void *impl);
int cuda_kernel_get(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k,
                    size_t *sizes, int max, int *nparams);
int cuda_kernel_names(dev_ctx *ctx, void *impl, char ***names, int *n);

#endif
