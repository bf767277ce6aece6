/* gpu.Task: a coroutine run by the interpreter's task loop.
 *
 * gpu.task(fn, ...) queues fn as a task; gpu.await(x) inside a task yields
 * until x (an event, a stream, or another task) is done, and outside one
 * waits for it (an event or a stream: a counted sync; a task: the loop runs
 * until it is done).  gpu.run() runs the loop until every task is done.
 *
 * Only the interpreter thread touches Lua: the device layer reports finished
 * work through watches and its progress counter (dev_watch_*,
 * dev_progress_*), and the loop sleeps on that counter when every task waits
 * for the device.
 *
 * The loop state is a table in the registry: `queue`, the unfinished tasks in
 * creation order, `by_thread`, coroutine -> task, `running`, the task being
 * resumed, and `scopes`, the open gpu.nosync scopes of each owner.
 *
 * gpu.nosync scopes live here because each belongs to a task (or to the main
 * program): see "gpu.nosync scopes" below. */
#include <string.h>
#include <time.h>

#include "bindings.h"
#include "common.h"

enum { T_NEW, T_READY, T_RUNNING, T_WAIT_DEV, T_WAIT_TASK, T_DONE, T_FAILED };
static const char *const state_names[] = {"new", "ready", "running", "waiting for the device",
                                          "waiting for a task", "done", "failed"};

/* user values: 1 the coroutine, 2 what it awaits (kept alive), 3 the
 * results (a table with n) or the error message */
typedef struct gpu_task {
  const bind_type *tag;
  int state;
  int id;
  int sync_slot;          /* the mode of its newest open gpu.nosync scope, -1 none */
  int observed;           /* its failure was raised to someone */
  dev_watch *w;           /* T_WAIT_DEV */
} gpu_task;

static const char loop_key = 0;   /* registry: the loop table */

static gpu_task *check_task(lua_State *L, int idx) {
  return bind_check_type(L, idx, &bind_task_type, sizeof(gpu_task));
}

static gpu_task *test_task(lua_State *L, int idx) {
  return bind_test_type(L, idx, &bind_task_type, sizeof(gpu_task));
}

/* Pushes the loop table, creating it on first use. */
static void push_loop(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &loop_key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_createtable(L, 0, 4);
  lua_newtable(L);
  lua_setfield(L, -2, "queue");
  lua_newtable(L);
  lua_setfield(L, -2, "by_thread");
  lua_pushinteger(L, 0);
  lua_setfield(L, -2, "depth");     /* loops running (0 or 1) */
  lua_pushinteger(L, 0);
  lua_setfield(L, -2, "next_id");
  lua_pushinteger(L, 0);
  lua_setfield(L, -2, "next_scope");
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &loop_key);
}

static lua_Integer loop_int(lua_State *L, const char *field) {
  push_loop(L);
  lua_getfield(L, -1, field);
  lua_Integer v = lua_tointeger(L, -1);
  lua_pop(L, 2);
  return v;
}

static void loop_set_int(lua_State *L, const char *field, lua_Integer v) {
  push_loop(L);
  lua_pushinteger(L, v);
  lua_setfield(L, -2, field);
  lua_pop(L, 1);
}

/* The task whose coroutine is L, pushed, or NULL (nothing pushed). */
static gpu_task *current_task(lua_State *L) {
  push_loop(L);
  lua_getfield(L, -1, "by_thread");
  lua_pushthread(L);
  lua_rawget(L, -2);
  gpu_task *t = lua_touserdata(L, -1);
  if (!t) { lua_pop(L, 3); return NULL; }
  lua_replace(L, -3);
  lua_pop(L, 1);
  return t;
}

static void drop_watch(gpu_task *t) {
  dev_watch_release(t->w);
  t->w = NULL;
}

