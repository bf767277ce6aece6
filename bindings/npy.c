/* .npy files (NumPy's format, NEP 1): gpu.load(path [, opts]) and
 * t:save(path [, opts]).
 *
 * A file is the magic "\x93NUMPY", a major and a minor version byte, the
 * header's length (uint16 little-endian in 1.0; uint32 in 2.0 and 3.0, whose
 * header is UTF-8), then the header: a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with
 * spaces and a '\n' so that the data starts aligned (64 bytes today, 16 for
 * older writers; any alignment is read), then the elements in C order.
 *
 * Loading to the device maps the elements' pages (bind_npy_map) and queues a
 * staged copy from the mapping on the stream, so the call returns before
 * the file is read; the device layer keeps the mapping until that copy is
 * done (elements not aligned to their size are copied as bytes).  What
 * cannot be mapped (bools, swapped elements, map = false) is read straight
 * into a pinned buffer (or the host
 * tensor asked for) and its copy queued the same way.  Every
 * size the header claims is checked against the file's before anything is
 * allocated.  Saving writes what numpy.save writes for the same array, byte
 * for byte, to a temporary file renamed over the path at the end. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tensor.h"
#include "npy.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_HEADER (1 << 20)    /* numpy's own limit is 10000 bytes */
#define NPY_ALIGN 64
#define NPY_GROWTH_DIGITS 21        /* numpy leaves room to rewrite the first size */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .npy reader and writer assume a little-endian host"
#endif

/* Our dtypes in .npy: the descr written, and its kind and size for reading.
 * bf16 has no numpy descr: ml_dtypes (and so JAX) save bfloat16 arrays as
 * '<V2', two opaque bytes, and that is what we write and read ('|V2' and
 * ml_dtypes' name 'bfloat16' are read too). */
static const struct npy_type {
  dev_dtype dt;
  char kind;
  int size;
  const char *descr;
} npy_types[] = {
  {DEV_F32, 'f', 4, "<f4"}, {DEV_F64, 'f', 8, "<f8"}, {DEV_F16, 'f', 2, "<f2"},
  {DEV_BF16, 'V', 2, "<V2"}, {DEV_I8, 'i', 1, "|i1"}, {DEV_U8, 'u', 1, "|u1"},
  {DEV_I32, 'i', 4, "<i4"}, {DEV_I64, 'i', 8, "<i8"}, {DEV_BOOL, 'b', 1, "|b1"},
};
#define NPY_NTYPES (sizeof npy_types / sizeof npy_types[0])


/* ---- the file handle: a userdata that closes the descriptor -------------- */

typedef struct npy_file { const bind_type *tag; int fd; } npy_file;

static int npy_file_close(lua_State *L) {
  npy_file *f = bind_check_type(L, 1, &bind_npy_file_type, sizeof *f);
  if (f->fd >= 0) {
    close(f->fd);
    f->fd = -1;
  }
  return 0;
}

static void os_error(char *err, size_t errlen, const char *what, const char *path, int e) {
  char buf[128];
  snprintf(err, errlen, "%s %s: %s", what, path, strerror_r(e, buf, sizeof buf));
}

/* Read n bytes at off; 0, or -1 with errno (0 at end of file). */
static int read_at(int fd, void *p, size_t n, off_t off) {
  char *c = p;
  while (n > 0) {
    ssize_t k = pread(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = 0;
      return -1;
    }
    c += k;
    n -= (size_t)k;
    off += k;
  }
  return 0;
}

/* ---- the header ----------------------------------------------------------- */

