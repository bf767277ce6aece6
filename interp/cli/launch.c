/* launch.c — `gpulua -n N script.lua [args]`: run the script on N ranks.
 *
 * The launcher forks N children of this same binary (/proc/self/exe) with the
 * program's arguments minus its own options, and the environment torchrun
 * gives: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT (and GPULUA_LAUNCHER=1).  One poll loop relays each child's
 * stdout and stderr line by line (optionally as "[rank R] line"), reaps the
 * children, and tears the job down when a rank fails or the launcher gets a
 * signal: the signal (SIGTERM for a failure) to every rank's process group,
 * SIGKILL after GRACE_MS, then a summary naming the cause with the failed
 * rank's last stderr lines.  Signals reach the loop through a self-pipe.
 *
 * The rank named is the one that failed first, which is not always the
 * first to exit: when a rank fails, its peers in a collective fail too, once
 * it has left, and may exit before it.  So a rank whose script fails writes
 * its pid to a pipe shared by all ranks (GPULUA_LAUNCHER_FD, main.c) before
 * it leaves the job; the pipe keeps those notes in the order the ranks
 * failed.  A rank that dies without a note (a signal, os.exit) failed before
 * the notes its peers write about it: on one node a peer sees a dead rank
 * gone only once the launcher has reaped it. */
#include "gpulua.h"
#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 1024      /* per node */
#define GRACE_MS 2000       /* from the first signal to SIGKILL */
#define DRAIN_MS 2000       /* after the last rank exits, for pipes its own children hold */
#define RING 2048           /* stderr tail kept per rank for the failure summary */
#define LINE_MAX_LEN 65536  /* a longer line is written in pieces */
#define READ_CHUNK 65536
#define OBUF 131072

/* ---- options ------------------------------------------------------------ */

/* A decimal integer in [lo, hi], the whole string, starting with a digit. */
static int parse_int(const char *s, long lo, long hi, long *out) {
  if (s == NULL || s[0] < '0' || s[0] > '9')
    return 0;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return 0;
  *out = v;
  return 1;
}

/* Whether argv[*i] is option `name`, with its value joined ("--x=v"; "-nv"
 * for a one-letter option) or in the next argument, which it then consumes.
 * *val is NULL when the value is missing. */
static int take_opt(char **argv, int *i, const char *name, const char **val) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0)
    return 0;
  if (a[n] == '\0') {
    *val = argv[*i + 1];
    if (*val != NULL)
      (*i)++;
    return 1;
  }
  if (a[n] == '=') {
    *val = a + n + 1;
    return 1;
  }
  if (n == 2) {
    *val = a + n;
    return 1;
  }
  return 0;
}

