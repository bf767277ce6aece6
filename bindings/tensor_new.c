/* gpu.Tensor construction: the module's functions that make a tensor from
 * a shape (empty, zeros, ones, full, pinned), a range (arange, linspace),
 * a pattern (eye), the generator (rand, randn, randint), another tensor's
 * shape (*_like) or a list of tensors (cat, stack).  gpu.tensor, from nested
 * tables, is in tensor_table.c; clone and to, from a tensor, in
 * tensor_copy.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* ---- from a shape: empty, zeros, ones, full, pinned -------------------- */

/* shape at idx: a table of non-negative integers (empty: a 0-dim tensor)
 * or integers; many: every number from idx on is a size, as
 * torch.zeros(3, 4), else one number is a 1-dim shape (gpu.full(n, v)).
 * *next: the argument after the shape. */
static int check_shape(lua_State *L, int idx, int64_t *shape, const char *what, int many, int *next) {
  int ndim, istable = lua_type(L, idx) == LUA_TTABLE;
  if (lua_type(L, idx) == LUA_TNUMBER) {
    ndim = 1;
    while (many && lua_type(L, idx + ndim) == LUA_TNUMBER) ndim++;
    if (ndim > DEV_MAXDIM) luaL_argerror(L, idx, lua_pushfstring(L, "%s has %d dims (at most %d)", what, ndim, DEV_MAXDIM));
  } else if (istable) {
    size_t n = lua_rawlen(L, idx);
    if (n > DEV_MAXDIM) luaL_argerror(L, idx, lua_pushfstring(L, "%s has %d dims (at most %d)", what, (int)n, DEV_MAXDIM));
    ndim = (int)n;
  } else {
    return luaL_typeerror(L, idx, "shape table or integer");
  }
  *next = istable ? idx + 1 : idx + ndim;
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) {
    if (istable) lua_rawgeti(L, idx, d + 1);
    else lua_pushvalue(L, idx + d);
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
  return ndim;
}

/* the options of the constructors: their slots o, o + 1, o + 2 */
const char *const bind_new_opts[] = {"dtype", "device", "stream", NULL};

static int fill_new(lua_State *L, const char *fname, int value_kind) {
  int64_t shape[DEV_MAXDIM];
  int next, ndim = check_shape(L, 1, shape, "shape", value_kind != 2, &next);
  if (value_kind == 2 && lua_isnone(L, 2)) luaL_typeerror(L, 2, "number");
  int o = bind_read_opts(L, value_kind == 2 ? 3 : next, bind_new_opts), stream = o + 2;
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
    size_t nbytes = (size_t)bind_numel_of(ndim, shape) * dev_dtype_size(dt);
    BIND_CHECK(L, ctx, dev_memset(ctx, s, t->v.buf, 0, 0, nbytes), fname);
  } else if (value_kind > 0) {
    dev_kop op = {.kind = DEV_OP_FILL, .out = t->v, .s0 = v};
    bind_tensor_submit2(L, stream, &op, 0, 0, 0, fname);
  }
  return 1;
}

static int tensor_empty(lua_State *L) { return fill_new(L, "empty", -1); }
static int tensor_zeros(lua_State *L) { return fill_new(L, "zeros", 0); }
static int tensor_ones(lua_State *L) { return fill_new(L, "ones", 1); }
static int tensor_full(lua_State *L) { return fill_new(L, "full", 2); }

static int tensor_pinned(lua_State *L) {
  int64_t shape[DEV_MAXDIM];
  int next, ndim = check_shape(L, 1, shape, "shape", 1, &next);
  static const char *const names[] = {"dtype", NULL};
  dev_dtype dt = bind_check_dtype(L, bind_read_opts(L, next, names), DEV_F32);
  bind_new_tensor(L, DEV_MEM_PINNED, dt, ndim, shape, 0, "pinned");
  return 1;
}

/* ---- ranges and patterns: arange, linspace, eye ------------------------ */

/* An integer range of n values from a by c must fit dt, as every number
 * given for an integer dtype must (its start, then its last value). */
