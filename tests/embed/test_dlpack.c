/* test_dlpack — TAP test of DLPack export and import through gpulua.h, as an
 * application uses them: its own managed tensors, its own threads, deleters
 * called late.  Runs on either backend (GPULUA_DEVICE); what differs between
 * them is checked per backend. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "gpulua.h"
#include "tests/tap.h"

/* The layout of the published ABI on x86-64 (LP64). */
_Static_assert(sizeof(DLDevice) == 8, "DLDevice");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType");
_Static_assert(offsetof(DLDataType, bits) == 1 && offsetof(DLDataType, lanes) == 2, "DLDataType fields");
_Static_assert(sizeof(DLTensor) == 48, "DLTensor");
_Static_assert(offsetof(DLTensor, data) == 0 && offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
                   offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 &&
                   offsetof(DLTensor, strides) == 32 && offsetof(DLTensor, byte_offset) == 40,
               "DLTensor fields");
_Static_assert(sizeof(DLManagedTensor) == 64, "DLManagedTensor");
_Static_assert(offsetof(DLManagedTensor, manager_ctx) == 48 && offsetof(DLManagedTensor, deleter) == 56,
               "DLManagedTensor fields");
_Static_assert(sizeof(DLPackVersion) == 8, "DLPackVersion");
_Static_assert(sizeof(DLManagedTensorVersioned) == 80, "DLManagedTensorVersioned");
_Static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8 &&
                   offsetof(DLManagedTensorVersioned, deleter) == 16 &&
                   offsetof(DLManagedTensorVersioned, flags) == 24 &&
                   offsetof(DLManagedTensorVersioned, dl_tensor) == 32,
               "DLManagedTensorVersioned fields");
_Static_assert(kDLCPU == 1 && kDLCUDA == 2 && kDLCUDAHost == 3 && kDLCUDAManaged == 13, "device types");
_Static_assert(kDLInt == 0 && kDLUInt == 1 && kDLFloat == 2 && kDLBfloat == 4 && kDLComplex == 5 && kDLBool == 6,
               "type codes");

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

static int run(gpulua *g, const char *chunk) {
  int st = gpulua_dostring(g, chunk, "=test");
  if (st) diag(gpulua_error(g));
  return st == 0;
}

/* The value of a Lua expression as an integer (or LUA_MININTEGER). */
static lua_Integer expr_int(gpulua *g, const char *expr) {
  lua_State *L = gpulua_state(g);
  char buf[512];
  snprintf(buf, sizeof buf, "return %s", expr);
  lua_Integer v = LUA_MININTEGER;
  if (luaL_loadstring(L, buf) == LUA_OK && gpulua_pcall(g, 0, 1) == LUA_OK) {
    lua_Number x = lua_tonumber(L, -1);
    v = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : (lua_Integer)x;
  } else {
    diag(lua_tostring(L, -1));
  }
  lua_settop(L, 0);
  return v;
}

/* Buffers still alive once garbage is collected and queued work is done. */
static lua_Integer live_buffers(gpulua *g) {
  run(g, "collectgarbage(); collectgarbage(); gpu.synchronize()");
  return expr_int(g, "gpu.stats().buffers");
}

static int is_host_backend(gpulua *g) {
  lua_State *L = gpulua_state(g);
  lua_getglobal(L, "gpu");
  lua_getfield(L, -1, "backend");
  int host = contains(lua_tostring(L, -1), "host");
  lua_settop(L, 0);
  return host;
}

static gpulua *open_instance(void) {
  gpulua *g = gpulua_open(NULL);
  if (!gpulua_state(g)) diag(gpulua_error(g));
  return g;
}

/* ---- export ----------------------------------------------------------------- */

static void call_deleter_thread(DLManagedTensor *m);

