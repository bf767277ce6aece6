/* DEV_OP_BINARY: add sub mul div pow max min of two tensors, a tensor and a
 * scalar, or a scalar and a tensor (DEV_F_SCALAR_LEFT), in the dtype's
 * compute type (k_binop).  An integer division by zero writes 0 and sets
 * *env->err_flag; the backend turns that into the host's error. */
#include "k_common.cuh"

enum { BM_TT, BM_TS, BM_ST };   /* tensor op tensor, tensor op scalar, scalar op tensor */

/* ---- kernels ------------------------------------------------------------- */

/* Every operand contiguous: 16-byte vectors when all are aligned.  The mode is
 * a template argument so the loop that matters (BM_TT) loads nothing else. */
template <int T, int OP, int M>
__global__ void __launch_bounds__(K_THREADS)
binary_contig(typename kt<T>::S *o, const typename kt<T>::S *a, const typename kt<T>::S *b,
              typename kt<T>::C s, int64_t n, int *err_flag)
{
  typedef typename kt<T>::S S;
  typedef typename kt<T>::C C;
  constexpr int N = 16 / sizeof(S);
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  uintptr_t bits = (uintptr_t)o | (uintptr_t)a | (M == BM_TT ? (uintptr_t)b : 0);
  int64_t nv = (bits & 15) == 0 ? n / N : 0;
  int zero = 0;
  for (i = tid; i < nv; i += nth) {
    kvec<S> va, vb;
    va.u = ((const uint4 *)a)[i];
    if constexpr (M == BM_TT) vb.u = ((const uint4 *)b)[i];
    K_UNROLL
    for (int j = 0; j < N; j++) {
      C x = k_load<T>(va.x[j]), y;
      if constexpr (M == BM_TT) y = k_load<T>(vb.x[j]);
      else y = s;
      va.x[j] = k_store<T>(M == BM_ST ? k_binop<OP>(y, x, &zero) : k_binop<OP>(x, y, &zero));
    }
    ((uint4 *)o)[i] = va.u;
  }
  for (i = nv * N + tid; i < n; i += nth) {
    C x = k_load<T>(a[i]), y;
    if constexpr (M == BM_TT) y = k_load<T>(b[i]);
    else y = s;
    o[i] = k_store<T>(M == BM_ST ? k_binop<OP>(y, x, &zero) : k_binop<OP>(x, y, &zero));
  }
  if (zero && err_flag != NULL) *err_flag = 1;
}

template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS)
binary_strided(kview out, kview a, kview b, typename kt<T>::C s, int mode, int64_t n, int *err_flag)
{
  typedef typename kt<T>::S S;
  typedef typename kt<T>::C C;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  int zero = 0;
  for (int64_t i = tid; i < n; i += nth) {
    C x = k_load<T>(*k_at<S>(a, i)), y = mode == BM_TT ? k_load<T>(*k_at<S>(b, i)) : s;
    *k_at<S>(out, i) = k_store<T>(mode == BM_ST ? k_binop<OP>(y, x, &zero) : k_binop<OP>(x, y, &zero));
  }
  if (zero && err_flag != NULL) *err_flag = 1;
}

/* ---- launchers ----------------------------------------------------------- */

template <int T, int OP>
static int launch_binary(const kview &ko, const kview &ka, const kview &kb, typename kt<T>::C s, int mode,
                         int64_t n, const cuk_env *env)
{
  typedef typename kt<T>::S S;
  cudaStream_t st = k_stream(env);
  int *flag = env->err_flag;
  if (ko.contig && ka.contig && (mode != BM_TT || kb.contig)) {
    int64_t per = 16 / (int64_t)sizeof(S);
    unsigned grid = k_blocks((n + per - 1) / per, env);
    S *o = (S *)ko.p;
    const S *a = (const S *)ka.p, *b = (const S *)kb.p;
    switch (mode) {
    case BM_TT: binary_contig<T, OP, BM_TT><<<grid, K_THREADS, 0, st>>>(o, a, b, s, n, flag); break;
    case BM_TS: binary_contig<T, OP, BM_TS><<<grid, K_THREADS, 0, st>>>(o, a, b, s, n, flag); break;
    default: binary_contig<T, OP, BM_ST><<<grid, K_THREADS, 0, st>>>(o, a, b, s, n, flag); break;
    }
  } else {
    binary_strided<T, OP><<<k_blocks(n, env), K_THREADS, 0, st>>>(ko, ka, kb, s, mode, n, flag);
  }
  return 0;
}

int k_binary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  dev_dtype t = out->dtype;
  int scalar = (op->flags & (DEV_F_SCALAR | DEV_F_SCALAR_LEFT)) != 0;
  int mode = !scalar ? BM_TT : (op->flags & DEV_F_SCALAR_LEFT) ? BM_ST : BM_TS;
  int code = op->code, rc;
  int64_t n = dev_view_numel(out);
  kview ko, ka, kb;
  if ((unsigned)code >= DEV_NBINOP) return k_fail(err, errlen, "binary: bad op %d", code);
  for (int i = 0; i < (scalar ? 1 : 2); i++) {
    if (op->in[i].dtype != t)
      return k_fail(err, errlen, "%s: dtype %s does not match %s", dev_binop_name((dev_binop)code),
                    dev_dtype_name(op->in[i].dtype), dev_dtype_name(t));
    if (dev_view_numel(&op->in[i]) != n)
      return k_fail(err, errlen, "%s: element counts differ", dev_binop_name((dev_binop)code));
  }
  if (n == 0) return 0;
  ko = k_view(out);
  ka = k_view(&op->in[0]);
  kb = scalar ? ka : k_view(&op->in[1]);
  rc = k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    typename kt<T>::C s = scalar ? k_scalar<T>(op->s0) : (typename kt<T>::C)0;
    switch (code) {
    case DEV_BIN_ADD: return launch_binary<T, DEV_BIN_ADD>(ko, ka, kb, s, mode, n, env);
    case DEV_BIN_SUB: return launch_binary<T, DEV_BIN_SUB>(ko, ka, kb, s, mode, n, env);
    case DEV_BIN_MUL: return launch_binary<T, DEV_BIN_MUL>(ko, ka, kb, s, mode, n, env);
    case DEV_BIN_DIV: return launch_binary<T, DEV_BIN_DIV>(ko, ka, kb, s, mode, n, env);
    case DEV_BIN_POW: return launch_binary<T, DEV_BIN_POW>(ko, ka, kb, s, mode, n, env);
    case DEV_BIN_MAX: return launch_binary<T, DEV_BIN_MAX>(ko, ka, kb, s, mode, n, env);
    default: return launch_binary<T, DEV_BIN_MIN>(ko, ka, kb, s, mode, n, env);
    }
  });
  if (rc != 0) return k_fail(err, errlen, "%s: unsupported dtype %s", dev_binop_name((dev_binop)code), dev_dtype_name(t));
  K_LAUNCHED();
  return 0;
}
