/* gpu.fuse's C half: the op table for the tracer (stdlib/gpu/fuse.lua), a
 * traced node list made into an interned program (cuda/fprog.c), and a run
 * of one: its inputs broadcast together, the output made (or opts.out
 * checked), and ONE op of kind DEV_OP_FUSED submitted on the stream, so
 * streams, graphs, traces, tasks and the race checker see one op.  These
 * are the functions of the module "gpu._fuse": the tracer's, not the
 * user's API (tests read the op list and the program count there). */
#include <string.h>

#include "tensor.h"

static void push_rows(lua_State *L, int *n, const char *kind, const char *name, int code, unsigned cls, int to_bool,
                      unsigned flags) {
  lua_createtable(L, 0, 7);
  lua_pushstring(L, kind); lua_setfield(L, -2, "kind");
  lua_pushstring(L, name); lua_setfield(L, -2, "name");
  lua_pushinteger(L, code); lua_setfield(L, -2, "code");
  lua_pushboolean(L, (cls & DEV_CLS_F) != 0); lua_setfield(L, -2, "F");
  lua_pushboolean(L, (cls & DEV_CLS_I) != 0); lua_setfield(L, -2, "I");
  lua_pushboolean(L, (cls & DEV_CLS_B) != 0); lua_setfield(L, -2, "B");
  lua_pushboolean(L, to_bool); lua_setfield(L, -2, "to_bool");
  lua_pushboolean(L, (flags & DEV_OPF_LEFT) != 0); lua_setfield(L, -2, "left");
  lua_pushboolean(L, (flags & DEV_OPF_ZDIV) != 0); lua_setfield(L, -2, "zdiv");
  lua_rawseti(L, -2, ++*n);
}

/* ops() -> the rows of ops.h ({kind, name, code, F, I, B,
 * to_bool, left, zdiv, default}), gpu.Tensor's method table */