/* a view: byte_offset and strides */
static void export_view(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int st;
  DLManagedTensor *m = (DLManagedTensor *)1;
  DLTensor *dl;
  run(g, "big = gpu.arange(0, 12, {dtype = 'i32', device = 'host'}):view({3, 4}); v = big:narrow(2, 2, 2)");
  lua_getglobal(L, "v");
  st = gpulua_to_dlpack(g, 1, &m);
  lua_settop(L, 0);
  ok(st == 0, "a narrowed view exports");
  if (st == 0) {
    dl = &m->dl_tensor;
    int32_t *e = (int32_t *)((char *)dl->data + dl->byte_offset);
    ok(dl->ndim == 2 && dl->shape[0] == 3 && dl->shape[1] == 2 && dl->strides[0] == 4 && dl->strides[1] == 1 &&
           dl->byte_offset == 4 && dl->dtype.code == kDLInt && dl->dtype.bits == 32,
       "shape {3, 2}, strides {4, 1}, byte_offset 4, int32");
    ok(e[0] == 1 && e[1] == 2 && e[4] == 5 && e[9] == 10, "its elements through strides");
    ok(dl->device.device_type == kDLCPU, "host memory is kDLCPU");
    /* a foreign thread's deleter, the instance still open */
    call_deleter_thread(m);
  }
  run(g, "big, v = nil, nil; collectgarbage(); collectgarbage()");
  gpulua_synchronize(g);
  ok(expr_int(g, "gpu.stats().buffers") == 0, "a deleter called on another thread: released at the next sync");
}

/* device memory, every dtype */
static void export_dtypes(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int host = is_host_backend(g);
  DLManagedTensor *m = (DLManagedTensor *)1;
  DLTensor *dl;
  static const struct { const char *name; uint8_t code, bits; } dts[] = {
    {"f32", kDLFloat, 32}, {"f64", kDLFloat, 64}, {"f16", kDLFloat, 16}, {"bf16", kDLBfloat, 16},
    {"i8", kDLInt, 8}, {"u8", kDLUInt, 8}, {"i32", kDLInt, 32}, {"i64", kDLInt, 64}, {"bool", kDLBool, 8},
  };
  int good = 1;
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    char chunk[128];
    snprintf(chunk, sizeof chunk, "d = gpu.ones({5}, {dtype = '%s'})", dts[i].name);
    run(g, chunk);
    lua_getglobal(L, "d");
    if (gpulua_to_dlpack(g, -1, &m) != 0) { good = 0; diag(gpulua_error(g)); lua_settop(L, 0); continue; }
    lua_settop(L, 0);
    dl = &m->dl_tensor;
    if (dl->dtype.code != dts[i].code || dl->dtype.bits != dts[i].bits || dl->dtype.lanes != 1) good = 0;
    if (host && dl->device.device_type != kDLCPU) good = 0;
    if (!host && (dl->device.device_type != kDLCUDA || dl->device.device_id != expr_int(g, "gpu.device_info().index")))
      good = 0;
    if (host && dts[i].bits == 8 && ((uint8_t *)dl->data)[4] != 1) good = 0;
    m->deleter(m);
  }
  ok(good, "device tensors of every dtype: code/bits, and %s", host ? "kDLCPU on the host backend" : "kDLCUDA, our GPU");
  run(g, "d = nil; collectgarbage()");
}

/* ordering: queued writes are done before the consumer reads */
static void export_ordering(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int st;
  DLManagedTensor *m = (DLManagedTensor *)1;
  run(g, "src = gpu.full({4096}, 7, {dtype = 'f32'}); dst = gpu.pinned({4096}); gpu.sleep(200); dst:copy(src)");
  lua_Integer syncs = expr_int(g, "gpu.stats().syncs");
  lua_getglobal(L, "dst");
  st = gpulua_to_dlpack(g, 1, &m);
  if (st) diag(gpulua_error(g));
  lua_settop(L, 0);
  ok(st == 0, "export of a tensor a queued copy is filling");
  if (st == 0) {
    float *p = (float *)((char *)m->dl_tensor.data + m->dl_tensor.byte_offset);
    int all = 1;
    for (int i = 0; i < 4096; i++) all &= p[i] == 7;
    ok(all, "the export waited for the queued copy: every element is written");
    ok(expr_int(g, "gpu.stats().syncs") == syncs + 1, "that wait was one counted sync");
    m->deleter(m);
  }
  run(g, "src, dst = nil, nil; collectgarbage()");
}

