/* Compiled host kernels (kcompile.c): running them (their modules are
 * loaded by kmodule.c; kfail.c puts a failure in words; kexec.h).
 *
 * A launch runs on the stream's worker thread: its blocks are
 * shared out to a process-wide pool of block workers (GPULUA_HOST_THREADS,
 * default one per CPU, the stream's worker counted), each running whole
 * blocks, one at a time.  A block's threads run one after the other in a
 * loop the compiler sees through (gpulua_hk_kernel.run_blocks), unless the
 * kernel reaches barriers or warp primitives: then each thread is a fiber
 * with its own stack, and a fiber that reaches __syncthreads or a warp
 * operation hands the CPU to the next one, round robin; the operation
 * completes when every live thread of the block (of the warp, for the lanes
 * of its mask) has reached it, so it means what it means on a GPU.  Threads
 * that exited no longer count, as on current GPUs; a wait that can never
 * complete (a warp operation naming a thread blocked at a barrier) fails
 * the kernel.
 *
 * A fault in kernel code (SIGSEGV, SIGBUS, SIGFPE, SIGILL on a block
 * worker) fails the launch instead of the process.  Modules built for
 * GPULUA_KERNEL_CHECK call back before each access of the user's code; the
 * ranges it may touch are set up per job and worker by kcheck.c, and a bad
 * access is described against the launch's tensor arguments and shared
 * memory (kfail.c). */
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kexec.h"
#include "util.h"

/* ---- fibers ---------------------------------------------------------------- */

#ifdef HK_ASM_SWITCH
/* The switch: callee-saved registers on the old stack, its stack pointer
 * into *save, then the other's restored.  The floating-point control words
 * stay as they are (loading them costs more than the rest of the switch):
 * every fiber of a thread shares the thread's.  A new fiber's stack holds a
 * frame whose return address is gpulua_hk_fiber_start, which calls rbx(r12). */
__asm__(".text\n"
        ".globl gpulua_hk_switch\n.hidden gpulua_hk_switch\n.type gpulua_hk_switch,@function\n"
        "gpulua_hk_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size gpulua_hk_switch, .-gpulua_hk_switch\n"
        ".globl gpulua_hk_fiber_start\n.hidden gpulua_hk_fiber_start\n.type gpulua_hk_fiber_start,@function\n"
        "gpulua_hk_fiber_start:\n"
        "  movq %r12, %rdi\n  callq *%rbx\n  ud2\n"
        ".size gpulua_hk_fiber_start, .-gpulua_hk_fiber_start\n");
void gpulua_hk_switch(void **save, void *to);
void gpulua_hk_fiber_start(void);
#endif

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

static pthread_key_t worker_key;
static pthread_once_t worker_once = PTHREAD_ONCE_INIT;

#define HK_ALTSTACK ((size_t)64 << 10)

static __thread hk_worker *tls_worker;   /* for the fault handler */

static void worker_free(void *p)
{
  hk_worker *w = p;
  if (!w) return;
  tls_worker = NULL;
  if (w->altstack) {
    stack_t ss = {.ss_flags = SS_DISABLE};
    sigaltstack(&ss, NULL);
    munmap(w->altstack, HK_ALTSTACK);
  }
  hk_check_free(w);
  if (w->stacks) munmap(w->stacks, HK_MAX_THREADS * (w->page + HK_STACK));
  free(w->f);
  free(w->dyn);
  free(w);
}

static void worker_key_init(void) { pthread_key_create(&worker_key, worker_free); }

static hk_worker *worker_self(void)
{
  pthread_once(&worker_once, worker_key_init);
  hk_worker *w = pthread_getspecific(worker_key);
  if (w) return w;
  w = calloc(1, sizeof *w);
  if (w && pthread_setspecific(worker_key, w)) { free(w); w = NULL; }
  if (w) {
    pthread_attr_t a;
    void *lo;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
      if (pthread_attr_getstack(&a, &lo, &size) == 0) { w->main_lo = lo; w->main_size = size; }
      pthread_attr_destroy(&a);
    }
    /* the fault handler runs on an alternate stack: a kernel thread may
     * have overflowed its own */
    stack_t old;
    if (sigaltstack(NULL, &old) == 0 && (old.ss_flags & SS_DISABLE)) {
      void *alt = mmap(NULL, HK_ALTSTACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      stack_t ss = {.ss_sp = alt, .ss_size = HK_ALTSTACK, .ss_flags = 0};
      if (alt != MAP_FAILED && sigaltstack(&ss, NULL) == 0) w->altstack = alt;
      else if (alt != MAP_FAILED) munmap(alt, HK_ALTSTACK);
    }
    /* stream and pool threads block every signal; a fault cannot be */
    sigset_t faults;
    sigemptyset(&faults);
    sigaddset(&faults, SIGSEGV);
    sigaddset(&faults, SIGBUS);
    sigaddset(&faults, SIGFPE);
    sigaddset(&faults, SIGILL);
    pthread_sigmask(SIG_UNBLOCK, &faults, NULL);
    tls_worker = w;
  }
  return w;
}

