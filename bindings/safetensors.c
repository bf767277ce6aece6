/* The safetensors header reader of safetensors.h.  Its checks are the
 * reference implementation's (safetensors' Rust crate, Metadata::validate):
 * a sane header length, valid JSON, the offsets contiguous and in order,
 * each length the shape's elements times the dtype's size, and the last
 * tensor ending at the buffer's end; duplicate keys are refused as well,
 * where a JSON reader would keep one of them silently. */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static const struct { dev_dtype dt; const char *name; } st_types[] = {
  {DEV_F64, "F64"}, {DEV_F32, "F32"}, {DEV_F16, "F16"}, {DEV_BF16, "BF16"}, {DEV_I64, "I64"},
  {DEV_I32, "I32"}, {DEV_I8, "I8"}, {DEV_U8, "U8"}, {DEV_BOOL, "BOOL"},
};
#define ST_NTYPES (sizeof st_types / sizeof st_types[0])
/* the format's other dtypes: named in the error as not supported */
static const char *const st_other[] = {"I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                       "F6_E2M3", "F6_E3M2", "F4", "C64", NULL};

const char *st_dtype_name(dev_dtype dt) {
  for (size_t i = 0; i < ST_NTYPES; i++)
    if (st_types[i].dt == dt) return st_types[i].name;
  return NULL;
}

int st_header_len(const unsigned char *first, uint64_t size, uint64_t *len, char *err, size_t errlen) {
  if (size < 8) {
    snprintf(err, errlen, "truncated (%llu bytes: no room for the header length)", (unsigned long long)size);
    return -1;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | first[i];
  if (n > ST_MAX_HEADER) {
    snprintf(err, errlen, "header length %llu is too large (at most %u): not a safetensors file?",
             (unsigned long long)n, ST_MAX_HEADER);
    return -1;
  }
  if (n > size - 8) {
    snprintf(err, errlen, "truncated header (the header length says %llu bytes, the file has %llu after it)",
             (unsigned long long)n, (unsigned long long)(size - 8));
    return -1;
  }
  if (n < 2) {
    snprintf(err, errlen, "header of %llu bytes: too short for a JSON object", (unsigned long long)n);
    return -1;
  }
  *len = n;
  return 0;
}

void st_free(st_header *h) {
  for (size_t i = 0; i < h->n; i++) free(h->t[i].name);
  for (size_t i = 0; i < h->nmeta; i++) {
    free(h->meta[i].key);
    free(h->meta[i].val);
  }
  free(h->t);
  free(h->meta);
  memset(h, 0, sizeof *h);
}

/* Pushes an empty slot on a growing array; NULL when out of memory. */
static void *grow(void **arr, size_t *n, size_t *cap, size_t esz) {
  if (*n == *cap) {
    size_t nc = *cap ? 2 * *cap : 8;
    void *na = realloc(*arr, nc * esz);
    if (!na) return NULL;
    *arr = na;
    *cap = nc;
  }
  void *slot = (char *)*arr + (*n)++ * esz;
  memset(slot, 0, esz);
  return slot;
}

static int parse_dtype(json_cur *c, st_entry *e) {
  char *s;
  size_t n;
  if (json_string(c, &s, &n)) return -1;
  for (size_t i = 0; i < ST_NTYPES; i++)
    if (strcmp(s, st_types[i].name) == 0 && strlen(s) == n) {
      e->dt = st_types[i].dt;
      free(s);
      return 0;
    }
  int known = 0;
  for (int i = 0; st_other[i]; i++) known |= strcmp(s, st_other[i]) == 0;
  snprintf(c->err, c->errlen, "tensor '%.200s': %s dtype '%.40s' (gpulua has F64 F32 F16 BF16 I64 I32 I8 U8 BOOL)",
           e->name, known ? "unsupported" : "unknown", s);
  free(s);
  return -1;
}

static int parse_shape(json_cur *c, st_entry *e) {
  if (json_expect(c, '[')) return -1;
  int more = 1;
  if (json_peek(c) == ']') { c->p++; more = 0; }
  while (more) {
    uint64_t v;
    if (e->ndim == DEV_MAXDIM) {
      snprintf(c->err, c->errlen, "tensor '%.200s': more than %d dims (gpulua tensors have at most %d)", e->name,
               DEV_MAXDIM, DEV_MAXDIM);
      return -1;
    }
    if (json_uint(c, (uint64_t)1 << 56, &v)) return -1;
    e->shape[e->ndim++] = (int64_t)v;
    if (json_next(c, ']', &more)) return -1;
  }
  return 0;
}

static int parse_offsets(json_cur *c, st_entry *e) {
  int more;
  if (json_expect(c, '[') || json_uint(c, UINT64_MAX, &e->begin) || json_expect(c, ',') ||
      json_uint(c, UINT64_MAX, &e->end) || json_next(c, ']', &more))
    return -1;
  if (more) return json_fail(c, "data_offsets has more than 2 numbers");
  return 0;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} */
static int parse_entry(json_cur *c, st_entry *e) {
  int have[3] = {0, 0, 0}, more = 1;
  static const char *const keys[] = {"dtype", "shape", "data_offsets"};
  if (json_expect(c, '{')) return -1;
  if (json_peek(c) == '}') { c->p++; more = 0; }
  while (more) {
    char *k;
    size_t kn;
    if (json_string(c, &k, &kn)) return -1;
    int i = 0;
    while (i < 3 && !(strcmp(k, keys[i]) == 0 && strlen(k) == kn)) i++;
    if (i == 3 || have[i]) {
      snprintf(c->err, c->errlen, "tensor '%.200s': %s key '%.40s'", e->name, i == 3 ? "unexpected" : "duplicate", k);
      free(k);
      return -1;
    }
    free(k);
    have[i] = 1;
    if (json_expect(c, ':')) return -1;
    if ((i == 0 ? parse_dtype(c, e) : i == 1 ? parse_shape(c, e) : parse_offsets(c, e)) || json_next(c, '}', &more))
      return -1;
  }
  for (int i = 0; i < 3; i++)
    if (!have[i]) {
      snprintf(c->err, c->errlen, "tensor '%.200s' has no '%s'", e->name, keys[i]);
      return -1;
    }
  return 0;
}

static int parse_meta(json_cur *c, st_header *h, size_t *cap) {
  int more = 1;
  if (json_peek(c) != '{') return json_fail(c, "__metadata__ is not an object");
  c->p++;
  if (json_peek(c) == '}') { c->p++; more = 0; }
  while (more) {
    st_meta *m = grow((void **)&h->meta, &h->nmeta, cap, sizeof *m);
    if (!m) return json_fail(c, "out of memory");
    if (json_string(c, &m->key, &m->klen) || json_expect(c, ':')) return -1;
    if (json_peek(c) != '"') return json_fail(c, "a __metadata__ value is not a string");
    if (json_string(c, &m->val, &m->vlen) || json_next(c, '}', &more)) return -1;
  }
  return 0;
}

static int by_name(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  size_t n = x->namelen < y->namelen ? x->namelen : y->namelen;
  int r = memcmp(x->name, y->name, n);
  return r ? r : (x->namelen > y->namelen) - (x->namelen < y->namelen);
}

static int by_begin(const void *a, const void *b) {
  const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

static int meta_by_key(const void *a, const void *b) {
  const st_meta *x = a, *y = b;
  size_t n = x->klen < y->klen ? x->klen : y->klen;
  int r = memcmp(x->key, y->key, n);
  return r ? r : (x->klen > y->klen) - (x->klen < y->klen);
}

static int check_offsets(st_header *h, uint64_t buflen, char *err, size_t errlen) {
  st_entry **order = malloc((h->n ? h->n : 1) * sizeof *order);
  if (!order) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < h->n; i++) order[i] = &h->t[i];
  qsort(order, h->n, sizeof *order, by_begin);
  uint64_t at = 0;
  int rc = 0;
  for (size_t i = 0; i < h->n && !rc; i++) {
    st_entry *e = order[i];
    uint64_t n = 1, bytes;
    for (int d = 0; d < e->ndim; d++)
      if (__builtin_mul_overflow(n, (uint64_t)e->shape[d], &n)) n = UINT64_MAX;
    if (__builtin_mul_overflow(n, (uint64_t)dev_dtype_size(e->dt), &bytes)) bytes = UINT64_MAX;
    if (bytes == UINT64_MAX) {
      char sh[DEV_MAXDIM * 24 + 8];
      size_t k = 0;
      for (int d = 0; d < e->ndim; d++)
        k += (size_t)snprintf(sh + k, sizeof sh - k, d ? ", %llu" : "%llu", (unsigned long long)e->shape[d]);
      sh[k] = 0;
      snprintf(err, errlen, "tensor '%.200s': shape [%s] of %s is too large", e->name, sh, st_dtype_name(e->dt));
      rc = -1;
    } else if (e->end < e->begin) {
      snprintf(err, errlen, "tensor '%.200s': data_offsets [%llu, %llu] end before they begin", e->name,
               (unsigned long long)e->begin, (unsigned long long)e->end);
      rc = -1;
    } else if (e->begin != at) {
      snprintf(err, errlen, "tensor '%.200s': data_offsets [%llu, %llu] %s (expected it to begin at %llu)", e->name,
               (unsigned long long)e->begin, (unsigned long long)e->end,
               e->begin < at ? "overlap the tensor before" : "leave a gap after the tensor before",
               (unsigned long long)at);
      rc = -1;
    } else if (e->end - e->begin != bytes) {
      snprintf(err, errlen, "tensor '%.200s': data_offsets [%llu, %llu] hold %llu bytes, its shape and dtype need %llu",
               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
               (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
      rc = -1;
    } else if (e->end > buflen) {
      snprintf(err, errlen, "truncated data: tensor '%.200s' ends at byte %llu of the buffer, the file has %llu",
               e->name, (unsigned long long)e->end, (unsigned long long)buflen);
      rc = -1;
    }
    at = e->end;
  }
  if (!rc && at != buflen) {
    snprintf(err, errlen, "the tensors end at byte %llu of the buffer, the file has %llu (trailing bytes)",
             (unsigned long long)at, (unsigned long long)buflen);
    rc = -1;
  }
  free(order);
  return rc;
}

static int parse_top(json_cur *c, st_header *h) {
  size_t cap = 0, mcap = 0;
  int more = 1;
  if (json_peek(c) != '{') return json_fail(c, "invalid JSON: the header is not an object");
  c->p++;
  if (json_peek(c) == '}') { c->p++; more = 0; }
  while (more) {
    char *k;
    size_t kn;
    if (json_string(c, &k, &kn)) return -1;
    if (json_expect(c, ':')) { free(k); return -1; }
    if (kn == 12 && memcmp(k, "__metadata__", 12) == 0) {
      free(k);
      if (h->has_meta) return json_fail(c, "duplicate key '__metadata__'");
      h->has_meta = 1;
      if (parse_meta(c, h, &mcap)) return -1;
    } else {
      st_entry *e = grow((void **)&h->t, &h->n, &cap, sizeof *e);
      if (!e) { free(k); return json_fail(c, "out of memory"); }
      e->name = k;
      e->namelen = kn;
      if (parse_entry(c, e)) return -1;
    }
    if (json_next(c, '}', &more)) return -1;
  }
  return json_end(c);
}

int st_parse(const char *text, size_t len, uint64_t buflen, st_header *h, char *err, size_t errlen) {
  json_cur c;
  memset(h, 0, sizeof *h);
  json_init(&c, text, len, err, errlen);
  if (parse_top(&c, h)) goto fail;
  if (h->n > 1) qsort(h->t, h->n, sizeof *h->t, by_name);
  for (size_t i = 1; i < h->n; i++)
    if (by_name(&h->t[i - 1], &h->t[i]) == 0) {
      snprintf(err, errlen, "duplicate tensor name '%.200s'", h->t[i].name);
      goto fail;
    }
  if (h->nmeta > 1) qsort(h->meta, h->nmeta, sizeof *h->meta, meta_by_key);
  for (size_t i = 1; i < h->nmeta; i++)
    if (meta_by_key(&h->meta[i - 1], &h->meta[i]) == 0) {
      snprintf(err, errlen, "duplicate __metadata__ key '%.200s'", h->meta[i].key);
      goto fail;
    }
  if (check_offsets(h, buflen, err, errlen)) goto fail;
  return 0;
fail:
  st_free(h);
  return -1;
}
