/* DEV_OP_INDEX: index_select and gather (a copy of elements, by their size
 * only) and scatter_add (atomic adds, per dtype: the order of the adds to
 * one element is the hardware's, so float sums may differ from the host's
 * in the last bits).  Indices are 1-based, of any integer dtype (read with
 * a switch: one dtype per launch, no extra instances).  An index outside
 * 1..size is skipped and sets *env->err_flag to the op's tag, s0.i (> 1,
 * set by the backend; the first such op wins): the backend reports it at
 * the next sync, naming the op and its script line.
 *
 * Positions p run over out (gather) or the index (scatter) in C order; the
 * tensor indexed along dim is seen over that shape with stride 0 along dim
 * (base), so its element is base + (idx - 1) * its stride along dim. */
#include "k_common.cuh"

K_MODULE(index)

__device__ __forceinline__ int64_t k_idx(const kview &v, int64_t i)
{
  int64_t o = k_off(v, i);
  switch (v.dtype) {
  case DEV_I8: return ((const int8_t *)v.p)[o];
  case DEV_U8: return ((const uint8_t *)v.p)[o];
  case DEV_I32: return ((const int32_t *)v.p)[o];
  default: return ((const int64_t *)v.p)[o];
  }
}

__device__ __forceinline__ void k_bad_index(int *flag, int tag)
{
  if (flag != NULL) atomicCAS(flag, 0, tag);
}

/* out[p] = base[p + (idx[p] - 1) * sd]; elements of E bytes */
template <typename E>
__global__ void __launch_bounds__(K_THREADS)
gather_k(kview out, kview idx, kview base, int64_t bound, int64_t sd, int64_t n, int *flag, int tag)
{
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = k_idx(idx, i);
    if (j < 1 || j > bound) {
      k_bad_index(flag, tag);
      continue;
    }
    ((E *)out.p)[k_off(out, i)] = ((const E *)base.p)[k_off(base, i) + (j - 1) * sd];
  }
}

/* The same where out and the index are contiguous and the index is of IX
 * (i64 or i32).  A block takes tiles of U * K_THREADS consecutive elements
 * (a thread U of them, K_THREADS apart): the elements a tile reads lie in
 * few rows, which the block then reads from L1 rather than each warp from
 * L2.  All U index loads, then all U element loads, then the stores: U
 * chains of two dependent loads in flight per thread (restrict: out
 * aliases neither input). */
template <typename E, typename IX, int U>
__global__ void __launch_bounds__(K_THREADS)
gather_contig_k(E *__restrict__ out, const IX *__restrict__ idx, const E *__restrict__ src, kview base, int64_t bound,
                int64_t sd, int64_t n, int *flag, int tag)
{
  const int64_t tile = (int64_t)U * K_THREADS;
  for (int64_t t0 = (int64_t)blockIdx.x * tile; t0 < n; t0 += (int64_t)gridDim.x * tile) {
    int64_t j[U];
    E v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t i = t0 + u * K_THREADS + threadIdx.x;
      j[u] = i < n ? (int64_t)idx[i] : 1;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t i = t0 + u * K_THREADS + threadIdx.x;
      if (i < n && j[u] >= 1 && j[u] <= bound) v[u] = src[k_off(base, i) + (j[u] - 1) * sd];
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t i = t0 + u * K_THREADS + threadIdx.x;
      if (i >= n) break;
      if (j[u] < 1 || j[u] > bound) k_bad_index(flag, tag);
      else out[i] = v[u];
    }
  }
}

/* Gather along the last dim of rows that fit in shared memory: a block
 * copies a row of src into shared memory (coalesced, each element read
 * once) and serves the row's indices from there.  Random reads from
 * global memory cost about a sector each (32 random elements of a row:
 * about 28 sectors a warp); from shared memory a bank each. */
template <typename E, typename IX>
__global__ void __launch_bounds__(K_THREADS)
gather_rows_k(E *__restrict__ out, const IX *__restrict__ idx, const E *__restrict__ src, int64_t rows, int64_t S,
              int64_t L, int64_t Bo, int *flag, int tag)
{
  const int U = 4;
  extern __shared__ __align__(16) unsigned char k_smem[];
  E *row = (E *)k_smem;
  /* whole 16-byte pieces where every row starts on 16 bytes */
  const int vec = ((uintptr_t)src % 16 == 0) && ((Bo * (int64_t)sizeof(E)) % 16 == 0);
  const int64_t nv = vec ? L * (int64_t)sizeof(E) / 16 : 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const E *s = src + r * Bo;
    const IX *ix = idx + r * S;
    E *o = out + r * S;
    /* the first U * K_THREADS indices in flight with the row's loads */
    int64_t j[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t k = (int64_t)u * K_THREADS + threadIdx.x;
      j[u] = k < S ? (int64_t)ix[k] : 1;
    }
    for (int64_t k = threadIdx.x; k < nv; k += K_THREADS) ((uint4 *)row)[k] = ((const uint4 *)s)[k];
    for (int64_t k = nv * 16 / (int64_t)sizeof(E) + threadIdx.x; k < L; k += K_THREADS) row[k] = s[k];
    __syncthreads();
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t k = (int64_t)u * K_THREADS + threadIdx.x;
      if (k >= S) break;
      if (j[u] < 1 || j[u] > L) k_bad_index(flag, tag);
      else o[k] = row[j[u] - 1];
    }
    for (int64_t k = (int64_t)U * K_THREADS + threadIdx.x; k < S; k += K_THREADS) {
      int64_t jj = (int64_t)ix[k];
      if (jj < 1 || jj > L) k_bad_index(flag, tag);
      else o[k] = row[jj - 1];
    }
    __syncthreads();
  }
}

