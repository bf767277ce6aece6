/* twostates — two lua_States of one process each `require "gpu"` from gpu.so
 * (tests/luamod.lua runs it): the module is loaded once by the dynamic
 * linker, and each state gets its own device context.  The first state is
 * closed with work still queued while the second goes on.
 *
 *   twostates 'DIR/?.so'     (a package.cpath for gpu.so)
 *
 * Prints one line per step; exit status 0 when all pass. */
#include <stdio.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

static lua_State *open_state(const char *cpath) {
  lua_State *L = luaL_newstate();
  if (L == NULL) return NULL;
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_pushstring(L, cpath);
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  return L;
}

static int run(lua_State *L, const char *what, const char *chunk) {
  if (luaL_dostring(L, chunk) != LUA_OK) {
    printf("not ok: %s: %s\n", what, lua_tostring(L, -1));
    lua_pop(L, 1);
    return 1;
  }
  printf("ok: %s\n", what);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: twostates 'DIR/?.so'\n");
    return 2;
  }
  lua_State *a = open_state(argv[1]), *b = open_state(argv[1]);
  if (a == NULL || b == NULL) return 1;
  int bad = 0;
  bad |= run(a, "state a requires gpu",
             "gpu = require 'gpu'; s = gpu.stream(); x = gpu.full({1000}, 2);"
             "assert(package.loaded['gpu.test'] == nil)");
  bad |= run(b, "state b requires gpu",
             "gpu = require 'gpu'; x = gpu.full({1000}, 3)");
  bad |= run(a, "the states have separate tensors and contexts",
             "assert(x:sum():item() == 2000, 'a sum'); assert(gpu.memory().allocated > 0)");
  bad |= run(b, "state b sees its own values",
             "assert(x:sum():item() == 3000, 'b sum'); assert(gpu.stats().streams == 0, 'a stream of a in b')");
  bad |= run(a, "state a queues work and is closed with it queued",
             "gpu.sleep(50, {stream = s}); y = x:add(1, {stream = s})");
  lua_close(a);
  bad |= run(b, "state b goes on after a is closed",
             "local T = require 'gpu.test'; assert(type(T.is) == 'function');"
             "x:mul_(2); assert(x:sum():item() == 6000, 'b after'); gpu.synchronize()");
  lua_close(b);
  printf("%s\n", bad ? "twostates: FAILED" : "twostates: all ok");
  return bad;
}
