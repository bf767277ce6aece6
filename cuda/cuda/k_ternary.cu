/* DEV_OP_TERNARY: the ternary ops of ops.h (kter), out = op(x, y, z), with y
 * and z tensors or scalars (DEV_F_SCALAR2, DEV_F_SCALAR3).  A condition
 * (DEV_OPF_COND: where's x) is a bool tensor, read as 0/1 in the compute
 * type. */
#include "k_common.cuh"

K_MODULE(ternary)

enum { TM_Y = 1, TM_Z = 2 };   /* mode bits: operand 2 (y), operand 3 (z) is a scalar */

/* Operand 1's dtype (bool for a condition) and one element of the result. */
template <int T, int OP> struct kternary {
  static constexpr int T0 = (kter<OP>::flags & DEV_OPF_COND) != 0 ? DEV_BOOL : T;
  typedef typename kt<T0>::S S0;
  typedef typename kt<T>::S S;
  typedef typename kt<T>::C C;
  static KH C first(S0 x) { return (C)k_load<T0>(x); }
  static KH S elem(C x, C y, C z) { return k_store<T>(kter<OP>::f(x, y, z)); }
};

/* ---- kernels ------------------------------------------------------------- */

/* Every tensor operand contiguous: those of dtype T move 16 bytes per step
 * when all are aligned for it.  The mode is a template argument, so the
 * kernel loads only the tensors. */
template <int T, int OP, int M>
__global__ void __launch_bounds__(K_THREADS)
ternary_contig(typename kt<T>::S *o, const typename kternary<T, OP>::S0 *x, const typename kt<T>::S *y,
               const typename kt<T>::S *z, typename kt<T>::C sy, typename kt<T>::C sz, int64_t n)
{
  typedef kternary<T, OP> K;
  typedef typename K::S S;
  typedef typename K::S0 S0;
  typedef typename K::C C;
  constexpr int V = 16 / sizeof(S);
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i;
  uintptr_t bits = (uintptr_t)o | ((M & TM_Y) ? 0 : (uintptr_t)y) | ((M & TM_Z) ? 0 : (uintptr_t)z);
  int64_t nv = (bits & 15) == 0 && (uintptr_t)x % (V * sizeof(S0)) == 0 ? n / V : 0;
  for (i = tid; i < nv; i += nth) {
    kpack<S0, V> vx = ((const kpack<S0, V> *)x)[i];
    kpack<S, V> vy, vz, r;
    if constexpr (!(M & TM_Y)) vy = ((const kpack<S, V> *)y)[i];
    if constexpr (!(M & TM_Z)) vz = ((const kpack<S, V> *)z)[i];
    K_UNROLL
    for (int j = 0; j < V; j++) {
      C b, c;
      if constexpr ((M & TM_Y) != 0) b = sy;
      else b = k_load<T>(vy.x[j]);
      if constexpr ((M & TM_Z) != 0) c = sz;
      else c = k_load<T>(vz.x[j]);
      r.x[j] = K::elem(K::first(vx.x[j]), b, c);
    }
    ((kpack<S, V> *)o)[i] = r;
  }
  for (i = nv * V + tid; i < n; i += nth) {
    C b, c;
    if constexpr ((M & TM_Y) != 0) b = sy;
    else b = k_load<T>(y[i]);
    if constexpr ((M & TM_Z) != 0) c = sz;
    else c = k_load<T>(z[i]);
    o[i] = K::elem(K::first(x[i]), b, c);
  }
}

template <int T, int OP>
__global__ void __launch_bounds__(K_THREADS)
ternary_strided(kview out, kview x, kview y, kview z, typename kt<T>::C sy, typename kt<T>::C sz, int mode,
                int64_t n)
{
  typedef kternary<T, OP> K;
  typedef typename K::S S;
  typedef typename K::C C;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = tid; i < n; i += nth) {
    C a = K::first(*k_at<typename K::S0>(x, i));
    C b = (mode & TM_Y) ? sy : k_load<T>(*k_at<S>(y, i));
    C c = (mode & TM_Z) ? sz : k_load<T>(*k_at<S>(z, i));
    *k_at<S>(out, i) = K::elem(a, b, c);
  }
}

/* ---- launchers ----------------------------------------------------------- */

