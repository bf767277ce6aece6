/* gpu.Tensor: metadata on the host, data where `device` says (device, pinned
 * or pageable host memory).  Every op checks its arguments here, builds a
 * dev_kop and hands it to the device layer, which queues it on a stream (or
 * runs it here when all its memory is host memory).  Printing is in
 * tensor_format.c, nested tables to tensors and back in tensor_table.c. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "tensor.h"

/* ---- helpers ---------------------------------------------------------- */

void bind_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "{");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)shape[d]);
  if (k < n) snprintf(buf + k, n - k, "}");
}

static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static gpu_tensor *to_tensor(lua_State *L, int idx) {
  return bind_check_type(L, idx, &bind_tensor_type, sizeof(gpu_tensor));
}

gpu_tensor *bind_check_tensor(lua_State *L, int idx) {
  gpu_tensor *t = to_tensor(L, idx);
  if (!t->v.buf) luaL_argerror(L, idx, "tensor is closed");
  return t;
}

gpu_tensor *bind_test_tensor(lua_State *L, int idx) {
  gpu_tensor *t = bind_test_tensor_handle(L, idx);
  if (t && !t->v.buf) luaL_argerror(L, idx, "tensor is closed");
  return t;
}

gpu_tensor *bind_push_tensor_handle(lua_State *L) {
  return bind_new_udata(L, &bind_tensor_type, sizeof(gpu_tensor), 0);
}

gpu_tensor *bind_new_tensor(lua_State *L, dev_memkind kind, dev_dtype dt, int ndim,
                            const int64_t *shape, int stream, const char *fname) {
  gpu_tensor *t = bind_push_tensor_handle(L);
  size_t bytes = (size_t)numel_of(ndim, shape) * dev_dtype_size(dt);
  dev_buf *b = bind_alloc(L, kind, bytes, stream, fname);
  t->v.dtype = dt;
  dev_view_set_contiguous(&t->v, ndim, shape);
  t->v.buf = b;
  return t;
}

static gpu_tensor *new_like(lua_State *L, const gpu_tensor *like, dev_dtype dt, int ndim,
                            const int64_t *shape, int stream, const char *fname) {
  if (!like->v.buf) luaL_error(L, "%s: tensor is closed", fname);
  return bind_new_tensor(L, like->v.buf->kind, dt, ndim, shape, stream, fname);
}

/* A new handle on the same storage (views); base at stack index idx. */
static gpu_tensor *new_view(lua_State *L, int idx) {
  gpu_tensor *t = bind_push_tensor_handle(L);
  gpu_tensor *base = bind_check_tensor(L, idx);
  t->v = base->v;
  dev_buf_retain(t->v.buf);
  return t;
}

/* Enqueue op.  The buffers of its views are taken from the tensors at stack
 * indices out and in[0..nin) (0: keep the view's buffer), here, after the
 * binding's last Lua allocation (see common.h); submit also finds the
 * stream, from the stream option's value at index stream (0: current). */
static void submit_views(lua_State *L, dev_stream *s, dev_kop *op, int out, const int *in, int nin,
                         const char *fname) {
  dev_ctx *ctx = dev_stream_ctx(s);
  if (out) op->out.buf = bind_check_tensor(L, out)->v.buf;
  for (int i = 0; i < nin; i++)
    if (in[i]) op->in[i].buf = bind_check_tensor(L, in[i])->v.buf;
  bind_call_site(L, ctx, fname);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, op), fname);
}

static void submit_on(lua_State *L, dev_stream *s, dev_kop *op, int out, int in0, int in1,
                      const char *fname) {
  int in[2] = {in0, in1};
  submit_views(L, s, op, out, in, 2, fname);
}

static void submit(lua_State *L, int stream, dev_kop *op, int out, int in0, int in1,
                   const char *fname) {
  submit_on(L, bind_stream(L, stream), op, out, in0, in1, fname);
}

/* shape: a table of non-negative integers or one integer (0: a zero-sized dim) */
static int check_shape(lua_State *L, int idx, int64_t *shape, const char *what) {
  int ndim;
  if (lua_type(L, idx) == LUA_TNUMBER) {
    ndim = 1;
    lua_pushvalue(L, idx);
  } else if (lua_type(L, idx) == LUA_TTABLE) {
    size_t n = lua_rawlen(L, idx);
    if (n > DEV_MAXDIM) luaL_argerror(L, idx, lua_pushfstring(L, "%s has %d dims (at most %d)", what, (int)n, DEV_MAXDIM));
    ndim = (int)n;
  } else {
    return luaL_typeerror(L, idx, "shape table or integer");
  }
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) {
    if (lua_type(L, idx) == LUA_TTABLE) lua_rawgeti(L, idx, d + 1);
    else lua_pushvalue(L, -1);
    int isint;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint) {
      if (lua_type(L, -1) == LUA_TNUMBER)
        luaL_argerror(L, idx, lua_pushfstring(L, "%s[%d] must be an integer, got %s", what, d + 1,
                                              lua_tostring(L, -1)));
      luaL_argerror(L, idx, lua_pushfstring(L, "%s[%d] must be an integer, got %s", what, d + 1,
                                            luaL_typename(L, -1)));
    }
    if (v < 0)
      luaL_argerror(L, idx, lua_pushfstring(L, "%s[%d] must be non-negative, got %I", what, d + 1, v));
    /* the sizes but zeros: bounded, so that strides fit even when numel is 0 */
    if (v && (__builtin_mul_overflow(total, (int64_t)v, &total) || total > ((int64_t)1 << 56)))
      luaL_argerror(L, idx, lua_pushfstring(L, "%s is too large", what));
    shape[d] = v;
    lua_pop(L, 1);
  }
  if (lua_type(L, idx) == LUA_TNUMBER) lua_pop(L, 1);
  return ndim;
}

/* The string at idx as a name: NULL when it holds a zero byte, which the
 * C string would cut short ("f32\0junk" is not f32). */
static const char *name_at(lua_State *L, int idx) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  return s && strlen(s) == n ? s : NULL;
}

/* How a bad name is shown: "f32\0..." for one with a zero byte. */
static const char *shown_name(lua_State *L, int idx) {
  const char *s = lua_tostring(L, idx);
  return name_at(L, idx) ? s : lua_pushfstring(L, "%s\\0...", s);
}

dev_dtype bind_check_dtype(lua_State *L, int idx, dev_dtype dflt) {
  dev_dtype dt = dflt;
  if (!lua_isnil(L, idx)) {
    if (lua_type(L, idx) != LUA_TSTRING)
      luaL_error(L, "bad option 'dtype' (string expected, got %s)", luaL_typename(L, idx));
    const char *name = name_at(L, idx);
    if (!name || dev_dtype_parse(name, &dt))
      luaL_error(L, "bad option 'dtype' (unknown dtype '%s'; expected %s)", shown_name(L, idx),
                 bind_push_names(L, dev_dtype_names, 0));
  }
  return dt;
}

/* 0; -1 for an unknown name; -2 for "cuda:N" with N not a device index. */
static int parse_device(lua_State *L, const char *name, dev_memkind *out) {
  static const char *const names[] = {"device", "cuda", "pinned", "host", "cpu", NULL};
  static const dev_memkind kinds[] = {DEV_MEM_DEVICE, DEV_MEM_DEVICE, DEV_MEM_PINNED, DEV_MEM_HOST, DEV_MEM_HOST};
  for (int i = 0; names[i]; i++)
    if (strcmp(name, names[i]) == 0) { *out = kinds[i]; return 0; }
  if (strncmp(name, "cuda:", 5) == 0 && name[5]) {
    /* digits only: strtol would also take "-0", "+0" and " 0" */
    long i = 0;
    for (const char *p = name + 5; *p; p++) {
      if (*p < '0' || *p > '9') return -1;
      if (i < 1000000) i = i * 10 + (*p - '0');
    }
    if (i >= dev_device_count(bind_ctx(L))) return -2;
    *out = DEV_MEM_DEVICE;
    return 0;
  }
  return -1;
}

dev_memkind bind_check_device(lua_State *L, int idx, dev_memkind dflt) {
  dev_memkind k = dflt;
  if (!lua_isnil(L, idx)) {
    int isstr = lua_type(L, idx) == LUA_TSTRING;
    const char *name = isstr ? name_at(L, idx) : NULL;
    if (name && parse_device(L, name, &k) == -2)
      luaL_error(L, "bad option 'device' ('%s': device index out of range, %d device%s)", name,
                 dev_device_count(bind_ctx(L)), dev_device_count(bind_ctx(L)) == 1 ? "" : "s");
    if (!name || parse_device(L, name, &k))
      luaL_error(L, "bad option 'device' (unknown device '%s'; expected \"device\", \"cuda\", "
                 "\"cuda:N\", \"pinned\" or \"host\")", isstr ? shown_name(L, idx) : luaL_typename(L, idx));
  }
  return k;
}

