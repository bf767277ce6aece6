/* Fuzz target: the .npy header reader of gpu.load (bindings/npy.c), which
 * this file includes, reader only (GPULUA_NPY_HEADER_ONLY).
 *
 * Each input is a whole file: it is written to a memfd (a regular file) and
 * read by read_header, the code gpu.load runs before it allocates anything
 * (magic, version, header length, the header dict, dtype, shape, and the
 * sizes checked against the file's).  The input is also given to the dict
 * parser alone, as a header's text, so that mutations reach it without
 * having to keep the preamble's length right.
 *
 * Built with libFuzzer (clang -fsanitize=fuzzer,address,undefined) by `make
 * fuzz`; replay_npy.c replays the corpus and the crashes in the suite.  A
 * crash, a sanitizer report or a broken invariant (abort) is a failure; an
 * error is fine. */
#define GPULUA_NPY_HEADER_ONLY
/* gpu.load and t:save are left out, and some helpers they use go unused */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "bindings/npy.c"

#include <stdint.h>
#include <sys/mman.h>

#include "fuzz.h"

static lua_State *L;
static int mfd = -1;

/* A NUL-terminated string within n bytes. */
static int terminated(const char *s, size_t n) { return memchr(s, 0, n) != NULL; }

static void check(int rc, const npy_header *h, const char *err, size_t errlen, uint64_t file_size) {
  FUZZ_ASSERT(terminated(err, errlen));
  if (rc != 0) {
    FUZZ_ASSERT(rc == -1 && err[0] != 0);
    return;
  }
  FUZZ_ASSERT(terminated(h->descr, sizeof h->descr));
  FUZZ_ASSERT((unsigned)h->dt < DEV_NDTYPE);
  FUZZ_ASSERT(h->ndim >= 0 && h->ndim <= DEV_MAXDIM);
  FUZZ_ASSERT(!h->fortran);
  uint64_t n = 1;
  for (int d = 0; d < h->ndim; d++) {
    FUZZ_ASSERT(h->shape[d] >= 0);   /* 0: an empty tensor */
    FUZZ_ASSERT(!__builtin_mul_overflow(n, (uint64_t)h->shape[d], &n));
  }
  FUZZ_ASSERT(h->nbytes == n * dev_dtype_size(h->dt));
  if (file_size != UINT64_MAX) {
    FUZZ_ASSERT(h->data_offset >= NPY_MAGIC_LEN + 4 && h->data_offset <= file_size);
    FUZZ_ASSERT(h->data_offset + h->nbytes == file_size);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) {
    L = luaL_newstate();
    mfd = memfd_create("npy", MFD_CLOEXEC);
    FUZZ_ASSERT(L && mfd >= 0);
  }
  /* the file */
  FUZZ_ASSERT(ftruncate(mfd, 0) == 0);
  FUZZ_ASSERT(size == 0 || pwrite(mfd, data, size, 0) == (ssize_t)size);
  npy_header h;
  char err[512];
  memset(&h, 0, sizeof h);
  memset(err, 0, sizeof err);
  int top = lua_gettop(L);
  int rc = read_header(L, mfd, &h, err, sizeof err);
  lua_settop(L, top);
  check(rc, &h, err, sizeof err, size);

  /* the header text alone, in a buffer of exactly its size */
  char *text = malloc(size ? size : 1);
  FUZZ_ASSERT(text != NULL);
  if (size) memcpy(text, data, size);
  memset(&h, 0, sizeof h);
  memset(err, 0, sizeof err);
  rc = parse_header(text, size, &h, err, sizeof err);
  check(rc, &h, err, sizeof err, UINT64_MAX);
  free(text);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
