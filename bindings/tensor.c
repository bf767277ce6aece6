/* gpu.Tensor, the type: metadata on the host, data where `device` says
 * (device, pinned or pageable host memory).  Here: its handle (check, push,
 * new), what the tensor files share (argument readers, the out option,
 * submitting an op, uploads and downloads), its fields, close and __gc, and
 * its method table, assembled from the files of each concern:
 *
 *   tensor_new.c          construction: empty zeros ones full arange linspace
 *                         eye rand randn randint pinned, *_like, cat, stack
 *   tensor_table.c        gpu.tensor from nested tables, t:totable
 *   tensor_copy.c         whole-tensor writes: copy clone contiguous to fill zero_
 *   tensor_view.c         views: view reshape narrow slice select transpose t
 *                         permute expand squeeze unsqueeze split chunk
 *   tensor_elementwise.c  the ops of cuda/ops.h (generated from its rows), their
 *                         metamethods, where, clamp; max/min
 *   tensor_reduce.c       the reductions of cuda/ops.h (generated), cumsum, cumprod,
 *                         softmax
 *   tensor_sort.c         sort argsort topk
 *   tensor_reorder.c      flip roll (index_select, copies of views), tril triu
 *   tensor_index.c        item get set, index_select gather scatter_add_, masked_fill
 *   tensor_matmul.c       matmul
 *   tensor_compose.c      ops made of the table's ops: isclose allclose nan_to_num
 *   tensor_format.c       printing (__tostring)
 *
 * Every op checks its arguments in its file, builds a dev_kop and hands it to
 * the device layer, which queues it on a stream (or runs it here when all its
 * memory is host memory). */
#include <stdio.h>
#include <string.h>

#include "tensor.h"

/* ---- the handle and what the tensor files share ------------------------ */

void bind_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "{");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)shape[d]);
  if (k < n) snprintf(buf + k, n - k, "}");
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
  size_t bytes = (size_t)bind_numel_of(ndim, shape) * dev_dtype_size(dt);
  dev_buf *b = bind_alloc(L, kind, bytes, stream, fname);
  t->v.dtype = dt;
  dev_view_set_contiguous(&t->v, ndim, shape);
  t->v.buf = b;
  return t;
}

gpu_tensor *bind_tensor_like(lua_State *L, const gpu_tensor *like, dev_dtype dt, int ndim,
                             const int64_t *shape, int stream, const char *fname) {
  if (!like->v.buf) luaL_error(L, "%s: tensor is closed", fname);
  return bind_new_tensor(L, like->v.buf->kind, dt, ndim, shape, stream, fname);
}

/* A new handle on the same storage (views); base at stack index idx. */
gpu_tensor *bind_tensor_view_of(lua_State *L, int idx) {
  gpu_tensor *t = bind_push_tensor_handle(L);
  gpu_tensor *base = bind_check_tensor(L, idx);
  t->v = base->v;
  dev_buf_retain(t->v.buf);
  return t;
}

/* Enqueue op.  The buffers of its views are taken from the tensors at stack
 * indices out and in[0..nin) (0: keep the view's buffer), here, after the
 * binding's last Lua allocation (see common.h), on stream s. */
void bind_tensor_submit_on(lua_State *L, dev_stream *s, dev_kop *op, int out, const int *in, int nin,
                           const char *fname) {
  dev_ctx *ctx = dev_stream_ctx(s);
  if (out) op->out.buf = bind_check_tensor(L, out)->v.buf;
  for (int i = 0; i < nin; i++)
    if (in[i]) op->in[i].buf = bind_check_tensor(L, in[i])->v.buf;
  bind_call_site(L, ctx, fname);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, op), fname);
}

void bind_tensor_submit(lua_State *L, int stream, dev_kop *op, int out, const int *in, int nin, const char *fname) {
  bind_tensor_submit_on(L, bind_stream(L, stream), op, out, in, nin, fname);
}

/* The string at idx as a name: NULL when it holds a zero byte, which the
 * C string would cut short ("f32\0junk" is not f32). */
