/* Tensor files beside .npy (npy.c): safetensors, Hugging Face's format.
 *
 *   gpu.load_safetensors(path [, {names =, device =, stream =, map =}]) --> tensors, metadata
 *   gpu.save_safetensors(path, tensors [, {metadata =, stream =}])
 *
 * The header is read and checked whole (safetensors.c, Lua-free) before
 * anything is allocated; then each tensor asked for is loaded from its
 * place in the file alone, as gpu.load loads a .npy file's elements: to the
 * device, its pages mapped and the staged copy queued on the stream (the
 * call returns before it reads them); else read into pinned (or host)
 * memory.  Saving writes what
 * the safetensors package writes: the header padded with spaces to a
 * multiple of 8 bytes, the tensors' bytes in the header's order. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tensor.h"   /* first: npy.h declares its Lua half after lua.h */
#include "npy.h"
#include "safetensors.h"
#include "zip.h"

/* ---- the parsed header: a userdata that frees it --------------------------- */

typedef struct inflater inflater;
typedef struct shared_fd shared_fd;
static void inflater_close(void *ud);
static void shared_fd_release(shared_fd *d);

/* pending: a deflated member's inflater until the device layer takes it;
 * dfd: the descriptor the inflaters of one load share */
typedef struct st_handle {
  const bind_type *tag;
  st_header h;
  zip_archive z;
  inflater *pending;
  shared_fd *dfd;
} st_handle;

static int st_handle_close(lua_State *L) {
  st_handle *u = bind_check_type(L, 1, &bind_st_header_type, sizeof *u);
  st_free(&u->h);
  zip_free(&u->z);
  if (u->pending) inflater_close(u->pending);
  u->pending = NULL;
  if (u->dfd) shared_fd_release(u->dfd);
  u->dfd = NULL;
  return 0;
}

static st_handle *push_handle(lua_State *L) {
  st_handle *u = bind_new_udata(L, &bind_st_header_type, sizeof *u, 0);
  memset(&u->h, 0, sizeof u->h);
  memset(&u->z, 0, sizeof u->z);
  u->pending = NULL;
  u->dfd = NULL;
  lua_toclose(L, lua_gettop(L));
  return u;
}

/* The entry named by the string at idx, or NULL (the entries are sorted). */
static const st_entry *find_entry(const st_header *h, const char *name, size_t n) {
  size_t lo = 0, hi = h->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const st_entry *e = &h->t[mid];
    size_t m = e->namelen < n ? e->namelen : n;
    int r = memcmp(e->name, name, m);
    if (!r) r = (e->namelen > n) - (e->namelen < n);
    if (!r) return e;
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

static void push_names(lua_State *L, const st_header *h) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t i = 0; i < h->n && i < 8; i++) {
    if (i) luaL_addstring(&b, ", ");
    luaL_addchar(&b, '\'');
    luaL_addlstring(&b, h->t[i].name, h->t[i].namelen);
    luaL_addchar(&b, '\'');
  }
  if (h->n > 8) lua_pushfstring(L, ", ... (%d in all)", (int)h->n), luaL_addvalue(&b);
  if (h->n == 0) luaL_addstring(&b, "none");
  luaL_pushresult(&b);
}

static void load_entry(lua_State *L, int fd, uint64_t base, const st_entry *e, dev_memkind kind, int stream,
                       int map, const char *path, int out) {
  bind_load_elements(L, fd, base + e->begin, e->dt, e->ndim, e->shape, kind, stream, map, "load_safetensors", path);
  lua_pushlstring(L, e->name, e->namelen);
  lua_insert(L, -2);
  lua_rawset(L, out);
}

