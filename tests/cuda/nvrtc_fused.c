/* Every op of the op table, in every dtype it takes, as a fused program
 * compiled by NVRTC (cuda/cuda/fgen.c): the code generation checked on a
 * machine without a GPU (make check-cuda, in CI).  Whether the kernels
 * compute the unfused ops' results is tests/fuse.lua's, on the GPU.
 *
 * The programs go into a few translation units, each kernel renamed, so
 * that NVRTC parses the headers a few times rather than once per program.
 * TAP output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cu.h"
#include "util.h"

static int ntest, nfail;
static void ok(int cond, const char *fmt, const char *a, const char *b) {
  ntest++;
  if (!cond) nfail++;
  printf("%s %d - ", cond ? "ok" : "not ok", ntest);
  printf(fmt, a, b);
  printf("\n");
}

static dev_fnode in(dev_dtype t, int i) { return (dev_fnode){.kind = DEV_FN_INPUT, .dtype = t, .index = i}; }
static dev_fnode par(int i) { return (dev_fnode){.kind = DEV_FN_PARAM, .dtype = DEV_NDTYPE, .index = i}; }

typedef struct unit { sbuf src; int n; } unit;

/* p's source into u (red: its trailing reductions' kernels, a mask of
 * 1 << CUK_RED_*, or 0: gf), its names made its own */
static void add_red(unit *u, const dev_fprog *p, int red) {
  static const char *const names[] = {"gf", "gf_elem", "gf_elem2", "gf_args", "knum", "gsrc", "gfr_rows", "gfr_cols", "gfr_run"};
  char err[256];
  for (int vec = 0; vec < 2; vec++) {
    sbuf s = {0};
    if (cuda_fused_source(p, vec, red, &s, err, sizeof err)) {
      ok(0, "%s: source: %s", p->name, err);
      free(s.p);
      return;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
      sb_printf(&u->src, "#define %s %s_%d_%d\n", names[i], names[i], u->n, vec);
    sb_str(&u->src, s.p);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) sb_printf(&u->src, "#undef %s\n", names[i]);
    free(s.p);
  }
  u->n++;
}

static void add(unit *u, const dev_fprog *p) { add_red(u, p, 0); }

static void try(unit *u, const char *name, const dev_fnode *nd, int n) {
  char err[256];
  const dev_fprog *p = dev_fprog_intern(name, nd, n, err, sizeof err);
  if (p) add(u, p);   /* refused: the op does not take the dtype (fprog.c checks that) */
}

static void compile_unit(unit *u, const char *what);

static dev_fnode cnum(double v) {
  return (dev_fnode){.kind = DEV_FN_CONST, .dtype = DEV_NDTYPE, .k = {.f = v}};
}
static dev_fnode un(int code, dev_dtype t, int a) {
  return (dev_fnode){.kind = DEV_FN_UNARY, .code = code, .dtype = t, .a = {a}};
}
static dev_fnode bin(int code, dev_dtype t, int a, int b) {
  return (dev_fnode){.kind = DEV_FN_BINARY, .code = code, .dtype = t, .a = {a, b}};
}

/* p's contiguous source has (want) or has not the text s */
static void has(const dev_fprog *p, const char *s, int want) {
  sbuf src = {0};
  char err[256];
  int rc = cuda_fused_source(p, 1, 0, &src, err, sizeof err);
  ok(rc == 0 && (strstr(src.p, s) != NULL) == want, want ? "%s: uses %s" : "%s: does not use %s", p->name, s);
  free(src.p);
}

/* The exact shortcuts of bf16 and f16 pairs (fgen.c's p16_op): which
 * programs take them, and that those compile.  Whether they give the
 * unfused bits is tests/gpu/fuse_exact.lua's, on the GPU. */
static const dev_dtype dts[] = {DEV_BF16, DEV_F16, DEV_F32};
static const char *const dtn[] = {"DEV_BF16", "DEV_F16", "DEV_F32"};

/* GELU as bench/ops.lua writes it, of dtype B: 0.044715 and 0.79788 are
 * in neither bf16 nor f16 */
