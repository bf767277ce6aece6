/* gpu.Stream: a queue of work.  gpu.stream{}, gpu.using(s), the default and
 * current streams. */
#include <string.h>

#include "common.h"

static gpu_stream *to_stream(lua_State *L, int idx) {
  return bind_check_type(L, idx, &bind_stream_type, sizeof(gpu_stream));
}

dev_stream *bind_check_stream(lua_State *L, int idx) {
  gpu_stream *p = to_stream(L, idx);
  if (!p->s) luaL_argerror(L, idx, "stream is closed");
  return p->s;
}

void bind_push_stream(lua_State *L, dev_stream *s) {
  gpu_stream *p = bind_new_udata(L, &bind_stream_type, sizeof *p, 0);
  dev_stream_retain(s);
  p->s = s;
}

static void push_default(lua_State *L) {
  gpu_state *st = bind_state(L);
  if (st->dflt == LUA_NOREF) {
    bind_push_stream(L, dev_default_stream(st->ctx));
    st->dflt = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->dflt);
}

/* Pushes the current stream's handle of the running coroutine, or nil. */
static int push_current(lua_State *L) {
  gpu_state *st = bind_state(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->current);
  lua_pushthread(L);
  int t = lua_rawget(L, -2);
  lua_remove(L, -2);
  return t;
}

/* gpu.using's stream for the running coroutine, else the default stream */
static dev_stream *current_stream(lua_State *L) {
  gpu_state *st = bind_state(L);
  gpu_stream *p;
  if (L == st->mainL && st->main_cur_ok) {
    p = st->main_cur;   /* kept alive by the table, which holds it */
  } else {
    p = push_current(L) != LUA_TNIL ? lua_touserdata(L, -1) : NULL;
    lua_pop(L, 1);
    if (L == st->mainL) {
      st->main_cur = p;
      st->main_cur_ok = 1;
    }
  }
  if (!p) return dev_default_stream(st->ctx);
  if (!p->s) luaL_error(L, "the current stream (set by gpu.using) is closed");
  return p->s;
}

void bind_push_current_table(lua_State *L) {
  gpu_state *st = bind_state(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->current);
  st->main_cur_ok = 0;
}

dev_stream *bind_stream(lua_State *L, int idx) {
  if (idx == 0 || lua_isnoneornil(L, idx)) return current_stream(L);
  gpu_stream *p = bind_test_stream(L, idx);
  if (!p) luaL_error(L, "bad option 'stream' (gpu.Stream expected, got %s)", bind_typename(L, idx));
  if (!p->s) luaL_error(L, "bad option 'stream' (stream is closed)");
  return p->s;
}

static const char *const priorities[] = {"low", "normal", "high", NULL};

/* The priority option's value at idx: a name, or -1, 0, 1 as CUDA's. */
static int check_priority(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TNUMBER) {
    int isint;
    lua_Integer p = lua_tointegerx(L, idx, &isint);
    if (!isint || p < -1 || p > 1)
      luaL_error(L, "bad option 'priority' (expected \"low\", \"normal\", \"high\" or -1, 0, 1)");
    return (int)p;
  }
  return DEV_PRIO_LOW + bind_check_option(L, idx, "priority", DEV_PRIO_NORMAL - DEV_PRIO_LOW, priorities);
}

static int stream_new(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  static const char *const names[] = {"priority", "nonblocking", NULL};
  int o = bind_read_opts(L, 1, names);
  int prio = check_priority(L, o), nonblocking = lua_toboolean(L, o + 1);
  gpu_stream *p = bind_new_udata(L, &bind_stream_type, sizeof *p, 0);
  BIND_CHECK(L, ctx, dev_stream_create(ctx, prio, nonblocking, &p->s), "stream");
  return 1;
}

static int stream_release(lua_State *L) {
  gpu_stream *p = to_stream(L, 1);
  /* The default stream's handle is shared and never goes away. */
  if (p->s && !dev_stream_is_default(p->s)) {
    dev_stream *s = p->s;
    p->s = NULL;
    dev_stream_release(s);
  }
  return 0;
}

static int stream_close(lua_State *L) {
  gpu_stream *p = to_stream(L, 1);
  if (p->s && dev_stream_is_default(p->s))
    return luaL_error(L, "the default stream cannot be closed");
  return stream_release(L);
}

static int stream_wait(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_check_stream(L, 1);
  int rc;
  if (bind_test_event(L, 2)) {
    rc = dev_stream_wait_event(s, bind_check_event(L, 2));
  } else if (bind_test_stream(L, 2)) {
    rc = dev_stream_wait_stream(s, bind_check_stream(L, 2));
  } else {
    return luaL_typeerror(L, 2, "gpu.Event or gpu.Stream");
  }
  BIND_CHECK(L, ctx, rc, "wait");
  lua_settop(L, 1);
  return 1;
}

static int stream_synchronize(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_check_stream(L, 1);
  bind_call_site(L, ctx, "synchronize");
  BIND_CHECK(L, ctx, dev_stream_synchronize(s), "synchronize");
  return 0;
}

