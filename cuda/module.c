/* Modules of run-time kernels: compiled with NVRTC (gpu.compile) or loaded
 * from an image (gpu.load_module), kernels found by name, signatures checked
 * against the compiled code, and launch configurations checked before a
 * launch.  Backend-neutral: the backend loads images and launches. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "devpriv.h"
#include "util.h"

/* The function of a C function kernel (its dev_kernel's handle). */
typedef struct cfunc {
  dev_cfunc fn;
  void *ud;
  void (*ud_free)(void *ud);
} cfunc;

struct dev_module {
  dev_ctx *ctx;
  int refs;
  void *impl;           /* the backend's loaded image */
  cfunc *cf;            /* a C function kernel's (then impl is NULL) */
  dev_buf *life;        /* launches note a use of it; its release unloads the image */
  int from_cache;
  int n;
  dev_kernel *k;
};

dev_buf *dev_module_life(dev_module *m) { return m->life; }
dev_ctx *dev_module_ctx(const dev_module *m) { return m->ctx; }
int dev_module_count(const dev_module *m) { return m->n; }
dev_kernel *dev_module_kernel(dev_module *m, int i) { return i >= 0 && i < m->n ? &m->k[i] : NULL; }
int dev_module_from_cache(const dev_module *m) { return m->from_cache; }
void dev_module_retain(dev_module *m) { m->refs++; }

static void free_kernels(dev_module *m)
{
  for (int i = 0; i < m->n; i++) free(m->k[i].sig.params);
  free(m->k);
  m->k = NULL;
  m->n = 0;
}

/* The life buffer's release: no launch from this module is queued any more. */
static void module_unload(void *ud, void *ptr)
{
  dev_module *m = ud;
  (void)ptr;
  if (m->impl) m->ctx->bk->module_unload(m->ctx, m->impl);
  if (m->cf) {
    if (m->cf->ud_free) m->cf->ud_free(m->cf->ud);
    free(m->cf);
  }
  free_kernels(m);
  free(m);
}

void dev_module_release(dev_module *m)
{
  if (!m || --m->refs > 0) return;
  if (m->life) dev_buf_release(m->life);   /* frees m once idle */
  else module_unload(m, NULL);
}

static int need_kernels(dev_ctx *ctx)
{
  if (!ctx->bk->module_load)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED,
                    "run-time kernels need the cuda backend (this gpulua runs on the %s backend)",
                    ctx->bk->name);
  return DEV_OK;
}

static int new_module(dev_ctx *ctx, const void *image, size_t len, dev_module **out)
{
  dev_module *m = calloc(1, sizeof *m);
  if (!m) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  m->ctx = ctx;
  m->refs = 1;
  int rc = ctx->bk->module_load(ctx, image, len, &m->impl);
  if (rc) { free(m); return rc; }
  rc = dev_buf_wrap_internal(ctx, m->impl, module_unload, m, &m->life);
  if (rc) { ctx->bk->module_unload(ctx, m->impl); free(m); return rc; }
  *out = m;
  return DEV_OK;
}