static void shape_repr(char *out, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(out, n, "(");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(out + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (k < n) snprintf(out + k, n - k, ndim == 1 ? ",)" : ")");
}

typedef struct parser {
  const char *p, *end, *start;
  char *err;
  size_t errlen;
} parser;

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int malformed(parser *ps, const char *what) {
  snprintf(ps->err, ps->errlen, "malformed header (%s at byte %d of the header)", what,
           (int)(ps->p - ps->start));
  return -1;
}

static int expect(parser *ps, char c) {
  skip_ws(ps);
  if (ps->p >= ps->end || *ps->p != c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return malformed(ps, what);
  }
  ps->p++;
  return 0;
}

/* A Python string literal without escapes ('...' or "..."), into out. */
static int parse_string(parser *ps, char *out, size_t n) {
  skip_ws(ps);
  if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"')) return malformed(ps, "expected a string");
  char q = *ps->p++;
  size_t k = 0;
  while (ps->p < ps->end && *ps->p != q) {
    if (*ps->p == '\\' || *ps->p == '\n') return malformed(ps, "unsupported string");
    /* '<f4\0junk' is not '<f4' */
    if (*ps->p == 0) return malformed(ps, "a zero byte in a string");
    if (k + 1 >= n) return malformed(ps, "string too long");
    out[k++] = *ps->p++;
  }
  if (ps->p >= ps->end) return malformed(ps, "unterminated string");
  ps->p++;
  out[k] = 0;
  return 0;
}

static int parse_bool(parser *ps, int *out) {
  skip_ws(ps);
  size_t left = (size_t)(ps->end - ps->p);
  if (left >= 4 && memcmp(ps->p, "True", 4) == 0) { *out = 1; ps->p += 4; return 0; }
  if (left >= 5 && memcmp(ps->p, "False", 5) == 0) { *out = 0; ps->p += 5; return 0; }
  return malformed(ps, "expected True or False");
}

/* (d0, d1, ...) with an optional trailing comma; Python 2's 3L sizes too. */
static int parse_shape(parser *ps, npy_header *h) {
  if (expect(ps, '(')) return -1;
  h->ndim = 0;
  for (;;) {
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ')') { ps->p++; return 0; }
    if (ps->p < ps->end && *ps->p == '-') return malformed(ps, "negative size in the shape");
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return malformed(ps, "expected a size in the shape");
    int64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *ps->p - '0', &v))
        return malformed(ps, "a size in the shape overflows");
      ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'L' || *ps->p == 'l')) ps->p++;
    if (h->ndim == DEV_MAXDIM) {
      snprintf(ps->err, ps->errlen, "the shape has more than %d dims (gpulua tensors have at most %d)",
               DEV_MAXDIM, DEV_MAXDIM);
      return -1;
    }
    h->shape[h->ndim++] = v;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
    if (ps->p < ps->end && *ps->p == ')') { ps->p++; return 0; }
    return malformed(ps, "expected ',' or ')' in the shape");
  }
}

/* descr -> our dtype; '=' and '|' and no order mean native (little endian). */
static int descr_dtype(npy_header *h, char *err, size_t errlen) {
  const char *d = h->descr;
  if (strcmp(d, "bfloat16") == 0) {
    h->dt = DEV_BF16;
    return 0;
  }
  char order = (*d == '<' || *d == '>' || *d == '|' || *d == '=') ? *d++ : '=';
  char kind = *d ? *d++ : 0;
  char *end;
  long size = strtol(d, &end, 10);
  int digits_only = *d >= '0' && *d <= '9' && *end == 0;
  for (size_t i = 0; digits_only && i < NPY_NTYPES; i++) {
    if (npy_types[i].kind == kind && npy_types[i].size == size) {
      h->dt = npy_types[i].dt;
      h->swap = order == '>' && size > 1 && kind != 'V';
      return 0;
    }
  }
  snprintf(err, errlen, "unsupported dtype '%s' (gpulua reads <f4 <f8 <f2 <V2 (bf16) |i1 |u1 <i4 <i8 |b1, "
           "either byte order)", h->descr);
  return -1;
}