/* versioned */
static void export_versioned(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int st;
  run(g, "w = gpu.zeros({2, 2}, {dtype = 'i64', device = 'host'})");
  lua_getglobal(L, "w");
  DLManagedTensorVersioned *mv = NULL;
  st = gpulua_to_dlpack_versioned(g, -1, &mv);
  lua_settop(L, 0);
  ok(st == 0 && mv && mv->version.major == 1 && mv->flags == 0 && mv->dl_tensor.ndim == 2 &&
         mv->dl_tensor.dtype.code == kDLInt && mv->dl_tensor.dtype.bits == 64,
     "versioned export: version 1.x, flags 0, int64 2-D");
  if (mv) mv->deleter(mv);
  run(g, "w = nil; collectgarbage()");
}

/* bad exports */
static void export_bad(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int st;
  DLManagedTensor *m = (DLManagedTensor *)1;
  lua_pushinteger(L, 5);
  st = gpulua_to_dlpack(g, -1, &m);
  ok(st != 0 && m == NULL && contains(gpulua_error(g), "gpulua_to_dlpack") &&
         contains(gpulua_error(g), "not a gpu.Tensor"),
     "a number is refused: %s", gpulua_error(g));
  lua_settop(L, 0);
  run(g, "c = gpu.ones({2}); c:close()");
  lua_getglobal(L, "c");
  st = gpulua_to_dlpack(g, -1, &m);
  ok(st != 0 && contains(gpulua_error(g), "closed"), "a closed tensor is refused: %s", gpulua_error(g));
  st = gpulua_to_dlpack(g, -1, NULL);
  ok(st != 0 && contains(gpulua_error(g), "out is NULL"), "out NULL is refused");
  lua_settop(L, 0);
  st = gpulua_to_dlpack(g, 7, &m);
  ok(st != 0 && contains(gpulua_error(g), "stack index 7"), "an empty stack slot is refused");
  ok(gpulua_to_dlpack(NULL, 1, &m) != 0 && m == NULL, "g NULL fails without a crash");
  run(g, "c = nil");
  ok(live_buffers(g) == 0, "nothing left");
}

static void test_export(void) {
  gpulua *g = open_instance();
  lua_State *L = gpulua_state(g);
  int host = is_host_backend(g);
  run(g, "t = gpu.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = 'f32', device = 'pinned'})");
  lua_getglobal(L, "t");
  DLManagedTensor *m = (DLManagedTensor *)1;
  int st = gpulua_to_dlpack(g, -1, &m);
  ok(st == 0 && m != NULL, "gpulua_to_dlpack exports a pinned tensor");
  if (st) diag(gpulua_error(g));
  ok(lua_gettop(L) == 1, "the stack is unchanged");
  lua_settop(L, 0);
  if (!m) return;
  DLTensor *dl = &m->dl_tensor;
  ok(dl->ndim == 2 && dl->shape[0] == 2 && dl->shape[1] == 3, "shape {2, 3}");
  ok(dl->strides && dl->strides[0] == 3 && dl->strides[1] == 1, "strides {3, 1} in elements");
  ok(dl->dtype.code == kDLFloat && dl->dtype.bits == 32 && dl->dtype.lanes == 1, "dtype float32, 1 lane");
  ok(dl->device.device_type == (host ? kDLCPU : kDLCUDAHost) && dl->device.device_id == 0,
     "pinned memory is %s", host ? "kDLCPU on the host backend" : "kDLCUDAHost");
  float *f = (float *)((char *)dl->data + dl->byte_offset);
  ok(f[0] == 1 && f[4] == 5 && f[5] == 6, "the data reads through the pointer");
  f[5] = 42;
  ok(expr_int(g, "t:get(2, 3)") == 42, "a write through the pointer shows in Lua");
  ok(expr_int(g, "gpu.stats().buffers") == 1, "one buffer while exported");
  run(g, "t = nil; collectgarbage(); collectgarbage()");
  ok(f[0] == 1 && f[5] == 42, "the memory outlives the collected Lua tensor");
  ok(expr_int(g, "gpu.stats().buffers") == 1, "the export holds the buffer");
  m->deleter(m);
  gpulua_synchronize(g);
  ok(expr_int(g, "gpu.stats().buffers") == 0, "the deleter releases it");
  export_view(g);
  export_dtypes(g);
  export_ordering(g);
  export_versioned(g);
  export_bad(g);
  gpulua_close(g);
}

