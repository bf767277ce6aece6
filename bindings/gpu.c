/* The `gpu` module table: runtime queries, synchronisation, counters, and the
 * per-interpreter state that every other binding reaches through the registry. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bindings.h"
#include "common.h"
#include "../cuda/util.h"

/* The state's registry key is this address: no string lookup per call. */
static const char state_key = 0;

gpu_state *bind_state(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  gpu_state *st = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!st || !st->ctx) luaL_error(L, "gpu runtime is not open");
  return st;
}

void bind_site(lua_State *L, dev_ctx *ctx) { bind_site_from(L, ctx, 1); }

void bind_site_from(lua_State *L, dev_ctx *ctx, int from) {
  lua_Debug ar;
  char site[DEV_SITE_LEN];
  site[0] = 0;
  /* The nearest Lua function up the stack is the script line that did it.
   * Formatted by hand: this runs for every op, and snprintf was a fifth of
   * the cost of enqueueing one. */
  for (int level = from; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline > 0) {
      char digits[16];
      int nd = 0;
      for (unsigned v = (unsigned)ar.currentline; v; v /= 10) digits[nd++] = (char)('0' + v % 10);
      size_t n = strlen(ar.short_src);
      if (n > sizeof site - 2 - (size_t)nd) n = sizeof site - 2 - (size_t)nd;
      memcpy(site, ar.short_src, n);
      site[n++] = ':';
      while (nd) site[n++] = digits[--nd];
      site[n] = 0;
      break;
    }
  }
  dev_set_site(ctx, site);
}

int bind_raise(lua_State *L, dev_ctx *ctx, const char *fname) {
  int top = lua_gettop(L);
  luaL_where(L, 1);
  if (lua_rawlen(L, -1) == 0) {
    /* called from C (tostring, print): the nearest script line instead */
    lua_Debug ar;
    for (int level = 2; lua_getstack(L, level, &ar); level++) {
      lua_getinfo(L, "Sl", &ar);
      if (ar.currentline > 0) {
        lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
        break;
      }
    }
  }
  if (fname) lua_pushfstring(L, "%s: %s", fname, dev_errmsg(ctx));
  else lua_pushstring(L, dev_errmsg(ctx));
  lua_concat(L, lua_gettop(L) - top);
  return lua_error(L);
}

const char *bind_push_names(lua_State *L, const char *const *names, int quoted) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; names[i]; i++) {
    if (i) luaL_addstring(&b, !quoted ? " " : names[i + 1] ? ", " : " or ");
    if (quoted) luaL_addchar(&b, '"');
    luaL_addstring(&b, names[i]);
    if (quoted) luaL_addchar(&b, '"');
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

/* the index of the string k (n bytes) in names, or -1: compared with its
 * length, so "host\0x" is not host */
static int name_index(const char *const *names, const char *k, size_t n) {
  for (int i = 0; names[i]; i++)
    if (names[i][0] == k[0] && strlen(names[i]) == n && memcmp(names[i], k, n) == 0) return i;
  return -1;
}

int bind_check_option(lua_State *L, int idx, const char *field, int def, const char *const *names) {
  int t = lua_type(L, idx);
  if (def >= 0 && t == LUA_TNIL) return def;
  size_t n;
  const char *k = t == LUA_TSTRING ? lua_tolstring(L, idx, &n) : NULL;
  int i = k ? name_index(names, k, n) : -1;
  if (i < 0) {
    const char *got = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : luaL_typename(L, idx);
    if (lua_type(L, idx) == LUA_TSTRING && strlen(got) != lua_rawlen(L, idx))
      got = lua_pushfstring(L, "'%s\\0...'", got);
    luaL_error(L, "bad option '%s' (expected %s, got %s)", field, bind_push_names(L, names, 1), got);
  }
  return i;
}

int bind_read_opts(lua_State *L, int idx, const char *const *names) {
  int n = 0;
  while (names[n]) n++;
  if (idx < 0) idx = lua_absindex(L, idx);
  luaL_checkstack(L, n + 3, "too many options");
  /* above the top: when no options are given, the slots may be at idx */
  int base = lua_gettop(L) + 1;
  for (int i = 0; i < n; i++) lua_pushnil(L);
  if (lua_isnoneornil(L, idx)) return base;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    size_t kn;
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &kn) : NULL;
    int i = k ? name_index(names, k, kn) : -1;
    if (i < 0) {
      const char *ty = luaL_typename(L, -2), *expected = bind_push_names(L, names, 0);
      if (!k) luaL_error(L, "bad option key (a %s; options are named: %s)", ty, expected);
      luaL_error(L, "unknown option '%s' (expected: %s)", k, expected);
    }
    /* every string option goes on to C as a C string */
    if (lua_type(L, -1) == LUA_TSTRING && !bind_name_at(L, -1))
      luaL_error(L, "bad option '%s' (a string with a zero byte: '%s')", names[i], bind_shown_name(L, -1));
    lua_copy(L, -1, base + i);
    lua_pop(L, 1);
  }
  return base;
}

