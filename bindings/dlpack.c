/* DLPack: tensors shared with other libraries without copying.  The public
 * side (the struct declarations, gpulua_to_dlpack, gpulua_push_dlpack) is in
 * interp/lib/gpulua.h; here are the two conversions and gpu.from_dlpack(p), for
 * a script that an application hands a managed tensor to as a light
 * userdata. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bindings.h"
#include "common.h"
#include "gpulua.h"

/* The registry key of a weak-valued table: managed tensor address -> the
 * tensor handle its import made (a second import of a live one is refused). */

/* ---- dtypes and devices --------------------------------------------------- */

static DLDataType to_dl_dtype(dev_dtype t) {
  DLDataType d = {kDLFloat, 32, 1};
  switch (t) {
  case DEV_F32: d.code = kDLFloat; d.bits = 32; break;
  case DEV_F64: d.code = kDLFloat; d.bits = 64; break;
  case DEV_F16: d.code = kDLFloat; d.bits = 16; break;
  case DEV_BF16: d.code = kDLBfloat; d.bits = 16; break;
  case DEV_I8: d.code = kDLInt; d.bits = 8; break;
  case DEV_U8: d.code = kDLUInt; d.bits = 8; break;
  case DEV_I32: d.code = kDLInt; d.bits = 32; break;
  case DEV_I64: d.code = kDLInt; d.bits = 64; break;
  case DEV_BOOL: d.code = kDLBool; d.bits = 8; break;
  default: break;
  }
  return d;
}

static int from_dl_dtype(DLDataType d, dev_dtype *out) {
  for (int t = 0; t < DEV_NDTYPE; t++) {
    DLDataType x = to_dl_dtype((dev_dtype)t);
    if (x.code == d.code && x.bits == d.bits) {
      *out = (dev_dtype)t;
      return 0;
    }
  }
  return -1;
}

static const char *dl_code_name(unsigned code) {
  static const char *const names[] = {"int", "uint", "float", "opaque handle", "bfloat", "complex", "bool"};
  return code < sizeof names / sizeof names[0] ? names[code] : code <= kDLFloat4_e2m1fn ? "float8/6/4" : "unknown";
}

static const char *dl_device_name(int type) {
  switch (type) {
  case kDLCPU: return "kDLCPU";
  case kDLCUDA: return "kDLCUDA";
  case kDLCUDAHost: return "kDLCUDAHost";
  case kDLCUDAManaged: return "kDLCUDAManaged";
  case kDLROCM: return "kDLROCM";
  case kDLROCMHost: return "kDLROCMHost";
  case kDLOpenCL: return "kDLOpenCL";
  case kDLVulkan: return "kDLVulkan";
  case kDLMetal: return "kDLMetal";
  case kDLOneAPI: return "kDLOneAPI";
  default: return "an unknown device type";
  }
}

static int host_backend(dev_ctx *ctx) { return strcmp(dev_backend_name(ctx), "host") == 0; }

/* ---- export --------------------------------------------------------------- */

/* One allocation per export: both struct flavours (one is used), and the
 * shape and strides they point to. */
typedef struct dl_export {
  DLManagedTensor legacy;
  DLManagedTensorVersioned versioned;
  dev_buf *buf;
  int64_t shape[DEV_MAXDIM], strides[DEV_MAXDIM];
} dl_export;

/* Any thread, also after gpulua_close: the device layer defers or locks. */
static void export_free(dl_export *e) {
  dev_buf_release_async(e->buf);
  free(e);
}
static void legacy_deleter(DLManagedTensor *m) { if (m) export_free(m->manager_ctx); }
static void versioned_deleter(DLManagedTensorVersioned *m) { if (m) export_free(m->manager_ctx); }

/* (tensor, out: a DLManagedTensor ** or DLManagedTensorVersioned **, versioned)
 * Called by the runtime in protected mode; *out is set only on success (the
 * runtime has set it to NULL). */
