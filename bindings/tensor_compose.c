/* gpu.Tensor ops made of the table's ops (cuda/ops.h), as NumPy defines
 * them: isclose and allclose (rtol, atol, equal_nan), nan_to_num (nan,
 * posinf, neginf).  Each takes more numbers than a row of the table can
 * carry (a binary op has one, a ternary two), so each is a few elementwise
 * ops on one stream, enqueued like any other. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "tensor.h"

/* t:name(x, y, opts) for the values at stack indices t, x and y (0: none)
 * and opts; the result's index (the new top). */
static int call(lua_State *L, const char *name, int t, int x, int y, int opts) {
  int n = 2;
  lua_getfield(L, t, name);
  lua_pushvalue(L, t);
  if (x) lua_pushvalue(L, x), n++;
  if (y) lua_pushvalue(L, y), n++;
  lua_pushvalue(L, opts);
  lua_call(L, n, 1);
  return lua_gettop(L);
}

static int push_number(lua_State *L, double v) {
  lua_pushnumber(L, v);
  return lua_gettop(L);
}

/* opts.name, a number, or def when absent. */
static double num_opt(lua_State *L, int slot, const char *name, const char *fname, double def) {
  if (lua_isnil(L, slot)) return def;
  if (lua_type(L, slot) != LUA_TNUMBER)
    luaL_error(L, "bad option '%s' to '%s' (number expected, got %s)", name, fname, luaL_typename(L, slot));
  return lua_tonumber(L, slot);
}

/* {stream = the slot's value}: the options every step gets. */
static int step_opts(lua_State *L, int stream) {
  lua_createtable(L, 0, 1);
  lua_pushvalue(L, stream);
  lua_setfield(L, -2, "stream");
  return lua_gettop(L);
}

/* isclose of the tensor at 1 and the tensor or number at 2, options at 3:
 * NumPy's |a - b| <= atol + rtol * |b| (not symmetric: b is the reference),
 * or a == b (equal infinities), or NaN and NaN when equal_nan.  Integers
 * are compared in f64, as NumPy does.  Pushes the bool tensor; *so: the
 * index of the steps' options. */
static int push_isclose(lua_State *L, const char *fname, int *so) {
  static const char *const names[] = {"rtol", "atol", "equal_nan", "stream", NULL};
  gpu_tensor *a = bind_check_tensor(L, 1), *b = bind_test_tensor(L, 2);
  dev_dtype dt = a->v.dtype;
  if (dt == DEV_BOOL) luaL_error(L, "%s: not supported for bool (needs a numeric dtype)", fname);
  if (!b && lua_type(L, 2) != LUA_TNUMBER) luaL_typeerror(L, 2, "gpu.Tensor or number");
  if (b && b->v.dtype != dt)
    luaL_argerror(L, 2, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                        dev_dtype_name(b->v.dtype), dev_dtype_name(dt), dev_dtype_name(dt)));
  if (b) bind_tensor_same_kind(L, 2, a, b);
  luaL_checkstack(L, 40, "isclose");   /* every step's result stays on the stack */
  int o = bind_read_opts(L, 3, names);
  double rtol = num_opt(L, o, "rtol", fname, 1e-5), atol = num_opt(L, o + 1, "atol", fname, 1e-8);
  int equal_nan = lua_toboolean(L, o + 2), s = step_opts(L, o + 3), x = 1, y = 2;
  *so = s;
  if (!dev_dtype_is_float(dt)) {
    lua_pushliteral(L, "f64");
    int f64 = lua_gettop(L);
    x = call(L, "to", 1, f64, 0, s);
    if (b) y = call(L, "to", 2, f64, 0, s);
  }
  int r = call(L, "sub", x, y, 0, s);
  r = call(L, "abs", r, 0, 0, s);
  if (b) {
    int tol = call(L, "abs", y, 0, 0, s);
    tol = call(L, "mul", tol, push_number(L, rtol), 0, s);
    tol = call(L, "add", tol, push_number(L, atol), 0, s);
    r = call(L, "le", r, tol, 0, s);
    /* an infinite or NaN b is close only to itself (a == b below) */
    r = call(L, "logical_and", r, call(L, "isfinite", y, 0, 0, s), 0, s);
  } else {
    double v = lua_tonumber(L, 2);
    r = call(L, "le", r, push_number(L, isfinite(v) ? atol + rtol * fabs(v) : -HUGE_VAL), 0, s);
  }
  r = call(L, "logical_or", r, call(L, "eq", x, y, 0, s), 0, s);
  if (equal_nan && (b || isnan(lua_tonumber(L, 2)))) {
    int both = call(L, "isnan", x, 0, 0, s);
    if (b) both = call(L, "logical_and", both, call(L, "isnan", y, 0, 0, s), 0, s);
    r = call(L, "logical_or", r, both, 0, s);
  }
  return r;
}

