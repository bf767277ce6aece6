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
  block **val;       /* per node: its value's block (a slot, shared with nodes that are done) */
  block **home;      /* per node: its slot (an input's val may point into the tensor instead) */
  block *num;        /* a number operand of a node, as its op takes it: 3 per node */
  const int *last;   /* per node: the last node that reads it (assign_slots) */
  int skip;          /* a node that its reader's pair loop already ran, -1: none */
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
  return is_num(&r->p->node[a]) ? &r->num[i * 3 + j] : r->val[a];
}

/* The walk's next k elements where the ops can read or write them in
 * place (advanced past them), NULL when they must go through a block: a
 * dtype that is its own compute type, k a multiple of 8 (the loops run to
 * round8(k)), one contiguous run, aligned as a block is.  Saves a copy of
 * each block in and out: a quarter of a fused GELU's time. */
static char *walk_direct(walk *w, dev_dtype t, int64_t k)
{
  char *p;
  int64_t s;
  if ((t != DEV_F32 && t != DEV_F64 && t != DEV_I64) || k % 8 || w->stride[w->nd - 1] != 1 || walk_avail(w) < k)
    return NULL;
  if ((uintptr_t)(w->p + w->off * w->esz) % _Alignof(block)) return NULL;
  walk_run(w, k, &p, &s);
  return p;
}

/* Node i, an f32 op of two f32 values, and node i + 1, the only reader of
 * its value, an f32 op of it and a number: both in one loop
 * (cpu_binop_pair_f: add, sub, mul, div) into i + 1's block, when that
 * block is not one i reads.  1 when it ran. */
static int eval_pair(run *r, int i, int64_t k)
{
  const dev_fprog *p = r->p;
  const dev_fnode *x = &p->node[i], *y = &p->node[i + 1];
  if (i + 1 >= p->n || r->last[i] != i + 1 || y->kind != DEV_FN_BINARY) return 0;
  if (x->dtype != DEV_F32 || y->dtype != DEV_F32 || is_num(&p->node[x->a[0]]) || is_num(&p->node[x->a[1]]))
    return 0;
  if (p->node[x->a[0]].dtype != DEV_F32 || p->node[x->a[1]].dtype != DEV_F32) return 0;
  int left = is_num(&p->node[y->a[0]]);
  if (left == is_num(&p->node[y->a[1]]) || y->a[left] != i) return 0;
  const block *a = operand(r, i, 0), *b = operand(r, i, 1);
  if (r->val[i + 1] == a || r->val[i + 1] == b) return 0;
  if (!cpu_binop_pair_f(x->code, y->code, left, a, b, operand(r, i + 1, !left), r->val[i + 1], k)) return 0;
  r->skip = i + 1;
  return 1;
}

/* Node i over the block's k elements; -1 on an integer division by zero. */
static int eval(run *r, int i, int64_t k)
{
  const dev_fnode *x = &r->p->node[i];
  block *v = r->val[i];
  cclass c = class_of(x->dtype), ca;
  dev_dtype at;
  if (i == r->skip) { r->skip = -1; return 0; }
  if (x->kind == DEV_FN_BINARY && eval_pair(r, i, k)) return 0;
  switch (x->kind) {
  case DEV_FN_INPUT: {
    char *d = walk_direct(&r->in[x->index], x->dtype, k);
    r->val[i] = d ? (block *)d : r->home[i];   /* read only: the ops take const operands */
    if (d) return 0;
    v = r->val[i];
    walk_load(&r->in[x->index], x->dtype, c, k, v);
    cpu_pad8(c, v, k);
    return 0;
  }
  case DEV_FN_UNARY:
    at = r->p->node[x->a[0]].dtype;
    cpu_unop_block(x->code, class_of(at), operand(r, i, 0), v, k);
    break;
  case DEV_FN_BINARY: {
    int left = is_num(&r->p->node[x->a[0]]), right = is_num(&r->p->node[x->a[1]]);
    at = r->p->node[x->a[left]].dtype;
    /* a number operand stays a number (in a register), not a block */
    int64_t z = left != right ? cpu_binop_block_k(x->code, class_of(at), operand(r, i, left), operand(r, i, !left),
                                                   left, v, k)
                              : cpu_binop_block(x->code, class_of(at), operand(r, i, 0), operand(r, i, 1), v, k);
    if (z > 0) return -1;
    break;
  }
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
    convert(class_of(at), ca, r->val[x->a[0]], v, (k + 7) & ~(int64_t)7);
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
  const int *slot;   /* per node: its block among nslot, -1: a number */
  int nslot;
  int out_direct;    /* the last node may write into out's memory (out_direct_ok) */
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
  walk wo[DEV_FMAXOUT];
  run *r = malloc(sizeof *r);
  block *mem = malloc((size_t)j->nslot * sizeof(block));
  block **val = malloc((size_t)p->n * 2 * sizeof *val);
  if (!r || !mem || !val) {
    free(r);
    free(mem);
    free(val);
    pthread_mutex_lock(&j->mu);
    j->oom = 1;
    pthread_mutex_unlock(&j->mu);
    return;
  }
  r->p = p;
  for (int i = 0; i < p->n; i++) val[i] = val[p->n + i] = j->slot[i] >= 0 ? &mem[j->slot[i]] : NULL;
  r->val = val;
  r->home = val + p->n;
  r->num = (block *)j->num;   /* read only here */
  r->last = j->slot + p->n;
  r->skip = -1;
  for (int i = 0; i < op->nin; i++) {
    walk_init(&r->in[i], dev_kop_in(op, i));
    walk_seek(&r->in[i], lo);
  }
  for (int o = 0; o < p->nout; o++) {
    walk_init(&wo[o], dev_kop_out(op, o));
    walk_seek(&wo[o], lo);
  }
  for (int64_t done = lo, k; done < hi; done += k) {
    k = min64(BLK, hi - done);
    char *od = j->out_direct ? walk_direct(&wo[0], op->out.dtype, k) : NULL;
    r->val[p->n - 1] = od ? (block *)od : r->home[p->n - 1];
    for (int i = 0; i < p->n; i++)
      if (eval(r, i, k) && zdiv < 0) zdiv = i;
    for (int o = od ? 1 : 0; o < p->nout; o++) {
      dev_dtype t = dev_kop_out(op, o)->dtype;
      walk_store(&wo[o], t, class_of(t), k, r->val[p->res[o]]);
    }
  }
  if (zdiv >= 0) {
    pthread_mutex_lock(&j->mu);
    if (j->znode < 0 || lo < j->zlo) { j->zlo = lo; j->znode = zdiv; }
    pthread_mutex_unlock(&j->mu);
  }
  free(mem);
  free(val);
  free(r);
}

/* Blocks for the nodes' values, a node's block taken back once its last
 * reader has run: GELU's 10 values live in 3 blocks, so a chunk's blocks
 * and the number blocks stay in L1 (a block per node, 12 of them, did
 * not).  A node's block is taken before its operands' go back, so no op
 * writes the block it reads (the loops take restrict arrays).  The last
 * node's block is stored after the loop: nothing reads past it. */
static int assign_slots(const dev_fprog *p, int *slot, int *last)
{
  int nslot = 0, nfree = 0, *free_ = last + p->n;
  for (int i = 0; i < p->n; i++) last[i] = -1;
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    int nop = x->kind == DEV_FN_UNARY || x->kind == DEV_FN_CAST ? 1 : x->kind == DEV_FN_BINARY ? 2
              : x->kind == DEV_FN_TERNARY ? 3 : 0;
    for (int j = 0; j < nop; j++) last[x->a[j]] = i;
  }
  for (int j = 0; j < p->nout; j++) last[p->res[j]] = p->n;   /* stored after the loop: kept */
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    if (is_num(x)) { slot[i] = -1; continue; }
    slot[i] = nfree > 0 ? free_[--nfree] : nslot++;
    int nop = x->kind == DEV_FN_UNARY || x->kind == DEV_FN_CAST ? 1 : x->kind == DEV_FN_BINARY ? 2
              : x->kind == DEV_FN_TERNARY ? 3 : 0;
    for (int j = 0; j < nop; j++) {
      int a = x->a[j], dup = 0;
      for (int m = 0; m < j; m++) dup |= x->a[m] == a;
      if (!dup && last[a] == i && slot[a] >= 0) free_[nfree++] = slot[a];
    }
  }
  return nslot;
}

