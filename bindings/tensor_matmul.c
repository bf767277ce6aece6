/* gpu.Tensor matmul: gpu.matmul(a, b) and a:matmul(b), 2-D or batched. */
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

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_matmul_methods[] = {
  {"matmul", t_matmul},
  {NULL, NULL}
};

const luaL_Reg bind_tensor_matmul_funcs[] = {
  {"matmul", t_matmul},
  {NULL, NULL}
};
