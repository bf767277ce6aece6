/* DEV_OP_REDUCE: the reductions of ops.h over the whole tensor (dim -1) or
 * along one dim.  Float sources accumulate in double and integer sums and
 * products in wrapping int64, as on the host; max/min/argmax/argmin carry
 * (value, index) so the first maximum, or the first NaN, wins whatever the
 * tree; any/all or and and the truth (nonzero, NaN included) of the
 * elements; var/std merge (count, mean, squared deviations) as Chan et al.
 * (one pass, stable), logsumexp (max, sum of exp(x - max)); norm is its own
 * code per p (inf, 2, other).
 *
 * Each output is one run of len elements at stride rstride (or, for dim -1
 * over a view that does not merge into one run, the flat order of the view).
 * Rows: a group of G threads per (output, split), for runs along memory.
 * Columns: a block's 32 lanes take 32 neighbouring outputs, its 8 warps split
 * the run, for reductions across the innermost dim.  When there are too few
 * outputs to fill the GPU, each is split over several groups/blocks whose
 * partial results a last kernel combines (a warp per output). */
#include "k_common.cuh"

K_MODULE(reduce)

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
  typedef typename std::conditional<pair, kpair<V>,
          typename std::conditional<wel, kwel,
          typename std::conditional<lse, klse,
          typename std::conditional<intacc, uint64_t, double>::type>::type>::type>::type A;
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

/* ---- kernels ------------------------------------------------------------- */

/* A group of G threads (32..256) per (output, split).  full: dim -1 over a
 * view that is not one run; element k is at k_off(in, k).  Otherwise output
 * o's run starts at k_off(outer, o) and steps by rstride. */
template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS)
reduce_rows(kview in, int full, kview outer, int64_t rstride, int64_t len, int64_t nout, int G,
            int64_t nsplit, int64_t chunk, typename red<T, CODE>::A *part, kview out, kprm prm)
{
  typedef red<T, CODE> R;
  typedef typename R::A A;
  typedef typename kt<T>::S S;
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
      if (full) {
        const S *p = (const S *)in.p;
        for (; k < k1; k += G) acc = R::comb(acc, R::elem(prm, p[k_off(in, k)], k));
      } else if (rstride == 1) {
        /* a contiguous run: 16-byte loads, four in flight, between a scalar
         * head (up to alignment) and tail */
        constexpr int N = 16 / sizeof(S);
        const S *q = (const S *)outer.p + k_off(outer, o) + k0;
        int64_t cnt = k1 - k0, head = (int64_t)(((16 - ((uintptr_t)q & 15)) & 15) / sizeof(S));
        if (head > cnt) head = cnt;
        if (t < head) acc = R::comb(acc, R::elem(prm, q[t], k0 + t));
        const uint4 *vq = (const uint4 *)(q + head);
        int64_t nv = (cnt - head) / N, v = t;
        for (; v + 3 * (int64_t)G < nv; v += 4 * (int64_t)G) {
          kvec<S> x[4];
          K_UNROLL
          for (int u = 0; u < 4; u++) x[u].u = vq[v + u * (int64_t)G];
          K_UNROLL
          for (int u = 0; u < 4; u++) {
            int64_t b = k0 + head + (v + u * (int64_t)G) * N;
            K_UNROLL
            for (int j = 0; j < N; j++) acc = R::comb(acc, R::elem(prm, x[u].x[j], b + j));
          }
        }
        for (; v < nv; v += G) {
          kvec<S> x0;
          x0.u = vq[v];
          int64_t b0 = k0 + head + v * N;
          K_UNROLL
          for (int j = 0; j < N; j++) acc = R::comb(acc, R::elem(prm, x0.x[j], b0 + j));
        }
        for (int64_t kk = head + nv * N + t; kk < cnt; kk += G) acc = R::comb(acc, R::elem(prm, q[kk], k0 + kk));
      } else {
        const S *p = (const S *)outer.p + k_off(outer, o);
        /* four loads in flight before they are combined, in order */
        for (; k + 3 * (int64_t)G < k1; k += 4 * (int64_t)G) {
          S v0 = p[k * rstride], v1 = p[(k + G) * rstride], v2 = p[(k + 2 * G) * rstride], v3 = p[(k + 3 * G) * rstride];
          acc = R::comb(acc, R::elem(prm, v0, k));
          acc = R::comb(acc, R::elem(prm, v1, k + G));
          acc = R::comb(acc, R::elem(prm, v2, k + 2 * G));
          acc = R::comb(acc, R::elem(prm, v3, k + 3 * G));
        }
        for (; k < k1; k += G) acc = R::comb(acc, R::elem(prm, p[k * rstride], k));
      }
    }
    acc = warp_reduce<R>(acc);
    if (G == 32) {
      if (lane == 0 && gid < total) emit<R>(acc, gid, nsplit, part, out, len, prm);
    } else {
      if (lane == 0) sm[warp] = acc;
      __syncthreads();
      if (t == 0 && gid < total) {
        int w0 = g * (G / 32);
        A r = sm[w0];
        for (int j = 1; j < G / 32; j++) r = R::comb(r, sm[w0 + j]);
        emit<R>(r, gid, nsplit, part, out, len, prm);
      }
      __syncthreads();
    }
  }
}

