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
 * Build, after `make install PREFIX=...` (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig):
 *   cc app.c $(pkg-config --cflags --libs gpulua)      (libgpulua.so, liblua5.4.so)
 * or with gpulua and Lua inside the binary:
 *   cc app.c $(pkg-config --static --cflags gpulua) -Wl,-Bstatic $(pkg-config --libs gpulua) \
 *      -Wl,-Bdynamic -Wl,--as-needed $(pkg-config --static --libs gpulua)
 *
 * Instances and threads: each gpulua_open() makes an independent interpreter
 * (its own lua_State and device context); several may live in one process and
 * share no state, so different instances may be used from different threads
 * at once.  One instance must be used by one thread at a time (every call
 * taking g, and the Lua C API on gpulua_state(g)); gpulua_error(NULL) and
 * the GPULUA_* constants are the only things usable from any thread.  Calls
 * made back into the application: push_tensor's release callback runs on
 * the thread using the instance, inside a gpulua call; a registered kernel
 * function runs on that thread on cuda, and on a stream's worker thread on
 * the host backend (so it must not touch the lua_State or call gpulua_*).
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
#define GPULUA_VERSION_MINOR 3
#define GPULUA_VERSION_PATCH 0
#define GPULUA_VERSION_STRING "0.3.0"

/* Layout version of gpulua_options.  New fields are only ever appended (and
 * this number raised); a library accepts any older layout it knows, reading
 * the fields that the caller's `size` covers and defaulting the rest. */
#define GPULUA_OPTIONS_VERSION 2

typedef struct gpulua_options {
  size_t size;          /* sizeof(gpulua_options) as the application compiled it */
  int version;          /* GPULUA_OPTIONS_VERSION the application compiled against */
  /* -- version 1 -- */
  const char *device;   /* "host", "cuda", "cuda:N", "auto"; NULL = env GPULUA_DEVICE, else
                           cuda if a GPU answers, else host.  Copied during gpulua_open. */
  int open_libs;        /* 1 (default): open the Lua standard libraries.  0: open none;
                           the `gpu` global is still set, and the embedded modules
                           (gpu.test, ...) become require-able once the application
                           opens the package library itself. */
  int ignore_env;       /* 1: the package library ignores LUA_PATH/LUA_CPATH (as `lua -E`),
                           and gpulua ignores its GPULUA_* settings, process-wide from then on.
                           Default 0. */
  /* -- version 2 -- */
  int interruptible;    /* 1: waits for the device give up on gpulua_interrupt (Ctrl-C).
                           Default 0: an interruptible wait polls on cuda where a plain
                           one blocks, so only an application that interrupts asks. */
} gpulua_options;

/* Always initialise options with this (then set fields by name). */
#define GPULUA_OPTIONS_INIT { sizeof(gpulua_options), GPULUA_OPTIONS_VERSION, NULL, 1, 0, 0 }

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
 * gpulua_error(), its last line "[C]: in function 'gpulua_poll'").  Call it
 * from the application's own loop, on the thread
 * that uses the instance.  The device signals completions; no thread other
 * than the caller ever runs Lua. */
int gpulua_poll(gpulua *g, double timeout_s);

/* ---- tensors over the application's memory ------------------------------ */

typedef enum gpulua_dtype {
  GPULUA_F32, GPULUA_F64, GPULUA_F16, GPULUA_BF16, GPULUA_I8, GPULUA_U8, GPULUA_I32,
  GPULUA_I64, GPULUA_BOOL
} gpulua_dtype;

/* Where the memory is: device memory (on the host backend, ordinary memory),
 * pinned (page-locked) host memory, or ordinary pageable host memory. */
typedef enum gpulua_memory { GPULUA_MEM_DEVICE, GPULUA_MEM_PINNED, GPULUA_MEM_HOST } gpulua_memory;

#define GPULUA_MAXDIM 8

typedef struct gpulua_tensor_info {
  void *data;                        /* the first element */
  gpulua_dtype dtype;
  gpulua_memory memory;
  int device;                        /* out: the CUDA device of the memory; -1 on the host backend */
  int ndim;                          /* 0 (one element) to GPULUA_MAXDIM */
  int64_t shape[GPULUA_MAXDIM];      /* each >= 1 */
  int64_t strides[GPULUA_MAXDIM];    /* in elements, each >= 0 */
  int strided;                       /* push: 0 = C order (strides ignored), 1 = strides as given;
                                        gpulua_check_tensor sets 1 */
} gpulua_tensor_info;

