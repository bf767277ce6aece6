/* Running the C++ compiler of gpu.compile (kcompile.c) so that it always
 * ends: in a process group of its own, under a time limit
 * (GPULUA_CXX_TIMEOUT, default 300 s) and a memory limit (GPULUA_CXX_MEMORY,
 * the address space of each of its processes, default 4G), and stopped by
 * the context's interrupt (Ctrl-C in the CLI).  An #include of a FIFO never
 * returns and one of /dev/zero grows without end: either way the whole
 * group (the driver, cc1plus, as, ld) is killed and waited for before the
 * caller removes its files.
 *
 * The wait polls (waitpid WNOHANG, naps of 1 to 20 ms): a SIGCHLD handler
 * or signalfd would take a signal from the application.  The child is made
 * with _Fork where the C library has it (no atfork handlers: a BLAS
 * library's could wait on its threads) and calls only async-signal-safe
 * functions before execve.  Should gpulua die without killing the group,
 * the driver gets SIGKILL (PR_SET_PDEATHSIG) and every process of it a CPU
 * time limit of the time limit, so none runs on for long. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hk.h"
#include "stage.h"   /* dev_parse_size */
#include "util.h"

extern char **environ;

#define DEFAULT_TIMEOUT 300.0
#define DEFAULT_MEMORY "4G"

int hk_limits_env(hk_limits *lim, char *err, size_t errlen)
{
  memset(lim, 0, sizeof *lim);
  lim->timeout_s = DEFAULT_TIMEOUT;
  const char *t = env_setting("GPULUA_CXX_TIMEOUT");
  if (t && *t) {
    char *end;
    double v = strtod(t, &end);
    size_t plain = strspn(t, "0123456789.eE+-");   /* no hex, inf or nan */
    if (flag_value(t) == 0) v = 0;
    else if (end == t || *end || t[plain] || !isfinite(v) || v < 0 || !((*t >= '0' && *t <= '9') || *t == '.'))
      return fail_msg(err, errlen, "GPULUA_CXX_TIMEOUT='%.40s' is not a number of seconds (a number >= 0; 0 "
                      "or off: no limit)", t);
    lim->timeout_s = v;
  }
  const char *m = env_setting("GPULUA_CXX_MEMORY");
  if (!m || !*m) m = DEFAULT_MEMORY;
  if (flag_value(m) == 0) return 0;
  if (dev_parse_size(m, &lim->memory))
    return fail_msg(err, errlen, "GPULUA_CXX_MEMORY='%.40s' is not a size (bytes with an optional K, M, G or T "
                    "suffix, powers of 1024: 4G, 512M; 0 or off: no limit)", m);
  snprintf(lim->memory_text, sizeof lim->memory_text, "%s", m);
  return 0;
}

/* The environment with TMPDIR set to tmpdir (the compiler's own temporary
 * files go there, so that they go with it); free() the array alone. */
static char **child_env(const char *tmpdir)
{
  size_t n = 0;
  while (environ[n]) n++;
  char **env = malloc((n + 2) * sizeof *env + strlen(tmpdir) + 8);
  if (!env) return NULL;
  char *var = (char *)(env + n + 2);
  sprintf(var, "TMPDIR=%s", tmpdir);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "TMPDIR=", 7) != 0) env[k++] = environ[i];
  env[k++] = var;
  env[k] = NULL;
  return env;
}

static pid_t fork_bare(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  return _Fork();
#else
  return fork();
#endif
}

/* The child, up to execve: async-signal-safe calls only.  An execve that
 * fails writes its errno into report. */
static _Noreturn void child(char *const argv[], char *const env[], int in, int out, int report,
                            const struct rlimit *as, const struct rlimit *cpu, pid_t parent)
{
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);   /* the parent died before the line above */
  if (as->rlim_cur) setrlimit(RLIMIT_AS, as);
  if (cpu->rlim_cur) setrlimit(RLIMIT_CPU, cpu);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (dup2(in, 0) >= 0 && dup2(out, 1) >= 0 && dup2(out, 2) >= 0) execve(argv[0], argv, env);
  int e = errno;
  (void)!write(report, &e, sizeof e);
  _exit(127);
}

/* argv[0] started in a group of its own: its pid, or -1 with errno. */
static pid_t start(char *const argv[], int out, const hk_limits *lim)
{
  struct rlimit as = {lim->memory, lim->memory}, cpu = {0, 0};
  if (lim->timeout_s > 0) {
    cpu.rlim_cur = (rlim_t)ceil(lim->timeout_s) + 1;
    cpu.rlim_max = cpu.rlim_cur + 4;
  }
  char **env = lim->tmpdir ? child_env(lim->tmpdir) : environ;
  if (!env) return -1;
  int in = open("/dev/null", O_RDONLY | O_CLOEXEC), rep[2], e;
  pid_t pid = -1;
  if (in < 0 || pipe2(rep, O_CLOEXEC) != 0) goto out;
  pid_t self = getpid();
  pid = fork_bare();
  if (pid == 0) child(argv, env, in, out, rep[1], &as, &cpu, self);
  e = errno;
  close(rep[1]);
  if (pid > 0) {
    setpgid(pid, pid);   /* as the child does: whichever comes first */
    ssize_t k;
    while ((k = read(rep[0], &e, sizeof e)) < 0 && errno == EINTR) {}
    if (k == sizeof e) {   /* it could not start: reap it */
      while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
      pid = -1;
    }
  }
  close(rep[0]);
  errno = e;
out:
  e = errno;
  if (in >= 0) close(in);
  if (env != environ) free(env);
  errno = e;
  return pid;
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Every process of the group pid leads killed, the leader reaped, and the
 * others waited for (their new parent reaps them) for up to 2 s. */
static void kill_group(pid_t pid)
{
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
  struct timespec nap = {0, 2000000};
  for (int i = 0; i < 1000 && kill(-pid, 0) == 0; i++) nanosleep(&nap, NULL);
}

int hk_run_limited(dev_ctx *ctx, char *const argv[], int out, const hk_limits *lim)
{
  pid_t pid = start(argv, out, lim);
  if (pid < 0) return -1;
  double t0 = now_s();
  long nap_ns = 1000000;
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (r < 0 && errno != EINTR) {
      int e = errno;
      kill_group(pid);
      errno = e;
      return -1;
    }
    if (ctx && dev_intr_enabled(ctx) && dev_intr_pending(ctx)) {
      kill_group(pid);
      return HK_RUN_INTERRUPTED;
    }
    if (lim->timeout_s > 0 && now_s() - t0 >= lim->timeout_s) {
      kill_group(pid);
      return HK_RUN_TIMEOUT;
    }
    struct timespec ts = {0, nap_ns};
    nanosleep(&ts, NULL);
    if (nap_ns < 20000000) nap_ns *= 2;
  }
}
