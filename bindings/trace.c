/* gpu.trace, the C half: start, stop, active, and the records as Lua tables
 * for the writers (events, json, svg) in stdlib/gpu/trace.lua, which the
 * table loads on first use of a field it lacks.  gpu.range and gpu.Range. */
#include <stdio.h>
#include <string.h>

#include "common.h"

/* A range holds its context (retained) so that __gc can end it late. */
typedef struct gpu_range { const bind_type *tag; dev_ctx *ctx; uint64_t id; int open; } gpu_range;

static int trace_start(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  lua_Integer max = 0;
  static const char *const names[] = {"max_events", NULL};
  int o = bind_read_opts(L, 1, names);
  if (!lua_isnil(L, o)) {
    int isint;
    max = lua_tointegerx(L, o, &isint);
    if (!isint || max < 1) return luaL_error(L, "bad option 'max_events' (a positive integer expected)");
  }
  BIND_CHECK(L, ctx, dev_trace_start(ctx, (size_t)max), "trace.start");
  return 0;
}

static int trace_stop(lua_State *L) {
  dev_trace_stop(bind_ctx(L));
  return 0;
}

static int trace_active(lua_State *L) {
  lua_pushboolean(L, dev_trace_active(bind_ctx(L)));
  return 1;
}

static void setnum(lua_State *L, const char *k, lua_Number v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

static void setint(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* The script line that called the writer: the first Lua frame outside this
 * module's own Lua half. */
static void caller_site(lua_State *L, dev_ctx *ctx) {
  lua_Debug ar;
  char site[DEV_SITE_LEN] = "";
  for (int level = 1; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    size_t n = strlen(ar.source);
    if (ar.currentline <= 0 || (n >= 14 && strcmp(ar.source + n - 14, "/gpu/trace.lua") == 0)) continue;
    snprintf(site, sizeof site, "%s:%d", ar.short_src, ar.currentline);
    break;
  }
  dev_set_site(ctx, site);
}

/* _collect(counted, call): wait for queued work (a counted sync on behalf
 * of gpu.trace.<call>, or quietly at exit), read the timings back; returns {records, dropped, max, duration
 * (us), active, backend, streams = {{id, priority, nonblocking, default}}}. */
static int trace_collect(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  static const char *const names[] = {"events", "json", "svg", "write", NULL};
  static const char *const calls[] = {"trace.events", "trace.json", "trace.svg", "trace.write"};
  int counted = lua_isnone(L, 1) || lua_toboolean(L, 1);
  int call = luaL_checkoption(L, 2, "events", names);
  caller_site(L, ctx);
  dev_set_call(ctx, calls[call]);
  int rc = dev_trace_collect(ctx, counted);
  dev_set_call(ctx, NULL);
  BIND_CHECK(L, ctx, rc, "trace");
  dev_trace_info in;
  dev_trace_get_info(ctx, &in);
  lua_createtable(L, 0, 8);
  setint(L, "records", (lua_Integer)in.records);
  setint(L, "dropped", (lua_Integer)in.dropped);
  setint(L, "max", (lua_Integer)in.max);
  setnum(L, "duration", (lua_Number)in.duration / 1e3);
  lua_pushboolean(L, in.active);
  lua_setfield(L, -2, "active");
  lua_pushstring(L, dev_backend_name(ctx));
  lua_setfield(L, -2, "backend");
  lua_createtable(L, in.nstreams, 0);
  for (int i = 0; i < in.nstreams; i++) {
    dev_trace_stream s;
    if (dev_trace_stream_at(ctx, i, &s)) break;
    lua_createtable(L, 0, 4);
    setint(L, "id", s.id);
    static const char *const prio[] = {"low", "normal", "high"};
    lua_pushstring(L, prio[s.priority < 0 ? 0 : s.priority > 0 ? 2 : 1]);
    lua_setfield(L, -2, "priority");
    lua_pushboolean(L, s.nonblocking);
    lua_setfield(L, -2, "nonblocking");
    lua_pushboolean(L, s.is_default);
    lua_setfield(L, -2, "default");
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "streams");
  return 1;
}

static void push_record(lua_State *L, const dev_trace_rec *r) {
  static const char *const kinds[] = {"op", "host_op", "collective", "sync", "range"};
  static const char *const copies[] = {NULL, "h2d", "d2h", "d2d", "h2h"};
  const char *cat = r->kind == DEV_TR_SYNC ? "sync" : r->kind == DEV_TR_RANGE ? "range"
                  : r->kind == DEV_TR_COLL ? "collective" : r->cls != DEV_TR_COMPUTE ? "copy" : "compute";
  lua_createtable(L, 0, 10);
  lua_pushstring(L, r->name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, kinds[r->kind <= DEV_TR_RANGE ? r->kind : 0]);
  lua_setfield(L, -2, "kind");
  lua_pushstring(L, cat);
  lua_setfield(L, -2, "cat");
  if (r->cls != DEV_TR_COMPUTE && r->cls <= DEV_TR_H2H) {
    lua_pushstring(L, copies[r->cls]);
    lua_setfield(L, -2, "copy");
  }
  if (r->stream >= 0) setint(L, "stream", r->stream);
  setnum(L, "ts", (lua_Number)r->t0 / 1e3);
  setnum(L, "dur", (lua_Number)(r->t1 - r->t0) / 1e3);
  setint(L, "bytes", (lua_Integer)r->bytes);
  lua_pushstring(L, r->site);
  lua_setfield(L, -2, "site");
  if (r->call) {
    lua_pushstring(L, r->call);
    lua_setfield(L, -2, "call");
  }
  if (r->kind == DEV_TR_RANGE) setint(L, "depth", r->depth);
}

/* _slice(first, count): records first .. first + count - 1 (1-based) of the
 * last collection, as a list of tables. */
static int trace_slice(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  lua_Integer first = luaL_checkinteger(L, 1), count = luaL_checkinteger(L, 2);
  luaL_argcheck(L, first >= 1, 1, "positive index expected");
  if (count < 0) count = 0;
  if (count > 65536) count = 65536;
  /* Lua's memory, so that a raise below leaks nothing */
  dev_trace_rec *buf = lua_newuserdatauv(L, (size_t)count * sizeof *buf + 1, 0);
  size_t n = dev_trace_copy(ctx, (size_t)first - 1, (size_t)count, buf);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    push_record(L, &buf[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

/* A missing field: the writers, from the stdlib module. */
static int trace_index(lua_State *L) {
  lua_settop(L, 2);
  if (lua_getglobal(L, "require") != LUA_TFUNCTION) return 0;
  lua_pushliteral(L, "gpu.trace");
  lua_call(L, 1, 0);
  lua_rawget(L, 1);
  return 1;
}

/* ---- gpu.range ----------------------------------------------------------- */

static int gpu_range_new(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  if (lua_type(L, 1) != LUA_TSTRING) return luaL_typeerror(L, 1, "string");
  const char *name = bind_check_cstring(L, 1);
  luaL_argcheck(L, lua_gettop(L) == 1, 2, "gpu.range takes a name only");
  gpu_range *r = bind_new_udata(L, &bind_range_type, sizeof *r, 2);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  /* the owner, kept alive while the range is: its address is not reused */
  lua_pushthread(L);
  lua_setiuservalue(L, -2, 2);
  bind_site(L, ctx);
  /* the owner is the coroutine: each task nests its own ranges */
  BIND_CHECK(L, ctx, dev_range_push(ctx, name, L, &r->id), "range");
  dev_ctx_retain(ctx);
  r->ctx = ctx;
  r->open = 1;
  return 1;
}

static int range_end(lua_State *L, int force) {
  gpu_range *r = bind_check_type(L, 1, &bind_range_type, sizeof *r);
  if (!r->open) return 0;
  int rc = dev_range_pop(r->ctx, r->id, force);
  if (!force) BIND_CHECK(L, r->ctx, rc, "gpu.range");
  r->open = 0;
  dev_ctx_release(r->ctx);
  r->ctx = NULL;
  return 0;
}

static int range_close(lua_State *L) { return range_end(L, 0); }

/* Leaving a scope by an error ends the ranges opened inside it too, rather
 * than replacing the error with one about their order. */
static int range_tbc(lua_State *L) { return range_end(L, !lua_isnoneornil(L, 2)); }

/* Collected while open: it ends now (with any still open inside it). */
static int range_gc(lua_State *L) { return range_end(L, 1); }

static int range_tostring(lua_State *L) {
  gpu_range *r = bind_check_type(L, 1, &bind_range_type, sizeof *r);
  lua_getiuservalue(L, 1, 1);
  lua_pushfstring(L, "gpu.Range '%s'%s", lua_tostring(L, -1), r->open ? "" : " (closed)");
  return 1;
}

static const luaL_Reg range_methods[] = {
  {"close", range_close},
  {NULL, NULL}
};

static const luaL_Reg range_metamethods[] = {
  {"__close", range_tbc},
  {"__gc", range_gc},
  {"__tostring", range_tostring},
  {NULL, NULL}
};

static const luaL_Reg trace_funcs[] = {
  {"start", trace_start},
  {"stop", trace_stop},
  {"active", trace_active},
  {"_collect", trace_collect},
  {"_slice", trace_slice},
  {NULL, NULL}
};

int bind_open_trace(lua_State *L) {
  bind_newtype(L, &bind_range_type, range_metamethods, range_methods);
  luaL_newlib(L, trace_funcs);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, trace_index);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  lua_setfield(L, -2, "trace");
  lua_pushcfunction(L, gpu_range_new);
  lua_setfield(L, -2, "range");
  return 0;
}