static int bad(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* --master host:port (host may be [v6addr]). */
static int parse_master(const char *s, struct launch *l) {
  const char *colon = strrchr(s, ':');
  long port;
  if (colon == NULL || colon == s || !parse_int(colon + 1, 1, 65535, &port))
    return 0;
  size_t hlen = (size_t)(colon - s);
  if (s[0] == '[' && hlen >= 2 && s[hlen - 1] == ']') {
    s++;
    hlen -= 2;
  }
  if (hlen == 0 || (l->master_addr = strndup(s, hlen)) == NULL)
    return 0;
  l->master_port = (int)port;
  return 1;
}

enum { OPT_N, OPT_NNODES, OPT_NODE_RANK, OPT_MASTER, NOPTS };

/* The launcher options as given, before their values are checked. */
struct given {
  const char *val[NOPTS];
  int set[NOPTS];
  const char *first;  /* the first launcher option seen */
};

/* Splits argv: the launcher options into g, the rest (gpulua's own options,
 * the script and its arguments) into l->argv.  0, or -1 with the message. */
static int split_args(char **argv, struct launch *l, struct given *g, char *err, size_t errlen) {
  static const char *const names[NOPTS] = {"-n", "--nnodes", "--node-rank", "--master"};
  int argc = 0, k = 0, i;
  while (argv[argc] != NULL)
    argc++;
  l->argv = malloc(((size_t)argc + 1) * sizeof *l->argv);
  if (l->argv == NULL)
    return bad(err, errlen, "not enough memory");
  l->argv[k++] = argv[0];
  /* Options end at the script, "-" or "--", as in collectargs. */
  for (i = 1; argv[i] != NULL; i++) {
    const char *a = argv[i], *value = NULL;
    int j;
    if (a[0] != '-' || a[1] == '\0' || strcmp(a, "--") == 0)
      break;
    for (j = 0; j < NOPTS; j++)
      if (take_opt(argv, &i, names[j], &value))
        break;
    if (j < NOPTS) {
      if (g->set[j])
        return bad(err, errlen, "%s given twice", names[j]);
      g->set[j] = 1;
      g->val[j] = value;
      g->first = g->first ? g->first : names[j];
    } else if (strcmp(a, "--prefix") == 0 || strcmp(a, "--no-prefix") == 0) {
      l->prefix = a[2] == 'p';
      g->first = g->first ? g->first : a;
    } else {
      l->argv[k++] = argv[i];
      /* the values of -e, -l, --device, --sync-debug, --trace and --check are not options */
      if ((strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0 || strcmp(a, "--device") == 0 ||
           strcmp(a, "--sync-debug") == 0 || strcmp(a, "--trace") == 0 || strcmp(a, "--check") == 0) &&
          argv[i + 1] != NULL)
        l->argv[k++] = argv[++i];
    }
  }
  while (argv[i] != NULL)
    l->argv[k++] = argv[i++];
  l->argv[k] = NULL;
  l->argc = k;
  return 0;
}

/* The values of -n, --nnodes, --node-rank and --master into l.  0, or -1
 * with the message. */
static int check_values(const struct given *g, struct launch *l, char *err, size_t errlen) {
  long v;
  const char *s;
  if (!g->set[OPT_N])
    return bad(err, errlen, "%s needs -n N", g->first);
  if (!parse_int(s = g->val[OPT_N], 1, MAX_RANKS, &v)) {
    if (s == NULL)
      return bad(err, errlen, "-n needs a positive integer");
    if (parse_int(s, 1, 1L << 30, &v))
      return bad(err, errlen, "-n %s: at most %d ranks per node", s, MAX_RANKS);
    return bad(err, errlen, "-n needs a positive integer, got '%s'", s);
  }
  l->nproc = (int)v;
  if (g->set[OPT_NNODES]) {
    if (!parse_int(s = g->val[OPT_NNODES], 1, 65536, &v)) {
      if (s == NULL)
        return bad(err, errlen, "--nnodes needs a positive integer");
      return bad(err, errlen, "--nnodes needs a positive integer, got '%s'", s);
    }
    l->nnodes = (int)v;
  }
  if (g->set[OPT_NODE_RANK]) {
    int top = l->nnodes - 1;
    if (!parse_int(s = g->val[OPT_NODE_RANK], 0, top, &v)) {
      if (s == NULL)
        return bad(err, errlen, "--node-rank needs an integer from 0 to %d", top);
      return bad(err, errlen, "--node-rank needs an integer from 0 to %d (--nnodes %d), got '%s'",
                 top, top + 1, s);
    }
    l->node_rank = (int)v;
  }
  if (g->set[OPT_MASTER] && !parse_master((s = g->val[OPT_MASTER]) ? s : "", l)) {
    if (s == NULL)
      return bad(err, errlen, "--master needs host:port");
    return bad(err, errlen, "--master needs host:port, got '%s'", s);
  }
  if (l->nnodes > 1 && l->master_addr == NULL)
    return bad(err, errlen, "--nnodes %d needs --master host:port", l->nnodes);
  return 0;
}

int launch_parse(char **argv, struct launch *l, char *err, size_t errlen) {
  struct given g = {{NULL}, {0}, NULL};
  memset(l, 0, sizeof *l);
  l->nnodes = 1;
  l->prefix = -1;
  if (argv[0] == NULL)
    return 0;
  /* the messages name argv's strings, which outlive l's copy */
  if (split_args(argv, l, &g, err, errlen) != 0 || (g.first != NULL && check_values(&g, l, err, errlen) != 0)) {
    launch_free(l);
    return -1;
  }
  if (g.first == NULL) {
    launch_free(l);
    return 0;
  }
  return 1;
}

void launch_free(struct launch *l) {
  free(l->argv);
  free(l->master_addr);
  l->argv = NULL;
  l->master_addr = NULL;
}

/* ---- the job ------------------------------------------------------------ */

struct stream {
  int fd;       /* read end of the child's pipe; -1 once closed */
  int dst;      /* 1 or 2: our stdout or stderr */
  int owner;    /* index of its rank */
  char *part;   /* the line read so far, without its newline */
  size_t len, cap;
};

struct rank {
  int rank;             /* global rank */
  pid_t pid;            /* also its process group; 0 if never started */
  int live;             /* started and not reaped */
  int status;           /* wait status once reaped */
  int noted;            /* it wrote its failure note */
  int seq;              /* the order in which its failure was seen (1 first), 0 */
  struct stream s[2];   /* stdout, stderr */
  char ring[RING];      /* the last RING bytes of its stderr */
  size_t head;
  int wrapped;
};

struct job {
  const struct launch *opt;
  struct rank *r;
  int n;
  int prefix;
  int port;
  int sigr;                 /* the self-pipe's read end */
  int reap;                 /* a SIGCHLD came: reap */
  int noter, notew;         /* the pipe of the ranks' failure notes */
  char note[64];            /* a note read in part */
  size_t notelen;
  int nseq;                 /* failures seen before the teardown, in order */
  int *order;               /* scratch: ranks by index, j->n of them */
  int spawn_rank, spawn_err;  /* the cause: a rank that could not start (errno) */
  int stopsig;              /* ... or the signal the launcher got, 0 */
  int fatal;                /* ... or the loop itself failed */
  int stopping, killed;     /* teardown: signalled, SIGKILLed */
  long long kill_at, drain_until;
  int dead[3];              /* our stdout/stderr can no longer be written */
  struct pollfd *pfd;
  struct stream **pst;
  int odst;
  size_t olen;
  char obuf[OBUF];
  char ibuf[READ_CHUNK];
};

/* The self-pipe's write end: the only state signal handlers touch. */
static int sig_wfd = -1;

static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
#define NCAUGHT ((int)(sizeof caught / sizeof caught[0]))

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(sig_wfd, &b, 1);
  (void)w;
  errno = saved;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN) {  /* someone made our stdout non-blocking */
        struct pollfd pf = {fd, POLLOUT, 0};
        if (poll(&pf, 1, -1) < 0 && errno != EINTR)
          return -1;
        continue;
      }
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void close_stream(struct stream *s) {
  close_fd(&s->fd);
  free(s->part);
  s->part = NULL;
  s->len = s->cap = 0;
}