/* ---- gpu.nosync scopes ---------------------------------------------------
 *
 * A scope belongs to its owner: the task being resumed when it opened (a
 * plain coroutine inside a task counts as that task), else the main
 * program.  loop.scopes[owner] holds the owner's open scopes, seq -> scope
 * (the main program's under a light userdata key); the newest one is in
 * force.  Closing a scope removes it from its owner's list and nothing else,
 * so scopes may close in any order and from any task, and one never closed
 * ends when it is collected.  Nothing is written back into whatever task
 * happens to run at the time. */

static const char main_owner = 0;   /* the key of the main program's scopes */

/* user values: 1 the owner (a gpu.Task, or false: the main program), 2 the
 * coroutine that opened it */
typedef struct nosync_scope {
  const bind_type *tag;
  lua_Integer seq;   /* its place in the opening order; 0 once closed */
  int mode;
  gpu_state *st;     /* for __gc, which must not raise once the runtime is closed */
} nosync_scope;

/* Pushes the task being resumed, or nil. */
static gpu_task *push_running(lua_State *L) {
  push_loop(L);
  lua_getfield(L, -1, "running");
  lua_replace(L, -2);
  return lua_touserdata(L, -1);
}

/* Pushes the list of open scopes of the owner at idx (a task, or anything
 * else for the main program), or nil when it has none. */
static void push_scopes(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  push_loop(L);
  if (lua_getfield(L, -1, "scopes") != LUA_TTABLE) {
    lua_remove(L, -2);
    return;   /* nil: no scope ever opened */
  }
  if (lua_touserdata(L, idx)) lua_pushvalue(L, idx);
  else lua_pushlightuserdata(L, (void *)&main_owner);
  lua_rawget(L, -2);
  lua_replace(L, -3);
  lua_pop(L, 1);
}

/* The mode of the owner at idx, from its open scopes: the newest one's, -1
 * none.  Scopes whose coroutine died of an error are ended on the way: they
 * stay pending there until the coroutine is closed or collected, and no
 * code of that coroutine can run again.  Stores the mode in the owner's
 * slot. */
static int owner_mode(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  gpu_task *t = lua_touserdata(L, idx);
  int *slot = t ? &t->sync_slot : &bind_state(L)->sync_main;
  int mode = -1;
  push_scopes(L, idx);
  if (lua_istable(L, -1)) {
    int list = lua_gettop(L);
    lua_Integer newest = 0;
    lua_pushnil(L);
    while (lua_next(L, list)) {
      nosync_scope *s = lua_touserdata(L, -1);
      lua_getiuservalue(L, -1, 2);
      lua_State *co = lua_tothread(L, -1);
      lua_pop(L, 1);
      if (co && lua_status(co) != LUA_OK && lua_status(co) != LUA_YIELD) {
        s->seq = 0;
        lua_pushvalue(L, -2);
        lua_pushnil(L);
        lua_rawset(L, list);   /* clearing a field during lua_next is allowed */
      } else if (s->seq > newest) {
        newest = s->seq;
        mode = s->mode;
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  *slot = mode;
  return mode;
}

int *bind_sync_slot(lua_State *L) {
  gpu_task *t = push_running(L);
  owner_mode(L, -1);
  lua_pop(L, 1);   /* the queue keeps the task */
  return t ? &t->sync_slot : &bind_state(L)->sync_main;
}

/* local _ <close> = gpu.nosync([mode]): syncs raise ("error", the default)
 * or warn until the scope ends, also when it ends by an error. */
static int gpu_nosync(lua_State *L) {
  bind_check_cstring(L, 1);
  int mode = luaL_checkoption(L, 1, "error", bind_sync_modes);
  gpu_state *st = bind_state(L);
  lua_settop(L, 0);
  nosync_scope *s = bind_new_udata(L, &bind_nosync_type, sizeof *s, 2);   /* 1 */
  s->seq = 0;   /* not open until it is in its owner's list */
  s->mode = mode;
  s->st = st;
  if (!push_running(L)) {   /* 2: the owner */
    lua_pop(L, 1);
    lua_pushboolean(L, 0);
  }
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 1, 1);
  lua_pushthread(L);
  lua_setiuservalue(L, 1, 2);
  push_loop(L);   /* 3 */
  if (lua_getfield(L, 3, "scopes") != LUA_TTABLE) {
    lua_pop(L, 1);
    /* weak keys: a finished task goes away once its scopes have */
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, 3, "scopes");
  }
  push_scopes(L, 2);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    /* weak values: a scope dropped unclosed is collected (and its __gc ends it) */
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    if (lua_touserdata(L, 2)) lua_pushvalue(L, 2);
    else lua_pushlightuserdata(L, (void *)&main_owner);
    lua_pushvalue(L, -2);
    lua_rawset(L, 4);
  }
  lua_getfield(L, 3, "next_scope");
  lua_Integer seq = lua_tointeger(L, -1) + 1;
  lua_pop(L, 1);
  lua_pushinteger(L, seq);
  lua_setfield(L, 3, "next_scope");
  lua_pushvalue(L, 1);
  lua_rawseti(L, -2, seq);
  s->seq = seq;
  owner_mode(L, 2);
  if (mode == 1) lua_warning(L, "@on", 0);
  bind_sync_apply(L);
  lua_settop(L, 1);
  return 1;
}

