/* The answer to "where are you?" (cuda/where.h): SIGURG sets a one-shot hook
 * on the main Lua state (lua_sethook is safe in a signal handler); at the
 * next Lua instruction the hook writes "is at FILE:LINE" and the traceback to
 * the rank's answer file.  No cost until asked. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lua.h"
#include "../cuda/where.h"
#include "common.h"

static lua_State *main_L;
static dev_ctx *main_ctx;

static void answer(lua_State *L, lua_Debug *unused) {
  (void)unused;
  lua_sethook(L, NULL, 0, 0);
  if (!where_asked()) return;  /* the asker gave up: leave no file behind */
  char path[128], tmp[128];
  where_path(path, sizeof path, (int)getpid(), "");
  where_path(tmp, sizeof tmp, (int)getpid(), ".tmp");
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  lua_Debug ar;
  int found = 0;
  for (int lv = 0; !found && lua_getstack(L, lv, &ar); lv++)
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
      fprintf(f, "is at %s:%d (busy in Lua)\n", ar.short_src, ar.currentline);
      found = 1;
    }
  if (!found) fprintf(f, "is in Lua with no script line\n");
  luaL_traceback(L, L, NULL, 0);
  fprintf(f, "%s\n", lua_tostring(L, -1));
  lua_pop(L, 1);
  fclose(f);
  rename(tmp, path);
}

static void on_signal(int sig) {
  (void)sig;
  where_note_c(main_ctx);
  if (main_L) lua_sethook(main_L, answer, LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

void bind_where_arm(lua_State *L, dev_ctx *ctx) {
  if (main_L) return;
  main_ctx = ctx;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  main_L = lua_tothread(L, -1);
  lua_pop(L, 1);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(WHERE_SIGNAL, &sa, NULL);
}
