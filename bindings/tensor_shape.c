/* gpu.Tensor shape queries and the shape ops made of other ops: size,
 * stride, dim, flatten, amax, amin, tile, diag, nonzero, masked_select.
 *
 * No kernel of their own: each is views, copies, reductions and index ops
 * (the same on both backends).  nonzero and masked_select need the count
 * of their result before they can make it: they read a mask back, which is
 * a counted sync under the sync-debug rules, as t:item(). */
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* t:name(args at stack indices a[0..n)) with one result; the result's index
 * (the new top). */
static int call(lua_State *L, const char *name, int t, const int *a, int n) {
  lua_getfield(L, t, name);
  lua_pushvalue(L, t);
  for (int i = 0; i < n; i++) lua_pushvalue(L, a[i]);
  lua_call(L, n + 1, 1);
  return lua_gettop(L);
}

/* A table of n integers, pushed; its index. */
static int push_ints(lua_State *L, int n, const int64_t *v) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)v[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return lua_gettop(L);
}

/* ---- queries: size, stride, dim --------------------------------------- */

/* t:size([dim]): the shape as a table, or the size of one dim */
static int t_size(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    push_ints(L, t->v.ndim, t->v.shape);
    return 1;
  }
  lua_pushinteger(L, (lua_Integer)t->v.shape[bind_tensor_dim(L, 2, 2, t->v.ndim)]);
  return 1;
}

/* t:stride([dim]): the strides in elements, as a table or of one dim */
static int t_stride(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    push_ints(L, t->v.ndim, t->v.stride);
    return 1;
  }
  lua_pushinteger(L, (lua_Integer)t->v.stride[bind_tensor_dim(L, 2, 2, t->v.ndim)]);
  return 1;
}

static int t_dim(lua_State *L) {
  lua_pushinteger(L, bind_check_tensor(L, 1)->v.ndim);
  return 1;
}

/* ---- flatten ---------------------------------------------------------- */

/* t:flatten([start [, end]]): dims start..end (default 1, -1) merged into
 * one, as t:reshape (a view when the strides allow); a 0-dim tensor gives
 * a 1-dim one of 1 element, as PyTorch */
static int t_flatten(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int nd = t->v.ndim, vnd = nd ? nd : 1;
  int a = lua_isnoneornil(L, 2) ? 0 : bind_tensor_dim(L, 2, 2, vnd);
  int b = lua_isnoneornil(L, 3) ? vnd - 1 : bind_tensor_dim(L, 3, 3, vnd);
  if (a > b)
    luaL_argerror(L, 3, lua_pushfstring(L, "end dim %d comes before start dim %d", b + 1, a + 1));
  int64_t shape[DEV_MAXDIM], one = 1;
  const int64_t *in = nd ? t->v.shape : &one;
  int n = 0;
  for (int d = 0; d < a; d++) shape[n++] = in[d];
  shape[n] = 1;
  for (int d = a; d <= b; d++) shape[n] *= in[d];
  n++;
  for (int d = b + 1; d < vnd; d++) shape[n++] = in[d];
  int s = push_ints(L, n, shape);
  call(L, "reshape", 1, &s, 1);
  return 1;
}

/* ---- amax, amin ------------------------------------------------------- */

/* The dims at idx (nil or {}: all, as torch.amax's dim=(); a number or a
 * table of them), as a mask of 0-based dims; each once. */
static unsigned dims_mask(lua_State *L, int idx, int nd) {
  if (lua_isnoneornil(L, idx) || (lua_type(L, idx) == LUA_TTABLE && lua_rawlen(L, idx) == 0))
    return nd ? (1u << nd) - 1 : 0;
  int n = lua_type(L, idx) == LUA_TTABLE ? (int)lua_rawlen(L, idx) : 1;
  if (lua_type(L, idx) != LUA_TTABLE && lua_type(L, idx) != LUA_TNUMBER) luaL_typeerror(L, idx, "dim or table of dims");
  if (n > DEV_MAXDIM) luaL_argerror(L, idx, "too many dims");
  unsigned mask = 0;
  for (int i = 0; i < n; i++) {
    if (lua_type(L, idx) == LUA_TTABLE) lua_rawgeti(L, idx, i + 1);
    else lua_pushvalue(L, idx);
    int d = bind_tensor_dim(L, lua_gettop(L), idx, nd);
    lua_pop(L, 1);
    if (mask & (1u << d)) luaL_argerror(L, idx, lua_pushfstring(L, "dim %d appears twice (each dim once)", d + 1));
    mask |= 1u << d;
  }
  return mask;
}