/* __close and __gc: the scope leaves its owner's list, and the mode in force
 * is set again for whatever runs now (which may be another task).  Never
 * raises. */
static int nosync_close(lua_State *L) {
  nosync_scope *s = bind_check_type(L, 1, &bind_nosync_type, sizeof *s);
  if (s->seq == 0) return 0;
  lua_Integer seq = s->seq;
  s->seq = 0;
  if (!s->st->ctx) return 0;   /* the runtime is closed: nothing to restore */
  lua_getiuservalue(L, 1, 1);
  int owner = lua_gettop(L);
  push_scopes(L, owner);
  if (lua_istable(L, -1)) {
    lua_pushnil(L);
    lua_rawseti(L, -2, seq);
  }
  lua_pop(L, 1);
  owner_mode(L, owner);
  lua_pop(L, 1);
  bind_sync_apply(L);
  return 0;
}

/* ---- gpu.task ----------------------------------------------------------- */

static int task_new(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  bind_state(L);
  int nargs = lua_gettop(L) - 1;
  gpu_task *t = bind_new_udata(L, &bind_task_type, sizeof *t, 3);
  t->sync_slot = -1;
  int ti = lua_gettop(L);
  lua_State *co = lua_newthread(L);
  lua_setiuservalue(L, ti, 1);
  /* the function and its arguments wait on the coroutine's stack */
  luaL_checkstack(co, nargs + 1, "too many arguments to gpu.task");
  for (int i = 1; i <= nargs + 1; i++) lua_pushvalue(L, i);
  lua_xmove(L, co, nargs + 1);
  t->id = (int)loop_int(L, "next_id") + 1;
  loop_set_int(L, "next_id", t->id);
  /* the task starts on the stream current where it was made */
  bind_push_current_table(L);
  if (lua_istable(L, -1)) {
    lua_pushthread(L);
    if (lua_rawget(L, -2) != LUA_TNIL) {
      lua_getiuservalue(L, ti, 1);
      lua_insert(L, -2);
      lua_rawset(L, -3);
    } else {
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  push_loop(L);
  lua_getfield(L, -1, "queue");
  lua_pushvalue(L, ti);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  lua_getfield(L, -2, "by_thread");
  lua_getiuservalue(L, ti, 1);
  lua_pushvalue(L, ti);
  lua_rawset(L, -3);
  lua_pop(L, 3);
  t->state = T_NEW;
  lua_settop(L, ti);
  return 1;
}

/* ---- the loop --------------------------------------------------------- */

/* Push the results of the finished task at idx, or raise its error. */
static int push_outcome(lua_State *L, int idx) {
  gpu_task *t = check_task(L, idx);
  lua_getiuservalue(L, idx, 3);
  if (t->state == T_FAILED) {
    t->observed = 1;
    return lua_error(L);
  }
  int n = 0;
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "n");
    n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    luaL_checkstack(L, n, "too many results");
    int tab = lua_gettop(L);
    for (int i = 1; i <= n; i++) lua_rawgeti(L, tab, i);
    lua_remove(L, tab);
  } else {
    lua_pop(L, 1);
  }
  return n;
}

