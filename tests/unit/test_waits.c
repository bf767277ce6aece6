/* Waits on the host backend: a stream's worker wakes the threads waiting
 * for it only when one of them is due (advance, wait_done in
 * cuda/host/backend.c).  Two waiters for different positions of one
 * stream at once, the interpreter thread (dev_stream_synchronize) and
 * another stream's worker (a wait on an event recorded in the middle),
 * over many rounds of varied timings: each must wake, and in order.  A
 * missed wake-up hangs: the alarm turns that into a failure. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "tests/tap.h"

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "not ok - a wait never woke (alarm after 120 s)\n";
  (void)!write(1, msg, sizeof msg - 1);
  _exit(1);
}

static int sleep_op(dev_ctx *ctx, dev_stream *s, double ms) {
  dev_kop op;
  memset(&op, 0, sizeof op);
  op.kind = DEV_OP_SLEEP;
  op.ms = ms;
  return dev_submit(ctx, s, &op);
}

static int fill_op(dev_ctx *ctx, dev_stream *s, const dev_view *v, float x) {
  dev_kop op;
  memset(&op, 0, sizeof op);
  op.kind = DEV_OP_FILL;
  op.out = *v;
  op.s0.f = x;
  return dev_submit(ctx, s, &op);
}

static int copy_op(dev_ctx *ctx, dev_stream *s, const dev_view *dst, const dev_view *src) {
  dev_kop op;
  memset(&op, 0, sizeof op);
  op.kind = DEV_OP_COPY;
  op.nin = 1;
  op.out = *dst;
  op.in[0] = *src;
  return dev_submit(ctx, s, &op);
}

static dev_view view_of(dev_buf *b) {
  dev_view v;
  memset(&v, 0, sizeof v);
  v.buf = b;
  v.dtype = DEV_F32;
  int64_t four = 4;
  dev_view_set_contiguous(&v, 1, &four);
  return v;
}

int main(void) {
  char err[256];
  signal(SIGALRM, on_alarm);
  alarm(120);
  dev_ctx *ctx = dev_open("host", err, sizeof err);
  if (!ctx) {
    skip_all("cannot open the host backend: %s", err);
    return 0;
  }
  dev_stream *s, *t;
  dev_buf *a, *b, *c;
  dev_event *e;
  ok(dev_stream_create(ctx, DEV_PRIO_NORMAL, 1, &s) == DEV_OK && dev_stream_create(ctx, DEV_PRIO_NORMAL, 1, &t) == DEV_OK &&
     dev_event_create(ctx, 0, &e) == DEV_OK, "two streams and an event");
  ok(dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &a) == DEV_OK && dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &b) == DEV_OK &&
     dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &c) == DEV_OK, "three buffers");
  dev_view va = view_of(a), vb = view_of(b), vc = view_of(c);
  int bad = 0, rounds = 200;
  for (int r = 0; r < rounds && !bad; r++) {
    double d1 = (r % 5) * 0.2, d2 = ((r / 5) % 4) * 0.25;   /* 0-0.8 ms and 0-0.75 ms */
    int rc = sleep_op(ctx, s, d1);
    rc = rc ? rc : fill_op(ctx, s, &va, (float)r);           /* a = r */
    rc = rc ? rc : dev_event_record(e, s);                    /* the middle of s */
    rc = rc ? rc : sleep_op(ctx, s, d2);
    rc = rc ? rc : fill_op(ctx, s, &vb, (float)r);           /* b = r, later */
    rc = rc ? rc : dev_stream_wait_event(t, e);               /* t's worker waits for the middle */
    rc = rc ? rc : copy_op(ctx, t, &vc, &va);                 /* c = a, after the fill of a */
    rc = rc ? rc : dev_stream_synchronize(s);                 /* this thread waits for the end */
    rc = rc ? rc : dev_stream_synchronize(t);
    if (rc || ((float *)b->ptr)[3] != (float)r || ((float *)c->ptr)[0] != (float)r) {
      bad = 1;
      ok(0, "round %d: rc %d, b %g, c %g (%s)", r, rc, (double)((float *)b->ptr)[3],
         (double)((float *)c->ptr)[0], dev_errmsg(ctx) ? dev_errmsg(ctx) : "");
    }
  }
  ok(!bad, "%d rounds: both waiters woke, each after its own position", rounds);
  dev_event_release(e);
  dev_buf_release(a);
  dev_buf_release(b);
  dev_buf_release(c);
  dev_stream_release(s);
  dev_stream_release(t);
  dev_close(ctx);
  return done_testing();
}
