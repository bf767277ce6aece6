/* gpu.Tensor methods that work along a dim: the reductions of ops.h (sum,
 * mean, max/min without an operand, argmax, argmin, any, all, prod, var,
 * std, norm, logsumexp), cumsum, softmax and log_softmax, and indexing
 * (index_select, gather, scatter_add_).  Dims and indices are 1-based;
 * the device layer takes 0-based dims and the 1-based indices as they are. */
#include <math.h>

#include "tensor.h"

/* The dim of a reduction or a row op: the dim option's value at idx (nil:
 * -1, every dim). */
static int opt_dim(lua_State *L, int idx, const gpu_tensor *t, const char *fname) {
  if (lua_isnil(L, idx)) return -1;
  if (t->v.ndim == 0) luaL_error(L, "%s: dim given for a 0-dim tensor", fname);
  return bind_tensor_dim(L, idx, 0, t->v.ndim);
}

/* ---- reductions ------------------------------------------------------ */

int bind_tensor_reduce(lua_State *L, dev_redop code) {
  const dev_redinfo *info = dev_redop_info(code);
  const char *fname = info->name;
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_kop op = {.kind = DEV_OP_REDUCE, .code = code, .nin = 1};
  static const char *const plain[] = {"dim", "keepdim", "out", "stream", NULL};
  static const char *const var[] = {"dim", "keepdim", "unbiased", "out", "stream", NULL};
  static const char *const norm[] = {"dim", "keepdim", "p", "out", "stream", NULL};
  int extra = code == DEV_RED_VAR || code == DEV_RED_STD || code == DEV_RED_NORM;
  /* slots: o dim, o + 1 keepdim, o + 2 unbiased or p (extra), then out, stream */
  int o = bind_read_opts(L, 2, code == DEV_RED_NORM ? norm : extra ? var : plain);
  int out = o + 2 + extra, stream = out + 1;
  dev_dtype in = t->v.dtype;
  if (!(dev_dtype_class(in) & info->classes))
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
  int ndim = 0;
  int64_t shape[DEV_MAXDIM], len = 1;
  for (int d = 0; d < t->v.ndim; d++) {
    if (dim < 0 || d == dim) {
      len *= t->v.shape[d];
      if (keepdim) shape[ndim++] = 1;
    } else {
      shape[ndim++] = t->v.shape[d];
    }
  }
  dev_scalar none;
  if (len == 0 && dev_redop_empty(code, &none))
    luaL_error(L, "%s: the reduction of an empty tensor has no identity (%s)", fname,
               dim < 0 ? "numel 0" : lua_pushfstring(L, "dim %d has size 0", dim + 1));
  dev_view tv = t->v;
  op.out = bind_tensor_out(L, out, stream, t, dev_redop_dtype(code, in), ndim, shape, fname)->v;
  op.dim = dim;
  op.in[0] = tv;
  int idx[1] = {1};
  bind_tensor_submit(L, stream, &op, 0, idx, 1, fname);
  return 1;
}

static int t_red_sum(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_SUM); }
static int t_red_mean(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_MEAN); }
static int t_red_argmax(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_ARGMAX); }
static int t_red_argmin(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_ARGMIN); }
static int t_red_any(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_ANY); }
static int t_red_all(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_ALL); }
static int t_red_prod(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_PROD); }
static int t_red_var(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_VAR); }
static int t_red_std(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_STD); }
static int t_red_norm(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_NORM); }
static int t_red_logsumexp(lua_State *L) { return bind_tensor_reduce(L, DEV_RED_LOGSUMEXP); }

/* ---- along one dim: cumsum, softmax ------------------------------------ */

/* t:cumsum(dim [, opts]); t:softmax(dim [, opts]) or t:softmax{dim =, ...} */
static int along(lua_State *L, dev_opkind kind, int code, const char *fname) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  static const char *const dim_out[] = {"dim", "out", "stream", NULL};
  /* t:softmax{dim =, ...}: slots o dim, then out; else out from opts at 3 */
  int o = 0, out, dim;
  if (kind == DEV_OP_SOFTMAX && lua_istable(L, 2)) {
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

static int t_cumsum(lua_State *L) { return along(L, DEV_OP_CUMSUM, 0, "cumsum"); }
static int t_softmax(lua_State *L) { return along(L, DEV_OP_SOFTMAX, DEV_SOFTMAX, "softmax"); }
static int t_log_softmax(lua_State *L) { return along(L, DEV_OP_SOFTMAX, DEV_LOG_SOFTMAX, "log_softmax"); }

/* ---- indexing ---------------------------------------------------------- */

static gpu_tensor *check_index(lua_State *L, int arg, const gpu_tensor *t) {
  gpu_tensor *x = bind_check_tensor(L, arg);
  if (dev_dtype_class(x->v.dtype) != DEV_CLS_I)
    luaL_argerror(L, arg, lua_pushfstring(L, "the index must be an integer tensor, got %s", dev_dtype_name(x->v.dtype)));
  bind_tensor_same_kind(L, arg, t, x);
  return x;
}

static void shape_error(lua_State *L, int arg, const char *what, const dev_view *a, const char *than,
                        const dev_view *b) {
  char sa[MAXSHAPESTR], sb[MAXSHAPESTR];
  bind_shape_str(sa, sizeof sa, a->ndim, a->shape);
  bind_shape_str(sb, sizeof sb, b->ndim, b->shape);
  luaL_argerror(L, arg, lua_pushfstring(L, "%s %s %s %s", what, sa, than, sb));
}

/* t:index_select(dim, idx [, opts]): the slices idx[1], idx[2], ... of t
 * along dim; idx a 1-D integer tensor. */
static int t_index_select(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim == 0) luaL_argerror(L, 1, "index_select needs a tensor of at least one dim");
  int dim = bind_tensor_dim(L, 2, 2, t->v.ndim);
  gpu_tensor *x = check_index(L, 3, t);
  int out = bind_read_opts(L, 4, bind_out_opts);
  if (x->v.ndim != 1)
    luaL_argerror(L, 3, lua_pushfstring(L, "the index must be 1-D, got %d-D", x->v.ndim));
  int64_t shape[DEV_MAXDIM];
  int ndim = t->v.ndim;
  for (int d = 0; d < ndim; d++) shape[d] = d == dim ? x->v.shape[0] : t->v.shape[d];
  dev_view tv = t->v, xv = x->v;
  gpu_tensor *o = bind_tensor_out(L, out, out + 1, t, tv.dtype, ndim, shape, "index_select");
  dev_kop op = {.kind = DEV_OP_INDEX, .code = DEV_IDX_SELECT, .nin = 2, .dim = dim, .out = o->v};
  op.in[0] = tv;
  /* the index seen over the result's shape: its stride along dim, 0 elsewhere */
  op.in[1] = xv;
  op.in[1].ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    op.in[1].shape[d] = shape[d];
    op.in[1].stride[d] = d == dim ? xv.stride[0] : 0;
  }
  int idx[2] = {1, 3};
  bind_tensor_submit(L, out + 1, &op, lua_gettop(L), idx, 2, "index_select");
  return 1;
}

