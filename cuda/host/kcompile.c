/* gpu.compile on the host backend: CUDA C source compiled for the CPU by the
 * system C++ compiler (c++, g++ or clang++ on PATH, or GPULUA_CXX) into a
 * shared object, against gpulua_cuda_rt.h, the device vocabulary libgpulua
 * embeds (hk_rt_header) and writes beside the source at each compilation.
 *
 * The source is compiled as written, with two changes that keep its lines:
 * `extern __shared__ T name[];` becomes a pointer to the block's dynamic
 * shared memory, and a trailer appended after it instantiates one entry per
 * launchable kernel (gpulua_rt::kernel_of in the header), which unpacks the
 * launch's arguments by the compiled parameter types and runs the threads.
 * Reading the source (the rewrite, which kernels need fibers) is ksource.c's;
 * running the compiler (a process group, limits, Ctrl-C) krun.c's.
 *
 * Compiled objects are cached on disk as NVRTC's are (GPULUA_KERNEL_CACHE,
 * the cache option), keyed by the source, the options, the compiler (its
 * path, modification time and first line of --version) and the header. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hk.h"
#define GPULUA_HK_ABI_ONLY
#include "host/cuda_device_rt.h"
#include "util.h"

extern char **environ;

/* ---- files ---------------------------------------------------------------- */

static int write_file(const char *path, const void *data, size_t n)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  const char *p = data;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) { close(fd); return -1; }
    p += k;
    n -= (size_t)k;
  }
  return close(fd);
}

/* The whole file, with a terminating zero (not counted in *len). */
static char *read_file(const char *path, size_t *len)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size > ((uint64_t)1 << 31)) {
    close(fd);
    return NULL;
  }
  size_t size = (size_t)st.st_size, got = 0;
  char *buf = malloc(size + 1);
  while (buf && got < size) {
    ssize_t k = read(fd, buf + got, size - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) { free(buf); buf = NULL; break; }
    got += (size_t)k;
  }
  close(fd);
  if (!buf) return NULL;
  buf[got] = 0;
  *len = got;
  return buf;
}

/* ---- the compiler --------------------------------------------------------- */

typedef struct compiler {
  char path[1024];
  char ident[1600];   /* path, mtime and the first line of --version */
  int clang;
} compiler;

static pthread_mutex_t cx_mu = PTHREAD_MUTEX_INITIALIZER;
static compiler cx_cached;      /* under cx_mu: the last one identified */
static time_t cx_mtime;

int hk_find_program(const char *name, char *out, size_t n)
{
  if (strchr(name, '/')) {
    if (access(name, X_OK) != 0) return -1;
    snprintf(out, n, "%s", name);
    return 0;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  while (*path) {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    if (len > 0 && len < n - strlen(name) - 2) {
      snprintf(out, n, "%.*s/%s", (int)len, path, name);
      struct stat st;
      if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0) return 0;
    }
    path += len;
    if (*path == ':') path++;
  }
  return -1;
}

int hk_run(char *const argv[], int out)
{
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa)) return -1;
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out, 1);
  posix_spawn_file_actions_adddup2(&fa, out, 2);
  pid_t pid;
  int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (e) { errno = e; return -1; }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The compiler of GPULUA_CXX or PATH, identified by its first line of
 * --version (run once per path and modification time); 0, -1 with the
 * message, or DEV_ERR_INTERRUPTED. */
