/* Launchers of the built-in CUDA kernels (cuda/k_*.cu), called by the CUDA
 * backend.  Plain C interface; each launcher takes an explicit stream, checks
 * cudaGetLastError() and returns 0 or -1 with a message.  Semantics are those
 * of dev_cpu_run() in cpu_ops.c, bit for bit where the host is exact
 * (integers, casts, fill, arange, rand), within float tolerance otherwise. */
#ifndef GPULUA_CUDA_KERNELS_H
#define GPULUA_CUDA_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "device.h"

typedef struct cuk_env {
  void *stream;          /* cudaStream_t */
  int *err_flag;         /* device-visible (mapped pinned) int: set to 1 by a
                            kernel that divides an integer by zero, to the op's
                            tag (s0.i) by an index op given an index out of range */
  int sm_count;          /* multiprocessors, for grid sizing */
  int checked;           /* the op's views already passed dev_view_check (an op
                            from dev_submit); 0 for ops a backend builds */
} cuk_env;

/* Every dev_kop kind except MATMUL on float dtypes (cuBLAS, in the backend):
 * FILL ARANGE RAND UNARY (incl. cast) BINARY TERNARY REDUCE COPY (strided,
 * same dtype) SLEEP CUMSUM SOFTMAX INDEX SORT, and MATMUL for integer dtypes.  Views point to device memory or to
 * pinned host memory (reachable through unified addressing). */
int cuk_launch(const dev_kop *op, const cuk_env *env, char *err, size_t errlen);

/* DEV_OP_FUSED: the one parameter of its kernels (gf_args of
 * cuda/cuda/fgen.c) into buf (cap bytes; *len used), ztag what an integer
 * division by zero sets env->err_flag to, whether the vector
 * kernel applies (*vec: every view contiguous, 16-byte aligned; with a
 * reduction, every input) and the grid of 256-thread blocks. */
int cuk_fused_args(const dev_kop *op, const cuk_env *env, int ztag, void *buf, size_t cap, size_t *len, int *vec,
                   unsigned *grid, char *err, size_t errlen);

/* DEV_OP_FUSED with trailing reductions (DEV_F_FREDUCE): the program's
 * kernels that take the place of the built-in reduce_rows, reduce_cols or
 * reduce_run (which: CUK_RED_*), launched by launch on the grid (gx, gy) of
 * 256 threads with rargs (k_reduce.cuh: krargs) as their first parameter,
 * the program's gf_args second and routs (k_reduce.cuh: krouts: where
 * each result goes) third. */
enum { CUK_RED_ROWS, CUK_RED_COLS, CUK_RED_RUN, CUK_RED_NKERNELS };
typedef struct cuk_rsource {
  int (*launch)(void *ud, int which, unsigned gx, unsigned gy, const void *rargs, const void *routs, char *err,
                size_t errlen);
  void *ud;
} cuk_rsource;

/* The values of dtype t and shape vshape (vndim dims) that a fused program
 * computes, its nres results (1..4), each reduced by codes[k] along dim (-1:
 * all) into outs[k] as DEV_OP_REDUCE reduces a new contiguous tensor of
 * them: each on its built-in plan, so the same tree and the same bits; in
 * one pass when their plans agree. */
int cuk_reduce_fused(dev_dtype t, int vndim, const int64_t *vshape, const dev_view *const *outs, const int *codes,
                     int nres, int dim, const cuk_rsource *src, const cuk_env *env, char *err, size_t errlen);

/* One kernel of each module (each k_*.cu), the commonest ops first: the
 * backend's loader (loader.c) loads the rest of their modules from these.
 * Fills out[0..max) and returns how many. */
int cuk_modules(const void **out, int max);

#ifdef __cplusplus
}
#endif

#endif