/* Resume the task at idx once. */
static void step(lua_State *L, int idx) {
  gpu_task *t = check_task(L, idx);
  drop_watch(t);   /* what it waited for is over */
  lua_getiuservalue(L, idx, 1);
  lua_State *co = lua_tothread(L, -1);
  lua_pop(L, 1);
  int nargs = t->state == T_NEW ? lua_gettop(co) - 1 : 0;
  t->state = T_RUNNING;
  /* Ctrl-C's hook (set on the main thread) reaches the task too */
  if (lua_gethook(L)) lua_sethook(co, lua_gethook(L), lua_gethookmask(L), lua_gethookcount(L));
  /* the task's own gpu.nosync scopes, for as long as it runs; scopes it
   * opens are its own */
  push_loop(L);
  lua_pushvalue(L, idx);
  lua_setfield(L, -2, "running");
  bind_sync_apply_slot(L, owner_mode(L, idx));
  int nres = 0;
  int status = lua_resume(co, L, nargs, &nres);
  lua_pushnil(L);
  lua_setfield(L, -2, "running");
  lua_pop(L, 1);
  bind_sync_apply(L);
  if (status == LUA_YIELD) {
    /* gpu.await set the state; a plain coroutine.yield just lets others run */
    if (t->state == T_RUNNING) t->state = T_READY;
    lua_pop(co, nres);
    return;
  }
  if (status == LUA_OK) {
    luaL_checkstack(L, nres + 2, "too many results");
    lua_createtable(L, nres, 1);
    int tab = lua_gettop(L);
    lua_xmove(co, L, nres);
    for (int i = nres; i >= 1; i--) lua_rawseti(L, tab, i);
    lua_pushinteger(L, nres);
    lua_setfield(L, tab, "n");
    t->state = T_DONE;
  } else {
    /* the task's own traceback, taken before its stack is closed */
    const char *msg = lua_tostring(co, -1);
    if (!msg) msg = lua_pushfstring(co, "(error object is a %s value)", luaL_typename(co, -1));
    luaL_traceback(L, co, lua_pushfstring(L, "task %d failed: %s", t->id, msg), 0);
    lua_remove(L, -2);
    lua_resetthread(co);   /* closes its pending to-be-closed variables */
    t->state = T_FAILED;
  }
  lua_setiuservalue(L, idx, 3);
}

static int finished(const gpu_task *t) { return t->state == T_DONE || t->state == T_FAILED; }

/* Can the task at idx run now: is what it waits for done? */
static int ready(lua_State *L, gpu_task *t, int idx) {
  switch (t->state) {
  case T_NEW: case T_READY: return 1;
  case T_WAIT_DEV: return dev_watch_done(t->w);
  case T_WAIT_TASK: {
    lua_getiuservalue(L, idx, 2);
    gpu_task *u = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return finished(u);
  }
  default: return 0;
  }
}

