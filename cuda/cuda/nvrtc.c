/* Run-time compilation: NVRTC loaded with dlopen on first use, and an on-disk
 * cache of compiled code keyed by everything that goes into a compilation.
 * No CUDA runtime calls here (NVRTC needs no GPU), so this also runs in the
 * unit tests of a machine without one. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cu.h"
#include "util.h"

/* NVRTC's own run-time keeps a process-lifetime allocation (the C++
 * exception pool of a library it loads); LeakSanitizer is told to ignore
 * what is allocated inside NVRTC calls, not ours. */
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#define NV_CALL(x) (__lsan_disable(), nv_r_ = (x), __lsan_enable(), nv_r_)
#else
#define NV_CALL(x) (x)
#endif

/* The NVRTC entry points we use (types as in nvrtc.h). */
typedef int nvrtc_result;
typedef struct nvrtc_prog *nvrtc_program;
static struct {
  void *lib;
  char why[256];
  const char *(*error_string)(nvrtc_result);
  nvrtc_result (*version)(int *, int *);
  nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int, const char *const *,
                         const char *const *);
  nvrtc_result (*destroy)(nvrtc_program *);
  nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
  nvrtc_result (*log_size)(nvrtc_program, size_t *);
  nvrtc_result (*log)(nvrtc_program, char *);
  nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
  nvrtc_result (*cubin)(nvrtc_program, char *);
  nvrtc_result (*add_name)(nvrtc_program, const char *);
  nvrtc_result (*lowered)(nvrtc_program, const char *, const char **);
  int major, minor;
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void)
{
  const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
  for (int i = 0; names[i] && !nv.lib; i++) nv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!nv.lib) {
    snprintf(nv.why, sizeof nv.why, "cannot load libnvrtc.so.13 (%s)", dlerror());
    return;
  }
#define SYM(field, name) \
  if (!(*(void **)&nv.field = dlsym(nv.lib, name))) { \
    snprintf(nv.why, sizeof nv.why, "libnvrtc lacks %s", name); dlclose(nv.lib); nv.lib = NULL; return; }
  SYM(error_string, "nvrtcGetErrorString");
  SYM(version, "nvrtcVersion");
  SYM(create, "nvrtcCreateProgram");
  SYM(destroy, "nvrtcDestroyProgram");
  SYM(compile, "nvrtcCompileProgram");
  SYM(log_size, "nvrtcGetProgramLogSize");
  SYM(log, "nvrtcGetProgramLog");
  SYM(cubin_size, "nvrtcGetCUBINSize");
  SYM(cubin, "nvrtcGetCUBIN");
  SYM(add_name, "nvrtcAddNameExpression");
  SYM(lowered, "nvrtcGetLoweredName");
#undef SYM
  nv.version(&nv.major, &nv.minor);
}

/* ---- the cache ------------------------------------------------------------ */

/* The entry's format (cuda/kcache.c); 2: with a checksum. */
static const char MAGIC[] = "GPULUA-KCACHE-2\n";

/* ---- compile ------------------------------------------------------------ */

/* NVRTC's options into all (at most 256; *nall of them): ours first, then
 * the caller's (later ones win in NVRTC).  archopt and incopt hold ours. */
static int nv_options(const char *arch, const char *const *opts, int nopts, const char **all, int *nall,
                      char archopt[64], char incopt[1100], char *err, size_t errlen)
{
  int n = 0;
  snprintf(archopt, 64, "--gpu-architecture=%s", arch);
  all[n++] = archopt;
  all[n++] = "-std=c++17";
  all[n++] = "-lineinfo";
  const char *home = getenv("CUDA_HOME");
  char inc[1024];
  snprintf(inc, sizeof inc, "%s/include", home && *home ? home : "/usr/local/cuda");
  struct stat sst;
  if (stat(inc, &sst) == 0 && S_ISDIR(sst.st_mode)) {
    snprintf(incopt, 1100, "-I%s", inc);
    all[n++] = incopt;
  }
  if (nopts > 256 - n) return fail_msg(err, errlen, "too many compiler options (%d)", nopts);
  for (int i = 0; i < nopts; i++) all[n++] = opts[i];
  *nall = n;
  return 0;
}

/* The cache key: everything that decides the output. */
static void nv_key(sbuf *key, const char *src, const char *name, const char **all, int nall,
                   const char *const *exprs, int nexprs, const dev_nvrtc_headers *h)
{
  char ver[64];
  snprintf(ver, sizeof ver, "nvrtc %d.%d", nv.major, nv.minor);
  sb_key(key, ver);
  sb_key(key, name);
  for (int i = 0; i < nall; i++) sb_key(key, all[i]);
  sb_key(key, "--");
  for (int i = 0; i < nexprs; i++) sb_key(key, exprs[i]);
  sb_key(key, "--");
  for (int i = 0; h && i < h->n; i++) {
    sb_key(key, h->names[i]);
    sb_key(key, h->texts[i]);
  }
  sb_key(key, "--");
  sb_key(key, src);
}

/* The image of a compiled program: each name expression's lowered name,
 * then the cubin. */