static int is_intdt(dev_dtype t) { return !dev_dtype_is_float(t) && t != DEV_BOOL; }

/* A Lua value converted for dtype t: exact for integers, range-checked.
 * Errors name argument `arg` (adjusted for methods by luaL_argerror) or, when
 * arg is 0, the thing described by `what`. */
static void scalar_error(lua_State *L, int arg, const char *what, const char *msg) {
  if (arg > 0) {
    if (what) msg = lua_pushfstring(L, "%s: %s", what, msg);
    luaL_argerror(L, arg, msg);
  }
  luaL_error(L, "bad %s (%s)", what, msg);
}

dev_scalar bind_check_scalar(lua_State *L, int idx, dev_dtype t, int arg, const char *what) {
  dev_scalar s = {0, 0, 0};
  int ty = lua_type(L, idx);
  if (t == DEV_BOOL) {
    if (ty == LUA_TBOOLEAN) { s.is_int = 1; s.i = lua_toboolean(L, idx); s.f = (double)s.i; return s; }
    int isint;
    lua_Integer v = lua_tointegerx(L, idx, &isint);
    if (ty == LUA_TNUMBER && isint && (v == 0 || v == 1)) { s.is_int = 1; s.i = v; s.f = (double)v; return s; }
    scalar_error(L, arg, what, lua_pushfstring(L, "bool tensor takes true/false or 0/1, got %s",
                 ty == LUA_TNUMBER ? lua_tostring(L, idx) : luaL_typename(L, idx)));
  }
  if (ty != LUA_TNUMBER)
    scalar_error(L, arg, what, lua_pushfstring(L, "number expected, got %s", luaL_typename(L, idx)));
  if (dev_dtype_is_float(t)) {
    s.f = lua_tonumber(L, idx);
    if (lua_isinteger(L, idx)) { s.is_int = 1; s.i = lua_tointeger(L, idx); }
    return s;
  }
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint)
    scalar_error(L, arg, what, lua_pushfstring(L, "number %s has no integer representation for %s",
                 lua_tostring(L, idx), dev_dtype_name(t)));
  int64_t lo = INT64_MIN, hi = INT64_MAX;
  switch (t) {
  case DEV_I8: lo = -128; hi = 127; break;
  case DEV_U8: lo = 0; hi = 255; break;
  case DEV_I32: lo = INT32_MIN; hi = INT32_MAX; break;
  default: break;
  }
  if (v < lo || v > hi)
    scalar_error(L, arg, what, lua_pushfstring(L, "%I does not fit in %s", v, dev_dtype_name(t)));
  s.is_int = 1;
  s.i = v;
  s.f = (double)v;
  return s;
}

void bind_push_elem(lua_State *L, dev_dtype t, const void *p) {
  switch (t) {
  case DEV_F32: lua_pushnumber(L, *(const float *)p); break;
  case DEV_F64: lua_pushnumber(L, *(const double *)p); break;
  case DEV_F16: lua_pushnumber(L, dev_half_to_float(*(const uint16_t *)p)); break;
  case DEV_BF16: lua_pushnumber(L, dev_bf16_to_float(*(const uint16_t *)p)); break;
  case DEV_I8: lua_pushinteger(L, *(const int8_t *)p); break;
  case DEV_U8: lua_pushinteger(L, *(const uint8_t *)p); break;
  case DEV_I32: lua_pushinteger(L, *(const int32_t *)p); break;
  case DEV_I64: lua_pushinteger(L, *(const int64_t *)p); break;
  case DEV_BOOL: lua_pushboolean(L, *(const uint8_t *)p != 0); break;
  default: lua_pushnil(L);
  }
}

/* Write packed f64/i64 values into dst: cast on the host first, so the device
 * side only ever sees a plain copy. */
/* dst views the tensor at stack index tidx; the stream option's value is at
 * index stream. */
void bind_tensor_upload(lua_State *L, dev_view dst_, int tidx, int isint, const void *vals, int stream,
                        const char *fname) {
  dev_ctx *ctx = bind_ctx(L);
  int64_t n = dev_view_numel(&dst_);
  dev_dtype srct = isint ? DEV_I64 : DEV_F64;
  dev_buf *tmp = NULL, *cast = NULL;
  /* staged in pinned memory: an upload from pageable memory would block;
   * out of it, collect, reclaim and try once more */
  dev_stream *s = bind_stream(L, stream);
  dst_.buf = bind_check_tensor(L, tidx)->v.buf;
  int rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, (size_t)n * 8, &tmp);
  if (rc == DEV_ERR_NOMEM && bind_reclaim(L, DEV_MEM_PINNED, (size_t)n * 8) == DEV_OK) {
    /* nothing held yet: finalizers the collection ran may have closed them */
    s = bind_stream(L, stream);
    dst_.buf = bind_check_tensor(L, tidx)->v.buf;
    rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, (size_t)n * 8, &tmp);
  }
  /* from here on nothing may raise before tmp and cast are released */
  const dev_view *dst = &dst_;
  if (rc == DEV_OK) {
    memcpy(tmp->ptr, vals, (size_t)n * 8);
    dev_kop op = {.kind = DEV_OP_COPY, .nin = 1};
    op.in[0].buf = tmp;
    op.in[0].dtype = srct;
    dev_view_set_contiguous(&op.in[0], dst->ndim, dst->shape);
    if (dst->dtype != srct) {
      rc = dev_buf_alloc(ctx, DEV_MEM_PINNED, (size_t)n * dev_dtype_size(dst->dtype), &cast);
      if (rc == DEV_OK) {
        dev_kop c = {.kind = DEV_OP_UNARY, .code = DEV_UN_COPY, .nin = 1};
        c.in[0] = op.in[0];
        c.out.buf = cast;
        c.out.dtype = dst->dtype;
        dev_view_set_contiguous(&c.out, dst->ndim, dst->shape);
        rc = dev_submit(ctx, NULL, &c);
        op.in[0] = c.out;
      }
    }
    op.out = *dst;
    bind_call_site(L, ctx, fname);
    if (rc == DEV_OK) rc = dev_submit(ctx, s, &op);
  }
  dev_buf_release(tmp);
  dev_buf_release(cast);
  BIND_CHECK(L, ctx, rc, fname);
}

/* ---- constructors ---------------------------------------------------- */

/* the options of the constructors: their slots o, o + 1, o + 2 */
const char *const bind_new_opts[] = {"dtype", "device", "stream", NULL};

static int fill_new(lua_State *L, const char *fname, int value_kind) {
  int64_t shape[DEV_MAXDIM];
  int ndim = check_shape(L, 1, shape, "shape");
  if (value_kind == 2 && lua_isnone(L, 2)) luaL_typeerror(L, 2, "number");
  int o = bind_read_opts(L, value_kind == 2 ? 3 : 2, bind_new_opts), stream = o + 2;
  dev_dtype dt = bind_check_dtype(L, o, DEV_F32);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  bind_stream(L, stream);  /* a bad stream option raises before allocating */
  dev_scalar v = {1, 0, 0};
  if (value_kind == 1) { v.i = 1; v.f = 1; }
  if (value_kind == 2) v = bind_check_scalar(L, 2, dt, 2, NULL);
  gpu_tensor *t = bind_new_tensor(L, kind, dt, ndim, shape, stream, fname);
  if (value_kind == 0) {
    dev_ctx *ctx = bind_ctx(L);
    dev_stream *s = bind_stream(L, stream);
    bind_call_site(L, ctx, fname);
    size_t nbytes = (size_t)numel_of(ndim, shape) * dev_dtype_size(dt);
    BIND_CHECK(L, ctx, dev_memset(ctx, s, t->v.buf, 0, 0, nbytes), fname);
  } else if (value_kind > 0) {
    dev_kop op = {.kind = DEV_OP_FILL, .out = t->v, .s0 = v};
    submit(L, stream, &op, 0, 0, 0, fname);
  }
  return 1;
}

static int tensor_empty(lua_State *L) { return fill_new(L, "empty", -1); }
static int tensor_zeros(lua_State *L) { return fill_new(L, "zeros", 0); }
static int tensor_ones(lua_State *L) { return fill_new(L, "ones", 1); }
static int tensor_full(lua_State *L) { return fill_new(L, "full", 2); }

