/* gpu.Graph: a step captured once and replayed.  gpu.graph(fn [, {name =}])
 * runs fn(s) once with s, a fresh capture stream, current: the work it
 * enqueues is recorded, not run (cuda/dev_graph.c); g:launch([stream])
 * replays it.  An error inside fn (a call that cannot be captured raises
 * at its own line) abandons the capture and is raised again as it was. */
#include <string.h>

#include "common.h"

typedef struct gpu_graph { const bind_type *tag; dev_graph *g; } gpu_graph;

static gpu_graph *to_graph(lua_State *L, int idx) {
  return bind_check_type(L, idx, &bind_graph_type, sizeof(gpu_graph));
}

static dev_graph *check_graph(lua_State *L, int idx) {
  gpu_graph *p = to_graph(L, idx);
  if (!p->g) luaL_argerror(L, idx, "graph is closed");
  return p->g;
}

/* Make the stream at idx the running coroutine's current stream (nil:
 * none), pushing the one it replaces (nil: none). */
static void swap_current(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  bind_push_current_table(L);
  lua_pushthread(L);
  lua_rawget(L, -2);
  lua_pushthread(L);
  lua_pushvalue(L, idx);
  lua_rawset(L, -4);
  lua_remove(L, -2);
}

/* The message handler of the capture: Lua's yield error there has no line
 * and does not say why; the capture and the yield's line are named.  Any
 * other error goes on as it was. */
static int capture_msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (lua_type(L, 1) != LUA_TSTRING || strcmp(msg, "attempt to yield across a C-call boundary") != 0)
    return 1;
  lua_Debug ar;
  lua_pushliteral(L, "");
  for (int level = 1; lua_getstack(L, level, &ar); level++) {
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
      lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
      break;
    }
  }
  const dev_graph *cap = dev_graph_open_capture(bind_ctx(L));
  lua_pushfstring(L, "%scoroutine.yield cannot yield inside a gpu.graph capture (captured at %s): "
                     "other tasks would run while it is open; yield before or after gpu.graph",
                  lua_tostring(L, -1), cap ? dev_graph_site(cap) : "?");
  return 1;
}

static int graph_new(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  static const char *const names[] = {"name", NULL};
  int o = bind_read_opts(L, 2, names);
  char name[DEV_TRACE_NAME] = "";
  if (!lua_isnil(L, o)) {
    if (lua_type(L, o) != LUA_TSTRING)
      luaL_error(L, "bad option 'name' (string expected, got %s)", luaL_typename(L, o));
    size_t n;
    const char *s = lua_tolstring(L, o, &n);
    if (n >= sizeof name) n = sizeof name - 1;
    memcpy(name, s, n);
    name[n] = 0;
  }
  lua_settop(L, 2);
  /* push, then acquire: 3 the graph, 4 the capture stream */
  gpu_graph *gg = bind_new_udata(L, &bind_graph_type, sizeof *gg, 0);
  gpu_stream *ps = bind_new_udata(L, &bind_stream_type, sizeof *ps, 0);
  if (dev_graph_capturing(ctx)) luaL_error(L, "graph: a capture is already open (gpu.graph does not nest)");
  /* nonblocking: CUDA cannot capture work that the legacy default stream
   * would be ordered with */
  BIND_CHECK(L, ctx, dev_stream_create(ctx, DEV_PRIO_NORMAL, 1, &ps->s), "graph");
  bind_site(L, ctx);
  BIND_CHECK(L, ctx, dev_graph_begin(ctx, ps->s, name, &gg->g), "graph");
  swap_current(L, 4);                       /* 5: the current stream before */
  lua_pushcfunction(L, capture_msgh);       /* 6 */
  int top = lua_gettop(L);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 4);
  int rc = lua_pcall(L, 1, LUA_MULTRET, 6);
  int nres = lua_gettop(L) - top;
  lua_remove(L, 6);
  top--;
  swap_current(L, 5);
  lua_pop(L, 1);
  if (rc != LUA_OK) {
    /* abandon the capture; the runtime goes on as before it */
    dev_graph *g = gg->g;
    gg->g = NULL;
    dev_graph_release(g);
    return lua_error(L);
  }
  if (dev_graph_end(gg->g) != DEV_OK) {
    char msg[1024];
    strncpy(msg, dev_errmsg(ctx), sizeof msg - 1);
    msg[sizeof msg - 1] = 0;
    dev_graph *g = gg->g;
    gg->g = NULL;
    dev_graph_release(g);
    return luaL_error(L, "graph: %s", msg);
  }
  lua_pushvalue(L, 3);
  lua_insert(L, top + 1);
  return nres + 1;
}

static int graph_launch(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  check_graph(L, 1);
  dev_stream *s = lua_isnoneornil(L, 2) ? bind_stream(L, 0) : bind_check_stream(L, 2);
  bind_site(L, ctx);
  BIND_CHECK(L, ctx, dev_graph_launch(to_graph(L, 1)->g, s), "launch");
  return 0;
}

static int graph_release(lua_State *L) {
  gpu_graph *p = to_graph(L, 1);
  if (p->g) {
    dev_graph *g = p->g;
    p->g = NULL;
    dev_graph_release(g);
  }
  return 0;
}

/* g.nodes, g.name, g.site, g.closed (after the methods) */
static int graph_fields(lua_State *L) {
  gpu_graph *p = to_graph(L, 1);
  const char *k = bind_check_key(L, 2);
  if (strcmp(k, "closed") == 0) {
    lua_pushboolean(L, p->g == NULL);
    return 1;
  }
  if (!p->g) return luaL_error(L, "graph is closed");
  if (strcmp(k, "nodes") == 0) lua_pushinteger(L, dev_graph_nodes(p->g));
  else if (strcmp(k, "name") == 0) lua_pushstring(L, dev_graph_name(p->g));
  else if (strcmp(k, "site") == 0) lua_pushstring(L, dev_graph_site(p->g));
  else lua_pushnil(L);
  return 1;
}

static int graph_tostring(lua_State *L) {
  gpu_graph *p = to_graph(L, 1);
  if (!p->g) lua_pushliteral(L, "gpu.Graph (closed)");
  else lua_pushfstring(L, "gpu.Graph '%s' (%d nodes, captured at %s)", dev_graph_name(p->g),
                       dev_graph_nodes(p->g), dev_graph_site(p->g));
  return 1;
}

static const luaL_Reg methods[] = {
  {"launch", graph_launch},
  {"close", graph_release},
  {NULL, NULL}
};

static const luaL_Reg metamethods[] = {
  {"__index", graph_fields},
  {"__tostring", graph_tostring},
  {"__gc", graph_release},
  {"__close", graph_release},
  {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"graph", graph_new},
  {NULL, NULL}
};

int bind_open_graph(lua_State *L) {
  bind_newtype(L, &bind_graph_type, metamethods, methods);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
