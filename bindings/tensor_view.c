/* gpu.Tensor views and the ops built from them: transpose, permute,
 * unsqueeze, squeeze, expand, select, slice, split, chunk, reshape.
 *
 * A view is a new handle on the same buffer (it retains it, so the base may
 * be dropped first) with its own offset, shape and strides: no device op, no
 * copy.  The race checker and the fences see views by their buffer.  An
 * expanded view (stride 0 along a dim of size > 1) is read-only: the device
 * layer refuses it as an op's output.  Dims and indices are 1-based, negative
 * ones count from the end. */
#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* ---- helpers ---------------------------------------------------------- */

/* A new handle on the storage of the tensor at idx, pushed. */
static gpu_tensor *view_of(lua_State *L, int idx) {
  gpu_tensor *t = bind_push_tensor_handle(L);
  gpu_tensor *base = bind_check_tensor(L, idx);
  t->v = base->v;
  dev_buf_retain(t->v.buf);
  return t;
}

/* The dim at stack idx (argument idx), 1-based or negative from the end, of
 * a tensor of ndim dims, as 0-based. */
static int check_dim(lua_State *L, int idx, int ndim) {
  int isint;
  lua_Integer d = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    if (lua_type(L, idx) == LUA_TNUMBER)
      luaL_argerror(L, idx, lua_pushfstring(L, "integer dim expected, got %s", lua_tostring(L, idx)));
    luaL_argerror(L, idx, lua_pushfstring(L, "integer dim expected, got %s", luaL_typename(L, idx)));
  }
  if (d < -ndim || d == 0 || d > ndim) {
    if (ndim == 0)
      luaL_argerror(L, idx, lua_pushfstring(L, "dim %I out of range for a 0-dim tensor", d));
    luaL_argerror(L, idx, lua_pushfstring(L, "dim %I out of range for a %d-dim tensor (1..%d, or -%d..-1)",
                                          d, ndim, ndim, ndim));
  }
  return (int)(d < 0 ? d + ndim : d - 1);
}

/* An optional dim at idx (nil: dflt, 0-based). */
static int opt_dim(lua_State *L, int idx, int ndim, int dflt) {
  return lua_isnoneornil(L, idx) ? dflt : check_dim(L, idx, ndim);
}

static lua_Integer check_int(lua_State *L, int idx, const char *what) {
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
static int read_ints(lua_State *L, int arg, int64_t *out, const char *what) {
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

/* Remove dim d of v (its size is 1, or v is being indexed along it). */
static void drop_dim(dev_view *v, int d) {
  for (int k = d; k < v->ndim - 1; k++) {
    v->shape[k] = v->shape[k + 1];
    v->stride[k] = v->stride[k + 1];
  }
  v->ndim--;
}

/* Enqueue a copy of the view src (of the tensor at stack sidx) into the view
 * dst (of the tensor at didx) on stream s; the buffers are taken from the
 * tensors here, after the caller's last Lua allocation. */
static void copy_view(lua_State *L, dev_stream *s, int didx, dev_view dst, int sidx, dev_view src,
                      const char *fname) {
  dev_ctx *ctx = dev_stream_ctx(s);
  dev_kop op = {.kind = DEV_OP_COPY, .nin = 1, .out = dst};
  op.out.buf = bind_check_tensor(L, didx)->v.buf;
  op.in[0] = src;
  op.in[0].buf = bind_check_tensor(L, sidx)->v.buf;
  bind_call_site(L, ctx, fname);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, &op), fname);
}

/* ---- views ------------------------------------------------------------ */

/* t:transpose(d1, d2): dims d1 and d2 swapped */
static int t_transpose(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int a = check_dim(L, 2, t->v.ndim), b = check_dim(L, 3, t->v.ndim);
  gpu_tensor *r = view_of(L, 1);
  int64_t sh = r->v.shape[a], st = r->v.stride[a];
  r->v.shape[a] = r->v.shape[b];
  r->v.stride[a] = r->v.stride[b];
  r->v.shape[b] = sh;
  r->v.stride[b] = st;
  return 1;
}