static int tensor_pinned(lua_State *L) {
  int64_t shape[DEV_MAXDIM];
  int ndim = check_shape(L, 1, shape, "shape");
  static const char *const names[] = {"dtype", NULL};
  dev_dtype dt = bind_check_dtype(L, bind_read_opts(L, 2, names), DEV_F32);
  bind_new_tensor(L, DEV_MEM_PINNED, dt, ndim, shape, 0, "pinned");
  return 1;
}

static int tensor_arange(lua_State *L) {
  int nargs = 0;
  while (lua_type(L, nargs + 1) == LUA_TNUMBER) nargs++;
  if (nargs < 1 || nargs > 3) return luaL_argerror(L, nargs + 1, "number expected");
  int o = bind_read_opts(L, nargs + 1, bind_new_opts), stream = o + 2;
  int allint = 1;
  for (int i = 1; i <= nargs; i++) allint &= lua_isinteger(L, i);
  dev_dtype dt = bind_check_dtype(L, o, allint ? DEV_I64 : DEV_F32);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  bind_stream(L, stream);
  int64_t n;
  dev_scalar start = {0, 0, 0}, step = {1, 1, 1};
  if (allint) {
    lua_Integer a = nargs >= 2 ? lua_tointeger(L, 1) : 0;
    lua_Integer b = nargs >= 2 ? lua_tointeger(L, 2) : lua_tointeger(L, 1);
    lua_Integer c = nargs == 3 ? lua_tointeger(L, 3) : 1;
    if (c == 0) return luaL_argerror(L, 3, "step must not be zero");
    /* ceil((b - a) / c) without overflow for sane ranges */
    __int128 span = (__int128)b - a;
    __int128 q = c > 0 ? (span + c - 1) / c : (span + c + 1) / c;
    if (q < 0) q = 0;   /* an empty range: an empty tensor, as NumPy */
    if (q > ((int64_t)1 << 48)) return luaL_error(L, "bad argument to 'arange' (range is too large)");
    n = (int64_t)q;
    start = (dev_scalar){1, a, (double)a};
    step = (dev_scalar){1, c, (double)c};
  } else {
    double a = nargs >= 2 ? lua_tonumber(L, 1) : 0;
    double b = nargs >= 2 ? lua_tonumber(L, 2) : lua_tonumber(L, 1);
    double c = nargs == 3 ? lua_tonumber(L, 3) : 1;
    if (c == 0 || c != c) return luaL_argerror(L, 3, "step must be a non-zero number");
    double q = ceil((b - a) / c);
    if (q != q) return luaL_error(L, "bad argument to 'arange' (bounds %f and %f give no range)", a, b);
    if (q < 0) q = 0;   /* an empty range: an empty tensor, as NumPy */
    if (q > (double)((int64_t)1 << 48)) return luaL_error(L, "bad argument to 'arange' (range is too large)");
    n = (int64_t)q;
    start = (dev_scalar){0, 0, a};
    step = (dev_scalar){0, 0, c};
  }
  if (!dev_dtype_is_float(dt) && !allint)
    return luaL_error(L, "bad option 'dtype' (arange with non-integer bounds needs a float dtype)");
  gpu_tensor *t = bind_new_tensor(L, kind, dt, 1, &n, stream, "arange");
  dev_kop op = {.kind = DEV_OP_ARANGE, .out = t->v, .s0 = start, .s1 = step};
  submit(L, stream, &op, 0, 0, 0, "arange");
  return 1;
}

static int random_new(lua_State *L, int normal) {
  const char *fname = normal ? "randn" : "rand";
  int64_t shape[DEV_MAXDIM];
  int ndim = check_shape(L, 1, shape, "shape");
  static const char *const normal_opts[] = {"dtype", "device", "stream", "mean", "std", "seed", NULL};
  static const char *const uniform_opts[] = {"dtype", "device", "stream", "low", "high", "seed", NULL};
  /* slots: o dtype, o + 1 device, o + 2 stream, o + 3 and o + 4 the bounds, o + 5 seed */
  int o = bind_read_opts(L, 2, normal ? normal_opts : uniform_opts), stream = o + 2;
  dev_dtype dt = bind_check_dtype(L, o, DEV_F32);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  bind_stream(L, stream);
  gpu_state *st = bind_state(L);
  if (normal && !dev_dtype_is_float(dt))
    return luaL_error(L, "bad option 'dtype' (randn needs a float dtype, got %s)", dev_dtype_name(dt));
  dev_scalar a, b;
  if (dev_dtype_is_float(dt)) {
    a = (dev_scalar){0, 0, 0};
    b = (dev_scalar){0, 0, 1};
    if (!lua_isnil(L, o + 3)) a = bind_check_scalar(L, o + 3, DEV_F64, 0, normal ? "option 'mean'" : "option 'low'");
    if (!lua_isnil(L, o + 4)) b = bind_check_scalar(L, o + 4, DEV_F64, 0, normal ? "option 'std'" : "option 'high'");
    if (!normal && !(b.f > a.f)) return luaL_error(L, "bad option 'high' (must be greater than 'low')");
    if (normal && !(b.f >= 0)) return luaL_error(L, "bad option 'std' (must be >= 0)");
  } else {
    a = (dev_scalar){1, 0, 0};
    b = (dev_scalar){1, dt == DEV_BOOL ? 2 : (int64_t)1 << 31, 0};
    if (dt == DEV_U8) b.i = 256;
    if (dt == DEV_I8) { a.i = -128; b.i = 128; }
    /* [low, high) must lie in the dtype: low fits, high - 1 fits */
    int64_t maxv = b.i - 1;
    if (!lua_isnil(L, o + 3)) a = bind_check_scalar(L, o + 3, dt == DEV_BOOL ? DEV_U8 : dt, 0, "option 'low'");
    if (!lua_isnil(L, o + 4)) b = bind_check_scalar(L, o + 4, DEV_I64, 0, "option 'high'");
    if (b.i <= a.i) return luaL_error(L, "bad option 'high' (must be greater than 'low')");
    if (dt == DEV_BOOL) maxv = 1;
    else if (dt == DEV_I32) maxv = INT32_MAX;
    else if (dt == DEV_I64) maxv = INT64_MAX;
    if (b.i - 1 > maxv || (dt == DEV_BOOL && a.i > 1))
      return luaL_error(L, "bad option 'high' (%I is beyond %s's range)", (lua_Integer)b.i, dev_dtype_name(dt));
  }
  uint64_t seed = st->seed, offset;
  int64_t n = numel_of(ndim, shape);
  if (!lua_isnil(L, o + 5)) {
    seed = (uint64_t)bind_check_scalar(L, o + 5, DEV_I64, 0, "option 'seed'").i;
    offset = 0;
  } else {
    offset = st->offset;
    st->offset += (uint64_t)n;
  }
  gpu_tensor *t = bind_new_tensor(L, kind, dt, ndim, shape, stream, fname);
  dev_kop op = {.kind = DEV_OP_RAND, .code = normal ? DEV_RAND_NORMAL : DEV_RAND_UNIFORM,
                .out = t->v, .s0 = a, .s1 = b, .seed = seed, .offset = offset};
  submit(L, stream, &op, 0, 0, 0, fname);
  return 1;
}

static int tensor_rand(lua_State *L) { return random_new(L, 0); }
static int tensor_randn(lua_State *L) { return random_new(L, 1); }

/* ---- fields and small methods ---------------------------------------- */

static int t_numel(lua_State *L) {
  lua_pushinteger(L, dev_view_numel(&bind_check_tensor(L, 1)->v));
  return 1;
}

static int t_nbytes(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  lua_pushinteger(L, dev_view_numel(&t->v) * (lua_Integer)dev_dtype_size(t->v.dtype));
  return 1;
}

static int t_is_contiguous(lua_State *L) {
  lua_pushboolean(L, dev_view_contiguous(&bind_check_tensor(L, 1)->v));
  return 1;
}

static int t_len(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim == 0) return luaL_error(L, "length of a 0-dim tensor");
  lua_pushinteger(L, t->v.shape[0]);
  return 1;
}

static int t_release(lua_State *L) {
  gpu_tensor *t = to_tensor(L, 1);
  if (t->v.buf) {
    dev_buf *b = t->v.buf;
    t->v.buf = NULL;
    dev_buf_release(b);
  }
  return 0;
}

/* t.shape, t.dtype, t.device, t.device_index, t.ndim, t.closed (after the
 * methods) */
