/* The on-disk cache of compiled kernels that both backends' compilers share
 * (cuda/cuda/nvrtc.c, cuda/host/kcompile.c).
 *
 * An entry is one file, written under a temporary name and renamed, so a
 * reader sees a whole file or none:
 *
 *   magic        the backend's, with the format's version ("GPULUA-KCACHE-2\n")
 *   u64 klen     the key's length
 *   u64 plen     the payload's length
 *   u64 sum      FNV-1a 64 of the key, then of the payload
 *   key          everything that decides the output
 *   payload      u32 n, n lowered names (u32 length, bytes), then the image
 *
 * Another magic is a miss (another format or version: the entry is
 * rebuilt); another key too (two keys with one hash).  With the magic
 * right, lengths that do not add up to the file's or a checksum that
 * differs mean a damaged entry: it is removed, the caller compiles again,
 * and a note says so (a damaged shared object would crash dlopen, a damaged
 * cubin cuModuleLoadData). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devpriv.h"
#include "util.h"

#define KC_MAX_FILE ((uint64_t)1 << 31)
#define KC_MAX_NAMES 65536
#define KC_MAX_NAME 4096

uint64_t dev_kcache_hash(const void *p, size_t n)
{
  return dev_kcache_hash_more(0xcbf29ce484222325ULL, p, n);
}

uint64_t dev_kcache_hash_more(uint64_t h, const void *p, size_t n)
{
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ULL; }   /* FNV-1a */
  return h;
}

/* GPULUA_KERNEL_CACHE names a directory (not on, off or empty). */
static const char *explicit_dir(void)
{
  const char *env = env_setting("GPULUA_KERNEL_CACHE");
  return env && *env && flag_value(env) < 0 ? env : NULL;
}

const char *dev_kcache_dir(char *buf, size_t n)
{
  /* a directory; off (or set empty): no cache; on: the default directory */
  const char *env = env_setting("GPULUA_KERNEL_CACHE");
  if (env && (!*env || flag_value(env) == 0)) return NULL;
  if (explicit_dir()) {
    snprintf(buf, n, "%s", env);
  } else {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(buf, n, "%s/gpulua", xdg);
    else if (home && *home) snprintf(buf, n, "%s/.cache/gpulua", home);
    else return NULL;
  }
  return buf;
}

int dev_mkdirs(char *path)
{
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int rc = mkdir(path, 0755);
    *p = '/';
    if (rc && errno != EEXIST) return -1;
  }
  return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

void dev_kimage_free(dev_kimage *img)
{
  if (!img) return;
  for (int i = 0; i < img->n; i++) free(img->lowered[i]);
  free(img->lowered);
  free(img->data);
  memset(img, 0, sizeof *img);
}

/* ---- entries ------------------------------------------------------------- */

static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* The payload's names and image into img (the checksum has passed). */
static int parse_payload(const unsigned char *p, uint64_t plen, int nexpr, dev_kimage *img)
{
  if (plen < 4) return DEV_KCACHE_BAD;
  uint32_t n = get32(p);
  uint64_t at = 4;
  if (n > KC_MAX_NAMES || (int)n != nexpr) return DEV_KCACHE_BAD;
  if (!(img->lowered = calloc(n ? n : 1, sizeof *img->lowered))) return DEV_KCACHE_MISS;
  for (uint32_t i = 0; i < n; i++) {
    if (plen - at < 4) return DEV_KCACHE_BAD;
    uint32_t len = get32(p + at);
    at += 4;
    if (len > KC_MAX_NAME || plen - at < len || memchr(p + at, 0, len)) return DEV_KCACHE_BAD;
    if (!(img->lowered[i] = malloc((size_t)len + 1))) return DEV_KCACHE_MISS;
    memcpy(img->lowered[i], p + at, len);
    img->lowered[i][len] = 0;
    img->n = (int)i + 1;
    at += len;
  }
  if (plen == at) return DEV_KCACHE_BAD;   /* no image */
  if (!(img->data = malloc(plen - at))) return DEV_KCACHE_MISS;
  memcpy(img->data, p + at, plen - at);
  img->size = plen - at;
  return DEV_KCACHE_HIT;
}