/* t:t(): a 2-D tensor transposed; a 0-D or 1-D tensor is returned as it is */
static int t_t(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim > 2)
    return luaL_error(L, "t: needs a tensor of at most 2 dims, got %d (use t:transpose(d1, d2) or t:permute{...})",
                      t->v.ndim);
  lua_settop(L, 1);
  if (t->v.ndim < 2) return 1;
  gpu_tensor *r = view_of(L, 1);
  r->v.shape[0] = t->v.shape[1];
  r->v.stride[0] = t->v.stride[1];
  r->v.shape[1] = t->v.shape[0];
  r->v.stride[1] = t->v.stride[0];
  return 1;
}

/* t:permute{d1, d2, ...} or t:permute(d1, d2, ...): dim k of the result is
 * dim dk of t; every dim once */
static int t_permute(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t dims[DEV_MAXDIM];
  int n = read_ints(L, 2, dims, "dims"), nd = t->v.ndim, seen[DEV_MAXDIM] = {0};
  if (n != nd)
    luaL_argerror(L, 2, lua_pushfstring(L, "%d dims given for a %d-dim tensor (each dim once)", n, nd));
  for (int k = 0; k < n; k++) {
    int64_t d = dims[k];
    if (d < -nd || d == 0 || d > nd)
      luaL_argerror(L, 2, lua_pushfstring(L, "dims[%d] = %I out of range for a %d-dim tensor", k + 1,
                                          (lua_Integer)d, nd));
    dims[k] = d < 0 ? d + nd : d - 1;
    if (seen[dims[k]]++)
      luaL_argerror(L, 2, lua_pushfstring(L, "dim %d appears twice (each dim once)", (int)dims[k] + 1));
  }
  dev_view v = t->v;
  gpu_tensor *r = view_of(L, 1);
  for (int k = 0; k < n; k++) {
    r->v.shape[k] = v.shape[dims[k]];
    r->v.stride[k] = v.stride[dims[k]];
  }
  return 1;
}

/* t:unsqueeze(d): a dim of size 1 inserted so that it is dim d of the result
 * (1..ndim+1; -1 the last) */
static int t_unsqueeze(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int nd = t->v.ndim;
  if (nd >= DEV_MAXDIM) return luaL_error(L, "unsqueeze: the tensor has %d dims already (at most %d)", nd, DEV_MAXDIM);
  int d = check_dim(L, 2, nd + 1);
  gpu_tensor *r = view_of(L, 1);
  for (int k = nd; k > d; k--) {
    r->v.shape[k] = r->v.shape[k - 1];
    r->v.stride[k] = r->v.stride[k - 1];
  }
  r->v.shape[d] = 1;
  r->v.stride[d] = d < nd ? t->v.shape[d] * t->v.stride[d] : 1;
  r->v.ndim = nd + 1;
  return 1;
}

/* t:squeeze([d]): without d, every dim of size 1 removed; with d, that dim
 * if its size is 1 (else t's shape is kept, as PyTorch) */
static int t_squeeze(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int d = lua_isnoneornil(L, 2) ? -1 : check_dim(L, 2, t->v.ndim);
  gpu_tensor *r = view_of(L, 1);
  if (d >= 0) {
    if (r->v.shape[d] == 1) drop_dim(&r->v, d);
    return 1;
  }
  for (int k = r->v.ndim - 1; k >= 0; k--)
    if (r->v.shape[k] == 1) drop_dim(&r->v, k);
  return 1;
}

/* t:expand(shape) or t:expand(n1, n2, ...): dims of size 1 repeated to the
 * size asked (stride 0, no copy), new dims added in front; -1 keeps a size.
 * The result is read-only: ops refuse it as their output. */