/* Chunks may run in any order when no input shares memory with out but
 * for being out itself (an update in place, `w = w - lr * g`): then each
 * element reads only what its own position holds.  A shifted overlap keeps
 * the one thread's order. */
static int split_ok(const dev_kop *op)
{
  for (int o = 0; o < op->fprog->nout; o++) {
    const dev_view *out = dev_kop_out(op, o);
    for (int i = 0; i < op->nin; i++) {
      const dev_view *v = dev_kop_in(op, i);
      if (!cpu_views_overlap(out, v)) continue;
      if (v->buf != out->buf || v->offset != out->offset || v->dtype != out->dtype || v->ndim != out->ndim) return 0;
      for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] != out->shape[d] || (v->shape[d] > 1 && v->stride[d] != out->stride[d])) return 0;
    }
  }
  return 1;
}

/* The last node may write into out's memory: an op (an input is not
 * copied, a cast goes through wider values in its block) of out's own
 * dtype, and no input shares memory with out (the loops take restrict
 * arrays). */
static int out_direct_ok(const dev_kop *op)
{
  const dev_fnode *x = &op->fprog->node[op->fprog->n - 1];
  if (op->fprog->nout > 1) return 0;   /* the results' blocks are stored after the loop */
  if (x->kind != DEV_FN_UNARY && x->kind != DEV_FN_BINARY && x->kind != DEV_FN_TERNARY) return 0;
  if (x->dtype != op->out.dtype) return 0;
  for (int i = 0; i < op->nin; i++)
    if (cpu_views_overlap(&op->out, dev_kop_in(op, i))) return 0;
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
  if ((op->nin > DEV_MAXIN || p->nparam || p->nout > 1) && !op->fargs)
    return fail_msg(err, errlen, "fused: no arguments");
  for (int o = 1; o < p->nout; o++)
    if (check_view(dev_kop_out(op, o), "out", err, errlen)) return -1;
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
  int *slot = malloc((size_t)p->n * 3 * sizeof(int));
  if (!slot) { free(num); return fail_msg(err, errlen, "%s: out of memory", p->name); }
  fused_job j = {.op = op, .num = num, .slot = slot, .zlo = 0, .znode = -1};
  j.nslot = assign_slots(p, slot, slot + p->n);
  j.out_direct = out_direct_ok(op);
  pthread_mutex_init(&j.mu, NULL);
  if (split_ok(op)) rc = cpu_par_for(n, BLK, fused_chunk, &j, err, errlen);
  else fused_chunk(&j, 0, n);
  pthread_mutex_destroy(&j.mu);
  free(slot);
  free(num);
  if (rc) return rc;
  if (j.oom) return fail_msg(err, errlen, "%s: out of memory", p->name);
  if (j.znode >= 0)
    return fail_msg(err, errlen, "%s: integer division by zero", dev_binop_name(p->node[j.znode].code));
  return 0;
}