static int t_fields(lua_State *L) {
  const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  gpu_tensor *t = to_tensor(L, 1);
  lua_settop(L, 2);
  if (!k) return luaL_error(L, "tensors are not indexable with %s (use t:get(i))", luaL_typename(L, 2));
  if (strcmp(k, "closed") == 0) { lua_pushboolean(L, t->v.buf == NULL); return 1; }
  if (!t->v.buf) return luaL_error(L, "tensor is closed");
  if (strcmp(k, "shape") == 0) {
    lua_createtable(L, t->v.ndim, 0);
    for (int d = 0; d < t->v.ndim; d++) {
      lua_pushinteger(L, t->v.shape[d]);
      lua_rawseti(L, -2, d + 1);
    }
  } else if (strcmp(k, "dtype") == 0) {
    lua_pushstring(L, dev_dtype_name(t->v.dtype));
  } else if (strcmp(k, "device") == 0) {
    lua_pushstring(L, kind_name(t));
  } else if (strcmp(k, "device_index") == 0) {
    lua_pushinteger(L, t->v.buf->device);
  } else if (strcmp(k, "ndim") == 0) {
    lua_pushinteger(L, t->v.ndim);
  } else {
    lua_pushnil(L);
  }
  return 1;
}

/* Read all values (C order) into a userdata on the stack top; a counted sync. */
void *bind_tensor_download(lua_State *L, int tidx, int stream, const char *fname) {
  dev_ctx *ctx = bind_ctx(L);
  gpu_tensor *t = bind_check_tensor(L, tidx);
  size_t bytes = (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype);
  void *p = lua_newuserdatauv(L, bytes, 0);
  dev_stream *s = bind_stream(L, stream);
  t = bind_check_tensor(L, tidx);
  bind_call_site(L, ctx, fname);
  int rc = dev_read(ctx, s, &t->v, p);
  /* its pinned staging buffer: collect, reclaim and try once more */
  if (rc == DEV_ERR_NOMEM && bind_reclaim(L, DEV_MEM_PINNED, bytes) == DEV_OK) {
    s = bind_stream(L, stream);
    t = bind_check_tensor(L, tidx);
    rc = dev_read(ctx, s, &t->v, p);
  }
  BIND_CHECK(L, ctx, rc, fname);
  return p;
}

static int t_item(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (dev_view_numel(&t->v) != 1) {
    char sh[MAXSHAPESTR];
    bind_shape_str(sh, sizeof sh, t->v.ndim, t->v.shape);
    return luaL_error(L, "item: tensor has %I elements (shape %s), expected 1",
                      (lua_Integer)dev_view_numel(&t->v), sh);
  }
  void *p = bind_tensor_download(L, 1, bind_read_stream_opt(L, 2), "item");
  bind_push_elem(L, t->v.dtype, p);
  return 1;
}

/* A 0-dim view of element (i, j, ...) given at stack positions first.. */
static dev_view element_view(lua_State *L, gpu_tensor *t, int first, int nidx, const char *fname) {
  if (nidx != t->v.ndim)
    luaL_error(L, "%s: expected %d index%s for a %d-dim tensor, got %d", fname, t->v.ndim,
               t->v.ndim == 1 ? "" : "es", t->v.ndim, nidx);
  dev_view v = t->v;
  for (int d = 0; d < t->v.ndim; d++) {
    int isint;
    lua_Integer i = lua_tointegerx(L, first + d, &isint);
    if (!isint) luaL_typeerror(L, first + d, "integer index");
    if (i < 1 || i > t->v.shape[d])
      luaL_argerror(L, first + d, lua_pushfstring(L, "index %I out of range for dim %d of size %I",
                                                  i, d + 1, (lua_Integer)t->v.shape[d]));
    v.offset += (size_t)((i - 1) * t->v.stride[d]) * dev_dtype_size(t->v.dtype);
  }
  v.ndim = 0;
  return v;
}

static int t_get(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int n = lua_gettop(L) - 1;
  dev_view v = element_view(L, t, 2, n, "get");
  dev_ctx *ctx = bind_ctx(L);
  unsigned char buf[8];
  bind_call_site(L, ctx, "get");
  BIND_CHECK(L, ctx, dev_read(ctx, bind_stream(L, 0), &v, buf), "get");
  bind_push_elem(L, t->v.dtype, buf);
  return 1;
}

static int t_set(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int n = lua_gettop(L) - 2;
  if (n < 0) return luaL_error(L, "set: expected indices and a value");
  dev_view v = element_view(L, t, 2, n, "set");
  dev_scalar s = bind_check_scalar(L, n + 2, t->v.dtype, n + 2, NULL);
  int isint = !dev_dtype_is_float(t->v.dtype);
  bind_tensor_upload(L, v, 1, isint, isint ? (const void *)&s.i : (const void *)&s.f, 0, "set");
  lua_settop(L, 1);
  return 1;
}

static int t_newindex(lua_State *L) {
  return luaL_error(L, "gpu.Tensor fields are read-only (use t:set(i, ..., v), t:fill(v) or t:to(...))");
}

/* ---- views and copies ------------------------------------------------ */

/* A 1-based (or negative, from the end) dim at stack idx, as 0-based.  Errors
 * name argument `arg`, or option 'dim' when arg is 0. */
static int check_dim(lua_State *L, int idx, int arg, int ndim) {
  int isint;
  lua_Integer d = lua_tointegerx(L, idx, &isint);
  const char *msg = NULL;
  if (!isint)
    msg = lua_pushfstring(L, "integer dim expected, got %s", luaL_typename(L, idx));
  else if (d < -ndim || d == 0 || d > ndim)
    msg = lua_pushfstring(L, "dim %I out of range for a %d-dim tensor", d, ndim);
  if (msg) {
    if (arg > 0) luaL_argerror(L, arg, msg);
    luaL_error(L, "bad option 'dim' (%s)", msg);
  }
  return (int)(d < 0 ? d + ndim : d - 1);
}

static int t_narrow(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int d = check_dim(L, 2, 2, t->v.ndim);
  lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
  /* length 0 is an empty view; it may start just past the end */
  if (start < 1 || start > t->v.shape[d] + (len == 0))
    luaL_argerror(L, 3, lua_pushfstring(L, "start %I out of range for dim %d of size %I", start,
                                        d + 1, (lua_Integer)t->v.shape[d]));
  if (len < 0)
    luaL_argerror(L, 4, lua_pushfstring(L, "length must be non-negative, got %I", len));
  if (len > t->v.shape[d] - (start - 1))
    luaL_argerror(L, 4, lua_pushfstring(L, "narrow past the end: start %I with length %I exceeds size %I of dim %d",
                                        start, len, (lua_Integer)t->v.shape[d], d + 1));
  gpu_tensor *r = new_view(L, 1);
  r->v.offset += (size_t)((start - 1) * r->v.stride[d]) * dev_dtype_size(r->v.dtype);
  r->v.shape[d] = len;
  return 1;
}

static int t_view(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t shape[DEV_MAXDIM];
  int ndim;
  if (lua_type(L, 2) == LUA_TTABLE) {
    size_t len = lua_rawlen(L, 2);
    if (len < 1 || len > DEV_MAXDIM) luaL_argerror(L, 2, "shape must have 1 to 8 dims");
    ndim = (int)len;
  } else {
    ndim = lua_gettop(L) - 1;
    if (ndim < 1 || ndim > DEV_MAXDIM) luaL_argerror(L, 2, "shape expected");
  }
  for (int d = 0; d < ndim; d++) {
    int isint;
    if (lua_type(L, 2) == LUA_TTABLE) lua_rawgeti(L, 2, d + 1);
    else lua_pushvalue(L, d + 2);
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    lua_pop(L, 1);
    if (!isint) luaL_argerror(L, 2, lua_pushfstring(L, "shape[%d] must be a non-negative integer or -1", d + 1));
    shape[d] = v;
  }
  bind_infer_shape(L, 2, ndim, shape, &t->v);
  if (!dev_view_contiguous(&t->v))
    luaL_error(L, "view: tensor is not contiguous (use t:contiguous():view(...))");
  gpu_tensor *r = new_view(L, 1);
  dev_view_set_contiguous(&r->v, ndim, shape);
  return 1;
}

static void check_same_numel(lua_State *L, int arg, const gpu_tensor *dst, const gpu_tensor *src) {
  if (dev_view_numel(&dst->v) != dev_view_numel(&src->v)) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, src->v.ndim, src->v.shape);
    bind_shape_str(b, sizeof b, dst->v.ndim, dst->v.shape);
    luaL_argerror(L, arg, lua_pushfstring(L, "shape %s (%I elements) does not match %s (%I elements)",
                                          a, (lua_Integer)dev_view_numel(&src->v), b,
                                          (lua_Integer)dev_view_numel(&dst->v)));
  }
}

