/* gpu.Tensor reductions: the rows of DEV_REDUCE_OPS (cuda/ops.h), one
 * method each, made from the rows (sum, mean, argmax, argmin, any, all,
 * prod, var, std, norm, logsumexp; max and min are tensor_elementwise.c's,
 * which call the reduction without an operand).  Each takes {dim =,
 * keepdim =, out =, stream =}, or the dim first: t:sum(2 [, opts]); var
 * and std also unbiased, norm p.  Then the
 * ops along one dim that keep its size, not reductions: cumsum, softmax,
 * log_softmax.  Dims are 1-based; the device layer takes them 0-based. */
#include <string.h>

#include "tensor.h"

/* The dim of a reduction or a row op: the dim option's value at idx (nil:
 * -1, every dim). */
int bind_reduce_dim(lua_State *L, int idx, int ndim, const char *fname) {
  if (lua_isnil(L, idx)) return -1;
  if (ndim == 0) luaL_error(L, "%s: dim given for a 0-dim tensor", fname);
  return bind_tensor_dim(L, idx, 0, ndim);
}

static int opt_dim(lua_State *L, int idx, const gpu_tensor *t, const char *fname) {
  return bind_reduce_dim(L, idx, t->v.ndim, fname);
}

dev_dtype bind_reduce_out(lua_State *L, dev_redop code, dev_dtype in, int dim, int keepdim, int *ndim,
                          int64_t *shape) {
  const char *fname = dev_redop_info(code)->name;
  if (!(dev_dtype_class(in) & dev_redop_info(code)->classes))
    luaL_error(L, "%s: not supported for %s (needs a float dtype)", fname, dev_dtype_name(in));
  int n = 0;
  int64_t len = 1;
  for (int d = 0; d < *ndim; d++) {
    if (dim < 0 || d == dim) {
      len *= shape[d];
      if (keepdim) shape[n++] = 1;
    } else {
      shape[n++] = shape[d];
    }
  }
  dev_scalar none;
  if (len == 0 && dev_redop_empty(code, &none))
    luaL_error(L, "%s: the reduction of an empty tensor has no identity (%s)", fname,
               dim < 0 ? "numel 0" : lua_pushfstring(L, "dim %d has size 0", dim + 1));
  *ndim = n;
  return dev_redop_dtype(code, in);
}

int bind_tensor_reduce(lua_State *L, dev_redop code) {
  const dev_redinfo *info = dev_redop_info(code);
  const char *fname = info->name;
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_kop op = {.kind = DEV_OP_REDUCE, .code = code, .nin = 1};
  static const char *const plain[] = {"dim", "keepdim", "out", "stream", NULL};
  static const char *const var[] = {"dim", "keepdim", "unbiased", "out", "stream", NULL};
  static const char *const norm[] = {"dim", "keepdim", "p", "out", "stream", NULL};
  int extra = code == DEV_RED_VAR || code == DEV_RED_STD || code == DEV_RED_NORM;
  /* slots: o dim, o + 1 keepdim, o + 2 unbiased or p (extra), then out, stream;
   * the dim may come first, as t:sum(2) or t:sum(2, {keepdim = true}) */
  int pos = lua_type(L, 2) == LUA_TNUMBER;
  int o = bind_read_opts(L, pos ? 3 : 2, code == DEV_RED_NORM ? norm : extra ? var : plain);
  if (pos) {
    if (!lua_isnil(L, o) && !lua_rawequal(L, o, 2))
      luaL_error(L, "%s: dim given twice (%s, and %s in the options)", fname, lua_tostring(L, 2),
                 luaL_tolstring(L, o, NULL));
    lua_copy(L, 2, o);
  }
  int out = o + 2 + extra, stream = out + 1;
  dev_dtype in = t->v.dtype;
  if (!(dev_dtype_class(in) & info->classes))   /* before the dim's own checks */
    luaL_error(L, "%s: not supported for %s (needs a float dtype)", fname, dev_dtype_name(in));
  int dim = opt_dim(L, o, t, fname);
  int keepdim = lua_toboolean(L, o + 1);
  if (code == DEV_RED_VAR || code == DEV_RED_STD) {
    /* Bessel's correction unless {unbiased = false}, as PyTorch */
    op.s0.is_int = 1;
    op.s0.i = lua_isnil(L, o + 2) || lua_toboolean(L, o + 2);
  }
  if (code == DEV_RED_NORM) {
    op.s0.f = 2;
    if (!lua_isnil(L, o + 2)) {
      if (lua_type(L, o + 2) != LUA_TNUMBER)
        luaL_error(L, "bad option 'p' to 'norm' (number expected, got %s)", luaL_typename(L, o + 2));
      op.s0.f = lua_tonumber(L, o + 2);
      if (!(op.s0.f > 0))
        luaL_error(L, "bad option 'p' to 'norm' (must be > 0 or math.huge, got %s)", lua_tostring(L, o + 2));
    }
  }
  int ndim = t->v.ndim;
  int64_t shape[DEV_MAXDIM];
  memcpy(shape, t->v.shape, sizeof shape);
  dev_dtype rt = bind_reduce_out(L, code, in, dim, keepdim, &ndim, shape);
  dev_view tv = t->v;
  op.out = bind_tensor_out(L, out, stream, t, rt, ndim, shape, fname)->v;
  op.dim = dim;
  op.in[0] = tv;
  int idx[1] = {1};
  bind_tensor_submit(L, stream, &op, 0, idx, 1, fname);
  return 1;
}

