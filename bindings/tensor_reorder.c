/* gpu.Tensor ops that move elements without arithmetic: flip (one copy
 * of a view with negative strides), roll (a copy of each block that moves, at
 * copy bandwidth), and tril, triu (the
 * tensor with a triangle zeroed: a mask made from two aranges, then one
 * masked_fill over the tensor).  Each returns a new tensor, as PyTorch's. */
#include "tensor.h"

/* The dims at arg, an integer or a table of them (1-based or negative), as
 * a 0-based list: each at most once.  How many. */
static int read_dims(lua_State *L, int arg, int ndim, int *dims, const char *fname) {
  int n = 1, seen[DEV_MAXDIM] = {0};
  if (lua_type(L, arg) == LUA_TTABLE) {
    n = (int)lua_rawlen(L, arg);
    if (n > DEV_MAXDIM) luaL_argerror(L, arg, lua_pushfstring(L, "%d dims (at most %d)", n, DEV_MAXDIM));
  } else if (lua_type(L, arg) != LUA_TNUMBER) {
    luaL_typeerror(L, arg, "integer or table of dims");
  }
  for (int i = 0; i < n; i++) {
    if (lua_type(L, arg) == LUA_TTABLE) lua_rawgeti(L, arg, i + 1);
    else lua_pushvalue(L, arg);
    dims[i] = bind_tensor_dim(L, lua_gettop(L), arg, ndim);
    lua_pop(L, 1);
    if (seen[dims[i]]++) luaL_argerror(L, arg, lua_pushfstring(L, "%s: dim %d given twice", fname, dims[i] + 1));
  }
  return n;
}

/* t:flip(dims [, opts]): the elements in reverse order along each of dims
 * (a dim or a table of dims), as a new tensor.  One copy, whatever the
 * number of dims: of a view of t that starts at the last element along
 * each flipped dim and walks back (negative strides, which the copy op of
 * both backends takes; the view never reaches a script). */
static int t_flip(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int dims[DEV_MAXDIM], stream = bind_read_stream_opt(L, 3);
  int n = t->v.ndim == 0 && lua_istable(L, 2) && lua_rawlen(L, 2) == 0 ? 0 : read_dims(L, 2, t->v.ndim, dims, "flip");
  dev_view tv = t->v, back = t->v;
  int64_t esz = (int64_t)dev_dtype_size(tv.dtype);
  for (int i = 0; i < n; i++) {
    int d = dims[i];
    if (tv.shape[d] <= 1) continue;
    back.offset = (size_t)((int64_t)back.offset + (tv.shape[d] - 1) * tv.stride[d] * esz);
    back.stride[d] = -tv.stride[d];
  }
  gpu_tensor *r = bind_tensor_like(L, t, tv.dtype, tv.ndim, tv.shape, stream, "flip");
  bind_tensor_copy_view(L, bind_stream(L, stream), lua_gettop(L), r->v, 1, back, "flip");
  return 1;
}

/* Integers at arg, one, or a table of them: how many (at most DEV_MAXDIM) */
static int read_shifts(lua_State *L, int arg, int64_t *s) {
  if (lua_type(L, arg) == LUA_TTABLE) {
    int n = (int)lua_rawlen(L, arg);
    if (n < 1 || n > DEV_MAXDIM)
      luaL_argerror(L, arg, lua_pushfstring(L, "%d shifts (1 to %d)", n, DEV_MAXDIM));
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, arg, i + 1);
      s[i] = bind_tensor_int(L, lua_gettop(L), "shift");
      lua_pop(L, 1);
    }
    return n;
  }
  s[0] = bind_tensor_int(L, arg, "shift");
  return 1;
}

/* dst <- src rolled by shift[i] along dims[i]: for each dim the block that
 * wraps around and the one that does not, a copy per combination. */
static void roll_copies(lua_State *L, int didx, dev_view dst, int sidx, dev_view src, int n, const int *dims,
                        const int64_t *shift, int stream) {
  int64_t esz = (int64_t)dev_dtype_size(src.dtype);
  dev_stream *s = bind_stream(L, stream);
  for (int mask = 0; mask < (1 << n); mask++) {
    dev_view a = src, b = dst;
    int empty = 0;
    for (int i = 0; i < n; i++) {
      int d = dims[i];
      int64_t len = src.shape[d], k = len ? ((shift[i] % len) + len) % len : 0;
      /* piece 0: src [0, len - k) to dst [k, len); piece 1: src [len - k, len) to dst [0, k) */
      int64_t from = mask >> i & 1 ? len - k : 0, to = mask >> i & 1 ? 0 : k, cnt = mask >> i & 1 ? k : len - k;
      a.offset = (size_t)((int64_t)a.offset + from * a.stride[d] * esz);
      b.offset = (size_t)((int64_t)b.offset + to * b.stride[d] * esz);
      a.shape[d] = b.shape[d] = cnt;
      empty |= cnt == 0;
    }
    if (!empty) bind_tensor_copy_view(L, s, didx, b, sidx, a, "roll");
  }
}

/* t:roll(shifts [, dims] [, opts]): elements moved by shifts[i] along
 * dims[i], wrapping around; no dims: over the flattened tensor */