/* tensors at stack indices dst and src */
static void copy_into(lua_State *L, int dst, int src, int stream) {
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1};
  op.out = bind_check_tensor(L, dst)->v;
  op.in[0] = bind_check_tensor(L, src)->v;
  submit(L, stream, &op, dst, src, 0, "copy");
}

static int t_copy(lua_State *L) {
  gpu_tensor *dst = bind_check_tensor(L, 1), *src = bind_check_tensor(L, 2);
  int stream = bind_read_stream_opt(L, 3);
  check_same_numel(L, 2, dst, src);
  if (dst->v.dtype != src->v.dtype)
    luaL_argerror(L, 2, lua_pushfstring(L, "dtype %s does not match %s (cast with src:to(\"%s\"))",
                                        dev_dtype_name(src->v.dtype), dev_dtype_name(dst->v.dtype),
                                        dev_dtype_name(dst->v.dtype)));
  copy_into(L, 1, 2, stream);
  lua_settop(L, 1);
  return 1;
}

static int t_clone(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int stream = bind_read_stream_opt(L, 2);
  new_like(L, t, t->v.dtype, t->v.ndim, t->v.shape, stream, "clone");
  copy_into(L, lua_gettop(L), 1, stream);
  return 1;
}

static int t_contiguous(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (dev_view_contiguous(&t->v)) {
    lua_settop(L, 1);
    return 1;
  }
  return t_clone(L);
}

/* t:to(device_or_dtype) or t:to{device =, dtype =} */
static int t_to(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_memkind kind = t->v.buf->kind;
  dev_dtype dt = t->v.dtype;
  static const char *const names[] = {"device", "dtype", "stream", NULL};
  int stream = 0;
  if (lua_type(L, 2) == LUA_TSTRING) {
    const char *x = name_at(L, 2);
    if (!x || (dev_dtype_parse(x, &dt) != 0 && parse_device(L, x, &kind) != 0))
      luaL_argerror(L, 2, lua_pushfstring(L, "unknown device or dtype '%s'", shown_name(L, 2)));
    stream = bind_read_stream_opt(L, 3);
  } else if (lua_type(L, 2) == LUA_TTABLE) {
    int o = bind_read_opts(L, 2, names);
    dt = bind_check_dtype(L, o + 1, dt);
    kind = bind_check_device(L, o, kind);
    stream = o + 2;
  } else {
    luaL_typeerror(L, 2, "device or dtype name, or table");
  }
  dev_view tv = t->v;
  dev_memkind tkind = t->v.buf->kind;
  if (kind == tkind && dt == tv.dtype) {
    bind_new_tensor(L, kind, dt, tv.ndim, tv.shape, stream, "to");
    copy_into(L, lua_gettop(L), 1, stream);
    return 1;
  }
  /* Cast where the data is, then move it. */
  int src = 1;
  if (dt != tv.dtype) {
    gpu_tensor *c = bind_new_tensor(L, tkind, dt, tv.ndim, tv.shape, stream, "to");
    dev_kop op = {.kind = DEV_OP_UNARY, .code = DEV_UN_COPY, .nin = 1, .out = c->v};
    op.in[0] = tv;
    src = lua_gettop(L);
    submit(L, stream, &op, 0, 1, 0, "to");
  }
  if (kind != tkind) {
    bind_new_tensor(L, kind, dt, tv.ndim, tv.shape, stream, "to");
    copy_into(L, lua_gettop(L), src, stream);
  }
  return 1;
}

static int t_fill(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_scalar v = bind_check_scalar(L, 2, t->v.dtype, 2, NULL);
  dev_kop op = {.kind = DEV_OP_FILL, .out = t->v, .s0 = v};
  submit_on(L, bind_stream(L, bind_read_stream_opt(L, 3)), &op, 1, 0, 0, "fill");
  lua_settop(L, 1);
  return 1;
}

/* all bits zero is 0 in every dtype */
static int t_zero_(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_stream *s = bind_stream(L, bind_read_stream_opt(L, 2));
  dev_ctx *ctx = dev_stream_ctx(s);
  t = bind_check_tensor(L, 1);
  bind_call_site(L, ctx, "zero_");
  int rc;
  if (dev_view_contiguous(&t->v)) {
    rc = dev_memset(ctx, s, t->v.buf, t->v.offset,
                    0, (size_t)dev_view_numel(&t->v) * dev_dtype_size(t->v.dtype));
  } else {
    dev_kop op = {.kind = DEV_OP_FILL, .out = t->v, .s0 = {1, 0, 0}};
    rc = dev_submit(ctx, s, &op);
  }
  BIND_CHECK(L, ctx, rc, "zero_");
  lua_settop(L, 1);
  return 1;
}

/* ---- elementwise ----------------------------------------------------- */

/* Kernels take operands from one memory: the device, or host memory (pinned
 * and pageable mix: such ops run on the calling thread). */
static int compatible(dev_memkind a, dev_memkind b) {
  return a == b || (a != DEV_MEM_DEVICE && b != DEV_MEM_DEVICE);
}

static void same_kind(lua_State *L, int arg, const gpu_tensor *a, const gpu_tensor *b) {
  if (!compatible(a->v.buf->kind, b->v.buf->kind))
    luaL_argerror(L, arg, lua_pushfstring(L, "tensor is in %s memory, expected %s (move it with :to(\"%s\"))",
                                          kind_name(b), kind_name(a), kind_name(a)));
}

/* The out option's value at index out, checked against the result's dtype
 * and shape, else a new tensor for the stream option's value at stream:
 * pushed. */
static gpu_tensor *opt_out(lua_State *L, int out, int stream, const gpu_tensor *like, dev_dtype dt, int ndim,
                           const int64_t *shape, const char *fname) {
  if (lua_isnil(L, out)) return new_like(L, like, dt, ndim, shape, stream, fname);
  lua_pushvalue(L, out);
  gpu_tensor *o = bind_test_tensor_handle(L, -1);
  if (!o) luaL_error(L, "bad option 'out' to '%s' (gpu.Tensor expected, got %s)", fname, luaL_typename(L, -1));
  if (!o->v.buf) luaL_error(L, "bad option 'out' to '%s' (tensor is closed)", fname);
  int same = o->v.ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = o->v.shape[d] == shape[d];
  if (!same || o->v.dtype != dt) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, o->v.ndim, o->v.shape);
    bind_shape_str(b, sizeof b, ndim, shape);
    luaL_error(L, "bad option 'out' to '%s' (%s %s does not match the result %s %s)", fname,
               dev_dtype_name(o->v.dtype), a, dev_dtype_name(dt), b);
  }
  if (!compatible(o->v.buf->kind, like->v.buf->kind))
    luaL_error(L, "bad option 'out' to '%s' (tensor is in %s memory, expected %s)", fname,
               kind_name(o), kind_name(like));
  return o;
}

/* the options of the ops that make a tensor: slots o (out) and o + 1 (stream) */
const char *const bind_out_opts[] = {"out", "stream", NULL};

/* An op's dtype rule (ops.h), checked before anything is allocated. */
static int takes(const dev_opinfo *o, dev_dtype t) { return (dev_dtype_class(t) & o->classes) != 0; }

static int unary(lua_State *L, dev_unop code, int inplace) {
  const dev_opinfo *info = dev_unop_info(code);
  const char *fname = info->name;
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_dtype dt = t->v.dtype, rdt = info->to_bool ? DEV_BOOL : dt;
  if (!takes(info, dt))
    luaL_error(L, "%s: not supported for %s (needs a %s dtype)", fname, dev_dtype_name(dt),
               info->classes == DEV_CLS_F ? "float" : "numeric");
  int o = bind_read_opts(L, 2, bind_out_opts);
  dev_view tv = t->v;
  gpu_tensor *r = inplace ? t : opt_out(L, o, o + 1, t, rdt, tv.ndim, tv.shape, fname);
  dev_kop op = {.kind = DEV_OP_UNARY, .code = code, .nin = 1, .out = r->v};
  op.in[0] = tv;
  submit(L, o + 1, &op, inplace ? 1 : lua_gettop(L), 1, 0, fname);
  if (inplace) lua_settop(L, 1);
  return 1;
}

