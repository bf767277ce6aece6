/* gpu.Kernel and gpu.Launcher: run-time kernels.  gpu.compile(src, opts)
 * compiles CUDA C with NVRTC, gpu.load_module(image or path, opts) loads
 * PTX/cubin; both return a module table whose fields are the kernels.
 * k{grid =, block =, shared =, stream =} checks a launch configuration and
 * returns a launcher; calling it with the kernel's arguments enqueues it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define MAXPARAMS 128

/* Each handle holds a reference on its module; NULL once closed. */
typedef gpu_kernel_handle gpu_kernel;
typedef struct gpu_launcher {
  const bind_type *tag;
  dev_module *m;
  dev_kernel *k;
  unsigned grid[3], block[3];
  size_t shared;
  int has_stream;               /* the stream is uservalue 1 */
} gpu_launcher;
typedef struct gpu_modref { const bind_type *tag; dev_module *m; } gpu_modref;

static int modref_release(lua_State *L) {
  gpu_modref *r = bind_check_type(L, 1, &bind_modref_type, sizeof *r);
  if (r->m) { dev_module *m = r->m; r->m = NULL; dev_module_release(m); }
  return 0;
}

static gpu_kernel *check_kernel(lua_State *L, int idx) {
  gpu_kernel *g = bind_check_type(L, idx, &bind_kernel_type, sizeof *g);
  if (!g->m) luaL_argerror(L, idx, "kernel is closed");
  return g;
}

static int kernel_release(lua_State *L) {
  gpu_kernel *g = bind_check_type(L, 1, &bind_kernel_type, sizeof *g);
  if (g->m) { dev_module *m = g->m; g->m = NULL; g->k = NULL; dev_module_release(m); }
  return 0;
}

static int launcher_release(lua_State *L) {
  gpu_launcher *ln = bind_check_type(L, 1, &bind_launcher_type, sizeof(gpu_launcher));
  if (ln->m) { dev_module *m = ln->m; ln->m = NULL; ln->k = NULL; dev_module_release(m); }
  return 0;
}

/* "__global__ void saxpy(float a, const float *x)" */
static void push_signature(lua_State *L, const dev_kernel *k) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, k->sig.from_ptx ? ".entry " : "__global__ void ");
  luaL_addstring(&b, k->sig.name);
  luaL_addchar(&b, '(');
  for (int i = 0; i < k->sig.nparams; i++) {
    const dev_kparam *p = &k->sig.params[i];
    if (i) luaL_addstring(&b, ", ");
    luaL_addstring(&b, p->type);
    if (*p->name) {
      if (p->type[strlen(p->type) - 1] != '*') luaL_addchar(&b, ' ');
      luaL_addstring(&b, p->name);
    }
  }
  luaL_addchar(&b, ')');
  luaL_pushresult(&b);
}

/* ---- launch configuration -------------------------------------------- */