/* gpu.load_safetensors(path [, {names = {...}, device =, stream =, map =}]) */
static int gpu_load_safetensors(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 1, "the path contains a zero byte");
  static const char *const names[] = {"names", "device", "stream", "map", NULL};
  int o = bind_read_opts(L, 2, names), sel = o, stream = o + 2;
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  int map = bind_opt_map(L, o + 3, "load_safetensors");
  bind_stream(L, stream);   /* a bad stream raises before the file is read */
  if (!lua_isnil(L, sel)) {
    if (!lua_istable(L, sel)) luaL_error(L, "bad option 'names' (a table of tensor names expected, got %s)",
                                         luaL_typename(L, sel));
    for (lua_Integer i = 1, n = luaL_len(L, sel); i <= n; i++)
      if (lua_rawgeti(L, sel, i) != LUA_TSTRING)
        luaL_error(L, "bad option 'names' (item %d is a %s, not a tensor name)", (int)i, luaL_typename(L, -1));
      else lua_pop(L, 1);
  }

  int fd = bind_open_read(L, path, "load_safetensors");
  struct stat st;
  if (fstat(fd, &st) != 0) return luaL_error(L, "load_safetensors: %s: cannot stat the file", path);
  uint64_t size = (uint64_t)st.st_size, hlen;
  unsigned char first[8];
  char err[512];
  if (size >= 8 && bind_read_at(fd, first, 8, 0) != 0)
    return luaL_error(L, "load_safetensors: %s: read failed", path);
  if (st_header_len(first, size, &hlen, err, sizeof err))
    return luaL_error(L, "load_safetensors: %s: %s", path, err);
  char *text = lua_newuserdatauv(L, (size_t)hlen, 0);
  if (bind_read_at(fd, text, (size_t)hlen, 8) != 0)
    return luaL_error(L, "load_safetensors: %s: read failed (the file shrank?)", path);
  st_handle *u = push_handle(L);
  if (st_parse(text, (size_t)hlen, size - 8 - hlen, &u->h, err, sizeof err))
    return luaL_error(L, "load_safetensors: %s: %s", path, err);
  const st_header *h = &u->h;
  uint64_t base = 8 + hlen;

  lua_createtable(L, 0, (int)(h->n < 1024 ? h->n : 1024));
  int out = lua_gettop(L);
  if (lua_isnil(L, sel)) {
    for (size_t i = 0; i < h->n; i++) load_entry(L, fd, base, &h->t[i], kind, stream, map, path, out);
  } else {
    /* every name is checked before any tensor is read */
    for (lua_Integer pass = 0; pass < 2; pass++)
      for (lua_Integer i = 1, n = luaL_len(L, sel); i <= n; i++) {
        size_t kn;
        lua_rawgeti(L, sel, i);
        const char *k = lua_tolstring(L, -1, &kn);
        const st_entry *e = find_entry(h, k, kn);
        if (!e) {
          push_names(L, h);
          return luaL_error(L, "load_safetensors: %s: no tensor '%s' in the file (it has %s)", path, k,
                            lua_tostring(L, -1));
        }
        lua_pop(L, 1);
        if (pass) load_entry(L, fd, base, e, kind, stream, map, path, out);
      }
  }
  lua_createtable(L, 0, (int)(h->nmeta < 1024 ? h->nmeta : 1024));
  for (size_t i = 0; i < h->nmeta; i++) {
    lua_pushlstring(L, h->meta[i].key, h->meta[i].klen);
    lua_pushlstring(L, h->meta[i].val, h->meta[i].vlen);
    lua_rawset(L, -3);
  }
  return 2;
}

/* ---- gpu.save_safetensors ------------------------------------------------------ */

static void add_json_string(luaL_Buffer *b, const char *s, size_t n) {
  luaL_addchar(b, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      luaL_addchar(b, '\\');
      luaL_addchar(b, (char)c);
    } else if (c < 0x20) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", c);
      luaL_addstring(b, esc);
    } else {
      luaL_addchar(b, (char)c);
    }
  }
  luaL_addchar(b, '"');
}

/* Pushes Lua's own lib.fn (table.sort, utf8.len ...), from the loaded
 * libraries, not the globals: a script may have replaced `table`. */
static void push_libfn(lua_State *L, const char *lib, const char *fn) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getfield(L, -1, lib);
  lua_getfield(L, -1, fn);
  lua_replace(L, -3);
  lua_pop(L, 1);
}

/* Sorts the sequence at idx of strings in place (table.sort). */
static void sort_list(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  push_libfn(L, "table", "sort");
  lua_pushvalue(L, idx);
  lua_call(L, 1, 0);
}

/* The names of the table at idx, checked and sorted, in a new sequence. */
static int sorted_names(lua_State *L, int idx, const char *fname) {
  lua_newtable(L);
  int names = lua_gettop(L), n = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_error(L, "%s: bad tensors table (a %s key; tensors are named by strings)", fname, luaL_typename(L, -2));
    if (!bind_test_tensor(L, -1))
      luaL_error(L, "%s: bad tensors table (tensor '%s' is a %s)", fname, lua_tostring(L, -2), luaL_typename(L, -1));
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, names, ++n);
  }
  sort_list(L, names);
  return names;
}

static void check_utf8(lua_State *L, int idx, const char *what, const char *fname) {
  idx = lua_absindex(L, idx);
  const char *s = lua_tostring(L, idx);
  push_libfn(L, "utf8", "len");
  lua_pushvalue(L, idx);
  lua_call(L, 1, 1);
  if (lua_isnil(L, -1)) luaL_error(L, "%s: %s '%s' is not valid UTF-8 (JSON text is UTF-8)", fname, what, s);
  lua_pop(L, 1);
}

