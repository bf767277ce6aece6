/* The reductions' device code (DEV_OP_REDUCE, k_reduce.cu), shared with the
 * fused programs that end in a reduction (gpu.fuse, fgen.c), which NVRTC
 * compiles with this header: their values are reduced by the same tree, so
 * a fused sum equals the unfused one bit for bit.
 *
 * The kernels' bodies read their elements through a source L: at(q) for the
 * element at q (an L::V), at16(q) for the 16 bytes at q (an L::P, whose
 * element j is L::pick(p, j)).  The built-in kernels read memory (kmem); a
 * fused program's source computes element (q - NULL) of its results, whose
 * run starts at a null "address" as a new tensor's starts 16-byte aligned.
 * A reduction R combines what R::elem makes of each element and stores
 * through R::put: red<T, CODE> is one reduction, rmulti up to four, of
 * the results of one fused program, each on its own accumulator. */
#ifndef GPULUA_K_REDUCE_CUH
#define GPULUA_K_REDUCE_CUH

#include "k_elem.cuh"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

template <bool B, class X, class Y> struct kcond { typedef X type; };
template <class X, class Y> struct kcond<false, X, Y> { typedef Y type; };

/* ---- accumulators ----------------------------------------------------------- */

/* The run-time options: norm's p, var/std's correction. */
typedef struct kprm {
  double p;
  double corr;
} kprm;

/* norm's cases, as codes of their own: inf (the largest magnitude), 2, any
 * other p (sum of |x|^p; p = 1 without the pow) */
enum { KR_NORM_INF = DEV_NREDOP + 1, KR_NORM_2, KR_NORM_P };

template <typename V> struct kpair {
  V v;
  int64_t i;   /* position in the run; < 0: nothing yet */
};

/* var/std: count, mean and sum of squared deviations, merged as Chan et al. */
struct kwel {
  double n, mean, m2;
};

/* logsumexp: the max and the sum of exp(x - max) */
struct klse {
  double m, s;
};

