/* GPULUA_KERNEL_CHECK's side of running host kernels (kexec.c runs them):
 * the memory a job's blocks may touch (gpulua_hk_range: the tensors passed,
 * the dynamic and static shared memory, the stacks, the module's data), the
 * static __shared__ arrays of a function, which ksource.c turns into calls
 * here so that each has an allocation of its own with a gap either side
 * (an overrun by one element is outside every range, even where a GPU would
 * land in the next array), the 48 KiB of static shared memory a GPU allows a
 * kernel, and the module's calls for a bad access or a misaligned atomic. */
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kexec.h"

/* bytes of gap either side of a static shared array */
#define HK_SHARED_GAP ((size_t)64)

static int add_range(hk_worker *w, uintptr_t lo, uintptr_t hi, int write, int param)
{
  if (w->nranges == w->cap_ranges) {
    int cap = w->cap_ranges ? 2 * w->cap_ranges : 32;
    gpulua_hk_range *r = realloc(w->ranges, (size_t)cap * sizeof *r);
    if (!r) return -1;
    w->ranges = r;
    w->cap_ranges = cap;
  }
  w->ranges[w->nranges++] = (gpulua_hk_range){lo, hi, write, param};
  return 0;
}

static void free_arrays(hk_worker *w)
{
  for (int i = 0; i < w->nsa; i++) free(w->sa[i].mem);
  w->nsa = 0;
  w->sa_bytes = 0;
}

void hk_check_free(hk_worker *w)
{
  free_arrays(w);
  free(w->sa);
  free(w->ranges);
}

int hk_make_ranges(hk_job *j, hk_worker *w)
{
  const hk_mod *hm = j->hk->mod;
  w->nranges = 0;
  free_arrays(w);
  if (!hm->checked) return 0;
  int bad = 0;
  for (int i = 0; i < j->nargs; i++) bad |= add_range(w, j->args[i].lo, j->args[i].hi, j->args[i].write, j->args[i].param);
  if (j->l->shared) bad |= add_range(w, (uintptr_t)w->dyn, (uintptr_t)w->dyn + j->l->shared, 1, -2);
  bad |= add_range(w, (uintptr_t)w->main_lo, (uintptr_t)w->main_lo + w->main_size, 1, -1);
  if (w->stacks)
    bad |= add_range(w, (uintptr_t)w->stacks, (uintptr_t)w->stacks + HK_MAX_THREADS * (w->page + HK_STACK), 1, -1);
  void *tls = NULL;
  if (dlinfo(hm->dl, RTLD_DI_TLS_DATA, &tls) != 0 || !tls) {
    if (hm->tls_probe) hm->tls_probe();
    if (dlinfo(hm->dl, RTLD_DI_TLS_DATA, &tls) != 0) tls = NULL;
  }
  if (tls) bad |= add_range(w, (uintptr_t)tls, (uintptr_t)tls + hm->tls_size, 1, -1);
  for (int i = 0; i < hm->nseg; i++) bad |= add_range(w, hm->seg[i].lo, hm->seg[i].hi, hm->seg[i].write, -1);
  return bad ? -1 : 0;
}

void hk_rt_bad_access(void *wp, unsigned long long addr, unsigned long long size, int write, void *pc)
{
  hk_worker *w = wp;
  const hk_mod *hm = w->job->hk->mod;
  char what[400], line[300], at[100];
  hk_describe_access(w, addr, size, write, what, sizeof what);
  hk_source_line(hm, pc, line, sizeof line);
  hk_thread_where(hm, at, sizeof at);
  hk_fail_here(w, "illegal memory access (cudaErrorIllegalAddress): %s%s, in %s", what, line, at);
}

/* The block's copy of static __shared__ declaration id: the same for every
 * thread and block of the job on this worker (shared memory starts
 * undefined on a GPU too); a new one is a range of its own. */
void *hk_rt_static_shared(void *wp, int id, unsigned long long size, unsigned long long align, const char *name,
                          void *pc)
{
  hk_worker *w = wp;
  for (int i = 0; i < w->nsa; i++)
    if (w->sa[i].id == id && w->sa[i].size == size) return w->sa[i].p;
  if (size > HK_MAX_STATIC_SHARED || w->sa_bytes + size > HK_MAX_STATIC_SHARED) {
    char line[300];
    hk_source_line(w->job->hk->mod, pc, line, sizeof line);
    hk_fail_here(w, "kernel '%s' uses too much shared data: %llu bytes of static __shared__ memory (array '%s' of "
                 "%llu bytes passed the limit), more than the 48 KiB (%zu bytes) a GPU allows a kernel%s",
                 w->job->l->k->sig.name, (unsigned long long)w->sa_bytes + size, name, size, HK_MAX_STATIC_SHARED,
                 line);
  }
  size_t dyn = w->job->l->shared;
  if (w->sa_bytes + size + dyn > HK_MAX_DYN_SHARED) {
    char line[300];
    hk_source_line(w->job->hk->mod, pc, line, sizeof line);
    hk_fail_here(w, "kernel '%s' uses too much shared data: %llu bytes of static __shared__ memory (array '%s' of "
                 "%llu bytes passed the limit) and the launch's %zu of dynamic, more than the %zu bytes a block may "
                 "have%s", w->job->l->k->sig.name, (unsigned long long)w->sa_bytes + size, name, size, dyn,
                 HK_MAX_DYN_SHARED, line);
  }
  size_t al = align < 16 ? 16 : (size_t)align, gap = (HK_SHARED_GAP + al - 1) / al * al;
  size_t body = ((size_t)size + al - 1) / al * al;
  char *mem = aligned_alloc(al, gap + body + gap);
  if (!mem) {
    hk_fail_here(w, "out of memory for the static shared array '%s' (%llu bytes)", name, size);
  }
  if (w->nsa == w->cap_sa) {
    int cap = w->cap_sa ? 2 * w->cap_sa : 8;
    hk_sarray *a = realloc(w->sa, (size_t)cap * sizeof *a);
    if (!a) { free(mem); hk_fail_here(w, "out of memory"); }
    w->sa = a;
    w->cap_sa = cap;
  }
  hk_sarray *s = &w->sa[w->nsa];
  *s = (hk_sarray){id, (size_t)size, mem, mem + gap, name};
  if (add_range(w, (uintptr_t)s->p, (uintptr_t)s->p + size, 1, -3 - w->nsa)) {
    free(mem);
    hk_fail_here(w, "out of memory");
  }
  w->nsa++;
  w->sa_bytes += size;
  w->cur_blk->ranges = w->ranges;
  w->cur_blk->nranges = w->nranges;
  return s->p;
}

void hk_rt_misaligned(void *wp, unsigned long long addr, unsigned long long size, const char *op, void *pc)
{
  hk_worker *w = wp;
  const hk_mod *hm = w->job->hk->mod;
  char name[240], line[300], at[100], where[300];
  unsigned long long el, dist;
  const gpulua_hk_range *r = hk_range_name(w, addr, size, name, sizeof name, &el, &dist);
  if (r && dist == 0)
    snprintf(where, sizeof where, "at byte %lld of %s", (long long)(addr - r->lo), name);
  else
    snprintf(where, sizeof where, "at 0x%llx", addr);
  hk_source_line(hm, pc, line, sizeof line);
  hk_thread_where(hm, at, sizeof at);
  hk_fail_here(w, "misaligned address (cudaErrorMisalignedAddress): a %llu-byte %s %s, not aligned to %llu "
               "bytes%s, in %s", size, op, where, size, line, at);
}