/* 32 neighbouring outputs per block (lanes), their runs split over the 8
 * warps; blockIdx.y is the split. */
template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS)
reduce_cols(kview outer, int64_t rstride, int64_t len, int64_t nout, int64_t nsplit, int64_t chunk,
            typename red<T, CODE>::A *part, kview out, kprm prm)
{
  typedef red<T, CODE> R;
  typedef typename R::A A;
  typedef typename kt<T>::S S;
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
        S v[8];
        K_UNROLL
        for (int j = 0; j < 8; j++) v[j] = p[(k + j * W) * rstride];
        K_UNROLL
        for (int j = 0; j < 8; j++) acc = R::comb(acc, R::elem(prm, v[j], k + j * W));
      }
      for (; k < k1; k += W) acc = R::comb(acc, R::elem(prm, p[k * rstride], k));
    }
    sm[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && o < nout) {
      for (int j = 1; j < W; j++) acc = R::comb(acc, sm[j][tx]);
      emit<R>(acc, o * nsplit + sp, nsplit, part, out, len, prm);
    }
    __syncthreads();
  }
}

/* The nsplit partials of each output (part[o * nsplit + j]): a warp each. */
template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS)
reduce_final(const typename red<T, CODE>::A *part, int64_t nsplit, int64_t nout, int64_t len, kview out, kprm prm)
{
  typedef red<T, CODE> R;
  typedef typename R::A A;
  int lane = threadIdx.x & 31;
  int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t o = w; o < nout; o += nw) {
    A acc = R::init();
    for (int64_t j = lane; j < nsplit; j += 32) acc = R::comb(acc, part[o * nsplit + j]);
    acc = warp_reduce<R>(acc);
    if (lane == 0) emit<R>(acc, o, 1, NULL, out, len, prm);
  }
}

/* ---- launchers ----------------------------------------------------------- */

/* How one reduction is laid out on the GPU. */
typedef struct rplan {
  int cols;              /* reduce_cols, else reduce_rows */
  int full;              /* rows over k_off(in, k) */
  kview in, outer, out;
  int64_t rstride, len, nout;
  kprm prm;
} rplan;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Resident blocks per SM of a kernel; 4 if the query fails (it then leaves
 * its error behind, which is cleared: nothing was launched). */
template <typename K> static int occupancy(K kernel)
{
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, K_THREADS, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 4;
  }
  return n > 0 ? n : 4;
}

