/* Asking a peer rank where it is: see where.h. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "devpriv.h"
#include "where.h"

/* By hand, without stdio: where_note_c runs in a signal handler. */
static size_t put_n(char *buf, size_t at, size_t len, const char *s, size_t most) {
  for (size_t i = 0; s && i < most && s[i] && at + 1 < len; i++) buf[at++] = s[i];
  buf[at] = 0;
  return at;
}

static size_t put(char *buf, size_t at, size_t len, const char *s) { return put_n(buf, at, len, s, (size_t)-1); }

static size_t put_uint(char *buf, size_t at, size_t len, unsigned v) {
  char d[16];
  int n = 0;
  do d[n++] = (char)('0' + v % 10); while ((v /= 10) && n < 15);
  while (n && at + 1 < len) buf[at++] = d[--n];
  buf[at] = 0;
  return at;
}

void where_path(char *buf, size_t len, int pid, const char *suffix) {
  size_t at = put(buf, 0, len, "/dev/shm/gpulua-where-");
  at = put_uint(buf, at, len, (unsigned)getuid());
  at = put(buf, at, len, "-");
  at = put_uint(buf, at, len, (unsigned)pid);
  put(buf, at, len, suffix);
}

int where_asked(void) {
  char path[128];
  where_path(path, sizeof path, (int)getpid(), ".ask");
  return access(path, F_OK) == 0;
}

void where_note_c(dev_ctx *ctx) {
  char path[128], msg[DEV_SITE_LEN + 160];
  where_path(path, sizeof path, (int)getpid(), ".c");
  size_t at = put(msg, 0, sizeof msg, "is in C");
  if (ctx && ctx->site[0]) {
    at = put(msg, at, sizeof msg, " (a wait, a sleep or a C call); its last gpu call was at ");
    /* the main thread may be writing it: at most its buffer, maybe torn */
    at = put_n(msg, at, sizeof msg, ctx->site, sizeof ctx->site);
  } else {
    at = put(msg, at, sizeof msg, " (a sleep, a wait or a C call)");
  }
  at = put(msg, at, sizeof msg, "\n");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;
  ssize_t w = write(fd, msg, at);
  (void)w;
  close(fd);
}

static int read_answer(const char *path, char *out, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(out, 1, len - 1, f);
  fclose(f);
  out[n] = 0;
  char *nl = strchr(out, '\n');
  if (!nl) return 0;  /* not written whole yet */
  *nl = 0;
  return 1;
}

int where_ask(int pid, char *out, size_t len, double wait_s) {
  char path[128], cpath[128], ask[128];
  where_path(path, sizeof path, pid, "");
  where_path(cpath, sizeof cpath, pid, ".c");
  where_path(ask, sizeof ask, pid, ".ask");
  unlink(path);
  unlink(cpath);
  out[0] = 0;
  if (pid <= 0 || len < 2) return 0;
  int fd = open(ask, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) close(fd);
  int got = 0;
  if (kill(pid, WHERE_SIGNAL) == 0) {
    struct timespec ts = {0, 10000000L};
    for (int i = 0; !got && i * 0.01 < wait_s; i++) {
      if (read_answer(path, out, len)) got = 1;
      else nanosleep(&ts, NULL);
    }
    if (!got && read_answer(cpath, out, len)) got = 2;
  }
  unlink(ask);
  unlink(path);
  unlink(cpath);
  if (!got) out[0] = 0;
  return got;
}