/* Pushes a gpu.Tensor onto gpulua_state(g)'s stack that uses the
 * application's memory t->data in place (no copy).  gpulua never frees it:
 * once the tensor and every view of it are gone and the work queued on them
 * has finished, release(ud, data) is called once (release may be NULL), on
 * the thread that uses g, during a later gpulua call on g (at the latest in
 * gpulua_close).  The application keeps the memory valid until then.  One
 * exception: when the tensor (or a view) was exported with gpulua_to_dlpack,
 * the memory also lives until the consumer calls that export's deleter, and
 * if that happens after gpulua_close, release runs then, on the deleter's
 * thread.
 *
 * On the cuda backend the memory must be what t->memory says (checked with
 * cudaPointerGetAttributes: device memory of this instance's GPU, pinned
 * memory, or pageable memory).  Returns 0, or non-zero with nothing pushed,
 * release not called and the message in gpulua_error() (NULL data, a shape
 * or stride out of range, a misaligned pointer, memory of another kind).
 *
 * Copies between pushed pageable memory (GPULUA_MEM_HOST) and the device
 * block, as cudaMemcpy does: when the script's copy call returns, the copy
 * is done (a counted host-device sync), so the application may touch its
 * memory whenever no gpulua call is running.  gpulua's own pageable tensors
 * are copied asynchronously instead (staged through pinned memory, queued
 * on the stream, behind the host-access fence); gpulua_push_tensor_ex with
 * GPULUA_PUSH_GUARDED gives pushed memory the same. */
int gpulua_push_tensor(gpulua *g, const gpulua_tensor_info *t,
                       void (*release)(void *ud, void *data), void *ud);

/* Flags of gpulua_push_tensor_ex (bits; others are refused). */
#define GPULUA_PUSH_GUARDED 1u   /* the memory is gpulua's to guard (below) */

/* gpulua_push_tensor with flags (0: the same as gpulua_push_tensor).
 *
 * GPULUA_PUSH_GUARDED: while queued work may use the memory, only gpulua
 * touches it.  Copies between it and the device are then asynchronous, as
 * for gpulua's own pageable tensors: queued on their stream, and not a sync;
 * the script's own accesses (item, get, totable, host ops, save) wait for
 * exactly the queued work that uses the memory.  The application reads or
 * writes it only once that work is done: after gpulua_synchronize(g), after
 * the release callback, or once a script has read the tensor or waited for
 * the stream that used it (an event, s:synchronize()).  For device and
 * pinned memory, whose copies are asynchronous anyway, the flag changes
 * nothing. */
int gpulua_push_tensor_ex(gpulua *g, const gpulua_tensor_info *t, unsigned flags,
                          void (*release)(void *ud, void *data), void *ud);

/* Describes the tensor at stack index idx (pointer to its first element,
 * dtype, memory, device, shape, strides) in *out.  Returns 0, or non-zero
 * when the value is not an open gpu.Tensor.  The memory may still be in use
 * by queued work: finish it (gpulua_synchronize) or order the application's
 * work after it on gpulua_stream_handle's stream before touching it. */
int gpulua_check_tensor(gpulua *g, int idx, gpulua_tensor_info *out);

/* ---- streams --------------------------------------------------------------- */

/* *out = the cudaStream_t of the gpu.Stream at stack index idx (idx 0: the
 * current stream of the main program, gpu.current_stream()); the default
 * stream is cudaStreamLegacy.  On the host backend *out = NULL.  Returns 0,
 * or non-zero when the value is not an open gpu.Stream. */
int gpulua_stream_handle(gpulua *g, int idx, void **out);

/* Pushes a gpu.Stream that enqueues on the application's cudaStream_t
 * `stream` (created by the application on this instance's GPU; gpulua
 * never destroys it, and it must stay valid until gpulua_close(g)).  Work
 * the application puts on that stream itself is ordered with gpulua's as
 * CUDA orders it; gpulua's race checker does not see it.  stream == NULL
 * pushes the default stream, on both backends (CUDA's NULL stream is the
 * legacy default stream, as gpulua's is).  The host backend has no CUDA
 * streams: any other handle fails there. */
int gpulua_push_stream(gpulua *g, void *stream);

/* ---- C functions as kernels ------------------------------------------------ */

typedef struct gpulua_kernel_call {
  const char *name;
  unsigned grid[3], block[3];   /* the launch configuration, as given */
  size_t shared;
  int nargs;
  void **args;      /* args[i] points to parameter i's value, typed as declared (a tensor: its
                       data pointer): the array cudaLaunchKernel takes */
  void *stream;     /* cuda: the cudaStream_t to enqueue on; host backend: NULL */
  void *ud;
  char *err;        /* on failure, write a message here (errlen bytes) and return non-zero */
  size_t errlen;
} gpulua_kernel_call;

typedef int (*gpulua_kernel_fn)(const gpulua_kernel_call *call);

/* Registers fn as the kernel gpu.kernels[name], launched from Lua as any
 * run-time kernel: gpu.kernels.scale{grid = g, block = b}(x, 2.0, n).
 * params declares its parameters in C ("float *x, float a, int n"; a
 * pointer to const only reads its tensor): arguments are checked against
 * them and, with the race checker on, ordered by them.
 *
 *   host backend: fn runs on the stream's worker thread, in stream order
 *     after the work before it, with call->stream NULL; it computes with
 *     the pointers (grid and block are for it to interpret).
 *   cuda: fn runs on the calling thread when the launch is enqueued, with
 *     call->stream the stream; it enqueues its work there (its own kernel
 *     through cudaLaunchKernel or <<<>>>, a library call, a copy) and must
 *     not wait for it.
 *
 * A non-zero return is a failed launch: on cuda a Lua error at the launch's
 * script line; on the host backend an asynchronous error naming the kernel
 * and line, raised at the next sync, as for any queued op.  ud is passed
 * as call->ud; it must stay valid until gpulua_close(g).  Returns 0, or
 * non-zero (a name that is not a C identifier or is taken, params that do
 * not parse or have a type Lua cannot pass, fn NULL). */
