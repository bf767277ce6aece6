/* Ranks and collectives: gpu.rank, gpu.world_size, gpu.local_rank,
 * gpu.local_world_size; gpu.all_reduce, broadcast, reduce, all_gather,
 * reduce_scatter, send, recv, group, barrier, init_comm; each collective's
 * {group =} a process group of bindings/group.c.  The job comes from
 * the environment, as torchrun and `gpulua -n` set it (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or Slurm's; the
 * communicator is joined on first use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "../cuda/util.h"

/* registry keys by address */
static const char group_key = 0;   /* the open gpu.group's pending sends/receives */

typedef struct job {
  dev_rank_info ri;
  char bad[200];                   /* what is wrong with the environment, if anything */
} job;

/* MASTER_PORT: 1 and *out, 0 when unset, -1 when not a port number. */
static int env_port(long *out) {
  const char *v = getenv("MASTER_PORT");
  if (!v || !*v) return 0;
  char *end;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 65535) return -1;
  *out = x;
  return 1;
}

/* A decimal number of seconds > 0 ("300", "2.5", "1e3"): 0 and *out, or -1.
 * strtod alone would take " 10", "inf", "nan", "0x10" and ignore "10s"'s s. */
static int env_seconds(const char *v, double *out) {
  if (!((*v >= '0' && *v <= '9') || *v == '.')) return -1;
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end) return -1;
  for (const char *p = v; p < end; p++)
    if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-'))
      return -1;
  if (!isfinite(x) || !(x > 0)) return -1;
  *out = x;
  return 0;
}

static void read_job(job *j) {
  memset(j, 0, sizeof *j);
  dev_rank_info *ri = &j->ri;
  long rank = 0, world = 1, lrank = 0, lworld = -1, port = 29500;
  long *dst[] = {[DEV_JOB_RANK] = &rank, [DEV_JOB_WORLD] = &world, [DEV_JOB_LOCAL_RANK] = &lrank,
                 [DEV_JOB_LOCAL_WORLD] = &lworld};
  for (int i = 0; i < 4; i++) {
    const char *var;
    if (dev_job_env((dev_job_var)i, dst[i], &var) < 0)
      snprintf(j->bad, sizeof j->bad, "%s='%s' is not a non-negative integer", var, getenv(var));
  }
  if (lworld < 0) lworld = world;
  if (!j->bad[0] && world < 1) snprintf(j->bad, sizeof j->bad, "WORLD_SIZE=%ld: a job has at least one rank", world);
  if (!j->bad[0] && rank >= world) snprintf(j->bad, sizeof j->bad, "RANK=%ld is not below WORLD_SIZE=%ld", rank, world);
  if (!j->bad[0] && (lworld < 1 || lrank >= lworld))
    snprintf(j->bad, sizeof j->bad, "LOCAL_RANK=%ld is not below LOCAL_WORLD_SIZE=%ld", lrank, lworld);
  if (!j->bad[0] && env_port(&port) < 0)
    snprintf(j->bad, sizeof j->bad, "MASTER_PORT='%s' is not a port number", getenv("MASTER_PORT"));
  ri->rank = (int)rank;
  ri->world = (int)world;
  ri->local_rank = (int)lrank;
  ri->local_world = (int)lworld;
  ri->master_port = (int)port;
  const char *addr = getenv("MASTER_ADDR");
  snprintf(ri->master_addr, sizeof ri->master_addr, "%s", addr && *addr ? addr : "127.0.0.1");
  const char *t = env_setting("GPULUA_COMM_TIMEOUT");
  ri->timeout_s = 300;
  if (t && *t && env_seconds(t, &ri->timeout_s) && !j->bad[0])
    snprintf(j->bad, sizeof j->bad, "GPULUA_COMM_TIMEOUT='%s' is not a number of seconds > 0", t);
  /* the per-collective check across ranks: GPULUA_COMM_CHECK on or off,
   * else (-1) the backend's default (on for host, off for cuda) */
  char why[160];
  ri->check = -1;
  if (env_flag("GPULUA_COMM_CHECK", &ri->check, why, sizeof why) && !j->bad[0])
    snprintf(j->bad, sizeof j->bad, "%s", why);
}

/* Collectives of the whole job do not mix with a group's sends and receives. */
static void no_group(lua_State *L, const char *fname) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &group_key);
  int open = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (open) luaL_error(L, "%s cannot be grouped: a gpu.group holds sends and receives only", fname);
}

