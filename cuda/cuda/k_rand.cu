/* DEV_OP_RAND: uniform [s0, s1), normal(mean s0, std s1) or integers in
 * [s0, s1) stored in any dtype (DEV_RAND_INT) from Philox-4x32-10
 * keyed by seed, element i drawing counter offset + i (flat C order), so the
 * numbers are the host backend's (see k_rand_elem in k_common.cuh). */
#include "k_common.cuh"

K_MODULE(rand)

/* ---- kernels ------------------------------------------------------------- */

template <int T>
__global__ void __launch_bounds__(K_THREADS) rand_kernel(kview out, int64_t n, krand r)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth)
    *k_at<typename kt<T>::S>(out, i) = k_rand_elem<T>(r, (uint64_t)i);
}

/* ---- launchers ----------------------------------------------------------- */

int k_rand(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  int64_t n = dev_view_numel(out);
  krand r;
  kview kv;
  if (op->code != DEV_RAND_UNIFORM && op->code != DEV_RAND_NORMAL && op->code != DEV_RAND_INT)
    return fail_msg(err, errlen, "rand: bad kind %d", op->code);
  if (op->code == DEV_RAND_NORMAL && !dev_dtype_is_float(out->dtype))
    return fail_msg(err, errlen, "randn needs a float dtype, not %s", dev_dtype_name(out->dtype));
  if (n == 0) return 0;
  r = k_rand_params(op);
  kv = k_view(out);
  k_dispatch(out->dtype, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    rand_kernel<T><<<k_blocks(n, env), K_THREADS, 0, k_stream(env)>>>(kv, n, r);
    return 0;
  });
  K_LAUNCHED();
  return 0;
}