const char *bind_name_at(lua_State *L, int idx) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  return s && strlen(s) == n ? s : NULL;
}

/* A string at idx for C: raises (argument idx) when it holds a zero byte;
 * the string, or NULL for any other value (the caller checks those). */
const char *bind_check_cstring(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TSTRING) return NULL;
  if (!bind_name_at(L, idx)) luaL_argerror(L, idx, "a string with a zero byte");
  return lua_tostring(L, idx);
}

/* A field's key at idx: one with a zero byte names no field, so it comes
 * back as it is shown ("name\0..."), which matches none. */
const char *bind_check_key(lua_State *L, int idx) {
  luaL_checkstring(L, idx);
  return bind_shown_name(L, idx);
}

/* How a bad name is shown: "f32\0..." for one with a zero byte. */
const char *bind_shown_name(lua_State *L, int idx) {
  const char *s = lua_tostring(L, idx);
  return bind_name_at(L, idx) ? s : lua_pushfstring(L, "%s\\0...", s);
}

dev_dtype bind_check_dtype(lua_State *L, int idx, dev_dtype dflt) {
  dev_dtype dt = dflt;
  if (!lua_isnil(L, idx)) {
    if (lua_type(L, idx) != LUA_TSTRING)
      luaL_error(L, "bad option 'dtype' (string expected, got %s)", luaL_typename(L, idx));
    const char *name = bind_name_at(L, idx);
    if (!name || dev_dtype_parse(name, &dt))
      luaL_error(L, "bad option 'dtype' (unknown dtype '%s'; expected %s)", bind_shown_name(L, idx),
                 bind_push_names(L, dev_dtype_names, 0));
  }
  return dt;
}

/* 0; -1 for an unknown name; -2 for "cuda:N" with N not a device index. */
int bind_parse_device(lua_State *L, const char *name, dev_memkind *out) {
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
    const char *name = isstr ? bind_name_at(L, idx) : NULL;
    if (name && bind_parse_device(L, name, &k) == -2)
      luaL_error(L, "bad option 'device' ('%s': device index out of range, %d device%s)", name,
                 dev_device_count(bind_ctx(L)), dev_device_count(bind_ctx(L)) == 1 ? "" : "s");
    if (!name || bind_parse_device(L, name, &k))
      luaL_error(L, "bad option 'device' (unknown device '%s'; expected \"device\", \"cuda\", "
                 "\"cuda:N\", \"pinned\" or \"host\")", isstr ? bind_shown_name(L, idx) : luaL_typename(L, idx));
  }
  return k;
}

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

/* A 1-based (or negative, from the end) dim at stack idx, as 0-based: the
 * one dim reader.  Errors name argument `arg`, or option 'dim' when arg is
 * 0, and give the range. */
int bind_tensor_dim(lua_State *L, int idx, int arg, int ndim) {
  int isint;
  lua_Integer d = lua_tointegerx(L, idx, &isint);
  const char *msg = NULL;
  if (!isint && lua_type(L, idx) == LUA_TNUMBER)
    msg = lua_pushfstring(L, "integer dim expected, got %s", lua_tostring(L, idx));
  else if (!isint)
    msg = lua_pushfstring(L, "integer dim expected, got %s", luaL_typename(L, idx));
  else if (ndim == 0)
    msg = lua_pushfstring(L, "dim %I out of range for a 0-dim tensor", d);
  else if (d < -ndim || d == 0 || d > ndim)
    msg = lua_pushfstring(L, "dim %I out of range for a %d-dim tensor (1..%d, or -%d..-1)", d, ndim, ndim, ndim);
  if (msg) {
    if (arg > 0) luaL_argerror(L, arg, msg);
    luaL_error(L, "bad option 'dim' (%s)", msg);
  }
  return (int)(d < 0 ? d + ndim : d - 1);
}

/* The one message for an index out of range, worded as bind_tensor_dim's:
 * it shows the range, so that it says where indices start. */