static int t_expand(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t shape[DEV_MAXDIM];
  int n = read_ints(L, 2, shape, "shape"), nd = t->v.ndim;
  if (n < nd)
    luaL_argerror(L, 2, lua_pushfstring(L, "%d sizes given for a %d-dim tensor (at least as many as its dims)", n, nd));
  dev_view v = t->v;
  int64_t stride[DEV_MAXDIM];
  for (int k = 0; k < n; k++) {
    int old = k - (n - nd);   /* the tensor's dim under size k, or < 0: a new dim */
    int64_t want = shape[k];
    if (want == -1) {
      if (old < 0)
        return luaL_argerror(L, 2, lua_pushfstring(L, "shape[%d] = -1 for a new leading dim (give its size)", k + 1));
      want = v.shape[old];
    }
    if (want < 0)
      luaL_argerror(L, 2, lua_pushfstring(L, "shape[%d] must be non-negative or -1, got %I", k + 1, (lua_Integer)want));
    if (old >= 0 && v.shape[old] != want && v.shape[old] != 1) {
      char a[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, nd, v.shape);
      luaL_argerror(L, 2, lua_pushfstring(L, "cannot expand dim %d of %s from size %I to %I (only a size of 1 expands)",
                                          old + 1, a, (lua_Integer)v.shape[old], (lua_Integer)want));
    }
    shape[k] = want;
    stride[k] = old >= 0 && v.shape[old] == want ? v.stride[old] : 0;
  }
  int64_t total = 1;
  for (int k = 0; k < n; k++)
    if (shape[k] && (__builtin_mul_overflow(total, shape[k], &total) || total > ((int64_t)1 << 56)))
      luaL_argerror(L, 2, "shape is too large");
  gpu_tensor *r = view_of(L, 1);
  r->v.ndim = n;
  memcpy(r->v.shape, shape, sizeof shape);
  memcpy(r->v.stride, stride, sizeof stride);
  return 1;
}

/* t:select(dim, i): the slice at index i (1-based, negative from the end)
 * along dim, which is dropped */
static int t_select(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int d = check_dim(L, 2, t->v.ndim);
  lua_Integer i = check_int(L, 3, "index"), n = t->v.shape[d];
  if (i < -n || i == 0 || i > n)
    luaL_argerror(L, 3, lua_pushfstring(L, "index %I out of range for dim %d of size %I", i, d + 1, n));
  if (i < 0) i += n + 1;
  gpu_tensor *r = view_of(L, 1);
  r->v.offset += (size_t)((i - 1) * r->v.stride[d]) * dev_dtype_size(r->v.dtype);
  drop_dim(&r->v, d);
  return 1;
}

/* The range [i, j] of a dim of size n as string.sub reads it: negatives
 * count from the end, then both are clipped to 1..n.  Returns the count of
 * elements taken with step and sets *first (1-based). */
static int64_t sub_range(int64_t n, int64_t i, int64_t j, int64_t step, int64_t *first) {
  if (i < 0) i = i + n + 1 < 1 ? 1 : i + n + 1;
  else if (i == 0) i = 1;
  if (j < 0) j = j + n + 1;
  else if (j > n) j = n;
  *first = i;
  if (i > j) return 0;
  return (j - i) / step + 1;
}

/* t:slice(dim, i [, j [, step]]): elements i..j (inclusive) of dim, every
 * step-th; i and j as string.sub takes them (negative from the end, clipped;
 * j defaults to -1) */
static int t_slice(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int d = check_dim(L, 2, t->v.ndim);
  lua_Integer i = check_int(L, 3, "start");
  lua_Integer j = lua_isnoneornil(L, 4) ? -1 : check_int(L, 4, "end");
  lua_Integer step = lua_isnoneornil(L, 5) ? 1 : check_int(L, 5, "step");
  if (step <= 0) luaL_argerror(L, 5, lua_pushfstring(L, "step must be positive, got %I", step));
  int64_t first, n = sub_range(t->v.shape[d], i, j, step, &first);
  gpu_tensor *r = view_of(L, 1);
  /* an empty slice keeps the offset: it may start past the end */
  if (n > 0) r->v.offset += (size_t)((first - 1) * r->v.stride[d]) * dev_dtype_size(r->v.dtype);
  r->v.shape[d] = n;
  r->v.stride[d] *= step;
  return 1;
}

