/* gpulua device layer: the backend-neutral API between bindings/ and a backend.
 *
 * Nothing here knows about Lua.  Every function is called from the thread that
 * owns the dev_ctx (the interpreter thread); backends may run work on their own
 * threads (host backend workers, CUDA driver threads) but never call back into
 * the caller except through the status codes and queues defined here.
 *
 * Errors: functions return DEV_OK (0) or a dev_status; the message of the last
 * failure on a context is dev_errmsg(ctx).  Nothing here exits, aborts or prints.
 */
#ifndef GPULUA_DEVICE_H
#define GPULUA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

#define DEV_MAXDIM 8
#define DEV_SITE_LEN 80   /* "script.lua:12" of the op that enqueued work */

typedef enum {
  DEV_F32, DEV_F64, DEV_F16, DEV_BF16, DEV_I8, DEV_U8, DEV_I32, DEV_I64, DEV_BOOL,
  DEV_NDTYPE
} dev_dtype;

typedef enum { DEV_MEM_DEVICE, DEV_MEM_PINNED, DEV_MEM_HOST } dev_memkind;
#define DEV_NMEMKIND 3

typedef enum {
  DEV_OK = 0,
  DEV_ERR_INVALID,      /* bad argument reached the device layer */
  DEV_ERR_NOMEM,        /* allocation failed (device, pinned or host) */
  DEV_ERR_UNSUPPORTED,  /* op/dtype/backend combination not available */
  DEV_ERR_DEVICE,       /* the backend failed (driver/library text in the message) */
  DEV_ERR_ASYNC,        /* earlier queued work failed; message names op and site */
  DEV_ERR_SYNC,         /* a sync refused by the sync policy (gpu.nosync) */
  DEV_ERR_RACE,         /* the race checker refused an op: nothing was enqueued */
  DEV_ERR_INTERRUPTED,  /* dev_interrupt: the host gave up waiting; the work runs on */
  DEV_ERR_CAPTURE       /* cannot be captured into a graph (a sync, a stream outside it ...) */
} dev_status;

typedef struct dev_ctx dev_ctx;
typedef struct dev_stream dev_stream;
typedef struct dev_event dev_event;
typedef struct dev_buf dev_buf;
typedef struct dev_graph dev_graph;

/* ---- dtypes ---------------------------------------------------------- */
const char *dev_dtype_name(dev_dtype t);
/* Every dtype's name, in enum order, NULL-ended: the one list ("f32", ...). */
extern const char *const dev_dtype_names[DEV_NDTYPE + 1];
int dev_dtype_parse(const char *name, dev_dtype *out);   /* 0 ok, -1 unknown */
size_t dev_dtype_size(dev_dtype t);
int dev_dtype_is_float(dev_dtype t);                     /* f32 f64 f16 bf16 */
const char *dev_memkind_name(dev_memkind k);             /* "device" "pinned" "host" */

/* f16 / bf16 conversions, round to nearest even (shared by kernels and bindings) */
float dev_half_to_float(uint16_t h);
uint16_t dev_float_to_half(float f);
float dev_bf16_to_float(uint16_t h);
uint16_t dev_float_to_bf16(float f);

/* ---- context --------------------------------------------------------- */
typedef struct dev_info {
  char name[128];
  const char *backend;        /* "host" | "cuda" */
  int index;
  size_t total_memory;        /* bytes the backend will hand out as device memory */
  int multiprocessors;        /* SMs on cuda, worker-capable CPU cores on host */
  int cc_major, cc_minor;     /* 0 on host */
} dev_info;

/* spec: NULL (env GPULUA_DEVICE, else cuda if a GPU answers, else host),
 * "host", "cuda", "cuda:N".  On failure returns NULL and writes err. */
dev_ctx *dev_open(const char *spec, char *err, size_t errlen);
/* Waits for all queued work, frees everything the context still holds. */
void dev_close(dev_ctx *ctx);
/* Reference counting so objects outliving the owner (late __gc) stay valid. */
void dev_ctx_retain(dev_ctx *ctx);
void dev_ctx_release(dev_ctx *ctx);

const char *dev_backend_name(dev_ctx *ctx);
/* Bytes of new allocations after which a loop's temporaries are best
 * collected to keep their blocks warm in the caches the backend's ops go
 * through (the CPU's for the host backend); 0 when the backend has none. */
size_t dev_warm_bytes(dev_ctx *ctx);
const char *dev_errmsg(dev_ctx *ctx);
int dev_device_count(dev_ctx *ctx);
int dev_device_info(dev_ctx *ctx, int index, dev_info *out);
int dev_current_device(dev_ctx *ctx);
int dev_set_device(dev_ctx *ctx, int index);

/* Script position recorded into each op enqueued afterwards (for async errors). */
void dev_set_site(dev_ctx *ctx, const char *site);

/* Threads of gpulua still running work that a caller gave up on, in any
 * context, even closed: a communicator's creation that timed out (NCCL's
 * blocking ncclCommInitRank cannot be stopped).  While there are some, a
 * process must end with _exit(): exit()'s handlers tear down the CUDA
 * runtime under such a thread, which then crashes. */
int dev_detached_threads(void);

/* Wait for all work on all streams of the context; reports async errors. Counted sync. */
int dev_synchronize(dev_ctx *ctx);
/* DEV_ERR_ASYNC (and clears it) if queued work failed since the last check. */
int dev_check_async(dev_ctx *ctx);

typedef struct dev_stats {
  uint64_t syncs, launches, copies;
  uint64_t h2d_bytes, d2h_bytes, d2d_bytes, h2h_bytes;
  int64_t streams;            /* live user streams (default stream excluded) */
  int64_t events;             /* live events */
  int64_t buffers;            /* live allocations of every kind */
  int64_t max_concurrent;     /* most ops seen running at once (host backend) */
  uint64_t replays;           /* graph launches (dev_graph_launch) */
} dev_stats;

/* Bytes of cache blocks (the request rounded up to its size class): held by
 * live buffers, their high-water mark, and reserved (live + cached). */
typedef struct dev_meminfo {
  size_t allocated, peak, reserved;                /* device memory */
  size_t pinned, pinned_peak, pinned_reserved;     /* page-locked host memory */
  size_t host, host_peak, host_reserved;           /* pageable memory held for tensors */
} dev_meminfo;