/* Does any queued task await the task at idx? */
static int awaited(lua_State *L, int queue, int idx) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, queue);
  int yes = 0;
  for (lua_Integer i = 1; i <= n && !yes; i++) {
    lua_rawgeti(L, queue, i);
    gpu_task *t = lua_touserdata(L, -1);
    if (t->state == T_WAIT_TASK) {
      lua_getiuservalue(L, -1, 2);
      yes = lua_rawequal(L, -1, idx);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  return yes;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Ctrl-C in the CLI sets a hook that fires at the next Lua instruction; the
 * loop runs none while it sleeps, so it gives the hook one. */
static void let_hook_run(lua_State *L) {
  if (lua_gethook(L) == NULL) return;
  luaL_loadstring(L, "return");
  lua_call(L, 0, 0);
}

/* Drop finished tasks from the queue.  Pushes the message of the first
 * failure that no task awaits (and returns 1), or pushes nothing. */
static int sweep_queue(lua_State *L, int loop, int queue) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, queue);
  int failed = 0;
  for (lua_Integer i = 1; i <= n && !failed; i++) {
    lua_rawgeti(L, queue, i);
    gpu_task *t = lua_touserdata(L, -1);
    if (t->state == T_FAILED && !t->observed && !awaited(L, queue, lua_gettop(L))) {
      t->observed = 1;
      failed = 1;
      lua_getiuservalue(L, -1, 3);
      lua_replace(L, -2);
    } else {
      lua_pop(L, 1);
    }
  }
  int top = lua_gettop(L);
  lua_getfield(L, loop, "by_thread");
  int by = lua_gettop(L);
  lua_Integer j = 0;
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, queue, i);
    gpu_task *t = lua_touserdata(L, -1);
    if (finished(t)) {
      lua_getiuservalue(L, -1, 1);
      lua_pushnil(L);
      lua_rawset(L, by);
      lua_pop(L, 1);
    } else {
      lua_rawseti(L, queue, ++j);
    }
  }
  for (lua_Integer i = j + 1; i <= n; i++) {
    lua_pushnil(L);
    lua_rawseti(L, queue, i);
  }
  lua_settop(L, top);
  return failed;
}

/* The loop (run protected by run_loop): arguments `until` (a task, or nil
 * for all) and the timeout (< 0: none); returns the tasks left. */
static int loop_body(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  double timeout_s = lua_tonumber(L, 2);
  gpu_task *until = lua_touserdata(L, 1);
  double deadline = timeout_s >= 0 ? now_s() + timeout_s : -1;
  push_loop(L);
  int loop = lua_gettop(L);
  lua_getfield(L, loop, "queue");
  int queue = lua_gettop(L);
  for (;;) {
    int ran = 0;
    let_hook_run(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, queue);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, queue, i);
      gpu_task *t = lua_touserdata(L, -1);
      if (ready(L, t, lua_gettop(L))) {
        step(L, lua_gettop(L));
        ran = 1;
      }
      lua_pop(L, 1);
    }
    if (sweep_queue(L, loop, queue)) return lua_error(L);
    n = (lua_Integer)lua_rawlen(L, queue);
    if (n == 0 || (until && finished(until))) break;
    double left = deadline >= 0 ? deadline - now_s() : 1;
    if (left <= 0) break;   /* gpu.run(0): one round */
    if (ran) continue;
    /* Nothing could run: every task waits.  Sleep until the device makes
     * progress (begin before testing, so no completion is missed). */
    uint64_t gen = dev_progress_begin(ctx);
    int any = 0, devwait = 0;
    for (lua_Integer i = 1; i <= n && !any; i++) {
      lua_rawgeti(L, queue, i);
      gpu_task *t = lua_touserdata(L, -1);
      if (t->state == T_WAIT_DEV) devwait = 1;
      any = ready(L, t, lua_gettop(L));
      lua_pop(L, 1);
    }
    if (any) { dev_progress_end(ctx); continue; }
    if (!devwait) {
      dev_progress_end(ctx);
      return luaL_error(L, "gpu.run: %d task%s await each other and nothing else (a cycle of gpu.await)",
                        (int)n, n == 1 ? "" : "s");
    }
    /* wake now and then for Ctrl-C's hook; an interrupt (dev_interrupt) ends the wait */
    if (dev_progress_wait(ctx, gen, left < 0.05 ? left : 0.05) < 0) return bind_raise(L, ctx, "gpu.run");
  }
  lua_pushinteger(L, (lua_Integer)lua_rawlen(L, queue));
  return 1;
}

/* Run tasks until the task at index `until` (0: every task) is done, or the
 * time runs out (timeout_s < 0: no limit).  Raises the first failure that no
 * task awaits.  Returns the number of unfinished tasks. */