static void *deleter_thread(void *m) {
  ((DLManagedTensor *)m)->deleter(m);
  return NULL;
}

static void call_deleter_thread(DLManagedTensor *m) {
  pthread_t th;
  if (pthread_create(&th, NULL, deleter_thread, m) == 0) pthread_join(th, NULL);
  else m->deleter(m);
}

/* A C function a script calls: exports its argument (under the script's
 * sync policy) and releases the export at once; returns true or the error. */
static gpulua *cb_g;
static int app_export(lua_State *L) {
  DLManagedTensor *m;
  if (gpulua_to_dlpack(cb_g, 1, &m) != 0) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, gpulua_error(cb_g));
    return 2;
  }
  m->deleter(m);
  lua_pushboolean(L, 1);
  return 1;
}

static void test_export_nosync(void) {
  gpulua *g = open_instance();
  cb_g = g;
  lua_State *L = gpulua_state(g);
  lua_register(L, "app_export", app_export);
  ok(run(g, "local x = gpu.ones({64}); assert(app_export(x) == true)"),
     "an application C function exports its argument");
  ok(run(g, "local x = gpu.ones({64}); gpu.sleep(200); x:fill(3)\n"
            "local ok, err\n"
            "do local _ <close> = gpu.nosync(); ok, err = app_export(x) end\n"
            "assert(not ok and err:find('DLPack export'), err)\n"
            "gpu.synchronize()"),
     "under gpu.nosync() an export that has to wait is refused, naming the DLPack export");
  gpulua_close(g);
}

/* ---- import ----------------------------------------------------------------- */

typedef struct app_tensor {
  DLManagedTensor m;
  DLManagedTensorVersioned mv;
  int64_t shape[8], strides[8];
  void *mem;
  size_t bytes;
  int *deleted;
} app_tensor;

static void app_free(app_tensor *a) {
  (*a->deleted)++;
  /* poison: a read after the deleter shows as wrong values (or to ASan) */
  memset(a->mem, 0xAB, a->bytes);
  free(a->mem);
  free(a);
}
static void app_deleter(DLManagedTensor *m) { app_free(m->manager_ctx); }
static void app_deleter_v(DLManagedTensorVersioned *m) { app_free(m->manager_ctx); }

/* n float32 values 1..n (or bytes for other types), 1-D compact, kDLCPU. */
static app_tensor *app_new(int n, int *deleted) {
  app_tensor *a = calloc(1, sizeof *a);
  a->bytes = (size_t)n * 4;
  a->mem = malloc(a->bytes);
  for (int i = 0; i < n; i++) ((float *)a->mem)[i] = (float)(i + 1);
  a->shape[0] = n;
  a->deleted = deleted;
  DLTensor *t = &a->m.dl_tensor;
  t->data = a->mem;
  t->device.device_type = kDLCPU;
  t->ndim = 1;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = a->shape;
  a->m.manager_ctx = a;
  a->m.deleter = app_deleter;
  a->mv.version.major = 1;
  a->mv.manager_ctx = a;
  a->mv.deleter = app_deleter_v;
  a->mv.dl_tensor = *t;
  return a;
}

static int managed_deleted;
static gpulua *capsule_g;
/* make_managed(n) -> a gpu.DLPack capsule: an application tensor handed to Lua */
static int app_make_managed(lua_State *L) {
  app_tensor *a = app_new((int)luaL_checkinteger(L, 1), &managed_deleted);
  if (gpulua_push_dlpack_capsule(capsule_g, &a->m) != 0) return luaL_error(L, "%s", gpulua_error(capsule_g));
  return 1;
}
/* raw_pointer(n) -> light userdata: what gpu.from_dlpack must refuse */
static int app_raw_pointer(lua_State *L) {
  app_tensor *a = app_new((int)luaL_checkinteger(L, 1), &managed_deleted);
  lua_pushlightuserdata(L, &a->m);
  return 1;
}
static int app_free_managed(lua_State *L) {
  DLManagedTensor *m = lua_touserdata(L, 1);
  m->deleter(m);
  return 0;
}

