/* Ops along one dim, one row at a time: DEV_OP_SOFTMAX (softmax and
 * log_softmax, float dtypes, computed in float for f32/f16/bf16 and in
 * double for f64) and DEV_OP_CUMSUM, cumsum and cumprod (floats add up or
 * multiply in double, integers and bool in wrapping int64, as on the host).
 *
 * A row is len elements from k_off(outer, r) at stride rstride (each of in
 * and out has its own).  Softmax keeps the row in registers: a warp per
 * row up to 1024 elements (4 or 32 a lane), a block (up to 1024 threads,
 * 16 elements each) per row up to 16384, with 4-element vector loads and stores where the
 * row is contiguous and aligned; the max and the sum of exp(x - max) are
 * warp-shuffle reductions (and across warps through shared memory), so the
 * row is read once and written once.  Longer rows: a block per row, an
 * online (max, sum) pass and a pass that writes.  Cumsum and cumprod: a warp per row,
 * 32 elements at a time scanned with shuffles and a carry; a thread per row
 * (sequential) when rows are strided and their starts neighbours. */
#include "k_common.cuh"

K_MODULE(rows)

#define SM_E 16            /* row elements a thread of a block keeps */
#define SM_WARP_SHORT 128  /* up to here a lane keeps 4, then 32 */
#define SM_WARP_MAX 1024
#define SM_BLOCK_MAX (1024 * SM_E)

__device__ __forceinline__ float kexp(float x) { return expf(x); }
__device__ __forceinline__ double kexp(double x) { return exp(x); }
__device__ __forceinline__ float klog(float x) { return logf(x); }
__device__ __forceinline__ double klog(double x) { return log(x); }

