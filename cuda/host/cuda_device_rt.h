/* gpulua_cuda_rt.h: the CUDA device-side vocabulary for kernels compiled by
 * the host backend (gpu.compile without a GPU).  libgpulua embeds this file
 * and hands it to the system C++ compiler with -include, so the same CUDA C
 * source compiles for the CPU; cuda/host/kexec.c runs what it builds.
 *
 * Part 1 (C): the interface between libgpulua and a compiled module; kexec.h
 * includes only this part (GPULUA_HK_ABI_ONLY).  Part 2 (C++): threadIdx and
 * friends, __shared__, barriers and warp primitives (through libgpulua's
 * fiber scheduler), atomics, the math API, __half and __nv_bfloat16 (those
 * two in cuda_device_math.h), printf, assert and clock64, and the
 * per-kernel entry points the generated trailer instantiates.  Kept free of the character pair that C trigraphs start
 * with: the build turns this file into a C string literal. */
#ifndef GPULUA_CUDA_RT_H
#define GPULUA_CUDA_RT_H

/* ---- part 1: the interface ------------------------------------------------ */

/* Bumped whenever anything below changes layout or meaning. */
#define GPULUA_HK_ABI 2

/* __syncthreads kinds and warp operations (gpulua_hk_rt.barrier, .warp) */
enum {
  GPULUA_BAR_SYNC, GPULUA_BAR_COUNT, GPULUA_BAR_AND, GPULUA_BAR_OR
};
enum {
  GPULUA_W_SYNC, GPULUA_W_SHFL, GPULUA_W_UP, GPULUA_W_DOWN, GPULUA_W_XOR, GPULUA_W_BALLOT,
  GPULUA_W_ANY, GPULUA_W_ALL, GPULUA_W_ACTIVE, GPULUA_W_MATCH_ANY, GPULUA_W_MATCH_ALL,
  GPULUA_W_ADD, GPULUA_W_MIN, GPULUA_W_MAX, GPULUA_W_UMIN, GPULUA_W_UMAX, GPULUA_W_AND,
  GPULUA_W_OR, GPULUA_W_XORR
};
/* why a kernel stopped (gpulua_hk_rt.fail) */
enum { GPULUA_FAIL_ASSERT = 1, GPULUA_FAIL_TRAP, GPULUA_FAIL_OTHER };

/* GPULUA_KERNEL_CHECK: memory a kernel may touch */
typedef struct gpulua_hk_range {
  unsigned long long lo, hi;    /* [lo, hi) */
  int write;                    /* may be written */
  int param;                    /* the kernel parameter it is (0-based), -1 none, -2 the
                                 * dynamic shared memory, -3 - i static __shared__ array i */
} gpulua_hk_range;

typedef struct gpulua_hk_rt {
  /* __syncthreads / _count / _and / _or: every live thread of the block */
  int (*barrier)(void *w, int kind, int pred);
  /* a warp-synchronous operation over the lanes of mask (the caller's lane
   * always included); arg is the source lane, delta or lane mask */
  unsigned long long (*warp)(void *w, int op, unsigned mask, unsigned long long v, int arg, int width);
  /* stops the kernel (every block); does not return */
  void (*fail)(void *w, int kind, const char *msg);
  /* GPULUA_KERNEL_CHECK: an access outside every range; does not return */
  void (*bad_access)(void *w, unsigned long long addr, unsigned long long size, int write, void *pc);
  /* GPULUA_KERNEL_CHECK: the block's copy of static __shared__ declaration
   * id (its size and alignment as compiled, name the array's), set apart
   * from everything else; stops the kernel (does not return) when its
   * static shared memory passes a GPU's 48 KiB */
  void *(*static_shared)(void *w, int id, unsigned long long size, unsigned long long align, const char *name,
                         void *pc);
  /* GPULUA_KERNEL_CHECK: an atomic operation (op: its name) on an address
   * not aligned to its size; does not return */
  void (*misaligned)(void *w, unsigned long long addr, unsigned long long size, const char *op, void *pc);
} gpulua_hk_rt;

typedef struct gpulua_hk_block {
  const gpulua_hk_rt *rt;
  void *w;                      /* the worker, for rt */
  void *const *args;            /* a pointer to each parameter's value */
  unsigned grid[3], block[3];
  void *dyn;                    /* dynamic shared memory (extern __shared__) */
  unsigned long long shared;    /* its bytes */
  unsigned long long first, last;   /* run_blocks: blocks [first, last), x fastest */
  const gpulua_hk_range *ranges;    /* GPULUA_KERNEL_CHECK */
  int nranges;
} gpulua_hk_block;

typedef struct gpulua_hk_kernel {
  const char *name;
  int nparams;
  const unsigned *sizes;        /* each parameter's size as compiled */
  /* every thread of the blocks, one after the other (no barriers) */
  void (*run_blocks)(const gpulua_hk_block *b);
  /* one thread of one block, on a fiber of libgpulua's */
  void (*run_thread)(const gpulua_hk_block *b, unsigned long long block, unsigned thread);
  /* 0: its source reaches no barrier or warp primitive (a loop will do,
   * even where the module's other kernels need fibers) */
  int fibers;
} gpulua_hk_kernel;

