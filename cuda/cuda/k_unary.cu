/* DEV_OP_UNARY: neg abs exp log sqrt relu sigmoid tanh in the dtype's compute
 * type, and DEV_UN_COPY between two dtypes as a cast (k_cast). */
#include "k_common.cuh"

/* ---- kernels ------------------------------------------------------------- */

/* Both sides contiguous: 16-byte vectors when both are aligned. */
template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS)
unary_contig(typename kt<T>::S *o, const typename kt<T>::S *a, int64_t n)
{
  typedef typename kt<T>::S S;
  constexpr int N = 16 / sizeof(S);
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  int64_t nv = (((uintptr_t)o | (uintptr_t)a) & 15) == 0 ? n / N : 0;
  for (i = tid; i < nv; i += nth) {
    kvec<S> v;
    v.u = ((const uint4 *)a)[i];
    K_UNROLL
    for (int j = 0; j < N; j++) v.x[j] = k_store<T>(k_unop<OP>(k_load<T>(v.x[j])));
    ((uint4 *)o)[i] = v.u;
  }
  for (i = nv * N + tid; i < n; i += nth) o[i] = k_store<T>(k_unop<OP>(k_load<T>(a[i])));
}

template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS) unary_strided(kview out, kview in, int64_t n)
{
  typedef typename kt<T>::S S;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth)
    *k_at<S>(out, i) = k_store<T>(k_unop<OP>(k_load<T>(*k_at<S>(in, i))));
}

/* Both sides contiguous: V elements per step, V set by the wider dtype so
 * that its side moves 16 bytes. */
template <int TI, int TO>
__global__ void __launch_bounds__(K_THREADS)
cast_contig(typename kt<TO>::S *o, const typename kt<TI>::S *a, int64_t n)
{
  typedef typename kt<TI>::S SI;
  typedef typename kt<TO>::S SO;
  constexpr int V = 16 / (sizeof(SI) > sizeof(SO) ? sizeof(SI) : sizeof(SO));
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  int64_t nv = (uintptr_t)o % (V * sizeof(SO)) == 0 && (uintptr_t)a % (V * sizeof(SI)) == 0 ? n / V : 0;
  for (i = tid; i < nv; i += nth) {
    kpack<SI, V> x = ((const kpack<SI, V> *)a)[i];
    kpack<SO, V> y;
    K_UNROLL
    for (int j = 0; j < V; j++) y.x[j] = k_cast<TI, TO>(x.x[j]);
    ((kpack<SO, V> *)o)[i] = y;
  }
  for (i = nv * V + tid; i < n; i += nth) o[i] = k_cast<TI, TO>(a[i]);
}

template <int TI, int TO>
__global__ void __launch_bounds__(K_THREADS) cast_kernel(kview out, kview in, int64_t n)
{
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth)
    *k_at<typename kt<TO>::S>(out, i) = k_cast<TI, TO>(*k_at<typename kt<TI>::S>(in, i));
}

/* ---- launchers ----------------------------------------------------------- */

template <int T, int OP>
static int launch_unary(const kview &out, const kview &in, int64_t n, const cuk_env *env)
{
  typedef typename kt<T>::S S;
  if (out.contig && in.contig) {
    int64_t nv = (n + 16 / (int64_t)sizeof(S) - 1) / (16 / (int64_t)sizeof(S));
    unary_contig<T, OP><<<k_blocks(nv, env), K_THREADS, 0, k_stream(env)>>>((S *)out.p, (const S *)in.p, n);
  } else {
    unary_strided<T, OP><<<k_blocks(n, env), K_THREADS, 0, k_stream(env)>>>(out, in, n);
  }
  return 0;
}

int k_unary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *out = &op->out, *in = &op->in[0];
  dev_dtype t = out->dtype;
  int64_t n = dev_view_numel(out);
  int code = op->code, rc;
  kview ko, ki;
  if ((unsigned)code >= DEV_NUNOP) return k_fail(err, errlen, "unary: bad op %d", code);
  if (code == DEV_UN_COPY && in->dtype == t) return k_copy_views(out, in, env, err, errlen);
  if (dev_view_numel(in) != n) return k_fail(err, errlen, "%s: element counts differ", dev_unop_name((dev_unop)code));
  if (code != DEV_UN_COPY) {
    if (in->dtype != t)
      return k_fail(err, errlen, "%s: dtype %s does not match %s", dev_unop_name((dev_unop)code),
                    dev_dtype_name(in->dtype), dev_dtype_name(t));
    if (!dev_dtype_is_float(t) && code != DEV_UN_NEG && code != DEV_UN_ABS && code != DEV_UN_RELU)
      return k_fail(err, errlen, "%s is not defined for %s", dev_unop_name((dev_unop)code), dev_dtype_name(t));
  }
  if (n == 0) return 0;
  ko = k_view(out);
  ki = k_view(in);
  if (code == DEV_UN_COPY) {
    rc = k_dispatch(in->dtype, [&](auto ti) {
      constexpr int TI = decltype(ti)::value;
      return k_dispatch(t, [&](auto to) {
        constexpr int TO = decltype(to)::value;
        if constexpr (TI == TO) return -2;
        else {
          typedef typename kt<TI>::S SI;
          typedef typename kt<TO>::S SO;
          constexpr int64_t V = 16 / (sizeof(SI) > sizeof(SO) ? sizeof(SI) : sizeof(SO));
          if (ko.contig && ki.contig)
            cast_contig<TI, TO><<<k_blocks((n + V - 1) / V, env), K_THREADS, 0, k_stream(env)>>>((SO *)ko.p, (const SI *)ki.p, n);
          else
            cast_kernel<TI, TO><<<k_blocks(n, env), K_THREADS, 0, k_stream(env)>>>(ko, ki, n);
          return 0;
        }
      });
    });
  } else {
    rc = k_dispatch(t, [&](auto tag) {
      constexpr int T = decltype(tag)::value;
      switch (code) {
      case DEV_UN_NEG: return launch_unary<T, DEV_UN_NEG>(ko, ki, n, env);
      case DEV_UN_ABS: return launch_unary<T, DEV_UN_ABS>(ko, ki, n, env);
      case DEV_UN_RELU: return launch_unary<T, DEV_UN_RELU>(ko, ki, n, env);
      default: break;
      }
      if constexpr (kt<T>::cls != KC_INT) {
        switch (code) {
        case DEV_UN_EXP: return launch_unary<T, DEV_UN_EXP>(ko, ki, n, env);
        case DEV_UN_LOG: return launch_unary<T, DEV_UN_LOG>(ko, ki, n, env);
        case DEV_UN_SQRT: return launch_unary<T, DEV_UN_SQRT>(ko, ki, n, env);
        case DEV_UN_SIGMOID: return launch_unary<T, DEV_UN_SIGMOID>(ko, ki, n, env);
        case DEV_UN_TANH: return launch_unary<T, DEV_UN_TANH>(ko, ki, n, env);
        default: break;
        }
      }
      return -2;
    });
  }
  if (rc != 0) return k_fail(err, errlen, "%s: unsupported for %s", dev_unop_name((dev_unop)code), dev_dtype_name(t));
  K_LAUNCHED();
  return 0;
}