/* Push a table of views of the tensor at 1 along dim d, of the sizes given. */
static void push_pieces(lua_State *L, int d, int n, const int64_t *sizes, int64_t each) {
  lua_createtable(L, n, 0);
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    int64_t len = sizes ? sizes[k] : each;
    gpu_tensor *t = bind_check_tensor(L, 1);
    if (len > t->v.shape[d] - at) len = t->v.shape[d] - at;
    gpu_tensor *r = view_of(L, 1);
    r->v.offset += (size_t)(at * r->v.stride[d]) * dev_dtype_size(r->v.dtype);
    r->v.shape[d] = len;
    at += len;
    lua_rawseti(L, -2, k + 1);
  }
}

/* t:split(size [, dim]): a table of views of size `size` along dim (default
 * 1), the last one shorter when size does not divide the dim;
 * t:split({s1, s2, ...} [, dim]): views of those sizes (summing to the dim's) */
static int t_split(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim == 0) return luaL_error(L, "split: a 0-dim tensor has no dim to split");
  int d = opt_dim(L, 3, t->v.ndim, 0);
  int64_t size = t->v.shape[d];
  if (lua_type(L, 2) == LUA_TTABLE) {
    size_t len = lua_rawlen(L, 2);
    if (len < 1) luaL_argerror(L, 2, "sizes must not be empty");
    if (len > INT32_MAX) luaL_argerror(L, 2, "too many sizes");
    int64_t *sizes = lua_newuserdatauv(L, len * sizeof(int64_t), 0), sum = 0;
    for (size_t k = 0; k < len; k++) {
      int isint;
      lua_rawgeti(L, 2, (lua_Integer)k + 1);
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      lua_pop(L, 1);
      if (!isint || v < 0)
        luaL_argerror(L, 2, lua_pushfstring(L, "sizes[%d] must be a non-negative integer", (int)k + 1));
      sizes[k] = v;
      if (__builtin_add_overflow(sum, (int64_t)v, &sum)) sum = INT64_MAX;
    }
    if (sum != size)
      luaL_argerror(L, 2, lua_pushfstring(L, "sizes sum to %I, dim %d has size %I", (lua_Integer)sum, d + 1,
                                          (lua_Integer)size));
    push_pieces(L, d, (int)len, sizes, 0);
    return 1;
  }
  lua_Integer each = check_int(L, 2, "size");
  if (each <= 0) luaL_argerror(L, 2, lua_pushfstring(L, "size must be positive, got %I", each));
  /* a zero-sized dim splits into one empty piece, as PyTorch */
  push_pieces(L, d, size ? (int)((size + each - 1) / each) : 1, NULL, each);
  return 1;
}

/* t:chunk(n [, dim]): a table of at most n views along dim (default 1), each
 * of ceil(size / n) (the last shorter), as PyTorch */
static int t_chunk(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  lua_Integer n = check_int(L, 2, "chunk count");
  if (n <= 0) luaL_argerror(L, 2, lua_pushfstring(L, "chunk count must be positive, got %I", n));
  if (t->v.ndim == 0) return luaL_error(L, "chunk: a 0-dim tensor has no dim to split");
  int d = opt_dim(L, 3, t->v.ndim, 0);
  if (n > INT32_MAX) luaL_argerror(L, 2, "too many chunks");
  int64_t size = t->v.shape[d], each = (size + n - 1) / n;
  /* a zero-sized dim gives n empty pieces, as PyTorch and NumPy's array_split */
  push_pieces(L, d, size ? (int)((size + each - 1) / each) : (int)n, NULL, each);
  return 1;
}

/* Strides that let a view of shape (ndim, shape) read v's elements in C
 * order without a copy, as PyTorch's computeStride; 0, or -1 when v's
 * layout does not allow it. */
