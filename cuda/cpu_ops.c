/* gpulua host kernels: the CPU implementation of every built-in op, and
 * dev_cpu_run, which runs one.  Here: copies, fill, arange, rand, the
 * elementwise ops, indexing, sleep; the reductions, cumsum and softmax are
 * in cpu_reduce.c, matmul in cpu_matmul.c; what they share (blocks, the
 * conversions, walks over views) in cpu_priv.h.
 *
 * Stream workers and the interpreter thread call in at the same time, so
 * nothing here keeps state between calls (but OpenBLAS, loaded once), and
 * nothing prints, exits or aborts.
 *
 * Elementwise ops work in blocks: the next BLK elements of each operand are
 * gathered (in flat C order, whatever the strides) into an array of the
 * compute type -- float for f32/f16/bf16, double for f64, int64 for the
 * integers and bool -- the op runs over the arrays, and the result is
 * converted and scattered into the output.  The dtype switch thus runs once per
 * strided run rather than per element, and a contiguous view is a single run.
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L   /* nanosleep */
#endif

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A neutral module (cpu_ops.h), not the host backend's: dev_op.c and both backends run ops with it. */
#include "cpu_ops.h"
#include "cpu_priv.h"
#include "devpriv.h"   /* dev_cfunc_run */
#include "scalar.h"
#include "util.h"

#define TWO_PI 6.283185307179586476925286766559

/* A scalar operand in t's compute type.  Integer dtypes take an integer scalar
 * exactly; a float one, and anything for bool, goes through t's store rule. */
void cpu_scalar_to(dev_scalar s, dev_dtype t, block *b)
{
  char elem[8];
  int64_t v;
  /* the value once, then a plain fill (vectorised): scalar_d per element
   * cost about 8 instructions each, 17k per fused call of four numbers */
  double d = scalar_d(s);
  float f = (float)d;
  switch (class_of(t)) {
  case C_FLOAT: for (int i = 0; i < BLK; i++) b->f[i] = f; break;
  case C_DOUBLE: for (int i = 0; i < BLK; i++) b->d[i] = d; break;
  case C_INT:
    v = s.i;
    if (!s.is_int || t == DEV_BOOL) {
      if (s.is_int) store_i(t, elem, 1, 1, &s.i);
      else store_d(t, elem, 1, 1, &s.f);
      load_i(t, elem, 1, 1, &v);
    }
    for (int i = 0; i < BLK; i++) b->i[i] = v;
    break;
  }
}

static int run_copy(const dev_view *out, const dev_view *in, char *err, size_t errlen)
{
  walk wo, wi;
  char *po, *pi;
  int64_t n = dev_view_numel(out), k, so, si;
  if (check_view(out, "out", err, errlen) || check_view(in, "in[0]", err, errlen)) return -1;
  if (in->dtype != out->dtype)
    return fail_msg(err, errlen, "copy: dtype %s does not match %s", dev_dtype_name(in->dtype), dev_dtype_name(out->dtype));
  if (dev_view_numel(in) != n) return fail_msg(err, errlen, "copy: element counts differ");
  if (n == 0) return 0;
  if (dev_view_contiguous(out) && dev_view_contiguous(in)) {
    memmove(dev_view_ptr(out), dev_view_ptr(in), (size_t)n * dev_dtype_size(out->dtype));
    return 0;
  }
  if (cpu_views_overlap(out, in)) {
    /* read everything before writing anything, as memmove (and the CUDA
     * backend's copy) does: through a packed copy of in */
    size_t esz = dev_dtype_size(out->dtype);
    char *tmp = malloc((size_t)n * esz);
    if (tmp == NULL) return fail_msg(err, errlen, "copy: out of memory staging an overlapping copy");
    walk_init(&wi, in);
    for (int64_t left = n, off = 0; left > 0; left -= k, off += k) {
      k = walk_run(&wi, left, &pi, &si);
      copy_run(wi.esz, tmp + (size_t)off * esz, 1, pi, si, k);
    }
    walk_init(&wo, out);
    for (int64_t left = n, off = 0; left > 0; left -= k, off += k) {
      k = walk_run(&wo, left, &po, &so);
      copy_run(wo.esz, po, so, tmp + (size_t)off * esz, 1, k);
    }
    free(tmp);
    return 0;
  }
  walk_init(&wo, out);
  walk_init(&wi, in);
  for (; n > 0; n -= k) {
    k = min64(walk_avail(&wo), walk_avail(&wi));
    walk_run(&wo, k, &po, &so);
    walk_run(&wi, k, &pi, &si);
    copy_run(wo.esz, po, so, pi, si, k);
  }
  return 0;
}

static int run_arange(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  int exact = op->s0.is_int && op->s1.is_int && class_of(out->dtype) == C_INT;
  double a = scalar_d(op->s0), step = scalar_d(op->s1);
  int64_t n = dev_view_numel(out), done, k, j;
  block b;
  walk w;
  if (check_view(out, "out", err, errlen)) return -1;
  walk_init(&w, out);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    for (j = 0; j < k; j++) {
      if (exact) b.i[j] = sc_wrap64((uint64_t)op->s0.i + (uint64_t)(done + j) * (uint64_t)op->s1.i);
      else b.d[j] = a + (double)(done + j) * step;
    }
    walk_store(&w, out->dtype, exact ? C_INT : C_DOUBLE, k, &b);
  }
  return 0;
}

/* Uniform draws are in [low, high): a value that rounds up to high in a
 * narrow dtype becomes the largest value of that dtype below high. */
static double below_high(double v, double high, dev_dtype t)
{
  float f;
  uint16_t h;
  switch (t) {
  case DEV_F32:
    for (f = (float)v; f >= high;) f = nextafterf(f, -INFINITY);
    return f;
  case DEV_F16:
    for (h = sc_double_to_half(v); sc_half_to_float(h) >= high;) h = sc_step_down16(h);
    return sc_half_to_float(h);
  case DEV_BF16:
    for (h = sc_double_to_bf16(v); sc_bf16_to_float(h) >= high;) h = sc_step_down16(h);
    return sc_bf16_to_float(h);
  default:
    return v < high ? v : nextafter(high, -INFINITY);
  }
}