static void job_fail(hk_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_fail(hk_job *j, const char *fmt, ...)
{
  pthread_mutex_lock(&j->emu);
  if (!atomic_load(&j->failed)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof j->err, fmt, ap);
    va_end(ap);
    atomic_store(&j->failed, 1);
  }
  pthread_mutex_unlock(&j->emu);
}

/* ---- switching fibers ------------------------------------------------------ */

static char *stack_lo(const hk_worker *w, int i) { return w->stacks + (size_t)i * (w->page + HK_STACK) + w->page; }

/* Switch from the running context (saved into *save, unless final: it is
 * never resumed) to sp / uc, whose stack is [lo, lo + size). */
static void swap_to(hk_worker *w, void **save, void *sp, void *uc, const void *lo, size_t size, int final)
{
#ifdef __SANITIZE_ADDRESS__
  void *fake = NULL;
  __sanitizer_start_switch_fiber(final ? NULL : &fake, lo, size);
#else
  (void)lo;
  (void)size;
  (void)final;
#endif
#ifdef HK_ASM_SWITCH
  (void)uc;
  gpulua_hk_switch(save, sp);
#else
  (void)sp;
  swapcontext((ucontext_t *)save, (ucontext_t *)uc);
#endif
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
  (void)w;
}

static void switch_fiber(hk_worker *w, int to, int final)
{
  hk_fiber *from = &w->f[w->cur], *f = &w->f[to];
  w->cur = to;
#ifdef HK_ASM_SWITCH
  /* the one after it runs next, usually: its saved frame is a cache miss
   * away, as every fiber's stack is another page */
  const hk_fiber *after = &w->f[to + 1 < w->nf ? to + 1 : 0];
  __builtin_prefetch(after->sp);
  __builtin_prefetch((const char *)after->sp + 64);
  void *dummy;
  swap_to(w, final ? &dummy : &from->sp, f->sp, NULL, stack_lo(w, to), HK_STACK, final);
#else
  swap_to(w, (void *)&from->uc, NULL, &f->uc, stack_lo(w, to), HK_STACK, final);
  (void)final;
#endif
}

/* Back to the thread's own stack, leaving the block's fibers for good. */
__attribute__((noreturn)) static void switch_main(hk_worker *w)
{
#ifdef HK_ASM_SWITCH
  void *dummy;
  swap_to(w, &dummy, w->main_sp, NULL, w->main_lo, w->main_size, 1);
#else
  ucontext_t dummy;
  swap_to(w, (void *)&dummy, NULL, &w->main_uc, w->main_lo, w->main_size, 1);
#endif
  abort();   /* not reached */
}

/* ---- the callbacks of compiled code ------------------------------------------ */

static void job_fail_kind(hk_job *j, int kind, const char *msg)
{
  switch (kind) {
  case GPULUA_FAIL_ASSERT:
    job_fail(j, "device-side assert triggered (cudaErrorAssert): %s", msg);
    break;
  case GPULUA_FAIL_TRAP:
    job_fail(j, "an illegal instruction was encountered (cudaErrorIllegalInstruction): %s", msg);
    break;
  default:
    job_fail(j, "%s", msg);
    break;
  }
}

/* The kernel stops: this thread leaves its block (the other workers stop
 * at their next block). */
static void rt_fail(void *wp, int kind, const char *msg)
{
  hk_worker *w = wp;
  job_fail_kind(w->job, kind, msg);
  if (w->in_fibers) switch_main(w);
  longjmp(w->jb, 1);
}

void hk_fail_here(hk_worker *w, const char *fmt, ...)
{
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rt_fail(w, GPULUA_FAIL_OTHER, msg);
  abort();   /* not reached */
}

/* A kernel run as a loop reached a barrier: its source said it would not
 * (kcompile.c's reading of it missed a way there). */
