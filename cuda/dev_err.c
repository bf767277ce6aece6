/* The context's errors: the message of the last failure, the first async
 * failure (any thread) until it is reported, warnings (what the caller
 * should hear though nothing failed), and the count of ops running.
 * The bottom of the neutral files: every other file and both backends call
 * it, and it calls none of them. */
#include <stdarg.h>
#include <stdio.h>

#include "devpriv.h"

int dev_fail(dev_ctx *ctx, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
  va_end(ap);
  return code;
}

void dev_async_fail(dev_ctx *ctx, const char *fmt, ...) {
  pthread_mutex_lock(&ctx->async_mu);
  if (!atomic_load(&ctx->async_flag)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->async_err, sizeof ctx->async_err, fmt, ap);
    va_end(ap);
    atomic_store(&ctx->async_flag, 1);
  }
  pthread_mutex_unlock(&ctx->async_mu);
}

void dev_note_running(dev_ctx *ctx, int delta) {
  int now = atomic_fetch_add(&ctx->running, delta) + delta;
  long long m = atomic_load(&ctx->max_running);
  while (now > m && !atomic_compare_exchange_weak(&ctx->max_running, &m, now)) {}
}

static atomic_int detached;

void dev_note_detached(int delta) { atomic_fetch_add(&detached, delta); }

int dev_detached_threads(void) { return atomic_load(&detached); }

int dev_check_async(dev_ctx *ctx) {
  if (!atomic_load(&ctx->async_flag)) return DEV_OK;
  pthread_mutex_lock(&ctx->async_mu);
  snprintf(ctx->err, sizeof ctx->err, "%s", ctx->async_err);
  atomic_store(&ctx->async_flag, 0);
  pthread_mutex_unlock(&ctx->async_mu);
  return DEV_ERR_ASYNC;
}

const char *dev_errmsg(dev_ctx *ctx) { return ctx->err; }

/* A backend wait (or compile) that gave up: the interrupt is taken, the
 * message set. */
int dev_intr_check(dev_ctx *ctx, int rc) {
  if (rc != DEV_ERR_INTERRUPTED) return rc;
  atomic_store(&ctx->intr, 0);
  return dev_fail(ctx, DEV_ERR_INTERRUPTED, "interrupted");
}

void dev_set_warn(dev_ctx *ctx, void (*warn)(void *ud, const char *msg), void *ud) {
  ctx->warn = warn;
  ctx->warn_ud = ud;
}

void dev_warn(dev_ctx *ctx, const char *fmt, ...) {
  if (!ctx->warn) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ctx->warn(ctx->warn_ud, msg);
}
