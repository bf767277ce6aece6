/* Memory that follows the script: gpu.memory, gpu.empty_cache,
 * gpu.reset_peak_memory, and bind_alloc, through which every tensor gets its
 * memory.
 *
 * Lua's collector counts a tensor's handle (a few dozen bytes), not the
 * memory behind it, so a loop of temporaries (`local y = (x * 2 + 1):relu()`)
 * would fill a device before a collection ever ran.  So each allocation
 * checks the bytes that live buffers of its kind hold against a limit set at
 * the last full collection: the bytes live then, plus as much again (at
 * least gc_floor).  Past it, a collection step runs first (a young
 * collection in generational mode, where the temporaries are), and a full
 * collection if that did not bring the kind under its limit.  Below the
 * limits, a young collection every gc_floor bytes allocated (the backend's
 * warm_bytes where smaller: 8 MiB on the host backend) keeps a loop's
 * temporaries few (their blocks are reused while warm); a full one instead
 * where the Lua heap is small beside the bytes made (full_is_cheap).  The
 * young collection runs before the allocation that would pass its step, so
 * that this allocation can take a block it frees.  The
 * limit is then live + max(live, gc_floor) with live <= the largest live set L, so
 * the bytes held never exceed 2 L + gc_floor (the bound docs/internals.md states).
 * Out of memory, an allocation collects in full, waits for the queued work
 * that still uses freed blocks of its kind (only that) and retries before it
 * raises with the figures. */
#include <string.h>

#include "common.h"

/* Allocations between young collections, whatever their size.  Lua paces
 * its collector by the size of the whole heap, so with 100 000 live tensors
 * it leaves some 20 000 temporaries uncollected between collections: their
 * handles, records and blocks become a working set far larger than the CPU
 * caches, and each allocation costs 1.5-4x what it does with 1 000 alive
 * (bench/alloc.lua's live rows).  Every 256 allocations, a young collection
 * (whose work is the young objects, not the live set) keeps that working set
 * small: under callgrind, last-level cache misses per gpu.empty({1}) with
 * 100 000 alive fell from 9.3 to 0.14, its instructions did not grow
 * (bench/RESULTS.md, 2026-11-25). */
#define GC_COUNT_STEP 256

/* Tensor bytes per byte of Lua heap for a full collection to count as cheap
 * (full_is_cheap, below). */
#define GC_FULL_RATIO 1024
#define GC_FULL_RATIO_WARM 128

/* A full collection just ran: every kind's limit from what is live now,
 * counting the allocation about to be made (bytes of kind), which will be
 * live too: a request larger than the rest then does not force a full
 * collection every time. */
static void gc_reset(gpu_state *st, dev_memkind kind, size_t bytes) {
  st->gc_since_full = 0;
  for (int k = 0; k < DEV_NMEMKIND; k++) {
    size_t live = dev_mem_live(st->ctx, (dev_memkind)k) + (k == (int)kind ? bytes : 0);
    st->gc_limit[k] = live + (live > st->gc_floor ? live : st->gc_floor);
  }
}

/* A full collection; 0 when it could not run (inside a finalizer, where
 * lua_gc does nothing), and then the limits stay as they are. */
static int collect_full(lua_State *L, gpu_state *st, dev_memkind kind, size_t bytes) {
  if (lua_gc(L, LUA_GCCOLLECT) < 0) return 0;
  gc_reset(st, kind, bytes);
  return 1;
}

void bind_memory_init(gpu_state *st) {
  size_t f = dev_mem_total(st->ctx, DEV_MEM_DEVICE) / 32;
  if (f < ((size_t)1 << 20)) f = (size_t)1 << 20;
  if (f > ((size_t)256 << 20)) f = (size_t)256 << 20;
  st->gc_floor = f;
  st->gc_young_step = f;
  /* where the backend's ops go through small caches (the CPU's), sooner */
  size_t w = dev_warm_bytes(st->ctx);
  st->gc_full_ratio = GC_FULL_RATIO;
  if (w && w < f) {
    st->gc_young_step = w;
    st->gc_full_ratio = GC_FULL_RATIO_WARM;
  }
  st->gc_count_step = GC_COUNT_STEP;
  gc_reset(st, DEV_MEM_DEVICE, 0);
}

/* Whether a full collection costs little beside the tensor bytes made since
 * the last one: its work is the Lua heap, at most 1/gc_full_ratio of them.
 * A young collection frees only what died young, and in a loop that makes
 * one big temporary per iteration, `local u = (t * 2 + 1):relu()`, each u
 * outlives two young collections (its register holds it until the next u
 * replaces it), grows old and waits for a full collection: the loop then
 * held 10 times t where incremental mode held 5 (host backend, 64 MiB
 * tensors, 2026-11-25).  With big temporaries and a small heap this keeps
 * it at the figure of incremental mode; with small temporaries, or a big
 * heap, the young collections stay.  GC_FULL_RATIO_WARM where the step is
 * the backend's warm_bytes (host): a full collection of a 52 KiB heap costs
 * about 9 us (2026-11-29), 1/128 of 8 MiB of host ops' time at most, and
 * the operands a young collection ages then wait one step, not 6-7
 * (`(x * 2 + 1):relu()` on 4 MiB: 4 blocks besides x, not 9).  On a GPU
 * the step is up to 256 MiB and the ops' time is not the host's: a 2 MiB
 * heap's full collection there would cost the enqueue loop 0.35 ms. */
