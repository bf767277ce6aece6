/* DEV_OP_SORT: the 1-based positions of each run along dim in sorted order,
 * written into out (i64).  Keys are made so that unsigned order is the
 * sort's order (NaN above every number; descending inverts them), and ties
 * go by position, so the order is total and the sort stable, like the
 * host's (cpu_sort.c).
 *
 * A bitonic network in the form that sorts any length n: the first step of
 * each merge compares i with its mirror i ^ (k - 1), the later ones i with
 * i + j, all ascending, and a partner at n or beyond (a virtual +inf) is
 * skipped.  Runs of up to SORT_CHUNK go through shared memory, a block each.
 * Longer runs: each chunk is sorted that way, then every merge of size
 * k > SORT_CHUNK does its steps with j >= SORT_CHUNK in global memory (one
 * launch each, on the positions in out, the keys read again from in) and
 * the rest in shared memory.  That path is n log^2 n work: it is kept for
 * rows of up to SORT_CHUNK (one launch, shared memory only) and for sizes
 * the radix path below cannot index.
 *
 * Longer rows go through CUB's stable radix sort (sort_radix): the same keys
 * (narrowed to 32 bits for dtypes of 4 bytes or less, whose order they keep
 * exactly) paired with each element's position in its row.  Many rows of a
 * 32-bit key sort as one batch with the row in the key's high bits (the
 * whole GPU on one sort, where a segment per block would leave it idle);
 * 64-bit keys of many rows go through CUB's segmented stable sort.  Radix
 * sorts are stable, so ties keep their input order, as the host's. */
#define CCCL_DISABLE_NVTX
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include "k_common.cuh"

K_MODULE(sort)

#define SORT_CHUNK 2048
#define SORT_THREADS 1024

template <int T> __device__ __forceinline__ uint64_t sort_key(const typename kt<T>::S *pi, int64_t sin, int64_t e,
                                                              int desc)
{
  uint64_t k;
  if constexpr (kt<T>::cls == KC_INT) {
    k = (uint64_t)k_load_i<T>(pi[e * sin]) ^ (1ull << 63);
  } else {
    double d = k_load_d<T>(pi[e * sin]);
    if (d != d) {
      k = ~0ull;
    } else {
      uint64_t u = (uint64_t)__double_as_longlong(d + 0.0);   /* -0 as +0 */
      k = u >> 63 ? ~u : u | (1ull << 63);
    }
  }
  return desc ? ~k : k;
}

__device__ __forceinline__ bool sort_less(uint64_t ka, int64_t ia, uint64_t kb, int64_t ib)
{
  return ka < kb || (ka == kb && ia < ib);
}

/* One block per chunk of a run: kk == 0 sorts the chunk (its positions
 * 0-based from the chunk's start), kk > SORT_CHUNK does the steps j <
 * SORT_CHUNK of the merge of size kk on the positions already in out. */
template <int T>
__global__ void __launch_bounds__(SORT_THREADS)
sort_chunk(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t nrows, int64_t kk, int desc)
{
  __shared__ uint64_t key[SORT_CHUNK];
  __shared__ int64_t pos[SORT_CHUNK];
  int64_t nchunks = (len + SORT_CHUNK - 1) / SORT_CHUNK;
  for (int64_t b = blockIdx.x; b < nrows * nchunks; b += gridDim.x) {
    int64_t r = b / nchunks, c0 = (b % nchunks) * SORT_CHUNK;
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    int64_t *po = (int64_t *)oout.p + k_off(oout, r);
    int n = (int)min(len - c0, (int64_t)SORT_CHUNK), p2 = 1;
    while (p2 < n) p2 <<= 1;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      int64_t at = kk ? po[(c0 + e) * sout] - 1 : c0 + e;
      pos[e] = at;
      key[e] = sort_key<T>(pi, sin, at, desc);
    }
    __syncthreads();
    /* a merge's last steps: j from SORT_CHUNK / 2, whatever n (a short last
     * chunk pairs fewer); a sort: every merge up to p2 */
    for (int k = kk ? 2 * SORT_CHUNK : 2; k <= (kk ? 2 * SORT_CHUNK : p2); k <<= 1) {
      for (int j = (kk ? SORT_CHUNK : k) >> 1; j > 0; j >>= 1) {
        int flip = !kk && j == k >> 1;
        for (int q = threadIdx.x; q < p2 / 2; q += blockDim.x) {
          int i = (q / j) * 2 * j + q % j, l = flip ? i ^ (k - 1) : i + j;
          if (l < n && sort_less(key[l], pos[l], key[i], pos[i])) {
            uint64_t tk = key[i];
            int64_t tp = pos[i];
            key[i] = key[l], pos[i] = pos[l];
            key[l] = tk, pos[l] = tp;
          }
        }
        __syncthreads();
      }
    }
    for (int e = threadIdx.x; e < n; e += blockDim.x) po[(c0 + e) * sout] = pos[e] + 1;
    __syncthreads();
  }
}

