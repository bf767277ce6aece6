/* DEV_OP_BINARY: the binary ops of ops.h of two tensors, a tensor and a
 * scalar, or a scalar and a tensor (DEV_F_SCALAR_LEFT, for the rows that
 * take one: DEV_OPF_LEFT), in the dtype's compute type (kbin).  An integer
 * division by zero writes 0 and sets *env->err_flag; the backend turns that
 * into the host's error. */
#include "k_common.cuh"

K_MODULE(binary)

enum { BM_TT, BM_TS, BM_ST };   /* tensor op tensor, tensor op scalar, scalar op tensor */

/* The result dtype of OP on T, and one element of it (x op y). */
template <int T, int OP> struct kbinary {
  static constexpr int TO = kbin<OP>::to_bool ? DEV_BOOL : T;
  typedef typename kt<T>::S SI;
  typedef typename kt<T>::C C;
  typedef typename kt<TO>::S SO;
  static KH SO elem(C x, C y, int *zero)
  {
    if constexpr (kt<T>::cls == KC_INT && (kbin<OP>::flags & DEV_OPF_ZDIV) != 0)
      if (y == 0) *zero = 1;
    return k_store<TO>(kbin<OP>::f(x, y));
  }
};

/* ---- kernels ------------------------------------------------------------- */

/* Every operand contiguous: the inputs move 16 bytes per step when all are
 * aligned for it.  The mode is a template argument so the loop that matters
 * (BM_TT) loads nothing else. */
template <int T, int OP, int M>
__global__ void __launch_bounds__(K_THREADS)
binary_contig(typename kbinary<T, OP>::SO *o, const typename kt<T>::S *a, const typename kt<T>::S *b,
              typename kt<T>::C s, int64_t n, int *err_flag)
{
  typedef kbinary<T, OP> B;
  typedef typename B::SI SI;
  typedef typename B::SO SO;
  typedef typename B::C C;
  constexpr int V = 16 / sizeof(SI);
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  uintptr_t bits = (uintptr_t)a | (M == BM_TT ? (uintptr_t)b : 0);
  int64_t nv = (bits & 15) == 0 && (uintptr_t)o % (V * sizeof(SO)) == 0 ? n / V : 0;
  int zero = 0;
  for (i = tid; i < nv; i += nth) {
    kpack<SI, V> va = ((const kpack<SI, V> *)a)[i], vb;
    kpack<SO, V> r;
    if constexpr (M == BM_TT) vb = ((const kpack<SI, V> *)b)[i];
    K_UNROLL
    for (int j = 0; j < V; j++) {
      C x = k_load<T>(va.x[j]), y;
      if constexpr (M == BM_TT) y = k_load<T>(vb.x[j]);
      else y = s;
      r.x[j] = M == BM_ST ? B::elem(y, x, &zero) : B::elem(x, y, &zero);
    }
    ((kpack<SO, V> *)o)[i] = r;
  }
  for (i = nv * V + tid; i < n; i += nth) {
    C x = k_load<T>(a[i]), y;
    if constexpr (M == BM_TT) y = k_load<T>(b[i]);
    else y = s;
    o[i] = M == BM_ST ? B::elem(y, x, &zero) : B::elem(x, y, &zero);
  }
  if (zero && err_flag != NULL) *err_flag = 1;
}

template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS)
binary_strided(kview out, kview a, kview b, typename kt<T>::C s, int mode, int64_t n, int *err_flag)
{
  typedef kbinary<T, OP> B;
  typedef typename B::SI SI;
  typedef typename B::C C;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  int zero = 0;
  for (int64_t i = tid; i < n; i += nth) {
    C x = k_load<T>(*k_at<SI>(a, i)), y = mode == BM_TT ? k_load<T>(*k_at<SI>(b, i)) : s;
    *k_at<typename B::SO>(out, i) = mode == BM_ST ? B::elem(y, x, &zero) : B::elem(x, y, &zero);
  }
  if (zero && err_flag != NULL) *err_flag = 1;
}