/* Pushes '"__metadata__":{...}' for the table at meta, keys sorted so that
 * the same table gives the same file. */
static void push_meta_json(lua_State *L, int meta, const char *fname) {
  if (!lua_istable(L, meta))
    luaL_error(L, "%s: bad option 'metadata' (a table of strings expected, got %s)", fname, luaL_typename(L, meta));
  lua_newtable(L);
  int mk = lua_gettop(L), nk = 0;
  lua_pushnil(L);
  while (lua_next(L, meta)) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "%s: bad option 'metadata' (a %s = %s entry; keys and values must be strings)", fname,
                 luaL_typename(L, -2), luaL_typename(L, -1));
    check_utf8(L, -2, "metadata key", fname);
    check_utf8(L, -1, "metadata value", fname);
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, mk, ++nk);
  }
  sort_list(L, mk);
  luaL_Buffer mb;
  luaL_buffinit(L, &mb);
  luaL_addstring(&mb, "\"__metadata__\":{");
  for (int i = 1; i <= nk; i++) {
    size_t kn, vn;
    lua_rawgeti(L, mk, i);
    const char *k = lua_tolstring(L, -1, &kn);
    lua_pushvalue(L, -1);
    lua_rawget(L, meta);
    const char *v = lua_tolstring(L, -1, &vn);
    lua_pop(L, 2);   /* both still anchored: in mk and in meta */
    if (i > 1) luaL_addchar(&mb, ',');
    add_json_string(&mb, k, kn);
    luaL_addchar(&mb, ':');
    add_json_string(&mb, v, vn);
  }
  luaL_addchar(&mb, '}');
  luaL_pushresult(&mb);
  lua_remove(L, mk);
}

/* The i-th tensor (by sorted name): its bytes in C order on the host into
 * datas[i] (a counted sync, as t:save), its header entry pushed.  *at: the
 * offset in the buffer, advanced. */
static void tensor_entry(lua_State *L, int names, int i, int datas, int stream, uint64_t *at, const char *fname) {
  size_t kn;
  lua_rawgeti(L, names, i);
  const char *k = lua_tolstring(L, -1, &kn);
  check_utf8(L, -1, "tensor name", fname);
  if (kn == 12 && memcmp(k, "__metadata__", 12) == 0)
    luaL_error(L, "%s: a tensor cannot be named '__metadata__' (the format keeps that key)", fname);
  lua_pushvalue(L, -1);
  lua_rawget(L, 2);
  gpu_tensor *t = bind_check_tensor(L, -1);
  const char *dn = st_dtype_name(t->v.dtype);
  size_t nbytes = (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype);
  char sh[DEV_MAXDIM * 24 + 96];
  size_t sk = (size_t)snprintf(sh, sizeof sh, ":{\"dtype\":\"%s\",\"shape\":[", dn ? dn : "?");
  for (int d = 0; d < t->v.ndim; d++)
    sk += (size_t)snprintf(sh + sk, sizeof sh - sk, d ? ",%lld" : "%lld", (long long)t->v.shape[d]);
  snprintf(sh + sk, sizeof sh - sk, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)*at,
           (unsigned long long)(*at + nbytes));
  *at += nbytes;
  void *p = lua_newuserdatauv(L, nbytes ? nbytes : 1, 0);
  t = bind_check_tensor(L, -2);
  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_stream(L, stream);
  bind_call_site(L, ctx, fname);
  if (nbytes) BIND_CHECK(L, ctx, dev_read(ctx, s, &t->v, p), fname);
  lua_rawseti(L, datas, i);
  lua_pop(L, 1);   /* the tensor: the name stays */
  luaL_Buffer kb;
  luaL_buffinit(L, &kb);
  add_json_string(&kb, k, kn);
  luaL_addstring(&kb, sh);
  luaL_pushresult(&kb);
  lua_remove(L, -2);
}

