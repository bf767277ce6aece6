/* Shared by the binding files: per-interpreter state, checkers and pushers for
 * each userdata type, and the conventions for raising device errors. */
#ifndef GPULUA_BIND_COMMON_H
#define GPULUA_BIND_COMMON_H

#include <lauxlib.h>
#include <lua.h>

#include "../cuda/device.h"

/* The types' names: their metatables' registry names and __name, so that
 * errors say "gpu.Stream expected, got ...".  Each has a bind_type below. */
#define GPULUA_STREAM "gpu.Stream"
#define GPULUA_EVENT "gpu.Event"
#define GPULUA_TENSOR "gpu.Tensor"
#define GPULUA_KERNEL "gpu.Kernel"
#define GPULUA_LAUNCHER "gpu.Launcher"     /* k{grid =, block =}: a configured launch */
#define GPULUA_MODULE "gpu.Module"         /* a table: the kernels of a module by name */
#define GPULUA_MODREF "gpu.ModuleRef"      /* holds a module while it is being made */
#define GPULUA_MODFILE "gpu.ModuleFile"    /* a module file being read (gpu.load_module) */
#define GPULUA_TASK "gpu.Task"
#define GPULUA_GRAPH "gpu.Graph"
#define GPULUA_NOSYNC "gpu.NoSync"         /* a gpu.nosync scope */
#define GPULUA_RANGE "gpu.Range"
#define GPULUA_USING "gpu.Using"           /* gpu.using's to-be-closed guard */
#define GPULUA_NPY_FILE "gpu.NpyFile"      /* a .npy file being read (gpu.load) */
#define GPULUA_ST_HEADER "gpu.SafetensorsHeader" /* a parsed header (gpu.load_safetensors) */
#define GPULUA_DLPACK "gpu.DLPack"         /* a DLPack capsule handed to scripts */
#define GPULUA_STATE "gpu.State"           /* the per-interpreter state */
#define GPULUA_GROUP "gpu.Group"           /* a process group (gpu.new_group) */
#define SYNC_WARN_MAX 256                  /* distinct sync warnings shown */
#define NOTE_WARN_MAX 32                   /* distinct other warnings of the device layer shown */

/* Each handle type starts with a tag, the address of its type's bind_type:
 * a userdata of the type's size whose first word is that address is that
 * type.  One load, where luaL_testudata looks the metatable up by name in the
 * registry (three times per enqueued op, a third of the cost of a fill).
 * Only C code makes full userdata, so a script cannot forge a tag; the
 * metatables are still set, for methods and __gc. */
typedef struct bind_type { const char *name; } bind_type;
extern const bind_type bind_stream_type, bind_event_type, bind_tensor_type, bind_kernel_type,
    bind_launcher_type, bind_module_type, bind_modref_type, bind_modfile_type, bind_task_type,
    bind_nosync_type, bind_range_type, bind_using_type, bind_npy_file_type, bind_dlpack_type,
    bind_state_type, bind_graph_type, bind_group_type, bind_st_header_type;

/* One per interpreter, a full userdata anchored in the registry. */
typedef struct gpu_state {
  const bind_type *tag;
  dev_ctx *ctx;
  uint64_t seed, offset;       /* the generator: Philox key and next counter */
  int current;                 /* registry ref: table thread -> current stream (weak keys) */
  /* the main thread's entry of it (NULL: none), read on every op; valid
   * while main_cur_ok, which every write to the table clears */
  struct gpu_stream *main_cur;
  int main_cur_ok;
  int dflt;                    /* registry ref: the default stream's handle */
  lua_State *mainL;            /* for lua_warning from the sync-warning callback */
  int nwarned;                 /* sync warnings shown, each once (by hash) */
  int sync_base;               /* gpu.sync_debug's mode: 0 off, 1 warn, 2 error */
  int sync_main;               /* the main program's innermost gpu.nosync mode, -1 none */
  int sync_suspended;          /* the REPL shows a result: off */
  uint64_t warned[SYNC_WARN_MAX];
  int nnoted;                  /* the device layer's other warnings shown, each once (by hash) */
  uint64_t noted[NOTE_WARN_MAX];
  size_t gc_floor;             /* memory.c: garbage a kind may gather, at least */
  size_t gc_limit[DEV_NMEMKIND];   /* bytes live per kind past which the collector runs */
  size_t gc_young, gc_young_step;  /* bytes allocated since the last collection step, and the step */
  size_t gc_full_ratio;            /* full_is_cheap: tensor bytes per byte of Lua heap (memory.c) */
  size_t gc_since_full;            /* bytes allocated since the last full collection */
  unsigned gc_count, gc_count_step;  /* allocations since then, and the step */
} gpu_state;

