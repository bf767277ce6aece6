/* gpu.Tensor views: view, reshape, narrow, slice, select, transpose, t,
 * permute, expand, squeeze, unsqueeze, split, chunk, diagonal.
 *
 * A view is a new handle on the same buffer (it retains it, so the base may
 * be dropped first) with its own offset, shape and strides: no device op, no
 * copy (t:reshape copies when the strides do not allow a view; t:contiguous
 * and t:clone, which always may copy, are in tensor_copy.c).  The race
 * checker and the fences see views by their buffer.  An expanded view
 * (stride 0 along a dim of size > 1) is read-only: the device layer refuses
 * it as an op's output.  Dims and indices are 1-based, negative ones count
 * from the end. */
#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* An optional dim at idx (nil: dflt, 0-based). */
static int opt_dim(lua_State *L, int idx, int ndim, int dflt) {
  return lua_isnoneornil(L, idx) ? dflt : bind_tensor_dim(L, idx, idx, ndim);
}

/* Remove dim d of v (its size is 1, or v is being indexed along it). */
static void drop_dim(dev_view *v, int d) {
  for (int k = d; k < v->ndim - 1; k++) {
    v->shape[k] = v->shape[k + 1];
    v->stride[k] = v->stride[k + 1];
  }
  v->ndim--;
}

/* t:transpose(d1, d2): dims d1 and d2 swapped */
static int t_transpose(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int a = bind_tensor_dim(L, 2, 2, t->v.ndim), b = bind_tensor_dim(L, 3, 3, t->v.ndim);
  gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  int n = bind_tensor_ints(L, 2, dims, "dims"), nd = t->v.ndim, seen[DEV_MAXDIM] = {0};
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
  gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  int d = bind_tensor_dim(L, 2, 2, nd + 1);
  gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  int d = lua_isnoneornil(L, 2) ? -1 : bind_tensor_dim(L, 2, 2, t->v.ndim);
  gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  int n = bind_tensor_ints(L, 2, shape, "shape"), nd = t->v.ndim;
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
  gpu_tensor *r = bind_tensor_view_of(L, 1);
  r->v.ndim = n;
  memcpy(r->v.shape, shape, sizeof shape);
  memcpy(r->v.stride, stride, sizeof stride);
  return 1;
}

/* t:select(dim, i): the slice at index i (1-based, negative from the end)
 * along dim, which is dropped */
static int t_select(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int d = bind_tensor_dim(L, 2, 2, t->v.ndim);
  lua_Integer i = bind_tensor_int(L, 3, "index"), n = t->v.shape[d];
  if (i < -n || i == 0 || i > n)
    luaL_argerror(L, 3, bind_push_index_range(L, "index", i, d, n, 1));
  if (i < 0) i += n + 1;
  gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  int d = bind_tensor_dim(L, 2, 2, t->v.ndim);
  lua_Integer i = bind_tensor_int(L, 3, "start");
  lua_Integer j = lua_isnoneornil(L, 4) ? -1 : bind_tensor_int(L, 4, "end");
  lua_Integer step = lua_isnoneornil(L, 5) ? 1 : bind_tensor_int(L, 5, "step");
  if (step <= 0) luaL_argerror(L, 5, lua_pushfstring(L, "step must be positive, got %I", step));
  int64_t first, n = sub_range(t->v.shape[d], i, j, step, &first);
  gpu_tensor *r = bind_tensor_view_of(L, 1);
  /* an empty slice keeps the offset: it may start past the end */
  if (n > 0) r->v.offset += (size_t)((first - 1) * r->v.stride[d]) * dev_dtype_size(r->v.dtype);
  r->v.shape[d] = n;
  r->v.stride[d] *= step;
  return 1;
}

/* t:diagonal([offset [, dim1 [, dim2]]]): the elements t[..i..i+offset..]
 * along dims dim1 and dim2 (1 and 2 by default), which are dropped, as a new
 * last dim; a view (its stride the sum of theirs), as torch.diagonal */
