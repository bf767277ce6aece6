/* dev_interrupt (Ctrl-C in the CLI) on the host backend: a wait in progress
 * and a wait that starts while the mark is pending give up with
 * DEV_ERR_INTERRUPTED, each mark is taken once, the queued work runs on and
 * the context stays usable; nothing happens while interrupts are off. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "tests/tap.h"

static void *interrupter(void *arg) {
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  dev_interrupt(arg);
  return NULL;
}

static int sleep_op(dev_ctx *ctx, dev_stream *s, double ms) {
  dev_kop op;
  memset(&op, 0, sizeof op);
  op.kind = DEV_OP_SLEEP;
  op.ms = ms;
  return dev_submit(ctx, s, &op);
}

/* A device buffer of 4 f32 (its view in v) that a fill with 3 queued on s
 * writes. */
static dev_buf *queue_fill(dev_ctx *ctx, dev_stream *s, dev_view *v) {
  dev_buf *b;
  ok(dev_buf_alloc(ctx, DEV_MEM_DEVICE, 16, &b) == DEV_OK, "a device buffer");
  memset(v, 0, sizeof *v);
  v->buf = b;
  v->dtype = DEV_F32;
  int64_t four = 4;
  dev_view_set_contiguous(v, 1, &four);
  dev_kop fill;
  memset(&fill, 0, sizeof fill);
  fill.kind = DEV_OP_FILL;
  fill.out = *v;
  fill.s0.f = 3;
  ok(dev_submit(ctx, s, &fill) == DEV_OK, "a fill queued behind the op");
  return b;
}

int main(void) {
  char err[256];
  dev_ctx *ctx = dev_open("host", err, sizeof err);
  if (!ctx) {
    skip_all("cannot open the host backend: %s", err);
    return 0;
  }
  dev_stream *s;
  ok(dev_stream_create(ctx, DEV_PRIO_NORMAL, 0, &s) == DEV_OK, "a stream");

  /* off: nothing is marked, waits are the plain ones */
  dev_interrupt(ctx);
  ok(dev_interrupt_take(ctx) == 0, "interrupts off: dev_interrupt marks nothing");

  dev_interrupt_enable(ctx, 1);
  dev_interrupt(ctx);
  ok(dev_interrupt_take(ctx) == 1, "on: dev_interrupt marks the context");
  ok(dev_interrupt_take(ctx) == 0, "the mark is taken once");

  /* a wait in progress: another thread interrupts it (as a signal would) */
  ok(sleep_op(ctx, s, 3000) == DEV_OK, "a 3 s op on the stream");
  pthread_t th;
  pthread_create(&th, NULL, interrupter, ctx);
  int rc = dev_stream_synchronize(s);
  pthread_join(th, NULL);
  ok(rc == DEV_ERR_INTERRUPTED, "stream synchronize gives up: status %d", rc);
  ok(strcmp(dev_errmsg(ctx), "interrupted") == 0, "with the message 'interrupted': %s", dev_errmsg(ctx));
  ok(dev_stream_query(s) == 0, "the op still runs");
  ok(dev_interrupt_take(ctx) == 0, "the wait took the mark");

  /* a mark pending before the wait starts */
  dev_interrupt(ctx);
  rc = dev_synchronize(ctx);
  ok(rc == DEV_ERR_INTERRUPTED, "device synchronize started after the mark gives up: %d", rc);
  dev_event *e;
  ok(dev_event_create(ctx, 0, &e) == DEV_OK && dev_event_record(e, s) == DEV_OK, "an event after the op");
  dev_interrupt(ctx);
  ok(dev_event_synchronize(e) == DEV_ERR_INTERRUPTED, "event synchronize gives up");

  /* a device-to-host read waits for the op that writes its source */
  dev_view v;
  dev_buf *b = queue_fill(ctx, s, &v);
  float got[4] = {0, 0, 0, 0};
  dev_interrupt(ctx);
  ok(dev_read(ctx, s, &v, got) == DEV_ERR_INTERRUPTED, "dev_read gives up");

  /* the task loop's sleep */
  dev_watch *w;
  ok(dev_watch_stream(s, &w) == DEV_OK && !dev_watch_done(w), "a watch on the stream");
  uint64_t gen = dev_progress_begin(ctx);
  dev_interrupt(ctx);
  ok(dev_progress_wait(ctx, gen, 10.0) == -1, "dev_progress_wait returns -1 when interrupted");
  ok(strcmp(dev_errmsg(ctx), "interrupted") == 0, "... with the message");

  /* without a mark the waits finish: the work ran on normally */
  rc = dev_synchronize(ctx);
  ok(rc == DEV_OK, "a later synchronize waits for the op: %s", rc ? dev_errmsg(ctx) : "ok");
  ok(dev_watch_done(w), "the watch is reached");
  rc = dev_read(ctx, s, &v, got);
  ok(rc == DEV_OK && got[0] == 3 && got[3] == 3, "the queued fill ran: %g", (double)got[0]);

  /* dev_close waits even with a mark pending */
  ok(sleep_op(ctx, s, 200) == DEV_OK, "another op");
  dev_interrupt(ctx);
  dev_watch_release(w);
  dev_event_release(e);
  dev_buf_release(b);
  dev_stream_release(s);
  dev_stats st;
  dev_get_stats(ctx, &st);
  ok(st.streams == 0 && st.events == 0, "handles released");
  dev_close(ctx);
  ok(1, "dev_close waited for the queued op and closed");
  return done_testing();
}