template <int T, int CODE> struct red {
  typedef typename kt<T>::S S;
  static constexpr bool isint = kt<T>::cls == KC_INT;
  static constexpr bool pair = CODE == DEV_RED_MAX || CODE == DEV_RED_MIN || CODE == DEV_RED_ARGMAX ||
                               CODE == DEV_RED_ARGMIN;
  static constexpr bool smaller = CODE == DEV_RED_MIN || CODE == DEV_RED_ARGMIN;
  static constexpr bool logic = CODE == DEV_RED_ANY || CODE == DEV_RED_ALL;
  static constexpr bool wel = CODE == DEV_RED_VAR || CODE == DEV_RED_STD;
  static constexpr bool lse = CODE == DEV_RED_LOGSUMEXP;
  static constexpr bool intacc = ((CODE == DEV_RED_SUM || CODE == DEV_RED_PROD) && isint) || logic;
  /* max/min compare in the compute type (exact, and no conversion per element) */
  typedef typename kt<T>::C V;
  typedef typename kcond<pair, kpair<V>,
          typename kcond<wel, kwel,
          typename kcond<lse, klse,
          typename kcond<intacc, uint64_t, double>::type>::type>::type>::type A;
  /* the result goes through store_i (else store_d) */
  static constexpr bool res_int = CODE == DEV_RED_ARGMAX || CODE == DEV_RED_ARGMIN || logic ||
                                  ((CODE == DEV_RED_SUM || CODE == DEV_RED_PROD || CODE == DEV_RED_MAX ||
                                    CODE == DEV_RED_MIN) && isint);

  static KH A init()
  {
    A a;
    if constexpr (pair) { a.v = 0; a.i = -1; }
    else if constexpr (wel) { a.n = 0; a.mean = 0; a.m2 = 0; }
    else if constexpr (lse) { a.m = -INFINITY; a.s = 0; }
    else a = CODE == DEV_RED_ALL || CODE == DEV_RED_PROD;
    return a;
  }

  /* the element as double: a sum keeps NaN a NaN whatever its payload (the
   * plain conversions do) */
  static KH double as_d(S s)
  {
    if constexpr (T == DEV_F16) return (double)__half2float(__half(__half_raw{s}));
    else if constexpr (T == DEV_BF16) return (double)sc_u2f((uint32_t)s << 16);
    else if constexpr (isint) return (double)k_load_i<T>(s);
    else return (double)s;
  }

  static KH A elem(const kprm &prm, S s, int64_t k)
  {
    A a;
    (void)prm;
    if constexpr (pair) {
      a.v = k_load<T>(s);
      a.i = k;
    } else if constexpr (logic) {
      (void)k;
      a = k_load<T>(s) != 0;
    } else if constexpr (intacc) {
      (void)k;
      a = (uint64_t)k_load_i<T>(s);
    } else if constexpr (wel) {
      (void)k;
      a.n = 1;
      a.mean = as_d(s);
      a.m2 = 0;
    } else if constexpr (lse) {
      (void)k;
      a.m = as_d(s);
      a.s = 1;
    } else if constexpr (CODE == KR_NORM_INF) {
      (void)k;
      a = fabs(as_d(s));
    } else if constexpr (CODE == KR_NORM_2) {
      (void)k;
      double x = as_d(s);
      a = x * x;
    } else if constexpr (CODE == KR_NORM_P) {
      (void)k;
      double x = fabs(as_d(s));
      a = prm.p == 1 ? x : pow(x, prm.p);
    } else {
      (void)k;
      a = as_d(s);
    }
    return a;
  }

  /* x better than y: a NaN first, then the larger (smaller for min), then
   * the earlier position */
  static KH bool wins(const A &x, const A &y)
  {
    if constexpr (pair) {
      if constexpr (!isint) {
        bool xn = x.v != x.v, yn = y.v != y.v;
        if (xn || yn) return xn && yn ? x.i < y.i : xn;
      }
      if constexpr (smaller) {
        if (x.v < y.v) return true;
        if (y.v < x.v) return false;
      } else {
        if (x.v > y.v) return true;
        if (y.v > x.v) return false;
      }
      return x.i < y.i;
    } else {
      (void)x;
      (void)y;
      return false;
    }
  }

  static KH A comb(const A &x, const A &y)
  {
    if constexpr (pair) {
      if (x.i < 0) return y;
      if (y.i < 0) return x;
      return wins(x, y) ? x : y;
    } else if constexpr (CODE == DEV_RED_ANY) {
      return x | y;
    } else if constexpr (CODE == DEV_RED_ALL) {
      return x & y;
    } else if constexpr (CODE == DEV_RED_PROD) {
      return x * y;
    } else if constexpr (CODE == KR_NORM_INF) {
      return x != x ? x : y != y ? y : x > y ? x : y;
    } else if constexpr (wel) {
      if (x.n == 0) return y;
      if (y.n == 0) return x;
      A r;
      double d = y.mean - x.mean;
      r.n = x.n + y.n;
      r.mean = x.mean + d * (y.n / r.n);
      r.m2 = x.m2 + y.m2 + d * d * (x.n * y.n / r.n);
      return r;
    } else if constexpr (lse) {
      /* NaN wins; -inf (nothing yet, or only -inf) adds nothing; an inf max is the result */
      if (x.m != x.m) return x;
      if (y.m != y.m) return y;
      if (y.m == -INFINITY) return x;
      if (x.m == -INFINITY) return y;
      A r;
      r.m = x.m > y.m ? x.m : y.m;
      if (r.m == INFINITY) { r.s = 1; return r; }
      r.s = x.s * exp(x.m - r.m) + y.s * exp(y.m - r.m);
      return r;
    } else {
      return x + y;
    }
  }

  static KH double res_d(const A &a, int64_t len, const kprm &prm)
  {
    (void)prm;
    if constexpr (pair && sizeof(V) == 4) { (void)len; return sc_f2d(a.v); }
    else if constexpr (pair) { (void)len; return (double)a.v; }
    else if constexpr (CODE == DEV_RED_MEAN) return (double)a / (double)len;
    else if constexpr (CODE == DEV_RED_VAR) { (void)len; return a.m2 / (a.n - prm.corr); }
    else if constexpr (CODE == DEV_RED_STD) { (void)len; return sqrt(a.m2 / (a.n - prm.corr)); }
    else if constexpr (lse) { (void)len; return a.m != a.m || isinf(a.m) ? a.m : a.m + log(a.s); }
    else if constexpr (CODE == KR_NORM_2) { (void)len; return sqrt(a); }
    else if constexpr (CODE == KR_NORM_P) { (void)len; return prm.p == 1 ? a : pow(a, 1 / prm.p); }
    else { (void)len; return (double)a; }
  }

  static KH int64_t res_i(const A &a)
  {
    if constexpr (CODE == DEV_RED_ARGMAX || CODE == DEV_RED_ARGMIN) return a.i + 1;
    else if constexpr (pair) return (int64_t)a.v;
    else if constexpr (logic) return (int64_t)a;
    else if constexpr (intacc) return sc_wrap64((uint64_t)a);
    else { (void)a; return 0; }
  }
};