__attribute__((noreturn)) static void no_fibers(hk_worker *w, const char *what)
{
  hk_fail_here(w, "kernel '%s' reached %s, which gpulua did not find on its way in the source (through a "
            "macro?): it ran without the fibers that need; please report this", w->job->l->k->sig.name, what);
}

/* Every live fiber waits: nothing can make progress. */
__attribute__((noreturn)) static void deadlock(hk_worker *w)
{
  int bar = 0, warp = 0;
  for (int i = 0; i < w->nf; i++) {
    if (w->f[i].state == F_BAR) bar++;
    if (w->f[i].state == F_WARP) warp++;
  }
  unsigned long long gx = w->blk.grid[0], gy = w->blk.grid[1];
  hk_fail_here(w, "block [%llu,%llu,%llu] cannot go on: %d thread%s wait%s at __syncthreads and %d at a "
            "warp operation whose other lanes are elsewhere (a barrier or warp operation not reached "
            "by every thread it waits for)", w->block % gx, w->block / gx % gy, w->block / gx / gy, bar,
            bar == 1 ? "" : "s", bar == 1 ? "s" : "", warp);
}

/* The next runnable fiber after the current one, round robin. */
static void yield(hk_worker *w)
{
  int n = w->nf;
  for (int k = 1; k <= n; k++) {
    int j = w->cur + k < n ? w->cur + k : w->cur + k - n;
    if (w->f[j].state == F_RUN) {
      if (j != w->cur) switch_fiber(w, j, 0);
      return;
    }
  }
  deadlock(w);
}

static void active_try(hk_worker *w, int wi);

static void bar_release(hk_worker *w)
{
  unsigned par = w->bar_gen & 1;
  w->res_true[par] = w->bar_true[par];
  w->res_total[par] = w->bar_arrived;
  w->bar_true[par] = 0;
  w->bar_arrived = 0;
  for (int i = 0; i < w->nf; i++)
    if (w->f[i].state == F_BAR) w->f[i].state = F_RUN;
  w->bar_gen++;
}

static int rt_barrier(void *wp, int kind, int pred)
{
  hk_worker *w = wp;
  if (!w->in_fibers) no_fibers(w, "__syncthreads");
  hk_fiber *f = &w->f[w->cur];
  unsigned gen = w->bar_gen;
  w->bar_true[gen & 1] += pred != 0;
  w->bar_arrived++;
  if (w->bar_arrived == w->live) {
    bar_release(w);
  } else {
    f->state = F_BAR;
    f->bar_gen = gen;
    active_try(w, (int)(f->th >> 5));
    yield(w);
  }
  int t = w->res_true[gen & 1], total = w->res_total[gen & 1];
  switch (kind) {
  case GPULUA_BAR_COUNT: return t;
  case GPULUA_BAR_AND: return t == total;
  case GPULUA_BAR_OR: return t > 0;
  default: return 0;
  }
}

/* The lanes of group (every one arrived) of warp wi get their results. */
static void warp_complete(hk_worker *w, int wi, unsigned group)
{
  hk_fiber *base = &w->f[wi * 32];
  unsigned ballot = 0;
  for (int l = 0; l < 32; l++)
    if ((group >> l & 1) && base[l].v) ballot |= 1u << l;
  for (int l = 0; l < 32; l++) {
    if (!(group >> l & 1)) continue;
    hk_fiber *f = &base[l];
    unsigned width = (unsigned)f->width, seg = (unsigned)l & ~(width - 1), src = (unsigned)l;
    unsigned a = (unsigned)f->arg;
    unsigned long long r = 0;
    switch (f->op) {
    case GPULUA_W_SHFL: src = seg + (a & (width - 1)); break;
    case GPULUA_W_UP: src = ((unsigned)l & (width - 1)) >= a ? (unsigned)l - a : (unsigned)l; break;
    case GPULUA_W_DOWN: src = ((unsigned)l & (width - 1)) + a < width ? (unsigned)l + a : (unsigned)l; break;
    case GPULUA_W_XOR: src = (unsigned)l ^ a; if (src >= seg + width) src = (unsigned)l; break;
    default: break;
    }
    switch (f->op) {
    case GPULUA_W_SHFL: case GPULUA_W_UP: case GPULUA_W_DOWN: case GPULUA_W_XOR:
      r = src < 32 && (group >> src & 1) ? base[src].v : f->v;
      break;
    case GPULUA_W_BALLOT: r = ballot; break;
    case GPULUA_W_ANY: r = ballot != 0; break;
    case GPULUA_W_ALL: r = ballot == group; break;
    case GPULUA_W_MATCH_ANY: case GPULUA_W_MATCH_ALL: {
      unsigned m = 0;
      for (int k = 0; k < 32; k++)
        if ((group >> k & 1) && base[k].v == f->v) m |= 1u << k;
      r = f->op == GPULUA_W_MATCH_ANY ? m : m == group ? group : 0;
      break;
    }
    case GPULUA_W_ADD: case GPULUA_W_MIN: case GPULUA_W_MAX: case GPULUA_W_UMIN: case GPULUA_W_UMAX:
    case GPULUA_W_AND: case GPULUA_W_OR: case GPULUA_W_XORR: {
      uint32_t acc = 0;
      int first = 1;
      for (int k = 0; k < 32; k++) {
        if (!(group >> k & 1)) continue;
        uint32_t x = (uint32_t)base[k].v;
        if (first) { acc = x; first = 0; continue; }
        switch (f->op) {
        case GPULUA_W_ADD: acc += x; break;
        case GPULUA_W_MIN: acc = (int32_t)x < (int32_t)acc ? x : acc; break;
        case GPULUA_W_MAX: acc = (int32_t)x > (int32_t)acc ? x : acc; break;
        case GPULUA_W_UMIN: acc = x < acc ? x : acc; break;
        case GPULUA_W_UMAX: acc = x > acc ? x : acc; break;
        case GPULUA_W_AND: acc &= x; break;
        case GPULUA_W_OR: acc |= x; break;
        default: acc ^= x; break;
        }
      }
      r = acc;
      break;
    }
    default: break;
    }
    f->res = r;
  }
  w->warp_arrived[wi] &= ~group;
  for (int l = 0; l < 32; l++)
    if ((group >> l & 1) && base[l].state == F_WARP) base[l].state = F_RUN;
}