static int find_compiler(dev_ctx *ctx, const hk_limits *lim, compiler *c, char *err, size_t errlen)
{
  const char *env = env_setting("GPULUA_CXX");
  char path[1024];
  if (env && *env) {
    if (hk_find_program(env, path, sizeof path))
      return fail_msg(err, errlen, "GPULUA_CXX='%s': no such executable", env);
  } else if (hk_find_program("c++", path, sizeof path) && hk_find_program("g++", path, sizeof path) &&
             hk_find_program("clang++", path, sizeof path)) {
    return fail_msg(err, errlen, "gpu.compile on the host backend needs a C++ compiler, and none of c++, "
                 "g++, clang++ is on PATH: install g++ (Debian/Ubuntu: apt-get install g++, which "
                 "build-essential brings) or set GPULUA_CXX");
  }
  struct stat st;
  if (stat(path, &st) != 0) return fail_msg(err, errlen, "cannot stat the C++ compiler %s: %s", path, strerror(errno));
  pthread_mutex_lock(&cx_mu);
  if (strcmp(cx_cached.path, path) == 0 && cx_mtime == st.st_mtime) {
    *c = cx_cached;
    pthread_mutex_unlock(&cx_mu);
    return 0;
  }
  pthread_mutex_unlock(&cx_mu);
  /* the first line of `path --version` */
  char name[1100];
  int fd = tmp_file("gpulua-cxx", name, sizeof name);
  if (fd < 0) return fail_msg(err, errlen, "cannot create a temporary file: %s", strerror(errno));
  char *argv[] = {path, "--version", NULL};
  int rc = hk_run_limited(ctx, argv, fd, lim);
  int e = errno;
  close(fd);
  size_t len = 0;
  char *text = rc == 0 ? read_file(name, &len) : NULL;
  unlink(name);
  if (rc != 0) {
    free(text);
    if (rc == HK_RUN_INTERRUPTED) {
      fail_msg(err, errlen, "interrupted");
      return DEV_ERR_INTERRUPTED;
    }
    if (rc == HK_RUN_TIMEOUT)
      return fail_msg(err, errlen, "the C++ compiler %s ran past the time limit of %g s (GPULUA_CXX_TIMEOUT) "
                      "answering --version", path, lim->timeout_s);
    if (rc < 0) return fail_msg(err, errlen, "cannot run the C++ compiler %s: %s", path, strerror(e));
    return fail_msg(err, errlen, "the C++ compiler %s fails `--version` (exit status %d)", path, rc);
  }
  compiler nc;
  memset(&nc, 0, sizeof nc);
  snprintf(nc.path, sizeof nc.path, "%s", path);
  char *nl = text ? strchr(text, '\n') : NULL;
  if (nl) *nl = 0;
  snprintf(nc.ident, sizeof nc.ident, "%s %lld %.500s", path, (long long)st.st_mtime, text ? text : "");
  nc.clang = text && strstr(text, "clang") != NULL;
  free(text);
  pthread_mutex_lock(&cx_mu);
  cx_cached = nc;
  cx_mtime = st.st_mtime;
  pthread_mutex_unlock(&cx_mu);
  *c = nc;
  return 0;
}

/* ---- options -------------------------------------------------------------- */

static int has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* NVRTC options for the GPU alone: accepted and ignored here. */
static int gpu_only(const char *o)
{
  static const char *const exact[] = {
    "-lineinfo", "--generate-line-info", "-G", "--device-debug", "--extra-device-vectorization",
    "-extra-device-vectorization", "-ewp", "--extensible-whole-program", "-dlto", "--dlink-time-opt",
    "-restrict", "--restrict", "-default-device", "--device-as-default-execution-space", "-w",
    "--disable-warnings", "--device-int128", "-device-int128", "-time", "--time", "-opt-info",
    "--no-source-include", "-no-source-include", "--builtin-move-forward", "--builtin-initializer-list",
    "-builtin-move-forward", "-builtin-initializer-list", "--no-display-error-number",
    "-no-display-error-number", "--display-error-number", "-display-error-number", "-src-in-ptx",
    "--source-in-ptx", "-Werror=all-warnings", "--Werror=all-warnings", "-fdevice-time-trace", NULL};
  static const char *const prefix[] = {
    "-arch=", "--gpu-architecture=", "-arch", "--maxrregcount=", "-maxrregcount=", "--fmad=", "-fmad=",
    "--ftz=", "-ftz=", "--prec-div=", "-prec-div=", "--prec-sqrt=", "-prec-sqrt=", "-dopt=", "--dopt=",
    "-rdc=", "--relocatable-device-code=", "--diag-suppress=", "-diag-suppress=", "--diag-error=",
    "-diag-error=", "--diag-warn=", "-diag-warn=", "-split-compile=", "--split-compile=", "-jump-table-density=",
    "--minimal", "-minimal", "-ofast-compile=", "--Ofast-compile=", "-fdevice-syntax-only", NULL};
  for (int i = 0; exact[i]; i++)
    if (strcmp(o, exact[i]) == 0) return 1;
  for (int i = 0; prefix[i]; i++)
    if (has_prefix(o, prefix[i])) return 1;
  return 0;
}

