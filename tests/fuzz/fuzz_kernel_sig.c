/* Fuzz target: the kernel-signature parsers (cuda/kernel_sig.c), which read
 * the __global__ signatures of gpu.compile's source, gpu.load_module's
 * `declare` and gpulua_register_kernel's parameter list, and the .entry
 * directives of PTX.
 *
 * Each input is given to both parsers as a C string.  A crash, a sanitizer
 * report or a broken invariant (abort) is a failure; an error is fine.
 * Built with libFuzzer by `make fuzz`; replay_kernel_sig.c replays the
 * corpus and the crashes in the suite. */
#include <string.h>

#include "device.h"
#include "fuzz.h"

static int terminated(const char *s, size_t n) { return memchr(s, 0, n) != NULL; }

static void check(int rc, dev_ksig *k, int n, const char *err, size_t errlen) {
  FUZZ_ASSERT(terminated(err, errlen));
  if (rc != 0) {
    FUZZ_ASSERT(rc == -1 && err[0] != 0 && k == NULL && n == 0);
    return;
  }
  FUZZ_ASSERT(n >= 0 && (n == 0) == (k == NULL));
  for (int i = 0; i < n; i++) {
    const dev_ksig *s = &k[i];
    FUZZ_ASSERT(terminated(s->name, sizeof s->name) && terminated(s->qualified, sizeof s->qualified));
    FUZZ_ASSERT(s->nparams >= 0 && (s->nparams == 0 || s->params != NULL));
    for (int j = 0; j < s->nparams; j++) {
      const dev_kparam *p = &s->params[j];
      FUZZ_ASSERT(terminated(p->name, sizeof p->name) && terminated(p->type, sizeof p->type));
      FUZZ_ASSERT(p->size >= 0);
      FUZZ_ASSERT(p->pointee >= -1 && p->pointee < DEV_NDTYPE);
      FUZZ_ASSERT(p->elsize >= 0);
      if (p->kind == DEV_KP_POINTER) FUZZ_ASSERT(p->size == 8);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* exactly size + 1 bytes, so that a read past the end is an ASan report */
  char *src = malloc(size + 1);
  FUZZ_ASSERT(src != NULL);
  if (size) memcpy(src, data, size);
  src[size] = 0;
  char err[512];
  dev_ksig *k;
  int n;

  memset(err, 0, sizeof err);
  k = (dev_ksig *)1;
  n = -1;
  int rc = dev_kernels_parse(src, &k, &n, err, sizeof err);
  check(rc, k, n, err, sizeof err);
  dev_kernels_free(k, n);

  memset(err, 0, sizeof err);
  k = (dev_ksig *)1;
  n = -1;
  rc = dev_kernels_parse_ptx(src, &k, &n, err, sizeof err);
  check(rc, k, n, err, sizeof err);
  dev_kernels_free(k, n);

  free(src);
  return 0;
}
