/* gpu.Tensor matmul: gpu.matmul(a, b) and a:matmul(b), 2-D or batched;
 * bmm, outer, dot and einsum, compositions in stdlib/gpu/einsum.lua. */
#include "tensor.h"

/* v as a 3-D view of batch size nb: a 2-D one (or a batch of one) repeats
 * with batch stride 0, without a copy. */
static dev_view as_batch(const dev_view *v, int64_t nb) {
  if (v->ndim == 3 && v->shape[0] == nb) return *v;
  dev_view w = *v;
  int r = v->ndim - 2;
  w.ndim = 3;
  w.shape[0] = nb;
  w.stride[0] = 0;
  for (int d = 0; d < 2; d++) {
    w.shape[d + 1] = v->shape[r + d];
    w.stride[d + 1] = v->stride[r + d];
  }
  return w;
}

/* gpu.matmul(a, b [, opts]) / a:matmul(b): 2-D @ 2-D, or batched: either
 * operand 3-D {batch, rows, cols}, a 2-D one or a batch of one broadcast to
 * the other's batch.  Transposed and other strided views go to the backend
 * as they are (cuBLAS transpose flags, strided batches; no copy). */
static int t_matmul(lua_State *L) {
  gpu_tensor *a = bind_check_tensor(L, 1), *b = bind_check_tensor(L, 2);
  int o = bind_read_opts(L, 3, bind_out_opts);
  if (a->v.ndim != 2 && a->v.ndim != 3)
    luaL_argerror(L, 1, lua_pushfstring(L, "matmul needs a 2-D or 3-D tensor, got %d-D", a->v.ndim));
  if (b->v.ndim != 2 && b->v.ndim != 3)
    luaL_argerror(L, 2, lua_pushfstring(L, "matmul needs a 2-D or 3-D tensor, got %d-D", b->v.ndim));
  int ra = a->v.ndim - 2, rb = b->v.ndim - 2;
  char sa[MAXSHAPESTR], sb[MAXSHAPESTR];
  bind_shape_str(sa, sizeof sa, a->v.ndim, a->v.shape);
  bind_shape_str(sb, sizeof sb, b->v.ndim, b->v.shape);
  if (a->v.shape[ra + 1] != b->v.shape[rb])
    luaL_argerror(L, 2, lua_pushfstring(L, "a %s @ b %s: a's dim %d (%I) differs from b's dim %d (%I)",
                                        sa, sb, ra + 2, (lua_Integer)a->v.shape[ra + 1], rb + 1,
                                        (lua_Integer)b->v.shape[rb]));
  int64_t na = ra ? a->v.shape[0] : 1, nbt = rb ? b->v.shape[0] : 1;
  if (na != nbt && na != 1 && nbt != 1)
    luaL_argerror(L, 2, lua_pushfstring(L, "a %s @ b %s: batch sizes %I and %I differ (and neither is 1)",
                                        sa, sb, (lua_Integer)na, (lua_Integer)nbt));
  if (a->v.dtype != b->v.dtype)
    luaL_argerror(L, 2, lua_pushfstring(L, "dtype %s does not match %s", dev_dtype_name(b->v.dtype),
                                        dev_dtype_name(a->v.dtype)));
  if (a->v.dtype == DEV_BOOL) luaL_argerror(L, 1, "matmul is not supported for bool");
  bind_tensor_same_kind(L, 2, a, b);
  int batched = ra || rb;
  int64_t nb = na == 1 ? nbt : na;   /* the other batch broadcasts; 0 stays 0 */
  int64_t shape[3] = {nb, a->v.shape[ra], b->v.shape[rb + 1]};
  dev_view av = a->v, bv = b->v;
  gpu_tensor *r = bind_tensor_out(L, o, o + 1, a, a->v.dtype, batched ? 3 : 2, batched ? shape : shape + 1, "matmul");
  dev_kop op = {.kind = DEV_OP_MATMUL, .nin = 2, .out = r->v};
  op.in[0] = batched ? as_batch(&av, nb) : av;
  op.in[1] = batched ? as_batch(&bv, nb) : bv;
  bind_tensor_submit2(L, o + 1, &op, lua_gettop(L), 1, 2, "matmul");
  return 1;
}

/* The Lua half of name (stdlib/gpu/einsum.lua) called with this call's
 * arguments, the values from index first on checked to be tensors.  Its
 * errors carry no position: raised again here, they name the script's
 * line. */
static int lua_half(lua_State *L, const char *name, int first) {
  int n = lua_gettop(L);
  if (n < first + (first == 1)) luaL_argerror(L, n + 1, "gpu.Tensor expected, got no value");
  for (int i = first; i <= n; i++) bind_check_tensor(L, i);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "gpu.einsum");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, name);
  lua_replace(L, -2);
  lua_insert(L, 1);
  if (lua_pcall(L, n, 1, 0) != LUA_OK) {
    if (lua_type(L, -1) != LUA_TSTRING) return lua_error(L);
    return luaL_error(L, "%s", lua_tostring(L, -1));
  }
  return 1;
}

/* gpu.bmm(a, b) / a:bmm(b): {B, n, k} @ {B, k, m}, no broadcast */
static int t_bmm(lua_State *L) { if (lua_gettop(L) > 2) lua_settop(L, 2); return lua_half(L, "bmm", 1); }
/* gpu.outer(a, b) / a:outer(b): 1-D a, b -> {#a, #b} */
static int t_outer(lua_State *L) { if (lua_gettop(L) > 2) lua_settop(L, 2); return lua_half(L, "outer", 1); }
/* gpu.dot(a, b) / a:dot(b): 1-D a, b -> a 0-dim tensor */
static int t_dot(lua_State *L) { if (lua_gettop(L) > 2) lua_settop(L, 2); return lua_half(L, "dot", 1); }
/* gpu.einsum(spec, a, ...) */
static int t_einsum(lua_State *L) { return lua_half(L, "einsum", 2); }

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_matmul_methods[] = {
  {"matmul", t_matmul}, {"bmm", t_bmm}, {"outer", t_outer}, {"dot", t_dot},
  {NULL, NULL}
};

const luaL_Reg bind_tensor_matmul_funcs[] = {
  {"matmul", t_matmul}, {"bmm", t_bmm}, {"outer", t_outer}, {"dot", t_dot}, {"einsum", t_einsum},
  {NULL, NULL}
};
