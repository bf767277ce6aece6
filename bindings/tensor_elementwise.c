/* gpu.Tensor elementwise ops: the rows of cuda/ops.h, one method each (and
 * one with `_`, in place, where the result has the tensor's dtype), made
 * from the rows; the arithmetic metamethods; the ternary rows' methods,
 * written out (where, clamp); max and min, elementwise with an operand and
 * the reduction without.  Operands broadcast as NumPy's. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tensor.h"

static int is_intdt(dev_dtype t) { return !dev_dtype_is_float(t) && t != DEV_BOOL; }

/* An op's dtype rule (ops.h), checked before anything is allocated. */
static int takes(const dev_opinfo *o, dev_dtype t) { return (dev_dtype_class(t) & o->classes) != 0; }

static int unary(lua_State *L, dev_unop code, int inplace) {
  const dev_opinfo *info = dev_unop_info(code);
  const char *fname = info->name;
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_dtype dt = t->v.dtype, rdt = info->to_bool ? DEV_BOOL : dt;
  if (!takes(info, dt))
    luaL_error(L, "%s: not supported for %s (needs a %s dtype)", fname, dev_dtype_name(dt),
               info->classes == DEV_CLS_F ? "float" : "numeric");
  int o = bind_read_opts(L, 2, bind_out_opts);
  dev_view tv = t->v;
  gpu_tensor *r = inplace ? t : bind_tensor_out(L, o, o + 1, t, rdt, tv.ndim, tv.shape, fname);
  dev_kop op = {.kind = DEV_OP_UNARY, .code = code, .nin = 1, .out = r->v};
  op.in[0] = tv;
  bind_tensor_submit2(L, o + 1, &op, inplace ? 1 : lua_gettop(L), 1, 0, fname);
  if (inplace) lua_settop(L, 1);
  return 1;
}