int embed_dlpack_export(lua_State *L) {
  void *out = lua_touserdata(L, 2);
  int versioned = lua_toboolean(L, 3);
  gpu_tensor *t = bind_test_tensor_handle(L, 1);
  if (!t) return luaL_error(L, "not a gpu.Tensor (got %s)", bind_typename(L, 1));
  if (!t->v.buf) return luaL_error(L, "the tensor is closed");
  dev_ctx *ctx = bind_ctx(L);
  bind_call_site(L, ctx, "to_dlpack");
  /* the consumer may read or write at once, on any stream */
  BIND_CHECK(L, ctx, dev_buf_wait(t->v.buf, "a DLPack export"), "to_dlpack");
  dl_export *e = calloc(1, sizeof *e);
  if (!e) return luaL_error(L, "to_dlpack: out of memory");
  /* nothing below raises */
  const dev_view *v = &t->v;
  DLTensor *dl = versioned ? &e->versioned.dl_tensor : &e->legacy.dl_tensor;
  e->buf = v->buf;
  dl->data = v->buf->ptr;
  dl->byte_offset = v->offset;
  dl->ndim = v->ndim;
  dl->dtype = to_dl_dtype(v->dtype);
  for (int d = 0; d < v->ndim; d++) {
    e->shape[d] = v->shape[d];
    e->strides[d] = v->stride[d];
  }
  dl->shape = e->shape;
  dl->strides = e->strides;
  dl->device.device_id = 0;
  if (host_backend(ctx)) {
    dl->device.device_type = kDLCPU;
  } else if (v->buf->kind == DEV_MEM_DEVICE) {
    dl->device.device_type = kDLCUDA;
    dl->device.device_id = v->buf->device;
  } else {
    dl->device.device_type = v->buf->kind == DEV_MEM_PINNED ? kDLCUDAHost : kDLCPU;
  }
  dev_buf_retain(v->buf);
  if (versioned) {
    e->versioned.version.major = DLPACK_MAJOR_VERSION;
    e->versioned.version.minor = DLPACK_MINOR_VERSION;
    e->versioned.manager_ctx = e;
    e->versioned.deleter = versioned_deleter;
    e->versioned.flags = 0;
    *(DLManagedTensorVersioned **)out = &e->versioned;
  } else {
    e->legacy.manager_ctx = e;
    e->legacy.deleter = legacy_deleter;
    *(DLManagedTensor **)out = &e->legacy;
  }
  return 0;
}

/* ---- import --------------------------------------------------------------- */

/* Raise: an argument error when the script called (arg > 0), else a plain
 * message for the C API.  Formats with snprintf: lua_pushfstring lacks %llu. */