/* Whether gather (out, idx, src along dim) takes gather_rows_k: along the
 * last dim, out and idx contiguous, idx i64 or i32, src's rows contiguous
 * and evenly spaced (Bo apart) over out's outer dims, a row of src within
 * 48 KiB and at most 4 times out's row (the kernel reads all of it). */
static int gather_rows_plan(const dev_view *out, const dev_view *idx, const dev_view *src, int dim, int64_t *rows,
                            int64_t *S, int64_t *L, int64_t *Bo)
{
  int nd = out->ndim;
  size_t esz = dev_dtype_size(out->dtype);
  if (dim != nd - 1 || !dev_view_contiguous(out) || !dev_view_contiguous(idx) ||
      (idx->dtype != DEV_I64 && idx->dtype != DEV_I32) || src->stride[dim] != 1)
    return 0;
  *S = out->shape[dim];
  *L = src->shape[dim];
  if (*S <= 0 || *L <= 0 || (size_t)*L * esz > 48 * 1024 || *L > 4 * *S) return 0;
  for (int d = 0; d + 2 < nd; d++)
    if (src->stride[d] != src->stride[d + 1] * out->shape[d + 1]) return 0;
  *Bo = nd >= 2 ? src->stride[nd - 2] : 0;
  *rows = dev_view_numel(out) / *S;
  return 1;
}

template <typename E>
static void gather_rows_launch(const dev_view *out, const dev_view *idx, const dev_view *src, int64_t rows,
                               int64_t S, int64_t L, int64_t Bo, const cuk_env *env, int tag)
{
  int64_t cap = (int64_t)(env->sm_count > 0 ? env->sm_count : 132) * 32;
  unsigned grid = (unsigned)(rows < cap ? rows : cap);
  size_t shm = (size_t)L * sizeof(E);
  E *o = (E *)dev_view_ptr(out);
  const E *s = (const E *)dev_view_ptr(src);
  if (idx->dtype == DEV_I64)
    gather_rows_k<E, int64_t><<<grid, K_THREADS, shm, k_stream(env)>>>(o, (const int64_t *)dev_view_ptr(idx), s, rows,
                                                                       S, L, Bo, env->err_flag, tag);
  else
    gather_rows_k<E, int32_t><<<grid, K_THREADS, shm, k_stream(env)>>>(o, (const int32_t *)dev_view_ptr(idx), s, rows,
                                                                       S, L, Bo, env->err_flag, tag);
}

template <typename E>
static void gather_launch(const kview &kout, const kview &kidx, const kview &kbase, int64_t bound, int64_t sd,
                          int64_t n, const cuk_env *env, int tag)
{
  cudaStream_t st = k_stream(env);
  if (kout.contig && kidx.contig && (kidx.dtype == DEV_I64 || kidx.dtype == DEV_I32)) {
    const int U = 4;
    unsigned grid = k_blocks((n + U - 1) / U, env);   /* tiles of U * K_THREADS */
    if (kidx.dtype == DEV_I64)
      gather_contig_k<E, int64_t, U><<<grid, K_THREADS, 0, st>>>((E *)kout.p, (const int64_t *)kidx.p,
                                                                  (const E *)kbase.p, kbase, bound, sd, n,
                                                                  env->err_flag, tag);
    else
      gather_contig_k<E, int32_t, U><<<grid, K_THREADS, 0, st>>>((E *)kout.p, (const int32_t *)kidx.p,
                                                                  (const E *)kbase.p, kbase, bound, sd, n,
                                                                  env->err_flag, tag);
    return;
  }
  gather_k<E><<<k_blocks(n, env), K_THREADS, 0, st>>>(kout, kidx, kbase, bound, sd, n, env->err_flag, tag);
}

/* Bytes of i8/u8 have no atomic add: a compare-and-swap of their word. */
__device__ __forceinline__ void atomic_add_byte(uint8_t *p, uint32_t v)
{
  unsigned int *w = (unsigned int *)((uintptr_t)p & ~(uintptr_t)3);
  unsigned int sh = (unsigned int)((uintptr_t)p & 3) * 8, old = *w, assumed;
  do {
    assumed = old;
    unsigned int b = ((assumed >> sh) + v) & 0xffu;
    old = atomicCAS(w, assumed, (assumed & ~(0xffu << sh)) | (b << sh));
  } while (assumed != old);
}