/* t:name(opts), and t:name_(opts) in place when the result has t's dtype */
#define UNARY_FUNCS(E, name, cls, res, fl)                                  \
  static int t_##name(lua_State *L) { return unary(L, DEV_UN_##E, 0); }     \
  DEV_IF_SAME(res, static int t_##name##_(lua_State *L) { return unary(L, DEV_UN_##E, 1); })
DEV_UNARY_OPS(UNARY_FUNCS)
#undef UNARY_FUNCS

static int t_unm(lua_State *L) {
  lua_settop(L, 1);
  return unary(L, DEV_UN_NEG, 0);
}

/* numpy broadcasting of n views: the result's shape, and each view expanded
 * to it (stride 0 along the dims it broadcasts); -1 when they do not
 * broadcast. */
int bind_tensor_broadcast(int n, const dev_view *const *in, dev_view *ex, int *ndim, int64_t *shape) {
  int nd = 0;
  for (int i = 0; i < n; i++)
    if (in[i]->ndim > nd) nd = in[i]->ndim;
  for (int d = nd - 1; d >= 0; d--) {
    int64_t sz = 1;
    for (int i = 0; i < n; i++) {
      int di = d - (nd - in[i]->ndim);
      int64_t si = di >= 0 ? in[i]->shape[di] : 1;
      if (si == 1) continue;
      if (sz != 1 && sz != si) return -1;
      sz = si;
    }
    shape[d] = sz;
  }
  for (int i = 0; i < n; i++) {
    ex[i] = *in[i];
    ex[i].ndim = nd;
    for (int d = 0; d < nd; d++) {
      int di = d - (nd - in[i]->ndim);
      ex[i].shape[d] = shape[d];
      ex[i].stride[d] = di >= 0 && in[i]->shape[di] != 1 ? in[i]->stride[di] : 0;
    }
  }
  *ndim = nd;
  return 0;
}

static int broadcast(const dev_view *a, const dev_view *b, dev_view *ea, dev_view *eb,
                     int *ndim, int64_t *shape) {
  const dev_view *in[2] = {a, b};
  dev_view ex[2];
  if (bind_tensor_broadcast(2, in, ex, ndim, shape)) return -1;
  *ea = ex[0];
  *eb = ex[1];
  return 0;
}

/* The number a binary op takes when its operand is left out (ops.h). */
static int has_default(dev_binop code, double *def) {
#define DEFAULT(E, v) if (code == DEV_BIN_##E) { *def = (v); return 1; }
  DEV_BINARY_DEFAULTS(DEFAULT)
#undef DEFAULT
  return 0;
}

static int binary_op(lua_State *L, dev_binop code, int ia, int ib, int opts, int inplace, int scalar_left) {
  const dev_opinfo *info = dev_binop_info(code);
  double def;
  if (lua_isnoneornil(L, ib) && has_default(code, &def)) {
    if (lua_gettop(L) < ib) lua_settop(L, ib);
    lua_pushnumber(L, def);
    lua_replace(L, ib);
  }
  const char *fname = info->name;
  gpu_tensor *t = bind_check_tensor(L, ia);
  dev_dtype dt = t->v.dtype, rdt = info->to_bool ? DEV_BOOL : dt;
  if (!takes(info, dt)) luaL_error(L, "%s: not supported for %s", fname, dev_dtype_name(dt));
  int out = bind_read_opts(L, opts, bind_out_opts), stream = out + 1;
  dev_kop op = {.kind = DEV_OP_BINARY, .code = code};
  gpu_tensor *x = bind_test_tensor(L, ib);
  int ndim = 0;
  int64_t shape[DEV_MAXDIM];
  if (x) {
    if (x->v.dtype != dt)
      luaL_argerror(L, ib, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                           dev_dtype_name(x->v.dtype), dev_dtype_name(dt), dev_dtype_name(dt)));
    bind_tensor_same_kind(L, ib, t, x);
    if (broadcast(&t->v, &x->v, &op.in[0], &op.in[1], &ndim, shape)) {
      char a[MAXSHAPESTR], b[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, t->v.ndim, t->v.shape);
      bind_shape_str(b, sizeof b, x->v.ndim, x->v.shape);
      luaL_argerror(L, ib, lua_pushfstring(L, "shape %s cannot be broadcast with %s", b, a));
    }
    op.nin = 2;
  } else {
    if (lua_type(L, ib) != LUA_TNUMBER && !(dt == DEV_BOOL && lua_isboolean(L, ib)))
      luaL_typeerror(L, ib, "gpu.Tensor or number");
    op.s0 = bind_check_scalar(L, ib, dt, ib, NULL);
    /* a comparison sees the number as the tensor's dtype holds it (0.1 as
     * f16 is 0.0999755859375), as NumPy does */
    if (info->to_bool) op.s0 = dev_scalar_as(op.s0, dt);
    if (is_intdt(dt) && op.s0.i == 0 && (info->flags & DEV_OPF_ZDIV) && !scalar_left)
      luaL_error(L, "%s: integer division by zero", fname);
    if (is_intdt(dt) && op.s0.i < 0 && code == DEV_BIN_POW && !scalar_left)
      luaL_error(L, "%s: integers to negative integer powers are not allowed", fname);
    op.nin = 1;
    op.flags = DEV_F_SCALAR | (scalar_left ? DEV_F_SCALAR_LEFT : 0);
    op.in[0] = t->v;
    ndim = t->v.ndim;
    memcpy(shape, t->v.shape, sizeof shape);
  }
  gpu_tensor *o;
  if (inplace) {
    int same = ndim == t->v.ndim;
    for (int d = 0; same && d < ndim; d++) same = shape[d] == t->v.shape[d];
    if (!same) {
      char a[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, ndim, shape);
      luaL_error(L, "%s_: result shape %s does not fit the tensor written in place", fname, a);
    }
    o = t;
  } else {
    o = bind_tensor_out(L, out, stream, t, rdt, ndim, shape, fname);
  }
  op.out = o->v;
  bind_tensor_submit2(L, stream, &op, inplace ? ia : lua_gettop(L), ia, x ? ib : 0, fname);
  if (inplace) lua_settop(L, ia);
  return 1;
}