#define GPULUA_HK_CHECKED 1u    /* gpulua_hk_module.flags: built for GPULUA_KERNEL_CHECK */

/* Exported as "gpulua_hk_mod"; a module that uses barriers or warp
 * primitives also exports "gpulua_hk_fibers" (its threads need fibers). */
typedef struct gpulua_hk_module {
  unsigned abi;
  unsigned flags;
  int nkernels;
  const gpulua_hk_kernel *const *kernels;
} gpulua_hk_module;

#ifndef GPULUA_HK_ABI_ONLY
#ifndef __cplusplus
#error "gpulua_cuda_rt.h part 2 is C++"
#endif

/* ---- part 2: the device vocabulary ----------------------------------------- */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <float.h>
#include <time.h>
#include <limits>
#include <type_traits>
#include <utility>

#define __GPULUA_HOST__ 1
#ifndef __CUDACC__
#define __CUDACC__ 1
#endif
#ifndef __CUDACC_RTC__
#define __CUDACC_RTC__ 1
#endif
#define CUDART_VERSION 12000

/* GPULUA_KERNEL_CHECK builds the user's code with address checks that call
 * the __asan_* functions at the end of this file; the runtime's own code
 * touches libgpulua's memory and is left out. */
#ifdef GPULUA_KCHECK
#define GPULUA_NOCHECK __attribute__((no_sanitize_address, noinline))
#define GPULUA_GLOBAL_ATTR
#else
#define GPULUA_NOCHECK
#define GPULUA_GLOBAL_ATTR __attribute__((always_inline))
#endif

#define __global__ GPULUA_GLOBAL_ATTR
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __shared__ thread_local
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __maxnreg__(n)
#define __cluster_dims__(...)
#define __grid_constant__
#define __builtin_align__(n) __attribute__((aligned(n)))
#define __CUDA_ALIGN__(n) __attribute__((aligned(n)))
/* inline PTX cannot run here: say so at the line that uses it */
#define asm gpulua_inline_PTX_asm_cannot_run_on_the_host_backend

/* ---- vector types -------------------------------------------------------- */

#define GPULUA_VEC2(T, N, A) \
  struct __attribute__((aligned(A))) N##2 { T x, y; }; \
  static inline N##2 make_##N##2(T x, T y) { N##2 r; r.x = x; r.y = y; return r; }
#define GPULUA_VEC3(T, N) \
  struct N##3 { T x, y, z; }; \
  static inline N##3 make_##N##3(T x, T y, T z) { N##3 r; r.x = x; r.y = y; r.z = z; return r; }
#define GPULUA_VEC4(T, N, A) \
  struct __attribute__((aligned(A))) N##4 { T x, y, z, w; }; \
  static inline N##4 make_##N##4(T x, T y, T z, T w) { N##4 r; r.x = x; r.y = y; r.z = z; r.w = w; return r; }
#define GPULUA_VEC1(T, N) \
  struct N##1 { T x; }; \
  static inline N##1 make_##N##1(T x) { N##1 r; r.x = x; return r; }
#define GPULUA_VECS(T, N, S) \
  GPULUA_VEC1(T, N) GPULUA_VEC2(T, N, 2 * (S)) GPULUA_VEC3(T, N) GPULUA_VEC4(T, N, 4 * (S) > 16 ? 16 : 4 * (S))

GPULUA_VECS(signed char, char, 1)
GPULUA_VECS(unsigned char, uchar, 1)
GPULUA_VECS(short, short, 2)
GPULUA_VECS(unsigned short, ushort, 2)
GPULUA_VECS(int, int, 4)
GPULUA_VECS(unsigned int, uint, 4)
GPULUA_VECS(long, long, 8)
GPULUA_VECS(unsigned long, ulong, 8)
GPULUA_VECS(long long, longlong, 8)
GPULUA_VECS(unsigned long long, ulonglong, 8)
GPULUA_VECS(float, float, 4)
GPULUA_VECS(double, double, 8)

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define warpSize 32

/* ---- per-thread state ------------------------------------------------------ */

extern "C" __attribute__((visibility("default"))) inline const char gpulua_hk_fibers = 1;