/* Writes to our stdout or stderr; after an error, what goes there is
 * dropped.  When its reader is gone (EPIPE), the ranks' pipes to that stream
 * are closed too, so that they see the broken pipe as they would without the
 * launcher. */
static void write_out(struct job *j, int dst, const char *p, size_t n) {
  if (j->dead[dst] || write_all(dst, p, n) == 0)
    return;
  j->dead[dst] = 1;
  if (errno == EPIPE)
    for (int i = 0; i < j->n; i++)
      close_stream(&j->r[i].s[dst - 1]);
}

static void flush_out(struct job *j) {
  size_t n = j->olen;
  j->olen = 0;
  if (n > 0)
    write_out(j, j->odst, j->obuf, n);
}

static void out_add(struct job *j, int dst, const char *p, size_t n) {
  if (n == 0 || j->dead[dst])
    return;
  if (j->olen > 0 && (j->odst != dst || j->olen + n > OBUF)) {
    flush_out(j);
    if (j->dead[dst])  /* p may have been a closed stream's buffer */
      return;
  }
  j->odst = dst;
  if (n > OBUF) {
    write_out(j, dst, p, n);
    return;
  }
  memcpy(j->obuf + j->olen, p, n);
  j->olen += n;
}

/* One output line: the prefix, what s held, then p[0..n), then a newline. */
static void line_out(struct job *j, struct rank *r, struct stream *s, const char *p, size_t n) {
  if (!j->dead[s->dst]) {
    if (j->prefix) {
      char pre[32];
      int m = snprintf(pre, sizeof pre, "[rank %d] ", r->rank);
      out_add(j, s->dst, pre, (size_t)m);
    }
    out_add(j, s->dst, s->part, s->len);
    out_add(j, s->dst, p, n);
    out_add(j, s->dst, "\n", 1);
  }
  s->len = 0;
}

