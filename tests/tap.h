/* TAP output for the C tests (tests/embed, tests/unit, the fuzz replays):
 *
 *   ok(cond, fmt, ...)   one "ok N - ..." or "not ok N - ..." line; returns cond
 *   skip(name, why)      "ok N - name # SKIP why" ("ok N # SKIP why" without a name)
 *   diag(msg)            msg as diagnostics, every line prefixed with "# "
 *   skip_all(fmt, ...)   the plan "1..0 # SKIP ...", for a test that cannot run
 *   done_testing()       the plan "1..N", printed last; main returns it: nonzero
 *                        when a test failed
 *
 * Each line is flushed at once, so a crash or a sanitizer report shows after
 * the last result it followed. */
#ifndef GPULUA_TESTS_TAP_H
#define GPULUA_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* unused: a test need not call every helper */
#define TAP_FN static __attribute__((unused))

static int ntest, nfail;

TAP_FN int ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
TAP_FN int ok(int cond, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%sok %d - ", cond ? "" : "not ", ++ntest);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  if (!cond) nfail++;
  return cond;
}

TAP_FN void skip(const char *name, const char *why) {
  if (name && *name)
    printf("ok %d - %s # SKIP %s\n", ++ntest, name, why);
  else
    printf("ok %d # SKIP %s\n", ++ntest, why);
  fflush(stdout);
}

TAP_FN void diag(const char *msg) {
  for (const char *p = msg; p && *p;) {
    const char *nl = strchr(p, '\n');
    int n = nl ? (int)(nl - p) : (int)strlen(p);
    printf("# %.*s\n", n, p);
    p += n + (nl != NULL);
  }
  fflush(stdout);
}

TAP_FN void skip_all(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
TAP_FN void skip_all(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("1..0 # SKIP ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

/* before exit: LeakSanitizer may end the process in exit(), unflushed */
TAP_FN int done_testing(void) {
  printf("1..%d\n", ntest);
  fflush(stdout);
  return nfail != 0;
}

#endif
