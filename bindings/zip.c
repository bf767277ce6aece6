/* The zip reader of zip.h (APPNOTE.TXT 6.3): the end of central directory
 * record is searched in the file's last 64 KiB + 22 bytes, zip64's locator
 * and record are followed when there, each central directory entry is
 * checked against the file (sizes, offsets, zip64 extra field), and a
 * member's local header is read only when the member is.  Sizes come from
 * the central directory, so members written with data descriptors (flag
 * bit 3: zeros in the local header) read as the others. */
#include "zip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef GPULUA_HAVE_ZLIB
#include <zlib.h>
#endif

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define END_LEN 22
#define CHUNK (1u << 20)

static uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t u64(const unsigned char *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

static int read_fail(char *err, size_t errlen, const char *what) {
  snprintf(err, errlen, "read failed (%s): %s", what, errno ? strerror(errno) : "unexpected end of file");
  return -1;
}

#ifndef GPULUA_HAVE_ZLIB
/* without zlib: the CRC-32 bit by bit (stored members only) */
uint32_t zip_crc32(uint32_t crc, const void *p, size_t n) {
  const unsigned char *c = p;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) {
    crc ^= c[i];
    for (int k = 0; k < 8; k++) crc = crc >> 1 ^ (0xEDB88320u & (0u - (crc & 1)));
  }
  return ~crc;
}

int zip_deflate(const void *p, size_t n, void **out, size_t *outlen) {
  (void)p, (void)n, (void)outlen;
  *out = NULL;
  return -1;
}
#else
uint32_t zip_crc32(uint32_t crc, const void *p, size_t n) {
  const unsigned char *c = p;
  uLong v = crc;
  while (n > 0) {
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    v = crc32(v, c, k);
    c += k;
    n -= k;
  }
  return (uint32_t)v;
}

#endif /* GPULUA_HAVE_ZLIB */

void zip_free(zip_archive *za) {
  for (size_t i = 0; i < za->n; i++) free(za->e[i].name);
  free(za->e);
  memset(za, 0, sizeof *za);
}

/* zip64: a locator right before the end record at *end_pos points at the
 * zip64 end record, whose values replace the 32-bit ones. */
static int zip64_end(zip_read_fn rd, void *ctx, uint64_t *end_pos, uint64_t *cd_off, uint64_t *cd_size,
                     uint64_t *count, char *err, size_t errlen) {
  unsigned char loc[20], rec[56];
  if (*end_pos < 20) return 0;
  if (rd(ctx, loc, 20, *end_pos - 20) != 0) return read_fail(err, errlen, "the zip64 locator");
  if (u32(loc) != SIG_LOC64) return 0;
  uint64_t off = u64(loc + 8);
  if (off > *end_pos - 20 || *end_pos - 20 - off < 56) {
    snprintf(err, errlen, "bad zip64 locator (its record at %llu is not before it)", (unsigned long long)off);
    return -1;
  }
  if (rd(ctx, rec, 56, off) != 0) return read_fail(err, errlen, "the zip64 end record");
  if (u32(rec) != SIG_END64) {
    snprintf(err, errlen, "bad zip64 end record (wrong signature at %llu)", (unsigned long long)off);
    return -1;
  }
  *count = u64(rec + 32);
  *cd_size = u64(rec + 40);
  *cd_off = u64(rec + 48);
  *end_pos = off;
  return 0;
}