/* The option field's value at idx: a number or {x, y, z}. */
static void check_dim3(lua_State *L, int idx, const char *field, unsigned out[3], int required) {
  int t = lua_type(L, idx);
  lua_pushvalue(L, idx);
  out[0] = out[1] = out[2] = 1;
  if (t == LUA_TNIL) {
    if (required) luaL_error(L, "launch configuration: '%s' is missing (a number or {x, y, z})", field);
  } else if (t == LUA_TNUMBER || t == LUA_TTABLE) {
    int n = t == LUA_TNUMBER ? 1 : (int)lua_rawlen(L, -1);
    if (n < 1 || n > 3) luaL_error(L, "launch configuration: '%s' must have 1 to 3 dimensions, got %d", field, n);
    for (int d = 0; d < n; d++) {
      if (t == LUA_TTABLE) lua_rawgeti(L, -1 - 0, d + 1);
      else lua_pushvalue(L, -1);
      int isint;
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      if (!isint || v < 1 || v > 0xFFFFFFFFLL)
        luaL_error(L, "launch configuration: %s.%c must be a positive integer, got %s", field, "xyz"[d],
                   lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
      out[d] = (unsigned)v;
      lua_pop(L, 1);
    }
  } else {
    luaL_error(L, "launch configuration: '%s' must be a number or {x, y, z}, got %s", field,
               luaL_typename(L, -1));
  }
  lua_pop(L, 1);
}

/* k{grid =, block =, shared =, stream =} */
static int kernel_call(lua_State *L) {
  gpu_kernel *g = check_kernel(L, 1);
  if (lua_type(L, 2) != LUA_TTABLE)
    return luaL_error(L, "kernel '%s': call it with a launch configuration first: "
                      "k{grid = ..., block = ...}(args...)", g->k->sig.name);
  static const char *const names[] = {"grid", "block", "shared", "stream", NULL};
  int o = bind_read_opts(L, 2, names);
  gpu_launcher *ln = bind_new_udata(L, &bind_launcher_type, sizeof *ln, 1);
  check_dim3(L, o, "grid", ln->grid, 1);
  check_dim3(L, o + 1, "block", ln->block, 1);
  if (!lua_isnil(L, o + 2)) {
    int isint;
    lua_Integer v = lua_tointegerx(L, o + 2, &isint);
    if (!isint || v < 0)
      luaL_error(L, "launch configuration: 'shared' must be a number of bytes >= 0");
    ln->shared = (size_t)v;
  }
  /* the launcher holds its stream (user value 1), found at each launch */
  if (!lua_isnil(L, o + 3)) {
    gpu_stream *p = bind_test_stream(L, o + 3);
    if (!p) luaL_error(L, "launch configuration: 'stream' must be a gpu.Stream, got %s", bind_typename(L, o + 3));
    if (!p->s) luaL_error(L, "launch configuration: 'stream' is closed");
    lua_pushvalue(L, o + 3);
    lua_setiuservalue(L, -2, 1);
    ln->has_stream = 1;
  }
  g = check_kernel(L, 1);
  char msg[300];
  if (dev_launch_check(bind_ctx(L), g->k, ln->grid, ln->block, ln->shared, msg, sizeof msg))
    return luaL_error(L, "kernel '%s': %s", g->k->sig.name, msg);
  dev_module_retain(g->m);
  ln->m = g->m;
  ln->k = g->k;
  return 1;
}

/* ---- arguments ----------------------------------------------------------- */

static const char *pname(const dev_kparam *p) { return *p->name ? p->name : "?"; }

static int arg_error(lua_State *L, const dev_kernel *k, int i, const char *fmt, const char *a,
                     const char *b) {
  const dev_kparam *p = &k->sig.params[i];
  char what[200];
  snprintf(what, sizeof what, fmt, a, b);
  return luaL_error(L, "kernel '%s': argument %d (%s %s): %s", k->sig.name, i + 1, p->type,
                    pname(p), what);
}

static lua_Integer int_arg(lua_State *L, const dev_kernel *k, int i, int idx, int size, int is_signed) {
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    if (lua_type(L, idx) == LUA_TNUMBER) arg_error(L, k, i, "expected an integer, got %s%s", lua_tostring(L, idx), "");
    arg_error(L, k, i, "expected an integer, got %s%s", luaL_typename(L, idx), "");
  }
  int bits = size * 8;
  int ok;
  if (is_signed) {
    ok = bits >= 64 || (v >= -((lua_Integer)1 << (bits - 1)) && v < ((lua_Integer)1 << (bits - 1)));
  } else {
    ok = v >= 0 && (bits >= 64 || v < ((lua_Integer)1 << bits));
  }
  if (!ok) {
    char range[80];
    if (bits >= 64) snprintf(range, sizeof range, is_signed ? "a 64-bit integer" : "[0, 2^63)");
    else if (is_signed) snprintf(range, sizeof range, "[-2^%d, 2^%d)", bits - 1, bits - 1);
    else snprintf(range, sizeof range, "[0, 2^%d)", bits);
    lua_pushfstring(L, "%I", v);
    arg_error(L, k, i, "%s is outside %s", lua_tostring(L, -1), range);
  }
  return v;
}