/* t:amax([dims] [, opts]) / t:amin: the max (min) over one dim or a table
 * of dims (nil: all), as torch.amax; opts.keepdim keeps them as size 1 */
static int extreme(lua_State *L, const char *fname) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int nd = t->v.ndim;
  static const char *const names[] = {"keepdim", NULL};
  /* t:amax{keepdim = true}: the options alone (a table with no list part
   * but some key) */
  if (lua_type(L, 2) == LUA_TTABLE && lua_rawlen(L, 2) == 0 && lua_isnoneornil(L, 3)) {
    lua_pushnil(L);
    if (lua_next(L, 2)) {
      lua_settop(L, 2);
      lua_pushnil(L);
      lua_insert(L, 2);
    }
  }
  lua_settop(L, 3);
  int o = bind_read_opts(L, 3, names);
  int keep = lua_toboolean(L, o);
  unsigned mask = dims_mask(L, 2, nd);
  if (t->v.dtype == DEV_BOOL) luaL_error(L, "%s: not supported for bool (use any or all)", fname);
  const char *red = fname[2] == 'a' ? "max" : "min";
  int64_t shape[DEV_MAXDIM];
  int n = 0;
  for (int d = 0; d < nd; d++)
    if (keep || !(mask & (1u << d))) shape[n++] = (mask & (1u << d)) ? 1 : t->v.shape[d];
  lua_pushvalue(L, 1);
  /* each dim kept as 1, so the others keep their numbers */
  for (int d = 0; d < nd; d++) {
    if (!(mask & (1u << d))) continue;
    if (t->v.shape[d] == 0)
      luaL_error(L, "%s: dim %d has size 0 (the %s of no elements)", fname, d + 1, red);
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, d + 1);
    lua_setfield(L, -2, "dim");
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "keepdim");
    int opts = lua_gettop(L);
    call(L, red, opts - 1, &opts, 1);
    lua_replace(L, opts - 1);
    lua_settop(L, opts - 1);
  }
  int r = lua_gettop(L);
  /* a 0-dim t: nothing reduced, still a new tensor */
  if (mask == 0) {
    call(L, "clone", r, NULL, 0);
    return 1;
  }
  int s = push_ints(L, n, shape);
  call(L, "reshape", r, &s, 1);
  return 1;
}

static int t_amax(lua_State *L) { return extreme(L, "amax"); }
static int t_amin(lua_State *L) { return extreme(L, "amin"); }

/* ---- tile ------------------------------------------------------------- */

/* t:tile(reps) or t:tile(r1, r2, ...): t repeated reps[k] times along dim
 * k, as torch.tile (fewer reps than dims: 1s in front; more: t gets leading
 * dims of 1).  An expanded view of t, copied. */