/* One step (k, j) of a merge over whole runs, on the positions in out. */
template <int T>
__global__ void __launch_bounds__(K_THREADS)
sort_step(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t p2, int64_t nrows, int64_t k,
          int64_t j, int desc)
{
  int64_t half = p2 / 2;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < nrows * half;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = t / half, q = t % half;
    int64_t i = (q / j) * 2 * j + q % j, l = j == k / 2 ? i ^ (k - 1) : i + j;
    if (l >= len) continue;
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    int64_t *po = (int64_t *)oout.p + k_off(oout, r);
    int64_t a = po[i * sout] - 1, b = po[l * sout] - 1;
    if (sort_less(sort_key<T>(pi, sin, b, desc), b, sort_key<T>(pi, sin, a, desc), a)) {
      po[i * sout] = b + 1;
      po[l * sout] = a + 1;
    }
  }
}

/* ---- long rows: CUB's radix sort ------------------------------------------ */

/* sort_key's order in 32 bits, for the dtypes of 4 bytes or less: floats
 * (f16/bf16 exact as float) by their float bits, integers (all in int32
 * range) with the sign bit flipped. */
template <int T> __device__ __forceinline__ uint32_t sort_key32(const typename kt<T>::S *pi, int64_t sin, int64_t e,
                                                                int desc)
{
  uint32_t k;
  if constexpr (kt<T>::cls == KC_INT) {
    k = (uint32_t)(int32_t)k_load_i<T>(pi[e * sin]) ^ 0x80000000u;
  } else {
    float f = (float)k_load_d<T>(pi[e * sin]);
    if (f != f) {
      k = ~0u;
    } else {
      uint32_t u = __float_as_uint(f + 0.0f);   /* -0 as +0 */
      k = u >> 31 ? ~u : u | 0x80000000u;
    }
  }
  return desc ? ~k : k;
}

/* The pairs to sort: element i of row r keyed, with i as its value.  W is
 * the key's width: a 32-bit key in a 64-bit K carries the row above it. */
template <int T, int W, class K>
__global__ void __launch_bounds__(K_THREADS)
sort_pairs_in(kview oin, int64_t sin, int64_t len, int64_t n, int desc, K *key, int *val)
{
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = p / len, i = p - r * len;
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    if constexpr (W == 64) key[p] = sort_key<T>(pi, sin, i, desc);
    else if constexpr (sizeof(K) == 8) key[p] = (K)r << 32 | sort_key32<T>(pi, sin, i, desc);
    else key[p] = sort_key32<T>(pi, sin, i, desc);
    val[p] = (int)i;
  }
}

/* The sorted pairs' positions (1-based) into out, the first kout of each
 * row: pair p is in row p / len, whichever way it was sorted (the row leads
 * the key, or a segment each). */
__global__ void __launch_bounds__(K_THREADS)
sort_pairs_out(kview oout, int64_t sout, int64_t len, int64_t kout, int64_t n, const int *val)
{
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = p / len, i = p - r * len;
    if (i < kout) ((int64_t *)oout.p + k_off(oout, r))[i * sout] = (int64_t)val[p] + 1;
  }
}

/* Row r's segment starts at r * len (r = 0..nrows: its end too). */
__global__ void __launch_bounds__(K_THREADS) sort_offsets(int64_t *off, int64_t len, int64_t nrows)
{
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r <= nrows; r += (int64_t)gridDim.x * blockDim.x)
    off[r] = r * len;
}

/* CUB's sort of the n = nrows * len pairs in kb/vb (their alternate
 * buffers beside them): one radix sort of the bits [0, bits) when the row is
 * in the key or there is one row, a segmented one otherwise.  The
 * temporary storage is stream ordered, as every other buffer here. */