static void arange_fits(lua_State *L, int nargs, dev_dtype dt, int64_t a, int64_t c, int64_t n) {
  if (nargs >= 2) bind_check_scalar(L, 1, dt, 1, NULL);
  __int128 last = (__int128)a + (__int128)(n - 1) * c;
  int64_t lo = INT64_MIN, hi = INT64_MAX;
  if (dt == DEV_I8) lo = -128, hi = 127;
  else if (dt == DEV_U8) lo = 0, hi = 255;
  else if (dt == DEV_I32) lo = INT32_MIN, hi = INT32_MAX;
  if (last < lo || last > hi)
    luaL_argerror(L, nargs >= 2 ? 2 : 1, lua_pushfstring(L, "the range reaches %I, which does not fit in %s",
                                                          (lua_Integer)last, dev_dtype_name(dt)));
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
  if (dt == DEV_BOOL)
    return luaL_error(L, "bad option 'dtype' (arange cannot make bool: a range of 0s and 1s is "
                      "gpu.arange(n):lt(k), or make it in an integer dtype and compare)");
  if (!dev_dtype_is_float(dt) && !allint)
    return luaL_error(L, "bad option 'dtype' (arange with non-integer bounds needs a float dtype)");
  if (!dev_dtype_is_float(dt) && n > 0) arange_fits(L, nargs, dt, start.i, step.i, n);
  gpu_tensor *t = bind_new_tensor(L, kind, dt, 1, &n, stream, "arange");
  dev_kop op = {.kind = DEV_OP_ARANGE, .out = t->v, .s0 = start, .s1 = step};
  bind_tensor_submit2(L, stream, &op, 0, 0, 0, "arange");
  return 1;
}

/* gpu.linspace(a, b, n [, opts]): n values from a to b evenly spaced, the
 * last exactly b (NumPy's: a + i*step in f64, rounded once to the dtype;
 * integer dtypes take the floor, as NumPy) */
static int tensor_linspace(lua_State *L) {
  double a = luaL_checknumber(L, 1), b = luaL_checknumber(L, 2);
  lua_Integer n = bind_tensor_int(L, 3, "count");
  int o = bind_read_opts(L, 4, bind_new_opts), stream = o + 2;
  if (n < 0) luaL_argerror(L, 3, lua_pushfstring(L, "count must be non-negative, got %I", n));
  if (n > ((int64_t)1 << 48)) luaL_argerror(L, 3, "count is too large");
  dev_dtype dt = bind_check_dtype(L, o, DEV_F32);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  bind_stream(L, stream);
  int64_t shape[1] = {n};
  int floor = !dev_dtype_is_float(dt) && dt != DEV_BOOL;
  bind_new_tensor(L, kind, dt, 1, shape, stream, "linspace");
  int ridx = lua_gettop(L), idx = ridx;
  if (floor) {   /* in f64, floored, then cast */
    bind_new_tensor(L, kind, DEV_F64, 1, shape, stream, "linspace");
    idx = lua_gettop(L);
  }
  double step = n > 1 ? (b - a) / (double)(n - 1) : 0;
  dev_kop op = {.kind = DEV_OP_ARANGE, .s0 = {0, 0, a}, .s1 = {0, 0, step}};
  op.out = bind_check_tensor(L, idx)->v;
  bind_tensor_submit2(L, stream, &op, idx, 0, 0, "linspace");
  if (n > 1) {
    dev_kop last = {.kind = DEV_OP_FILL, .s0 = {0, 0, b}};
    last.out = bind_check_tensor(L, idx)->v;
    last.out.offset += (size_t)(n - 1) * dev_dtype_size(last.out.dtype);
    last.out.shape[0] = 1;
    bind_tensor_submit2(L, stream, &last, idx, 0, 0, "linspace");
  }
  if (floor) {
    dev_kop fl = {.kind = DEV_OP_UNARY, .code = DEV_UN_FLOOR, .nin = 1};
    fl.out = fl.in[0] = bind_check_tensor(L, idx)->v;
    bind_tensor_submit2(L, stream, &fl, idx, idx, 0, "linspace");
    dev_kop cast = {.kind = DEV_OP_UNARY, .code = DEV_UN_COPY, .nin = 1};
    cast.in[0] = bind_check_tensor(L, idx)->v;
    cast.out = bind_check_tensor(L, ridx)->v;
    bind_tensor_submit2(L, stream, &cast, ridx, idx, 0, "linspace");
    lua_settop(L, ridx);
  }
  return 1;
}

