/* gpulua_cuda_rt.h: the CUDA device-side vocabulary for kernels compiled by
 * the host backend (gpu.compile without a GPU).  libgpulua embeds this file
 * and hands it to the system C++ compiler with -include, so the same CUDA C
 * source compiles for the CPU; cuda/host/kexec.c runs what it builds.
 *
 * Part 1 (C): the interface between libgpulua and a compiled module; kexec.c
 * includes only this part (GPULUA_HK_ABI_ONLY).  Part 2 (C++): threadIdx and
 * friends, __shared__, barriers and warp primitives (through libgpulua's
 * fiber scheduler), atomics, the math API, __half and __nv_bfloat16, printf,
 * assert and clock64, and the per-kernel entry points the generated trailer
 * instantiates.  Kept free of the character pair that C trigraphs start
 * with: the build turns this file into a C string literal. */
#ifndef GPULUA_CUDA_RT_H
#define GPULUA_CUDA_RT_H

/* ---- part 1: the interface ------------------------------------------------ */

/* Bumped whenever anything below changes layout or meaning. */
#define GPULUA_HK_ABI 1

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
  int param;                    /* the kernel parameter it is (0-based), -1 none */
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
  static inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, GPULUA_RELAXED); } \
  static inline T atomicSub(T *a, T v) { return __atomic_fetch_sub(a, v, GPULUA_RELAXED); } \
  static inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, GPULUA_RELAXED); } \
  static inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, GPULUA_RELAXED); } \
  static inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, GPULUA_RELAXED); } \
  static inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, GPULUA_RELAXED); } \
  static inline T atomicCAS(T *a, T cmp, T v) \
  { \
    __atomic_compare_exchange_n(a, &cmp, v, false, GPULUA_RELAXED, GPULUA_RELAXED); \
    return cmp; \
  } \
  static inline T atomicMin(T *a, T v) \
  { \
    T o = __atomic_load_n(a, GPULUA_RELAXED); \
    while (v < o && !__atomic_compare_exchange_n(a, &o, v, true, GPULUA_RELAXED, GPULUA_RELAXED)) {} \
    return o; \
  } \
  static inline T atomicMax(T *a, T v) \
  { \
    T o = __atomic_load_n(a, GPULUA_RELAXED); \
    while (v > o && !__atomic_compare_exchange_n(a, &o, v, true, GPULUA_RELAXED, GPULUA_RELAXED)) {} \
    return o; \
  }
