/* DEV_OP_COPY: out = in[0], same dtype and element count, in flat C order
 * whatever the strides.  Raw element moves by size; no conversion.
 *
 * A copy that transposes (in contiguous along one dim, out along another:
 * m:t():contiguous(), a permuted reshape, cat of transposed parts) goes
 * through square tiles in shared memory, so that both its reads and its
 * writes are coalesced: 64 x 64 where both transposed dims are that long
 * (8 elements in flight per thread: 2727 GB/s on an 8192 x 8192 f32 on an
 * H100 against 2150 for 32 x 32 tiles, bench/RESULTS.md), else 32 x 32.
 * Any other copy walks out in order and gathers in. */
#include "k_common.cuh"

K_MODULE(copy)

#define KT_TILE 32   /* transpose tile edge: the small tile */
#define KT_BIG 64    /* the large tile, where both transposed dims reach it */
#define KT_ROWS 8    /* thread rows of a tile's block: tile / KT_ROWS elements per thread and side */
#define KT_MIN 16    /* shortest transposed dim worth a tile */
/* Blocks per SM the kernel is built for with 32 x 32 tiles, to keep loads
 * in flight: 8 (32 registers) for elements up to 4 bytes; 8-byte ones spill
 * there (ptxas -v) and carry twice the bytes per load: 4.  64 x 64 tiles
 * have blocks twice as large: half as many. */
#define KT_BLOCKS(E) (sizeof(E) < 8 ? 8 : 4)

/* A copy as a batch of 2-D transposes.  Element (a, b) of batch z is
 * in[ib + a + b * isb] and out[ob + b + a * osa], where ib and ob are batch
 * z's offsets over the batch dims (outermost first): in is contiguous along
 * a, out along b.  Strides and offsets in elements. */
typedef struct ktrans {
  char *out, *in;
  int64_t na, nb;   /* extents of a and b */
  int64_t isb, osa; /* in's stride along b, out's along a */
  int64_t nbatch;   /* product of bshape */
  int bdim;
  int64_t bshape[DEV_MAXDIM], bout[DEV_MAXDIM], bin[DEV_MAXDIM];
} ktrans;

/* ---- kernels ------------------------------------------------------------- */

template <typename E>
__global__ void __launch_bounds__(K_THREADS) copy_kernel(kview out, kview in, int64_t n)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth) *k_at<E>(out, i) = *k_at<E>(in, i);
}

/* out[i] = in[-i] (in: the address of the run's first element, which
 * walks back: a flip), 16 bytes a step where both ends are aligned so, the
 * elements of each step reversed in registers; then the rest one by one. */
template <typename E>
__global__ void __launch_bounds__(K_THREADS) copy_reversed(E *out, const E *in, int64_t n, int vec)
{
  constexpr int V = 16 / sizeof(E);
  union pack { uint4 u; E x[V]; };
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  int64_t nv = vec ? n / V : 0, v = tid;
  for (; v + 3 * nth < nv; v += 4 * nth) {   /* four loads in flight */
    pack a[4], b;
#pragma unroll
    for (int u = 0; u < 4; u++) a[u].u = *(const uint4 *)(in - ((v + u * nth) * V + V - 1));
#pragma unroll
    for (int u = 0; u < 4; u++) {
#pragma unroll
      for (int j = 0; j < V; j++) b.x[j] = a[u].x[V - 1 - j];
      ((uint4 *)out)[v + u * nth] = b.u;
    }
  }
  for (; v < nv; v += nth) {
    pack a, b;
    a.u = *(const uint4 *)(in - (v * V + V - 1));
#pragma unroll
    for (int j = 0; j < V; j++) b.x[j] = a.x[V - 1 - j];
    ((uint4 *)out)[v] = b.u;
  }
  for (int64_t i = nv * V + tid; i < n; i += nth) out[i] = in[-i];
}

/* Batch z's offsets (elements) of in and out.  Not unrolled: the common
 * copy has no batch dims, and an unrolled walk of all DEV_MAXDIM made the
 * kernel spill at its 32 registers (0.78 of D2D on an H200 against 0.94). */