/* t:name(x, opts), and t:name_(x, opts) in place when the result has t's dtype */
#define BINARY_FUNCS(E, name, cls, res, fl)                                                    \
  static int t_bin_##name(lua_State *L) { return binary_op(L, DEV_BIN_##E, 1, 2, 3, 0, 0); } \
  DEV_IF_SAME(res, static int t_bin_##name##_(lua_State *L) { return binary_op(L, DEV_BIN_##E, 1, 2, 3, 1, 0); })
DEV_BINARY_OPS(BINARY_FUNCS)
#undef BINARY_FUNCS

/* a op b where either may be a number */
static int meta_binary(lua_State *L, dev_binop code) {
  lua_settop(L, 2);
  lua_pushnil(L);  /* opts at 3 */
  if (bind_test_tensor_handle(L, 1)) return binary_op(L, code, 1, 2, 3, 0, 0);
  return binary_op(L, code, 2, 1, 3, 0, 1);
}

static int t_meta_add(lua_State *L) { return meta_binary(L, DEV_BIN_ADD); }
static int t_meta_sub(lua_State *L) { return meta_binary(L, DEV_BIN_SUB); }
static int t_meta_mul(lua_State *L) { return meta_binary(L, DEV_BIN_MUL); }
static int t_meta_div(lua_State *L) { return meta_binary(L, DEV_BIN_DIV); }
static int t_meta_pow(lua_State *L) { return meta_binary(L, DEV_BIN_POW); }
static int t_meta_mod(lua_State *L) { return meta_binary(L, DEV_BIN_REMAINDER); }
static int t_meta_idiv(lua_State *L) { return meta_binary(L, DEV_BIN_FLOOR_DIVIDE); }

/* max/min: elementwise with an operand (a bool tensor's may be a boolean),
 * a reduction without */
static int has_operand(lua_State *L) {
  return lua_type(L, 2) == LUA_TNUMBER || lua_isboolean(L, 2) || bind_test_tensor_handle(L, 2);
}

static int t_max(lua_State *L) {
  if (has_operand(L)) return binary_op(L, DEV_BIN_MAX, 1, 2, 3, 0, 0);
  return bind_tensor_reduce(L, DEV_RED_MAX);
}

static int t_min(lua_State *L) {
  if (has_operand(L)) return binary_op(L, DEV_BIN_MIN, 1, 2, 3, 0, 0);
  return bind_tensor_reduce(L, DEV_RED_MIN);
}

void bind_tensor_check_cond(lua_State *L, int arg, const gpu_tensor *c, const char *what) {
  if (c->v.dtype != DEV_BOOL)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s must be a bool tensor, got %s (make one with t:ne(0), t:gt(x), ...)",
                                          what, dev_dtype_name(c->v.dtype)));
}

/* Operand arg of a ternary op: a tensor (the caller takes it), or a number
 * for dtype dt, into s, with flag set in op. */
static void ternary_operand(lua_State *L, int arg, dev_dtype dt, dev_kop *op, int flag, dev_scalar *s) {
  if (bind_test_tensor(L, arg)) return;
  if (lua_type(L, arg) != LUA_TNUMBER && !(dt == DEV_BOOL && lua_isboolean(L, arg)))
    luaL_typeerror(L, arg, "gpu.Tensor or number");
  *s = bind_check_scalar(L, arg, dt, arg, NULL);
  op->flags |= flag;
}

/* gpu.where(cond, a, b, opts): cond ? a : b elementwise, cond a bool tensor,
 * a and b tensors of one dtype or numbers (both numbers: opts.dtype, f32 by
 * default), all broadcast together. */