static int t_tile(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t reps[DEV_MAXDIM], mid[2 * DEV_MAXDIM], ex[2 * DEV_MAXDIM], out[DEV_MAXDIM];
  int nr = bind_tensor_ints(L, 2, reps, "reps"), nd = t->v.ndim;
  int n = nr > nd ? nr : nd, m = 0;
  for (int k = 0; k < nr; k++)
    if (reps[k] < 0) luaL_argerror(L, 2, lua_pushfstring(L, "reps[%d] must be non-negative, got %I", k + 1,
                                                          (lua_Integer)reps[k]));
  int64_t total = 1;
  for (int k = 0; k < n; k++) {
    int64_t r = k < n - nr ? 1 : reps[k - (n - nr)], in = k < n - nd ? 1 : t->v.shape[k - (n - nd)];
    /* a dim of size 1 expands as it is; another gets a dim of reps before it */
    if (in == 1) mid[m] = 1, ex[m++] = r;
    else {
      if (r != 1) mid[m] = 1, ex[m++] = r;
      mid[m] = ex[m] = in, m++;
    }
    out[k] = r * in;
    if (out[k] && (__builtin_mul_overflow(total, out[k], &total) || total > ((int64_t)1 << 56)))
      luaL_argerror(L, 2, "the result is too large");
    if (m > DEV_MAXDIM)
      luaL_argerror(L, 2, lua_pushfstring(L, "too many dims: the dims and the reps other than 1 come to more "
                                             "than %d", DEV_MAXDIM));
  }
  int a = push_ints(L, m, mid);
  int v = call(L, "reshape", 1, &a, 1);
  int b = push_ints(L, m, ex);
  v = call(L, "expand", v, &b, 1);
  v = call(L, "clone", v, NULL, 0);
  int c = push_ints(L, n, out);
  call(L, "view", v, &c, 1);
  return 1;
}

/* ---- diag ------------------------------------------------------------- */

/* t:diag([k]): a 1-D t on diagonal k of a square matrix of zeros, or the
 * diagonal k of a 2-D t (a copy); k > 0 above the main diagonal, as
 * torch.diag */
static int t_diag(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  lua_Integer k = lua_isnoneornil(L, 2) ? 0 : bind_tensor_int(L, 2, "diagonal");
  lua_settop(L, 2);
  int nd = t->v.ndim;
  if (nd != 1 && nd != 2) return luaL_error(L, "diag: needs a 1-D or 2-D tensor, got %d dims", nd);
  if (k > ((lua_Integer)1 << 40) || k < -((lua_Integer)1 << 40)) luaL_argerror(L, 2, "diagonal too far out");
  size_t es = dev_dtype_size(t->v.dtype);
  if (nd == 1) {
    int64_t n = t->v.shape[0], m = n + (k < 0 ? -k : k), shape[2] = {m, m};
    gpu_tensor *r = bind_new_tensor(L, t->v.buf->kind, t->v.dtype, 2, shape, 0, "diag");
    int ridx = lua_gettop(L);
    size_t nbytes = (size_t)(m * m) * es;
    dev_ctx *ctx = bind_ctx(L);
    dev_stream *s = bind_stream(L, 0);
    bind_call_site(L, ctx, "diag");
    BIND_CHECK(L, ctx, dev_memset(ctx, s, r->v.buf, 0, 0, nbytes), "diag");
    if (n == 0) return 1;
    dev_view d = r->v;
    d.ndim = 1;
    d.shape[0] = n;
    d.stride[0] = m + 1;
    d.offset += (size_t)(k >= 0 ? k : -k * m) * es;
    bind_tensor_copy_view(L, s, ridx, d, 1, t->v, "diag");
    lua_settop(L, ridx);
    return 1;
  }
  int64_t rows = t->v.shape[0], cols = t->v.shape[1];
  int64_t len = k >= 0 ? (rows < cols - k ? rows : cols - k) : (rows + k < cols ? rows + k : cols);
  if (len < 0) len = 0;
  gpu_tensor *r = bind_tensor_view_of(L, 1);
  r->v.ndim = 1;
  r->v.shape[0] = len;
  r->v.stride[0] = t->v.stride[0] + t->v.stride[1];
  if (len > 0) r->v.offset += (size_t)(k >= 0 ? k * t->v.stride[1] : -k * t->v.stride[0]) * es;
  call(L, "clone", lua_gettop(L), NULL, 0);
  return 1;
}

/* ---- nonzero, masked_select: a sync for the count --------------------- */

/* The mask (a bool tensor at idx) read back, a counted sync; the userdata
 * pushed, its values in C order; *count: how many are true. */
static const unsigned char *read_mask(lua_State *L, int idx, int64_t *count, const char *fname) {
  const unsigned char *m = bind_tensor_download(L, idx, 0, fname);
  int64_t n = dev_view_numel(&bind_check_tensor(L, idx)->v), c = 0;
  for (int64_t i = 0; i < n; i++) c += m[i] != 0;
  *count = c;
  return m;
}