static double num_arg(lua_State *L, const dev_kernel *k, int i, int idx) {
  if (lua_type(L, idx) != LUA_TNUMBER) arg_error(L, k, i, "expected a number, got %s%s", luaL_typename(L, idx), "");
  return lua_tonumber(L, idx);
}

static void store(uint64_t *slot, const void *v, int size) {
  *slot = 0;
  memcpy(slot, v, (size_t)size);
}

/* A tensor argument: its data pointer, checked against the parameter. */
static void *tensor_arg(lua_State *L, const dev_kernel *k, int i, int idx, dev_buf **buf) {
  const dev_kparam *p = &k->sig.params[i];
  gpu_tensor *t = bind_test_tensor_handle(L, idx);
  if (!t) arg_error(L, k, i, "expected a tensor, got %s%s", luaL_typename(L, idx), "");
  if (!t->v.buf) arg_error(L, k, i, "%s%s", "tensor is closed", "");
  const dev_view *v = &t->v;
  if (v->buf->kind == DEV_MEM_HOST)
    arg_error(L, k, i, "%s%s", "a host tensor: kernels read device (or pinned) memory; "
              "move it with t:to(\"device\")", "");
  if (p->pointee >= 0 && v->dtype != (dev_dtype)p->pointee)
    arg_error(L, k, i, "expected a %s tensor, got %s", dev_dtype_name((dev_dtype)p->pointee),
              dev_dtype_name(v->dtype));
  if (p->pointee < 0 && p->elsize && (size_t)p->elsize != dev_dtype_size(v->dtype))
    arg_error(L, k, i, "expected a tensor of %s-byte elements, got %s", p->elsize == 2 ? "2" :
              p->elsize == 4 ? "4" : p->elsize == 8 ? "8" : "1", dev_dtype_name(v->dtype));
  if (!dev_view_contiguous(v))
    arg_error(L, k, i, "%s%s", "the tensor is not contiguous (pass t:contiguous())", "");
  void *ptr = dev_view_ptr(v);
  size_t align = p->pointee >= 0 ? dev_dtype_size((dev_dtype)p->pointee) : 1;
  if (p->elsize > 0 && (size_t)p->elsize > align) align = (size_t)p->elsize;
  if ((uintptr_t)ptr % align)
    arg_error(L, k, i, "the tensor's data is not aligned to %s bytes (a view at an odd offset)%s",
              align == 16 ? "16" : align == 8 ? "8" : align == 4 ? "4" : "2", "");
  *buf = v->buf;
  return ptr;
}

/* "kernel 'saxpy'": the name a failed launch is raised with */
static const char *kernel_what(char *buf, size_t n, const dev_kernel *k) {
  snprintf(buf, n, "kernel '%s'", k->sig.name);
  return buf;
}

/* The bytes of the (checked, contiguous) tensor argument at idx. */
static size_t tensor_bytes(lua_State *L, int idx) {
  const dev_view *v = &bind_test_tensor_handle(L, idx)->v;
  return (size_t)dev_view_numel(v) * dev_dtype_size(v->dtype);
}

/* launcher(args...) */
/* A launch's arguments as the kernel takes them: a value per parameter
 * (args[i] points at vals[i]), and the tensors' buffers with whether the
 * kernel may write them and each pointer's extent in bytes. */
typedef struct kargs {
  uint64_t vals[MAXPARAMS];
  void *args[MAXPARAMS];
  dev_buf *bufs[MAXPARAMS];
  unsigned char writes[MAXPARAMS];
  size_t ext[MAXPARAMS];
  int nb;
} kargs;