static int fuse_ops(lua_State *L) {
  int n = 0;
  lua_newtable(L);
#define U(E, name, cls, res, fl) push_rows(L, &n, "unary", #name, DEV_UN_##E, DEV_CLASSES(cls), DEV_RESULT(res), fl);
  DEV_UNARY_OPS(U)
#undef U
#define B(E, name, cls, res, fl) push_rows(L, &n, "binary", #name, DEV_BIN_##E, DEV_CLASSES(cls), DEV_RESULT(res), fl);
  DEV_BINARY_OPS(B)
#undef B
#define T(E, name, cls, res, fl) push_rows(L, &n, "ternary", #name, DEV_TER_##E, DEV_CLASSES(cls), DEV_RESULT(res), fl);
  DEV_TERNARY_OPS(T)
#undef T
#define D(E, v)                                  \
  for (int i = 1; i <= n; i++) {                 \
    lua_rawgeti(L, -1, i);                       \
    lua_getfield(L, -1, "name");                 \
    if (strcmp(lua_tostring(L, -1), dev_binop_name(DEV_BIN_##E)) == 0) { \
      lua_pushnumber(L, v);                      \
      lua_setfield(L, -3, "default");            \
    }                                            \
    lua_pop(L, 2);                               \
  }
  DEV_BINARY_DEFAULTS(D)
#undef D
  lua_rawgetp(L, LUA_REGISTRYINDEX, &bind_tensor_type);
  lua_getfield(L, -1, "__methods");
  lua_remove(L, -2);
  return 2;
}

static int field_int(lua_State *L, int t, const char *k) {
  lua_getfield(L, t, k);
  int v = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* One node from the table on top of the stack. */
static void read_node(lua_State *L, dev_fnode *x) {
  int t = lua_gettop(L);
  memset(x, 0, sizeof *x);
  x->kind = field_int(L, t, "kind");
  x->code = field_int(L, t, "code");
  x->index = field_int(L, t, "index");
  for (int j = 0; j < 3; j++) {
    lua_rawgeti(L, t, j + 1);
    x->a[j] = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) - 1 : -1;
    lua_pop(L, 1);
  }
  x->dtype = DEV_NDTYPE;
  if (lua_getfield(L, t, "dtype") == LUA_TSTRING) dev_dtype_parse(lua_tostring(L, -1), &x->dtype);
  lua_pop(L, 1);
  if (lua_getfield(L, t, "k") == LUA_TNUMBER) {
    if (lua_isinteger(L, -1)) { x->k.is_int = 1; x->k.i = lua_tointeger(L, -1); x->k.f = (double)x->k.i; }
    else x->k.f = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
}

/* program(name, nodes [, res [, reds]]) -> the interned program (light
 * userdata): its results the nodes res[] (1-based; default: the last
 * node), each reduced by reds[j] (a trailing reduction's name) if given */
static int fuse_program(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int res[DEV_FMAXOUT], nout = 0;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    nout = (int)lua_rawlen(L, 3);
    if (nout < 1 || nout > DEV_FMAXOUT)
      return luaL_error(L, "%s: %d results in one op (at most %d)", name, nout, DEV_FMAXOUT);
    for (int j = 0; j < nout; j++) {
      lua_rawgeti(L, 3, j + 1);
      res[j] = (int)lua_tointeger(L, -1) - 1;
      lua_pop(L, 1);
    }
  }
  int n = (int)lua_rawlen(L, 2);
  if (n < 1 || n > DEV_FNODES) return luaL_error(L, "%s: %d ops (at most %d in one fused call)", name, n, DEV_FNODES);
  dev_fnode *nodes = lua_newuserdatauv(L, (size_t)n * sizeof *nodes, 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 2, i + 1);
    read_node(L, &nodes[i]);
    lua_pop(L, 1);
  }
  char err[200];
  if (!nout) res[nout++] = n - 1;
  int red[DEV_FMAXOUT], *reds = NULL;
  if (!lua_isnoneornil(L, 4)) {
    luaL_checktype(L, 4, LUA_TTABLE);
    if ((int)lua_rawlen(L, 4) != nout) return luaL_error(L, "%s: %d reductions for %d results", name,
                                                         (int)lua_rawlen(L, 4), nout);
    for (int j = 0; j < nout; j++) {
      lua_rawgeti(L, 4, j + 1);
      const char *rn = luaL_checkstring(L, -1);
      red[j] = -1;
      for (int c = 0; c < DEV_NREDOP; c++)
        if (strcmp(dev_redop_name(c), rn) == 0) red[j] = c;
      if (red[j] < 0) return luaL_error(L, "%s: no reduction '%s'", name, rn);
      lua_pop(L, 1);
    }
    reds = red;
  }
  const dev_fprog *p = dev_fprog_intern_red(name, nodes, n, res, nout, reds, err, sizeof err);
  if (!p) return luaL_error(L, "%s: %s", name, err);
  lua_pushlightuserdata(L, (void *)p);
  return 1;
}

/* The run's inputs (args[map[i]]: the tables at 2 and 3) pushed, checked,
 * broadcast into op; -1 when a program of several results has inputs that
 * do not broadcast together (its results, one op each, may: the caller
 * runs them so), else an error. */
static int run_inputs(lua_State *L, const dev_fprog *p, dev_kop *op, dev_fargs *fa, int *ndim, int64_t *shape,
                       int *idx) {
  const dev_view *v[DEV_FMAXIN];
  dev_view bv[DEV_FMAXIN];
  gpu_tensor *first = NULL;
  for (int i = 0; i < p->nin; i++) {
    lua_rawgeti(L, 3, i + 1);
    lua_rawget(L, 2);
    gpu_tensor *t = bind_check_tensor(L, -1);
    idx[i] = lua_gettop(L);
    if (first) bind_tensor_same_kind(L, idx[i], first, t);
    else first = t;
    v[i] = &t->v;
  }
  if (bind_tensor_broadcast(p->nin, v, bv, ndim, shape)) {
    if (p->nout > 1) return -1;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; i < p->nin; i++) {
      char s[MAXSHAPESTR];
      bind_shape_str(s, sizeof s, v[i]->ndim, v[i]->shape);
      luaL_addstring(&b, i ? ", " : "");
      luaL_addstring(&b, s);
    }
    luaL_pushresult(&b);
    luaL_error(L, "%s: the inputs' shapes %s cannot be broadcast together", p->name, lua_tostring(L, -1));
  }
  for (int i = 0; i < p->nin; i++) {
    if (i < DEV_MAXIN) op->in[i] = bv[i];
    else fa->xin[i - DEV_MAXIN] = bv[i];
  }
  op->nin = p->nin;
  return 0;
}

/* The trailing reductions of a run (slots r: dim, r + 1: keepdim) on op,
 * of results of rank ndim and this shape: the outputs' dtypes (dt[], the
 * results' on entry), rank and shape as the unfused reductions make them. */
