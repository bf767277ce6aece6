/* The sync policy and interrupts.
 *
 * - Every counted host-device sync calls dev_sync_enter before it waits and
 *   dev_sync_leave once the wait is over, or dev_sync_abandon (trace.c) when
 *   what it waits for was refused before any wait.  Allowed: counted (and a
 *   span on the trace).  Warn: the same, and the callback gets a message
 *   with the site and the call.  Refused: DEV_ERR_SYNC, not counted, and the
 *   caller waits for nothing.
 * - Not through the policy: dev_mem_reclaim's wait (counted, never refused:
 *   running out of memory is worse), and dev_count_sync, a sync the bindings
 *   did themselves.
 * - dev_interrupt (a signal handler) sets the pending flag only while
 *   interrupts are enabled; disabling clears it.  The waits that take it:
 *   dev_sync_wait (with the backend's pos_wait_intr), a backend event_sync,
 *   dev_progress_wait; a taken interrupt is DEV_ERR_INTERRUPTED,
 *   "interrupted".  The lifetime waits (closing, out of memory) are not
 *   interruptible.
 */
#include <stdio.h>

#include "devpriv.h"
#include "capture.h"

/* ---- interrupts --------------------------------------------------------- */

void dev_interrupt_enable(dev_ctx *ctx, int on) {
  atomic_store(&ctx->intr_on, on != 0);
  if (!on) atomic_store(&ctx->intr, 0);
}

/* Async-signal-safe: lock-free atomics only. */
void dev_interrupt(dev_ctx *ctx) {
  if (ctx && atomic_load(&ctx->intr_on)) atomic_store(&ctx->intr, 1);
}

int dev_interrupt_take(dev_ctx *ctx) { return atomic_exchange(&ctx->intr, 0) != 0; }

/* The wait of a counted sync: interruptible while enabled. */
int dev_sync_wait(dev_ctx *ctx, dev_stream *s, uint64_t pos) {
  if (ctx->bk->pos_wait_intr && atomic_load(&ctx->intr_on))
    return dev_intr_check(ctx, ctx->bk->pos_wait_intr(s, pos));
  return ctx->bk->pos_wait(s, pos);
}

/* ---- the sync policy ------------------------------------------------- */

void dev_count_sync(dev_ctx *ctx) { ctx->st.syncs++; }

void dev_set_sync_policy(dev_ctx *ctx, dev_sync_policy p) { ctx->sync_policy = p; }
dev_sync_policy dev_get_sync_policy(dev_ctx *ctx) { return ctx->sync_policy; }
void dev_set_call(dev_ctx *ctx, const char *call) { ctx->call = call; }

void dev_set_sync_warn(dev_ctx *ctx, void (*warn)(void *ud, const char *msg), void *ud) {
  ctx->sync_warn = warn;
  ctx->sync_warn_ud = ud;
}

int dev_sync_enter(dev_ctx *ctx, const char *what) {
  if (ctx->capture) return graph_refuse(ctx, what);
  if (ctx->sync_policy == DEV_SYNC_ALLOW) {
    ctx->st.syncs++;
    if (ctx->trace_gen) dev_trace_sync_open(ctx, what);
    return DEV_OK;
  }
  char msg[sizeof ctx->site + 192];
  snprintf(msg, sizeof msg, "%s%s%s%s%s waits for the device (a host-device sync)", ctx->site,
           *ctx->site ? ": " : "", ctx->call ? ctx->call : "", ctx->call ? ": " : "", what);
  if (ctx->sync_policy == DEV_SYNC_REFUSE) {
    /* the bindings add the script line and the call themselves */
    return dev_fail(ctx, DEV_ERR_SYNC, "%s waits for the device: a host-device sync, not "
                    "allowed here (gpu.nosync() or sync debugging set to \"error\")", what);
  }
  ctx->st.syncs++;   /* refused ones did not happen */
  if (ctx->trace_gen) dev_trace_sync_open(ctx, what);
  if (ctx->sync_warn) ctx->sync_warn(ctx->sync_warn_ud, msg);
  return DEV_OK;
}