/* ---- launchers ----------------------------------------------------------- */

template <int T, int OP>
static int launch_binary(const kview &ko, const kview &ka, const kview &kb, typename kt<T>::C s, int mode,
                         int64_t n, const cuk_env *env)
{
  typedef kbinary<T, OP> B;
  typedef typename B::SI S;
  typedef typename B::SO SO;
  cudaStream_t st = k_stream(env);
  int *flag = env->err_flag;
  if (ko.contig && ka.contig && (mode != BM_TT || kb.contig)) {
    int64_t per = 16 / (int64_t)sizeof(S);
    unsigned grid = k_blocks((n + per - 1) / per, env);
    SO *o = (SO *)ko.p;
    const S *a = (const S *)ka.p, *b = (const S *)kb.p;
    switch (mode) {
    case BM_TT: binary_contig<T, OP, BM_TT><<<grid, K_THREADS, 0, st>>>(o, a, b, s, n, flag); break;
    case BM_TS: binary_contig<T, OP, BM_TS><<<grid, K_THREADS, 0, st>>>(o, a, b, s, n, flag); break;
    default:
      /* only the rows with a number on the left (the metamethods) */
      if constexpr ((kbin<OP>::flags & DEV_OPF_LEFT) != 0)
        binary_contig<T, OP, BM_ST><<<grid, K_THREADS, 0, st>>>(o, a, b, s, n, flag);
      else
        return -2;
      break;
    }
  } else {
    binary_strided<T, OP><<<k_blocks(n, env), K_THREADS, 0, st>>>(ko, ka, kb, s, mode, n, flag);
  }
  return 0;
}

int k_binary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  const dev_opinfo *o = dev_binop_info(op->code);
  dev_dtype t = op->in[0].dtype;
  int scalar = (op->flags & (DEV_F_SCALAR | DEV_F_SCALAR_LEFT)) != 0;
  int mode = !scalar ? BM_TT : (op->flags & DEV_F_SCALAR_LEFT) ? BM_ST : BM_TS;
  int code = op->code, rc;
  int64_t n = dev_view_numel(out);
  kview ko, ka, kb;
  if (o == NULL) return fail_msg(err, errlen, "binary: bad op %d", code);
  if (o->to_bool && out->dtype != DEV_BOOL)
    return fail_msg(err, errlen, "%s: the result is bool, not %s", o->name, dev_dtype_name(out->dtype));
  for (int i = 0; i < (scalar ? 1 : 2); i++) {
    if (op->in[i].dtype != (o->to_bool ? t : out->dtype))
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(op->in[i].dtype),
                    dev_dtype_name(o->to_bool ? t : out->dtype));
    if (dev_view_numel(&op->in[i]) != n)
      return fail_msg(err, errlen, "%s: element counts differ", o->name);
  }
  if (n == 0) return 0;
  ko = k_view(out);
  ka = k_view(&op->in[0]);
  kb = scalar ? ka : k_view(&op->in[1]);
  /* the kernels of the rows that take T (ops.h's classes column) */
  rc = k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    typename kt<T>::C s = scalar ? k_scalar<T>(op->s0) : (typename kt<T>::C)0;
    switch (code) {
#define K_CASE(E, name, cls, res, fl)                                     \
    case DEV_BIN_##E:                                                     \
      if constexpr ((kbin<DEV_BIN_##E>::classes & k_class<T>()) != 0)     \
        return launch_binary<T, DEV_BIN_##E>(ko, ka, kb, s, mode, n, env); \
      else                                                                \
        return -2;
    DEV_BINARY_OPS(K_CASE)
#undef K_CASE
    default: return -2;
    }
  });
  if (rc != 0) return fail_msg(err, errlen, "%s: unsupported dtype %s", o->name, dev_dtype_name(t));
  K_LAUNCHED();
  return 0;
}
