/* TAP output for the C unit tests: ok(cond, fmt, ...) prints one "ok N" or
 * "not ok N" line; main prints the plan "1..N" last and returns nfail != 0. */
#ifndef GPULUA_TESTS_TAP_H
#define GPULUA_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>

static int ntest, nfail;

static void ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ok(int cond, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%sok %d - ", cond ? "" : "not ", ++ntest);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (!cond) nfail++;
}

#endif