static int nv_image(nvrtc_program prog, const char *const *exprs, int nexprs, dev_kimage *img, char *err,
                    size_t errlen)
{
  nvrtc_result r;
  img->lowered = calloc(nexprs > 0 ? (size_t)nexprs : 1, sizeof *img->lowered);
  if (!img->lowered) return fail_msg(err, errlen, "out of memory");
  for (int i = 0; i < nexprs; i++) {
    const char *lw = NULL;
    if ((r = nv.lowered(prog, exprs[i], &lw)) || !lw)
      return fail_msg(err, errlen, "nvrtcGetLoweredName(%s): %s", exprs[i], nv.error_string(r));
    if (!(img->lowered[i] = strdup(lw))) return fail_msg(err, errlen, "out of memory");
    img->n = i + 1;
  }
  size_t size = 0;
  if ((r = nv.cubin_size(prog, &size)) || size == 0)
    return fail_msg(err, errlen, "nvrtcGetCUBINSize: %s",
                    r ? nv.error_string(r) : "no cubin (use a real sm_ architecture)");
  if (!(img->data = malloc(size))) return fail_msg(err, errlen, "out of memory");
  if ((r = nv.cubin(prog, (char *)img->data))) return fail_msg(err, errlen, "nvrtcGetCUBIN: %s", nv.error_string(r));
  img->size = size;
  return 0;
}

/* Compiles src into img through a new program; NVRTC's log in *log for a
 * compile error. */
static int nv_build(const char *src, const char *name, const char **all, int nall, const char *const *exprs,
                    int nexprs, const dev_nvrtc_headers *h, dev_kimage *img, char **log, char *err, size_t errlen)
{
  nvrtc_program prog = NULL;
  int rc = -1;
#ifdef __SANITIZE_ADDRESS__
  nvrtc_result nv_r_;
#endif
  nvrtc_result r = NV_CALL(nv.create(&prog, src, name, h ? h->n : 0, h ? h->texts : NULL, h ? h->names : NULL));
  if (r) { fail_msg(err, errlen, "nvrtcCreateProgram: %s", nv.error_string(r)); goto out; }
  for (int i = 0; i < nexprs; i++) {
    if ((r = nv.add_name(prog, exprs[i]))) {
      fail_msg(err, errlen, "nvrtcAddNameExpression(%s): %s", exprs[i], nv.error_string(r));
      goto out;
    }
  }
  r = NV_CALL(nv.compile(prog, nall, all));
  if (r) {
    size_t n = 0;
    if (log && nv.log_size(prog, &n) == 0 && n > 0 && (*log = malloc(n + 1)) != NULL) {
      if (nv.log(prog, *log)) (*log)[0] = 0;
      (*log)[n] = 0;
    }
    fail_msg(err, errlen, "compilation failed (%s)", nv.error_string(r));
    goto out;
  }
  rc = nv_image(prog, exprs, nexprs, img, err, errlen);
out:
  if (prog) (void)NV_CALL(nv.destroy(&prog));
  return rc;
}

int dev_nvrtc_compile(dev_ctx *ctx, const char *src, const char *name, const char *arch,
                      const char *const *opts, int nopts, const char *const *exprs, int nexprs,
                      int use_cache, dev_kimage *img, char **log, char *err, size_t errlen)
{
  (void)ctx;
  return dev_nvrtc_compile_h(src, name, arch, opts, nopts, exprs, nexprs, NULL, use_cache, img, log, err, errlen);
}

int dev_nvrtc_compile_h(const char *src, const char *name, const char *arch, const char *const *opts, int nopts,
                        const char *const *exprs, int nexprs, const dev_nvrtc_headers *h, int use_cache,
                        dev_kimage *img, char **log, char *err, size_t errlen)
{
  memset(img, 0, sizeof *img);
  if (log) *log = NULL;
  if (nexprs < 0 || nopts < 0) return fail_msg(err, errlen, "bad arguments");
#ifdef __SANITIZE_ADDRESS__
  __lsan_disable();
#endif
  pthread_once(&nv_once, nv_load);
#ifdef __SANITIZE_ADDRESS__
  __lsan_enable();
#endif
  if (!nv.lib) return fail_msg(err, errlen, "run-time compilation needs NVRTC: %s", nv.why);

  char archopt[64], incopt[1100];
  const char *all[256];
  int nall = 0;
  if (nv_options(arch, opts, nopts, all, &nall, archopt, incopt, err, errlen)) return -1;

  sbuf key = {0};
  nv_key(&key, src, name, all, nall, exprs, nexprs, h);
  if (key.oom) { free(key.p); return fail_msg(err, errlen, "out of memory"); }

  char dirbuf[1024], path[1200];
  const char *dir = use_cache ? dev_kcache_dir(dirbuf, sizeof dirbuf) : NULL;
  if (dir) {
    snprintf(path, sizeof path, "%s/%016llx.kc", dir, (unsigned long long)dev_kcache_hash(key.p, key.n));
    char note[sizeof img->note];
    note[0] = 0;
    if (dev_kcache_read(path, MAGIC, key.p, key.n, nexprs, img, note, sizeof note) == DEV_KCACHE_HIT) {
      free(key.p);
      return 0;
    }
    snprintf(img->note, sizeof img->note, "%s", note);
  }

  int rc = nv_build(src, name, all, nall, exprs, nexprs, h, img, log, err, errlen);
  if (rc == 0 && dir)
    dev_kcache_write(dir, path, MAGIC, key.p, key.n, img, img->note, img->note[0] ? 0 : sizeof img->note);
  if (rc) dev_kimage_free(img);
  free(key.p);
  return rc;
}