/* Take over sig (its params move into the module's kernel). */
static int add_kernel(dev_module *m, dev_ksig *sig, const char *symbol)
{
  dev_ctx *ctx = m->ctx;
  dev_kernel *k = &m->k[m->n];
  memset(k, 0, sizeof *k);
  size_t sizes[256];
  int np = 0, want = sig->nparams;
  if (want > 256)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED, "kernel '%s': more than 256 parameters", sig->name);
  int rc = ctx->bk->kernel_get(ctx, m->impl, symbol, k, sizes, want < 0 ? 256 : want, &np);
  if (rc) return rc;
  k->mod = m;
  k->sig = *sig;
  sig->params = NULL;
  m->n++;
  /* A cubin without declarations: take arguments by size. */
  if (k->sig.nparams < 0) {
    k->sig.nparams = 0;
    k->sig.params = calloc(np > 0 ? (size_t)np : 1, sizeof *k->sig.params);
    if (!k->sig.params) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
    for (int i = 0; i < np && i < 256; i++) {
      dev_kparam *p = &k->sig.params[i];
      p->kind = sizes[i] == 1 || sizes[i] == 2 || sizes[i] == 4 || sizes[i] == 8 ? DEV_KP_RAW : DEV_KP_OTHER;
      p->size = (int)sizes[i];
      p->pointee = -1;
      snprintf(p->type, sizeof p->type, "%zu bytes", sizes[i]);
      k->sig.nparams++;
    }
    return DEV_OK;
  }
  /* What the source says must be what was compiled (sizes, and no fewer
   * parameters; more cannot be asked for without an API error). */
  if (np != k->sig.nparams)
    return dev_fail(ctx, DEV_ERR_INVALID,
                    "kernel '%s': its signature as written has %d parameter%s but the compiled "
                    "kernel has %d (gpulua reads signatures without expanding macros)",
                    k->sig.name, k->sig.nparams, k->sig.nparams == 1 ? "" : "s", np);
  for (int i = 0; i < np && i < 256; i++) {
    dev_kparam *p = &k->sig.params[i];
    if (p->kind == DEV_KP_OTHER && p->size == 0) p->size = (int)sizes[i];
    if ((size_t)p->size != sizes[i])
      return dev_fail(ctx, DEV_ERR_INVALID,
                      "kernel '%s', parameter %d (%s%s%s): read as %d bytes but compiled as %zu",
                      k->sig.name, i + 1, p->type, *p->name ? " " : "", p->name, p->size, sizes[i]);
  }
  return DEV_OK;
}

static int arch_of(dev_ctx *ctx, char *buf, size_t n)
{
  dev_info info;
  int rc = ctx->bk->device_info(ctx, ctx->device, &info);
  if (rc) return rc;
  snprintf(buf, n, "sm_%d%d", info.cc_major, info.cc_minor);
  return DEV_OK;
}

int dev_module_compile(dev_ctx *ctx, const char *src, const dev_compile_opts *o,
                       dev_module **out, char **log)
{
  *out = NULL;
  if (log) *log = NULL;
  int rc = need_kernels(ctx);
  if (rc) return rc;
  rc = dev_check_async(ctx);
  if (rc) return rc;
  char msg[512], arch[32];
  dev_ksig *sigs = NULL;
  int nsig = 0;
  if (dev_kernels_parse(src, &sigs, &nsig, msg, sizeof msg))
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  if ((rc = arch_of(ctx, arch, sizeof arch))) { dev_kernels_free(sigs, nsig); return rc; }
  /* name expressions give every launchable kernel's lowered name */
  const char **exprs = calloc(nsig ? (size_t)nsig : 1, sizeof *exprs);
  char *ebuf = calloc(nsig ? (size_t)nsig : 1, 200);
  if (!exprs || !ebuf) {
    free(exprs); free(ebuf); dev_kernels_free(sigs, nsig);
    return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  }
  int nexpr = 0;
  for (int i = 0; i < nsig; i++) {
    if (sigs[i].is_template || sigs[i].overloaded) continue;
    char *e = ebuf + 200 * nexpr;
    snprintf(e, 200, "&%s", sigs[i].qualified);
    exprs[nexpr++] = e;
  }
  dev_kimage img;
  int c = -1;
  if (ctx->bk->compile)
    c = ctx->bk->compile(ctx, src, o && o->name ? o->name : "kernel.cu", arch, o ? o->options : NULL,
                         o ? o->noptions : 0, exprs, nexpr, o ? o->cache : 1, &img, log, msg, sizeof msg);
  else
    snprintf(msg, sizeof msg, "the %s backend cannot compile kernels", ctx->bk->name);
  free(exprs);
  free(ebuf);
  if (c) {
    dev_kernels_free(sigs, nsig);
    if (c == DEV_ERR_INTERRUPTED) return dev_intr_check(ctx, c);
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  }
  if (img.note[0]) dev_warn(ctx, "%s", img.note);
  dev_module *m = NULL;
  rc = new_module(ctx, img.data, img.size, &m);
  if (rc == DEV_OK) {
    m->from_cache = img.from_cache;
    m->k = calloc(nsig ? (size_t)nsig : 1, sizeof *m->k);
    if (!m->k) rc = dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  }
  for (int i = 0, e = 0; rc == DEV_OK && i < nsig; i++) {
    if (sigs[i].is_template || sigs[i].overloaded) {
      /* kept without a handle so that using it says why */
      dev_kernel *k = &m->k[m->n++];
      memset(k, 0, sizeof *k);
      k->mod = m;
      k->sig = sigs[i];
      sigs[i].params = NULL;
      continue;
    }
    rc = add_kernel(m, &sigs[i], img.lowered[e++]);
  }
  dev_kimage_free(&img);
  dev_kernels_free(sigs, nsig);
  if (rc) { dev_module_release(m); return rc; }
  *out = m;
  return DEV_OK;
}

