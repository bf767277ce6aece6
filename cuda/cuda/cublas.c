/* CUDA backend: matmul through cuBLAS (loaded with dlopen on first use),
 * f32, f64, f16 and bf16; the integer dtypes have their own kernels
 * (k_matmul_int.cu).  Split off runtime.c, whose state it shares (rt.h). */
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <library_types.h>

#include "kernels.h"
#include "rt.h"

int cuda_load_cublas(dev_ctx *ctx) {
  cstate *cs = CS(ctx);
  if (cs->cublas) return DEV_OK;
  if (!cs->cublas_lib) {
    const char *names[] = {"libcublas.so.13", "libcublas.so", NULL};
    for (int i = 0; names[i] && !cs->cublas_lib; i++) cs->cublas_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!cs->cublas_lib)
      return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "matmul needs cuBLAS: cannot load libcublas.so.13 (%s)", dlerror());
  }
  cublas_create_t create = (cublas_create_t)dlsym(cs->cublas_lib, "cublasCreate_v2");
  cs->cublas_destroy = (cublas_destroy_t)dlsym(cs->cublas_lib, "cublasDestroy_v2");
  cs->cublas_setstream = (cublas_setstream_t)dlsym(cs->cublas_lib, "cublasSetStream_v2");
  cs->cublas_gemmex = (cublas_gemmex_t)dlsym(cs->cublas_lib, "cublasGemmEx");
  cs->cublas_gemmsb = (cublas_gemmsb_t)dlsym(cs->cublas_lib, "cublasGemmStridedBatchedEx");
  if (!create || !cs->cublas_destroy || !cs->cublas_setstream || !cs->cublas_gemmex || !cs->cublas_gemmsb)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "cuBLAS lacks cublasGemmEx or cublasGemmStridedBatchedEx");
  int st = create(&cs->cublas);
  if (st != 0) {
    cs->cublas = NULL;
    return dev_fail(ctx, DEV_ERR_DEVICE, "cublasCreate failed (status %d)", st);
  }
  return DEV_OK;
}

/* A matrix (the last two dims of a 2-D or 3-D view) as cuBLAS takes it.
 * cuBLAS is column-major, so a row-major r x c matrix with unit column
 * stride is its c x r transpose with op N, and one with unit row stride (a
 * transposed view) is op T of itself; either needs ld >= its column-major
 * rows.  Anything else is packed into scratch first. */
typedef struct gmat { const void *p; int op, ld; long long bstride; } gmat;

static int gemm_operand(const dev_view *v, gmat *g) {
  int r = v->ndim - 2;
  int64_t rows = v->shape[r], cols = v->shape[r + 1], rs = v->stride[r], cs = v->stride[r + 1];
  g->p = dev_view_ptr(v);
  g->bstride = r ? v->stride[0] : 0;
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
    g->op = 0;   /* CUBLAS_OP_N */
    g->ld = (int)(rows == 1 ? (cols > 0 ? cols : 1) : rs);
    return rows == 1 || rs <= INT_MAX;
  }
  if ((rows == 1 || rs == 1) && cs >= rows) {
    g->op = 1;   /* CUBLAS_OP_T */
    g->ld = (int)cs;
    return cs <= INT_MAX;
  }
  return 0;
}

/* Pack a strided view into fresh contiguous device memory on stream st;
 * on failure *mem is NULL and nothing is held. */
static int pack(dev_ctx *ctx, cstream *c, const dev_view *v, dev_view *packed, void **mem) {
  size_t bytes = (size_t)dev_view_numel(v) * dev_dtype_size(v->dtype);
  cudaError_t e = cudaMallocAsync(mem, bytes, c->st);
  if (e != cudaSuccess) {
    *mem = NULL;
    return cuda_fail(ctx, e, "matmul scratch");
  }
  dev_buf *b = calloc(1, sizeof *b);
  if (!b) {
    cudaFreeAsync(*mem, c->st);
    *mem = NULL;
    return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  }
  b->ptr = *mem;
  b->bytes = bytes;
  b->kind = DEV_MEM_DEVICE;
  memset(packed, 0, sizeof *packed);
  packed->buf = b;
  packed->dtype = v->dtype;
  dev_view_set_contiguous(packed, v->ndim, v->shape);
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1, .out = *packed};
  op.in[0] = *v;
  cuk_env env = {c->st, CS(ctx)->flag_dev, CS(ctx)->sm_count, 0};
  char msg[256];
  if (cuk_launch(&op, &env, msg, sizeof msg)) {
    free(b);
    cudaFreeAsync(*mem, c->st);
    *mem = NULL;
    return dev_fail(ctx, DEV_ERR_DEVICE, "matmul: %s", msg);
  }
  return DEV_OK;
}

/* cuBLAS's data and compute types for a float dtype; -1 for the others. */
static int gemm_types(dev_dtype t, int *type, int *compute) {
  switch (t) {
  case DEV_F32: *type = CUDA_R_32F; *compute = 68 /* CUBLAS_COMPUTE_32F */; return 0;
  case DEV_F64: *type = CUDA_R_64F; *compute = 70 /* CUBLAS_COMPUTE_64F */; return 0;
  case DEV_F16: *type = CUDA_R_16F; *compute = 68; return 0;
  case DEV_BF16: *type = CUDA_R_16BF; *compute = 68; return 0;
  default: return -1;
  }
}

/* One product of nb matrices m x k @ k x n on c's stream (column-major, so
 * b comes first): one cublasGemmEx, or one cublasGemmStridedBatchedEx. */