/* queued work keeps imported memory alive (pinned memory on the host backend
 * is ordinary memory, so its copies are queued like device ones) */
static void import_queued(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int host = is_host_backend(g);
  int deleted = 0;
  app_tensor *a;
  int st;
  if (host) {
    deleted = 0;
    a = app_new(4096, &deleted);
    a->m.dl_tensor.device.device_type = kDLCUDAHost;
    st = gpulua_push_dlpack(g, &a->m);
    lua_setglobal(L, "p");
    ok(st == 0 && run(g, "assert(p.device == 'pinned')\n"
                          "q = gpu.empty({4096}); gpu.sleep(30); q:copy(p)\n"
                          "p = nil; collectgarbage(); collectgarbage()\n"
                          "gpu.synchronize()\n"
                          "local v = q:totable(); for i = 1, 4096 do assert(v[i] == i, i) end\n"
                          "q = nil"),
       "a queued copy from an imported tensor reads it before its deleter (poisons) runs");
    ok(deleted == 1, "and the deleter ran once");
  } else {
    skip("queued copy keeps imported pinned memory alive", "host backend only (malloc'd memory is not pinned)");
  }
}

/* strides, byte_offset, negative strides, 0-dim */
static void import_strides(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int deleted = 0;
  app_tensor *a;
  int st;
  a = app_new(12, &deleted);   /* a 3x4 matrix 1..12: column 2 */
  a->shape[0] = 3;
  a->strides[0] = 4;
  a->m.dl_tensor.strides = a->strides;
  a->m.dl_tensor.byte_offset = 4;
  st = gpulua_push_dlpack(g, &a->m);
  lua_setglobal(L, "col");
  ok(st == 0 && run(g, "local v = col:totable(); assert(v[1] == 2 and v[2] == 6 and v[3] == 10, "
                        "table.concat(v, ','))\n assert(not col:is_contiguous()) col = nil"),
     "strides {4} and byte_offset 4: a column");

  a = app_new(1, &deleted);
  a->m.dl_tensor.ndim = 0;
  st = gpulua_push_dlpack(g, &a->m);
  lua_setglobal(L, "sc");
  ok(st == 0 && run(g, "assert(sc.ndim == 0 and sc:item() == 1) sc = nil"), "a 0-dim tensor");
  run(g, "collectgarbage(); collectgarbage()");
  gpulua_synchronize(g);
  ok(deleted == 2, "each deleted once (%d)", deleted);
}

/* versioned */
static void import_versioned(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int deleted = 0;
  app_tensor *a;
  int st;
  a = app_new(3, &deleted);
  st = gpulua_push_dlpack_versioned(g, &a->mv);
  lua_setglobal(L, "vv");
  ok(st == 0 && run(g, "assert(vv:sum():item() == 6) vv = nil; collectgarbage()"), "a versioned import");
  gpulua_synchronize(g);
  ok(deleted == 1, "its versioned deleter ran once");
}

