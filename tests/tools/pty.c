/* pty — drive a program through a pseudo-terminal, expect-style (for the
 * REPL tests).
 *
 *   pty [-t SECONDS] [-e NAME=VALUE]... -- PROGRAM [ARGS...]  < SCRIPT
 *
 * starts PROGRAM on a new pseudo-terminal (80x24, TERM=vt100 unless -e says
 * otherwise) as the session leader with the terminal as its controlling
 * terminal, then runs SCRIPT, one command per line:
 *
 *   send TEXT     write TEXT to the terminal (C escapes: \n \r \t \e \\ \xHH;
 *                 \x03 is Ctrl-C, \x04 Ctrl-D)
 *   type TEXT     send TEXT once the terminal is in raw mode (a line editor
 *                 reads it), as a person typing at a prompt would
 *   expect TEXT   wait until TEXT appears in the output after the end of the
 *                 previous match (same escapes)
 *   sleep MS      let MS milliseconds pass (reading output meanwhile)
 *   wait          wait for PROGRAM to exit
 *
 * Every wait ends after SECONDS (default 20): then the program is killed and
 * pty fails.  At the end pty writes the whole transcript (the terminal's
 * output) to stdout, then a line "pty: exit N" (or "pty: signal N", or
 * "pty: FAILED: why"), and exits 0 only when every command succeeded and the
 * program exited 0 after a `wait`.  A script without `wait` kills the
 * program at its end (and reports "pty: killed"). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static char *out;          /* the transcript */
static size_t outlen, outcap, mark;
static int master = -1;
static pid_t child = -1;
static int status = -1;    /* the child's wait status once it exited */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void append(const char *p, size_t n) {
  if (outlen + n + 1 > outcap) {
    size_t cap = outcap ? outcap : 4096;
    while (outlen + n + 1 > cap) cap *= 2;
    char *o = realloc(out, cap);
    if (o == NULL) {
      fprintf(stderr, "pty: out of memory\n");
      exit(2);
    }
    out = o;
    outcap = cap;
  }
  memcpy(out + outlen, p, n);
  outlen += n;
  out[outlen] = '\0';
}

/* Read what the terminal has, waiting at most ms.  Returns 0 at the end of
 * output (the program and every process holding the terminal are gone). */