static __device__ __forceinline__ void trans_batch(const ktrans &t, int64_t z, int64_t *ib, int64_t *ob)
{
  int64_t i = 0, o = 0;
#ifdef __CUDA_ARCH__
#pragma unroll 1
#endif
  for (int d = t.bdim - 1; d >= 0; d--) {
    int64_t q = z / t.bshape[d], c = z - q * t.bshape[d];
    o += c * t.bout[d];
    i += c * t.bin[d];
    z = q;
  }
  *ib = i;
  *ob = o;
}

/* Blocks of TILE x KT_ROWS threads, one tile each: x along a, y along
 * b, z over the batch, each a grid-stride loop for grids at their limits.
 * EDGE: na or nb is not a multiple of TILE, and each element is checked.
 * Where both are, the kernel has no check at all: a branch per element in
 * it read 0.78 of D2D on an H200 (8192 x 8192 f32), a clamped index 0.88,
 * none 0.95 (bench/RESULTS.md, 2026-11-28).  Clamped or split launches did
 * worse than the branches at odd sizes (8191: 0.58-0.64 against 0.68). */
template <typename E, int TILE, bool EDGE>
__global__ void __launch_bounds__(TILE * KT_ROWS, KT_BLOCKS(E) * 32 / TILE) transpose_kernel(ktrans t)
{
  /* +1: a column of the tile falls in different banks */
  __shared__ E tile[TILE][TILE + 1];
  E v[TILE / KT_ROWS];
  const int tx = threadIdx.x, ty = threadIdx.y;
  /* the tile loops' bounds are block-uniform: the barriers are reached by all */
  for (int64_t z = blockIdx.z; z < t.nbatch; z += gridDim.z) {
    int64_t ib, ob;
    trans_batch(t, z, &ib, &ob);
    for (int64_t b0 = (int64_t)blockIdx.y * TILE; b0 < t.nb; b0 += (int64_t)gridDim.y * TILE) {
      for (int64_t a0 = (int64_t)blockIdx.x * TILE; a0 < t.na; a0 += (int64_t)gridDim.x * TILE) {
        /* read: lanes along a, where in is contiguous, every load issued
         * before the first store; v[k] is tile[ty + k * KT_ROWS][tx] */
K_UNROLL
        for (int k = 0; k < TILE / KT_ROWS; k++)
          if (!EDGE || (a0 + tx < t.na && b0 + ty + k * KT_ROWS < t.nb))
            v[k] = ((const E *)t.in)[ib + (a0 + tx) + (b0 + ty + k * KT_ROWS) * t.isb];
K_UNROLL
        for (int k = 0; k < TILE / KT_ROWS; k++)
          if (!EDGE || (a0 + tx < t.na && b0 + ty + k * KT_ROWS < t.nb)) tile[ty + k * KT_ROWS][tx] = v[k];
        __syncthreads();
        /* write: lanes along b, where out is contiguous */
K_UNROLL
        for (int k = 0; k < TILE / KT_ROWS; k++)
          if (!EDGE || (b0 + tx < t.nb && a0 + ty + k * KT_ROWS < t.na))
            ((E *)t.out)[ob + (b0 + tx) + (a0 + ty + k * KT_ROWS) * t.osa] = tile[tx][ty + k * KT_ROWS];
        __syncthreads();   /* the tile is free again */
      }
    }
  }
}

/* ---- launchers ----------------------------------------------------------- */

/* Fills *t and returns 1 if copying in to out is a batch of transposes
 * (ktrans) with both transposed dims at least KT_MIN long; else 0.  The two
 * views' dims are refined to common ones (a dim of one split where the
 * other's dims end: both run in flat C order), then merged again where they
 * nest in both. */
