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
#include <stdint.h>
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

/* ---- DLPack ---------------------------------------------------------------
 *
 * Tensors cross to and from other libraries (PyTorch, CuPy, JAX, ...) as
 * DLPack managed tensors, without copying.  The declarations below follow
 * the published DLPack ABI (dlpack.h 1.x, which keeps the 0.8 layout of the
 * legacy DLManagedTensor); they are skipped when the application included
 * the real dlpack.h first, and the real one is skipped when included after
 * this header (same include guard), so either order compiles.
 *
 * Memory kinds:  "device" tensors are kDLCUDA with device_id = this
 * instance's GPU on the cuda backend; "pinned" are kDLCUDAHost; "host" are
 * kDLCPU.  On the host backend there is no GPU: every tensor, "device" ones
 * included, is exported as kDLCPU (device_id 0), and importing kDLCUDA fails.
 * kDLCUDA imports must be on this instance's GPU; kDLCUDAManaged and other
 * device types are refused.
 *
 * Ordering: the legacy protocol carries no stream.  gpulua_to_dlpack first
 * waits for every queued op that reads or writes the tensor (a counted sync
 * when it has to wait; refused under gpu.nosync), so the consumer may read and
 * write the memory at once, on any stream.  An imported tensor must be ready
 * when it is pushed: the producer has finished writing it.
 *
 * Lifetime and threads: an export keeps the tensor's memory alive (not the
 * Lua object) until the consumer calls its deleter, which it may do from
 * any thread, also after gpulua_close: the memory (and what the device
 * layer needs to free it) outlives the instance until then.  While the
 * instance is open, a deleter called on another thread only queues the
 * release; the owner thread frees the memory at its next allocation or
 * synchronize.  An import owns the managed tensor once the push succeeds:
 * gpulua calls its deleter exactly once, on the thread using the instance
 * (or in gpulua_close), after the last tensor viewing the memory is closed
 * or collected and every op queued on it has finished.
 */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,          /* page-locked host memory (cudaMallocHost) */
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17,
  kDLTrn = 18
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;        /* 0 for host memory of any kind */
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;

/* code is a DLDataTypeCode; gpulua's dtypes all have lanes = 1 */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;               /* base pointer; the first element is at data + byte_offset */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;           /* ndim sizes */
  int64_t *strides;         /* ndim strides in elements; NULL: compact C order */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;        /* the producer's */
  void (*deleter)(struct DLManagedTensor *self);   /* may be NULL */
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif /* DLPACK_DLPACK_H_ */

/* Export the tensor at index idx of gpulua_state(g)'s stack, without
 * copying: *out describes its memory (data + byte_offset, shape, strides in
 * elements, never NULL) and keeps it alive until the consumer calls
 * (*out)->deleter(*out), exactly once, from any thread.  Waits for queued
 * work on the tensor first (see Ordering).  Returns 0, or non-zero with the
 * message in gpulua_error() (not a tensor, a closed tensor, a sync refused by
 * gpu.nosync, out of memory); *out is then NULL.  The stack is unchanged. */
int gpulua_to_dlpack(gpulua *g, int idx, DLManagedTensor **out);

/* Push a tensor viewing m's memory onto gpulua_state(g)'s stack, without
 * copying.  On success (0) the tensor owns m and gpulua calls m->deleter(m)
 * once (see Lifetime); on failure (non-zero, message in gpulua_error(),
 * nothing pushed) the caller still owns m and must call its deleter itself.
 * Refused: m NULL, data NULL, ndim above 8 or negative, a size of 0 or less
 * (gpulua has no empty tensors), lanes other than 1, a dtype gpulua does not
 * have (f32 f64 f16 bf16 i8 u8 i32 i64 bool), a misaligned first element,
 * negative strides or strides that overflow, device types other than those
 * above, kDLCUDA on the host backend or on another GPU, and the same m pushed
 * again while the tensor from the first push is alive. */
int gpulua_push_dlpack(gpulua *g, DLManagedTensor *m);

#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
/* The same for the versioned struct of DLPack 1.x (available when the
 * dlpack.h in use is 1.x, or when this header declared it).  Exports carry
 * version 1.1 and flags 0.  Imports are refused when the major version is
 * not 1 (call the deleter yourself, as the spec says) or the tensor is
 * marked read-only: gpulua tensors are always writable. */
int gpulua_to_dlpack_versioned(gpulua *g, int idx, DLManagedTensorVersioned **out);
int gpulua_push_dlpack_versioned(gpulua *g, DLManagedTensorVersioned *m);
#endif

#ifdef __cplusplus
}
#endif

#endif