/* gpu.eye(n [, m] [, opts]): n x m (m = n by default), ones on the diagonal */
static int tensor_eye(lua_State *L) {
  lua_Integer n = bind_tensor_int(L, 1, "row count"), m = n;
  int opts = 3;
  if (lua_type(L, 2) == LUA_TTABLE) opts = 2;
  else if (!lua_isnoneornil(L, 2)) m = bind_tensor_int(L, 2, "column count");
  if (n < 0) luaL_argerror(L, 1, lua_pushfstring(L, "row count must be non-negative, got %I", n));
  if (m < 0) luaL_argerror(L, 2, lua_pushfstring(L, "column count must be non-negative, got %I", m));
  int o = bind_read_opts(L, opts, bind_new_opts), stream = o + 2;
  int64_t shape[2] = {n, m}, total = 0;
  if (n > ((int64_t)1 << 56) || m > ((int64_t)1 << 56) || __builtin_mul_overflow(shape[0], shape[1], &total) ||
      total > ((int64_t)1 << 56))
    luaL_argerror(L, 1, "shape is too large");
  dev_dtype dt = bind_check_dtype(L, o, DEV_F32);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  bind_stream(L, stream);
  bind_new_tensor(L, kind, dt, 2, shape, stream, "eye");
  int ridx = lua_gettop(L);
  dev_stream *s = bind_stream(L, stream);
  dev_ctx *ctx = dev_stream_ctx(s);
  gpu_tensor *r = bind_check_tensor(L, ridx);
  bind_call_site(L, ctx, "eye");
  BIND_CHECK(L, ctx, dev_memset(ctx, s, r->v.buf, r->v.offset, 0, (size_t)total * dev_dtype_size(dt)), "eye");
  /* the diagonal: a strided 1-D view */
  dev_kop op = {.kind = DEV_OP_FILL, .s0 = {1, 1, 1}};
  op.out = bind_check_tensor(L, ridx)->v;
  op.out.ndim = 1;
  op.out.shape[0] = n < m ? n : m;
  op.out.stride[0] = m + 1;
  bind_tensor_submit2(L, stream, &op, ridx, 0, 0, "eye");
  return 1;
}

/* ---- the generator: rand, randn, randint ------------------------------- */

/* A float generator's bound: a finite number (NaN or inf would fill the
 * tensor with NaNs). */
static void finite_bound(lua_State *L, double v, const char *name) {
  if (isfinite(v)) return;
  luaL_error(L, "bad option '%s' (must be a finite number, got %s)", name, v != v ? "nan" : v > 0 ? "inf" : "-inf");
}

static int random_new(lua_State *L, int normal) {
  const char *fname = normal ? "randn" : "rand";
  int64_t shape[DEV_MAXDIM];
  int next, ndim = check_shape(L, 1, shape, "shape", 1, &next);
  static const char *const normal_opts[] = {"dtype", "device", "stream", "mean", "std", "seed", NULL};
  static const char *const uniform_opts[] = {"dtype", "device", "stream", "low", "high", "seed", NULL};
  /* slots: o dtype, o + 1 device, o + 2 stream, o + 3 and o + 4 the bounds, o + 5 seed */
  int o = bind_read_opts(L, next, normal ? normal_opts : uniform_opts), stream = o + 2;
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
    finite_bound(L, a.f, normal ? "mean" : "low");
    finite_bound(L, b.f, normal ? "std" : "high");
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
  int64_t n = bind_numel_of(ndim, shape);
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
  bind_tensor_submit2(L, stream, &op, 0, 0, 0, fname);
  return 1;
}

static int tensor_rand(lua_State *L) { return random_new(L, 0); }
static int tensor_randn(lua_State *L) { return random_new(L, 1); }