/* Keeps the start of a line; a line past LINE_MAX_LEN (or out of memory) is
 * written as it is, in pieces. */
static void keep(struct job *j, struct rank *r, struct stream *s, const char *p, size_t n) {
  if (s->len + n > LINE_MAX_LEN) {
    line_out(j, r, s, p, n);
    return;
  }
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    while (cap < s->len + n)
      cap *= 2;
    char *np = realloc(s->part, cap);
    if (np == NULL) {
      line_out(j, r, s, p, n);
      return;
    }
    s->part = np;
    s->cap = cap;
  }
  memcpy(s->part + s->len, p, n);
  s->len += n;
}

static void ring_add(struct rank *r, const char *p, size_t n) {
  if (n >= RING) {
    memcpy(r->ring, p + n - RING, RING);
    r->head = 0;
    r->wrapped = 1;
    return;
  }
  size_t first = RING - r->head < n ? RING - r->head : n;
  memcpy(r->ring + r->head, p, first);
  memcpy(r->ring, p + first, n - first);
  if (r->head + n >= RING)
    r->wrapped = 1;
  r->head = (r->head + n) % RING;
}

static void read_stream(struct job *j, struct rank *r, struct stream *s) {
  ssize_t n = read(s->fd, j->ibuf, sizeof j->ibuf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return;
  if (n <= 0) {  /* end of file (or a read error: the same to us) */
    if (s->len > 0)
      line_out(j, r, s, "", 0);
    flush_out(j);
    close_stream(s);
    return;
  }
  if (s == &r->s[1])
    ring_add(r, j->ibuf, (size_t)n);
  const char *p = j->ibuf, *end = j->ibuf + n;
  while (p < end && s->fd >= 0) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl == NULL) {
      keep(j, r, s, p, (size_t)(end - p));
      break;
    }
    line_out(j, r, s, p, (size_t)(nl - p));
    p = nl + 1;
  }
  flush_out(j);
}

/* ---- children ----------------------------------------------------------- */

static int add_var(char ***env, char **p, size_t *left, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(*p, *left, fmt, ap);
  va_end(ap);
  if (w < 0 || (size_t)w >= *left)
    return -1;
  *(*env)++ = *p;
  *p += w + 1;
  *left -= (size_t)w + 1;
  return 0;
}

static const char *const launch_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "GPULUA_LAUNCHER", "GPULUA_LAUNCHER_FD", NULL};

static int is_launch_var(const char *e) {
  for (int i = 0; launch_vars[i] != NULL; i++) {
    size_t n = strlen(launch_vars[i]);
    if (strncmp(e, launch_vars[i], n) == 0 && e[n] == '=')
      return 1;
  }
  return 0;
}

/* Our environment with the rank's variables set: one allocation (the
 * pointer array followed by the strings), freed with free(). */
static char **make_env(const struct job *j, int local) {
  const struct launch *o = j->opt;
  const char *addr = o->master_addr ? o->master_addr : "127.0.0.1";
  size_t n = 0;
  while (environ[n] != NULL)
    n++;
  size_t nptr = n + 9, left = 576 + strlen(addr);
  char **env = malloc(nptr * sizeof *env + left);
  if (env == NULL)
    return NULL;
  char **e = env, *p = (char *)(env + nptr);
  for (size_t i = 0; i < n; i++)
    if (!is_launch_var(environ[i]))
      *e++ = environ[i];
  if (add_var(&e, &p, &left, "RANK=%d", o->node_rank * o->nproc + local) ||
      add_var(&e, &p, &left, "WORLD_SIZE=%d", o->nnodes * o->nproc) ||
      add_var(&e, &p, &left, "LOCAL_RANK=%d", local) ||
      add_var(&e, &p, &left, "LOCAL_WORLD_SIZE=%d", o->nproc) ||
      add_var(&e, &p, &left, "MASTER_ADDR=%s", addr) ||
      add_var(&e, &p, &left, "MASTER_PORT=%d", j->port) ||
      add_var(&e, &p, &left, "GPULUA_LAUNCHER=1") ||
      add_var(&e, &p, &left, "GPULUA_LAUNCHER_FD=%d", j->notew)) {
    free(env);
    return NULL;
  }
  *e = NULL;
  return env;
}

