/* Fused programs (DEV_OP_FUSED): checking and interning.  A program is
 * checked once, here, against the dtype rules of ops.h, so that the backends
 * run it without checks of their own; interned by content (a list under a
 * mutex), never freed: a queued op or a graph holds a plain pointer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry { struct entry *next; dev_fprog *p; } *programs;
static uint64_t count;

static int fail(char *err, size_t errlen, int i, const char *msg, const char *a, const char *b)
{
  snprintf(err, errlen, "node %d: %s%s%s", i + 1, msg, a ? a : "", b ? b : "");
  return -1;
}

static int is_num(const dev_fnode *x) { return x->kind == DEV_FN_CONST || x->kind == DEV_FN_PARAM; }

/* The operands of an op node: earlier nodes, tensors where a tensor must be,
 * of the dtypes the op's row takes. */
static int check_op(const dev_fnode *nd, int i, char *err, size_t errlen)
{
  const dev_fnode *x = &nd[i];
  const dev_opinfo *o = x->kind == DEV_FN_UNARY ? dev_unop_info(x->code)
                        : x->kind == DEV_FN_BINARY ? dev_binop_info(x->code) : dev_terop_info(x->code);
  int nop = x->kind == DEV_FN_UNARY ? 1 : x->kind == DEV_FN_BINARY ? 2 : 3;
  dev_dtype t = DEV_NDTYPE;
  if (!o || (x->kind == DEV_FN_UNARY && x->code == DEV_UN_COPY)) return fail(err, errlen, i, "bad op", 0, 0);
  for (int j = 0; j < nop; j++) {
    int a = x->a[j];
    if (a < 0 || a >= i) return fail(err, errlen, i, "bad operand", 0, 0);
    if (is_num(&nd[a])) {
      if (j == 0 && x->kind != DEV_FN_BINARY) return fail(err, errlen, i, o->name, " needs a tensor first", 0);
      continue;
    }
    if (j == 0 && x->kind == DEV_FN_TERNARY && (o->flags & DEV_OPF_COND)) {
      if (nd[a].dtype != DEV_BOOL) return fail(err, errlen, i, o->name, ": the condition must be bool", 0);
      continue;
    }
    if (t == DEV_NDTYPE) t = nd[a].dtype;
    else if (nd[a].dtype != t) return fail(err, errlen, i, o->name, ": operand dtypes differ", 0);
  }
  if (t == DEV_NDTYPE) return fail(err, errlen, i, o->name, " needs a tensor operand", 0);
  if (x->kind == DEV_FN_BINARY && is_num(&nd[x->a[0]]) && !(o->flags & DEV_OPF_LEFT))
    return fail(err, errlen, i, o->name, " takes no number on its left", 0);
  if (!(dev_dtype_class(t) & o->classes)) return fail(err, errlen, i, o->name, " is not defined for ", dev_dtype_name(t));
  if (x->dtype != (o->to_bool ? DEV_BOOL : t)) return fail(err, errlen, i, o->name, ": wrong result dtype", 0);
  return 0;
}

static int check(const dev_fnode *nd, int n, int *nin, int *nparam, char *err, size_t errlen)
{
  *nin = *nparam = 0;
  if (n < 1 || n > DEV_FNODES) return fail(err, errlen, 0, "bad node count", 0, 0);
  for (int i = 0; i < n; i++) {
    const dev_fnode *x = &nd[i];
    switch (x->kind) {
    case DEV_FN_INPUT:
      if (x->index != *nin || x->index >= DEV_FMAXIN || (unsigned)x->dtype >= DEV_NDTYPE)
        return fail(err, errlen, i, "bad input (more than 8 tensors?)", 0, 0);
      (*nin)++;
      break;
    case DEV_FN_PARAM:
      if (x->index != *nparam || x->index >= DEV_FPARAMS) return fail(err, errlen, i, "bad parameter (more than 8 numbers?)", 0, 0);
      (*nparam)++;
      break;
    case DEV_FN_CONST: break;
    case DEV_FN_CAST:
      if (x->a[0] < 0 || x->a[0] >= i || is_num(&nd[x->a[0]]) || (unsigned)x->dtype >= DEV_NDTYPE)
        return fail(err, errlen, i, "bad cast", 0, 0);
      break;
    case DEV_FN_UNARY: case DEV_FN_BINARY: case DEV_FN_TERNARY:
      if (check_op(nd, i, err, errlen)) return -1;
      break;
    default: return fail(err, errlen, i, "bad kind", 0, 0);
    }
  }
  return 0;
}

