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
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <mutex>

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
    int64_t r = n == len ? 0 : p / len, i = p - r * len;   /* one row: no 64-bit division */
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    if constexpr (W == 64) key[p] = sort_key<T>(pi, sin, i, desc);
    else if constexpr (sizeof(K) == 8) key[p] = (K)r << 32 | sort_key32<T>(pi, sin, i, desc);
    else key[p] = sort_key32<T>(pi, sin, i, desc);
    val[p] = (int)i;
  }
}

/* The sorted pairs' positions (1-based) into out, the first kout of each
 * row, and the values there into ovals (where its p is not NULL: a read of
 * the input the sort has just left in L2): pair p is in row p / len,
 * whichever way it was sorted (the row leads the key, or a segment each). */
template <int T>
__global__ void __launch_bounds__(K_THREADS)
sort_pairs_out(kview oout, int64_t sout, int64_t len, int64_t kout, int64_t n, const int *val, kview oin,
               int64_t sin, kview ovals, int64_t svals)
{
  typedef typename kt<T>::S S;
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = n == len ? 0 : p / len, i = p - r * len;
    if (i >= kout) continue;
    int64_t at = val[p];
    ((int64_t *)oout.p + k_off(oout, r))[i * sout] = at + 1;
    if (ovals.p) ((S *)ovals.p + k_off(ovals, r))[i * svals] = ((const S *)oin.p + k_off(oin, r))[at * sin];
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
 * in the key or there is one row, a segmented one (seg) otherwise, of
 * the segments at off.  tmp NULL: only *bytes, the temporary storage it
 * needs, is set (the buffers are not read). */
template <class K>
static cudaError_t sort_cub(void *tmp, size_t *bytes, cub::DoubleBuffer<K> &kb, cub::DoubleBuffer<int> &vb,
                            int64_t n, int64_t nrows, int bits, int seg, const int64_t *off, cudaStream_t st)
{
  if (seg) return cub::DeviceSegmentedSort::StableSortPairs(tmp, *bytes, kb, vb, n, nrows, off, off + 1, st);
  return cub::DeviceRadixSort::SortPairs(tmp, *bytes, kb, vb, n, 0, bits, st);
}

/* CUB's temporary bytes for a sort's shape, asked once: the query runs
 * CUB's whole dispatch on the host (its policy, occupancy and size
 * computations), which a sort of 1M then paid twice a call.  A few shapes
 * are kept, the last ones asked, per device (its policy and size follow
 * the device's architecture). */
struct cub_need { int64_t n, nrows; int bits, seg, ksize, device; size_t bytes; };
static std::mutex cub_need_mu;
static cub_need cub_needs[8];
static unsigned cub_next;

template <class K>
static cudaError_t sort_cub_bytes(cub::DoubleBuffer<K> &kb, cub::DoubleBuffer<int> &vb, int64_t n, int64_t nrows,
                                  int bits, int seg, cudaStream_t st, size_t *bytes)
{
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaGetLastError();
  cub_need key = {n, nrows, bits, seg, (int)sizeof(K), device, 0};
  {
    std::lock_guard<std::mutex> g(cub_need_mu);
    for (const cub_need &c : cub_needs)
      if (c.n == key.n && c.nrows == key.nrows && c.bits == key.bits && c.seg == key.seg && c.ksize == key.ksize &&
          c.device == key.device && c.n > 0) {
        *bytes = c.bytes;
        return cudaSuccess;
      }
  }
  *bytes = 0;
  cudaError_t e = sort_cub<K>(NULL, bytes, kb, vb, n, nrows, bits, seg, NULL, st);
  if (e != cudaSuccess) return e;
  key.bytes = *bytes;
  std::lock_guard<std::mutex> g(cub_need_mu);
  cub_needs[cub_next++ % 8] = key;
  return cudaSuccess;
}

/* W-bit keys in K: the pairs made, sorted and written out; 1 where there
 * is no device memory for the pairs (the caller sorts another way).  One
 * allocation holds the pairs, their alternates, the offsets and CUB's
 * temporary storage. */
template <int T, int W, class K>
static int sort_radix_as(kview oin, int64_t sin, kview oout, int64_t sout, kview ovals, int64_t svals, int64_t len,
                         int64_t kout, int64_t nrows, int desc, const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  int64_t n = len * nrows;
  int bits = W;
  int segmented = W == 64 && nrows > 1;
  char *buf = NULL;
  /* each array 256-byte aligned, as cudaMallocAsync's own */
  size_t kbytes = ((size_t)n * sizeof(K) + 255) & ~(size_t)255, vbytes = ((size_t)n * sizeof(int) + 255) & ~(size_t)255;
  size_t obytes = segmented ? ((size_t)(nrows + 1) * 8 + 255) & ~(size_t)255 : 0, tbytes = 0;
  cudaError_t e;
  if (W == 32 && sizeof(K) == 8)
    while (((int64_t)1 << (bits - 32)) < nrows) bits++;   /* the row's bits above the key */
  {
    /* the query reads only the shapes, not the buffers */
    cub::DoubleBuffer<K> qk((K *)NULL, (K *)NULL);
    cub::DoubleBuffer<int> qv((int *)NULL, (int *)NULL);
    e = sort_cub_bytes<K>(qk, qv, n, nrows, bits, segmented, st, &tbytes);
    if (e != cudaSuccess) return fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  }
  e = cudaMallocAsync((void **)&buf, 2 * kbytes + 2 * vbytes + obytes + (tbytes ? tbytes : 1), st);
  if (e == cudaErrorMemoryAllocation) {   /* the bitonic sort needs none */
    cudaGetLastError();
    return 1;
  }
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  {
    K *k0 = (K *)buf, *k1 = (K *)(buf + kbytes);
    int *v0 = (int *)(buf + 2 * kbytes), *v1 = (int *)(buf + 2 * kbytes + vbytes);
    int64_t *off = segmented ? (int64_t *)(buf + 2 * kbytes + 2 * vbytes) : NULL;
    void *tmp = buf + 2 * kbytes + 2 * vbytes + obytes;
    cub::DoubleBuffer<K> kb(k0, k1);
    cub::DoubleBuffer<int> vb(v0, v1);
    sort_pairs_in<T, W, K><<<k_blocks(n, env), K_THREADS, 0, st>>>(oin, sin, len, n, desc, k0, v0);
    if ((e = cudaGetLastError()) != cudaSuccess) goto done;
    if (off) {
      sort_offsets<<<k_blocks(nrows + 1, env), K_THREADS, 0, st>>>(off, len, nrows);
      if ((e = cudaGetLastError()) != cudaSuccess) goto done;
    }
    if ((e = sort_cub<K>(tmp, &tbytes, kb, vb, n, nrows, bits, segmented, off, st)) != cudaSuccess) goto done;
    sort_pairs_out<T><<<k_blocks(n, env), K_THREADS, 0, st>>>(oout, sout, len, kout, n, vb.Current(), oin, sin,
                                                               ovals, svals);
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
static int sort_radix(kview oin, int64_t sin, kview oout, int64_t sout, kview ovals, int64_t svals, int64_t len,
                      int64_t kout, int64_t nrows, int desc, const cuk_env *env, char *err, size_t errlen)
{
  if constexpr (sizeof(typename kt<T>::S) > 4)
    return sort_radix_as<T, 64, uint64_t>(oin, sin, oout, sout, ovals, svals, len, kout, nrows, desc, env, err,
                                          errlen);
  else if (nrows == 1)
    return sort_radix_as<T, 32, uint32_t>(oin, sin, oout, sout, ovals, svals, len, kout, nrows, desc, env, err,
                                          errlen);
  else
    return sort_radix_as<T, 32, uint64_t>(oin, sin, oout, sout, ovals, svals, len, kout, nrows, desc, env, err,
                                          errlen);
}

/* ---- topk: a selection ---------------------------------------------------- */

/* topk of k <= TOPK_FAST (any k <= SORT_CHUNK on rows of up to SORT_CHUNK)
 * without a full sort, for short rows and where the radix select below has
 * no memory for its temporaries: each chunk of SORT_CHUNK of a row sorted in shared
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

/* ---- topk of long rows: a radix select ----------------------------------- */

/* topk of k <= TOPK_FAST on rows longer than SORT_CHUNK, in a few reads of
 * the input.  The keys are sort_key32's (dtypes of 4 bytes or less) or
 * sort_key's, as K; T is the k-th smallest key of the row (descending keys
 * are inverted, so "smallest" is the result's order).  Digit passes from
 * the high bits (11 at most) find T: a histogram of the elements whose
 * known high bits equal T's, then one block a row picks the digit where the
 * running count reaches need.  Every element whose known bits are below
 * T's is in the result; need more come from those equal to it.  The result
 * is then gathered (the equal ones by position where only some of them are
 * taken: the stable order's first) and its k sorted by (key, position) in
 * shared memory, as topk_chunk does.  Everything stays on the device: each
 * kernel reads the row's state and a row that is done skips at once. */
#define TSEL_BITS 11
#define TSEL_BINS (1 << TSEL_BITS)
#define TSEL_THREADS 512
#define TSEL_SCAN 256
#define TSEL_SLICE 8192   /* the fewest elements a slice of a row holds */

/* A row's state.  prefix: T's `known` high bits (the rest 0); need: how
 * many of the k are still to come from the elements whose known bits are
 * prefix's; eqn: how many those are (need <= eqn always). */
template <class K> struct tsel { K prefix; int known; unsigned need, eqn; };

template <class K> __device__ __forceinline__ K tsel_mask(int known)
{
  return known == 0 ? (K)0 : ~(K)0 << (8 * (int)sizeof(K) - known);
}

/* Done: T known, or every element matching the prefix taken. */
template <class K> __device__ __forceinline__ bool tsel_done(const tsel<K> &s)
{
  return s.eqn == s.need || s.known == 8 * (int)sizeof(K);
}

template <int T, class K> __device__ __forceinline__ K tsel_key(const typename kt<T>::S *pi, int64_t sin, int64_t e,
                                                                int desc)
{
  if constexpr (sizeof(K) == 8) return sort_key<T>(pi, sin, e, desc);
  else return sort_key32<T>(pi, sin, e, desc);
}

/* The keys of elements e + u * blockDim.x, u < TSEL_UNROLL, those before
 * e1 (bit u of the result): all loaded before any is used, so that the
 * loads are in flight together. */
#define TSEL_UNROLL 4
template <int T, class K>
__device__ __forceinline__ unsigned tsel_keys(const typename kt<T>::S *pi, int64_t sin, int64_t e, int64_t e1,
                                              int desc, K *key)
{
  unsigned in = 0;
#pragma unroll
  for (int u = 0; u < TSEL_UNROLL; u++) {
    int64_t f = e + (int64_t)u * blockDim.x;
    key[u] = f < e1 ? tsel_key<T, K>(pi, sin, f, desc) : (K)0;
    in |= (unsigned)(f < e1) << u;
  }
  return in;
}

/* Block b of the rows' bpr each: its row and its contiguous slice [*e0, *e1)
 * (slices in position order: the ties' ranks need it). */
__device__ __forceinline__ int64_t tsel_slice(int64_t b, int64_t bpr, int64_t len, int64_t *e0, int64_t *e1)
{
  int64_t slice = (len + bpr - 1) / bpr;
  *e0 = (b % bpr) * slice;
  *e1 = min(len, *e0 + slice);
  return b / bpr;
}

/* Every row: need k of len, nothing known; histograms and counters 0. */
template <class K>
__global__ void __launch_bounds__(K_THREADS)
tsel_init(int64_t nrows, int64_t len, int64_t k, tsel<K> *state, unsigned *cnt, unsigned *hist)
{
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nrows * TSEL_BINS;
       i += (int64_t)gridDim.x * blockDim.x) {
    hist[i] = 0;
    if (i < nrows) {
      state[i] = tsel<K>{ (K)0, 0, (unsigned)k, (unsigned)len };
      cnt[i] = 0;
    }
  }
}

/* The pass of bits [lo, hi): each block counts the digits of its slice's
 * elements that match the row's prefix (their bits from hi up known) in
 * shared memory, then adds them to the row's histogram. */
template <int T, class K>
__global__ void __launch_bounds__(TSEL_THREADS)
tsel_hist(kview oin, int64_t sin, int64_t len, int64_t nrows, int64_t bpr, int hi, int lo, int desc,
          const tsel<K> *state, unsigned *hist)
{
  __shared__ unsigned h[TSEL_BINS];
  unsigned dmask = (1u << (hi - lo)) - 1;
  for (int64_t b = blockIdx.x; b < nrows * bpr; b += gridDim.x) {
    int64_t e0, e1, r = tsel_slice(b, bpr, len, &e0, &e1);
    tsel<K> s = state[r];
    if (tsel_done(s)) continue;   /* the same for the whole block */
    K mask = tsel_mask<K>(s.known);
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    for (int i = threadIdx.x; i < TSEL_BINS; i += blockDim.x) h[i] = 0;
    __syncthreads();
    for (int64_t e = e0 + threadIdx.x; e < e1; e += TSEL_UNROLL * blockDim.x) {
      K key[TSEL_UNROLL];
      unsigned in = tsel_keys<T, K>(pi, sin, e, e1, desc, key);
#pragma unroll
      for (int u = 0; u < TSEL_UNROLL; u++)
        if ((in >> u & 1) && ((key[u] ^ s.prefix) & mask) == 0) atomicAdd(&h[(unsigned)(key[u] >> lo) & dmask], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TSEL_BINS; i += blockDim.x)
      if (h[i]) atomicAdd(&hist[r * TSEL_BINS + i], h[i]);
    __syncthreads();
  }
}

/* One block a row: the digit d at lo where the count of the digits below
 * it is < need and with it >= need (one such digit: the counts add up to
 * eqn >= need).  T's digit is d; need less the digits below; the histogram
 * zeroed for the next pass. */
template <class K>
__global__ void __launch_bounds__(TSEL_SCAN)
tsel_scan(int64_t nrows, int lo, tsel<K> *state, unsigned *hist)
{
  typedef cub::BlockScan<unsigned, TSEL_SCAN> scan;
  __shared__ typename scan::TempStorage tmp;
  constexpr int per = TSEL_BINS / TSEL_SCAN;
  for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
    tsel<K> s = state[r];
    if (tsel_done(s)) continue;   /* the same for the whole block */
    unsigned *h = hist + r * TSEL_BINS + threadIdx.x * per, c[per], sum = 0, before;
    for (int i = 0; i < per; i++) sum += c[i] = h[i];
    /* the scan's barriers: every thread has read state[r] before it is written */
    scan(tmp).ExclusiveSum(sum, before);
    for (int i = 0; i < per; i++) {
      if (before < s.need && before + c[i] >= s.need) {
        s.prefix |= (K)(threadIdx.x * per + i) << lo;
        s.known = 8 * (int)sizeof(K) - lo;
        s.need -= before;
        s.eqn = c[i];
        state[r] = s;
      }
      before += c[i];
      h[i] = 0;
    }
    __syncthreads();
  }
}

/* The result's candidates: the elements below the prefix (k - need of
 * them) and, where all of them are taken (eqn == need), those equal to it,
 * to row r's k slots in any order.  Where only need of the eqn equal ones
 * are taken, each block counts its equal ones in eqc for tsel_ties. */
template <int T, class K>
__global__ void __launch_bounds__(TSEL_THREADS)
tsel_gather(kview oin, int64_t sin, int64_t len, int64_t nrows, int64_t bpr, int64_t k, int desc,
            const tsel<K> *state, unsigned *cnt, unsigned *eqc, uint64_t *ck, int64_t *cpos)
{
  __shared__ unsigned neq;
  for (int64_t b = blockIdx.x; b < nrows * bpr; b += gridDim.x) {
    int64_t e0, e1, r = tsel_slice(b, bpr, len, &e0, &e1);
    tsel<K> s = state[r];
    K mask = tsel_mask<K>(s.known);
    bool all = s.eqn == s.need;
    const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
    if (threadIdx.x == 0) neq = 0;
    __syncthreads();
    for (int64_t e = e0 + threadIdx.x; e < e1; e += TSEL_UNROLL * blockDim.x) {
      K key[TSEL_UNROLL];
      unsigned in = tsel_keys<T, K>(pi, sin, e, e1, desc, key);
#pragma unroll
      for (int u = 0; u < TSEL_UNROLL; u++) {
        K km = key[u] & mask;
        if (!(in >> u & 1)) continue;
        if (km < s.prefix || (all && km == s.prefix)) {
          unsigned at = atomicAdd(&cnt[r], 1u);
          if (at < k) {   /* always (the counts are exact); a guard */
            ck[r * k + at] = key[u];
            cpos[r * k + at] = e + (int64_t)u * blockDim.x;
          }
        } else if (km == s.prefix) {
          atomicAdd(&neq, 1u);
        }
      }
    }
    __syncthreads();
    if (!all && threadIdx.x == 0) eqc[b] = neq;
    __syncthreads();
  }
}

/* Where need < eqn (T known): the first need elements equal to T by
 * position to row r's last need slots.  Block b's slice starts at rank
 * base, the count of the row's slices before it (eqc); slices whose base
 * is past need, or with none equal, exit at once.  Within the slice each
 * warp takes a contiguous part: the warps count theirs (TSEL_UNROLL tiles
 * of 32 in flight), a scan of the counts gives each warp its first rank,
 * and the warps whose ranks reach below need walk their part again, a
 * ballot a tile giving the lanes' ranks.  No barrier a tile: the walk is a
 * few rounds of loads, not one a tile. */
template <int T, class K>
__global__ void __launch_bounds__(TSEL_THREADS)
tsel_ties(kview oin, int64_t sin, int64_t len, int64_t nrows, int64_t bpr, int64_t k, int desc,
          const tsel<K> *state, const unsigned *eqc, uint64_t *ck, int64_t *cpos)
{
  __shared__ unsigned wc[TSEL_THREADS / 32], sbase;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t b = blockIdx.x; b < nrows * bpr; b += gridDim.x) {
    int64_t e0, e1, r = tsel_slice(b, bpr, len, &e0, &e1);
    tsel<K> s = state[r];
    if (s.eqn == s.need || eqc[b] == 0) continue;   /* the same for the whole block */
    if (w == 0) {
      unsigned sum = 0;
      for (int64_t j = r * bpr + lane; j < b; j += 32) sum += eqc[j];
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) sbase = sum;
    }
    __syncthreads();
    unsigned base = sbase;
    if (base < s.need) {   /* the same for the whole block */
      const typename kt<T>::S *pi = (const typename kt<T>::S *)oin.p + k_off(oin, r);
      int64_t part = (e1 - e0 + nw - 1) / nw, w0 = min(e1, e0 + w * part), w1 = min(e1, w0 + part);
      unsigned c = 0;
      for (int64_t t = w0 + lane; t < w1 + lane; t += 32 * TSEL_UNROLL) {
        bool f[TSEL_UNROLL];
#pragma unroll
        for (int u = 0; u < TSEL_UNROLL; u++) {
          int64_t e = t + 32 * u;
          f[u] = e < w1 && tsel_key<T, K>(pi, sin, e, desc) == s.prefix;
        }
#pragma unroll
        for (int u = 0; u < TSEL_UNROLL; u++) c += __popc(__ballot_sync(0xffffffffu, f[u]));
      }
      if (lane == 0) wc[w] = c;
      __syncthreads();
      unsigned at = base;
      for (int i = 0; i < w; i++) at += wc[i];
      unsigned below = (1u << lane) - 1;
      for (int64_t t = w0 + lane; t < w1 + lane && at < s.need; t += 32 * TSEL_UNROLL) {
        bool f[TSEL_UNROLL];
#pragma unroll
        for (int u = 0; u < TSEL_UNROLL; u++) {
          int64_t e = t + 32 * u;
          f[u] = e < w1 && tsel_key<T, K>(pi, sin, e, desc) == s.prefix;
        }
#pragma unroll
        for (int u = 0; u < TSEL_UNROLL; u++) {
          unsigned m = __ballot_sync(0xffffffffu, f[u]), rank = at + __popc(m & below);
          if (f[u] && rank < s.need) {
            int64_t slot = r * k + (k - s.need) + rank;
            ck[slot] = (uint64_t)s.prefix;
            cpos[slot] = t + 32 * u;
          }
          at += __popc(m);
        }
      }
    }
    __syncthreads();   /* wc and sbase again */
  }
}