/* __activemask: the lanes that reach it together.  Lanes run one after the
 * other here, so those waiting in it get their answer once no other live
 * lane of the warp can run on to join them (each has exited or waits at a
 * barrier or another warp operation). */
static void active_try(hk_worker *w, int wi)
{
  unsigned waiting = w->warp_active[wi];
  if (!waiting) return;
  hk_fiber *base = &w->f[wi * 32];
  for (int l = 0; l < 32; l++)
    if ((w->warp_live[wi] >> l & 1) && base[l].state == F_RUN && !(waiting >> l & 1)) return;
  w->warp_active[wi] = 0;
  w->warp_arrived[wi] &= ~waiting;
  for (int l = 0; l < 32; l++) {
    if (!(waiting >> l & 1)) continue;
    base[l].res = waiting;
    base[l].state = F_RUN;
  }
}

/* Complete whatever waits in warp wi that now can (a lane arrived or left). */
static void warp_try(hk_worker *w, int wi)
{
  hk_fiber *base = &w->f[wi * 32];
  for (int l = 0; l < 32; l++) {
    if (!(w->warp_arrived[wi] >> l & 1) || (w->warp_active[wi] >> l & 1)) continue;
    unsigned group = base[l].mask & w->warp_live[wi];
    if ((w->warp_arrived[wi] & group) == group) warp_complete(w, wi, group);
  }
  active_try(w, wi);
}

static unsigned long long rt_warp(void *wp, int op, unsigned mask, unsigned long long v, int arg, int width)
{
  hk_worker *w = wp;
  if (!w->in_fibers) no_fibers(w, "a warp primitive");
  hk_fiber *f = &w->f[w->cur];
  int wi = (int)(f->th >> 5), lane = (int)(f->th & 31);
  if (op == GPULUA_W_ACTIVE) {
    f->state = F_WARP;
    w->warp_active[wi] |= 1u << lane;
    w->warp_arrived[wi] |= 1u << lane;
    active_try(w, wi);
    if (f->state != F_RUN) yield(w);
    return f->res;
  }
  if (width < 1 || width > 32 || (width & (width - 1))) width = 32;
  f->op = op;
  f->arg = arg;
  f->width = width;
  f->v = v;
  f->mask = mask | 1u << lane;
  w->warp_arrived[wi] |= 1u << lane;
  unsigned group = f->mask & w->warp_live[wi];
  if ((w->warp_arrived[wi] & group) == group) {
    warp_complete(w, wi, group);
  } else {
    f->state = F_WARP;
    active_try(w, wi);
    yield(w);
  }
  return f->res;
}