static const dev_fprog *gelu(dev_dtype B, char *err, size_t errlen) {
  dev_fnode g[] = {in(B, 0),
                   bin(DEV_BIN_MUL, B, 0, 0), bin(DEV_BIN_MUL, B, 1, 0), cnum(0.044715), bin(DEV_BIN_MUL, B, 2, 3),
                   bin(DEV_BIN_ADD, B, 4, 0), cnum(0.7978845608), bin(DEV_BIN_MUL, B, 5, 6), un(DEV_UN_TANH, B, 7),
                   cnum(1), bin(DEV_BIN_ADD, B, 8, 9), bin(DEV_BIN_MUL, B, 10, 0), cnum(0.5),
                   bin(DEV_BIN_MUL, B, 11, 12)};
  char name[64];
  snprintf(name, sizeof name, "gelu_%s", dev_dtype_name(B));
  return dev_fprog_intern(name, g, (int)(sizeof g / sizeof g[0]), err, errlen);
}

static void p16_gelu(unit *u) {
  char err[256], want[128];
  const dev_fprog *p;
  for (size_t d = 0; d < 2; d++) {
    dev_dtype B = dts[d];
    const char *N = dtn[d];
    p = gelu(B, err, sizeof err);
    ok(p != NULL, "gelu_%s: %s", dev_dtype_name(B), p ? "interned" : err);
    if (!p) continue;
    snprintf(want, sizeof want, "k_p2_mul<%s>(h0, h0)", N);
    has(p, want, 1);
    has(p, "k_p2_tanh_bf16(h7)", B == DEV_BF16);   /* f16's: the float op */
    unsigned one = B == DEV_BF16 ? 0x3f80 : 0x3c00, half = B == DEV_BF16 ? 0x3f00 : 0x3800;
    snprintf(want, sizeof want, "k_p2_add<%s>(h8, k_p2_bits<%s>(0x%04x, 0x%04x))", N, N, one, one);
    has(p, want, 1);   /* + 1 */
    snprintf(want, sizeof want, "k_p2_mul<%s>(h11, k_p2_bits<%s>(0x%04x, 0x%04x))", N, N, half, half);
    has(p, want, 1);   /* * 0.5 */
    snprintf(want, sizeof want, "k_p2_mul<%s>(h2, ", N);
    has(p, want, 0);   /* x^3 * 0.044715: in float */
    snprintf(want, sizeof want, "k_p2_put<%s>(out0a, out0b, h13)", N);
    has(p, want, 1);   /* the result stored as a pair */
    add(u, p);
  }
}

/* each op with a CONST (2: exact, 0.1: not), a PARAM (known at run time),
 * a number on the left; f32 never packed */
static void p16_numbers(unit *u) {
  char err[256];
  const dev_fprog *p;
  static const int ops[] = {DEV_BIN_ADD, DEV_BIN_SUB, DEV_BIN_MUL, DEV_BIN_DIV};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
      dev_dtype T = dts[d];
      const char *N = dtn[d];
      int o = ops[k], pk = T != DEV_F32;
      /* a node is packed by its op, or (division) rounded and packed */
      const char *fn = o == DEV_BIN_ADD ? "add" : o == DEV_BIN_SUB ? "sub" : o == DEV_BIN_MUL ? "mul" : "round";
      char name[64], h2[64], h4[64], rnd[64];
      snprintf(h2, sizeof h2, "h2 = k_p2_%s<%s>(", fn, N);
      snprintf(h4, sizeof h4, "h4 = k_p2_%s<%s>(", fn, N);
      snprintf(rnd, sizeof rnd, "h2 = k_p2_round<%s>(", N);
      dev_fnode c2[] = {in(T, 0), cnum(2), bin(o, T, 0, 1), in(T, 1), bin(o, T, 2, 3)};
      dev_fnode c01[] = {cnum(0.1), in(T, 0), bin(o, T, 0, 1)};
      dev_fnode pr[] = {in(T, 0), par(0), bin(o, T, 0, 1)};
      snprintf(name, sizeof name, "%s_const2_%s", dev_binop_info(o)->name, dev_dtype_name(T));
      if ((p = dev_fprog_intern(name, c2, 5, err, sizeof err))) {
        has(p, h2, pk);
        has(p, h4, pk);
        add(u, p);
      }
      snprintf(name, sizeof name, "%s_const01_%s", dev_binop_info(o)->name, dev_dtype_name(T));
      if ((p = dev_fprog_intern(name, c01, 3, err, sizeof err))) {
        has(p, rnd, pk);
        add(u, p);
      }
      snprintf(name, sizeof name, "%s_param_%s", dev_binop_info(o)->name, dev_dtype_name(T));
      if ((p = dev_fprog_intern(name, pr, 3, err, sizeof err))) {
        /* packed when the number is one of T, else the float op rounded */
        has(p, "if (k_p2_exact<", pk && o != DEV_BIN_DIV);
        has(p, rnd, pk);
        add(u, p);
      }
    }
}