static int transpose_plan(const kview &out, const kview &in, ktrans *t)
{
  int64_t shape[2 * DEV_MAXDIM], so[2 * DEV_MAXDIM], si[2 * DEV_MAXDIM];
  int i = out.ndim - 1, j = in.ndim - 1, n = 0, m = 0, a = -1, b = -1;
  int64_t ro = out.shape[i], ri = in.shape[j], cso = out.stride[i], csi = in.stride[j];
  /* common dims, innermost first: ro and ri are what is left of out's dim i
   * and in's dim j, cso and csi the strides of that rest */
  while (i >= 0 && j >= 0) {
    int64_t e = ro < ri ? ro : ri;
    if (e < 1 || ro % e != 0 || ri % e != 0 || n == 2 * DEV_MAXDIM) return 0;
    shape[n] = e;
    so[n] = cso;
    si[n] = csi;
    n++;
    ro /= e;
    ri /= e;
    cso *= e;
    csi *= e;
    if (ro == 1 && --i >= 0) { ro = out.shape[i]; cso = out.stride[i]; }
    if (ri == 1 && --j >= 0) { ri = in.shape[j]; csi = in.stride[j]; }
  }
  if (i >= 0 || j >= 0) return 0;
  for (int d = 1; d < n; d++) {
    if (so[d] == so[m] * shape[m] && si[d] == si[m] * shape[m]) {
      shape[m] *= shape[d];
    } else {
      m++;
      shape[m] = shape[d];
      so[m] = so[d];
      si[m] = si[d];
    }
  }
  n = m + 1;
  for (int d = 0; d < n; d++) {
    if (si[d] == 1 && a < 0) a = d;
    if (so[d] == 1 && b < 0) b = d;
  }
  /* shorter dims leave most of a tile empty, and the gather reads few sectors */
  if (a < 0 || b < 0 || a == b || shape[a] < KT_MIN || shape[b] < KT_MIN || n > DEV_MAXDIM) return 0;
  memset(t, 0, sizeof *t);
  t->out = out.p;
  t->in = in.p;
  t->na = shape[a];
  t->nb = shape[b];
  t->isb = si[b];
  t->osa = so[a];
  t->nbatch = 1;
  for (int d = n - 1; d >= 0; d--) {
    if (d == a || d == b) continue;
    t->bshape[t->bdim] = shape[d];
    t->bout[t->bdim] = so[d];
    t->bin[t->bdim] = si[d];
    t->nbatch *= shape[d];
    t->bdim++;
  }
  return 1;
}

template <int TILE, bool EDGE> static void launch_tiles(const ktrans &t, int dtype, cudaStream_t st)
{
  int64_t ta = (t.na + TILE - 1) / TILE, tb = (t.nb + TILE - 1) / TILE;
  dim3 block(TILE, KT_ROWS), grid((unsigned)(ta < INT_MAX ? ta : INT_MAX), (unsigned)(tb < 65535 ? tb : 65535),
                                  (unsigned)(t.nbatch < 65535 ? t.nbatch : 65535));
  switch (k_esize(dtype)) {
  case 1: transpose_kernel<uint8_t, TILE, EDGE><<<grid, block, 0, st>>>(t); break;
  case 2: transpose_kernel<uint16_t, TILE, EDGE><<<grid, block, 0, st>>>(t); break;
  case 4: transpose_kernel<uint32_t, TILE, EDGE><<<grid, block, 0, st>>>(t); break;
  default: transpose_kernel<uint64_t, TILE, EDGE><<<grid, block, 0, st>>>(t); break;
  }
}

static int launch_transpose(const ktrans &t, int dtype, const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  if (t.na >= KT_BIG && t.nb >= KT_BIG) {
    if (t.na % KT_BIG == 0 && t.nb % KT_BIG == 0) launch_tiles<KT_BIG, false>(t, dtype, st);
    else launch_tiles<KT_BIG, true>(t, dtype, st);
  } else if (t.na % KT_TILE == 0 && t.nb % KT_TILE == 0) {
    launch_tiles<KT_TILE, false>(t, dtype, st);
  } else {
    launch_tiles<KT_TILE, true>(t, dtype, st);
  }
  K_LAUNCHED();
  return 0;
}

/* A run copied backwards (a flip of a contiguous tensor) */
static int launch_reversed(const kview &out, const kview &in, int64_t n, const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  int es = k_esize(out.dtype);
  /* the 16 bytes of a step: out's from its start, in's ending at element 0 */
  int vec = ((uintptr_t)out.p % 16) == 0 && ((uintptr_t)(in.p - (16 - es)) % 16) == 0;
  unsigned grid = k_blocks(vec ? (n + 15 / es) / (16 / es) : n, env);
  switch (es) {
  case 1: copy_reversed<uint8_t><<<grid, K_THREADS, 0, st>>>((uint8_t *)out.p, (const uint8_t *)in.p, n, vec); break;
  case 2: copy_reversed<uint16_t><<<grid, K_THREADS, 0, st>>>((uint16_t *)out.p, (const uint16_t *)in.p, n, vec); break;
  case 4: copy_reversed<uint32_t><<<grid, K_THREADS, 0, st>>>((uint32_t *)out.p, (const uint32_t *)in.p, n, vec); break;
  default: copy_reversed<uint64_t><<<grid, K_THREADS, 0, st>>>((uint64_t *)out.p, (const uint64_t *)in.p, n, vec); break;
  }
  K_LAUNCHED();
  return 0;
}