/* The current fiber's thread returned. */
__attribute__((noreturn)) static void fiber_done(hk_worker *w)
{
  hk_fiber *f = &w->f[w->cur];
  f->state = F_DONE;
  w->live--;
  int wi = (int)(f->th >> 5);
  w->warp_live[wi] &= ~(1u << (f->th & 31));
  w->warp_arrived[wi] &= ~(1u << (f->th & 31));
  w->warp_active[wi] &= ~(1u << (f->th & 31));
  if (w->live == 0) switch_main(w);
  if (w->bar_arrived > 0 && w->bar_arrived == w->live) bar_release(w);
  warp_try(w, wi);
  int n = w->nf;
  for (int k = 1; k < n; k++) {
    int j = w->cur + k < n ? w->cur + k : w->cur + k - n;
    if (w->f[j].state == F_RUN) {
      switch_fiber(w, j, 1);
      abort();   /* not reached */
    }
  }
  deadlock(w);
}

static void fiber_entry(hk_fiber *f)
{
  hk_worker *w = f->w;
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
  w->job->hk->k->run_thread(&w->blk, w->block, f->th);
  fiber_done(w);
}

#ifndef HK_ASM_SWITCH
static void fiber_entry_uc(unsigned hi, unsigned lo)
{
  fiber_entry((hk_fiber *)(uintptr_t)((uint64_t)hi << 32 | lo));
}
#endif