int dev_kcache_parse(const void *buf, size_t len, const char *magic, const void *key, size_t klen, int nexpr,
                     dev_kimage *img)
{
  const unsigned char *f = buf;
  size_t m = strlen(magic);
  memset(img, 0, sizeof *img);
  if (len < m || memcmp(f, magic, m) != 0) return DEV_KCACHE_MISS;
  if (len - m < 24) return DEV_KCACHE_BAD;
  uint64_t kl = get64(f + m), rest = len - m - 24;
  if (kl > rest) return DEV_KCACHE_BAD;
  uint64_t pl = get64(f + m + 8), sum = get64(f + m + 16);
  if (pl != rest - kl) return DEV_KCACHE_BAD;
  const unsigned char *k = f + m + 24, *p = k + kl;
  if (dev_kcache_hash_more(dev_kcache_hash(k, kl), p, pl) != sum) return DEV_KCACHE_BAD;
  if (kl != klen || memcmp(k, key, klen) != 0) return DEV_KCACHE_MISS;
  int rc = parse_payload(p, pl, nexpr, img);
  if (rc != DEV_KCACHE_HIT) dev_kimage_free(img);
  else img->from_cache = 1;
  return rc;
}

/* The whole regular file at path (at most KC_MAX_FILE bytes), or NULL. */
static unsigned char *slurp(const char *path, size_t *len)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > KC_MAX_FILE) {
    close(fd);
    return NULL;
  }
  size_t size = (size_t)st.st_size, got = 0;
  unsigned char *buf = malloc(size ? size : 1);
  while (buf && got < size) {
    ssize_t k = read(fd, buf + got, size - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  *len = got;
  return buf;
}

int dev_kcache_read(const char *path, const char *magic, const void *key, size_t klen, int nexpr,
                    dev_kimage *img, char *note, size_t notelen)
{
  size_t len = 0;
  unsigned char *f = slurp(path, &len);
  memset(img, 0, sizeof *img);
  if (!f) return DEV_KCACHE_MISS;
  int rc = dev_kcache_parse(f, len, magic, key, klen, nexpr, img);
  free(f);
  if (rc == DEV_KCACHE_BAD) {
    unlink(path);
    fail_msg(note, notelen, "the kernel cache entry %s was damaged (its checksum or lengths do not match): "
             "removed, and the kernel compiled again", path);
  }
  return rc;
}

/* The cache directory, made if missing: with parents when it is the
 * default one; the last component alone when GPULUA_KERNEL_CACHE names it
 * (as mkdir without -p), else a note says why there is no cache. */
static int make_dir(const char *dir, char *note, size_t notelen)
{
  struct stat st;
  if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  const char *env = explicit_dir();
  if (!env) {
    char d[1024];
    snprintf(d, sizeof d, "%s", dir);
    return dev_mkdirs(d);
  }
  if (mkdir(dir, 0755) == 0) return 0;
  int e = errno;
  if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  return fail_msg(note, notelen, "GPULUA_KERNEL_CACHE='%s': %s; kernels are compiled without the cache",
                  env, e == ENOENT ? "its parent directory does not exist (only the last directory is made)"
                     : e == EEXIST ? "not a directory" : strerror(e));
}

int dev_kcache_write(const char *dir, const char *path, const char *magic, const void *key, size_t klen,
                     const dev_kimage *img, char *note, size_t notelen)
{
  if (make_dir(dir, note, notelen)) return -1;
  sbuf p = {0};
  uint32_t n = (uint32_t)img->n;
  sb_add(&p, &n, 4);
  for (int i = 0; i < img->n; i++) {
    uint32_t len = (uint32_t)strlen(img->lowered[i]);
    sb_add(&p, &len, 4);
    sb_add(&p, img->lowered[i], len);
  }
  sb_add(&p, img->data, img->size);
  if (p.oom) { free(p.p); return -1; }
  uint64_t head[3] = {klen, p.n, dev_kcache_hash_more(dev_kcache_hash(key, klen), p.p, p.n)};
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f = fopen(tmp, "wbe");
  if (!f) { free(p.p); return -1; }
  size_t m = strlen(magic);
  int bad = fwrite(magic, 1, m, f) != m || fwrite(head, 8, 3, f) != 3 || fwrite(key, 1, klen, f) != klen ||
            fwrite(p.p, 1, p.n, f) != p.n;
  free(p.p);
  if (fclose(f) || bad || rename(tmp, path)) {
    unlink(tmp);
    return -1;
  }
  return 0;
}