GPULUA_ATOMIC_INT(int)
GPULUA_ATOMIC_INT(unsigned int)
GPULUA_ATOMIC_INT(long long)
GPULUA_ATOMIC_INT(unsigned long long)
static inline unsigned short atomicCAS(unsigned short *a, unsigned short cmp, unsigned short v)
{
  __atomic_compare_exchange_n(a, &cmp, v, false, GPULUA_RELAXED, GPULUA_RELAXED);
  return cmp;
}
static inline unsigned atomicInc(unsigned *a, unsigned lim)
{
  unsigned o = __atomic_load_n(a, GPULUA_RELAXED);
  while (!__atomic_compare_exchange_n(a, &o, o >= lim ? 0u : o + 1, true, GPULUA_RELAXED, GPULUA_RELAXED)) {}
  return o;
}
static inline unsigned atomicDec(unsigned *a, unsigned lim)
{
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

static inline float atomicAdd(float *a, float v)
{
  return gpulua_rt::atomic_rmw<float, unsigned>(a, [v](float o) { return o + v; });
}
static inline double atomicAdd(double *a, double v)
{
  return gpulua_rt::atomic_rmw<double, unsigned long long>(a, [v](double o) { return o + v; });
}
static inline float atomicExch(float *a, float v)
{
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

/* ---- the math API ------------------------------------------------------------------- */
/* The C library has most (expf, tanhf, erff, sincosf, exp10f, ...); these
 * are CUDA's own.  Operations with a rounding suffix round to nearest unless
 * it is _rn... for the rest: _rz/_rd/_ru are computed exactly in double and
 * then rounded as asked. */

namespace gpulua_rt {
inline double erfinv(double y)
{
  if (y != y || y < -1 || y > 1) return NAN;
  if (y == 1) return INFINITY;
  if (y == -1) return -INFINITY;
  /* M. Giles' single-precision approximation, then Newton on erf */
  double w = -log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    double p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w; p = 1.50140941 + p * w;
    x = p * y;
  } else {
    w = sqrt(w) - 3.0;
    double p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w; p = 2.83297682 + p * w;
    x = p * y;
  }
  for (int i = 0; i < 3; i++) {
    double e = erf(x) - y;
    x -= e / (1.1283791670955126 * exp(-x * x));
  }
  return x;
}
inline double erfcinv(double y)
{
  if (y != y || y < 0 || y > 2) return NAN;
  if (y == 0) return INFINITY;
  if (y == 2) return -INFINITY;
  if (y > 1) return -erfcinv(2 - y);
  if (y > 0.0625) return erfinv(1.0 - y);
  /* the tail: Newton on log(erfc(x)) = log(y) */
  double x = sqrt(-log(y)), ly = log(y);
  for (int i = 0; i < 100; i++) {
    double ec = erfc(x), d = -1.1283791670955126 * exp(-x * x) / ec;
    if (!(ec > 0) || !(d < 0)) break;
    double nx = x - (log(ec) - ly) / d;
    if (fabs(nx - x) <= 1e-16 * x) { x = nx; break; }
    x = nx;
  }
  return x;
}
inline double erfcx(double x)
{
  if (x < 25) return exp(x * x) * erfc(x);
  double r = 1 / (x * x);
  return 0.5641895835477563 / x * (1 - 0.5 * r + 0.75 * r * r - 1.875 * r * r * r);
}
} /* namespace gpulua_rt */

static inline float rsqrtf(float x) { return (float)(1.0 / sqrt((double)x)); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return (float)(1.0 / cbrt((double)x)); }
static inline double rcbrt(double x) { return 1.0 / cbrt(x); }
static inline double sinpi(double x) { return fmod(x, 1.0) == 0 ? copysign(0.0, x) : sin(M_PI * x); }
static inline double cospi(double x) { return fmod(x + 0.5, 1.0) == 0 ? 0.0 : cos(M_PI * x); }
static inline float sinpif(float x) { return (float)sinpi(x); }
static inline float cospif(float x) { return (float)cospi(x); }
static inline void sincospi(double x, double *s, double *c) { *s = sinpi(x); *c = cospi(x); }
static inline void sincospif(float x, float *s, float *c) { *s = sinpif(x); *c = cospif(x); }
static inline double normcdf(double x) { return 0.5 * erfc(-x * 0.7071067811865476); }
static inline float normcdff(float x) { return (float)normcdf(x); }
static inline double erfinv(double x) { return gpulua_rt::erfinv(x); }
static inline float erfinvf(float x) { return (float)gpulua_rt::erfinv(x); }
static inline double erfcinv(double x) { return gpulua_rt::erfcinv(x); }
static inline float erfcinvf(float x) { return (float)gpulua_rt::erfcinv(x); }
static inline double normcdfinv(double x) { return -1.4142135623730951 * gpulua_rt::erfcinv(2 * x); }
static inline float normcdfinvf(float x) { return (float)normcdfinv(x); }
static inline double erfcx(double x) { return gpulua_rt::erfcx(x); }
static inline float erfcxf(float x) { return (float)gpulua_rt::erfcx(x); }
static inline double rhypot(double x, double y) { return 1 / hypot(x, y); }
static inline float rhypotf(float x, float y) { return (float)(1 / hypot((double)x, (double)y)); }
static inline double norm3d(double a, double b, double c) { return sqrt(a * a + b * b + c * c); }
static inline float norm3df(float a, float b, float c) { return (float)norm3d(a, b, c); }
static inline double rnorm3d(double a, double b, double c) { return 1 / norm3d(a, b, c); }
static inline float rnorm3df(float a, float b, float c) { return (float)rnorm3d(a, b, c); }
static inline double norm4d(double a, double b, double c, double d) { return sqrt(a * a + b * b + c * c + d * d); }
static inline float norm4df(float a, float b, float c, float d) { return (float)norm4d(a, b, c, d); }
static inline double rnorm4d(double a, double b, double c, double d) { return 1 / norm4d(a, b, c, d); }
static inline float rnorm4df(float a, float b, float c, float d) { return (float)rnorm4d(a, b, c, d); }
static inline double norm(int n, const double *a)
{
  double s = 0;
  for (int i = 0; i < n; i++) s += a[i] * a[i];
  return sqrt(s);
}
static inline float normf(int n, const float *a)
{
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)a[i] * a[i];
  return (float)sqrt(s);
}
static inline double rnorm(int n, const double *a) { return 1 / norm(n, a); }
static inline float rnormf(int n, const float *a) { return 1 / normf(n, a); }
static inline float fdividef(float a, float b) { return a / b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; }
/* the C library declares these names itself (its internal aliases) */
#define __expf expf
#define __exp10f exp10f
#define __logf logf
#define __log2f log2f
#define __log10f log10f
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __sincosf sincosf
#define __powf powf
#define __tanhf tanhf
#define GPULUA_FOP4(name, expr) \
  static inline float name##_rn(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RN); } \
  static inline float name##_rz(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RZ); } \
  static inline float name##_rd(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RD); } \
  static inline float name##_ru(float a, float b) { return gpulua_rt::to_float(expr, gpulua_rt::RU); }
