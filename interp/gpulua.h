/* gpulua.h — the public embedding API of gpulua (the only installed header).
 *
 *   gpulua_options o = GPULUA_OPTIONS_INIT;
 *   o.device = "host";                      // or NULL: env GPULUA_DEVICE, else auto
 *   gpulua *g = gpulua_open(&o);
 *   if (gpulua_state(g) == NULL) {          // failed to open (g may be NULL: out of memory)
 *     fprintf(stderr, "%s\n", gpulua_error(g));
 *     gpulua_close(g);
 *     return 1;
 *   }
 *   if (gpulua_dofile(g, "pipeline.lua") != 0)
 *     fprintf(stderr, "%s\n", gpulua_error(g));
 *   gpulua_close(g);
 *
 * Build:  cc -I<gpulua>/interp $(pkg-config --cflags lua5.4) app.c \
 *           <gpulua>/build/libgpulua.a /usr/lib/x86_64-linux-gnu/liblua5.4.a \
 *           -lopenblas -lm -ldl -pthread        (-lopenblas only if make found OpenBLAS;
 *           a CUDA build adds /usr/local/cuda/lib64/libcudart_static.a -lrt -lstdc++)
 *
 * Instances: each gpulua_open() makes an independent interpreter (its own
 * lua_State and device context); several may live in one process and share no
 * state.  One instance must be used by one thread at a time.
 *
 * Errors: no function here exits or aborts the host application.  Failing
 * calls return non-zero and keep a message (with a Lua traceback for runtime
 * errors) readable through gpulua_error() until the next failing call.
 */
#ifndef GPULUA_H
#define GPULUA_H

#include <stddef.h>
#include <lua.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPULUA_VERSION_MAJOR 0
#define GPULUA_VERSION_MINOR 1
#define GPULUA_VERSION_PATCH 0
#define GPULUA_VERSION_STRING "0.1.0"

/* Layout version of gpulua_options.  New fields are only ever appended (and
 * this number raised); a library accepts any older layout it knows, reading
 * the fields that the caller's `size` covers and defaulting the rest. */
#define GPULUA_OPTIONS_VERSION 1

typedef struct gpulua_options {
  size_t size;          /* sizeof(gpulua_options) as the application compiled it */
  int version;          /* GPULUA_OPTIONS_VERSION the application compiled against */
  /* -- version 1 -- */
  const char *device;   /* "host", "cuda", "cuda:N"; NULL = env GPULUA_DEVICE, else
                           cuda if a GPU answers, else host.  Copied during gpulua_open. */
  int open_libs;        /* 1 (default): open the Lua standard libraries.  0: open none;
                           the `gpu` global is still set, and the embedded modules
                           (gpu.test, ...) become require-able once the application
                           opens the package library itself. */
  int ignore_env;       /* 1: the package library ignores LUA_PATH/LUA_CPATH (as `lua -E`).
                           Default 0. */
} gpulua_options;

/* Always initialise options with this (then set fields by name). */
#define GPULUA_OPTIONS_INIT { sizeof(gpulua_options), GPULUA_OPTIONS_VERSION, NULL, 1, 0 }

typedef struct gpulua gpulua;

/* Creates an interpreter: a new lua_State, the standard libraries (per
 * options), the embedded Lua modules in package.preload, and the `gpu` module,
 * loaded eagerly (so the device is opened now) and set as the global `gpu`.
 * o == NULL means defaults (as GPULUA_OPTIONS_INIT).
 *
 * Returns NULL only when out of memory.  If the options have a size or version
 * this library does not accept, or the device cannot be opened, returns a
 * handle in the failed state: gpulua_state() is NULL, gpulua_error() says why,
 * every other call fails harmlessly, and gpulua_close() must still be called. */
gpulua *gpulua_open(const gpulua_options *o);

/* The instance's lua_State, for the ordinary Lua C API; NULL for a failed
 * handle or g == NULL.  Do not lua_close() it: use gpulua_close(). */
lua_State *gpulua_state(gpulua *g);

/* Load and run a file (path NULL = standard input), or a string.  chunkname
 * follows Lua's convention ("=name" shows as name, "@file" as a file name,
 * anything else as [string "..."]); NULL uses the chunk text itself.  Results
 * are discarded.  Returns 0 (LUA_OK) or the LUA_ERR* status of the failure;
 * gpulua_error() then holds the message (runtime errors: with traceback). */
int gpulua_dofile(gpulua *g, const char *path);
int gpulua_dostring(gpulua *g, const char *chunk, const char *chunkname);

/* lua_pcall with gpulua's message handler: calls the function below nargs
 * arguments on the stack of gpulua_state(g).  Like lua_pcall it leaves
 * nresults results, or on error the message (with traceback), on the stack;
 * on error the message is also kept for gpulua_error(). */
int gpulua_pcall(gpulua *g, int nargs, int nresults);

/* Finish all work queued on the device by this instance.  Returns 0, or
 * non-zero when queued work failed (the message in gpulua_error()). */
int gpulua_synchronize(gpulua *g);

/* Run the tasks scripts queued with gpu.task: every task that can run
 * (its gpu.await satisfied) runs until it awaits again or ends, and the call
 * waits at most timeout_s seconds for queued device work to let more run
 * (0: do not wait, return at once; < 0: run until every task is done, as
 * gpu.run()).  Returns the number of unfinished tasks (0: none), or -1 when a
 * task failed and no other task awaited it (its message and traceback in
 * gpulua_error()).  Call it from the application's own loop, on the thread
 * that uses the instance.  The device signals completions; no thread other
 * than the caller ever runs Lua. */
int gpulua_poll(gpulua *g, double timeout_s);

/* The message of the most recent failure on g ("" if none), owned by g and
 * valid until the next call on g.  gpulua_error(NULL) explains a NULL handle
 * (out of memory).  Never returns NULL. */
const char *gpulua_error(gpulua *g);

/* Finishes queued work, releases the interpreter and every device object it
 * holds, and frees the handle.  gpulua_close(NULL) does nothing. */
void gpulua_close(gpulua *g);

#ifdef __cplusplus
}
#endif

#endif