static int t_roll(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t shift[DEV_MAXDIM];
  int dims[DEV_MAXDIM];
  int ns = read_shifts(L, 2, shift);
  int hasdims = lua_type(L, 3) == LUA_TNUMBER || (lua_istable(L, 3) && !bind_test_tensor(L, 3) &&
                                                  lua_rawlen(L, 3) > 0);
  int stream = bind_read_stream_opt(L, hasdims ? 4 : 3);
  dev_view tv = t->v;
  if (hasdims) {
    if (tv.ndim == 0) luaL_argerror(L, 3, "roll: a 0-dim tensor has no dims");
    int nd = read_dims(L, 3, tv.ndim, dims, "roll");
    if (nd != ns)
      luaL_argerror(L, 3, lua_pushfstring(L, "roll: %d shifts for %d dims (one each)", ns, nd));
    gpu_tensor *r = bind_tensor_like(L, t, tv.dtype, tv.ndim, tv.shape, stream, "roll");
    roll_copies(L, lua_gettop(L), r->v, 1, tv, nd, dims, shift, stream);
    return 1;
  }
  if (ns != 1) luaL_argerror(L, 2, lua_pushfstring(L, "roll: %d shifts without dims (one, or give dims)", ns));
  /* flat: the tensor in C order (a copy when it is not contiguous), seen as one dim */
  int src = 1;
  if (!dev_view_contiguous(&tv)) {
    bind_tensor_like(L, t, tv.dtype, tv.ndim, tv.shape, stream, "roll");
    src = lua_gettop(L);
    bind_tensor_copy_view(L, bind_stream(L, stream), src, bind_check_tensor(L, src)->v, 1, tv, "roll");
  }
  gpu_tensor *r = bind_tensor_like(L, t, tv.dtype, tv.ndim, tv.shape, stream, "roll");
  int64_t numel = dev_view_numel(&tv);
  dev_view a = bind_check_tensor(L, src)->v, b = r->v;
  dev_view_set_contiguous(&a, 1, &numel);
  dev_view_set_contiguous(&b, 1, &numel);
  dims[0] = 0;
  roll_copies(L, lua_gettop(L), b, src, a, 1, dims, shift, stream);
  return 1;
}

/* An i64 tensor of shape (m, n) holding 0, 1, ... in C order, pushed. */
static int push_arange(lua_State *L, const gpu_tensor *like, int64_t m, int64_t n, int stream, const char *fname) {
  int64_t shape[2] = {m, n};
  gpu_tensor *r = bind_tensor_like(L, like, DEV_I64, 2, shape, stream, fname);
  dev_kop op = {.kind = DEV_OP_ARANGE, .out = r->v, .s0 = {.is_int = 1, .i = 0}, .s1 = {.is_int = 1, .i = 1}};
  bind_tensor_submit2(L, stream, &op, lua_gettop(L), 0, 0, fname);
  return lua_gettop(L);
}

/* t:name(x, opts) for the values at stack indices t and x; its result's index */
static int call(lua_State *L, const char *name, int t, int x, int opts) {
  lua_getfield(L, t, name);
  lua_pushvalue(L, t);
  lua_pushvalue(L, x);
  lua_pushvalue(L, opts);
  lua_call(L, 3, 1);
  return lua_gettop(L);
}

/* t:tril([k] [, opts]) / t:triu: the elements with col - row <= k (tril)
 * or >= k (triu) of the last two dims kept, the others zero */
static int tri(lua_State *L, int lower, const char *fname) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int hask = !lua_isnoneornil(L, 2) && !lua_istable(L, 2);
  lua_Integer k = hask ? bind_tensor_int(L, 2, "k") : 0;
  int stream = bind_read_stream_opt(L, hask ? 3 : 2);
  if (t->v.ndim < 2) luaL_argerror(L, 1, lua_pushfstring(L, "%s needs a tensor of at least 2 dims", fname));
  luaL_checkstack(L, 16, fname);
  int64_t m = t->v.shape[t->v.ndim - 2], n = t->v.shape[t->v.ndim - 1];
  lua_createtable(L, 0, 1);
  lua_pushvalue(L, stream);
  lua_setfield(L, -2, "stream");
  int so = lua_gettop(L);
  int rows = push_arange(L, t, m, 1, stream, fname), cols = push_arange(L, t, 1, n, stream, fname);
  int diff = call(L, "sub", cols, rows, so);
  lua_pushinteger(L, k);
  int mask = call(L, lower ? "gt" : "lt", diff, lua_gettop(L), so);
  if (t->v.dtype == DEV_BOOL) lua_pushboolean(L, 0);
  else lua_pushinteger(L, 0);
  lua_getfield(L, 1, "masked_fill");
  lua_pushvalue(L, 1);
  lua_pushvalue(L, mask);
  lua_pushvalue(L, -4);
  lua_pushvalue(L, so);
  lua_call(L, 4, 1);
  return 1;
}

static int t_tril(lua_State *L) { return tri(L, 1, "tril"); }
static int t_triu(lua_State *L) { return tri(L, 0, "triu"); }

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_reorder_methods[] = {
  {"flip", t_flip}, {"roll", t_roll}, {"tril", t_tril}, {"triu", t_triu},
  {NULL, NULL}
};