/* gpu.save_safetensors(path, tensors [, {metadata = {k = v}, stream = s}]) */
static int gpu_save_safetensors(lua_State *L) {
  static const char *const fname = "save_safetensors";
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 1, "the path contains a zero byte");
  luaL_checktype(L, 2, LUA_TTABLE);
  static const char *const optnames[] = {"metadata", "stream", NULL};
  int o = bind_read_opts(L, 3, optnames), meta = o, stream = o + 1;
  int names = sorted_names(L, 2, fname);
  int n = (int)luaL_len(L, names);
  lua_newtable(L);   /* the tensors' host bytes, anchored while written */
  int datas = lua_gettop(L);
  lua_newtable(L);   /* the header's members, joined below */
  int parts = lua_gettop(L), np = 0;
  if (!lua_isnil(L, meta)) {
    push_meta_json(L, meta, fname);
    lua_rawseti(L, parts, ++np);
  }
  uint64_t at = 0;
  for (int i = 1; i <= n; i++) {
    tensor_entry(L, names, i, datas, stream, &at, fname);
    lua_rawseti(L, parts, ++np);
  }
  lua_pushliteral(L, "{");
  push_libfn(L, "table", "concat");
  lua_pushvalue(L, parts);
  lua_pushliteral(L, ",");
  lua_call(L, 2, 1);
  lua_pushliteral(L, "}");
  /* padded with spaces, as the safetensors package does, so that the data starts 8-aligned */
  lua_concat(L, 3);
  size_t tlen = luaL_len(L, -1);
  lua_pushlstring(L, "        ", (8 - tlen % 8) % 8);
  lua_concat(L, 2);
  const char *hdr = lua_tolstring(L, -1, &tlen);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)tlen >> (8 * i));
  bind_piece *pc = lua_newuserdatauv(L, sizeof *pc * ((size_t)n + 2), 0);
  pc[0] = (bind_piece){len8, 8};
  pc[1] = (bind_piece){hdr, tlen};
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, names, i);
    lua_rawget(L, 2);
    gpu_tensor *t = bind_check_tensor(L, -1);
    size_t nbytes = (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype);
    lua_rawgeti(L, datas, i);
    pc[i + 1] = (bind_piece){lua_touserdata(L, -1), nbytes};
    lua_pop(L, 2);   /* still anchored in datas */
  }
  char err[512];
  if (bind_write_file(path, pc, n + 2, err, sizeof err)) return luaL_error(L, "%s: %s", fname, err);
  return 0;
}

/* ---- .npz: gpu.load_npz, gpu.save_npz ---------------------------------------- */

static int fd_read(void *ctx, void *p, size_t n, uint64_t off) { return bind_read_at(*(int *)ctx, p, n, off); }

typedef struct mem_file { const unsigned char *p; uint64_t n; } mem_file;

static int mem_read(void *ctx, void *p, size_t n, uint64_t off) {
  mem_file *m = ctx;
  if (off > m->n || n > m->n - off) {
    errno = 0;
    return -1;
  }
  memcpy(p, m->p + off, n);
  return 0;
}

/* A member's key: its name less ".npy", as numpy.load gives it. */
static void push_key(lua_State *L, const zip_entry *e) {
  size_t n = e->namelen;
  if (n > 4 && memcmp(e->name + n - 4, ".npy", 4) == 0) n -= 4;
  lua_pushlstring(L, e->name, n);
}

static void check_names_opt(lua_State *L, int sel) {
  if (lua_isnil(L, sel)) return;
  if (!lua_istable(L, sel))
    luaL_error(L, "bad option 'names' (a table of tensor names expected, got %s)", luaL_typename(L, sel));
  for (lua_Integer i = 1, n = luaL_len(L, sel); i <= n; i++)
    if (lua_rawgeti(L, sel, i) != LUA_TSTRING)
      luaL_error(L, "bad option 'names' (item %d is a %s, not a tensor name)", (int)i, luaL_typename(L, -1));
    else lua_pop(L, 1);
}

/* A stored member's .npy read in place, at base in the file, its CRC-32
 * folded in as the reads go: the .npy reader reads a member front to back
 * (preamble, header, elements), rereading at most a few bytes. */
typedef struct member_file { int fd; uint64_t base, done; uint32_t crc; } member_file;

static int member_read(void *ctx, void *p, size_t n, uint64_t off) {
  member_file *m = ctx;
  if (bind_read_at(m->fd, p, n, m->base + off) != 0) return -1;
  if (off <= m->done && n > m->done - off) {
    m->crc = zip_crc32(m->crc, (const char *)p + (m->done - off), (size_t)(off + n - m->done));
    m->done = off + n;
  }
  return 0;
}

/* A stored member as gpu.load loads a .npy, pushed: its local header and
 * .npy header read from the file; to the device its elements mapped and
 * the copy queued (not CRC-checked: nothing is read), else read straight
 * into the tensor (or its staging buffer) and the CRC-32 checked. */