namespace gpulua_rt {

/* Cache-line aligned, which also keeps the module's thread-local block off
 * 16 bytes into a page, where GCC 12's LeakSanitizer takes it for an old
 * glibc's and reads a bogus range (a crash at exit under ASan). */
struct alignas(64) tstate {
  uint3 tid, bid;
  dim3 bdim, gdim;
  void *dyn;
  const gpulua_hk_block *blk;
};

/* One per OS thread; a block runs on one thread from start to end (its
 * threads as fibers there), so the address never changes under a kernel:
 * const lets the compiler take it once per function. */
__attribute__((const, noinline)) inline tstate *tsp()
{
  static thread_local tstate s;
  return &s;
}

/* A call that lets other fibers run: threadIdx is restored after it. */
GPULUA_NOCHECK inline int barrier(int kind, int pred)
{
  tstate *t = tsp();
  uint3 me = t->tid;
  __asm__ volatile("" : : "r"(&gpulua_hk_fibers));
  int r = t->blk->rt->barrier(t->blk->w, kind, pred);
  t->tid = me;
  return r;
}

GPULUA_NOCHECK inline unsigned long long warp(int op, unsigned mask, unsigned long long v, int arg, int width)
{
  tstate *t = tsp();
  uint3 me = t->tid;
  __asm__ volatile("" : : "r"(&gpulua_hk_fibers));
  unsigned long long r = t->blk->rt->warp(t->blk->w, op, mask, v, arg, width);
  t->tid = me;
  return r;
}

[[noreturn]] GPULUA_NOCHECK inline void fail(int kind, const char *msg)
{
  tstate *t = tsp();
  t->blk->rt->fail(t->blk->w, kind, msg);
  __builtin_unreachable();
}

inline void *dyn_shared() { return tsp()->dyn; }

#ifdef GPULUA_KCHECK
/* GPULUA_KERNEL_CHECK: ksource.c turns each `__shared__ T name[N];` of a
 * function into a reference to this, the block's copy kept apart by
 * libgpulua (so an overrun is one); an atomic's address must be aligned to
 * its size.  (pc: the user's code that asked) */
__attribute__((no_sanitize_address, noinline)) inline void *static_shared(int id, unsigned long long size,
                                                                         unsigned long long align, const char *name)
{
  tstate *t = tsp();
  return t->blk->rt->static_shared(t->blk->w, id, size, align, name, __builtin_return_address(0));
}
__attribute__((no_sanitize_address, noinline)) inline void misaligned(const void *a, unsigned long long n,
                                                                      const char *op, void *pc)
{
  tstate *t = tsp();
  t->blk->rt->misaligned(t->blk->w, (unsigned long long)(uintptr_t)a, n, op, pc);
}
#define GPULUA_ATOMIC static __attribute__((noinline))
#define GPULUA_ALIGNED(a, op) \
  do { \
    if ((uintptr_t)(a) % sizeof *(a)) ::gpulua_rt::misaligned(a, sizeof *(a), op, __builtin_return_address(0)); \
  } while (0)
#else
#define GPULUA_ATOMIC static inline
#define GPULUA_ALIGNED(a, op) ((void)0)
#endif

} /* namespace gpulua_rt */

#define threadIdx (::gpulua_rt::tsp()->tid)
#define blockIdx (::gpulua_rt::tsp()->bid)
#define blockDim (::gpulua_rt::tsp()->bdim)
#define gridDim (::gpulua_rt::tsp()->gdim)

/* ---- barriers and warp primitives -------------------------------------------- */

static inline void __syncthreads() { gpulua_rt::barrier(GPULUA_BAR_SYNC, 0); }
static inline int __syncthreads_count(int p) { return gpulua_rt::barrier(GPULUA_BAR_COUNT, p != 0); }
static inline int __syncthreads_and(int p) { return gpulua_rt::barrier(GPULUA_BAR_AND, p != 0); }
static inline int __syncthreads_or(int p) { return gpulua_rt::barrier(GPULUA_BAR_OR, p != 0); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { gpulua_rt::warp(GPULUA_W_SYNC, mask, 0, 0, 32); }
static inline unsigned __activemask() { return (unsigned)gpulua_rt::warp(GPULUA_W_ACTIVE, 0, 0, 0, 32); }
static inline unsigned __ballot_sync(unsigned mask, int p)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_BALLOT, mask, p != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int p) { return (int)gpulua_rt::warp(GPULUA_W_ANY, mask, p != 0, 0, 32); }
static inline int __all_sync(unsigned mask, int p) { return (int)gpulua_rt::warp(GPULUA_W_ALL, mask, p != 0, 0, 32); }
static inline unsigned __uni_sync(unsigned mask, int p)
{
  unsigned b = __ballot_sync(mask, p);
  return b == 0 || b == (mask & __activemask());
}

namespace gpulua_rt {
template <typename T> inline unsigned long long to_bits(T v)
{
  static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
  unsigned long long b = 0;
  memcpy(&b, &v, sizeof v);
  return b;
}
template <typename T> inline T from_bits(unsigned long long b)
{
  T v;
  memcpy(&v, &b, sizeof v);
  return v;
}
template <typename T> inline T shfl(int op, unsigned mask, T v, int arg, int width)
{
  return from_bits<T>(warp(op, mask, to_bits(v), arg, width));
}
} /* namespace gpulua_rt */

template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
  return gpulua_rt::shfl(GPULUA_W_SHFL, mask, v, src, width);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
  return gpulua_rt::shfl(GPULUA_W_UP, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
  return gpulua_rt::shfl(GPULUA_W_DOWN, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
  return gpulua_rt::shfl(GPULUA_W_XOR, mask, v, lane_mask, width);
}
template <typename T> inline unsigned __match_any_sync(unsigned mask, T v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_MATCH_ANY, mask, gpulua_rt::to_bits(v), 0, 32);
}
template <typename T> inline unsigned __match_all_sync(unsigned mask, T v, int *pred)
{
  unsigned r = (unsigned)gpulua_rt::warp(GPULUA_W_MATCH_ALL, mask, gpulua_rt::to_bits(v), 0, 32);
  *pred = r != 0;
  return r;
}
static inline int __reduce_add_sync(unsigned mask, int v)
{
  return (int)gpulua_rt::warp(GPULUA_W_ADD, mask, (unsigned long long)(long long)v, 0, 32);
}
static inline unsigned __reduce_add_sync(unsigned mask, unsigned v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_ADD, mask, v, 0, 32);
}
static inline int __reduce_min_sync(unsigned mask, int v)
{
  return (int)gpulua_rt::warp(GPULUA_W_MIN, mask, (unsigned long long)(long long)v, 0, 32);
}
static inline unsigned __reduce_min_sync(unsigned mask, unsigned v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_UMIN, mask, v, 0, 32);
}
static inline int __reduce_max_sync(unsigned mask, int v)
{
  return (int)gpulua_rt::warp(GPULUA_W_MAX, mask, (unsigned long long)(long long)v, 0, 32);
}
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_UMAX, mask, v, 0, 32);
}
static inline unsigned __reduce_and_sync(unsigned mask, unsigned v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_AND, mask, v, 0, 32);
}
static inline unsigned __reduce_or_sync(unsigned mask, unsigned v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_OR, mask, v, 0, 32);
}
static inline unsigned __reduce_xor_sync(unsigned mask, unsigned v)
{
  return (unsigned)gpulua_rt::warp(GPULUA_W_XORR, mask, v, 0, 32);
}

