/* Run-time kernels of the host backend (gpu.compile without a GPU): shared
 * by cuda/host/backend.c, kcompile.c (compiling and the on-disk cache),
 * kmodule.c (loading) and kexec.c (running; kexec.h is what those two
 * share with kfail.c). */
#ifndef GPULUA_HOST_HK_H
#define GPULUA_HOST_HK_H

#include "devpriv.h"

/* The backend's compile: CUDA C source built into a shared object with the
 * system C++ compiler against gpulua_cuda_rt.h (hk_rt_header, embedded at
 * build time).  The image is the shared object; lowered[i] names the entry
 * of exprs[i] ("&name" of a launchable kernel).  GPULUA_KERNEL_CHECK=1 in
 * the environment builds it with address checks. */
int hk_compile(dev_ctx *ctx, const char *src, const char *name, const char *arch, const char *const *opts, int nopts,
               const char *const *exprs, int nexprs, int use_cache, dev_kimage *img, char **log,
               char *err, size_t errlen);
extern const char hk_rt_header[];   /* $(BUILD)/gen/hk_rt.c */
/* An executable on PATH (or name itself when it has a '/'): 0, or -1. */
int hk_find_program(const char *name, char *out, size_t n);
/* The source as the C++ compiler takes it (ksource.c): extern __shared__
 * arrays become pointers to the block's dynamic shared memory, and with
 * check (GPULUA_KERNEL_CHECK) static __shared__ arrays of a function
 * references to the block's copy libgpulua sets apart; 0, or -1 with the
 * message. */
struct sbuf;
int hk_rewrite(const char *src, int check, struct sbuf *o, char *err, size_t errlen);
/* need[i]: whether kernel exprs[i] may reach a barrier or warp primitive
 * (then it runs on fibers); 1 whenever the source cannot tell. */
void hk_fiber_scan(const char *src, const char *const *exprs, int nexprs, int *need);
/* argv[0] (a path) run with stdout and stderr into fd out, stdin from
 * /dev/null; its exit status, or -1 with errno when it cannot start. */
int hk_run(char *const argv[], int out);
/* The C++ compiler's limits (krun.c): seconds of wall time (0: none), bytes
 * of address space per process (0: none) as GPULUA_CXX_MEMORY wrote it, and
 * the TMPDIR it gets (NULL: ours).  env: GPULUA_CXX_TIMEOUT (default 300)
 * and GPULUA_CXX_MEMORY (default 4G), 0 or -1 with the message. */
typedef struct hk_limits {
  double timeout_s;
  size_t memory;
  char memory_text[48];
  const char *tmpdir;
} hk_limits;
int hk_limits_env(hk_limits *lim, char *err, size_t errlen);
/* As hk_run, in a process group of its own under lim: HK_RUN_TIMEOUT past
 * the time limit, HK_RUN_INTERRUPTED when ctx (may be NULL) is interrupted
 * (the interrupt is not taken); then every process of the group has been
 * killed and waited for. */
#define HK_RUN_TIMEOUT (-2)
#define HK_RUN_INTERRUPTED (-3)
int hk_run_limited(dev_ctx *ctx, char *const argv[], int out, const hk_limits *lim);

int hk_module_load(dev_ctx *ctx, const void *image, size_t len, void **impl);
void hk_module_unload(dev_ctx *ctx, void *impl);
int hk_kernel_get(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k, size_t *sizes, int max,
                  int *nparams);
int hk_kernel_names(dev_ctx *ctx, void *impl, char ***names, int *n);

/* Run a launch of a compiled kernel on the calling thread and the pool of
 * block workers; 0 when every block finished, else -1 with what stopped it
 * in err ("device-side assert triggered ...").  Any thread. */
int hk_launch(const dev_launch *l, char *err, size_t errlen);
/* Whether a launch's kernel is one of hk_compile's (not a C function). */
int hk_is_compiled(const dev_kernel *k);

#endif
