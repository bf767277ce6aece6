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

/* p's source into u (red: its trailing reduction + 1, or 0), its names
 * made its own */
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
}

/* argv[1] "reductions": only the trailing reductions' unit; "results":
 * only the unit of several results */
int main(int argc, char **argv) {
  char name[64];
  setenv("GPULUA_KERNEL_CACHE", "0", 1);
  int only_red = argc > 1 && strcmp(argv[1], "reductions") == 0;
  int only_res = argc > 1 && strcmp(argv[1], "results") == 0;
  for (int t = 0; t < DEV_NDTYPE && !only_red && !only_res; t++) {
    unit u = {0};
    dev_dtype T = (dev_dtype)t;
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
  if (!only_red) {
    several_results();
    if (only_res) {
      printf("1..%d\n", ntest);
      return nfail != 0;
    }
  }
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
    const dev_fprog *p = dev_fprog_intern(name, nd, 5, err, sizeof err);
    ok(p != NULL, "%s: %s", name, p ? "interned" : err);
    if (p) add_red(&u, p, 1 + rcase[c].red);
  }
  compile_unit(&u, "trailing reductions");
  printf("1..%d\n", ntest);
  return nfail != 0;
}