static int run_rand(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  dev_dtype t = out->dtype;
  int isint = class_of(t) == C_INT, normal = op->code == DEV_RAND_NORMAL, randint = op->code == DEV_RAND_INT;
  double a = scalar_d(op->s0), b = scalar_d(op->s1), u;
  int64_t low = op->s0.is_int ? op->s0.i : sat(op->s0.f, INT64_MIN, INT64_MAX);
  int64_t high = op->s1.is_int ? op->s1.i : sat(op->s1.f, INT64_MIN, INT64_MAX);
  uint64_t range = (uint64_t)high - (uint64_t)low, r;
  int64_t n = dev_view_numel(out), done, k, j;
  uint32_t x[4];
  block v;
  walk w;
  if (check_view(out, "out", err, errlen)) return -1;
  if (op->code != DEV_RAND_UNIFORM && !normal && !randint) return fail_msg(err, errlen, "rand: bad kind %d", op->code);
  if (normal && isint) return fail_msg(err, errlen, "randn needs a float dtype, not %s", dev_dtype_name(t));
  walk_init(&w, out);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    for (j = 0; j < k; j++) {
      dev_philox(op->seed, op->offset + (uint64_t)(done + j), x);
      if (randint) {
        r = range != 0 ? ((uint64_t)x[0] << 32 | x[1]) % range : 0;
        v.i[j] = sc_wrap64((uint64_t)low + r);
      } else if (t == DEV_BOOL) {
        v.i[j] = x[0] & 1;
      } else if (isint) {
        r = range != 0 ? ((uint64_t)x[0] << 32 | x[1]) % range : 0;
        v.i[j] = sc_wrap64((uint64_t)low + r);
      } else if (normal) {
        double z = sqrt(-2.0 * log(sc_unit53(x[0], x[1]))) * cos(TWO_PI * sc_unit53(x[2], x[3]));
        v.d[j] = a + b * z;
      } else {
        u = t == DEV_F64 ? sc_unit53(x[0], x[1]) : ((x[0] >> 8) + 0.5) * 0x1p-24;
        v.d[j] = below_high(a + u * (b - a), b, t);
      }
    }
    walk_store(&w, t, isint || randint ? C_INT : C_DOUBLE, k, &v);
  }
  return 0;
}

/* The ops of ops.h over arrays: one case per row and compute type, each a
 * plain loop over the row's scalar function (scalar.h).  The loops run over
 * whole groups of 8 elements, which lets the compiler vectorise them at -O2
 * (no scalar remainder): the array functions take n a multiple of 8, the
 * block functions round up (pad8 zeroes an operand's slots past n up to
 * there).  A bool result (0/1) goes to an int64 array.  Kept out of line:
 * inlined into the walkers' loops, gcc (12, -O2) no longer vectorises them.
 * The arrays are a block's, or the tensors' own memory where the operands
 * are contiguous in a dtype that is its own compute type (direct_ok). */
#define RES_SAME(same, b) same
#define RES_BOOL(same, b) b
/* On x86-64 each array function is also built for AVX2 (8 floats a
 * vector rather than SSE's 4) and AVX-512 (16), picked at load time by the
 * CPU.  The loops are the same C, IEEE arithmetic without contraction
 * (-std=c11 keeps fp-contract off), so every result is the same bits in
 * any build.  At -O2 gcc vectorises only loops with no remainder, so each
 * function runs its loop over the multiple of 16 and then over the 8 left
 * (ARRAY_SPLIT): a fused GELU's block loops are bound by their loads and
 * stores, and 16 floats a vector halve them (2^20 f32 on the 2-core Zen 5
 * machine: bench/RESULTS.md, 2026-11-29 host32c). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ARRAY_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ARRAY_CLONES
#endif
#define ARRAY_FN static __attribute__((noinline)) ARRAY_CLONES
#define ARRAY_BODY static inline __attribute__((always_inline))
/* body over [0, n) as a multiple of 16 and the rest (0 or 8 elements) */
#define ARRAY_SPLIT(n, m, run_lo, run_hi) do { int64_t m = (n) & ~(int64_t)15; run_lo; if (m < (n)) run_hi; } while (0)
#define MULT8(n) ((n) & ~(int64_t)7)

static inline int64_t round8(int64_t n) { return (n + 7) & ~(int64_t)7; }

void cpu_pad8(cclass c, block *b, int64_t n)
{
  size_t sz = class_size(c);
  memset((char *)b + (size_t)n * sz, 0, (size_t)(round8(n) - n) * sz);
}

/* ---- vector math: glibc's libmvec ----------------------------------------
 * The float functions of the op table are the C library's on the host
 * (docs/lua-api.md: within a few ulps of CUDA's, not bit for bit).  On
 * x86-64 glibc (2.35 and later) the same library has vector versions of
 * them, libmvec (part of libc6: no other dependency): 4 floats or 2 doubles
 * a call, at most 4 ulps off (glibc's manual), specials (NaN, inf, -0) kept.
 * It is loaded with dlopen at the first such op, as OpenBLAS is; without it
 * the loops call the scalar functions.  The same table serves every path
 * (plain ops, blocks, gpu.fuse), so fused and unfused results stay equal. */
#if defined(__x86_64__) && defined(__GLIBC__)
#define HAVE_MVEC 1
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>

/* The widest variant the CPU runs is taken, for every element alike (a
 * short run goes through a zero-padded vector of the same function), so a
 * value's result does not depend on where it sits in the array: fused and
 * unfused ops, chunks and blocks, all agree.  On AVX-512 the 16-float
 * versions are about 4x the SSE ones (tanh, 2^20 f32: 1.2 ms to 0.27 ms on
 * one thread); their results differ from the SSE ones' in the last bits,
 * within glibc's 4 ulps.  Each call sits in a function built for its ISA,
 * as the vector types' calling convention needs. */
typedef void *mvec_fn;
enum { MV_SSE, MV_AVX2, MV_AVX512 };
static struct { mvec_fn f[DEV_NUNOP], d[DEV_NUNOP]; int isa; } mvec;
static pthread_once_t mvec_once = PTHREAD_ONCE_INIT;