static int view_strides(const dev_view *v, int ndim, const int64_t *shape, int64_t *stride) {
  if (v->ndim == 0 || dev_view_numel(v) == 0) {
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
      stride[d] = st;
      st *= shape[d] ? shape[d] : 1;
    }
    return 0;
  }
  int view_d = ndim - 1;
  int64_t chunk = v->stride[v->ndim - 1], tnumel = 1, vnumel = 1;
  for (int td = v->ndim - 1; td >= 0; td--) {
    tnumel *= v->shape[td];
    if (td == 0 || (v->shape[td - 1] != 1 && v->stride[td - 1] != tnumel * chunk)) {
      while (view_d >= 0 && (vnumel < tnumel || shape[view_d] == 1)) {
        stride[view_d] = vnumel * chunk;
        vnumel *= shape[view_d];
        view_d--;
      }
      if (vnumel != tnumel) return -1;
      if (td > 0) {
        chunk = v->stride[td - 1];
        tnumel = vnumel = 1;
      }
    }
  }
  return view_d == -1 ? 0 : -1;
}

/* -1 in a shape, for t:view and t:reshape (tensor.h) */
void bind_infer_shape(lua_State *L, int arg, int ndim, int64_t *shape, const dev_view *from) {
  int infer = -1;
  int64_t known = 1, n = dev_view_numel(from);
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == -1) {
      if (infer >= 0) luaL_argerror(L, arg, "only one size may be -1");
      infer = d;
      continue;
    }
    if (shape[d] < 0)
      luaL_argerror(L, arg, lua_pushfstring(L, "shape[%d] must be a non-negative integer or -1, got %I", d + 1,
                                            (lua_Integer)shape[d]));
    if (__builtin_mul_overflow(known, shape[d], &known)) luaL_argerror(L, arg, "shape is too large");
  }
  if (infer >= 0) {
    if (known == 0) luaL_argerror(L, arg, "cannot infer -1 beside a zero-sized dim");
    if (n % known)
      luaL_argerror(L, arg, lua_pushfstring(L, "cannot infer -1: %I elements are not divisible by %I",
                                            (lua_Integer)n, (lua_Integer)known));
    shape[infer] = n / known;
    known = n;
  }
  if (known != n) {
    char a[MAXSHAPESTR], b[MAXSHAPESTR];
    bind_shape_str(a, sizeof a, ndim, shape);
    bind_shape_str(b, sizeof b, from->ndim, from->shape);
    luaL_argerror(L, arg, lua_pushfstring(L, "shape %s (%I elements) does not match %s (%I elements)", a,
                                          (lua_Integer)known, b, (lua_Integer)n));
  }
}

/* t:reshape(shape) or t:reshape(n1, n2, ...): the elements in C order with a
 * new shape (one size may be -1: inferred); a view when t's strides allow
 * it, else a contiguous copy (on the current stream) */
static int t_reshape(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t shape[DEV_MAXDIM], stride[DEV_MAXDIM];
  int ndim = read_ints(L, 2, shape, "shape");
  bind_infer_shape(L, 2, ndim, shape, &t->v);
  if (view_strides(&t->v, ndim, shape, stride) == 0) {
    gpu_tensor *r = view_of(L, 1);
    r->v.ndim = ndim;
    memcpy(r->v.shape, shape, sizeof shape);
    memcpy(r->v.stride, stride, sizeof stride);
    return 1;
  }
  /* a copy in C order, then seen with the new shape */
  dev_view src = t->v;
  gpu_tensor *r = bind_new_tensor(L, t->v.buf->kind, src.dtype, src.ndim, src.shape, 0, "reshape");
  dev_view dst = r->v;
  int ridx = lua_gettop(L);
  copy_view(L, bind_stream(L, 0), ridx, dst, 1, src, "reshape");
  r = bind_check_tensor(L, ridx);
  dev_view_set_contiguous(&r->v, ndim, shape);
  return 1;
}

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