/* The inclusive range of integer dtype t as int64 (bool: 0..1). */
static void int_range(dev_dtype t, int64_t *lo, int64_t *hi) {
  switch (t) {
  case DEV_I8: *lo = INT8_MIN; *hi = INT8_MAX; break;
  case DEV_U8: *lo = 0; *hi = UINT8_MAX; break;
  case DEV_I32: *lo = INT32_MIN; *hi = INT32_MAX; break;
  case DEV_BOOL: *lo = 0; *hi = 1; break;
  default: *lo = INT64_MIN; *hi = INT64_MAX; break;
  }
}

/* gpu.randint(lo, hi, shape [, opts]): integers in [lo, hi) (hi exclusive,
 * as NumPy and PyTorch), uniform; i64 by default, any dtype (a float dtype
 * holds the integers as it rounds them).  From the counter-based generator
 * as gpu.rand (gpu.seed, or opts.seed): the same numbers on every backend. */
static int tensor_randint(lua_State *L) {
  lua_Integer lo = bind_tensor_int(L, 1, "low"), hi = bind_tensor_int(L, 2, "high");
  int64_t shape[DEV_MAXDIM];
  if (lua_type(L, 3) != LUA_TTABLE && lua_type(L, 3) != LUA_TNUMBER)
    luaL_typeerror(L, 3, "shape table or integer");
  lua_settop(L, 4);
  /* the shape through gpu.empty's checks: gpu.empty(shape) would allocate */
  int ndim;
  if (lua_type(L, 3) == LUA_TNUMBER) {
    ndim = 1;
    shape[0] = bind_tensor_int(L, 3, "size");
  } else {
    ndim = bind_tensor_ints(L, 3, shape, "shape");
  }
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      luaL_argerror(L, 3, lua_pushfstring(L, "shape[%d] must be non-negative, got %I", d + 1, (lua_Integer)shape[d]));
    if (shape[d] && (__builtin_mul_overflow(total, shape[d], &total) || total > ((int64_t)1 << 56)))
      luaL_argerror(L, 3, "shape is too large");
  }
  static const char *const names[] = {"dtype", "device", "stream", "seed", NULL};
  int o = bind_read_opts(L, 4, names), stream = o + 2;
  if (hi <= lo) luaL_argerror(L, 2, lua_pushfstring(L, "high (%I) must be greater than low (%I)", hi, lo));
  dev_dtype dt = bind_check_dtype(L, o, DEV_I64);
  dev_memkind kind = bind_check_device(L, o + 1, DEV_MEM_DEVICE);
  if (!dev_dtype_is_float(dt)) {
    int64_t min, max;
    int_range(dt, &min, &max);
    if (lo < min || hi - 1 > max)
      return luaL_error(L, "randint: [%I, %I) is beyond %s's range [%I, %I]", lo, hi, dev_dtype_name(dt),
                        (lua_Integer)min, (lua_Integer)max);
  }
  bind_stream(L, stream);
  gpu_state *st = bind_state(L);
  uint64_t seed = st->seed, offset;
  if (!lua_isnil(L, o + 3)) {
    seed = (uint64_t)bind_check_scalar(L, o + 3, DEV_I64, 0, "option 'seed'").i;
    offset = 0;
  } else {
    offset = st->offset;
    for (int d = 0; d < ndim; d++) total *= shape[d] != 0;   /* numel */
    st->offset += (uint64_t)total;
  }
  bind_new_tensor(L, kind, dt, ndim, shape, stream, "randint");
  dev_kop op = {.kind = DEV_OP_RAND, .code = DEV_RAND_INT, .s0 = {1, lo, (double)lo}, .s1 = {1, hi, (double)hi},
                .seed = seed, .offset = offset};
  op.out = bind_check_tensor(L, lua_gettop(L))->v;
  bind_tensor_submit2(L, stream, &op, lua_gettop(L), 0, 0, "randint");
  return 1;
}

/* ---- another tensor's shape: *_like ------------------------------------ */

/* gpu.empty_like / zeros_like / ones_like (t [, opts]), full_like(t, v [, opts]):
 * a new contiguous tensor of t's shape, dtype and memory (opts.dtype and
 * opts.device override them) */