void dev_get_stats(dev_ctx *ctx, dev_stats *out);
void dev_get_meminfo(dev_ctx *ctx, dev_meminfo *out);
void dev_count_sync(dev_ctx *ctx);

/* What a counted sync (the host waiting for the device: synchronize, a
 * device-to-host read, a host-access fence that has to wait, a copy between
 * the device and wrapped pageable memory not guarded, dev_buf_guard) does
 * besides being counted.  WARN calls the warn
 * callback with "<site>: <call>: <what> waits for the device" and goes on;
 * REFUSE fails with that message (DEV_ERR_SYNC) before waiting. */
typedef enum { DEV_SYNC_ALLOW, DEV_SYNC_WARN, DEV_SYNC_REFUSE } dev_sync_policy;
void dev_set_sync_policy(dev_ctx *ctx, dev_sync_policy p);
dev_sync_policy dev_get_sync_policy(dev_ctx *ctx);
/* Called on the interpreter thread, during the call that syncs; must not raise. */
void dev_set_sync_warn(dev_ctx *ctx, void (*warn)(void *ud, const char *msg), void *ud);
/* Other warnings: something the caller should hear though nothing failed
 * ("the kernel cache entry ... was damaged: removed, and the kernel compiled
 * again"), called as the sync warning is, with the message alone. */
void dev_set_warn(dev_ctx *ctx, void (*warn)(void *ud, const char *msg), void *ud);
/* The API call (a static string: "item", "synchronize") that the next
 * counted sync belongs to, for messages; NULL for none. */
void dev_set_call(dev_ctx *ctx, const char *call);

/* The stream race checker: while on, an op (kernel, copy, collective) that
 * reads a buffer another stream writes, or writes one another stream reads or
 * writes, with no event, wait, sync or default-stream rule ordering the two,
 * fails with DEV_ERR_RACE before anything is enqueued; the message names both
 * ops, their streams and script sites.  On at dev_open when env GPULUA_CHECK
 * is "races"; history starts when it is turned on.  Off: one branch per op. */
int dev_check_races(dev_ctx *ctx, int on);   /* DEV_OK, or DEV_ERR_NOMEM */
int dev_races_checked(dev_ctx *ctx);

/* ---- memory ---------------------------------------------------------- */
/* A dev_buf is one base allocation.  refcounted by its users (tensors); when the
 * last reference goes, its memory is returned only once every op queued on it
 * has finished.  ptr is valid until then. */
struct dev_buf {
  dev_ctx *ctx;
  void *ptr;
  size_t bytes;           /* usable: the request rounded up to its size class */
  dev_memkind kind;
  int device;
  /* private to device layer */
  int refs;
  void *priv;
};

/* Memory comes from a cache (see dev_buf.c): a block freed while queued work on
 * a stream still uses it may go at once to a buffer allocated for a stream
 * ordered after that work (dev_buf_alloc_on with that stream); any other
 * stream, and the host, wait for that work before they touch the buffer.
 * s NULL: only blocks no queued work uses.  Out of memory is DEV_ERR_NOMEM
 * with the figures in the message, after the cache's unused blocks were
 * returned to the backend. */
int dev_buf_alloc(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_buf **out);
int dev_buf_alloc_on(dev_ctx *ctx, dev_memkind kind, size_t bytes, dev_stream *s, dev_buf **out);
/* Bytes of live buffers of a kind, and what the kind has in all. */
size_t dev_mem_live(dev_ctx *ctx, dev_memkind kind);
size_t dev_mem_total(dev_ctx *ctx, dev_memkind kind);
void dev_reset_peak(dev_ctx *ctx);
/* Cached blocks no queued work uses go back to the system. */
void dev_empty_cache(dev_ctx *ctx);
/* After an allocation of this kind failed (and the caller freed what it
 * could): wait for the queued work that still uses cached blocks of the kind
 * (only that; counted as a sync, never refused), then return every cached
 * block of the kind to the system, so that a retry can succeed. */
int dev_mem_reclaim(dev_ctx *ctx, dev_memkind kind);
/* Wrap memory owned by someone else; release(ud, ptr) is called on the
 * interpreter thread once the last reference is gone and the work queued on
 * it has finished (at a later device call, or at dev_close).  When ptr is
 * not NULL and bytes > 0, a backend that can tell (cuda) checks that ptr is
 * memory of that kind: DEV_ERR_INVALID otherwise. */
int dev_buf_wrap(dev_ctx *ctx, dev_memkind kind, void *ptr, size_t bytes,
                 void (*release)(void *ud, void *ptr), void *ud, dev_buf **out);
/* Wrapped pageable memory that only gpulua touches while queued work may
 * use it (the application waits for that work first, as for any tensor):
 * its copies to and from the device are staged and asynchronous, behind the
 * host-access fence, like those of gpulua's own pageable buffers.  Without
 * it a copy between wrapped pageable memory and the device blocks the
 * calling thread until done (a counted sync), as cudaMemcpy does. */
void dev_buf_guard(dev_buf *b);
/* 1 when a buffer of the context still wraps memory with this release and
 * ud (alive, or released and waiting for its queued work): the memory is
 * still in gpulua's hands. */
int dev_buf_wrapping(dev_ctx *ctx, void (*release)(void *ud, void *ptr), const void *ud);
void dev_buf_retain(dev_buf *b);
void dev_buf_release(dev_buf *b);
/* Before the calling thread touches host-visible memory: wait for queued work
 * that writes it (write=0) or that reads or writes it (write=1).  Counted as a
 * sync when it had to wait for anything.  Host/pinned buffers only. */
int dev_buf_fence(dev_buf *b, int write);
/* 1 when no queued work uses the buffer. */
int dev_buf_idle(dev_buf *b);

/* ---- buffers shared with other libraries (DLPack) ---------------------- */
/* Wait for every queued op that reads or writes b, any kind of memory:
 * afterwards another library may read or write it at once.  A counted sync
 * ("<what> waits for the device") when it had to wait. */
int dev_buf_wait(dev_buf *b, const char *what);
/* dev_buf_release from any thread (a DLPack consumer's deleter).  While the
 * context is open the release is queued and done by the owner thread at its
 * next allocation, synchronize or dev_close; the memory stays valid until
 * then.  After dev_close the release happens in the calling thread, under
 * the context's lock, and the last one frees the context. */
