/* What the embedding API (gpulua.h) hands to and takes from scripts: tensors
 * over the application's memory, stream handles both ways, and C functions
 * launched as kernels.  Each entry point is a lua_CFunction that the runtime
 * calls in protected mode, so a bad argument is an error message, never a
 * crash; messages start with the public function's name. */
#include <stdlib.h>
#include <string.h>

#include "bindings.h"
#include "common.h"

_Static_assert(GPULUA_F32 == (int)DEV_F32 && GPULUA_F64 == (int)DEV_F64 && GPULUA_F16 == (int)DEV_F16 &&
               GPULUA_BF16 == (int)DEV_BF16 && GPULUA_I8 == (int)DEV_I8 && GPULUA_U8 == (int)DEV_U8 &&
               GPULUA_I32 == (int)DEV_I32 && GPULUA_I64 == (int)DEV_I64 && GPULUA_BOOL == (int)DEV_BOOL,
               "gpulua_dtype follows dev_dtype");
_Static_assert(GPULUA_MEM_DEVICE == (int)DEV_MEM_DEVICE && GPULUA_MEM_PINNED == (int)DEV_MEM_PINNED &&
               GPULUA_MEM_HOST == (int)DEV_MEM_HOST, "gpulua_memory follows dev_memkind");
_Static_assert(GPULUA_MAXDIM == DEV_MAXDIM, "GPULUA_MAXDIM is DEV_MAXDIM");

/* ---- tensors ------------------------------------------------------------ */

/* 1: lightuserdata embed_wrap.  Pushes the tensor. */
int embed_push_tensor(lua_State *L) {
  const embed_wrap *w = lua_touserdata(L, 1);
  const gpulua_tensor_info *ti = w->t;
  const char *fn = w->fn;
  if (ti == NULL) return luaL_error(L, "%s: the tensor description is NULL", fn);
  if (w->flags & ~GPULUA_PUSH_GUARDED)
    return luaL_error(L, "%s: unknown flags %I (GPULUA_PUSH_GUARDED is the only flag)", fn,
                      (lua_Integer)(w->flags & ~GPULUA_PUSH_GUARDED));
  if ((unsigned)ti->dtype >= DEV_NDTYPE) return luaL_error(L, "%s: dtype %d is not a gpulua_dtype", fn, (int)ti->dtype);
  if ((unsigned)ti->memory > DEV_MEM_HOST)
    return luaL_error(L, "%s: memory %d is not a gpulua_memory", fn, (int)ti->memory);
  if (ti->ndim < 0 || ti->ndim > DEV_MAXDIM)
    return luaL_error(L, "%s: ndim %d is outside [0, %d]", fn, ti->ndim, DEV_MAXDIM);
  dev_view v;
  memset(&v, 0, sizeof v);
  v.dtype = (dev_dtype)ti->dtype;
  size_t el = dev_dtype_size(v.dtype);
  /* the last element's offset, in elements: the memory the tensor spans */
  int64_t last = 0, numel = 1;
  for (int d = 0; d < ti->ndim; d++) {
    if (ti->shape[d] <= 0)
      return luaL_error(L, "%s: shape[%d] is %I (dims must be positive)", fn, d, (lua_Integer)ti->shape[d]);
    if (__builtin_mul_overflow(numel, ti->shape[d], &numel) || numel > ((int64_t)1 << 56))
      return luaL_error(L, "%s: the shape has too many elements", fn);
  }
  if (ti->strided) {
    for (int d = 0; d < ti->ndim; d++) {
      int64_t span;
      if (ti->strides[d] < 0)
        return luaL_error(L, "%s: strides[%d] is %I (strides must be >= 0)", fn, d, (lua_Integer)ti->strides[d]);
      if (__builtin_mul_overflow(ti->shape[d] - 1, ti->strides[d], &span) ||
          __builtin_add_overflow(last, span, &last) || last > ((int64_t)1 << 56))
        return luaL_error(L, "%s: the strides reach too far", fn);
      v.shape[d] = ti->shape[d];
      v.stride[d] = ti->strides[d];
    }
    v.ndim = ti->ndim;
  } else {
    dev_view_set_contiguous(&v, ti->ndim, ti->shape);
    last = numel - 1;
  }
  if (ti->data == NULL) return luaL_error(L, "%s: data is NULL", fn);
  if ((uintptr_t)ti->data % el != 0)
    return luaL_error(L, "%s: data %p is not aligned to its %s elements (%d bytes)", fn, ti->data,
                      dev_dtype_name(v.dtype), (int)el);
  size_t bytes = (size_t)(last + 1) * el;
  gpu_tensor *t = bind_push_tensor_handle(L);
  dev_ctx *ctx = bind_ctx(L);
  dev_buf *b;
  if (dev_buf_wrap(ctx, (dev_memkind)ti->memory, ti->data, bytes, w->release, w->ud, &b) != DEV_OK)
    return luaL_error(L, "%s: %s", fn, dev_errmsg(ctx));
  /* the application's pageable memory: copies block unless gpulua guards it */
  if (w->flags & GPULUA_PUSH_GUARDED) dev_buf_guard(b);
  v.buf = b;
  t->v = v;
  return 1;
}