static int make_like(lua_State *L, int what, const char *fname) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (what == 3 && lua_isnone(L, 2)) luaL_typeerror(L, 2, "number");
  int o = bind_read_opts(L, what == 3 ? 3 : 2, bind_new_opts), stream = o + 2;
  dev_view v = t->v;
  dev_dtype dt = bind_check_dtype(L, o, v.dtype);
  dev_memkind kind = bind_check_device(L, o + 1, v.buf->kind);
  dev_scalar val = {1, what == 2, what == 2};
  if (what == 3) val = bind_check_scalar(L, 2, dt, 2, NULL);
  bind_stream(L, stream);
  gpu_tensor *r = bind_new_tensor(L, kind, dt, v.ndim, v.shape, stream, fname);
  int ridx = lua_gettop(L);
  size_t bytes = (size_t)dev_view_numel(&r->v) * dev_dtype_size(dt);
  if (what == 1) {
    dev_stream *s = bind_stream(L, stream);
    dev_ctx *ctx = dev_stream_ctx(s);
    r = bind_check_tensor(L, ridx);
    bind_call_site(L, ctx, fname);
    BIND_CHECK(L, ctx, dev_memset(ctx, s, r->v.buf, r->v.offset, 0, bytes), fname);
  } else if (what >= 2) {
    dev_kop op = {.kind = DEV_OP_FILL, .s0 = val};
    op.out = r->v;
    bind_tensor_submit2(L, stream, &op, ridx, 0, 0, fname);
  }
  return 1;
}

static int tensor_empty_like(lua_State *L) { return make_like(L, 0, "empty_like"); }
static int tensor_zeros_like(lua_State *L) { return make_like(L, 1, "zeros_like"); }
static int tensor_ones_like(lua_State *L) { return make_like(L, 2, "ones_like"); }
static int tensor_full_like(lua_State *L) { return make_like(L, 3, "full_like"); }

/* ---- joining: cat, stack ----------------------------------------------- */

/* Kernels take operands from one memory: the device, or host memory (pinned
 * and pageable mix), as tensor.c's ops. */
static int same_side(dev_memkind a, dev_memkind b) {
  return a == b || (a != DEV_MEM_DEVICE && b != DEV_MEM_DEVICE);
}

/* The bytes [*lo, *hi) of v's buffer that its elements lie in. */
static void extent(const dev_view *v, size_t *lo, size_t *hi) {
  int64_t last = 0;
  for (int d = 0; d < v->ndim; d++) last += (v->shape[d] - 1) * v->stride[d];
  *lo = v->offset;
  *hi = v->offset + (size_t)(last + 1) * dev_dtype_size(v->dtype);
}

static int overlap(const dev_view *a, const dev_view *b) {
  size_t alo, ahi, blo, bhi;
  if (a->buf != b->buf || dev_view_numel(a) == 0 || dev_view_numel(b) == 0) return 0;
  extent(a, &alo, &ahi);
  extent(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

/* list[k] of the table at 1, checked: pushed, and returned. */
static gpu_tensor *list_item(lua_State *L, int k) {
  lua_rawgeti(L, 1, k);
  gpu_tensor *t = bind_test_tensor_handle(L, -1);
  if (!t)
    luaL_argerror(L, 1, lua_pushfstring(L, "list[%d]: gpu.Tensor expected, got %s", k, bind_typename(L, -1)));
  if (!t->v.buf) luaL_argerror(L, 1, lua_pushfstring(L, "list[%d]: tensor is closed", k));
  return t;
}

/* A join in the making: list[1]'s view f, the list's length n, the dim d
 * joined along and the result's shape. */
typedef struct joining {
  const char *fname;
  int stack, d, ndim;
  lua_Integer n;
  dev_view f;
  int64_t shape[DEV_MAXDIM];
} joining;

/* list[2..n] against list[1]: dtype, memory side and shape; the sizes
 * along d added up (cat). */
static void join_check(lua_State *L, joining *j) {
  const dev_view f = j->f;
  int stack = j->stack, d = j->d;
  for (lua_Integer k = 2; k <= j->n; k++) {
    gpu_tensor *t = list_item(L, (int)k);
    if (t->v.dtype != f.dtype)
      luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] has dtype %s, list[1] %s (cast with :to(\"%s\"))", (int)k,
                                          dev_dtype_name(t->v.dtype), dev_dtype_name(f.dtype), dev_dtype_name(f.dtype)));
    if (!same_side(t->v.buf->kind, f.buf->kind))
      luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] is in %s memory, list[1] in %s (move it with :to(\"%s\"))",
                                          (int)k, kind_name(t), dev_memkind_name(f.buf->kind),
                                          dev_memkind_name(f.buf->kind)));
    int same = t->v.ndim == f.ndim;
    for (int i = 0; same && i < f.ndim; i++) same = t->v.shape[i] == f.shape[i] || (!stack && i == d);
    if (!same) {
      char a[MAXSHAPESTR], b[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, t->v.ndim, t->v.shape);
      bind_shape_str(b, sizeof b, f.ndim, f.shape);
      if (stack) luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] has shape %s, list[1] %s: stack needs equal shapes",
                                                     (int)k, a, b));
      luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] has shape %s, list[1] %s: sizes must match except in dim %d",
                                          (int)k, a, b, d + 1));
    }
    if (!stack && (__builtin_add_overflow(j->shape[d], t->v.shape[d], &j->shape[d]) ||
                   j->shape[d] > ((int64_t)1 << 56)))
      luaL_argerror(L, 1, "the result is too large");
    lua_pop(L, 1);
  }
}