static void mvec_load(void)
{
  static const struct { int code; const char *name; } fns[] = {
    {DEV_UN_EXP, "exp"}, {DEV_UN_LOG, "log"}, {DEV_UN_TANH, "tanh"}, {DEV_UN_SIN, "sin"},
    {DEV_UN_COS, "cos"}, {DEV_UN_LOG1P, "log1p"}, {DEV_UN_EXPM1, "expm1"}, {DEV_UN_LOG2, "log2"},
    {DEV_UN_LOG10, "log10"}, {DEV_UN_EXP2, "exp2"}, {DEV_UN_TAN, "tan"}, {DEV_UN_ASIN, "asin"},
    {DEV_UN_ACOS, "acos"}, {DEV_UN_ATAN, "atan"}, {DEV_UN_SINH, "sinh"}, {DEV_UN_COSH, "cosh"},
    {DEV_UN_ERF, "erf"},
  };
  /* the mangled prefixes of the x86-64 vector ABI: b SSE, d AVX2, e AVX-512 */
  static const char *const fpre[] = {"_ZGVbN4v_", "_ZGVdN8v_", "_ZGVeN16v_"};
  static const char *const dpre[] = {"_ZGVbN2v_", "_ZGVdN4v_", "_ZGVeN8v_"};
  void *lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
  char sym[64];
  if (!lib) return;
  __builtin_cpu_init();
  mvec.isa = __builtin_cpu_supports("avx512f") ? MV_AVX512 : __builtin_cpu_supports("avx2") ? MV_AVX2 : MV_SSE;
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    snprintf(sym, sizeof sym, "%s%sf", fpre[mvec.isa], fns[i].name);
    mvec.f[fns[i].code] = dlsym(lib, sym);
    snprintf(sym, sizeof sym, "%s%s", dpre[mvec.isa], fns[i].name);
    mvec.d[fns[i].code] = dlsym(lib, sym);
  }
}

/* fn over x[0..n), n a multiple of 8; W elements a call, the last short
 * group through a zero-padded vector */
#define MVEC_RUN(NAME, T, VT, W, LOAD, STORE, ATTR)                                                \
  ATTR static void NAME(mvec_fn fp, const T *x, T *r, int64_t n)                                   \
  {                                                                                                \
    VT (*fn)(VT) = (VT (*)(VT))fp;                                                                 \
    T pad[W];                                                                                      \
    int64_t i = 0;                                                                                 \
    for (; i + (W) <= n; i += (W)) STORE(r + i, fn(LOAD(x + i)));                                 \
    if (i == n) return;                                                                            \
    memset(pad, 0, sizeof pad);                                                                    \
    memcpy(pad, x + i, (size_t)(n - i) * sizeof(T));                                               \
    STORE(pad, fn(LOAD(pad)));                                                                     \
    memcpy(r + i, pad, (size_t)(n - i) * sizeof(T));                                               \
  }
MVEC_RUN(mv_f_sse, float, __m128, 4, _mm_loadu_ps, _mm_storeu_ps, )
MVEC_RUN(mv_d_sse, double, __m128d, 2, _mm_loadu_pd, _mm_storeu_pd, )
MVEC_RUN(mv_f_avx2, float, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, __attribute__((target("avx2"))))
MVEC_RUN(mv_d_avx2, double, __m256d, 4, _mm256_loadu_pd, _mm256_storeu_pd, __attribute__((target("avx2"))))
MVEC_RUN(mv_f_avx512, float, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, __attribute__((target("avx512f"))))
MVEC_RUN(mv_d_avx512, double, __m512d, 8, _mm512_loadu_pd, _mm512_storeu_pd, __attribute__((target("avx512f"))))

/* 1 when op code ran over x[0..n) (n a multiple of 8) through libmvec. */
static int mvec_unop_f(int code, const float *x, float *r, int64_t n)
{
  mvec_fn fn;
  if ((unsigned)code >= DEV_NUNOP) return 0;
  pthread_once(&mvec_once, mvec_load);
  if (!(fn = mvec.f[code])) return 0;
  switch (mvec.isa) {
  case MV_AVX512: mv_f_avx512(fn, x, r, n); break;
  case MV_AVX2: mv_f_avx2(fn, x, r, n); break;
  default: mv_f_sse(fn, x, r, n); break;
  }
  return 1;
}

static int mvec_unop_d(int code, const double *x, double *r, int64_t n)
{
  mvec_fn fn;
  if ((unsigned)code >= DEV_NUNOP) return 0;
  pthread_once(&mvec_once, mvec_load);
  if (!(fn = mvec.d[code])) return 0;
  switch (mvec.isa) {
  case MV_AVX512: mv_d_avx512(fn, x, r, n); break;
  case MV_AVX2: mv_d_avx2(fn, x, r, n); break;
  default: mv_d_sse(fn, x, r, n); break;
  }
  return 1;
}
#else
static int mvec_unop_f(int code, const float *x, float *r, int64_t n) { (void)code; (void)x; (void)r; (void)n; return 0; }
static int mvec_unop_d(int code, const double *x, double *r, int64_t n) { (void)code; (void)x; (void)r; (void)n; return 0; }
#endif

/* One array function per compute type C (f, d, i) and arity; r points to
 * the result array (int64 for a bool result). */
