/* Fuzz target: the safetensors header reader of gpu.load_safetensors
 * (bindings/safetensors.c over the JSON reader bindings/json.c), Lua-free.
 *
 * Each input is a whole file: the header length is read from its first 8
 * bytes and checked against its size, then the header text is parsed and
 * checked against the buffer after it, as gpu.load_safetensors does before
 * it allocates anything.  The input is also parsed as a header's text alone
 * (against a buffer of the input's own size), so that mutations reach the
 * JSON reader without having to keep the length right.  A crash, a
 * sanitizer report or a broken invariant (abort) is a failure; an error is
 * fine.  replay_safetensors.c replays the corpus in the suite. */
#include <stdlib.h>
#include <string.h>

#include "bindings/safetensors.h"
#include "fuzz.h"

static int terminated(const char *s, size_t n) { return memchr(s, 0, n) != NULL; }

static void check(int rc, const st_header *h, const char *err, size_t errlen, uint64_t buflen) {
  FUZZ_ASSERT(terminated(err, errlen));
  if (rc != 0) {
    FUZZ_ASSERT(rc == -1 && err[0] != 0);
    FUZZ_ASSERT(h->t == NULL && h->n == 0 && h->meta == NULL);
    return;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < h->n; i++) {
    const st_entry *e = &h->t[i];
    FUZZ_ASSERT(e->name != NULL && e->name[e->namelen] == 0);
    FUZZ_ASSERT((unsigned)e->dt < DEV_NDTYPE && st_dtype_name(e->dt) != NULL);
    FUZZ_ASSERT(e->ndim >= 0 && e->ndim <= DEV_MAXDIM);
    uint64_t n = dev_dtype_size(e->dt);
    for (int d = 0; d < e->ndim; d++) {
      FUZZ_ASSERT(e->shape[d] >= 0);
      FUZZ_ASSERT(!__builtin_mul_overflow(n, (uint64_t)e->shape[d], &n));
    }
    FUZZ_ASSERT(e->begin <= e->end && e->end <= buflen && e->end - e->begin == n);
    total += n;
    /* sorted by name, no two alike */
    if (i) {
      size_t m = h->t[i - 1].namelen < e->namelen ? h->t[i - 1].namelen : e->namelen;
      int r = memcmp(h->t[i - 1].name, e->name, m);
      FUZZ_ASSERT(r < 0 || (r == 0 && h->t[i - 1].namelen < e->namelen));
    }
  }
  FUZZ_ASSERT(total == buflen);   /* contiguous, no overlap, no gap */
  for (size_t i = 0; i < h->nmeta; i++)
    FUZZ_ASSERT(h->meta[i].key && h->meta[i].val && h->meta[i].key[h->meta[i].klen] == 0 &&
                h->meta[i].val[h->meta[i].vlen] == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512];
  st_header h;
  uint64_t hlen;
  memset(err, 0, sizeof err);
  memset(&h, 0, sizeof h);
  int rc = st_header_len(data, size, &hlen, err, sizeof err);
  FUZZ_ASSERT(terminated(err, sizeof err));
  if (rc == 0) {
    FUZZ_ASSERT(hlen <= size - 8 && hlen <= ST_MAX_HEADER);
    /* the text in a buffer of exactly its size */
    char *text = malloc(hlen ? hlen : 1);
    FUZZ_ASSERT(text != NULL);
    memcpy(text, data + 8, hlen);
    rc = st_parse(text, hlen, size - 8 - hlen, &h, err, sizeof err);
    check(rc, &h, err, sizeof err, size - 8 - hlen);
    st_free(&h);
    free(text);
  }
  char *text = malloc(size ? size : 1);
  FUZZ_ASSERT(text != NULL);
  if (size) memcpy(text, data, size);
  memset(err, 0, sizeof err);
  rc = st_parse(text, size, size, &h, err, sizeof err);
  check(rc, &h, err, sizeof err, size);
  st_free(&h);
  free(text);
  return 0;
}
