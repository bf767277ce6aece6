/* runtime.c — the embedding API (gpulua.h): one lua_State per instance with
 * the standard libraries, the embedded stdlib modules and the `gpu` module.
 * No static mutable state: everything an instance owns hangs off its handle
 * or its Lua registry. */
#include "gpulua.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

#include "bindings.h"
#include "stdlib_modules.h"

struct gpulua {
  lua_State *L;     /* NULL in the failed state */
  struct dev_ctx *ctx;   /* the gpu module's device context (NULL: failed) */
  volatile sig_atomic_t interruptible;   /* gpulua_interrupt may use ctx (a
                                            signal handler reads it) */
  char *err;        /* owned copy of the last error message, or NULL */
  int err_nomem;    /* the last error could not be copied */
};

/* Fields of options version 1 end here; a caller's size must cover them. */
#define OPTIONS_V1_END (offsetof(gpulua_options, ignore_env) + sizeof(int))

static void set_error(gpulua *g, const char *msg) {
  free(g->err);
  g->err = strdup(msg ? msg : "(no error message)");
  g->err_nomem = (g->err == NULL);
}

/* The error object on top of L as a message (it is always a string from our
 * handler, except for objects raised before the handler ran). */
static const char *top_message(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  return msg ? msg : "(error object is not a string)";
}

/* lua.c's message handler: turn the error object into a string and append a
 * traceback. */
static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Everything that builds the state runs here, in protected mode, so an error
 * (a device that cannot be opened, out of memory) comes back as a status. */
static int setup_state(lua_State *L) {
  const gpulua_options *o = (const gpulua_options *)lua_touserdata(L, 1);
  if (o->ignore_env) {
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  if (o->open_libs)
    luaL_openlibs(L);
  stdlib_preload(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, bind_open_gpu);
  lua_setfield(L, -2, "gpu");
  lua_pop(L, 1);
  if (o->device != NULL) {
    lua_pushstring(L, o->device);
    lua_setfield(L, LUA_REGISTRYINDEX, GPULUA_REG_DEVICE);
  }
  /* Eagerly, so a device that cannot be opened fails gpulua_open. */
  luaL_requiref(L, "gpu", bind_open_gpu, 1);
  return 0;
}

static const char *check_options(const gpulua_options *o) {
  if (o->version < 1 || o->version > GPULUA_OPTIONS_VERSION)
    return "unsupported options version";
  if (o->size < OPTIONS_V1_END || o->size > sizeof(gpulua_options))
    return "unsupported options size";
  return NULL;
}

gpulua *gpulua_open(const gpulua_options *o) {
  gpulua_options opt = GPULUA_OPTIONS_INIT;
  gpulua *g = calloc(1, sizeof *g);
  if (g == NULL)
    return NULL;
  if (o != NULL) {
    const char *why = check_options(o);
    if (why != NULL) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "gpulua_open: %s (size %zu, version %d; this library, gpulua "
               GPULUA_VERSION_STRING ", takes version 1 to %d with size %zu to %zu): "
               "initialise options with GPULUA_OPTIONS_INIT",
               why, o->size, o->version, GPULUA_OPTIONS_VERSION,
               (size_t)OPTIONS_V1_END, sizeof(gpulua_options));
      set_error(g, msg);
      return g;
    }
    /* Fields beyond the caller's size keep their defaults. */
    memcpy(&opt, o, o->size);
  }
  g->L = luaL_newstate();
  if (g->L == NULL) {
    free(g);
    return NULL;
  }
  /* Generational, as lua.c: a loop's temporary tensors die young, and a
   * young collection finds them without marking the whole heap (docs/internals.md,
   * "Memory and the collector"). */
  lua_gc(g->L, LUA_GCGEN, 0, 0);
  lua_pushcfunction(g->L, setup_state);
  lua_pushlightuserdata(g->L, &opt);
  if (lua_pcall(g->L, 1, 0, 0) != LUA_OK) {
    set_error(g, top_message(g->L));
    lua_settop(g->L, 0);
    bind_finish(g->L);
    lua_close(g->L);
    g->L = NULL;
    return g;
  }
  g->ctx = bind_dev(g->L);
  g->interruptible = opt.interruptible != 0 && g->ctx != NULL;
  if (g->interruptible)
    bind_interrupt_enable(g->ctx, 1);
  return g;
}

