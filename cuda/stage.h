/* Staged pageable copies (cuda/dev_stage.c): called by dev_op.c and by the
 * backends' open, close and stage_copy. */
#ifndef GPULUA_STAGE_H
#define GPULUA_STAGE_H

#include "devpriv.h"

/* cuda/dev_stage.c: copies between pageable memory and the device through
 * pinned slots (its header says how).  config reads GPULUA_STAGE_CHUNK and
 * GPULUA_STAGE_THREADS (a backend's open); shutdown joins the pool's
 * threads (a backend's close, every stream drained).  plan: the chunk
 * (whole elements) and slots of a copy of bytes.  new: a job moving host's
 * elements to or from dev (contiguous) through nslot slots of chunk bytes
 * at stage; start: an H2D job may read its source now (no queued work
 * writes it).  emit: the steps in stream order, through the backend's
 * ops (wait, post, copy: each asynchronous in stream order; a step a call
 * failed to enqueue never runs).  abort:
 * after a failed enqueue, once no thread copies for the job any more.
 * retain/release: a reference (the submitter has one).  dev_parse_size: "8M", "1.5G" (0, or
 * -1 when not a size of at least one byte). */
#define DEV_STAGE_CHUNK ((size_t)8 << 20)
#define DEV_STAGE_THREADS 8   /* at most, by default: half the processors (dev_stage_config) */
typedef struct dev_stage_ops {
  /* the stream waits until (int32_t)(*flag - value) >= 0 (host memory) */
  int (*wait)(void *ud, volatile uint32_t *flag, uint32_t value);
  /* the stream writes value to *flag once the steps before it are done */
  int (*post)(void *ud, volatile uint32_t *flag, uint32_t value);
  /* an asynchronous copy in stream order */
  int (*copy)(void *ud, void *dst, const void *src, size_t n);
} dev_stage_ops;
int dev_stage_config(dev_ctx *ctx, int dma);
void dev_stage_shutdown(dev_ctx *ctx);
void dev_stage_plan(dev_ctx *ctx, size_t bytes, size_t el, size_t *chunk, int64_t *nslot);
int dev_stage_new(dev_ctx *ctx, int h2d, const dev_view *host, void *dev, void *stage, size_t chunk,
                  int64_t nslot, dev_stage_job **out);
/* An H2D job whose bytes src makes (dev_copy_source), filled in order one
 * chunk at a time; a failed fill is the context's async error, prefixed
 * with the script position of now (ctx->site).  The job closes src when
 * freed; when this fails src is not taken. */
int dev_stage_new_source(dev_ctx *ctx, const dev_source *src, size_t bytes, void *dev, void *stage,
                         size_t chunk, int64_t nslot, dev_stage_job **out);
/* The slots' bytes of the source jobs alive (being filled, or their steps
 * not yet done). */
size_t dev_stage_source_bytes(dev_ctx *ctx);
void dev_stage_start(dev_stage_job *j);
int dev_stage_emit(dev_stage_job *j, const dev_stage_ops *ops, void *ud);
void dev_stage_abort(dev_stage_job *j);
void dev_stage_retain(dev_stage_job *j);
void dev_stage_release(dev_stage_job *j);
int dev_parse_size(const char *s, size_t *out);

#endif
