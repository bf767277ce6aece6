/* The backend interface (as nccl-tests' table per engine): what a backend
 * implements (dev_backend, one table each: cuda/host/backend.c,
 * cuda/cuda/runtime.c) and what it is handed (a captured graph, a compiled
 * image).  The neutral files reach a backend through this table alone;
 * dev.c picks one by name. */
#ifndef GPULUA_BACKEND_H
#define GPULUA_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "device.h"

struct dev_kimage;
typedef struct dev_stage_job dev_stage_job;
typedef struct dev_stage_pool dev_stage_pool;
struct dev_gexec;

typedef struct dev_backend {
  const char *name;
  /* Bytes of new tensors after which a loop's temporaries are best
   * collected, so that their blocks are reused while still in the caches
   * the backend's ops go through; 0: no such size (bindings/memory.c). */
  size_t warm_bytes;
  int (*open)(dev_ctx *ctx, int device);
  void (*close)(dev_ctx *ctx);
  int (*device_count)(dev_ctx *ctx);
  int (*device_info)(dev_ctx *ctx, int index, dev_info *out);

  int (*stream_init)(dev_stream *s);
  void (*stream_fini)(dev_stream *s);      /* drained, unreferenced */
  int (*stream_idle)(dev_stream *s);       /* no queued work, nobody waits on it */
  uint64_t (*stream_pos)(dev_stream *s);   /* position after the last enqueued item */
  int (*pos_done)(dev_stream *s, uint64_t pos);
  int (*pos_wait)(dev_stream *s, uint64_t pos);
  /* optional: pos_wait that returns DEV_ERR_INTERRUPTED (no message) when
   * dev_intr_pending, checked at least every 50 ms */
  int (*pos_wait_intr)(dev_stream *s, uint64_t pos);
  int (*stream_wait)(dev_stream *s, dev_stream *other, uint64_t pos);

  int (*event_init)(dev_event *e);
  void (*event_fini)(dev_event *e);
  int (*event_record)(dev_event *e, dev_stream *s);   /* sets e->stream, e->pos */
  int (*event_query)(dev_event *e);   /* optional: 1 done, 0 pending, <0 error */
  int (*event_sync)(dev_event *e);    /* optional; interruptible as pos_wait_intr
                                         when dev_intr_enabled */
  int (*event_wait)(dev_stream *s, dev_event *e);   /* optional: s waits for e's last record */
  int (*event_elapsed)(dev_event *a, dev_event *b, double *ms);
  /* optional: a completion signal for stream s at pos, or for e's last
   * record (e not NULL); the backend calls dev_progress_signal when it is
   * reached and watch_done says so from then on.  Without these the device
   * layer tests pos_done, and the backend signals progress for every item. */
  int (*watch)(dev_ctx *ctx, dev_stream *s, uint64_t pos, dev_event *e, void **impl);
  int (*watch_done)(dev_ctx *ctx, void *impl);
  void (*watch_free)(dev_ctx *ctx, void *impl);

  /* Memory for the device layer's cache (dev_buf.c), which calls alloc only
   * when no cached block fits, and free only for blocks no queued work uses.
   * alloc fails with DEV_ERR_NOMEM (no message needed) when memory of the
   * kind is exhausted; mem_total is what the kind has in all; trim, optional,
   * returns what the backend itself keeps (a driver pool) to the system. */
  int (*alloc)(dev_ctx *ctx, dev_memkind kind, size_t bytes, void **out);
  void (*free)(dev_ctx *ctx, dev_memkind kind, void *p, size_t bytes);
  size_t (*mem_total)(dev_ctx *ctx, dev_memkind kind);
  void (*trim)(dev_ctx *ctx);
  int (*submit)(dev_stream *s, const dev_kop *op);
  /* A copy between pageable memory and the device, staged (dev_stage.c):
   * enqueue the job's steps on s (dev_stage_emit) as one op at one
   * position.  A failure leaves nothing of it running: the backend aborts
   * the job (dev_stage_abort) and waits for the steps it had enqueued. */
  int (*stage_copy)(dev_stream *s, const dev_kop *op, dev_stage_job *j);

  /* Run-time kernels; NULL on a backend without them.  compile turns
   * source into an image module_load takes (for arch; the lowered names of
   * the name expressions exprs), from the on-disk cache where use_cache:
   * 0, -1 with the message in err, or DEV_ERR_INTERRUPTED when ctx's
   * interrupt (dev_interrupt) stopped it; it does not take the interrupt.
   * ctx is for that alone, and may be NULL. */
  int (*compile)(dev_ctx *ctx, const char *src, const char *name, const char *arch, const char *const *opts, int nopts,
                 const char *const *exprs, int nexprs, int use_cache, struct dev_kimage *img, char **log,
                 char *err, size_t errlen);
  int (*module_load)(dev_ctx *ctx, const void *image, size_t len, void **impl);
  void (*module_unload)(dev_ctx *ctx, void *impl);
  /* Handle and limits of the kernel named `symbol`, and the sizes of its
   * first parameters, at most max (*nparams: how many it has, up to max). */
  int (*kernel_get)(dev_ctx *ctx, void *impl, const char *symbol, dev_kernel *k,
                    size_t *sizes, int max, int *nparams);
  /* Names of every kernel in the image (malloc'd array of malloc'd names). */
  int (*kernel_names)(dev_ctx *ctx, void *impl, char ***names, int *n);
  /* Set where compile's images are the backend's own: no PTX, cubin or
   * fatbin is loaded (gpu.load_module). */
  int compile_only;

  /* Collectives; NULL on a backend without them.  coll takes a checked
   * group of n (copied) with its sequence number in the job. */
  int (*comm_open)(dev_ctx *ctx, const dev_rank_info *ri);
  /* optional: joined already; create the communicator if deferred, take
   * ri's timeout and check */
  int (*comm_connect)(dev_ctx *ctx, const dev_rank_info *ri);
  void (*comm_close)(dev_ctx *ctx);
  int (*coll)(dev_stream *s, const dev_coll *c, int n, uint64_t seq);
  /* optional: open g's communicator (g's fields set; collective over the
   * members, or over the world where the library splits, with this rank's
   * colour and key); sets g->impl and g->free_impl.  g NULL: this rank
   * is in no group of the split (colour -1) */
  int (*group_open)(dev_ctx *ctx, dev_group *g, int color, int key);
  /* Set where collectives are compared across ranks unless the job says
   * otherwise (dev_rank_info.check -1). */
  int check_colls;

  /* Tracing, optional (cuda/trace.c): the clock reference of a new session,
   * finished op timings into records, the timing resources freed; ranges
   * for external profilers (NVTX). */
  int (*trace_start)(dev_ctx *ctx);
  void (*trace_flush)(dev_ctx *ctx);
  void (*trace_free)(dev_ctx *ctx);
  uint64_t (*range_start)(dev_ctx *ctx, const char *name);   /* may overlap others */
  void (*range_end)(dev_ctx *ctx, uint64_t handle);

  /* Application objects, optional: is ptr memory of this kind (dev_buf_wrap);
   * the native handle of a stream (dev_stream_native).  stream_init wraps
   * s->wrap when it is set (dev_stream_wrap); a backend without
   * stream_native cannot. */
  int (*check_ptr)(dev_ctx *ctx, dev_memkind kind, void *ptr, size_t bytes);
  void *(*stream_native)(dev_stream *s);

  /* Graphs (cuda/dev_graph.c); NULL: the backend has none.  graph_build,
   * optional, makes the backend's executable of a captured node list
   * (gx->impl) once the capture ends; graph_launch enqueues one replay of
   * it on s, ordered there as one op, its collectives numbered from seq
   * on (gx->ncolls of them); graph_free frees gx->impl once no replay is
   * queued (interpreter thread).  A replay takes 1 + gx->nrec positions
   * of s, the last ones enqueued: the k-th (from 1) is reached when the
   * replay records the script's event of its k-th such record node (the
   * device layer marks the event there; the backend records it: its
   * timestamp, its CUDA event), the last when the replay is over. */
  int (*graph_build)(dev_ctx *ctx, struct dev_gexec *gx);
  int (*graph_launch)(dev_stream *s, const struct dev_gexec *gx, uint64_t seq);
  void (*graph_free)(dev_ctx *ctx, struct dev_gexec *gx);
} dev_backend;