/* memory fences: blocks run on several CPU threads */
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- assert, __trap, clock64 ------------------------------------------------ */

namespace gpulua_rt {
GPULUA_NOCHECK inline void where(char *buf, size_t n)
{
  tstate *t = tsp();
  snprintf(buf, n, "block [%u,%u,%u], thread [%u,%u,%u]", t->bid.x, t->bid.y, t->bid.z, t->tid.x, t->tid.y,
           t->tid.z);
}
[[noreturn]] GPULUA_NOCHECK inline void assert_fail(const char *expr, const char *file, unsigned line,
                                                  const char *fn)
{
  char at[96], msg[700];
  where(at, sizeof at);
  snprintf(msg, sizeof msg, "%s:%u: %s: %s: Assertion `%s` failed.", file, line, fn, at, expr);
  fail(GPULUA_FAIL_ASSERT, msg);
}
[[noreturn]] GPULUA_NOCHECK inline void trap(const char *what)
{
  char at[96], msg[200];
  where(at, sizeof at);
  snprintf(msg, sizeof msg, "%s in %s", what, at);
  fail(GPULUA_FAIL_TRAP, msg);
}
} /* namespace gpulua_rt */

#define GPULUA_ASSERT(e) ((e) ? (void)0 : ::gpulua_rt::assert_fail(#e, __FILE__, __LINE__, __func__))
#undef assert
#ifdef NDEBUG
#define assert(e) ((void)0)
#else
#define assert(e) GPULUA_ASSERT(e)
#endif

/* what a CUDA kernel declares itself to assert with */
extern "C" inline void __assertfail(const char *msg, const char *file, unsigned line, const char *fn, size_t)
{
  gpulua_rt::assert_fail(msg, file, line, fn);
}
[[noreturn]] static inline void __trap() { gpulua_rt::trap("__trap()"); }
[[noreturn]] static inline void __brkpt() { gpulua_rt::trap("__brkpt()"); }

/* the GPU's clock counts cycles; here it is nanoseconds (monotonic) */
static inline long long clock64()
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static inline void __nanosleep(unsigned ns)
{
  struct timespec ts = {0, (long)ns};
  nanosleep(&ts, nullptr);
}

/* ---- atomics: real ones, blocks run on several threads ------------------------ */

#define GPULUA_RELAXED __ATOMIC_RELAXED
#define GPULUA_ATOMIC_INT(T) \
  GPULUA_ATOMIC T atomicAdd(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicAdd"); \
    return __atomic_fetch_add(a, v, GPULUA_RELAXED); \
  } \
  GPULUA_ATOMIC T atomicSub(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicSub"); \
    return __atomic_fetch_sub(a, v, GPULUA_RELAXED); \
  } \
  GPULUA_ATOMIC T atomicExch(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicExch"); \
    return __atomic_exchange_n(a, v, GPULUA_RELAXED); \
  } \
  GPULUA_ATOMIC T atomicAnd(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicAnd"); \
    return __atomic_fetch_and(a, v, GPULUA_RELAXED); \
  } \
  GPULUA_ATOMIC T atomicOr(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicOr"); \
    return __atomic_fetch_or(a, v, GPULUA_RELAXED); \
  } \
  GPULUA_ATOMIC T atomicXor(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicXor"); \
    return __atomic_fetch_xor(a, v, GPULUA_RELAXED); \
  } \
  GPULUA_ATOMIC T atomicCAS(T *a, T cmp, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicCAS"); \
    __atomic_compare_exchange_n(a, &cmp, v, false, GPULUA_RELAXED, GPULUA_RELAXED); \
    return cmp; \
  } \
  GPULUA_ATOMIC T atomicMin(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicMin"); \
    T o = __atomic_load_n(a, GPULUA_RELAXED); \
    while (v < o && !__atomic_compare_exchange_n(a, &o, v, true, GPULUA_RELAXED, GPULUA_RELAXED)) {} \
    return o; \
  } \
  GPULUA_ATOMIC T atomicMax(T *a, T v) \
  { \
    GPULUA_ALIGNED(a, "atomicMax"); \
    T o = __atomic_load_n(a, GPULUA_RELAXED); \
    while (v > o && !__atomic_compare_exchange_n(a, &o, v, true, GPULUA_RELAXED, GPULUA_RELAXED)) {} \
    return o; \
  }