static int stream_query(lua_State *L) {
  bind_ctx(L);
  dev_stream *s = bind_check_stream(L, 1);
  lua_pushboolean(L, dev_stream_query(s) > 0);
  return 1;
}

static int stream_record(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  bind_check_stream(L, 1);
  static const char *const names[] = {"timing", NULL};
  int o = bind_read_opts(L, 2, names);
  int timing = lua_isnil(L, o) || lua_toboolean(L, o);
  bind_push_event(L, NULL);  /* push, then acquire */
  gpu_event *p = lua_touserdata(L, -1);
  BIND_CHECK(L, ctx, dev_event_create(ctx, timing, &p->e), "record");
  dev_stream *s = bind_check_stream(L, 1);
  BIND_CHECK(L, ctx, dev_event_record(p->e, s), "record");
  return 1;
}

/* s.priority, s.nonblocking, s.id, s.closed, s.is_default (after the methods) */
static int stream_fields(lua_State *L) {
  gpu_stream *p = to_stream(L, 1);
  const char *k = bind_check_key(L, 2);
  if (!p->s) {
    if (strcmp(k, "closed") == 0) { lua_pushboolean(L, 1); return 1; }
    return luaL_error(L, "stream is closed");
  }
  if (strcmp(k, "priority") == 0) {
    lua_pushstring(L, priorities[dev_stream_priority(p->s) - DEV_PRIO_LOW]);
  } else if (strcmp(k, "nonblocking") == 0) {
    lua_pushboolean(L, dev_stream_nonblocking(p->s));
  } else if (strcmp(k, "id") == 0) {
    lua_pushinteger(L, (lua_Integer)dev_stream_id(p->s));
  } else if (strcmp(k, "closed") == 0) {
    lua_pushboolean(L, 0);
  } else if (strcmp(k, "is_default") == 0) {
    lua_pushboolean(L, dev_stream_is_default(p->s));
  } else {
    lua_pushnil(L);
  }
  return 1;
}

static int stream_tostring(lua_State *L) {
  gpu_stream *p = to_stream(L, 1);
  if (!p->s)
    lua_pushliteral(L, "gpu.Stream (closed)");
  else if (dev_stream_is_default(p->s))
    lua_pushliteral(L, "gpu.Stream (default)");
  else
    lua_pushfstring(L, "gpu.Stream %d (%s%s)", (int)dev_stream_id(p->s),
                    dev_stream_priority(p->s) > 0 ? "high" :
                    dev_stream_priority(p->s) < 0 ? "low" : "normal",
                    dev_stream_nonblocking(p->s) ? ", nonblocking" : "");
  return 1;
}

/* ---- gpu.using ------------------------------------------------------- */

/* A to-be-closed guard, its user values { thread, previous stream or false }. */
typedef struct using_guard { const bind_type *tag; } using_guard;

static int using_close(lua_State *L) {
  bind_check_type(L, 1, &bind_using_type, sizeof(using_guard));
  lua_getiuservalue(L, 1, 1);  /* thread */
  if (lua_isnil(L, -1)) return 0;  /* already restored */
  bind_push_current_table(L);
  lua_pushvalue(L, -2);
  lua_getiuservalue(L, 1, 2);
  if (lua_toboolean(L, -1) == 0) { lua_pop(L, 1); lua_pushnil(L); }
  lua_rawset(L, -3);
  lua_pushnil(L);
  lua_setiuservalue(L, 1, 1);
  return 0;
}

static int gpu_using(lua_State *L) {
  bind_check_stream(L, 1);
  bind_new_udata(L, &bind_using_type, sizeof(using_guard), 2);
  lua_pushthread(L);
  lua_setiuservalue(L, -2, 1);
  if (push_current(L) == LUA_TNIL) { lua_pop(L, 1); lua_pushboolean(L, 0); }
  lua_setiuservalue(L, -2, 2);
  bind_push_current_table(L);
  lua_pushthread(L);
  lua_pushvalue(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  return 1;
}

static int gpu_default_stream(lua_State *L) {
  push_default(L);
  return 1;
}

static int gpu_current_stream(lua_State *L) {
  if (push_current(L) == LUA_TNIL) {
    lua_pop(L, 1);
    push_default(L);
  }
  return 1;
}

static const luaL_Reg methods[] = {
  {"wait", stream_wait},
  {"synchronize", stream_synchronize},
  {"query", stream_query},
  {"record", stream_record},
  {"close", stream_close},
  {NULL, NULL}
};

static const luaL_Reg metamethods[] = {
  {"__index", stream_fields},
  {"__tostring", stream_tostring},
  {"__gc", stream_release},
  {"__close", stream_release},
  {NULL, NULL}
};

static const luaL_Reg using_meta[] = {
  {"__close", using_close},
  {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"stream", stream_new},
  {"using", gpu_using},
  {"default_stream", gpu_default_stream},
  {"current_stream", gpu_current_stream},
  {NULL, NULL}
};

int bind_open_stream(lua_State *L) {
  bind_newtype(L, &bind_stream_type, metamethods, methods);
  bind_newtype(L, &bind_using_type, using_meta, NULL);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