static int parse_header(const char *text, size_t len, npy_header *h, char *err, size_t errlen) {
  parser ps = {text, text + len, text, err, errlen};
  int have_descr = 0, have_fortran = 0, have_shape = 0;
  if (expect(&ps, '{')) return -1;
  for (;;) {
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == '}') { ps.p++; break; }
    char key[32];
    if (parse_string(&ps, key, sizeof key) || expect(&ps, ':')) return -1;
    skip_ws(&ps);
    if (strcmp(key, "descr") == 0 && !have_descr) {
      have_descr = 1;
      if (ps.p < ps.end && (*ps.p == '[' || *ps.p == '(')) {
        snprintf(err, errlen, "unsupported dtype (a structured or subarray dtype: %s)",
                 *ps.p == '[' ? "a list of fields" : "a tuple");
        return -1;
      }
      if (parse_string(&ps, h->descr, sizeof h->descr)) return -1;
    } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
      have_fortran = 1;
      if (parse_bool(&ps, &h->fortran)) return -1;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      have_shape = 1;
      if (parse_shape(&ps, h)) return -1;
    } else {
      snprintf(err, errlen, "malformed header (%s key '%s')",
               strcmp(key, "descr") && strcmp(key, "fortran_order") && strcmp(key, "shape") ? "unexpected"
                                                                                           : "repeated",
               key);
      return -1;
    }
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == ',') { ps.p++; continue; }
    if (ps.p < ps.end && *ps.p == '}') { ps.p++; break; }
    return malformed(&ps, "expected ',' or '}'");
  }
  skip_ws(&ps);
  if (ps.p != ps.end) return malformed(&ps, "text after the dict");
  if (!have_descr || !have_fortran || !have_shape) {
    snprintf(err, errlen, "malformed header (no '%s' key)", !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    return -1;
  }
  if (descr_dtype(h, err, errlen)) return -1;
  if (h->fortran) {
    snprintf(err, errlen, "Fortran-order data (fortran_order: True) is not supported: save it in C order "
             "(numpy.ascontiguousarray) first");
    return -1;
  }
  char sh[DEV_MAXDIM * 24 + 8];
  shape_repr(sh, sizeof sh, h->ndim, h->shape);
  int64_t n = 1, empty = 0;
  for (int d = 0; d < h->ndim; d++) {
    /* a zero-sized dim is an empty tensor; the other sizes are still bounded */
    if (h->shape[d] == 0) {
      empty = 1;
      continue;
    }
    if (__builtin_mul_overflow(n, h->shape[d], &n) || n > ((int64_t)1 << 56)) {
      snprintf(err, errlen, "shape %s is too large", sh);
      return -1;
    }
  }
  h->nbytes = empty ? 0 : (size_t)n * dev_dtype_size(h->dt);
  return 0;
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "a special file";
}

/* Reads and checks the preamble and header of a file of size bytes read
 * through rd; sizes are checked against the file's before anything they
 * give is allocated.  Lua-free: the .npz reader (formats.c) reads members
 * of a zip through it. */
int npy_read_header(npy_read_fn rd, void *ctx, uint64_t size, npy_header *h, char *err, size_t errlen) {
  unsigned char pre[12];
  size_t n = size < sizeof pre ? (size_t)size : sizeof pre;
  if (rd(ctx, pre, n, 0) != 0) {
    snprintf(err, errlen, "read failed: %s", errno ? strerror_r(errno, (char[128]){0}, 128) : "unexpected end of file");
    return -1;
  }
  if (n >= 4 && memcmp(pre, "PK\3\4", 4) == 0) {
    snprintf(err, errlen, "not a .npy file (it is a zip archive: for .npz files, gpu.load_npz)");
    return -1;
  }
  if (memcmp(pre, NPY_MAGIC, n < NPY_MAGIC_LEN ? n : NPY_MAGIC_LEN) != 0 || n == 0) {
    snprintf(err, errlen, "not a .npy file (bad magic: it does not start with \\x93NUMPY)");
    return -1;
  }
  if (n < NPY_MAGIC_LEN + 2) {
    snprintf(err, errlen, "truncated (%d bytes: no room for the format version)", (int)n);
    return -1;
  }
  h->major = pre[6];
  h->minor = pre[7];
  if (h->major < 1 || h->major > 3 || h->minor != 0) {
    snprintf(err, errlen, "unsupported .npy format version %d.%d (gpulua reads 1.0, 2.0 and 3.0)", h->major,
             h->minor);
    return -1;
  }
  size_t lenbytes = h->major == 1 ? 2 : 4, prefix = NPY_MAGIC_LEN + 2 + lenbytes;
  if (n < prefix) {
    snprintf(err, errlen, "truncated (%d bytes: no room for the header length)", (int)n);
    return -1;
  }
  uint64_t hlen = h->major == 1 ? (uint64_t)pre[8] | (uint64_t)pre[9] << 8
                                : (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 |
                                      (uint64_t)pre[11] << 24;
  if (hlen > size - prefix) {
    snprintf(err, errlen, "truncated header (the header length says %llu bytes, the file has %llu after the "
             "preamble)", (unsigned long long)hlen, (unsigned long long)(size - prefix));
    return -1;
  }
  if (hlen > NPY_MAX_HEADER) {
    snprintf(err, errlen, "header of %llu bytes is too large (at most %d)", (unsigned long long)hlen, NPY_MAX_HEADER);
    return -1;
  }
  char *text = malloc((size_t)hlen + 1);
  if (!text) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (rd(ctx, text, (size_t)hlen, prefix) != 0) {
    snprintf(err, errlen, "read failed: %s", errno ? strerror_r(errno, (char[128]){0}, 128) : "unexpected end of file");
    free(text);
    return -1;
  }
  text[hlen] = 0;
  int rc = parse_header(text, (size_t)hlen, h, err, errlen);
  free(text);
  if (rc) return -1;
  h->data_offset = prefix + (size_t)hlen;
  uint64_t have = size - h->data_offset;
  if (have != h->nbytes) {
    char sh[DEV_MAXDIM * 24 + 8];
    shape_repr(sh, sizeof sh, h->ndim, h->shape);
    snprintf(err, errlen, "%s: shape %s of '%s' needs %llu bytes of data, the file has %llu%s",
             have < h->nbytes ? "truncated data" : "the header does not match the file's size", sh, h->descr,
             (unsigned long long)h->nbytes, (unsigned long long)have,
             have < h->nbytes ? "" : " (trailing bytes)");
    return -1;
  }
  return 0;
}

static int fd_read(void *ctx, void *p, size_t n, uint64_t off) { return read_at(*(int *)ctx, p, n, (off_t)off); }

/* npy_read_header on an open file, checked to be a regular file first. */
static int read_header(lua_State *L, int fd, npy_header *h, char *err, size_t errlen) {
  (void)L;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "cannot stat the file: %s", strerror_r(errno, (char[128]){0}, 128));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "not a regular file (%s)", file_kind(st.st_mode));
    return -1;
  }
  /* opened O_NONBLOCK so that a FIFO could not block the open; a regular file reads as usual */
  int fl = fcntl(fd, F_GETFL);
  if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return npy_read_header(fd_read, &fd, (uint64_t)st.st_size, h, err, errlen);
}

