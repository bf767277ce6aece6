/* The CUDA backend's private API: what its files in cuda/cuda/ call in
 * each other, as cuda/host/hk.h is the host backend's.  The device layer's
 * neutral files never include it: they reach the backend through
 * dev_backend (cuda/backend.h) alone. */
#ifndef GPULUA_CUDA_CU_H
#define GPULUA_CUDA_CU_H

#include "devpriv.h"
#include "util.h"

/* cuda/cuda/nvrtc.c, the cuda backend's compile: src for arch ("sm_90").  On
 * failure returns -1 with a message in err and, for a compile error, NVRTC's
 * log in *log (free()).  Needs no GPU (NVRTC is loaded on first use) and no
 * ctx (NULL will do: NVRTC runs in the process, and is not interrupted). */
int dev_nvrtc_compile(dev_ctx *ctx, const char *src, const char *name, const char *arch,
                      const char *const *opts, int nopts, const char *const *exprs, int nexprs,
                      int use_cache, dev_kimage *img, char **log, char *err, size_t errlen);
/* The same, src able to #include the headers given by name (NVRTC's own
 * mechanism: no files), which are part of the cache key. */
typedef struct dev_nvrtc_headers {
  int n;
  const char *const *names, *const *texts;
} dev_nvrtc_headers;
int dev_nvrtc_compile_h(const char *src, const char *name, const char *arch, const char *const *opts, int nopts,
                        const char *const *exprs, int nexprs, const dev_nvrtc_headers *h, int use_cache,
                        dev_kimage *img, char **log, char *err, size_t errlen);

/* cuda/cuda/fgen.c: DEV_OP_FUSED.  source writes the CUDA C++ of a fused
 * program's kernel `gf` (vec: for every view contiguous and 16-byte aligned;
 * else any layout), or with red (nonzero: for a program that ends in
 * reductions, dev_fprog.red) those of its reduction kernels whose bits
 * (1 << CUK_RED_*) red has: gfr_rows, gfr_cols, gfr_run; compile makes it a cubin for arch through
 * NVRTC with the element headers (k_elem.cuh, k_reduce.cuh and what they
 * include, embedded at build time), the disk cache first.  Neither needs a
 * GPU. */
int cuda_fused_source(const dev_fprog *p, int vec, int red, sbuf *src, char *err, size_t errlen);
int cuda_fused_compile(const dev_fprog *p, int vec, int red, const char *arch, dev_kimage *img, char **log,
                       char *err, size_t errlen);
/* The same for a source of fused kernels (several programs' at once, in a
 * test), and how many number operands p's kernels take (gf_args). */
int cuda_fused_compile_src(const char *src, const char *name, const char *arch, dev_kimage *img, char **log,
                           char *err, size_t errlen);
int cuda_fused_numbers(const dev_fprog *p);

/* cuda/cuda/nccl.c: the CUDA backend's collectives over NCCL.  open joins
 * the job (and the sideband of the ranks of one node); connect creates the
 * NCCL communicator (run does on first use); run enqueues a checked group on
 * a cudaStream_t. */
typedef struct cuda_comm cuda_comm;
int cuda_comm_open(dev_ctx *ctx, int device, const dev_rank_info *ri, cuda_comm **out);
int cuda_comm_connect(cuda_comm *c, const dev_rank_info *ri, const char *what);
int cuda_comm_run(cuda_comm *c, void *stream, const dev_coll *g, int n, uint64_t seq);
void cuda_comm_forget_stream(cuda_comm *c, void *stream);   /* drained, about to be destroyed */
void cuda_comm_close(cuda_comm *c);
/* A process group: ncclCommSplit of the world's communicator with this
 * rank's colour (-1: none, g NULL) and key; sets g->impl and g->free_impl. */
int cuda_comm_split(cuda_comm *c, dev_group *g, int color, int key);
/* Graphs holding collectives (cuda/cuda/graph.c): connect before a capture
 * (cuda_comm_ready), capture one node's collectives into stream, register
 * the executable, whose kill the close calls before the communicator goes
 * (then it is leaked: leak is set), and launch a replay, checked and
 * watched as its collectives numbered from seq.  cuda_comm_graph_drop
 * unregisters it and says whether it must be leaked (the communicator was
 * aborted, or the close killed it). */
typedef struct cuda_comm_graph {
  struct cuda_comm_graph *next;
  void (*kill)(struct cuda_comm_graph *g);
  int leak;
  int gone;     /* the communicator was closed: no drop */
} cuda_comm_graph;
int cuda_comm_ready(cuda_comm *c, const char *what);
int cuda_comm_capture(cuda_comm *c, void *stream, const dev_gnode *nd);
void cuda_comm_graph_add(cuda_comm *c, cuda_comm_graph *g);
int cuda_comm_graph_drop(cuda_comm *c, cuda_comm_graph *g);
int cuda_comm_replay(cuda_comm *c, void *stream, void *exec, const dev_gexec *gx, uint64_t seq, const char *label);

/* cuda/cuda/loader.c: the built-in kernels loaded by a thread (NULL from
 * new when out of memory: kernels then load on first use).  kick starts
 * the thread (once; after the context's first op), wait kicks and joins it
 * (before streams run side by side), stop makes it leave what is left,
 * joins it and frees it. */
typedef struct cuda_loader cuda_loader;
cuda_loader *cuda_loader_new(int device);
void cuda_loader_kick(cuda_loader *l);
void cuda_loader_wait(cuda_loader *l);
void cuda_loader_stop(cuda_loader *l);

/* cuda/cuda/timing.c: timing events around an op while tracing (begin before
 * it is enqueued; op/coll after, with its status, which they return), the
 * backend's trace hooks, and NVTX ranges. */
typedef struct cuda_tmark { void *ev; } cuda_tmark;
int cuda_trace_begin(dev_ctx *ctx, void *stream, cuda_tmark *m);
int cuda_trace_op(dev_ctx *ctx, void *stream, cuda_tmark *m, int64_t sid, const dev_kop *op, int rc);
int cuda_trace_coll(dev_ctx *ctx, void *stream, cuda_tmark *m, int64_t sid, const dev_coll *g, int n,
                    int rc);
int cuda_trace_rec(dev_ctx *ctx, void *stream, cuda_tmark *m, const dev_trace_rec *r, int rc);
int cuda_trace_start(dev_ctx *ctx);
void cuda_trace_flush(dev_ctx *ctx);
void cuda_trace_free(dev_ctx *ctx);
uint64_t cuda_range_start(dev_ctx *ctx, const char *name);
void cuda_range_end(dev_ctx *ctx, uint64_t handle);

/* cuda/cuda/runtime.c, for graph.c: what an op needs before a capture
 * begins; the op's work on a capturing cudaStream_t (a node, no
 * bookkeeping); a replay's bookkeeping once it is on s (its position,
 * named `name`, a marker when it touches host memory); a CUDA error as the
 * backend reports every one. */
int cuda_capture_prepare(dev_ctx *ctx, const dev_kop *op);
int cuda_capture_op(dev_ctx *ctx, void *stream, const dev_kop *op);
int cuda_enqueued(dev_stream *s, const char *name, int host);
int cuda_error(dev_ctx *ctx, int err, const char *what);
/* cuda/cuda/graph.c: the backend's graph hooks */
int cuda_graph_build(dev_ctx *ctx, dev_gexec *gx);
int cuda_graph_launch(dev_stream *s, const dev_gexec *gx, uint64_t seq);
void cuda_graph_free(dev_ctx *ctx, dev_gexec *gx);

#endif