const char *bind_push_index_range(lua_State *L, const char *what, lua_Integer i, int d, lua_Integer n, int neg) {
  if (n == 0) return lua_pushfstring(L, "%s %I out of range for dim %d of size 0 (empty)", what, i, d + 1);
  if (neg) return lua_pushfstring(L, "%s %I out of range for dim %d of size %I (1..%I, or -%I..-1)", what, i, d + 1, n, n, n);
  return lua_pushfstring(L, "%s %I out of range for dim %d of size %I (1..%I)", what, i, d + 1, n, n);
}

/* Kernels take operands from one memory: the device, or host memory (pinned
 * and pageable mix: such ops run on the calling thread). */
static int compatible(dev_memkind a, dev_memkind b) {
  return a == b || (a != DEV_MEM_DEVICE && b != DEV_MEM_DEVICE);
}

void bind_tensor_same_kind(lua_State *L, int arg, const gpu_tensor *a, const gpu_tensor *b) {
  if (!compatible(a->v.buf->kind, b->v.buf->kind))
    luaL_argerror(L, arg, lua_pushfstring(L, "tensor is in %s memory, expected %s (move it with :to(\"%s\"))",
                                          kind_name(b), kind_name(a), kind_name(a)));
}

/* The out option's value at index out, checked against the result's dtype
 * and shape, else a new tensor for the stream option's value at stream:
 * pushed. */
gpu_tensor *bind_tensor_out(lua_State *L, int out, int stream, const gpu_tensor *like, dev_dtype dt, int ndim,
                            const int64_t *shape, const char *fname) {
  if (lua_isnil(L, out)) return bind_tensor_like(L, like, dt, ndim, shape, stream, fname);
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

lua_Integer bind_tensor_int(lua_State *L, int idx, const char *what) {
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    if (lua_type(L, idx) == LUA_TNUMBER)
      luaL_argerror(L, idx, lua_pushfstring(L, "integer %s expected, got %s", what, lua_tostring(L, idx)));
    luaL_argerror(L, idx, lua_pushfstring(L, "integer %s expected, got %s", what, luaL_typename(L, idx)));
  }
  return v;
}

/* Integers from a table at arg, or the arguments arg..top: a shape or a
 * list of dims.  Returns how many (at most DEV_MAXDIM). */
int bind_tensor_ints(lua_State *L, int arg, int64_t *out, const char *what) {
  int n, istable = lua_type(L, arg) == LUA_TTABLE;
  if (istable) {
    size_t len = lua_rawlen(L, arg);
    if (len > DEV_MAXDIM)
      luaL_argerror(L, arg, lua_pushfstring(L, "%s has %d entries (at most %d)", what, (int)len, DEV_MAXDIM));
    n = (int)len;
  } else {
    n = lua_gettop(L) - arg + 1;
    if (n < 1) luaL_argerror(L, arg, lua_pushfstring(L, "%s expected (a table or integers)", what));
    if (n > DEV_MAXDIM)
      luaL_argerror(L, arg, lua_pushfstring(L, "%s has %d entries (at most %d)", what, n, DEV_MAXDIM));
  }
  for (int i = 0; i < n; i++) {
    int isint;
    if (istable) lua_rawgeti(L, arg, i + 1);
    else lua_pushvalue(L, arg + i);
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint)
      luaL_argerror(L, arg, lua_pushfstring(L, "%s[%d] must be an integer, got %s", what, i + 1,
                                            lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1)
                                                                           : luaL_typename(L, -1)));
    lua_pop(L, 1);
    out[i] = v;
  }
  return n;
}

/* Enqueue a copy of the view src (of the tensor at stack sidx) into the view
 * dst (of the tensor at didx) on stream s; the buffers are taken from the
 * tensors here, after the caller's last Lua allocation. */
void bind_tensor_copy_view(lua_State *L, dev_stream *s, int didx, dev_view dst, int sidx, dev_view src,
                           const char *fname) {
  dev_ctx *ctx = dev_stream_ctx(s);
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1, .out = dst};
  op.out.buf = bind_check_tensor(L, didx)->v.buf;
  op.in[0] = src;
  op.in[0].buf = bind_check_tensor(L, sidx)->v.buf;
  bind_call_site(L, ctx, fname);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, &op), fname);
}