/* In the child between fork and exec: async-signal-safe calls only. */
static void child_exec(int local, int out, int err, int errw, int notew, pid_t parent,
                       char **argv, char **env) {
  struct sigaction dfl;
  sigset_t none;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int i = 0; i < NCAUGHT; i++)
    sigaction(caught[i], &dfl, NULL);
  sigaction(SIGPIPE, &dfl, NULL);
  sigaction(SIGQUIT, &dfl, NULL);
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, NULL);
  /* Its own session (so its own process group, which the launcher signals
   * as a whole; and reading an inherited terminal does not stop it with
   * SIGTTIN), and it dies with the launcher. */
  setsid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent)
    _exit(127);
  /* the failure notes' pipe stays open across exec (GPULUA_LAUNCHER_FD) */
  if (dup2(out, 1) < 0 || dup2(err, 2) < 0 || fcntl(notew, F_SETFD, 0) < 0)
    goto fail;
  if (local > 0) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || dup2(fd, 0) < 0)
      goto fail;
    close(fd);
  }
  execve("/proc/self/exe", argv, env);
fail:;
  int e = errno;
  ssize_t w = write(errw, &e, sizeof e);
  (void)w;
  _exit(127);
}

/* Starts rank `local`; returns 0 or an errno value. */
static int spawn(struct job *j, int local) {
  struct rank *r = &j->r[local];
  int out[2] = {-1, -1}, err[2] = {-1, -1}, ep[2] = {-1, -1};
  int e = 0;
  char **env = NULL;
  pid_t parent = getpid();
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
    e = errno;
    goto done;
  }
  env = make_env(j, local);
  if (env == NULL) {
    e = ENOMEM;
    goto done;
  }
  /* No handler may run in the child before it resets them (it would write
   * to our self-pipe). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pid_t pid = fork();
  if (pid == 0)
    child_exec(local, out[1], err[1], ep[1], j->notew, parent, j->opt->argv, env);
  e = pid < 0 ? errno : 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  close_fd(&out[1]);
  close_fd(&err[1]);
  close_fd(&ep[1]);
  if (pid < 0)
    goto done;
  /* The error pipe closes at exec; a failed exec sends its errno first. */
  int ce;
  ssize_t got;
  do
    got = read(ep[0], &ce, sizeof ce);
  while (got < 0 && errno == EINTR);
  if (got == (ssize_t)sizeof ce) {
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    e = ce;
    goto done;
  }
  r->pid = pid;
  r->live = 1;
  r->s[0].fd = out[0];
  r->s[1].fd = err[0];
  out[0] = err[0] = -1;
done:
  close_fd(&out[0]);
  close_fd(&out[1]);
  close_fd(&err[0]);
  close_fd(&err[1]);
  close_fd(&ep[0]);
  close_fd(&ep[1]);
  free(env);
  return e;
}

/* Signals every rank's process group that may still hold a process: the
 * running ranks, and exited ones whose pipes a child of theirs keeps open. */
static void signal_all(struct job *j, int sig) {
  for (int i = 0; i < j->n; i++) {
    struct rank *r = &j->r[i];
    if (r->pid > 0 && (r->live || r->s[0].fd >= 0 || r->s[1].fd >= 0))
      if (kill(-r->pid, sig) != 0 && r->live)
        kill(r->pid, sig);
  }
}

static void stop(struct job *j, int sig) {
  j->stopping = 1;
  j->kill_at = now_ms() + GRACE_MS;
  signal_all(j, sig);
}

