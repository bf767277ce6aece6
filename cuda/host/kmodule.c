/* Compiled host kernels (kcompile.c): their modules.  A module is the
 * compiler's shared object, written to a temporary file and dlopen'ed (each
 * load its own copy, as CUDA modules have their own globals); its kernels
 * are found by name.  Launches are kexec.c's. */
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kexec.h"
#include "util.h"

typedef struct seg_find { uintptr_t base; hk_mod *hm; } seg_find;

static int seg_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
  (void)size;
  seg_find *sf = arg;
  if (info->dlpi_addr != sf->base) return 0;
  hk_mod *hm = sf->hm;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_TLS) hm->tls_size = ph->p_memsz;
    if (ph->p_type != PT_LOAD || hm->nseg == HK_MAXSEG) continue;
    gpulua_hk_range *r = &hm->seg[hm->nseg++];
    r->lo = info->dlpi_addr + ph->p_vaddr;
    r->hi = r->lo + ph->p_memsz;
    r->write = (ph->p_flags & PF_W) != 0;
    r->param = -1;
  }
  return 1;
}

/* Bytes of the thread-local variables (the __shared__ arrays) declared in
 * the body of function name, from the symbol table of the ELF image (local
 * statics of `name` are _ZZ<len><name>...E<var>); 0 when the name is not a
 * plain identifier or the image has no symbol table. */
static size_t own_shared(const unsigned char *img, size_t len, const char *name)
{
  char pre[300];
  size_t nl = strlen(name), total = 0;
  for (size_t i = 0; i < nl; i++)
    if (!(name[i] == '_' || (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
          (name[i] >= '0' && name[i] <= '9')))
      return 0;
  snprintf(pre, sizeof pre, "_ZZ%zu%s", nl, name);
  size_t pl = strlen(pre);
  const ElfW(Ehdr) *eh = (const void *)img;
  if (len < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_shentsize != sizeof(ElfW(Shdr)) ||
      eh->e_shoff > len || (size_t)eh->e_shnum > (len - eh->e_shoff) / sizeof(ElfW(Shdr)))
    return 0;
  const ElfW(Shdr) *sh = (const void *)(img + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum || sh[i].sh_offset > len ||
        sh[i].sh_size > len - sh[i].sh_offset || sh[i].sh_entsize != sizeof(ElfW(Sym)))
      continue;
    const ElfW(Shdr) *st = &sh[sh[i].sh_link];
    if (st->sh_offset > len || st->sh_size > len - st->sh_offset || st->sh_size == 0) continue;
    const char *str = (const char *)img + st->sh_offset;
    const ElfW(Sym) *sym = (const void *)(img + sh[i].sh_offset);
    size_t n = sh[i].sh_size / sizeof *sym;
    for (size_t k = 0; k < n; k++) {
      if (ELF64_ST_TYPE(sym[k].st_info) != STT_TLS || sym[k].st_name >= st->sh_size) continue;
      const char *nm = str + sym[k].st_name;
      size_t room = st->sh_size - sym[k].st_name;
      if (room > pl && strncmp(nm, pre, pl) == 0 && !(nm[pl] >= '0' && nm[pl] <= '9') &&
          memchr(nm, 0, room))
        total += sym[k].st_size;
    }
  }
  return total;
}

/* ---- modules -------------------------------------------------------------- */

