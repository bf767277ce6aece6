/* dev_submit refuses a malformed op with DEV_ERR_INVALID and a message, and
 * reads nothing outside the op: the device layer's own check of what the
 * bindings hand it (under ASan, an out-of-range operand count that was read
 * would be reported). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "tests/tap.h"

static dev_kop op_on(dev_opkind kind, dev_buf *b, int nin) {
  dev_kop op;
  memset(&op, 0, sizeof op);
  op.kind = kind;
  op.out.buf = b;
  op.out.dtype = DEV_F32;
  int64_t shape[1] = {4};
  dev_view_set_contiguous(&op.out, 1, shape);
  for (int i = 0; i < DEV_MAXIN; i++)
    op.in[i] = op.out;
  op.nin = nin;
  return op;
}

/* Negative strides: a copy's input may walk back (flip), in memory of the
 * output's kind; nothing else takes them.  b: 4 f32 of device memory. */
static void negative_strides(dev_ctx *ctx, dev_stream *s, dev_buf *b) {
  dev_buf *o, *h;
  ok(dev_buf_alloc(ctx, DEV_MEM_DEVICE, 16, &o) == DEV_OK && dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &h) == DEV_OK,
     "buffers for the reversed copies");
  float v[4] = {1, 2, 3, 4}, r[4] = {0};
  dev_kop up = op_on(DEV_OP_COPY, o, 1);
  up.in[0].buf = h;
  memcpy(h->ptr, v, sizeof v);
  ok(dev_submit(ctx, s, &up) == DEV_OK, "pinned to device, forwards");
  dev_kop back = op_on(DEV_OP_COPY, b, 1);
  back.in[0].buf = o;
  back.in[0].offset = 12;
  back.in[0].stride[0] = -1;
  ok(dev_submit(ctx, s, &back) == DEV_OK, "a copy of a reversed view: accepted");
  dev_kop down = op_on(DEV_OP_COPY, h, 1);
  down.in[0].buf = b;
  ok(dev_submit(ctx, s, &down) == DEV_OK && dev_synchronize(ctx) == DEV_OK, "and back to pinned");
  memcpy(r, h->ptr, sizeof r);
  ok(r[0] == 4 && r[1] == 3 && r[2] == 2 && r[3] == 1, "reversed: %g %g %g %g", r[0], r[1], r[2], r[3]);
  dev_kop cross = op_on(DEV_OP_COPY, h, 1);
  cross.in[0].buf = o;
  cross.in[0].offset = 12;
  cross.in[0].stride[0] = -1;
  ok(dev_submit(ctx, s, &cross) == DEV_ERR_INVALID, "device to pinned walking back: refused (%s)",
     dev_errmsg(ctx) ? dev_errmsg(ctx) : "(none)");
  dev_kop neg = op_on(DEV_OP_UNARY, b, 1);
  neg.in[0].offset = 12;
  neg.in[0].stride[0] = -1;
  ok(dev_submit(ctx, s, &neg) == DEV_ERR_INVALID, "a unary op's reversed input: refused (%s)",
     dev_errmsg(ctx) ? dev_errmsg(ctx) : "(none)");
  dev_kop out = op_on(DEV_OP_COPY, b, 1);
  out.in[0].buf = o;
  out.out.offset = 12;
  out.out.stride[0] = -1;
  ok(dev_submit(ctx, s, &out) == DEV_ERR_INVALID, "a copy's reversed output: refused");
  dev_synchronize(ctx);
  dev_buf_release(o);
  dev_buf_release(h);
}

/* A fused op ending in a reduction (DEV_F_FREDUCE): the reductions its
 * program may end in, its dim, its output's size and dtype are checked; a
 * well-formed one reduces the program's values, also into an output that
 * is one of its inputs (through a temporary, as any op that is not
 * elementwise). */
