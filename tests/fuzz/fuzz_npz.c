/* Fuzz target: the .npz reader of gpu.load_npz: the zip reader
 * (bindings/zip.c: end records, central directory, local headers,
 * inflate, CRC-32) and, for each member it gives, the .npy header reader
 * (bindings/npy.c, included reader only), both on the member read whole
 * and in place in the file (the mapped path), the member read again in
 * pieces of every size (the inflater of a load to the device: the same
 * bytes, the same outcome), all Lua-free, over the
 * input as a whole file in memory.  A crash, a sanitizer report or a broken
 * invariant (abort) is a failure; an error is fine.  replay_npz.c replays
 * the corpus in the suite. */
#define GPULUA_NPY_HEADER_ONLY
#pragma GCC diagnostic ignored "-Wunused-function"
#include "bindings/npy.c"

#include "bindings/zip.h"
#include "fuzz.h"

typedef struct mem { const unsigned char *p; uint64_t n; } mem;

/* Reads within the buffer only: a read past its end is an error, as past a file's. */
static int mem_read(void *ctx, void *p, size_t n, uint64_t off) {
  mem *m = ctx;
  if (off > m->n || n > m->n - off) {
    errno = 0;
    return -1;
  }
  if (n) memcpy(p, m->p + off, n);
  return 0;
}

static int terminated(const char *s, size_t n) { return memchr(s, 0, n) != NULL; }

/* A stored member's .npy read in place, as gpu.load_npz maps it: every
 * read must stay inside the member. */
typedef struct member { mem *f; uint64_t base, size; } member;

static int member_read(void *ctx, void *p, size_t n, uint64_t off) {
  member *m = ctx;
  FUZZ_ASSERT(off <= m->size && n <= m->size - off);
  return mem_read(m->f, p, n, m->base + off);
}

/* The mapped path: the local header against the central directory, then
 * the .npy header from the file, its elements inside the member. */
static void member_in_place(mem *f, const zip_archive *z, const zip_entry *e) {
  char err[512];
  uint64_t off = 0;
  memset(err, 0, sizeof err);
  if (zip_member_offset(mem_read, f, z, e, &off, err, sizeof err)) {
    FUZZ_ASSERT(terminated(err, sizeof err) && err[0] != 0);
    return;
  }
  FUZZ_ASSERT(off <= z->cd_off && e->csize <= z->cd_off - off);
  if (e->method != 0) return;
  member m = {f, off, e->usize};
  npy_header h;
  memset(&h, 0, sizeof h);
  memset(err, 0, sizeof err);
  if (npy_read_header(member_read, &m, e->usize, &h, err, sizeof err) == 0)
    FUZZ_ASSERT(h.data_offset + h.nbytes == e->usize);
  else
    FUZZ_ASSERT(terminated(err, sizeof err) && err[0] != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mem f = {data, size};
  zip_archive z;
  char err[512];
  memset(err, 0, sizeof err);
  int rc = zip_open(mem_read, &f, size, &z, err, sizeof err);
  FUZZ_ASSERT(terminated(err, sizeof err));
  if (rc) {
    FUZZ_ASSERT(rc == -1 && err[0] && z.e == NULL && z.n == 0);
    return 0;
  }
  FUZZ_ASSERT(z.cd_off <= size);
  for (size_t i = 0; i < z.n && i < 64; i++) {
    const zip_entry *e = &z.e[i];
    FUZZ_ASSERT(e->name && e->name[e->namelen] == 0);
    FUZZ_ASSERT(e->method == 0 || e->method == 8);
    FUZZ_ASSERT(e->lho <= z.cd_off && e->csize <= z.cd_off - e->lho);
    /* no two members overlap */
    for (size_t j = 0; j < i; j++) {
      const zip_entry *a = z.e[j].lho < e->lho ? &z.e[j] : e, *b = a == e ? &z.e[j] : e;
      FUZZ_ASSERT(b->lho - a->lho >= 30 + a->namelen + a->csize);
    }
    member_in_place(&f, &z, e);
    if (e->usize > (1u << 24)) continue;   /* a big claim is only memory, not a finding */
    unsigned char *out = malloc(e->usize ? (size_t)e->usize : 1);
    FUZZ_ASSERT(out != NULL);
    memset(err, 0, sizeof err);
    int whole = zip_read_member(mem_read, &f, &z, e, out, err, sizeof err);
    FUZZ_ASSERT(terminated(err, sizeof err));
    /* read again front to back in pieces (gpu.load_npz's inflater): the
     * same bytes and the same outcome, whatever the pieces */
    zip_stream *zs = NULL;
    char err2[512];
    memset(err2, 0, sizeof err2);
    if (zip_stream_open(mem_read, &f, &z, e, &zs, err2, sizeof err2) == 0) {
      unsigned char *again = malloc(e->usize ? (size_t)e->usize : 1);
      FUZZ_ASSERT(again != NULL);
      uint64_t at = 0;
      int piecewise = 0;
      size_t step = 1 + (size ? data[i % size] : 0) * 7;
      do {
        size_t n = e->usize - at < step ? (size_t)(e->usize - at) : step;
        piecewise = zip_stream_read(zs, again + at, n, err2, sizeof err2);
        at += n;
        step = step * 3 % 4099 + 1;
      } while (piecewise == 0 && at < e->usize);
      FUZZ_ASSERT((piecewise == 0) == (whole == 0));
      if (whole == 0) FUZZ_ASSERT(e->usize == 0 || memcmp(again, out, (size_t)e->usize) == 0);
      else FUZZ_ASSERT(terminated(err2, sizeof err2) && err2[0] != 0);
      free(again);
      zip_stream_close(zs);
    } else {
      FUZZ_ASSERT(whole != 0 && terminated(err2, sizeof err2) && err2[0] != 0);
    }
    if (whole == 0) {
      FUZZ_ASSERT(zip_crc32(0, out, (size_t)e->usize) == e->crc);
      mem m = {out, e->usize};
      npy_header h;
      memset(&h, 0, sizeof h);
      memset(err, 0, sizeof err);
      if (npy_read_header(mem_read, &m, e->usize, &h, err, sizeof err) == 0)
        FUZZ_ASSERT(h.data_offset + h.nbytes == e->usize);
      else
        FUZZ_ASSERT(err[0] != 0);
    } else {
      FUZZ_ASSERT(terminated(err, sizeof err) && err[0] != 0);
    }
    free(out);
  }
  zip_free(&z);
  return 0;
}
