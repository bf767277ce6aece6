/* gpulua host kernels: DEV_OP_SORT, the 1-based positions of each run
 * along a dim in sorted order (the first k of them where out's run is k
 * long: topk).  Part of the CPU kernels (cuda/cpu_ops.c
 * runs them; cpu_priv.h). */
#include <stdlib.h>

#include "cpu_priv.h"
#include "ops.h"
#include "util.h"

/* A key and its position: keys are made so that unsigned order is the
 * sort's order, and ties go by position, which makes the sort stable. */
typedef struct skey { uint64_t k; int64_t at; } skey;

static int skey_cmp(const void *a, const void *b)
{
  const skey *x = a, *y = b;
  if (x->k != y->k) return x->k < y->k ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

/* The order of doubles as unsigned integers: NaN above +inf, -0 equal to +0 */
static uint64_t key_of_double(double d)
{
  uint64_t u;
  if (d != d) return UINT64_MAX;
  d += 0.0;
  memcpy(&u, &d, sizeof u);
  return u >> 63 ? ~u : u | (1ull << 63);
}

/* b's run is the first kout positions of a's. */
static int sort_row(char *a, int64_t sa, char *b, int64_t sb, int64_t kout, const dev_kop *op, char *err,
                    size_t errlen)
{
  dev_dtype t = op->in[0].dtype;
  int64_t len = op->in[0].shape[op->dim];
  cclass c = class_of(t) == C_INT ? C_INT : C_DOUBLE;
  int desc = op->code & DEV_SORT_DESCENDING;
  skey *s = malloc((size_t)len * sizeof *s);
  int64_t done, k, j;
  walk w;
  block x;
  if (!s) return fail_msg(err, errlen, "sort: out of host memory for a row of %lld", (long long)len);
  walk_1d(&w, a, (int64_t)dev_dtype_size(t), len, sa);
  for (done = 0; done < len; done += k) {
    k = min64(BLK, len - done);
    walk_load(&w, t, c, k, &x);
    for (j = 0; j < k; j++) {
      uint64_t key = c == C_INT ? (uint64_t)x.i[j] ^ (1ull << 63) : key_of_double(x.d[j]);
      s[done + j] = (skey){desc ? ~key : key, done + j + 1};
    }
  }
  qsort(s, (size_t)len, sizeof *s, skey_cmp);
  walk_1d(&w, b, 8, kout, sb);
  for (done = 0; done < kout; done += k) {
    k = min64(BLK, kout - done);
    for (j = 0; j < k; j++) x.i[j] = s[done + j].at;
    walk_store(&w, DEV_I64, C_INT, k, &x);
  }
  free(s);
  return 0;
}

int cpu_run_sort(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *src = &op->in[0], *out = &op->out;
  if (check_view(out, "out", err, errlen) || check_view(src, "in[0]", err, errlen)) return -1;
  if (op->nin != 1 || op->dim < 0 || op->dim >= src->ndim || src->ndim != out->ndim || out->dtype != DEV_I64)
    return fail_msg(err, errlen, "sort: bad dim, shape or dtype");
  for (int d = 0; d < src->ndim; d++)
    if (d == op->dim ? out->shape[d] > src->shape[d] : src->shape[d] != out->shape[d])
      return fail_msg(err, errlen, "sort: shapes differ");
  return cpu_each_row(op, sort_row, err, errlen);
}