/* tanh and exp of bf16 and f16 (f16's tanh: the float op); a cast read by
 * a packed op; a packed node's elements read by ops of every kind */
static void p16_reads(unit *u) {
  char err[256], want[128];
  const dev_fprog *p;
  for (size_t d = 0; d < 2; d++) {
    dev_dtype T = dts[d];
    char name[64];
    dev_fnode t[] = {in(T, 0), un(DEV_UN_TANH, T, 0), un(DEV_UN_EXP, T, 1)};
    snprintf(name, sizeof name, "tanh_exp_%s", dev_dtype_name(T));
    if ((p = dev_fprog_intern(name, t, 3, err, sizeof err))) {
      has(p, "k_p2_tanh_bf16(h0)", T == DEV_BF16);
      snprintf(want, sizeof want, "k_p2_exp<%s>(v1a, v1b)", dtn[d]);
      has(p, want, 1);
      add(u, p);
    }
  }
  /* a cast to bf16 read by a packed op */
  const dev_dtype B = DEV_BF16;
  dev_fnode cast[] = {in(DEV_F32, 0), {.kind = DEV_FN_CAST, .dtype = B, .a = {0}}, in(B, 1),
                      bin(DEV_BIN_MUL, B, 1, 2)};
  if ((p = dev_fprog_intern("cast_mul_bf16", cast, 4, err, sizeof err))) {
    has(p, "k_p2_mul<DEV_BF16>(h1, h2)", 1);
    add(u, p);
  }
  /* a packed node's elements (kp1) read by a unary op, a ternary, a
   * comparison, a packed op and a cast */
  dev_fnode mix[] = {in(B, 0), in(B, 1), bin(DEV_BIN_MUL, B, 0, 1), un(DEV_UN_RELU, B, 2), in(DEV_BOOL, 2),
                     {.kind = DEV_FN_TERNARY, .code = DEV_TER_WHERE, .dtype = B, .a = {4, 2, 3}},
                     bin(DEV_BIN_ADD, B, 2, 5), bin(DEV_BIN_GT, DEV_BOOL, 6, 0),
                     {.kind = DEV_FN_CAST, .dtype = DEV_F32, .a = {6}}, {.kind = DEV_FN_CAST, .dtype = DEV_F32, .a = {7}},
                     bin(DEV_BIN_MUL, DEV_F32, 8, 9)};
  if ((p = dev_fprog_intern("kp1_reads", mix, (int)(sizeof mix / sizeof mix[0]), err, sizeof err))) {
    has(p, "kp2<DEV_BF16> h6 = k_p2_add<DEV_BF16>(h2, h5)", 1);
    add(u, p);
  } else {
    ok(0, "%s: %s", "kp1_reads", err);
  }
}

static void p16_pairs(void) {
  unit u = {0};
  p16_gelu(&u);
  p16_numbers(&u);
  p16_reads(&u);
  compile_unit(&u, "bf16 and f16 pairs");
}