/* Join the job; with defer, NCCL's communicator waits for the first
 * collective.  A later gpu.init_comm (no defer) creates it and applies its
 * options, the timeout and check options' values at slots o and o + 1 (o 0:
 * none). */
static void join(lua_State *L, const char *fname, int o, int defer) {
  dev_ctx *ctx = bind_ctx(L);
  if (dev_comm_ready(ctx) && defer) return;
  job j;
  read_job(&j);
  j.ri.defer = defer;
  if (j.bad[0]) luaL_error(L, "%s: cannot join the job: %s", fname, j.bad);
  if (o && !lua_isnil(L, o)) {
    if (!lua_isnumber(L, o) || !(lua_tonumber(L, o) > 0))
      luaL_error(L, "bad option 'timeout' (seconds > 0 expected, got %s)", luaL_tolstring(L, o, NULL));
    j.ri.timeout_s = lua_tonumber(L, o);
  }
  if (o && !lua_isnil(L, o + 1)) j.ri.check = lua_toboolean(L, o + 1);
  bind_where_arm(L, ctx);
  bind_site(L, ctx);
  BIND_CHECK(L, ctx, dev_comm_init(ctx, &j.ri), fname);
}

void bind_join(lua_State *L, const char *fname) { join(L, fname, 0, 1); }

/* gpu.init_comm{timeout =, check =}: join now rather than at the first collective */
static int comm_init(lua_State *L) {
  static const char *const names[] = {"timeout", "check", NULL};
  join(L, "init_comm", bind_read_opts(L, 1, names), 0);
  return 0;
}

/* The op option's value at idx (nil: sum), in dev_cred's order. */
static dev_cred check_red(lua_State *L, int idx) {
  static const char *const names[] = {"sum", "prod", "max", "min", "avg", NULL};
  return (dev_cred)bind_check_option(L, idx, "op", DEV_CRED_SUM, names);
}

/* The rank at idx, of group g (NULL: the world); else -1, and *why says
 * what is wrong with the value (in Lua's own words where it has them: 0.5
 * is a number with no integer representation, not "no rank number"). */
static int rank_at(lua_State *L, int idx, dev_group *g, const char **why) {
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  *why = NULL;
  if (!isint) {
    *why = lua_type(L, idx) == LUA_TNUMBER
               ? "number has no integer representation"
               : lua_pushfstring(L, "a rank number expected, got %s", luaL_typename(L, idx));
    return -1;
  }
  int world = g ? dev_group_size(g) : bind_ctx_world(L);
  if (v < 0 || v >= world) {
    *why = g ? lua_pushfstring(L, "%I is not a rank of %s: it has %d", v, dev_group_label(g), world)
             : lua_pushfstring(L, "%I is not a rank: the world has %d", v, world);
    return -1;
  }
  return (int)v;
}

/* Argument arg, a rank: "bad argument #2 to 'send' (...)" as luaL_check*. */
static int check_rank_arg(lua_State *L, int arg, dev_group *g) {
  luaL_checkinteger(L, arg);   /* Lua's messages for a non-number and for 0.5 */
  const char *why;
  int r = rank_at(L, arg, g, &why);
  if (why) luaL_argerror(L, arg, why);
  return r;
}

/* The rank option's value at idx (nil: dflt). */
static int opt_rank(lua_State *L, int idx, const char *field, int dflt, dev_group *g) {
  if (lua_isnil(L, idx)) return dflt;
  const char *why;
  int r = rank_at(L, idx, g, &why);
  if (why) luaL_error(L, "bad option '%s' (%s)", field, why);
  return r;
}

/* The out option's value at idx: idx, or 0 when nil. */
static int opt_out(lua_State *L, int idx) {
  if (lua_isnil(L, idx)) return 0;
  if (!bind_test_tensor_handle(L, idx))
    luaL_error(L, "bad option 'out' (gpu.Tensor expected, got %s)", bind_typename(L, idx));
  return idx;
}

/* The name a failed collective is raised with (BIND_CHECK's fname, taken
 * after the failure): none when the device layer's message starts with the
 * collective's name already. */
static const char *coll_name(dev_ctx *ctx, const char *fname) {
  const char *msg = dev_errmsg(ctx);
  size_t n = strlen(fname);
  return strncmp(msg, fname, n) == 0 && msg[n] == ':' ? NULL : fname;
}