#define UN_LOOP(C, T, RT)                                                                          \
  ARRAY_BODY void unop_##C##_run(int code, const T *restrict x, void *rv, int64_t off, int64_t n)  \
  {                                                                                                \
    RT *restrict r = (RT *)rv + off;                                                               \
    int64_t *restrict rb = (int64_t *)rv + off;                                                    \
    (void)r; (void)rb;                                                                             \
    switch (code) { UN_CASES_##C default: break; }                                                 \
  }                                                                                                \
  ARRAY_FN void unop_##C(int code, const T *restrict x, void *restrict rv, int64_t n)              \
  {                                                                                                \
    n = MULT8(n);                                                                                  \
    if (MVEC_##C(code, x, rv, n)) return;                                                          \
    ARRAY_SPLIT(n, m, unop_##C##_run(code, x, rv, 0, m),                                         \
                unop_##C##_run(code, x + m, rv, m, 8));                  \
  }
#define UN_F(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_UN_##E: \
  for (int64_t i = 0; i < n; i++) RES_##res(r, rb)[i] = sc_##name##_f(x[i]); break;)
#define UN_D(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_UN_##E: \
  for (int64_t i = 0; i < n; i++) RES_##res(r, rb)[i] = sc_##name##_d(x[i]); break;)
#define UN_I(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_UN_##E: \
  for (int64_t i = 0; i < n; i++) rb[i] = sc_##name##_i(x[i]); break;)
#define MVEC_f(code, x, r, n) mvec_unop_f(code, x, r, n)
#define MVEC_d(code, x, r, n) mvec_unop_d(code, x, r, n)
#define MVEC_i(code, x, r, n) 0
#define UN_CASES_f DEV_UNARY_OPS(UN_F)
#define UN_CASES_d DEV_UNARY_OPS(UN_D)
#define UN_CASES_i DEV_UNARY_OPS(UN_I)
UN_LOOP(f, float, float)
UN_LOOP(d, double, double)
UN_LOOP(i, int64_t, int64_t)

/* Returns how many integer divisions by zero there were (among the first n0). */
#define BIN_LOOP(C, T, RT)                                                                         \
  ARRAY_BODY int64_t binop_##C##_run(int code, const T *restrict x, const T *restrict y,           \
                                     void *rv, int64_t off, int64_t n, int64_t n0)                 \
  {                                                                                                \
    RT *restrict r = (RT *)rv + off;                                                               \
    int64_t *restrict rb = (int64_t *)rv + off, zeros = 0;                                         \
    (void)r; (void)rb; (void)n0;                                                                   \
    switch (code) { BIN_CASES_##C default: break; }                                                \
    return zeros;                                                                                  \
  }                                                                                                \
  ARRAY_FN int64_t binop_##C(int code, const T *restrict x, const T *restrict y, void *restrict rv, \
                             int64_t n, int64_t n0)                                                \
  {                                                                                                \
    int64_t zeros = 0;                                                                             \
    n = MULT8(n);                                                                                  \
    ARRAY_SPLIT(n, m, zeros = binop_##C##_run(code, x, y, rv, 0, m, n0 < m ? n0 : m),            \
                zeros += binop_##C##_run(code, x + m, y + m, rv, m, 8, n0 - m)); \
    return zeros;                                                                                  \
  }
#define BIN_F(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_BIN_##E: \
  for (int64_t i = 0; i < n; i++) RES_##res(r, rb)[i] = sc_##name##_f(x[i], y[i]); break;)
#define BIN_D(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_BIN_##E: \
  for (int64_t i = 0; i < n; i++) RES_##res(r, rb)[i] = sc_##name##_d(x[i], y[i]); break;)
#define BIN_I(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_BIN_##E: \
  for (int64_t i = 0; i < n; i++) rb[i] = sc_##name##_i(x[i], y[i]); \
  if ((fl) & DEV_OPF_ZDIV) for (int64_t i = 0; i < n0; i++) zeros += y[i] == 0; \
  break;)
#define BIN_CASES_f DEV_BINARY_OPS(BIN_F)
#define BIN_CASES_d DEV_BINARY_OPS(BIN_D)
#define BIN_CASES_i DEV_BINARY_OPS(BIN_I)
BIN_LOOP(f, float, float)
BIN_LOOP(d, double, double)
BIN_LOOP(i, int64_t, int64_t)

/* The same with a number for one operand (left: k op x[i], else x[i] op
 * k): k stays in a register, where a block of copies of it cost a load
 * per element (a fused GELU has 4 such ops of its 8). */
#define BINK_LOOP(C, T, RT)                                                                        \
  ARRAY_BODY int64_t binopk_##C##_run(int code, const T *restrict x, T k, int left, void *rv,      \
                                      int64_t off, int64_t n, int64_t n0)                          \
  {                                                                                                \
    RT *restrict r = (RT *)rv + off;                                                               \
    int64_t *restrict rb = (int64_t *)rv + off, zeros = 0;                                         \
    (void)r; (void)rb; (void)n0;                                                                   \
    switch (code) { BINK_CASES_##C default: break; }                                               \
    return zeros;                                                                                  \
  }                                                                                                \
  ARRAY_FN int64_t binopk_##C(int code, const T *restrict x, T k, int left, void *restrict rv,     \
                              int64_t n, int64_t n0)                                               \
  {                                                                                                \
    int64_t zeros = 0;                                                                             \
    n = MULT8(n);                                                                                  \
    ARRAY_SPLIT(n, m, zeros = binopk_##C##_run(code, x, k, left, rv, 0, m, n0 < m ? n0 : m),     \
                zeros += binopk_##C##_run(code, x + m, k, left, rv, m, 8, n0 - m)); \
    return zeros;                                                                                  \
  }
#define BINK_FD(E, name, cls, res, sfx) DEV_IF_F(cls, case DEV_BIN_##E:                            \
  if (left) for (int64_t i = 0; i < n; i++) RES_##res(r, rb)[i] = sc_##name##_##sfx(k, x[i]);      \
  else for (int64_t i = 0; i < n; i++) RES_##res(r, rb)[i] = sc_##name##_##sfx(x[i], k);          \
  break;)
#define BINK_F(E, name, cls, res, fl) BINK_FD(E, name, cls, res, f)
#define BINK_D(E, name, cls, res, fl) BINK_FD(E, name, cls, res, d)
#define BINK_I(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_BIN_##E:                              \
  if (left) for (int64_t i = 0; i < n; i++) rb[i] = sc_##name##_i(k, x[i]);                        \
  else for (int64_t i = 0; i < n; i++) rb[i] = sc_##name##_i(x[i], k);                             \
  if ((fl) & DEV_OPF_ZDIV) {                                                                       \
    if (left) for (int64_t i = 0; i < n0; i++) zeros += x[i] == 0;                                 \
    else if (k == 0 && n0 > 0) zeros += n0;                                                        \
  }                                                                                                \
  break;)
#define BINK_CASES_f DEV_BINARY_OPS(BINK_F)
#define BINK_CASES_d DEV_BINARY_OPS(BINK_D)
#define BINK_CASES_i DEV_BINARY_OPS(BINK_I)
BINK_LOOP(f, float, float)
BINK_LOOP(d, double, double)
BINK_LOOP(i, int64_t, int64_t)