static void compile_unit(unit *u, const char *what) {
  dev_kimage img;
  char *log = NULL, err[512];
  int rc = cuda_fused_compile_src(u->src.p, what, "sm_90", &img, &log, err, sizeof err);
  char count[64];
  snprintf(count, sizeof count, "%d programs", u->n);
  ok(rc == 0, "%s (%s) compiles", what, count);
  if (rc) {
    printf("# %s\n", err);
    if (log) {
      /* the first lines of the log */
      char *e = log;
      for (int i = 0; i < 40 && e && *e; i++) e = strchr(e + 1, '\n');
      if (e) *e = 0;
      printf("# %s\n", log);
    }
  } else {
    dev_kimage_free(&img);
  }
  free(log);
  free(u->src.p);
  memset(u, 0, sizeof *u);
}

/* several results of one program, of different dtypes: an op's, a
 * comparison's (bool), a cast's (bf16), the input itself, one node twice */
static void several_results(void) {
  char name[64];
  unit u = {0};
  dev_fnode nd[6] = {in(DEV_F32, 0), in(DEV_F32, 1),
                     {.kind = DEV_FN_BINARY, .code = DEV_BIN_MUL, .dtype = DEV_F32, .a = {0, 1}},
                     {.kind = DEV_FN_BINARY, .code = DEV_BIN_LT, .dtype = DEV_BOOL, .a = {2, 1}},
                     {.kind = DEV_FN_CAST, .dtype = DEV_BF16, .a = {2}},
                     {.kind = DEV_FN_UNARY, .code = DEV_UN_EXP, .dtype = DEV_F32, .a = {0}}};
  static const struct { int nout, res[DEV_FMAXOUT]; } rs[] = {{3, {2, 3, 4}}, {4, {5, 4, 0, 5}}, {2, {3, 2}}};
  for (size_t c = 0; c < sizeof rs / sizeof rs[0]; c++) {
    char err[256];
    snprintf(name, sizeof name, "multi_%d", (int)c);
    const dev_fprog *p = dev_fprog_intern_res(name, nd, 6, rs[c].res, rs[c].nout, err, sizeof err);
    ok(p != NULL, "%s: %s", name, p ? "interned" : err);
    if (p) add(&u, p);
  }
  compile_unit(&u, "several results");
  /* a name as load() makes it, with quotes, and one with a newline: the
   * source's comment and NVRTC's file name (PTX's .file) take them */
  static const char *const odd[] = {"fused@[string \"return function(a) return a end\"]:1", "two\nlines */ x"};
  for (int i = 0; i < 2; i++) {
    char err[512];
    const dev_fprog *p = dev_fprog_intern_res(odd[i], nd, 6, rs[0].res, 1, err, sizeof err);
    dev_kimage img;
    char *log = NULL;
    int rc = p ? cuda_fused_compile(p, 1, 0, "sm_90", &img, &log, err, sizeof err) : -1;
    ok(rc == 0, "a program named %s compiles%s", i ? "with a newline" : "with quotes", rc ? err : "");
    if (rc == 0) dev_kimage_free(&img);
    free(log);
  }
}

/* argv[1] "reductions": only the trailing reductions' unit; "results":
 * only the unit of several results */
