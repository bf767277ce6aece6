/* The chores of util.h. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Room for n more bytes and the NUL; 0, or -1 with oom set. */
static int sb_room(sbuf *b, size_t n)
{
  if (b->oom) return -1;
  if (b->n + n + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->n + n + 1) cap *= 2;
  char *np = realloc(b->p, cap);
  if (!np) { b->oom = 1; return -1; }
  b->p = np;
  b->cap = cap;
  return 0;
}

void sb_add(sbuf *b, const void *s, size_t n)
{
  if (sb_room(b, n)) return;
  if (n > 0) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

void sb_key(sbuf *b, const char *s) { sb_add(b, s, strlen(s) + 1); }

void sb_printf(sbuf *b, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) { b->oom = 1; return; }
  if (sb_room(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

/* One try in $TMPDIR, then one in /tmp: fd >= 0 (or 0 for a directory). */
static int tmp_make(const char *prefix, char *path, size_t n, int dir)
{
  const char *td = getenv("TMPDIR");
  const char *where[] = {td && *td ? td : "/tmp", "/tmp"};
  int rc = -1;
  for (int i = 0; i < 2 && rc < 0; i++) {
    if (snprintf(path, n, "%s/%s-XXXXXX", where[i], prefix) >= (int)n) { errno = ENAMETOOLONG; continue; }
    rc = dir ? (mkdtemp(path) ? 0 : -1) : mkostemp(path, O_CLOEXEC);
  }
  return rc;
}

int tmp_file(const char *prefix, char *path, size_t n) { return tmp_make(prefix, path, n, 0); }

int tmp_dir(const char *prefix, char *path, size_t n) { return tmp_make(prefix, path, n, 1); }

int flag_value(const char *v)
{
  static const char *const words[][2] = {{"0", "1"}, {"off", "on"}, {"no", "yes"}, {"false", "true"}};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    for (int on = 0; on < 2; on++)
      if (strcasecmp(v, words[i][on]) == 0) return on;
  return -1;
}

/* set once, never cleared; read by any thread */
static atomic_int settings_off;

void env_settings_off(void) { atomic_store(&settings_off, 1); }

int env_settings_ignored(void) { return atomic_load(&settings_off); }

const char *env_setting(const char *name)
{
  return atomic_load(&settings_off) ? NULL : getenv(name);
}

int env_flag(const char *name, int *on, char *err, size_t errlen)
{
  const char *v = env_setting(name);
  if (!v || !*v) return 0;
  int f = flag_value(v);
  if (f < 0)
    return fail_msg(err, errlen, "%s='%.40s' is not on or off (expected 1, on, yes or true; 0, off, no or false)",
                    name, v);
  *on = f;
  return 0;
}
