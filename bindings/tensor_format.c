/* gpu.Tensor as text (its __tostring): shape, dtype, device and the values
 * in numpy's layout, the middle of long dims elided. */
#include <stdio.h>
#include <string.h>

#include "tensor.h"

#define SHOW_MAX 100   /* more elements than this: each long dim is elided */
#define SHOW_EDGE 3    /* values shown at each end of an elided dim */
#define ELEM_W 32      /* room for one formatted value */

typedef struct show {
  int ndim;
  int64_t n[DEV_MAXDIM];     /* values shown per dim */
  int elided[DEV_MAXDIM];    /* dim shows SHOW_EDGE at each end and "..." between */
  int width;                 /* of the widest value */
  const char *vals;          /* ELEM_W bytes per shown value, C order */
} show;

static void fmt_elem(lua_State *L, dev_dtype dt, const void *p, char *out) {
  bind_push_elem(L, dt, p);
  if (lua_type(L, -1) == LUA_TNUMBER && !lua_isinteger(L, -1)) {
    double x = lua_tonumber(L, -1);
    if (x != x) snprintf(out, ELEM_W, "nan");
    else snprintf(out, ELEM_W, "%.6g", x);
  } else if (lua_isinteger(L, -1)) {
    snprintf(out, ELEM_W, "%lld", (long long)lua_tointeger(L, -1));
  } else {
    snprintf(out, ELEM_W, "%s", lua_toboolean(L, -1) ? "true" : "false");
  }
  lua_pop(L, 1);
}

static void add_block(luaL_Buffer *b, const show *sh, int d, int64_t *at) {
  if (d == sh->ndim) {
    const char *v = sh->vals + *at * ELEM_W;
    for (int pad = sh->width - (int)strlen(v); pad > 0; pad--) luaL_addchar(b, ' ');
    luaL_addstring(b, v);
    (*at)++;
    return;
  }
  luaL_addchar(b, '{');
  for (int64_t i = 0; i < sh->n[d]; i++) {
    if (i > 0) {
      luaL_addchar(b, ',');
      if (d == sh->ndim - 1) {
        luaL_addchar(b, ' ');
      } else {   /* rows on their own lines, a blank line between matrices */
        for (int k = d; k < sh->ndim - 1; k++) luaL_addchar(b, '\n');
        for (int k = 0; k <= d; k++) luaL_addchar(b, ' ');
      }
    }
    if (sh->elided[d] && i == SHOW_EDGE) {
      luaL_addstring(b, "...,");
      if (d == sh->ndim - 1) {
        luaL_addchar(b, ' ');
      } else {
        for (int k = d; k < sh->ndim - 1; k++) luaL_addchar(b, '\n');
        for (int k = 0; k <= d; k++) luaL_addchar(b, ' ');
      }
    }
    add_block(b, sh, d + 1, at);
  }
  luaL_addchar(b, '}');
}

/* The shown values of t (all of them, or the ends of each elided dim) read
 * into ELEM_W-byte strings: one dev_read per block of the ends (a counted
 * sync each; one when nothing is elided). */
static void read_shown(lua_State *L, int tidx, show *sh) {
  gpu_tensor *t = bind_check_tensor(L, tidx);
  dev_view v = t->v;
  int64_t total = 1, nblocks = 1;
  sh->ndim = v.ndim;
  for (int d = 0; d < v.ndim; d++) {
    sh->elided[d] = dev_view_numel(&v) > SHOW_MAX && v.shape[d] > 2 * SHOW_EDGE;
    sh->n[d] = sh->elided[d] ? 2 * SHOW_EDGE : v.shape[d];
    total *= sh->n[d];
    if (sh->elided[d]) nblocks *= 2;
  }
  size_t esz = dev_dtype_size(v.dtype);
  unsigned char *raw = lua_newuserdatauv(L, (size_t)total * esz, 0);
  unsigned char *blk = lua_newuserdatauv(L, (size_t)total * esz, 0);
  char *vals = lua_newuserdatauv(L, (size_t)total * ELEM_W, 0);
  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_stream(L, 0);
  v.buf = bind_check_tensor(L, tidx)->v.buf;   /* Lua code may have run: fetch it again */
  bind_call_site(L, ctx, "tostring");
  for (int64_t k = 0; k < nblocks; k++) {
    /* block k: head or tail of each elided dim (a bit each), all of the others */
    dev_view bv = v;
    int64_t first[DEV_MAXDIM], bit = 0;
    for (int d = 0; d < v.ndim; d++) {
      first[d] = 0;
      if (!sh->elided[d]) continue;
      int tail = (int)((k >> bit++) & 1);
      bv.shape[d] = SHOW_EDGE;
      if (tail) {
        first[d] = SHOW_EDGE;
        bv.offset += (size_t)((v.shape[d] - SHOW_EDGE) * v.stride[d]) * esz;
      }
    }
    BIND_CHECK(L, ctx, dev_read(ctx, s, &bv, blk), "tostring");
    int64_t idx[DEV_MAXDIM] = {0}, nb = dev_view_numel(&bv);
    for (int64_t e = 0; e < nb; e++) {
      int64_t at = 0;
      for (int d = 0; d < v.ndim; d++) at = at * sh->n[d] + first[d] + idx[d];
      memcpy(raw + at * (int64_t)esz, blk + e * (int64_t)esz, esz);
      for (int d = v.ndim - 1; d >= 0 && ++idx[d] == bv.shape[d]; d--) idx[d] = 0;
    }
  }
  sh->width = 0;
  for (int64_t i = 0; i < total; i++) {
    fmt_elem(L, v.dtype, raw + i * (int64_t)esz, vals + i * ELEM_W);
    int w = (int)strlen(vals + i * ELEM_W);
    if (w > sh->width) sh->width = w;
  }
  sh->vals = vals;
}

/* gpu.Tensor(f32, {2,3}, device) then the values: on the same line for 0
 * and 1 dims, else a row per line; elided with "..." past SHOW_MAX values. */
int bind_tensor_tostring(lua_State *L) {
  gpu_tensor *t = bind_check_type(L, 1, &bind_tensor_type, sizeof(gpu_tensor));
  if (!t->v.buf) {
    lua_pushliteral(L, "gpu.Tensor (closed)");
    return 1;
  }
  char sh[MAXSHAPESTR];
  bind_shape_str(sh, sizeof sh, t->v.ndim, t->v.shape);
  lua_settop(L, 1);
  lua_pushfstring(L, "gpu.Tensor(%s, %s, %s)%s", dev_dtype_name(t->v.dtype), sh, kind_name(t),
                  t->v.ndim > 1 ? "\n" : " ");
  if (dev_view_numel(&t->v) == 0) {
    lua_pushliteral(L, "{}");
    lua_concat(L, 2);
    return 1;
  }
  show w;
  read_shown(L, 1, &w);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushvalue(L, 2);
  luaL_addvalue(&b);
  int64_t at = 0;
  add_block(&b, &w, 0, &at);
  luaL_pushresult(&b);
  return 1;
}