static int pump(int ms) {
  struct pollfd p = {master, POLLIN, 0};
  int r = poll(&p, 1, ms);
  if (r < 0 && errno == EINTR) return 1;
  if (r <= 0) return 1;
  char buf[4096];
  ssize_t n = read(master, buf, sizeof buf);
  if (n > 0) {
    append(buf, (size_t)n);
    return 1;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
  return 0;   /* EIO: the other side is closed */
}

static void reap(int block) {
  if (status != -1 || child <= 0) return;
  int st;
  if (waitpid(child, &st, block ? 0 : WNOHANG) == child) status = st;
}

static size_t unescape(const char *s, char *d) {
  size_t n = 0;
  while (*s) {
    if (*s != '\\' || s[1] == '\0') {
      d[n++] = *s++;
      continue;
    }
    s++;
    switch (*s) {
      case 'n': d[n++] = '\n'; s++; break;
      case 'r': d[n++] = '\r'; s++; break;
      case 't': d[n++] = '\t'; s++; break;
      case 'e': d[n++] = '\033'; s++; break;
      case 'x': {
        char hex[3] = {0, 0, 0};
        s++;
        for (int i = 0; i < 2 && *s; i++) hex[i] = *s++;
        d[n++] = (char)strtol(hex, NULL, 16);
        break;
      }
      default: d[n++] = *s++; break;
    }
  }
  d[n] = '\0';
  return n;
}

static int fail(const char *fmt, const char *arg) {
  fwrite(out ? out : "", 1, outlen, stdout);
  printf("\npty: FAILED: ");
  printf(fmt, arg);
  printf("\n");
  fflush(stdout);
  if (child > 0 && status == -1) {
    kill(-child, SIGKILL);
    kill(child, SIGKILL);
    reap(1);
  }
  return 1;
}

static int run_script(double timeout) {
  char line[8192], arg[8192];
  while (fgets(line, sizeof line, stdin)) {
    size_t l = strlen(line);
    if (l > 0 && line[l - 1] == '\n') line[--l] = '\0';
    if (line[0] == '\0' || line[0] == '#') continue;
    char *sp = strchr(line, ' ');
    const char *a = sp ? sp + 1 : "";
    if (sp) *sp = '\0';
    size_t alen = unescape(a, arg);
    double deadline = now() + timeout;
    if (strcmp(line, "type") == 0) {
      for (;;) {
        struct termios t;
        if (tcgetattr(master, &t) == 0 && !(t.c_lflag & ICANON)) break;
        if (now() > deadline) return fail("timeout waiting for raw mode to type '%s'", a);
        pump(5);
      }
    }
    if (strcmp(line, "send") == 0 || strcmp(line, "type") == 0) {
      for (size_t off = 0; off < alen;) {
        ssize_t n = write(master, arg + off, alen - off);
        if (n < 0 && errno != EINTR && errno != EAGAIN) return fail("send: %s", strerror(errno));
        if (n > 0) off += (size_t)n;
        pump(0);
      }
    } else if (strcmp(line, "expect") == 0) {
      for (;;) {
        char *hit = outlen > mark ? memmem(out + mark, outlen - mark, arg, alen) : NULL;
        if (hit != NULL) {
          mark = (size_t)(hit - out) + alen;
          break;
        }
        if (now() > deadline) return fail("timeout waiting for '%s'", a);
        if (!pump(100)) {
          reap(1);
          return fail("the program ended before '%s' appeared", a);
        }
      }
    } else if (strcmp(line, "sleep") == 0) {
      double until = now() + atof(a) / 1000.0;
      while (now() < until) pump(10);
    } else if (strcmp(line, "wait") == 0) {
      for (;;) {
        reap(0);
        if (status != -1) break;
        if (now() > deadline) return fail("timeout waiting for the program to exit%s", "");
        pump(50);
      }
      while (pump(0) && outlen > 0) {
        struct pollfd p = {master, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
      }
    } else {
      return fail("unknown command '%s'", line);
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  double timeout = 20;
  int i = 1;
  const char *term = "vt100";
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
      timeout = atof(argv[++i]);
    } else if (strcmp(argv[i], "-e") == 0 && i + 1 < argc) {
      if (putenv(argv[++i]) != 0) return 2;
    } else {
      fprintf(stderr, "usage: pty [-t SECONDS] [-e NAME=VALUE]... -- PROGRAM [ARGS...] < SCRIPT\n");
      return 2;
    }
  }
  if (i + 1 >= argc) {
    fprintf(stderr, "pty: no program\n");
    return 2;
  }
  char **prog = argv + i + 1;
  if (getenv("TERM") == NULL || strcmp(getenv("TERM"), "dumb") == 0) setenv("TERM", term, 1);

  master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    perror("pty: posix_openpt");
    return 2;
  }
  const char *slave = ptsname(master);
  struct winsize ws = {24, 80, 0, 0};
  fflush(stdout);
  child = fork();
  if (child < 0) {
    perror("pty: fork");
    return 2;
  }
  if (child == 0) {
    setsid();
    int s = open(slave, O_RDWR);
    if (s < 0) _exit(127);
    ioctl(s, TIOCSCTTY, 0);
    ioctl(s, TIOCSWINSZ, &ws);
    dup2(s, 0);
    dup2(s, 1);
    dup2(s, 2);
    if (s > 2) close(s);
    close(master);
    signal(SIGINT, SIG_DFL);
    execvp(prog[0], prog);
    _exit(127);
  }
  int bad = run_script(timeout);
  if (bad) return 1;
  if (status == -1) {
    kill(-child, SIGKILL);
    kill(child, SIGKILL);
    reap(1);
    fwrite(out ? out : "", 1, outlen, stdout);
    printf("\npty: killed\n");
    return 1;
  }
  fwrite(out ? out : "", 1, outlen, stdout);
  if (WIFEXITED(status)) printf("\npty: exit %d\n", WEXITSTATUS(status));
  else printf("\npty: signal %d\n", WTERMSIG(status));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