dev_image_kind dev_image_kind_of(const void *data, size_t len)
{
  static const unsigned char fatbin[4] = {0x50, 0xed, 0x55, 0xba};
  if (len >= 4 && memcmp(data, "\x7f" "ELF", 4) == 0) return DEV_IMAGE_CUBIN;
  if (len >= 4 && memcmp(data, fatbin, 4) == 0) return DEV_IMAGE_FATBIN;
  if (memmem(data, len, ".entry", 6) && (memmem(data, len, ".version", 8) || memmem(data, len, ".target", 7)))
    return DEV_IMAGE_PTX;
  return DEV_IMAGE_NONE;
}

/* PTX handed to the loader: text with its terminating zero and no other */
static int is_ptx(const void *image, size_t len)
{
  const char *s = image;
  return len > 8 && memchr(s, 0, len) == s + len - 1 && dev_image_kind_of(image, len) == DEV_IMAGE_PTX;
}

int dev_module_load(dev_ctx *ctx, const void *image, size_t len, const char *declare,
                    dev_module **out)
{
  *out = NULL;
  int rc = need_kernels(ctx);
  if (rc) return rc;
  if (ctx->bk->compile_only)
    return dev_fail(ctx, DEV_ERR_UNSUPPORTED,
                    "run-time kernels need the cuda backend (this gpulua runs on the %s backend)",
                    ctx->bk->name);
  rc = dev_check_async(ctx);
  if (rc) return rc;
  char msg[512];
  dev_ksig *decl = NULL;
  int ndecl = 0;
  if (declare && dev_kernels_parse(declare, &decl, &ndecl, msg, sizeof msg))
    return dev_fail(ctx, DEV_ERR_INVALID, "declare: %s", msg);
  dev_ksig *ptx = NULL;
  int nptx = 0;
  if (is_ptx(image, len) && dev_kernels_parse_ptx(image, &ptx, &nptx, msg, sizeof msg)) {
    dev_kernels_free(decl, ndecl);
    return dev_fail(ctx, DEV_ERR_INVALID, "%s", msg);
  }
  dev_module *m = NULL;
  char **names = NULL;
  int nnames = 0;
  rc = new_module(ctx, image, len, &m);
  if (rc == DEV_OK) rc = ctx->bk->kernel_names(ctx, m->impl, &names, &nnames);
  if (rc == DEV_OK && !(m->k = calloc(nnames ? (size_t)nnames : 1, sizeof *m->k)))
    rc = dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  for (int i = 0; rc == DEV_OK && i < nnames; i++) {
    const char *sym = names[i];
    dev_ksig sig;
    memset(&sig, 0, sizeof sig);
    sig.nparams = -1;
    snprintf(sig.name, sizeof sig.name, "%s", sym);
    /* a declaration matches the plain name or an Itanium-mangled _Z<len><name> */
    for (int d = 0; d < ndecl; d++) {
      char pre[160];
      snprintf(pre, sizeof pre, "_Z%zu%s", strlen(decl[d].name), decl[d].name);
      if (strcmp(sym, decl[d].name) == 0 || strncmp(sym, pre, strlen(pre)) == 0) {
        sig = decl[d];
        decl[d].params = NULL;
        decl[d].nparams = 0;
        break;
      }
    }
    if (sig.nparams < 0) {
      for (int d = 0; d < nptx; d++) {
        if (strcmp(sym, ptx[d].name) != 0) continue;
        sig = ptx[d];
        ptx[d].params = NULL;
        ptx[d].nparams = 0;
        break;
      }
    }
    rc = add_kernel(m, &sig, sym);
    free(sig.params);
  }
  for (int i = 0; i < nnames; i++) free(names[i]);
  free(names);
  dev_kernels_free(decl, ndecl);
  dev_kernels_free(ptx, nptx);
  if (rc) { if (m) dev_module_release(m); return rc; }
  *out = m;
  return DEV_OK;
}