/* A captured graph as the backends see it: its nodes in capture order (a
 * topological order: the host backend replays the ops in it, one after the
 * other), with the fork/join between the capture's streams as records and
 * waits (stream 0 is the one the capture began on), for a backend that
 * rebuilds it (cuda). */
typedef enum { DEV_GN_OP, DEV_GN_RECORD, DEV_GN_WAIT, DEV_GN_COLL } dev_gnode_kind;
typedef struct dev_gnode {
  int kind;                  /* dev_gnode_kind */
  int stream;                /* the capture's stream it was enqueued on */
  int event;                 /* RECORD: its slot; WAIT: the slot of the record waited for */
  dev_kop op;                /* OP; a launch points to a copy the graph owns */
  dev_coll *coll;            /* COLL: a collective or a group (ncoll), the graph's copy */
  int ncoll;
  char site[DEV_SITE_LEN];   /* the script line that enqueued it */
} dev_gnode;

typedef struct dev_gexec {
  dev_gnode *nodes;
  int n, nops, nstreams, nevents;
  /* per record slot (nevents): the script's event each replay records
   * there (held until the graph is freed), NULL for a stream's implicit
   * record; nrec: the RECORD nodes of such slots */
  dev_event **events;
  int nrec;
  int ncolls;                /* COLL nodes: the collectives (groups count one) of a replay */
  char name[DEV_TRACE_NAME];
  char site[DEV_SITE_LEN];   /* of the capture */
  void *impl;                /* the backend's executable (graph_build) */
} dev_gexec;