int bind_read_stream_opt(lua_State *L, int idx) {
  static const char *const names[] = {"stream", NULL};
  return bind_read_opts(L, idx, names);
}

static int state_gc(lua_State *L) {
  gpu_state *st = bind_check_type(L, 1, &bind_state_type, sizeof *st);
  if (st->ctx) {
    dev_close(st->ctx);
    st->ctx = NULL;
  }
  return 0;
}

static const luaL_Reg state_meta[] = {
  {"__gc", state_gc},
  {NULL, NULL}
};

static int gpu_device_count(lua_State *L) {
  lua_pushinteger(L, dev_device_count(bind_ctx(L)));
  return 1;
}

/* A device index as an int: 2^32 must not become device 0 by the cast. */
static int check_device_index(lua_State *L, int arg, lua_Integer v) {
  if (v < 0 || v > INT_MAX) {
    int n = dev_device_count(bind_ctx(L));
    luaL_argerror(L, arg, lua_pushfstring(L, "device index %I out of range (%d device%s)", v, n,
                                          n == 1 ? "" : "s"));
  }
  return (int)v;
}

static int gpu_device_info(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  int i = check_device_index(L, 1, luaL_optinteger(L, 1, dev_current_device(ctx)));
  dev_info info;
  if (dev_device_info(ctx, i, &info)) luaL_argerror(L, 1, dev_errmsg(ctx));
  lua_createtable(L, 0, 6);
  lua_pushstring(L, info.name); lua_setfield(L, -2, "name");
  lua_pushstring(L, info.backend); lua_setfield(L, -2, "backend");
  lua_pushinteger(L, info.index); lua_setfield(L, -2, "index");
  lua_pushinteger(L, (lua_Integer)info.total_memory); lua_setfield(L, -2, "total_memory");
  lua_pushinteger(L, info.multiprocessors); lua_setfield(L, -2, "multiprocessors");
  if (info.cc_major) {
    lua_pushfstring(L, "%d.%d", info.cc_major, info.cc_minor);
    lua_setfield(L, -2, "compute_capability");
  }
  return 1;
}

static int gpu_set_device(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  int i = check_device_index(L, 1, luaL_checkinteger(L, 1));
  if (dev_set_device(ctx, i)) luaL_argerror(L, 1, dev_errmsg(ctx));
  return 0;
}

static int gpu_synchronize(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  if (!lua_isnone(L, 1))
    return luaL_argerror(L, 1, "gpu.synchronize() waits for every stream and takes no argument "
                               "(use s:synchronize() for one stream)");
  bind_call_site(L, ctx, "synchronize");
  BIND_CHECK(L, ctx, dev_synchronize(ctx), "synchronize");
  return 0;
}

/* ---- sync debugging ----------------------------------------------------- */