/* Stacks and fiber records for n threads. */
static int ensure_fibers(hk_worker *w, int n)
{
  if (!w->stacks) {
    long pg = sysconf(_SC_PAGESIZE);
    w->page = pg > 0 ? (size_t)pg : 4096;
    void *p = mmap(NULL, HK_MAX_THREADS * (w->page + HK_STACK), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return -1;
    w->stacks = p;
  }
  if (!w->f && !(w->f = calloc(HK_MAX_THREADS, sizeof *w->f))) return -1;
  for (; w->guarded < n; w->guarded++)
    if (mprotect(w->stacks + (size_t)w->guarded * (w->page + HK_STACK), w->page, PROT_NONE)) return -1;
  return 0;
}

static void fiber_init(hk_worker *w, int i)
{
  hk_fiber *f = &w->f[i];
  f->w = w;
  f->th = (unsigned)i;
  f->state = F_RUN;
  char *lo = stack_lo(w, i);
#ifdef __SANITIZE_ADDRESS__
  /* the frames a finished fiber left on it keep their redzones' poison */
  __asan_unpoison_memory_region(lo + HK_STACK - 16384, 16384);
#endif
#ifdef HK_ASM_SWITCH
  /* the frame gpulua_hk_switch pops: r15..r12, rbx, rbp, then the return
   * address; gpulua_hk_fiber_start runs with rsp 16-aligned.  The tops are
   * staggered within a page: stacks a page multiple apart would all fall
   * into the same cache sets. */
  char *top = lo + HK_STACK - (size_t)(i * 832 % 4096);
  uint64_t *sp = (uint64_t *)(((uintptr_t)top & ~(uintptr_t)15) - 56);
  sp[0] = 0;                             /* r15 */
  sp[1] = 0;                             /* r14 */
  sp[2] = 0;                             /* r13 */
  sp[3] = (uint64_t)(uintptr_t)f;        /* r12: the argument */
  sp[4] = (uint64_t)(uintptr_t)fiber_entry;   /* rbx: the function */
  sp[5] = 0;                             /* rbp */
  sp[6] = (uint64_t)(uintptr_t)gpulua_hk_fiber_start;
  f->sp = sp;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = lo;
  f->uc.uc_stack.ss_size = HK_STACK;
  f->uc.uc_link = NULL;
  uint64_t a = (uint64_t)(uintptr_t)f;
  makecontext(&f->uc, (void (*)(void))fiber_entry_uc, 2, (unsigned)(a >> 32), (unsigned)a);
#endif
}

static void fault_fail(hk_worker *w);

/* One block of j as fibers on this thread: 0, or -1 once the kernel failed. */
static int run_block_fibers(hk_job *j, hk_worker *w, unsigned long long b)
{
  int n = (int)(j->l->block[0] * j->l->block[1] * j->l->block[2]);
  if (ensure_fibers(w, n)) {
    job_fail(j, "out of memory for the stacks of %d kernel threads", n);
    return -1;
  }
  w->blk = j->tmpl;
  w->blk.w = w;
  w->blk.dyn = w->dyn;
  w->blk.first = b;
  w->blk.last = b + 1;
  w->blk.ranges = w->ranges;
  w->blk.nranges = w->nranges;
  w->cur_blk = &w->blk;
  w->block = b;
  w->job = j;
  w->nf = n;
  w->live = n;
  w->cur = 0;
  w->bar_gen = 0;
  w->bar_arrived = 0;
  w->bar_true[0] = w->bar_true[1] = 0;
  for (int i = 0; i < n; i++) fiber_init(w, i);
  for (int k = 0; k < (n + 31) / 32; k++) {
    int lanes = n - 32 * k < 32 ? n - 32 * k : 32;
    w->warp_live[k] = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    w->warp_arrived[k] = 0;
    w->warp_active[k] = 0;
  }
  if (setjmp(w->jb)) {
    /* a fault: the handler left the fibers for good */
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
    fault_fail(w);
    w->in_fibers = 0;
  } else {
    w->in_fibers = 1;
    w->in_kernel = 1;
#ifdef HK_ASM_SWITCH
    swap_to(w, &w->main_sp, w->f[0].sp, NULL, stack_lo(w, 0), HK_STACK, 0);
#else
    swap_to(w, (void *)&w->main_uc, NULL, &w->f[0].uc, stack_lo(w, 0), HK_STACK, 0);
#endif
    w->in_kernel = 0;
    w->in_fibers = 0;
  }
  if (!atomic_load(&j->failed)) return 0;
#ifdef __SANITIZE_ADDRESS__
  /* abandoned fibers leave their frames' shadow behind */
  __asan_unpoison_memory_region(w->stacks, (size_t)n * (w->page + HK_STACK));
#endif
  return -1;
}

/* ---- what went wrong, in words ------------------------------------------------ */

/* After a fault in kernel code (the handler jumped back here): the job
 * fails saying what it was. */
static void fault_fail(hk_worker *w)
{
  const hk_mod *hm = w->job->hk->mod;
  char at[100], line[300], why[200];
  hk_thread_where(hm, at, sizeof at);
  if (!w->in_fibers && !hm->checked) {
    /* a loop the compiler optimized keeps no exact thread index at hand:
     * the blocks it was running */
    unsigned long long gx = w->job->l->grid[0], gy = w->job->l->grid[1], b = w->range_first;
    if (w->range_last == b + 1)
      snprintf(at, sizeof at, "block [%llu,%llu,%llu]", b % gx, b / gx % gy, b / gx / gy);
    else
      snprintf(at, sizeof at, "one of blocks %llu to %llu (x fastest)", b, w->range_last - 1);
  }
  hk_source_line(hm, w->fault_pc, line, sizeof line);
  const char *hint = hm->checked ? "" : " (GPULUA_KERNEL_CHECK=1 finds the line)";
  uintptr_t a = (uintptr_t)w->fault_addr;
  int overflow = 0;
  if (w->stacks && a >= (uintptr_t)w->stacks && a < (uintptr_t)w->stacks + HK_MAX_THREADS * (w->page + HK_STACK))
    overflow = (a - (uintptr_t)w->stacks) % (w->page + HK_STACK) < w->page;
  if (w->main_lo && a < (uintptr_t)w->main_lo + 4096 && a + 65536 >= (uintptr_t)w->main_lo) overflow = 1;
  switch (w->fault_sig) {
  case SIGFPE:
    snprintf(why, sizeof why, "%s (a GPU gives an unspecified value; the CPU traps)",
             w->fault_code == FPE_INTOVF ? "integer overflow in a division" : "integer division by zero");
    break;
  case SIGILL:
    snprintf(why, sizeof why, "an illegal instruction was encountered (cudaErrorIllegalInstruction)");
    break;
  default:
    if (overflow)
      snprintf(why, sizeof why, "a kernel thread overflowed its stack of %zu KiB (cudaErrorHardwareStackError)",
               (size_t)(HK_STACK >> 10));
    else
      snprintf(why, sizeof why, "illegal memory access (cudaErrorIllegalAddress): a fault at address 0x%llx%s",
               (unsigned long long)a, a < 65536 ? " (a null pointer?)" : "");
    break;
  }
  job_fail(w->job, "%s%s, in %s%s", why, line, at, w->fault_sig == SIGFPE || overflow ? "" : hint);
}

/* ---- faults ------------------------------------------------------------------- */

static struct sigaction prev_act[4];
static const int fault_sigs[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_handler(int sig, siginfo_t *si, void *uc)
{
  hk_worker *w = tls_worker;
  if (w && w->in_kernel) {
    w->in_kernel = 0;
    w->fault_sig = sig;
    w->fault_code = si->si_code;
    w->fault_addr = si->si_addr;
#if defined(__x86_64__)
    w->fault_pc = (void *)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    w->fault_pc = (void *)((ucontext_t *)uc)->uc_mcontext.pc;
#endif
#ifdef __SANITIZE_ADDRESS__
    if (w->in_fibers) __sanitizer_start_switch_fiber(NULL, w->main_lo, w->main_size);
#endif
    longjmp(w->jb, 2);
  }
  /* not ours: what was there before */
  for (int i = 0; i < 4; i++) {
    if (fault_sigs[i] != sig) continue;
    const struct sigaction *p = &prev_act[i];
    if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
      p->sa_sigaction(sig, si, uc);
    } else if (p->sa_handler == SIG_DFL || p->sa_handler == SIG_IGN) {
      /* back to the default, and the fault happens again */
      signal(sig, SIG_DFL);
    } else {
      p->sa_handler(sig);
    }
  }
}

static void fault_install(void)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = fault_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 4; i++) sigaction(fault_sigs[i], &sa, &prev_act[i]);
}