/* The user's options as the C++ compiler's (appended to out), or -1 with
 * the one it does not know.  Options that take a value in the next item
 * (-I dir, -D X) are joined. */
static int translate_opts(const char *const *opts, int nopts, const char **out, int *nout, int cap,
                          sbuf *store, size_t *offs, char *err, size_t errlen)
{
  /* strings go into store; out gets them once store stops moving */
  int n = 0;
  for (int i = 0; i < nopts; i++) {
    const char *o = opts[i];
    const char *val = NULL, *flag = NULL;
    if (gpu_only(o)) continue;
    if (strcmp(o, "--use_fast_math") == 0 || strcmp(o, "-use_fast_math") == 0) {
      /* fast math without -ffast-math's flush-to-zero start-up code, which
       * would change the whole process's floating point */
      static const char *const fm[] = {"-fno-signed-zeros", "-fno-trapping-math", "-freciprocal-math",
                                       "-fassociative-math", NULL};
      for (int k = 0; fm[k]; k++) {
        if (n == cap) return fail_msg(err, errlen, "too many compiler options");
        offs[n++] = store->n;
        sb_key(store, fm[k]);
      }
      continue;
    }
    if ((strcmp(o, "-D") == 0 || strcmp(o, "-U") == 0 || strcmp(o, "-I") == 0 || strcmp(o, "-include") == 0) &&
        i + 1 < nopts) {
      flag = o;
      val = opts[++i];
    } else if (has_prefix(o, "--define-macro=")) { flag = "-D"; val = o + 15; }
    else if (has_prefix(o, "--undefine-macro=")) { flag = "-U"; val = o + 17; }
    else if (has_prefix(o, "--include-path=")) { flag = "-I"; val = o + 15; }
    else if (has_prefix(o, "--pre-include=")) { flag = "-include"; val = o + 14; }
    else if ((has_prefix(o, "-D") || has_prefix(o, "-U") || has_prefix(o, "-I")) && o[2]) {
      flag = "";
      val = o;
    } else if (has_prefix(o, "-std=c++") || has_prefix(o, "--std=c++")) {
      flag = "";
      val = o[1] == '-' ? o + 1 : o;
    } else if (strcmp(o, "-O0") == 0 || strcmp(o, "-O1") == 0 || strcmp(o, "-O2") == 0 || strcmp(o, "-O3") == 0 ||
               strcmp(o, "-g") == 0) {
      flag = "";
      val = o;
    } else {
      return fail_msg(err, errlen, "compilation failed: the host backend does not know the option '%s' "
                   "(it takes -D, -U, -I, -include, -std=c++NN, --use_fast_math, -O0..-O3, -g; options "
                   "for the GPU alone, such as -arch or --maxrregcount, are ignored)", o);
    }
    if (n + 2 > cap) return fail_msg(err, errlen, "too many compiler options");
    if (strcmp(flag, "-include") == 0) {
      offs[n++] = store->n;
      sb_key(store, "-include");
      flag = "";
    }
    offs[n++] = store->n;
    sb_add(store, flag, strlen(flag));
    sb_key(store, val);
  }
  if (store->oom) return fail_msg(err, errlen, "out of memory");
  for (int i = 0; i < n; i++) out[*nout + i] = store->p + offs[i];
  *nout += n;
  return 0;
}

/* ---- the cache ------------------------------------------------------------ */

/* The entry's format (cuda/kcache.c); 2: with a checksum. */
static const char MAGIC[] = "GPULUA-HKCACHE-2\n";

/* ---- compiling ------------------------------------------------------------ */

/* Headers a CUDA source may include: all are gpulua_cuda_rt.h (given with
 * -include), so these are empty, except assert.h, which (re)defines assert
 * by NDEBUG as the C one does. */