GPULUA_FOP4(__fadd, (long double)a + b)
GPULUA_FOP4(__fsub, (long double)a - b)
GPULUA_FOP4(__fmul, (long double)a * b)
GPULUA_FOP4(__fdiv, (long double)a / b)
#define GPULUA_FUN4(name, expr) \
  static inline float name##_rn(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RN); } \
  static inline float name##_rz(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RZ); } \
  static inline float name##_rd(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RD); } \
  static inline float name##_ru(float a) { return gpulua_rt::to_float(expr, gpulua_rt::RU); }
GPULUA_FUN4(__frcp, 1.0L / a)
GPULUA_FUN4(__fsqrt, sqrtl((long double)a))
static inline float __frsqrt_rn(float a) { return (float)(1.0 / sqrt((double)a)); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmaf_rz(float a, float b, float c) { return gpulua_rt::to_float(fmal(a, b, c), gpulua_rt::RZ); }
static inline float __fmaf_rd(float a, float b, float c) { return gpulua_rt::to_float(fmal(a, b, c), gpulua_rt::RD); }
static inline float __fmaf_ru(float a, float b, float c) { return gpulua_rt::to_float(fmal(a, b, c), gpulua_rt::RU); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

/* math_constants.h */
#define CUDART_INF_F INFINITY
#define CUDART_NAN_F NAN
#define CUDART_MIN_DENORM_F 1.40129846e-45f
#define CUDART_MAX_NORMAL_F FLT_MAX
#define CUDART_NEG_ZERO_F (-0.0f)
#define CUDART_ZERO_F 0.0f
#define CUDART_ONE_F 1.0f
#define CUDART_SQRT_HALF_F 0.707106781f
#define CUDART_SQRT_TWO_F 1.414213562f
#define CUDART_THIRD_F 0.333333333f
#define CUDART_PIO4_F 0.785398163f
#define CUDART_PIO2_F 1.570796327f
#define CUDART_3PIO4_F 2.356194490f
#define CUDART_2_OVER_PI_F 0.636619772f
#define CUDART_PI_F 3.141592654f
#define CUDART_L2E_F 1.442695041f
#define CUDART_L2T_F 3.321928094f
#define CUDART_LG2_F 0.301029996f
#define CUDART_LGE_F 0.434294482f
#define CUDART_LN2_F 0.693147181f
#define CUDART_LNT_F 2.302585093f
#define CUDART_LNPI_F 1.144729886f
#define CUDART_TWO_TO_M126_F 1.175494351e-38f
#define CUDART_TWO_TO_126_F 8.507059173e37f
#define CUDART_NORM_HUGE_F 3.402823466e38f
#define CUDART_TWO_TO_23_F 8388608.0f
#define CUDART_TWO_TO_24_F 16777216.0f
#define CUDART_TWO_TO_31_F 2147483648.0f
#define CUDART_TWO_TO_32_F 4294967296.0f
#define CUDART_REMQUO_BITS_F 3
#define CUDART_TRIG_PLOSS_F 105615.0f
#define CUDART_INF INFINITY
#define CUDART_NAN NAN
#define CUDART_NEG_ZERO (-0.0)
#define CUDART_ZERO 0.0
#define CUDART_ONE 1.0
#define CUDART_SQRT_TWO 1.4142135623730951
#define CUDART_SQRT_HALF 0.7071067811865476
#define CUDART_SQRT_2PI 2.5066282746310002
#define CUDART_SQRT_PIO2 1.2533141373155003
#define CUDART_SQRT_2OPI 0.7978845608028654
#define CUDART_THIRD 0.3333333333333333
#define CUDART_TWOTHIRD 0.6666666666666666
#define CUDART_PIO4 0.7853981633974483
#define CUDART_PIO2 1.5707963267948966
#define CUDART_3PIO4 2.356194490192345
#define CUDART_PI 3.141592653589793
#define CUDART_2PI 6.283185307179586
#define CUDART_L2E 1.4426950408889634
#define CUDART_L2T 3.321928094887362
#define CUDART_LG2 0.3010299956639812
#define CUDART_LGE 0.4342944819032518
#define CUDART_LN2 0.6931471805599453
#define CUDART_LNT 2.302585092994046
#define CUDART_LNPI 1.1447298858494002
#define CUDART_TWO_TO_53 9007199254740992.0
#define CUDART_TWO_TO_54 18014398509481984.0
#define CUDART_TWO_TO_63 9223372036854775808.0
#define CUDART_TWO_TO_64 18446744073709551616.0

/* ---- __half and __nv_bfloat16 ---------------------------------------------------------- */

namespace gpulua_rt {
/* x rounded by mode to a binary float with p significant bits, minimum
 * normal exponent emin and largest finite value fmax; its bits (sign,
 * exponent, p-1 mantissa bits).  Exact arithmetic in long double. */
inline unsigned short to_f16_bits(long double x, int mode, int p, int emin, int ebits)
{
  if (x != x) return 0x7fff;                /* the canonical NaN, as CUDA's */
  unsigned short sign = signbit(x) ? (unsigned short)(1u << (p - 1 + ebits)) : 0;
  unsigned short expmask = (unsigned short)(((1u << ebits) - 1) << (p - 1));
  int m = p - 1, bias = 1 - emin, emax = (1 << ebits) - 2 - bias;
  long double a = fabsl(x), fmax = ldexpl(2.0L - ldexpl(1.0L, -m), emax);
  /* on the magnitude: toward -inf is away from zero for a negative x */
  int md = sign && mode == RD ? RU : sign && mode == RU ? RD : mode;
  if (a == INFINITY) return (unsigned short)(sign | expmask);
  if (a == 0) return sign;
  int e;
  frexpl(a, &e);
  e -= 1;                                   /* a in [2^e, 2^(e+1)) */
  int q = e < emin ? emin - m : e - m;      /* the weight of the last mantissa bit */
  long double r = ldexpl(round_mode_l(ldexpl(a, -q), md), q);
  if (r > fmax) {
    if (md == RN || md == RU) return (unsigned short)(sign | expmask);
    r = fmax;
  }
  if (r == 0) return sign;
  frexpl(r, &e);
  e -= 1;
  if (e < emin) return (unsigned short)(sign | (unsigned short)ldexpl(r, m - emin));
  unsigned short mant = (unsigned short)(ldexpl(r, m - e) - ldexpl(1.0L, m));
  return (unsigned short)(sign | (unsigned short)((e + bias) << m) | mant);
}
inline float from_f16_bits(unsigned short b, int p, int emin, int ebits)
{
  int m = p - 1, bias = 1 - emin;
  unsigned e = (unsigned)(b >> m) & ((1u << ebits) - 1), mant = b & ((1u << m) - 1);
  float s = (b >> (m + ebits)) ? -1.0f : 1.0f;
  if (e == (1u << ebits) - 1) return mant ? NAN : s * INFINITY;
  if (e == 0) return s * ldexpf((float)mant, emin - m);
  return s * ldexpf((float)(mant | (1u << m)), (int)e - bias - m);
}
inline unsigned short h_bits(long double x, int mode) { return to_f16_bits(x, mode, 11, -14, 5); }
inline unsigned short b_bits(long double x, int mode) { return to_f16_bits(x, mode, 8, -126, 8); }
inline float h_float(unsigned short b) { return from_f16_bits(b, 11, -14, 5); }
inline float b_float(unsigned short b)
{
  unsigned u = (unsigned)b << 16;
  if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) u |= 0x400000;
  return bit_cast<float>(u);
}
struct raw16 { unsigned short x; };
} /* namespace gpulua_rt */

typedef struct __half_raw { unsigned short x; } __half_raw;
typedef struct __nv_bfloat16_raw { unsigned short x; } __nv_bfloat16_raw;

/* T: the type; B: its bits from a long double by mode; F: its value */
#define GPULUA_F16_TYPE(T, RAW, B, F) \
  struct __attribute__((aligned(2))) T { \
    unsigned short __x; \
    T() = default; \
    constexpr T(RAW r) : __x(r.x) {} \
    T(float f) : __x(gpulua_rt::B(f, gpulua_rt::RN)) {} \
    T(double d) : __x(gpulua_rt::B(d, gpulua_rt::RN)) {} \
    T(int i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(unsigned i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(long long i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(unsigned long long i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(short i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    T(unsigned short i) : __x(gpulua_rt::B(i, gpulua_rt::RN)) {} \
    operator float() const { return gpulua_rt::F(__x); } \
    operator RAW() const { RAW r; r.x = __x; return r; } \
    T &operator=(float f) { __x = gpulua_rt::B(f, gpulua_rt::RN); return *this; } \
    T &operator=(double d) { __x = gpulua_rt::B(d, gpulua_rt::RN); return *this; } \
    T &operator=(RAW r) { __x = r.x; return *this; } \
  };
GPULUA_F16_TYPE(__half, __half_raw, h_bits, h_float)
GPULUA_F16_TYPE(__nv_bfloat16, __nv_bfloat16_raw, b_bits, b_float)
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct __attribute__((aligned(4))) __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(__half a, __half b) : x(a), y(b) {}
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

namespace gpulua_rt {
inline __half mkh(unsigned short b) { __half h; h.__x = b; return h; }
inline __nv_bfloat16 mkb(unsigned short b) { __nv_bfloat16 h; h.__x = b; return h; }
inline __half rnd(__half, long double x) { return mkh(h_bits(x, RN)); }
inline __nv_bfloat16 rnd(__nv_bfloat16, long double x) { return mkb(b_bits(x, RN)); }
} /* namespace gpulua_rt */

/* conversions of __half */
static inline float __half2float(__half h) { return gpulua_rt::h_float(h.__x); }
static inline __half __float2half(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RN)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline __half __float2half_rz(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RZ)); }
static inline __half __float2half_rd(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RD)); }
static inline __half __float2half_ru(float f) { return gpulua_rt::mkh(gpulua_rt::h_bits(f, gpulua_rt::RU)); }
static inline __half __double2half(double d) { return gpulua_rt::mkh(gpulua_rt::h_bits(d, gpulua_rt::RN)); }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __short_as_half(short s) { return gpulua_rt::mkh((unsigned short)s); }
static inline __half __ushort_as_half(unsigned short s) { return gpulua_rt::mkh(s); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half(a), __float2half(b)); }
static inline __half2 __float2half2_rn(float a) { return __half2(__float2half(a), __float2half(a)); }
static inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline __half2 make_half2(__half a, __half b) { return __half2(a, b); }
/* conversions of __nv_bfloat16 */
static inline float __bfloat162float(__nv_bfloat16 h) { return gpulua_rt::b_float(h.__x); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RN)); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RZ)); }
static inline __nv_bfloat16 __float2bfloat16_rd(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RD)); }
static inline __nv_bfloat16 __float2bfloat16_ru(float f) { return gpulua_rt::mkb(gpulua_rt::b_bits(f, gpulua_rt::RU)); }
static inline __nv_bfloat16 __double2bfloat16(double d) { return gpulua_rt::mkb(gpulua_rt::b_bits(d, gpulua_rt::RN)); }
static inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __short_as_bfloat16(short s) { return gpulua_rt::mkb((unsigned short)s); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { return gpulua_rt::mkb(s); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
  return __nv_bfloat162(__float2bfloat16(a), __float2bfloat16(b));
}
static inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __floats2bfloat162_rn(a, a); }
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h)
{
  return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
static inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }

/* integers to and from both, with rounding modes */
#define GPULUA_H_FROM(name, I, B, MK, mode) \
  static inline decltype(gpulua_rt::MK(0)) name(I i) { return gpulua_rt::MK(gpulua_rt::B((long double)i, gpulua_rt::mode)); }
#define GPULUA_H_TO(name, T, I, F, mode) \
  static inline I name(T h) { return gpulua_rt::to_int<I>(gpulua_rt::F(h.__x), gpulua_rt::mode); }
#define GPULUA_H_INTS(T, S, B, MK, F) \
  GPULUA_H_FROM(__int2##S##_rn, int, B, MK, RN) GPULUA_H_FROM(__int2##S##_rz, int, B, MK, RZ) \
  GPULUA_H_FROM(__int2##S##_rd, int, B, MK, RD) GPULUA_H_FROM(__int2##S##_ru, int, B, MK, RU) \
  GPULUA_H_FROM(__uint2##S##_rn, unsigned, B, MK, RN) GPULUA_H_FROM(__short2##S##_rn, short, B, MK, RN) \
  GPULUA_H_FROM(__ushort2##S##_rn, unsigned short, B, MK, RN) GPULUA_H_FROM(__ll2##S##_rn, long long, B, MK, RN) \
  GPULUA_H_FROM(__ull2##S##_rn, unsigned long long, B, MK, RN) \
  GPULUA_H_TO(__##S##2int_rn, T, int, F, RN) GPULUA_H_TO(__##S##2int_rz, T, int, F, RZ) \
  GPULUA_H_TO(__##S##2int_rd, T, int, F, RD) GPULUA_H_TO(__##S##2int_ru, T, int, F, RU) \
  GPULUA_H_TO(__##S##2uint_rn, T, unsigned, F, RN) GPULUA_H_TO(__##S##2uint_rz, T, unsigned, F, RZ) \
  GPULUA_H_TO(__##S##2short_rn, T, short, F, RN) GPULUA_H_TO(__##S##2short_rz, T, short, F, RZ) \
  GPULUA_H_TO(__##S##2ushort_rn, T, unsigned short, F, RN) GPULUA_H_TO(__##S##2ushort_rz, T, unsigned short, F, RZ) \
  GPULUA_H_TO(__##S##2ll_rn, T, long long, F, RN) GPULUA_H_TO(__##S##2ll_rz, T, long long, F, RZ) \
  GPULUA_H_TO(__##S##2ull_rn, T, unsigned long long, F, RN) GPULUA_H_TO(__##S##2ull_rz, T, unsigned long long, F, RZ)
GPULUA_H_INTS(__half, half, h_bits, mkh, h_float)
GPULUA_H_INTS(__nv_bfloat16, bfloat16, b_bits, mkb, b_float)

/* Arithmetic shared by both (CUDA overloads the names): each operation is
 * exact in long double and rounded once. */
#define GPULUA_F16_OPS(T, T2) \
  static inline float gpulua_f(T a) { return (float)a; } \
  static inline T __hadd(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a + (float)b); } \
  static inline T __hsub(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a - (float)b); } \
  static inline T __hmul(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a * (float)b); } \
  static inline T __hdiv(T a, T b) { return gpulua_rt::rnd(a, (long double)(float)a / (float)b); } \
  static inline T __hfma(T a, T b, T c) { return gpulua_rt::rnd(a, fmal((float)a, (float)b, (float)c)); } \
  static inline T __hadd_rn(T a, T b) { return __hadd(a, b); } \
  static inline T __hsub_rn(T a, T b) { return __hsub(a, b); } \
  static inline T __hmul_rn(T a, T b) { return __hmul(a, b); } \
  static inline T gpulua_sat(T a) { float f = (float)a; return T(f != f ? 0.0f : f < 0 ? 0.0f : f > 1 ? 1.0f : f); } \
  static inline T __hadd_sat(T a, T b) { return gpulua_sat(__hadd(a, b)); } \
  static inline T __hsub_sat(T a, T b) { return gpulua_sat(__hsub(a, b)); } \
  static inline T __hmul_sat(T a, T b) { return gpulua_sat(__hmul(a, b)); } \
  static inline T __hfma_sat(T a, T b, T c) { return gpulua_sat(__hfma(a, b, c)); } \
  static inline T __hneg(T a) { T r = a; r.__x ^= 0x8000; return r; } \
  static inline T __habs(T a) { T r = a; r.__x &= 0x7fff; return r; } \
  static inline bool __hisnan(T a) { float f = (float)a; return f != f; } \
  static inline int __hisinf(T a) { float f = (float)a; return f == INFINITY ? 1 : f == -INFINITY ? -1 : 0; } \
  static inline T __hmax(T a, T b) { return T(fmaxf((float)a, (float)b)); } \
  static inline T __hmin(T a, T b) { return T(fminf((float)a, (float)b)); } \
  static inline T __hmax_nan(T a, T b) { return __hisnan(a) ? a : __hisnan(b) ? b : __hmax(a, b); } \
  static inline T __hmin_nan(T a, T b) { return __hisnan(a) ? a : __hisnan(b) ? b : __hmin(a, b); } \
  static inline bool __heq(T a, T b) { return (float)a == (float)b; } \
  static inline bool __hne(T a, T b) { return !__hisnan(a) && !__hisnan(b) && (float)a != (float)b; } \
  static inline bool __hlt(T a, T b) { return (float)a < (float)b; } \
  static inline bool __hle(T a, T b) { return (float)a <= (float)b; } \
  static inline bool __hgt(T a, T b) { return (float)a > (float)b; } \
  static inline bool __hge(T a, T b) { return (float)a >= (float)b; } \
  static inline bool __hequ(T a, T b) { return !((float)a != (float)b); } \
  static inline bool __hneu(T a, T b) { return (float)a != (float)b; } \
  static inline bool __hltu(T a, T b) { return !((float)a >= (float)b); } \
  static inline bool __hleu(T a, T b) { return !((float)a > (float)b); } \
  static inline bool __hgtu(T a, T b) { return !((float)a <= (float)b); } \
  static inline bool __hgeu(T a, T b) { return !((float)a < (float)b); } \
  static inline T hsqrt(T a) { return gpulua_rt::rnd(a, sqrtl((float)a)); } \
  static inline T hrsqrt(T a) { return T(1.0 / sqrt((double)(float)a)); } \
  static inline T hrcp(T a) { return gpulua_rt::rnd(a, 1.0L / (float)a); } \
  static inline T hexp(T a) { return T(exp((double)(float)a)); } \
  static inline T hexp2(T a) { return T(exp2((double)(float)a)); } \
  static inline T hexp10(T a) { return T(exp10((double)(float)a)); } \
  static inline T hlog(T a) { return T(log((double)(float)a)); } \
  static inline T hlog2(T a) { return T(log2((double)(float)a)); } \
  static inline T hlog10(T a) { return T(log10((double)(float)a)); } \
  static inline T hsin(T a) { return T(sin((double)(float)a)); } \
  static inline T hcos(T a) { return T(cos((double)(float)a)); } \
  static inline T htanh(T a) { return T(tanh((double)(float)a)); } \
  static inline T hceil(T a) { return T(ceilf((float)a)); } \
  static inline T hfloor(T a) { return T(floorf((float)a)); } \
  static inline T htrunc(T a) { return T(truncf((float)a)); } \
  static inline T hrint(T a) { return T(rintf((float)a)); } \
  static inline T operator+(const T &a, const T &b) { return __hadd(a, b); } \
  static inline T operator-(const T &a, const T &b) { return __hsub(a, b); } \
  static inline T operator*(const T &a, const T &b) { return __hmul(a, b); } \
  static inline T operator/(const T &a, const T &b) { return __hdiv(a, b); } \
  static inline T &operator+=(T &a, const T &b) { return a = __hadd(a, b); } \
  static inline T &operator-=(T &a, const T &b) { return a = __hsub(a, b); } \
  static inline T &operator*=(T &a, const T &b) { return a = __hmul(a, b); } \
  static inline T &operator/=(T &a, const T &b) { return a = __hdiv(a, b); } \
  static inline T operator+(const T &a) { return a; } \
  static inline T operator-(const T &a) { return __hneg(a); } \
  static inline bool operator==(const T &a, const T &b) { return __heq(a, b); } \
  static inline bool operator!=(const T &a, const T &b) { return __hneu(a, b); } \
  static inline bool operator<(const T &a, const T &b) { return __hlt(a, b); } \
  static inline bool operator<=(const T &a, const T &b) { return __hle(a, b); } \
  static inline bool operator>(const T &a, const T &b) { return __hgt(a, b); } \
  static inline bool operator>=(const T &a, const T &b) { return __hge(a, b); } \
  static inline T2 __hadd2(T2 a, T2 b) { return T2(__hadd(a.x, b.x), __hadd(a.y, b.y)); } \
  static inline T2 __hsub2(T2 a, T2 b) { return T2(__hsub(a.x, b.x), __hsub(a.y, b.y)); } \
  static inline T2 __hmul2(T2 a, T2 b) { return T2(__hmul(a.x, b.x), __hmul(a.y, b.y)); } \
  static inline T2 __h2div(T2 a, T2 b) { return T2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); } \
  static inline T2 __hfma2(T2 a, T2 b, T2 c) { return T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); } \
  static inline T2 __hneg2(T2 a) { return T2(__hneg(a.x), __hneg(a.y)); } \
  static inline T2 __habs2(T2 a) { return T2(__habs(a.x), __habs(a.y)); } \
  static inline T2 __hmax2(T2 a, T2 b) { return T2(__hmax(a.x, b.x), __hmax(a.y, b.y)); } \
  static inline T2 __hmin2(T2 a, T2 b) { return T2(__hmin(a.x, b.x), __hmin(a.y, b.y)); } \
  static inline T2 h2sqrt(T2 a) { return T2(hsqrt(a.x), hsqrt(a.y)); } \
  static inline T2 h2exp(T2 a) { return T2(hexp(a.x), hexp(a.y)); } \
  static inline T2 h2log(T2 a) { return T2(hlog(a.x), hlog(a.y)); } \
  static inline T2 operator+(const T2 &a, const T2 &b) { return __hadd2(a, b); } \
  static inline T2 operator-(const T2 &a, const T2 &b) { return __hsub2(a, b); } \
  static inline T2 operator*(const T2 &a, const T2 &b) { return __hmul2(a, b); } \
  static inline T2 operator/(const T2 &a, const T2 &b) { return __h2div(a, b); } \
  static inline T2 &operator+=(T2 &a, const T2 &b) { return a = __hadd2(a, b); } \
  static inline T2 &operator*=(T2 &a, const T2 &b) { return a = __hmul2(a, b); } \
  static inline T atomicAdd(T *a, T v) \
  { \
    return gpulua_rt::atomic_rmw<T, unsigned short>(a, [v](T o) { return __hadd(o, v); }); \
  } \
  static inline T2 atomicAdd(T2 *a, T2 v) \
  { \
    return gpulua_rt::atomic_rmw<T2, unsigned>(a, [v](T2 o) { return __hadd2(o, v); }); \
  }
GPULUA_F16_OPS(__half, __half2)
GPULUA_F16_OPS(__nv_bfloat16, __nv_bfloat162)

static inline __half __low2half(__half2 a) { return a.x; }
static inline __half __high2half(__half2 a) { return a.y; }
static inline float __low2float(__half2 a) { return __half2float(a.x); }
static inline float __high2float(__half2 a) { return __half2float(a.y); }
static inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
static inline __half2 __half2half2(__half a) { return __half2(a, a); }
static inline __half2 __lowhigh2highlow(__half2 a) { return __half2(a.y, a.x); }
static inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
static inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 a) { return a.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 a) { return a.y; }
static inline float __low2float(__nv_bfloat162 a) { return __bfloat162float(a.x); }
static inline float __high2float(__nv_bfloat162 a) { return __bfloat162float(a.y); }
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
static inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162(a, a); }
static inline __nv_bfloat162 __lowhigh2highlow(__nv_bfloat162 a) { return __nv_bfloat162(a.y, a.x); }

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