/* Enqueue one collective: tensors at stack indices si (send) and ri (recv),
 * on the stream option's value at stream (nil: the current stream), fetched
 * here after the last Lua allocation. */
static void enqueue(lua_State *L, const char *fname, dev_coll *c, int si, int ri, int stream) {
  dev_stream *s = bind_stream(L, stream);
  dev_ctx *ctx = dev_stream_ctx(s);
  if (si) c->send = bind_check_tensor(L, si)->v;
  if (ri) c->recv = bind_check_tensor(L, ri)->v;
  bind_site(L, ctx);
  BIND_CHECK(L, ctx, dev_collective(ctx, s, c, 1), coll_name(ctx, fname));
}

/* gpu.all_reduce(t, {op =, out =, stream =, group =}) -> out or t */
static int comm_all_reduce(lua_State *L) {
  static const char *const names[] = {"op", "out", "stream", "group", NULL};
  bind_check_tensor(L, 1);
  int o = bind_read_opts(L, 2, names);
  no_group(L, "all_reduce");
  join(L, "all_reduce", 0, 1);
  dev_coll c = {.kind = DEV_COLL_ALL_REDUCE, .red = check_red(L, o), .group = bind_opt_group(L, o + 3, "all_reduce")};
  int out = opt_out(L, o + 1);
  enqueue(L, "all_reduce", &c, 1, out ? out : 1, o + 2);
  lua_pushvalue(L, out ? out : 1);
  return 1;
}

/* gpu.broadcast(t, {root =, out =, stream =, group =}): root's t to every rank's t (or out) */
static int comm_broadcast(lua_State *L) {
  static const char *const names[] = {"root", "out", "stream", "group", NULL};
  bind_check_tensor(L, 1);
  int o = bind_read_opts(L, 2, names);
  no_group(L, "broadcast");
  join(L, "broadcast", 0, 1);
  dev_group *g = bind_opt_group(L, o + 3, "broadcast");
  dev_coll c = {.kind = DEV_COLL_BROADCAST, .peer = opt_rank(L, o, "root", 0, g), .group = g};
  int out = opt_out(L, o + 1);
  enqueue(L, "broadcast", &c, 1, out ? out : 1, o + 2);
  lua_pushvalue(L, out ? out : 1);
  return 1;
}

/* gpu.reduce(t, {op =, root =, out =, stream =, group =}): the result on root only */
static int comm_reduce(lua_State *L) {
  static const char *const names[] = {"op", "root", "out", "stream", "group", NULL};
  bind_check_tensor(L, 1);
  int o = bind_read_opts(L, 2, names);
  no_group(L, "reduce");
  join(L, "reduce", 0, 1);
  dev_group *g = bind_opt_group(L, o + 4, "reduce");
  dev_coll c = {.kind = DEV_COLL_REDUCE, .red = check_red(L, o), .peer = opt_rank(L, o + 1, "root", 0, g), .group = g};
  int out = opt_out(L, o + 2);
  enqueue(L, "reduce", &c, 1, out ? out : 1, o + 3);
  lua_pushvalue(L, out ? out : 1);
  return 1;
}

/* gpu.all_gather(out, t, {stream =, group =}): out holds every rank's t, in rank order */
static int comm_all_gather(lua_State *L) {
  bind_check_tensor(L, 1);
  bind_check_tensor(L, 2);
  static const char *const names[] = {"stream", "group", NULL};
  int o = bind_read_opts(L, 3, names);
  no_group(L, "all_gather");
  join(L, "all_gather", 0, 1);
  dev_coll c = {.kind = DEV_COLL_ALL_GATHER, .group = bind_opt_group(L, o + 1, "all_gather")};
  enqueue(L, "all_gather", &c, 2, 1, o);
  lua_settop(L, 1);
  return 1;
}

/* gpu.reduce_scatter(out, t, {op =, stream =, group =}): rank r gets block r of the
 * reduction of every rank's t */
static int comm_reduce_scatter(lua_State *L) {
  bind_check_tensor(L, 1);
  bind_check_tensor(L, 2);
  static const char *const names[] = {"op", "stream", "group", NULL};
  int o = bind_read_opts(L, 3, names);
  no_group(L, "reduce_scatter");
  join(L, "reduce_scatter", 0, 1);
  dev_coll c = {.kind = DEV_COLL_REDUCE_SCATTER, .red = check_red(L, o),
                .group = bind_opt_group(L, o + 2, "reduce_scatter")};
  enqueue(L, "reduce_scatter", &c, 2, 1, o + 1);
  lua_settop(L, 1);
  return 1;
}