static const char *const stubs[] = {
  "cuda_runtime.h", "cuda_runtime_api.h", "cuda.h", "cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h",
  "cuda_bf16.hpp", "device_launch_parameters.h", "device_functions.h", "device_atomic_functions.h",
  "sm_20_atomic_functions.h", "sm_30_intrinsics.h", "sm_32_intrinsics.h", "sm_60_atomic_functions.h",
  "math_functions.h", "math_constants.h", "vector_types.h", "vector_functions.h", "crt/math_functions.h",
  "crt/device_functions.h", NULL};
static const char ASSERT_H[] =
  "/* gpulua host backend: assert fails the kernel as a device-side assert */\n"
  "#undef assert\n#ifdef NDEBUG\n#define assert(e) ((void)0)\n#else\n"
  "#define assert(e) GPULUA_ASSERT(e)\n#endif\n";

typedef struct tmpdir { char path[1024]; } tmpdir;

static void tmp_path(const tmpdir *t, const char *name, char *out, size_t n)
{
  snprintf(out, n, "%s/%s", t->path, name);
}

/* path and what is in it, to depth levels of directories below it: ours,
 * and whatever the compiler left (its TMPDIR is ours, so its own temporary
 * files are in it, also when it was killed). */
static void remove_tree(const char *path, int depth)
{
  DIR *d = opendir(path);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char p[1400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
      if (depth > 0) remove_tree(p, depth - 1);
    } else {
      unlink(p);
    }
  }
  if (d) closedir(d);
  rmdir(path);
}

static void tmp_remove(tmpdir *t) { remove_tree(t->path, 3); }

static int write_runtime(const tmpdir *t)
{
  char p[1200];
  tmp_path(t, "gpulua_cuda_rt.h", p, sizeof p);
  if (write_file(p, hk_rt_header, strlen(hk_rt_header))) return -1;
  snprintf(p, sizeof p, "%s/include", t->path);
  if (mkdir(p, 0755)) return -1;
  snprintf(p, sizeof p, "%s/include/crt", t->path);
  if (mkdir(p, 0755)) return -1;
  for (int i = 0; stubs[i]; i++) {
    snprintf(p, sizeof p, "%s/include/%s", t->path, stubs[i]);
    static const char stub[] = "/* gpulua host backend: supplied by gpulua_cuda_rt.h */\n";
    if (write_file(p, stub, sizeof stub - 1)) return -1;
  }
  snprintf(p, sizeof p, "%s/include/assert.h", t->path);
  return write_file(p, ASSERT_H, sizeof ASSERT_H - 1);
}

/* The compiler's messages with the temporary directory's name taken out. */
static char *clean_log(const char *text, const char *dir)
{
  sbuf o = {0};
  size_t dl = strlen(dir);
  const size_t cap = 64 * 1024;
  for (const char *p = text; *p;) {
    if (strncmp(p, dir, dl) == 0 && p[dl] == '/') { p += dl + 1; continue; }
    if (o.n >= cap) {
      sb_printf(&o, "\n... (%zu more bytes of compiler messages)\n", strlen(p));
      break;
    }
    sb_add(&o, p++, 1);
  }
  if (o.oom) { free(o.p); return NULL; }
  if (!o.p) return strdup("");
  return o.p;
}

/* The flags of every compilation; with GPULUA_KERNEL_CHECK, the address
 * checks of each compiler. */
static const char *const cc_base[] = {
  "-x", "c++", "-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
  "-fno-semantic-interposition", "-fno-exceptions", "-fno-math-errno", "-fno-strict-aliasing", "-w",
  "-Wl,-z,defs", NULL};
static const char *const cc_gcc_check[] = {
  "-DGPULUA_KCHECK=1", "-g", "-fno-omit-frame-pointer", "-fsanitize=kernel-address",
  "--param", "asan-instrumentation-with-call-threshold=0", "--param", "asan-stack=0", "--param",
  "asan-globals=0", "-fno-sanitize-address-use-after-scope", "-Wl,-Bsymbolic", NULL};