/* 1: lightuserdata gpulua_tensor_info (out), 2: the value. */
int embed_check_tensor(lua_State *L) {
  gpulua_tensor_info *out = lua_touserdata(L, 1);
  gpu_tensor *t = bind_test_tensor_handle(L, 2);
  if (t == NULL) return luaL_error(L, "gpulua_check_tensor: expected a gpu.Tensor, got %s", bind_typename(L, 2));
  if (t->v.buf == NULL) return luaL_error(L, "gpulua_check_tensor: the tensor is closed");
  memset(out, 0, sizeof *out);
  out->data = dev_view_ptr(&t->v);
  out->dtype = (gpulua_dtype)t->v.dtype;
  out->memory = (gpulua_memory)t->v.buf->kind;
  out->device = strcmp(dev_backend_name(bind_ctx(L)), "host") == 0 ? -1 : t->v.buf->device;
  out->ndim = t->v.ndim;
  for (int d = 0; d < t->v.ndim; d++) {
    out->shape[d] = t->v.shape[d];
    out->strides[d] = t->v.stride[d];
  }
  out->strided = 1;
  return 0;
}

/* ---- streams ------------------------------------------------------------ */

/* 1: lightuserdata void ** (out), 2: a gpu.Stream, or none for the current stream. */
int embed_stream_handle(lua_State *L) {
  void **out = lua_touserdata(L, 1);
  dev_stream *s;
  if (lua_isnoneornil(L, 2)) {
    s = bind_stream(L, 0);
  } else {
    gpu_stream *p = bind_test_stream(L, 2);
    if (p == NULL) return luaL_error(L, "gpulua_stream_handle: expected a gpu.Stream, got %s", bind_typename(L, 2));
    if (p->s == NULL) return luaL_error(L, "gpulua_stream_handle: the stream is closed");
    s = p->s;
  }
  *out = dev_stream_native(s);
  return 0;
}

/* 1: lightuserdata: the application's stream handle (NULL: the default
 * stream, as CUDA's NULL stream is).  Pushes a gpu.Stream. */
int embed_push_stream(lua_State *L) {
  void *native = lua_touserdata(L, 1);
  dev_ctx *ctx = bind_ctx(L);
  if (native == NULL) {
    bind_push_stream(L, dev_default_stream(ctx));
    return 1;
  }
  gpu_stream *p = bind_new_udata(L, &bind_stream_type, sizeof *p, 0);
  dev_stream *s;
  if (dev_stream_wrap(ctx, native, &s) != DEV_OK)
    return luaL_error(L, "gpulua_push_stream: %s", dev_errmsg(ctx));
  p->s = s;
  return 1;
}

/* ---- C function kernels ------------------------------------------------- */

typedef struct ckernel { gpulua_kernel_fn fn; void *ud; } ckernel;

/* The device layer's call, as the application's function sees it. */
static int ckernel_call(const dev_cfunc_call *c, char *err, size_t errlen) {
  const ckernel *ck = c->ud;
  gpulua_kernel_call call;
  memset(&call, 0, sizeof call);
  call.name = c->name;
  memcpy(call.grid, c->grid, sizeof call.grid);
  memcpy(call.block, c->block, sizeof call.block);
  call.shared = c->shared;
  call.nargs = c->nargs;
  call.args = c->args;
  call.stream = c->stream;
  call.ud = ck->ud;
  call.err = err;
  call.errlen = errlen;
  return ck->fn(&call);
}

/* 1: lightuserdata embed_kernel.  Adds gpu.kernels[name]. */
int embed_register_kernel(lua_State *L) {
  const embed_kernel *r = lua_touserdata(L, 1);
  const char *fn = "gpulua_register_kernel";
  if (r->name == NULL) return luaL_error(L, "%s: the name is NULL", fn);
  if (r->fn == NULL) return luaL_error(L, "%s: kernel '%s': the function is NULL", fn, r->name);
  /* gpu.kernels, made on first use, in the loaded module table */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, "gpu") != LUA_TTABLE) return luaL_error(L, "%s: the gpu module is not loaded", fn);
  lua_getfield(L, -1, "kernels");
  if (lua_type(L, -1) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "kernels");
  }
  if (lua_getfield(L, -1, r->name) != LUA_TNIL)
    return luaL_error(L, "%s: a kernel '%s' is already registered", fn, r->name);
  lua_pop(L, 1);
  /* the handle first (released state), then the module: an error leaks nothing */
  gpu_kernel_handle *h = bind_new_kernel_handle(L);
  ckernel *ck = malloc(sizeof *ck);
  if (ck == NULL) return luaL_error(L, "%s: out of memory", fn);
  ck->fn = r->fn;
  ck->ud = r->ud;
  dev_ctx *ctx = bind_ctx(L);
  dev_module *m;
  if (dev_module_cfunc(ctx, r->name, r->params, ckernel_call, ck, free, &m) != DEV_OK) {
    free(ck);
    return luaL_error(L, "%s: %s", fn, dev_errmsg(ctx));
  }
  h->m = m;
  h->k = dev_module_kernel(m, 0);
  lua_setfield(L, -2, r->name);
  return 0;
}