template <class K>
static cudaError_t sort_cub(cub::DoubleBuffer<K> &kb, cub::DoubleBuffer<int> &vb, int64_t n, int64_t nrows, int bits,
                            const int64_t *off, cudaStream_t st)
{
  size_t bytes = 0;
  void *tmp = NULL;
  cudaError_t e;
  for (int pass = 0; pass < 2; pass++) {
    if (off)
      e = cub::DeviceSegmentedSort::StableSortPairs(tmp, bytes, kb, vb, n, nrows, off, off + 1, st);
    else
      e = cub::DeviceRadixSort::SortPairs(tmp, bytes, kb, vb, n, 0, bits, st);
    if (e != cudaSuccess || pass == 1) break;
    if ((e = cudaMallocAsync(&tmp, bytes ? bytes : 1, st)) != cudaSuccess) return e;
  }
  cudaError_t f = tmp ? cudaFreeAsync(tmp, st) : cudaSuccess;
  return e != cudaSuccess ? e : f;
}

/* W-bit keys in K: the pairs made, sorted and written out; 1 where there
 * is no device memory for the pairs (the caller sorts another way). */
template <int T, int W, class K>
static int sort_radix_as(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t kout, int64_t nrows,
                         int desc, const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  int64_t n = len * nrows;
  int bits = W;
  int segmented = W == 64 && nrows > 1;
  char *buf = NULL;
  /* each of the five arrays 256-byte aligned, as cudaMallocAsync's own */
  size_t kbytes = ((size_t)n * sizeof(K) + 255) & ~(size_t)255, vbytes = ((size_t)n * sizeof(int) + 255) & ~(size_t)255;
  cudaError_t e;
  if (W == 32 && sizeof(K) == 8)
    while (((int64_t)1 << (bits - 32)) < nrows) bits++;   /* the row's bits above the key */
  e = cudaMallocAsync((void **)&buf, 2 * kbytes + 2 * vbytes + (segmented ? (size_t)(nrows + 1) * 8 : 0), st);
  if (e == cudaErrorMemoryAllocation) {   /* the bitonic sort needs none */
    cudaGetLastError();
    return 1;
  }
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  {
    K *k0 = (K *)buf, *k1 = (K *)(buf + kbytes);
    int *v0 = (int *)(buf + 2 * kbytes), *v1 = (int *)(buf + 2 * kbytes + vbytes);
    int64_t *off = segmented ? (int64_t *)(buf + 2 * kbytes + 2 * vbytes) : NULL;
    cub::DoubleBuffer<K> kb(k0, k1);
    cub::DoubleBuffer<int> vb(v0, v1);
    sort_pairs_in<T, W, K><<<k_blocks(n, env), K_THREADS, 0, st>>>(oin, sin, len, n, desc, k0, v0);
    if ((e = cudaGetLastError()) != cudaSuccess) goto done;
    if (off) {
      sort_offsets<<<k_blocks(nrows + 1, env), K_THREADS, 0, st>>>(off, len, nrows);
      if ((e = cudaGetLastError()) != cudaSuccess) goto done;
    }
    if ((e = sort_cub<K>(kb, vb, n, nrows, bits, off, st)) != cudaSuccess) goto done;
    sort_pairs_out<<<k_blocks(n, env), K_THREADS, 0, st>>>(oout, sout, len, kout, n, vb.Current());
    e = cudaGetLastError();
  }
done:
  {
    cudaError_t f = cudaFreeAsync(buf, st);
    if (e == cudaSuccess) e = f;
  }
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return 0;
}

/* Whether the radix path takes rows of len: longer than the shared-memory
 * sort's, positions in int, and the row fitting above a 32-bit key. */
static int sort_radix_fits(int64_t len, int64_t nrows)
{
  return len > SORT_CHUNK && len <= INT32_MAX && nrows <= ((int64_t)1 << 31);
}

template <int T>
static int sort_radix(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t kout, int64_t nrows,
                      int desc, const cuk_env *env, char *err, size_t errlen)
{
  if constexpr (sizeof(typename kt<T>::S) > 4)
    return sort_radix_as<T, 64, uint64_t>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
  else if (nrows == 1)
    return sort_radix_as<T, 32, uint32_t>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
  else
    return sort_radix_as<T, 32, uint64_t>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
}

