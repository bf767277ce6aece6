/* test_embed — TAP test of the embedding API (interp/lib/gpulua.h), as an
 * application uses it: only gpulua.h and the Lua C API. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "gpulua.h"
#include "tests/tap.h"

static int contains(const char *s, const char *sub) {
  return s != NULL && strstr(s, sub) != NULL;
}

/* Value of global `name` as an integer (LUA_MININTEGER if not an integer). */
static lua_Integer global_int(gpulua *g, const char *name) {
  lua_State *L = gpulua_state(g);
  lua_Integer v = LUA_MININTEGER;
  if (lua_getglobal(L, name) == LUA_TNUMBER && lua_isinteger(L, -1))
    v = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

static void test_defaults(void) {
  gpulua *g = gpulua_open(NULL);
  ok(g != NULL && gpulua_state(g) != NULL, "gpulua_open(NULL) opens an instance with a lua_State");
  if (gpulua_state(g) == NULL)
    diag(gpulua_error(g));
  ok(gpulua_dostring(g, "answer = 6 * 7; return answer", "=setup") == 0,
     "dostring that sets a global and returns succeeds");
  ok(global_int(g, "answer") == 42, "the global reads back through the lua_State");
  ok(lua_gettop(gpulua_state(g)) == 0, "dostring leaves the stack as it found it");
  ok(gpulua_dostring(g, "assert(type(gpu) == 'table' and package.loaded.gpu == gpu)", "=gpu") == 0,
     "the gpu module is loaded and is the global gpu");
  ok(gpulua_dostring(g, "assert(type(string.format) == 'function' and io and os)", "=libs") == 0,
     "standard libraries are open by default");
  ok(gpulua_dostring(g, "assert(type(package.preload['gpu.test']) == 'function')", "=preload") == 0,
     "the embedded stdlib module gpu.test is in package.preload");
  gpulua_close(g);
}

static void test_errors(void) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  gpulua *g = gpulua_open(&o);
  int st = gpulua_dostring(g, "local x = 1\nerror('boom')\n", "=mychunk");
  const char *e = gpulua_error(g);
  ok(st == LUA_ERRRUN, "a runtime error returns LUA_ERRRUN (got %d)", st);
  ok(contains(e, "mychunk:2:") && contains(e, "boom"), "the error names the chunk and line");
  if (!contains(e, "mychunk:2:"))
    diag(e);
  ok(contains(e, "stack traceback"), "the error carries a traceback");
  ok(lua_gettop(gpulua_state(g)) == 0, "a failed dostring leaves the stack as it found it");

  st = gpulua_dostring(g, "x = = 1", "=bad");
  ok(st == LUA_ERRSYNTAX && contains(gpulua_error(g), "bad:1:"),
     "a syntax error returns LUA_ERRSYNTAX with a message naming the chunk");

  st = gpulua_dostring(g, "error(setmetatable({}, {__tostring = function() return 'custom' end}))", "=obj");
  ok(st != 0 && contains(gpulua_error(g), "custom"), "a non-string error object is shown through __tostring");

  ok(gpulua_dostring(g, "after = 1", "=after") == 0 && global_int(g, "after") == 1,
     "the instance still works after errors");

  st = gpulua_dofile(g, "/nonexistent/dir/missing.lua");
  ok(st != 0 && contains(gpulua_error(g), "missing.lua"), "dofile on a missing file fails naming the file");

  lua_State *L = gpulua_state(g);
  luaL_loadstring(L, "local a, b = ...; return a + b, a * b");
  lua_pushinteger(L, 3);
  lua_pushinteger(L, 4);
  st = gpulua_pcall(g, 2, 2);
  ok(st == 0 && lua_tointeger(L, -2) == 7 && lua_tointeger(L, -1) == 12,
     "gpulua_pcall passes arguments and leaves results");
  lua_settop(L, 0);
  luaL_loadstring(L, "error('in pcall')");
  st = gpulua_pcall(g, 0, 0);
  ok(st == LUA_ERRRUN && lua_gettop(L) == 1 && contains(lua_tostring(L, -1), "in pcall") &&
         contains(gpulua_error(g), "stack traceback"),
     "gpulua_pcall leaves the message on the stack and in gpulua_error");
  lua_settop(L, 0);
  gpulua_close(g);
}