/* gpu.cat(list [, dim] [, opts]) and gpu.stack(list [, dim] [, opts]): the
 * tensors of list joined along dim (1 by default): cat along an existing dim
 * (the other sizes equal), stack along a new one (all shapes equal).  Same
 * dtype, same memory side; the result is in list[1]'s memory, or opts.out.
 * One copy per tensor, into a view of the result. */
static int join(lua_State *L, int stack) {
  const char *fname = stack ? "stack" : "cat";
  luaL_checktype(L, 1, LUA_TTABLE);
  int opts = 3, hasdim = !lua_isnoneornil(L, 2);
  if (lua_type(L, 2) == LUA_TTABLE) {
    if (!lua_isnone(L, 3)) luaL_argerror(L, 3, "no argument expected after the options");
    opts = 2;
    hasdim = 0;
  }
  static const char *const names[] = {"out", "stream", NULL};
  int out = bind_read_opts(L, opts, names), stream = out + 1;
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  if (n < 1) luaL_argerror(L, 1, "the list is empty (give at least one tensor)");
  if (n > INT32_MAX) luaL_argerror(L, 1, "the list is too long");
  gpu_tensor *first = list_item(L, 1);
  dev_view f = first->v;
  lua_pop(L, 1);
  if (!stack && f.ndim == 0)
    luaL_argerror(L, 1, "list[1] is a 0-dim tensor: cat needs at least 1 dim (gpu.stack makes a new one)");
  if (stack && f.ndim >= DEV_MAXDIM)
    luaL_argerror(L, 1, lua_pushfstring(L, "list[1] has %d dims: stacking makes %d (at most %d)", f.ndim,
                                        f.ndim + 1, DEV_MAXDIM));
  int d = hasdim ? check_dim(L, 2, f.ndim + stack) : 0;
  int64_t shape[DEV_MAXDIM];
  int ndim = f.ndim + stack;
  for (int k = 0, j = 0; k < ndim; k++) shape[k] = stack && k == d ? n : f.shape[j++];
  for (lua_Integer k = 2; k <= n; k++) {
    gpu_tensor *t = list_item(L, (int)k);
    if (t->v.dtype != f.dtype)
      luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] has dtype %s, list[1] %s (cast with :to(\"%s\"))", (int)k,
                                          dev_dtype_name(t->v.dtype), dev_dtype_name(f.dtype), dev_dtype_name(f.dtype)));
    if (!same_side(t->v.buf->kind, f.buf->kind))
      luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] is in %s memory, list[1] in %s (move it with :to(\"%s\"))",
                                          (int)k, kind_name(t), dev_memkind_name(f.buf->kind),
                                          dev_memkind_name(f.buf->kind)));
    int same = t->v.ndim == f.ndim;
    for (int j = 0; same && j < f.ndim; j++) same = t->v.shape[j] == f.shape[j] || (!stack && j == d);
    if (!same) {
      char a[MAXSHAPESTR], b[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, t->v.ndim, t->v.shape);
      bind_shape_str(b, sizeof b, f.ndim, f.shape);
      if (stack) luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] has shape %s, list[1] %s: stack needs equal shapes",
                                                     (int)k, a, b));
      luaL_argerror(L, 1, lua_pushfstring(L, "list[%d] has shape %s, list[1] %s: sizes must match except in dim %d",
                                          (int)k, a, b, d + 1));
    }
    if (!stack && (__builtin_add_overflow(shape[d], t->v.shape[d], &shape[d]) || shape[d] > ((int64_t)1 << 56)))
      luaL_argerror(L, 1, "the result is too large");
    lua_pop(L, 1);
  }
  /* the result: opts.out (checked) or a new tensor */
  gpu_tensor *o;
  if (!lua_isnil(L, out)) {
    lua_pushvalue(L, out);
    o = bind_test_tensor_handle(L, -1);
    if (!o) luaL_error(L, "bad option 'out' to '%s' (gpu.Tensor expected, got %s)", fname, bind_typename(L, -1));
    if (!o->v.buf) luaL_error(L, "bad option 'out' to '%s' (tensor is closed)", fname);
    int same = o->v.ndim == ndim && o->v.dtype == f.dtype;
    for (int j = 0; same && j < ndim; j++) same = o->v.shape[j] == shape[j];
    if (!same) {
      char a[MAXSHAPESTR], b[MAXSHAPESTR];
      bind_shape_str(a, sizeof a, o->v.ndim, o->v.shape);
      bind_shape_str(b, sizeof b, ndim, shape);
      luaL_error(L, "bad option 'out' to '%s' (%s %s does not match the result %s %s)", fname,
                 dev_dtype_name(o->v.dtype), a, dev_dtype_name(f.dtype), b);
    }
    if (!same_side(o->v.buf->kind, f.buf->kind))
      luaL_error(L, "bad option 'out' to '%s' (tensor is in %s memory, the list in %s)", fname, kind_name(o),
                 dev_memkind_name(f.buf->kind));
    for (lua_Integer k = 1; k <= n; k++) {
      gpu_tensor *t = list_item(L, (int)k);
      if (overlap(&o->v, &t->v))
        luaL_error(L, "bad option 'out' to '%s' (it shares memory with list[%d])", fname, (int)k);
      lua_pop(L, 1);
    }
  } else {
    bind_new_tensor(L, f.buf->kind, f.dtype, ndim, shape, stream, fname);
  }
  int ridx = lua_gettop(L);
  dev_stream *s = bind_stream(L, stream);
  int64_t at = 0;
  for (lua_Integer k = 1; k <= n; k++) {
    gpu_tensor *t = list_item(L, (int)k);
    dev_view src = t->v, dst = bind_check_tensor(L, ridx)->v;
    size_t esz = dev_dtype_size(dst.dtype);
    if (stack) {
      dst.offset += (size_t)((k - 1) * dst.stride[d]) * esz;
      for (int j = d; j < ndim - 1; j++) {
        dst.shape[j] = dst.shape[j + 1];
        dst.stride[j] = dst.stride[j + 1];
      }
      dst.ndim--;
    } else {
      dst.offset += (size_t)(at * dst.stride[d]) * esz;
      dst.shape[d] = src.shape[d];
      at += src.shape[d];
    }
    if (dev_view_numel(&src) > 0) copy_view(L, s, ridx, dst, lua_gettop(L), src, fname);
    lua_pop(L, 1);
  }
  return 1;
}

