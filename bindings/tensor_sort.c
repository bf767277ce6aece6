/* gpu.Tensor sorting: sort, argsort, topk.  One device op (DEV_OP_SORT)
 * gives the 1-based positions along a dim in sorted order and, for sort and
 * topk, the values there (DEV_SORT_VALUES); topk narrows both to the first k.  Every sort is
 * stable: equal keys keep their order, NaN sorts above every number (last
 * ascending, first descending), as NumPy's and PyTorch's. */
#include <string.h>

#include "tensor.h"

/* A boolean option at idx: nil gives dflt. */
static int opt_bool(lua_State *L, int idx, const char *name, const char *fname, int dflt) {
  if (lua_isnil(L, idx)) return dflt;
  if (!lua_isboolean(L, idx))
    luaL_error(L, "bad option '%s' to '%s' (boolean expected, got %s)", name, fname, luaL_typename(L, idx));
  return lua_toboolean(L, idx);
}

/* The dim at slot o (nil: the last), 0-based; a 0-dim tensor sorts as one
 * element, so it takes dim 1 or -1. */
static int sort_dim(lua_State *L, int o, const gpu_tensor *t) {
  int nd = t->v.ndim > 0 ? t->v.ndim : 1;
  return lua_isnil(L, o) ? nd - 1 : bind_tensor_dim(L, o, 0, nd);
}

/* The dim given first (t:sort(2, opts)) into slot o, which must be empty. */
static void dim_first(lua_State *L, int pos, int o, const char *fname) {
  if (!lua_isnil(L, o))
    luaL_error(L, "%s: dim given twice (%s, and %s in the options)", fname, lua_tostring(L, pos),
               luaL_tolstring(L, o, NULL));
  lua_copy(L, pos, o);
}

/* v as an op sees it: a 0-dim view as one element along one dim. */
static dev_view as_rows(dev_view v) {
  if (v.ndim == 0) {
    v.ndim = 1;
    v.shape[0] = 1;
    v.stride[0] = 1;
  }
  return v;
}

/* The sort of the tensor at 1 along dim into the i64 tensor at stack index
 * ix, on s; vx > 0: the values at those positions into the tensor at vx, in
 * the same op (DEV_SORT_VALUES). */
static void submit_sort(lua_State *L, dev_stream *s, int ix, int vx, int dim, int desc, const char *fname) {
  dev_kop op = {.kind = DEV_OP_SORT, .code = DEV_SORT_STABLE | (desc ? DEV_SORT_DESCENDING : 0), .nin = 1,
                .dim = dim};
  dev_fargs fa;
  op.out = as_rows(bind_check_tensor(L, ix)->v);
  op.in[0] = as_rows(bind_check_tensor(L, 1)->v);
  if (vx) {
    op.code |= DEV_SORT_VALUES;
    fa.xout[0] = as_rows(bind_check_tensor(L, vx)->v);
    op.fargs = &fa;
  }
  int in[1] = {1};
  bind_tensor_submit_on(L, s, &op, ix, in, 1, fname);
}

/* t:sort([dim] [, opts]) -> values, indices; t:argsort the indices only */
static int sort_or_argsort(lua_State *L, int values, const char *fname) {
  static const char *const names[] = {"dim", "descending", "stable", "stream", NULL};
  gpu_tensor *t = bind_check_tensor(L, 1);
  int pos = lua_type(L, 2) == LUA_TNUMBER;
  int o = bind_read_opts(L, pos ? 3 : 2, names);
  if (pos) dim_first(L, 2, o, fname);
  int dim = sort_dim(L, o, t);
  int desc = opt_bool(L, o + 1, "descending", fname, 0);
  opt_bool(L, o + 2, "stable", fname, 1);   /* every sort is stable */
  int stream = o + 3;
  dev_view tv = t->v;
  bind_tensor_like(L, t, DEV_I64, tv.ndim, tv.shape, stream, fname);
  int ix = lua_gettop(L);
  if (values) bind_tensor_like(L, t, tv.dtype, tv.ndim, tv.shape, stream, fname);
  dev_stream *s = bind_stream(L, stream);
  submit_sort(L, s, ix, values ? ix + 1 : 0, dim, desc, fname);
  if (!values) return 1;
  lua_pushvalue(L, ix);
  return 2;
}

static int t_sort(lua_State *L) { return sort_or_argsort(L, 1, "sort"); }
static int t_argsort(lua_State *L) { return sort_or_argsort(L, 0, "argsort"); }

/* t:topk(k [, dim] [, opts]) -> values, indices: the k largest (smallest
 * with largest = false) along dim, in order: a sort op into indices k long
 * (the first k positions of the stable sort; on cuda a selection for small
 * k), with the values. */
static int t_topk(lua_State *L) {
  static const char *const names[] = {"dim", "largest", "sorted", "stream", NULL};
  gpu_tensor *t = bind_check_tensor(L, 1);
  lua_Integer k = bind_tensor_int(L, 2, "k");
  int pos = lua_type(L, 3) == LUA_TNUMBER;
  int o = bind_read_opts(L, pos ? 4 : 3, names);
  if (pos) dim_first(L, 3, o, "topk");
  int dim = sort_dim(L, o, t);
  int largest = opt_bool(L, o + 1, "largest", "topk", 1);
  opt_bool(L, o + 2, "sorted", "topk", 1);   /* the result is always sorted */
  int stream = o + 3;
  dev_view tv = as_rows(t->v);
  if (t->v.ndim == 0 && k != 1)
    luaL_argerror(L, 2, lua_pushfstring(L, "k = %I is out of range for a 0-dim tensor (1 only)", k));
  if (k < 0 || k > tv.shape[dim])
    luaL_argerror(L, 2, lua_pushfstring(L, "k = %I is out of range for dim %d of size %I (0..%I)", k, dim + 1,
                                        (lua_Integer)tv.shape[dim], (lua_Integer)tv.shape[dim]));
  int64_t kshape[DEV_MAXDIM];
  memcpy(kshape, t->v.shape, sizeof kshape);
  if (t->v.ndim > 0) kshape[dim] = k;
  bind_tensor_like(L, t, DEV_I64, t->v.ndim, kshape, stream, "topk");
  int ix = lua_gettop(L);
  bind_tensor_like(L, t, t->v.dtype, t->v.ndim, kshape, stream, "topk");
  dev_stream *s = bind_stream(L, stream);
  submit_sort(L, s, ix, ix + 1, dim, largest, "topk");
  lua_pushvalue(L, ix);
  return 2;
}

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_sort_methods[] = {
  {"sort", t_sort}, {"argsort", t_argsort}, {"topk", t_topk},
  {NULL, NULL}
};