void dev_buf_release_async(dev_buf *b);

/* ---- streams and events ---------------------------------------------- */
enum { DEV_PRIO_LOW = -1, DEV_PRIO_NORMAL = 0, DEV_PRIO_HIGH = 1 };

/* The default stream: ordered with every blocking user stream (CUDA's legacy
 * default stream semantics).  Owned by the context; never released. */
dev_stream *dev_default_stream(dev_ctx *ctx);
int dev_stream_create(dev_ctx *ctx, int priority, int nonblocking, dev_stream **out);
void dev_stream_retain(dev_stream *s);
void dev_stream_release(dev_stream *s);   /* queued work still runs */
int dev_stream_synchronize(dev_stream *s); /* counted sync */
int dev_stream_query(dev_stream *s);       /* 1 idle, 0 busy, <0 error */
int dev_stream_wait_event(dev_stream *s, dev_event *e);
int dev_stream_wait_stream(dev_stream *s, dev_stream *other);
int dev_stream_priority(dev_stream *s);
int dev_stream_nonblocking(dev_stream *s);
int dev_stream_is_default(dev_stream *s);
dev_ctx *dev_stream_ctx(const dev_stream *s);  /* the context the stream belongs to */
uint64_t dev_stream_id(dev_stream *s);

int dev_event_create(dev_ctx *ctx, int timing, dev_event **out);
void dev_event_release(dev_event *e);
int dev_event_record(dev_event *e, dev_stream *s);
int dev_event_query(dev_event *e);         /* 1 done (or never recorded), 0 pending */
int dev_event_synchronize(dev_event *e);   /* counted sync */
int dev_event_recorded(dev_event *e);
int dev_event_timing(dev_event *e);
/* ms between start and end; DEV_ERR_INVALID when either lacks timing, was
 * never recorded or has not completed (message says which). */
int dev_event_elapsed(dev_event *start, dev_event *end, double *ms);

/* ---- completions, for tasks on the interpreter thread ------------------ */
/* A watch is a point in queued work that the interpreter thread can test
 * without blocking: the end of a stream's queued work when the watch was
 * made, or an event's last record.  The backend signals its completion (host
 * backend: the workers; cuda: a host function behind the point) into the
 * context's progress counter, so the thread can sleep until something
 * finished instead of polling.  None of this is a counted sync. */
typedef struct dev_watch dev_watch;
int dev_watch_stream(dev_stream *s, dev_watch **out);
int dev_watch_event(dev_event *e, dev_watch **out);   /* never recorded: done at once */
int dev_watch_done(dev_watch *w);                      /* 1 reached, 0 not yet; never waits */
void dev_watch_release(dev_watch *w);
/* Sleeping until some watched work finishes, without losing a wakeup:
 *   gen = dev_progress_begin(ctx); test the watches;
 *   none done: dev_progress_wait(ctx, gen, timeout_s), else dev_progress_end(ctx).
 * wait returns 1 when something finished since begin, 0 at the timeout, -1
 * when interrupted (dev_interrupt; the message says so); it ends the begin
 * in every case. */
uint64_t dev_progress_begin(dev_ctx *ctx);
int dev_progress_wait(dev_ctx *ctx, uint64_t gen, double timeout_s);
void dev_progress_end(dev_ctx *ctx);

/* ---- interrupting the host's waits (Ctrl-C) --------------------------- */
/* While enabled, the host's waits for the device (every counted sync:
 * synchronize, device-to-host reads, host-access fences, blocking copies)
 * and dev_progress_wait give up when the context is interrupted: they
 * return DEV_ERR_INTERRUPTED with the message "interrupted", and the queued
 * work runs on and finishes as usual.  dev_interrupt is async-signal-safe
 * (a signal handler calls it): it marks the context, and the wait in
 * progress, or the next one that has to wait, takes the mark.
 * dev_interrupt_take takes a pending mark without waiting (1 if there was
 * one): for a caller that interrupts otherwise (a Lua hook), or that drops a
 * stale mark once the interrupted statement has ended.  Off by default: an
 * interruptible wait polls on cuda (cudaStreamQuery) where a plain one
 * blocks in the driver; dev_close turns it off (closing always waits). */
void dev_interrupt_enable(dev_ctx *ctx, int on);
void dev_interrupt(dev_ctx *ctx);
int dev_interrupt_take(dev_ctx *ctx);

/* ---- tensors as the device layer sees them --------------------------- */
/* A strided view of a buffer.  Strides are in elements; a 0-dim view has one
 * element.  Broadcast inputs use stride 0. */
typedef struct dev_view {
  dev_buf *buf;
  size_t offset;              /* bytes from buf->ptr */
  dev_dtype dtype;
  int ndim;
  int64_t shape[DEV_MAXDIM];
  int64_t stride[DEV_MAXDIM];
} dev_view;

int64_t dev_view_numel(const dev_view *v);
/* Set shape and C-order strides (buf, offset and dtype untouched). */
void dev_view_set_contiguous(dev_view *v, int ndim, const int64_t *shape);
int dev_view_contiguous(const dev_view *v);
/* 0 if the view is well formed, aligned and inside its buffer; else -1 with
 * a message naming `what`.  Used by every backend's kernels. */
int dev_view_check(const dev_view *v, const char *what, char *err, size_t errlen);
/* The i-th 2-D matrix of a 3-D view, for batched matmul (a batch stride of 0
 * broadcasts). */
dev_view dev_view_batch(const dev_view *v, int64_t i);
static inline void *dev_view_ptr(const dev_view *v) {
  return (char *)v->buf->ptr + v->offset;
}

/* A scalar operand: exact for every integer dtype, double for floats. */
typedef struct dev_scalar { int is_int; int64_t i; double f; } dev_scalar;

/* The elementwise ops and reductions are declared in ops.h, once. */
#define DEV_OP_ENUM_UN(E, name, cls, res, fl) DEV_UN_##E,
#define DEV_OP_ENUM_BIN(E, name, cls, res, fl) DEV_BIN_##E,
#define DEV_OP_ENUM_TER(E, name, cls, res, fl) DEV_TER_##E,
#define DEV_OP_ENUM_RED(E, name, cls, res) DEV_RED_##E,
typedef enum {
  DEV_UN_COPY,     /* dst = src, converting dtype: cast */
  DEV_UNARY_OPS(DEV_OP_ENUM_UN)
  DEV_NUNOP
} dev_unop;

