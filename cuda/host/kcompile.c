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
 *
 * Compiled objects are cached on disk as NVRTC's are (GPULUA_KERNEL_CACHE,
 * the cache option), keyed by the source, the options, the compiler (its
 * path, modification time and first line of --version) and the header. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

static int find_compiler(compiler *c, char *err, size_t errlen)
{
  const char *env = getenv("GPULUA_CXX");
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
  int rc = hk_run(argv, fd);
  int e = errno;
  close(fd);
  size_t len = 0;
  char *text = rc == 0 ? read_file(name, &len) : NULL;
  unlink(name);
  if (rc != 0) {
    free(text);
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

/* ---- the source ----------------------------------------------------------- */

static int is_id(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* Past whitespace and comments (newlines counted into *nl). */
static const char *skip_ws(const char *p, int *nl)
{
  for (;;) {
    if (*p == '\n') { if (nl) (*nl)++; p++; continue; }
    if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\f' || *p == '\v') { p++; continue; }
    if (p[0] == '/' && p[1] == '/') { while (*p && *p != '\n') p++; continue; }
    if (p[0] == '/' && p[1] == '*') {
      const char *e = strstr(p + 2, "*/");
      const char *end = e ? e + 2 : p + strlen(p);
      for (const char *q = p; q < end; q++) if (*q == '\n' && nl) (*nl)++;
      p = end;
      continue;
    }
    return p;
  }
}

static int word_at(const char *p, const char *w)
{
  size_t n = strlen(w);
  return strncmp(p, w, n) == 0 && !is_id(p[n]);
}

/* The declaration `extern __shared__ TYPE NAME[]REST;` at p (just past
 * `__shared__`) up to its ';': the parts, or -1 when it is not that shape. */
static int split_dyn_shared(const char *p, const char **ty, size_t *tyn, const char **nm, size_t *nmn,
                            const char **rest, size_t *restn, const char **semi)
{
  const char *s = p, *br = NULL;
  int depth = 0;
  for (; *s && !(*s == ';' && depth == 0); s++) {
    if (*s == '(') depth++;
    else if (*s == ')') depth--;
    else if (*s == '[' && !br && depth == 0) {
      const char *q = s + 1;
      while (*q == ' ' || *q == '\t') q++;
      if (*q == ']') br = s;
    }
  }
  if (!*s || !br) return -1;
  const char *e = br;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
  const char *b = e;
  while (b > p && is_id(b[-1])) b--;
  if (b == e) return -1;
  *ty = p;
  *tyn = (size_t)(b - p);
  *nm = b;
  *nmn = (size_t)(e - b);
  const char *r = strchr(br, ']') + 1;
  *rest = r;
  *restn = (size_t)(s - r);
  *semi = s;
  return 0;
}

/* The type part of a declaration without alignment attributes, for a cast. */
static void add_cast_type(sbuf *o, const char *ty, size_t n)
{
  for (size_t i = 0; i < n;) {
    if ((n - i > 9 && word_at(ty + i, "__align__")) || (n - i > 7 && word_at(ty + i, "alignas")) ||
        (n - i > 13 && word_at(ty + i, "__attribute__"))) {
      size_t j = i;
      while (j < n && ty[j] != '(') j++;
      int d = 0;
      for (; j < n; j++) {
        if (ty[j] == '(') d++;
        else if (ty[j] == ')' && --d == 0) { j++; break; }
      }
      i = j;
      continue;
    }
    if (ty[i] == '\n' || ty[i] == '\r') { sb_add(o, " ", 1); i++; continue; }
    sb_add(o, ty + i, 1);
    i++;
  }
}

typedef struct fsname { char name[128]; sbuf repl; } fsname;

/* The source as compiled: `extern __shared__` declarations rewritten (lines
 * kept), the rest as written. */
/* rewrite's state: the braces open (a block or a namespace-like scope),
 * and the extern __shared__ arrays declared at namespace scope with what
 * each later use of their name becomes. */
enum { SC_BLOCK, SC_NS };
typedef struct rwstate {
  int scope[256], depth;
  fsname fs[16];
  int nfs;
} rwstate;

/* A preprocessor line at p (continuations included), copied; past it. */
static const char *copy_directive(const char *p, sbuf *o)
{
  while (*p && *p != '\n') {
    if (p[0] == '\\' && p[1] == '\n') { sb_add(o, p, 2); p += 2; continue; }
    sb_add(o, p++, 1);
  }
  return p;
}

/* A string or character literal at p (raw strings R"d(...)d" too), copied;
 * past it. */
static const char *copy_literal(const char *src, const char *p, sbuf *o)
{
  char c = *p;
  const char *s = p++;
  if (c == '"' && s > src && s[-1] == 'R') {
    const char *dl = p;
    while (*p && *p != '(') p++;
    char endm[40];
    snprintf(endm, sizeof endm, ")%.*s\"", (int)(p - dl) < 16 ? (int)(p - dl) : 16, dl);
    const char *e = strstr(p, endm);
    p = e ? e + strlen(endm) : p + strlen(p);
  } else {
    while (*p && *p != c && *p != '\n') { if (*p == '\\' && p[1]) p++; p++; }
    if (*p == c) p++;
  }
  sb_add(o, s, (size_t)(p - s));
  return p;
}

/* A number at p, copied (exponent signs included); past it. */
static const char *copy_number(const char *p, sbuf *o)
{
  const char *s = p;
  while (is_id(*p) || *p == '.' || *p == '\'' ||
         ((*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E' || p[-1] == 'p' || p[-1] == 'P')))
    p++;
  sb_add(o, s, (size_t)(p - s));
  return p;
}

/* A '{': what it opens, from the output before it (namespace NAME {,
 * namespace {, extern "C" { open namespace-like scopes). */
static void open_brace(rwstate *rw, const sbuf *o)
{
  int kind = SC_BLOCK;
  size_t k = o->n;
  while (k > 0 && (o->p[k - 1] == ' ' || o->p[k - 1] == '\t' || o->p[k - 1] == '\n' || o->p[k - 1] == '\r')) k--;
  size_t e = k;
  while (k > 0 && is_id(o->p[k - 1])) k--;
  if (e - k == 9 && strncmp(o->p + k, "namespace", 9) == 0) kind = SC_NS;
  else if (k == e && e >= 3 && strncmp(o->p + e - 3, "\"C\"", 3) == 0) kind = SC_NS;
  else if (e > k) {
    size_t k2 = k;
    while (k2 > 0 && (o->p[k2 - 1] == ' ' || o->p[k2 - 1] == '\t' || o->p[k2 - 1] == '\n')) k2--;
    size_t e2 = k2;
    while (k2 > 0 && is_id(o->p[k2 - 1])) k2--;
    if (e2 - k2 == 9 && strncmp(o->p + k2, "namespace", 9) == 0) kind = SC_NS;
  }
  if (rw->depth < 256) rw->scope[rw->depth] = kind;
  rw->depth++;
}

/* The name being output follows '.', '->' or '::': a member, not ours. */
static int after_member(const sbuf *o)
{
  size_t k = o->n;
  while (k > 0 && (o->p[k - 1] == ' ' || o->p[k - 1] == '\t')) k--;
  return k > 0 && (o->p[k - 1] == '.' || (k > 1 && o->p[k - 1] == '>' && o->p[k - 2] == '-') ||
                   (k > 1 && o->p[k - 1] == ':' && o->p[k - 2] == ':'));
}

/* `extern __shared__ TYPE NAME[];` with p just past "extern": in a function
 * a const pointer to the block's dynamic shared memory; at namespace scope
 * each later use of NAME becomes that pointer.  The declaration's lines are
 * kept as blank lines.  1 (*next past it), 0 when not such a declaration,
 * -1 on error. */
static int rewrite_extern_shared(rwstate *rw, const char *p, sbuf *o, const char **next, char *err, size_t errlen)
{
  int nl = 0;
  const char *q = skip_ws(p, &nl);
  const char *ty, *nm, *rest, *semi;
  size_t tyn, nmn, restn;
  if (!word_at(q, "__shared__") || split_dyn_shared(q + 10, &ty, &tyn, &nm, &nmn, &rest, &restn, &semi) != 0)
    return 0;
  int in_fn = 0;
  for (int d = 0; d < rw->depth && d < 256; d++) if (rw->scope[d] == SC_BLOCK) in_fn = 1;
  int lines = nl;
  for (const char *r = q; r < semi; r++) if (*r == '\n') lines++;
  if (in_fn) {
    /* TYPE (*const NAME)REST = (decltype(NAME))::gpulua_rt::dyn_shared(); */
    add_cast_type(o, ty, tyn);
    sb_printf(o, "(*const %.*s)", (int)nmn, nm);
    add_cast_type(o, rest, restn);
    sb_printf(o, " = (decltype(%.*s))::gpulua_rt::dyn_shared();", (int)nmn, nm);
  } else if (rw->nfs < 16 && nmn < sizeof rw->fs[0].name) {
    fsname *f = &rw->fs[rw->nfs++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%.*s", (int)nmn, nm);
    sb_str(&f->repl, "((");
    add_cast_type(&f->repl, ty, tyn);
    sb_str(&f->repl, "(*)");
    add_cast_type(&f->repl, rest, restn);
    sb_str(&f->repl, ")::gpulua_rt::dyn_shared())");
    if (f->repl.oom) return fail_msg(err, errlen, "out of memory");
  } else {
    return fail_msg(err, errlen, "more than 16 extern __shared__ arrays at namespace scope");
  }
  for (int i = 0; i < lines; i++) sb_add(o, "\n", 1);
  *next = semi + 1;
  return 1;
}

/* The identifier s (n bytes): an extern __shared__ array of namespace scope
 * becomes its pointer, anything else is copied. */
static void copy_name(const rwstate *rw, const char *s, size_t n, sbuf *o)
{
  if (!after_member(o))
    for (int i = 0; i < rw->nfs; i++)
      if (strlen(rw->fs[i].name) == n && strncmp(rw->fs[i].name, s, n) == 0) {
        sb_add(o, rw->fs[i].repl.p, rw->fs[i].repl.n);
        return;
      }
  sb_add(o, s, n);
}

static int rewrite(const char *src, sbuf *o, char *err, size_t errlen)
{
  rwstate rw;
  rw.depth = rw.nfs = 0;
  int line_start = 1, ret = 0;
  const char *p = src;
  while (*p && ret == 0) {
    char c = *p;
    if (c == '\n') { line_start = 1; sb_add(o, p++, 1); continue; }
    if (c == ' ' || c == '\t' || c == '\r') { sb_add(o, p++, 1); continue; }
    if (c == '#' && line_start) { p = copy_directive(p, o); continue; }
    line_start = 0;
    if (p[0] == '/' && (p[1] == '/' || p[1] == '*')) {
      const char *e = skip_ws(p, NULL);
      sb_add(o, p, (size_t)(e - p));
      p = e;
    } else if (c == '"' || c == '\'') {
      p = copy_literal(src, p, o);
    } else if (c == '{') {
      open_brace(&rw, o);
      sb_add(o, p++, 1);
    } else if (c == '}') {
      if (rw.depth > 0) rw.depth--;
      sb_add(o, p++, 1);
    } else if (is_id(c) && !(c >= '0' && c <= '9')) {
      const char *s = p;
      while (is_id(*p)) p++;
      size_t n = (size_t)(p - s);
      int r = n == 6 && strncmp(s, "extern", 6) == 0 ? rewrite_extern_shared(&rw, p, o, &p, err, errlen) : 0;
      if (r < 0) ret = -1;
      else if (r == 0) copy_name(&rw, s, n, o);
    } else if (c >= '0' && c <= '9') {
      p = copy_number(p, o);
    } else {
      sb_add(o, p++, 1);
    }
  }
  for (int i = 0; i < rw.nfs; i++) free(rw.fs[i].repl.p);
  if (!ret && o->oom) ret = fail_msg(err, errlen, "out of memory");
  return ret;
}

/* ---- which kernels need fibers --------------------------------------------- */

/* A kernel needs its threads as fibers when it may reach a barrier or a
 * warp primitive.  The compiled module tells (gpulua_hk_fibers) but not for
 * which kernel; this reads the source instead: every function body and
 * macro, the names each uses, and which of them lead to a primitive.  It
 * errs towards fibers (a name used anywhere for something that leads there
 * counts); a header of the user's, which it cannot read, makes every kernel
 * of the module use them. */

typedef struct fnbody {
  const char *name;
  size_t len;
  size_t first, count;          /* its identifiers in ids[] */
  int need;
} fnbody;

typedef struct scan {
  fnbody *fn;
  int nfn, capfn;
  const char **ids;             /* identifiers, as (start, length) */
  size_t *idlen;
  size_t nids, capids;
  int unknown;                  /* an include it cannot see */
  int oom;
} scan;

static int is_primitive(const char *s, size_t n)
{
  return (n > 6 && strncmp(s, "__sync", 6) == 0) || (n > 5 && strncmp(s + n - 5, "_sync", 5) == 0) ||
         (n == 12 && strncmp(s, "__activemask", 12) == 0);
}

static void scan_id(scan *sc, const char *s, size_t n)
{
  if (sc->nids == sc->capids) {
    size_t cap = sc->capids ? 2 * sc->capids : 256;
    const char **ni = realloc(sc->ids, cap * sizeof *ni);
    if (!ni) { sc->oom = 1; return; }
    sc->ids = ni;
    size_t *nl = realloc(sc->idlen, cap * sizeof *nl);
    if (!nl) { sc->oom = 1; return; }
    sc->idlen = nl;
    sc->capids = cap;
  }
  sc->ids[sc->nids] = s;
  sc->idlen[sc->nids++] = n;
}

static fnbody *scan_fn(scan *sc, const char *name, size_t len)
{
  if (sc->nfn == sc->capfn) {
    int cap = sc->capfn ? 2 * sc->capfn : 64;
    fnbody *nf = realloc(sc->fn, (size_t)cap * sizeof *nf);
    if (!nf) { sc->oom = 1; return NULL; }
    sc->fn = nf;
    sc->capfn = cap;
  }
  fnbody *f = &sc->fn[sc->nfn++];
  f->name = name;
  f->len = len;
  f->first = sc->nids;
  f->count = 0;
  f->need = 0;
  return f;
}

/* The tokens that matter: identifiers (kind 'i') and ( ) { } ; (kind 'p'). */
typedef struct stok { const char *s; size_t n; char kind; } stok;

/* A directive at p (its line, continuations included): a macro is a body
 * of its own; an include of the user's is a body it cannot read.  Past it. */
static const char *scan_directive(scan *sc, const char *p)
{
  const char *e = p;
  while (*e && !(*e == '\n' && e[-1] != '\\')) e++;
  const char *q = p + 1;
  while (*q == ' ' || *q == '\t') q++;
  if (strncmp(q, "include", 7) == 0) {
    q += 7;
    while (*q == ' ' || *q == '\t') q++;
    if (*q == '"') sc->unknown = 1;
  } else if (strncmp(q, "define", 6) == 0 && (q[6] == ' ' || q[6] == '\t')) {
    q += 6;
    while (*q == ' ' || *q == '\t') q++;
    const char *nm = q;
    while (q < e && is_id(*q)) q++;
    fnbody *f = scan_fn(sc, nm, (size_t)(q - nm));
    for (; f && q < e;) {
      if (is_id(*q) && !(*q >= '0' && *q <= '9')) {
        const char *a = q;
        while (q < e && is_id(*q)) q++;
        scan_id(sc, a, (size_t)(q - a));
      } else {
        q++;
      }
    }
    if (f) f->count = sc->nids - f->first;
  }
  return e;
}

/* The tokens that matter for finding bodies: identifiers and ( ) { } ;,
 * directives handled on the way; *ntk of them (free the result). */
static stok *scan_tokens(scan *sc, const char *src, size_t *ntk)
{
  stok *tk = NULL;
  size_t captk = 0;
  int line_start = 1;
  *ntk = 0;
  for (const char *p = src; *p && !sc->oom;) {
    char c = *p;
    if (c == '\n') { line_start = 1; p++; continue; }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') { p++; continue; }
    if (p[0] == '/' && (p[1] == '/' || p[1] == '*')) { p = skip_ws(p, NULL); continue; }
    if (c == '#' && line_start) { p = scan_directive(sc, p); continue; }
    line_start = 0;
    if (c == '"' || c == '\'') {
      p++;
      while (*p && *p != c && *p != '\n') { if (*p == '\\' && p[1]) p++; p++; }
      if (*p == c) p++;
      continue;
    }
    stok t = {p, 1, 0};
    if (is_id(c) && !(c >= '0' && c <= '9')) {
      while (is_id(*p)) p++;
      t.n = (size_t)(p - t.s);
      t.kind = 'i';
    } else if (c >= '0' && c <= '9') {
      while (is_id(*p) || *p == '.') p++;
      continue;
    } else {
      p++;
      if (!strchr("(){};", c)) continue;
      t.kind = 'p';
    }
    if (*ntk == captk) {
      size_t cap = captk ? 2 * captk : 1024;
      stok *nt = realloc(tk, cap * sizeof *nt);
      if (!nt) { sc->oom = 1; break; }
      tk = nt;
      captk = cap;
    }
    tk[(*ntk)++] = t;
  }
  return tk;
}

/* Function bodies: a { after ) at a level outside any body; inside it,
 * every identifier up to the matching }. */
static void scan_bodies(scan *sc, const stok *tk, size_t ntk)
{
  for (size_t i = 0; i < ntk && !sc->oom; i++) {
    if (!(tk[i].kind == 'p' && tk[i].s[0] == '{')) continue;
    size_t j = i;
    while (j > 0 && tk[j - 1].kind == 'i') j--;       /* const, noexcept, override... */
    if (j == 0 || !(tk[j - 1].kind == 'p' && tk[j - 1].s[0] == ')')) continue;
    /* the ( that matches, and the name before it */
    size_t k = j - 1;
    int depth = 0;
    for (;;) {
      if (tk[k].kind == 'p' && tk[k].s[0] == ')') depth++;
      else if (tk[k].kind == 'p' && tk[k].s[0] == '(' && --depth == 0) break;
      if (k == 0) break;
      k--;
    }
    const char *nm = "";
    size_t nl = 0;
    if (k > 0 && tk[k - 1].kind == 'i') { nm = tk[k - 1].s; nl = tk[k - 1].n; }
    fnbody *f = scan_fn(sc, nm, nl);
    depth = 0;
    size_t e = i;
    for (; e < ntk; e++) {
      if (tk[e].kind == 'p' && tk[e].s[0] == '{') depth++;
      else if (tk[e].kind == 'p' && tk[e].s[0] == '}' && --depth == 0) break;
      else if (tk[e].kind == 'i') scan_id(sc, tk[e].s, tk[e].n);
    }
    if (f) f->count = sc->nids - f->first;
    i = e;
  }
}

/* Which bodies lead to a primitive: those that name one, then those that
 * name such a body, until nothing changes.  1 if a body without a name (a
 * lambda at namespace scope, which could be any) does. */
static int mark_needs(scan *sc)
{
  int changed = 1, anon = 0;
  for (int f = 0; f < sc->nfn; f++)
    for (size_t k = 0; k < sc->fn[f].count && !sc->fn[f].need; k++)
      sc->fn[f].need = is_primitive(sc->ids[sc->fn[f].first + k], sc->idlen[sc->fn[f].first + k]);
  while (changed && !sc->oom) {
    changed = 0;
    for (int f = 0; f < sc->nfn; f++) {
      if (sc->fn[f].need) continue;
      for (size_t k = 0; k < sc->fn[f].count && !sc->fn[f].need; k++) {
        const char *id = sc->ids[sc->fn[f].first + k];
        size_t n = sc->idlen[sc->fn[f].first + k];
        for (int g = 0; g < sc->nfn; g++)
          if (sc->fn[g].need && sc->fn[g].len == n && strncmp(sc->fn[g].name, id, n) == 0) {
            sc->fn[f].need = 1;
            break;
          }
      }
      changed |= sc->fn[f].need;
    }
  }
  for (int f = 0; f < sc->nfn; f++) if (sc->fn[f].need && sc->fn[f].len == 0) anon = 1;
  return anon;
}

static void fiber_scan(const char *src, const char *const *exprs, int nexprs, int *need)
{
  scan sc;
  memset(&sc, 0, sizeof sc);
  size_t ntk;
  stok *tk = scan_tokens(&sc, src, &ntk);
  scan_bodies(&sc, tk, ntk);
  int anon = mark_needs(&sc);
  for (int i = 0; i < nexprs; i++) {
    const char *q = exprs[i][0] == '&' ? exprs[i] + 1 : exprs[i], *last = q;
    for (const char *r = q; *r; r++) if (r[0] == ':' && r[1] == ':') last = r + 2;
    size_t n = strlen(last);
    int found = 0, nd = 0;
    for (int f = 0; f < sc.nfn; f++) {
      if (sc.fn[f].len != n || strncmp(sc.fn[f].name, last, n) != 0) continue;
      found = 1;
      nd |= sc.fn[f].need;
    }
    need[i] = sc.oom || sc.unknown || anon || !found || nd;
  }
  free(tk);
  free(sc.fn);
  free(sc.ids);
  free(sc.idlen);
}

/* ---- the cache ------------------------------------------------------------ */

static const char MAGIC[] = "GPULUA-HKCACHE-1\n";

static int cache_read(const char *path, const sbuf *key, dev_kimage *img)
{
  size_t len;
  char *f = read_file(path, &len);
  if (!f) return -1;
  size_t m = sizeof MAGIC - 1;
  uint64_t klen, isize;
  if (len < m + 16 || memcmp(f, MAGIC, m) != 0) goto miss;
  memcpy(&klen, f + m, 8);
  if (klen != key->n || len - m - 8 < klen + 8 || memcmp(f + m + 8, key->p, klen) != 0) goto miss;
  memcpy(&isize, f + m + 8 + klen, 8);
  if (isize == 0 || isize != len - m - 16 - klen) goto miss;
  img->data = malloc(isize);
  if (!img->data) goto miss;
  memcpy(img->data, f + m + 16 + klen, isize);
  img->size = isize;
  free(f);
  return 0;
miss:
  free(f);
  return -1;
}

static void cache_write(const char *dir, const char *path, const sbuf *key, const dev_kimage *img)
{
  char d[1024], tmp[1300];
  snprintf(d, sizeof d, "%s", dir);
  if (dev_mkdirs(d)) return;
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  uint64_t klen = key->n, isize = img->size;
  int bad = fwrite(MAGIC, 1, sizeof MAGIC - 1, f) != sizeof MAGIC - 1 || fwrite(&klen, 8, 1, f) != 1 ||
            fwrite(key->p, 1, key->n, f) != key->n || fwrite(&isize, 8, 1, f) != 1 ||
            fwrite(img->data, 1, img->size, f) != img->size;
  if (fclose(f) || bad || rename(tmp, path)) unlink(tmp);
}

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

static void tmp_remove(tmpdir *t)
{
  char p[1200];
  static const char *const files[] = {"gpulua_cuda_rt.h", "kernel.cu", "kernel.so", "log", NULL};
  for (int i = 0; files[i]; i++) { tmp_path(t, files[i], p, sizeof p); unlink(p); }
  for (int i = 0; stubs[i]; i++) {
    snprintf(p, sizeof p, "%s/include/%s", t->path, stubs[i]);
    unlink(p);
  }
  snprintf(p, sizeof p, "%s/include/assert.h", t->path);
  unlink(p);
  snprintf(p, sizeof p, "%s/include/crt", t->path);
  rmdir(p);
  snprintf(p, sizeof p, "%s/include", t->path);
  rmdir(p);
  rmdir(t->path);
}

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
static int build_source(const char *src, const char *name, const char *const *exprs, int nexprs,
                        const char *const *argv, int user_at, int argc, sbuf *text, char *err, size_t errlen)
{
  sb_str(text, "#line 1 \"");
  for (const char *q = name; *q; q++) {
    if (*q == '"' || *q == '\\') sb_add(text, "\\", 1);
    sb_add(text, (unsigned char)*q < 0x20 || *q == 0x7f ? "?" : q, 1);
  }
  sb_str(text, "\"\n");
  if (rewrite(src, text, err, errlen)) return -1;
  int *need = calloc(nexprs > 0 ? (size_t)nexprs : 1, sizeof *need);
  if (!need) return fail_msg(err, errlen, "out of memory");
  fiber_scan(src, exprs, nexprs, need);
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

/* Runs the compiler on text in a temporary directory of its own, which it
 * removes: the object in img, or the compiler's messages in *log. */
static int run_compiler(const compiler *cx, const char *const *argv, int user_at, int argc, const sbuf *text,
                        dev_kimage *img, char **log, char *err, size_t errlen)
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
  int st = hk_run((char *const *)full, lfd);
  int e = errno;
  close(lfd);
  if (st < 0) { rc = fail_msg(err, errlen, "cannot run the C++ compiler %s: %s", cx->path, strerror(e)); goto out; }
  if (st != 0) {
    size_t ln;
    char *raw = read_file(p_log, &ln);
    if (log && raw) *log = clean_log(raw, td.path);
    free(raw);
    rc = fail_msg(err, errlen, "compilation failed (%s exited with status %d)", cx->path, st);
    goto out;
  }
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

int hk_compile(const char *src, const char *name, const char *arch, const char *const *opts, int nopts,
               const char *const *exprs, int nexprs, int use_cache, dev_kimage *img, char **log,
               char *err, size_t errlen)
{
  (void)arch;
  memset(img, 0, sizeof *img);
  if (log) *log = NULL;
  if (nexprs < 0 || nopts < 0) return fail_msg(err, errlen, "bad arguments");
  compiler cx;
  if (find_compiler(&cx, err, errlen)) return -1;
  int check = 0;
  if (env_flag("GPULUA_KERNEL_CHECK", &check, err, errlen)) return -1;

  const char *argv[CC_ARGV_MAX];
  int argc, user_at;
  sbuf ostore = {0}, text = {0}, key = {0};
  int rc = build_cmdline(&cx, check, opts, nopts, argv, &argc, &user_at, &ostore, err, errlen);
  if (rc == 0) rc = build_source(src, name, exprs, nexprs, argv, user_at, argc, &text, err, errlen);
  if (rc == 0) rc = build_key(&cx, argv, argc, &text, &key, err, errlen);
  if (rc == 0) {
    char dirbuf[1024], cpath[1200];
    const char *dir = use_cache ? dev_kcache_dir(dirbuf, sizeof dirbuf) : NULL;
    if (dir) {
      snprintf(cpath, sizeof cpath, "%s/%016llx.hk", dir, (unsigned long long)dev_kcache_hash(key.p, key.n));
      img->from_cache = cache_read(cpath, &key, img) == 0;
    }
    if (!img->from_cache) {
      rc = run_compiler(&cx, argv, user_at, argc, &text, img, log, err, errlen);
      if (rc == 0 && dir) cache_write(dir, cpath, &key, img);
    }
  }
  if (rc == 0) rc = name_entries(img, nexprs, err, errlen);
  if (rc) dev_kimage_free(img);
  free(ostore.p);
  free(text.p);
  free(key.p);
  return rc;
}