/* ---- send, recv and groups -------------------------------------------------- */

/* Inside gpu.group: {kind, tensor, peer, stream handle or false, process
 * group handle or false} appended to the group's list; outside: enqueued at
 * once as a group of one. */
static int p2p(lua_State *L, dev_coll_kind kind, const char *fname) {
  bind_check_tensor(L, 1);
  /* the arguments in order, and all of them before joining the job */
  luaL_checkinteger(L, 2);
  static const char *const names[] = {"stream", "group", NULL};
  int o = bind_read_opts(L, 3, names);
  join(L, fname, 0, 1);
  dev_group *pg = bind_opt_group(L, o + 1, fname);
  int peer = check_rank_arg(L, 2, pg);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &group_key);
  if (lua_istable(L, -1)) {
    int list = lua_gettop(L);
    lua_createtable(L, 4, 0);
    lua_pushinteger(L, kind);
    lua_rawseti(L, -2, 1);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 2);
    lua_pushinteger(L, peer);
    lua_rawseti(L, -2, 3);
    if (!lua_isnil(L, o)) {
      if (!bind_test_stream(L, o))
        luaL_error(L, "bad option 'stream' (gpu.Stream expected, got %s)", bind_typename(L, o));
      lua_pushvalue(L, o);
    } else {
      lua_pushboolean(L, 0);
    }
    lua_rawseti(L, -2, 4);
    if (pg) lua_pushvalue(L, o + 1);
    else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, 5);
    lua_rawseti(L, list, (lua_Integer)lua_rawlen(L, list) + 1);
    lua_settop(L, 1);
    return 1;
  }
  lua_pop(L, 1);
  dev_coll c = {.kind = kind, .peer = peer, .group = pg};
  enqueue(L, fname, &c, kind == DEV_COLL_SEND ? 1 : 0, kind == DEV_COLL_RECV ? 1 : 0, o);
  lua_settop(L, 1);
  return 1;
}

static int comm_send(lua_State *L) { return p2p(L, DEV_COLL_SEND, "send"); }
static int comm_recv(lua_State *L) { return p2p(L, DEV_COLL_RECV, "recv"); }

/* Enqueue the pending list at idx as one group. */
static void flush_group(lua_State *L, int list) {
  int n = (int)lua_rawlen(L, list);
  if (n == 0) return;
  dev_coll *g = lua_newuserdatauv(L, (size_t)n * sizeof *g, 0);
  memset(g, 0, (size_t)n * sizeof *g);
  /* one stream for all: named by each (the same), or by none; the list
   * keeps the streams alive */
  gpu_stream *named = NULL;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, list, i);
    lua_rawgeti(L, -1, 4);
    gpu_stream *p = lua_toboolean(L, -1) ? bind_test_stream(L, -1) : NULL;
    if (i > 1 && p != named) luaL_error(L, "gpu.group: every send and recv of a group goes on one stream");
    named = p;
    lua_pop(L, 2);
  }
  /* the stream of the group, then the tensors: after the last allocation */
  dev_stream *s;
  if (named) {
    if (!named->s) luaL_error(L, "gpu.group: the group's stream is closed");
    s = named->s;
  } else {
    s = bind_stream(L, 0);
  }
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, list, i);
    lua_rawgeti(L, -1, 1);
    g[i - 1].kind = (dev_coll_kind)lua_tointeger(L, -1);
    lua_rawgeti(L, -2, 3);
    g[i - 1].peer = (int)lua_tointeger(L, -1);
    lua_rawgeti(L, -3, 2);
    gpu_tensor *t = bind_test_tensor_handle(L, -1);
    if (!t || !t->v.buf) luaL_error(L, "gpu.group: %s #%d: tensor is closed", dev_coll_name(g[i - 1].kind), i);
    if (g[i - 1].kind == DEV_COLL_SEND) g[i - 1].send = t->v;
    else g[i - 1].recv = t->v;
    /* the process group: closed since the call? */
    lua_rawgeti(L, -4, 5);
    if (lua_toboolean(L, -1)) g[i - 1].group = bind_opt_group(L, -1, "gpu.group");
    lua_pop(L, 5);
  }
  dev_ctx *ctx = dev_stream_ctx(s);
  bind_site(L, ctx);
  BIND_CHECK(L, ctx, dev_collective(ctx, s, g, n), coll_name(ctx, "group"));
}