static int launch_copy(const kview &out, const kview &in, int64_t n, const cuk_env *env, char *err, size_t errlen)
{
  unsigned grid;
  cudaStream_t st = k_stream(env);
  ktrans t;
  if (transpose_plan(out, in, &t)) return launch_transpose(t, out.dtype, env, err, errlen);
  if (out.contig && in.ndim == 1 && in.stride[0] == -1) return launch_reversed(out, in, n, env, err, errlen);
  grid = k_blocks(n, env);
  switch (k_esize(out.dtype)) {
  case 1: copy_kernel<uint8_t><<<grid, K_THREADS, 0, st>>>(out, in, n); break;
  case 2: copy_kernel<uint16_t><<<grid, K_THREADS, 0, st>>>(out, in, n); break;
  case 4: copy_kernel<uint32_t><<<grid, K_THREADS, 0, st>>>(out, in, n); break;
  default: copy_kernel<uint64_t><<<grid, K_THREADS, 0, st>>>(out, in, n); break;
  }
  K_LAUNCHED();
  return 0;
}

static kview packed_view(void *p, int64_t n, int dtype)
{
  kview k;
  memset(&k, 0, sizeof k);
  k.p = (char *)p;
  k.ndim = 1;
  k.shape[0] = n;
  k.stride[0] = 1;
  k.dtype = dtype;
  k.contig = 1;
  k.small = n < ((int64_t)1 << 32);
  return k;
}

int k_copy_views(const dev_view *out, const dev_view *in, const cuk_env *env, char *err, size_t errlen)
{
  int64_t n = dev_view_numel(out);
  size_t bytes;
  cudaStream_t st = k_stream(env);
  void *tmp = NULL;
  kview ko, ki;
  int rc = -1, same = 1;
  cudaError_t e;
  if (k_check_view(out, "out", err, errlen) || k_check_view(in, "in[0]", err, errlen)) return -1;
  if (in->dtype != out->dtype)
    return fail_msg(err, errlen, "copy: dtype %s does not match %s", dev_dtype_name(in->dtype), dev_dtype_name(out->dtype));
  if (dev_view_numel(in) != n) return fail_msg(err, errlen, "copy: element counts differ");
  if (n == 0) return 0;
  bytes = (size_t)n * dev_dtype_size(out->dtype);
  ko = k_view(out);
  ki = k_view(in);
  if (ko.p == ki.p && ko.ndim == ki.ndim) {
    for (int d = 0; d < ko.ndim; d++) same &= ko.shape[d] == ki.shape[d] && ko.stride[d] == ki.stride[d];
    if (same) return 0;   /* a view copied onto itself */
  }
  if (!k_views_overlap(out, in)) {
    if (ko.contig && ki.contig) {
      K_CUDA(cudaMemcpyAsync(ko.p, ki.p, bytes, cudaMemcpyDefault, st));
      return 0;
    }
    return launch_copy(ko, ki, n, env, err, errlen);
  }
  /* Overlapping views: read everything before writing anything (memmove). */
  if ((e = cudaMallocAsync(&tmp, bytes, st)) != cudaSuccess) {
    tmp = NULL;
    fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
    goto done;
  }
  if (launch_copy(packed_view(tmp, n, out->dtype), ki, n, env, err, errlen) ||
      launch_copy(ko, packed_view(tmp, n, out->dtype), n, env, err, errlen))
    goto done;
  rc = 0;
done:
  if (tmp != NULL && (e = cudaFreeAsync(tmp, st)) != cudaSuccess && rc == 0)
    rc = fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

int k_copy(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  return k_copy_views(&op->out, &op->in[0], env, err, errlen);
}