typedef struct gpu_stream { const bind_type *tag; dev_stream *s; } gpu_stream;
typedef struct gpu_event { const bind_type *tag; dev_event *e; } gpu_event;
/* view.buf == NULL once closed */
typedef struct gpu_tensor { const bind_type *tag; dev_view v; } gpu_tensor;

/* The handle at idx if it is a ty of size bytes, else NULL. */
static inline void *bind_test_type(lua_State *L, int idx, const bind_type *ty, size_t size) {
  void *p = lua_touserdata(L, idx);
  if (p && lua_type(L, idx) == LUA_TUSERDATA && lua_rawlen(L, idx) == size &&
      *(const bind_type *const *)p == ty)
    return p;
  return NULL;
}
#define bind_test_stream(L, idx) ((gpu_stream *)bind_test_type((L), (idx), &bind_stream_type, sizeof(gpu_stream)))
#define bind_test_event(L, idx) ((gpu_event *)bind_test_type((L), (idx), &bind_event_type, sizeof(gpu_event)))
#define bind_test_tensor_handle(L, idx) \
  ((gpu_tensor *)bind_test_type((L), (idx), &bind_tensor_type, sizeof(gpu_tensor)))
/* The value's type for messages: its metatable's __name (gpu.Stream, FILE*)
 * or the Lua type; pushes at most one value (for use on the way to an error). */
const char *bind_typename(lua_State *L, int idx);
/* As luaL_checkudata: the handle, or a "<type> expected" argument error. */
void *bind_check_type(lua_State *L, int idx, const bind_type *ty, size_t size);

/* Make ty's metatable, as liolib's createmeta: registered under ty->name
 * (luaL_newmetatable, which sets __name), with the metamethods `meta`.  When
 * the type has methods or fields, __index is one C closure: a raw get in the
 * methods table (its upvalue; also the metatable's __methods, which the
 * REPL's completion reads), then, for a key that is no method, the type's
 * field getter, meta's "__index" entry, called with (object, key).  Either
 * may be NULL.  Leaves the stack as it was; a second call for ty does
 * nothing. */
void bind_newtype(lua_State *L, const bind_type *ty, const luaL_Reg *meta, const luaL_Reg *methods);
/* Push a new full userdata of type ty (made by bind_newtype): size bytes,
 * zeroed, the tag set, nuv user values, ty's metatable.  The released state
 * of every handle is all zeros but for what its maker sets next. */
void *bind_new_udata(lua_State *L, const bind_type *ty, size_t size, int nuv);

gpu_state *bind_state(lua_State *L);
static inline dev_ctx *bind_ctx(lua_State *L) { return bind_state(L)->ctx; }

/* Answer a peer's "where are you?" (bindings/where.c); once per process. */
void bind_where_arm(lua_State *L, dev_ctx *ctx);
/* Record the calling script line into ops enqueued next. */
void bind_site(lua_State *L, dev_ctx *ctx);
/* The same from `from` levels up (a library function in Lua between the
 * script and the binding: gpu.fuse's call is 3 up from its run). */
void bind_site_from(lua_State *L, dev_ctx *ctx, int from);
/* bind_site, and name the API call for the sync policy's messages: before
 * every call that may make the host wait for the device (fname static). */
static inline void bind_call_site(lua_State *L, dev_ctx *ctx, const char *fname) {
  bind_site(L, ctx);
  dev_set_call(ctx, fname);
}
/* How a device error is raised, the one way: "<where>fname: <device layer
 * message>", where is the calling script line (found up the stack when a C
 * function such as print called the binding); fname NULL: the message names
 * the call itself.  BIND_CHECK evaluates fname only when call failed, so it
 * may be formatted then (a kernel's name, a collective's message). */