static void fused_reductions(dev_ctx *ctx, dev_stream *s) {
  char err[256];
  dev_fnode nodes[3] = {{.kind = DEV_FN_INPUT, .dtype = DEV_F32, .index = 0},
                        {.kind = DEV_FN_CONST, .dtype = DEV_NDTYPE, .k = {0, 0, 2}},
                        {.kind = DEV_FN_BINARY, .code = DEV_BIN_MUL, .dtype = DEV_F32, .a = {0, 1}}};
  int last = 2, sum = DEV_RED_SUM;
  const dev_fprog *p = dev_fprog_intern_red("twice", nodes, 3, &last, 1, &sum, err, sizeof err);
  const dev_fprog *plain = dev_fprog_intern("twice", nodes, 3, err, sizeof err);
  static const int refused_codes[] = {DEV_RED_ARGMAX, DEV_RED_VAR, DEV_NREDOP + 3, -1};
  for (size_t i = 0; i < sizeof refused_codes / sizeof refused_codes[0]; i++)
    ok(!dev_fprog_intern_red("bad", nodes, 3, &last, 1, &refused_codes[i], err, sizeof err),
       "a program ending in reduction %d: refused (%s)", refused_codes[i], err);
  dev_buf *in, *o;
  ok(p != NULL && plain != NULL && p != plain && dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &in) == DEV_OK &&
     dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &o) == DEV_OK, "a program sum(x * 2), x * 2 apart, and their buffers");
  if (!p || !plain) return;
  float v[4] = {1, 2, 3, 4};
  memcpy(in->ptr, v, sizeof v);
  dev_kop f = op_on(DEV_OP_FUSED, in, 1);
  f.fprog = p;
  f.flags = DEV_F_FREDUCE;
  f.dim = -1;
  f.out.buf = o;
  f.out.dtype = dev_redop_dtype(DEV_RED_SUM, DEV_F32);
  int64_t one[1] = {1}, two[1] = {2};
  dev_view_set_contiguous(&f.out, 1, one);
  static const struct { int flags, dim, n; dev_dtype t; const char *what; } bad[] = {
      {0, -1, 1, DEV_F32, "without the flag"},
      {DEV_F_FREDUCE, 1, 1, DEV_F32, "dim 1 of a 1-dim result"},
      {DEV_F_FREDUCE, -2, 1, DEV_F32, "dim -2"},
      {DEV_F_FREDUCE, -1, 2, DEV_F32, "an output of 2 elements"},
      {DEV_F_FREDUCE, -1, 1, DEV_I32, "an output of another dtype"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dev_kop g = f;
    g.flags = bad[i].flags;
    g.dim = bad[i].dim;
    g.out.dtype = bad[i].t;
    dev_view_set_contiguous(&g.out, 1, bad[i].n == 2 ? two : one);
    int rc = dev_submit(ctx, s, &g);
    const char *msg = dev_errmsg(ctx);
    ok(rc == DEV_ERR_INVALID, "fused reduction, %s: refused (%s)", bad[i].what, msg ? msg : "(none)");
  }
  dev_kop pf = f;
  pf.fprog = plain;
  ok(dev_submit(ctx, s, &pf) == DEV_ERR_INVALID, "the flag on a program without reductions: refused (%s)",
     dev_errmsg(ctx));
  int ran = dev_submit(ctx, s, &f) == DEV_OK && dev_synchronize(ctx) == DEV_OK;
  ok(ran && ((float *)o->ptr)[0] == 20, "sum of x * 2: 20 (got %g)", (double)((float *)o->ptr)[0]);
  dev_kop g = f;
  g.out = f.in[0];
  dev_view_set_contiguous(&g.out, 1, one);   /* element 1 of the input */
  ok(dev_submit(ctx, s, &g) == DEV_OK && dev_synchronize(ctx) == DEV_OK && ((float *)in->ptr)[0] == 20 &&
     ((float *)in->ptr)[3] == 4, "into its own input's first element: 20, the rest untouched");
  dev_buf_release(in);
  dev_buf_release(o);
}

/* A fused program of several results (dev_fprog_intern_res): the results
 * checked when interned; an op of it writes each output in one pass,
 * after reading its inputs (here an output is its own input); outputs that
 * overlap, of another dtype or shape, or without the op's fargs are
 * refused, nothing written. */
