/* gpu.Tensor and Lua tables: gpu.tensor{...} from nested tables (or one
 * number), staged and uploaded in one copy, and t:totable(), the values read
 * back into nested tables. */
#include <stdio.h>

#include "tensor.h"

/* The shape of nested tables at idx: the lengths of the first entries down;
 * an empty table is a zero-sized dim, the last ({} is {0}, {{}} is {1, 0}). */
static void infer_shape(lua_State *L, int idx, int *ndim, int64_t *shape) {
  *ndim = 0;
  lua_pushvalue(L, idx);
  while (lua_type(L, -1) == LUA_TTABLE) {
    if (*ndim == DEV_MAXDIM) luaL_argerror(L, 1, "too many nested tables");
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    shape[(*ndim)++] = n;
    if (n == 0) break;
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

typedef struct flat { int isint; dev_dtype dt; int64_t k; union { double *f; int64_t *i; } p; } flat;

static void flatten(lua_State *L, int idx, int d, int ndim, const int64_t *shape, flat *fl) {
  if (d == ndim) {
    char what[64];
    snprintf(what, sizeof what, "value at position %lld", (long long)fl->k + 1);
    dev_scalar v = bind_check_scalar(L, idx, fl->dt, 1, what);
    if (fl->isint) fl->p.i[fl->k++] = v.i;
    else fl->p.f[fl->k++] = v.f;
    return;
  }
  if (lua_type(L, idx) != LUA_TTABLE || (int64_t)lua_rawlen(L, idx) != shape[d])
    luaL_argerror(L, 1, lua_pushfstring(L, "ragged nested table (dim %d should have %d entries)",
                                        d + 1, (int)shape[d]));
  for (int64_t i = 1; i <= shape[d]; i++) {
    lua_rawgeti(L, idx, i);
    flatten(L, lua_gettop(L), d + 1, ndim, shape, fl);
    lua_pop(L, 1);
  }
}

/* The leaves' kinds under idx, as bits: 1 a float, 2 an integer, 4 a boolean
 * (anything else is left to flatten's checks). */
static int leaf_kinds(lua_State *L, int idx, int d, int ndim, const int64_t *shape) {
  if (d == ndim) {
    if (lua_type(L, idx) == LUA_TBOOLEAN) return 4;
    if (lua_type(L, idx) == LUA_TNUMBER) return lua_isinteger(L, idx) ? 2 : 1;
    return 0;
  }
  if (lua_type(L, idx) != LUA_TTABLE) return 0;
  luaL_checkstack(L, 2, "tensor too deep");
  int kinds = 0;
  for (int64_t i = 1; i <= shape[d] && !(kinds & 1); i++) {
    lua_rawgeti(L, idx, i);
    kinds |= leaf_kinds(L, lua_gettop(L), d + 1, ndim, shape);
    lua_pop(L, 1);
  }
  return kinds;
}

/* The dtype NumPy and PyTorch give such values: f32 when a float is among
 * them (or none at all), else i64 when an integer is, else bool. */
static dev_dtype default_dtype(lua_State *L, int ndim, const int64_t *shape) {
  int kinds = leaf_kinds(L, 1, 0, ndim, shape);
  if (kinds & 1 || kinds == 0) return DEV_F32;
  return kinds & 2 ? DEV_I64 : DEV_BOOL;
}

/* gpu.tensor(values, opts): nested tables (or one number) of Lua values */
static int bind_tensor_from(lua_State *L) {
  int64_t shape[DEV_MAXDIM];
  int ndim;
  int ty = lua_type(L, 1);
  if (ty != LUA_TTABLE && ty != LUA_TNUMBER && ty != LUA_TBOOLEAN)
    return luaL_typeerror(L, 1, "table or number");
  int o = bind_read_opts(L, 2, bind_new_opts), stream = o + 2;
  infer_shape(L, 1, &ndim, shape);
  dev_dtype dt = bind_check_dtype(L, o, lua_isnil(L, o) ? default_dtype(L, ndim, shape) : DEV_F32);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  bind_stream(L, stream);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(n, shape[d], &n) || n > ((int64_t)1 << 31))
      return luaL_argerror(L, 1, "table too large");
  flat fl = {.isint = !dev_dtype_is_float(dt), .dt = dt, .k = 0};
  /* staging in a userdata: nothing leaks if a value is bad */
  void *stage = lua_newuserdatauv(L, (size_t)n * 8, 0);
  fl.p.f = stage;
  flatten(L, 1, 0, ndim, shape, &fl);
  gpu_tensor *t = bind_new_tensor(L, kind, dt, ndim, shape, stream, "tensor");
  bind_tensor_upload(L, t->v, lua_gettop(L), fl.isint, stage, stream, "tensor");
  return 1;
}

static void build_table(lua_State *L, dev_dtype dt, const unsigned char **p, int d, int ndim,
                        const int64_t *shape) {
  if (d == ndim) {
    bind_push_elem(L, dt, *p);
    *p += dev_dtype_size(dt);
    return;
  }
  luaL_checkstack(L, 4, "tensor too deep");
  lua_createtable(L, (int)shape[d], 0);
  for (int64_t i = 1; i <= shape[d]; i++) {
    build_table(L, dt, p, d + 1, ndim, shape);
    lua_rawseti(L, -2, i);
  }
}

/* t:totable([{stream =}]): nested tables of the values; a counted sync */
static int bind_tensor_totable(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  /* the tables count as well as the values (an empty last dim makes tables
   * alone): at most what gpu.tensor takes, 2^31 */
  int64_t tables = 1, level = 1, cap = (int64_t)1 << 31;
  for (int d = 0; d + 1 < t->v.ndim && tables <= cap; d++) {
    level = level > cap ? level : level * t->v.shape[d];
    tables += level;
  }
  int64_t values = dev_view_numel(&t->v);
  if (tables > cap || values > cap - tables)
    return luaL_error(L, "totable: too large for tables: %s%I tables and %I values (at most 2^31 in all, as "
                      "gpu.tensor takes)", tables > cap ? "over " : "", (lua_Integer)(tables > cap ? cap : tables),
                      (lua_Integer)values);
  const unsigned char *p = bind_tensor_download(L, 1, bind_read_stream_opt(L, 2), "totable");
  build_table(L, t->v.dtype, &p, 0, t->v.ndim, t->v.shape);
  return 1;
}

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_table_methods[] = {
  {"totable", bind_tensor_totable},
  {NULL, NULL}
};

const luaL_Reg bind_tensor_table_funcs[] = {
  {"tensor", bind_tensor_from},
  {NULL, NULL}
};
