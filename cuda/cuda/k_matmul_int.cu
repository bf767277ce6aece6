/* DEV_OP_MATMUL for the integer dtypes (i8 u8 i32 i64): out = in[0] @ in[1],
 * accumulated in 64-bit integers with wrapping (unsigned) arithmetic and
 * stored wrapped to the dtype's width, as the host does and as elementwise
 * integer arithmetic (and NumPy's and PyTorch's matmul) wrap: the result is
 * the exact sum modulo 2^bits.  Float dtypes go through cuBLAS. */
#include "k_common.cuh"

K_MODULE(matmul_int)

#define MT 16   /* tile edge */

/* A 2-D operand: element (r, c) at p[r * s0 + c * s1]. */
typedef struct kmat {
  char *p;
  int64_t s0, s1;
} kmat;

/* ---- kernels ------------------------------------------------------------- */

template <int T>
__global__ void __launch_bounds__(MT * MT) matmul_int_kernel(kmat a, kmat b, kmat c, int m, int n, int k)
{
  typedef typename kt<T>::S S;
  __shared__ unsigned long long as[MT][MT + 1], bs[MT][MT + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int mt = (m + MT - 1) / MT, nt = (n + MT - 1) / MT;
  /* tile loops with block-uniform bounds: the barriers are reached by all */
  for (int rt = blockIdx.y; rt < mt; rt += gridDim.y) {
    for (int ct = blockIdx.x; ct < nt; ct += gridDim.x) {
      int row = rt * MT + ty, col = ct * MT + tx;
      unsigned long long acc = 0;
      for (int p0 = 0; p0 < k; p0 += MT) {
        as[ty][tx] = row < m && p0 + tx < k ? (unsigned long long)k_load_i<T>(((const S *)a.p)[row * a.s0 + (int64_t)(p0 + tx) * a.s1]) : 0ull;
        bs[ty][tx] = p0 + ty < k && col < n ? (unsigned long long)k_load_i<T>(((const S *)b.p)[(int64_t)(p0 + ty) * b.s0 + col * b.s1]) : 0ull;
        __syncthreads();
        int kk = min(MT, k - p0);
        for (int q = 0; q < kk; q++) acc += as[ty][q] * bs[q][tx];
        __syncthreads();
      }
      if (row < m && col < n) ((S *)c.p)[row * c.s0 + col * c.s1] = k_store_i<T>((int64_t)acc);
    }
  }
}

/* ---- launchers ----------------------------------------------------------- */

static kmat mat_of(const dev_view *v) { return kmat{(char *)dev_view_ptr(v), v->stride[0], v->stride[1]}; }

/* One 2-D product; k_matmul_int calls it per batch. */
static int matmul_int_2d(const dev_view *av, const dev_view *bv, const dev_view *ov, const cuk_env *env,
                         char *err, size_t errlen)
{
  dev_dtype t = ov->dtype;
  cudaStream_t st = k_stream(env);
  int64_t m, n, k;
  void *tmp = NULL;
  dev_buf tbuf;
  dev_view tview;
  kmat c;
  int rc = -1;
  cudaError_t e;
  m = av->shape[0];
  k = av->shape[1];
  n = bv->shape[1];
  if (bv->shape[0] != k || ov->shape[0] != m || ov->shape[1] != n)
    return fail_msg(err, errlen, "matmul: shapes {%lld,%lld} @ {%lld,%lld} -> {%lld,%lld} do not match",
                  (long long)m, (long long)k, (long long)bv->shape[0], (long long)n,
                  (long long)ov->shape[0], (long long)ov->shape[1]);
  if (av->dtype != t || bv->dtype != t) return fail_msg(err, errlen, "matmul: dtypes differ");
  if (t == DEV_BOOL) return fail_msg(err, errlen, "matmul does not support bool");
  if (dev_dtype_is_float(t)) return fail_msg(err, errlen, "matmul: %s goes through cuBLAS, not the built-in kernels", dev_dtype_name(t));
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return fail_msg(err, errlen, "matmul: matrix too large");
  if (m == 0 || n == 0) return 0;
  if (k == 0) {
    dev_scalar zero = {1, 0, 0.0};
    return k_fill_view(ov, zero, env, err, errlen);
  }
  c = mat_of(ov);
  /* out sharing memory with an operand: compute into a packed copy first */
  if (k_views_overlap(ov, av) || k_views_overlap(ov, bv)) {
    if ((e = cudaMallocAsync(&tmp, (size_t)(m * n) * dev_dtype_size(t), st)) != cudaSuccess) {
      tmp = NULL;
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      goto done;
    }
    c = kmat{(char *)tmp, n, 1};
  }
  {
    dim3 block(MT, MT), grid((unsigned)((n + MT - 1) / MT < 65535 ? (n + MT - 1) / MT : 65535),
                             (unsigned)((m + MT - 1) / MT < 65535 ? (m + MT - 1) / MT : 65535));
    kmat a = mat_of(av), b = mat_of(bv);
    rc = k_dispatch(t, [&](auto tag) {
      constexpr int T = decltype(tag)::value;
      if constexpr (kt<T>::cls != KC_INT || T == DEV_BOOL) return -2;
      else {
        matmul_int_kernel<T><<<grid, block, 0, st>>>(a, b, c, (int)m, (int)n, (int)k);
        return 0;
      }
    });
  }
  if (rc != 0) {
    fail_msg(err, errlen, "matmul: unsupported dtype %s", dev_dtype_name(t));
    rc = -1;
    goto done;
  }
  rc = -1;
  if ((e = cudaGetLastError()) != cudaSuccess) {
    fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
    goto done;
  }
  if (tmp != NULL) {
    memset(&tbuf, 0, sizeof tbuf);
    tbuf.ptr = tmp;
    tbuf.bytes = (size_t)(m * n) * dev_dtype_size(t);
    tbuf.kind = DEV_MEM_DEVICE;
    memset(&tview, 0, sizeof tview);
    tview.buf = &tbuf;
    tview.dtype = t;
    tview.ndim = 2;
    tview.shape[0] = m;
    tview.shape[1] = n;
    tview.stride[0] = n;
    tview.stride[1] = 1;
    if (k_copy_views(ov, &tview, env, err, errlen)) goto done;
  }
  rc = 0;
done:
  if (tmp != NULL && (e = cudaFreeAsync(tmp, st)) != cudaSuccess && rc == 0)
    rc = fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

/* 2-D, or 3-D of one batch size: one tiled launch per batch (integer
 * batched products are rare; cuBLAS takes the float ones in one call). */
int k_matmul_int(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *av = &op->in[0], *bv = &op->in[1], *ov = &op->out;
  if (av->ndim != ov->ndim || bv->ndim != ov->ndim || (ov->ndim != 2 && ov->ndim != 3))
    return fail_msg(err, errlen, "matmul needs 2-D tensors, or 3-D ones of one batch size");
  if (ov->ndim == 2) return matmul_int_2d(av, bv, ov, env, err, errlen);
  if (av->shape[0] != ov->shape[0] || bv->shape[0] != ov->shape[0])
    return fail_msg(err, errlen, "matmul: batch sizes differ");
  for (int64_t i = 0; i < ov->shape[0]; i++) {
    dev_view a = dev_view_batch(av, i), b = dev_view_batch(bv, i), o = dev_view_batch(ov, i);
    if (matmul_int_2d(&a, &b, &o, env, err, errlen)) return -1;
  }
  return 0;
}