/* t:isclose(b, opts), gpu.isclose(a, b, opts): a bool tensor */
static int t_isclose(lua_State *L) {
  int so;
  lua_settop(L, 3);
  push_isclose(L, "isclose", &so);
  return 1;
}

/* t:allclose(b, opts), gpu.allclose(a, b, opts): whether every element is
 * close, a Lua boolean; it reads the result, so it syncs, as t:item() does */
static int t_allclose(lua_State *L) {
  int so;
  lua_settop(L, 3);
  int r = push_isclose(L, "allclose", &so);
  r = call(L, "all", r, 0, 0, so);
  lua_getfield(L, so, "stream");
  bind_push_elem(L, DEV_BOOL, bind_tensor_download(L, r, lua_gettop(L), "allclose"));
  return 1;
}

/* The largest finite value of a float dtype. */
static double float_max(dev_dtype dt) {
  switch (dt) {
  case DEV_F16: return 65504.0;
  case DEV_BF16: return 0x1.fep127;
  case DEV_F32: return FLT_MAX;
  default: return DBL_MAX;
  }
}

/* t:nan_to_num(opts), t:nan_to_num_(opts): NaN, inf and -inf replaced by
 * opts.nan (0), opts.posinf and opts.neginf (the dtype's largest and
 * smallest finite values), as NumPy's and PyTorch's; integers and bool have
 * none (a copy, or nothing in place). */
static int nan_to_num(lua_State *L, int inplace) {
  static const char *const names[] = {"nan", "posinf", "neginf", "stream", NULL};
  const char *fname = inplace ? "nan_to_num_" : "nan_to_num";
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_dtype dt = t->v.dtype;
  lua_settop(L, 2);
  luaL_checkstack(L, 30, "nan_to_num");
  int o = bind_read_opts(L, 2, names);
  double big = dev_dtype_is_float(dt) ? float_max(dt) : 0;
  double v[3] = {num_opt(L, o, "nan", fname, 0), num_opt(L, o + 1, "posinf", fname, big),
                 num_opt(L, o + 2, "neginf", fname, -big)};
  int so = step_opts(L, o + 3), r = 1;
  if (!inplace) r = call(L, "clone", 1, 0, 0, so);
  if (dev_dtype_is_float(dt)) {
    /* every mask from the values before any is replaced */
    int m[3];
    m[0] = call(L, "isnan", 1, 0, 0, so);
    m[1] = call(L, "eq", 1, push_number(L, HUGE_VAL), 0, so);
    m[2] = call(L, "eq", 1, push_number(L, -HUGE_VAL), 0, so);
    for (int k = 0; k < 3; k++) call(L, "masked_fill_", r, m[k], push_number(L, v[k]), so);
  }
  lua_pushvalue(L, r);
  return 1;
}

static int t_nan_to_num(lua_State *L) { return nan_to_num(L, 0); }
static int t_nan_to_num_(lua_State *L) { return nan_to_num(L, 1); }

const luaL_Reg bind_tensor_compose_methods[] = {
  {"isclose", t_isclose}, {"allclose", t_allclose},
  {"nan_to_num", t_nan_to_num}, {"nan_to_num_", t_nan_to_num_},
  {NULL, NULL}
};

const luaL_Reg bind_tensor_compose_funcs[] = {
  {"isclose", t_isclose}, {"allclose", t_allclose},
  {NULL, NULL}
};