GPULUA_ATOMIC_INT(int)
GPULUA_ATOMIC_INT(unsigned int)
GPULUA_ATOMIC_INT(long long)
GPULUA_ATOMIC_INT(unsigned long long)
GPULUA_ATOMIC unsigned short atomicCAS(unsigned short *a, unsigned short cmp, unsigned short v)
{
  GPULUA_ALIGNED(a, "atomicCAS");
  __atomic_compare_exchange_n(a, &cmp, v, false, GPULUA_RELAXED, GPULUA_RELAXED);
  return cmp;
}
GPULUA_ATOMIC unsigned atomicInc(unsigned *a, unsigned lim)
{
  GPULUA_ALIGNED(a, "atomicInc");
  unsigned o = __atomic_load_n(a, GPULUA_RELAXED);
  while (!__atomic_compare_exchange_n(a, &o, o >= lim ? 0u : o + 1, true, GPULUA_RELAXED, GPULUA_RELAXED)) {}
  return o;
}
GPULUA_ATOMIC unsigned atomicDec(unsigned *a, unsigned lim)
{
  GPULUA_ALIGNED(a, "atomicDec");
  unsigned o = __atomic_load_n(a, GPULUA_RELAXED);
  while (!__atomic_compare_exchange_n(a, &o, o == 0 || o > lim ? lim : o - 1, true, GPULUA_RELAXED,
                                      GPULUA_RELAXED)) {}
  return o;
}

namespace gpulua_rt {
/* a read-modify-write of a value kept in the integer type B */
template <typename T, typename B, typename F> inline T atomic_rmw(T *a, F f)
{
  B *p = reinterpret_cast<B *>(a);
  B o = __atomic_load_n(p, GPULUA_RELAXED), n;
  for (;;) {
    T ov, nv;
    memcpy(&ov, &o, sizeof ov);
    nv = f(ov);
    memcpy(&n, &nv, sizeof n);
    if (__atomic_compare_exchange_n(p, &o, n, true, GPULUA_RELAXED, GPULUA_RELAXED)) return ov;
  }
}
} /* namespace gpulua_rt */

GPULUA_ATOMIC float atomicAdd(float *a, float v)
{
  GPULUA_ALIGNED(a, "atomicAdd");
  return gpulua_rt::atomic_rmw<float, unsigned>(a, [v](float o) { return o + v; });
}
GPULUA_ATOMIC double atomicAdd(double *a, double v)
{
  GPULUA_ALIGNED(a, "atomicAdd");
  return gpulua_rt::atomic_rmw<double, unsigned long long>(a, [v](double o) { return o + v; });
}
GPULUA_ATOMIC float atomicExch(float *a, float v)
{
  GPULUA_ALIGNED(a, "atomicExch");
  return gpulua_rt::atomic_rmw<float, unsigned>(a, [v](float) { return v; });
}
/* no atomicMax/atomicMin on float or double: CUDA has none for sm_90
 * (NVRTC: "no instance of overloaded function"), so neither does the host */
/* the scopes are all one here */
#define GPULUA_SCOPED(op) \
  template <typename... A> static inline auto op##_block(A... a) -> decltype(op(a...)) { return op(a...); } \
  template <typename... A> static inline auto op##_system(A... a) -> decltype(op(a...)) { return op(a...); }
GPULUA_SCOPED(atomicAdd) GPULUA_SCOPED(atomicSub) GPULUA_SCOPED(atomicExch) GPULUA_SCOPED(atomicMin)
GPULUA_SCOPED(atomicMax) GPULUA_SCOPED(atomicAnd) GPULUA_SCOPED(atomicOr) GPULUA_SCOPED(atomicXor)
GPULUA_SCOPED(atomicCAS) GPULUA_SCOPED(atomicInc) GPULUA_SCOPED(atomicDec)

/* ---- loads and stores with cache hints ----------------------------------------- */

template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
template <typename T> static inline T __ldca(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline T __ldlu(const T *p) { return *p; }
template <typename T> static inline T __ldcv(const T *p) { return *p; }
template <typename T> static inline void __stwb(T *p, T v) { *p = v; }
template <typename T> static inline void __stcg(T *p, T v) { *p = v; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename T> static inline void __stwt(T *p, T v) { *p = v; }

/* ---- min and max, as CUDA's global overloads -------------------------------------- */

#define GPULUA_MINMAX(T) \
  static inline T min(T a, T b) { return b < a ? b : a; } \
  static inline T max(T a, T b) { return a < b ? b : a; }
GPULUA_MINMAX(int)
GPULUA_MINMAX(unsigned int)
GPULUA_MINMAX(long)
GPULUA_MINMAX(unsigned long)
GPULUA_MINMAX(long long)
GPULUA_MINMAX(unsigned long long)
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
/* mixed operands: in their common type, as the usual conversions give */
template <typename A, typename B,
          typename = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value &&
                                             !std::is_same<A, B>::value>::type>
static inline typename std::common_type<A, B>::type min(A a, B b)
{
  typedef typename std::common_type<A, B>::type C;
  return min((C)a, (C)b);
}
template <typename A, typename B,
          typename = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value &&
                                             !std::is_same<A, B>::value>::type>
static inline typename std::common_type<A, B>::type max(A a, B b)
{
  typedef typename std::common_type<A, B>::type C;
  return max((C)a, (C)b);
}
static inline unsigned umin(unsigned a, unsigned b) { return min(a, b); }
static inline unsigned umax(unsigned a, unsigned b) { return max(a, b); }
static inline long long llmin(long long a, long long b) { return min(a, b); }
static inline long long llmax(long long a, long long b) { return max(a, b); }
static inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return min(a, b); }
static inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return max(a, b); }