static void fused_results(dev_ctx *ctx, dev_stream *s) {
  char err[256];
  dev_fnode nodes[4] = {{.kind = DEV_FN_INPUT, .dtype = DEV_F32, .index = 0},
                        {.kind = DEV_FN_CONST, .dtype = DEV_NDTYPE, .k = {0, 0, 2}},
                        {.kind = DEV_FN_BINARY, .code = DEV_BIN_MUL, .dtype = DEV_F32, .a = {0, 1}},
                        {.kind = DEV_FN_BINARY, .code = DEV_BIN_ADD, .dtype = DEV_F32, .a = {0, 1}}};
  static const struct { int nout, res[DEV_FMAXOUT]; const char *what; } bad[] = {
      {0, {0}, "no result"}, {5, {2, 3, 2, 3}, "five results"}, {2, {2, 4}, "a node past the end"},
      {2, {-1, 2}, "node -1"}, {2, {2, 1}, "a number as a result"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const dev_fprog *q = dev_fprog_intern_res("bad", nodes, 4, bad[i].res, bad[i].nout, err, sizeof err);
    ok(q == NULL, "results, %s: refused (%s)", bad[i].what, q ? "accepted" : err);
  }
  int res[2] = {2, 3};
  const dev_fprog *p = dev_fprog_intern_res("twice_and_plus2", nodes, 4, res, 2, err, sizeof err);
  dev_buf *x, *o;
  ok(p != NULL && p->nout == 2 && dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &x) == DEV_OK &&
     dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &o) == DEV_OK, "a program of x * 2 and x + 2, and its buffers");
  if (!p) return;
  float v[4] = {1, 2, 3, 4};
  memcpy(x->ptr, v, sizeof v);
  memset(o->ptr, 0, 16);
  dev_fargs fa;
  memset(&fa, 0, sizeof fa);
  dev_kop f = op_on(DEV_OP_FUSED, x, 1);
  f.fprog = p;
  fa.xout[0] = f.out;
  fa.xout[0].buf = o;
  dev_kop nofa = f;
  ok(dev_submit(ctx, s, &nofa) == DEV_ERR_INVALID, "without fargs: refused (%s)", dev_errmsg(ctx));
  f.fargs = &fa;
  dev_fargs same = fa, wide = fa, other = fa;
  same.xout[0].buf = x;
  wide.xout[0].dtype = DEV_F64;
  other.xout[0].shape[0] = 2;
  const dev_fargs *refused[] = {&same, &wide, &other};
  const char *why[] = {"outputs that overlap", "an output of another dtype", "an output of another shape"};
  for (int i = 0; i < 3; i++) {
    dev_kop g = f;
    g.fargs = refused[i];
    ok(dev_submit(ctx, s, &g) == DEV_ERR_INVALID, "%s: refused (%s)", why[i], dev_errmsg(ctx));
  }
  dev_kop r = f;
  r.flags = DEV_F_FREDUCE;
  r.dim = -1;
  ok(dev_submit(ctx, s, &r) == DEV_ERR_INVALID, "the reduction flag on a program without: refused (%s)",
     dev_errmsg(ctx));
  ok(dev_synchronize(ctx) == DEV_OK && ((float *)x->ptr)[0] == 1 && ((float *)o->ptr)[0] == 0,
     "nothing written by the refused ops");
  ok(dev_submit(ctx, s, &f) == DEV_OK && dev_synchronize(ctx) == DEV_OK, "x * 2 into x, x + 2 into o: one op");
  const float *a = x->ptr, *b = o->ptr;
  ok(a[0] == 2 && a[3] == 8 && b[0] == 3 && b[3] == 6, "x = %g..%g (2..8), o = %g..%g (3..6): both read the old x",
     (double)a[0], (double)a[3], (double)b[0], (double)b[3]);
  dev_buf_release(x);
  dev_buf_release(o);
}

/* A fused program of several results, each reduced (dev_fprog_intern_red):
 * results of different dtypes refused when interned; an op of it reduces
 * each into its own output in one op, the outputs of the reductions'
 * dtypes, checked as a program of several results' are. */