/* Two f32 ops in one loop, (x op1 y) op2 k (left: k op2 (x op1 y)), for
 * op1 and op2 among add, sub, mul, div: gpu.fuse's `t * a * 0.5` and the
 * like.  Each op rounds to float as its own loop does (no contraction), so
 * the result is the two loops' bit for bit, without the store and load of
 * the value between them and one dispatch of two. */
#define PAIR_CASE(i1, f1, i2, f2) case i1 * 4 + i2:                                                \
  if (left) for (int64_t i = 0; i < n; i++) r[i] = sc_##f2##_f(k, sc_##f1##_f(x[i], y[i]));       \
  else for (int64_t i = 0; i < n; i++) r[i] = sc_##f2##_f(sc_##f1##_f(x[i], y[i]), k);            \
  break;
#define PAIR_ROW(i1, f1) PAIR_CASE(i1, f1, 0, add) PAIR_CASE(i1, f1, 1, sub) PAIR_CASE(i1, f1, 2, mul) \
  PAIR_CASE(i1, f1, 3, div)
ARRAY_BODY void pair_f_run(int pair, int left, const float *restrict x, const float *restrict y, float k,
                           float *restrict r, int64_t n)
{
  switch (pair) { PAIR_ROW(0, add) PAIR_ROW(1, sub) PAIR_ROW(2, mul) PAIR_ROW(3, div) default: break; }
}

ARRAY_FN void pair_f(int pair, int left, const float *restrict x, const float *restrict y, float k,
                     float *restrict r, int64_t n)
{
  n = MULT8(n);
  ARRAY_SPLIT(n, m, pair_f_run(pair, left, x, y, k, r, m), pair_f_run(pair, left, x + m, y + m, k, r + m, 8));
}

static int pair_index(int code)
{
  switch (code) {
  case DEV_BIN_ADD: return 0;
  case DEV_BIN_SUB: return 1;
  case DEV_BIN_MUL: return 2;
  case DEV_BIN_DIV: return 3;
  default: return -1;
  }
}

int cpu_binop_pair_f(int code1, int code2, int left, const block *restrict x, const block *restrict y,
                     const block *kb, block *restrict r, int64_t n)
{
  int a = pair_index(code1), b = pair_index(code2);
  if (a < 0 || b < 0) return 0;
  pair_f(a * 4 + b, left, x->f, y->f, kb->f[0], r->f, round8(n));
  return 1;
}

