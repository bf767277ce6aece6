/* CUDA backend: the modules of run-time kernels (gpu.compile's images,
 * and the application's): load and unload them as CUDA libraries, find a
 * kernel and its parameters, list the kernels.  Split off runtime.c (rt.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt.h"

int cuda_module_load(dev_ctx *ctx, const void *image, size_t len, void **impl) {
  (void)len;
  cudaLibrary_t lib;
  CK(ctx, cudaLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0), "load module");
  *impl = lib;
  return DEV_OK;
}

void cuda_module_unload(dev_ctx *ctx, void *impl) {
  (void)ctx;
  if (cudaLibraryUnload((cudaLibrary_t)impl) != cudaSuccess) cudaGetLastError();
}

int cuda_kernel_get(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k,
                        size_t *sizes, int max, int *nparams) {
  cstate *cs = CS(ctx);
  cudaKernel_t kr;
  cudaError_t e = cudaLibraryGetKernel(&kr, (cudaLibrary_t)impl, symbol);
  if (e != cudaSuccess) {
    char what[300];
    snprintf(what, sizeof what, "kernel '%.200s' not found in the module", symbol);
    return cuda_fail(ctx, e, what);
  }
  struct cudaFuncAttributes a;
  CK(ctx, cudaFuncGetAttributes(&a, (const void *)kr), "kernel attributes");
  k->handle = (void *)kr;
  k->max_threads = a.maxThreadsPerBlock;
  k->static_shared = a.sharedSizeBytes;
  k->max_dynamic_shared = (size_t)cs->optin_shared > a.sharedSizeBytes ? (size_t)cs->optin_shared - a.sharedSizeBytes : 0;
  k->shared_set = (size_t)a.maxDynamicSharedSizeBytes;
  /* Up to max parameters: asking past the last one is an API error that
   * compute-sanitizer reports, so the caller passes the count it expects. */
  int n = 0;
  for (; n < max; n++) {
    size_t off = 0, size = 0;
    if (cudaFuncGetParamInfo((const void *)kr, (size_t)n, &off, &size) != cudaSuccess) {
      cudaGetLastError();
      break;
    }
    sizes[n] = size;
  }
  *nparams = n;
  return DEV_OK;
}