/* A tensor (or nil: NULL) for pointer parameter i, from the value at idx. */
static void pack_pointer(lua_State *L, dev_kernel *k, int i, int idx, int writes, kargs *a) {
  void *ptr = NULL;
  if (lua_type(L, idx) != LUA_TNIL) {
    ptr = tensor_arg(L, k, i, idx, &a->bufs[a->nb]);
    a->writes[a->nb++] = (unsigned char)writes;
    a->ext[i] = tensor_bytes(L, idx);
  }
  store(&a->vals[i], &ptr, 8);
}

/* A parameter of a type known only by its size: the Lua value says what it is. */
static void pack_raw(lua_State *L, dev_kernel *k, int i, int idx, kargs *a) {
  const dev_kparam *p = &k->sig.params[i];
  int t = lua_type(L, idx);
  if ((bind_test_tensor_handle(L, idx) || t == LUA_TNIL) && p->size == 8) {
    pack_pointer(L, k, i, idx, 1, a);
  } else if (t == LUA_TNUMBER && lua_isinteger(L, idx)) {
    lua_Integer v = lua_tointeger(L, idx);
    int bits = p->size * 8;
    if (bits < 64 && (v < -((lua_Integer)1 << (bits - 1)) || v >= ((lua_Integer)1 << bits)))
      arg_error(L, k, i, "%s does not fit in %s", lua_tostring(L, idx), p->type);
    store(&a->vals[i], &v, p->size);
  } else if (t == LUA_TNUMBER && (p->size == 4 || p->size == 8 || p->size == 2)) {
    double d = lua_tonumber(L, idx);
    if (p->size == 8) store(&a->vals[i], &d, 8);
    else if (p->size == 4) { float f = (float)d; store(&a->vals[i], &f, 4); }
    else { uint16_t h = dev_float_to_half((float)d); store(&a->vals[i], &h, 2); }
  } else if (t == LUA_TBOOLEAN && p->size == 1) {
    unsigned char b = (unsigned char)lua_toboolean(L, idx);
    store(&a->vals[i], &b, 1);
  } else {
    arg_error(L, k, i, "cannot pass a %s as %s", luaL_typename(L, idx), p->type);
  }
}

/* Parameter i from the Lua value at idx, checked against its type. */
static void pack_arg(lua_State *L, dev_kernel *k, int i, int idx, kargs *a) {
  const dev_kparam *p = &k->sig.params[i];
  a->args[i] = &a->vals[i];
  a->ext[i] = 0;
  switch (p->kind) {
  case DEV_KP_POINTER:
    pack_pointer(L, k, i, idx, !p->is_const, a);
    break;
  case DEV_KP_INT: case DEV_KP_UINT: {
    lua_Integer v = int_arg(L, k, i, idx, p->size, p->kind == DEV_KP_INT);
    store(&a->vals[i], &v, p->size);   /* little-endian: the low bytes */
    break;
  }
  case DEV_KP_FLOAT: {
    double d = num_arg(L, k, i, idx);
    if (p->size == 4) { float f = (float)d; store(&a->vals[i], &f, 4); }
    else store(&a->vals[i], &d, 8);
    break;
  }
  case DEV_KP_HALF: case DEV_KP_BF16: {
    float f = (float)num_arg(L, k, i, idx);
    uint16_t h = p->kind == DEV_KP_HALF ? dev_float_to_half(f) : dev_float_to_bf16(f);
    store(&a->vals[i], &h, 2);
    break;
  }
  case DEV_KP_BOOL: {
    if (lua_type(L, idx) != LUA_TBOOLEAN)
      arg_error(L, k, i, "expected a boolean, got %s%s", luaL_typename(L, idx), "");
    unsigned char b = (unsigned char)lua_toboolean(L, idx);
    store(&a->vals[i], &b, 1);
    break;
  }
  case DEV_KP_RAW:
    pack_raw(L, k, i, idx, a);
    break;
  case DEV_KP_OTHER:
    arg_error(L, k, i, "gpulua cannot pass this type from Lua (use pointers, integers, "
              "float, double, __half, __nv_bfloat16 or bool)%s%s", "", "");
    break;
  }
}