/* The result, pushed: the out option's value at out (checked: shape,
 * dtype, memory side), or a new tensor.  Returns 1 when out shares memory
 * with a tensor of the list. */
static int join_out(lua_State *L, const joining *j, int out, int stream) {
  const char *fname = j->fname;
  const dev_view f = j->f;
  if (lua_isnil(L, out)) {
    bind_new_tensor(L, f.buf->kind, f.dtype, j->ndim, j->shape, stream, fname);
    return 0;
  }
  lua_pushvalue(L, out);
  gpu_tensor *o = bind_test_tensor_handle(L, -1);
  if (!o) luaL_error(L, "bad option 'out' to '%s' (gpu.Tensor expected, got %s)", fname, bind_typename(L, -1));
  if (!o->v.buf) luaL_error(L, "bad option 'out' to '%s' (tensor is closed)", fname);
  int same = o->v.ndim == j->ndim && o->v.dtype == f.dtype;
  for (int i = 0; same && i < j->ndim; i++) same = o->v.shape[i] == j->shape[i];
  if (!same) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, o->v.ndim, o->v.shape);
    bind_shape_str(b, sizeof b, j->ndim, j->shape);
    luaL_error(L, "bad option 'out' to '%s' (%s %s does not match the result %s %s)", fname,
               dev_dtype_name(o->v.dtype), a, dev_dtype_name(f.dtype), b);
  }
  if (!same_side(o->v.buf->kind, f.buf->kind))
    luaL_error(L, "bad option 'out' to '%s' (tensor is in %s memory, the list in %s)", fname, kind_name(o),
               dev_memkind_name(f.buf->kind));
  int shared = 0;
  for (lua_Integer k = 1; k <= j->n && !shared; k++) {
    shared = overlap(&o->v, &list_item(L, (int)k)->v);
    lua_pop(L, 1);
  }
  return shared;
}

/* One copy per tensor of the list, into its view of the result at ridx. */
static void join_copy(lua_State *L, const joining *j, int ridx, int stream) {
  dev_stream *s = bind_stream(L, stream);
  int d = j->d;
  int64_t at = 0;
  for (lua_Integer k = 1; k <= j->n; k++) {
    gpu_tensor *t = list_item(L, (int)k);
    dev_view src = t->v, dst = bind_check_tensor(L, ridx)->v;
    size_t esz = dev_dtype_size(dst.dtype);
    if (j->stack) {
      dst.offset += (size_t)((k - 1) * dst.stride[d]) * esz;
      for (int i = d; i < j->ndim - 1; i++) {
        dst.shape[i] = dst.shape[i + 1];
        dst.stride[i] = dst.stride[i + 1];
      }
      dst.ndim--;
    } else {
      dst.offset += (size_t)(at * dst.stride[d]) * esz;
      dst.shape[d] = src.shape[d];
      at += src.shape[d];
    }
    if (dev_view_numel(&src) > 0) bind_tensor_copy_view(L, s, ridx, dst, lua_gettop(L), src, j->fname);
    lua_pop(L, 1);
  }
}

