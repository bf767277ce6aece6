/* DEV_OP_UNARY: the unary ops of ops.h in the dtype's compute type (kun), and
 * DEV_UN_COPY between two dtypes as a cast (k_cast). */
#include "k_common.cuh"

K_MODULE(unary)

/* The result dtype of OP on T, and one element of it. */
template <int T, int OP> struct kunary {
  static constexpr int TO = kun<OP>::to_bool ? DEV_BOOL : T;
  typedef typename kt<T>::S SI;
  typedef typename kt<TO>::S SO;
  static KH SO elem(SI x) { return k_store<TO>(kun<OP>::f(k_load<T>(x))); }
};

/* ---- kernels ------------------------------------------------------------- */

/* Both sides contiguous: the input moves 16 bytes per step when both sides
 * are aligned for it. */
template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS)
unary_contig(typename kunary<T, OP>::SO *o, const typename kunary<T, OP>::SI *a, int64_t n)
{
  typedef kunary<T, OP> U;
  typedef typename U::SI SI;
  typedef typename U::SO SO;
  constexpr int V = 16 / sizeof(SI);
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  int64_t nv = (uintptr_t)a % 16 == 0 && (uintptr_t)o % (V * sizeof(SO)) == 0 ? n / V : 0;
  for (i = tid; i < nv; i += nth) {
    kpack<SI, V> x = ((const kpack<SI, V> *)a)[i];
    kpack<SO, V> y;
    K_UNROLL
    for (int j = 0; j < V; j++) y.x[j] = U::elem(x.x[j]);
    ((kpack<SO, V> *)o)[i] = y;
  }
  for (i = nv * V + tid; i < n; i += nth) o[i] = U::elem(a[i]);
}

template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS) unary_strided(kview out, kview in, int64_t n)
{
  typedef kunary<T, OP> U;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth)
    *k_at<typename U::SO>(out, i) = U::elem(*k_at<typename U::SI>(in, i));
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
  typedef kunary<T, OP> U;
  if (out.contig && in.contig) {
    int64_t per = 16 / (int64_t)sizeof(typename U::SI);
    unary_contig<T, OP><<<k_blocks((n + per - 1) / per, env), K_THREADS, 0, k_stream(env)>>>(
        (typename U::SO *)out.p, (const typename U::SI *)in.p, n);
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
  const dev_opinfo *o = dev_unop_info(code);
  kview ko, ki;
  if ((unsigned)code >= DEV_NUNOP) return fail_msg(err, errlen, "unary: bad op %d", code);
  if (code == DEV_UN_COPY && in->dtype == t) return k_copy_views(out, in, env, err, errlen);
  if (dev_view_numel(in) != n) return fail_msg(err, errlen, "%s: element counts differ", dev_unop_name((dev_unop)code));
  if (code != DEV_UN_COPY) {
    if (o->to_bool ? t != DEV_BOOL : in->dtype != t)
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(in->dtype),
                    dev_dtype_name(t));
    if (!(dev_dtype_class(in->dtype) & o->classes))
      return fail_msg(err, errlen, "%s is not defined for %s", o->name, dev_dtype_name(in->dtype));
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
    /* the kernels of the rows that take T (ops.h's classes column) */
    rc = k_dispatch(in->dtype, [&](auto tag) {
      constexpr int T = decltype(tag)::value;
      switch (code) {
#define K_CASE(E, name, cls, res, fl)                                  \
      case DEV_UN_##E:                                                 \
        if constexpr ((kun<DEV_UN_##E>::classes & k_class<T>()) != 0)  \
          return launch_unary<T, DEV_UN_##E>(ko, ki, n, env);          \
        else                                                           \
          return -2;
      DEV_UNARY_OPS(K_CASE)
#undef K_CASE
      default: return -2;
      }
    });
  }
  if (rc != 0) return fail_msg(err, errlen, "%s: unsupported for %s", dev_unop_name((dev_unop)code), dev_dtype_name(t));
  K_LAUNCHED();
  return 0;
}