int hk_module_load(dev_ctx *ctx, const void *image, size_t len, void **impl)
{
  char path[1100];
  int fd = tmp_file("gpulua-k", path, sizeof path);
  if (fd < 0) return dev_fail(ctx, DEV_ERR_DEVICE, "load module: cannot create a temporary file: %s", strerror(errno));
  const char *p = image;
  size_t left = len;
  while (left > 0) {
    ssize_t k = write(fd, p, left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = errno;
      close(fd);
      unlink(path);
      return dev_fail(ctx, DEV_ERR_DEVICE, "load module: cannot write %s: %s", path, strerror(e));
    }
    p += k;
    left -= (size_t)k;
  }
  close(fd);
  /* a fresh name per load: dlopen would hand back an object already loaded
   * under the same name */
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const char *why = dl ? NULL : dlerror();
  if (!dl) {
    unlink(path);
    return dev_fail(ctx, DEV_ERR_DEVICE, "load module: %s", why ? why : "dlopen failed");
  }
  const gpulua_hk_module *m = dlsym(dl, "gpulua_hk_mod");
  if (!m || m->abi != GPULUA_HK_ABI) {
    dlclose(dl);
    unlink(path);
    return dev_fail(ctx, DEV_ERR_DEVICE, "load module: not a module of this gpulua's host kernels (interface %d)",
                    GPULUA_HK_ABI);
  }
  int checked = (m->flags & GPULUA_HK_CHECKED) != 0;
  if (!checked) unlink(path);
  hk_mod *hm = calloc(1, sizeof *hm);
  hk_kern *ks = calloc(m->nkernels > 0 ? (size_t)m->nkernels : 1, sizeof *ks);
  if (!hm || !ks) {
    free(hm);
    free(ks);
    dlclose(dl);
    if (checked) unlink(path);
    return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  }
  hm->dl = dl;
  hm->m = m;
  hm->fibers = dlsym(dl, "gpulua_hk_fibers") != NULL;
  hm->ks = ks;
  *(void **)&hm->where = dlsym(dl, "gpulua_hk_where");
  *(void **)&hm->tls_probe = dlsym(dl, "gpulua_hk_tls_probe");
  struct link_map *lm = NULL;
  if (dlinfo(dl, RTLD_DI_LINKMAP, &lm) == 0 && lm) hm->base = lm->l_addr;
  hm->checked = checked;
  if (checked) {
    snprintf(hm->path, sizeof hm->path, "%s", path);
    seg_find sf = {hm->base, hm};
    dl_iterate_phdr(seg_cb, &sf);
  }
  for (int i = 0; i < m->nkernels; i++) {
    ks[i].mod = hm;
    ks[i].k = m->kernels[i];
    ks[i].static_shared = own_shared(image, len, m->kernels[i]->name);
  }
  *impl = hm;
  return DEV_OK;
}

void hk_module_unload(dev_ctx *ctx, void *impl)
{
  (void)ctx;
  hk_mod *hm = impl;
  if (!hm) return;
  dlclose(hm->dl);
  if (hm->checked) unlink(hm->path);
  free(hm->ks);
  free(hm);
}

int hk_kernel_get(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k, size_t *sizes, int max,
                  int *nparams)
{
  hk_mod *hm = impl;
  const gpulua_hk_kernel *kk = dlsym(hm->dl, symbol);
  hk_kern *found = NULL;
  for (int i = 0; kk && i < hm->m->nkernels; i++)
    if (hm->ks[i].k == kk) found = &hm->ks[i];
  if (!found) return dev_fail(ctx, DEV_ERR_DEVICE, "kernel '%.200s' not found in the module", symbol);
  k->handle = found;
  k->max_threads = HK_MAX_THREADS;
  /* as ptxas: no more static shared memory than a GPU allows a kernel */
  if (found->static_shared > HK_MAX_STATIC_SHARED)
    return dev_fail(ctx, DEV_ERR_DEVICE, "kernel '%.200s' uses too much shared data: %zu bytes of static "
                    "__shared__ memory, more than the 48 KiB (%zu bytes) a GPU allows a kernel",
                    found->k->name, found->static_shared, HK_MAX_STATIC_SHARED);
  k->static_shared = found->static_shared;
  k->max_dynamic_shared = HK_MAX_DYN_SHARED - found->static_shared;
  k->shared_set = k->max_dynamic_shared;
  int n = kk->nparams < max ? kk->nparams : max;
  for (int i = 0; i < n; i++) sizes[i] = kk->sizes[i];
  *nparams = n;
  return DEV_OK;
}

int hk_kernel_names(dev_ctx *ctx, void *impl, char ***names, int *n)
{
  hk_mod *hm = impl;
  int count = hm->m->nkernels;
  char **out = calloc(count > 0 ? (size_t)count : 1, sizeof *out);
  if (!out) return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
  for (int i = 0; i < count; i++) {
    if (!(out[i] = strdup(hm->m->kernels[i]->name))) {
      for (int j = 0; j < i; j++) free(out[j]);
      free(out);
      return dev_fail(ctx, DEV_ERR_NOMEM, "out of memory");
    }
  }
  *names = out;
  *n = count;
  return DEV_OK;
}

int hk_is_compiled(const dev_kernel *k)
{
  return k && k->handle && !dev_kernel_is_cfunc(k);
}