/* t:name([opts]), one per row of DEV_REDUCE_OPS */
#define REDUCE_FUNC(E, name, cls, res) \
  static int t_red_##name(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_##E); }
DEV_REDUCE_OPS(REDUCE_FUNC)
#undef REDUCE_FUNC

/* t:cumsum(dim [, opts]) or t:cumsum{dim =, ...}; cumprod, softmax the same */
static int along(lua_State *L, dev_opkind kind, int code, const char *fname) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  static const char *const dim_out[] = {"dim", "out", "stream", NULL};
  /* t:softmax{dim =, ...}, t:cumsum{dim =, ...}: slots o dim, then out;
   * else out from opts at 3 */
  int o = 0, out, dim;
  if (lua_istable(L, 2)) {
    o = bind_read_opts(L, 2, dim_out);
    if (lua_isnil(L, o)) luaL_error(L, "%s: option 'dim' is required", fname);
  }
  dev_dtype dt = t->v.dtype;
  if (kind == DEV_OP_SOFTMAX && !dev_dtype_is_float(dt))
    luaL_error(L, "%s: not supported for %s (needs a float dtype)", fname, dev_dtype_name(dt));
  if (t->v.ndim == 0) luaL_error(L, "%s: needs a tensor of at least one dim", fname);
  if (o) {
    dim = opt_dim(L, o, t, fname);
    out = o + 1;
  } else {   /* the dim argument before the options' slots, which may take its place */
    dim = bind_tensor_dim(L, 2, 2, t->v.ndim);
    out = bind_read_opts(L, 3, bind_out_opts);
  }
  dev_dtype rdt = kind == DEV_OP_CUMSUM ? dev_redop_dtype(DEV_RED_SUM, dt) : dt;
  dev_view tv = t->v;
  gpu_tensor *r = bind_tensor_out(L, out, out + 1, t, rdt, tv.ndim, tv.shape, fname);
  dev_kop op = {.kind = kind, .code = code, .nin = 1, .dim = dim, .out = r->v};
  op.in[0] = tv;
  int idx[1] = {1};
  bind_tensor_submit(L, out + 1, &op, lua_gettop(L), idx, 1, fname);
  return 1;
}

static int t_cumsum(lua_State *L) { return along(L, DEV_OP_CUMSUM, DEV_CUM_SUM, "cumsum"); }
static int t_cumprod(lua_State *L) { return along(L, DEV_OP_CUMSUM, DEV_CUM_PROD, "cumprod"); }
static int t_softmax(lua_State *L) { return along(L, DEV_OP_SOFTMAX, DEV_SOFTMAX, "softmax"); }
static int t_log_softmax(lua_State *L) { return along(L, DEV_OP_SOFTMAX, DEV_LOG_SOFTMAX, "log_softmax"); }

/* ---- methods ---------------------------------------------------------- */

#define REDUCE_REG(E, name, cls, res) {#name, t_red_##name},
const luaL_Reg bind_tensor_reduce_methods[] = {
  DEV_REDUCE_OPS(REDUCE_REG)
  {"cumsum", t_cumsum}, {"cumprod", t_cumprod}, {"softmax", t_softmax}, {"log_softmax", t_log_softmax},
  {NULL, NULL}
};
#undef REDUCE_REG
