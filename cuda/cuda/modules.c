/* CUDA backend: the modules of run-time kernels (gpu.compile's images,
 * and the application's): load and unload them as CUDA libraries, find a
 * kernel and its parameters, list the kernels.  Split off runtime.c (rt.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