static void load_stored(lua_State *L, int fd, const zip_archive *z, const zip_entry *e, dev_memkind kind,
                        int stream, int map, const char *path) {
  char err[512];
  uint64_t off;
  if (zip_member_offset(fd_read, &fd, z, e, &off, err, sizeof err)) luaL_error(L, "load_npz: %s: %s", path, err);
  /* the .npy header is checked against the member's size: nothing past it is read */
  member_file m = {fd, off, 0, 0};
  npy_header h;
  memset(&h, 0, sizeof h);
  if (npy_read_header(member_read, &m, e->usize, &h, err, sizeof err))
    luaL_error(L, "load_npz: %s: member '%s': %s", path, e->name, err);
  if (map && kind == DEV_MEM_DEVICE && h.nbytes && h.dt != DEV_BOOL && !h.swap) {
    npy_header in_file = h;
    in_file.data_offset += (size_t)off;
    if (bind_npy_map(L, fd, &in_file, stream, "load_npz")) return;
  }
  bind_npy_load(L, member_read, &m, &h, kind, stream, "load_npz", path);
  /* a tensor made of corrupt data is dropped (a queued copy to it is harmless) */
  if (m.done != e->usize || m.crc != e->crc) {
    snprintf(err, sizeof err, "CRC-32 mismatch (the data is corrupt: %08x, the archive says %08x)", (unsigned)m.crc,
             (unsigned)e->crc);
    luaL_error(L, "load_npz: %s: member '%s': %s", path, e->name, err);
  }
}

/* A descriptor of the file for the inflaters of one load (pread: any
 * thread), closed with the last of them: a load of many members holds one
 * descriptor, not one each. */
struct shared_fd { int fd; atomic_int refs; };

static void shared_fd_release(shared_fd *d) {
  if (atomic_fetch_sub(&d->refs, 1) != 1) return;
  close(d->fd);
  free(d);
}

/* A deflated member inflated on the staging threads (dev_copy_source):
 * its .npy header inflated and read at the call, its elements given to
 * the device layer chunk by chunk, then the rest of the member inflated for
 * its CRC-32.  It reads the file through the load's own descriptor. */
struct inflater {
  shared_fd *dfd;
  zip_stream *zs;
  unsigned char *head;          /* the member's first bytes, inflated for the header */
  size_t have, cap, pos;        /* bytes in head, room, the next to give */
  uint64_t left;                /* the member's bytes not yet inflated */
  uint64_t togive;              /* the elements' bytes not yet given */
  char err[400];                /* why head_read failed, if inflating did */
  char prefix[300];             /* "load_npz: <path>: " */
};

static void inflater_close(void *ud) {
  inflater *f = ud;
  zip_stream_close(f->zs);
  if (f->dfd) shared_fd_release(f->dfd);
  free(f->head);
  free(f);
}

/* npy_read_header's reader: the member's bytes inflated into head as far
 * as a read asks (a header reads front to back). */
static int head_read(void *ctx, void *p, size_t n, uint64_t off) {
  inflater *f = ctx;
  if (off + n < off || off + n > f->have + f->left) {
    errno = 0;
    return -1;
  }
  size_t want = (size_t)(off + n);
  if (want > f->have) {
    if (want > f->cap) {
      size_t cap = want < 4096 ? 4096 : want * 2;
      unsigned char *h = realloc(f->head, cap);
      if (!h) return -1;
      f->head = h;
      f->cap = cap;
    }
    if (zip_stream_read(f->zs, f->head + f->have, want - f->have, f->err, sizeof f->err)) {
      errno = EIO;
      return -1;
    }
    f->left -= want - f->have;
    f->have = want;
  }
  memcpy(p, f->head + off, n);
  return 0;
}

static int inflater_fill(void *ud, void *dst, size_t n, char *err, size_t errlen) {
  inflater *f = ud;
  char msg[400];
  size_t k = f->pos < f->have ? f->have - f->pos : 0;
  if (k > n) k = n;
  memcpy(dst, f->head + f->pos, k);
  f->pos += n;
  f->togive -= n;
  int rc = 0;
  if (n > k) {
    rc = zip_stream_read(f->zs, (char *)dst + k, n - k, msg, sizeof msg);
    f->left -= n - k;
  }
  /* after the last element: the rest of the member, for its CRC-32 */
  unsigned char junk[4096];
  while (rc == 0 && f->togive == 0 && f->left > 0) {
    size_t m = f->left < sizeof junk ? (size_t)f->left : sizeof junk;
    rc = zip_stream_read(f->zs, junk, m, msg, sizeof msg);
    f->left -= m;
  }
  if (rc) snprintf(err, errlen, "%s%s", f->prefix, msg);
  return rc;
}

/* A deflated member to the device: pushed, its copy queued; 0 (nothing
 * pushed) when its elements are not a plain copy (the caller inflates it
 * at the call then). */