/* tests/fuzz/npy_header.c includes this file for the reader above alone. */
#ifndef GPULUA_NPY_HEADER_ONLY

/* ---- gpu.load ------------------------------------------------------------- */

/* A new tensor in released state, then its memory (push, then acquire). */
static gpu_tensor *push_tensor(lua_State *L, dev_memkind kind, const npy_header *h) {
  gpu_tensor *t = bind_push_tensor_handle(L);
  dev_buf *b = bind_alloc(L, kind, h->nbytes, 0, "load");
  t->v.dtype = h->dt;
  dev_view_set_contiguous(&t->v, h->ndim, h->shape);
  t->v.buf = b;
  return t;
}

static void drop(lua_State *L, int idx) {
  gpu_tensor *t = bind_test_tensor_handle(L, idx);
  if (t && t->v.buf) {
    dev_buf *b = t->v.buf;
    t->v.buf = NULL;
    dev_buf_release(b);
  }
}

void npy_fix_elements(const npy_header *h, void *p) {
  size_t esz = dev_dtype_size(h->dt), n = h->nbytes / esz;
  unsigned char *c = p;
  if (h->swap) {
    for (size_t i = 0; i < n; i++, c += esz)
      for (size_t a = 0, b = esz - 1; a < b; a++, b--) {
        unsigned char x = c[a];
        c[a] = c[b];
        c[b] = x;
      }
  } else if (h->dt == DEV_BOOL) {
    /* numpy's bools are 0/1; any other byte means true */
    for (size_t i = 0; i < n; i++) c[i] = c[i] != 0;
  }
}

/* ---- mapped loads ----------------------------------------------------------- */

/* A mapping of a file's pages, unmapped by the device layer's release once
 * the last copy reading it is done (dev_buf_wrap). */
typedef struct file_map { void *base; size_t len; } file_map;

static void unmap_release(void *ud, void *ptr) {
  (void)ptr;
  file_map *m = ud;
  munmap(m->base, m->len);
  free(m);
}

/* A device tensor of h's elements at h->data_offset of the regular file fd,
 * pushed: the pages holding them mapped (read-only, private) and wrapped as
 * guarded pageable memory, so the copy is staged and queued on the stream
 * and the call returns before it has read a byte; the mapping goes when the
 * copy is done.  Only those pages are mapped, so a selection reads nothing
 * else.  Elements not aligned to their size in the file (an .npz member's,
 * as numpy.savez places them) are copied as bytes.  0 (nothing pushed) when
 * mapping is not possible: no elements, a file not as large as the header
 * said any more, mmap refused; the caller then reads them. */