/* every op of the table that takes T, and every cast from T, in one unit */
static void every_op(dev_dtype T) {
  char name[64];
  unit u = {0};
  for (int op = 0; op < DEV_NUNOP; op++) {
    if (op == DEV_UN_COPY) continue;
    const dev_opinfo *o = dev_unop_info(op);
    dev_fnode nd[2] = {in(T, 0), {.kind = DEV_FN_UNARY, .code = op, .dtype = o->to_bool ? DEV_BOOL : T, .a = {0}}};
    snprintf(name, sizeof name, "%s_%s", o->name, dev_dtype_name(T));
    try(&u, name, nd, 2);
  }
  for (int op = 0; op < DEV_NBINOP; op++) {
    const dev_opinfo *o = dev_binop_info(op);
    dev_dtype R = o->to_bool ? DEV_BOOL : T;
    dev_fnode tt[3] = {in(T, 0), in(T, 1), {.kind = DEV_FN_BINARY, .code = op, .dtype = R, .a = {0, 1}}};
    dev_fnode tn[3] = {in(T, 0), par(0), {.kind = DEV_FN_BINARY, .code = op, .dtype = R, .a = {0, 1}}};
    dev_fnode nt[3] = {par(0), in(T, 0), {.kind = DEV_FN_BINARY, .code = op, .dtype = R, .a = {0, 1}}};
    snprintf(name, sizeof name, "%s_%s", o->name, dev_dtype_name(T));
    try(&u, name, tt, 3);
    try(&u, name, tn, 3);
    if (o->flags & DEV_OPF_LEFT) try(&u, name, nt, 3);
  }
  for (int op = 0; op < DEV_NTEROP; op++) {
    const dev_opinfo *o = dev_terop_info(op);
    dev_dtype C = (o->flags & DEV_OPF_COND) ? DEV_BOOL : T;
    dev_fnode t3[4] = {in(C, 0), in(T, 1), in(T, 2), {.kind = DEV_FN_TERNARY, .code = op, .dtype = T, .a = {0, 1, 2}}};
    dev_fnode t1[4] = {in(C, 0), par(0), par(1), {.kind = DEV_FN_TERNARY, .code = op, .dtype = T, .a = {0, 1, 2}}};
    snprintf(name, sizeof name, "%s_%s", o->name, dev_dtype_name(T));
    try(&u, name, t3, 4);
    try(&u, name, t1, 4);
  }
  for (int t2 = 0; t2 < DEV_NDTYPE; t2++) {
    dev_fnode nd[2] = {in(T, 0), {.kind = DEV_FN_CAST, .dtype = (dev_dtype)t2, .a = {0}}};
    snprintf(name, sizeof name, "cast_%s_%s", dev_dtype_name(T), dev_dtype_name((dev_dtype)t2));
    try(&u, name, nd, 2);
  }
  snprintf(name, sizeof name, "every op on %s", dev_dtype_name(T));
  compile_unit(&u, name);
}

/* the trailing reductions' unit */
static void reductions(void) {
  char name[64];
  /* the trailing reductions (k_reduce.cuh's bodies with a program's
   * values; both layouts, rows and columns): each reduction once, over a
   * program of a dtype of each class.  Each compile costs about a second
   * (the bodies unroll), so one unit of a few. */
  static const struct { dev_dtype t; int red; } rcase[] = {
      {DEV_F32, DEV_RED_SUM}, {DEV_BF16, DEV_RED_MEAN}, {DEV_F64, DEV_RED_PROD},
      {DEV_I32, DEV_RED_MAX}, {DEV_U8, DEV_RED_MIN},   {DEV_BOOL, DEV_RED_SUM}};
  unit u = {0};
  for (size_t c = 0; c < sizeof rcase / sizeof rcase[0]; c++) {
    dev_dtype T = rcase[c].t;
    /* (x * p) // y, or for bool (x and p) or y: two inputs, a parameter, an
     * op that may divide by zero */
    dev_fnode nd[5] = {in(T, 0), par(0), {.kind = DEV_FN_BINARY, .code = DEV_BIN_MUL, .dtype = T, .a = {0, 1}},
                       in(T, 1), {.kind = DEV_FN_BINARY, .code = DEV_BIN_FLOOR_DIVIDE, .dtype = T, .a = {2, 3}}};
    if (T == DEV_BOOL) nd[2].code = DEV_BIN_LOGICAL_AND, nd[4].code = DEV_BIN_LOGICAL_OR;
    snprintf(name, sizeof name, "red_%s", dev_dtype_name(T));
    char err[256];
    int last = 4;
    const dev_fprog *p = dev_fprog_intern_red(name, nd, 5, &last, 1, &rcase[c].red, err, sizeof err);
    ok(p != NULL, "%s: %s", name, p ? "interned" : err);
    if (p) add_red(&u, p, 7);
  }
  /* several reductions of one program, one accumulator each (rmulti):
   * sum, max and mean of three f32 values; every trailing reduction but
   * mean of four i32 ones */
  static const struct { dev_dtype t; int nres, red[4]; } mcase[] = {
      {DEV_F32, 3, {DEV_RED_SUM, DEV_RED_MAX, DEV_RED_MEAN}},
      {DEV_I32, 4, {DEV_RED_SUM, DEV_RED_PROD, DEV_RED_MAX, DEV_RED_MIN}}};
  for (size_t c = 0; c < sizeof mcase / sizeof mcase[0]; c++) {
    dev_dtype T = mcase[c].t;
    dev_fnode nd[6] = {in(T, 0), par(0), {.kind = DEV_FN_BINARY, .code = DEV_BIN_MUL, .dtype = T, .a = {0, 1}},
                       in(T, 1), {.kind = DEV_FN_BINARY, .code = DEV_BIN_FLOOR_DIVIDE, .dtype = T, .a = {2, 3}},
                       {.kind = DEV_FN_BINARY, .code = DEV_BIN_SUB, .dtype = T, .a = {3, 0}}};
    int res[4] = {2, 4, 5, 0};
    char err[256];
    snprintf(name, sizeof name, "reds%d_%s", mcase[c].nres, dev_dtype_name(T));
    const dev_fprog *p = dev_fprog_intern_red(name, nd, 6, res, mcase[c].nres, mcase[c].red, err, sizeof err);
    ok(p != NULL, "%s: %s", name, p ? "interned" : err);
    if (p) add_red(&u, p, 7);
  }
  compile_unit(&u, "trailing reductions");
}