typedef enum { DEV_BINARY_OPS(DEV_OP_ENUM_BIN) DEV_NBINOP } dev_binop;
typedef enum { DEV_TERNARY_OPS(DEV_OP_ENUM_TER) DEV_NTEROP } dev_terop;
typedef enum { DEV_REDUCE_OPS(DEV_OP_ENUM_RED) DEV_NREDOP } dev_redop;
#undef DEV_OP_ENUM_UN
#undef DEV_OP_ENUM_BIN
#undef DEV_OP_ENUM_TER
#undef DEV_OP_ENUM_RED

/* DEV_RAND_INT: integers in [s0, s1) (both integer scalars), stored in any
 * dtype (gpu.randint) */
typedef enum { DEV_RAND_UNIFORM, DEV_RAND_NORMAL, DEV_RAND_INT } dev_randkind;
typedef enum { DEV_SOFTMAX, DEV_LOG_SOFTMAX } dev_softkind;
/* DEV_OP_CUMSUM: a running sum or product */
typedef enum { DEV_CUM_SUM, DEV_CUM_PROD } dev_cumkind;
/* DEV_OP_SORT's flags (its code).  DEV_SORT_VALUES: a second output,
 * fargs->xout[0], gets the values at those positions (in[0]'s dtype, out's
 * shape): t:sort and t:topk in one op, not a sort and a gather. */
#define DEV_SORT_DESCENDING 1
#define DEV_SORT_STABLE 2
#define DEV_SORT_VALUES 4
/* DEV_OP_INDEX: select is gather with the index broadcast (see dev_opkind) */
typedef enum { DEV_IDX_SELECT, DEV_IDX_GATHER, DEV_IDX_SCATTER_ADD, DEV_NIDX } dev_idxkind;

const char *dev_unop_name(dev_unop op);
const char *dev_binop_name(dev_binop op);
const char *dev_terop_name(dev_terop op);
const char *dev_redop_name(dev_redop op);

/* An elementwise op's row of ops.h: its name, the dtype classes it takes
 * (DEV_CLS_* bits), whether its result is bool, its DEV_OPF_* flags. */
typedef struct dev_opinfo { const char *name; unsigned classes; int to_bool; unsigned flags; } dev_opinfo;
/* NULL for a code outside the table (DEV_UN_COPY included). */
const dev_opinfo *dev_unop_info(int code);
const dev_opinfo *dev_binop_info(int code);
const dev_opinfo *dev_terop_info(int code);
/* A reduction's row: its name, classes and DEV_RRES_* result. */
typedef struct dev_redinfo { const char *name; unsigned classes; int result; } dev_redinfo;
const dev_redinfo *dev_redop_info(int code);   /* NULL outside the table */
/* The dtype of a reduction of a src tensor (its result column). */
dev_dtype dev_redop_dtype(int code, dev_dtype src);
/* A reduction of nothing: 0 and its value in *s (as for a fill), or -1
 * when it has none (max min argmax argmin). */
int dev_redop_empty(int code, dev_scalar *s);
/* DEV_CLS_F, DEV_CLS_I or DEV_CLS_B; 0 for a bad dtype. */
unsigned dev_dtype_class(dev_dtype t);
/* s as dtype t stores it (a float rounded to f16, say); as for a fill. */
dev_scalar dev_scalar_as(dev_scalar s, dev_dtype t);

/* One unit of queued work, as a backend receives it.  The host backend runs it
 * with dev_cpu_run() (cpu_ops.h); the CUDA backend launches the matching kernel. */
/* The kinds, one row each in DEV_OP_KINDS (ops.h), which says what each
 * one's fields mean: DEV_OP_FILL, DEV_OP_ARANGE, ... */
#define DEV_OPKIND_ENUM(E, name, fl) DEV_OP_##E,
typedef enum { DEV_OP_KINDS(DEV_OPKIND_ENUM) } dev_opkind;
#undef DEV_OPKIND_ENUM

enum {
  DEV_F_SCALAR = 1,        /* binary: second operand is s0 */
  DEV_F_SCALAR_LEFT = 2,   /* binary: s0 op in[0] instead of in[0] op s0 */
  DEV_F_SCALAR2 = 4,       /* ternary: operand 2 is s0 */
  DEV_F_SCALAR3 = 8,       /* ternary: operand 3 is s1 */
  DEV_F_FREDUCE = 16       /* fused: the program's results reduced by its
                              red[] (sum, mean, prod, max, min) along dim (-1:
                              all); set exactly when the program has them */
};

#define DEV_MAXIN 3   /* tensor operands held in a dev_kop, packed from in[0] */
#define DEV_FMAXIN 8  /* tensor operands of a fused op: in[], then its fargs' xin[] */
#define DEV_FPARAMS 8 /* number parameters of a fused op */
#define DEV_FMAXOUT 4 /* results of a fused op: out, then its fargs' xout[] */

/* A fused op's program (DEV_OP_FUSED): nodes in order, each reading only
 * earlier ones; res[] are the results' nodes (nout of them, all of one
 * shape: one pass writes them all, after reading every input; a program
 * with one result has the last node as it).  A program may end in
 * reductions (nred = nout): result j is then reduced by red[j] (DEV_RED_SUM,
 * MEAN, PROD, MAX or MIN) along the op's dim, every result of one dtype,
 * and the op's outputs are the reductions'.  Each tensor node has the dtype the
 * unfused op would have produced and rounds to it; a number node (CONST,
 * PARAM) has none: the op that reads it takes it as the unfused op takes a
 * number operand.  Programs are interned (dev_fprog_intern): one per content,
 * never freed, so queued ops and graphs may point at them freely. */