template <int T, int OP>
static int launch_ternary(const kview &ko, const kview &kx, const kview &ky, const kview &kz,
                          typename kt<T>::C sy, typename kt<T>::C sz, int mode, int64_t n, const cuk_env *env)
{
  typedef kternary<T, OP> K;
  typedef typename K::S S;
  cudaStream_t st = k_stream(env);
  if (ko.contig && kx.contig && ((mode & TM_Y) || ky.contig) && ((mode & TM_Z) || kz.contig)) {
    int64_t per = 16 / (int64_t)sizeof(S);
    unsigned grid = k_blocks((n + per - 1) / per, env);
    S *o = (S *)ko.p;
    const typename K::S0 *x = (const typename K::S0 *)kx.p;
    const S *y = (const S *)ky.p, *z = (const S *)kz.p;
    switch (mode) {
    case 0: ternary_contig<T, OP, 0><<<grid, K_THREADS, 0, st>>>(o, x, y, z, sy, sz, n); break;
    case TM_Y: ternary_contig<T, OP, TM_Y><<<grid, K_THREADS, 0, st>>>(o, x, y, z, sy, sz, n); break;
    case TM_Z: ternary_contig<T, OP, TM_Z><<<grid, K_THREADS, 0, st>>>(o, x, y, z, sy, sz, n); break;
    default: ternary_contig<T, OP, TM_Y | TM_Z><<<grid, K_THREADS, 0, st>>>(o, x, y, z, sy, sz, n); break;
    }
  } else {
    ternary_strided<T, OP><<<k_blocks(n, env), K_THREADS, 0, st>>>(ko, kx, ky, kz, sy, sz, mode, n);
  }
  return 0;
}

int k_ternary(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  const dev_view *out = &op->out, *v[3] = {&op->in[0], NULL, NULL};
  const dev_opinfo *o = dev_terop_info(op->code);
  dev_dtype t = out->dtype;
  int code = op->code, rc;
  int mode = ((op->flags & DEV_F_SCALAR2) ? TM_Y : 0) | ((op->flags & DEV_F_SCALAR3) ? TM_Z : 0);
  int64_t n = dev_view_numel(out);
  kview ko, kx, ky, kz;
  if (o == NULL) return fail_msg(err, errlen, "ternary: bad op %d", code);
  if (op->nin != 1 + !(mode & TM_Y) + !(mode & TM_Z)) return fail_msg(err, errlen, "%s: bad operands", o->name);
  if (!(mode & TM_Y)) v[1] = &op->in[1];
  if (!(mode & TM_Z)) v[2] = &op->in[(mode & TM_Y) ? 1 : 2];
  for (int j = 0; j < 3; j++) {
    dev_dtype want = j == 0 && (o->flags & DEV_OPF_COND) ? DEV_BOOL : t;
    if (!v[j]) continue;
    if (v[j]->dtype != want)
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(v[j]->dtype),
                    dev_dtype_name(want));
    if (dev_view_numel(v[j]) != n) return fail_msg(err, errlen, "%s: element counts differ", o->name);
  }
  if (n == 0) return 0;
  ko = k_view(out);
  kx = k_view(v[0]);
  ky = v[1] ? k_view(v[1]) : kx;
  kz = v[2] ? k_view(v[2]) : kx;
  /* the kernels of the rows that take T (ops.h's classes column) */
  rc = k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    typename kt<T>::C sy = (mode & TM_Y) ? k_scalar<T>(op->s0) : (typename kt<T>::C)0;
    typename kt<T>::C sz = (mode & TM_Z) ? k_scalar<T>(op->s1) : (typename kt<T>::C)0;
    switch (code) {
#define K_CASE(E, name, cls, res, fl)                                                 \
    case DEV_TER_##E:                                                                 \
      if constexpr ((kter<DEV_TER_##E>::classes & k_class<T>()) != 0)                 \
        return launch_ternary<T, DEV_TER_##E>(ko, kx, ky, kz, sy, sz, mode, n, env);  \
      else                                                                            \
        return -2;
    DEV_TERNARY_OPS(K_CASE)
#undef K_CASE
    default: return -2;
    }
  });
  if (rc != 0) return fail_msg(err, errlen, "%s: unsupported dtype %s", o->name, dev_dtype_name(t));
  K_LAUNCHED();
  return 0;
}
