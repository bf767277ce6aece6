/* Tensor files beside .npy (npy.c): safetensors, Hugging Face's format.
 *
 *   gpu.load_safetensors(path [, {names =, device =, stream =}]) --> tensors, metadata
 *   gpu.save_safetensors(path, tensors [, {metadata =, stream =}])
 *
 * The header is read and checked whole (safetensors.c, Lua-free) before
 * anything is allocated; then each tensor asked for is read from its place
 * in the file alone, as gpu.load reads a .npy file's elements: into pinned
 * memory, the copy to the device queued on the stream.  Saving writes what
 * the safetensors package writes: the header padded with spaces to a
 * multiple of 8 bytes, the tensors' bytes in the header's order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"
#include "tensor.h"

/* ---- the parsed header: a userdata that frees it --------------------------- */

typedef struct st_handle { const bind_type *tag; st_header h; } st_handle;

static int st_handle_close(lua_State *L) {
  st_handle *u = bind_check_type(L, 1, &bind_st_header_type, sizeof *u);
  st_free(&u->h);
  return 0;
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
                       const char *path, int out) {
  bind_load_elements(L, fd, base + e->begin, e->dt, e->ndim, e->shape, kind, stream, "load_safetensors", path);
  lua_pushlstring(L, e->name, e->namelen);
  lua_insert(L, -2);
  lua_rawset(L, out);
}

/* gpu.load_safetensors(path [, {names = {...}, device =, stream =}]) */
static int gpu_load_safetensors(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_argerror(L, 1, "the path contains a zero byte");
  static const char *const names[] = {"names", "device", "stream", NULL};
  int o = bind_read_opts(L, 2, names), sel = o, stream = o + 2;
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
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
  st_handle *u = bind_new_udata(L, &bind_st_header_type, sizeof *u, 0);
  memset(&u->h, 0, sizeof u->h);
  lua_toclose(L, lua_gettop(L));
  if (st_parse(text, (size_t)hlen, size - 8 - hlen, &u->h, err, sizeof err))
    return luaL_error(L, "load_safetensors: %s: %s", path, err);
  const st_header *h = &u->h;
  uint64_t base = 8 + hlen;

  lua_createtable(L, 0, (int)(h->n < 1024 ? h->n : 1024));
  int out = lua_gettop(L);
  if (lua_isnil(L, sel)) {
    for (size_t i = 0; i < h->n; i++) load_entry(L, fd, base, &h->t[i], kind, stream, path, out);
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
        if (pass) load_entry(L, fd, base, e, kind, stream, path, out);
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
  lua_getglobal(L, "table");
  lua_getfield(L, -1, "sort");
  lua_pushvalue(L, names);
  lua_call(L, 1, 0);
  lua_pop(L, 1);
  return names;
}

static void check_utf8(lua_State *L, int idx, const char *what, const char *fname) {
  idx = lua_absindex(L, idx);
  const char *s = lua_tostring(L, idx);
  lua_getglobal(L, "utf8");
  lua_getfield(L, -1, "len");
  lua_pushvalue(L, idx);
  lua_call(L, 1, 1);
  if (lua_isnil(L, -1)) luaL_error(L, "%s: %s '%s' is not valid UTF-8 (JSON text is UTF-8)", fname, what, s);
  lua_pop(L, 2);
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
  dev_ctx *ctx = bind_ctx(L);
  int names = sorted_names(L, 2, fname);
  int n = (int)luaL_len(L, names);

  luaL_Buffer b;
  lua_newtable(L);   /* the tensors' host bytes, anchored while written */
  int datas = lua_gettop(L);
  luaL_checkstack(L, 8, "too many tensors");
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '{');
  int first = 1;
  if (!lua_isnil(L, meta)) {
    if (!lua_istable(L, meta))
      luaL_error(L, "%s: bad option 'metadata' (a table of strings expected, got %s)", fname, luaL_typename(L, meta));
    /* sorted keys, so that the same table gives the same file */
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
    lua_getglobal(L, "table");
    lua_getfield(L, -1, "sort");
    lua_pushvalue(L, mk);
    lua_call(L, 1, 0);
    lua_pop(L, 1);
    /* the buffer sits on the stack above mk: build the text apart, then add it */
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
      lua_pop(L, 2);
      if (i > 1) luaL_addchar(&mb, ',');
      add_json_string(&mb, k, kn);
      luaL_addchar(&mb, ':');
      add_json_string(&mb, v, vn);
    }
    luaL_addchar(&mb, '}');
    luaL_pushresult(&mb);
    lua_remove(L, mk);
    luaL_addvalue(&b);
    first = 0;
  }
  uint64_t at = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, names, i);
    size_t kn;
    const char *k = lua_tolstring(L, -1, &kn);
    check_utf8(L, -1, "tensor name", fname);
    if (kn == 12 && memcmp(k, "__metadata__", 12) == 0)
      luaL_error(L, "%s: a tensor cannot be named '__metadata__' (the format keeps that key)", fname);
    lua_rawget(L, 2);
    gpu_tensor *t = bind_check_tensor(L, -1);
    const char *dn = st_dtype_name(t->v.dtype);
    size_t nbytes = (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype);
    char sh[DEV_MAXDIM * 24 + 64];
    size_t sk = (size_t)snprintf(sh, sizeof sh, "{\"dtype\":\"%s\",\"shape\":[", dn ? dn : "?");
    for (int d = 0; d < t->v.ndim; d++)
      sk += (size_t)snprintf(sh + sk, sizeof sh - sk, d ? ",%lld" : "%lld", (long long)t->v.shape[d]);
    snprintf(sh + sk, sizeof sh - sk, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
             (unsigned long long)(at + nbytes));
    at += nbytes;
    /* the bytes in C order on the host: a counted sync, as t:save */
    void *p = lua_newuserdatauv(L, nbytes ? nbytes : 1, 0);
    t = bind_check_tensor(L, -2);
    dev_stream *s = bind_stream(L, stream);
    bind_call_site(L, ctx, fname);
    if (nbytes) BIND_CHECK(L, ctx, dev_read(ctx, s, &t->v, p), fname);
    lua_rawseti(L, datas, i);
    lua_pop(L, 1);
    lua_rawgeti(L, names, i);
    k = lua_tolstring(L, -1, &kn);
    /* the key's text goes in through a string, as the buffer is on the stack */
    luaL_Buffer kb;
    luaL_buffinit(L, &kb);
    if (!first) luaL_addchar(&kb, ',');
    add_json_string(&kb, k, kn);
    luaL_addchar(&kb, ':');
    luaL_addstring(&kb, sh);
    luaL_pushresult(&kb);
    lua_remove(L, -2);
    luaL_addvalue(&b);
    first = 0;
  }
  luaL_addchar(&b, '}');
  luaL_pushresult(&b);
  /* padded with spaces, as the safetensors package does, so that the data starts 8-aligned */
  size_t tlen;
  lua_tolstring(L, -1, &tlen);
  size_t pad = (8 - tlen % 8) % 8;
  lua_pushlstring(L, "        ", pad);
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
    lua_pop(L, 1);
    lua_rawgeti(L, datas, i);
    pc[i + 1] = (bind_piece){lua_touserdata(L, -1), nbytes};
    lua_pop(L, 1);   /* still anchored in datas */
  }
  char err[512];
  if (bind_write_file(path, pc, n + 2, err, sizeof err)) return luaL_error(L, "%s: %s", fname, err);
  return 0;
}

static const luaL_Reg funcs[] = {
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