static int gemm(dev_ctx *ctx, cstream *c, const gmat *ga, const gmat *gb, const gmat *gc, int64_t nb,
                int64_t m, int64_t n, int64_t k, int type, int compute) {
  cstate *cs = CS(ctx);
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *alpha = type == CUDA_R_64F ? (const void *)&one64 : (const void *)&one32;
  const void *beta = type == CUDA_R_64F ? (const void *)&zero64 : (const void *)&zero32;
  cs->cublas_setstream(cs->cublas, c->st);
  int st;
  if (nb == 1)
    st = cs->cublas_gemmex(cs->cublas, gb->op, ga->op, (int)n, (int)m, (int)k, alpha, gb->p, type, gb->ld,
                           ga->p, type, ga->ld, beta, (void *)gc->p, type, gc->ld, compute,
                           -1 /* CUBLAS_GEMM_DEFAULT */);
  else
    st = cs->cublas_gemmsb(cs->cublas, gb->op, ga->op, (int)n, (int)m, (int)k, alpha, gb->p, type, gb->ld,
                           gb->bstride, ga->p, type, ga->ld, ga->bstride, beta, (void *)gc->p, type, gc->ld,
                           gc->bstride, (int)nb, compute, -1);
  if (st != 0)
    return dev_fail(ctx, DEV_ERR_DEVICE, "matmul: %s failed (status %d)",
                    nb == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx", st);
  return DEV_OK;
}

/* An op of the copy or fill kernels on c's stream, for matmul. */
static int launch(dev_ctx *ctx, cstream *c, const dev_kop *op) {
  cuk_env env = {c->st, CS(ctx)->flag_dev, CS(ctx)->sm_count, 0};
  char msg[256];
  return cuk_launch(op, &env, msg, sizeof msg) ? dev_fail(ctx, DEV_ERR_DEVICE, "matmul: %s", msg) : DEV_OK;
}

/* The result's matrix as cuBLAS writes it: out itself, or (*mc, described
 * by pc) fresh contiguous scratch when out takes op T or its batches overlap. */
static int gemm_result(dev_ctx *ctx, cstream *c, const dev_view *out, int64_t nb, int64_t m, int64_t n,
                       gmat *gc, dev_view *pc, void **mc) {
  /* the output takes op N only, and distinct matrices per batch */
  if (gemm_operand(out, gc) && gc->op == 0 && (nb <= 1 || gc->bstride >= (long long)(m - 1) * gc->ld + n))
    return DEV_OK;
  size_t bytes = (size_t)dev_view_numel(out) * dev_dtype_size(out->dtype);
  cudaError_t e = cudaMallocAsync(mc, bytes, c->st);
  if (e != cudaSuccess) { *mc = NULL; return cuda_fail(ctx, e, "matmul scratch"); }
  memset(pc, 0, sizeof *pc);
  pc->dtype = out->dtype;
  dev_view_set_contiguous(pc, out->ndim, out->shape);
  gc->p = *mc;
  gc->op = 0;
  gc->ld = (int)n;
  gc->bstride = (long long)(m * n);
  return DEV_OK;
}

/* out = a @ b, 2-D or batched 3-D (validate: one batch size; an operand's
 * batch stride may be 0).  One cublasGemmEx, or one
 * cublasGemmStridedBatchedEx for a batch; f16/bf16 accumulate in f32.
 * Row-major C = A B is column-major C^T = B^T A^T. */
int cuda_matmul(dev_stream *s, const dev_kop *op) {
  dev_ctx *ctx = s->ctx;
  cstream *c = CST(s);
  int rc = cuda_load_cublas(ctx);
  if (rc) return rc;
  int type, compute;
  if (gemm_types(op->out.dtype, &type, &compute))
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "matmul: no cuBLAS path for this dtype");
  const dev_view *out = &op->out;
  int r = out->ndim - 2;
  int64_t nb = r ? out->shape[0] : 1, m = out->shape[r], n = out->shape[r + 1], k = op->in[0].shape[r + 1];
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || nb > INT_MAX)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "matmul: matrix too large for cuBLAS");
  if (m == 0 || n == 0 || nb == 0) return DEV_OK;
  if (k == 0) {
    dev_kop zero = {.kind = DEV_OP_FILL, .out = *out, .s0 = {.is_int = 1, .i = 0}};
    return launch(ctx, c, &zero);
  }
  dev_view pa, pb, pc;
  void *ma = NULL, *mb = NULL, *mc = NULL;
  gmat ga, gb, gc;
  if (!gemm_operand(&op->in[0], &ga)) {
    if ((rc = pack(ctx, c, &op->in[0], &pa, &ma))) return rc;
    gemm_operand(&pa, &ga);
  }
  if (!gemm_operand(&op->in[1], &gb)) {
    if ((rc = pack(ctx, c, &op->in[1], &pb, &mb))) goto done;
    gemm_operand(&pb, &gb);
  }
  if ((rc = gemm_result(ctx, c, out, nb, m, n, &gc, &pc, &mc))) goto done;
  if ((rc = gemm(ctx, c, &ga, &gb, &gc, nb, m, n, k, type, compute))) goto done;
  if (mc) {
    dev_buf tb = {.ptr = mc, .bytes = (size_t)dev_view_numel(out) * dev_dtype_size(out->dtype),
                  .kind = DEV_MEM_DEVICE};
    pc.buf = &tb;
    dev_kop cp = {.kind = DEV_OP_COPY, .nin = 1, .out = *out};
    cp.in[0] = pc;
    rc = launch(ctx, c, &cp);
  }
done:
  if (ma) { free(pa.buf); cudaFreeAsync(ma, c->st); }
  if (mb) { free(pb.buf); cudaFreeAsync(mb, c->st); }
  if (mc) cudaFreeAsync(mc, c->st);
  return rc;
}