static void fused_two_reductions(dev_ctx *ctx, dev_stream *s) {
  char err[256];
  dev_fnode nodes[5] = {{.kind = DEV_FN_INPUT, .dtype = DEV_I32, .index = 0},
                        {.kind = DEV_FN_CONST, .dtype = DEV_NDTYPE, .k = {1, 2, 2}},
                        {.kind = DEV_FN_BINARY, .code = DEV_BIN_MUL, .dtype = DEV_I32, .a = {0, 1}},
                        {.kind = DEV_FN_BINARY, .code = DEV_BIN_SUB, .dtype = DEV_I32, .a = {0, 1}},
                        {.kind = DEV_FN_BINARY, .code = DEV_BIN_GT, .dtype = DEV_BOOL, .a = {0, 1}}};
  int res[2] = {2, 3}, mixed[2] = {2, 4}, red[2] = {DEV_RED_SUM, DEV_RED_MAX};
  ok(!dev_fprog_intern_red("mixed", nodes, 5, mixed, 2, red, err, sizeof err),
     "reductions of an i32 and a bool result in one program: refused (%s)", err);
  const dev_fprog *p = dev_fprog_intern_red("sum_and_max", nodes, 5, res, 2, red, err, sizeof err);
  dev_buf *x, *o;
  ok(p != NULL && p->nred == 2 && dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &x) == DEV_OK &&
     dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &o) == DEV_OK, "sum(x * 2) and max(x - 2) of i32, and buffers");
  if (!p) return;
  int32_t v[4] = {1, -7, 3, 5};
  memcpy(x->ptr, v, sizeof v);
  memset(o->ptr, 0, 16);
  dev_fargs fa;
  memset(&fa, 0, sizeof fa);
  dev_kop f = op_on(DEV_OP_FUSED, x, 1);
  f.fprog = p;
  f.in[0].dtype = DEV_I32;
  f.flags = DEV_F_FREDUCE;
  f.dim = -1;
  f.fargs = &fa;
  int64_t one[1] = {1};
  f.out.buf = o;
  f.out.dtype = DEV_I64;   /* an integer sum's */
  dev_view_set_contiguous(&f.out, 1, one);
  fa.xout[0] = f.out;
  fa.xout[0].offset = 8;
  fa.xout[0].dtype = DEV_I32;   /* max keeps the dtype */
  dev_kop g = f;
  g.out.dtype = DEV_I32;
  ok(dev_submit(ctx, s, &g) == DEV_ERR_INVALID, "the sum into an i32 output: refused (%s)", dev_errmsg(ctx));
  dev_fargs wide = fa;
  wide.xout[0].dtype = DEV_I64;
  g = f;
  g.fargs = &wide;
  ok(dev_submit(ctx, s, &g) == DEV_ERR_INVALID, "the max into an i64 output: refused (%s)", dev_errmsg(ctx));
  ok(dev_check_op(ctx, &g) == DEV_ERR_INVALID, "dev_check_op: the same refusal (%s)", dev_errmsg(ctx));
  int checked = dev_check_op(ctx, &f) == DEV_OK && dev_synchronize(ctx) == DEV_OK;
  int64_t none = -1;
  memcpy(&none, o->ptr, 8);
  ok(checked && none == 0, "dev_check_op of the good op: accepted, nothing run (out %lld)", (long long)none);
  int rc = dev_submit(ctx, s, &f);
  ok(rc == DEV_OK && dev_synchronize(ctx) == DEV_OK, "both reductions: one op (%s)", rc ? dev_errmsg(ctx) : "ran");
  int64_t sum;
  int32_t max;
  memcpy(&sum, o->ptr, 8);
  memcpy(&max, (char *)o->ptr + 8, 4);
  ok(sum == 4 && max == 3, "sum(x * 2) = %lld (4), max(x - 2) = %d (3)", (long long)sum, max);
  dev_buf_release(x);
  dev_buf_release(o);
}

/* A sort with its values (DEV_SORT_VALUES): the values' view in fargs,
 * checked as an output, of the positions' shape and the input's dtype;
 * the positions and the values in one op. */
static void sort_values(dev_ctx *ctx, dev_stream *s) {
  dev_buf *x, *pos, *val;
  ok(dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &x) == DEV_OK && dev_buf_alloc(ctx, DEV_MEM_PINNED, 32, &pos) == DEV_OK &&
     dev_buf_alloc(ctx, DEV_MEM_PINNED, 16, &val) == DEV_OK, "sort: a tensor of 4 f32 and its results' buffers");
  float v[4] = {3, -1, 2, -1};
  memcpy(x->ptr, v, sizeof v);
  memset(val->ptr, 0, 16);
  dev_kop op = op_on(DEV_OP_SORT, x, 1);
  op.out.buf = pos;
  op.out.dtype = DEV_I64;
  op.code = DEV_SORT_STABLE | DEV_SORT_VALUES;
  dev_fargs fa;
  memset(&fa, 0, sizeof fa);
  fa.xout[0] = op.in[0];
  fa.xout[0].buf = val;
  ok(dev_submit(ctx, s, &op) == DEV_ERR_INVALID, "values asked for without fargs: refused (%s)", dev_errmsg(ctx));
  op.fargs = &fa;
  dev_fargs wide = fa, other = fa, over = fa, into = fa;
  wide.xout[0].dtype = DEV_F64;
  other.xout[0].shape[0] = 2;
  over.xout[0].buf = pos;   /* f32 values over the positions */
  into.xout[0].buf = NULL;
  const dev_fargs *refused[] = {&wide, &other, &over, &into};
  const char *why[] = {"values of another dtype", "values of another shape", "values over the positions",
                       "values without a buffer"};
  for (int i = 0; i < 4; i++) {
    dev_kop g = op;
    g.fargs = refused[i];
    ok(dev_submit(ctx, s, &g) == DEV_ERR_INVALID, "%s: refused (%s)", why[i], dev_errmsg(ctx));
  }
  dev_kop bad = op;
  bad.code = 8;
  ok(dev_submit(ctx, s, &bad) == DEV_ERR_INVALID, "an unknown sort flag: refused (%s)", dev_errmsg(ctx));
  ok(dev_synchronize(ctx) == DEV_OK && ((float *)val->ptr)[0] == 0, "nothing written by the refused ops");
  ok(dev_submit(ctx, s, &op) == DEV_OK && dev_synchronize(ctx) == DEV_OK, "positions and values: one op");
  const int64_t *p = pos->ptr;
  const float *w = val->ptr;
  ok(p[0] == 2 && p[1] == 4 && p[2] == 3 && p[3] == 1, "positions %lld %lld %lld %lld (2 4 3 1: ties in order)",
     (long long)p[0], (long long)p[1], (long long)p[2], (long long)p[3]);
  ok(w[0] == -1 && w[1] == -1 && w[2] == 2 && w[3] == 3, "values %g %g %g %g", (double)w[0], (double)w[1],
     (double)w[2], (double)w[3]);
  dev_buf_release(x);
  dev_buf_release(pos);
  dev_buf_release(val);
}