template <int T, int CODE>
static int launch_reduce(const rplan *pl, const cuk_env *env, char *err, size_t errlen)
{
  typedef typename red<T, CODE>::A A;
  cudaStream_t st = k_stream(env);
  int sm = k_sm(env), G = 32, rc = -1;
  int64_t nsplit = 1, chunk, len = pl->len, nout = pl->nout;
  A *part = NULL;
  cudaError_t e;
  /* Split outputs until the GPU holds one full wave of blocks: a fixed count
   * leaves a part-empty last wave, as the blocks per SM vary with the
   * kernel's registers. */
  int per_sm = 0;
  if (pl->cols) {
    int64_t ntiles = cdiv(nout, 32), want;
    per_sm = occupancy(reduce_cols<T, CODE>);
    want = (int64_t)sm * per_sm;
    if (ntiles < want) nsplit = min64(min64(want / ntiles, max64(1, len / 64)), 4096);
  } else {
    int64_t want;
    per_sm = occupancy(reduce_rows<T, CODE>);
    G = len >= 8192 ? 256 : len >= 2048 ? 128 : len >= 512 ? 64 : 32;
    want = (int64_t)sm * per_sm * (K_THREADS / G);   /* groups */
    if (nout < want) nsplit = min64(min64(want / nout, max64(1, len / (G * 16))), 4096);
  }
  if (nsplit < 1) nsplit = 1;
  chunk = cdiv(len, nsplit);
  nsplit = cdiv(len, chunk);
  if (nsplit > 1) {
    e = cudaMallocAsync((void **)&part, (size_t)(nout * nsplit) * sizeof(A), st);
    if (e != cudaSuccess) {
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      part = NULL;
      goto done;
    }
  }
  if (pl->cols) {
    dim3 grid((unsigned)min64(cdiv(nout, 32), (int64_t)sm * per_sm * 8), (unsigned)nsplit);
    reduce_cols<T, CODE><<<grid, K_THREADS, 0, st>>>(pl->outer, pl->rstride, len, nout, nsplit, chunk, part, pl->out, pl->prm);
  } else {
    unsigned grid = (unsigned)min64(cdiv(nout * nsplit, K_THREADS / G), (int64_t)sm * per_sm * 8);
    reduce_rows<T, CODE><<<grid, K_THREADS, 0, st>>>(pl->in, pl->full, pl->outer, pl->rstride, len, nout, G,
                                                      nsplit, chunk, part, pl->out, pl->prm);
  }
  if ((e = cudaGetLastError()) != cudaSuccess) {
    fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
    goto done;
  }
  if (nsplit > 1) {
    reduce_final<T, CODE><<<(unsigned)min64(cdiv(nout * 32, K_THREADS), (int64_t)sm * 32), K_THREADS, 0, st>>>(
        part, nsplit, nout, len, pl->out, pl->prm);
    if ((e = cudaGetLastError()) != cudaSuccess) {
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      goto done;
    }
  }
  rc = 0;
done:
  /* stream-ordered: freed once the kernels above are done with it */
  if (part != NULL && (e = cudaFreeAsync(part, st)) != cudaSuccess && rc == 0)
    rc = fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

/* The kernel of the reduction code for dtype t (one instance per dtype
 * and code the op table allows), launched over pl. */
static int dispatch_reduce(rplan &pl, dev_dtype t, int code, const cuk_env *env, char *err, size_t errlen)
{
  int rc = k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    switch (code) {
    case DEV_RED_SUM: return launch_reduce<T, DEV_RED_SUM>(&pl, env, err, errlen);
    case DEV_RED_MEAN: return launch_reduce<T, DEV_RED_MEAN>(&pl, env, err, errlen);
    case DEV_RED_MAX: return launch_reduce<T, DEV_RED_MAX>(&pl, env, err, errlen);
    case DEV_RED_MIN: return launch_reduce<T, DEV_RED_MIN>(&pl, env, err, errlen);
    case DEV_RED_ANY: return launch_reduce<T, DEV_RED_ANY>(&pl, env, err, errlen);
    case DEV_RED_ALL: return launch_reduce<T, DEV_RED_ALL>(&pl, env, err, errlen);
    case DEV_RED_PROD: return launch_reduce<T, DEV_RED_PROD>(&pl, env, err, errlen);
    case DEV_RED_ARGMIN: return launch_reduce<T, DEV_RED_ARGMIN>(&pl, env, err, errlen);
    case DEV_RED_ARGMAX: return launch_reduce<T, DEV_RED_ARGMAX>(&pl, env, err, errlen);
    default: break;
    }
    /* the float-only ones: no integer instances */
    if constexpr (kt<T>::cls != KC_INT) {
      switch (code) {
      case DEV_RED_VAR: return launch_reduce<T, DEV_RED_VAR>(&pl, env, err, errlen);
      case DEV_RED_STD: return launch_reduce<T, DEV_RED_STD>(&pl, env, err, errlen);
      case DEV_RED_LOGSUMEXP: return launch_reduce<T, DEV_RED_LOGSUMEXP>(&pl, env, err, errlen);
      case DEV_RED_NORM:
        if (isinf(pl.prm.p)) return launch_reduce<T, KR_NORM_INF>(&pl, env, err, errlen);
        if (pl.prm.p == 2) return launch_reduce<T, KR_NORM_2>(&pl, env, err, errlen);
        return launch_reduce<T, KR_NORM_P>(&pl, env, err, errlen);
      default: break;
      }
    }
    return fail_msg(err, errlen, "%s is not supported for %s", dev_redop_name((dev_redop)code),
                  dev_dtype_name((dev_dtype)T));
  });
  if (rc == -2) return fail_msg(err, errlen, "reduce: bad dtype %d", (int)t);
  return rc;
}

