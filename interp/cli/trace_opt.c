/* `gpulua --trace FILE` and GPULUA_TRACE=FILE: tracing starts before
 * anything runs and the file is written at exit, after the queued work,
 * also when the script failed.  The work is gpu.trace's (_cli_start and
 * _cli_finish in stdlib/gpu/trace.lua); the module and the path actually
 * written (per rank) are kept in the registry, out of the script's reach. */
#include <stdio.h>

#include <lauxlib.h>

#include "cli.h"

#define TRACE_KEY "gpulua.cli_trace"   /* registry: {module, path, label} */

static int report(lua_State *L, const char *label) {
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "%s: %s: %s\n", cli_progname, label,
          msg ? msg : "(error object is not a string)");
  fflush(stderr);
  lua_pop(L, 1);
  return 1;
}

int cli_trace_start(gpulua *g, const char *path, const char *label) {
  lua_State *L = gpulua_state(g);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "gpu.trace");
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) return report(L, label);
  lua_getfield(L, -1, "_cli_start");
  lua_pushstring(L, path);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    lua_remove(L, -2);
    return report(L, label);
  }
  lua_createtable(L, 3, 0);
  lua_insert(L, -3);             /* t, module, path */
  lua_rawseti(L, -3, 2);
  lua_rawseti(L, -2, 1);
  lua_pushstring(L, label);
  lua_rawseti(L, -2, 3);
  lua_setfield(L, LUA_REGISTRYINDEX, TRACE_KEY);
  return 0;
}

int cli_trace_finish(gpulua *g) {
  lua_State *L = gpulua_state(g);
  if (lua_getfield(L, LUA_REGISTRYINDEX, TRACE_KEY) != LUA_TTABLE) {
    lua_pop(L, 1);
    return 0;
  }
  lua_rawgeti(L, -1, 3);
  const char *label = lua_tostring(L, -1);
  lua_rawgeti(L, -2, 1);
  lua_getfield(L, -1, "_cli_finish");
  lua_rawgeti(L, -4, 2);
  int status = lua_pcall(L, 1, 0, 0);
  if (status != LUA_OK) report(L, label);
  lua_pop(L, 3);
  return status != LUA_OK;
}

void cli_trace_drop(gpulua *g, const char *why) {
  lua_State *L = gpulua_state(g);
  if (lua_getfield(L, LUA_REGISTRYINDEX, TRACE_KEY) == LUA_TTABLE) {
    lua_rawgeti(L, -1, 3);
    lua_rawgeti(L, -2, 2);
    fprintf(stderr, "%s: %s: %s not written (%s)\n", cli_progname, lua_tostring(L, -2),
            lua_tostring(L, -1), why);
    fflush(stderr);
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
}