/* the Lua side: gpu.from_dlpack of a capsule the application hands over */
static void import_capsules(gpulua *g) {
  lua_State *L = gpulua_state(g);
  lua_register(L, "make_managed", app_make_managed);
  lua_register(L, "raw_pointer", app_raw_pointer);
  lua_register(L, "free_managed", app_free_managed);
  capsule_g = g;
  managed_deleted = 0;
  ok(run(g, "local c = make_managed(4)\n"
            "assert(tostring(c) == 'gpu.DLPack (unused)', tostring(c))\n"
            "local t = gpu.from_dlpack(c)\n"
            "assert(tostring(c) == 'gpu.DLPack (used)', tostring(c))\n"
            "assert(t.device == 'host' and t:sum():item() == 10)\n"
            "t = nil; c = nil; collectgarbage(); collectgarbage()"),
     "gpu.from_dlpack(capsule) imports");
  gpulua_synchronize(g);
  ok(managed_deleted == 1, "and the deleter ran once after collection (the used capsule does not call it)");
  managed_deleted = 0;
  ok(run(g, "local c = make_managed(4)\n"
            "local t = gpu.from_dlpack(c)\n"
            "local ok, err = pcall(gpu.from_dlpack, c)\n"
            "assert(not ok and err:find('used already'), err)\n"
            "t = nil; collectgarbage()"),
     "a capsule is used once: a second gpu.from_dlpack raises");
  gpulua_synchronize(g);
  ok(managed_deleted == 1, "one import, one deleter call");
  managed_deleted = 0;
  ok(run(g, "do local c <close> = make_managed(4) end\n"
            "local c2 = make_managed(2); c2 = nil; collectgarbage(); collectgarbage()"),
     "unused capsules, closed and collected");
  ok(managed_deleted == 2, "an unused capsule calls the deleter itself (%d calls)", managed_deleted);
  managed_deleted = 0;
  ok(run(g, "local p = raw_pointer(4)\n"
            "local ok, err = pcall(gpu.from_dlpack, p)\n"
            "assert(not ok and err:find('gpu.DLPack', 1, true) and err:find('light userdata', 1, true), err)\n"
            "free_managed(p)"),
     "a bare pointer is refused: a script cannot pass a stale or forged one");
  ok(managed_deleted == 1, "(the application freed it)");
}

/* the same managed tensor pushed again while a view still holds its memory */
static void import_again(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int deleted = 0;
  app_tensor *a;
  int st;
  a = app_new(6, &deleted);
  st = gpulua_push_dlpack(g, &a->m);
  lua_setglobal(L, "A");
  ok(st == 0 && run(g, "V = A:narrow(1, 2, 3); A = nil; collectgarbage(); collectgarbage()"),
     "an import, a view of it, the import collected");
  st = gpulua_push_dlpack(g, &a->m);
  ok(st != 0 && contains(gpulua_error(g), "imported already"),
     "pushing it again while the view holds the memory is refused: %s", gpulua_error(g));
  ok(run(g, "V = nil; collectgarbage(); collectgarbage()") && gpulua_synchronize(g) == 0 && deleted == 1,
     "the deleter ran once, after the view (%d calls)", deleted);
}

/* round trip: our own export imported back shares the memory */
static void import_round_trip(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int st;
  run(g, "orig = gpu.tensor({1, 2, 3}, {dtype = 'i32', device = 'pinned'})");
  lua_getglobal(L, "orig");
  DLManagedTensor *m = NULL;
  st = gpulua_to_dlpack(g, -1, &m);
  lua_settop(L, 0);
  st = st || gpulua_push_dlpack(g, m);
  lua_setglobal(L, "back");
  ok(st == 0 && run(g, "back:fill(9); assert(orig:sum():item() == 27)\n"
                       "orig, back = nil, nil; collectgarbage(); collectgarbage()"),
     "an export imported back views the same memory");
  gpulua_synchronize(g);
  ok(expr_int(g, "gpu.stats().buffers") == 0, "both released (the import's release called the export's deleter)");
}

