/* DEV_OP_FUSED on the host: a block-wise interpreter over the program's
 * nodes (device.h: dev_fprog).  The next BLK elements of each input are
 * gathered into a block of its compute type, each node runs the op's own
 * block loop of cpu_ops.c (the scalar functions of scalar.h) into a block of
 * its own, and the last node's block is stored.  A node whose dtype is
 * narrower than its compute type (f16, bf16, i8, u8, i32, bool) is rounded
 * to it (stored into and loaded back from a scratch array), so every value
 * is the one the unfused op would have written: the results are the
 * unfused ops' bit for bit.  Number operands are made into blocks once per
 * run, as the unfused op makes its number operand (cpu_scalar_to). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "cpu_priv.h"
#include "scalar.h"
#include "util.h"

typedef struct run {
  const dev_fprog *p;
  block *val;        /* one per node */
  block *num;        /* a number operand of a node, as its op takes it: 3 per node */
  walk in[DEV_FMAXIN];
  char scratch[BLK * 8];
} run;

static int is_num(const dev_fnode *x) { return x->kind == DEV_FN_CONST || x->kind == DEV_FN_PARAM; }

/* dtypes held exactly by their compute type need no rounding */
static int narrow(dev_dtype t) { return t != DEV_F32 && t != DEV_F64 && t != DEV_I64; }

static void round_to(run *r, dev_dtype t, block *b, int64_t k)
{
  if (!narrow(t)) return;
  store_run(class_of(t), t, r->scratch, 1, k, b);
  load_run(class_of(t), t, r->scratch, 1, k, b);
}

/* b's n values from class `from` to class `to` (exact but for double to
 * float, which only where's condition and casts need, with 0/1 and the
 * cast's own rule) */
static void convert(cclass from, cclass to, const block *b, block *o, int64_t n)
{
  int64_t i;
  if (from == to) { if (b != o) memcpy(o, b, (size_t)n * class_size(to)); return; }
  for (i = 0; i < n; i++) {
    double v = from == C_FLOAT ? (double)b->f[i] : from == C_DOUBLE ? b->d[i] : (double)b->i[i];
    if (to == C_FLOAT) o->f[i] = (float)v;
    else if (to == C_DOUBLE) o->d[i] = v;
    else o->i[i] = b->i[i];   /* only int to int reaches here */
  }
}

/* The number operands' blocks: each as the op reading it takes a number of
 * its dtype t (a comparison sees it as t holds it, as the binding does). */
static void make_numbers(run *r, const dev_kop *op)
{
  const dev_fprog *p = r->p;
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    int nop = x->kind == DEV_FN_BINARY ? 2 : x->kind == DEV_FN_TERNARY ? 3 : 0;
    const dev_opinfo *o = x->kind == DEV_FN_BINARY ? dev_binop_info(x->code) : dev_terop_info(x->code);
    dev_dtype t = x->dtype;
    if (nop == 2 && o->to_bool) t = p->node[is_num(&p->node[x->a[0]]) ? x->a[1] : x->a[0]].dtype;
    for (int j = 0; j < nop; j++) {
      const dev_fnode *a = &p->node[x->a[j]];
      if (!is_num(a)) continue;
      dev_scalar s = a->kind == DEV_FN_CONST ? a->k : op->fargs->param[a->index];
      if (nop == 2 && o->to_bool) s = dev_scalar_as(s, t);
      cpu_scalar_to(s, t, &r->num[i * 3 + j]);
    }
  }
}

static const block *operand(run *r, int i, int j)
{
  int a = r->p->node[i].a[j];
  return is_num(&r->p->node[a]) ? &r->num[i * 3 + j] : &r->val[a];
}

/* Node i over the block's k elements; -1 on an integer division by zero. */
static int eval(run *r, int i, int64_t k)
{
  const dev_fnode *x = &r->p->node[i];
  block *v = &r->val[i];
  cclass c = class_of(x->dtype), ca;
  dev_dtype at;
  switch (x->kind) {
  case DEV_FN_INPUT:
    walk_load(&r->in[x->index], x->dtype, c, k, v);
    cpu_pad8(c, v, k);
    return 0;
  case DEV_FN_UNARY:
    at = r->p->node[x->a[0]].dtype;
    cpu_unop_block(x->code, class_of(at), operand(r, i, 0), v, k);
    break;
  case DEV_FN_BINARY:
    at = r->p->node[x->a[is_num(&r->p->node[x->a[0]])]].dtype;
    if (cpu_binop_block(x->code, class_of(at), operand(r, i, 0), operand(r, i, 1), v, k) > 0) return -1;
    break;
  case DEV_FN_TERNARY: {
    const block *cond = operand(r, i, 0);
    if (dev_terop_info(x->code)->flags & DEV_OPF_COND) {
      /* the condition (0/1) in the compute type, as the unfused op loads it */
      convert(C_INT, c, cond, (block *)r->scratch, (k + 7) & ~(int64_t)7);
      cond = (const block *)r->scratch;
    }
    cpu_terop_block(x->code, c, cond, operand(r, i, 1), operand(r, i, 2), v, k);
    break;
  }
  case DEV_FN_CAST:
    /* as the unfused cast: integers exact as int64, floats through double */
    at = r->p->node[x->a[0]].dtype;
    ca = class_of(at) == C_INT ? C_INT : C_DOUBLE;
    convert(class_of(at), ca, &r->val[x->a[0]], v, (k + 7) & ~(int64_t)7);
    store_run(ca, x->dtype, r->scratch, 1, k, v);
    load_run(c, x->dtype, r->scratch, 1, k, v);
    cpu_pad8(c, v, k);
    return 0;
  default:
    return 0;
  }
  round_to(r, x->dtype, v, k);
  return 0;
}