const char *const bind_sync_modes[] = {"off", "warn", "error", NULL};

/* The device layer's sync warning: shown once per message (message names the
 * script line and the call), through Lua's warning system so an embedder's
 * warn function sees it.  Runs inside the syncing call: must not raise, so it
 * touches no Lua stack. */
static void sync_warn(void *ud, const char *msg) {
  gpu_state *st = ud;
  uint64_t h = 1469598103934665603ULL;   /* FNV-1a */
  for (const char *p = msg; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  for (int i = 0; i < st->nwarned && i < SYNC_WARN_MAX; i++)
    if (st->warned[i] == h) return;
  if (st->nwarned < SYNC_WARN_MAX) {
    st->warned[st->nwarned++] = h;
    lua_warning(st->mainL, "gpulua: ", 1);
    /* the first one also says how to turn them off */
    lua_warning(st->mainL, msg, st->nwarned == 1);
    if (st->nwarned == 1)
      lua_warning(st->mainL, " [gpu.sync_debug(\"off\") or GPULUA_SYNC_DEBUG=off silences these]", 0);
  } else if (st->nwarned == SYNC_WARN_MAX) {
    st->nwarned++;   /* once: then it stays past the table */
    lua_warning(st->mainL, "gpulua: more host-device sync warnings are not shown", 0);
  }
}

/* The device layer's other warnings (a damaged kernel cache entry, a cache
 * directory that cannot be made): as the sync warnings, each message once. */
static void note_warn(void *ud, const char *msg) {
  gpu_state *st = ud;
  uint64_t h = 1469598103934665603ULL;   /* FNV-1a */
  for (const char *p = msg; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  for (int i = 0; i < st->nnoted; i++)
    if (st->noted[i] == h) return;
  if (st->nnoted < NOTE_WARN_MAX) st->noted[st->nnoted++] = h;
  lua_warning(st->mainL, "gpulua: ", 1);
  lua_warning(st->mainL, msg, 0);
}

/* The mode in force: the newest open gpu.nosync scope of the running task
 * (or of the main program outside tasks), else the base mode that
 * gpu.sync_debug sets; "off" while the REPL shows a result.  The scopes
 * themselves live in task.c, with the tasks that own them. */
static int effective_mode(lua_State *L, gpu_state *st) {
  if (st->sync_suspended) return 0;
  int o = *bind_sync_slot(L);
  return o >= 0 ? o : st->sync_base;
}

static void set_policy(gpu_state *st, int m) {
  dev_set_sync_policy(st->ctx, m == 0 ? DEV_SYNC_ALLOW : m == 1 ? DEV_SYNC_WARN : DEV_SYNC_REFUSE);
}

void bind_sync_apply(lua_State *L) {
  gpu_state *st = bind_state(L);
  set_policy(st, effective_mode(L, st));
}

void bind_sync_apply_slot(lua_State *L, int slot) {
  gpu_state *st = bind_state(L);
  set_policy(st, st->sync_suspended ? 0 : slot >= 0 ? slot : st->sync_base);
}

/* gpu.sync_debug([mode]) --> the mode in force before.  Sets the base mode;
 * a gpu.nosync scope still open wins over it until it ends.  Finding the
 * mode in force ends the scopes that a coroutine which died of an error left
 * open (bind_sync_slot), and the policy is set again, so no stale scope
 * outlives this call.  "warn" also turns Lua warnings on: asking for them
 * means wanting to see them. */
int bind_sync_debug(lua_State *L) {
  gpu_state *st = bind_state(L);
  int old = effective_mode(L, st);
  if (!lua_isnoneornil(L, 1)) {
    bind_check_cstring(L, 1);
    int m = luaL_checkoption(L, 1, NULL, bind_sync_modes);
    st->sync_base = m;
    if (m == 1) lua_warning(L, "@on", 0);
  }
  bind_sync_apply(L);
  lua_pushstring(L, bind_sync_modes[old]);
  return 1;
}

void bind_sync_suspend(lua_State *L, int suspend) {
  gpu_state *st = bind_state(L);
  st->sync_suspended = suspend;
  bind_sync_apply(L);
}

static void setint(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

static int gpu_stats(lua_State *L) {
  dev_stats s;
  dev_get_stats(bind_ctx(L), &s);
  lua_createtable(L, 0, 12);
  setint(L, "syncs", (lua_Integer)s.syncs);
  setint(L, "launches", (lua_Integer)s.launches);
  setint(L, "copies", (lua_Integer)s.copies);
  setint(L, "h2d_bytes", (lua_Integer)s.h2d_bytes);
  setint(L, "d2h_bytes", (lua_Integer)s.d2h_bytes);
  setint(L, "d2d_bytes", (lua_Integer)s.d2d_bytes);
  setint(L, "h2h_bytes", (lua_Integer)s.h2h_bytes);
  setint(L, "streams", s.streams);
  setint(L, "events", s.events);
  setint(L, "buffers", s.buffers);
  setint(L, "max_concurrent", s.max_concurrent);
  setint(L, "replays", (lua_Integer)s.replays);
  return 1;
}

static int gpu_seed(lua_State *L) {
  gpu_state *st = bind_state(L);
  st->seed = (uint64_t)luaL_checkinteger(L, 1);
  st->offset = 0;
  return 0;
}

static int gpu_sleep(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  double ms = luaL_checknumber(L, 1);
  luaL_argcheck(L, ms >= 0 && ms <= 1e7, 1, "milliseconds must be in [0, 1e7]");
  dev_stream *s = bind_stream(L, bind_read_stream_opt(L, 2));
  dev_kop op = {.kind = DEV_OP_SLEEP, .ms = ms};
  bind_site(L, ctx);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, &op), "sleep");
  return 0;
}

/* gpu.check_races([on]): the stream race checker; returns whether it was on */
static int gpu_check_races(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  int was = dev_races_checked(ctx);
  if (!lua_isnone(L, 1)) {
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    BIND_CHECK(L, ctx, dev_check_races(ctx, lua_toboolean(L, 1)), "check_races");
  }
  lua_pushboolean(L, was);
  return 1;
}

/* Seconds on the monotonic clock, for timing host-side work from a script. */
static int gpu_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* Whether stdin, stdout or stderr is a terminal: Lua itself cannot ask, and
 * gpu.pipeline draws its progress line only on one. */
static int gpu_isatty(lua_State *L) {
  static const char *const names[] = {"stdin", "stdout", "stderr", NULL};
  static const int fds[] = {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO};
  bind_check_cstring(L, 1);
  int i = luaL_checkoption(L, 1, NULL, names);
  lua_pushboolean(L, isatty(fds[i]) == 1);
  return 1;
}

static const luaL_Reg gpu_funcs[] = {
  {"check_races", gpu_check_races},
  {"clock", gpu_clock},
  {"isatty", gpu_isatty},
  {"device_count", gpu_device_count},
  {"device_info", gpu_device_info},
  {"set_device", gpu_set_device},
  {"synchronize", gpu_synchronize},
  {"stats", gpu_stats},
  {"sync_debug", bind_sync_debug},
  {"seed", gpu_seed},
  {"sleep", gpu_sleep},
  {NULL, NULL}
};

int bind_open_gpu(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  int have = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (!have) {
    const char *spec = NULL;
    /* lua -E, gpulua -E, an embedder's ignore_env: gpulua's settings too */
    if (lua_getfield(L, LUA_REGISTRYINDEX, "LUA_NOENV") != LUA_TNIL && lua_toboolean(L, -1))
      env_settings_off();
    lua_pop(L, 1);
    if (lua_getfield(L, LUA_REGISTRYINDEX, GPULUA_REG_DEVICE) == LUA_TSTRING)
      spec = lua_tostring(L, -1);
    /* Push, then acquire: the state exists (released) before the context. */
    bind_newtype(L, &bind_state_type, state_meta, NULL);
    gpu_state *st = bind_new_udata(L, &bind_state_type, sizeof *st, 0);
    st->current = st->dflt = LUA_NOREF;
    st->seed = 0x5EEDULL;
    st->sync_main = -1;
    /* GPULUA_SYNC_DEBUG: the initial mode, for scripts and embedders alike;
     * checked before anything is set up */
    const char *env = env_setting("GPULUA_SYNC_DEBUG");
    if (env && *env) {
      st->sync_base = -1;
      for (int i = 0; bind_sync_modes[i]; i++)
        if (strcmp(env, bind_sync_modes[i]) == 0) st->sync_base = i;
      if (st->sync_base < 0) {
        lua_pop(L, 2);
        return luaL_error(L, "gpu: GPULUA_SYNC_DEBUG='%s' (expected off, warn or error)", env);
      }
    }
    char err[512];
    st->ctx = dev_open(spec, err, sizeof err);
    if (!st->ctx) {
      lua_pop(L, 2);
      return luaL_error(L, "gpu: %s", err);
    }
    lua_rawsetp(L, LUA_REGISTRYINDEX, &state_key);
    lua_pop(L, 1);  /* spec */
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    st->mainL = lua_tothread(L, -1);
    lua_pop(L, 1);
    dev_set_sync_warn(st->ctx, sync_warn, st);
    dev_set_warn(st->ctx, note_warn, st);
    bind_memory_init(st);
    if (st->sync_base == 1) lua_warning(L, "@on", 0);
    bind_sync_apply(L);
    /* thread -> current stream; weak keys so finished coroutines go away */
    lua_newtable(L);
    lua_newtable(L);
    lua_pushstring(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    st->current = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  luaL_newlib(L, gpu_funcs);
  lua_pushstring(L, dev_backend_name(bind_ctx(L)));
  lua_setfield(L, -2, "backend");
  bind_open_stream(L);
  bind_open_event(L);
  bind_open_tensor(L);
  bind_open_kernel(L);
  bind_open_comm(L);
  bind_open_group(L);
  bind_open_task(L);
  bind_open_graph(L);
  bind_open_trace(L);
  bind_open_npy(L);
  bind_open_formats(L);
  bind_open_dlpack(L);
  bind_open_memory(L);
  return 1;
}

struct dev_ctx *bind_dev(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  gpu_state *st = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return st ? st->ctx : NULL;
}

void bind_interrupt(struct dev_ctx *ctx) { dev_interrupt(ctx); }
int bind_interrupt_clear(struct dev_ctx *ctx) { return dev_interrupt_take(ctx); }
void bind_interrupt_enable(struct dev_ctx *ctx, int on) { dev_interrupt_enable(ctx, on); }

const char *bind_backend(struct dev_ctx *ctx, int *device) {
  if (device != NULL)
    *device = dev_current_device(ctx);
  return dev_backend_name(ctx);
}

void bind_job_cleanup(int port, int world) { dev_comm_cleanup(port, world); }

int bind_detached_threads(void) { return dev_detached_threads(); }

int bind_finish(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  gpu_state *st = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!st || !st->ctx) return LUA_OK;
  /* the runtime's own wait, not the script's: never refused or warned */
  dev_sync_policy p = dev_get_sync_policy(st->ctx);
  dev_set_sync_policy(st->ctx, DEV_SYNC_ALLOW);
  dev_set_call(st->ctx, "finishing queued work");   /* for the trace */
  int rc = dev_synchronize(st->ctx);
  dev_set_call(st->ctx, NULL);
  dev_set_sync_policy(st->ctx, p);
  if (rc != DEV_OK) {
    lua_pushstring(L, dev_errmsg(st->ctx));
    return LUA_ERRRUN;
  }
  return LUA_OK;
}