/* The launch's stream: the launch configuration's, else the current one. */
static dev_stream *launch_stream(lua_State *L, const gpu_launcher *ln, const dev_kernel *k) {
  if (!ln->has_stream) return bind_stream(L, 0);
  lua_getiuservalue(L, 1, 1);
  gpu_stream *p = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!p || !p->s) luaL_error(L, "kernel '%s': the launch configuration's stream is closed", k->sig.name);
  return p->s;
}

static int launcher_call(lua_State *L) {
  gpu_launcher *ln = bind_check_type(L, 1, &bind_launcher_type, sizeof *ln);
  if (!ln->m) return luaL_argerror(L, 1, "launcher is closed");
  dev_kernel *k = ln->k;
  int np = k->sig.nparams, nargs = lua_gettop(L) - 1;
  if (nargs != np) {
    push_signature(L, k);
    return luaL_error(L, "kernel '%s' takes %d argument%s, got %d: %s", k->sig.name, np,
                      np == 1 ? "" : "s", nargs, lua_tostring(L, -1));
  }
  if (np > MAXPARAMS) return luaL_error(L, "kernel '%s': more than %d parameters", k->sig.name, MAXPARAMS);
  dev_stream *s = launch_stream(L, ln, k);
  dev_ctx *ctx = dev_stream_ctx(s);
  bind_site(L, ctx);
  kargs a;
  a.nb = 0;
  for (int i = 0; i < np; i++) pack_arg(L, k, i, i + 2, &a);
  dev_launch l = {.k = k, .shared = ln->shared, .args = a.args, .bufs = a.bufs, .writes = a.writes,
                  .nbufs = a.nb, .extents = a.ext};
  memcpy(l.grid, ln->grid, sizeof l.grid);
  memcpy(l.block, ln->block, sizeof l.block);
  dev_kop op = {.kind = DEV_OP_LAUNCH, .launch = &l};
  char what[160];
  BIND_CHECK(L, ctx, dev_submit(ctx, s, &op), kernel_what(what, sizeof what, k));
  return 0;
}

/* ---- kernel fields ------------------------------------------------------- */

/* k.name, k.signature, k.params, ... and k:close: no methods table, so that
 * every field of a closed kernel, close too, raises "kernel is closed" */
static int kernel_fields(lua_State *L) {
  gpu_kernel *g = check_kernel(L, 1);
  const char *key = bind_check_key(L, 2);
  const dev_kernel *k = g->k;
  if (strcmp(key, "name") == 0) lua_pushstring(L, k->sig.name);
  else if (strcmp(key, "signature") == 0) push_signature(L, k);
  else if (strcmp(key, "max_threads") == 0) lua_pushinteger(L, k->max_threads);
  else if (strcmp(key, "static_shared") == 0) lua_pushinteger(L, (lua_Integer)k->static_shared);
  else if (strcmp(key, "max_shared") == 0) lua_pushinteger(L, (lua_Integer)k->max_dynamic_shared);
  else if (strcmp(key, "params") == 0) {
    lua_createtable(L, k->sig.nparams, 0);
    for (int i = 0; i < k->sig.nparams; i++) {
      lua_createtable(L, 0, 2);
      lua_pushstring(L, k->sig.params[i].name);
      lua_setfield(L, -2, "name");
      lua_pushstring(L, k->sig.params[i].type);
      lua_setfield(L, -2, "type");
      lua_rawseti(L, -2, i + 1);
    }
  } else if (strcmp(key, "close") == 0) {
    lua_pushcfunction(L, kernel_release);
  } else {
    return luaL_error(L, "gpu.Kernel has no field '%s' (fields: name, signature, params, "
                      "max_threads, static_shared, max_shared; call k{grid =, block =}(args...))", key);
  }
  return 1;
}

static int kernel_tostring(lua_State *L) {
  gpu_kernel *g = bind_check_type(L, 1, &bind_kernel_type, sizeof *g);
  if (!g->m) { lua_pushliteral(L, "gpu.Kernel (closed)"); return 1; }
  push_signature(L, g->k);
  lua_pushfstring(L, "gpu.Kernel: %s", lua_tostring(L, -1));
  return 1;
}

