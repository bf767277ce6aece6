/* What interp/ needs from bindings/: the `gpu` module opener and the hooks the
 * runtime uses around a script.  Internal to gpulua (not installed). */
#ifndef GPULUA_BINDINGS_H
#define GPULUA_BINDINGS_H

#include <lua.h>

#include "gpulua.h"

/* Registry key of an optional string set before `require "gpu"`: the device
 * spec ("host", "cuda", "cuda:N"); absent means env GPULUA_DEVICE, then auto. */
#define GPULUA_REG_DEVICE "gpulua.device"

/* The `gpu` module's opener (a lua_CFunction for luaL_requiref): creates
 * this interpreter's device context on first open (kept in the registry) and
 * returns the module table.  The library's runtime (interp/lib/runtime.c)
 * and gpu.so's luaopen_gpu (interp/module/luamod.c) both call it. */
int bind_open_gpu(lua_State *L);

/* gpu.run and gpu.sync_debug as C functions, so the runtime calls them
 * without looking up a global that a script may have replaced. */
int bind_run(lua_State *L);
int bind_sync_debug(lua_State *L);
/* While suspended, syncs are neither warned about nor refused (the REPL
 * showing a result the person asked for). */
void bind_sync_suspend(lua_State *L, int suspend);

/* Finish all queued work of this interpreter's device context (if it was
 * opened).  Returns LUA_OK, or pushes an error message and returns LUA_ERRRUN
 * when queued work failed.  Never raises. */
int bind_finish(lua_State *L);
/* gpulua_detached_threads: dev_detached_threads (cuda/device.h). */
int bind_detached_threads(void);

/* The embedding API's entry points (embed.c): lua_CFunctions the runtime
 * calls in protected mode; argument 1 is a light userdata as each says. */
typedef struct embed_wrap {
  const gpulua_tensor_info *t;
  void (*release)(void *ud, void *data);
  void *ud;
  unsigned flags;      /* GPULUA_PUSH_* */
  const char *fn;      /* the public function's name, for messages */
} embed_wrap;
typedef struct embed_kernel {
  const char *name, *params;
  gpulua_kernel_fn fn;
  void *ud;
} embed_kernel;
int embed_push_tensor(lua_State *L);      /* (wrap) -> tensor */
int embed_check_tensor(lua_State *L);     /* (gpulua_tensor_info *out, value) */
int embed_stream_handle(lua_State *L);    /* (void **out [, stream]) */
int embed_push_stream(lua_State *L);      /* (native or NULL) -> stream */
int embed_register_kernel(lua_State *L);  /* (kernel) */

/* DLPack (bindings/dlpack.c), for the runtime's protected calls behind
 * gpulua_to_dlpack / gpulua_push_dlpack (gpulua.h).  export: (tensor, out,
 * versioned) with out a light userdata DLManagedTensor ** (or
 * DLManagedTensorVersioned **), set on success; import: (m, versioned), m a
 * light userdata, pushes the tensor and owns m on success only. */
int embed_dlpack_export(lua_State *L);
int embed_dlpack_import(lua_State *L);
/* (m, versioned) -> a gpu.DLPack capsule owning m (on success only) */
int embed_dlpack_capsule(lua_State *L);

/* This interpreter's device context, NULL while the gpu module is not open:
 * the runtime keeps it for the calls below, which take it as it is. */
struct dev_ctx *bind_dev(lua_State *L);
/* gpulua_interrupt (async-signal-safe) and gpulua_interrupt_clear. */
void bind_interrupt(struct dev_ctx *ctx);
int bind_interrupt_clear(struct dev_ctx *ctx);
void bind_interrupt_enable(struct dev_ctx *ctx, int on);
/* The backend's name, and its device number in *device. */
const char *bind_backend(struct dev_ctx *ctx, int *device);
/* gpulua_job_cleanup */
void bind_job_cleanup(int port, int world);

#endif