/* The bench's GELU of dtype name dt (bf16, f16, f32), contiguous: its CUDA
 * source to stdout, its sm_90 cubin (NVRTC's) into the file cubin.  For
 * counting a kernel's instructions where no GPU (and no disassembler) is:
 * sm_90 instructions are 16 bytes, so the size of the cubin's .text.gf
 * (readelf -SW) / 16 is gf's count; nvcc -ptx on the source (-Icuda
 * -Icuda/cuda -fmad=false) gives its PTX. */
static int gelu_kernel(const char *dt, const char *cubin) {
  dev_dtype t = DEV_NDTYPE;
  char err[512];
  for (int i = 0; i < DEV_NDTYPE; i++)
    if (strcmp(dt, dev_dtype_name((dev_dtype)i)) == 0) t = (dev_dtype)i;
  const dev_fprog *p = t == DEV_BF16 || t == DEV_F16 || t == DEV_F32 ? gelu(t, err, sizeof err) : NULL;
  sbuf src = {0};
  if (!p || cuda_fused_source(p, 1, 0, &src, err, sizeof err)) {
    fprintf(stderr, "gelu %s: %s\n", dt, p ? err : "bf16, f16 or f32");
    free(src.p);
    return 1;
  }
  fputs(src.p, stdout);
  dev_kimage img;
  char *log = NULL;
  int rc = cuda_fused_compile_src(src.p, "gelu.cu", "sm_90", &img, &log, err, sizeof err);
  free(src.p);
  free(log);
  if (rc) {
    fprintf(stderr, "gelu %s: %s\n", dt, err);
    return 1;
  }
  FILE *f = fopen(cubin, "wb");
  int bad = !f || fwrite(img.data, 1, img.size, f) != img.size;
  if (f && fclose(f) != 0) bad = 1;
  dev_kimage_free(&img);
  if (bad) fprintf(stderr, "gelu %s: cannot write %s\n", dt, cubin);
  return bad;
}

int main(int argc, char **argv) {
  setenv("GPULUA_KERNEL_CACHE", "0", 1);
  /* argv[1] "gelu", argv[2] a dtype, argv[3] a file: gelu_kernel */
  if (argc > 3 && strcmp(argv[1], "gelu") == 0) return gelu_kernel(argv[2], argv[3]);
  /* argv[1] "pairs": only the unit of bf16 and f16 pairs */
  if (argc > 1 && strcmp(argv[1], "pairs") == 0) {
    p16_pairs();
    printf("1..%d\n", ntest);
    return nfail != 0;
  }
  int only_red = argc > 1 && strcmp(argv[1], "reductions") == 0;
  int only_res = argc > 1 && strcmp(argv[1], "results") == 0;
  for (int t = 0; t < DEV_NDTYPE && !only_red && !only_res; t++) every_op((dev_dtype)t);
  if (!only_red) {
    several_results();
    if (only_res) {
      printf("1..%d\n", ntest);
      return nfail != 0;
    }
  }
  reductions();
  if (!only_red) p16_pairs();
  printf("1..%d\n", ntest);
  return nfail != 0;
}