enum { DEV_FN_INPUT, DEV_FN_CONST, DEV_FN_PARAM, DEV_FN_UNARY, DEV_FN_BINARY, DEV_FN_TERNARY, DEV_FN_CAST };
#define DEV_FNODES 256
typedef struct dev_fnode {
  int kind;        /* DEV_FN_* */
  int code;        /* UNARY, BINARY, TERNARY: the op of ops.h */
  dev_dtype dtype; /* of the value (INPUT, the ops, CAST: the target) */
  int a[3];        /* operands: earlier nodes (unary one, binary two, ternary three) */
  int index;       /* INPUT: operand index (dev_kop_in); PARAM: fargs->param[index] */
  dev_scalar k;    /* CONST */
} dev_fnode;
typedef struct dev_fprog {
  char name[DEV_SITE_LEN];   /* in messages and traces */
  int n, nin, nparam, nout;
  int res[DEV_FMAXOUT];
  int nred;               /* 0, or nout: every result reduced */
  int red[DEV_FMAXOUT];   /* result j's reduction (DEV_RED_*) when nred */
#ifndef __CUDACC_RTC__
  dev_fnode node[];
#else
  dev_fnode node[1];   /* NVRTC (fused kernels include this file) has no flexible arrays */
#endif
} dev_fprog;
/* The interned program of these nodes, checked (operands, dtype rules of
 * ops.h); NULL with a message in err.  Its result is the last node;
 * dev_fprog_intern_res's are the nout nodes res[] (0-based), and
 * dev_fprog_intern_red's the same, each reduced by red[j] (NULL: none). */
const dev_fprog *dev_fprog_intern(const char *name, const dev_fnode *nodes, int n, char *err, size_t errlen);
const dev_fprog *dev_fprog_intern_res(const char *name, const dev_fnode *nodes, int n, const int *res, int nout,
                                      char *err, size_t errlen);
const dev_fprog *dev_fprog_intern_red(const char *name, const dev_fnode *nodes, int n, const int *res, int nout,
                                      const int *red, char *err, size_t errlen);
/* How many programs were interned so far (a cache miss each). */
uint64_t dev_fprog_count(void);

typedef struct dev_kop {
  dev_opkind kind;
  int code;
  int flags;
  int nin;
  int dim;
  dev_view out;
  dev_view in[DEV_MAXIN];
  dev_scalar s0, s1;
  uint64_t seed, offset;   /* DEV_OP_RAND: counter-based generator key and start */
  double ms;               /* DEV_OP_SLEEP */
  const struct dev_launch *launch;   /* DEV_OP_LAUNCH */
  const struct dev_fprog *fprog;     /* DEV_OP_FUSED */
  const struct dev_fargs *fargs;     /* DEV_OP_FUSED, DEV_OP_SORT's values: the caller's, until dev_submit returns */
} dev_kop;

/* What a fused op has past a dev_kop's own fields: its operands past in[]
 * and its number parameters.  Kept out of dev_kop, which every op of every
 * kind fills, copies and queues: eight inline views cost each built-in op on
 * the cuda backend about 0.3 us (bench/RESULTS.md, 2026-11-28).  Whoever
 * keeps an op past dev_submit (a queue, a graph) keeps a copy. */
typedef struct dev_fargs {
  dev_view xin[DEV_FMAXIN - DEV_MAXIN];
  dev_view xout[DEV_FMAXOUT - 1];   /* results 2.. of a program with several */
  dev_scalar param[DEV_FPARAMS];
} dev_fargs;

/* Operand i of op (i < op->nin), wherever it is kept. */
static inline const dev_view *dev_kop_in(const dev_kop *op, int i) {
  return i < DEV_MAXIN ? &op->in[i] : &op->fargs->xin[i - DEV_MAXIN];
}

/* How many outputs op writes (a fused op's program may have several), and
 * output j of them, wherever it is kept. */
static inline int dev_kop_nout(const dev_kop *op) {
  if (op->kind == DEV_OP_SORT) return (op->code & DEV_SORT_VALUES) && op->fargs ? 2 : 1;
  return op->kind == DEV_OP_FUSED && op->fprog ? op->fprog->nout : 1;
}
static inline const dev_view *dev_kop_out(const dev_kop *op, int j) {
  return j == 0 ? &op->out : &op->fargs->xout[j - 1];
}

/* Validate and enqueue on stream s (NULL: default stream).  If every buffer
 * the op touches is host-visible (pinned/host) the op runs on the calling
 * thread after host-access fences, as the contract says.  Returns at once
 * otherwise, a copy between pageable memory and the device included (staged
 * through pinned memory: GPULUA_STAGE_CHUNK, GPULUA_STAGE_THREADS), except
 * one of wrapped memory not guarded (dev_buf_guard), which waits.  Buffers
 * stay alive until the op finishes. */
int dev_submit(dev_ctx *ctx, dev_stream *s, const dev_kop *op);
/* The checks dev_submit makes of op (operands, outputs, dtypes, shapes),
 * and nothing else: nothing is queued.  For a caller that submits several
 * ops as one call and must refuse it before the first writes anything. */
int dev_check_op(dev_ctx *ctx, const dev_kop *op);
/* DEV_ERR_INVALID when v repeats elements (an expanded view: stride 0 along
 * a dim of size > 1): no op writes through it (dev_submit checks its
 * output; a write of one element, t:set, asks before it makes its view). */
int dev_check_writable(dev_ctx *ctx, const dev_view *v);
/* The op's name in messages and traces ("add", "copy", a kernel's name). */
const char *dev_op_name(const dev_kop *op);

/* Counter-based generator (Philox-4x32-10): the same numbers on every backend. */
void dev_philox(uint64_t seed, uint64_t counter, uint32_t out[4]);

/* Set `bytes` bytes of b from `offset` to `value`, asynchronously on s. */
int dev_memset(dev_ctx *ctx, dev_stream *s, dev_buf *b, size_t offset, int value, size_t bytes);

/* Copy a view's elements (C order, packed) to host memory and wait: a counted
 * sync.  Used by item/get/totable on device tensors. */
int dev_read(dev_ctx *ctx, dev_stream *s, const dev_view *src, void *dst);
/* Write packed host values into a view, asynchronously (the values are copied
 * first, so src may be reused at once). */
int dev_write(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const void *src);

/* Bytes made on the host in order, by one thread at a time: an inflated
 * file member.  fill writes the next n bytes to dst: 0, or -1 with a
 * message in err.  close is called once, on any thread, when no fill can
 * come any more.  Neither may call into the context. */
