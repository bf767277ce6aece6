/* gpu.Event: a point in a stream's work; orders streams and measures time. */
#include <string.h>

#include "common.h"

static gpu_event *to_event(lua_State *L, int idx) {
  return bind_check_type(L, idx, &bind_event_type, sizeof(gpu_event));
}

dev_event *bind_check_event(lua_State *L, int idx) {
  gpu_event *p = to_event(L, idx);
  if (!p->e) luaL_argerror(L, idx, "event is closed");
  return p->e;
}

void bind_push_event(lua_State *L, dev_event *e) {
  gpu_event *p = bind_new_udata(L, &bind_event_type, sizeof *p, 0);
  p->e = e;
}

static int event_new(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  static const char *const names[] = {"timing", NULL};
  int o = bind_read_opts(L, 1, names);
  int timing = lua_isnil(L, o) || lua_toboolean(L, o);  /* as cudaEventCreate; {timing = false} for pure ordering */
  gpu_event *p = bind_new_udata(L, &bind_event_type, sizeof *p, 0);
  BIND_CHECK(L, ctx, dev_event_create(ctx, timing, &p->e), "event");
  return 1;
}

static int event_release(lua_State *L) {
  gpu_event *p = to_event(L, 1);
  if (p->e) {
    dev_event *e = p->e;
    p->e = NULL;
    dev_event_release(e);
  }
  return 0;
}

static int event_record(lua_State *L) {
  bind_ctx(L);
  dev_event *e = bind_check_event(L, 1);
  dev_stream *s = lua_isnoneornil(L, 2) ? bind_stream(L, 0) : bind_check_stream(L, 2);
  BIND_CHECK(L, bind_ctx(L), dev_event_record(e, s), "record");
  lua_settop(L, 1);
  return 1;
}

static int event_synchronize(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  dev_event *e = bind_check_event(L, 1);
  bind_call_site(L, ctx, "synchronize");
  BIND_CHECK(L, ctx, dev_event_synchronize(e), "synchronize");
  return 0;
}

static int event_query(lua_State *L) {
  bind_ctx(L);
  lua_pushboolean(L, dev_event_query(bind_check_event(L, 1)) > 0);
  return 1;
}

static int elapsed(lua_State *L, int start, int end) {
  dev_ctx *ctx = bind_ctx(L);
  dev_event *a = bind_check_event(L, start), *b = bind_check_event(L, end);
  double ms;
  BIND_CHECK(L, ctx, dev_event_elapsed(a, b, &ms), "elapsed");
  lua_pushnumber(L, ms);
  return 1;
}

static int event_elapsed(lua_State *L) { return elapsed(L, 1, 2); }

/* ev2 - ev1: milliseconds from ev1 to ev2 */
static int event_sub(lua_State *L) { return elapsed(L, 2, 1); }

/* e.closed, e.timing, e.recorded (after the methods) */
static int event_fields(lua_State *L) {
  gpu_event *p = to_event(L, 1);
  const char *k = bind_check_key(L, 2);
  if (strcmp(k, "closed") == 0) {
    lua_pushboolean(L, p->e == NULL);
    return 1;
  }
  if (!p->e) return luaL_error(L, "event is closed");
  if (strcmp(k, "timing") == 0) lua_pushboolean(L, dev_event_timing(p->e));
  else if (strcmp(k, "recorded") == 0) lua_pushboolean(L, dev_event_recorded(p->e));
  else lua_pushnil(L);
  return 1;
}

static int event_tostring(lua_State *L) {
  gpu_event *p = to_event(L, 1);
  if (!p->e) lua_pushliteral(L, "gpu.Event (closed)");
  else lua_pushfstring(L, "gpu.Event (%s%s)",
                       dev_event_recorded(p->e) ? (dev_event_query(p->e) ? "done" : "pending")
                                                : "never recorded",
                       dev_event_timing(p->e) ? ", timing" : "");
  return 1;
}

static const luaL_Reg methods[] = {
  {"record", event_record},
  {"synchronize", event_synchronize},
  {"query", event_query},
  {"elapsed", event_elapsed},
  {"close", event_release},
  {NULL, NULL}
};

static const luaL_Reg metamethods[] = {
  {"__index", event_fields},
  {"__sub", event_sub},
  {"__tostring", event_tostring},
  {"__gc", event_release},
  {"__close", event_release},
  {NULL, NULL}
};

int bind_open_event(lua_State *L) {
  bind_newtype(L, &bind_event_type, metamethods, methods);
  lua_pushcfunction(L, event_new);
  lua_setfield(L, -2, "event");
  return 0;
}