static void test_import(void) {
  gpulua *g = open_instance();
  lua_State *L = gpulua_state(g);
  int deleted = 0;
  app_tensor *a = app_new(6, &deleted);
  a->shape[0] = 2;
  a->shape[1] = 3;
  a->m.dl_tensor.ndim = 2;
  int st = gpulua_push_dlpack(g, &a->m);
  ok(st == 0 && lua_gettop(L) == 1, "gpulua_push_dlpack pushes a tensor");
  if (st) { diag(gpulua_error(g)); a->m.deleter(&a->m); gpulua_close(g); return; }
  lua_setglobal(L, "imp");
  ok(run(g, "assert(imp.device == 'host' and imp.dtype == 'f32' and imp.shape[1] == 2 and imp.shape[2] == 3)\n"
            "local v = imp:totable(); assert(v[1][1] == 1 and v[2][3] == 6)\n"
            "assert((imp + 1):sum():item() == 27)\n"
            "imp:add_(10)\n"
            "d = imp:to('device'); d:mul_(2)"),
     "the imported host tensor reads, computes and is written in place");
  gpulua_synchronize(g);
  ok(((float *)a->mem)[0] == 11 && ((float *)a->mem)[5] == 16, "in-place writes land in the application's memory");
  ok(deleted == 0, "no deleter while the tensor is alive");
  run(g, "imp = nil; collectgarbage(); collectgarbage()");
  gpulua_synchronize(g);
  ok(deleted == 1, "the deleter ran exactly once after the tensor was collected");
  ok(expr_int(g, "d:sum():item()") == 162, "the device copy made from it is intact");
  run(g, "d = nil; collectgarbage()");
  import_queued(g);
  import_strides(g);
  import_versioned(g);
  import_capsules(g);
  import_again(g);
  import_round_trip(g);
  gpulua_close(g);
}

/* Each bad managed tensor: refused, nothing pushed, deleter not called. */
static void bad_import(gpulua *g, app_tensor *a, int versioned, const char *want, const char *what) {
  lua_State *L = gpulua_state(g);
  int before = *a->deleted;
  int top = lua_gettop(L);
  int st = versioned ? gpulua_push_dlpack_versioned(g, &a->mv) : gpulua_push_dlpack(g, &a->m);
  const char *e = gpulua_error(g);
  ok(st != 0 && lua_gettop(L) == top && *a->deleted == before && contains(e, want) &&
         contains(e, versioned ? "gpulua_push_dlpack_versioned" : "gpulua_push_dlpack"),
     "%s: %s", what, e);
  a->m.deleter(&a->m);   /* still the caller's */
}

static void test_bad_import(void) {
  gpulua *g = open_instance();
  int host = is_host_backend(g);
  int deleted = 0;
  int st = gpulua_push_dlpack(g, NULL);
  ok(st != 0 && contains(gpulua_error(g), "NULL"), "NULL is refused: %s", gpulua_error(g));
  app_tensor *a = app_new(4, &deleted);
  a->m.dl_tensor.ndim = 9;
  bad_import(g, a, 0, "ndim 9", "ndim 9");
  a = app_new(4, &deleted);
  a->m.dl_tensor.ndim = -1;
  bad_import(g, a, 0, "ndim -1", "ndim -1");
  a = app_new(4, &deleted);
  a->m.dl_tensor.dtype.lanes = 2;
  bad_import(g, a, 0, "2 lanes", "lanes 2");
  a = app_new(4, &deleted);
  a->m.dl_tensor.dtype.code = kDLComplex;
  a->m.dl_tensor.dtype.bits = 64;
  bad_import(g, a, 0, "complex", "complex64");
  a = app_new(4, &deleted);
  a->m.dl_tensor.dtype.code = kDLUInt;
  a->m.dl_tensor.dtype.bits = 32;
  bad_import(g, a, 0, "code 1 'uint', 32 bits", "uint32");
  a = app_new(4, &deleted);
  a->m.dl_tensor.dtype.code = 99;
  bad_import(g, a, 0, "code 99", "an unknown type code");
  a = app_new(4, &deleted);
  a->m.dl_tensor.device.device_type = kDLCUDA;
  a->m.dl_tensor.device.device_id = host ? 0 : 77;
  bad_import(g, a, 0, host ? "host backend" : "device 77", host ? "kDLCUDA on the host backend" : "another GPU");
  a = app_new(4, &deleted);
  a->m.dl_tensor.device.device_type = kDLOpenCL;
  bad_import(g, a, 0, "kDLOpenCL", "an OpenCL buffer");
  a = app_new(4, &deleted);
  a->m.dl_tensor.device.device_type = kDLCUDAManaged;
  bad_import(g, a, 0, "kDLCUDAManaged", "managed memory");
  a = app_new(4, &deleted);
  a->m.dl_tensor.data = NULL;
  bad_import(g, a, 0, "data is NULL", "data NULL");
  a = app_new(4, &deleted);
  a->shape[0] = 0;
  bad_import(g, a, 0, "no empty tensors", "a zero size");
  a = app_new(4, &deleted);
  a->m.dl_tensor.shape = NULL;
  bad_import(g, a, 0, "shape is NULL", "shape NULL");
  a = app_new(4, &deleted);
  a->strides[0] = -1;
  a->m.dl_tensor.strides = a->strides;
  a->m.dl_tensor.byte_offset = 12;
  bad_import(g, a, 0, "negative stride", "a negative stride");
  a = app_new(4, &deleted);
  a->m.dl_tensor.byte_offset = 2;
  bad_import(g, a, 0, "not aligned", "a misaligned first element");
  a = app_new(4, &deleted);
  a->strides[0] = INT64_MAX / 2;
  a->m.dl_tensor.strides = a->strides;
  bad_import(g, a, 0, "too large", "a stride that overflows");
  a = app_new(4, &deleted);
  a->mv.version.major = 2;
  bad_import(g, a, 1, "version 2.0", "a versioned tensor of major version 2");
  a = app_new(4, &deleted);
  a->mv.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  bad_import(g, a, 1, "read-only", "a read-only tensor");
  ok(deleted == 17, "the caller's deleter ran for every refused tensor, gpulua's never (%d)", deleted);
  ok(run(g, "assert((gpu.ones({2}) + 1):sum():item() == 4)"), "the instance still works");
  ok(live_buffers(g) == 0, "no buffer left behind");
  gpulua_close(g);
}