static int import_fail(lua_State *L, int arg, const char *fname, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
static int import_fail(lua_State *L, int arg, const char *fname, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (arg > 0) return luaL_argerror(L, arg, msg);
  return luaL_error(L, "%s: %s", fname, msg);
}

static void release_legacy(void *ud, void *ptr) {
  (void)ptr;
  DLManagedTensor *m = ud;
  if (m->deleter) m->deleter(m);
}

static void release_versioned(void *ud, void *ptr) {
  (void)ptr;
  DLManagedTensorVersioned *m = ud;
  if (m->deleter) m->deleter(m);
}

/* Push a tensor viewing p's memory (a DLManagedTensor, or a
 * DLManagedTensorVersioned if versioned), owning p on success only: every
 * check, and the one Lua allocation, come before the wrap. */
/* Each import check raises through import_fail (a Lua error naming the
 * argument or the call); these helpers return only when it passes. */

/* The DLTensor of a managed tensor (versioned: a version this gpulua reads,
 * and writable). */
static const DLTensor *import_header(lua_State *L, void *p, int versioned, int arg, const char *fname) {
  if (!versioned) return &((const DLManagedTensor *)p)->dl_tensor;
  const DLManagedTensorVersioned *mv = p;
  if (mv->version.major != DLPACK_MAJOR_VERSION)
    import_fail(L, arg, fname, "DLPack version %u.%u (this gpulua reads %d.x)",
                (unsigned)mv->version.major, (unsigned)mv->version.minor, DLPACK_MAJOR_VERSION);
  if (mv->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    import_fail(L, arg, fname, "the tensor is read-only (gpulua tensors are always writable)");
  return &mv->dl_tensor;
}

/* The kind of memory the tensor's device names, if this interpreter can use it. */
static dev_memkind import_kind(lua_State *L, const DLTensor *dl, dev_ctx *ctx, int arg, const char *fname) {
  switch ((int)dl->device.device_type) {
  case kDLCPU: return DEV_MEM_HOST;
  case kDLCUDAHost: return DEV_MEM_PINNED;
  case kDLCUDA:
    if (host_backend(ctx))
      import_fail(L, arg, fname, "kDLCUDA memory cannot be used on the host backend (no GPU)");
    if (dl->device.device_id != dev_current_device(ctx))
      import_fail(L, arg, fname, "kDLCUDA memory of device %d; this interpreter drives device %d",
                  (int)dl->device.device_id, dev_current_device(ctx));
    return DEV_MEM_DEVICE;
  default:
    import_fail(L, arg, fname, "device type %d (%s) is not supported (kDLCPU, kDLCUDAHost or kDLCUDA)",
                (int)dl->device.device_type, dl_device_name((int)dl->device.device_type));
    return DEV_MEM_HOST;
  }
}

/* The view of the tensor's shape and strides (in elements, forwards only)
 * into *v; how many elements after the first the last one lies. */
static int64_t import_view(lua_State *L, const DLTensor *dl, dev_view *v, int arg, const char *fname) {
  int64_t expect = 1, hi = 0;
  v->ndim = dl->ndim;
  for (int d = dl->ndim - 1; d >= 0; d--) {
    if (dl->shape[d] <= 0)
      import_fail(L, arg, fname, "size %lld in dim %d (gpulua has no empty tensors)", (long long)dl->shape[d], d + 1);
    v->shape[d] = dl->shape[d];
    v->stride[d] = dl->strides ? dl->strides[d] : expect;
    /* the kernels walk views forwards only */
    if (v->stride[d] < 0)
      import_fail(L, arg, fname, "negative stride %lld in dim %d is not supported", (long long)v->stride[d], d + 1);
    if (__builtin_mul_overflow(expect, dl->shape[d], &expect) || expect > ((int64_t)1 << 56))
      import_fail(L, arg, fname, "too many elements");
    uint64_t ext;
    if (__builtin_mul_overflow((uint64_t)(v->shape[d] - 1), (uint64_t)v->stride[d], &ext) ||
        ext > (uint64_t)(INT64_MAX / 16))
      import_fail(L, arg, fname, "stride %lld in dim %d is too large", (long long)v->stride[d], d + 1);
    hi += (int64_t)ext;
  }
  return hi;
}

/* The first element's address (aligned) and the bytes up to the last one's
 * end, within the address space. */
static uintptr_t import_span(lua_State *L, const DLTensor *dl, size_t esz, int64_t hi, size_t *bytes, int arg,
                             const char *fname) {
  uintptr_t first = (uintptr_t)dl->data, end;
  if (__builtin_add_overflow(first, (uintptr_t)dl->byte_offset, &first))
    import_fail(L, arg, fname, "byte_offset %llu runs past the address space", (unsigned long long)dl->byte_offset);
  if (first & (esz - 1))
    import_fail(L, arg, fname, "the first element (data + byte_offset) is not aligned to %zu bytes", esz);
  if (__builtin_mul_overflow((size_t)hi + 1, esz, bytes) || __builtin_add_overflow(first, (uintptr_t)*bytes, &end))
    import_fail(L, arg, fname, "the elements span more than the address space");
  return first;
}

static int push_import(lua_State *L, void *p, int versioned, int arg, const char *fname) {
  if (!p) return import_fail(L, arg, fname, "the managed tensor is NULL");
  const DLTensor *dl = import_header(L, p, versioned, arg, fname);
  dev_ctx *ctx = bind_ctx(L);
  if (dl->ndim < 0 || dl->ndim > DEV_MAXDIM)
    return import_fail(L, arg, fname, "ndim %d (gpulua tensors have 0 to %d dims)", (int)dl->ndim, DEV_MAXDIM);
  if (dl->dtype.lanes != 1)
    return import_fail(L, arg, fname, "dtype with %u lanes (only 1 is supported)", (unsigned)dl->dtype.lanes);
  dev_dtype dt;
  if (from_dl_dtype(dl->dtype, &dt))
    return import_fail(L, arg, fname, "unsupported dtype (code %u '%s', %u bits); gpulua has %s",
                       (unsigned)dl->dtype.code, dl_code_name(dl->dtype.code), (unsigned)dl->dtype.bits,
                       bind_push_names(L, dev_dtype_names, 0));
  dev_memkind kind = import_kind(L, dl, ctx, arg, fname);
  if (!dl->data) return import_fail(L, arg, fname, "data is NULL");
  if (dl->ndim > 0 && !dl->shape) return import_fail(L, arg, fname, "shape is NULL");
  dev_view v;
  memset(&v, 0, sizeof v);
  v.dtype = dt;
  int64_t hi = import_view(L, dl, &v, arg, fname);
  size_t bytes;
  uintptr_t first = import_span(L, dl, dev_dtype_size(dt), hi, &bytes, arg, fname);

  /* a second import of a managed tensor whose memory gpulua still holds */
  void (*release)(void *, void *) = versioned ? release_versioned : release_legacy;
  if (dev_buf_wrapping(ctx, release, p))
    return import_fail(L, arg, fname, "this managed tensor was imported already and gpulua still holds "
                       "its memory");
  gpu_tensor *t = bind_push_tensor_handle(L);
  /* ownership passes here, and nothing after raises */
  dev_buf *b;
  BIND_CHECK(L, ctx, dev_buf_wrap(ctx, kind, (void *)first, bytes, release, p, &b), fname);
  t->v = v;
  t->v.buf = b;
  return 1;
}

/* (lightuserdata m, versioned) -> tensor, for the runtime's protected call */
int embed_dlpack_import(lua_State *L) {
  return push_import(L, lua_touserdata(L, 1), lua_toboolean(L, 2), 0,
                     lua_toboolean(L, 2) ? "gpulua_push_dlpack_versioned" : "gpulua_push_dlpack");
}

/* A managed tensor the application hands to scripts (gpulua_push_dlpack_capsule):
 * a full userdata, so a script can neither forge nor reuse one.  It owns m
 * until gpu.from_dlpack consumes it (then the tensor does); an unused one
 * calls m's deleter when collected or closed.  m NULL: used or released. */
typedef struct dl_capsule { const bind_type *tag; void *m; int versioned; } dl_capsule;

static int capsule_release(lua_State *L) {
  dl_capsule *c = bind_check_type(L, 1, &bind_dlpack_type, sizeof *c);
  void *m = c->m;
  c->m = NULL;
  if (m) {
    if (c->versioned) release_versioned(m, NULL);
    else release_legacy(m, NULL);
  }
  return 0;
}

static int capsule_tostring(lua_State *L) {
  dl_capsule *c = bind_check_type(L, 1, &bind_dlpack_type, sizeof *c);
  lua_pushfstring(L, "gpu.DLPack (%s%s)", c->versioned ? "versioned, " : "", c->m ? "unused" : "used");
  return 1;
}

/* (lightuserdata m, versioned) -> capsule, for the runtime's protected call;
 * owns m on success only */
int embed_dlpack_capsule(lua_State *L) {
  void *m = lua_touserdata(L, 1);
  int versioned = lua_toboolean(L, 2);
  if (!m) return luaL_error(L, "the managed tensor is NULL");
  dl_capsule *c = bind_new_udata(L, &bind_dlpack_type, sizeof *c, 0);
  c->versioned = versioned;
  c->m = m;
  return 1;
}

/* gpu.from_dlpack(capsule): the tensor over the capsule's managed tensor,
 * which it owns from then on; the capsule is used up.  Raised: the capsule
 * keeps it. */
static int gpu_from_dlpack(lua_State *L) {
  dl_capsule *c = bind_test_type(L, 1, &bind_dlpack_type, sizeof *c);
  if (!c) return luaL_typeerror(L, 1, GPULUA_DLPACK " (a capsule from gpulua_push_dlpack_capsule)");
  if (!c->m) return luaL_argerror(L, 1, "the capsule was used already (a DLPack tensor is imported once)");
  push_import(L, c->m, c->versioned, 1, "from_dlpack");
  c->m = NULL;
  return 1;
}

static const luaL_Reg funcs[] = {
  {"from_dlpack", gpu_from_dlpack},
  {NULL, NULL}
};

static const luaL_Reg capsule_meta[] = {
  {"__gc", capsule_release},
  {"__close", capsule_release},
  {"__tostring", capsule_tostring},
  {NULL, NULL}
};

int bind_open_dlpack(lua_State *L) {
  bind_newtype(L, &bind_dlpack_type, capsule_meta, NULL);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
