/* The strict JSON reader of json.h (RFC 8259): no comments, no trailing
 * commas, no leading zeros, no control characters in strings, valid UTF-8
 * only; nothing is read outside [start, end). */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

void json_init(json_cur *c, const char *text, size_t len, char *err, size_t errlen) {
  c->p = c->start = text;
  c->end = text + len;
  c->err = err;
  c->errlen = errlen;
  c->depth = 0;
}

int json_fail(json_cur *c, const char *what) {
  snprintf(c->err, c->errlen, "%s at byte %lld of the header", what, (long long)(c->p - c->start));
  return -1;
}

void json_ws(json_cur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

int json_peek(json_cur *c) {
  json_ws(c);
  return c->p < c->end ? (unsigned char)*c->p : 0;
}

int json_expect(json_cur *c, char ch) {
  if (json_peek(c) != (unsigned char)ch) {
    char what[48];
    snprintf(what, sizeof what, "invalid JSON: expected '%c'", ch);
    return json_fail(c, c->p >= c->end ? "invalid JSON: unexpected end" : what);
  }
  c->p++;
  return 0;
}

static int hex4(json_cur *c, unsigned *out) {
  if (c->end - c->p < 4) return json_fail(c, "invalid JSON: truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char h = c->p[i];
    int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
    if (d < 0) return json_fail(c, "invalid JSON: bad \\u escape");
    v = v << 4 | (unsigned)d;
  }
  c->p += 4;
  *out = v;
  return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* The length of the valid UTF-8 sequence at p (not ASCII), or 0. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end) {
  unsigned cp, n;
  if (*p >= 0xC2 && *p <= 0xDF) { n = 2; cp = *p & 0x1F; }
  else if (*p >= 0xE0 && *p <= 0xEF) { n = 3; cp = *p & 0x0F; }
  else if (*p >= 0xF0 && *p <= 0xF4) { n = 4; cp = *p & 0x07; }
  else return 0;
  if ((size_t)(end - p) < n) return 0;
  for (unsigned i = 1; i < n; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  /* overlong forms, surrogates, beyond U+10FFFF */
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

int json_string(json_cur *c, char **out, size_t *len) {
  *out = NULL;
  if (json_expect(c, '"')) return -1;
  /* the unescaped text is never longer than the escaped */
  const char *q = c->p;
  while (q < c->end && *q != '"') q += *q == '\\' && q + 1 < c->end ? 2 : 1;
  if (q >= c->end) return json_fail(c, "invalid JSON: unterminated string");
  char *buf = malloc((size_t)(q - c->p) + 1);
  if (!buf) return json_fail(c, "out of memory");
  size_t k = 0;
  while (*c->p != '"') {
    unsigned char ch = (unsigned char)*c->p;
    if (ch < 0x20) { free(buf); return json_fail(c, "invalid JSON: a control character in a string"); }
    if (ch >= 0x80) {
      size_t n = utf8_len((const unsigned char *)c->p, (const unsigned char *)c->end);
      if (!n) { free(buf); return json_fail(c, "invalid UTF-8 in a string"); }
      memcpy(buf + k, c->p, n);
      k += n;
      c->p += n;
      continue;
    }
    c->p++;
    if (ch != '\\') { buf[k++] = (char)ch; continue; }
    char e = *c->p++;
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *at = e ? strchr(from, e) : NULL;
    if (at) { buf[k++] = to[at - from]; continue; }
    unsigned cp, lo;
    if (e != 'u' || hex4(c, &cp)) {
      free(buf);
      return e == 'u' ? -1 : json_fail(c, "invalid JSON: bad escape in a string");
    }
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      /* a surrogate pair, or invalid */
      if (c->end - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u') { free(buf); return json_fail(c, "invalid JSON: lone surrogate"); }
      c->p += 2;
      if (hex4(c, &lo)) { free(buf); return -1; }
      if (lo < 0xDC00 || lo > 0xDFFF) { free(buf); return json_fail(c, "invalid JSON: lone surrogate"); }
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      free(buf);
      return json_fail(c, "invalid JSON: lone surrogate");
    }
    k += put_utf8(buf + k, cp);
  }
  c->p++;
  buf[k] = 0;
  *out = buf;
  *len = k;
  return 0;
}

int json_uint(json_cur *c, uint64_t max, uint64_t *out) {
  int ch = json_peek(c);
  if (ch == '-') return json_fail(c, "a negative number");
  if (ch < '0' || ch > '9') return json_fail(c, "expected a non-negative integer");
  uint64_t v = 0;
  const char *s = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*c->p - '0'), &v) || v > max)
      return json_fail(c, "an integer too large");
    c->p++;
  }
  if (c->p - s > 1 && *s == '0') { c->p = s; return json_fail(c, "invalid JSON: a leading zero"); }
  if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E'))
    return json_fail(c, "expected an integer (not a fraction or an exponent)");
  *out = v;
  return 0;
}

int json_next(json_cur *c, char close, int *more) {
  int ch = json_peek(c);
  if (ch == ',') { c->p++; *more = 1; return 0; }
  if (ch == (unsigned char)close) { c->p++; *more = 0; return 0; }
  char what[64];
  snprintf(what, sizeof what, "invalid JSON: expected ',' or '%c'", close);
  return json_fail(c, c->p >= c->end ? "invalid JSON: unexpected end" : what);
}

static int skip_literal(json_cur *c, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return json_fail(c, "invalid JSON: unexpected character");
  c->p += n;
  return 0;
}

static int skip_number(json_cur *c) {
  const char *s = c->p;
  if (c->p < c->end && *c->p == '-') c->p++;
  if (c->p >= c->end || *c->p < '0' || *c->p > '9') return json_fail(c, "invalid JSON: bad number");
  if (*c->p == '0') c->p++;
  else while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
  if (c->p < c->end && *c->p == '.') {
    c->p++;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return json_fail(c, "invalid JSON: bad number");
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
  }
  if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
    c->p++;
    if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return json_fail(c, "invalid JSON: bad number");
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
  }
  (void)s;
  return 0;
}

int json_skip(json_cur *c) {
  int ch = json_peek(c), more = 1;
  if (ch == '"') {
    char *s;
    size_t n;
    if (json_string(c, &s, &n)) return -1;
    free(s);
    return 0;
  }
  if (ch == '{' || ch == '[') {
    if (++c->depth > JSON_MAX_DEPTH) return json_fail(c, "JSON nested too deeply");
    c->p++;
    char close = ch == '{' ? '}' : ']';
    if (json_peek(c) == (unsigned char)close) { c->p++; more = 0; }
    while (more) {
      if (ch == '{') {
        char *s;
        size_t n;
        if (json_string(c, &s, &n)) return -1;
        free(s);
        if (json_expect(c, ':')) return -1;
      }
      if (json_skip(c) || json_next(c, close, &more)) return -1;
    }
    c->depth--;
    return 0;
  }
  if (ch == 't') return skip_literal(c, "true");
  if (ch == 'f') return skip_literal(c, "false");
  if (ch == 'n') return skip_literal(c, "null");
  if (ch == '-' || (ch >= '0' && ch <= '9')) return skip_number(c);
  return json_fail(c, ch ? "invalid JSON: unexpected character" : "invalid JSON: unexpected end");
}

int json_end(json_cur *c) {
  json_ws(c);
  return c->p == c->end ? 0 : json_fail(c, "invalid JSON: text after the header's object");
}