/* An i64 tensor of shape (ndim, shape) from the packed values at vals
 * (a userdata, so nothing leaks on an error), pushed. */
static void push_i64(lua_State *L, int ndim, const int64_t *shape, const int64_t *vals, const char *fname) {
  gpu_tensor *t = bind_new_tensor(L, bind_check_tensor(L, 1)->v.buf->kind, DEV_I64, ndim, shape, 0, fname);
  if (bind_numel_of(ndim, shape) > 0) bind_tensor_upload(L, t->v, lua_gettop(L), 1, vals, 0, fname);
}

/* t:nonzero(): the 1-based indices of the nonzero elements, an N x ndim
 * i64 tensor in C order; sync (it needs N) */
static int t_nonzero(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  lua_settop(L, 1);
  int nd = t->v.ndim;
  lua_pushinteger(L, 0);
  int zero = lua_gettop(L);
  int mask = call(L, "ne", 1, &zero, 1);
  int64_t count, n = dev_view_numel(&t->v);
  const unsigned char *m = read_mask(L, mask, &count, "nonzero");
  int64_t *idx = lua_newuserdatauv(L, (size_t)(count * nd + 1) * 8, 0), at = 0, pos[DEV_MAXDIM] = {0};
  for (int64_t i = 0; i < n; i++) {
    if (m[i])
      for (int d = 0; d < nd; d++) idx[at++] = pos[d] + 1;
    for (int d = nd - 1; d >= 0 && ++pos[d] == t->v.shape[d]; d--) pos[d] = 0;
  }
  int64_t shape[2] = {count, nd};
  push_i64(L, 2, shape, idx, "nonzero");
  return 1;
}

/* t:masked_select(mask): the elements where the bool mask (broadcast with
 * t) is true, as a 1-D tensor in C order; sync (it needs the count) */
static int t_masked_select(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1), *m = bind_check_tensor(L, 2);
  lua_settop(L, 2);
  if (m->v.dtype != DEV_BOOL)
    luaL_argerror(L, 2, lua_pushfstring(L, "mask must be bool, got %s (compare first: t:gt(0))",
                                        dev_dtype_name(m->v.dtype)));
  bind_tensor_same_kind(L, 2, t, m);
  const dev_view *in[2] = {&t->v, &m->v};
  dev_view ex[2];
  int nd;
  int64_t shape[DEV_MAXDIM];
  if (bind_tensor_broadcast(2, in, ex, &nd, shape)) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, t->v.ndim, t->v.shape);
    bind_shape_str(b, sizeof b, m->v.ndim, m->v.shape);
    return luaL_argerror(L, 2, lua_pushfstring(L, "mask shape %s does not broadcast with %s", b, a));
  }
  int s = push_ints(L, nd, shape);
  int tv = call(L, "expand", 1, &s, 1);
  int mv = call(L, "expand", 2, &s, 1);
  int64_t count, n = bind_numel_of(nd, shape);
  const unsigned char *mk = read_mask(L, mv, &count, "masked_select");
  int64_t *idx = lua_newuserdatauv(L, (size_t)(count + 1) * 8, 0), at = 0;
  for (int64_t i = 0; i < n; i++)
    if (mk[i]) idx[at++] = i + 1;
  lua_pushinteger(L, -1);
  int minus1 = lua_gettop(L);
  int flat = call(L, "reshape", tv, &minus1, 1);
  push_i64(L, 1, &count, idx, "masked_select");
  int ii = lua_gettop(L);
  lua_pushinteger(L, 1);
  int one = lua_gettop(L);
  int args[2] = {one, ii};
  call(L, "index_select", flat, args, 2);
  return 1;
}

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_shape_methods[] = {
  {"size", t_size}, {"stride", t_stride}, {"dim", t_dim}, {"flatten", t_flatten},
  {"amax", t_amax}, {"amin", t_amin}, {"tile", t_tile}, {"diag", t_diag},
  {"nonzero", t_nonzero}, {"masked_select", t_masked_select},
  {NULL, NULL}
};