int cuda_kernel_names(dev_ctx *ctx, void *impl, char ***names, int *n) {
  unsigned count = 0;
  *names = NULL;
  *n = 0;
  CK(ctx, cudaLibraryGetKernelCount(&count, (cudaLibrary_t)impl), "module kernels");
  cudaKernel_t *ks = calloc(count ? count : 1, sizeof *ks);
  char **out = calloc(count ? count : 1, sizeof *out);
  if (!ks || !out) { free(ks); free(out); return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory"); }
  cudaError_t e = cudaLibraryEnumerateKernels(ks, count, (cudaLibrary_t)impl);
  for (unsigned i = 0; e == cudaSuccess && i < count; i++) {
    const char *name = NULL;
    e = cudaFuncGetName(&name, (const void *)ks[i]);
    if (e == cudaSuccess && !(out[i] = strdup(name ? name : "?"))) e = cudaErrorMemoryAllocation;
  }
  free(ks);
  if (e != cudaSuccess) {
    for (unsigned i = 0; i < count; i++) free(out[i]);
    free(out);
    return cuda_fail(ctx, e, "module kernels");
  }
  *names = out;
  *n = (int)count;
  return DEV_OK;
}

/* ---- fused programs' kernels (DEV_OP_FUSED) ------------------------------- */

/* A program's modules, loaded in this context, each compiled when first
 * needed: for any layout [0] and for contiguous views [1] (fgen.c), its
 * kernel gf (slot 0), or for a program that ends in reductions each of its
 * reduction kernels on its own (slot 1 + CUK_RED_*: rows, cols, run), so
 * that a first call compiles the one its plan takes. */
enum { NSLOT = 1 + CUK_RED_NKERNELS };
typedef struct cfused {
  struct cfused *next;
  const dev_fprog *p;
  cudaLibrary_t lib[2][NSLOT];
  cudaKernel_t k[2][NSLOT];
} cfused;

static cfused **fused_slot(cstate *cs, const dev_fprog *p) {
  return &cs->fused[((uintptr_t)p >> 6) % NFUSED];
}

/* p's entry, made when new (NULL: out of memory) */
static cfused *fused_get(cstate *cs, const dev_fprog *p) {
  cfused **slot = fused_slot(cs, p);
  for (cfused *f = *slot; f; f = f->next)
    if (f->p == p) return f;
  cfused *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->p = p;
  f->next = *slot;
  *slot = f;
  return f;
}

/* Programs are interned (one per content, never freed), so the pointer is
 * the key.  The compile goes through the disk cache of compiled kernels,
 * whose key holds the source, the headers and NVRTC's version.  *out: gf
 * (slot 0), or reduction kernel slot - 1 (CUK_RED_*: gfr_rows, gfr_cols,
 * gfr_run). */
static int fused_kernel(dev_ctx *ctx, const dev_fprog *p, int vec, int slot, cudaKernel_t *out) {
  cstate *cs = CS(ctx);
  cfused *f = fused_get(cs, p);
  if (!f) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory loading a fused kernel");
  if ((*out = f->k[vec][slot])) return DEV_OK;
  int major = 0, minor = 0;
  CK(ctx, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cs->device), "device info");
  CK(ctx, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cs->device), "device info");
  char arch[32], err[512];
  snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
  dev_kimage img;
  char *log = NULL;
  if (cuda_fused_compile(p, vec, slot ? 1 << (slot - 1) : 0, arch, &img, &log, err, sizeof err)) {
    int rc = dev_fail(ctx, DEV_ERR_DEVICE, "%s: the fused kernel did not compile: %s%s%.1500s", p->name, err,
                      log ? "\n" : "", log ? log : "");
    free(log);
    return rc;
  }
  cudaLibrary_t lib = NULL;
  cudaKernel_t k = NULL;
  static const char *const names[NSLOT] = {"gf", "gfr_rows", "gfr_cols", "gfr_run"};
  cudaError_t e = cudaLibraryLoadData(&lib, img.data, NULL, NULL, 0, NULL, NULL, 0);
  dev_kimage_free(&img);
  if (e == cudaSuccess) e = cudaLibraryGetKernel(&k, lib, names[slot]);
  if (e != cudaSuccess) {
    if (lib) cudaLibraryUnload(lib);
    char what[DEV_SITE_LEN + 64];
    snprintf(what, sizeof what, "%s: loading the fused kernel", p->name);
    return cuda_fail(ctx, e, what);
  }
  f->lib[vec][slot] = lib;
  *out = f->k[vec][slot] = k;
  return DEV_OK;
}

/* op's kernel parameter into buf and whether it is the contiguous
 * variant's (*vec); and a program without reductions' kernel, compiled if
 * need be (the reductions' are compiled as their plan asks for them) */
static int fused_setup(dev_ctx *ctx, cudaStream_t st, const dev_kop *op, int tag, void *buf, size_t cap,
                       cudaKernel_t *k, int *vec, unsigned *grid) {
  cstate *cs = CS(ctx);
  cuk_env env = {st, cs->flag_dev, cs->sm_count, 1};
  size_t len;
  char msg[256];
  if (cuk_fused_args(op, &env, tag, buf, cap, &len, vec, grid, msg, sizeof msg))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  *k = NULL;
  return op->fprog->nred ? DEV_OK : fused_kernel(ctx, op->fprog, *vec, 0, k);
}

/* Before a capture: every kernel the op may launch (a reduction's three:
 * which one its plan takes is known at the launch) */
int cuda_fused_prepare(dev_ctx *ctx, const dev_kop *op) {
  _Alignas(16) char buf[4096];
  cudaKernel_t k;
  unsigned grid;
  int vec, rc = fused_setup(ctx, NULL, op, 1, buf, sizeof buf, &k, &vec, &grid);
  for (int w = 0; rc == DEV_OK && op->fprog->nred && w < CUK_RED_NKERNELS; w++)
    rc = fused_kernel(ctx, op->fprog, vec, 1 + w, &k);
  return rc;
}