int dev_launch_check(dev_ctx *ctx, const dev_kernel *k, const unsigned grid[3],
                     const unsigned block[3], size_t shared, char *err, size_t errlen)
{
  (void)ctx;
  /* limits of every CUDA device since compute capability 3.0 */
  static const unsigned gmax[3] = {2147483647u, 65535u, 65535u}, bmax[3] = {1024u, 1024u, 64u};
  static const char xyz[] = "xyz";
  if (!k->handle) {
    snprintf(err, errlen, "%s", k->sig.is_template
             ? "is a template: launch an instance through an extern \"C\" __global__ wrapper"
             : "is overloaded: give each overload its own name to launch it from Lua");
    return -1;
  }
  uint64_t threads = 1;
  for (int d = 0; d < 3; d++) {
    if (grid[d] < 1 || grid[d] > gmax[d]) {
      snprintf(err, errlen, "grid.%c = %u is outside [1, %u]", xyz[d], grid[d], gmax[d]);
      return -1;
    }
    if (block[d] < 1 || block[d] > bmax[d]) {
      snprintf(err, errlen, "block.%c = %u is outside [1, %u]", xyz[d], block[d], bmax[d]);
      return -1;
    }
    threads *= block[d];
  }
  if (threads > (uint64_t)k->max_threads) {
    snprintf(err, errlen, "a block of %llu threads is more than this kernel's limit of %d",
             (unsigned long long)threads, k->max_threads);
    return -1;
  }
  if (shared > k->max_dynamic_shared) {
    snprintf(err, errlen, "shared = %zu bytes is more than the %zu bytes of dynamic shared memory "
             "this kernel can have (it declares %zu static)", shared, k->max_dynamic_shared,
             k->static_shared);
    return -1;
  }
  return 0;
}

/* ---- C function kernels -------------------------------------------------- */

int dev_kernel_is_cfunc(const dev_kernel *k)
{
  return k && k->mod && k->mod->cf && k->handle == k->mod->cf;
}