static const gpulua_hk_rt rt = {rt_barrier, rt_warp, rt_fail, hk_rt_bad_access, hk_rt_static_shared,
                               hk_rt_misaligned};

/* ---- running blocks ------------------------------------------------------- */

static int ensure_dyn(hk_worker *w, size_t bytes)
{
  if (bytes <= w->dyn_cap && w->dyn) return 0;
  size_t cap = (bytes + 255) & ~(size_t)255;
  void *p = aligned_alloc(256, cap ? cap : 256);
  if (!p) return -1;
  free(w->dyn);
  w->dyn = p;
  w->dyn_cap = cap;
  return 0;
}

/* Blocks [b0, b1) on this thread: 0, or -1 once the kernel failed. */
static int run_range(hk_job *j, hk_worker *w, unsigned long long b0, unsigned long long b1)
{
  gpulua_hk_block blk = j->tmpl;
  blk.w = w;
  blk.dyn = w->dyn;
  blk.first = b0;
  blk.last = b1;
  blk.ranges = w->ranges;
  blk.nranges = w->nranges;
  w->cur_blk = &blk;
  w->job = j;
  w->range_first = b0;
  w->range_last = b1;
  switch (setjmp(w->jb)) {
  case 0: break;
  case 2: fault_fail(w); return -1;
  default: return -1;
  }
  w->in_kernel = 1;
  j->hk->k->run_blocks(&blk);
  w->in_kernel = 0;
  return 0;
}

static void run_job(hk_job *j, hk_worker *w)
{
  if (ensure_dyn(w, j->l->shared)) {
    job_fail(j, "out of memory for %zu bytes of dynamic shared memory", j->l->shared);
    return;
  }
  int fibers = j->hk->mod->fibers && j->hk->k->fibers;
  int n = (int)(j->l->block[0] * j->l->block[1] * j->l->block[2]);
  if (fibers && ensure_fibers(w, n)) {
    job_fail(j, "out of memory for the stacks of %d kernel threads", n);
    return;
  }
  if (hk_make_ranges(j, w)) {
    job_fail(j, "out of memory");
    return;
  }
  while (!atomic_load(&j->failed)) {
    unsigned long long b0 = atomic_fetch_add(&j->next_block, j->chunk);
    if (b0 >= j->nblocks) break;
    unsigned long long b1 = b0 + j->chunk < j->nblocks ? b0 + j->chunk : j->nblocks;
    int bad = 0;
    for (unsigned long long b = b0; fibers && b < b1 && !bad; b++) bad = run_block_fibers(j, w, b);
    if (!fibers) bad = run_range(j, w, b0, b1);
    if (bad) break;
  }
}

/* ---- the pool of block workers ------------------------------------------------ */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t work;
  hk_job *jobs;                 /* launches with blocks to hand out */
  int size;                     /* workers per launch, its own thread counted; 0: not read yet */
  int started;                  /* pool threads running */
  char bad[160];                /* GPULUA_HOST_THREADS is not a count */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, ""};

static void *pool_main(void *arg)
{
  (void)arg;
  hk_worker *w = worker_self();
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    hk_job *j = pool.jobs;
    while (j && (atomic_load(&j->failed) || atomic_load(&j->next_block) >= j->nblocks)) j = j->next;
    if (!j || !w) {
      pthread_cond_wait(&pool.work, &pool.mu);
      if (!w) w = worker_self();
      continue;
    }
    j->active++;
    pthread_mutex_unlock(&pool.mu);
    run_job(j, w);
    pthread_mutex_lock(&pool.mu);
    if (--j->active == 0) pthread_cond_broadcast(&j->idle);
  }
  return NULL;
}