#define TER_LOOP(C, T)                                                                             \
  ARRAY_BODY void terop_##C##_run(int code, const T *restrict x, const T *restrict y,              \
                                  const T *restrict z, T *restrict r, int64_t n)                   \
  {                                                                                                \
    switch (code) { TER_CASES_##C default: break; }                                                \
  }                                                                                                \
  ARRAY_FN void terop_##C(int code, const T *restrict x, const T *restrict y, const T *restrict z, \
                          T *restrict r, int64_t n)                                                \
  {                                                                                                \
    n = MULT8(n);                                                                                  \
    ARRAY_SPLIT(n, m, terop_##C##_run(code, x, y, z, r, m),                                       \
                terop_##C##_run(code, x + m, y + m, z + m, r + m, 8));                             \
  }
#define TER_F(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_TER_##E: \
  for (int64_t i = 0; i < n; i++) r[i] = sc_##name##_f(x[i], y[i], z[i]); break;)
#define TER_D(E, name, cls, res, fl) DEV_IF_F(cls, case DEV_TER_##E: \
  for (int64_t i = 0; i < n; i++) r[i] = sc_##name##_d(x[i], y[i], z[i]); break;)
#define TER_I(E, name, cls, res, fl) DEV_IF_I(cls, case DEV_TER_##E: \
  for (int64_t i = 0; i < n; i++) r[i] = sc_##name##_i(x[i], y[i], z[i]); break;)
#define TER_CASES_f DEV_TERNARY_OPS(TER_F)
#define TER_CASES_d DEV_TERNARY_OPS(TER_D)
#define TER_CASES_i DEV_TERNARY_OPS(TER_I)
TER_LOOP(f, float)
TER_LOOP(d, double)
TER_LOOP(i, int64_t)

void cpu_unop_block(int code, cclass c, const block *restrict x, block *restrict r, int64_t n)
{
  n = round8(n);
  switch (c) {
  case C_FLOAT: unop_f(code, x->f, r, n); break;
  case C_DOUBLE: unop_d(code, x->d, r, n); break;
  case C_INT: unop_i(code, x->i, r, n); break;
  }
}

/* Returns how many integer divisions by zero there were. */
int64_t cpu_binop_block(int code, cclass c, const block *restrict x, const block *restrict y,
                        block *restrict r, int64_t n)
{
  switch (c) {
  case C_FLOAT: return binop_f(code, x->f, y->f, r, round8(n), n);
  case C_DOUBLE: return binop_d(code, x->d, y->d, r, round8(n), n);
  case C_INT: return binop_i(code, x->i, y->i, r, round8(n), n);
  }
  return 0;
}

/* x op k (left: k op x), k the first value of the number block kb. */
int64_t cpu_binop_block_k(int code, cclass c, const block *restrict x, const block *kb, int left,
                          block *restrict r, int64_t n)
{
  switch (c) {
  case C_FLOAT: return binopk_f(code, x->f, kb->f[0], left, r, round8(n), n);
  case C_DOUBLE: return binopk_d(code, x->d, kb->d[0], left, r, round8(n), n);
  case C_INT: return binopk_i(code, x->i, kb->i[0], left, r, round8(n), n);
  }
  return 0;
}

void cpu_terop_block(int code, cclass c, const block *restrict x, const block *restrict y,
                     const block *restrict z, block *restrict r, int64_t n)
{
  n = round8(n);
  switch (c) {
  case C_FLOAT: terop_f(code, x->f, y->f, z->f, r->f, n); break;
  case C_DOUBLE: terop_d(code, x->d, y->d, z->d, r->d, n); break;
  case C_INT: terop_i(code, x->i, y->i, z->i, r->i, n); break;
  }
}

/* ---- contiguous fast path ------------------------------------------------ */

/* An elementwise op can run on the tensors' own memory when every operand
 * is contiguous in out's dtype, that dtype is its own compute type (f32,
 * f64, i64), the result is not bool, and out is either an operand itself or
 * apart from it (a partly overlapping view keeps the block path's order). */
static int direct_ok(const dev_view *out, const dev_view *in, int nin)
{
  dev_dtype t = out->dtype;
  if ((t != DEV_F32 && t != DEV_F64 && t != DEV_I64) || dev_view_numel(out) == 0 || !dev_view_contiguous(out))
    return 0;
  for (int i = 0; i < nin; i++)
    if (in[i].dtype != t || !dev_view_contiguous(&in[i]) ||
        (dev_view_ptr(&in[i]) != dev_view_ptr(out) && cpu_views_overlap(out, &in[i])))
      return 0;
  return 1;
}

static int64_t binop_any(int code, cclass c, const void *x, const void *y, void *r, int64_t n, int64_t n0)
{
  switch (c) {
  case C_FLOAT: return binop_f(code, x, y, r, n, n0);
  case C_DOUBLE: return binop_d(code, x, y, r, n, n0);
  case C_INT: return binop_i(code, x, y, r, n, n0);
  }
  return 0;
}

/* The last n % 8 elements go through blocks, so that no loop writes past n. */
static void unary_direct(int code, cclass c, const char *x, char *r, int64_t n)
{
  size_t esz = class_size(c);
  int64_t n8 = MULT8(n), k = n - n8;
  block bx, br;
  switch (c) {
  case C_FLOAT: unop_f(code, (const float *)x, r, n8); break;
  case C_DOUBLE: unop_d(code, (const double *)x, r, n8); break;
  case C_INT: unop_i(code, (const int64_t *)x, r, n8); break;
  }
  if (k == 0) return;
  memcpy(&bx, x + n8 * esz, (size_t)k * esz);
  cpu_pad8(c, &bx, k);
  cpu_unop_block(code, c, &bx, &br, k);
  memcpy(r + n8 * esz, &br, (size_t)k * esz);
}

/* y NULL: the other operand is the scalar block s (left: s op x). */
static int64_t binary_direct(int code, cclass c, const char *x, const char *y, const block *s, int left,
                             char *r, int64_t n)
{
  size_t esz = class_size(c);
  int64_t zeros = 0, n8 = MULT8(n), k = n - n8;
  block bx, by, br;
  if (n8 && y) {
    zeros += binop_any(code, c, x, y, r, n8, n8);
  } else if (n8) {
    switch (c) {
    case C_FLOAT: zeros += binopk_f(code, (const float *)x, s->f[0], left, r, n8, n8); break;
    case C_DOUBLE: zeros += binopk_d(code, (const double *)x, s->d[0], left, r, n8, n8); break;
    case C_INT: zeros += binopk_i(code, (const int64_t *)x, s->i[0], left, r, n8, n8); break;
    }
  }
  if (k == 0) return zeros;
  memcpy(left ? &by : &bx, x + n8 * esz, (size_t)k * esz);
  if (y) memcpy(&by, y + n8 * esz, (size_t)k * esz);
  else memcpy(left ? &bx : &by, s, sizeof *s);
  cpu_pad8(c, &bx, k);
  cpu_pad8(c, &by, k);
  zeros += cpu_binop_block(code, c, &bx, &by, &br, k);
  memcpy(r + n8 * esz, &br, (size_t)k * esz);
  return zeros;
}

/* A large contiguous op in chunks over the host's threads (cpu_par.c): the
 * chunks start at multiples of BLK, so only the last one has a tail. */
typedef struct direct_job {
  int code, left;
  cclass c;
  const char *x, *y;
  const block *s;
  char *r;
  _Atomic int64_t zeros;
} direct_job;

static void unary_chunk(void *arg, int64_t lo, int64_t hi)
{
  direct_job *j = arg;
  size_t esz = class_size(j->c);
  unary_direct(j->code, j->c, j->x + lo * esz, j->r + lo * esz, hi - lo);
}

static void binary_chunk(void *arg, int64_t lo, int64_t hi)
{
  direct_job *j = arg;
  size_t esz = class_size(j->c);
  int64_t z = binary_direct(j->code, j->c, j->x + lo * esz, j->y ? j->y + lo * esz : NULL, j->s, j->left,
                            j->r + lo * esz, hi - lo);
  if (z) j->zeros += z;
}

/* The op's dtype rule (ops.h), as dev_op.c's validate has it. */
static int check_classes(const dev_opinfo *o, dev_dtype t, char *err, size_t errlen)
{
  if (!(dev_dtype_class(t) & o->classes))
    return fail_msg(err, errlen, "%s is not defined for %s", o->name, dev_dtype_name(t));
  return 0;
}

static int run_unary(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out, *in = &op->in[0];
  dev_dtype t = out->dtype;
  const dev_opinfo *o = dev_unop_info(op->code);
  cclass c = class_of(in->dtype), rc;
  int64_t n = dev_view_numel(out), done, k;
  block x, r;
  walk wo, wi;
  if ((unsigned)op->code >= DEV_NUNOP) return fail_msg(err, errlen, "unary: bad op %d", op->code);
  if (op->code == DEV_UN_COPY && in->dtype == t) return run_copy(out, in, err, errlen);
  if (check_view(out, "out", err, errlen) || check_view(in, "in[0]", err, errlen)) return -1;
  if (dev_view_numel(in) != n) return fail_msg(err, errlen, "%s: element counts differ", dev_unop_name(op->code));
  walk_init(&wo, out);
  walk_init(&wi, in);
  if (op->code == DEV_UN_COPY) {
    /* a cast: integers stay exact as int64, every float is exact in double */
    c = class_of(in->dtype) == C_INT ? C_INT : C_DOUBLE;
    for (done = 0; done < n; done += k) {
      k = min64(BLK, n - done);
      walk_load(&wi, in->dtype, c, k, &x);
      walk_store(&wo, t, c, k, &x);
    }
    return 0;
  }
  if (o->to_bool ? t != DEV_BOOL : in->dtype != t)
    return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(in->dtype), dev_dtype_name(t));
  if (check_classes(o, in->dtype, err, errlen)) return -1;
  if (!o->to_bool && direct_ok(out, in, 1)) {
    direct_job j = {.code = op->code, .c = c, .x = dev_view_ptr(in), .r = dev_view_ptr(out)};
    return cpu_par_for(n, BLK, unary_chunk, &j, err, errlen);
  }
  rc = o->to_bool ? C_INT : c;
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    walk_load(&wi, in->dtype, c, k, &x);
    cpu_pad8(c, &x, k);
    cpu_unop_block(op->code, c, &x, &r, k);
    walk_store(&wo, t, rc, k, &r);
  }
  return 0;
}

