/* DEV_OP_COPY: out = in[0], same dtype and element count, in flat C order
 * whatever the strides.  Raw element moves by size; no conversion. */
#include "k_common.cuh"

/* ---- kernels ------------------------------------------------------------- */

template <typename E>
__global__ void __launch_bounds__(K_THREADS) copy_kernel(kview out, kview in, int64_t n)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth) *k_at<E>(out, i) = *k_at<E>(in, i);
}

/* ---- launchers ----------------------------------------------------------- */

static int launch_copy(const kview &out, const kview &in, int64_t n, const cuk_env *env, char *err, size_t errlen)
{
  unsigned grid = k_blocks(n, env);
  cudaStream_t st = k_stream(env);
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
    return k_fail(err, errlen, "copy: dtype %s does not match %s", dev_dtype_name(in->dtype), dev_dtype_name(out->dtype));
  if (dev_view_numel(in) != n) return k_fail(err, errlen, "copy: element counts differ");
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
    k_fail(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
    goto done;
  }
  if (launch_copy(packed_view(tmp, n, out->dtype), ki, n, env, err, errlen) ||
      launch_copy(ko, packed_view(tmp, n, out->dtype), n, env, err, errlen))
    goto done;
  rc = 0;
done:
  if (tmp != NULL && (e = cudaFreeAsync(tmp, st)) != cudaSuccess && rc == 0)
    rc = k_fail(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

int k_copy(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  return k_copy_views(&op->out, &op->in[0], env, err, errlen);
}