/* The end record (and zip64's): where the central directory is. */
static int find_end(zip_read_fn rd, void *ctx, uint64_t size, uint64_t *cd_off, uint64_t *cd_size, uint64_t *count,
                    char *err, size_t errlen) {
  if (size < END_LEN) {
    snprintf(err, errlen, "not a zip archive (%llu bytes: too short)", (unsigned long long)size);
    return -1;
  }
  size_t tail = size < END_LEN + 65535 ? (size_t)size : END_LEN + 65535;
  unsigned char *t = malloc(tail);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (rd(ctx, t, tail, size - tail) != 0) {
    free(t);
    return read_fail(err, errlen, "the end record");
  }
  size_t at = tail - END_LEN + 1;
  int found = 0;
  while (at-- > 0) {
    /* the record, with a comment that ends exactly at the file's end */
    if (u32(t + at) == SIG_END && at + END_LEN + u16(t + at + 20) == tail) {
      found = 1;
      break;
    }
  }
  if (!found) {
    free(t);
    snprintf(err, errlen, "not a zip archive (no end of central directory record: truncated?)");
    return -1;
  }
  const unsigned char *e = t + at;
  uint64_t end_pos = size - tail + at;
  if (u16(e + 4) != 0 || u16(e + 6) != 0 || u16(e + 8) != u16(e + 10)) {
    free(t);
    snprintf(err, errlen, "a multi-disk zip archive is not supported");
    return -1;
  }
  *count = u16(e + 10);
  *cd_size = u32(e + 12);
  *cd_off = u32(e + 16);
  free(t);
  if (zip64_end(rd, ctx, &end_pos, cd_off, cd_size, count, err, errlen)) return -1;
  if (*cd_off > end_pos || *cd_size > end_pos - *cd_off) {
    snprintf(err, errlen, "bad central directory (offset %llu, %llu bytes; the end record is at %llu): truncated?",
             (unsigned long long)*cd_off, (unsigned long long)*cd_size, (unsigned long long)end_pos);
    return -1;
  }
  if (*count > *cd_size / 46) {
    snprintf(err, errlen, "bad central directory (%llu entries in %llu bytes)", (unsigned long long)*count,
             (unsigned long long)*cd_size);
    return -1;
  }
  return 0;
}

/* The zip64 extra field's values for the 32-bit fields that are all ones. */
static int zip64_extra(const unsigned char *x, size_t xlen, zip_entry *e, int need_u, int need_c, int need_o) {
  while (xlen >= 4) {
    uint16_t id = u16(x), n = u16(x + 2);
    if ((size_t)n > xlen - 4) return -1;
    if (id == 1) {
      size_t k = 0;
      if (need_u) { if (k + 8 > n) return -1; e->usize = u64(x + 4 + k); k += 8; }
      if (need_c) { if (k + 8 > n) return -1; e->csize = u64(x + 4 + k); k += 8; }
      if (need_o) { if (k + 8 > n) return -1; e->lho = u64(x + 4 + k); k += 8; }
      return 0;
    }
    x += 4 + n;
    xlen -= 4 + (size_t)n;
  }
  return need_u || need_c || need_o ? -1 : 0;
}