static void test_dofile(void) {
  char path[] = "/tmp/gpulua_test_embed_XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f != NULL) {
    fputs("from_file = 'yes'\n", f);
    fclose(f);
  }
  gpulua *g = gpulua_open(NULL);
  int st = gpulua_dofile(g, path);
  lua_State *L = gpulua_state(g);
  lua_getglobal(L, "from_file");
  ok(f != NULL && st == 0 && contains(lua_tostring(L, -1), "yes"), "dofile runs a file");
  lua_pop(L, 1);
  gpulua_close(g);
  remove(path);
}

static void test_two_instances(void) {
  gpulua *a = gpulua_open(NULL), *b = gpulua_open(NULL);
  ok(gpulua_state(a) != NULL && gpulua_state(b) != NULL && gpulua_state(a) != gpulua_state(b),
     "two instances open at once");
  gpulua_dostring(a, "shared_name = 1", "=a");
  gpulua_dostring(b, "shared_name = 2", "=b");
  ok(global_int(a, "shared_name") == 1 && global_int(b, "shared_name") == 2,
     "the same global holds different values in the two instances");
  gpulua_dostring(a, "gpu.from_a = true", "=a");
  ok(gpulua_dostring(b, "assert(gpu.from_a == nil)", "=b") == 0,
     "each instance has its own gpu module table");
  gpulua_dostring(a, "error('only in a')", "=a");
  ok(contains(gpulua_error(a), "only in a") && !contains(gpulua_error(b), "only in a"),
     "errors are kept per instance");
  gpulua_close(a);
  ok(gpulua_dostring(b, "shared_name = shared_name + 1", "=b") == 0 && global_int(b, "shared_name") == 3,
     "closing one instance leaves the other working");
  gpulua_close(b);
}

static void test_bad_options(void) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  o.size = 3;
  gpulua *g = gpulua_open(&o);
  ok(g != NULL && gpulua_state(g) == NULL && contains(gpulua_error(g), "size") &&
         contains(gpulua_error(g), "GPULUA_OPTIONS_INIT"),
     "a wrong options size gives a failed handle that says why");
  diag(gpulua_error(g));
  ok(gpulua_dostring(g, "x = 1", "=x") != 0 && gpulua_dofile(g, NULL) != 0 &&
         gpulua_synchronize(g) != 0 && contains(gpulua_error(g), "size"),
     "calls on a failed handle fail and keep the reason");
  gpulua_close(g);
  ok(1, "gpulua_close on a failed handle");

  o = (gpulua_options)GPULUA_OPTIONS_INIT;
  o.version = GPULUA_OPTIONS_VERSION + 1;
  g = gpulua_open(&o);
  ok(g != NULL && gpulua_state(g) == NULL && contains(gpulua_error(g), "version"),
     "a newer options version gives a failed handle that says why");
  gpulua_close(g);

  o = (gpulua_options)GPULUA_OPTIONS_INIT;
  o.device = "no-such-device";
  g = gpulua_open(&o);
  ok(g != NULL && gpulua_state(g) == NULL && gpulua_error(g)[0] != '\0',
     "a device that cannot be opened gives a failed handle with a message");
  diag(gpulua_error(g));
  gpulua_close(g);
}