int bind_npy_map(lua_State *L, int fd, const npy_header *h, int stream, const char *fname) {
  struct stat st;
  if (h->nbytes == 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  uint64_t end = (uint64_t)h->data_offset + h->nbytes;
  if (end < h->nbytes || end > (uint64_t)st.st_size) return 0;   /* the pread path reports it */
  long pg = sysconf(_SC_PAGESIZE);
  uint64_t first = (uint64_t)h->data_offset / (uint64_t)pg * (uint64_t)pg;
  size_t len = (size_t)(end - first);
  /* the device tensor first: out of device memory fails before the mapping */
  push_tensor(L, DEV_MEM_DEVICE, h);
  int dst = lua_gettop(L);
  /* everything that may raise or run Lua comes before the mapping */
  dev_ctx *ctx = bind_ctx(L);
  bind_call_site(L, ctx, fname);
  dev_stream *s = bind_stream(L, stream);
  gpu_tensor *t = bind_check_tensor(L, dst);
  file_map *m = malloc(sizeof *m);
  void *base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, (off_t)first);
  if (!m || base == MAP_FAILED) {
    free(m);
    if (base != MAP_FAILED) munmap(base, len);
    drop(L, dst);
    lua_pop(L, 1);
    return 0;
  }
  m->base = base;
  m->len = len;
  /* read ahead in order: the staging threads read it front to back */
  madvise(base, len, MADV_SEQUENTIAL);
  dev_buf *b = NULL;
  char *p = (char *)base + (h->data_offset - first);
  if (dev_buf_wrap(ctx, DEV_MEM_HOST, p, h->nbytes, unmap_release, m, &b) != DEV_OK) {
    unmap_release(m, p);
    bind_raise(L, ctx, fname);
  }
  /* its copies are staged and asynchronous: nothing else touches the pages */
  dev_buf_guard(b);
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1, .out = t->v};
  op.in[0] = t->v;
  op.in[0].buf = b;
  op.in[0].offset = 0;
  /* views must be aligned to their element size; bytes always are */
  if (h->data_offset % dev_dtype_size(h->dt)) {
    int64_t n = (int64_t)h->nbytes;
    op.out.dtype = op.in[0].dtype = DEV_U8;
    dev_view_set_contiguous(&op.out, 1, &n);
    dev_view_set_contiguous(&op.in[0], 1, &n);
  }
  int rc = dev_submit(ctx, s, &op);
  /* the queued copy holds the buffer now: the mapping lives until it is done */
  dev_buf_release(b);
  if (rc != DEV_OK) bind_raise(L, ctx, fname);
  return 1;
}

/* Reads h's elements at h->data_offset through rd into a new tensor of kind
 * pushed on the stack: device memory through a pinned staging buffer and a
 * copy queued on the stream at slot stream, the other kinds directly.
 * fname and path name the error. */
void bind_npy_load(lua_State *L, npy_read_fn rd, void *rctx, const npy_header *h, dev_memkind kind, int stream,
                   const char *fname, const char *path) {
  char err[512];
  /* a file's elements as they are on disk go to the device mapped; bools
   * (any nonzero byte is true) and swapped elements are fixed up on the host */
  if (rd == fd_read && kind == DEV_MEM_DEVICE && !h->nomap && !h->swap && h->dt != DEV_BOOL &&
      bind_npy_map(L, *(int *)rctx, h, stream, fname))
    return;
  /* the device tensor first: out of device memory fails before the read */
  int dst = 0;
  if (kind == DEV_MEM_DEVICE) {
    push_tensor(L, DEV_MEM_DEVICE, h);
    dst = lua_gettop(L);
  }
  gpu_tensor *stage = push_tensor(L, kind == DEV_MEM_HOST ? DEV_MEM_HOST : DEV_MEM_PINNED, h);
  int sidx = lua_gettop(L);
  if (h->nbytes && rd(rctx, stage->v.buf->ptr, h->nbytes, h->data_offset) != 0) {
    snprintf(err, sizeof err, "read failed: %s", errno ? strerror_r(errno, (char[128]){0}, 128)
                                                      : "unexpected end of file (the file shrank)");
    /* the memory goes now, not at the next collection */
    drop(L, sidx);
    if (dst) drop(L, dst);
    luaL_error(L, "%s: %s: %s", fname, path, err);
  }
  npy_fix_elements(h, stage->v.buf->ptr);
  if (!dst) return;

  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_stream(L, stream);
  gpu_tensor *t = bind_check_tensor(L, dst);
  stage = bind_check_tensor(L, sidx);
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1, .out = t->v};
  op.in[0] = stage->v;
  bind_call_site(L, ctx, fname);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, &op), fname);
  /* the staging buffer goes back to the pool once the copy has read it */
  drop(L, sidx);
  lua_settop(L, dst);
}