static int parse_cd(const unsigned char *cd, uint64_t cd_size, uint64_t count, zip_archive *za, char *err,
                    size_t errlen) {
  za->e = calloc(count ? (size_t)count : 1, sizeof *za->e);
  if (!za->e) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  uint64_t at = 0;
  for (uint64_t i = 0; i < count; i++) {
    if (cd_size - at < 46 || u32(cd + at) != SIG_CENTRAL) {
      snprintf(err, errlen, "bad central directory entry %llu (%s)", (unsigned long long)i + 1,
               cd_size - at < 46 ? "truncated" : "wrong signature");
      return -1;
    }
    const unsigned char *h = cd + at;
    size_t nlen = u16(h + 28), xlen = u16(h + 30), clen = u16(h + 32);
    if (cd_size - at - 46 < nlen + xlen + clen) {
      snprintf(err, errlen, "bad central directory entry %llu (truncated)", (unsigned long long)i + 1);
      return -1;
    }
    zip_entry *e = &za->e[za->n];
    e->name = malloc(nlen + 1);
    if (!e->name) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    za->n++;
    memcpy(e->name, h + 46, nlen);
    e->name[nlen] = 0;
    e->namelen = nlen;
    uint16_t flags = u16(h + 8);
    e->method = u16(h + 10);
    e->crc = u32(h + 16);
    e->csize = u32(h + 20);
    e->usize = u32(h + 24);
    e->lho = u32(h + 42);
    if (zip64_extra(h + 46 + nlen, xlen, e, e->usize == 0xFFFFFFFFu, e->csize == 0xFFFFFFFFu, e->lho == 0xFFFFFFFFu)) {
      snprintf(err, errlen, "member '%.200s': bad zip64 extra field", e->name);
      return -1;
    }
    if (flags & 1) {
      snprintf(err, errlen, "member '%.200s' is encrypted (not supported)", e->name);
      return -1;
    }
    if (e->method != 0 && e->method != 8) {
      snprintf(err, errlen, "member '%.200s': compression method %d is not supported (stored and deflated are)",
               e->name, e->method);
      return -1;
    }
    if (e->method == 0 && e->csize != e->usize) {
      snprintf(err, errlen, "member '%.200s': stored, but its sizes differ (%llu and %llu)", e->name,
               (unsigned long long)e->csize, (unsigned long long)e->usize);
      return -1;
    }
    /* deflate expands at most 1032:1; a bigger claim is a corrupt (or hostile) entry */
    if (e->method == 8 && e->usize / 1032 > e->csize + 1) {
      snprintf(err, errlen, "member '%.200s': %llu bytes cannot inflate to the %llu claimed", e->name,
               (unsigned long long)e->csize, (unsigned long long)e->usize);
      return -1;
    }
    if (e->lho > za->cd_off || e->csize > za->cd_off - e->lho) {
      snprintf(err, errlen, "member '%.200s' (at %llu, %llu bytes) does not lie before the central directory: "
               "truncated or corrupt", e->name, (unsigned long long)e->lho, (unsigned long long)e->csize);
      return -1;
    }
    at += 46 + nlen + xlen + clen;
  }
  return 0;
}

static int by_offset(const void *a, const void *b) {
  const zip_entry *x = *(const zip_entry *const *)a, *y = *(const zip_entry *const *)b;
  if (x->lho != y->lho) return x->lho < y->lho ? -1 : 1;
  return x < y ? -1 : x > y;   /* central directory order: the same message every time */
}

/* No two members share bytes: each spans at least its local header, its
 * name and its data from its offset.  A member is then at most read (or
 * mapped) once, and overlapping members (a zip bomb's trick) are refused. */
static int check_overlap(const zip_archive *za, char *err, size_t errlen) {
  if (za->n < 2) return 0;
  const zip_entry **by = malloc(za->n * sizeof *by);
  if (!by) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < za->n; i++) by[i] = &za->e[i];
  qsort(by, za->n, sizeof *by, by_offset);
  int rc = 0;
  for (size_t i = 0; i + 1 < za->n && !rc; i++) {
    const zip_entry *a = by[i], *b = by[i + 1];
    /* lho + csize <= cd_off (parse_cd): the sum does not overflow */
    if (b->lho - a->lho < 30 + a->namelen + a->csize) {
      snprintf(err, errlen, "members '%.200s' and '%.200s' overlap (at %llu and %llu): corrupt", a->name, b->name,
               (unsigned long long)a->lho, (unsigned long long)b->lho);
      rc = -1;
    }
  }
  free(by);
  return rc;
}

int zip_open(zip_read_fn rd, void *ctx, uint64_t size, zip_archive *za, char *err, size_t errlen) {
  uint64_t cd_off, cd_size, count;
  memset(za, 0, sizeof *za);
  if (find_end(rd, ctx, size, &cd_off, &cd_size, &count, err, errlen)) return -1;
  unsigned char *cd = malloc(cd_size ? (size_t)cd_size : 1);
  if (!cd) {
    snprintf(err, errlen, "out of memory (a central directory of %llu bytes)", (unsigned long long)cd_size);
    return -1;
  }
  if (cd_size && rd(ctx, cd, (size_t)cd_size, cd_off) != 0) {
    free(cd);
    return read_fail(err, errlen, "the central directory");
  }
  za->cd_off = cd_off;
  int rc = parse_cd(cd, cd_size, count, za, err, errlen);
  if (rc == 0) rc = check_overlap(za, err, errlen);
  free(cd);
  if (rc) zip_free(za);
  return rc;
}