static int t_diagonal(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  if (t->v.ndim < 2) return luaL_error(L, "diagonal: needs a tensor of at least 2 dims, got %d", t->v.ndim);
  lua_Integer off = lua_isnoneornil(L, 2) ? 0 : bind_tensor_int(L, 2, "offset");
  int a = opt_dim(L, 3, t->v.ndim, 0), b = opt_dim(L, 4, t->v.ndim, 1);
  if (a == b) luaL_argerror(L, 4, lua_pushfstring(L, "dim1 and dim2 are both dim %d", a + 1));
  int64_t na = t->v.shape[a], nb = t->v.shape[b];
  /* the count on the diagonal; an offset past either dim gives an empty view */
  int64_t n = 0, first_a = 0, first_b = 0;
  if (off >= 0 && off < nb) n = na < nb - off ? na : nb - off, first_b = off;
  else if (off < 0 && -off < na) n = na + off < nb ? na + off : nb, first_a = -off;
  gpu_tensor *r = bind_tensor_view_of(L, 1);
  dev_view *v = &r->v;
  int64_t step = v->stride[a] + v->stride[b];
  if (n > 0) v->offset += (size_t)(first_a * v->stride[a] + first_b * v->stride[b]) * dev_dtype_size(v->dtype);
  drop_dim(v, a > b ? a : b);
  drop_dim(v, a > b ? b : a);
  v->shape[v->ndim] = n;
  v->stride[v->ndim] = step;
  v->ndim++;
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
    gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  lua_Integer each = bind_tensor_int(L, 2, "size");
  if (each <= 0) luaL_argerror(L, 2, lua_pushfstring(L, "size must be positive, got %I", each));
  /* a zero-sized dim splits into one empty piece, as PyTorch */
  push_pieces(L, d, size ? (int)((size + each - 1) / each) : 1, NULL, each);
  return 1;
}

/* t:chunk(n [, dim]): a table of at most n views along dim (default 1), each
 * of ceil(size / n) (the last shorter), as PyTorch */
static int t_chunk(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  lua_Integer n = bind_tensor_int(L, 2, "chunk count");
  if (n <= 0) luaL_argerror(L, 2, lua_pushfstring(L, "chunk count must be positive, got %I", n));
  if (t->v.ndim == 0) return luaL_error(L, "chunk: a 0-dim tensor has no dim to split");
  int d = opt_dim(L, 3, t->v.ndim, 0);
  if (n > INT32_MAX) luaL_argerror(L, 2, "too many chunks");
  int64_t size = t->v.shape[d], each = (size + n - 1) / n;
  /* a zero-sized dim gives n empty pieces, as PyTorch and NumPy's array_split */
  push_pieces(L, d, size ? (int)((size + each - 1) / each) : (int)n, NULL, each);
  return 1;
}

static int t_narrow(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int d = bind_tensor_dim(L, 2, 2, t->v.ndim);
  lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
  /* length 0 is an empty view; it may start just past the end */
  if (start < 1 || start > t->v.shape[d] + (len == 0))
    luaL_argerror(L, 3, bind_push_index_range(L, "start", start, d, t->v.shape[d], 0));
  if (len < 0)
    luaL_argerror(L, 4, lua_pushfstring(L, "length must be non-negative, got %I", len));
  if (len > t->v.shape[d] - (start - 1))
    luaL_argerror(L, 4, lua_pushfstring(L, "narrow past the end: start %I with length %I exceeds size %I of dim %d",
                                        start, len, (lua_Integer)t->v.shape[d], d + 1));
  gpu_tensor *r = bind_tensor_view_of(L, 1);
  r->v.offset += (size_t)((start - 1) * r->v.stride[d]) * dev_dtype_size(r->v.dtype);
  r->v.shape[d] = len;
  return 1;
}

/* t:view(shape) or t:view(n1, n2, ...): t's elements with a new shape, no
 * copy (t must be contiguous); one size may be -1, {} is 0-dim */
static int t_view(lua_State *L) {
  gpu_tensor *t = bind_check_tensor(L, 1);
  int64_t shape[DEV_MAXDIM];
  int ndim = bind_tensor_ints(L, 2, shape, "shape");
  bind_infer_shape(L, 2, ndim, shape, &t->v);
  if (!dev_view_contiguous(&t->v))
    luaL_error(L, "view: tensor is not contiguous (use t:contiguous():view(...))");
  gpu_tensor *r = bind_tensor_view_of(L, 1);
  dev_view_set_contiguous(&r->v, ndim, shape);
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
  int ndim = bind_tensor_ints(L, 2, shape, "shape");
  bind_infer_shape(L, 2, ndim, shape, &t->v);
  if (view_strides(&t->v, ndim, shape, stride) == 0) {
    gpu_tensor *r = bind_tensor_view_of(L, 1);
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
  bind_tensor_copy_view(L, bind_stream(L, 0), ridx, dst, 1, src, "reshape");
  r = bind_check_tensor(L, ridx);
  dev_view_set_contiguous(&r->v, ndim, shape);
  return 1;
}

/* ---- methods ---------------------------------------------------------- */

const luaL_Reg bind_tensor_view_methods[] = {
  {"view", t_view}, {"reshape", t_reshape}, {"narrow", t_narrow}, {"slice", t_slice}, {"select", t_select},
  {"transpose", t_transpose}, {"t", t_t}, {"permute", t_permute}, {"expand", t_expand},
  {"squeeze", t_squeeze}, {"unsqueeze", t_unsqueeze}, {"split", t_split}, {"chunk", t_chunk},
  {"diagonal", t_diagonal},
  {NULL, NULL}
};