/* Compiled code and the lowered (mangled) names of the name expressions;
 * note: what the caller should hear though nothing failed (a damaged cache
 * entry, a cache directory that cannot be made), shown as a warning. */
typedef struct dev_kimage {
  void *data;
  size_t size;
  char **lowered;
  int n;
  int from_cache;
  char note[512];
} dev_kimage;

/* cuda/kcache.c: the on-disk cache of compiled kernels that both backends'
 * compilers use (cuda/cuda/nvrtc.c, cuda/host/kcompile.c): a key's hash
 * (FNV-1a; _more goes on from h), the directory (GPULUA_KERNEL_CACHE,
 * "0"/"off"/"": none; else $XDG_CACHE_HOME/gpulua or ~/.cache/gpulua; NULL
 * when off or unknown), and mkdir -p (0, or -1 with errno).
 * An entry (the file's layout is in kcache.c) holds the key, img's lowered
 * names and image, and a checksum.  read: DEV_KCACHE_HIT with img filled,
 * MISS (no entry, another key or format), or BAD: damaged, removed, and a
 * note saying so.  write: 0, or -1 (not an error: no cache), with a note
 * when GPULUA_KERNEL_CACHE names a directory that cannot be made (only its
 * last component is made; the default directory with its parents).  parse:
 * read's check of a file's bytes. */
enum { DEV_KCACHE_HIT = 0, DEV_KCACHE_MISS = -1, DEV_KCACHE_BAD = -2 };
uint64_t dev_kcache_hash(const void *p, size_t n);
uint64_t dev_kcache_hash_more(uint64_t h, const void *p, size_t n);
const char *dev_kcache_dir(char *buf, size_t n);
int dev_mkdirs(char *path);
int dev_kcache_read(const char *path, const char *magic, const void *key, size_t klen, int nexpr,
                    dev_kimage *img, char *note, size_t notelen);
int dev_kcache_write(const char *dir, const char *path, const char *magic, const void *key, size_t klen,
                     const dev_kimage *img, char *note, size_t notelen);
int dev_kcache_parse(const void *buf, size_t len, const char *magic, const void *key, size_t klen, int nexpr,
                     dev_kimage *img);
void dev_kimage_free(dev_kimage *img);   /* and memset: note too */

extern const dev_backend dev_host_backend;
#ifdef GPULUA_HAVE_CUDA   /* its private API: cuda/cuda/cu.h */
extern const dev_backend dev_cuda_backend;
int dev_cuda_available(void);
#endif

#endif