int dev_module_cfunc(dev_ctx *ctx, const char *name, const char *params, dev_cfunc fn,
                     void *ud, void (*ud_free)(void *ud), dev_module **out)
{
  *out = NULL;
  if (!fn) return dev_fail(ctx, DEV_ERR_INVALID, "C kernel: the function is NULL");
  if (!name || !*name) return dev_fail(ctx, DEV_ERR_INVALID, "C kernel: no name");
  size_t nl = strlen(name);
  if (nl >= sizeof(((dev_ksig *)0)->name))
    return dev_fail(ctx, DEV_ERR_INVALID, "C kernel: the name is longer than %zu bytes",
                    sizeof(((dev_ksig *)0)->name) - 1);
  for (size_t i = 0; i < nl; i++) {
    char c = name[i];
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')))
      return dev_fail(ctx, DEV_ERR_INVALID, "C kernel '%s': the name must be a C identifier", name);
  }
  if (!params) params = "";
  /* The declaration read as a kernel's, so launches check arguments the same way. */
  size_t len = nl + strlen(params) + 64;
  char *decl = malloc(len);
  if (!decl) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  snprintf(decl, len, "__global__ void %s(%s) {}", name, params);
  char msg[512];
  dev_ksig *sigs = NULL;
  int n = 0;
  int bad = dev_kernels_parse(decl, &sigs, &n, msg, sizeof msg);
  free(decl);
  if (bad) return dev_fail(ctx, DEV_ERR_INVALID, "C kernel '%s': parameters: %s", name, msg);
  if (n != 1) {
    dev_kernels_free(sigs, n);
    return dev_fail(ctx, DEV_ERR_INVALID, "C kernel '%s': the parameters are not one declaration list", name);
  }
  for (int i = 0; i < sigs[0].nparams; i++) {
    const dev_kparam *p = &sigs[0].params[i];
    if (p->kind == DEV_KP_OTHER || p->kind == DEV_KP_RAW) {
      int rc = dev_fail(ctx, DEV_ERR_INVALID, "C kernel '%s': parameter %d (%s) cannot be passed from Lua "
                        "(use pointers, integers, float, double, __half, __nv_bfloat16 or bool)",
                        name, i + 1, p->type);
      dev_kernels_free(sigs, n);
      return rc;
    }
  }
  dev_module *m = calloc(1, sizeof *m);
  cfunc *cf = calloc(1, sizeof *cf);
  dev_kernel *k = calloc(1, sizeof *k);
  if (!m || !cf || !k) {
    free(m); free(cf); free(k);
    dev_kernels_free(sigs, n);
    return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  }
  m->ctx = ctx;
  m->refs = 1;
  m->cf = cf;
  m->k = k;
  m->n = 1;
  k->mod = m;
  k->sig = sigs[0];
  sigs[0].params = NULL;
  dev_kernels_free(sigs, n);
  k->handle = cf;
  k->max_threads = 1024;
  k->max_dynamic_shared = SIZE_MAX;   /* the function's own kernels decide */
  int rc = dev_buf_wrap_internal(ctx, NULL, module_unload, m, &m->life);
  if (rc) { free(k->sig.params); free(k); free(cf); free(m); return rc; }
  /* ud is the module's from here on */
  cf->fn = fn;
  cf->ud = ud;
  cf->ud_free = ud_free;
  *out = m;
  return DEV_OK;
}

int dev_cfunc_run(const dev_launch *l, void *stream, char *err, size_t errlen)
{
  const cfunc *cf = l->k->handle;
  dev_cfunc_call c = {l->k->sig.name, l->grid, l->block, l->shared, l->k->sig.nparams, l->args,
                      stream, cf->ud};
  if (errlen) err[0] = 0;
  if (cf->fn(&c, err, errlen) == 0) return 0;
  if (errlen && !err[0]) snprintf(err, errlen, "the C function failed (no message)");
  return -1;
}

dev_launch *dev_launch_dup(const dev_launch *l)
{
  int np = l->k->sig.nparams, nb = l->nbufs;
  /* one block: the launch, arg pointers, 8-byte value slots, extents,
   * buffers, writes */
  size_t bytes = sizeof(dev_launch) + (size_t)np * (sizeof(void *) + 8 + sizeof(size_t)) +
                 (size_t)nb * (sizeof(dev_buf *) + 1);
  dev_launch *c = malloc(bytes);
  if (!c) return NULL;
  *c = *l;
  void **args = (void **)(c + 1);
  uint64_t *vals = (uint64_t *)(args + np);
  size_t *ext = (size_t *)(vals + np);
  dev_buf **bufs = (dev_buf **)(ext + np);
  unsigned char *writes = (unsigned char *)(bufs + nb);
  for (int i = 0; i < np; i++) ext[i] = l->extents ? l->extents[i] : 0;
  c->extents = l->extents ? ext : NULL;
  for (int i = 0; i < np; i++) {
    int size = l->k->sig.params[i].size;
    vals[i] = 0;
    memcpy(&vals[i], l->args[i], size > 0 && size <= 8 ? (size_t)size : 8);
    args[i] = &vals[i];
  }
  if (nb) {
    memcpy(bufs, l->bufs, (size_t)nb * sizeof *bufs);
    memcpy(writes, l->writes, (size_t)nb);
  }
  c->args = args;
  c->bufs = bufs;
  c->writes = writes;
  return c;
}