static int launcher_tostring(lua_State *L) {
  gpu_launcher *ln = bind_check_type(L, 1, &bind_launcher_type, sizeof(gpu_launcher));
  if (!ln->m) { lua_pushliteral(L, "gpu.Launcher (closed)"); return 1; }
  lua_pushfstring(L, "gpu.Launcher: %s grid {%d, %d, %d} block {%d, %d, %d} shared %d", ln->k->sig.name,
                  (int)ln->grid[0], (int)ln->grid[1], (int)ln->grid[2], (int)ln->block[0],
                  (int)ln->block[1], (int)ln->block[2], (int)ln->shared);
  return 1;
}

/* ---- modules ------------------------------------------------------------- */

static int module_index(lua_State *L) {
  const char *key = lua_tostring(L, 2);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushnil(L);
  int n = 0;
  while (lua_next(L, 1)) {
    if (lua_type(L, -2) == LUA_TSTRING) {
      if (n++) luaL_addstring(&b, ", ");
      luaL_addstring(&b, lua_tostring(L, -2));
    }
    lua_pop(L, 1);
  }
  luaL_pushresult(&b);
  return luaL_error(L, "the module has no kernel '%s' (kernels: %s)", key ? key : luaL_typename(L, 2),
                    n ? lua_tostring(L, -1) : "none");
}

/* The module table for m, whose reference the modref at ref holds. */
static void push_module(lua_State *L, int ref) {
  dev_module *m = ((gpu_modref *)lua_touserdata(L, ref))->m;
  int n = dev_module_count(m);
  lua_createtable(L, 0, n);
  for (int i = 0; i < n; i++) {
    dev_kernel *k = dev_module_kernel(m, i);
    gpu_kernel *g = bind_new_udata(L, &bind_kernel_type, sizeof *g, 0);
    dev_module_retain(m);
    g->m = m;
    g->k = k;
    lua_setfield(L, -2, k->sig.name);
  }
  luaL_setmetatable(L, GPULUA_MODULE);
}

gpu_kernel_handle *bind_new_kernel_handle(lua_State *L) {
  return bind_new_udata(L, &bind_kernel_type, sizeof(gpu_kernel), 0);
}

static gpu_modref *new_modref(lua_State *L) {
  return bind_new_udata(L, &bind_modref_type, sizeof(gpu_modref), 0);
}

/* gpu.compile(src, {options = {...}, name =, cache =}) */
static int gpu_compile(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  size_t len;
  if (lua_type(L, 1) != LUA_TSTRING) luaL_typeerror(L, 1, "string (CUDA C source)");
  const char *src = lua_tolstring(L, 1, &len);
  if (strlen(src) != len) return luaL_argerror(L, 1, "source contains a zero byte");
  static const char *const names[] = {"options", "name", "cache", NULL};
  lua_settop(L, 2);
  /* slots 3 options, 4 name, 5 cache: they keep the strings alive */
  bind_read_opts(L, 2, names);
  dev_compile_opts o = {.cache = lua_isnil(L, 5) || lua_toboolean(L, 5)};
  if (!lua_isnil(L, 4)) {
    if (lua_type(L, 4) != LUA_TSTRING) luaL_error(L, "bad option 'name' (string expected, got %s)", luaL_typename(L, 4));
    o.name = lua_tostring(L, 4);
  }
  int t = lua_type(L, 3);
  if (t != LUA_TNIL && t != LUA_TTABLE)
    luaL_error(L, "bad option 'options' (a table of strings expected, got %s)", luaL_typename(L, 3));
  int n = t == LUA_TTABLE ? (int)lua_rawlen(L, 3) : 0;
  const char **opts = n ? lua_newuserdatauv(L, (size_t)n * sizeof *opts, 0) : NULL;
  for (int i = 0; i < n; i++) {
    if (lua_rawgeti(L, 3, i + 1) != LUA_TSTRING)
      luaL_error(L, "bad option 'options' (item %d: string expected, got %s)", i + 1, luaL_typename(L, -1));
    if (!(opts[i] = bind_name_at(L, -1)))   /* anchored in the options table */
      luaL_error(L, "bad option 'options' (item %d: a string with a zero byte)", i + 1);
    lua_pop(L, 1);
  }
  o.options = opts;
  o.noptions = n;
  gpu_modref *r = new_modref(L);
  int ref = lua_gettop(L);
  char *log = NULL;
  bind_site(L, ctx);
  int rc = dev_module_compile(ctx, src, &o, &r->m, &log);
  if (rc != DEV_OK) {
    if (log && *log) {
      lua_pushfstring(L, "gpu.compile: %s\n%s", dev_errmsg(ctx), log);
      free(log);
      luaL_where(L, 1);
      lua_insert(L, -2);
      lua_concat(L, 2);
      return lua_error(L);
    }
    free(log);
    return bind_raise(L, ctx, "gpu.compile");
  }
  free(log);
  push_module(L, ref);
  return 1;
}