/* The sizes of a local header's zip64 extra field: both, real size first
 * (APPNOTE 4.5.3: in a local header the field holds both).  0, or -1. */
static int local_zip64(const unsigned char *x, size_t xlen, uint64_t *usize, uint64_t *csize) {
  while (xlen >= 4) {
    uint16_t id = u16(x), n = u16(x + 2);
    if ((size_t)n > xlen - 4) return -1;
    if (id == 1) {
      if (n < 16) return -1;
      *usize = u64(x + 4);
      *csize = u64(x + 12);
      return 0;
    }
    x += 4 + n;
    xlen -= 4 + (size_t)n;
  }
  return -1;
}

/* What the local header says (nx: its name, then its extra field) against
 * the central directory entry e: the same name and method, and the same
 * sizes and CRC-32 unless a data descriptor holds them (flag bit 3). */
static int check_local(const unsigned char *lh, const unsigned char *nx, const zip_entry *e, char *err,
                       size_t errlen) {
  size_t nlen = u16(lh + 26), xlen = u16(lh + 28);
  if (nlen != e->namelen || memcmp(nx, e->name, nlen) != 0) {
    snprintf(err, errlen, "member '%.200s': its local header names '%.*s': corrupt", e->name,
             (int)(nlen < 200 ? nlen : 200), (const char *)nx);
    return -1;
  }
  if (u16(lh + 8) != e->method) {
    snprintf(err, errlen, "member '%.200s': its local header says method %d, the central directory %d: corrupt",
             e->name, u16(lh + 8), e->method);
    return -1;
  }
  if (u16(lh + 6) & 8) return 0;
  uint64_t cs = u32(lh + 18), us = u32(lh + 22), cs64 = 0, us64 = 0;
  if (cs == 0xFFFFFFFFu || us == 0xFFFFFFFFu) {
    if (local_zip64(nx + nlen, xlen, &us64, &cs64)) {
      snprintf(err, errlen, "member '%.200s': bad zip64 extra field in its local header", e->name);
      return -1;
    }
    if (cs == 0xFFFFFFFFu) cs = cs64;
    if (us == 0xFFFFFFFFu) us = us64;
  }
  if (us != e->usize || cs != e->csize) {
    snprintf(err, errlen, "member '%.200s': its local header says %llu bytes (%llu compressed), the central "
             "directory %llu (%llu): corrupt", e->name, (unsigned long long)us, (unsigned long long)cs,
             (unsigned long long)e->usize, (unsigned long long)e->csize);
    return -1;
  }
  if (u32(lh + 14) != e->crc) {
    snprintf(err, errlen, "member '%.200s': its local header's CRC-32 (%08x) is not the central directory's "
             "(%08x): corrupt", e->name, (unsigned)u32(lh + 14), (unsigned)e->crc);
    return -1;
  }
  return 0;
}

int zip_member_offset(zip_read_fn rd, void *ctx, const zip_archive *za, const zip_entry *e, uint64_t *off,
                      char *err, size_t errlen) {
  unsigned char lh[30];
  if (za->cd_off - e->lho < 30) {
    snprintf(err, errlen, "member '%.200s': its local header runs into the central directory: corrupt", e->name);
    return -1;
  }
  if (rd(ctx, lh, 30, e->lho) != 0) return read_fail(err, errlen, "a local header");
  if (u32(lh) != SIG_LOCAL) {
    snprintf(err, errlen, "member '%.200s': bad local header (wrong signature at %llu)", e->name,
             (unsigned long long)e->lho);
    return -1;
  }
  size_t nx = (size_t)u16(lh + 26) + u16(lh + 28);
  uint64_t at = e->lho + 30 + nx;   /* lho < cd_off: no overflow */
  if (at > za->cd_off || e->csize > za->cd_off - at) {
    snprintf(err, errlen, "member '%.200s': its data runs into the central directory: corrupt", e->name);
    return -1;
  }
  unsigned char *x = malloc(nx ? nx : 1);
  if (!x) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int rc = nx && rd(ctx, x, nx, e->lho + 30) != 0 ? read_fail(err, errlen, "a local header")
                                                  : check_local(lh, x, e, err, errlen);
  free(x);
  *off = at;
  return rc;
}