static void run_reduction(lua_State *L, int r, const dev_fprog *p, dev_kop *op, dev_dtype *dt, int *ndim,
                          int64_t *shape) {
  for (int j = 0; j < p->nout; j++) {   /* before the dim's own checks, as unfused */
    int code = p->red[j];
    if (!(dev_dtype_class(dt[j]) & dev_redop_info(code)->classes))
      luaL_error(L, "%s: not supported for %s (needs a float dtype)", dev_redop_name(code), dev_dtype_name(dt[j]));
  }
  op->dim = bind_reduce_dim(L, r, *ndim, dev_redop_name(p->red[0]));
  op->flags |= DEV_F_FREDUCE;
  int nd = *ndim;
  int64_t sh[DEV_MAXDIM];
  for (int j = 0; j < p->nout; j++) {
    *ndim = nd;
    memcpy(sh, shape, sizeof sh);
    dt[j] = bind_reduce_out(L, (dev_redop)p->red[j], dt[j], op->dim, lua_toboolean(L, r + 1), ndim, sh);
  }
  memcpy(shape, sh, sizeof sh);
}

/* The outputs of a program of several results (slot 5: nil, or a list of
 * one tensor each to write), of dtypes dt[], made or checked, into op and
 * pushed in order. */
static void run_outs(lua_State *L, const dev_fprog *p, dev_kop *op, dev_fargs *fa, const gpu_tensor *like,
                     const dev_dtype *dt, int ndim, const int64_t *shape) {
  if (!lua_isnil(L, 5) && (!lua_istable(L, 5) || (int)lua_rawlen(L, 5) != p->nout))
    luaL_error(L, "%s: out must be a list of %d tensors (one per result)", p->name, p->nout);
  for (int j = 0; j < p->nout; j++) {
    if (lua_istable(L, 5)) lua_rawgeti(L, 5, j + 1);
    else lua_pushnil(L);
    int slot = lua_gettop(L);
    gpu_tensor *o = bind_tensor_out(L, slot, 6, like, dt[j], ndim, shape, p->name);
    lua_replace(L, slot);
    if (j == 0) op->out = o->v;
    else fa->xout[j - 1] = o->v;
  }
}

/* run(prog, args, ins, params, out, stream, level [, dim, keepdim [, dry]])
 * -> the results (false: run_inputs's -1): one DEV_OP_FUSED op on the
 * stream, of inputs args[ins[i]] and parameters args[params[i]] (out: nil,
 * or a tensor to write; a list of them for a program of several results);
 * a program that ends in reductions reduces its results along dim, in the
 * same op.  Its site is the nearest line of a Lua function from `level` up
 * the stack from run (not debug.getinfo's table, made per call).  dry:
 * the op is checked as dev_submit checks it, and nothing is run or
 * returned (a call of several ops checks them all before the first). */