template <int T> __device__ __forceinline__ void atomic_add_elem(typename kt<T>::S *p, typename kt<T>::S v)
{
  if constexpr (T == DEV_F32) atomicAdd(p, v);
  else if constexpr (T == DEV_F64) atomicAdd(p, v);
  else if constexpr (T == DEV_F16) atomicAdd((__half *)p, __half(__half_raw{v}));
  else if constexpr (T == DEV_BF16) atomicAdd((__nv_bfloat16 *)p, __nv_bfloat16(__nv_bfloat16_raw{v}));
  else if constexpr (T == DEV_I32) atomicAdd((int *)p, (int)v);
  else if constexpr (T == DEV_I64) atomicAdd((unsigned long long *)p, (unsigned long long)v);
  else atomic_add_byte((uint8_t *)p, (uint32_t)(uint8_t)v);
}

/* base[p + (idx[p] - 1) * sd] += src[p], p over idx */
template <int T>
__global__ void __launch_bounds__(K_THREADS)
scatter_add_k(kview base, kview idx, kview src, int64_t bound, int64_t sd, int64_t n, int *flag, int tag)
{
  typedef typename kt<T>::S S;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = k_idx(idx, i);
    if (j < 1 || j > bound) {
      k_bad_index(flag, tag);
      continue;
    }
    atomic_add_elem<T>((S *)base.p + k_off(base, i) + (j - 1) * sd, ((const S *)src.p)[k_off(src, i)]);
  }
}

/* v over shape's shape (v's strides), stride 0 along dim unless keep */
static kview seen_over(const dev_view *v, const dev_view *shape, int dim, int keep)
{
  dev_view r = *v;
  for (int d = 0; d < v->ndim; d++) r.shape[d] = shape->shape[d];
  if (!keep) r.stride[dim] = 0;
  return k_view(&r);
}

int k_index(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  int scatter = op->code == DEV_IDX_SCATTER_ADD, dim = op->dim;
  const dev_view *out = &op->out, *idx = &op->in[scatter ? 0 : 1], *val = &op->in[scatter ? 1 : 0];
  const dev_view *it = scatter ? idx : out, *tgt = scatter ? out : val;
  if (op->nin != 2 || dim < 0 || dim >= out->ndim || idx->ndim != out->ndim || val->ndim != out->ndim ||
      dev_dtype_class(idx->dtype) != DEV_CLS_I || val->dtype != out->dtype)
    return fail_msg(err, errlen, "index: bad operands");
  int64_t n = dev_view_numel(it), bound = tgt->shape[dim], sd = tgt->stride[dim];
  if (n == 0) return 0;
  kview kidx = k_view(idx), kbase = seen_over(tgt, it, dim, 0);
  int tag = op->s0.i > 1 && op->s0.i <= INT_MAX ? (int)op->s0.i : 2;
  cudaStream_t st = k_stream(env);
  unsigned grid = k_blocks(n, env);
  if (!scatter) {
    int64_t rows, S, L, Bo;
    if (gather_rows_plan(out, idx, tgt, dim, &rows, &S, &L, &Bo)) {
      switch (dev_dtype_size(out->dtype)) {
      case 1: gather_rows_launch<uint8_t>(out, idx, tgt, rows, S, L, Bo, env, tag); break;
      case 2: gather_rows_launch<uint16_t>(out, idx, tgt, rows, S, L, Bo, env, tag); break;
      case 4: gather_rows_launch<uint32_t>(out, idx, tgt, rows, S, L, Bo, env, tag); break;
      default: gather_rows_launch<uint64_t>(out, idx, tgt, rows, S, L, Bo, env, tag); break;
      }
      K_LAUNCHED();
      return 0;
    }
    kview kout = k_view(out);
    switch (dev_dtype_size(out->dtype)) {
    case 1: gather_launch<uint8_t>(kout, kidx, kbase, bound, sd, n, env, tag); break;
    case 2: gather_launch<uint16_t>(kout, kidx, kbase, bound, sd, n, env, tag); break;
    case 4: gather_launch<uint32_t>(kout, kidx, kbase, bound, sd, n, env, tag); break;
    default: gather_launch<uint64_t>(kout, kidx, kbase, bound, sd, n, env, tag); break;
    }
    K_LAUNCHED();
    return 0;
  }
  kview ksrc = seen_over(val, it, dim, 1);
  int rc = k_dispatch(out->dtype, [&](auto t) {
    constexpr int T = decltype(t)::value;
    if constexpr (T == DEV_BOOL) {
      return -2;
    } else {
      scatter_add_k<T><<<grid, K_THREADS, 0, st>>>(kbase, kidx, ksrc, bound, sd, n, env->err_flag, tag);
      return 0;
    }
  });
  if (rc == -2) return fail_msg(err, errlen, "scatter_add_ is not supported for %s", dev_dtype_name(out->dtype));
  K_LAUNCHED();
  return 0;
}
