/* The host backend's run-time kernels (cuda/host/): what kexec.c (launches,
 * fibers, the block workers), kmodule.c (loading modules), kcheck.c
 * (GPULUA_KERNEL_CHECK's ranges and static shared arrays) and kfail.c (a
 * failed kernel in words) share: a loaded module and its kernels, a
 * launch's job, a fiber and the thread that runs blocks.  Private to
 * them; what the rest of the backend calls is in hk.h. */
#ifndef GPULUA_HOST_KEXEC_H
#define GPULUA_HOST_KEXEC_H

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "hk.h"
#define GPULUA_HK_ABI_ONLY
#include "host/cuda_device_rt.h"

/* As an H100's: a block of 1024 threads, and dynamic shared memory up to
 * the 227 KiB a kernel may opt in to there (host kernels need no opt-in). */
#define HK_MAX_THREADS 1024
#define HK_MAX_DYN_SHARED ((size_t)232448)
/* The static __shared__ memory a kernel may have on a GPU (ptxas refuses
 * more); GPULUA_KERNEL_CHECK holds host kernels to it. */
#define HK_MAX_STATIC_SHARED ((size_t)49152)

typedef struct hk_mod hk_mod;

typedef struct hk_kern {
  hk_mod *mod;
  const gpulua_hk_kernel *k;
  size_t static_shared;         /* the __shared__ arrays of its own body (kmodule.c) */
} hk_kern;

#define HK_MAXSEG 16

struct hk_mod {
  void *dl;
  const gpulua_hk_module *m;
  int fibers;                   /* its threads need fibers */
  hk_kern *ks;                  /* one per kernel of m */
  void (*where)(char *buf, unsigned long n);   /* the failing thread's block and thread */
  void *(*tls_probe)(void);
  uintptr_t base;               /* the load address: pc - base is in the file */
  /* built with GPULUA_KERNEL_CHECK: the file stays (addr2line reads its
   * lines), and what a kernel may touch besides its tensors */
  int checked;
  char path[1100];
  gpulua_hk_range seg[HK_MAXSEG];   /* the object's loaded segments */
  int nseg;
  size_t tls_size;              /* its thread-local storage: __shared__ */
};

typedef struct hk_job {
  struct hk_job *next;          /* the pool's list, under pool.mu */
  const dev_launch *l;
  const hk_kern *hk;
  gpulua_hk_block tmpl;
  unsigned long long nblocks, chunk;
  _Atomic unsigned long long next_block;
  atomic_int failed;
  int active;                   /* pool workers in it (pool.mu) */
  pthread_cond_t idle;          /* active fell to 0 */
  pthread_mutex_t emu;
  char err[1024];               /* the first failure (emu) */
  gpulua_hk_range *args;        /* GPULUA_KERNEL_CHECK: the tensors passed */
  int nargs;
} hk_job;

/* Fibers switch through the assembly in kexec.c on x86-64, else through
 * ucontext (also with GPULUA_HK_UCONTEXT defined). */
#if defined(__x86_64__) && !defined(GPULUA_HK_UCONTEXT)
#define HK_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

enum { F_RUN, F_BAR, F_WARP, F_DONE };

typedef struct hk_worker hk_worker;

/* GPULUA_KERNEL_CHECK: a static __shared__ array of the job a worker runs,
 * its bytes at p, in an allocation of its own with a gap either side */
typedef struct hk_sarray {
  int id;                       /* the declaration (ksource.c numbers them) */
  size_t size;
  char *mem, *p;
  const char *name;             /* the module's string */
} hk_sarray;

typedef struct hk_fiber {
  void *sp;                     /* saved stack pointer while switched out */
#ifndef HK_ASM_SWITCH
  ucontext_t uc;
#endif
  hk_worker *w;
  unsigned th;                  /* linear thread index in the block */
  int state;
  unsigned bar_gen;             /* the barrier it waits at */
  /* its warp operation: what it asked, and the result */
  int op, arg, width;
  unsigned mask;
  unsigned long long v, res;
} hk_fiber;