static int group_body(lua_State *L) {
  lua_pushvalue(L, 1);
  lua_call(L, 0, 0);
  return 0;
}

/* gpu.group(fn): the sends and receives fn makes run together, as NCCL's
 * ncclGroupStart/End, so a ring exchange cannot deadlock. */
static int comm_group(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &group_key);
  if (!lua_isnil(L, -1)) {
    /* nested: the outer group collects */
    lua_pop(L, 1);
    lua_call(L, 0, 0);
    return 0;
  }
  lua_pop(L, 1);
  lua_newtable(L);
  int list = lua_gettop(L);
  lua_pushvalue(L, list);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &group_key);
  lua_pushcfunction(L, group_body);
  lua_pushvalue(L, 1);
  int rc = lua_pcall(L, 1, 0, 0);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &group_key);
  if (rc != LUA_OK) return lua_error(L);   /* nothing of the group was enqueued */
  flush_group(L, list);
  return 0;
}

/* gpu.barrier({group =}): every rank's host gets here before any goes on (a 1-element
 * all_reduce on the current stream, then a wait for it: a counted sync). */
static int comm_barrier(lua_State *L) {
  static const char *const names[] = {"group", NULL};
  int o = bind_read_opts(L, 1, names);
  no_group(L, "barrier");
  join(L, "barrier", 0, 1);
  dev_group *pg = bind_opt_group(L, o, "barrier");
  dev_ctx *ctx = bind_ctx(L);
  dev_stream *s = bind_stream(L, 0);
  /* a bare buffer: the device layer keeps it until the all_reduce is done */
  dev_buf *b;
  BIND_CHECK(L, ctx, dev_buf_alloc(ctx, DEV_MEM_DEVICE, 1, &b), "barrier");
  int64_t one = 1;
  dev_coll c = {.kind = DEV_COLL_ALL_REDUCE, .red = DEV_CRED_MAX, .group = pg};
  c.send.buf = b;
  c.send.dtype = DEV_U8;
  dev_view_set_contiguous(&c.send, 1, &one);
  c.recv = c.send;
  bind_site(L, ctx);
  int rc = dev_memset(ctx, s, b, 0, 0, 1);
  if (rc == DEV_OK) rc = dev_collective(ctx, s, &c, 1);
  dev_buf_release(b);
  BIND_CHECK(L, ctx, rc, coll_name(ctx, "barrier"));
  bind_call_site(L, ctx, "barrier");
  BIND_CHECK(L, ctx, dev_stream_synchronize(s), "barrier");
  return 0;
}

static const luaL_Reg comm_funcs[] = {
  {"init_comm", comm_init},
  {"all_reduce", comm_all_reduce},
  {"broadcast", comm_broadcast},
  {"reduce", comm_reduce},
  {"all_gather", comm_all_gather},
  {"reduce_scatter", comm_reduce_scatter},
  {"send", comm_send},
  {"recv", comm_recv},
  {"group", comm_group},
  {"barrier", comm_barrier},
  {NULL, NULL}
};

int bind_ctx_world(lua_State *L) {
  dev_ctx *ctx = bind_ctx(L);
  if (dev_comm_ready(ctx)) return dev_comm_world(ctx);
  job j;
  read_job(&j);
  return j.ri.world;
}

int bind_open_comm(lua_State *L) {
  job j;
  read_job(&j);
  /* plain fields: a script reads them as often as it likes */
  lua_pushinteger(L, j.ri.rank);
  lua_setfield(L, -2, "rank");
  lua_pushinteger(L, j.ri.world);
  lua_setfield(L, -2, "world_size");
  lua_pushinteger(L, j.ri.local_rank);
  lua_setfield(L, -2, "local_rank");
  lua_pushinteger(L, j.ri.local_world);
  lua_setfield(L, -2, "local_world_size");
  luaL_setfuncs(L, comm_funcs, 0);
  /* Under `gpulua -n` every rank starts, so each joins the job at once (on
   * cuda, NCCL's communicator still waits for the first collective): then a
   * rank whose script ends (or dies) before a collective its peers wait in is
   * seen to be gone, at once, instead of after the timeout. */
  const char *launched = getenv("GPULUA_LAUNCHER");
  if (launched && *launched && strcmp(launched, "0") != 0 && !j.bad[0] && j.ri.world > 1 &&
      j.ri.local_world == j.ri.world)
    join(L, "gpu", 0, 1);
  return 0;
}