int bind_raise(lua_State *L, dev_ctx *ctx, const char *fname);
#define BIND_CHECK(L, ctx, call, fname) \
  do { if ((call) != DEV_OK) bind_raise((L), (ctx), (fname)); } while (0)

/* Rule for bindings: Lua code (finalizers run by an allocation, metamethods)
 * may close any object.  So raw dev_stream / dev_buf pointers are fetched from
 * their handles after the last Lua allocation and just before the device call;
 * tables are read with raw access. */

/* streams */
/* Argument idx: an open gpu.Stream ("bad argument #2 to 'record' (...)"). */
dev_stream *bind_check_stream(lua_State *L, int idx);
/* The one way to find the stream an op runs on: the stream option's value at
 * idx (a slot of bind_read_opts), checked ("bad option 'stream' (...)");
 * idx 0, none or nil: the current stream (gpu.using's for the running
 * coroutine, else the default stream).  As any raw pointer, fetched after
 * the binding's last Lua allocation. */
dev_stream *bind_stream(lua_State *L, int idx);
void bind_push_stream(lua_State *L, dev_stream *s);   /* retains s */

/* events */
dev_event *bind_check_event(lua_State *L, int idx);
void bind_push_event(lua_State *L, dev_event *e);     /* takes ownership */

/* kernels: a gpu.Kernel handle in the released state (m NULL), for a
 * module made after it is pushed */
typedef struct gpu_kernel_handle { const bind_type *tag; dev_module *m; dev_kernel *k; } gpu_kernel_handle;
gpu_kernel_handle *bind_new_kernel_handle(lua_State *L);

/* tensors */
/* Push a gpu.Tensor in the released state (no buffer): the caller acquires
 * its memory next, so an error in between leaks nothing. */
gpu_tensor *bind_push_tensor_handle(lua_State *L);
gpu_tensor *bind_check_tensor(lua_State *L, int idx);
gpu_tensor *bind_test_tensor(lua_State *L, int idx); /* NULL if not a tensor; raises if closed */
int bind_tensor_save(lua_State *L);   /* t:save(path [, opts]), in npy.c with the .npy writer */
/* A file written whole from pieces, through a temporary renamed over path
 * (npy.c); 0, or -1 with a message in err. */
typedef struct bind_piece { const void *p; size_t n; } bind_piece;
int bind_write_file(const char *path, const bind_piece *pc, int npc, char *err, size_t errlen);
/* Opens a regular file to read, with a to-be-closed handle pushed; raises
 * "fname: ..." when it cannot.  Returns the descriptor. */
int bind_open_read(lua_State *L, const char *path, const char *fname);
/* Reads n bytes at off: 0, or -1 with errno (0 at the end of the file). */
int bind_read_at(int fd, void *p, size_t n, uint64_t off);
/* Pushes a new tensor of kind read from the C-order little-endian elements
 * at off of fd, as gpu.load does (device memory: mapped, or read into
 * pinned memory when it cannot be or map is 0, the copy queued on the
 * stream at slot stream); the caller checked that they lie within the file. */
void bind_load_elements(lua_State *L, int fd, uint64_t off, dev_dtype dt, int ndim, const int64_t *shape,
                        dev_memkind kind, int stream, int map, const char *fname, const char *path);
/* The option map (a boolean, default true) at idx: may device loads map
 * the file (npy.c)?  Raises "bad option 'map' to 'fname'" otherwise. */
int bind_opt_map(lua_State *L, int idx, const char *fname);

/* Options: the table at idx (none or nil: none given), read in one pass
 * with raw access, so no metamethod of the caller's table runs in the middle
 * of a binding.  Its keys must be among names (NULL-ended): a misspelt
 * option raises "unknown option 'x' (expected: a b c)" instead of being
 * ignored.  names[i]'s value is pushed at the returned index + i, nil when
 * absent; read the values there (bind_stream for the stream's). */