template <typename C> __device__ __forceinline__ C warp_max(C v)
{
  K_UNROLL
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename C> __device__ __forceinline__ C warp_sum(C v)
{
  K_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The block's max (MAX) or sum of v, in every thread; sm holds 32. */
template <bool MAX, typename C> __device__ __forceinline__ C block_all(C v, C *sm)
{
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  v = lane < nw ? sm[lane] : (MAX ? (C)-INFINITY : (C)0);
  v = MAX ? warp_max(v) : warp_sum(v);
  __syncthreads();   /* sm is free again */
  return v;
}

/* ---- softmax, the row in registers --------------------------------------- */

/* WARP: a warp per row (blockDim / 32 rows a block); else a block per row.
 * E: the row elements a thread keeps (a multiple of 4). */
template <int T, bool LOG, bool WARP, int E>
__global__ void __launch_bounds__(WARP ? K_THREADS : 1024)
softmax_cached(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t nrows)
{
  typedef typename kt<T>::S S;
  typedef typename kt<T>::C C;
  typedef kpack<S, 4> P;
  __shared__ C sm[WARP ? 1 : 32];
  int nt = WARP ? 32 : blockDim.x, t = WARP ? threadIdx.x & 31 : threadIdx.x;
  int64_t r0 = WARP ? (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
  int64_t rstep = WARP ? (int64_t)gridDim.x * (blockDim.x >> 5) : gridDim.x;
  /* the bound is the same for the whole block (block mode), or the warp */
  for (int64_t r = r0; r < nrows; r += rstep) {
    const S *pi = (const S *)oin.p + k_off(oin, r);
    S *po = (S *)oout.p + k_off(oout, r);
    bool vec = sin == 1 && sout == 1 && len % 4 == 0 && ((uintptr_t)pi % sizeof(P)) == 0 &&
               ((uintptr_t)po % sizeof(P)) == 0;
    C v[E];
    /* slot i holds element at(i): (i / 4 * nt + t) * 4 + i % 4 with vectors, i * nt + t without */
#define AT(i) (vec ? ((int64_t)((i) / 4 * nt + t) * 4 + (i) % 4) : (int64_t)(i) * nt + t)
    if (vec) {
      K_UNROLL
      for (int j = 0; j < E / 4; j++) {
        int64_t q = (int64_t)(j * nt + t) * 4;
        P x = {};
        if (q < len) x = *(const P *)(pi + q);
        K_UNROLL
        for (int u = 0; u < 4; u++) v[j * 4 + u] = q < len ? k_load<T>(x.x[u]) : (C)-INFINITY;
      }
    } else {
      K_UNROLL
      for (int i = 0; i < E; i++) v[i] = AT(i) < len ? k_load<T>(pi[AT(i) * sin]) : (C)-INFINITY;
    }
    C m = -INFINITY;
    K_UNROLL
    for (int i = 0; i < E; i++) m = fmax(m, v[i]);
    if constexpr (WARP) m = warp_max(m);
    else m = block_all<true>(m, sm);
    C s = 0;
    K_UNROLL
    for (int i = 0; i < E; i++) {
      C e = kexp(v[i] - m);
      if (AT(i) < len) s += e;
      if (!LOG) v[i] = e;
    }
    if constexpr (WARP) s = warp_sum(s);
    else s = block_all<false>(s, sm);
    C ls = LOG ? klog(s) : (C)0;
    K_UNROLL
    for (int i = 0; i < E; i++) v[i] = LOG ? v[i] - m - ls : v[i] / s;
    if (vec) {
      K_UNROLL
      for (int j = 0; j < E / 4; j++) {
        int64_t q = (int64_t)(j * nt + t) * 4;
        if (q < len) {
          P x;
          K_UNROLL
          for (int u = 0; u < 4; u++) x.x[u] = k_store<T>(v[j * 4 + u]);
          *(P *)(po + q) = x;
        }
      }
    } else {
      K_UNROLL
      for (int i = 0; i < E; i++)
        if (AT(i) < len) po[AT(i) * sout] = k_store<T>(v[i]);
    }
#undef AT
  }
}

/* Rows too long for registers: each thread's online (max, sum) over its
 * elements, merged across the block, then a pass that writes. */
template <int T, bool LOG>
__global__ void __launch_bounds__(1024)
softmax_long(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t nrows)
{
  typedef typename kt<T>::S S;
  typedef typename kt<T>::C C;
  __shared__ C sm[32];
  for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
    const S *pi = (const S *)oin.p + k_off(oin, r);
    S *po = (S *)oout.p + k_off(oout, r);
    C m = -INFINITY, s = 0;
    for (int64_t e = threadIdx.x; e < len; e += blockDim.x) {
      C x = k_load<T>(pi[e * sin]);
      if (x == (C)-INFINITY) continue;   /* adds nothing (and -inf - -inf would be NaN) */
      if (x > m) {
        s = s * kexp(m - x) + 1;
        m = x;
      } else {
        s += kexp(x - m);   /* a NaN x makes s NaN */
      }
    }
    C bm = block_all<true>(m, sm);
    s = m == (C)-INFINITY ? (C)0 : s * kexp(m - bm);
    s = block_all<false>(s, sm);
    C ls = klog(s);
    for (int64_t e = threadIdx.x; e < len; e += blockDim.x) {
      C x = k_load<T>(pi[e * sin]);
      po[e * sout] = k_store<T>(LOG ? x - bm - ls : kexp(x - bm) / s);
    }
  }
}

/* ---- cumsum ------------------------------------------------------------ */

template <int T> struct kscan {
  static constexpr bool isint = kt<T>::cls == KC_INT;
  typedef typename std::conditional<isint, uint64_t, double>::type A;
  static constexpr int TO = isint ? DEV_I64 : T;
  typedef typename kt<T>::S S;
  typedef typename kt<TO>::S SO;
  static KH A load(S s)
  {
    if constexpr (isint) return (uint64_t)k_load_i<T>(s);
    else return k_load_d<T>(s);
  }
  static KH SO store(A a)
  {
    if constexpr (isint) return (SO)sc_wrap64(a);
    else return k_store_d<TO>(a);
  }
};

__device__ __forceinline__ double shfl_up(double v, int o) { return __shfl_up_sync(0xffffffffu, v, o); }
__device__ __forceinline__ uint64_t shfl_up(uint64_t v, int o)
{
  return (uint64_t)__shfl_up_sync(0xffffffffu, (unsigned long long)v, o);
}
__device__ __forceinline__ double shfl_idx(double v, int l) { return __shfl_sync(0xffffffffu, v, l); }
__device__ __forceinline__ uint64_t shfl_idx(uint64_t v, int l)
{
  return (uint64_t)__shfl_sync(0xffffffffu, (unsigned long long)v, l);
}

/* The scan's step and its identity: a sum, or a product (cumprod). */
template <bool PROD, typename A> __device__ __forceinline__ A scan_op(A a, A b)
{
  if constexpr (PROD) return a * b;
  else return a + b;
}

/* A warp per row, 32 elements at a time. */
template <int T, bool PROD>
__global__ void __launch_bounds__(K_THREADS)
cumsum_warp(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t nrows)
{
  typedef kscan<T> K;
  typedef typename K::A A;
  int lane = threadIdx.x & 31;
  int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t r = w; r < nrows; r += nw) {
    const typename K::S *pi = (const typename K::S *)oin.p + k_off(oin, r);
    typename K::SO *po = (typename K::SO *)oout.p + k_off(oout, r);
    A carry = (A)PROD;
    for (int64_t b = 0; b < len; b += 32) {
      int64_t e = b + lane;
      A x = e < len ? K::load(pi[e * sin]) : (A)PROD;
      K_UNROLL
      for (int o = 1; o < 32; o <<= 1) {
        A y = shfl_up(x, o);
        if (lane >= o) x = scan_op<PROD>(x, y);
      }
      x = scan_op<PROD>(x, carry);
      if (e < len) po[e * sout] = K::store(x);
      carry = shfl_idx(x, 31);
    }
  }
}

/* A thread per row, in order along it. */
template <int T, bool PROD>
__global__ void __launch_bounds__(K_THREADS)
cumsum_seq(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t nrows)
{
  typedef kscan<T> K;
  typedef typename K::A A;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < nrows; r += (int64_t)gridDim.x * blockDim.x) {
    const typename K::S *pi = (const typename K::S *)oin.p + k_off(oin, r);
    typename K::SO *po = (typename K::SO *)oout.p + k_off(oout, r);
    A acc = (A)PROD;
    for (int64_t e = 0; e < len; e++) {
      acc = scan_op<PROD>(acc, K::load(pi[e * sin]));
      po[e * sout] = K::store(acc);
    }
  }
}