/* t:name(opts), and t:name_(opts) in place when the result has t's dtype */
#define UNARY_FUNCS(E, name, cls, res, fl)                                  \
  static int t_##name(lua_State *L) { return unary(L, DEV_UN_##E, 0); }     \
  DEV_IF_SAME(res, static int t_##name##_(lua_State *L) { return unary(L, DEV_UN_##E, 1); })
DEV_UNARY_OPS(UNARY_FUNCS)
#undef UNARY_FUNCS

static int t_unm(lua_State *L) {
  lua_settop(L, 1);
  return unary(L, DEV_UN_NEG, 0);
}

/* numpy broadcasting of n views: the result's shape, and each view expanded
 * to it (stride 0 along the dims it broadcasts); -1 when they do not
 * broadcast. */
static int broadcast_n(int n, const dev_view *const *in, dev_view *ex, int *ndim, int64_t *shape) {
  int nd = 0;
  for (int i = 0; i < n; i++)
    if (in[i]->ndim > nd) nd = in[i]->ndim;
  for (int d = nd - 1; d >= 0; d--) {
    int64_t sz = 1;
    for (int i = 0; i < n; i++) {
      int di = d - (nd - in[i]->ndim);
      int64_t si = di >= 0 ? in[i]->shape[di] : 1;
      if (si == 1) continue;
      if (sz != 1 && sz != si) return -1;
      sz = si;
    }
    shape[d] = sz;
  }
  for (int i = 0; i < n; i++) {
    ex[i] = *in[i];
    ex[i].ndim = nd;
    for (int d = 0; d < nd; d++) {
      int di = d - (nd - in[i]->ndim);
      ex[i].shape[d] = shape[d];
      ex[i].stride[d] = di >= 0 && in[i]->shape[di] != 1 ? in[i]->stride[di] : 0;
    }
  }
  *ndim = nd;
  return 0;
}

static int broadcast(const dev_view *a, const dev_view *b, dev_view *ea, dev_view *eb,
                     int *ndim, int64_t *shape) {
  const dev_view *in[2] = {a, b};
  dev_view ex[2];
  if (broadcast_n(2, in, ex, ndim, shape)) return -1;
  *ea = ex[0];
  *eb = ex[1];
  return 0;
}

static int binary_op(lua_State *L, dev_binop code, int ia, int ib, int opts, int inplace, int scalar_left) {
  const dev_opinfo *info = dev_binop_info(code);
  const char *fname = info->name;
  gpu_tensor *t = bind_check_tensor(L, ia);
  dev_dtype dt = t->v.dtype, rdt = info->to_bool ? DEV_BOOL : dt;
  if (!takes(info, dt)) luaL_error(L, "%s: not supported for %s", fname, dev_dtype_name(dt));
  int out = bind_read_opts(L, opts, bind_out_opts), stream = out + 1;
  dev_kop op = {.kind = DEV_OP_BINARY, .code = code};
  gpu_tensor *x = bind_test_tensor(L, ib);
  int ndim = 0;
  int64_t shape[DEV_MAXDIM];
  if (x) {
    if (x->v.dtype != dt)
      luaL_argerror(L, ib, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                           dev_dtype_name(x->v.dtype), dev_dtype_name(dt), dev_dtype_name(dt)));
    same_kind(L, ib, t, x);
    if (broadcast(&t->v, &x->v, &op.in[0], &op.in[1], &ndim, shape)) {
      char a[MAXSHAPESTR], b[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, t->v.ndim, t->v.shape);
      bind_shape_str(b, sizeof b, x->v.ndim, x->v.shape);
      luaL_argerror(L, ib, lua_pushfstring(L, "shape %s cannot be broadcast with %s", b, a));
    }
    op.nin = 2;
  } else {
    if (lua_type(L, ib) != LUA_TNUMBER && !(dt == DEV_BOOL && lua_isboolean(L, ib)))
      luaL_typeerror(L, ib, "gpu.Tensor or number");
    op.s0 = bind_check_scalar(L, ib, dt, ib, NULL);
    /* a comparison sees the number as the tensor's dtype holds it (0.1 as
     * f16 is 0.0999755859375), as NumPy does */
    if (info->to_bool) op.s0 = dev_scalar_as(op.s0, dt);
    if (is_intdt(dt) && op.s0.i == 0 && (info->flags & DEV_OPF_ZDIV) && !scalar_left)
      luaL_error(L, "%s: integer division by zero", fname);
    if (is_intdt(dt) && op.s0.i < 0 && code == DEV_BIN_POW && !scalar_left)
      luaL_error(L, "%s: integers to negative integer powers are not allowed", fname);
    op.nin = 1;
    op.flags = DEV_F_SCALAR | (scalar_left ? DEV_F_SCALAR_LEFT : 0);
    op.in[0] = t->v;
    ndim = t->v.ndim;
    memcpy(shape, t->v.shape, sizeof shape);
  }
  gpu_tensor *o;
  if (inplace) {
    int same = ndim == t->v.ndim;
    for (int d = 0; same && d < ndim; d++) same = shape[d] == t->v.shape[d];
    if (!same) {
      char a[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, ndim, shape);
      luaL_error(L, "%s_: result shape %s does not fit the tensor written in place", fname, a);
    }
    o = t;
  } else {
    o = opt_out(L, out, stream, t, rdt, ndim, shape, fname);
  }
  op.out = o->v;
  submit(L, stream, &op, inplace ? ia : lua_gettop(L), ia, x ? ib : 0, fname);
  if (inplace) lua_settop(L, ia);
  return 1;
}

/* t:name(x, opts), and t:name_(x, opts) in place when the result has t's dtype */
#define BINARY_FUNCS(E, name, cls, res, fl)                                                    \
  static int t_bin_##name(lua_State *L) { return binary_op(L, DEV_BIN_##E, 1, 2, 3, 0, 0); } \
  DEV_IF_SAME(res, static int t_bin_##name##_(lua_State *L) { return binary_op(L, DEV_BIN_##E, 1, 2, 3, 1, 0); })
DEV_BINARY_OPS(BINARY_FUNCS)
#undef BINARY_FUNCS

/* a op b where either may be a number */
static int meta_binary(lua_State *L, dev_binop code) {
  lua_settop(L, 2);
  lua_pushnil(L);  /* opts at 3 */
  if (bind_test_tensor_handle(L, 1)) return binary_op(L, code, 1, 2, 3, 0, 0);
  return binary_op(L, code, 2, 1, 3, 0, 1);
}

static int t_meta_add(lua_State *L) { return meta_binary(L, DEV_BIN_ADD); }
static int t_meta_sub(lua_State *L) { return meta_binary(L, DEV_BIN_SUB); }
static int t_meta_mul(lua_State *L) { return meta_binary(L, DEV_BIN_MUL); }
static int t_meta_div(lua_State *L) { return meta_binary(L, DEV_BIN_DIV); }
static int t_meta_pow(lua_State *L) { return meta_binary(L, DEV_BIN_POW); }
static int t_meta_mod(lua_State *L) { return meta_binary(L, DEV_BIN_REMAINDER); }
static int t_meta_idiv(lua_State *L) { return meta_binary(L, DEV_BIN_FLOOR_DIVIDE); }

/* ---- reductions ------------------------------------------------------ */

/* sum, mean, ... are in tensor_reduce.c; max and min are also elementwise */

/* max/min: elementwise with an operand (a bool tensor's may be a boolean),
 * a reduction without */
static int has_operand(lua_State *L) {
  return lua_type(L, 2) == LUA_TNUMBER || lua_isboolean(L, 2) || bind_test_tensor_handle(L, 2);
}

static int t_max(lua_State *L) {
  if (has_operand(L)) return binary_op(L, DEV_BIN_MAX, 1, 2, 3, 0, 0);
  return bind_tensor_reduce(L, DEV_RED_MAX);
}

static int t_min(lua_State *L) {
  if (has_operand(L)) return binary_op(L, DEV_BIN_MIN, 1, 2, 3, 0, 0);
  return bind_tensor_reduce(L, DEV_RED_MIN);
}

/* ---- selecting: where, masked_fill ------------------------------------ */

static void check_cond(lua_State *L, int arg, const gpu_tensor *c, const char *what) {
  if (c->v.dtype != DEV_BOOL)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s must be a bool tensor, got %s (make one with t:ne(0), t:gt(x), ...)",
                                          what, dev_dtype_name(c->v.dtype)));
}

/* Operand arg of a ternary op: a tensor (the caller takes it), or a number
 * for dtype dt, into s, with flag set in op. */
static void ternary_operand(lua_State *L, int arg, dev_dtype dt, dev_kop *op, int flag, dev_scalar *s) {
  if (bind_test_tensor(L, arg)) return;
  if (lua_type(L, arg) != LUA_TNUMBER && !(dt == DEV_BOOL && lua_isboolean(L, arg)))
    luaL_typeerror(L, arg, "gpu.Tensor or number");
  *s = bind_check_scalar(L, arg, dt, arg, NULL);
  op->flags |= flag;
}

