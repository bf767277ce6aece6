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

/* Rows of up to this many elements go through qsort; longer ones through
 * radix_sort, whose passes cost the same whatever the order. */
#define RADIX_MIN 256

/* A stable LSD radix sort of s[0..n) by key, a byte a pass, through tmp;
 * the result in s.  One read counts every byte's digits; a byte the same
 * in every key (the low bytes of a float widened to double, the high ones
 * of small integers) is skipped.  Stable, and the pairs are made in
 * position order: ties keep it, as skey_cmp orders them. */
static void radix_sort(skey *s, skey *tmp, int64_t n)
{
  static const int NB = 8;
  int64_t (*cnt)[256] = calloc(NB, sizeof *cnt);
  skey *src = s, *dst = tmp;
  if (!cnt) {
    qsort(s, (size_t)n, sizeof *s, skey_cmp);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    for (int b = 0; b < NB; b++) cnt[b][(src[i].k >> (8 * b)) & 255]++;
  for (int b = 0; b < NB; b++) {
    int64_t *c = cnt[b], sum = 0;
    if (c[(src[0].k >> (8 * b)) & 255] == n) continue;   /* one digit: nothing moves */
    for (int d = 0; d < 256; d++) {
      int64_t t = c[d];
      c[d] = sum;
      sum += t;
    }
    for (int64_t i = 0; i < n; i++) dst[c[(src[i].k >> (8 * b)) & 255]++] = src[i];
    skey *t = src;
    src = dst;
    dst = t;
  }
  if (src != s) memcpy(s, src, (size_t)n * sizeof *s);
  free(cnt);
}

/* The first kout of s[0..n) in skey_cmp's order into s[0..kout), sorted,
 * for kout much smaller than n (topk): a radix select from the top byte.
 * Each pass counts the candidates' digits (they share the bytes above),
 * takes those below the digit where the count reaches need into tmp, and
 * keeps those at it, in order, as the candidates.  Past the last byte the
 * candidates' keys are all the kout-th one: the first need of them by
 * position are taken (they are still in position order).  Then the kout
 * taken are sorted. */
static void select_first(skey *s, skey *tmp, int64_t n, int64_t kout)
{
  int64_t ncand = n, need = kout, got = 0;
  for (int b = 7; b >= 0 && need > 0 && need < ncand; b--) {
    int64_t cnt[256] = {0}, below = 0;
    int d = 0;
    for (int64_t i = 0; i < ncand; i++) cnt[(s[i].k >> (8 * b)) & 255]++;
    while (below + cnt[d] < need) below += cnt[d++];
    if (cnt[d] == ncand) continue;   /* one digit: nothing decided */
    int64_t j = 0;
    for (int64_t i = 0; i < ncand; i++) {
      int dig = (int)((s[i].k >> (8 * b)) & 255);
      if (dig < d) tmp[got++] = s[i];
      else if (dig == d) s[j++] = s[i];
    }
    ncand = j;
    need -= below;
  }
  for (int64_t i = 0; i < need; i++) tmp[got++] = s[i];
  qsort(tmp, (size_t)got, sizeof *tmp, skey_cmp);
  memcpy(s, tmp, (size_t)got * sizeof *s);
}

/* b's run is the first kout positions of a's. */
static int sort_row(char *a, int64_t sa, char *b, int64_t sb, int64_t kout, const dev_kop *op, char *err,
                    size_t errlen)
{
  dev_dtype t = op->in[0].dtype;
  int64_t len = op->in[0].shape[op->dim];
  cclass c = class_of(t) == C_INT ? C_INT : C_DOUBLE;
  int desc = op->code & DEV_SORT_DESCENDING;
  int radix = len > RADIX_MIN, select = radix && kout <= len / 16;
  skey *s = malloc((size_t)(radix && !select ? 2 * len : select ? len + kout : len) * sizeof *s);
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
  if (select) select_first(s, s + len, len, kout);
  else if (radix) radix_sort(s, s + len, len);
  else qsort(s, (size_t)len, sizeof *s, skey_cmp);
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