lua_State *gpulua_state(gpulua *g) {
  return g != NULL ? g->L : NULL;
}

int gpulua_pcall(gpulua *g, int nargs, int nresults) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  lua_State *L = g->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (status != LUA_OK)
    set_error(g, top_message(L));
  return status;
}

/* Run the chunk that a load left on the stack (or record the load error). */
static int run_loaded(gpulua *g, int status) {
  if (status == LUA_OK)
    status = gpulua_pcall(g, 0, 0);
  else
    set_error(g, top_message(g->L));
  if (status != LUA_OK)
    lua_pop(g->L, 1);
  return status;
}

int gpulua_dofile(gpulua *g, const char *path) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  return run_loaded(g, luaL_loadfile(g->L, path));
}

int gpulua_dostring(gpulua *g, const char *chunk, const char *chunkname) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  if (chunk == NULL) {
    set_error(g, "gpulua_dostring: chunk is NULL");
    return LUA_ERRRUN;
  }
  size_t len = strlen(chunk);
  return run_loaded(g, luaL_loadbuffer(g->L, chunk, len, chunkname ? chunkname : chunk));
}

int gpulua_synchronize(gpulua *g) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  int top = lua_gettop(g->L);
  int status = bind_finish(g->L);
  if (status != LUA_OK)
    set_error(g, top_message(g->L));
  lua_settop(g->L, top);
  return status;
}

int gpulua_poll(gpulua *g, double timeout_s) {
  if (g == NULL || g->L == NULL)
    return -1;
  lua_State *L = g->L;
  int top = lua_gettop(L);
  lua_pushcfunction(L, bind_run);
  int nargs = 0;
  if (timeout_s >= 0) {
    lua_pushnumber(L, timeout_s);
    nargs = 1;
  }
  /* no message handler: the traceback of a failed task is in its message
   * already, and below it the caller is the application, not gpu.run */
  int status = lua_pcall(L, nargs, 1, 0);
  int left = status == LUA_OK ? (int)lua_tointeger(L, -1) : -1;
  if (status != LUA_OK) {
    const char *msg = top_message(L);
    lua_pushfstring(L, "%s%s\n\t[C]: in function 'gpulua_poll'", msg,
                    strstr(msg, "\nstack traceback:") ? "" : "\nstack traceback:");
    set_error(g, lua_tostring(L, -1));
  }
  lua_settop(L, top);
  return left;
}

void gpulua_interrupt(gpulua *g) {
  if (g != NULL && g->interruptible)
    bind_interrupt(g->ctx);
}

int gpulua_interrupt_clear(gpulua *g) {
  return g != NULL && g->interruptible ? bind_interrupt_clear(g->ctx) : 0;
}

int gpulua_sync_debug(gpulua *g, const char *mode) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  int top = lua_gettop(g->L);
  lua_pushcfunction(g->L, bind_sync_debug);
  lua_pushstring(g->L, mode != NULL ? mode : "(null)");
  int status = gpulua_pcall(g, 1, 0);
  lua_settop(g->L, top);
  return status;
}

void gpulua_sync_debug_suspend(gpulua *g, int on) {
  if (g != NULL && g->L != NULL && g->ctx != NULL)
    bind_sync_suspend(g->L, on != 0);
}

const char *gpulua_backend(gpulua *g, int *device) {
  if (g == NULL || g->ctx == NULL)
    return NULL;
  return bind_backend(g->ctx, device);
}

void gpulua_job_cleanup(int port, int world) { bind_job_cleanup(port, world); }