static lua_Integer run_loop(lua_State *L, int until, double timeout_s, const char *fname) {
  /* the tasks' work would go into the capture, which then fails */
  const dev_graph *cap = dev_graph_open_capture(bind_ctx(L));
  if (cap)
    luaL_error(L, "%s cannot run tasks during a gpu.graph capture (captured at %s); run them "
                  "before or after gpu.graph", fname, dev_graph_site(cap));
  if (loop_int(L, "depth") > 0)
    luaL_error(L, "the task loop is already running (gpu.run or gpu.await(task) from a plain "
                  "coroutine or a callback inside a task)");
  loop_set_int(L, "depth", 1);
  lua_pushcfunction(L, loop_body);
  if (until) lua_pushvalue(L, until); else lua_pushnil(L);
  lua_pushnumber(L, timeout_s);
  int status = lua_pcall(L, 2, 1, 0);
  loop_set_int(L, "depth", 0);
  if (status != LUA_OK) lua_error(L);
  lua_Integer left = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return left;
}

/* gpu.run([timeout_s]) --> tasks left unfinished (0 without a timeout) */
int bind_run(lua_State *L) {
  double timeout = luaL_optnumber(L, 1, -1);
  luaL_argcheck(L, lua_isnoneornil(L, 1) || timeout >= 0, 1, "timeout must be >= 0 seconds");
  if (current_task(L)) return luaL_error(L, "gpu.run cannot be called from a task (use gpu.await)");
  lua_pushinteger(L, run_loop(L, 0, timeout, "gpu.run"));
  return 1;
}

/* ---- gpu.await -------------------------------------------------------- */

/* Where an awaiting task goes on: the outcome of what it awaited. */
static int await_k(lua_State *L, int status, lua_KContext kctx) {
  (void)status;
  int kind = (int)kctx;
  gpu_task *self = current_task(L);
  int me = lua_gettop(L);
  if (kind == T_WAIT_TASK && self) {
    lua_getiuservalue(L, me, 2);
    lua_pushnil(L);
    lua_setiuservalue(L, me, 2);
    return push_outcome(L, lua_gettop(L));
  }
  if (self) {
    lua_pushnil(L);
    lua_setiuservalue(L, me, 2);
  }
  dev_ctx *ctx = bind_ctx(L);
  BIND_CHECK(L, ctx, dev_check_async(ctx), "await");
  return 0;
}

static int gpu_await(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  lua_settop(L, 1);
  gpu_task *self = current_task(L);
  int me = self ? 2 : 0;
  const dev_graph *cap = dev_graph_open_capture(ctx);
  if (self && !lua_isyieldable(L) && cap)
    return luaL_error(L, "gpu.await cannot yield inside a gpu.graph capture (captured at %s): other tasks "
                         "would run while it is open; await before or after gpu.graph", dev_graph_site(cap));
  if (self && !lua_isyieldable(L))
    return luaL_error(L, "gpu.await cannot yield here: the task is inside a C call that does not let "
                         "it yield (table.sort, string.gsub, require, a metamethod ...); await outside it");
  gpu_task *u = test_task(L, 1);
  if (u) {
    if (u == self) return luaL_argerror(L, 1, "a task cannot await itself");
    if (u->state == T_DONE || u->state == T_FAILED) return push_outcome(L, 1);
    if (self) {
      lua_pushvalue(L, 1);
      lua_setiuservalue(L, me, 2);
      self->state = T_WAIT_TASK;
      return lua_yieldk(L, 0, T_WAIT_TASK, await_k);
    }
    run_loop(L, 1, -1, "gpu.await");
    return push_outcome(L, 1);
  }
  dev_watch *w = NULL;
  int rc;
  if (bind_test_event(L, 1)) {
    dev_event *e = bind_check_event(L, 1);
    if (!self) {
      bind_call_site(L, ctx, "await");
      BIND_CHECK(L, ctx, dev_event_synchronize(e), "await");
      return 0;
    }
    rc = dev_watch_event(e, &w);
  } else if (bind_test_stream(L, 1)) {
    dev_stream *s = bind_check_stream(L, 1);
    if (!self) {
      bind_call_site(L, ctx, "await");
      BIND_CHECK(L, ctx, dev_stream_synchronize(s), "await");
      return 0;
    }
    rc = dev_watch_stream(s, &w);
  } else {
    return luaL_typeerror(L, 1, "gpu.Event, gpu.Stream or gpu.Task");
  }
  BIND_CHECK(L, ctx, rc, "await");
  if (dev_watch_done(w)) {
    dev_watch_release(w);
    BIND_CHECK(L, ctx, dev_check_async(ctx), "await");
    return 0;
  }
  drop_watch(self);
  self->w = w;
  self->state = T_WAIT_DEV;
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, me, 2);
  return lua_yieldk(L, 0, T_WAIT_DEV, await_k);
}