/* ---- launcher ------------------------------------------------------------ */

/* The other dims of v (as a kview) and the run along dim. */
static kview outer_view(const dev_view *v, int dim, int64_t *len, int64_t *rstride)
{
  dev_view o = *v;
  *len = v->shape[dim];
  *rstride = v->stride[dim];
  for (int d = dim; d + 1 < v->ndim; d++) {
    o.shape[d] = v->shape[d + 1];
    o.stride[d] = v->stride[d + 1];
  }
  o.ndim--;
  return k_view(&o);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int k_rows(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  int dim = op->dim, sm = k_sm(env);
  int64_t len, sin, sout, nrows;
  if (dim < 0 || dim >= src->ndim || src->ndim != out->ndim) return fail_msg(err, errlen, "bad dim %d", dim);
  kview oin = outer_view(src, dim, &len, &sin), oout = outer_view(out, dim, &len, &sout);
  nrows = dev_view_numel(src) / (len > 0 ? len : 1);
  if (len == 0 || nrows == 0) return 0;
  cudaStream_t st = k_stream(env);
  if (op->kind == DEV_OP_CUMSUM) {
    /* strided runs whose starts are neighbours: a thread each reads along with its neighbours */
    int seq = sin != 1 && oin.stride[oin.ndim - 1] == 1 && nrows >= 32 * (int64_t)sm;
    int prod = op->code == DEV_CUM_PROD;
    unsigned wgrid = (unsigned)min64(cdiv(nrows * 32, K_THREADS), (int64_t)sm * 16);
    int rc = k_dispatch(src->dtype, [&](auto tag) {
      constexpr int T = decltype(tag)::value;
      if (seq && prod) cumsum_seq<T, true><<<k_blocks(nrows, env), K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
      else if (seq) cumsum_seq<T, false><<<k_blocks(nrows, env), K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
      else if (prod) cumsum_warp<T, true><<<wgrid, K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
      else cumsum_warp<T, false><<<wgrid, K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
      return 0;
    });
    if (rc == -2) return fail_msg(err, errlen, "%s: bad dtype %d", prod ? "cumprod" : "cumsum", (int)src->dtype);
    K_LAUNCHED();
    return 0;
  }
  int log = op->code == DEV_LOG_SOFTMAX;
  int rc = k_dispatch(src->dtype, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if constexpr (kt<T>::cls == KC_INT) {
      return -2;
    } else {
      if (len <= SM_WARP_MAX) {
        /* a warp per row, as many in flight as the rows: each has one or a few loads to wait for */
        unsigned grid = (unsigned)min64(cdiv(nrows, K_THREADS / 32), INT32_MAX);
        if (len <= SM_WARP_SHORT) {
          if (log) softmax_cached<T, true, true, 4><<<grid, K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
          else softmax_cached<T, false, true, 4><<<grid, K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
        } else {
          if (log) softmax_cached<T, true, true, 32><<<grid, K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
          else softmax_cached<T, false, true, 32><<<grid, K_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows);
        }
      } else if (len <= SM_BLOCK_MAX) {
        int nt = (int)min64(1024, cdiv(cdiv(len, SM_E), 32) * 32);
        unsigned grid = (unsigned)min64(nrows, (int64_t)sm * (2048 / nt) * 8);
        if (log) softmax_cached<T, true, false, SM_E><<<grid, nt, 0, st>>>(oin, sin, oout, sout, len, nrows);
        else softmax_cached<T, false, false, SM_E><<<grid, nt, 0, st>>>(oin, sin, oout, sout, len, nrows);
      } else {
        unsigned grid = (unsigned)min64(nrows, (int64_t)sm * 8);
        if (log) softmax_long<T, true><<<grid, 1024, 0, st>>>(oin, sin, oout, sout, len, nrows);
        else softmax_long<T, false><<<grid, 1024, 0, st>>>(oin, sin, oout, sout, len, nrows);
      }
      return 0;
    }
  });
  if (rc == -2) return fail_msg(err, errlen, "%s: needs a float dtype, not %s", log ? "log_softmax" : "softmax",
                              dev_dtype_name(src->dtype));
  K_LAUNCHED();
  return 0;
}