static int full_is_cheap(lua_State *L, gpu_state *st) {
  size_t heap = (size_t)lua_gc(L, LUA_GCCOUNT) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB);
  return st->gc_since_full / st->gc_full_ratio >= heap;
}

static void collect(lua_State *L, gpu_state *st, dev_memkind kind, size_t bytes) {
  if (lua_gc(L, LUA_GCSTEP, 0) < 0) return;
  if (dev_mem_live(st->ctx, kind) + bytes <= st->gc_limit[kind]) return;
  collect_full(L, st, kind, bytes);
}

/* t:close() gave back bytes that no collection has to find: the pacing's
 * count of bytes allocated since its last step goes down by them, so that
 * a loop that closes what it makes (`out:close(); out = a:flip(1)`) runs
 * no step for them.  A step delays the op's start: on an H200 one
 * a:clone() of 256 MiB took 145 us, a copy into an existing tensor 134,
 * with a full collection ahead of each allocation. */
void bind_memory_closed(lua_State *L, size_t bytes) {
  gpu_state *st = bind_state(L);
  st->gc_young = st->gc_young > bytes ? st->gc_young - bytes : 0;
}

dev_buf *bind_alloc(lua_State *L, dev_memkind kind, size_t bytes, int stream, const char *fname) {
  gpu_state *st = bind_state(L);
  dev_ctx *ctx = st->ctx;
  if (dev_mem_live(ctx, kind) + bytes > st->gc_limit[kind]) {
    collect(L, st, kind, bytes);
    st->gc_young = bytes;
  } else if (st->gc_young && st->gc_young + bytes > st->gc_young_step) {
    /* a young collection now and then keeps the blocks of a loop's
     * temporaries few and warm in the caches, long before any limit; a
     * full one where that is cheap beside the memory at stake.  It runs
     * before the allocation that would pass the step, so that this one
     * can take a block that the collection frees */
    if (full_is_cheap(L, st)) {
      collect_full(L, st, kind, bytes);
    } else {
      lua_gc(L, LUA_GCSTEP, 0);
    }
    st->gc_young = bytes;
    st->gc_count = 0;
  } else {
    st->gc_young += bytes;
    if (++st->gc_count >= st->gc_count_step) {
      /* the same by count, for small temporaries: only while the collector
       * runs (collectgarbage("stop") holds), as Lua's own pacer would */
      st->gc_count = 0;
      if (lua_gc(L, LUA_GCISRUNNING)) lua_gc(L, LUA_GCSTEP, 0);
    }
  }
  st->gc_since_full += bytes;
  /* the stream looked up after any collection (a finalizer may close streams) */
  dev_buf *b;
  int rc = dev_buf_alloc_on(ctx, kind, bytes, bind_stream(L, stream), &b);
  if (rc == DEV_ERR_NOMEM && bind_reclaim(L, kind, bytes) == DEV_OK)
    rc = dev_buf_alloc_on(ctx, kind, bytes, bind_stream(L, stream), &b);
  BIND_CHECK(L, ctx, rc, fname);
  return b;
}

int bind_reclaim(lua_State *L, dev_memkind kind, size_t bytes) {
  gpu_state *st = bind_state(L);
  collect_full(L, st, kind, bytes);
  return dev_mem_reclaim(st->ctx, kind);
}

static void setint(lua_State *L, const char *k, size_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

static int gpu_memory(lua_State *L) {
  gpu_state *st = bind_state(L);
  dev_meminfo m;
  dev_get_meminfo(st->ctx, &m);
  lua_createtable(L, 0, 10);
  setint(L, "allocated", m.allocated);
  setint(L, "reserved", m.reserved);
  setint(L, "peak", m.peak);
  setint(L, "pinned", m.pinned);
  setint(L, "pinned_reserved", m.pinned_reserved);
  setint(L, "pinned_peak", m.pinned_peak);
  setint(L, "host", m.host);
  setint(L, "host_reserved", m.host_reserved);
  setint(L, "host_peak", m.host_peak);
  setint(L, "gc_floor", st->gc_floor);
  return 1;
}

static void no_args(lua_State *L) {
  if (!lua_isnone(L, 1)) luaL_argerror(L, 1, "no arguments expected");
}

static int gpu_empty_cache(lua_State *L) {
  no_args(L);
  dev_empty_cache(bind_ctx(L));
  return 0;
}

static int gpu_reset_peak_memory(lua_State *L) {
  no_args(L);
  dev_reset_peak(bind_ctx(L));
  return 0;
}

static const luaL_Reg funcs[] = {
  {"memory", gpu_memory},
  {"empty_cache", gpu_empty_cache},
  {"reset_peak_memory", gpu_reset_peak_memory},
  {NULL, NULL}
};

int bind_open_memory(lua_State *L) {
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