/* ---- lifetimes across gpulua_close --------------------------------------------- */

static void test_close(void) {
  gpulua *g = open_instance();
  lua_State *L = gpulua_state(g);
  int host = is_host_backend(g);
  run(g, "h = gpu.tensor({5, 6, 7}, {dtype = 'f64', device = 'host'})\n"
         "p = gpu.tensor({1, 2}, {dtype = 'i64', device = 'pinned'})\n"
         "d = gpu.full({8}, 3, {dtype = 'f32'})");
  DLManagedTensor *mh = NULL, *mp = NULL, *md = NULL;
  lua_getglobal(L, "h");
  lua_getglobal(L, "p");
  lua_getglobal(L, "d");
  int st = gpulua_to_dlpack(g, 1, &mh) | gpulua_to_dlpack(g, 2, &mp) | gpulua_to_dlpack(g, 3, &md);
  lua_settop(L, 0);
  ok(st == 0, "three exports");
  if (st) { gpulua_close(g); return; }
  int deleted = 0;
  app_tensor *a = app_new(3, &deleted);
  ok(gpulua_push_dlpack(g, &a->m) == 0, "and an import");
  lua_setglobal(L, "imp");
  gpulua_close(g);
  ok(deleted == 1, "gpulua_close runs the import's deleter once");
  double *hv = (double *)((char *)mh->dl_tensor.data + mh->dl_tensor.byte_offset);
  int64_t *pv = (int64_t *)((char *)mp->dl_tensor.data + mp->dl_tensor.byte_offset);
  ok(hv[0] == 5 && hv[2] == 7 && pv[1] == 2, "exported host and pinned memory is still valid after gpulua_close");
  if (host) {
    float *dv = (float *)((char *)md->dl_tensor.data + md->dl_tensor.byte_offset);
    ok(dv[0] == 3 && dv[7] == 3, "and device memory (ordinary memory on the host backend)");
  } else {
    skip("device memory readable after close", "cuda backend: not host-readable");
  }
  mh->deleter(mh);
  call_deleter_thread(mp);
  md->deleter(md);
  ok(1, "deleters called after gpulua_close, one on another thread: no crash (ASan checks the frees)");
}

int main(void) {
  ok(1, "the declarations have the DLPack ABI's layout (checked at compile time)");
  test_export();
  test_export_nosync();
  test_import();
  test_bad_import();
  test_close();
  return done_testing();
}