/* gpu.where(cond, a, b, opts): cond ? a : b elementwise, cond a bool tensor,
 * a and b tensors of one dtype or numbers (both numbers: opts.dtype, f32 by
 * default), all broadcast together. */
static int tensor_where(lua_State *L) {
  gpu_tensor *c = bind_check_tensor(L, 1);
  check_cond(L, 1, c, "condition");
  /* the operands before the options' slots, which may take their places */
  for (int arg = 2; arg <= 3; arg++)
    if (lua_isnone(L, arg)) luaL_typeerror(L, arg, "gpu.Tensor or number");
  static const char *const names[] = {"out", "stream", "dtype", NULL};
  int o = bind_read_opts(L, 4, names);
  gpu_tensor *a = bind_test_tensor(L, 2), *b = bind_test_tensor(L, 3), *first = a ? a : b;
  if (a && b && a->v.dtype != b->v.dtype)
    luaL_argerror(L, 3, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                        dev_dtype_name(b->v.dtype), dev_dtype_name(a->v.dtype), dev_dtype_name(a->v.dtype)));
  dev_dtype dt = bind_check_dtype(L, o + 2, first ? first->v.dtype : DEV_F32);
  if (first && dt != first->v.dtype)
    luaL_error(L, "bad option 'dtype' to 'where' (%s; the result takes the dtype of the tensors, %s)",
               dev_dtype_name(dt), dev_dtype_name(first->v.dtype));
  dev_kop op = {.kind = DEV_OP_TERNARY, .code = DEV_TER_WHERE};
  ternary_operand(L, 2, dt, &op, DEV_F_SCALAR2, &op.s0);
  ternary_operand(L, 3, dt, &op, DEV_F_SCALAR3, &op.s1);
  const dev_view *in[3] = {&c->v};
  int idx[3] = {1}, n = 1;
  if (a) { same_kind(L, 2, c, a); in[n] = &a->v; idx[n++] = 2; }
  if (b) { same_kind(L, 3, c, b); in[n] = &b->v; idx[n++] = 3; }
  int ndim;
  int64_t shape[DEV_MAXDIM];
  if (broadcast_n(n, in, op.in, &ndim, shape)) {
    char sc[MAXSHAPESTR], sa[MAXSHAPESTR], sb[MAXSHAPESTR];
    bind_shape_str(sc, sizeof sc, c->v.ndim, c->v.shape);
    if (a) bind_shape_str(sa, sizeof sa, a->v.ndim, a->v.shape); else snprintf(sa, sizeof sa, "(number)");
    if (b) bind_shape_str(sb, sizeof sb, b->v.ndim, b->v.shape); else snprintf(sb, sizeof sb, "(number)");
    luaL_error(L, "where: shapes %s, %s and %s cannot be broadcast together", sc, sa, sb);
  }
  op.nin = n;
  op.out = opt_out(L, o, o + 1, c, dt, ndim, shape, "where")->v;
  submit_views(L, bind_stream(L, o + 1), &op, lua_gettop(L), idx, n, "where");
  return 1;
}

/* t:masked_fill(mask, v, opts): v where mask (a bool tensor broadcast to t's
 * shape) is true, t elsewhere; masked_fill_ in place. */
static int masked_fill(lua_State *L, int inplace) {
  const char *fname = inplace ? "masked_fill_" : "masked_fill";
  gpu_tensor *t = bind_check_tensor(L, 1), *m = bind_check_tensor(L, 2);
  check_cond(L, 2, m, "mask");
  dev_dtype dt = t->v.dtype;
  same_kind(L, 2, t, m);
  dev_kop op = {.kind = DEV_OP_TERNARY, .code = DEV_TER_WHERE, .nin = 2};
  if (lua_type(L, 3) != LUA_TNUMBER && !(dt == DEV_BOOL && lua_isboolean(L, 3)))
    luaL_typeerror(L, 3, "number");
  op.s0 = bind_check_scalar(L, 3, dt, 3, NULL);
  /* in place, no out: slots out 0 and stream o; else o and o + 1 */
  int o = inplace ? bind_read_stream_opt(L, 4) : bind_read_opts(L, 4, bind_out_opts);
  int out = inplace ? 0 : o, stream = inplace ? o : o + 1;
  op.flags = DEV_F_SCALAR2;
  const dev_view *in[2] = {&m->v, &t->v};
  int ndim, same;
  int64_t shape[DEV_MAXDIM];
  same = broadcast_n(2, in, op.in, &ndim, shape) == 0 && ndim == t->v.ndim;
  for (int d = 0; same && d < ndim; d++) same = shape[d] == t->v.shape[d];
  if (!same) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, m->v.ndim, m->v.shape);
    bind_shape_str(b, sizeof b, t->v.ndim, t->v.shape);
    luaL_argerror(L, 2, lua_pushfstring(L, "mask shape %s cannot be broadcast to the tensor's %s", a, b));
  }
  dev_view tv = t->v;
  op.out = inplace ? t->v : opt_out(L, out, stream, t, dt, tv.ndim, tv.shape, fname)->v;
  int idx[2] = {2, 1};
  submit_views(L, bind_stream(L, stream), &op, inplace ? 1 : lua_gettop(L), idx, 2, fname);
  if (inplace) lua_settop(L, 1);
  return 1;
}

static int t_masked_fill(lua_State *L) { return masked_fill(L, 0); }
static int t_masked_fill_(lua_State *L) { return masked_fill(L, 1); }

/* t:clamp(lo, hi, opts): min(max(t, lo), hi); lo and hi numbers, tensors of
 * t's dtype or nil (no bound; not both), all broadcast; clamp_ in place. */
static int clamp(lua_State *L, int inplace) {
  const char *fname = inplace ? "clamp_" : "clamp";
  const dev_opinfo *info = dev_terop_info(DEV_TER_CLAMP);
  gpu_tensor *t = bind_check_tensor(L, 1);
  dev_dtype dt = t->v.dtype;
  if (!takes(info, dt))
    luaL_error(L, "%s: not supported for %s (needs a numeric dtype)", fname, dev_dtype_name(dt));
  /* in place, no out: slots out 0 and stream o; else o and o + 1 */
  int o = inplace ? bind_read_stream_opt(L, 4) : bind_read_opts(L, 4, bind_out_opts);
  int out = inplace ? 0 : o, stream = inplace ? o : o + 1;
  if (lua_isnoneornil(L, 2) && lua_isnoneornil(L, 3)) luaL_error(L, "%s: give lo, hi or both", fname);
  dev_kop op = {.kind = DEV_OP_TERNARY, .code = DEV_TER_CLAMP};
  /* a missing bound is the one that changes nothing */
  dev_scalar none[2] = {{0, 0, -HUGE_VAL}, {0, 0, HUGE_VAL}};
  if (!dev_dtype_is_float(dt)) {
    none[0] = (dev_scalar){1, INT64_MIN, 0};
    none[1] = (dev_scalar){1, INT64_MAX, 0};
  }
  const dev_view *in[3] = {&t->v};
  int idx[3] = {1}, n = 1;
  for (int k = 0; k < 2; k++) {
    int arg = 2 + k, flag = k ? DEV_F_SCALAR3 : DEV_F_SCALAR2;
    dev_scalar *s = k ? &op.s1 : &op.s0;
    gpu_tensor *b = bind_test_tensor(L, arg);
    if (b) {
      if (b->v.dtype != dt)
        luaL_argerror(L, arg, lua_pushfstring(L, "dtype %s does not match %s (cast with :to(\"%s\"))",
                                              dev_dtype_name(b->v.dtype), dev_dtype_name(dt), dev_dtype_name(dt)));
      same_kind(L, arg, t, b);
      in[n] = &b->v;
      idx[n++] = arg;
    } else if (lua_isnoneornil(L, arg)) {
      *s = none[k];
      op.flags |= flag;
    } else {
      ternary_operand(L, arg, dt, &op, flag, s);
    }
  }
  int ndim, same;
  int64_t shape[DEV_MAXDIM];
  if (broadcast_n(n, in, op.in, &ndim, shape)) luaL_error(L, "%s: the bounds' shapes cannot be broadcast with the tensor's", fname);
  same = ndim == t->v.ndim;
  for (int d = 0; same && d < ndim; d++) same = shape[d] == t->v.shape[d];
  if (inplace && !same) {
    char a[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, ndim, shape);
    luaL_error(L, "%s: result shape %s does not fit the tensor written in place", fname, a);
  }
  op.nin = n;
  op.out = inplace ? t->v : opt_out(L, out, stream, t, dt, ndim, shape, fname)->v;
  submit_views(L, bind_stream(L, stream), &op, inplace ? 1 : lua_gettop(L), idx, n, fname);
  if (inplace) lua_settop(L, 1);
  return 1;
}