static int tensor_where(lua_State *L) {
  gpu_tensor *c = bind_check_tensor(L, 1);
  bind_tensor_check_cond(L, 1, c, "condition");
  /* the operands before the options' slots, which may take their places */
  for (int arg = 2; arg <= 3; arg++)
    if (lua_isnone(L, arg)) luaL_typeerror(L, arg, "gpu.Tensor or number");
  static const char *const names[] = {"out", "stream", "dtype", NULL};
  int o = bind_read_opts(L, 4, names);
  gpu_tensor *a = bind_test_tensor(L, 2), *b = bind_test_tensor(L, 3), *first = a ? a : b;
  if (a && b && a->v.dtype != b->v.dtype)
    luaL_argerror(L, 3, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                        dev_dtype_name(b->v.dtype), dev_dtype_name(a->v.dtype), dev_dtype_name(a->v.dtype)));
  dev_dtype dt = bind_check_dtype(L, o + 2, first ? first->v.dtype : DEV_F32);
  if (first && dt != first->v.dtype)
    luaL_error(L, "bad option 'dtype' to 'where' (%s; the result takes the dtype of the tensors, %s)",
               dev_dtype_name(dt), dev_dtype_name(first->v.dtype));
  dev_kop op = {.kind = DEV_OP_TERNARY, .code = DEV_TER_WHERE};
  ternary_operand(L, 2, dt, &op, DEV_F_SCALAR2, &op.s0);
  ternary_operand(L, 3, dt, &op, DEV_F_SCALAR3, &op.s1);
  const dev_view *in[3] = {&c->v};
  int idx[3] = {1}, n = 1;
  if (a) { bind_tensor_same_kind(L, 2, c, a); in[n] = &a->v; idx[n++] = 2; }
  if (b) { bind_tensor_same_kind(L, 3, c, b); in[n] = &b->v; idx[n++] = 3; }
  int ndim;
  int64_t shape[DEV_MAXDIM];
  if (bind_tensor_broadcast(n, in, op.in, &ndim, shape)) {
    char sc[MAXSHAPESTR], sa[MAXSHAPESTR], sb[MAXSHAPESTR];
    bind_shape_str(sc, sizeof sc, c->v.ndim, c->v.shape);
    if (a) bind_shape_str(sa, sizeof sa, a->v.ndim, a->v.shape); else snprintf(sa, sizeof sa, "(number)");
    if (b) bind_shape_str(sb, sizeof sb, b->v.ndim, b->v.shape); else snprintf(sb, sizeof sb, "(number)");
    luaL_error(L, "where: shapes %s, %s and %s cannot be broadcast together", sc, sa, sb);
  }
  op.nin = n;
  op.out = bind_tensor_out(L, o, o + 1, c, dt, ndim, shape, "where")->v;
  bind_tensor_submit(L, o + 1, &op, lua_gettop(L), idx, n, "where");
  return 1;
}

/* A ternary row's method, t:name(x, y, opts): x and y numbers or tensors of
 * t's dtype, all broadcast; nil for none[k] where none is given (clamp's
 * missing bound); in place (t:name_) when inplace. */
static int ternary_method(lua_State *L, dev_terop code, int inplace, const dev_scalar *none) {
  const dev_opinfo *info = dev_terop_info(code);
  char fname[64];
  snprintf(fname, sizeof fname, "%s%s", info->name, inplace ? "_" : "");
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_dtype dt = t->v.dtype;
  if (!takes(info, dt))
    luaL_error(L, "%s: not supported for %s (needs a %s dtype)", fname, dev_dtype_name(dt),
               info->classes == DEV_CLS_F ? "float" : "numeric");
  /* in place, no out: slots out 0 and stream o; else o and o + 1 */
  int o = inplace ? bind_read_stream_opt(L, 4) : bind_read_opts(L, 4, bind_out_opts);
  int out = inplace ? 0 : o, stream = inplace ? o : o + 1;
  dev_kop op = {.kind = DEV_OP_TERNARY, .code = code};
  const dev_view *in[3] = {&t->v};
  int idx[3] = {1}, n = 1;
  for (int k = 0; k < 2; k++) {
    int arg = 2 + k, flag = k ? DEV_F_SCALAR3 : DEV_F_SCALAR2;
    dev_scalar *s = k ? &op.s1 : &op.s0;
    gpu_tensor *b = bind_test_tensor(L, arg);
    if (b) {
      if (b->v.dtype != dt)
        luaL_argerror(L, arg, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                              dev_dtype_name(b->v.dtype), dev_dtype_name(dt), dev_dtype_name(dt)));
      bind_tensor_same_kind(L, arg, t, b);
      in[n] = &b->v;
      idx[n++] = arg;
    } else if (none && lua_isnoneornil(L, arg)) {
      *s = none[k];
      op.flags |= flag;
    } else {
      ternary_operand(L, arg, dt, &op, flag, s);
    }
  }
  int ndim, same;
  int64_t shape[DEV_MAXDIM];
  if (bind_tensor_broadcast(n, in, op.in, &ndim, shape))
    luaL_error(L, "%s: the operands' shapes cannot be broadcast with the tensor's", fname);
  same = ndim == t->v.ndim;
  for (int d = 0; same && d < ndim; d++) same = shape[d] == t->v.shape[d];
  if (inplace && !same) {
    char a[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, ndim, shape);
    luaL_error(L, "%s: result shape %s does not fit the tensor written in place", fname, a);
  }
  op.nin = n;
  op.out = inplace ? t->v : bind_tensor_out(L, out, stream, t, dt, ndim, shape, fname)->v;
  bind_tensor_submit(L, stream, &op, inplace ? 1 : lua_gettop(L), idx, n, fname);
  if (inplace) lua_settop(L, 1);
  return 1;
}

