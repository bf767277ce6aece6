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

struct tstate {
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

/* ---- assert, printf, clock64 ------------------------------------------------ */

namespace gpulua_rt {
[[noreturn]] GPULUA_NOCHECK inline void assert_fail(const char *expr, const char *file, unsigned line,
                                                  const char *fn)
{
  tstate *t = tsp();
  char msg[600];
  snprintf(msg, sizeof msg, "%s:%u: %s: block [%u,%u,%u], thread [%u,%u,%u]: Assertion `%s` failed.", file, line,
           fn, t->bid.x, t->bid.y, t->bid.z, t->tid.x, t->tid.y, t->tid.z, expr);
  fail(GPULUA_FAIL_ASSERT, msg);
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

/* GPULUA_HK_PART3 */

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

  template <void (*F)(P...), size_t... I>
  static void blocks_(const gpulua_hk_block *b, std::index_sequence<I...>)
  {
    enter(b);
    [&](typename std::decay<P>::type... a) {
      tstate *t = tsp();
      const unsigned bx = b->block[0], by = b->block[1], bz = b->block[2];
      for (unsigned long long l = b->first; l < b->last; l++) {
        t->bid = block_index(b, l);
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
  static void thread_(const gpulua_hk_block *b, unsigned long long l, unsigned th, std::index_sequence<I...>)
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

  template <void (*F)(P...)> static constexpr gpulua_hk_kernel make(const char *name)
  {
    return gpulua_hk_kernel{name, (int)sizeof...(P), sizes, &blocks<F>, &thread<F>};
  }
};
template <typename... P> constexpr unsigned kernel_of<void (*)(P...)>::sizes[sizeof...(P) + 1];

} /* namespace gpulua_rt */

/* The generated trailer: one GPULUA_HK_KERNEL per launchable kernel, then
 * GPULUA_HK_MODULE listing them. */
#define GPULUA_HK_KERNEL(I, F, NAME) \
  extern "C" __attribute__((visibility("default"))) const gpulua_hk_kernel gpulua_hk_k##I = \
    ::gpulua_rt::kernel_of<decltype(&F)>::make<&F>(NAME);
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