static const char *const cc_clang_check[] = {
  "-DGPULUA_KCHECK=1", "-g", "-fno-omit-frame-pointer", "-fsanitize=kernel-address", "-mllvm",
  "-asan-instrumentation-with-call-threshold=0", "-mllvm", "-asan-stack=0", "-mllvm", "-asan-globals=0",
  "-Wl,-Bsymbolic", NULL};

/* A compilation's command line, but for its paths: ours, then the user's
 * options from argv[*user_at] (their strings kept in *ostore). */
#define CC_ARGV_MAX 300
static int build_cmdline(const compiler *cx, int check, const char *const *opts, int nopts,
                         const char **argv, int *argc, int *user_at, sbuf *ostore, char *err, size_t errlen)
{
  size_t offs[256];
  *argc = 0;
  argv[(*argc)++] = cx->path;
  for (int i = 0; cc_base[i]; i++) argv[(*argc)++] = cc_base[i];
  if (!cx->clang) argv[(*argc)++] = "-fno-gnu-unique";
  if (check)
    for (const char *const *c = cx->clang ? cc_clang_check : cc_gcc_check; *c; c++) argv[(*argc)++] = *c;
  *user_at = *argc;
  if (nopts > 200) return fail_msg(err, errlen, "too many compiler options (%d)", nopts);
  return translate_opts(opts, nopts, argv, argc, 256, ostore, offs, err, errlen) ? -1 : 0;
}

/* The source as compiled into *text: a #line naming the kernel, the source
 * rewritten, then an entry per name expression, whose fiber needs are
 * scanned from the source (all of them when an option pre-includes a
 * header, which is not read). */
static int build_source(const char *src, const char *name, int check, const char *const *exprs, int nexprs,
                        const char *const *argv, int user_at, int argc, sbuf *text, char *err, size_t errlen)
{
  sb_str(text, "#line 1 \"");
  for (const char *q = name; *q; q++) {
    if (*q == '"' || *q == '\\') sb_add(text, "\\", 1);
    sb_add(text, (unsigned char)*q < 0x20 || *q == 0x7f ? "?" : q, 1);
  }
  sb_str(text, "\"\n");
  if (hk_rewrite(src, check, text, err, errlen)) return -1;
  int *need = calloc(nexprs > 0 ? (size_t)nexprs : 1, sizeof *need);
  if (!need) return fail_msg(err, errlen, "out of memory");
  hk_fiber_scan(src, exprs, nexprs, need);
  for (int i = user_at; i < argc; i++)
    if (strcmp(argv[i], "-include") == 0)
      for (int k = 0; k < nexprs; k++) need[k] = 1;
  sb_str(text, "\n#line 1 \"<gpulua kernel entries>\"\n");
  for (int i = 0; i < nexprs; i++) {
    const char *e = exprs[i][0] == '&' ? exprs[i] + 1 : exprs[i];
    sb_printf(text, "GPULUA_HK_KERNEL(%d, %s, \"%s\", %d)\n", i, e, e, need[i]);
  }
  free(need);
  sb_printf(text, "GPULUA_HK_MODULE(%d", nexprs);
  if (nexprs == 0) sb_str(text, ", nullptr");
  for (int i = 0; i < nexprs; i++) sb_printf(text, ", &gpulua_hk_k%d", i);
  sb_str(text, ")\n");
  return text->oom ? fail_msg(err, errlen, "out of memory") : 0;
}

/* Everything that decides the output, as the cache key. */
static int build_key(const compiler *cx, const char *const *argv, int argc, const sbuf *text, sbuf *key,
                     char *err, size_t errlen)
{
  char hv[64];
  snprintf(hv, sizeof hv, "gpulua-hk %d %016llx", GPULUA_HK_ABI,
           (unsigned long long)dev_kcache_hash(hk_rt_header, strlen(hk_rt_header)));
  sb_key(key, hv);
  sb_key(key, cx->ident);
  for (int i = 1; i < argc; i++) sb_key(key, argv[i]);
  sb_key(key, "--");
  sb_key(key, text->p ? text->p : "");
  return key->oom ? fail_msg(err, errlen, "out of memory") : 0;
}