const char *gpulua_error(gpulua *g) {
  if (g == NULL)
    return "gpulua: no instance (gpulua_open ran out of memory)";
  if (g->err_nomem)
    return "not enough memory (to copy the error message)";
  return g->err != NULL ? g->err : "";
}

int gpulua_detached_threads(void) { return bind_detached_threads(); }

void gpulua_close(gpulua *g) {
  if (g == NULL)
    return;
  if (g->L != NULL) {
    /* Queued work must finish while the context and its objects still
     * exist; an async error here has nobody left to report to. */
    lua_settop(g->L, 0);
    bind_finish(g->L);
    g->interruptible = 0;   /* the context goes with the state */
    lua_close(g->L);
  }
  free(g->err);
  free(g);
}

/* ---- tensors, streams and kernels of the application --------------------- */

/* Call a binding entry point f(arg [, value at idx]) in protected mode,
 * leaving nres results; errors (argument messages, not tracebacks) go to
 * gpulua_error.  idx 0: no value. */
static int call_entry(gpulua *g, lua_CFunction f, void *arg, int idx, int nres, const char *fname) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  lua_State *L = g->L;
  int top = lua_gettop(L);
  if (idx != 0) {
    if (idx > top || (idx < 0 && -idx > top) || idx <= LUA_REGISTRYINDEX) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s: stack index %d is not valid (the stack has %d values)", fname, idx, top);
      set_error(g, msg);
      return LUA_ERRRUN;
    }
    idx = lua_absindex(L, idx);
  }
  if (!lua_checkstack(L, 3)) {
    set_error(g, "not enough memory (Lua stack)");
    return LUA_ERRMEM;
  }
  lua_pushcfunction(L, f);
  lua_pushlightuserdata(L, arg);
  if (idx != 0)
    lua_pushvalue(L, idx);
  int status = lua_pcall(L, idx != 0 ? 2 : 1, nres, 0);
  if (status != LUA_OK) {
    set_error(g, top_message(L));
    lua_settop(L, top);
  }
  return status;
}

int gpulua_push_tensor(gpulua *g, const gpulua_tensor_info *t,
                       void (*release)(void *ud, void *data), void *ud) {
  embed_wrap w = {t, release, ud, 0, "gpulua_push_tensor"};
  return call_entry(g, embed_push_tensor, &w, 0, 1, "gpulua_push_tensor");
}

int gpulua_push_tensor_ex(gpulua *g, const gpulua_tensor_info *t, unsigned flags,
                          void (*release)(void *ud, void *data), void *ud) {
  embed_wrap w = {t, release, ud, flags, "gpulua_push_tensor_ex"};
  return call_entry(g, embed_push_tensor, &w, 0, 1, "gpulua_push_tensor_ex");
}

int gpulua_check_tensor(gpulua *g, int idx, gpulua_tensor_info *out) {
  if (out == NULL) {
    if (g != NULL && g->L != NULL)
      set_error(g, "gpulua_check_tensor: out is NULL");
    return LUA_ERRRUN;
  }
  return call_entry(g, embed_check_tensor, out, idx, 0, "gpulua_check_tensor");
}

int gpulua_stream_handle(gpulua *g, int idx, void **out) {
  if (out == NULL) {
    if (g != NULL && g->L != NULL)
      set_error(g, "gpulua_stream_handle: out is NULL");
    return LUA_ERRRUN;
  }
  return call_entry(g, embed_stream_handle, out, idx, 0, "gpulua_stream_handle");
}

int gpulua_push_stream(gpulua *g, void *stream) {
  return call_entry(g, embed_push_stream, stream, 0, 1, "gpulua_push_stream");
}

int gpulua_register_kernel(gpulua *g, const char *name, const char *params,
                           gpulua_kernel_fn fn, void *ud) {
  embed_kernel k = {name, params, fn, ud};
  return call_entry(g, embed_register_kernel, &k, 0, 0, "gpulua_register_kernel");
}