/* t:gather(dim, idx [, opts]): r[p] = t[p with p[dim] = idx[p]], r of idx's
 * shape; idx no larger than t along the other dims. */
static int t_gather(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim == 0) luaL_argerror(L, 1, "gather needs a tensor of at least one dim");
  int dim = bind_tensor_dim(L, 2, 2, t->v.ndim);
  gpu_tensor *x = check_index(L, 3, t);
  int out = bind_read_opts(L, 4, bind_out_opts);
  if (x->v.ndim != t->v.ndim)
    luaL_argerror(L, 3, lua_pushfstring(L, "the index has %d dims, the tensor %d", x->v.ndim, t->v.ndim));
  for (int d = 0; d < t->v.ndim; d++)
    if (d != dim && x->v.shape[d] > t->v.shape[d])
      shape_error(L, 3, "index shape", &x->v, "is larger than the tensor's outside dim", &t->v);
  dev_view tv = t->v, xv = x->v;
  gpu_tensor *o = bind_tensor_out(L, out, out + 1, t, tv.dtype, xv.ndim, xv.shape, "gather");
  dev_kop op = {.kind = DEV_OP_INDEX, .code = DEV_IDX_GATHER, .nin = 2, .dim = dim, .out = o->v};
  op.in[0] = tv;
  op.in[1] = xv;
  int idx[2] = {1, 3};
  bind_tensor_submit(L, out + 1, &op, lua_gettop(L), idx, 2, "gather");
  return 1;
}

/* t:scatter_add_(dim, idx, src [, opts]): t[p with p[dim] = idx[p]] += src[p]
 * for every position p of idx, in place; returns t. */
static int t_scatter_add_(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim == 0) luaL_argerror(L, 1, "scatter_add_ needs a tensor of at least one dim");
  int dim = bind_tensor_dim(L, 2, 2, t->v.ndim);
  gpu_tensor *x = check_index(L, 3, t), *src = bind_check_tensor(L, 4);
  int stream = bind_read_stream_opt(L, 5);
  if (!(dev_dtype_class(t->v.dtype) & DEV_CLASSES_FI))
    luaL_argerror(L, 1, lua_pushfstring(L, "scatter_add_ is not supported for %s", dev_dtype_name(t->v.dtype)));
  if (src->v.dtype != t->v.dtype)
    luaL_argerror(L, 4, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                        dev_dtype_name(src->v.dtype), dev_dtype_name(t->v.dtype),
                                        dev_dtype_name(t->v.dtype)));
  bind_tensor_same_kind(L, 4, t, src);
  if (x->v.ndim != t->v.ndim || src->v.ndim != t->v.ndim)
    luaL_argerror(L, x->v.ndim != t->v.ndim ? 3 : 4,
                  lua_pushfstring(L, "the index and src need the tensor's %d dims", t->v.ndim));
  for (int d = 0; d < t->v.ndim; d++) {
    if (x->v.shape[d] > src->v.shape[d]) shape_error(L, 3, "index shape", &x->v, "is larger than src's", &src->v);
    if (d != dim && x->v.shape[d] > t->v.shape[d])
      shape_error(L, 3, "index shape", &x->v, "is larger than the tensor's outside dim", &t->v);
  }
  dev_kop op = {.kind = DEV_OP_INDEX, .code = DEV_IDX_SCATTER_ADD, .nin = 2, .dim = dim, .out = t->v};
  op.in[0] = x->v;
  op.in[1] = src->v;
  int idx[2] = {3, 4};
  bind_tensor_submit(L, stream, &op, 1, idx, 2, "scatter_add_");
  lua_settop(L, 1);
  return 1;
}

/* max and min are tensor.c's (elementwise with an operand) */
const luaL_Reg bind_tensor_reduce_methods[] = {
  {"sum", t_red_sum}, {"mean", t_red_mean}, {"argmax", t_red_argmax}, {"argmin", t_red_argmin},
  {"any", t_red_any}, {"all", t_red_all}, {"prod", t_red_prod}, {"var", t_red_var}, {"std", t_red_std},
  {"norm", t_red_norm}, {"logsumexp", t_red_logsumexp},
  {"cumsum", t_cumsum}, {"softmax", t_softmax}, {"log_softmax", t_log_softmax},
  {"index_select", t_index_select}, {"gather", t_gather}, {"scatter_add_", t_scatter_add_},
  {NULL, NULL}
};