static int tensor_cat(lua_State *L) { return join(L, 0); }
static int tensor_stack(lua_State *L) { return join(L, 1); }

/* ---- creation: linspace, eye, randint, *_like ---------------------------- */

/* Enqueue op on the stream of slot stream: its output a view of the tensor
 * at stack index out, its input (if any) one of the tensor at in. */
static void submit_op(lua_State *L, int stream, dev_kop *op, int out, int in, const char *fname) {
  dev_stream *s = bind_stream(L, stream);
  dev_ctx *ctx = dev_stream_ctx(s);
  op->out.buf = bind_check_tensor(L, out)->v.buf;
  if (op->nin) op->in[0].buf = bind_check_tensor(L, in)->v.buf;
  bind_call_site(L, ctx, fname);
  BIND_CHECK(L, ctx, dev_submit(ctx, s, op), fname);
}

/* gpu.linspace(a, b, n [, opts]): n values from a to b evenly spaced, the
 * last exactly b (NumPy's: a + i*step in f64, rounded once to the dtype;
 * integer dtypes take the floor, as NumPy) */
static int tensor_linspace(lua_State *L) {
  double a = luaL_checknumber(L, 1), b = luaL_checknumber(L, 2);
  lua_Integer n = check_int(L, 3, "count");
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
  submit_op(L, stream, &op, idx, 0, "linspace");
  if (n > 1) {
    dev_kop last = {.kind = DEV_OP_FILL, .s0 = {0, 0, b}};
    last.out = bind_check_tensor(L, idx)->v;
    last.out.offset += (size_t)(n - 1) * dev_dtype_size(last.out.dtype);
    last.out.shape[0] = 1;
    submit_op(L, stream, &last, idx, 0, "linspace");
  }
  if (floor) {
    dev_kop fl = {.kind = DEV_OP_UNARY, .code = DEV_UN_FLOOR, .nin = 1};
    fl.out = fl.in[0] = bind_check_tensor(L, idx)->v;
    submit_op(L, stream, &fl, idx, idx, "linspace");
    dev_kop cast = {.kind = DEV_OP_UNARY, .code = DEV_UN_COPY, .nin = 1};
    cast.in[0] = bind_check_tensor(L, idx)->v;
    cast.out = bind_check_tensor(L, ridx)->v;
    submit_op(L, stream, &cast, ridx, idx, "linspace");
    lua_settop(L, ridx);
  }
  return 1;
}