/* Whether the compiler's messages say it ran out of memory. */
static int says_oom(const char *log)
{
  static const char *const words[] = {"out of memory", "memory exhausted", "Cannot allocate memory",
                                      "bad_alloc", "Allocation failed", NULL};
  for (int i = 0; log && words[i]; i++)
    if (strstr(log, words[i])) return 1;
  return 0;
}

/* What the compiler's run (st and errno e of hk_run_limited) means: 0 when
 * it made the object, else -1 or DEV_ERR_INTERRUPTED with the message, and
 * its messages in *log. */
static int compiler_status(int st, int e, const compiler *cx, const hk_limits *lim, const tmpdir *td,
                           char **log, char *err, size_t errlen)
{
  if (st == 0) return 0;
  if (st == HK_RUN_INTERRUPTED) {
    fail_msg(err, errlen, "interrupted");
    return DEV_ERR_INTERRUPTED;
  }
  if (st == HK_RUN_TIMEOUT || (lim->timeout_s > 0 && st == 128 + SIGXCPU))
    return fail_msg(err, errlen, "the C++ compiler ran past the time limit of %g s (GPULUA_CXX_TIMEOUT)",
                    lim->timeout_s);
  if (st < 0) {
    if (lim->memory && (e == ENOMEM || e == E2BIG))
      return fail_msg(err, errlen, "the C++ compiler %s cannot start under the memory limit of %s "
                      "(GPULUA_CXX_MEMORY): %s", cx->path, lim->memory_text, strerror(e));
    return fail_msg(err, errlen, "cannot run the C++ compiler %s: %s", cx->path, strerror(e));
  }
  char p_log[1200];
  size_t ln;
  tmp_path(td, "log", p_log, sizeof p_log);
  char *raw = read_file(p_log, &ln);
  int oom = lim->memory && (says_oom(raw) || st > 128);
  if (log && raw) *log = clean_log(raw, td->path);
  free(raw);
  if (oom)
    return fail_msg(err, errlen, "compilation failed: the C++ compiler ran out of memory under the limit of %s "
                    "(GPULUA_CXX_MEMORY): %s exited with status %d", lim->memory_text, cx->path, st);
  return fail_msg(err, errlen, "compilation failed (%s exited with status %d)", cx->path, st);
}

/* Runs the compiler on text in a temporary directory of its own, which it
 * removes (the compiler's TMPDIR too): the object in img, or the compiler's
 * messages in *log; 0, -1 with the message, or DEV_ERR_INTERRUPTED. */
