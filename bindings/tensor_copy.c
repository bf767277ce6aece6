/* gpu.Tensor whole-tensor writes: t:copy(src) into t, t:clone() and
 * t:contiguous() (a copy in C order), t:to(device or dtype) (a cast where
 * the data is, then a move), t:fill(v) and t:zero_(). */
#include "tensor.h"

static void check_same_numel(lua_State *L, int arg, const gpu_tensor *dst, const gpu_tensor *src) {
  if (dev_view_numel(&dst->v) != dev_view_numel(&src->v)) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, src->v.ndim, src->v.shape);
    bind_shape_str(b, sizeof b, dst->v.ndim, dst->v.shape);
    luaL_argerror(L, arg, lua_pushfstring(L, "shape %s (%I elements) does not match %s (%I elements)",
                                          a, (lua_Integer)dev_view_numel(&src->v), b,
                                          (lua_Integer)dev_view_numel(&dst->v)));
  }
}

/* tensors at stack indices dst and src */
static void copy_into(lua_State *L, int dst, int src, int stream) {
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1};
  op.out = bind_check_tensor(L, dst)->v;
  op.in[0] = bind_check_tensor(L, src)->v;
  bind_tensor_submit2(L, stream, &op, dst, src, 0, "copy");
}

static int t_copy(lua_State *L) {
  gpu_tensor *dst = bind_check_tensor(L, 1), *src = bind_check_tensor(L, 2);
  int stream = bind_read_stream_opt(L, 3);
  check_same_numel(L, 2, dst, src);
  if (dst->v.dtype != src->v.dtype)
    luaL_argerror(L, 2, lua_pushfstring(L, "dtype %s does not match %s (cast with src:to(\"%s\"))",
                                        dev_dtype_name(src->v.dtype), dev_dtype_name(dst->v.dtype),
                                        dev_dtype_name(dst->v.dtype)));
  copy_into(L, 1, 2, stream);
  lua_settop(L, 1);
  return 1;
}

static int t_clone(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int stream = bind_read_stream_opt(L, 2);
  bind_tensor_like(L, t, t->v.dtype, t->v.ndim, t->v.shape, stream, "clone");
  copy_into(L, lua_gettop(L), 1, stream);
  return 1;
}

static int t_contiguous(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (dev_view_contiguous(&t->v)) {
    lua_settop(L, 1);
    return 1;
  }
  return t_clone(L);
}

/* t:to(device_or_dtype) or t:to{device =, dtype =} */
static int t_to(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_memkind kind = t->v.buf->kind;
  dev_dtype dt = t->v.dtype;
  static const char *const names[] = {"device", "dtype", "stream", NULL};
  int stream = 0;
  if (lua_type(L, 2) == LUA_TSTRING) {
    const char *x = bind_name_at(L, 2);
    if (!x || (dev_dtype_parse(x, &dt) != 0 && bind_parse_device(L, x, &kind) != 0))
      luaL_argerror(L, 2, lua_pushfstring(L, "unknown device or dtype '%s'", bind_shown_name(L, 2)));
    stream = bind_read_stream_opt(L, 3);
  } else if (lua_type(L, 2) == LUA_TTABLE) {
    int o = bind_read_opts(L, 2, names);
    dt = bind_check_dtype(L, o + 1, dt);
    kind = bind_check_device(L, o, kind);
    stream = o + 2;
  } else {
    luaL_typeerror(L, 2, "device or dtype name, or table");
  }
  dev_view tv = t->v;
  dev_memkind tkind = t->v.buf->kind;
  if (kind == tkind && dt == tv.dtype) {
    bind_new_tensor(L, kind, dt, tv.ndim, tv.shape, stream, "to");
    copy_into(L, lua_gettop(L), 1, stream);
    return 1;
  }
  /* Cast where the data is, then move it. */
  int src = 1;
  if (dt != tv.dtype) {
    gpu_tensor *c = bind_new_tensor(L, tkind, dt, tv.ndim, tv.shape, stream, "to");
    dev_kop op = {.kind = DEV_OP_UNARY, .code = DEV_UN_COPY, .nin = 1, .out = c->v};
    op.in[0] = tv;
    src = lua_gettop(L);
    bind_tensor_submit2(L, stream, &op, 0, 1, 0, "to");
  }
  if (kind != tkind) {
    bind_new_tensor(L, kind, dt, tv.ndim, tv.shape, stream, "to");
    copy_into(L, lua_gettop(L), src, stream);
  }
  return 1;
}

static int t_fill(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_scalar v = bind_check_scalar(L, 2, t->v.dtype, 2, NULL);
  dev_kop op = {.kind = DEV_OP_FILL, .out = t->v, .s0 = v};
  bind_tensor_submit2(L, bind_read_stream_opt(L, 3), &op, 1, 0, 0, "fill");
  lua_settop(L, 1);
  return 1;
}

/* all bits zero is 0 in every dtype */
static int t_zero_(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_stream *s = bind_stream(L, bind_read_stream_opt(L, 2));
  dev_ctx *ctx = dev_stream_ctx(s);
  t = bind_check_tensor(L, 1);
  bind_call_site(L, ctx, "zero_");
  int rc;
  if (dev_view_contiguous(&t->v)) {
    rc = dev_memset(ctx, s, t->v.buf, t->v.offset,
                    0, (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype));
  } else {
    dev_kop op = {.kind = DEV_OP_FILL, .out = t->v, .s0 = {1, 0, 0}};
    rc = dev_submit(ctx, s, &op);
  }
  BIND_CHECK(L, ctx, rc, "zero_");
  lua_settop(L, 1);
  return 1;
}

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_copy_methods[] = {
  {"copy", t_copy}, {"clone", t_clone}, {"contiguous", t_contiguous}, {"to", t_to},
  {"fill", t_fill}, {"zero_", t_zero_},
  {NULL, NULL}
};