/* Under pool.mu: the pool threads for a launch of nblocks, started as
 * needed; how many there are. */
static int pool_grow(unsigned long long nblocks)
{
  if (pool.size == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    pool.size = n > 0 ? (int)n : 1;
    const char *env = env_setting("GPULUA_HOST_THREADS");
    if (env && *env) {
      char *end;
      long v = strtol(env, &end, 10);
      if (*end || v < 1 || v > 1024)
        snprintf(pool.bad, sizeof pool.bad, "GPULUA_HOST_THREADS='%.40s' is not a number of threads (1 to 1024)", env);
      else
        pool.size = (int)v;
    }
  }
  if (nblocks <= 1 || *pool.bad) return 0;
  unsigned long long want = (unsigned long long)pool.size - 1;
  if (want > nblocks - 1) want = nblocks - 1;
  while ((unsigned long long)pool.started < want) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    int e = pthread_create(&th, NULL, pool_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) break;
    pthread_detach(th);
    pool.started++;
  }
  return pool.started;
}

int hk_launch(const dev_launch *l, char *err, size_t errlen)
{
  const hk_kern *hk = l->k->handle;
  hk_worker *w = worker_self();
  if (!w) { snprintf(err, errlen, "out of memory"); return -1; }
  hk_job j;
  memset(&j, 0, sizeof j);
  j.l = l;
  j.hk = hk;
  j.tmpl.rt = &rt;
  j.tmpl.args = l->args;
  memcpy(j.tmpl.grid, l->grid, sizeof j.tmpl.grid);
  memcpy(j.tmpl.block, l->block, sizeof j.tmpl.block);
  j.tmpl.shared = l->shared;
  j.nblocks = (unsigned long long)l->grid[0] * l->grid[1] * l->grid[2];
  pthread_once(&fault_once, fault_install);
  if (hk->mod->checked) {
    /* each tensor argument's bytes (a const pointer's read only) */
    const dev_ksig *sig = &l->k->sig;
    j.args = calloc(sig->nparams > 0 ? (size_t)sig->nparams : 1, sizeof *j.args);
    if (!j.args) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int i = 0; i < sig->nparams; i++) {
      const dev_kparam *p = &sig->params[i];
      void *ptr;
      if ((p->kind != DEV_KP_POINTER && p->kind != DEV_KP_RAW) || p->size != 8 || !l->extents ||
          !l->extents[i])
        continue;
      memcpy(&ptr, l->args[i], sizeof ptr);
      if (!ptr) continue;
      j.args[j.nargs++] = (gpulua_hk_range){(uintptr_t)ptr, (uintptr_t)ptr + l->extents[i],
                                            p->kind == DEV_KP_RAW || !p->is_const, i};
    }
  }
  atomic_init(&j.next_block, 0);
  atomic_init(&j.failed, 0);
  pthread_mutex_init(&j.emu, NULL);
  pthread_cond_init(&j.idle, NULL);

  pthread_mutex_lock(&pool.mu);
  int helpers = pool_grow(j.nblocks);
  if (*pool.bad) {
    snprintf(err, errlen, "%s", pool.bad);
    pthread_mutex_unlock(&pool.mu);
    free(j.args);
    pthread_mutex_destroy(&j.emu);
    pthread_cond_destroy(&j.idle);
    return -1;
  }
  unsigned long long per = j.nblocks / (8ull * (unsigned long long)(helpers + 1));
  j.chunk = per < 1 || (hk->mod->fibers && hk->k->fibers) ? 1 : per > 64 ? 64 : per;
  if (helpers > 0) {
    j.next = pool.jobs;
    pool.jobs = &j;
    pthread_cond_broadcast(&pool.work);
  }
  pthread_mutex_unlock(&pool.mu);

  run_job(&j, w);

  if (helpers > 0) {
    pthread_mutex_lock(&pool.mu);
    for (hk_job **pp = &pool.jobs; *pp; pp = &(*pp)->next)
      if (*pp == &j) { *pp = j.next; break; }
    while (j.active > 0) pthread_cond_wait(&j.idle, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
  }
  int failed = atomic_load(&j.failed);
  if (failed) snprintf(err, errlen, "%s", j.err);
  free(j.args);
  pthread_mutex_destroy(&j.emu);
  pthread_cond_destroy(&j.idle);
  return failed ? -1 : 0;
}