/* ---- bits and reinterpretations ---------------------------------------------------- */

namespace gpulua_rt {
template <typename To, typename From> inline To bit_cast(From v)
{
  static_assert(sizeof(To) == sizeof(From), "sizes differ");
  To r;
  memcpy(&r, &v, sizeof r);
  return r;
}
} /* namespace gpulua_rt */

static inline int __float_as_int(float x) { return gpulua_rt::bit_cast<int>(x); }
static inline unsigned __float_as_uint(float x) { return gpulua_rt::bit_cast<unsigned>(x); }
static inline float __int_as_float(int x) { return gpulua_rt::bit_cast<float>(x); }
static inline float __uint_as_float(unsigned x) { return gpulua_rt::bit_cast<float>(x); }
static inline long long __double_as_longlong(double x) { return gpulua_rt::bit_cast<long long>(x); }
static inline double __longlong_as_double(long long x) { return gpulua_rt::bit_cast<double>(x); }
static inline int __double2hiint(double x) { return (int)(__double_as_longlong(x) >> 32); }
static inline int __double2loint(double x) { return (int)(unsigned)__double_as_longlong(x); }
static inline double __hiloint2double(int hi, int lo)
{
  return __longlong_as_double((long long)((unsigned long long)(unsigned)hi << 32 | (unsigned)lo));
}

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x)
{
  x = (x >> 1 & 0x55555555u) | (x & 0x55555555u) << 1;
  x = (x >> 2 & 0x33333333u) | (x & 0x33333333u) << 2;
  x = (x >> 4 & 0x0f0f0f0fu) | (x & 0x0f0f0f0fu) << 4;
  return __builtin_bswap32(x);
}
static inline unsigned long long __brevll(unsigned long long x)
{
  return (unsigned long long)__brev((unsigned)x) << 32 | __brev((unsigned)(x >> 32));
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
  unsigned long long b = (unsigned long long)y << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; i++) r |= (unsigned)(b >> (8 * (s >> (4 * i) & 7)) & 0xff) << (8 * i);
  return r;
}
static inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s)
{
  return (unsigned)(((unsigned long long)hi << 32 | lo) << (s & 31) >> 32);
}
static inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned s)
{
  return s >= 32 ? lo : (unsigned)(((unsigned long long)hi << 32 | lo) << s >> 32);
}
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s)
{
  return (unsigned)(((unsigned long long)hi << 32 | lo) >> (s & 31));
}
static inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s)
{
  return s >= 32 ? hi : (unsigned)(((unsigned long long)hi << 32 | lo) >> s);
}
static inline int __mul24(int a, int b) { return (int)((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
static inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffff) * (b & 0xffffff); }
static inline int __mulhi(int a, int b) { return (int)((long long)a * b >> 32); }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)((unsigned long long)a * b >> 32); }
static inline long long __mul64hi(long long a, long long b) { return (long long)((__int128)a * b >> 64); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}
static inline unsigned __sad(int a, int b, unsigned c) { return c + (unsigned)(a > b ? a - b : b - a); }
static inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return c + (a > b ? a - b : b - a); }
static inline int __hadd(int a, int b) { return (int)(((long long)a + b) >> 1); }
static inline int __rhadd(int a, int b) { return (int)(((long long)a + b + 1) >> 1); }
static inline unsigned __uhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b) >> 1); }
static inline unsigned __urhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b + 1) >> 1); }
static inline int __dp4a(int a, int b, int c)
{
  for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> 8 * i) * (int)(signed char)(b >> 8 * i);
  return c;
}
static inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
  for (int i = 0; i < 4; i++) c += (a >> 8 * i & 0xff) * (b >> 8 * i & 0xff);
  return c;
}

/* ---- conversions with a rounding mode, saturating as the GPU's do ------------------- */