static void test_options(void) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  o.device = "host";
  gpulua *g = gpulua_open(&o);
  ok(gpulua_state(g) != NULL && gpulua_dostring(g, "assert(gpu.backend == 'host')", "=dev") == 0,
     "device \"host\" explicitly gives the host backend");
  if (gpulua_state(g) == NULL)
    diag(gpulua_error(g));
  int st = gpulua_dostring(g,
                           "local t = gpu.zeros({4})\n"
                           "assert(t:sum():item() == 0)\n"
                           "local u = gpu.ones({3, 2}, {dtype = 'f64'})\n"
                           "assert(u:sum():item() == 6)\n",
                           "=tensors");
  ok(st == 0, "a chunk using gpu tensors runs");
  if (st != 0)
    diag(gpulua_error(g));
  ok(gpulua_synchronize(g) == 0, "gpulua_synchronize finishes queued work");
  gpulua_close(g);

  o = (gpulua_options)GPULUA_OPTIONS_INIT;
  o.open_libs = 0;
  g = gpulua_open(&o);
  lua_State *L = gpulua_state(g);
  int bare = L != NULL && lua_getglobal(L, "string") == LUA_TNIL && lua_getglobal(L, "gpu") == LUA_TTABLE;
  if (L != NULL)
    lua_settop(L, 0);
  ok(bare, "open_libs = 0 opens no standard library but still sets gpu");
  if (L != NULL) {
    luaL_openlibs(L);
    ok(gpulua_dostring(g, "assert(type(package.preload['gpu.test']) == 'function')", "=late") == 0,
       "embedded modules become require-able when the application opens package later");
  } else {
    ok(0, "embedded modules become require-able when the application opens package later");
  }
  gpulua_close(g);

  /* An application compiled against version 1 with only its fields. */
  o = (gpulua_options)GPULUA_OPTIONS_INIT;
  o.size = offsetof(gpulua_options, ignore_env) + sizeof(int);
  g = gpulua_open(&o);
  ok(gpulua_state(g) != NULL, "an options size that covers the version 1 fields is accepted");
  gpulua_close(g);
}

/* Tasks driven from the application's loop with gpulua_poll. */
static void test_poll(void) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  o.device = "host";
  gpulua *g = gpulua_open(&o);
  ok(gpulua_poll(g, 0) == 0, "gpulua_poll with no tasks returns 0");
  ok(gpulua_dostring(g,
       "local s = gpu.stream()\n"
       "steps = 0\n"
       "for k = 1, 3 do\n"
       "  gpu.task(function()\n"
       "    for i = 1, 2 do gpu.sleep(20, {stream = s}); gpu.await(s:record()); steps = steps + 1 end\n"
       "  end)\n"
       "end\n", "=tasks") == 0, "a script queues 3 tasks");
  ok(global_int(g, "steps") == 0, "queued tasks do not run by themselves");
  int left = gpulua_poll(g, 0);
  ok(left == 3, "gpulua_poll(g, 0) runs what can run and returns the 3 unfinished tasks (got %d)", left);
  int rounds = 0;
  while ((left = gpulua_poll(g, 0.01)) > 0 && rounds < 10000)
    rounds++;
  ok(left == 0 && global_int(g, "steps") == 6, "polling with a timeout finishes every task (steps %lld)",
     (long long)global_int(g, "steps"));
  ok(gpulua_dostring(g, "gpu.task(function() error('task boom') end)", "=fail") == 0,
     "a script queues a failing task");
  ok(gpulua_poll(g, -1) == -1 && contains(gpulua_error(g), "task boom") &&
     contains(gpulua_error(g), "stack traceback"),
     "gpulua_poll returns -1 with the task's error and traceback");
  /* polled first: the message's argument is read after the poll set it */
  int queued = gpulua_dostring(g, "gpu.task(function() error('task boom') end)", "=fail") == 0;
  int failed = queued && gpulua_poll(g, -1) == -1;
  const char *msg = gpulua_error(g);
  ok(failed && contains(msg, "in function 'gpulua_poll'") && !contains(msg, "gpu.run"),
     "the traceback names gpulua_poll, the application's call, not gpu.run: %s", msg);
  ok(gpulua_poll(g, -1) == 0, "the instance goes on: the failed task is gone");
  gpulua_close(g);
  ok(gpulua_poll(NULL, 0) == -1, "gpulua_poll(NULL) fails harmlessly");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* What an interactive front end uses: interrupts (from a signal handler, as
 * a Ctrl-C would), the sync policy and the device's name. */
static gpulua *alarm_g;
static void on_alarm(int sig) {
  (void)sig;
  gpulua_interrupt(alarm_g);
}

