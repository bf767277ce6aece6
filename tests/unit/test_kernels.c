/* Kernel signatures read from CUDA C and PTX, and run-time compilation with
 * NVRTC and its on-disk cache.  NVRTC needs no GPU, so this runs wherever
 * the cuda backend is built (cuda/cuda/nvrtc.c) and libnvrtc is installed
 * (otherwise those tests are skipped). */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devpriv.h"
#ifdef GPULUA_HAVE_CUDA
#include "cuda/cu.h"   /* dev_nvrtc_compile */
#endif
#include "tests/tap.h"

/* Under ASan: LeakSanitizer scans each thread's dynamic TLS as roots, and
 * once libnvrtc is loaded (the nvrtc tests below) it read a bogus dynamic
 * TLS range on some machines and crashed at exit ("Tracer caught signal
 * 11", DTLS 8 at 0x1adc-0x20000037de; kernel 6.18, glibc 2.36, gcc 12's
 * libasan, 2026-11-25), whatever the test did.  This test keeps no heap
 * pointer in thread-local storage, so its leak check does without it. */
#ifdef __SANITIZE_ADDRESS__
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "use_tls=0"; }
#endif


static const dev_ksig *find(const dev_ksig *k, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(k[i].name, name) == 0) return &k[i];
  return NULL;
}

static int param_is(const dev_ksig *k, int i, dev_kparam_kind kind, int size, const char *name,
                    const char *type, int pointee, int is_const) {
  if (!k || i >= k->nparams) return 0;
  const dev_kparam *p = &k->params[i];
  int good = p->kind == kind && p->size == size && strcmp(p->name, name) == 0 &&
             strcmp(p->type, type) == 0 && p->pointee == pointee && p->is_const == is_const;
  if (!good)
    printf("# %s param %d: kind %d size %d name '%s' type '%s' pointee %d const %d\n", k->name, i,
           p->kind, p->size, p->name, p->type, p->pointee, p->is_const);
  return good;
}

static const char *SRC =
  "#include <cuda_fp16.h>\n"
  "#define N 4 /* a macro, with a ( in a comment */\n"
  "// __global__ void commented(int x) {}\n"
  "/* __global__ void also_commented(int x) {} */\n"
  "struct Pair { int a, b; };\n"
  "extern \"C\" __global__ void saxpy(float a, const float *__restrict__ x, float* y, int n)\n"
  "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }\n"
  "__global__ void __launch_bounds__(256, 2) mangled(unsigned long long n, size_t m,\n"
  "    double d, __half h, bool flag, const int64_t *src, __nv_bfloat16 *dst, void *any) {}\n"
  "template <typename T> __global__ void templ(T *x) {}\n"
  "namespace ns { __global__ void inner(char c, unsigned char u, signed char s) {} }\n"
  "extern \"C\" {\n"
  "__global__ void noargs() {}\n"
  "__global__ void voidargs(void) {}\n"
  "}\n"
  "__global__ void unnamed(float, const int *, unsigned int);\n"
  "__global__ void unnamed(float a, const int *b, unsigned int c) {}\n"
  "__global__ void other(Pair p, float4 *v, float &r, float x[]) {}\n"
  "__device__ void not_a_kernel(int x) {}\n"
  "static const char *s = \"__global__ void in_string(int x) {}\";\n";

