/* DEV_OP_FUSED's arguments: the one parameter (gf_args, cuda/cuda/fgen.c)
 * of a fused program's kernels, made here where k_view and k_scalar are;
 * the kernels themselves come from NVRTC (modules.c launches them). */
#include "k_common.cuh"

namespace {

union knum { float f; double d; int64_t i; };

/* gf_args as the generated source declares it, after its views */
struct gf_tail { int64_t n; int *zflag; int ztag; };

/* A number operand in the compute type of dtype t, as the unfused op takes
 * it (k_scalar). */
knum number(dev_scalar s, int t)
{
  knum v;
  v.i = 0;
  k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if constexpr (kt<T>::cls == KC_FLOAT) v.f = k_scalar<T>(s);
    else if constexpr (kt<T>::cls == KC_DOUBLE) v.d = k_scalar<T>(s);
    else v.i = k_scalar<T>(s);
    return 0;
  });
  return v;
}

int is_num(const dev_fnode *x) { return x->kind == DEV_FN_CONST || x->kind == DEV_FN_PARAM; }

}  // namespace

extern "C" int cuk_fused_args(const dev_kop *op, const cuk_env *env, int ztag, void *buf, size_t cap,
                              size_t *len, int *vec, unsigned *grid, char *err, size_t errlen)
{
  const dev_fprog *p = op->fprog;
  kview kv[DEV_FMAXOUT + DEV_FMAXIN];
  int nout = p->nout, nv = nout + op->nin, red = (op->flags & DEV_F_FREDUCE) != 0;
  int contig = 1, widest = 1;
  uintptr_t bits = 0;
  for (int i = 0; i < nv; i++) {   /* as gf_args has them: the outputs, then the inputs */
    const dev_view *v = i < nout ? dev_kop_out(op, i) : dev_kop_in(op, i - nout);
    kv[i] = k_view(v);
    if (i < nout && red) continue;   /* the reductions' outputs: not the program's */
    contig = contig && kv[i].contig;
    bits |= (uintptr_t)kv[i].p;
    if (k_esize(v->dtype) > widest) widest = k_esize(v->dtype);
  }
  *vec = contig && (bits & 15) == 0;
  /* the views: kviews, or pointers (char *), as fgen.c declares them */
  size_t vsize = *vec ? sizeof(char *) : sizeof(kview), off = vsize * (size_t)nv;
  gf_tail t;
  memset(&t, 0, sizeof t);
  t.n = dev_view_numel(red ? dev_kop_in(op, 0) : &op->out);
  t.zflag = env->err_flag;
  t.ztag = ztag;
  if (off + sizeof t + sizeof(knum) > cap) return fail_msg(err, errlen, "%s: too many arguments", p->name);
  for (int i = 0; i < nv; i++) {
    if (*vec) memcpy((char *)buf + i * vsize, &kv[i].p, vsize);
    else memcpy((char *)buf + i * vsize, &kv[i], vsize);
  }
  memcpy((char *)buf + off, &t, sizeof t);
  off += sizeof t;   /* 8-aligned: the numbers follow */
  /* numbers, in the order fgen.c reads them */
  size_t first = off;
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    int nop = x->kind == DEV_FN_BINARY ? 2 : x->kind == DEV_FN_TERNARY ? 3 : x->kind == DEV_FN_UNARY ? 1 : 0;
    int dt = x->dtype;
    const dev_opinfo *o = x->kind == DEV_FN_BINARY ? dev_binop_info(x->code) : NULL;
    if (x->kind == DEV_FN_BINARY) dt = p->node[x->a[is_num(&p->node[x->a[0]])]].dtype;
    for (int j = 0; j < nop; j++) {
      const dev_fnode *a = &p->node[x->a[j]];
      if (!is_num(a)) continue;
      dev_scalar s = a->kind == DEV_FN_CONST ? a->k : op->fargs->param[a->index];
      /* a comparison sees the number as its tensor's dtype holds it, as the
       * binding makes the unfused op's */
      if (o && o->to_bool) s = dev_scalar_as(s, (dev_dtype)dt);
      if (off + sizeof(knum) > cap) return fail_msg(err, errlen, "%s: too many numbers for one kernel", p->name);
      knum v = number(s, dt);
      memcpy((char *)buf + off, &v, sizeof v);
      off += sizeof v;
    }
  }
  if (off == first) {
    knum zero;
    zero.i = 0;
    memcpy((char *)buf + off, &zero, sizeof zero);   /* num[1] of a program without numbers */
    off += sizeof zero;
  }
  *len = off;
  int64_t items = *vec ? (t.n + 16 / widest - 1) / (16 / widest) : t.n;
  *grid = k_blocks(items > 0 ? items : 1, env);
  return 0;
}