static int run_binary(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out;
  const dev_opinfo *o = dev_binop_info(op->code);
  dev_dtype t = op->in[0].dtype;
  cclass c = class_of(t), rc;
  int scalar = (op->flags & (DEV_F_SCALAR | DEV_F_SCALAR_LEFT)) != 0;
  int left = (op->flags & DEV_F_SCALAR_LEFT) != 0;
  int64_t n = dev_view_numel(out), done, k, zeros = 0;
  block x, y, r;
  walk wo, wa, wb;
  if (o == NULL) return fail_msg(err, errlen, "binary: bad op %d", op->code);
  if (check_view(out, "out", err, errlen) || check_view(&op->in[0], "in[0]", err, errlen) ||
      (!scalar && check_view(&op->in[1], "in[1]", err, errlen)))
    return -1;
  if (o->to_bool && out->dtype != DEV_BOOL)
    return fail_msg(err, errlen, "%s: the result is bool, not %s", o->name, dev_dtype_name(out->dtype));
  for (int i = 0; i < (scalar ? 1 : 2); i++) {
    if (op->in[i].dtype != (o->to_bool ? t : out->dtype))
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name,
                  dev_dtype_name(op->in[i].dtype), dev_dtype_name(o->to_bool ? t : out->dtype));
    if (dev_view_numel(&op->in[i]) != n)
      return fail_msg(err, errlen, "%s: element counts differ", o->name);
  }
  if (check_classes(o, t, err, errlen)) return -1;
  rc = o->to_bool ? C_INT : c;
  if (scalar) cpu_scalar_to(op->s0, t, left ? &x : &y);
  if (!o->to_bool && direct_ok(out, op->in, scalar ? 1 : 2)) {
    direct_job j = {.code = op->code, .left = left, .c = c, .x = dev_view_ptr(&op->in[0]),
                    .y = scalar ? NULL : dev_view_ptr(&op->in[1]), .s = left ? &x : &y, .r = dev_view_ptr(out)};
    if (cpu_par_for(n, BLK, binary_chunk, &j, err, errlen)) return -1;
    return j.zeros > 0 ? fail_msg(err, errlen, "integer division by zero") : 0;
  }
  walk_init(&wo, out);
  walk_init(&wa, &op->in[0]);
  if (!scalar) walk_init(&wb, &op->in[1]);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    walk_load(&wa, t, c, k, left ? &y : &x);
    cpu_pad8(c, left ? &y : &x, k);
    if (!scalar) {
      walk_load(&wb, t, c, k, &y);
      cpu_pad8(c, &y, k);
    }
    zeros += cpu_binop_block(op->code, c, &x, &y, &r, k);
    walk_store(&wo, out->dtype, rc, k, &r);
  }
  if (zeros > 0) return fail_msg(err, errlen, "integer division by zero");
  return 0;
}

/* Operands 2 and 3 are the next tensors of in[] or, flagged, s0 and s1; a
 * condition (DEV_OPF_COND) is loaded as 0/1 in the compute type. */
static int run_ternary(const dev_kop *op, char *err, size_t errlen)
{
  const dev_view *out = &op->out, *v[3] = {&op->in[0], NULL, NULL};
  const dev_opinfo *o = dev_terop_info(op->code);
  dev_dtype t = out->dtype;
  cclass c = class_of(t);
  int s2 = (op->flags & DEV_F_SCALAR2) != 0, s3 = (op->flags & DEV_F_SCALAR3) != 0;
  int64_t n = dev_view_numel(out), done, k;
  block b[3], r;
  walk wo, w[3];
  static const char *const names[] = {"in[0]", "in[1]", "in[2]"};
  if (o == NULL) return fail_msg(err, errlen, "ternary: bad op %d", op->code);
  if (op->nin != 1 + !s2 + !s3) return fail_msg(err, errlen, "%s: bad operands", o->name);
  if (!s2) v[1] = &op->in[1];
  if (!s3) v[2] = &op->in[s2 ? 1 : 2];
  if (check_view(out, "out", err, errlen)) return -1;
  for (int j = 0, i = 0; j < 3; j++) {
    dev_dtype want = j == 0 && (o->flags & DEV_OPF_COND) ? DEV_BOOL : t;
    if (!v[j]) continue;
    if (check_view(v[j], names[i++], err, errlen)) return -1;
    if (v[j]->dtype != want)
      return fail_msg(err, errlen, "%s: dtype %s does not match %s", o->name, dev_dtype_name(v[j]->dtype),
                  dev_dtype_name(want));
    if (dev_view_numel(v[j]) != n) return fail_msg(err, errlen, "%s: element counts differ", o->name);
  }
  if (check_classes(o, t, err, errlen)) return -1;
  walk_init(&wo, out);
  for (int j = 0; j < 3; j++)
    if (v[j]) walk_init(&w[j], v[j]);
  if (s2) cpu_scalar_to(op->s0, t, &b[1]);
  if (s3) cpu_scalar_to(op->s1, t, &b[2]);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, n - done);
    for (int j = 0; j < 3; j++) {
      if (!v[j]) continue;
      walk_load(&w[j], v[j]->dtype, c, k, &b[j]);
      cpu_pad8(c, &b[j], k);
    }
    cpu_terop_block(op->code, c, &b[0], &b[1], &b[2], &r, k);
    walk_store(&wo, t, c, k, &r);
  }
  return 0;
}

/* ---- indexing ----------------------------------------------------------- */

/* v seen over shape (its strides kept), with stride 0 along dim: the
 * offset of a position but for its index along dim. */
static dev_view base_view(const dev_view *v, const dev_view *shape, int dim)
{
  dev_view r = *v;
  for (int d = 0; d < v->ndim; d++) r.shape[d] = shape->shape[d];
  r.stride[dim] = 0;
  return r;
}