typedef struct dev_source {
  int (*fill)(void *ud, void *dst, size_t n, char *err, size_t errlen);
  void (*close)(void *ud);
  void *ud;
} dev_source;
/* Queue a copy of the bytes src makes into dst (device memory, contiguous),
 * asynchronously on s, as a staged copy of pageable memory: the staging
 * threads call fill chunk by chunk, in order, while the script goes on, so
 * that the sources of several copies are filled at once.  A fill that fails
 * is an asynchronous error, reported at the next sync with the script
 * position of the call and the fill's message; dst then holds whatever was
 * made.  Where nothing is staged (a graph capture, a backend or setting
 * with no staging) the bytes are made here first, and a failed fill fails
 * the call.  src is closed in every case, also when this fails. */
int dev_copy_source(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const dev_source *src);

/* ---- run-time kernels --------------------------------------------------- */
/* How an argument reaches a kernel parameter. */
typedef enum {
  DEV_KP_POINTER,   /* T * / const T *: a tensor's data */
  DEV_KP_INT,       /* signed integer of `size` bytes */
  DEV_KP_UINT,      /* unsigned integer */
  DEV_KP_FLOAT,     /* float (4) or double (8) */
  DEV_KP_HALF,      /* __half */
  DEV_KP_BF16,      /* __nv_bfloat16 */
  DEV_KP_BOOL,
  DEV_KP_RAW,       /* only the size is known (PTX, cubin): the argument decides */
  DEV_KP_OTHER      /* a struct, reference or unknown type: cannot be passed */
} dev_kparam_kind;

typedef struct dev_kparam {
  char name[64];          /* "" when the declaration has none */
  char type[96];          /* as written, for messages: "const float *" */
  dev_kparam_kind kind;
  int size;               /* bytes passed (8 for a pointer) */
  int is_const;           /* pointer to const: the kernel only reads the tensor */
  int pointee;            /* pointers: the dtype a tensor must have, -1 any */
  int elsize;             /* pointers: element size when pointee is -1 (0 any) */
} dev_kparam;

typedef struct dev_ksig {
  char name[128];         /* as written: the field of the module */
  char qualified[192];    /* with namespaces: the name expression for NVRTC */
  int extern_c, is_template, overloaded, from_ptx;
  int nparams;
  dev_kparam *params;
} dev_ksig;

/* Every __global__ function of CUDA C source, with its parameters (read as
 * written, without preprocessing).  0, or -1 with a message. */
int dev_kernels_parse(const char *src, dev_ksig **out, int *n, char *err, size_t errlen);
/* Every .entry of PTX text. */
int dev_kernels_parse_ptx(const char *ptx, dev_ksig **out, int *n, char *err, size_t errlen);
void dev_kernels_free(dev_ksig *k, int n);

typedef struct dev_module dev_module;

/* A kernel of a loaded module; lives as long as its module. */
typedef struct dev_kernel {
  dev_module *mod;
  dev_ksig sig;
  void *handle;           /* backend function handle */
  int max_threads;        /* per block, for this kernel */
  size_t static_shared;   /* bytes of __shared__ the kernel declares */
  size_t max_dynamic_shared;
  size_t shared_set;      /* dynamic shared memory the kernel is allowed so far */
} dev_kernel;

typedef struct dev_compile_opts {
  const char *name;             /* program name in NVRTC's messages */
  const char *const *options;   /* extra NVRTC options */
  int noptions;
  int cache;                    /* use the on-disk cache (if not disabled by env) */
} dev_compile_opts;

/* Compile CUDA C for the current device and load it: with NVRTC on cuda,
 * with the system C++ compiler on the host backend (cuda/host/kcompile.c).
 * On a compile error returns DEV_ERR_INVALID and, if log is not NULL, sets
 * *log to the compiler's full log (free() it). */
int dev_module_compile(dev_ctx *ctx, const char *src, const dev_compile_opts *o,
                       dev_module **out, char **log);
/* What the len bytes at data are: a cubin (ELF), a fatbin, PTX text (an
 * .entry and a .version or .target), or none of these (e.g. a path). */
typedef enum { DEV_IMAGE_NONE, DEV_IMAGE_PTX, DEV_IMAGE_CUBIN, DEV_IMAGE_FATBIN } dev_image_kind;
dev_image_kind dev_image_kind_of(const void *data, size_t len);
/* Load a cubin, fatbin or PTX image.  `declare` (CUDA C prototypes, may be
 * NULL) gives parameter types; without it PTX entries give sizes and kinds,
 * and a cubin's kernels take arguments by size. */
int dev_module_load(dev_ctx *ctx, const void *image, size_t len, const char *declare,
                    dev_module **out);
int dev_module_count(const dev_module *m);
dev_kernel *dev_module_kernel(dev_module *m, int i);
int dev_module_from_cache(const dev_module *m);   /* compiled code came from the disk cache */
void dev_module_retain(dev_module *m);
/* Unloaded once the launches queued from it have finished. */
void dev_module_release(dev_module *m);

/* One launch of a run-time kernel. */
typedef struct dev_launch {
  dev_kernel *k;
  unsigned grid[3], block[3];
  size_t shared;
  void **args;            /* one pointer per parameter, to its value */
  dev_buf **bufs;         /* tensors the kernel may touch ... */
  const unsigned char *writes;   /* ... and whether it may write them */
  int nbufs;
  /* optional, one per parameter: the bytes of the tensor passed for it
   * (0 for anything else), for GPULUA_KERNEL_CHECK's bounds */
  const size_t *extents;
} dev_launch;

/* Grid, block and shared memory valid for this kernel on this device? 0, or
 * -1 with a message. */
int dev_launch_check(dev_ctx *ctx, const dev_kernel *k, const unsigned grid[3],
                     const unsigned block[3], size_t shared, char *err, size_t errlen);

/* ---- what an embedding application hands over --------------------------- */
/* A stream over the backend's own stream handle: on cuda a cudaStream_t the
 * application created (gpulua never destroys it; it must stay valid while
 * the context may use the stream: until the stream is released and its
 * work is done, or the context is closed).  Its priority and blocking flag
 * are the handle's.  The host backend has no such handles:
 * DEV_ERR_UNSUPPORTED.  (NULL is not accepted: the caller maps CUDA's NULL
 * stream to dev_default_stream.) */