static int run_op(lua_State *L) {
  luaL_checktype(L, 1, LUA_TLIGHTUSERDATA);
  const dev_fprog *p = lua_touserdata(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checktype(L, 4, LUA_TTABLE);
  int level = (int)luaL_optinteger(L, 7, 0);
  if ((int)lua_rawlen(L, 3) != p->nin) return luaL_error(L, "%s: %d inputs, the program takes %d", p->name,
                                                          (int)lua_rawlen(L, 3), p->nin);
  dev_fargs fa;
  dev_kop op = {.kind = DEV_OP_FUSED, .fprog = p, .fargs = &fa};
  int ndim, idx[DEV_FMAXIN];
  int64_t shape[DEV_MAXDIM];
  if (run_inputs(L, p, &op, &fa, &ndim, shape, idx)) return -1;
  for (int i = 0; i < p->nparam; i++) {
    lua_rawgeti(L, 4, i + 1);
    lua_rawget(L, 2);
    dev_scalar *s = &fa.param[i];
    *s = (dev_scalar){0};
    if (lua_isinteger(L, -1)) { s->is_int = 1; s->i = lua_tointeger(L, -1); s->f = (double)s->i; }
    else if (lua_type(L, -1) == LUA_TNUMBER) s->f = lua_tonumber(L, -1);
    else return luaL_error(L, "%s: parameter %d is not a number", p->name, i + 1);
    lua_pop(L, 1);
  }
  dev_dtype dt[DEV_FMAXOUT];
  for (int j = 0; j < p->nout; j++) dt[j] = p->node[p->res[j]].dtype;
  if (p->nred) run_reduction(L, 8, p, &op, dt, &ndim, shape);
  int top = lua_gettop(L);
  if (p->nout > 1) {
    run_outs(L, p, &op, &fa, bind_check_tensor(L, idx[0]), dt, ndim, shape);
  } else {
    gpu_tensor *o = bind_tensor_out(L, 5, 6, bind_check_tensor(L, idx[0]), dt[0], ndim, shape, p->name);
    op.out = o->v;
  }
  dev_stream *s = bind_stream(L, 6);
  dev_ctx *ctx = dev_stream_ctx(s);
  bind_site_from(L, ctx, level > 0 ? level : 1);
  dev_set_call(ctx, p->name);
  if (lua_toboolean(L, 10)) {   /* dry: the checks only */
    BIND_CHECK(L, ctx, dev_check_op(ctx, &op), p->name);
    return 0;
  }
  BIND_CHECK(L, ctx, dev_submit(ctx, s, &op), p->name);
  for (int j = 1; j <= p->nout; j++) lua_pushvalue(L, top + j);
  return p->nout;
}

/* run's slots 1..10 (above them, anything: fuse_call's), as above: the
 * count of results pushed, or -1 (nothing to use pushed) when a program of
 * several results has inputs that do not broadcast together. */
static int fuse_run(lua_State *L) {
  lua_settop(L, 10);
  int n = run_op(L);
  if (n >= 0) return n;
  lua_pushboolean(L, 0);
  return 1;
}

/* The signature of the n values at stack index a.. (the trace cache's
 * key): each tensor's dtype, rank and which dims are 1, "n" for a number.
 * Pushes it and returns 0, or pushes nothing and returns the first bad
 * value's number. */
static int push_key(lua_State *L, int a, int n) {
  luaL_Buffer b;
  int base = lua_gettop(L);
  luaL_buffinit(L, &b);
  for (int i = 0; i < n; i++) {
    int t = lua_type(L, a + i);
    gpu_tensor *x = t == LUA_TUSERDATA ? bind_test_tensor(L, a + i) : NULL;
    if (t == LUA_TNUMBER) {
      luaL_addchar(&b, 'n');
    } else if (!x) {
      lua_settop(L, base);   /* the buffer's box, if it made one */
      return i + 1;
    } else {
      luaL_addchar(&b, (char)('A' + x->v.dtype));
      luaL_addchar(&b, (char)('0' + x->v.ndim));
      for (int d = 0; d < x->v.ndim; d++) luaL_addchar(&b, x->v.shape[d] == 1 ? '1' : '*');
    }
    luaL_addchar(&b, ';');
  }
  luaL_pushresult(&b);
  return 0;
}

/* key(args, n) -> push_key of args[1..n]; nil and the bad argument's
 * number for anything but tensors and numbers. */
static int fuse_key(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int n = (int)luaL_checkinteger(L, 2);
  luaL_checkstack(L, n + 2, "too many arguments");
  for (int i = 1; i <= n; i++) lua_rawgeti(L, 1, i);
  int bad = push_key(L, 3, n);
  if (!bad) return 1;
  lua_pushnil(L);
  lua_pushinteger(L, bad);
  return 2;
}

/* The slow path of a call: fuse.lua's (upvalue 1), with the same values. */
static int call_slow(lua_State *L, int top) {
  lua_settop(L, top);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, top, LUA_MULTRET);
  return lua_gettop(L);
}

/* Whether the call at 1 (the callable) .. top (o: its options table, or 0)
 * may take the fast path of entry.fast at f: options out and stream only,
 * a number for each parameter. */
