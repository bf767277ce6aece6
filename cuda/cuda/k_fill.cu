/* DEV_OP_FILL (out = s0) and DEV_OP_ARANGE (out[i] = s0 + i*s1, flat C order). */
#include "k_common.cuh"

K_MODULE(fill)

/* ---- kernels ------------------------------------------------------------- */

/* Writes the element bits v everywhere; a contiguous, aligned view 16 bytes
 * at a time. */
template <typename E>
__global__ void __launch_bounds__(K_THREADS) fill_kernel(kview out, int64_t n, E v)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  if (out.contig && ((uintptr_t)out.p & 15) == 0) {
    constexpr int N = 16 / sizeof(E);
    kvec<E> w;
K_UNROLL
    for (int j = 0; j < N; j++) w.x[j] = v;
    int64_t nv = n / N;
    for (i = tid; i < nv; i += nth) ((uint4 *)out.p)[i] = w.u;
    for (i = nv * N + tid; i < n; i += nth) ((E *)out.p)[i] = v;
  } else {
    for (i = tid; i < n; i += nth) *k_at<E>(out, i) = v;
  }
}

/* The contiguous case with a small argument list: a fill is often a tiny
 * op whose cost is its launch, and a whole kview is ~150 bytes to pass. */
template <typename E>
__global__ void __launch_bounds__(K_THREADS) fill_contig_kernel(E *p, int64_t n, E v)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  if (((uintptr_t)p & 15) == 0) {
    constexpr int N = 16 / sizeof(E);
    kvec<E> w;
K_UNROLL
    for (int j = 0; j < N; j++) w.x[j] = v;
    int64_t nv = n / N;
    for (i = tid; i < nv; i += nth) ((uint4 *)p)[i] = w.u;
    for (i = nv * N + tid; i < n; i += nth) p[i] = v;
  } else {
    for (i = tid; i < n; i += nth) p[i] = v;
  }
}

/* At most one block's worth: one element per thread, nothing else (a tiny
 * fill's cost is its launch and its latency, and a round trip waits for the
 * kernel's last instruction). */
template <typename E>
__global__ void __launch_bounds__(K_THREADS) fill_small_kernel(E *p, int n, E v)
{
  if ((int)threadIdx.x < n) p[threadIdx.x] = v;
}

template <int T>
__global__ void __launch_bounds__(K_THREADS) arange_kernel(kview out, int64_t n, int exact, dev_scalar s0, dev_scalar s1)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth)
    *k_at<typename kt<T>::S>(out, i) = k_arange_elem<T>(exact, s0, s1, i);
}

/* ---- launchers ----------------------------------------------------------- */

template <typename E>
static int launch_fill(const dev_view *out, int64_t n, uint64_t bits, const cuk_env *env, char *err, size_t errlen)
{
  E v;
  memcpy(&v, &bits, sizeof v);
  if (dev_view_contiguous(out) && n <= K_THREADS) {
    E *p = (E *)dev_view_ptr(out);
    int ni = (int)n;
    void *args[] = {&p, &ni, &v};
    unsigned threads = (unsigned)(n + 31) / 32 * 32;
    K_CUDA(k_launch<fill_small_kernel<E>>(dim3(1), dim3(threads), args, 0, env));
    return 0;
  }
  if (dev_view_contiguous(out))
    fill_contig_kernel<E><<<k_blocks(n, env), K_THREADS, 0, k_stream(env)>>>((E *)dev_view_ptr(out), n, v);
  else
    fill_kernel<E><<<k_blocks(n, env), K_THREADS, 0, k_stream(env)>>>(k_view(out), n, v);
  K_LAUNCHED();
  return 0;
}

int k_fill_view(const dev_view *out, dev_scalar s, const cuk_env *env, char *err, size_t errlen)
{
  int64_t n = dev_view_numel(out);
  uint64_t bits = 0;
  if (n == 0) return 0;
  k_dispatch(out->dtype, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    typename kt<T>::S e = k_fill_elem<T>(s);
    memcpy(&bits, &e, sizeof e);
    return 0;
  });
  switch (dev_dtype_size(out->dtype)) {
  case 1: return launch_fill<uint8_t>(out, n, bits, env, err, errlen);
  case 2: return launch_fill<uint16_t>(out, n, bits, env, err, errlen);
  case 4: return launch_fill<uint32_t>(out, n, bits, env, err, errlen);
  default: return launch_fill<uint64_t>(out, n, bits, env, err, errlen);
  }
}

int k_fill(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  return k_fill_view(&op->out, op->s0, env, err, errlen);
}

int k_arange(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  int64_t n = dev_view_numel(out);
  int exact = op->s0.is_int && op->s1.is_int && !dev_dtype_is_float(out->dtype);
  kview kv;
  if (n == 0) return 0;
  kv = k_view(out);
  k_dispatch(out->dtype, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    arange_kernel<T><<<k_blocks(n, env), K_THREADS, 0, k_stream(env)>>>(kv, n, exact, op->s0, op->s1);
    return 0;
  });
  K_LAUNCHED();
  return 0;
}
