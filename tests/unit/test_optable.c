/* The op table (cuda/ops.h) is the one dtype rule: for every elementwise op
 * (unary, binary, ternary) and dtype, the device layer's validation
 * (dev_submit) and the host kernels (dev_cpu_run, which the CUDA kernels
 * mirror from the same table) accept exactly the dtypes of the op's classes
 * column, and produce its result dtype.  Before the table, the kernels took bool for neg/abs/relu (and for
 * every binary op) where validation refused it. */
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "cpu_ops.h"
#include "tests/tap.h"

#define N 4

static dev_view view(dev_buf *b, dev_dtype t) {
  dev_view v;
  int64_t n = N;
  memset(&v, 0, sizeof v);
  v.buf = b;
  v.dtype = t;
  dev_view_set_contiguous(&v, 1, &n);
  return v;
}

/* dev_cpu_run and dev_submit on op, both: 1 accepted, 0 refused, -1 they
 * disagree */
static int verdict(dev_ctx *ctx, const dev_kop *op, char *why, size_t n) {
  char err[256] = "";
  int cpu = dev_cpu_run(op, err, sizeof err) == 0;
  int dev = dev_submit(ctx, NULL, op) == DEV_OK;
  snprintf(why, n, "cpu: %s; submit: %s", cpu ? "ok" : err, dev ? "ok" : dev_errmsg(ctx));
  return cpu == dev ? cpu : -1;
}

/* A host buffer of N elements per dtype: in and in2 hold ones, out takes
 * results. */
typedef struct bufs { dev_buf *in[DEV_NDTYPE], *in2[DEV_NDTYPE], *out[DEV_NDTYPE]; } bufs;

/* unary ops: the dtypes their classes take, into their result dtype */
static void check_unary(dev_ctx *ctx, const bufs *b) {
  char why[600];
  for (int code = DEV_UN_COPY + 1; code < DEV_NUNOP; code++) {
    const dev_opinfo *o = dev_unop_info(code);
    for (int t = 0; t < DEV_NDTYPE; t++) {
      dev_dtype rt = o->to_bool ? DEV_BOOL : (dev_dtype)t;
      dev_kop op = {.kind = DEV_OP_UNARY, .code = code, .nin = 1, .out = view(b->out[rt], rt)};
      op.in[0] = view(b->in[t], t);
      int want = (dev_dtype_class(t) & o->classes) != 0, got = verdict(ctx, &op, why, sizeof why);
      ok(got == want, "%s %s: %s (%s)", o->name, dev_dtype_name(t), want ? "accepted" : "refused", why);
      if (o->to_bool || !want) continue;
      /* a bool result is the only other dtype a SAME op may not write */
      op.out = view(b->out[DEV_BOOL], DEV_BOOL);
      if (t != DEV_BOOL) ok(verdict(ctx, &op, why, sizeof why) == 0, "%s %s into bool: refused", o->name, dev_dtype_name(t));
    }
  }
}

/* binary ops: two tensors, a number on the right, a number on the left */
static void check_binary(dev_ctx *ctx, const bufs *b) {
  char why[600];
  for (int code = 0; code < DEV_NBINOP; code++) {
    const dev_opinfo *o = dev_binop_info(code);
    for (int t = 0; t < DEV_NDTYPE; t++) {
      dev_dtype rt = o->to_bool ? DEV_BOOL : (dev_dtype)t;
      int want = (dev_dtype_class(t) & o->classes) != 0;
      dev_kop op = {.kind = DEV_OP_BINARY, .code = code, .nin = 2, .out = view(b->out[rt], rt)};
      op.in[0] = view(b->in[t], t);
      op.in[1] = view(b->in2[t], t);
      ok(verdict(ctx, &op, why, sizeof why) == want, "%s %s: %s (%s)", o->name, dev_dtype_name(t),
         want ? "accepted" : "refused", why);
      op.nin = 1;
      op.flags = DEV_F_SCALAR;
      op.s0 = (dev_scalar){1, 1, 1};
      ok(verdict(ctx, &op, why, sizeof why) == want, "%s %s with a scalar: %s (%s)", o->name, dev_dtype_name(t),
         want ? "accepted" : "refused", why);
      /* a number on the left only where the table says so */
      op.flags = DEV_F_SCALAR | DEV_F_SCALAR_LEFT;
      int got = dev_submit(ctx, NULL, &op) == DEV_OK;
      ok(got == (want && (o->flags & DEV_OPF_LEFT)), "%s %s with a scalar on the left: %s (%s)", o->name,
         dev_dtype_name(t), got ? "accepted" : "refused", got ? "ok" : dev_errmsg(ctx));
    }
  }
}

