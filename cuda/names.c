/* The names of ops and collectives in messages and traces ("add", "copy",
 * "all_reduce #3"): pure functions, low in the layer, so that the race
 * checker, traces and the shared-memory transport need not call up into
 * dev_op.c or dev_coll.c for them. */
#include <stdio.h>
#include <string.h>

#include "device.h"

/* The kinds' own names, from their rows in ops.h. */
#define KIND_NAME(E, name, fl) #name,
static const char *const kind_names[] = { DEV_OP_KINDS(KIND_NAME) };
#undef KIND_NAME

/* The op's name in messages: its kind's, or, for a kind of several ops, the
 * op's (its row in ops.h, its kernel's name). */
const char *dev_op_name(const dev_kop *op) {
  switch (op->kind) {
  case DEV_OP_RAND: return op->code == DEV_RAND_NORMAL ? "randn" : op->code == DEV_RAND_INT ? "randint" : "rand";
  case DEV_OP_UNARY: return dev_unop_name(op->code);
  case DEV_OP_BINARY: return dev_binop_name(op->code);
  case DEV_OP_TERNARY: return dev_terop_name(op->code);
  case DEV_OP_REDUCE: return dev_redop_name(op->code);
  case DEV_OP_CUMSUM: return op->code == DEV_CUM_PROD ? "cumprod" : "cumsum";
  case DEV_OP_SOFTMAX: return op->code == DEV_LOG_SOFTMAX ? "log_softmax" : "softmax";
  case DEV_OP_INDEX:
    return op->code == DEV_IDX_SELECT ? "index_select" : op->code == DEV_IDX_GATHER ? "gather" : "scatter_add_";
  case DEV_OP_LAUNCH: return op->launch && op->launch->k ? op->launch->k->sig.name : "kernel";
  case DEV_OP_FUSED: return op->fprog ? op->fprog->name : "fused";
  default: return (unsigned)op->kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[op->kind] : "op";
  }
}


const char *dev_coll_name(dev_coll_kind k) {
  static const char *const names[DEV_NCOLL] = {"all_reduce", "broadcast", "reduce", "all_gather",
                                               "reduce_scatter", "send", "recv"};
  return (unsigned)k < DEV_NCOLL ? names[k] : "?";
}

void dev_coll_describe(char *out, size_t len, dev_coll_kind kind, int n, uint64_t seq) {
  if (n > 1) {
    snprintf(out, len, "a group of %d sends/receives (#%llu)", n, (unsigned long long)seq);
    return;
  }
  /* "all_reduce #12", by hand: the host backend names every collective it
   * runs, and snprintf was a fifth of the cost of one */
  char digits[24];
  int nd = 0;
  do digits[nd++] = (char)('0' + seq % 10); while ((seq /= 10) != 0);
  const char *name = dev_coll_name(kind);
  size_t k = strlen(name);
  if (len < k + 2 + (size_t)nd + 1) {
    snprintf(out, len, "%s", name);
    return;
  }
  memcpy(out, name, k);
  out[k++] = ' ';
  out[k++] = '#';
  while (nd) out[k++] = digits[--nd];
  out[k] = 0;
}

const char *dev_cred_name(dev_cred r) {
  static const char *const names[DEV_NCRED] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)r < DEV_NCRED ? names[r] : "?";
}