static int index_fail(char *err, size_t errlen, int64_t i, int64_t n)
{
  return fail_msg(err, errlen, "index out of range (%lld not in 1..%lld)", (long long)i, (long long)n);
}

/* gather, index_select: out[p] = src[p with p[dim] = idx[p]]; scatter_add:
 * out[p with p[dim] = idx[p]] += src[p], in C order of idx's positions, so
 * the sums come out the same every time.  Indices are 1-based. */
static int run_index(const dev_kop *op, char *err, size_t errlen)
{
  int scatter = op->code == DEV_IDX_SCATTER_ADD, dim = op->dim;
  const dev_view *out = &op->out, *idx = &op->in[scatter ? 0 : 1], *val = &op->in[scatter ? 1 : 0];
  /* iterated over: where the positions come from (out, or idx) */
  const dev_view *it = scatter ? idx : out, *tgt = scatter ? out : val;
  dev_view base = base_view(tgt, it, dim), vals = base_view(val, it, dim);
  int64_t n = dev_view_numel(it), bound = tgt->shape[dim], sd = tgt->stride[dim], esz, done, k, j, ka, kb;
  dev_dtype t = out->dtype;
  cclass c = class_of(t);
  walk wi, wb, wv;
  char *pb, *pv;
  block ix;
  if (check_view(out, "out", err, errlen) || check_view(&op->in[0], "in[0]", err, errlen) ||
      check_view(&op->in[1], "in[1]", err, errlen))
    return -1;
  if (op->nin != 2 || dim < 0 || dim >= out->ndim || idx->ndim != out->ndim || val->ndim != out->ndim ||
      class_of(idx->dtype) != C_INT || idx->dtype == DEV_BOOL || val->dtype != t)
    return fail_msg(err, errlen, "index: bad operands");
  esz = (int64_t)dev_dtype_size(t);
  vals.stride[dim] = val->stride[dim];   /* src is read at p itself */
  if (n == 0) return 0;
  walk_init(&wi, idx);
  walk_init(&wb, &base);
  walk_init(&wv, scatter ? &vals : out);
  for (done = 0; done < n; done += k) {
    k = min64(BLK, min64(walk_avail(&wb), walk_avail(&wv)));
    walk_load(&wi, idx->dtype, C_INT, k, &ix);
    walk_run(&wb, k, &pb, &ka);
    walk_run(&wv, k, &pv, &kb);
    for (j = 0; j < k; j++) {
      int64_t i = ix.i[j];
      if (i < 1 || i > bound) return index_fail(err, errlen, i, bound);
      char *at = pb + (j * ka + (i - 1) * sd) * esz, *v = pv + j * kb * esz;
      if (!scatter) {
        copy_run(esz, v, 1, at, 1, 1);
      } else {
        union { float f; double d; int64_t i; } x, y;
        load_run(c, t, at, 1, 1, &x);
        load_run(c, t, v, 1, 1, &y);
        if (c == C_FLOAT) x.f += y.f;
        else if (c == C_DOUBLE) x.d += y.d;
        else x.i = sc_wrap64((uint64_t)x.i + (uint64_t)y.i);
        store_run(c, t, at, 1, 1, &x);
      }
    }
  }
  return 0;
}

static int run_sleep(double ms)
{
  struct timespec ts;
  if (!(ms > 0)) return 0;
  if (ms > 1e12) ms = 1e12;   /* keeps the conversion to time_t defined */
  ts.tv_sec = (time_t)(ms / 1000);
  ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
  if (ts.tv_nsec < 0) ts.tv_nsec = 0;
  if (ts.tv_nsec > 999999999L) ts.tv_nsec = 999999999L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  return 0;
}

/* DEV_OP_SORT; with DEV_SORT_VALUES, the values at the positions too (a
 * gather along dim, as cuda's paths that do not write them in the sort) */
static int run_sort(const dev_kop *op, char *err, size_t errlen)
{
  int rc = cpu_run_sort(op, err, errlen);
  if (rc || !(op->code & DEV_SORT_VALUES) || !op->fargs) return rc;
  dev_kop g = {.kind = DEV_OP_INDEX, .code = DEV_IDX_GATHER, .nin = 2, .dim = op->dim};
  g.out = op->fargs->xout[0];
  g.in[0] = op->in[0];
  g.in[1] = op->out;
  return run_index(&g, err, errlen);
}

int dev_cpu_run(const dev_kop *op, char *err, size_t errlen)
{
  if (op == NULL) return fail_msg(err, errlen, "no op");
  switch (op->kind) {
  case DEV_OP_FILL: return run_fill(op, err, errlen);
  case DEV_OP_ARANGE: return run_arange(op, err, errlen);
  case DEV_OP_RAND: return run_rand(op, err, errlen);
  case DEV_OP_UNARY: return run_unary(op, err, errlen);
  case DEV_OP_BINARY: return run_binary(op, err, errlen);
  case DEV_OP_TERNARY: return run_ternary(op, err, errlen);
  case DEV_OP_REDUCE: return cpu_run_reduce(op, err, errlen);
  case DEV_OP_MATMUL: return cpu_run_matmul(op, err, errlen);
  case DEV_OP_COPY: return run_copy(&op->out, &op->in[0], err, errlen);
  case DEV_OP_CUMSUM: case DEV_OP_SOFTMAX: return cpu_run_rows(op, err, errlen);
  case DEV_OP_INDEX: return run_index(op, err, errlen);
  case DEV_OP_SORT: return run_sort(op, err, errlen);
  case DEV_OP_FUSED:
    return op->flags & DEV_F_FREDUCE ? cpu_run_fused_reduce(op, err, errlen) : cpu_run_fused(op, err, errlen);
  case DEV_OP_SLEEP: return run_sleep(op->ms);
  case DEV_OP_LAUNCH:
    if (op->launch && dev_kernel_is_cfunc(op->launch->k)) return dev_cfunc_run(op->launch, NULL, err, errlen);
    return fail_msg(err, errlen, "run-time kernels need the cuda backend");
  }
  return fail_msg(err, errlen, "unknown op kind %d", (int)op->kind);
}

/* Philox-4x32-10: scalar.h's, which the kernels share. */
void dev_philox(uint64_t seed, uint64_t counter, uint32_t out[4])
{
  sc_philox(seed, counter, out);
}