static int load_inflating(lua_State *L, st_handle *u, int fd, const zip_entry *e, int stream, const char *path) {
  char err[512];
  if (!u->dfd) {
    shared_fd *d = malloc(sizeof *d);
    if (!d) return luaL_error(L, "load_npz: %s: out of memory", path);
    if ((d->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
      free(d);
      return luaL_error(L, "load_npz: %s: cannot duplicate its descriptor: %s", path, strerror(errno));
    }
    atomic_init(&d->refs, 1);   /* the handle's */
    u->dfd = d;
  }
  inflater *f = calloc(1, sizeof *f);
  if (!f) return luaL_error(L, "load_npz: %s: out of memory", path);
  atomic_fetch_add(&u->dfd->refs, 1);
  f->dfd = u->dfd;
  f->left = e->usize;
  u->pending = f;
  snprintf(f->prefix, sizeof f->prefix, "load_npz: %.200s: ", path);
  if (zip_stream_open(fd_read, &f->dfd->fd, &u->z, e, &f->zs, err, sizeof err))
    return luaL_error(L, "load_npz: %s: %s", path, err);
  npy_header h;
  memset(&h, 0, sizeof h);
  f->err[0] = 0;
  if (npy_read_header(head_read, f, e->usize, &h, err, sizeof err)) {
    /* a failed inflate says why; else the header does */
    if (f->err[0]) return luaL_error(L, "load_npz: %s: %s", path, f->err);
    return luaL_error(L, "load_npz: %s: member '%s': %s", path, e->name, err);
  }
  if (h.swap || h.dt == DEV_BOOL || h.nbytes == 0) {
    inflater_close(f);
    u->pending = NULL;
    return 0;
  }
  f->pos = h.data_offset;
  f->togive = h.nbytes;
  gpu_tensor *t = bind_push_tensor_handle(L);
  t->v.buf = bind_alloc(L, DEV_MEM_DEVICE, h.nbytes, 0, "load_npz");
  t->v.dtype = h.dt;
  dev_view_set_contiguous(&t->v, h.ndim, h.shape);
  dev_ctx *ctx = bind_ctx(L);
  bind_call_site(L, ctx, "load_npz");
  dev_stream *s = bind_stream(L, stream);
  dev_source src = {inflater_fill, inflater_close, f};
  u->pending = NULL;   /* the device layer's now, whatever it returns */
  BIND_CHECK(L, ctx, dev_copy_source(ctx, s, &t->v, &src), "load_npz");
  return 1;
}

static void load_member(lua_State *L, st_handle *u, int fd, const zip_entry *e, dev_memkind kind, int stream,
                        int map, const char *path, int out) {
  const zip_archive *z = &u->z;
  push_key(L, e);
  if (e->method == 0) {
    load_stored(L, fd, z, e, kind, stream, map, path);
    lua_rawset(L, out);
    return;
  }
  if (map && kind == DEV_MEM_DEVICE && load_inflating(L, u, fd, e, stream, path)) {
    lua_rawset(L, out);
    return;
  }
  /* deflated, to host memory or map = false: inflated whole at the call,
   * CRC-32 checked, then loaded from there */
  char err[512];
  unsigned char *buf = lua_newuserdatauv(L, e->usize ? (size_t)e->usize : 1, 0);
  if (zip_read_member(fd_read, &fd, z, e, buf, err, sizeof err))
    luaL_error(L, "load_npz: %s: %s", path, err);
  mem_file m = {buf, e->usize};
  npy_header h;
  memset(&h, 0, sizeof h);
  if (npy_read_header(mem_read, &m, e->usize, &h, err, sizeof err))
    luaL_error(L, "load_npz: %s: member '%s': %s", path, e->name, err);
  bind_npy_load(L, mem_read, &m, &h, kind, stream, "load_npz", path);
  lua_remove(L, -2);   /* the member's bytes */
  lua_rawset(L, out);
}

/* gpu.load_npz(path [, {names = {...}, device =, stream =, map =}]) --> {name = tensor} */
static int gpu_load_npz(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 1, "the path contains a zero byte");
  static const char *const names[] = {"names", "device", "stream", "map", NULL};
  int o = bind_read_opts(L, 2, names), sel = o, stream = o + 2;
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  int map = bind_opt_map(L, o + 3, "load_npz");
  bind_stream(L, stream);
  check_names_opt(L, sel);
  int fd = bind_open_read(L, path, "load_npz");
  struct stat st;
  if (fstat(fd, &st) != 0) return luaL_error(L, "load_npz: %s: cannot stat the file", path);
  st_handle *u = push_handle(L);
  char err[512];
  if (zip_open(fd_read, &fd, (uint64_t)st.st_size, &u->z, err, sizeof err))
    return luaL_error(L, "load_npz: %s: %s", path, err);
  const zip_archive *z = &u->z;
  /* key -> entry index; two members with one key are refused */
  lua_createtable(L, 0, (int)(z->n < 1024 ? z->n : 1024));
  int index = lua_gettop(L);
  for (size_t i = 0; i < z->n; i++) {
    push_key(L, &z->e[i]);
    if (lua_rawget(L, index) != LUA_TNIL) return luaL_error(L, "load_npz: %s: two members named '%s'", path, z->e[i].name);
    lua_pop(L, 1);
    push_key(L, &z->e[i]);
    lua_pushinteger(L, (lua_Integer)i);
    lua_rawset(L, index);
  }
  lua_newtable(L);
  int out = lua_gettop(L);
  if (lua_isnil(L, sel)) {
    for (size_t i = 0; i < z->n; i++) load_member(L, u, fd, &z->e[i], kind, stream, map, path, out);
    return 1;
  }
  for (int pass = 0; pass < 2; pass++)
    for (lua_Integer i = 1, n = luaL_len(L, sel); i <= n; i++) {
      lua_rawgeti(L, sel, i);
      if (lua_rawget(L, index) == LUA_TNIL) {
        lua_rawgeti(L, sel, i);
        return luaL_error(L, "load_npz: %s: no array '%s' in the file", path, lua_tostring(L, -1));
      }
      size_t k = (size_t)lua_tointeger(L, -1);
      lua_pop(L, 1);
      if (pass) load_member(L, u, fd, &z->e[k], kind, stream, map, path, out);
    }
  return 1;
}

