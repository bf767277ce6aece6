/* luamod.c — the entry point of gpu.so, the `gpu` bindings as a Lua C module
 * for a stock Lua 5.4 (`LUA_CPATH=<dir>/?.so lua5.4 -e 'local gpu = require
 * "gpu"'`).  gpu.so holds the same objects as libgpulua minus the runtime
 * (interp/lib/runtime.c: a host lua_State is the caller's here) and without a
 * copy of Lua: the Lua API comes from the process that loads it.
 *
 * luaopen_gpu below is the module's only export: it opens the bindings
 * (bind_open_gpu, bindings/gpu.c) and also makes the embedded stdlib modules
 * (gpu.test, gpu.pipeline, gpu.trace) require-able, as in gpulua.  Every lua_State that requires gpu gets its own device context.
 *
 * At lua_close the queued work is finished (gpulua does that before its own
 * exit), and an asynchronous error it left (an integer division by zero in a
 * queued op) is reported: "gpu: <message>" on stderr, since a finalizer
 * cannot raise to anyone.  lua.c decides its exit status before lua_close,
 * so the error also turns the process's exit status 0, when it comes, into 1
 * (glibc's on_exit sees the status; other statuses stay).  For that gpu.so
 * stays loaded to the end of the process once it has reported an error.
 * os.exit, which closes nothing unless asked to, is replaced when gpu is
 * first required in a state (the only time gpu.so runs there): it finishes
 * and reports the same way first, then calls the os.exit it replaced. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

#include "bindings.h"
#include "stdlib_modules.h"

int luaopen_gpu(lua_State *L);

/* registry[&closer]: the userdata whose __gc finishes the queued work */
static const char closer = 0;

#ifdef __GLIBC__
static atomic_flag status_hooked = ATOMIC_FLAG_INIT;

/* At exit: an error was reported, so a status of 0 becomes 1.  _exit is
 * the only way to change it: stdio is flushed first, and the exit handlers
 * registered before this one do not run. */
static void exit_failed(int status, void *ud) {
  (void)ud;
  if (status == 0) {
    fflush(NULL);
    _exit(EXIT_FAILURE);
  }
}

/* Once per process: the handler, and gpu.so kept loaded for it (lua_close
 * unloads the C modules it loaded after their finalizers). */
static void hook_exit_status(void) {
  if (atomic_flag_test_and_set(&status_hooked))
    return;
  Dl_info self;
  if (dladdr((const void *)&closer, &self) == 0 || self.dli_fname == NULL ||
      dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == NULL)
    return;
  on_exit(exit_failed, NULL);
}
#else
static void hook_exit_status(void) {}
#endif

/* Finishes the queued work of L's gpu state and reports what failed in it
 * on stderr.  0, or -1 when something failed. */
static int finish_report(lua_State *L) {
  if (bind_finish(L) == LUA_OK)
    return 0;
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "gpu: %s\n", msg != NULL ? msg : "an error in queued work");
  fflush(stderr);
  lua_pop(L, 1);
  return -1;
}

/* __gc of the closer, which lua_close runs before the gpu state's own
 * (finalizers run in the reverse order of their marking): finish the
 * queued work while the context is open, and report what failed in it. */
static int closer_gc(lua_State *L) {
  if (finish_report(L) != 0)
    hook_exit_status();
  return 0;
}

/* os.exit([code [, close]]) once gpu is required: the os.exit it replaces
 * (upvalue 1), after the queued work is finished as at lua_close; a failure
 * in it is reported and turns a status of success into 1.  lua.c's
 * os.exit(code) does not close the state (nor, then, run closer_gc). */
static int gpu_os_exit(lua_State *L) {
  int success = lua_isboolean(L, 1) ? lua_toboolean(L, 1)
                                    : luaL_optinteger(L, 1, EXIT_SUCCESS) == EXIT_SUCCESS;
  if (lua_gettop(L) < 1)
    lua_settop(L, 1);
  if (finish_report(L) != 0 && success) {
    lua_pushinteger(L, EXIT_FAILURE);
    lua_replace(L, 1);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* Puts gpu_os_exit in the place of the os library's exit, if loaded. */
static void wrap_os_exit(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, "os") == LUA_TTABLE && lua_getfield(L, -1, "exit") == LUA_TFUNCTION) {
    lua_pushcclosure(L, gpu_os_exit, 1);
    lua_setfield(L, -2, "exit");
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
}

int luaopen_gpu(lua_State *L) {
  stdlib_preload(L);
  int n = bind_open_gpu(L);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &closer) == LUA_TNIL) {
    lua_newuserdatauv(L, 1, 0);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, closer_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &closer);
    wrap_os_exit(L);
  }
  lua_pop(L, 1);
  return n;
}