/* Slices a row: about four times as many slices in all as blocks resident
 * on the GPU (the grid below is that many blocks, each taking slices in
 * turn: no part-empty last wave, which cost as much as a full one), each
 * of at least TSEL_SLICE elements (each slice adds its histogram's atomics). */
static int64_t tsel_bpr(int64_t len, int64_t nrows, const cuk_env *env)
{
  int64_t want = (16 * (int64_t)k_sm(env) + nrows - 1) / nrows, most = len / TSEL_SLICE;
  if (want > most) want = most;
  return want > 0 ? want : 1;
}

/* The grid of a select kernel: its resident blocks on the GPU, or fewer
 * where there are fewer slices (4 a multiprocessor if the query fails; it
 * then leaves its error behind, which is cleared: nothing was launched). */
template <typename F> static unsigned tsel_grid(F kernel, int64_t units, const cuk_env *env)
{
  int per = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, TSEL_THREADS, 0) != cudaSuccess || per <= 0) {
    (void)cudaGetLastError();
    per = 4;
  }
  int64_t most = (int64_t)per * k_sm(env);
  return (unsigned)(units < most ? units : most);
}

static size_t tsel_al(size_t n) { return (n + 255) & ~(size_t)255; }

/* The select's kernels in stream order, on buf (tsel_as says its layout). */
template <int T, class K>
static cudaError_t tsel_launch(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t k,
                               int64_t nrows, int desc, int64_t bpr, char *buf, const cuk_env *env)
{
  cudaStream_t st = k_stream(env);
  tsel<K> *state = (tsel<K> *)buf;
  unsigned *hist = (unsigned *)(buf + tsel_al((size_t)nrows * sizeof(tsel<K>)));
  unsigned *cnt = hist + (size_t)nrows * TSEL_BINS, *eqc = (unsigned *)((char *)cnt + tsel_al((size_t)nrows * 4));
  uint64_t *ck = (uint64_t *)((char *)eqc + tsel_al((size_t)(nrows * bpr) * 4));
  int64_t *cpos = (int64_t *)(ck + nrows * k);
  unsigned hgrid = tsel_grid(tsel_hist<T, K>, nrows * bpr, env), ggrid = tsel_grid(tsel_gather<T, K>, nrows * bpr, env);
  unsigned tgrid = tsel_grid(tsel_ties<T, K>, nrows * bpr, env);
  unsigned rgrid = (unsigned)(nrows < INT32_MAX ? nrows : INT32_MAX);
  cudaError_t e;
  tsel_init<K><<<k_blocks(nrows * TSEL_BINS, env), K_THREADS, 0, st>>>(nrows, len, k, state, cnt, hist);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  for (int hi = 8 * (int)sizeof(K), lo; hi > 0; hi = lo) {
    lo = hi > TSEL_BITS ? hi - TSEL_BITS : 0;
    tsel_hist<T, K><<<hgrid, TSEL_THREADS, 0, st>>>(oin, sin, len, nrows, bpr, hi, lo, desc, state, hist);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    tsel_scan<K><<<rgrid, TSEL_SCAN, 0, st>>>(nrows, lo, state, hist);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  tsel_gather<T, K><<<ggrid, TSEL_THREADS, 0, st>>>(oin, sin, len, nrows, bpr, k, desc, state, cnt, eqc, ck, cpos);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  tsel_ties<T, K><<<tgrid, TSEL_THREADS, 0, st>>>(oin, sin, len, nrows, bpr, k, desc, state, eqc, ck, cpos);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  /* the k candidates of a row: one chunk, sorted, its positions to out */
  topk_chunk<T><<<rgrid, k <= 64 ? 32 : ((int)(k + 63) / 64) * 32, 0, st>>>(oin, sin, ck, cpos, k, nrows, k, desc,
                                                                           NULL, NULL, 0, oout, sout);
  return cudaGetLastError();
}

/* The select on its temporaries (the rows' states, histograms and
 * counters, the blocks' tie counts, k candidates a row), stream ordered;
 * 1 where there is no device memory for them (the caller goes by rounds). */
template <int T>
static int topk_select(kview oin, int64_t sin, kview oout, int64_t sout, int64_t len, int64_t k, int64_t nrows,
                       int desc, const cuk_env *env, char *err, size_t errlen)
{
  typedef typename std::conditional<(sizeof(typename kt<T>::S) > 4), uint64_t, uint32_t>::type K;
  cudaStream_t st = k_stream(env);
  int64_t bpr = tsel_bpr(len, nrows, env);
  size_t bytes = tsel_al((size_t)nrows * sizeof(tsel<K>)) + (size_t)nrows * TSEL_BINS * 4 +
                 tsel_al((size_t)nrows * 4) + tsel_al((size_t)(nrows * bpr) * 4) + (size_t)(nrows * k) * 16;
  char *buf = NULL;
  cudaError_t e = cudaMallocAsync((void **)&buf, bytes, st), f;
  if (e == cudaErrorMemoryAllocation) {   /* the rounds need less */
    cudaGetLastError();
    return 1;
  }
  if (e != cudaSuccess) return fail_msg(err, errlen, "%s:%d: topk: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  e = tsel_launch<T, K>(oin, sin, oout, sout, len, k, nrows, desc, bpr, buf, env);
  f = cudaFreeAsync(buf, st);
  if (e == cudaSuccess) e = f;
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

/* DEV_SORT_VALUES where the path did not write them: the values at the
 * positions in out, a gather along dim (k_index's; the positions are in
 * range, so its check never fires). */
static int sort_values(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  dev_kop g;
  memset(&g, 0, sizeof g);
  g.kind = DEV_OP_INDEX;
  g.code = DEV_IDX_GATHER;
  g.nin = 2;
  g.dim = op->dim;
  g.out = op->fargs->xout[0];
  g.in[0] = op->in[0];
  g.in[1] = op->out;
  return k_index(&g, env, err, errlen);
}

int k_sort(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  int dim = op->dim, desc = op->code & DEV_SORT_DESCENDING;
  int values = (op->code & DEV_SORT_VALUES) && op->fargs, wrote = 0;
  int64_t len, kout, sin, sout, kv = 0, svals = 0;
  if (dim < 0 || dim >= src->ndim || src->ndim != out->ndim || out->dtype != DEV_I64)
    return fail_msg(err, errlen, "sort: bad dim %d or result dtype", dim);
  if (values && (op->fargs->xout[0].ndim != out->ndim || op->fargs->xout[0].dtype != src->dtype))
    return fail_msg(err, errlen, "sort: bad values view");
  kview oin = sort_outer(src, dim, &len, &sin), oout = sort_outer(out, dim, &kout, &sout), ovals;
  if (values) ovals = sort_outer(&op->fargs->xout[0], dim, &kv, &svals);
  else memset(&ovals, 0, sizeof ovals);
  int64_t nrows = dev_view_numel(src) / (len > 0 ? len : 1);
  if (kout > len) return fail_msg(err, errlen, "sort: %lld results of rows of %lld", (long long)kout, (long long)len);
  if (len == 0 || nrows == 0 || kout == 0) return 0;
  /* topk: a selection for small k (or short rows), the radix select for
   * long rows (the rounds without the memory for it); the radix sort's
   * first kout past it; without the memory for that, rounds up to TOPK_MAX */
  int select = kout < len && (kout <= TOPK_FAST || len <= SORT_CHUNK);
  int rc = k_dispatch(src->dtype, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (select && len > SORT_CHUNK && kout <= TOPK_FAST && len <= INT32_MAX) {
      int r = topk_select<T>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
      if (r != 1) return r;
    }
    if (select) return topk_runs<T>(oin, sin, oout, sout, len, kout, nrows, desc, env, err, errlen);
    if (sort_radix_fits(len, nrows)) {
      int r = sort_radix<T>(oin, sin, oout, sout, ovals, svals, len, kout, nrows, desc, env, err, errlen);
      wrote = r == 0;
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
  if (rc == 0 && values && !wrote) rc = sort_values(op, env, err, errlen);
  return rc;
}