__device__ __forceinline__ double shfl_down(double v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
__device__ __forceinline__ uint64_t shfl_down(uint64_t v, int o)
{
  return (uint64_t)__shfl_down_sync(0xffffffffu, (unsigned long long)v, o);
}
__device__ __forceinline__ int64_t shfl_down(int64_t v, int o)
{
  return (int64_t)__shfl_down_sync(0xffffffffu, (long long)v, o);
}
template <typename V> __device__ __forceinline__ kpair<V> shfl_down(const kpair<V> &p, int o)
{
  kpair<V> r;
  r.v = shfl_down(p.v, o);
  r.i = shfl_down(p.i, o);
  return r;
}
__device__ __forceinline__ kwel shfl_down(const kwel &w, int o)
{
  kwel r;
  r.n = shfl_down(w.n, o);
  r.mean = shfl_down(w.mean, o);
  r.m2 = shfl_down(w.m2, o);
  return r;
}
__device__ __forceinline__ klse shfl_down(const klse &l, int o)
{
  klse r;
  r.m = shfl_down(l.m, o);
  r.s = shfl_down(l.s, o);
  return r;
}

/* Lane 0 gets the warp's result; every lane must take part. */
template <class R> __device__ __forceinline__ typename R::A warp_reduce(typename R::A a)
{
  K_UNROLL
  for (int o = 16; o > 0; o >>= 1) a = R::comb(a, shfl_down(a, o));
  return a;
}

/* Output o's result, or partial number gid when outputs are split. */
template <class R>
__device__ __forceinline__ void emit(typename R::A a, int64_t gid, int64_t nsplit, typename R::A *part,
                                     const kview &out, int64_t len, const kprm &prm)
{
  if (nsplit > 1) {
    part[gid] = a;
    return;
  }
  char *p = out.p + k_off(out, gid) * k_esize(out.dtype);
  if constexpr (R::res_int) k_store_i_rt(out.dtype, p, R::res_i(a));
  else k_store_d_rt(out.dtype, p, R::res_d(a, len, prm));
}

/* A reduction's layout on the GPU, the kernels' first parameter
 * (k_reduce.cu makes it): rows (a group of G threads per output and split;
 * full: over k_off(in, k)), or columns (32 neighbouring outputs a block) */
struct krargs {
  kview in, outer, out;
  int full, G;
  int64_t rstride, len, nout, nsplit, chunk;
  void *part;   /* nsplit > 1: the partials, red<T, CODE>::A each */
  kprm prm;
};

/* One reduction: its accumulator's steps (red), and its result stored
 * through krargs' out (or part). */
template <int T, int CODE> struct red1 : red<T, CODE> {
  typedef red<T, CODE> R;
  template <class L>
  static __device__ __forceinline__ void put(const krargs &r, const L &, const typename R::A &a, int64_t gid)
  {
    emit<R>(a, gid, r.nsplit, (typename R::A *)r.part, r.out, r.len, r.prm);
  }
};

/* The built-in kernels' source: memory. */
template <typename S> struct kmem {
  typedef S V;
  typedef kvec<S> P;
  __device__ __forceinline__ S at(const S *q) const { return *q; }
  __device__ __forceinline__ P at16(const uint4 *q) const
  {
    P p;
    p.u = *q;
    return p;
  }
  static __device__ __forceinline__ S pick(const P &p, int j) { return p.x[j]; }
};

/* ---- several reductions in one pass (gpu.fuse) ----------------------------- */

/* Where the results of a pass of several go (the kernels' third parameter,
 * held by the fused program's source): each result's output, its partials
 * when outputs are split, and which results this pass stores (a pass on a
 * plan that is not a result's own computes it but leaves it to another). */
#define KR_MAXRES 4
struct krouts {
  kview out[KR_MAXRES];
  void *part[KR_MAXRES];
  unsigned mask;
};

struct knil {};
__device__ __forceinline__ knil shfl_down(const knil &a, int) { return a; }

/* Result k of a pass: reduction CODE of T, or none (-1). */
template <int T, int CODE> struct rslot : red<T, CODE> {
  static constexpr bool none = false;
};
template <int T> struct rslot<T, -1> {
  static constexpr bool none = true;
  typedef knil A;
  static KH A init() { return A(); }
  static KH A comb(const A &x, const A &) { return x; }
  template <class S> static KH A elem(const kprm &, S, int64_t) { return A(); }
};

template <class A0, class A1, class A2, class A3> struct kacc4 {
  A0 a0;
  A1 a1;
  A2 a2;
  A3 a3;
};
template <class A0, class A1, class A2, class A3>
__device__ __forceinline__ kacc4<A0, A1, A2, A3> shfl_down(const kacc4<A0, A1, A2, A3> &x, int o)
{
  kacc4<A0, A1, A2, A3> r;
  r.a0 = shfl_down(x.a0, o);
  r.a1 = shfl_down(x.a1, o);
  r.a2 = shfl_down(x.a2, o);
  r.a3 = shfl_down(x.a3, o);
  return r;
}

/* An element of each result; 16 bytes of each. */
template <typename S> struct kv4 {
  S x[KR_MAXRES];
};
template <typename S> struct kp4 {
  kvec<S> v[KR_MAXRES];
};

template <class R>
__device__ __forceinline__ void slot_put(const krargs &r, const krouts &o, int k, const typename R::A &a,
                                         int64_t gid)
{
  if constexpr (!R::none) {
    if (o.mask & (1u << k)) emit<R>(a, gid, r.nsplit, (typename R::A *)o.part[k], o.out[k], r.len, r.prm);
  }
}

/* Up to four reductions (codes C0.., -1 for none) of the results of one
 * program, all of T: the tuple of their accumulators, each combined by its
 * own steps, so that each result is the one its reduction alone would make
 * on the same plan.  The source (L::o) says where they go. */
template <int T, int C0, int C1, int C2, int C3> struct rmulti {
  typedef rslot<T, C0> R0;
  typedef rslot<T, C1> R1;
  typedef rslot<T, C2> R2;
  typedef rslot<T, C3> R3;
  typedef kacc4<typename R0::A, typename R1::A, typename R2::A, typename R3::A> A;
  typedef typename kt<T>::S S;

  static KH A init()
  {
    A a;
    a.a0 = R0::init();
    a.a1 = R1::init();
    a.a2 = R2::init();
    a.a3 = R3::init();
    return a;
  }
  static KH A elem(const kprm &prm, const kv4<S> &v, int64_t k)
  {
    A a;
    a.a0 = R0::elem(prm, v.x[0], k);
    a.a1 = R1::elem(prm, v.x[1], k);
    a.a2 = R2::elem(prm, v.x[2], k);
    a.a3 = R3::elem(prm, v.x[3], k);
    return a;
  }
  static KH A comb(const A &x, const A &y)
  {
    A r;
    r.a0 = R0::comb(x.a0, y.a0);
    r.a1 = R1::comb(x.a1, y.a1);
    r.a2 = R2::comb(x.a2, y.a2);
    r.a3 = R3::comb(x.a3, y.a3);
    return r;
  }
  template <class L>
  static __device__ __forceinline__ void put(const krargs &r, const L &src, const A &a, int64_t gid)
  {
    slot_put<R0>(r, src.o, 0, a.a0, gid);
    slot_put<R1>(r, src.o, 1, a.a1, gid);
    slot_put<R2>(r, src.o, 2, a.a2, gid);
    slot_put<R3>(r, src.o, 3, a.a3, gid);
  }
};

/* ---- kernels ------------------------------------------------------------- */

/* Thread t's part (of G) of a contiguous run of cnt elements at q (element
 * k0 of its output's run), combined into acc: 16-byte loads, U in flight,
 * between a scalar head (up to alignment) and tail.  A thread combines its
 * vectors v, v + G, v + 2G ... in order whatever U, so U changes the speed,
 * not the result: the kernels of runs along memory take 8 (9 % faster than
 * 4 for a sum of 256 MiB f32 on an H200), the general one 4 (fewer
 * registers for its other paths). */
template <int T, class R, class L, int U>
__device__ __forceinline__ typename R::A k_run_acc(typename R::A acc, const L &src, const typename kt<T>::S *q,
                                                   int64_t k0, int64_t cnt, int t, int G, const kprm &prm)
{
  typedef typename kt<T>::S S;
  constexpr int N = 16 / sizeof(S);
  int64_t head = (int64_t)(((16 - ((uintptr_t)q & 15)) & 15) / sizeof(S));
  if (head > cnt) head = cnt;
  if (t < head) acc = R::comb(acc, R::elem(prm, src.at(q + t), k0 + t));
  const uint4 *vq = (const uint4 *)(q + head);
  int64_t nv = (cnt - head) / N, v = t;
  for (; v + (U - 1) * (int64_t)G < nv; v += U * (int64_t)G) {
    typename L::P x[U];
    K_UNROLL
    for (int u = 0; u < U; u++) x[u] = src.at16(vq + v + u * (int64_t)G);
    K_UNROLL
    for (int u = 0; u < U; u++) {
      int64_t b = k0 + head + (v + u * (int64_t)G) * N;
      K_UNROLL
      for (int j = 0; j < N; j++) acc = R::comb(acc, R::elem(prm, L::pick(x[u], j), b + j));
    }
  }
  for (; v < nv; v += G) {
    typename L::P x0 = src.at16(vq + v);
    int64_t b0 = k0 + head + v * N;
    K_UNROLL
    for (int j = 0; j < N; j++) acc = R::comb(acc, R::elem(prm, L::pick(x0, j), b0 + j));
  }
  for (int64_t kk = head + nv * N + t; kk < cnt; kk += G) acc = R::comb(acc, R::elem(prm, src.at(q + kk), k0 + kk));
  return acc;
}

/* A group of G threads (32..256) per (output, split).  full: dim -1 over a
 * view that is not one run; element k is at k_off(in, k).  Otherwise output
 * o's run starts at k_off(outer, o) and steps by rstride.  RUN: only runs
 * along memory (not full, rstride 1), a kernel of fewer registers (more
 * blocks per SM: 1.13x the bandwidth of the general kernel for a sum of
 * 256 MiB f32 on an H200). */
template <int T, class R, class L, int U = 4, bool RUN = false>
__device__ __forceinline__ void k_reduce_rows(const krargs &r, const L &src)
{
  typedef typename R::A A;
  typedef typename L::V V;
  typedef typename kt<T>::S S;
  const kview &in = r.in, &outer = r.outer;
  const int full = r.full, G = r.G;
  const int64_t rstride = r.rstride, len = r.len, nout = r.nout, nsplit = r.nsplit, chunk = r.chunk;
  __shared__ A sm[K_THREADS / 32];
  int groups = K_THREADS / G, g = threadIdx.x / G, t = threadIdx.x % G;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t total = nout * nsplit;
  /* the bound is the same for the whole block, so every thread reaches the barriers */
  for (int64_t base = (int64_t)blockIdx.x * groups; base < total; base += (int64_t)gridDim.x * groups) {
    int64_t gid = base + g;
    A acc = R::init();
    if (gid < total) {
      int64_t o = gid / nsplit, sp = gid - o * nsplit;
      int64_t k0 = sp * chunk, k1 = min(len, k0 + chunk), k = k0 + t;
      if (!RUN && full) {
        const S *p = (const S *)in.p;
        for (; k < k1; k += G) acc = R::comb(acc, R::elem(r.prm, src.at(p + k_off(in, k)), k));
      } else if (RUN || rstride == 1) {
        acc = k_run_acc<T, R, L, U>(acc, src, (const typename kt<T>::S *)outer.p + k_off(outer, o) + k0, k0,
                                       k1 - k0, t, G, r.prm);
      } else if constexpr (!RUN) {
        const S *p = (const S *)outer.p + k_off(outer, o);
        /* four loads in flight before they are combined, in order */
        for (; k + 3 * (int64_t)G < k1; k += 4 * (int64_t)G) {
          V v0 = src.at(p + k * rstride), v1 = src.at(p + (k + G) * rstride), v2 = src.at(p + (k + 2 * G) * rstride),
            v3 = src.at(p + (k + 3 * G) * rstride);
          acc = R::comb(acc, R::elem(r.prm, v0, k));
          acc = R::comb(acc, R::elem(r.prm, v1, k + G));
          acc = R::comb(acc, R::elem(r.prm, v2, k + 2 * G));
          acc = R::comb(acc, R::elem(r.prm, v3, k + 3 * G));
        }
        for (; k < k1; k += G) acc = R::comb(acc, R::elem(r.prm, src.at(p + k * rstride), k));
      }
    }
    acc = warp_reduce<R>(acc);
    if (G == 32) {
      if (lane == 0 && gid < total) R::put(r, src, acc, gid);
    } else {
      if (lane == 0) sm[warp] = acc;
      __syncthreads();
      if (t == 0 && gid < total) {
        int w0 = g * (G / 32);
        A rr = sm[w0];
        for (int j = 1; j < G / 32; j++) rr = R::comb(rr, sm[w0 + j]);
        R::put(r, src, rr, gid);
      }
      __syncthreads();
    }
  }
}

/* 32 neighbouring outputs per block (lanes), their runs split over the 8
 * warps; blockIdx.y is the split. */
template <int T, class R, class L>
__device__ __forceinline__ void k_reduce_cols(const krargs &r, const L &src)
{
  typedef typename R::A A;
  typedef typename L::V V;
  typedef typename kt<T>::S S;
  const kview &outer = r.outer;
  const int64_t rstride = r.rstride, len = r.len, nout = r.nout, nsplit = r.nsplit, chunk = r.chunk;
  constexpr int W = K_THREADS / 32;
  __shared__ A sm[W][32];
  int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  int64_t ntiles = (nout + 31) / 32, sp = blockIdx.y;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    int64_t o = tile * 32 + tx;
    A acc = R::init();
    if (o < nout) {
      const S *p = (const S *)outer.p + k_off(outer, o);
      int64_t k0 = sp * chunk, k1 = min(len, k0 + chunk), k = k0 + ty;
      /* eight loads in flight, then combined in order */
      for (; k + 7 * W < k1; k += 8 * W) {
        V v[8];
        K_UNROLL
        for (int j = 0; j < 8; j++) v[j] = src.at(p + (k + j * W) * rstride);
        K_UNROLL
        for (int j = 0; j < 8; j++) acc = R::comb(acc, R::elem(r.prm, v[j], k + j * W));
      }
      for (; k < k1; k += W) acc = R::comb(acc, R::elem(r.prm, src.at(p + k * rstride), k));
    }
    sm[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && o < nout) {
      for (int j = 1; j < W; j++) acc = R::comb(acc, sm[j][tx]);
      R::put(r, src, acc, o * nsplit + sp);
    }
    __syncthreads();
  }
}

#endif