int main(void) {
  char err[256];
  dev_ctx *ctx = dev_open("host", err, sizeof err);
  if (!ctx) {
    skip_all("cannot open the host backend: %s", err);
    return 0;
  }
  dev_stream *s = dev_default_stream(ctx);
  dev_buf *b;
  ok(dev_buf_alloc(ctx, DEV_MEM_DEVICE, 16, &b) == DEV_OK, "a buffer of 4 f32");

  static const struct { dev_opkind kind; const char *name; } kinds[] = {
    {DEV_OP_FILL, "fill"}, {DEV_OP_ARANGE, "arange"}, {DEV_OP_RAND, "rand"},
    {DEV_OP_UNARY, "unary"}, {DEV_OP_BINARY, "binary"}, {DEV_OP_TERNARY, "ternary"}, {DEV_OP_REDUCE, "reduce"},
    {DEV_OP_MATMUL, "matmul"}, {DEV_OP_COPY, "copy"}};
  static const int bad_nin[] = {-1, DEV_MAXIN + 1, 1000000};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (size_t j = 0; j < sizeof bad_nin / sizeof bad_nin[0]; j++) {
      dev_kop op = op_on(kinds[k].kind, b, bad_nin[j]);
      int rc = dev_submit(ctx, s, &op);
      const char *msg = dev_errmsg(ctx);
      ok(rc == DEV_ERR_INVALID && msg != NULL && strstr(msg, "operand") != NULL,
         "%s with %d inputs is refused: %s", kinds[k].name, bad_nin[j], msg ? msg : "(none)");
    }
  /* A fused op's operands past in[] live in its fargs: without them, more
   * than DEV_MAXIN operands are refused, never read from past the op. */
  dev_fnode nodes[DEV_FMAXIN * 2];
  int nn = 0;
  for (int i = 0; i < DEV_MAXIN + 1; i++) nodes[nn++] = (dev_fnode){.kind = DEV_FN_INPUT, .dtype = DEV_F32, .index = i};
  for (int i = 1; i < DEV_MAXIN + 1; i++) {
    int prev = i == 1 ? 0 : nn - 1;
    nodes[nn] = (dev_fnode){.kind = DEV_FN_BINARY, .code = DEV_BIN_ADD, .dtype = DEV_F32, .a = {prev, i}};
    nn++;
  }
  const dev_fprog *p = dev_fprog_intern("sum4", nodes, nn, err, sizeof err);
  ok(p != NULL, "a program of %d inputs: %s", DEV_MAXIN + 1, p ? "interned" : err);
  if (p) {
    dev_kop f = op_on(DEV_OP_FUSED, b, DEV_MAXIN + 1);
    f.fprog = p;
    int rc = dev_submit(ctx, s, &f);
    const char *msg = dev_errmsg(ctx);
    ok(rc == DEV_ERR_INVALID, "fused, %d inputs, no fargs: refused (%s)", DEV_MAXIN + 1, msg ? msg : "(none)");
    dev_fargs fa;
    memset(&fa, 0, sizeof fa);
    fa.xin[0] = f.out;
    f.fargs = &fa;
    ok(dev_submit(ctx, s, &f) == DEV_OK && dev_synchronize(ctx) == DEV_OK, "with its fargs: runs");
  }
  dev_kop fill = op_on(DEV_OP_FILL, b, 0);
  ok(dev_submit(ctx, s, &fill) == DEV_OK && dev_synchronize(ctx) == DEV_OK, "a well-formed fill still runs");

  negative_strides(ctx, s, b);
  fused_reductions(ctx, s);
  fused_results(ctx, s);
  fused_two_reductions(ctx, s);
  sort_values(ctx, s);
  dev_buf_release(b);
  dev_close(ctx);
  return done_testing();
}