static int fast_ok(lua_State *L, int f, int o) {
  if (o) {
    for (lua_pushnil(L); lua_next(L, o); lua_pop(L, 1)) {
      const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "";
      if (strcmp(k, "out") != 0 && strcmp(k, "stream") != 0) {
        lua_pop(L, 2);
        return 0;
      }
    }
  }
  lua_getfield(L, f, "params");
  int np = (int)lua_rawlen(L, -1), ok = 1;
  for (int i = 1; i <= np && ok; i++) {
    lua_rawgeti(L, -1, i);
    ok = lua_type(L, 1 + (int)lua_tointeger(L, -1)) == LUA_TNUMBER;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return ok;
}

/* f(...): the __call of gpu.fuse's callables.  A signature traced to one
 * op whose number arguments need no check (fuse.lua's entry.fast) goes
 * straight to run from here, its errors and site at the caller's line;
 * everything else (a first call, several ops, checks, the reference path
 * of tests) goes through fuse.lua's call (upvalue 1; upvalue 2: the module,
 * whose `unfused` selects the reference path). */
static int fuse_call(lua_State *L) {
  int top = lua_gettop(L), n = top - 1, o = 0;
  luaL_checkstack(L, 24, "fused call");
  if (n > 0 && lua_type(L, top) == LUA_TTABLE) {
    if (lua_getmetatable(L, top)) lua_pop(L, 1);
    else o = top, n--;
  }
  lua_getfield(L, lua_upvalueindex(2), "unfused");
  int unfused = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (unfused || lua_type(L, 1) != LUA_TTABLE || push_key(L, 2, n)) return call_slow(L, top);
  lua_getfield(L, 1, "cache");
  if (!lua_istable(L, -1)) return call_slow(L, top);
  lua_rotate(L, -2, 1);
  if (lua_rawget(L, -2) != LUA_TTABLE || lua_getfield(L, -1, "fast") != LUA_TTABLE) return call_slow(L, top);
  int f = lua_gettop(L);
  if (!fast_ok(L, f, o)) return call_slow(L, top);
  /* run's slots: prog, args, ins, params, out, stream, level, dim,
   * keepdim, dry; then the callable and the options (to fall back to the
   * slow path), and the rest goes */
  lua_getfield(L, f, "p");
  lua_createtable(L, n, 0);
  for (int i = 1; i <= n; i++) {
    lua_pushvalue(L, 1 + i);
    lua_rawseti(L, -2, i);
  }
  lua_getfield(L, f, "ins");
  lua_getfield(L, f, "params");
  if (o) lua_getfield(L, o, "out"); else lua_pushnil(L);
  if (o) lua_getfield(L, o, "stream"); else lua_pushnil(L);
  lua_pushinteger(L, 1);   /* the site: the caller's line */
  lua_getfield(L, f, "dim");
  lua_getfield(L, f, "keepdim");
  lua_pushnil(L);
  lua_pushvalue(L, 1);
  if (o) lua_pushvalue(L, o); else lua_pushnil(L);
  lua_rotate(L, 1, 12);
  lua_settop(L, 12);
  int nres = run_op(L);
  if (nres >= 0) {
    lua_getfield(L, 11, "calls");
    lua_pushinteger(L, lua_tointeger(L, -1) + 1);
    lua_setfield(L, 11, "calls");
    lua_pop(L, 1);
    return nres;
  }
  /* a group whose inputs do not broadcast together this call: the slow
   * path runs its results one op each */
  lua_settop(L, 12);
  lua_pushvalue(L, 11);
  for (int i = 1; i <= n; i++) lua_rawgeti(L, 2, i);
  int has_o = !lua_isnil(L, 12);
  if (has_o) lua_pushvalue(L, 12);
  int cnt = 1 + n + has_o;
  lua_rotate(L, 1, cnt);
  return call_slow(L, cnt);
}

/* caller(slow) -> the __call of a callable: fuse_call over slow */
static int fuse_caller(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_pushcclosure(L, fuse_call, 2);
  return 1;
}

/* count() -> programs interned so far (each a cache miss) */
static int fuse_count(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)dev_fprog_count());
  return 1;
}

/* gpu.fuse(fn, opts): stdlib/gpu/fuse.lua's */
static int fuse_entry(lua_State *L) {
  int n = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "gpu.fuse");
  lua_call(L, 1, 1);
  lua_insert(L, 1);
  lua_call(L, n, 1);
  return 1;
}

const luaL_Reg bind_fuse_funcs[] = {
  {"fuse", fuse_entry},
  {NULL, NULL}
};

static int open_core(lua_State *L) {
  static const luaL_Reg core[] = {
    {"ops", fuse_ops}, {"program", fuse_program}, {"run", fuse_run}, {"key", fuse_key},
    {"count", fuse_count}, {"caller", fuse_caller}, {NULL, NULL}
  };
  luaL_newlib(L, core);
  return 1;
}

void bind_fuse_preload(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, open_core);
  lua_setfield(L, -2, "gpu._fuse");
  lua_pop(L, 1);
}