static int t_clamp(lua_State *L) { return clamp(L, 0); }
static int t_clamp_(lua_State *L) { return clamp(L, 1); }

/* ---- matmul ---------------------------------------------------------- */

/* v as a 3-D view of batch size nb: a 2-D one (or a batch of one) repeats
 * with batch stride 0, without a copy. */
static dev_view as_batch(const dev_view *v, int64_t nb) {
  if (v->ndim == 3 && v->shape[0] == nb) return *v;
  dev_view w = *v;
  int r = v->ndim - 2;
  w.ndim = 3;
  w.shape[0] = nb;
  w.stride[0] = 0;
  for (int d = 0; d < 2; d++) {
    w.shape[d + 1] = v->shape[r + d];
    w.stride[d + 1] = v->stride[r + d];
  }
  return w;
}

/* gpu.matmul(a, b [, opts]) / a:matmul(b): 2-D @ 2-D, or batched: either
 * operand 3-D {batch, rows, cols}, a 2-D one or a batch of one broadcast to
 * the other's batch.  Transposed and other strided views go to the backend
 * as they are (cuBLAS transpose flags, strided batches; no copy). */
static int t_matmul(lua_State *L) {
  gpu_tensor *a = bind_check_tensor(L, 1), *b = bind_check_tensor(L, 2);
  int o = bind_read_opts(L, 3, bind_out_opts);
  if (a->v.ndim != 2 && a->v.ndim != 3)
    luaL_argerror(L, 1, lua_pushfstring(L, "matmul needs a 2-D or 3-D tensor, got %d-D", a->v.ndim));
  if (b->v.ndim != 2 && b->v.ndim != 3)
    luaL_argerror(L, 2, lua_pushfstring(L, "matmul needs a 2-D or 3-D tensor, got %d-D", b->v.ndim));
  int ra = a->v.ndim - 2, rb = b->v.ndim - 2;
  char sa[MAXSHAPESTR], sb[MAXSHAPESTR];
  bind_shape_str(sa, sizeof sa, a->v.ndim, a->v.shape);
  bind_shape_str(sb, sizeof sb, b->v.ndim, b->v.shape);
  if (a->v.shape[ra + 1] != b->v.shape[rb])
    luaL_argerror(L, 2, lua_pushfstring(L, "a %s @ b %s: a's dim %d (%I) differs from b's dim %d (%I)",
                                        sa, sb, ra + 2, (lua_Integer)a->v.shape[ra + 1], rb + 1,
                                        (lua_Integer)b->v.shape[rb]));
  int64_t na = ra ? a->v.shape[0] : 1, nbt = rb ? b->v.shape[0] : 1;
  if (na != nbt && na != 1 && nbt != 1)
    luaL_argerror(L, 2, lua_pushfstring(L, "a %s @ b %s: batch sizes %I and %I differ (and neither is 1)",
                                        sa, sb, (lua_Integer)na, (lua_Integer)nbt));
  if (a->v.dtype != b->v.dtype)
    luaL_argerror(L, 2, lua_pushfstring(L, "dtype %s does not match %s", dev_dtype_name(b->v.dtype),
                                        dev_dtype_name(a->v.dtype)));
  if (a->v.dtype == DEV_BOOL) luaL_argerror(L, 1, "matmul is not supported for bool");
  same_kind(L, 2, a, b);
  int batched = ra || rb;
  int64_t nb = na == 1 ? nbt : na;   /* the other batch broadcasts; 0 stays 0 */
  int64_t shape[3] = {nb, a->v.shape[ra], b->v.shape[rb + 1]};
  dev_view av = a->v, bv = b->v;
  gpu_tensor *r = opt_out(L, o, o + 1, a, a->v.dtype, batched ? 3 : 2, batched ? shape : shape + 1, "matmul");
  dev_kop op = {.kind = DEV_OP_MATMUL, .nin = 2, .out = r->v};
  op.in[0] = batched ? as_batch(&av, nb) : av;
  op.in[1] = batched ? as_batch(&bv, nb) : bv;
  submit(L, o + 1, &op, lua_gettop(L), 1, 2, "matmul");
  return 1;
}

/* ---- for the other tensor files (tensor.h) ----------------------------- */

int bind_tensor_dim(lua_State *L, int idx, int arg, int ndim) { return check_dim(L, idx, arg, ndim); }

gpu_tensor *bind_tensor_out(lua_State *L, int out, int stream, const gpu_tensor *like, dev_dtype dt, int ndim,
                            const int64_t *shape, const char *fname) {
  return opt_out(L, out, stream, like, dt, ndim, shape, fname);
}

void bind_tensor_same_kind(lua_State *L, int arg, const gpu_tensor *a, const gpu_tensor *b) {
  same_kind(L, arg, a, b);
}

void bind_tensor_submit(lua_State *L, int stream, dev_kop *op, int out, const int *in, int nin, const char *fname) {
  submit_views(L, bind_stream(L, stream), op, out, in, nin, fname);
}

/* ---- registration ---------------------------------------------------- */

static const luaL_Reg methods[] = {
  {"numel", t_numel}, {"nbytes", t_nbytes}, {"is_contiguous", t_is_contiguous},
  {"item", t_item}, {"get", t_get}, {"set", t_set}, {"totable", bind_tensor_totable},
  {"narrow", t_narrow}, {"view", t_view}, {"contiguous", t_contiguous}, {"clone", t_clone},
  {"copy", t_copy}, {"to", t_to}, {"fill", t_fill}, {"zero_", t_zero_},
  {"max", t_max}, {"min", t_min},
  {"masked_fill", t_masked_fill}, {"masked_fill_", t_masked_fill_}, {"clamp", t_clamp}, {"clamp_", t_clamp_},
  {"matmul", t_matmul},
  {"save", bind_tensor_save},
  {"close", t_release},
  {NULL, NULL}
};

static const luaL_Reg metamethods[] = {
  {"__index", t_fields},
  {"__newindex", t_newindex},
  {"__add", t_meta_add}, {"__sub", t_meta_sub}, {"__mul", t_meta_mul},
  {"__div", t_meta_div}, {"__pow", t_meta_pow}, {"__mod", t_meta_mod}, {"__idiv", t_meta_idiv},
  {"__unm", t_unm},
  {"__len", t_len},
  {"__tostring", bind_tensor_tostring},
  {"__gc", t_release},
  {"__close", t_release},
  {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"empty", tensor_empty}, {"zeros", tensor_zeros}, {"ones", tensor_ones},
  {"full", tensor_full}, {"arange", tensor_arange}, {"rand", tensor_rand},
  {"randn", tensor_randn}, {"tensor", bind_tensor_from}, {"pinned", tensor_pinned},
  {"matmul", t_matmul}, {"where", tensor_where},
  {NULL, NULL}
};

/* The ops of ops.h, one method each (and one with `_`, in place, where the
 * result has the tensor's dtype).  Added after methods[], where a method of
 * the same name (max, min: also reductions) wins. */
#define UNARY_REG(E, name, cls, res, fl) {#name, t_##name}, DEV_IF_SAME(res, {#name "_", t_##name##_},)
#define BINARY_REG(E, name, cls, res, fl) {#name, t_bin_##name}, DEV_IF_SAME(res, {#name "_", t_bin_##name##_},)
static const luaL_Reg op_methods[] = {
  DEV_UNARY_OPS(UNARY_REG)
  DEV_BINARY_OPS(BINARY_REG)
  {NULL, NULL}
};
#undef UNARY_REG
#undef BINARY_REG

int bind_open_tensor(lua_State *L) {
  bind_newtype(L, &bind_tensor_type, metamethods, methods);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &bind_tensor_type);
  lua_getfield(L, -1, "__methods");
  for (const luaL_Reg *r = op_methods; r->name; r++) {
    if (lua_getfield(L, -1, r->name) == LUA_TNIL) {
      lua_pushcfunction(L, r->func);
      lua_setfield(L, -3, r->name);
    }
    lua_pop(L, 1);
  }
  luaL_setfuncs(L, bind_tensor_reduce_methods, 0);
  lua_pop(L, 2);
  luaL_setfuncs(L, funcs, 0);
  bind_open_tensor_view(L);
  return 0;
}