static int run_compiler(dev_ctx *ctx, const compiler *cx, const hk_limits *lim, const char *const *argv,
                        int user_at, int argc, const sbuf *text, dev_kimage *img, char **log, char *err,
                        size_t errlen)
{
  char p_src[1200], p_so[1200], p_log[1200], p_rt[1200], inc[1200];
  tmpdir td;
  if (tmp_dir("gpulua-cc", td.path, sizeof td.path))
    return fail_msg(err, errlen, "cannot create a temporary directory: %s", strerror(errno));
  int rc = 0;
  tmp_path(&td, "kernel.cu", p_src, sizeof p_src);
  tmp_path(&td, "kernel.so", p_so, sizeof p_so);
  tmp_path(&td, "log", p_log, sizeof p_log);
  tmp_path(&td, "gpulua_cuda_rt.h", p_rt, sizeof p_rt);
  snprintf(inc, sizeof inc, "-I%s/include", td.path);
  if (write_runtime(&td) || write_file(p_src, text->p, text->n)) {
    rc = fail_msg(err, errlen, "cannot write to %s: %s", td.path, strerror(errno));
    goto out;
  }
  /* ours first, then the user's (later -std and -O win), the file last */
  const char *full[CC_ARGV_MAX + 20];
  int n = 0;
  for (int i = 0; i < user_at; i++) full[n++] = argv[i];
  full[n++] = inc;
  full[n++] = "-include";
  full[n++] = p_rt;
  for (int i = user_at; i < argc; i++) full[n++] = argv[i];
  full[n++] = p_src;
  full[n++] = "-o";
  full[n++] = p_so;
  full[n] = NULL;
  int lfd = open(p_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (lfd < 0) { rc = fail_msg(err, errlen, "cannot write to %s: %s", td.path, strerror(errno)); goto out; }
  hk_limits in_dir = *lim;
  in_dir.tmpdir = td.path;
  int st = hk_run_limited(ctx, (char *const *)full, lfd, &in_dir);
  int e = errno;
  close(lfd);
  if ((rc = compiler_status(st, e, cx, lim, &td, log, err, errlen))) goto out;
  size_t size;
  img->data = read_file(p_so, &size);
  if (!img->data) { rc = fail_msg(err, errlen, "cannot read the compiled object: %s", strerror(errno)); goto out; }
  img->size = size;
out:
  tmp_remove(&td);
  return rc;
}

/* The lowered name of each entry: gpulua_hk_k<i>. */
static int name_entries(dev_kimage *img, int nexprs, char *err, size_t errlen)
{
  /* a cache hit comes with its (empty) list: this one replaces it */
  for (int i = 0; i < img->n; i++) free(img->lowered[i]);
  free(img->lowered);
  img->n = 0;
  img->lowered = calloc(nexprs > 0 ? (size_t)nexprs : 1, sizeof *img->lowered);
  if (!img->lowered) return fail_msg(err, errlen, "out of memory");
  for (int i = 0; i < nexprs; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "gpulua_hk_k%d", i);
    if (!(img->lowered[i] = strdup(nm))) return fail_msg(err, errlen, "out of memory");
    img->n = i + 1;
  }
  return 0;
}

int hk_compile(dev_ctx *ctx, const char *src, const char *name, const char *arch, const char *const *opts,
               int nopts, const char *const *exprs, int nexprs, int use_cache, dev_kimage *img, char **log,
               char *err, size_t errlen)
{
  (void)arch;
  memset(img, 0, sizeof *img);
  if (log) *log = NULL;
  if (nexprs < 0 || nopts < 0) return fail_msg(err, errlen, "bad arguments");
  hk_limits lim;
  if (hk_limits_env(&lim, err, errlen)) return -1;
  compiler cx;
  int rc = find_compiler(ctx, &lim, &cx, err, errlen);
  if (rc) return rc;
  int check = 0;
  if (env_flag("GPULUA_KERNEL_CHECK", &check, err, errlen)) return -1;

  const char *argv[CC_ARGV_MAX];
  int argc, user_at;
  sbuf ostore = {0}, text = {0}, key = {0};
  rc = build_cmdline(&cx, check, opts, nopts, argv, &argc, &user_at, &ostore, err, errlen);
  if (rc == 0) rc = build_source(src, name, check, exprs, nexprs, argv, user_at, argc, &text, err, errlen);
  if (rc == 0) rc = build_key(&cx, argv, argc, &text, &key, err, errlen);
  if (rc == 0) {
    char dirbuf[1024], cpath[1200], note[sizeof img->note] = "";
    const char *dir = use_cache ? dev_kcache_dir(dirbuf, sizeof dirbuf) : NULL;
    if (dir) {
      snprintf(cpath, sizeof cpath, "%s/%016llx.hk", dir, (unsigned long long)dev_kcache_hash(key.p, key.n));
      dev_kcache_read(cpath, MAGIC, key.p, key.n, 0, img, note, sizeof note);
    }
    if (!img->from_cache) {
      rc = run_compiler(ctx, &cx, &lim, argv, user_at, argc, &text, img, log, err, errlen);
      if (rc == 0 && dir) dev_kcache_write(dir, cpath, MAGIC, key.p, key.n, img, note, note[0] ? 0 : sizeof note);
    }
    snprintf(img->note, sizeof img->note, "%s", note);
  }
  if (rc == 0) rc = name_entries(img, nexprs, err, errlen);
  if (rc) dev_kimage_free(img);
  free(ostore.p);
  free(text.p);
  free(key.p);
  return rc;
}