static void test_parse(void) {
  dev_ksig *k = NULL;
  int n = 0;
  char err[256] = "";
  int rc = dev_kernels_parse(SRC, &k, &n, err, sizeof err);
  ok(rc == 0, "parse: the source parses (%s)", err);
  ok(n == 8, "parse: 8 kernels found, comments, strings and __device__ functions skipped (got %d)", n);
  const dev_ksig *s = find(k, n, "saxpy");
  ok(s && s->extern_c && s->nparams == 4, "parse: saxpy is extern \"C\" with 4 parameters");
  ok(param_is(s, 0, DEV_KP_FLOAT, 4, "a", "float", -1, 0), "parse: float a");
  ok(param_is(s, 1, DEV_KP_POINTER, 8, "x", "const float *", DEV_F32, 1), "parse: const float *__restrict__ x");
  ok(param_is(s, 2, DEV_KP_POINTER, 8, "y", "float *", DEV_F32, 0), "parse: float* y");
  ok(param_is(s, 3, DEV_KP_INT, 4, "n", "int", -1, 0), "parse: int n");
  const dev_ksig *m = find(k, n, "mangled");
  ok(m && !m->extern_c && m->nparams == 8, "parse: __launch_bounds__ skipped, 8 parameters");
  ok(param_is(m, 0, DEV_KP_UINT, 8, "n", "unsigned long long", -1, 0), "parse: unsigned long long");
  ok(param_is(m, 1, DEV_KP_UINT, 8, "m", "size_t", -1, 0), "parse: size_t");
  ok(param_is(m, 2, DEV_KP_FLOAT, 8, "d", "double", -1, 0), "parse: double");
  ok(param_is(m, 3, DEV_KP_HALF, 2, "h", "__half", -1, 0), "parse: __half");
  ok(param_is(m, 4, DEV_KP_BOOL, 1, "flag", "bool", -1, 0), "parse: bool");
  ok(param_is(m, 5, DEV_KP_POINTER, 8, "src", "const int64_t *", DEV_I64, 1), "parse: const int64_t *");
  ok(param_is(m, 6, DEV_KP_POINTER, 8, "dst", "__nv_bfloat16 *", DEV_BF16, 0), "parse: __nv_bfloat16 *");
  ok(param_is(m, 7, DEV_KP_POINTER, 8, "any", "void *", -1, 0), "parse: void * takes any dtype");
  const dev_ksig *t = find(k, n, "templ");
  ok(t && t->is_template, "parse: a template kernel is marked");
  const dev_ksig *in = find(k, n, "inner");
  ok(in && strcmp(in->qualified, "ns::inner") == 0, "parse: namespace qualifies the name (%s)", in ? in->qualified : "-");
  ok(param_is(in, 0, DEV_KP_INT, 1, "c", "char", -1, 0) && param_is(in, 1, DEV_KP_UINT, 1, "u", "unsigned char", -1, 0) &&
     param_is(in, 2, DEV_KP_INT, 1, "s", "signed char", -1, 0), "parse: char, unsigned char, signed char");
  const dev_ksig *na = find(k, n, "noargs"), *va = find(k, n, "voidargs");
  ok(na && na->nparams == 0 && na->extern_c && va && va->nparams == 0 && va->extern_c,
     "parse: () and (void) in an extern \"C\" block");
  const dev_ksig *u = find(k, n, "unnamed");
  ok(u && u->nparams == 3 && !u->overloaded, "parse: a declaration and its definition are one kernel");
  ok(param_is(u, 0, DEV_KP_FLOAT, 4, "", "float", -1, 0) && param_is(u, 1, DEV_KP_POINTER, 8, "", "const int *", DEV_I32, 1) &&
     param_is(u, 2, DEV_KP_UINT, 4, "", "unsigned int", -1, 0), "parse: unnamed parameters");
  const dev_ksig *o = find(k, n, "other");
  ok(o && o->nparams == 4 && o->params[0].kind == DEV_KP_OTHER && o->params[2].kind == DEV_KP_OTHER,
     "parse: a struct and a reference cannot be passed");
  ok(param_is(o, 1, DEV_KP_POINTER, 8, "v", "float4 *", DEV_F32, 0), "parse: float4 * takes an f32 tensor");
  ok(param_is(o, 3, DEV_KP_POINTER, 8, "x", "float []", DEV_F32, 0), "parse: float x[] is a pointer");
  dev_kernels_free(k, n);

  rc = dev_kernels_parse("__global__ void f(int a, float b) {}\n__global__ void f(int a) {}\n", &k, &n, err, sizeof err);
  ok(rc == 0 && n == 1 && k[0].overloaded, "parse: overloads are marked");
  dev_kernels_free(k, n);
  rc = dev_kernels_parse("__global__ void broken(int a, float b {}\n", &k, &n, err, sizeof err);
  ok(rc == -1 && strstr(err, "broken") && strstr(err, "unbalanced"), "parse: unbalanced parentheses: %s", err);
  rc = dev_kernels_parse("__global__ void v(void x) {}\n", &k, &n, err, sizeof err);
  ok(rc == -1 && strstr(err, "void"), "parse: a void parameter is an error: %s", err);
  rc = dev_kernels_parse("", &k, &n, err, sizeof err);
  ok(rc == 0 && n == 0, "parse: no kernels in empty source");
  dev_kernels_free(k, n);
}

static const char *PTX =
  ".version 8.0\n.target sm_90\n.address_size 64\n"
  ".visible .entry scale(\n .param .u64 scale_param_0,\n .param .f32 scale_param_1,\n"
  " .param .u32 scale_param_2\n)\n{ ret; }\n"
  ".visible .entry bystruct(\n .param .align 8 .b8 bystruct_param_0[16]\n)\n{ ret; }\n";

