/* Compiled host kernels: what went wrong, in words, for kexec.c's
 * failures: the source line of a pc (addr2line, for modules built with
 * GPULUA_KERNEL_CHECK), the failing block and thread, and which tensor a
 * bad access missed. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kexec.h"

/* " at FILE:LINE" of pc in a module built with GPULUA_KERNEL_CHECK (its
 * debug information, read by addr2line), or "". */
void hk_source_line(const hk_mod *hm, void *pc, char *out, size_t n)
{
  out[0] = 0;
  char a2l[1100], addr[40], text[256];
  if (!hm->checked || !pc || hk_find_program("addr2line", a2l, sizeof a2l)) return;
  snprintf(addr, sizeof addr, "0x%llx", (unsigned long long)((uintptr_t)pc - hm->base - 1));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) return;
  char *argv[] = {a2l, "-e", (char *)hm->path, "-s", addr, NULL};
  int st = hk_run(argv, fds[1]);
  close(fds[1]);
  ssize_t got = st == 0 ? read(fds[0], text, sizeof text - 1) : -1;
  close(fds[0]);
  if (got <= 0) return;
  text[got] = 0;
  text[strcspn(text, " \n")] = 0;        /* "file:line (discriminator 2)" */
  if (text[0] && text[0] != '?' && !strstr(text, ":?") && !strstr(text, ":0"))
    snprintf(out, n, " at %s", text);
}

/* The block and thread that failed (their coordinates are the module's). */
void hk_thread_where(const hk_mod *hm, char *out, size_t n)
{
  out[0] = 0;
  if (hm->where) hm->where(out, n);
}

const gpulua_hk_range *hk_range_name(const hk_worker *w, unsigned long long addr, unsigned long long size,
                                     char *name, size_t n, unsigned long long *el, unsigned long long *dist)
{
  const dev_ksig *sig = &w->job->l->k->sig;
  const gpulua_hk_range *best = NULL;
  *dist = ~0ull;
  *el = 1;
  for (int i = 0; i < w->nranges; i++) {
    const gpulua_hk_range *r = &w->ranges[i];
    if (r->param == -1) continue;
    unsigned long long d = addr >= r->hi ? addr - r->hi + 1 : addr + size <= r->lo ? r->lo - addr : 0;
    if (d < *dist) { *dist = d; best = r; }
  }
  if (!best || *dist > ((unsigned long long)1 << 20)) return NULL;
  /* the range in elements where they are known */
  unsigned long long bytes = best->hi - best->lo;
  if (best->param >= 0) {
    const dev_kparam *p = &sig->params[best->param];
    *el = p->pointee >= 0 ? dev_dtype_size((dev_dtype)p->pointee) : p->elsize > 0 ? (unsigned long long)p->elsize : 1;
    if (bytes % *el) *el = 1;
    if (*el > 1)
      snprintf(name, n, "argument %d '%s' (%s, %llu elements)", best->param + 1, *p->name ? p->name : "?",
               p->type, bytes / *el);
    else
      snprintf(name, n, "argument %d '%s' (%s, %llu bytes)", best->param + 1, *p->name ? p->name : "?",
               p->type, bytes);
  } else if (best->param == -2) {
    snprintf(name, n, "the dynamic shared memory (%llu bytes)", bytes);
  } else {
    snprintf(name, n, "__shared__ array '%s' (%llu bytes)", w->sa[-3 - best->param].name, bytes);
  }
  return best;
}

/* Which memory addr is outside of: the nearest tensor argument, or the
 * dynamic or a static shared array. */
void hk_describe_access(const hk_worker *w, unsigned long long addr, unsigned long long size, int write,
                            char *out, size_t n)
{
  const char *rw = write ? "write" : "read";
  char name[240];
  unsigned long long el, dist;
  const gpulua_hk_range *best = hk_range_name(w, addr, size, name, sizeof name, &el, &dist);
  if (addr < 65536 && (!best || dist > 0)) {
    snprintf(out, n, "a %llu-byte %s at address 0x%llx (a null pointer?)", size, rw, addr);
    return;
  }
  if (!best) {
    snprintf(out, n, "a %llu-byte %s at 0x%llx, in no tensor the kernel was given, nor its stack or shared "
             "memory", size, rw, addr);
    return;
  }
  long long off = (long long)(addr - best->lo);
  if (dist == 0 && addr >= best->lo && addr + size <= best->hi) {
    snprintf(out, n, "a %llu-byte write to %s, which the kernel may only read (a pointer to const)", size, name);
  } else if (el > 1 && off % (long long)el == 0) {
    snprintf(out, n, "a %llu-byte %s of element %lld of %s, %s", size, rw, off / (long long)el, name,
             off < 0 ? "before its start" : "past its end");
  } else {
    snprintf(out, n, "a %llu-byte %s at byte %lld of %s, %s", size, rw, off, name,
             off < 0 ? "before its start" : "past its end");
  }
}