/* ---- gpu.load_module ------------------------------------------------------ */

#define MAX_IMAGE ((size_t)1 << 30)   /* the largest module file read */

/* The open module file: a to-be-closed userdata that owns the descriptor,
 * made before the open, so that no error (an allocation included) leaks it. */
typedef struct modfile { const bind_type *tag; int fd; } modfile;

static int modfile_close(lua_State *L) {
  modfile *f = bind_check_type(L, 1, &bind_modfile_type, sizeof *f);
  if (f->fd >= 0) {
    close(f->fd);
    f->fd = -1;
  }
  return 0;
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "a special file";
}

/* Text that is meant as an image rather than a path: more than a path can
 * hold, or lines, or a PTX directive. */
static int image_text(const char *s, size_t len) {
  return len >= PATH_MAX || memchr(s, '\n', len) || memmem(s, len, ".entry", 6) ||
         memmem(s, len, ".version", 8) || memmem(s, len, ".target", 7);
}

/* Push the contents of the regular file at path (at most MAX_IMAGE bytes). */
static void push_file(lua_State *L, const char *path, size_t len) {
  modfile *f = bind_new_udata(L, &bind_modfile_type, sizeof *f, 0);
  f->fd = -1;
  lua_toclose(L, -1);   /* closed on return and on every error */
  /* O_NONBLOCK: opening a FIFO must not wait for a writer (refused below) */
  f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd < 0) {
    int e = errno;
    /* no such file, and PTX-like text: a broken image rather than a path */
    if ((e == ENOENT || e == ENAMETOOLONG) && image_text(path, len))
      luaL_error(L, "gpu.load_module: not PTX (an .entry and a .version or .target), a cubin or a fatbin, "
                 "nor a file");
    luaL_error(L, "gpu.load_module: cannot open '%s': %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(f->fd, &st) != 0) luaL_error(L, "gpu.load_module: cannot stat '%s': %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    luaL_error(L, "gpu.load_module: '%s' is not a regular file (%s)", path, file_kind(st.st_mode));
  if ((uint64_t)st.st_size > MAX_IMAGE)
    luaL_error(L, "gpu.load_module: '%s' has %I bytes, more than the %d MiB a module image may have", path,
               (lua_Integer)st.st_size, (int)(MAX_IMAGE >> 20));
  int fl = fcntl(f->fd, F_GETFL);
  if (fl != -1) fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK);
  size_t size = (size_t)st.st_size, got = 0;
  luaL_Buffer b;
  char *p = luaL_buffinitsize(L, &b, size ? size : 1);
  while (got < size) {
    ssize_t k = read(f->fd, p + got, size - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) luaL_error(L, "gpu.load_module: cannot read '%s': %s", path, strerror(errno));
    if (k == 0) luaL_error(L, "gpu.load_module: cannot read '%s': the file shrank while it was read", path);
    got += (size_t)k;
  }
  luaL_pushresultsize(&b, size);
}