int dev_stream_wrap(dev_ctx *ctx, void *native, dev_stream **out);
/* The backend's handle of s: on cuda its cudaStream_t (cudaStreamLegacy for
 * the default stream); NULL on the host backend. */
void *dev_stream_native(dev_stream *s);

/* Kernels that are C functions of the application.  A launch calls fn:
 *   host backend: on the stream's worker thread, in stream order, with
 *     stream NULL; fn computes with the arguments' pointers;
 *   cuda: on the interpreter thread when the launch is enqueued, with
 *     stream the cudaStream_t; fn enqueues its own work there (a kernel,
 *     a library call) and must not wait for it.
 * args[i] points to parameter i's value as declared (a tensor: its data
 * pointer), the array cudaLaunchKernel takes.  fn returns 0, or non-zero
 * with a message in err: on cuda the launch fails at once; on the host
 * backend as any failed queued op (the next check reports it). */
typedef struct dev_cfunc_call {
  const char *name;
  const unsigned *grid, *block;
  size_t shared;
  int nargs;
  void **args;
  void *stream;
  void *ud;
} dev_cfunc_call;
typedef int (*dev_cfunc)(const dev_cfunc_call *c, char *err, size_t errlen);
/* A module of one kernel `name` whose parameters are the C declaration
 * `params` ("const float *x, float *y, int n"); ud_free(ud) (may be NULL)
 * runs when the module is unloaded.  Launches are checked as any kernel's
 * (grid, block, argument types; a pointer to const only reads). */
int dev_module_cfunc(dev_ctx *ctx, const char *name, const char *params, dev_cfunc fn,
                     void *ud, void (*ud_free)(void *ud), dev_module **out);
int dev_kernel_is_cfunc(const dev_kernel *k);

/* ---- graphs: a step captured once, replayed ---------------------------- */
/* dev_graph_begin opens a capture on stream s (not the default stream): from
 * then until dev_graph_end, work enqueued on s, and on streams joined to the
 * capture (a stream that waits for an event recorded in the capture, or for
 * a stream of it, joins), is validated as usual and recorded, not run.  One
 * capture per context at a time.  While it is open, what cannot be replayed
 * fails with DEV_ERR_CAPTURE and records nothing: a host wait (every counted
 * sync, dev_read, host access to a buffer the capture uses), work on a
 * stream outside the capture, a wait for an event recorded outside it,
 * pageable host memory, collectives, launching a graph.  The caller then
 * abandons the capture (dev_graph_release).
 * dev_graph_end ends it; it fails (the graph is unusable: release it) when a
 * joined stream's work was not joined back into s by an event or a wait, as
 * CUDA's stream capture requires.
 * The graph holds every buffer its ops touch and every module they launch
 * from, until it is released; a replay (dev_graph_launch) is one item on its
 * stream, ordered there as one op, and holds them until it finishes, so a
 * graph released with replays queued frees what it holds once they end.
 * name (may be NULL: "graph") names it in messages and traces; the capture's
 * site is the context's site at dev_graph_begin.  Asynchronous errors in a
 * replay name the graph, its capture line and the op's own line. */
int dev_graph_begin(dev_ctx *ctx, dev_stream *s, const char *name, dev_graph **out);
int dev_graph_end(dev_graph *g);
int dev_graph_launch(dev_graph *g, dev_stream *s);   /* s NULL: the default stream */
/* Abandons the capture if it is open.  NULL: nothing. */
void dev_graph_release(dev_graph *g);
int dev_graph_nodes(const dev_graph *g);             /* ops captured */
const char *dev_graph_name(const dev_graph *g);
const char *dev_graph_site(const dev_graph *g);      /* "script.lua:12" of the capture */
int dev_graph_capturing(dev_ctx *ctx);               /* a capture is open */
const dev_graph *dev_graph_open_capture(dev_ctx *ctx);   /* the capture open now, or NULL */

/* ---- tracing ---------------------------------------------------------- */
/* A session records every op (its stream, name, bytes, script line, start
 * and end on the host's monotonic clock), every counted sync the host waits
 * in, host-run ops and ranges.  Off, it costs one branch per op.  Records
 * are appended by the backends (host workers under a lock; on cuda from
 * timing events recorded around each op, read back at collection). */
typedef enum { DEV_TR_OP, DEV_TR_HOST_OP, DEV_TR_COLL, DEV_TR_SYNC, DEV_TR_RANGE } dev_trace_kind;
/* What an op does: copies by direction (host = pinned or pageable memory). */
typedef enum { DEV_TR_COMPUTE, DEV_TR_H2D, DEV_TR_D2H, DEV_TR_D2D, DEV_TR_H2H } dev_trace_class;
#define DEV_TRACE_NAME 64
#define DEV_TRACE_DEFAULT_MAX 1000000

typedef struct dev_trace_rec {
  int64_t t0, t1;            /* ns since the session started, host clock */
  uint64_t bytes;            /* copies: moved; other ops: written; collectives: sent */
  int64_t stream;            /* stream id; -1: the host (syncs, host-run ops, ranges) */
  const char *call;          /* syncs: the API call (static string) or NULL */
  uint8_t kind, cls;         /* dev_trace_kind, dev_trace_class */
  uint16_t depth;            /* ranges: nesting depth, 0 outermost */
  char name[DEV_TRACE_NAME]; /* op, collective, range name; a sync's `what` */
  char site[DEV_SITE_LEN];   /* script line that enqueued it */
} dev_trace_rec;

/* A stream that work of the session went to (it may be closed since). */
typedef struct dev_trace_stream { int64_t id; int priority, nonblocking, is_default; } dev_trace_stream;

typedef struct dev_trace_info {
  int active;
  size_t records, max;       /* records held, and the bound */
  uint64_t dropped;          /* records lost to the bound (or out of memory) */
  int64_t duration;          /* ns from start to stop (now while active), or to the end
                                of the last record if later */
  int nstreams;
} dev_trace_info;

/* Start a session (records of the previous one are dropped); at most
 * max_records records (0: DEV_TRACE_DEFAULT_MAX).  DEV_ERR_INVALID if on. */
