/* luamod.c — the entry point of gpu.so, the `gpu` bindings as a Lua C module
 * for a stock Lua 5.4 (`LUA_CPATH=<dir>/?.so lua5.4 -e 'local gpu = require
 * "gpu"'`).  gpu.so holds the same objects as libgpulua minus the runtime
 * (interp/runtime.c: a host lua_State is the caller's here) and without a
 * copy of Lua: the Lua API comes from the process that loads it.
 *
 * The bindings' own opener is bindings/gpu.c's luaopen_gpu; in gpu.so the
 * Makefile renames that symbol in a copy of gpu.o to gpulua_luamod_core (it
 * cannot be renamed in the source: libgpulua and the gpulua binary call it by
 * its name), so that the exported luaopen_gpu below also makes the embedded
 * stdlib modules (gpu.test, gpu.pipeline, gpu.trace) require-able, as in
 * gpulua.  Every lua_State that requires gpu gets its own device context. */
#include <lua.h>

#include "stdlib_modules.h"

int gpulua_luamod_core(lua_State *L);   /* bindings/gpu.c's luaopen_gpu, renamed */

int luaopen_gpu(lua_State *L);

int luaopen_gpu(lua_State *L) {
  gpulua_stdlib_preload(L);
  return gpulua_luamod_core(L);
}