/* The results: 1..DEV_FMAXOUT nodes, each a tensor node. */
static int check_res(const dev_fnode *nd, int n, const int *res, int nout, char *err, size_t errlen)
{
  if (nout < 1 || nout > DEV_FMAXOUT) {
    snprintf(err, errlen, "%d results (1 to %d in one fused op)", nout, DEV_FMAXOUT);
    return -1;
  }
  for (int j = 0; j < nout; j++) {
    if (res[j] < 0 || res[j] >= n) {
      snprintf(err, errlen, "result %d: bad node", j + 1);
      return -1;
    }
    if (is_num(&nd[res[j]])) return fail(err, errlen, res[j], "the result is a number, not a tensor", 0, 0);
  }
  return 0;
}

/* The reductions a program may end in: one of the trailing ones per
 * result, every result of one dtype (one pass reduces them all). */
static int check_red(const dev_fnode *nd, const int *res, int nout, const int *red, char *err, size_t errlen)
{
  for (int j = 0; j < nout; j++) {
    int c = red[j];
    if (c != DEV_RED_SUM && c != DEV_RED_MEAN && c != DEV_RED_PROD && c != DEV_RED_MAX && c != DEV_RED_MIN) {
      snprintf(err, errlen, "result %d: a fused op ends in sum, mean, prod, max or min, not %s", j + 1,
               (unsigned)c < DEV_NREDOP ? dev_redop_name(c) : "?");
      return -1;
    }
    if (nd[res[j]].dtype != nd[res[0]].dtype) {
      snprintf(err, errlen, "result %d: the values reduced in one op have one dtype (%s, then %s)", j + 1,
               dev_dtype_name(nd[res[0]].dtype), dev_dtype_name(nd[res[j]].dtype));
      return -1;
    }
  }
  return 0;
}

const dev_fprog *dev_fprog_intern_red(const char *name, const dev_fnode *nodes, int n, const int *res, int nout,
                                      const int *red, char *err, size_t errlen)
{
  int nin, nparam;
  if (check(nodes, n, &nin, &nparam, err, errlen) || check_res(nodes, n, res, nout, err, errlen) ||
      (red && check_red(nodes, res, nout, red, err, errlen)))
    return NULL;
  size_t sz = sizeof(dev_fprog) + (size_t)n * sizeof(dev_fnode);
  dev_fprog *p = calloc(1, sz);
  if (!p) { snprintf(err, errlen, "out of memory"); return NULL; }
  snprintf(p->name, sizeof p->name, "%s", name ? name : "fused");
  p->n = n;
  p->nin = nin;
  p->nparam = nparam;
  p->nout = nout;
  memcpy(p->res, res, (size_t)nout * sizeof *res);
  if (red) {
    p->nred = nout;
    memcpy(p->red, red, (size_t)nout * sizeof *red);
  }
  memcpy(p->node, nodes, (size_t)n * sizeof(dev_fnode));
  pthread_mutex_lock(&lock);
  for (struct entry *e = programs; e; e = e->next)
    if (e->p->n == n && memcmp(e->p, p, sz) == 0) {
      pthread_mutex_unlock(&lock);
      free(p);
      return e->p;
    }
  struct entry *e = malloc(sizeof *e);
  if (!e) { pthread_mutex_unlock(&lock); free(p); snprintf(err, errlen, "out of memory"); return NULL; }
  e->p = p;
  e->next = programs;
  programs = e;
  count++;
  pthread_mutex_unlock(&lock);
  return p;
}

const dev_fprog *dev_fprog_intern_res(const char *name, const dev_fnode *nodes, int n, const int *res, int nout,
                                      char *err, size_t errlen)
{
  return dev_fprog_intern_red(name, nodes, n, res, nout, NULL, err, errlen);
}

const dev_fprog *dev_fprog_intern(const char *name, const dev_fnode *nodes, int n, char *err, size_t errlen)
{
  int last = n - 1;
  return dev_fprog_intern_res(name, nodes, n, &last, 1, err, errlen);
}

uint64_t dev_fprog_count(void)
{
  pthread_mutex_lock(&lock);
  uint64_t n = count;
  pthread_mutex_unlock(&lock);
  return n;
}