int k_reduce(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  int dim = op->dim, code = op->code;
  int64_t nout = 1;
  dev_view outer;
  rplan pl;
  memset(&pl, 0, sizeof pl);
  if ((unsigned)code >= DEV_NREDOP) return fail_msg(err, errlen, "reduce: bad op %d", code);
  if (dim < -1 || dim >= src->ndim) return fail_msg(err, errlen, "%s: bad dim %d", dev_redop_name((dev_redop)code), dim);
  outer = *src;
  if (dim >= 0) {
    pl.len = src->shape[dim];
    pl.rstride = src->stride[dim];
    for (int d = dim; d + 1 < src->ndim; d++) {
      outer.shape[d] = src->shape[d + 1];
      outer.stride[d] = src->stride[d + 1];
    }
    outer.ndim--;
    nout = dev_view_numel(&outer);
  } else {
    pl.len = dev_view_numel(src);
  }
  if (dev_view_numel(out) != nout)
    return fail_msg(err, errlen, "%s: out has %lld elements, expected %lld", dev_redop_name((dev_redop)code),
                  (long long)dev_view_numel(out), (long long)nout);
  if (nout == 0) return 0;
  if (pl.len == 0) {
    dev_scalar s;
    if (dev_redop_empty(code, &s)) return fail_msg(err, errlen, "%s of an empty tensor", dev_redop_name((dev_redop)code));
    return k_fill_view(out, s, env, err, errlen);
  }
  pl.prm.p = op->s0.f;
  pl.prm.corr = (double)op->s0.i;
  pl.nout = nout;
  pl.out = k_view(out);
  if (dim < 0) {
    pl.in = k_view(src);
    if (pl.in.ndim == 1) {
      /* one run: the same as a dim reduction with one output */
      pl.outer = pl.in;
      pl.outer.contig = 1;
      pl.rstride = pl.in.stride[0];
    } else {
      pl.full = 1;
      pl.outer = pl.in;
    }
  } else {
    pl.in = k_view(src);
    pl.outer = k_view(&outer);
    int64_t inner = pl.outer.stride[pl.outer.ndim - 1];
    /* neighbouring outputs are neighbours in memory, or the runs are short */
    pl.cols = nout > 1 && (pl.len <= 32 || ((inner == 1 || inner == -1) && pl.rstride != 1 && pl.rstride != -1));
  }
  return dispatch_reduce(pl, src->dtype, code, env, err, errlen);
}