/* Where the walk would be after lo elements (flat C order of its merged
 * dims): a chunk of the split starts there. */
static void walk_seek(walk *w, int64_t lo)
{
  w->off = 0;
  for (int d = w->nd - 1; d >= 0; d--) {
    w->idx[d] = lo % w->shape[d];
    w->off += w->idx[d] * w->stride[d];
    lo /= w->shape[d];
  }
}

/* One fused op shared out over the host's threads (cpu_par.c): the number
 * blocks are made once and read by every chunk; each chunk has its own
 * value blocks and walks.  The first chunk (lowest index) with an integer
 * division by zero names the op, as the one-thread loop would. */
typedef struct fused_job {
  const dev_kop *op;
  const block *num;
  pthread_mutex_t mu;
  int64_t zlo;     /* the first element of the lowest chunk with a zero division */
  int znode;       /* its node */
  int oom;
} fused_job;

static void fused_chunk(void *arg, int64_t lo, int64_t hi)
{
  fused_job *j = arg;
  const dev_kop *op = j->op;
  const dev_fprog *p = op->fprog;
  int zdiv = -1;
  walk wo;
  run *r = malloc(sizeof *r);
  block *val = malloc((size_t)p->n * sizeof(block));
  if (!r || !val) {
    free(r);
    free(val);
    pthread_mutex_lock(&j->mu);
    j->oom = 1;
    pthread_mutex_unlock(&j->mu);
    return;
  }
  r->p = p;
  r->val = val;
  r->num = (block *)j->num;   /* read only here */
  for (int i = 0; i < op->nin; i++) {
    walk_init(&r->in[i], dev_kop_in(op, i));
    walk_seek(&r->in[i], lo);
  }
  walk_init(&wo, &op->out);
  walk_seek(&wo, lo);
  for (int64_t done = lo, k; done < hi; done += k) {
    k = min64(BLK, hi - done);
    for (int i = 0; i < p->n; i++)
      if (eval(r, i, k) && zdiv < 0) zdiv = i;
    walk_store(&wo, op->out.dtype, class_of(op->out.dtype), k, &r->val[p->n - 1]);
  }
  if (zdiv >= 0) {
    pthread_mutex_lock(&j->mu);
    if (j->znode < 0 || lo < j->zlo) { j->zlo = lo; j->znode = zdiv; }
    pthread_mutex_unlock(&j->mu);
  }
  free(val);
  free(r);
}

/* Chunks may run in any order when no input shares memory with out but
 * for being out itself (an update in place, `w = w - lr * g`): then each
 * element reads only what its own position holds.  A shifted overlap keeps
 * the one thread's order. */
static int split_ok(const dev_kop *op)
{
  const dev_view *out = &op->out;
  for (int i = 0; i < op->nin; i++) {
    const dev_view *v = dev_kop_in(op, i);
    if (!cpu_views_overlap(out, v)) continue;
    if (v->buf != out->buf || v->offset != out->offset || v->dtype != out->dtype || v->ndim != out->ndim) return 0;
    for (int d = 0; d < v->ndim; d++)
      if (v->shape[d] != out->shape[d] || (v->shape[d] > 1 && v->stride[d] != out->stride[d])) return 0;
  }
  return 1;
}

int cpu_run_fused(const dev_kop *op, char *err, size_t errlen)
{
  const dev_fprog *p = op->fprog;
  const dev_view *out = &op->out;
  int64_t n = dev_view_numel(out);
  int rc = 0;
  if (!p || op->nin != p->nin) return fail_msg(err, errlen, "fused: bad program");
  if (check_view(out, "out", err, errlen)) return -1;
  if ((op->nin > DEV_MAXIN || p->nparam) && !op->fargs) return fail_msg(err, errlen, "fused: no arguments");
  for (int i = 0; i < op->nin; i++)
    if (check_view(dev_kop_in(op, i), "in", err, errlen)) return -1;
  if (n == 0) return 0;
  run *r = malloc(sizeof *r);
  block *num = malloc((size_t)p->n * 3 * sizeof(block));
  if (!r || !num) { free(r); free(num); return fail_msg(err, errlen, "%s: out of memory", p->name); }
  r->p = p;
  r->num = num;
  make_numbers(r, op);
  free(r);
  fused_job j = {.op = op, .num = num, .zlo = 0, .znode = -1};
  pthread_mutex_init(&j.mu, NULL);
  if (split_ok(op)) rc = cpu_par_for(n, BLK, fused_chunk, &j, err, errlen);
  else fused_chunk(&j, 0, n);
  pthread_mutex_destroy(&j.mu);
  free(num);
  if (rc) return rc;
  if (j.oom) return fail_msg(err, errlen, "%s: out of memory", p->name);
  if (j.znode >= 0)
    return fail_msg(err, errlen, "%s: integer division by zero", dev_binop_name(p->node[j.znode].code));
  return 0;
}
