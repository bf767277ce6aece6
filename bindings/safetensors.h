/* The safetensors header (Hugging Face's format), Lua-free so that it can be
 * fuzzed alone (tests/fuzz/fuzz_safetensors.c).  A file is the header's
 * length N (u64 little-endian), N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * (white space after it allowed), then the byte buffer: each tensor's
 * elements, C order, little-endian, at [b, e) of the buffer. */
#ifndef GPULUA_SAFETENSORS_H
#define GPULUA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../cuda/device.h"

#define ST_MAX_HEADER 100000000u   /* the reference implementation's limit */

typedef struct st_entry {
  char *name;
  size_t namelen;
  dev_dtype dt;
  int ndim;
  int64_t shape[DEV_MAXDIM];
  uint64_t begin, end;          /* in the buffer, which starts at 8 + N */
} st_entry;

typedef struct st_meta { char *key, *val; size_t klen, vlen; } st_meta;

typedef struct st_header {
  st_entry *t;
  size_t n;
  st_meta *meta;
  size_t nmeta;
  int has_meta;
} st_header;

/* The header length from the first 8 bytes of a file of size bytes; checks
 * it against the limit and the file.  0, or -1 with a message. */
int st_header_len(const unsigned char *first, uint64_t size, uint64_t *len, char *err, size_t errlen);
/* Parses and checks the header text against a buffer of buflen bytes: the
 * JSON, the keys, the dtypes, the offsets (in order, contiguous from 0, no
 * overlap, ending at buflen) and each length against shape x dtype size. */
int st_parse(const char *text, size_t len, uint64_t buflen, st_header *h, char *err, size_t errlen);
void st_free(st_header *h);
/* Our dtype's name in the format ("F32"), and the other way (-1: none). */
const char *st_dtype_name(dev_dtype dt);

#endif