/* ---- a member read front to back ------------------------------------- */

struct zip_stream {
  zip_read_fn rd;
  void *ctx;
  char *name;
  int method;
  uint64_t off, left;       /* the next byte of its data in the file, and how many are left */
  uint64_t usize, done;     /* its size, and the bytes given so far */
  uint32_t crc, want;       /* the CRC-32 of those bytes, and the archive's */
#ifdef GPULUA_HAVE_ZLIB
  z_stream z;
  int zinit, ended;         /* inflateInit2 done; the deflate stream's end seen */
  unsigned char *in;        /* CHUNK bytes of compressed data */
#endif
};

void zip_stream_close(zip_stream *s) {
  if (!s) return;
#ifdef GPULUA_HAVE_ZLIB
  if (s->zinit) inflateEnd(&s->z);
  free(s->in);
#endif
  free(s->name);
  free(s);
}

int zip_stream_open(zip_read_fn rd, void *ctx, const zip_archive *za, const zip_entry *e, zip_stream **out,
                    char *err, size_t errlen) {
  *out = NULL;
  uint64_t off;
  if (zip_member_offset(rd, ctx, za, e, &off, err, errlen)) return -1;
#ifndef GPULUA_HAVE_ZLIB
  if (e->method != 0) {
    snprintf(err, errlen, "member '%.200s' is deflated, and this gpulua was built without zlib "
             "(apt install zlib1g-dev, then rebuild)", e->name);
    return -1;
  }
#endif
  zip_stream *s = calloc(1, sizeof *s);
  if (!s || !(s->name = strdup(e->name))) {
    free(s);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  s->rd = rd;
  s->ctx = ctx;
  s->method = e->method;
  s->off = off;
  s->left = e->csize;
  s->usize = e->usize;
  s->want = e->crc;
#ifdef GPULUA_HAVE_ZLIB
  if (s->method != 0) {
    if (!(s->in = malloc(CHUNK))) {
      zip_stream_close(s);
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    if (inflateInit2(&s->z, -15) != Z_OK) {
      zip_stream_close(s);
      snprintf(err, errlen, "zlib: cannot start inflating");
      return -1;
    }
    s->zinit = 1;
  }
#endif
  *out = s;
  return 0;
}

#ifdef GPULUA_HAVE_ZLIB
/* Up to n bytes inflated into o (*got of them): fewer only once the deflate
 * stream has ended or its data in the file is used up. */
static int inflate_some(zip_stream *s, unsigned char *o, size_t n, size_t *got, char *err, size_t errlen) {
  *got = 0;
  while (*got < n && !s->ended) {
    if (s->z.avail_in == 0 && s->left > 0) {
      size_t k = s->left < CHUNK ? (size_t)s->left : CHUNK;
      if (s->rd(s->ctx, s->in, k, s->off) != 0) return read_fail(err, errlen, "a member's data");
      s->off += k;
      s->left -= k;
      s->z.next_in = s->in;
      s->z.avail_in = (uInt)k;
    }
    size_t room = n - *got;
    s->z.next_out = o + *got;
    s->z.avail_out = room > (1u << 30) ? (1u << 30) : (uInt)room;
    uInt before = s->z.avail_out;
    int zr = inflate(&s->z, Z_NO_FLUSH);
    *got += before - s->z.avail_out;
    if (zr == Z_STREAM_END) s->ended = 1;
    else if (zr == Z_BUF_ERROR && s->z.avail_in == 0 && s->left == 0) break;   /* no more input */
    else if (zr != Z_OK && zr != Z_BUF_ERROR) {
      snprintf(err, errlen, "member '%.200s': corrupt deflate data (zlib: %s)", s->name,
               s->z.msg ? s->z.msg : "error");
      return -1;
    }
  }
  return 0;
}
#endif

/* After the last byte: a deflate stream ends there, and the CRC-32 matches. */
static int stream_finish(zip_stream *s, char *err, size_t errlen) {
#ifdef GPULUA_HAVE_ZLIB
  if (s->method != 0) {
    unsigned char extra;
    size_t got = 0;
    if (!s->ended && inflate_some(s, &extra, 1, &got, err, errlen)) return -1;
    if (!s->ended || got) {
      snprintf(err, errlen, "member '%.200s': corrupt deflate data (more data than its size)", s->name);
      return -1;
    }
  }
#endif
  if (s->crc != s->want) {
    snprintf(err, errlen, "member '%.200s': CRC-32 mismatch (the data is corrupt: %08x, the archive says %08x)",
             s->name, s->crc, s->want);
    return -1;
  }
  return 0;
}

int zip_stream_read(zip_stream *s, void *out, size_t n, char *err, size_t errlen) {
  if (n > s->usize - s->done) {
    snprintf(err, errlen, "member '%.200s': a read past its end", s->name);
    return -1;
  }
  if (n == 0 && s->done < s->usize) return 0;
  if (s->method == 0) {
    if (n && s->rd(s->ctx, out, n, s->off + s->done) != 0) return read_fail(err, errlen, "a member's data");
  }
#ifdef GPULUA_HAVE_ZLIB
  else {
    size_t got;
    if (inflate_some(s, out, n, &got, err, errlen)) return -1;
    if (got < n) {
      snprintf(err, errlen, "member '%.200s': corrupt deflate data (it ends early)", s->name);
      return -1;
    }
  }
#endif
  s->crc = zip_crc32(s->crc, out, n);
  s->done += n;
  return s->done == s->usize ? stream_finish(s, err, errlen) : 0;
}

int zip_read_member(zip_read_fn rd, void *ctx, const zip_archive *za, const zip_entry *e, void *out, char *err,
                    size_t errlen) {
  zip_stream *s;
  if (zip_stream_open(rd, ctx, za, e, &s, err, errlen)) return -1;
  int rc = zip_stream_read(s, out, (size_t)e->usize, err, errlen);
  zip_stream_close(s);
  return rc;
}

#ifdef GPULUA_HAVE_ZLIB
int zip_deflate(const void *p, size_t n, void **out, size_t *outlen) {
  z_stream z;
  memset(&z, 0, sizeof z);
  *out = NULL;
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return -1;
  size_t cap = n + n / 1000 + 64 + 5 * (n / 16000 + 1);   /* deflateBound's stored-block worst case, and more */
  unsigned char *o = malloc(cap);
  if (!o) {
    deflateEnd(&z);
    return -1;
  }
  const unsigned char *in = p;
  size_t inleft = n, done = 0;
  int zr = Z_OK;
  while (zr != Z_STREAM_END) {
    if (z.avail_in == 0 && inleft) {
      uInt k = inleft > (1u << 30) ? (1u << 30) : (uInt)inleft;
      z.next_in = (unsigned char *)in;
      z.avail_in = k;
      in += k;
      inleft -= k;
    }
    if (done == cap) {
      unsigned char *no = realloc(o, cap * 2);
      if (!no) { free(o); deflateEnd(&z); return -1; }
      o = no;
      cap *= 2;
    }
    size_t room = cap - done;
    z.next_out = o + done;
    z.avail_out = room > (1u << 30) ? (1u << 30) : (uInt)room;
    uInt before = z.avail_out;
    zr = deflate(&z, inleft || z.avail_in ? Z_NO_FLUSH : Z_FINISH);
    done += before - z.avail_out;
    if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) { free(o); deflateEnd(&z); return -1; }
  }
  deflateEnd(&z);
  *out = o;
  *outlen = done;
  return 0;
}
#endif /* GPULUA_HAVE_ZLIB */