#define ZDIV_MSG(E, name, cls, res, fl) [DEV_BIN_##E] = #name ": integer division by zero",
static const char *const zdiv_msg[DEV_NBINOP] = {DEV_BINARY_OPS(ZDIV_MSG)};
#undef ZDIV_MSG

/* The flag's value for an integer division by zero in op: a tag naming
 * its program's first op that can divide by zero (as the host names the
 * op); 1, no name, when none can. */
static int fused_tag(dev_ctx *ctx, const dev_kop *op) {
  const dev_fprog *p = op->fprog;
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    if (x->kind == DEV_FN_BINARY && (dev_binop_info(x->code)->flags & DEV_OPF_ZDIV) &&
        !dev_dtype_is_float(x->dtype))
      return cuda_tag_op(ctx, op, zdiv_msg[x->code]);
  }
  return 1;
}

/* A reduction kernel of a fused op, as k_reduce.cu's plan asks (cuk_rsource),
 * compiled if need be (its failure's code in rc, its message the
 * context's) */
typedef struct rlaunch {
  dev_ctx *ctx;
  const dev_fprog *p;
  int vec, rc;
  void *args;   /* gf_args */
  cudaStream_t st;
} rlaunch;

static int rlaunch_one(void *ud, int which, unsigned gx, unsigned gy, const void *rargs, const void *routs, char *err,
                       size_t errlen) {
  rlaunch *l = ud;
  cudaKernel_t k;
  if ((unsigned)which >= CUK_RED_NKERNELS) return fail_msg(err, errlen, "bad reduction kernel %d", which);
  if ((l->rc = fused_kernel(l->ctx, l->p, l->vec, 1 + which, &k))) return fail_msg(err, errlen, "%s", dev_errmsg(l->ctx));
  void *args[3] = {(void *)rargs, l->args, (void *)routs};
  cudaError_t e = cudaLaunchKernel((const void *)k, (dim3){gx, gy, 1}, (dim3){256, 1, 1}, args, 0, l->st);
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s", cudaGetErrorString(e));
  return 0;
}

int cuda_fused_launch(dev_ctx *ctx, cudaStream_t st, const dev_kop *op) {
  _Alignas(16) char buf[4096];
  cudaKernel_t k;
  unsigned grid;
  int vec, rc = fused_setup(ctx, st, op, fused_tag(ctx, op), buf, sizeof buf, &k, &vec, &grid);
  if (rc) return rc;
  char what[DEV_SITE_LEN + 32];
  snprintf(what, sizeof what, "fused '%s'", op->fprog->name);
  if (op->flags & DEV_F_FREDUCE) {
    cstate *cs = CS(ctx);
    cuk_env env = {st, cs->flag_dev, cs->sm_count, 1};
    const dev_fprog *p = op->fprog;
    rlaunch l = {ctx, p, vec, DEV_OK, buf, st};
    cuk_rsource src = {rlaunch_one, &l};
    const dev_view *v = dev_kop_in(op, 0), *outs[DEV_FMAXOUT];
    char err[256];
    for (int j = 0; j < p->nout; j++) outs[j] = dev_kop_out(op, j);
    if (cuk_reduce_fused(p->node[p->res[0]].dtype, v->ndim, v->shape, outs, p->red, p->nout, op->dim, &src, &env,
                         err, sizeof err))
      return l.rc ? l.rc : dev_fail(ctx, DEV_ERR_DEVICE, "%s: %s", what, err);
    return DEV_OK;
  }
  void *args[1] = {buf};
  cudaError_t e = cudaLaunchKernel((const void *)k, (dim3){grid, 1, 1}, (dim3){256, 1, 1}, args, 0, st);
  if (e != cudaSuccess) return cuda_fail(ctx, e, what);
  return DEV_OK;
}

void cuda_fused_free(dev_ctx *ctx) {
  cstate *cs = CS(ctx);
  for (int i = 0; i < NFUSED; i++)
    while (cs->fused[i]) {
      cfused *f = cs->fused[i];
      cs->fused[i] = f->next;
      for (int v = 0; v < 2; v++)
        for (int r = 0; r < NSLOT; r++)
          if (f->lib[v][r] && cudaLibraryUnload(f->lib[v][r]) != cudaSuccess) cudaGetLastError();
      free(f);
    }
}