static void test_ptx(void) {
  dev_ksig *k = NULL;
  int n = 0;
  char err[256] = "";
  int rc = dev_kernels_parse_ptx(PTX, &k, &n, err, sizeof err);
  ok(rc == 0 && n == 2, "ptx: two entries (%s)", err);
  const dev_ksig *s = find(k, n, "scale");
  ok(s && s->nparams == 3 && s->params[0].kind == DEV_KP_RAW && s->params[0].size == 8 &&
     s->params[1].kind == DEV_KP_FLOAT && s->params[1].size == 4 && s->params[2].kind == DEV_KP_UINT &&
     s->params[2].size == 4, "ptx: .u64 raw (pointer or integer), .f32 float, .u32 unsigned");
  const dev_ksig *b = find(k, n, "bystruct");
  ok(b && b->nparams == 1 && b->params[0].kind == DEV_KP_OTHER && b->params[0].size == 16,
     "ptx: a .b8 array parameter is a struct of 16 bytes");
  dev_kernels_free(k, n);
}

#ifndef GPULUA_HAVE_CUDA
static void test_nvrtc(void) { skip(NULL, "NVRTC is the cuda backend's (not built)"); }
#else
static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".kc") && !strstr(e->d_name, ".tmp")) n++;
  closedir(d);
  return n;
}

/* A damaged cache file is found by its checksum, removed and recompiled,
 * with a note; never an error or a wrong image.  Then a cache directory
 * whose parent is missing. */
static void test_nvrtc_damaged(const char *dir, const char *sub, const char *src, const char *const *exprs,
                               const char *const *opt) {
  dev_kimage img;
  char *log = NULL, err[512] = "";
  int rc;
  char path[512];
  DIR *d = opendir(sub);
  struct dirent *e;
  path[0] = 0;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".kc")) { snprintf(path, sizeof path, "%s/%s", sub, e->d_name); break; }
  if (d) closedir(d);
  FILE *f = fopen(path, "r+b");
  if (f) { fseek(f, 40, SEEK_SET); fputc('#', f); fclose(f); }
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", NULL, 0, exprs, 2, 1, &img, &log, err, sizeof err);
  int rc2 = rc == 0 ? 0 : -1;
  char note[sizeof img.note];
  snprintf(note, sizeof note, "%s", img.note);
  dev_kimage_free(&img);
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", opt, 1, exprs, 2, 1, &img, &log, err, sizeof err);
  ok(rc2 == 0 && rc == 0, "nvrtc: a damaged cache file is recompiled");
  /* path is one of the two entries */
  if (!note[0]) snprintf(note, sizeof note, "%s", img.note);
  ok(strstr(note, "damaged") && strstr(note, path), "nvrtc: ... with a note: %s", note);
  dev_kimage_free(&img);
  for (int i = 0; i < 2; i++) {
    rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", i ? opt : NULL, i, exprs, 2, 1, &img, &log, err, sizeof err);
    ok(rc == 0 && img.from_cache && !img.note[0], "nvrtc: entry %d then comes from the cache, with no note", i + 1);
    dev_kimage_free(&img);
  }
  char missing[300];
  snprintf(missing, sizeof missing, "%s/missing/cache", dir);
  setenv("GPULUA_KERNEL_CACHE", missing, 1);
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", NULL, 0, exprs, 2, 1, &img, &log, err, sizeof err);
  snprintf(missing, sizeof missing, "%s/missing", dir);
  ok(rc == 0 && strstr(img.note, "GPULUA_KERNEL_CACHE=") && strstr(img.note, "without the cache") &&
     access(missing, F_OK) != 0, "nvrtc: a cache directory whose parent is missing: a note, nothing made: %s",
     img.note);
  dev_kimage_free(&img);
}