/* ---- DLPack ------------------------------------------------------------- */

/* Run f(value at idx or nothing, p, versioned) protected, without a
 * traceback (these are API errors, not script errors), leaving nresults. */
static int dlpack_call(gpulua *g, const char *fname, lua_CFunction f, int idx, void *p, int versioned,
                       int nresults) {
  lua_State *L = g->L;
  if (!lua_checkstack(L, 4)) {
    set_error(g, "not enough Lua stack");
    return LUA_ERRMEM;
  }
  lua_pushcfunction(L, f);
  int nargs = 2;
  if (idx) {
    lua_pushvalue(L, idx);
    nargs = 3;
  }
  lua_pushlightuserdata(L, p);
  lua_pushboolean(L, versioned);
  int status = lua_pcall(L, nargs, nresults, 0);
  if (status != LUA_OK) {
    const char *msg = top_message(L);
    size_t n = strlen(fname) + strlen(msg) + 3;
    char *m = malloc(n);
    if (m != NULL) {
      /* the bindings' import messages name the function already */
      if (strncmp(msg, fname, strlen(fname)) == 0)
        snprintf(m, n, "%s", msg);
      else
        snprintf(m, n, "%s: %s", fname, msg);
    }
    set_error(g, m ? m : msg);
    free(m);
    lua_pop(L, 1);
  }
  return status;
}

/* out: a DLManagedTensor ** or DLManagedTensorVersioned **, already NULLed */
static int to_dlpack(gpulua *g, const char *fname, int idx, void *out, int versioned) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  char msg[128];
  int top = lua_gettop(g->L);
  if (out == NULL || idx == 0 || idx <= LUA_REGISTRYINDEX || idx > top || (idx < 0 && -idx > top)) {
    if (out == NULL)
      snprintf(msg, sizeof msg, "%s: out is NULL", fname);
    else
      snprintf(msg, sizeof msg, "%s: stack index %d is not valid (the stack has %d values)", fname, idx, top);
    set_error(g, msg);
    return LUA_ERRRUN;
  }
  return dlpack_call(g, fname, embed_dlpack_export, lua_absindex(g->L, idx), out, versioned, 0);
}

static int push_dlpack(gpulua *g, const char *fname, void *m, int versioned) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  return dlpack_call(g, fname, embed_dlpack_import, 0, m, versioned, 1);
}

int gpulua_to_dlpack(gpulua *g, int idx, DLManagedTensor **out) {
  if (out != NULL)
    *out = NULL;
  return to_dlpack(g, "gpulua_to_dlpack", idx, out, 0);
}

int gpulua_push_dlpack(gpulua *g, DLManagedTensor *m) {
  return push_dlpack(g, "gpulua_push_dlpack", m, 0);
}

int gpulua_to_dlpack_versioned(gpulua *g, int idx, DLManagedTensorVersioned **out) {
  if (out != NULL)
    *out = NULL;
  return to_dlpack(g, "gpulua_to_dlpack_versioned", idx, out, 1);
}

int gpulua_push_dlpack_versioned(gpulua *g, DLManagedTensorVersioned *m) {
  return push_dlpack(g, "gpulua_push_dlpack_versioned", m, 1);
}

static int push_capsule(gpulua *g, const char *fname, void *m, int versioned) {
  if (g == NULL || g->L == NULL)
    return LUA_ERRRUN;
  return dlpack_call(g, fname, embed_dlpack_capsule, 0, m, versioned, 1);
}

int gpulua_push_dlpack_capsule(gpulua *g, DLManagedTensor *m) {
  return push_capsule(g, "gpulua_push_dlpack_capsule", m, 0);
}

int gpulua_push_dlpack_capsule_versioned(gpulua *g, DLManagedTensorVersioned *m) {
  return push_capsule(g, "gpulua_push_dlpack_capsule_versioned", m, 1);
}
