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

/* A program's modules, loaded in this context: its kernel for any layout
 * [0] and for contiguous views [1] (fgen.c), and with a trailing reduction
 * [.][1 + code] its two reduction kernels (rows, cols), each compiled when
 * first needed. */
enum { NRED = 2 };   /* the gf kernel, or a program's reductions' */
typedef struct cfused {
  struct cfused *next;
  const dev_fprog *p;
  cudaLibrary_t lib[2][NRED];
  cudaKernel_t k[2][NRED][CUK_RED_NKERNELS];
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
 * whose key holds the source, the headers and NVRTC's version.  out[0]:
 * gf; with red (1: the program ends in reductions) out[CUK_RED_*]:
 * gfr_rows, gfr_cols, gfr_run. */
static int fused_kernel(dev_ctx *ctx, const dev_fprog *p, int vec, int red, cudaKernel_t out[CUK_RED_NKERNELS]) {
  cstate *cs = CS(ctx);
  cfused *f = fused_get(cs, p);
  if (!f) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory loading a fused kernel");
  if (f->k[vec][red][0]) {
    for (int i = 0; i < CUK_RED_NKERNELS; i++) out[i] = f->k[vec][red][i];
    return DEV_OK;
  }
  int major = 0, minor = 0;
  CK(ctx, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cs->device), "device info");
  CK(ctx, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cs->device), "device info");
  char arch[32], err[512];
  snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
  dev_kimage img;
  char *log = NULL;
  if (cuda_fused_compile(p, vec, red, arch, &img, &log, err, sizeof err)) {
    int rc = dev_fail(ctx, DEV_ERR_DEVICE, "%s: the fused kernel did not compile: %s%s%.1500s", p->name, err,
                      log ? "\n" : "", log ? log : "");
    free(log);
    return rc;
  }
  cudaLibrary_t lib = NULL;
  cudaKernel_t k[CUK_RED_NKERNELS] = {NULL};
  static const char *const rnames[CUK_RED_NKERNELS] = {"gfr_rows", "gfr_cols", "gfr_run"};
  cudaError_t e = cudaLibraryLoadData(&lib, img.data, NULL, NULL, 0, NULL, NULL, 0);
  dev_kimage_free(&img);
  if (e == cudaSuccess && !red) e = cudaLibraryGetKernel(&k[0], lib, "gf");
  for (int i = 0; red && i < CUK_RED_NKERNELS && e == cudaSuccess; i++) e = cudaLibraryGetKernel(&k[i], lib, rnames[i]);
  if (e != cudaSuccess) {
    if (lib) cudaLibraryUnload(lib);
    char what[DEV_SITE_LEN + 64];
    snprintf(what, sizeof what, "%s: loading the fused kernel", p->name);
    return cuda_fail(ctx, e, what);
  }
  f->lib[vec][red] = lib;
  for (int i = 0; i < CUK_RED_NKERNELS; i++) out[i] = f->k[vec][red][i] = k[i];
  return DEV_OK;
}

static int fused_red(const dev_kop *op) { return op->fprog->nred > 0; }

/* op's kernel parameter into buf, and its kernels, compiled if need be */
static int fused_setup(dev_ctx *ctx, cudaStream_t st, const dev_kop *op, int tag, void *buf, size_t cap,
                       cudaKernel_t k[CUK_RED_NKERNELS], unsigned *grid) {
  cstate *cs = CS(ctx);
  cuk_env env = {st, cs->flag_dev, cs->sm_count, 1};
  size_t len;
  int vec;
  char msg[256];
  if (cuk_fused_args(op, &env, tag, buf, cap, &len, &vec, grid, msg, sizeof msg))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  return fused_kernel(ctx, op->fprog, vec, fused_red(op), k);
}

int cuda_fused_prepare(dev_ctx *ctx, const dev_kop *op) {
  _Alignas(16) char buf[4096];
  cudaKernel_t k[CUK_RED_NKERNELS];
  unsigned grid;
  return fused_setup(ctx, NULL, op, 1, buf, sizeof buf, k, &grid);
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

/* A reduction kernel of a fused op, as k_reduce.cu's plan asks (cuk_rsource) */
typedef struct rlaunch {
  const cudaKernel_t *k;
  void *args;   /* gf_args */
  cudaStream_t st;
} rlaunch;

static int rlaunch_one(void *ud, int which, unsigned gx, unsigned gy, const void *rargs, const void *routs, char *err,
                       size_t errlen) {
  rlaunch *l = ud;
  void *args[3] = {(void *)rargs, l->args, (void *)routs};
  cudaError_t e = cudaLaunchKernel((const void *)l->k[which], (dim3){gx, gy, 1}, (dim3){256, 1, 1}, args, 0, l->st);
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s", cudaGetErrorString(e));
  return 0;
}

int cuda_fused_launch(dev_ctx *ctx, cudaStream_t st, const dev_kop *op) {
  _Alignas(16) char buf[4096];
  cudaKernel_t k[CUK_RED_NKERNELS];
  unsigned grid;
  int rc = fused_setup(ctx, st, op, fused_tag(ctx, op), buf, sizeof buf, k, &grid);
  if (rc) return rc;
  char what[DEV_SITE_LEN + 32];
  snprintf(what, sizeof what, "fused '%s'", op->fprog->name);
  if (op->flags & DEV_F_FREDUCE) {
    cstate *cs = CS(ctx);
    cuk_env env = {st, cs->flag_dev, cs->sm_count, 1};
    rlaunch l = {k, buf, st};
    cuk_rsource src = {rlaunch_one, &l};
    const dev_view *v = dev_kop_in(op, 0), *outs[DEV_FMAXOUT];
    const dev_fprog *p = op->fprog;
    char err[256];
    for (int j = 0; j < p->nout; j++) outs[j] = dev_kop_out(op, j);
    if (cuk_reduce_fused(p->node[p->res[0]].dtype, v->ndim, v->shape, outs, p->red, p->nout, op->dim, &src, &env,
                         err, sizeof err))
      return dev_fail(ctx, DEV_ERR_DEVICE, "%s: %s", what, err);
    return DEV_OK;
  }
  void *args[1] = {buf};
  cudaError_t e = cudaLaunchKernel((const void *)k[0], (dim3){grid, 1, 1}, (dim3){256, 1, 1}, args, 0, st);
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
        for (int r = 0; r < NRED; r++)
          if (f->lib[v][r] && cudaLibraryUnload(f->lib[v][r]) != cudaSuccess) cudaGetLastError();
      free(f);
    }
}