static void put16(luaL_Buffer *b, unsigned v) {
  luaL_addchar(b, (char)(v & 0xff));
  luaL_addchar(b, (char)(v >> 8 & 0xff));
}
static void put32(luaL_Buffer *b, uint32_t v) {
  put16(b, v & 0xffff);
  put16(b, v >> 16);
}

typedef struct member { uint32_t crc; uint64_t csize, usize, off; int method; } member;

/* A local header (central = 0) or a central directory entry. */
static void push_header(lua_State *L, const member *m, const char *name, size_t nlen, int central) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  put32(&b, central ? 0x02014b50u : 0x04034b50u);
  if (central) put16(&b, 20);     /* made by: MS-DOS, 2.0 */
  put16(&b, 20);                  /* needed: 2.0 */
  put16(&b, 0);                   /* flags */
  put16(&b, (unsigned)m->method);
  put16(&b, 0);                   /* time 00:00 */
  put16(&b, 0x21);                /* date 1980-01-01 */
  put32(&b, m->crc);
  put32(&b, (uint32_t)m->csize);
  put32(&b, (uint32_t)m->usize);
  put16(&b, (unsigned)nlen);
  put16(&b, 0);                   /* extra */
  if (central) {
    put16(&b, 0);                 /* comment */
    put16(&b, 0);                 /* disk */
    put16(&b, 0);                 /* internal attributes */
    put32(&b, 0);                 /* external attributes */
    put32(&b, (uint32_t)m->off);
  }
  luaL_addlstring(&b, name, nlen);
  luaL_pushresult(&b);
}

/* The i-th array (by sorted name) as a member at offset off: its local
 * header and data appended to pieces (*np), its central directory entry
 * to cds[i], its sizes in *m.  Returns the offset after it. */