/* ---- topk: a selection ---------------------------------------------------- */

/* topk of k <= TOPK_FAST (any k <= SORT_CHUNK on rows of up to SORT_CHUNK)
 * without a full sort: each chunk of SORT_CHUNK of a row sorted in shared
 * memory as sort_chunk does, its first k kept as (key, position)
 * candidates; then the same over the candidates, round after round, until
 * a row's fit one chunk, whose first k are the result.  The first k of a
 * union are among the first k of its parts, and (key, position) is a total
 * order, so the result is the full stable sort's first k. */
#define TOPK_FAST 256
#define TOPK_MAX (SORT_CHUNK / 2)   /* a round at least halves the candidates */

/* The candidates a round keeps of m per row: k of each chunk (fewer of a
 * short last one). */
static int64_t topk_kept(int64_t m, int64_t k)
{
  int64_t nch = (m + SORT_CHUNK - 1) / SORT_CHUNK, last = m - (nch - 1) * SORT_CHUNK;
  return (nch - 1) * k + (last < k ? last : k);
}

/* One round: m items a row, from the tensor (ck NULL: the positions
 * 0..m-1) or from the last round's candidates (row r's at r * m); the first
 * k of each chunk to ok/opos (row r's at r * mo, chunk c's at c * k), or,
 * ok NULL (one chunk a row), as 1-based positions into out. */
template <int T>
__global__ void __launch_bounds__(SORT_THREADS)
topk_chunk(kview oin, int64_t sin, const uint64_t *ck, const int64_t *cpos, int64_t m, int64_t nrows, int64_t k,
           int desc, uint64_t *ok, int64_t *opos, int64_t mo, kview oout, int64_t sout)
{
  __shared__ uint64_t key[SORT_CHUNK];
  __shared__ int64_t pos[SORT_CHUNK];
  int64_t nchunks = (m + SORT_CHUNK - 1) / SORT_CHUNK;
  for (int64_t b = blockIdx.x; b < nrows * nchunks; b += gridDim.x) {
    int64_t r = b / nchunks, c = b % nchunks, c0 = c * SORT_CHUNK;
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    int n = (int)min(m - c0, (int64_t)SORT_CHUNK), p2 = 1, nk = (int)min((int64_t)n, k);
    while (p2 < n) p2 <<= 1;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      if (ck) {
        key[e] = ck[r * m + c0 + e];
        pos[e] = cpos[r * m + c0 + e];
      } else {
        pos[e] = c0 + e;
        key[e] = sort_key<T>(pi, sin, c0 + e, desc);
      }
    }
    __syncthreads();
    for (int kq = 2; kq <= p2; kq <<= 1) {
      for (int j = kq >> 1; j > 0; j >>= 1) {
        for (int q = threadIdx.x; q < p2 / 2; q += blockDim.x) {
          int i = (q / j) * 2 * j + q % j, l = j == kq >> 1 ? i ^ (kq - 1) : i + j;
          if (l < n && sort_less(key[l], pos[l], key[i], pos[i])) {
            uint64_t tk = key[i];
            int64_t tp = pos[i];
            key[i] = key[l], pos[i] = pos[l];
            key[l] = tk, pos[l] = tp;
          }
        }
        __syncthreads();
      }
    }
    if (ok) {
      for (int e = threadIdx.x; e < nk; e += blockDim.x) {
        ok[r * mo + c * k + e] = key[e];
        opos[r * mo + c * k + e] = pos[e];
      }
    } else {
      int64_t *po = (int64_t *)oout.p + k_off(oout, r);
      for (int e = threadIdx.x; e < nk; e += blockDim.x) po[e * sout] = pos[e] + 1;
    }
    __syncthreads();
  }
}

