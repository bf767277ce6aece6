/* gpulua host kernels: matmul, through OpenBLAS where it loads, else
 * through the built-in loops.  Part of the CPU kernels (cuda/cpu_ops.c
 * runs it; cpu_priv.h). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef GPULUA_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#endif

#include "cpu_priv.h"

/* OpenBLAS, loaded with dlopen at the first matmul; without it, the built-in
 * loops.  Linked, its constructor started its threads (one per CPU) in
 * every gpulua process, whether it multiplied or not, and under an
 * address-space limit (ulimit -v 8000000) on a host of 64 CPUs they spun
 * in mmap for their buffers and the process hung at exit even after
 * `gpulua -e "print(1)"` (OPENBLAS_NUM_THREADS=1 did not hang). */
#ifdef GPULUA_HAVE_OPENBLAS
static struct {
  pthread_once_t once;
  __typeof__(cblas_sgemm) *sgemm;
  __typeof__(cblas_dgemm) *dgemm;
  char bad[160];   /* GPULUA_HOST_BLAS is neither on nor off: every matmul says so */
} blas = {PTHREAD_ONCE_INIT, NULL, NULL, ""};

static void blas_load(void)
{
  /* off: the built-in loops (tests/runtime.lua) */
  int on = 1;
  if (env_flag("GPULUA_HOST_BLAS", &on, blas.bad, sizeof blas.bad) || !on) return;
  const char *names[] = {"libopenblas.so.0", "libopenblas.so", NULL};
  void *lib = NULL;
  for (int i = 0; names[i] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  if (!(*(void **)&blas.sgemm = dlsym(lib, "cblas_sgemm")) || !(*(void **)&blas.dgemm = dlsym(lib, "cblas_dgemm"))) {
    blas.sgemm = NULL;
    blas.dgemm = NULL;
    dlclose(lib);
  }
}

static int have_blas(void)
{
  pthread_once(&blas.once, blas_load);
  return blas.sgemm != NULL;
}

static const char *blas_bad(void)
{
  pthread_once(&blas.once, blas_load);
  return blas.bad[0] ? blas.bad : NULL;
}
#else
static int have_blas(void) { return 0; }
static const char *blas_bad(void) { return NULL; }
#endif

/* A 2-D matmul operand as BLAS takes it: row-major, or transposed, with a
 * leading dimension.  It points into the view when dtype and layout allow,
 * otherwise into a packed copy in the compute type. */
typedef struct mat { char *p; int64_t ld; int trans; void *tmp; } mat;

static int mat_in(mat *m, const dev_view *v, dev_dtype ct, cclass c)
{
  int64_t r = v->shape[0], cols = v->shape[1];
  walk w;
  m->tmp = NULL;
  m->trans = 0;
  if (v->dtype == ct) {
    if ((cols == 1 || v->stride[1] == 1) && (r == 1 || v->stride[0] >= cols)) {
      m->p = dev_view_ptr(v);
      m->ld = r == 1 ? cols : v->stride[0];
      if (m->ld <= INT_MAX) return 0;
    }
    if (have_blas() && (r == 1 || v->stride[0] == 1) && (cols == 1 || v->stride[1] >= r)) {
      m->p = dev_view_ptr(v);
      m->ld = cols == 1 ? r : v->stride[1];
      m->trans = 1;
      if (m->ld <= INT_MAX) return 0;
    }
  }
  m->tmp = malloc((size_t)(r * cols) * class_size(c));
  if (m->tmp == NULL) return -1;
  walk_init(&w, v);
  walk_load(&w, v->dtype, c, r * cols, m->tmp);
  m->p = m->tmp;
  m->ld = cols;
  m->trans = 0;
  return 0;
}

/* i-k-j order: the inner loop runs along rows of b and c. */
static void gemm_f(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float *c, int64_t ldc)
{
  for (int64_t i = 0; i < m; i++) {
    float *ci = c + i * ldc;
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      float aip = a[i * lda + p];
      const float *bp = b + p * ldb;
      for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
    }
  }
}

static void gemm_d(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda,
                   const double *b, int64_t ldb, double *c, int64_t ldc)
{
  for (int64_t i = 0; i < m; i++) {
    double *ci = c + i * ldc;
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      double aip = a[i * lda + p];
      const double *bp = b + p * ldb;
      for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
    }
  }
}

/* Integers: the exact sum modulo 2^64 (unsigned arithmetic wraps), stored
 * wrapped to the dtype's width, as elementwise integer arithmetic does. */
static void gemm_i(int64_t m, int64_t n, int64_t k, const mat *a, const mat *b, int64_t *c, int64_t ldc)
{
  const int64_t *ap = (const int64_t *)a->p, *bp = (const int64_t *)b->p;
  for (int64_t i = 0; i < m; i++) {
    uint64_t *ci = (uint64_t *)(c + i * ldc);
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      uint64_t aip = (uint64_t)(a->trans ? ap[p * a->ld + i] : ap[i * a->ld + p]);
      for (int64_t j = 0; j < n; j++)
        ci[j] += aip * (uint64_t)(b->trans ? bp[j * b->ld + p] : bp[p * b->ld + j]);
    }
  }
}

static int overlaps(const dev_buf *x, const dev_buf *y)
{
  const char *a = x->ptr, *b = y->ptr;
  return x == y || (a < b + y->bytes && b < a + x->bytes);
}