/* t:clamp(lo, hi, opts): min(max(t, lo), hi); lo and hi numbers, tensors of
 * t's dtype or nil (no bound; not both), all broadcast; clamp_ in place. */
static int clamp(lua_State *L, int inplace) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (lua_isnoneornil(L, 2) && lua_isnoneornil(L, 3))
    luaL_error(L, "%s: give lo, hi or both", inplace ? "clamp_" : "clamp");
  /* a missing bound is the one that changes nothing */
  dev_scalar none[2] = {{0, 0, -HUGE_VAL}, {0, 0, HUGE_VAL}};
  if (!dev_dtype_is_float(t->v.dtype)) {
    none[0] = (dev_scalar){1, INT64_MIN, 0};
    none[1] = (dev_scalar){1, INT64_MAX, 0};
  }
  return ternary_method(L, DEV_TER_CLAMP, inplace, none);
}

static int t_clamp(lua_State *L) { return clamp(L, 0); }
static int t_clamp_(lua_State *L) { return clamp(L, 1); }
static int t_lerp(lua_State *L) { return ternary_method(L, DEV_TER_LERP, 0, NULL); }
static int t_lerp_(lua_State *L) { return ternary_method(L, DEV_TER_LERP, 1, NULL); }

/* ---- methods ---------------------------------------------------------- */

/* max and min first: they win over the rows below and the reductions'
 * (tensor.c keeps a name's first function) */
#define UNARY_REG(E, name, cls, res, fl) {#name, t_##name}, DEV_IF_SAME(res, {#name "_", t_##name##_},)
#define BINARY_REG(E, name, cls, res, fl) {#name, t_bin_##name}, DEV_IF_SAME(res, {#name "_", t_bin_##name##_},)
const luaL_Reg bind_tensor_elementwise_methods[] = {
  {"max", t_max}, {"min", t_min},
  {"clamp", t_clamp}, {"clamp_", t_clamp_},
  {"lerp", t_lerp}, {"lerp_", t_lerp_},
  DEV_UNARY_OPS(UNARY_REG)
  DEV_BINARY_OPS(BINARY_REG)
  {NULL, NULL}
};
#undef UNARY_REG
#undef BINARY_REG

const luaL_Reg bind_tensor_elementwise_meta[] = {
  {"__add", t_meta_add}, {"__sub", t_meta_sub}, {"__mul", t_meta_mul},
  {"__div", t_meta_div}, {"__pow", t_meta_pow}, {"__mod", t_meta_mod}, {"__idiv", t_meta_idiv},
  {"__unm", t_unm},
  {NULL, NULL}
};

const luaL_Reg bind_tensor_elementwise_funcs[] = {
  {"where", tensor_where},
  {NULL, NULL}
};
