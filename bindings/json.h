/* A strict, bounded JSON reader for file headers (safetensors): a cursor over
 * a buffer of known length that reads one value at a time, for parsers that
 * know the shape they expect.  No Lua, no allocation but the strings asked
 * for, so the parsers built on it can be fuzzed alone.  Every reader returns
 * 0, or -1 with a message ("... at byte N of the header") in err. */
#ifndef GPULUA_JSON_H
#define GPULUA_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef struct json_cur {
  const char *p, *end, *start;
  char *err;
  size_t errlen;
  int depth;                  /* nesting of json_skip, bounded */
} json_cur;

void json_init(json_cur *c, const char *text, size_t len, char *err, size_t errlen);
/* A message naming the byte the cursor is at; returns -1. */
int json_fail(json_cur *c, const char *what);
void json_ws(json_cur *c);
/* The next non-space character, or 0 at the end (a zero byte is an error later). */
int json_peek(json_cur *c);
int json_expect(json_cur *c, char ch);
/* A string, unescaped (UTF-8, \u escapes with surrogate pairs) into a new
 * malloc'd buffer of *len bytes plus a terminating zero (it may hold zero
 * bytes of its own, from \u0000).  Invalid UTF-8 is refused. */
int json_string(json_cur *c, char **out, size_t *len);
/* A non-negative integer without sign, fraction or exponent, at most max. */
int json_uint(json_cur *c, uint64_t max, uint64_t *out);
/* After a member or element: 1 for ',' (another follows), 0 for close. */
int json_next(json_cur *c, char close, int *more);
/* Any value, checked and skipped (nesting bounded). */
int json_skip(json_cur *c);
/* Only white space is left. */
int json_end(json_cur *c);

#endif
