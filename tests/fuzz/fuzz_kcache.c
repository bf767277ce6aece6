/* Fuzz target: the kernel cache's entry reader (cuda/kcache.c,
 * dev_kcache_parse), which both backends' compilers run on every file of
 * the cache before they load what it holds (dlopen on the host backend,
 * cuModuleLoadData on cuda).
 *
 * Each input is a whole entry.  It is read twice: as it is, against a key
 * of its own bytes (a damaged file: mostly a miss or BAD), and with its
 * checksum and payload length made right, against the key it holds, so
 * that mutations reach the payload's reader (the lowered names and the
 * image) past the checksum.  The first byte picks the number of names
 * asked for.  A crash, a sanitizer report or a broken invariant (abort) is
 * a failure; a miss or a damaged entry is fine.  Built with libFuzzer by
 * `make fuzz`; replay_kcache.c replays the corpus and the crashes in the
 * suite. */
#include <string.h>

#include "backend.h"
#include "fuzz.h"

static const char MAGIC[] = "GPULUA-KCACHE-2\n";
#define M (sizeof MAGIC - 1)

static void check(int rc, const dev_kimage *img, int nexpr) {
  FUZZ_ASSERT(rc == DEV_KCACHE_HIT || rc == DEV_KCACHE_MISS || rc == DEV_KCACHE_BAD);
  if (rc != DEV_KCACHE_HIT) {
    FUZZ_ASSERT(!img->data && !img->lowered && img->n == 0 && img->size == 0 && !img->from_cache);
    return;
  }
  FUZZ_ASSERT(img->from_cache && img->data && img->size > 0 && img->n == nexpr);
  FUZZ_ASSERT(img->lowered != NULL);
  for (int i = 0; i < img->n; i++) FUZZ_ASSERT(img->lowered[i] && strlen(img->lowered[i]) <= 4096);
}

static void parse(const unsigned char *buf, size_t len, const void *key, size_t klen, int nexpr) {
  dev_kimage img;
  memset(&img, 0x5a, sizeof img);   /* the reader must set every field */
  int rc = dev_kcache_parse(buf, len, MAGIC, key, klen, nexpr, &img);
  check(rc, &img, nexpr);
  dev_kimage_free(&img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int nexpr = data[0] % 4;
  /* exactly the entry's bytes, so that a read past the end is an ASan report */
  size_t len = size - 1;
  unsigned char *buf = malloc(len ? len : 1);
  FUZZ_ASSERT(buf != NULL);
  memcpy(buf, data + 1, len);
  parse(buf, len, data, size > 16 ? 16 : size, nexpr);
  if (len >= M + 24 && memcmp(buf, MAGIC, M) == 0) {
    uint64_t kl, pl, sum, rest = len - M - 24;
    memcpy(&kl, buf + M, 8);
    if (kl <= rest) {
      pl = rest - kl;
      const unsigned char *k = buf + M + 24;
      sum = dev_kcache_hash_more(dev_kcache_hash(k, kl), k + kl, pl);
      memcpy(buf + M + 8, &pl, 8);
      memcpy(buf + M + 16, &sum, 8);
      uint32_t n = 0;
      if (pl >= 4) memcpy(&n, k + kl, 4);
      parse(buf, len, k, kl, nexpr);
      if (n != (uint32_t)nexpr && n < 70000) parse(buf, len, k, kl, (int)n);
    }
  }
  free(buf);
  return 0;
}