static void test_nvrtc(void) {
  /* the library's loader is the probe (it keeps LeakSanitizer away from
   * NVRTC's own process-lifetime allocations) */
  dev_kimage probe;
  char perr[512] = "";
  if (dev_nvrtc_compile(NULL, "__global__ void k() {}\n", "probe.cu", "sm_90", NULL, 0, NULL, 0, 0, &probe,
                        NULL, perr, sizeof perr) && strstr(perr, "needs NVRTC")) {
    skip(NULL, perr);
    return;
  }
  dev_kimage_free(&probe);
  char dir[] = "/tmp/gpulua-kcache-XXXXXX";
  if (!mkdtemp(dir)) { ok(0, "nvrtc: mkdtemp"); return; }
  char sub[256];
  snprintf(sub, sizeof sub, "%s/nested", dir);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/nested/cache", dir);
  setenv("GPULUA_KERNEL_CACHE", sub, 1);
  const char *src = "extern \"C\" __global__ void add1(float *x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1; }\n"
                    "__global__ void cxx(double *y) { y[0] = 2; }\n";
  const char *exprs[] = {"&add1", "&cxx"};
  dev_kimage img;
  char *log = NULL, err[512] = "";
  int rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", NULL, 0, exprs, 2, 1, &img, &log, err, sizeof err);
  ok(rc == 0 && img.size > 0 && !img.from_cache, "nvrtc: compiles for sm_90 (%s)", err);
  ok(rc == 0 && img.size > 4 && memcmp(img.data, "\x7f" "ELF", 4) == 0, "nvrtc: the image is a cubin (ELF)");
  ok(rc == 0 && img.n == 2 && strcmp(img.lowered[0], "add1") == 0 && strncmp(img.lowered[1], "_Z3cxx", 6) == 0,
     "nvrtc: lowered names (add1, %s)", rc == 0 && img.n == 2 ? img.lowered[1] : "-");
  size_t size1 = img.size;
  dev_kimage_free(&img);
  free(log);
  ok(count_files(sub) == 1, "nvrtc: one file in the cache directory (its last component made)");
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", NULL, 0, exprs, 2, 1, &img, &log, err, sizeof err);
  ok(rc == 0 && img.from_cache && img.size == size1 && img.n == 2 && strcmp(img.lowered[0], "add1") == 0,
     "nvrtc: the same compilation comes from the cache");
  dev_kimage_free(&img);
  const char *opt[] = {"-DX=1"};
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", opt, 1, exprs, 2, 1, &img, &log, err, sizeof err);
  ok(rc == 0 && !img.from_cache && count_files(sub) == 2, "nvrtc: other options are another cache entry");
  dev_kimage_free(&img);
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", NULL, 0, exprs, 2, 0, &img, &log, err, sizeof err);
  ok(rc == 0 && !img.from_cache, "nvrtc: cache = false compiles again");
  dev_kimage_free(&img);
  test_nvrtc_damaged(dir, sub, src, exprs, opt);
  setenv("GPULUA_KERNEL_CACHE", "0", 1);
  rc = dev_nvrtc_compile(NULL, "__global__ void k() {}\n", "t.cu", "sm_90", NULL, 0, NULL, 0, 1, &img, &log, err, sizeof err);
  ok(rc == 0 && count_files(sub) == 2, "nvrtc: GPULUA_KERNEL_CACHE=0 writes nothing");
  dev_kimage_free(&img);

  rc = dev_nvrtc_compile(NULL, "__global__ void bad() { undefined_thing = 1; }\n", "broken.cu", "sm_90", NULL, 0,
                         NULL, 0, 1, &img, &log, err, sizeof err);
  ok(rc == -1 && strstr(err, "compilation failed"), "nvrtc: a compile error fails: %s", err);
  ok(log && strstr(log, "broken.cu(1)") && strstr(log, "undefined_thing"),
     "nvrtc: the log names the program, the line and the identifier");
  free(log);
  log = NULL;
  const char *badopt[] = {"--no-such-option"};
  rc = dev_nvrtc_compile(NULL, src, "t.cu", "sm_90", badopt, 1, NULL, 0, 1, &img, &log, err, sizeof err);
  ok(rc == -1, "nvrtc: an unknown option fails: %s", err);
  free(log);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) printf("# could not remove %s\n", dir);
}
#endif

/* gpu.load_module tells an image from a path with this */
static void test_image_kind(void) {
  static const char ptx[] = ".version 8.0\n.target sm_90\n.visible .entry k()\n{ ret; }\n";
  static const unsigned char elf[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0};
  static const unsigned char fat[] = {0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0};
  ok(dev_image_kind_of(ptx, sizeof ptx - 1) == DEV_IMAGE_PTX, "image kind: PTX text");
  ok(dev_image_kind_of(elf, sizeof elf) == DEV_IMAGE_CUBIN, "image kind: an ELF cubin");
  ok(dev_image_kind_of(fat, sizeof fat) == DEV_IMAGE_FATBIN, "image kind: a fatbin");
  ok(dev_image_kind_of("kernels/saxpy.ptx", 17) == DEV_IMAGE_NONE, "image kind: a path is none");
  ok(dev_image_kind_of(".entry without a version", 24) == DEV_IMAGE_NONE, "image kind: .entry alone is not PTX");
  ok(dev_image_kind_of(ptx, 20) == DEV_IMAGE_NONE, "image kind: only the first len bytes are read");
  ok(dev_image_kind_of("\x7f" "EL", 3) == DEV_IMAGE_NONE, "image kind: three bytes of a magic");
}

int main(void) {
  test_image_kind();
  test_parse();
  test_ptx();
  test_nvrtc();
  return done_testing();
}