/* Bytes of stack per fiber (CUDA gives a thread 1 KiB by default; C++ and
 * printf need more), with a guard page below each. */
#define HK_STACK ((size_t)128 << 10)

/* The state of a thread that runs blocks: a pool worker or a stream's. */
struct hk_worker {
  jmp_buf jb;                   /* a failing thread leaves its block through here */
  hk_job *job;
  void *dyn;                    /* dynamic shared memory */
  size_t dyn_cap;
  /* a fault (SIGSEGV, SIGFPE...) in kernel code: what the handler saw */
  volatile sig_atomic_t in_kernel;
  unsigned long long range_first, range_last;   /* the blocks run as a loop now */
  int fault_sig, fault_code;
  void *fault_addr, *fault_pc;
  char *altstack;               /* ours, when the thread had none */
  /* GPULUA_KERNEL_CHECK: the job's ranges plus this thread's */
  gpulua_hk_range *ranges;
  int nranges, cap_ranges;
  hk_sarray *sa;                /* the job's static __shared__ arrays */
  int nsa, cap_sa;
  size_t sa_bytes;
  gpulua_hk_block *cur_blk;     /* the block description its kernel reads now */
  /* fibers */
  char *stacks;                 /* HK_MAX_THREADS of (guard page + HK_STACK) */
  size_t page;
  int guarded;                  /* stacks whose guard page is set */
  hk_fiber *f;                  /* HK_MAX_THREADS */
  int nf, cur, live, in_fibers;
  void *main_sp;
#ifndef HK_ASM_SWITCH
  ucontext_t main_uc;
#endif
  const void *main_lo;          /* this thread's own stack (AddressSanitizer) */
  size_t main_size;
  gpulua_hk_block blk;          /* the block the fibers run */
  unsigned long long block;
  unsigned bar_gen;             /* barriers completed in this block */
  int bar_arrived, bar_true[2], res_true[2], res_total[2];
  unsigned warp_live[HK_MAX_THREADS / 32], warp_arrived[HK_MAX_THREADS / 32];
  unsigned warp_active[HK_MAX_THREADS / 32];   /* lanes waiting in __activemask */
};

/* kfail.c: " at FILE:LINE" of pc in a module built with
 * GPULUA_KERNEL_CHECK, or ""; the block and thread that failed; which
 * memory a bad access of w's job missed */
void hk_source_line(const hk_mod *hm, void *pc, char *out, size_t n);
void hk_thread_where(const hk_mod *hm, char *out, size_t n);
void hk_describe_access(const hk_worker *w, unsigned long long addr, unsigned long long size, int write,
                        char *out, size_t n);

/* kexec.c: fails the kernel from one of its threads with the message (and
 * the thread's block and thread); does not return. */
void hk_fail_here(hk_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* kcheck.c, GPULUA_KERNEL_CHECK: what w's blocks of j may touch (0, or -1
 * out of memory; its static shared arrays of an earlier job let go); the
 * module's calls (gpulua_hk_rt) for a bad access, a static __shared__
 * array and a misaligned atomic; w's memory of it freed */
int hk_make_ranges(hk_job *j, hk_worker *w);
void hk_rt_bad_access(void *wp, unsigned long long addr, unsigned long long size, int write, void *pc);
void *hk_rt_static_shared(void *wp, int id, unsigned long long size, unsigned long long align, const char *name,
                          void *pc);
void hk_rt_misaligned(void *wp, unsigned long long addr, unsigned long long size, const char *op, void *pc);
void hk_check_free(hk_worker *w);
/* kfail.c: the memory of w's job that addr is in or nearest to, in words
 * ("argument 2 'y' (float *, 1000 elements)"), its first byte, its element
 * size (1 when unknown); NULL when none is near. */
const gpulua_hk_range *hk_range_name(const hk_worker *w, unsigned long long addr, unsigned long long size,
                                     char *name, size_t n, unsigned long long *el, unsigned long long *dist);

#endif