/* ---- methods ------------------------------------------------------------ */

/* t:result() --> the task's results; raises its error, or if it is not done */
static int task_result(lua_State *L) {
  gpu_task *t = check_task(L, 1);
  if (t->state != T_DONE && t->state != T_FAILED)
    return luaL_error(L, "task %d is not done (%s): use gpu.await(t)", t->id, state_names[t->state]);
  lua_settop(L, 1);
  return push_outcome(L, 1);
}

/* t:cancel(): a task not finished never runs again; its to-be-closed
 * variables are closed, and awaiting it raises "task N was cancelled". */
static int task_cancel(lua_State *L) {
  gpu_task *t = check_task(L, 1);
  if (finished(t)) return 0;
  lua_getiuservalue(L, 1, 1);
  lua_State *co = lua_tothread(L, -1);
  lua_Debug ar;
  /* running, or resuming another coroutine: its stack is in use */
  if (co == L || t->state == T_RUNNING || (lua_status(co) == LUA_OK && lua_getstack(co, 0, &ar)))
    return luaL_error(L, "task %d is running: a task cannot cancel itself", t->id);
  drop_watch(t);
  lua_resetthread(co);
  lua_pop(L, 1);
  t->state = T_FAILED;
  t->observed = 1;
  lua_pushfstring(L, "task %d was cancelled", t->id);
  lua_setiuservalue(L, 1, 3);
  return 0;
}

/* t.done, t.failed, t.state, t.id, t.error (after the methods) */
static int task_fields(lua_State *L) {
  gpu_task *t = check_task(L, 1);
  const char *k = bind_check_key(L, 2);
  if (strcmp(k, "done") == 0) lua_pushboolean(L, t->state == T_DONE || t->state == T_FAILED);
  else if (strcmp(k, "failed") == 0) lua_pushboolean(L, t->state == T_FAILED);
  else if (strcmp(k, "state") == 0) lua_pushstring(L, state_names[t->state]);
  else if (strcmp(k, "id") == 0) lua_pushinteger(L, t->id);
  else if (strcmp(k, "error") == 0) {
    if (t->state == T_FAILED) lua_getiuservalue(L, 1, 3);
    else lua_pushnil(L);
  } else {
    lua_pushnil(L);
  }
  return 1;
}

static int task_tostring(lua_State *L) {
  gpu_task *t = check_task(L, 1);
  lua_pushfstring(L, "gpu.Task %d (%s)", t->id, state_names[t->state]);
  return 1;
}

static int task_gc(lua_State *L) {
  gpu_task *t = check_task(L, 1);
  drop_watch(t);
  return 0;
}

static const luaL_Reg task_methods[] = {
  {"result", task_result},
  {"cancel", task_cancel},
  {NULL, NULL}
};

static const luaL_Reg task_meta[] = {
  {"__index", task_fields},
  {"__tostring", task_tostring},
  {"__gc", task_gc},
  {NULL, NULL}
};

static const luaL_Reg nosync_meta[] = {
  {"__close", nosync_close},
  {"__gc", nosync_close},
  {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"task", task_new},
  {"await", gpu_await},
  {"run", bind_run},
  {"nosync", gpu_nosync},
  {NULL, NULL}
};

int bind_open_task(lua_State *L) {
  bind_newtype(L, &bind_task_type, task_meta, task_methods);
  bind_newtype(L, &bind_nosync_type, nosync_meta, NULL);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