namespace gpulua_rt {
enum { RN, RZ, RD, RU };
inline double round_mode(double x, int mode)
{
  switch (mode) {
  case RZ: return trunc(x);
  case RD: return floor(x);
  case RU: return ceil(x);
  default: {
    double f = floor(x), d = x - f;
    return d > 0.5 || (d == 0.5 && fmod(f, 2.0) != 0) ? f + 1 : f;
  }
  }
}
inline long double round_mode_l(long double x, int mode)
{
  switch (mode) {
  case RZ: return truncl(x);
  case RD: return floorl(x);
  case RU: return ceill(x);
  default: {
    long double f = floorl(x), d = x - f;
    return d > 0.5L || (d == 0.5L && fmodl(f, 2.0L) != 0) ? f + 1 : f;
  }
  }
}
template <typename I> inline I to_int(double x, int mode)
{
  if (x != x) return 0;
  double r = round_mode(x, mode);
  if (r <= (double)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
  if (r >= (double)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
  return (I)r;
}
/* a float from a wider value, rounded by mode (the arithmetic is exact in
 * long double for what reaches it: doubles and 64-bit integers) */
inline float to_float(long double x, int mode)
{
  float r = (float)x;                     /* nearest */
  if (mode == RN || r != r || (long double)r == x) return r;
  long double rr = r;
  int down = mode == RD || (mode == RZ && x > 0), up = mode == RU || (mode == RZ && x < 0);
  if (down && rr > x) return nextafterf(r, -INFINITY);
  if (up && rr < x) return nextafterf(r, INFINITY);
  return r;
}
} /* namespace gpulua_rt */

#define GPULUA_F2I(name, I, mode) \
  static inline I name(float x) { return gpulua_rt::to_int<I>(x, gpulua_rt::mode); }
#define GPULUA_D2I(name, I, mode) \
  static inline I name(double x) { return gpulua_rt::to_int<I>(x, gpulua_rt::mode); }
#define GPULUA_CVT4(M, pre, I) \
  M(pre##_rn, I, RN) M(pre##_rz, I, RZ) M(pre##_rd, I, RD) M(pre##_ru, I, RU)
GPULUA_CVT4(GPULUA_F2I, __float2int, int)
GPULUA_CVT4(GPULUA_F2I, __float2uint, unsigned)
GPULUA_CVT4(GPULUA_F2I, __float2ll, long long)
GPULUA_CVT4(GPULUA_F2I, __float2ull, unsigned long long)
GPULUA_CVT4(GPULUA_D2I, __double2int, int)
GPULUA_CVT4(GPULUA_D2I, __double2uint, unsigned)
GPULUA_CVT4(GPULUA_D2I, __double2ll, long long)
GPULUA_CVT4(GPULUA_D2I, __double2ull, unsigned long long)
#define GPULUA_I2F(name, T, mode) \
  static inline float name(T x) { return gpulua_rt::to_float((long double)x, gpulua_rt::mode); }
GPULUA_CVT4(GPULUA_I2F, __int2float, int)
GPULUA_CVT4(GPULUA_I2F, __uint2float, unsigned)
GPULUA_CVT4(GPULUA_I2F, __ll2float, long long)
GPULUA_CVT4(GPULUA_I2F, __ull2float, unsigned long long)
GPULUA_CVT4(GPULUA_I2F, __double2float, double)
static inline double __int2double_rn(int x) { return x; }
static inline double __uint2double_rn(unsigned x) { return x; }
static inline double __ll2double_rn(long long x) { return (double)x; }
static inline double __ull2double_rn(unsigned long long x) { return (double)x; }
static inline float __float2float_rn(float x) { return x; }

/* the math API, __half and __nv_bfloat16: the build puts that file here in
 * the copy libgpulua embeds */
#include "cuda_device_math.h"

/* ---- entry points ---------------------------------------------------------- */

namespace gpulua_rt {

template <typename P> GPULUA_NOCHECK inline typename std::decay<P>::type load_arg(const void *p)
{
  typename std::decay<P>::type v;
  memcpy((void *)&v, p, sizeof v);
  return v;
}

GPULUA_NOCHECK inline void enter(const gpulua_hk_block *b)
{
  tstate *t = tsp();
  t->blk = b;
  t->dyn = b->dyn;
  t->gdim = dim3(b->grid[0], b->grid[1], b->grid[2]);
  t->bdim = dim3(b->block[0], b->block[1], b->block[2]);
}

GPULUA_NOCHECK inline uint3 block_index(const gpulua_hk_block *b, unsigned long long l)
{
  unsigned long long gx = b->grid[0], gy = b->grid[1];
  return uint3{(unsigned)(l % gx), (unsigned)(l / gx % gy), (unsigned)(l / gx / gy)};
}

template <typename F> struct kernel_of;
template <typename... P> struct kernel_of<void (*)(P...)> {
  static constexpr unsigned sizes[sizeof...(P) + 1] = {(unsigned)sizeof(typename std::decay<P>::type)..., 0u};

  /* (the loop touches only its own copies: under GPULUA_KERNEL_CHECK it is
   * checked code, and the block description is libgpulua's memory) */
  template <void (*F)(P...), size_t... I>
  GPULUA_NOCHECK static void blocks_(const gpulua_hk_block *b, std::index_sequence<I...>)
  {
    enter(b);
    const unsigned bx = b->block[0], by = b->block[1], bz = b->block[2];
    const unsigned long long first = b->first, last = b->last, gx = b->grid[0], gy = b->grid[1];
    [=](typename std::decay<P>::type... a) {
      tstate *t = tsp();
      for (unsigned long long l = first; l < last; l++) {
        t->bid = uint3{(unsigned)(l % gx), (unsigned)(l / gx % gy), (unsigned)(l / gx / gy)};
        for (unsigned z = 0; z < bz; z++)
          for (unsigned y = 0; y < by; y++)
            for (unsigned x = 0; x < bx; x++) {
              t->tid = uint3{x, y, z};
              F(a...);
            }
      }
    }(load_arg<P>(b->args[I])...);
  }
  template <void (*F)(P...)> static void blocks(const gpulua_hk_block *b)
  {
    blocks_<F>(b, std::index_sequence_for<P...>());
  }

  template <void (*F)(P...), size_t... I>
  GPULUA_NOCHECK static void thread_(const gpulua_hk_block *b, unsigned long long l, unsigned th,
                                     std::index_sequence<I...>)
  {
    enter(b);
    tstate *t = tsp();
    t->bid = block_index(b, l);
    unsigned bx = b->block[0], by = b->block[1];
    t->tid = uint3{th % bx, th / bx % by, th / bx / by};
    F(load_arg<P>(b->args[I])...);
  }
  template <void (*F)(P...)> static void thread(const gpulua_hk_block *b, unsigned long long l, unsigned th)
  {
    thread_<F>(b, l, th, std::index_sequence_for<P...>());
  }

  template <void (*F)(P...)> static constexpr gpulua_hk_kernel make(const char *name, int fibers)
  {
    return gpulua_hk_kernel{name, (int)sizeof...(P), sizes, &blocks<F>, &thread<F>, fibers};
  }
};
template <typename... P> constexpr unsigned kernel_of<void (*)(P...)>::sizes[sizeof...(P) + 1];

} /* namespace gpulua_rt */

/* For libgpulua's messages: where the failing thread is; this thread's
 * block of thread-local storage, allocated (the module's __shared__). */
extern "C" __attribute__((visibility("default"))) GPULUA_NOCHECK void gpulua_hk_where(char *buf, unsigned long n)
{
  gpulua_rt::where(buf, n);
}
extern "C" __attribute__((visibility("default"))) GPULUA_NOCHECK void *gpulua_hk_tls_probe(void)
{
  return gpulua_rt::tsp();
}

#ifdef GPULUA_KCHECK
/* GPULUA_KERNEL_CHECK: the compiler calls these before each load and store
 * of the user's code (-fsanitize=kernel-address, every check a call); an
 * access must fall in one of the block's ranges: the tensors passed (the
 * const ones read only), the stacks, shared memory, the module's data. */
namespace gpulua_rt {
__attribute__((no_sanitize_address, noinline)) inline void check(unsigned long a, unsigned long n, int write,
                                                                 void *pc)
{
  const gpulua_hk_block *b = tsp()->blk;
  if (!b) return;                           /* outside a kernel: the module's start-up */
  for (int i = 0; i < b->nranges; i++) {
    const gpulua_hk_range *r = &b->ranges[i];
    if (a >= r->lo && a + n <= r->hi && a + n >= a && (!write || r->write)) return;
  }
  b->rt->bad_access(b->w, a, n, write, pc);
}
} /* namespace gpulua_rt */
/* (the compiler's own declarations: void *, long; the module is linked
 * -Bsymbolic, so its calls reach these and never another's) */
#define GPULUA_ACCESS(kind, n, write) \
  extern "C" __attribute__((no_sanitize_address, noinline)) void __asan_##kind##n##_noabort(void *a) \
  { \
    gpulua_rt::check((unsigned long)a, n, write, __builtin_return_address(0)); \
  }
GPULUA_ACCESS(load, 1, 0) GPULUA_ACCESS(load, 2, 0) GPULUA_ACCESS(load, 4, 0) GPULUA_ACCESS(load, 8, 0)
GPULUA_ACCESS(load, 16, 0) GPULUA_ACCESS(store, 1, 1) GPULUA_ACCESS(store, 2, 1) GPULUA_ACCESS(store, 4, 1)
GPULUA_ACCESS(store, 8, 1) GPULUA_ACCESS(store, 16, 1)
extern "C" __attribute__((no_sanitize_address, noinline)) void __asan_handle_no_return(void) {}
extern "C" __attribute__((no_sanitize_address, noinline)) void __asan_loadN_noabort(void *a, long n)
{
  gpulua_rt::check((unsigned long)a, (unsigned long)n, 0, __builtin_return_address(0));
}
extern "C" __attribute__((no_sanitize_address, noinline)) void __asan_storeN_noabort(void *a, long n)
{
  gpulua_rt::check((unsigned long)a, (unsigned long)n, 1, __builtin_return_address(0));
}
#endif

/* The generated trailer: one GPULUA_HK_KERNEL per launchable kernel (FIBERS:
 * whether its source may reach a barrier or warp primitive), then
 * GPULUA_HK_MODULE listing them. */
#define GPULUA_HK_KERNEL(I, F, NAME, FIBERS) \
  extern "C" __attribute__((visibility("default"))) const gpulua_hk_kernel gpulua_hk_k##I = \
    ::gpulua_rt::kernel_of<decltype(&F)>::make<&F>(NAME, FIBERS);
#ifdef GPULUA_KCHECK
#define GPULUA_HK_FLAGS GPULUA_HK_CHECKED
#else
#define GPULUA_HK_FLAGS 0u
#endif
#define GPULUA_HK_MODULE(N, ...) \
  static const gpulua_hk_kernel *const gpulua_hk_list[] = {__VA_ARGS__}; \
  extern "C" __attribute__((visibility("default"))) const gpulua_hk_module gpulua_hk_mod = \
    {GPULUA_HK_ABI, GPULUA_HK_FLAGS, N, gpulua_hk_list};

#endif /* GPULUA_HK_ABI_ONLY */
#endif /* GPULUA_CUDA_RT_H */