static void test_frontend(void) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  o.device = "host";
  o.interruptible = 1;
  gpulua *g = gpulua_open(&o);
  int device = -1;
  const char *be = gpulua_backend(g, &device);
  ok(be != NULL && strcmp(be, "host") == 0 && device == 0, "gpulua_backend: host, device 0 (%s, %d)",
     be ? be : "NULL", device);

  /* a wait interrupted from a signal handler gives up; the work runs on */
  alarm_g = g;
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, &old);
  struct itimerval it = {{0, 0}, {0, 100000}};
  setitimer(ITIMER_REAL, &it, NULL);
  double t0 = now_s();
  int st = gpulua_dostring(g, "gpu.sleep(1500); gpu.synchronize()", "=intr");
  double took = now_s() - t0;
  sigaction(SIGALRM, &old, NULL);
  ok(st != 0 && contains(gpulua_error(g), "interrupted") && took < 1.2,
     "gpulua_interrupt from a signal handler stops a wait (%.2f s): %s", took, st ? gpulua_error(g) : "no error");
  ok(gpulua_interrupt_clear(g) == 0, "the wait took the interrupt: none is left pending");
  ok(gpulua_synchronize(g) == 0, "the interrupted work runs on and finishes");
  gpulua_interrupt(g);
  ok(gpulua_interrupt_clear(g) == 1 && gpulua_interrupt_clear(g) == 0,
     "gpulua_interrupt_clear takes a pending interrupt once");
  ok(gpulua_dostring(g, "gpu.sleep(20); gpu.synchronize()", "=after") == 0, "a cleared interrupt stops nothing");

  /* the sync policy */
  ok(gpulua_sync_debug(g, "error") == 0, "gpulua_sync_debug(\"error\")");
  st = gpulua_dostring(g, "local x = gpu.ones({2}):sum():item()", "=sync");
  ok(st != 0 && contains(gpulua_error(g), "sync"), "then a sync raises: %s", gpulua_error(g));
  gpulua_sync_debug_suspend(g, 1);
  ok(gpulua_dostring(g, "assert(gpu.ones({2}):sum():item() == 2)", "=suspended") == 0,
     "suspended, the sync is allowed");
  gpulua_sync_debug_suspend(g, 0);
  ok(gpulua_dostring(g, "local x = gpu.ones({2}):sum():item()", "=resumed") != 0, "resumed, it raises again");
  st = gpulua_sync_debug(g, "loud");
  ok(st != 0 && contains(gpulua_error(g), "loud"), "an unknown mode fails, naming it: %s", gpulua_error(g));
  ok(gpulua_sync_debug(g, "off") == 0 && gpulua_dostring(g, "local x = gpu.ones({2}):sum():item()", "=off") == 0,
     "\"off\" allows syncs again");
  gpulua_close(g);

  /* not interruptible: gpulua_interrupt does nothing */
  o = (gpulua_options)GPULUA_OPTIONS_INIT;
  o.device = "host";
  g = gpulua_open(&o);
  gpulua_interrupt(g);
  ok(gpulua_interrupt_clear(g) == 0 && gpulua_dostring(g, "gpu.sleep(20); gpu.synchronize()", "=plain") == 0,
     "without interruptible, gpulua_interrupt does nothing");
  gpulua_close(g);

  /* failed and NULL handles */
  o = (gpulua_options)GPULUA_OPTIONS_INIT;
  o.device = "nonsense";
  o.interruptible = 1;
  g = gpulua_open(&o);
  gpulua_interrupt(g);
  gpulua_interrupt(NULL);
  gpulua_sync_debug_suspend(g, 1);
  ok(gpulua_state(g) == NULL && gpulua_backend(g, &device) == NULL && gpulua_backend(NULL, NULL) == NULL &&
     gpulua_interrupt_clear(g) == 0 && gpulua_interrupt_clear(NULL) == 0 && gpulua_sync_debug(g, "warn") != 0 &&
     gpulua_sync_debug(NULL, "warn") != 0,
     "the front-end calls fail harmlessly on a failed or NULL handle");
  gpulua_close(g);
}

int main(void) {
  test_defaults();
  test_frontend();
  test_poll();
  test_errors();
  test_dofile();
  test_two_instances();
  test_bad_options();
  test_options();

  gpulua_close(NULL);
  ok(1, "gpulua_close(NULL) is a no-op");
  ok(gpulua_state(NULL) == NULL && gpulua_error(NULL) != NULL && gpulua_error(NULL)[0] != '\0',
     "a NULL handle has no state and an explaining error");

  return done_testing();
}