int dev_trace_start(dev_ctx *ctx, size_t max_records);
/* Stop recording new work; work enqueued while on still records. */
void dev_trace_stop(dev_ctx *ctx);
int dev_trace_active(dev_ctx *ctx);
/* Wait for all queued work, read back the backend's timings and sort the
 * records by start.  counted: a counted sync (dev_synchronize, with its
 * policy and async errors); else a quiet wait that reports nothing (at exit). */
int dev_trace_collect(dev_ctx *ctx, int counted);
void dev_trace_get_info(dev_ctx *ctx, dev_trace_info *out);
/* Copy records [first, first + n) (clipped); returns how many. */
size_t dev_trace_copy(dev_ctx *ctx, size_t first, size_t n, dev_trace_rec *out);
/* The i-th stream of the session (0 <= i < nstreams). */
int dev_trace_stream_at(dev_ctx *ctx, int i, dev_trace_stream *out);

/* A named range on the host track (and an NVTX range on cuda, for nsys).
 * Ranges of one owner (the bindings: a coroutine, so tasks that interleave
 * each keep their own) nest: popping one that is not the owner's innermost
 * fails naming it, unless force, which also ends the owner's ranges inside
 * it.  Ranges of different owners may overlap.  Popping an id that is not
 * open does nothing. */
int dev_range_push(dev_ctx *ctx, const char *name, const void *owner, uint64_t *id);
int dev_range_pop(dev_ctx *ctx, uint64_t id, int force);

/* ---- ranks and collectives ------------------------------------------- */

/* Where this process sits in the job (from RANK / WORLD_SIZE / ... as
 * torchrun or `gpulua -n` set them, or Slurm's). */
typedef struct dev_rank_info {
  int rank, world, local_rank, local_world;
  char master_addr[256];
  int master_port;
  double timeout_s;       /* a collective that waits longer for a peer fails */
  int check;              /* compare each collective across ranks first: 1, 0, or -1 for
                             the backend's default (on for host; off for cuda, where it
                             costs a meeting of the ranks' host threads per collective) */
  int defer;              /* join the job now, create the communicator (NCCL's) at the
                             first collective or at a dev_comm_init without defer */
} dev_rank_info;

/* A number of the job from the environment, as torchrun (and `gpulua -n`)
 * sets it, else as Slurm does: RANK or SLURM_PROCID, WORLD_SIZE or
 * SLURM_NTASKS, LOCAL_RANK or SLURM_LOCALID, LOCAL_WORLD_SIZE or
 * SLURM_NTASKS_PER_NODE (an empty value counts as unset).  1 and *out (0 to
 * 1000000); 0 when unset; -1 when not such an integer, *var naming the
 * variable. */
typedef struct dev_group dev_group;

typedef enum { DEV_JOB_RANK, DEV_JOB_WORLD, DEV_JOB_LOCAL_RANK, DEV_JOB_LOCAL_WORLD } dev_job_var;
int dev_job_env(dev_job_var what, long *out, const char **var);

typedef enum {
  DEV_COLL_ALL_REDUCE, DEV_COLL_BROADCAST, DEV_COLL_REDUCE, DEV_COLL_ALL_GATHER,
  DEV_COLL_REDUCE_SCATTER, DEV_COLL_SEND, DEV_COLL_RECV, DEV_NCOLL
} dev_coll_kind;

typedef enum { DEV_CRED_SUM, DEV_CRED_PROD, DEV_CRED_MAX, DEV_CRED_MIN, DEV_CRED_AVG, DEV_NCRED } dev_cred;

/* One collective.  Views are contiguous; send and recv may be the same
 * memory (in place).  Counts: all_reduce, broadcast, reduce: equal;
 * all_gather: recv = world x send; reduce_scatter: send = world x recv.
 * send has no recv view, recv no send view; peer is the root of broadcast
 * and reduce, the other rank of send and recv. */
typedef struct dev_coll {
  dev_coll_kind kind;
  dev_cred red;
  int peer;
  dev_view send, recv;
  int graph;            /* set by the runtime: run by a graph replay (every rank must capture it) */
  dev_group *group;     /* NULL: the world; else peer and root are ranks of the group */
} dev_coll;

const char *dev_coll_name(dev_coll_kind k);
const char *dev_cred_name(dev_cred r);
/* "all_reduce #3", or "a group of 2 sends/receives (#4)": the collectives
 * numbered seq in messages */
void dev_coll_describe(char *out, size_t len, dev_coll_kind kind, int n, uint64_t seq);
/* Join the job's communicator (once per context).  Blocks until every rank
 * has joined or ri->timeout_s passes.  A second call with the same rank and
 * world creates a deferred communicator (unless ri->defer) and, on cuda,
 * applies ri's timeout and check. */
int dev_comm_init(dev_ctx *ctx, const dev_rank_info *ri);
int dev_comm_ready(dev_ctx *ctx);
int dev_comm_world(dev_ctx *ctx);   /* ranks in the joined job */
int dev_comm_rank(dev_ctx *ctx);    /* this one's */
/* Enqueue n collectives on s, run as one group: all of them progress
 * together, so a ring of sends and receives cannot deadlock.  n > 1 only
 * for send and recv.  Errors that only the peers can see (a rank that called
 * something else, a rank that is gone) are asynchronous errors. */
int dev_collective(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n);
/* A process group: a communicator over some ranks of the world (NCCL's
 * ncclCommSplit).  dev_group_split is collective over the world (every rank
 * calls it, in the same order): the ranks of one colour (>= 0) form a group,
 * numbered by key then world rank; a rank with colour < 0 gets *out NULL.
 * agree is a value every rank must pass alike (a hash of new_group's list),
 * else every rank fails.  label names the group in messages (NULL: "group
 * {1,3}").  The group lives until its last reference is released (queued
 * and captured collectives hold one). */
int dev_group_split(dev_ctx *ctx, int color, int key, uint64_t agree, const char *label, dev_group **out);
int dev_group_rank(const dev_group *g);
int dev_group_size(const dev_group *g);
const int *dev_group_members(const dev_group *g);   /* world ranks, in group-rank order */
const char *dev_group_label(const dev_group *g);
void dev_group_retain(dev_group *g);
void dev_group_release(dev_group *g);
/* For a launcher, once every rank has exited: remove what a job of `world`
 * ranks on `port` may have left on this node (a rank killed while the ranks
 * were meeting leaves the host backend's shared memory). */
void dev_comm_cleanup(int port, int world);

#endif
