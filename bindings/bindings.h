/* What interp/ needs from bindings/: the `gpu` module opener and the hooks the
 * runtime uses around a script.  Internal to gpulua (not installed). */
#ifndef GPULUA_BINDINGS_H
#define GPULUA_BINDINGS_H

#include <lua.h>

/* Registry key of an optional string set before `require "gpu"`: the device
 * spec ("host", "cuda", "cuda:N"); absent means env GPULUA_DEVICE, then auto. */
#define GPULUA_REG_DEVICE "gpulua.device"

/* The `gpu` module: creates this interpreter's device context on first open
 * (kept in the registry) and returns the module table. */
int luaopen_gpu(lua_State *L);

/* gpu.run and gpu.sync_debug as C functions, so the runtime calls them
 * without looking up a global that a script may have replaced. */
int gpulua_bind_run(lua_State *L);
int gpulua_bind_sync_debug(lua_State *L);
/* While suspended, syncs are neither warned about nor refused (the REPL
 * showing a result the person asked for). */
void gpulua_bind_sync_suspend(lua_State *L, int suspend);

/* Finish all queued work of this interpreter's device context (if it was
 * opened).  Returns LUA_OK, or pushes an error message and returns LUA_ERRRUN
 * when queued work failed.  Never raises. */
int gpulua_bind_finish(lua_State *L);

/* This interpreter's device context, NULL while the gpu module is not open:
 * for the CLI (Ctrl-C's dev_interrupt, the REPL's prompt). */
struct dev_ctx *gpulua_bind_dev(lua_State *L);

#endif