int gpulua_register_kernel(gpulua *g, const char *name, const char *params,
                           gpulua_kernel_fn fn, void *ud);

/* The message of the most recent failure on g ("" if none), owned by g and
 * valid until the next call on g.  gpulua_error(NULL) explains a NULL handle
 * (out of memory).  Never returns NULL. */
const char *gpulua_error(gpulua *g);

/* Finishes queued work, releases the interpreter and every device object it
 * holds, and frees the handle.  gpulua_close(NULL) does nothing. */
void gpulua_close(gpulua *g);

/* The threads of gpulua still running work that a script gave up on, even
 * after gpulua_close: a collective communicator's creation that timed out
 * (NCCL's cannot be stopped).  While it is not 0, end the process with
 * _exit() (after fflush), not exit() or a return from main: exit's
 * handlers tear down the CUDA runtime under such a thread, which then
 * crashes.  The gpulua program does so. */
int gpulua_detached_threads(void);

/* ---- interrupts, sync policy, the device ---------------------------------
 *
 * What an interactive front end (gpulua's own REPL, a notebook kernel)
 * needs beyond running chunks. */

/* Makes the wait for the device in progress, or the next one, give up: the
 * waiting call (t:item(), gpu.synchronize(), gpulua_synchronize, ...) fails
 * with the message "interrupted", while the queued work runs on and
 * finishes as usual.  Only on an instance opened with interruptible = 1;
 * otherwise it does nothing.  Async-signal-safe: meant for a SIGINT
 * handler, which stops Lua code itself the way lua.c does (lua_sethook on
 * gpulua_state(g), read before the signal came).  g may be a failed handle. */
void gpulua_interrupt(gpulua *g);

/* Takes an interrupt no wait has taken: returns 1 if one was pending, else
 * 0.  For a handler whose Lua hook stopped the script first, or to drop a
 * stale interrupt once the interrupted call has returned. */
int gpulua_interrupt_clear(gpulua *g);

/* What a host-device sync (t:item(), gpu.synchronize(), ...) does, as
 * gpu.sync_debug(mode): "off", "warn" (a warning naming the call and the
 * script line) or "error".  Returns 0, or non-zero for another mode (the
 * message in gpulua_error()). */
int gpulua_sync_debug(gpulua *g, const char *mode);

/* While suspended (on = 1), syncs are counted but neither warned about nor
 * refused: a front end showing a result the user asked for.  on = 0 ends it. */
void gpulua_sync_debug_suspend(gpulua *g, int on);

/* The backend this instance opened ("host" or "cuda") and, in *device when
 * device is not NULL, its device number; NULL for a failed handle. */
const char *gpulua_backend(gpulua *g, int *device);

/* For a launcher of ranks (the script's processes of a job, each an
 * instance: docs/cli.md, "Ranks"), once every rank has exited: removes what a
 * job of `world` ranks meeting at `port` may have left on this node (a rank
 * killed while the ranks were meeting leaves shared memory behind). */
void gpulua_job_cleanup(int port, int world);

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
 * or collected and every op queued on it has finished; except when that
 * tensor was itself exported again: then the import's deleter runs when the
 * re-export's deleter does, on that thread, possibly after gpulua_close.
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
 * again while gpulua still holds the memory of the first push. */
int gpulua_push_dlpack(gpulua *g, DLManagedTensor *m);

/* For a script to import: push a gpu.DLPack capsule that owns m (on success;
 * on failure the caller keeps it).  gpu.from_dlpack(capsule) in a script
 * makes the tensor, which then owns m; a capsule is used once, and one that
 * is never used calls m->deleter(m) when it is collected.  A script cannot
 * make or reuse a capsule, so a stale pointer never reaches gpulua. */
int gpulua_push_dlpack_capsule(gpulua *g, DLManagedTensor *m);

#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
/* The same for the versioned struct of DLPack 1.x (available when the
 * dlpack.h in use is 1.x, or when this header declared it).  Exports carry
 * version 1.1 and flags 0.  Imports are refused when the major version is
 * not 1 (call the deleter yourself, as the spec says) or the tensor is
 * marked read-only: gpulua tensors are always writable. */
int gpulua_to_dlpack_versioned(gpulua *g, int idx, DLManagedTensorVersioned **out);
int gpulua_push_dlpack_versioned(gpulua *g, DLManagedTensorVersioned *m);
int gpulua_push_dlpack_capsule_versioned(gpulua *g, DLManagedTensorVersioned *m);
#endif

#ifdef __cplusplus
}
#endif

#endif