static uint64_t add_member(lua_State *L, int names, int i, int compress, int stream, int pieces, int *np, int cds,
                           member *m, uint64_t off, const char *fname) {
  int top = lua_gettop(L);
  lua_rawgeti(L, names, i);
  lua_pushliteral(L, ".npy");
  lua_concat(L, 2);
  size_t nlen;
  const char *name = lua_tolstring(L, -1, &nlen);
  if (nlen > 65535) luaL_error(L, "%s: a name of %d bytes is too long for a zip", fname, (int)nlen);
  lua_rawgeti(L, names, i);
  lua_rawget(L, 2);
  gpu_tensor *t = bind_check_tensor(L, -1);
  char hdr[1024];
  size_t hlen = bind_npy_make_header(&t->v, hdr);
  size_t nbytes = (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype);
  if (nbytes + hlen >= 0xFFFFFFFFu)
    luaL_error(L, "%s: array '%s' of %llu bytes: members of 4 GiB and more (zip64) are not written yet", fname,
               name, (unsigned long long)nbytes);
  unsigned char *p = lua_newuserdatauv(L, hlen + nbytes, 0);
  memcpy(p, hdr, hlen);
  t = bind_check_tensor(L, -2);
  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_stream(L, stream);
  bind_call_site(L, ctx, fname);
  if (nbytes) BIND_CHECK(L, ctx, dev_read(ctx, s, &t->v, p + hlen), fname);
  m->usize = m->csize = hlen + nbytes;
  m->crc = zip_crc32(0, p, (size_t)m->usize);
  m->off = off;
  m->method = 0;
  if (compress) {
    void *c;
    size_t clen;
    if (zip_deflate(p, (size_t)m->usize, &c, &clen))
      luaL_error(L, "%s: cannot compress (out of memory, or a gpulua built without zlib: apt install "
                 "zlib1g-dev, then rebuild)", fname);
    void *cu = lua_newuserdatauv(L, clen ? clen : 1, 0);
    memcpy(cu, c, clen);
    free(c);
    lua_replace(L, -2);
    m->method = 8;
    m->csize = clen;
  }
  push_header(L, m, name, nlen, 0);
  lua_rawseti(L, pieces, ++*np);
  lua_rawseti(L, pieces, ++*np);   /* the data */
  push_header(L, m, name, nlen, 1);
  lua_rawseti(L, cds, i);
  lua_settop(L, top);
  off += 30 + nlen + m->csize;
  if (off >= 0xFFFFFFFFu) luaL_error(L, "%s: an archive of 4 GiB and more (zip64) is not written yet", fname);
  return off;
}

static void push_end_record(lua_State *L, int n, uint64_t cd_size, uint64_t cd_off) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  put32(&b, 0x06054b50u);
  put16(&b, 0);
  put16(&b, 0);
  put16(&b, (unsigned)n);
  put16(&b, (unsigned)n);
  put32(&b, (uint32_t)cd_size);
  put32(&b, (uint32_t)cd_off);
  put16(&b, 0);
  luaL_pushresult(&b);
}

/* gpu.save_npz(path, tensors [, {compress = false, stream =}]) */
static int gpu_save_npz(lua_State *L) {
  static const char *const fname = "save_npz";
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 1, "the path contains a zero byte");
  luaL_checktype(L, 2, LUA_TTABLE);
  static const char *const optnames[] = {"compress", "stream", NULL};
  int o = bind_read_opts(L, 3, optnames), stream = o + 1;
  int compress = lua_toboolean(L, o);
  int names = sorted_names(L, 2, fname);
  int n = (int)luaL_len(L, names);
  if (n > 65535) return luaL_error(L, "%s: %d arrays: more than a zip without zip64 holds (65535)", fname, n);
  lua_newtable(L);   /* the pieces, in order: strings and userdata */
  int pieces = lua_gettop(L), np = 0;
  lua_newtable(L);   /* the central directory entries */
  int cds = lua_gettop(L);
  member *ms = lua_newuserdatauv(L, sizeof *ms * ((size_t)n + 1), 0);
  uint64_t off = 0, cd_size = 0;
  for (int i = 1; i <= n; i++) off = add_member(L, names, i, compress, stream, pieces, &np, cds, &ms[i], off, fname);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, cds, i);
    cd_size += luaL_len(L, -1);
    lua_rawseti(L, pieces, ++np);
  }
  push_end_record(L, n, cd_size, off);
  lua_rawseti(L, pieces, ++np);
  bind_piece *pc = lua_newuserdatauv(L, sizeof *pc * (size_t)np, 0);
  for (int i = 1; i <= np; i++) {
    lua_rawgeti(L, pieces, i);
    if (lua_type(L, -1) == LUA_TSTRING)
      pc[i - 1].p = lua_tolstring(L, -1, &pc[i - 1].n);
    else   /* the data of member k is piece 2k */
      pc[i - 1] = (bind_piece){lua_touserdata(L, -1), (size_t)ms[i / 2].csize};
    lua_pop(L, 1);   /* still anchored in pieces */
  }
  char err[512];
  if (bind_write_file(path, pc, np, err, sizeof err)) return luaL_error(L, "%s: %s", fname, err);
  return 0;
}

static const luaL_Reg funcs[] = {
  {"load_npz", gpu_load_npz},
  {"save_npz", gpu_save_npz},
  {"load_safetensors", gpu_load_safetensors},
  {"save_safetensors", gpu_save_safetensors},
  {NULL, NULL}
};

static const luaL_Reg st_handle_meta[] = {
  {"__close", st_handle_close},
  {"__gc", st_handle_close},
  {NULL, NULL}
};

int bind_open_formats(lua_State *L) {
  bind_newtype(L, &bind_st_header_type, st_handle_meta, NULL);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