static int exited_ok(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

/* Reads the failure notes there are (a rank's pid and a newline each,
 * written whole), marking their ranks noted; the newly noted ranks' indices
 * go to order[], in the order they were written.  Returns how many. */
static int read_notes(struct job *j, int *order) {
  int n = 0;
  for (;;) {
    ssize_t got = read(j->noter, j->note + j->notelen, sizeof j->note - j->notelen);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return n;
    size_t len = j->notelen + (size_t)got, start = 0;
    for (size_t k = 0; k < len; k++) {
      if (j->note[k] != '\n')
        continue;
      long pid = 0;
      for (size_t d = start; d < k && j->note[d] >= '0' && j->note[d] <= '9' && pid < 1L << 40; d++)
        pid = pid * 10 + (j->note[d] - '0');
      for (int i = 0; i < j->n; i++)
        if (j->r[i].pid == pid && !j->r[i].noted) {
          j->r[i].noted = 1;
          order[n++] = i;
        }
      start = k + 1;
    }
    /* what is left is the start of a note; a full buffer is no note */
    j->notelen = len - start < sizeof j->note ? len - start : 0;
    memmove(j->note, j->note + start, j->notelen);
  }
}

/* Reaps the ranks that exited, reads the failure notes, and, before a
 * teardown, numbers the failures in the order they happened: first the
 * ranks reaped now that failed without a note (the notes read now may be
 * about them), then the notes in the order written.  A rank that exits
 * non-zero starts the teardown. */
static void collect(struct job *j) {
  int nx = 0;
  j->reap = 0;
  for (int i = 0; i < j->n; i++) {
    struct rank *r = &j->r[i];
    int st;
    if (!r->live || waitpid(r->pid, &st, WNOHANG) != r->pid)
      continue;
    r->live = 0;
    r->status = st;
    if (!exited_ok(st))
      nx++;
  }
  int nn = read_notes(j, j->order);
  if (j->stopping)
    return;
  for (int i = 0; i < j->n; i++) {
    struct rank *r = &j->r[i];
    if (!r->live && r->pid > 0 && !exited_ok(r->status) && !r->noted && r->seq == 0)
      r->seq = ++j->nseq;
  }
  for (int k = 0; k < nn; k++)
    if (j->r[j->order[k]].seq == 0)
      j->r[j->order[k]].seq = ++j->nseq;
  if (nx > 0)
    stop(j, SIGTERM);
}

/* The rank that failed first (before the teardown), or NULL. */
static struct rank *first_failed(struct job *j) {
  struct rank *first = NULL;
  for (int i = 0; i < j->n; i++) {
    struct rank *r = &j->r[i];
    if (r->seq > 0 && !r->live && !exited_ok(r->status) && (first == NULL || r->seq < first->seq))
      first = r;
  }
  return first;
}

static void read_signals(struct job *j) {
  unsigned char b[64];
  ssize_t n;
  while ((n = read(j->sigr, b, sizeof b)) > 0) {
    for (ssize_t i = 0; i < n; i++) {
      if (b[i] == SIGCHLD) {
        j->reap = 1;
      } else if (!j->stopping) {
        j->stopsig = b[i];
        stop(j, b[i]);
      } else if (!j->killed) {  /* a second signal, or one during a teardown */
        signal_all(j, SIGKILL);
        j->killed = 1;
      }
    }
  }
}

static void loop(struct job *j) {
  for (;;) {
    if (j->reap)
      collect(j);
    long long now = now_ms();
    if (j->stopping && !j->killed && now >= j->kill_at) {
      signal_all(j, SIGKILL);
      j->killed = 1;
    }
    int live = 0, nfd = 2;
    j->pfd[0].fd = j->sigr;
    j->pfd[0].events = POLLIN;
    j->pfd[1].fd = j->noter;
    j->pfd[1].events = POLLIN;
    for (int i = 0; i < j->n; i++) {
      live += j->r[i].live;
      for (int k = 0; k < 2; k++) {
        struct stream *s = &j->r[i].s[k];
        if (s->fd >= 0) {
          j->pfd[nfd].fd = s->fd;
          j->pfd[nfd].events = POLLIN;
          j->pst[nfd++] = s;
        }
      }
    }
    int timeout = -1;
    if (live == 0) {
      if (nfd == 2)
        return;
      if (j->drain_until == 0)
        j->drain_until = now + DRAIN_MS;
      if (now >= j->drain_until)
        return;
      timeout = (int)(j->drain_until - now);
    } else if (j->stopping && !j->killed) {
      timeout = (int)(j->kill_at - now);
    }
    int rc = poll(j->pfd, (nfds_t)nfd, timeout);
    if (rc < 0 && errno != EINTR) {
      fprintf(stderr, "%s: poll: %s\n", j->opt->progname, strerror(errno));
      signal_all(j, SIGKILL);
      for (int i = 0; i < j->n; i++)
        if (j->r[i].live) {
          while (waitpid(j->r[i].pid, &j->r[i].status, 0) < 0 && errno == EINTR)
            ;
          j->r[i].live = 0;
        }
      j->fatal = 1;
      return;
    }
    if (rc == 0)
      j->reap = 1;  /* a deadline passed: look again */
    if (rc <= 0)
      continue;
    if (j->pfd[0].revents)
      read_signals(j);
    if (j->pfd[1].revents)
      j->reap = 1;  /* a note: read it with the exits there are */
    for (int f = 2; f < nfd; f++) {
      struct stream *s = j->pst[f];
      if (j->pfd[f].revents && s->fd == j->pfd[f].fd)
        read_stream(j, &j->r[s->owner], s);
    }
  }
}

/* The failed rank's last stderr lines, indented, after its summary line. */
static void print_tail(struct rank *r) {
  char buf[RING];
  size_t n = 0, start = 0;
  if (r->wrapped) {
    memcpy(buf, r->ring + r->head, RING - r->head);
    memcpy(buf + RING - r->head, r->ring, r->head);
    n = RING;
    /* drop the line the ring starts in the middle of */
    const char *nl = memchr(buf, '\n', n);
    if (nl != NULL && (size_t)(nl - buf) + 1 < n)
      start = (size_t)(nl - buf) + 1;
  } else {
    memcpy(buf, r->ring, r->head);
    n = r->head;
  }
  while (start < n) {
    const char *nl = memchr(buf + start, '\n', n - start);
    size_t len = nl ? (size_t)(nl - (buf + start)) : n - start;
    fprintf(stderr, "  rank %d: %.*s\n", r->rank, (int)len, buf + start);
    start += len + 1;
  }
}

/* Prints the cause (if any) and returns the program's exit status. */
static int summary(struct job *j) {
  if (j->spawn_err != 0) {
    fprintf(stderr, "%s: cannot start rank %d: %s\n", j->opt->progname, j->spawn_rank,
            strerror(j->spawn_err));
    return 1;
  }
  if (j->fatal)
    return 1;
  struct rank *r = first_failed(j);
  if (r != NULL) {
    int st = r->status;
    if (WIFSIGNALED(st))
      fprintf(stderr, "%s: rank %d failed: killed by signal %d (%s)\n", j->opt->progname, r->rank,
              WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
      fprintf(stderr, "%s: rank %d failed: exit status %d\n", j->opt->progname, r->rank,
              WEXITSTATUS(st));
    print_tail(r);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  }
  if (j->stopsig != 0) {
    fprintf(stderr, "%s: stopped all ranks on signal %d (%s)\n", j->opt->progname, j->stopsig,
            strsignal(j->stopsig));
    return 128 + j->stopsig;
  }
  return 0;
}

static int free_port(int *port) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errno;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int e = 0;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    e = errno;
  close(fd);
  *port = ntohs(a.sin_port);
  return e;
}

/* A job of o->nproc ranks, none started; NULL when out of memory. */
static struct job *job_new(const struct launch *o) {
  struct job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return NULL;
  j->n = o->nproc;
  j->r = calloc((size_t)o->nproc, sizeof *j->r);
  j->pfd = calloc(2 * (size_t)o->nproc + 2, sizeof *j->pfd);
  j->pst = calloc(2 * (size_t)o->nproc + 2, sizeof *j->pst);
  j->order = calloc((size_t)o->nproc, sizeof *j->order);
  if (j->r == NULL || j->pfd == NULL || j->pst == NULL || j->order == NULL)
    return j;   /* job_free takes it; the caller sees the NULL fields */
  j->opt = o;
  j->spawn_rank = -1;
  j->noter = j->notew = j->sigr = -1;
  for (int i = 0; i < j->n; i++) {
    j->r[i].rank = o->node_rank * o->nproc + i;
    for (int k = 0; k < 2; k++) {
      j->r[i].s[k].fd = -1;
      j->r[i].s[k].dst = k + 1;
      j->r[i].s[k].owner = i;
    }
  }
  j->prefix = o->prefix >= 0 ? o->prefix : (isatty(1) || isatty(2));
  j->port = o->master_port;
  return j;
}

static void job_free(struct job *j) {
  if (j == NULL)
    return;
  if (j->r != NULL)
    for (int i = 0; i < j->n; i++)
      for (int k = 0; k < 2; k++)
        close_stream(&j->r[i].s[k]);
  free(j->r);
  free(j->pfd);
  free(j->pst);
  free(j->order);
  free(j);
}

/* The launcher's signals go to its signal pipe (sig_wfd); SIGPIPE is
 * ignored.  The old actions are kept for signals_restore. */
static void signals_catch(struct sigaction *old, struct sigaction *oldpipe) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NCAUGHT; i++) {
    sa.sa_flags = SA_RESTART | (caught[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigaction(caught[i], &sa, &old[i]);
  }
  sa.sa_handler = SIG_IGN;
  sa.sa_flags = 0;
  sigaction(SIGPIPE, &sa, oldpipe);
}

static void signals_restore(const struct sigaction *old, const struct sigaction *oldpipe) {
  for (int i = 0; i < NCAUGHT; i++)
    sigaction(caught[i], &old[i], NULL);
  sigaction(SIGPIPE, oldpipe, NULL);
  sig_wfd = -1;
}

/* A rank killed while asked where it is (cuda/where.h) leaves files there. */
static void where_cleanup(int pid) {
  static const char *const suffix[] = {"", ".c", ".ask", ".tmp"};
  char path[128];
  for (int i = 0; i < 4; i++)
    if (snprintf(path, sizeof path, "/dev/shm/gpulua-where-%u-%d%s", (unsigned)getuid(), pid, suffix[i]) > 0)
      unlink(path);
}

/* Starts the ranks one by one (no more once the job stops), then runs the
 * job to its end; the exit status. */
static int job_run(struct job *j) {
  int e;
  for (int i = 0; i < j->n && !j->stopping; i++) {
    if ((e = spawn(j, i)) != 0) {
      j->spawn_rank = j->r[i].rank;
      j->spawn_err = e;
      stop(j, SIGTERM);
    }
    read_signals(j);  /* Ctrl-C while starting many ranks: start no more */
  }
  j->reap = 1;
  loop(j);
  int status = summary(j);
  /* a rank stopped while the ranks were meeting leaves the job's shared
   * memory behind */
  gpulua_job_cleanup(j->port, j->opt->nnodes * j->opt->nproc);
  for (int i = 0; i < j->n; i++)
    if (j->r[i].pid > 0) where_cleanup((int)j->r[i].pid);
  return status;
}

int launch_run(const struct launch *o) {
  struct sigaction old[NCAUGHT], oldpipe;
  int sp[2] = {-1, -1}, np[2] = {-1, -1}, status = 1, e;

  /* Closed standard descriptors would be reused for pipes, and dup2 onto
   * them in the child would go wrong. */
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) < 0)
      return 1;

  struct job *j = job_new(o);
  if (j == NULL || j->r == NULL || j->pfd == NULL || j->pst == NULL || j->order == NULL) {
    fprintf(stderr, "%s: not enough memory for %d ranks\n", o->progname, o->nproc);
    goto out;
  }
  if (j->port == 0 && (e = free_port(&j->port)) != 0) {
    fprintf(stderr, "%s: cannot find a free port on 127.0.0.1: %s\n", o->progname, strerror(e));
    goto out;
  }
  /* the notes' read end does not block; the ranks' write end does (a note
   * is written whole) */
  if (pipe2(sp, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(np, O_CLOEXEC) != 0 ||
      fcntl(np[0], F_SETFL, O_NONBLOCK) != 0) {
    fprintf(stderr, "%s: pipe: %s\n", o->progname, strerror(errno));
    goto out;
  }
  j->noter = np[0];
  j->notew = np[1];
  j->sigr = sp[0];
  sig_wfd = sp[1];
  signals_catch(old, &oldpipe);
  status = job_run(j);
  signals_restore(old, &oldpipe);
out:
  close_fd(&sp[0]);
  close_fd(&sp[1]);
  close_fd(&np[0]);
  close_fd(&np[1]);
  job_free(j);
  return status;
}
