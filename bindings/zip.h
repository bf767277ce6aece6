/* Zip archives as NumPy's .npz files are (zip.c): the central directory
 * parsed and checked, zip64 included, members stored or deflated (zlib),
 * their CRC-32 checked; no two members overlap.  Lua-free, so that it can be fuzzed alone
 * (tests/fuzz/fuzz_npz.c).  Only what .npz needs: one disk, no encryption. */
#ifndef GPULUA_ZIP_H
#define GPULUA_ZIP_H

#include <stddef.h>
#include <stdint.h>

/* Reads n bytes at off: 0, or -1 (errno set; 0 at the end of the file). */
typedef int (*zip_read_fn)(void *ctx, void *p, size_t n, uint64_t off);

typedef struct zip_entry {
  char *name;                   /* zero-terminated; namelen bytes */
  size_t namelen;
  int method;                   /* 0 stored, 8 deflated */
  uint32_t crc;
  uint64_t csize, usize, lho;   /* compressed and real size, local header offset */
} zip_entry;

typedef struct zip_archive {
  zip_entry *e;
  size_t n;
  uint64_t cd_off;              /* members lie before the central directory */
} zip_archive;

/* Reads and checks the end record and the central directory of a file of
 * size bytes.  0, or -1 with a message (za is then empty). */
int zip_open(zip_read_fn rd, void *ctx, uint64_t size, zip_archive *za, char *err, size_t errlen);
void zip_free(zip_archive *za);
/* Where the member's data starts in the file (*off): its local header
 * read and checked against the central directory (name, method, and the
 * sizes and CRC-32 unless a data descriptor holds them), its data checked
 * to lie before the central directory.  0, or -1 with a message. */
int zip_member_offset(zip_read_fn rd, void *ctx, const zip_archive *za, const zip_entry *e, uint64_t *off,
                      char *err, size_t errlen);
/* The member's usize bytes into out, inflated if need be, CRC-32 checked. */
int zip_read_member(zip_read_fn rd, void *ctx, const zip_archive *za, const zip_entry *e, void *out, char *err,
                    size_t errlen);
/* A member read front to back in pieces (the reads of one stream in order,
 * from one thread at a time): open reads and checks its local header;
 * read gives its next n bytes (stored, or inflated), and with the last one
 * checks that a deflate stream ends there and the CRC-32.  0, or -1 with a
 * message.  The stream keeps rd and ctx, and copies what it needs of e. */
typedef struct zip_stream zip_stream;
int zip_stream_open(zip_read_fn rd, void *ctx, const zip_archive *za, const zip_entry *e, zip_stream **out,
                    char *err, size_t errlen);
int zip_stream_read(zip_stream *s, void *out, size_t n, char *err, size_t errlen);
void zip_stream_close(zip_stream *s);
/* CRC-32 (zlib's) of n bytes, continuing from crc (0 to start). */
uint32_t zip_crc32(uint32_t crc, const void *p, size_t n);
/* Raw deflate of n bytes into a new malloc'd buffer (*out, *outlen); 0 or -1. */
int zip_deflate(const void *p, size_t n, void **out, size_t *outlen);

#endif