template <int T>
static int topk_runs(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t kout, int64_t nrows,
                     int desc, const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  int64_t m = len, side = len > SORT_CHUNK ? nrows * topk_kept(len, kout) : 0;   /* candidates, the most */
  char *buf = NULL;
  const uint64_t *ck = NULL;
  const int64_t *cpos = NULL;
  cudaError_t e = cudaSuccess;
  if (side && (e = cudaMallocAsync((void **)&buf, (size_t)side * 32, st)) != cudaSuccess)
    return fail_msg(err, errlen, "%s:%d: topk: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  for (int round = 0;; round++) {
    int64_t nch = (m + SORT_CHUNK - 1) / SORT_CHUNK, mo = nch > 1 ? topk_kept(m, kout) : kout;
    char *half = buf + (round & 1) * side * 16;   /* the two halves in turn */
    uint64_t *ok = nch > 1 ? (uint64_t *)half : NULL;
    int64_t *opos = nch > 1 ? (int64_t *)(half + side * 8) : NULL;
    unsigned grid = (unsigned)(nrows * nch < INT32_MAX ? nrows * nch : INT32_MAX);
    int threads = m >= 2 * SORT_THREADS ? SORT_THREADS : m <= 64 ? 32 : ((int)(m + 63) / 64) * 32;
    topk_chunk<T><<<grid, threads, 0, st>>>(oin, sin, ck, cpos, m, nrows, kout, desc, ok, opos, mo, oout, sout);
    if ((e = cudaGetLastError()) != cudaSuccess || nch == 1) break;
    ck = ok, cpos = opos, m = mo;
  }
  if (buf) {
    cudaError_t f = cudaFreeAsync(buf, st);
    if (e == cudaSuccess) e = f;
  }
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s:%d: topk: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return 0;
}

/* The other dims of v (as a kview) and the run along dim. */
static kview sort_outer(const dev_view *v, int dim, int64_t *len, int64_t *rstride)
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

template <int T>
static int sort_runs(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t nrows, int desc,
                     const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  int64_t nchunks = (len + SORT_CHUNK - 1) / SORT_CHUNK, p2 = 1;
  unsigned grid = (unsigned)(nrows * nchunks < INT32_MAX ? nrows * nchunks : INT32_MAX);
  int threads = len >= 2 * SORT_THREADS ? SORT_THREADS : len <= 64 ? 32 : ((int)(len + 63) / 64) * 32;
  sort_chunk<T><<<grid, threads, 0, st>>>(oin, sin, oout, sout, len, nrows, 0, desc);
  K_LAUNCHED();
  while (p2 < len) p2 <<= 1;
  for (int64_t k = 2 * SORT_CHUNK; k <= p2; k <<= 1) {
    for (int64_t j = k / 2; j >= SORT_CHUNK; j /= 2) {
      sort_step<T><<<k_blocks(nrows * (p2 / 2), env), K_THREADS, 0, st>>>(oin, sin, oout, sout, len, p2, nrows, k,
                                                                          j, desc);
      K_LAUNCHED();
    }
    sort_chunk<T><<<grid, SORT_THREADS, 0, st>>>(oin, sin, oout, sout, len, nrows, k, desc);
    K_LAUNCHED();
  }
  return 0;
}

int k_sort(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  int dim = op->dim, desc = op->code & DEV_SORT_DESCENDING;
  int64_t len, kout, sin, sout;
  if (dim < 0 || dim >= src->ndim || src->ndim != out->ndim || out->dtype != DEV_I64)
    return fail_msg(err, errlen, "sort: bad dim %d or result dtype", dim);
  kview oin = sort_outer(src, dim, &len, &sin), oout = sort_outer(out, dim, &kout, &sout);
  int64_t nrows = dev_view_numel(src) / (len > 0 ? len : 1);
  if (kout > len) return fail_msg(err, errlen, "sort: %lld results of rows of %lld", (long long)kout, (long long)len);
  if (len == 0 || nrows == 0 || kout == 0) return 0;
  /* topk: a selection for small k (or short rows); the radix sort's first
   * kout past it; without the memory for that, a selection up to TOPK_MAX */
  int select = kout < len && (kout <= TOPK_FAST || len <= SORT_CHUNK);
  int rc = k_dispatch(src->dtype, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (select) return topk_runs<T>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
    if (sort_radix_fits(len, nrows)) {
      int r = sort_radix<T>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
      if (r != 1) return r;
    }
    if (kout < len && kout <= TOPK_MAX)
      return topk_runs<T>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
    if (kout < len)
      return fail_msg(err, errlen, "topk: k = %lld of rows of %lld: no device memory for the sort", (long long)kout,
                      (long long)len);
    return sort_runs<T>(oin, sin, oout, sout, len, nrows, desc, env, err, errlen);
  });
  if (rc == -2) return fail_msg(err, errlen, "sort: bad dtype %d", (int)src->dtype);
  return rc;
}