/* gpu.cat(list [, dim] [, opts]) and gpu.stack(list [, dim] [, opts]): the
 * tensors of list joined along dim (1 by default): cat along an existing dim
 * (the other sizes equal), stack along a new one (all shapes equal).  Same
 * dtype, same memory side; the result is in list[1]'s memory, or opts.out.
 * One copy per tensor, into a view of the result; an out that shares memory
 * with the list is written last, from a temporary (every input is read
 * before out is written, as for every op). */
static int join(lua_State *L, int stack) {
  joining j = {.fname = stack ? "stack" : "cat", .stack = stack};
  luaL_checktype(L, 1, LUA_TTABLE);
  int opts = 3, hasdim = !lua_isnoneornil(L, 2);
  if (lua_type(L, 2) == LUA_TTABLE) {
    if (!lua_isnone(L, 3)) luaL_argerror(L, 3, "no argument expected after the options");
    opts = 2;
    hasdim = 0;
  }
  int out = bind_read_opts(L, opts, bind_out_opts), stream = out + 1;
  j.n = (lua_Integer)lua_rawlen(L, 1);
  if (j.n < 1) luaL_argerror(L, 1, "the list is empty (give at least one tensor)");
  if (j.n > INT32_MAX) luaL_argerror(L, 1, "the list is too long");
  j.f = list_item(L, 1)->v;
  lua_pop(L, 1);
  if (!stack && j.f.ndim == 0)
    luaL_argerror(L, 1, "list[1] is a 0-dim tensor: cat needs at least 1 dim (gpu.stack makes a new one)");
  if (stack && j.f.ndim >= DEV_MAXDIM)
    luaL_argerror(L, 1, lua_pushfstring(L, "list[1] has %d dims: stacking makes %d (at most %d)", j.f.ndim,
                                        j.f.ndim + 1, DEV_MAXDIM));
  j.d = hasdim ? bind_tensor_dim(L, 2, 2, j.f.ndim + stack) : 0;
  j.ndim = j.f.ndim + stack;
  for (int k = 0, i = 0; k < j.ndim; k++) j.shape[k] = stack && k == j.d ? j.n : j.f.shape[i++];
  join_check(L, &j);
  int shared = join_out(L, &j, out, stream), r = lua_gettop(L);
  if (shared) bind_new_tensor(L, j.f.buf->kind, j.f.dtype, j.ndim, j.shape, stream, j.fname);
  join_copy(L, &j, lua_gettop(L), stream);
  if (shared) {
    gpu_tensor *tmp = bind_check_tensor(L, r + 1);
    bind_tensor_copy_view(L, bind_stream(L, stream), r, bind_check_tensor(L, r)->v, r + 1, tmp->v, j.fname);
    dev_buf *b = tmp->v.buf;   /* back to the pool at once, once the copy is done */
    tmp->v.buf = NULL;
    dev_buf_release(b);
    lua_settop(L, r);
  }
  return 1;
}

static int tensor_cat(lua_State *L) { return join(L, 0); }
static int tensor_stack(lua_State *L) { return join(L, 1); }

/* ---- the functions ---------------------------------------------------- */

const luaL_Reg bind_tensor_new_funcs[] = {
  {"empty", tensor_empty}, {"zeros", tensor_zeros}, {"ones", tensor_ones}, {"full", tensor_full},
  {"pinned", tensor_pinned}, {"arange", tensor_arange}, {"linspace", tensor_linspace}, {"eye", tensor_eye},
  {"rand", tensor_rand}, {"randn", tensor_randn}, {"randint", tensor_randint},
  {"empty_like", tensor_empty_like}, {"zeros_like", tensor_zeros_like},
  {"ones_like", tensor_ones_like}, {"full_like", tensor_full_like},
  {"cat", tensor_cat}, {"stack", tensor_stack},
  {NULL, NULL}
};
