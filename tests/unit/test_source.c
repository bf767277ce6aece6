/* dev_copy_source (device.h): a staged copy of bytes a dev_source makes
 * (gpu.load_npz's inflater), on the host backend.  The bytes arrive in
 * order, across chunks and copies in flight at once; a failed fill is an
 * async error at the next sync, with the call's script position and the
 * fill's message; where nothing is staged (a host-visible destination) the
 * bytes are made at the call and a failed fill fails it; and the source is
 * closed exactly once in every case, the refused ones included. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "tests/tap.h"

/* Bytes (pos * 7 + seed) & 0xff in order; fails at byte fail_at (when not
 * negative); counts its fills, bytes and closes. */
typedef struct counter {
  uint64_t pos;
  int64_t fail_at;
  unsigned seed;
  atomic_int fills, closes;
  atomic_int out_of_order;
} counter;

static unsigned char byte_at(unsigned seed, uint64_t i) { return (unsigned char)((i * 7 + seed) & 0xff); }

static int c_fill(void *ud, void *dst, size_t n, char *err, size_t errlen) {
  counter *c = ud;
  atomic_fetch_add(&c->fills, 1);
  if (c->fail_at >= 0 && c->pos + n > (uint64_t)c->fail_at) {
    snprintf(err, errlen, "made-up corruption at byte %lld", (long long)c->fail_at);
    return -1;
  }
  unsigned char *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = byte_at(c->seed, c->pos + i);
  c->pos += n;
  return 0;
}

static void c_close(void *ud) {
  counter *c = ud;
  atomic_fetch_add(&c->closes, 1);
}

static dev_source source_of(counter *c) { return (dev_source){c_fill, c_close, c}; }

static void counter_init(counter *c, unsigned seed, int64_t fail_at) {
  memset(c, 0, sizeof *c);
  c->seed = seed;
  c->fail_at = fail_at;
}

/* The closes once they settle: a job's last reference may go on a staging
 * thread a moment after the stream passed it. */
static int closes_settled(counter *c) {
  for (int i = 0; i < 1000 && atomic_load(&c->closes) == 0; i++)
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  return atomic_load(&c->closes);
}

static dev_view bytes_view(dev_buf *b, int64_t n) {
  dev_view v;
  memset(&v, 0, sizeof v);
  v.buf = b;
  v.dtype = DEV_U8;
  dev_view_set_contiguous(&v, 1, &n);
  return v;
}

/* 1 when dst (n bytes, read back) holds seed's sequence */
static int holds(dev_ctx *ctx, dev_stream *s, const dev_view *v, unsigned seed, int64_t n) {
  unsigned char *h = malloc((size_t)n);
  int good = h && dev_read(ctx, s, v, h) == DEV_OK;
  for (int64_t i = 0; good && i < n; i++) good = h[i] == byte_at(seed, (uint64_t)i);
  free(h);
  return good;
}

enum { NCOPY = 6 };
static const int64_t N = (3 << 20) + 17;

/* several copies in flight at once, of several chunks each, into b[] */
static void in_flight(dev_ctx *ctx, dev_stream *s, dev_buf **b) {
  counter c[NCOPY];
  int queued = 1;
  for (int k = 0; k < NCOPY; k++) {
    counter_init(&c[k], (unsigned)k + 1, -1);
    queued &= dev_buf_alloc(ctx, DEV_MEM_DEVICE, (size_t)N, &b[k]) == DEV_OK;
    dev_view v = bytes_view(b[k], N);
    dev_source src = source_of(&c[k]);
    queued &= dev_copy_source(ctx, s, &v, &src) == DEV_OK;
  }
  ok(queued, "%d copies of %lld bytes queued", NCOPY, (long long)N);
  ok(dev_synchronize(ctx) == DEV_OK, "and done at the sync");
  for (int k = 0; k < NCOPY; k++) {
    dev_view v = bytes_view(b[k], N);
    ok(holds(ctx, s, &v, c[k].seed, N) && c[k].pos == (uint64_t)N,
       "copy %d: every byte in order (%d fills)", k + 1, atomic_load(&c[k].fills));
    ok(closes_settled(&c[k]) == 1, "copy %d: its source closed once", k + 1);
  }
}