int bind_read_opts(lua_State *L, int idx, const char *const *names);
/* bind_read_opts for the ops whose only option is the stream: its slot. */
int bind_read_stream_opt(lua_State *L, int idx);
/* As luaL_checkoption, for the option `field`'s value at idx: the index of
 * its name in names (NULL-ended), def when the value is nil (def -1: a value
 * is required); else "bad option 'field' (expected \"a\", \"b\" or \"c\",
 * got x)".  def is an index, not a name: the collectives' op is read on
 * every call. */
int bind_check_option(lua_State *L, int idx, const char *field, int def, const char *const *names);

/* The string at idx as a name: NULL when it holds a zero byte; how a bad
 * name is shown ("f32\0..."). */
const char *bind_name_at(lua_State *L, int idx);
const char *bind_shown_name(lua_State *L, int idx);
/* A string at idx for C: raises (argument idx) when it holds a zero byte,
 * which the C string would cut short; NULL for a value of another type. */
const char *bind_check_cstring(lua_State *L, int idx);
/* A field's key at idx (__index): one with a zero byte names no field. */
const char *bind_check_key(lua_State *L, int idx);
/* Push names (NULL-ended) for a message: "a b c", or quoted,
 * "\"a\", \"b\" or \"c\"". */
const char *bind_push_names(lua_State *L, const char *const *names, int quoted);
/* gpu.sync_debug's and gpu.nosync's modes, in the order of gpu_state's
 * sync_base: "off", "warn", "error" (gpu.c). */
extern const char *const bind_sync_modes[];
/* Push the table thread -> current stream to change it: every write goes
 * through here, which forgets the main thread's remembered entry. */
void bind_push_current_table(lua_State *L);

int bind_open_stream(lua_State *L);   /* each adds its constructors to the table on top */
int bind_open_event(lua_State *L);
int bind_open_tensor(lua_State *L);
int bind_open_kernel(lua_State *L);
int bind_open_comm(lua_State *L);
int bind_open_task(lua_State *L);
int bind_open_graph(lua_State *L);   /* gpu.graph (graph.c) */
/* The gpu.nosync mode slot (-1: none) of the running task, or of the main
 * program outside tasks (task.c). */
int *bind_sync_slot(lua_State *L);
/* Set the device layer's sync policy from the mode in force for L, or for
 * a task whose nosync slot is `slot` (about to be resumed). */
void bind_sync_apply(lua_State *L);
void bind_sync_apply_slot(lua_State *L, int slot);
int bind_open_trace(lua_State *L);    /* gpu.trace, gpu.range */
int bind_open_npy(lua_State *L);      /* gpu.load (.npy files) */
int bind_open_formats(lua_State *L);  /* gpu.load_safetensors, gpu.save_safetensors */
int bind_open_dlpack(lua_State *L);   /* gpu.from_dlpack */
int bind_open_memory(lua_State *L);   /* gpu.memory, gpu.empty_cache, gpu.reset_peak_memory */
void bind_memory_init(gpu_state *st); /* once the context is open */
/* Memory for a new tensor, made for the stream option's value at index
 * stream (0: the current stream).  Keeps Lua's collector in step with the
 * memory tensors hold; out of memory, collects, waits for the work that
 * still uses freed memory and retries, then raises "<fname>: out of memory
 * ..." with the figures.  May run finalizers: fetch raw pointers after it. */
dev_buf *bind_alloc(lua_State *L, dev_memkind kind, size_t bytes, int stream, const char *fname);
void bind_memory_closed(lua_State *L, size_t bytes);
/* After a device call failed with DEV_ERR_NOMEM for memory of this kind
 * (bytes wanted): a full collection and dev_mem_reclaim, so that one retry
 * can succeed; DEV_OK, or the reclaim's error (message in the context). */
int bind_reclaim(lua_State *L, dev_memkind kind, size_t bytes);
/* ranks in the job: the joined communicator's, else the environment's */
int bind_ctx_world(lua_State *L);
/* Join the job (comm.c), the communicator deferred as for a collective. */
void bind_join(lua_State *L, const char *fname);
int bind_open_group(lua_State *L);    /* gpu.new_group, gpu.split_group (group.c) */
/* The group option's value at idx for collective fname: NULL for nil (the
 * world); raises on a closed group and on a group this rank is not in. */
dev_group *bind_opt_group(lua_State *L, int idx, const char *fname);

#endif