void bind_load_elements(lua_State *L, int fd, uint64_t off, dev_dtype dt, int ndim, const int64_t *shape,
                        dev_memkind kind, int stream, int map, const char *fname, const char *path) {
  npy_header h;
  memset(&h, 0, sizeof h);
  h.nomap = !map;
  h.dt = dt;
  h.ndim = ndim;
  int empty = 0;
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    h.shape[d] = shape[d];
    empty |= shape[d] == 0;
    n *= (size_t)(shape[d] ? shape[d] : 1);   /* the caller checked the size against the file's */
  }
  h.nbytes = empty ? 0 : n * dev_dtype_size(dt);
  h.data_offset = (size_t)off;
  bind_npy_load(L, fd_read, &fd, &h, kind, stream, fname, path);
}

int bind_open_read(lua_State *L, const char *path, const char *fname) {
  npy_file *f = bind_new_udata(L, &bind_npy_file_type, sizeof *f, 0);
  f->fd = -1;
  lua_toclose(L, lua_gettop(L));   /* closed on return and on every error */
  /* O_NONBLOCK: opening a FIFO must not wait for a writer */
  f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  char err[512];
  if (f->fd < 0) {
    os_error(err, sizeof err, "cannot open", path, errno);
    luaL_error(L, "%s: %s", fname, err);
  }
  struct stat st;
  if (fstat(f->fd, &st) != 0) {
    os_error(err, sizeof err, "cannot stat", path, errno);
    luaL_error(L, "%s: %s", fname, err);
  }
  if (!S_ISREG(st.st_mode)) luaL_error(L, "%s: %s: not a regular file (%s)", fname, path, file_kind(st.st_mode));
  int fl = fcntl(f->fd, F_GETFL);
  if (fl != -1) fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK);
  return f->fd;
}

int bind_read_at(int fd, void *p, size_t n, uint64_t off) { return read_at(fd, p, n, (off_t)off); }

int bind_opt_map(lua_State *L, int idx, const char *fname) {
  if (lua_isnil(L, idx)) return 1;
  if (!lua_isboolean(L, idx))
    luaL_error(L, "bad option 'map' to '%s' (boolean expected, got %s)", fname, luaL_typename(L, idx));
  return lua_toboolean(L, idx);
}

/* gpu.load(path [, {device = "device"|"pinned"|"host", stream = s, map = true}]) */
static int gpu_load(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 1, "the path contains a zero byte");
  static const char *const names[] = {"device", "stream", "map", NULL};
  int o = bind_read_opts(L, 2, names), stream = o + 1;
  dev_memkind kind = bind_check_device(L, o, DEV_MEM_DEVICE);
  int map = bind_opt_map(L, o + 2, "load");
  bind_stream(L, stream);   /* a bad stream raises before the file is read */

  npy_file *f = bind_new_udata(L, &bind_npy_file_type, sizeof *f, 0);
  f->fd = -1;
  int fslot = lua_gettop(L);
  lua_toclose(L, fslot);   /* closed on return and on every error */
  /* O_NONBLOCK: opening a FIFO must not wait for a writer (read_header refuses it) */
  f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  char err[512];
  if (f->fd < 0) {
    os_error(err, sizeof err, "cannot open", path, errno);
    return luaL_error(L, "load: %s", err);
  }
  npy_header h;
  memset(&h, 0, sizeof h);
  if (read_header(L, f->fd, &h, err, sizeof err)) return luaL_error(L, "load: %s: %s", path, err);
  h.nomap = !map;
  bind_npy_load(L, fd_read, &f->fd, &h, kind, stream, "load", path);
  return 1;
}

/* ---- t:save --------------------------------------------------------------- */

/* numpy.save's header for a C-order array: the dict with sorted keys, room
 * for the first size to grow to 21 digits, spaces and '\n' to align the data
 * to 64 bytes.  Returns its length (the preamble included). */