/* f32 and f64 run in their own precision; f16/bf16 in f32; integers in
 * int64, wrapping (gemm_i). */
/* One 2-D product out = a @ b; run_matmul calls it per batch. */
static int matmul_2d(const dev_view *av, const dev_view *bv, const dev_view *ov, char *err, size_t errlen)
{
  dev_dtype t = ov->dtype;
  int sp = class_of(t) == C_FLOAT, in = class_of(t) == C_INT;
  dev_dtype ct = sp ? DEV_F32 : in ? DEV_I64 : DEV_F64;
  cclass c = sp ? C_FLOAT : in ? C_INT : C_DOUBLE;
  mat a = {0}, b = {0};
  char *cp;
  void *ctmp = NULL;
  int64_t m, n, k, ldc;
  int rc = -1;
  walk w;
  m = av->shape[0];
  k = av->shape[1];
  n = bv->shape[1];
  if (bv->shape[0] != k || ov->shape[0] != m || ov->shape[1] != n)
    return fail_msg(err, errlen, "matmul: shapes {%lld,%lld} @ {%lld,%lld} -> {%lld,%lld} do not match",
                (long long)m, (long long)k, (long long)bv->shape[0], (long long)n,
                (long long)ov->shape[0], (long long)ov->shape[1]);
  if (av->dtype != t || bv->dtype != t) return fail_msg(err, errlen, "matmul: dtypes differ");
  if (t == DEV_BOOL) return fail_msg(err, errlen, "matmul does not support bool");
  if (blas_bad()) return fail_msg(err, errlen, "matmul: %s", blas_bad());
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return fail_msg(err, errlen, "matmul: matrix too large");
  if (m == 0 || n == 0) return 0;
  if (k == 0) {
    dev_kop zero = {.kind = DEV_OP_FILL, .out = *ov, .s0 = {.is_int = 1, .i = 0}};
    return run_fill(&zero, err, errlen);
  }
  if (mat_in(&a, av, ct, c) || mat_in(&b, bv, ct, c)) { fail_msg(err, errlen, "out of memory"); goto done; }
  /* write straight into out unless it needs converting, is laid out otherwise
   * or shares memory with an operand */
  if (t == ct && (n == 1 || ov->stride[1] == 1) && (m == 1 || (ov->stride[0] >= n && ov->stride[0] <= INT_MAX)) &&
      !overlaps(ov->buf, av->buf) && !overlaps(ov->buf, bv->buf)) {
    cp = dev_view_ptr(ov);
    ldc = m == 1 ? n : ov->stride[0];
  } else {
    if ((ctmp = malloc((size_t)(m * n) * class_size(c))) == NULL) { fail_msg(err, errlen, "out of memory"); goto done; }
    cp = ctmp;
    ldc = n;
  }
  if (in) gemm_i(m, n, k, &a, &b, (int64_t *)cp, ldc);
#ifdef GPULUA_HAVE_OPENBLAS
  else if (have_blas() && sp)
    blas.sgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, 1.0f, (const float *)a.p, (int)a.ld, (const float *)b.p, (int)b.ld,
                0.0f, (float *)cp, (int)ldc);
  else if (have_blas())
    blas.dgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, 1.0, (const double *)a.p, (int)a.ld, (const double *)b.p, (int)b.ld,
                0.0, (double *)cp, (int)ldc);
#endif
  else if (sp) gemm_f(m, n, k, (const float *)a.p, a.ld, (const float *)b.p, b.ld, (float *)cp, ldc);
  else gemm_d(m, n, k, (const double *)a.p, a.ld, (const double *)b.p, b.ld, (double *)cp, ldc);
  if (ctmp != NULL) {
    walk_init(&w, ov);
    walk_store(&w, t, c, m * n, ctmp);
  }
  rc = 0;
done:
  free(a.tmp);
  free(b.tmp);
  free(ctmp);
  return rc;
}

/* out = in[0] @ in[1]: 2-D, or 3-D with one batch size (an operand's batch
 * stride may be 0: broadcast), one product per batch. */
int cpu_run_matmul(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *av = &op->in[0], *bv = &op->in[1], *ov = &op->out;
  if (check_view(ov, "out", err, errlen) || check_view(av, "in[0]", err, errlen) ||
      check_view(bv, "in[1]", err, errlen))
    return -1;
  if (av->ndim != ov->ndim || bv->ndim != ov->ndim || (ov->ndim != 2 && ov->ndim != 3))
    return fail_msg(err, errlen, "matmul needs 2-D tensors, or 3-D ones of one batch size");
  if (ov->ndim == 2) return matmul_2d(av, bv, ov, err, errlen);
  if (av->shape[0] != ov->shape[0] || bv->shape[0] != ov->shape[0])
    return fail_msg(err, errlen, "matmul: batch sizes %lld, %lld -> %lld differ", (long long)av->shape[0],
                (long long)bv->shape[0], (long long)ov->shape[0]);
  for (int64_t i = 0; i < ov->shape[0]; i++) {
    dev_view a = dev_view_batch(av, i), b = dev_view_batch(bv, i), o = dev_view_batch(ov, i);
    if (matmul_2d(&a, &b, &o, err, errlen)) return -1;
  }
  return 0;
}