/* a fill that fails past the first chunk: an async error at the sync */
static void failing(dev_ctx *ctx, dev_stream *s, dev_buf *b) {
  counter bad;
  counter_init(&bad, 9, (int64_t)(2 << 20));
  dev_set_site(ctx, "load.lua:7");
  dev_view v0 = bytes_view(b, N);
  dev_source src = source_of(&bad);
  ok(dev_copy_source(ctx, s, &v0, &src) == DEV_OK, "a failing source: queued");
  dev_set_site(ctx, "load.lua:9");
  int rc = dev_synchronize(ctx);
  const char *msg = dev_errmsg(ctx);
  ok(rc == DEV_ERR_ASYNC && msg && strstr(msg, "load.lua:7: made-up corruption at byte 2097152"),
     "the sync raises it, with the call's position: %s", msg ? msg : "(none)");
  ok(closes_settled(&bad) == 1, "its source closed once");
  ok(dev_synchronize(ctx) == DEV_OK, "reported once: the next sync is clean");
  counter after;
  counter_init(&after, 3, -1);
  src = source_of(&after);
  ok(dev_copy_source(ctx, s, &v0, &src) == DEV_OK && dev_synchronize(ctx) == DEV_OK && holds(ctx, s, &v0, 3, N),
     "the buffer takes a good copy after");
}

/* a pinned destination: made at the call */
static void made_here(dev_ctx *ctx, dev_stream *s) {
  dev_buf *p;
  ok(dev_buf_alloc(ctx, DEV_MEM_PINNED, 1000, &p) == DEV_OK, "a pinned buffer");
  counter here;
  counter_init(&here, 5, -1);
  dev_view pv = bytes_view(p, 1000);
  dev_source src = source_of(&here);
  ok(dev_copy_source(ctx, s, &pv, &src) == DEV_OK && atomic_load(&here.closes) == 1 && here.pos == 1000,
     "to pinned memory: filled and closed at the call");
  int good = 1;
  for (int i = 0; i < 1000; i++) good &= ((unsigned char *)p->ptr)[i] == byte_at(5, (uint64_t)i);
  ok(good, "with the bytes in order");
  counter_init(&here, 5, 10);
  src = source_of(&here);
  int rc = dev_copy_source(ctx, s, &pv, &src);
  const char *msg = dev_errmsg(ctx);
  ok(rc != DEV_OK && msg && strstr(msg, "made-up corruption at byte 10") && atomic_load(&here.closes) == 1,
     "a failed fill there fails the call (%s), closed once", msg ? msg : "(none)");
  dev_buf_release(p);
}

/* refused: nothing filled, closed once */
static void refused(dev_ctx *ctx, dev_stream *s, dev_buf *b) {
  counter no;
  counter_init(&no, 1, -1);
  dev_view strided = bytes_view(b, 8);
  strided.stride[0] = 2;
  dev_source src = source_of(&no);
  int rc = dev_copy_source(ctx, s, &strided, &src);
  ok(rc == DEV_ERR_INVALID && atomic_load(&no.fills) == 0 && atomic_load(&no.closes) == 1,
     "a destination with strides: refused (%s), nothing filled, closed once", dev_errmsg(ctx));
  counter_init(&no, 1, -1);
  dev_view none = bytes_view(NULL, 8);
  src = source_of(&no);
  rc = dev_copy_source(ctx, s, &none, &src);
  ok(rc == DEV_ERR_INVALID && atomic_load(&no.fills) == 0 && atomic_load(&no.closes) == 1,
     "no buffer: refused (%s), closed once", dev_errmsg(ctx));
  counter_init(&no, 1, -1);
  dev_view empty = bytes_view(b, 0);
  src = source_of(&no);
  ok(dev_copy_source(ctx, s, &empty, &src) == DEV_OK && atomic_load(&no.fills) == 0 &&
     atomic_load(&no.closes) == 1, "zero bytes: nothing filled, closed once");
}

int main(void) {
  char err[256];
  dev_ctx *ctx = dev_open("host", err, sizeof err);
  if (!ctx) {
    skip_all("cannot open the host backend: %s", err);
    return 0;
  }
  dev_stream *s = dev_default_stream(ctx);
  dev_buf *b[NCOPY];
  in_flight(ctx, s, b);
  failing(ctx, s, b[0]);
  made_here(ctx, s);
  refused(ctx, s, b[1]);
  for (int k = 0; k < NCOPY; k++) dev_buf_release(b[k]);
  dev_close(ctx);
  return done_testing();
}