size_t bind_npy_make_header(const dev_view *v, char *out) {
  const char *descr = "?";
  for (size_t i = 0; i < NPY_NTYPES; i++)
    if (npy_types[i].dt == v->dtype) descr = npy_types[i].descr;
  char sh[DEV_MAXDIM * 24 + 8];
  shape_repr(sh, sizeof sh, v->ndim, v->shape);
  char text[512];
  int k = snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, sh);
  if (v->ndim > 0) {
    char first[24];
    int grow = NPY_GROWTH_DIGITS - snprintf(first, sizeof first, "%lld", (long long)v->shape[0]);
    k += snprintf(text + k, sizeof text - (size_t)k, "%*s", grow > 0 ? grow : 0, "");
  }
  /* version 1.0: the header here is always far below 65535 bytes */
  size_t hlen = (size_t)k + 1, pre = NPY_MAGIC_LEN + 2 + 2;
  size_t pad = NPY_ALIGN - (pre + hlen) % NPY_ALIGN, total = hlen + pad;
  memcpy(out, NPY_MAGIC, NPY_MAGIC_LEN);
  out[6] = 1;
  out[7] = 0;
  out[8] = (char)(total & 0xff);
  out[9] = (char)(total >> 8);
  memcpy(out + pre, text, (size_t)k);
  memset(out + pre + k, ' ', pad);
  out[pre + total - 1] = '\n';
  return pre + total;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t k = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Write the pieces to a new file beside path, then rename it over path: a
 * failed save leaves path as it was.  0, or -1 with a message.  The other
 * file formats (formats.c) write through it too. */
int bind_write_file(const char *path, const bind_piece *pc, int npc, char *err, size_t errlen) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 48);
  if (!tmp) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int fd = -1, e = 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  for (int i = 0; i < 16 && fd < 0; i++) {
    unsigned long nonce = (unsigned long)ts.tv_nsec ^ ((unsigned long)(uintptr_t)pc >> 4) ^ (unsigned long)i * 7919u;
    snprintf(tmp, plen + 48, "%s.%ld.%lx.tmp", path, (long)getpid(), nonce);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    os_error(err, errlen, "cannot write", path, errno);
    free(tmp);
    return -1;
  }
  for (int i = 0; i < npc && !e; i++)
    if (write_all(fd, pc[i].p, pc[i].n)) e = errno;
  if (!e && fsync(fd)) e = errno;
  if (close(fd) && !e) e = errno;
  if (!e && rename(tmp, path)) e = errno;
  if (e) {
    unlink(tmp);
    os_error(err, errlen, "cannot write", path, e);
  }
  free(tmp);
  return e ? -1 : 0;
}

/* t:save(path [, {stream = s}]) --> t, one of the tensor's methods */
int bind_tensor_save(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  size_t plen;
  const char *path = luaL_checklstring(L, 2, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 2, "the path contains a zero byte");
  int stream = bind_read_stream_opt(L, 3);
  dev_ctx *ctx = bind_ctx(L);
  size_t nbytes = (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype);
  const void *data;
  if (t->v.buf->kind != DEV_MEM_DEVICE && dev_view_contiguous(&t->v)) {
    /* written from where it lies, once queued writers are done */
    bind_call_site(L, ctx, "save");
    BIND_CHECK(L, ctx, dev_buf_fence(t->v.buf, 0), "save");
    data = dev_view_ptr(&t->v);
  } else {
    /* C order on the host: a counted sync, as t:totable */
    void *p = lua_newuserdatauv(L, nbytes, 0);
    dev_stream *s = bind_stream(L, stream);
    t = bind_check_tensor(L, 1);
    bind_call_site(L, ctx, "save");
    BIND_CHECK(L, ctx, dev_read(ctx, s, &t->v, p), "save");
    data = p;
  }
  char hdr[1024], err[512];
  size_t hlen = bind_npy_make_header(&t->v, hdr);
  bind_piece pc[2] = {{hdr, hlen}, {data, nbytes}};
  if (bind_write_file(path, pc, 2, err, sizeof err)) return luaL_error(L, "save: %s", err);
  lua_settop(L, 1);
  return 1;
}

/* ---- registration ----------------------------------------------------------- */

static const luaL_Reg funcs[] = {
  {"load", gpu_load},
  {NULL, NULL}
};

static const luaL_Reg npy_file_meta[] = {
  {"__close", npy_file_close},
  {"__gc", npy_file_close},
  {NULL, NULL}
};

int bind_open_npy(lua_State *L) {
  bind_newtype(L, &bind_npy_file_type, npy_file_meta, NULL);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}

#endif /* GPULUA_NPY_HEADER_ONLY */
