/* gpu.Tensor indexing: elements (t:item, t:get, t:set: these sync or
 * upload), slices chosen by an index tensor (index_select, gather,
 * scatter_add_) and by a mask (masked_fill).  Indices are 1-based; the
 * device layer takes 0-based dims and the 1-based indices as they are.
 * Views by position (narrow, slice, select) are in tensor_view.c. */
#include "tensor.h"

static int t_item(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (dev_view_numel(&t->v) != 1) {
    char sh[MAXSHAPESTR];
    bind_shape_str(sh, sizeof sh, t->v.ndim, t->v.shape);
    return luaL_error(L, "item: tensor has %I elements (shape %s), expected 1",
                      (lua_Integer)dev_view_numel(&t->v), sh);
  }
  void *p = bind_tensor_download(L, 1, bind_read_stream_opt(L, 2), "item");
  bind_push_elem(L, t->v.dtype, p);
  return 1;
}

/* A 0-dim view of element (i, j, ...) given at stack positions first.. */
static dev_view element_view(lua_State *L, gpu_tensor *t, int first, int nidx, const char *fname) {
  if (nidx != t->v.ndim)
    luaL_error(L, "%s: expected %d index%s for a %d-dim tensor, got %d", fname, t->v.ndim,
               t->v.ndim == 1 ? "" : "es", t->v.ndim, nidx);
  dev_view v = t->v;
  for (int d = 0; d < t->v.ndim; d++) {
    int isint;
    lua_Integer i = lua_tointegerx(L, first + d, &isint);
    if (!isint) luaL_typeerror(L, first + d, "integer index");
    if (i < 1 || i > t->v.shape[d])
      luaL_argerror(L, first + d, bind_push_index_range(L, "index", i, d, t->v.shape[d], 0));
    v.offset += (size_t)((i - 1) * t->v.stride[d]) * dev_dtype_size(t->v.dtype);
  }
  v.ndim = 0;
  return v;
}

static int t_get(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int n = lua_gettop(L) - 1;
  dev_view v = element_view(L, t, 2, n, "get");
  dev_ctx *ctx = bind_ctx(L);
  unsigned char buf[8];
  bind_call_site(L, ctx, "get");
  BIND_CHECK(L, ctx, dev_read(ctx, bind_stream(L, 0), &v, buf), "get");
  bind_push_elem(L, t->v.dtype, buf);
  return 1;
}

static int t_set(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int n = lua_gettop(L) - 2;
  if (n < 0) return luaL_error(L, "set: expected indices and a value");
  /* the element's own view is 0-dim: ask of the tensor, as every write does */
  dev_ctx *ctx = bind_ctx(L);
  BIND_CHECK(L, ctx, dev_check_writable(ctx, &t->v), "set");
  dev_view v = element_view(L, t, 2, n, "set");
  dev_scalar s = bind_check_scalar(L, n + 2, t->v.dtype, n + 2, NULL);
  int isint = !dev_dtype_is_float(t->v.dtype);
  bind_tensor_upload(L, v, 1, isint, isint ? (const void *)&s.i : (const void *)&s.f, 0, "set");
  lua_settop(L, 1);
  return 1;
}

/* t:masked_fill(mask, v, opts): v where mask (a bool tensor broadcast to t's
 * shape) is true, t elsewhere; masked_fill_ in place. */
static int masked_fill(lua_State *L, int inplace) {
  const char *fname = inplace ? "masked_fill_" : "masked_fill";
  gpu_tensor *t = bind_check_tensor(L, 1), *m = bind_check_tensor(L, 2);
  bind_tensor_check_cond(L, 2, m, "mask");
  dev_dtype dt = t->v.dtype;
  bind_tensor_same_kind(L, 2, t, m);
  dev_kop op = {.kind = DEV_OP_TERNARY, .code = DEV_TER_WHERE, .nin = 2};
  if (lua_type(L, 3) != LUA_TNUMBER && !(dt == DEV_BOOL && lua_isboolean(L, 3)))
    luaL_typeerror(L, 3, "number");
  op.s0 = bind_check_scalar(L, 3, dt, 3, NULL);
  /* in place, no out: slots out 0 and stream o; else o and o + 1 */
  int o = inplace ? bind_read_stream_opt(L, 4) : bind_read_opts(L, 4, bind_out_opts);
  int out = inplace ? 0 : o, stream = inplace ? o : o + 1;
  op.flags = DEV_F_SCALAR2;
  const dev_view *in[2] = {&m->v, &t->v};
  int ndim, same;
  int64_t shape[DEV_MAXDIM];
  same = bind_tensor_broadcast(2, in, op.in, &ndim, shape) == 0 && ndim == t->v.ndim;
  for (int d = 0; same && d < ndim; d++) same = shape[d] == t->v.shape[d];
  if (!same) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, m->v.ndim, m->v.shape);
    bind_shape_str(b, sizeof b, t->v.ndim, t->v.shape);
    luaL_argerror(L, 2, lua_pushfstring(L, "mask shape %s cannot be broadcast to the tensor's %s", a, b));
  }
  dev_view tv = t->v;
  op.out = inplace ? t->v : bind_tensor_out(L, out, stream, t, dt, tv.ndim, tv.shape, fname)->v;
  int idx[2] = {2, 1};
  bind_tensor_submit(L, stream, &op, inplace ? 1 : lua_gettop(L), idx, 2, fname);
  if (inplace) lua_settop(L, 1);
  return 1;
}

static int t_masked_fill(lua_State *L) { return masked_fill(L, 0); }
static int t_masked_fill_(lua_State *L) { return masked_fill(L, 1); }

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

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_index_methods[] = {
  {"item", t_item}, {"get", t_get}, {"set", t_set},
  {"index_select", t_index_select}, {"gather", t_gather}, {"scatter_add_", t_scatter_add_},
  {"masked_fill", t_masked_fill}, {"masked_fill_", t_masked_fill_},
  {NULL, NULL}
};