/* gpu.load_module(image_or_path, {declare =}) */
static int gpu_load_module(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  size_t len;
  if (lua_type(L, 1) != LUA_TSTRING) luaL_typeerror(L, 1, "string (PTX, cubin or a path)");
  const char *data = lua_tolstring(L, 1, &len);
  static const char *const names[] = {"declare", NULL};
  lua_settop(L, 2);
  const char *declare = NULL;
  if (!lua_isnil(L, bind_read_opts(L, 2, names))) {   /* slot 3 keeps it alive */
    if (lua_type(L, 3) != LUA_TSTRING)
      luaL_error(L, "bad option 'declare' (CUDA C prototypes as a string expected, got %s)", luaL_typename(L, 3));
    declare = lua_tostring(L, 3);
  }
  int is_path = dev_image_kind_of(data, len) == DEV_IMAGE_NONE;
  if (is_path && strlen(data) != len)
    return luaL_argerror(L, 1, "not PTX, a cubin or a fatbin, nor a path (it contains a zero byte)");
  gpu_modref *r = new_modref(L);
  int ref = lua_gettop(L);
  /* Only cuda loads images: another backend's own error comes first, before
   * a path is opened (the device layer checks the backend before the image). */
  if (strcmp(dev_backend_name(ctx), "cuda") != 0) {
    bind_site(L, ctx);
    BIND_CHECK(L, ctx, dev_module_load(ctx, data, len + 1, declare, &r->m), "gpu.load_module");
    push_module(L, ref);
    return 1;
  }
  if (is_path) {
    push_file(L, data, len);
    data = lua_tolstring(L, -1, &len);
    if (dev_image_kind_of(data, len) == DEV_IMAGE_NONE)
      return luaL_error(L, "gpu.load_module: '%s' is not PTX, a cubin or a fatbin", lua_tostring(L, 1));
  }
  r = lua_touserdata(L, ref);
  bind_site(L, ctx);
  /* the terminating zero goes too: PTX is read as a C string */
  BIND_CHECK(L, ctx, dev_module_load(ctx, data, len + 1, declare, &r->m), "gpu.load_module");
  push_module(L, ref);
  return 1;
}

static const luaL_Reg kernel_meta[] = {
  {"__index", kernel_fields},
  {"__call", kernel_call},
  {"__tostring", kernel_tostring},
  {"__gc", kernel_release},
  {"__close", kernel_release},
  {NULL, NULL}
};

static const luaL_Reg launcher_meta[] = {
  {"__call", launcher_call},
  {"__tostring", launcher_tostring},
  {"__gc", launcher_release},
  {"__close", launcher_release},
  {NULL, NULL}
};

static const luaL_Reg kernel_funcs[] = {
  {"compile", gpu_compile},
  {"load_module", gpu_load_module},
  {NULL, NULL}
};

static const luaL_Reg modref_meta[] = {
  {"__gc", modref_release},
  {NULL, NULL}
};

static const luaL_Reg modfile_meta[] = {
  {"__close", modfile_close},
  {"__gc", modfile_close},
  {NULL, NULL}
};

/* a table of kernels: its fields are raw; __index is for a missing one */
static const luaL_Reg module_meta[] = {
  {"__index", module_index},
  {NULL, NULL}
};

int bind_open_kernel(lua_State *L) {
  bind_newtype(L, &bind_kernel_type, kernel_meta, NULL);
  bind_newtype(L, &bind_launcher_type, launcher_meta, NULL);
  bind_newtype(L, &bind_modref_type, modref_meta, NULL);
  bind_newtype(L, &bind_modfile_type, modfile_meta, NULL);
  bind_newtype(L, &bind_module_type, module_meta, NULL);
  luaL_setfuncs(L, kernel_funcs, 0);
  return 0;
}