/* ternary ops: three tensors, a number as operand 2, the condition's dtype */
static void check_ternary(dev_ctx *ctx, const bufs *b) {
  char why[600];
  for (int code = 0; code < DEV_NTEROP; code++) {
    const dev_opinfo *o = dev_terop_info(code);
    for (int t = 0; t < DEV_NDTYPE; t++) {
      int want = (dev_dtype_class(t) & o->classes) != 0;
      dev_dtype ct = (o->flags & DEV_OPF_COND) ? DEV_BOOL : (dev_dtype)t;
      dev_kop op = {.kind = DEV_OP_TERNARY, .code = code, .nin = 3, .out = view(b->out[t], t)};
      op.in[0] = view(b->in[ct], ct);
      op.in[1] = view(b->in[t], t);
      op.in[2] = view(b->in2[t], t);
      ok(verdict(ctx, &op, why, sizeof why) == want, "%s %s: %s (%s)", o->name, dev_dtype_name(t),
         want ? "accepted" : "refused", why);
      /* operand 2 a number: the tensors pack from in[0] */
      op.nin = 2;
      op.flags = DEV_F_SCALAR2;
      op.s0 = (dev_scalar){1, 1, 1};
      op.in[1] = op.in[2];
      ok(verdict(ctx, &op, why, sizeof why) == want, "%s %s with a number: %s (%s)", o->name, dev_dtype_name(t),
         want ? "accepted" : "refused", why);
      if (!(o->flags & DEV_OPF_COND) || t == DEV_BOOL) continue;
      /* a condition of the op's dtype is refused */
      op.in[0] = view(b->in[t], t);
      ok(verdict(ctx, &op, why, sizeof why) == 0, "%s %s with a %s condition: refused", o->name, dev_dtype_name(t),
         dev_dtype_name(t));
    }
  }
}

int main(void) {
  char err[256];
  dev_ctx *ctx = dev_open("host", err, sizeof err);
  if (!ctx) {
    skip_all("cannot open the host backend: %s", err);
    return 0;
  }
  bufs b;
  for (int t = 0; t < DEV_NDTYPE; t++) {
    /* ones: no integer division by zero */
    dev_buf_alloc(ctx, DEV_MEM_HOST, N * 8, &b.in[t]);
    dev_buf_alloc(ctx, DEV_MEM_HOST, N * 8, &b.in2[t]);
    dev_buf_alloc(ctx, DEV_MEM_HOST, N * 8, &b.out[t]);
    dev_kop fill = {.kind = DEV_OP_FILL, .out = view(b.in[t], t), .s0 = {1, 1, 1}};
    dev_submit(ctx, NULL, &fill);
    fill.out = view(b.in2[t], t);
    dev_submit(ctx, NULL, &fill);
  }

  check_unary(ctx, &b);
  check_binary(ctx, &b);
  check_ternary(ctx, &b);

  for (int t = 0; t < DEV_NDTYPE; t++) {
    dev_buf_release(b.in[t]);
    dev_buf_release(b.in2[t]);
    dev_buf_release(b.out[t]);
  }
  dev_close(ctx);
  return done_testing();
}