/* ---- the type: fields, close ------------------------------------------ */

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

/* t:close() and <close>: as the collector's release, and the bytes that
 * this gave back (none for a view of a buffer still held) are told to the
 * pacing (bind_memory_closed). */
static int t_close(lua_State *L) {
  gpu_tensor *t = to_tensor(L, 1);
  if (!t->v.buf) return 0;
  dev_ctx *ctx = t->v.buf->ctx;
  dev_memkind kind = t->v.buf->kind;
  size_t before = dev_mem_live(ctx, kind);
  t_release(L);
  size_t after = dev_mem_live(ctx, kind);
  if (after < before) bind_memory_closed(L, before - after);
  return 0;
}

/* t.shape, t.dtype, t.device, t.device_index, t.ndim, t.closed (after the
 * methods) */
static int t_fields(lua_State *L) {
  gpu_tensor *t = to_tensor(L, 1);
  lua_settop(L, 2);
  const char *k = lua_type(L, 2) == LUA_TSTRING ? bind_check_key(L, 2) : NULL;
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

static int t_newindex(lua_State *L) {
  return luaL_error(L, "gpu.Tensor fields are read-only (use t:set(i, ..., v), t:fill(v) or t:to(...))");
}

/* ---- the method table ------------------------------------------------- */

static const luaL_Reg methods[] = {
  {"numel", t_numel}, {"nbytes", t_nbytes}, {"is_contiguous", t_is_contiguous},
  {"save", bind_tensor_save},
  {"close", t_close},
  {NULL, NULL}
};

static const luaL_Reg metamethods[] = {
  {"__index", t_fields},
  {"__newindex", t_newindex},
  {"__len", t_len},
  {"__tostring", bind_tensor_tostring},
  {"__gc", t_release},
  {"__close", t_close},
  {NULL, NULL}
};

/* Each concern's methods, in this order.  A name given twice keeps its
 * first function: max and min are tensor_elementwise.c's (elementwise with
 * an operand, the reduction without), ahead of the rows of ops.h that name
 * them as a binary op and as a reduction. */
static const luaL_Reg *const method_sets[] = {
  methods, bind_tensor_copy_methods, bind_tensor_view_methods, bind_tensor_elementwise_methods,
  bind_tensor_reduce_methods, bind_tensor_index_methods, bind_tensor_matmul_methods,
  bind_tensor_table_methods, bind_tensor_compose_methods, bind_tensor_shape_methods, bind_tensor_sort_methods,
  bind_tensor_reorder_methods, NULL
};

/* The module's functions (gpu.zeros, gpu.where, ...), by concern. */
static const luaL_Reg *const func_sets[] = {
  bind_tensor_new_funcs, bind_tensor_table_funcs, bind_tensor_elementwise_funcs, bind_tensor_matmul_funcs,
  bind_tensor_compose_funcs, bind_fuse_funcs, NULL
};

/* Adds gpu.Tensor's type and the module's tensor functions to the table on top. */
int bind_open_tensor(lua_State *L) {
  bind_newtype(L, &bind_tensor_type, metamethods, NULL);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &bind_tensor_type);
  luaL_setfuncs(L, bind_tensor_elementwise_meta, 0);
  lua_getfield(L, -1, "__methods");
  for (int k = 0; method_sets[k]; k++)
    for (const luaL_Reg *r = method_sets[k]; r->name; r++) {
      if (lua_getfield(L, -1, r->name) == LUA_TNIL) {
        lua_pushcfunction(L, r->func);
        lua_setfield(L, -3, r->name);
      }
      lua_pop(L, 1);
    }
  lua_pop(L, 2);
  for (int k = 0; func_sets[k]; k++) luaL_setfuncs(L, func_sets[k], 0);
  bind_fuse_preload(L);
  return 0;
}