/* gpu.eye(n [, m] [, opts]): n x m (m = n by default), ones on the diagonal */
static int tensor_eye(lua_State *L) {
  lua_Integer n = check_int(L, 1, "row count"), m = n;
  int opts = 3;
  if (lua_type(L, 2) == LUA_TTABLE) opts = 2;
  else if (!lua_isnoneornil(L, 2)) m = check_int(L, 2, "column count");
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
  submit_op(L, stream, &op, ridx, 0, "eye");
  return 1;
}

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
  lua_Integer lo = check_int(L, 1, "low"), hi = check_int(L, 2, "high");
  int64_t shape[DEV_MAXDIM];
  if (lua_type(L, 3) != LUA_TTABLE && lua_type(L, 3) != LUA_TNUMBER)
    luaL_typeerror(L, 3, "shape table or integer");
  lua_settop(L, 4);
  /* the shape through gpu.empty's checks: gpu.empty(shape) would allocate */
  int ndim;
  if (lua_type(L, 3) == LUA_TNUMBER) {
    ndim = 1;
    shape[0] = check_int(L, 3, "size");
  } else {
    ndim = read_ints(L, 3, shape, "shape");
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
  submit_op(L, stream, &op, lua_gettop(L), 0, "randint");
  return 1;
}

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
    submit_op(L, stream, &op, ridx, 0, fname);
  }
  return 1;
}

static int tensor_empty_like(lua_State *L) { return make_like(L, 0, "empty_like"); }
static int tensor_zeros_like(lua_State *L) { return make_like(L, 1, "zeros_like"); }
static int tensor_ones_like(lua_State *L) { return make_like(L, 2, "ones_like"); }
static int tensor_full_like(lua_State *L) { return make_like(L, 3, "full_like"); }

/* ---- registration ---------------------------------------------------- */

static const luaL_Reg view_methods[] = {
  {"transpose", t_transpose}, {"t", t_t}, {"permute", t_permute},
  {"unsqueeze", t_unsqueeze}, {"squeeze", t_squeeze}, {"expand", t_expand},
  {"select", t_select}, {"slice", t_slice}, {"split", t_split}, {"chunk", t_chunk},
  {"reshape", t_reshape},
  {NULL, NULL}
};

static const luaL_Reg view_funcs[] = {
  {"cat", tensor_cat}, {"stack", tensor_stack},
  {"linspace", tensor_linspace}, {"eye", tensor_eye}, {"randint", tensor_randint},
  {"empty_like", tensor_empty_like}, {"zeros_like", tensor_zeros_like},
  {"ones_like", tensor_ones_like}, {"full_like", tensor_full_like},
  {NULL, NULL}
};

/* Called by bind_open_tensor with the module table on top: the methods go
 * into gpu.Tensor's method table, the functions into the module. */
void bind_open_tensor_view(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &bind_tensor_type);
  lua_getfield(L, -1, "__methods");
  luaL_setfuncs(L, view_methods, 0);
  lua_pop(L, 2);
  luaL_setfuncs(L, view_funcs, 0);
}
