/* gpu.Group: a process group, a communicator over some ranks of the job
 * (torch.distributed.new_group, NCCL's ncclCommSplit).  gpu.new_group(ranks)
 * and gpu.split_group(color, key) are collective over the world; every
 * collective takes {group = g}, and g:all_reduce(t) ... are the same calls
 * with the group filled in.  Roots and peers in a group's collectives are
 * ranks of the group (g.rank's numbering), as in NCCL's split communicators. */
#include <stdio.h>
#include <string.h>

#include "common.h"

typedef struct gpu_group {
  const bind_type *tag;
  dev_group *g;            /* NULL: closed, or this rank is not a member */
  int member, closed;
  char label[96];          /* for messages, a non-member's too */
} gpu_group;

static gpu_group *to_group(lua_State *L, int idx) {
  return bind_check_type(L, idx, &bind_group_type, sizeof(gpu_group));
}

dev_group *bind_opt_group(lua_State *L, int idx, const char *fname) {
  if (lua_isnil(L, idx)) return NULL;
  gpu_group *p = bind_test_type(L, idx, &bind_group_type, sizeof(gpu_group));
  if (!p) luaL_error(L, "bad option 'group' (gpu.Group expected, got %s)", bind_typename(L, idx));
  if (p->closed) luaL_error(L, "%s: %s is closed", fname, p->label);
  if (!p->member)
    luaL_error(L, "%s: this rank (%d) is not in %s", fname, dev_comm_rank(bind_ctx(L)), p->label);
  return p->g;
}

/* Split the world with this rank's colour (< 0: none) and key into the
 * handle p (pushed closed, so that a failure leaks nothing). */
static void make(lua_State *L, gpu_group *p, int color, int key, uint64_t agree, const char *name,
                 const char *fname) {
  dev_ctx *ctx = bind_ctx(L);
  bind_call_site(L, ctx, fname);
  dev_group *g;
  BIND_CHECK(L, ctx, dev_group_split(ctx, color, key, agree, name, &g), fname);
  p->g = g;
  p->member = g != NULL;
  p->closed = 0;
  if (g) snprintf(p->label, sizeof p->label, "%s", dev_group_label(g));
}

/* The name option's value at idx: NULL when nil. */
static const char *opt_name(lua_State *L, int idx) {
  if (lua_isnil(L, idx)) return NULL;
  if (lua_type(L, idx) != LUA_TSTRING)
    luaL_error(L, "bad option 'name' (string expected, got %s)", luaL_typename(L, idx));
  return lua_tostring(L, idx);
}

/* The label of a group of these world ranks, as dev_group_split makes it. */
static void list_label(char *out, size_t len, const char *name, const int *r, int n) {
  if (name) {
    snprintf(out, len, "group '%s'", name);
    return;
  }
  size_t at = (size_t)snprintf(out, len, "group {");
  for (int i = 0; i < n; i++) {
    int k = snprintf(out + at, len - at, "%s%d", i ? "," : "", r[i]);
    if (k < 0 || at + (size_t)k + 5 >= len) {
      snprintf(out + (at < len - 5 ? at : len - 5), 5, "...}");
      return;
    }
    at += (size_t)k;
  }
  snprintf(out + at, len - at, "}");
}

/* gpu.new_group(ranks [, {name =}]): ranks a list of distinct ranks of the
 * world (nil: all of them), in the order that numbers the group's ranks.
 * Every rank of the world calls it with the same list. */
static int group_new(lua_State *L) {
  static const char *const names[] = {"name", NULL};
  if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TTABLE);
  int o = bind_read_opts(L, 2, names);
  const char *name = opt_name(L, o);
  int world = bind_ctx_world(L);
  int n = lua_isnoneornil(L, 1) ? world : (int)lua_rawlen(L, 1);
  if (n < 1) luaL_argerror(L, 1, "a group has at least one rank");
  if (n > world) luaL_argerror(L, 1, lua_pushfstring(L, "%d ranks, and the world has %d", n, world));
  int *r = lua_newuserdatauv(L, (size_t)(n + world) * sizeof *r, 0);
  int *seen = r + n;
  memset(seen, 0, (size_t)world * sizeof *seen);
  for (int i = 0; i < n; i++) {
    if (lua_isnoneornil(L, 1)) {
      r[i] = i;
      continue;
    }
    int isint;
    lua_Integer v = (lua_rawgeti(L, 1, i + 1), lua_tointegerx(L, -1, &isint));
    lua_pop(L, 1);
    if (!isint || v < 0 || v >= world)
      luaL_argerror(L, 1, lua_pushfstring(L, "entry %d is not a rank of the world of %d", i + 1, world));
    if (seen[v]++) luaL_argerror(L, 1, lua_pushfstring(L, "rank %d is listed twice", (int)v));
    r[i] = (int)v;
  }
  bind_join(L, "new_group");
  int me = dev_comm_rank(bind_ctx(L)), key = -1;
  /* FNV-1a over the list: every rank must pass the same one */
  uint64_t agree = 1469598103934665603ULL;
  for (int i = 0; i < n; i++) {
    agree = (agree ^ (uint64_t)(r[i] + 1)) * 1099511628211ULL;
    if (r[i] == me) key = i;
  }
  gpu_group *p = bind_new_udata(L, &bind_group_type, sizeof *p, 0);
  p->closed = 1;
  list_label(p->label, sizeof p->label, name, r, n);
  make(L, p, key < 0 ? -1 : 0, key, agree, name, "new_group");
  return 1;
}

/* gpu.split_group(color [, key [, {name =}]]): the ranks that pass the same
 * colour (an integer >= 0) form a group, numbered by key (default: the world
 * rank), ties in world-rank order; color nil: this rank is in none. */
static int group_split(lua_State *L) {
  static const char *const names[] = {"name", NULL};
  int color = -1;
  if (!lua_isnoneornil(L, 1)) {
    lua_Integer c = luaL_checkinteger(L, 1);
    if (c < 0 || c > 0x7fffffff) luaL_argerror(L, 1, "a colour is an integer >= 0 (nil: in no group)");
    color = (int)c;
  }
  lua_Integer key = luaL_optinteger(L, 2, -1);
  if (!lua_isnoneornil(L, 2) && (key < -0x7fffffff || key > 0x7fffffff)) luaL_argerror(L, 2, "key out of range");
  int o = bind_read_opts(L, 3, names);
  const char *name = opt_name(L, o);
  bind_join(L, "split_group");
  if (lua_isnoneornil(L, 2)) key = dev_comm_rank(bind_ctx(L));
  gpu_group *p = bind_new_udata(L, &bind_group_type, sizeof *p, 0);
  p->closed = 1;
  snprintf(p->label, sizeof p->label, name ? "group '%s'" : "a group of gpu.split_group (colour nil)",
           name ? name : "");
  make(L, p, color, (int)key, 0x73706c6974ULL, name, "split_group");
  return 1;
}

/* One release for __gc, __close and g:close(): idempotent.  Queued and
 * captured collectives keep the communicator until they are done. */
static int group_release(lua_State *L) {
  gpu_group *p = to_group(L, 1);
  dev_group *g = p->g;
  p->g = NULL;
  p->closed = 1;
  if (g) dev_group_release(g);
  return 0;
}

/* g.rank, g.size, g.ranks (world ranks, in group-rank order), g.name,
 * g.closed: nil rank, size and ranks on a rank not in the group */
static int group_fields(lua_State *L) {
  gpu_group *p = to_group(L, 1);
  const char *k = bind_check_key(L, 2);
  if (strcmp(k, "closed") == 0) {
    lua_pushboolean(L, p->closed);
    return 1;
  }
  if (strcmp(k, "name") == 0) {
    lua_pushstring(L, p->label);
    return 1;
  }
  if (p->closed && (!strcmp(k, "rank") || !strcmp(k, "size") || !strcmp(k, "ranks")))
    return luaL_error(L, "%s is closed", p->label);
  if (!p->g) {
    lua_pushnil(L);
  } else if (strcmp(k, "rank") == 0) {
    lua_pushinteger(L, dev_group_rank(p->g));
  } else if (strcmp(k, "size") == 0) {
    lua_pushinteger(L, dev_group_size(p->g));
  } else if (strcmp(k, "ranks") == 0) {
    int n = dev_group_size(p->g);
    const int *m = dev_group_members(p->g);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
      lua_pushinteger(L, m[i]);
      lua_rawseti(L, -2, i + 1);
    }
  } else {
    lua_pushnil(L);
  }
  return 1;
}

static int group_tostring(lua_State *L) {
  gpu_group *p = to_group(L, 1);
  if (p->closed) lua_pushfstring(L, "gpu.Group (%s, closed)", p->label);
  else if (!p->g) lua_pushfstring(L, "gpu.Group (%s, this rank not in it)", p->label);
  else lua_pushfstring(L, "gpu.Group (%s, rank %d of %d)", p->label, dev_group_rank(p->g), dev_group_size(p->g));
  return 1;
}

/* g:name(args..., opts): gpu.name(args..., opts with group = g); upvalue 1
 * the gpu function, upvalue 2 the options' position among its arguments. */
static int group_call(lua_State *L) {
  to_group(L, 1);
  int k = (int)lua_tointeger(L, lua_upvalueindex(2));
  lua_settop(L, k + 1);   /* g, the arguments, the options */
  lua_createtable(L, 0, 2);
  if (lua_istable(L, k + 1)) {
    lua_pushnil(L);
    while (lua_next(L, k + 1)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -4);
    }
  } else if (!lua_isnil(L, k + 1)) {
    return luaL_typeerror(L, k + 1, "table");
  }
  lua_pushliteral(L, "group");
  if (lua_rawget(L, -2) != LUA_TNIL) return luaL_error(L, "bad option 'group' (the method is the group's already)");
  lua_pop(L, 1);
  lua_pushvalue(L, 1);
  lua_setfield(L, -2, "group");
  lua_replace(L, k + 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_replace(L, 1);
  lua_call(L, k, LUA_MULTRET);
  return lua_gettop(L);
}

static const luaL_Reg methods[] = {
  {"close", group_release},
  {NULL, NULL}
};

static const luaL_Reg metamethods[] = {
  {"__index", group_fields},
  {"__tostring", group_tostring},
  {"__gc", group_release},
  {"__close", group_release},
  {NULL, NULL}
};

/* the collectives that are also methods, with their options' position */
static const struct { const char *name; int opts; } wrapped[] = {
  {"all_reduce", 2}, {"broadcast", 2}, {"reduce", 2}, {"all_gather", 3}, {"reduce_scatter", 3},
  {"send", 3},       {"recv", 3},      {"barrier", 1}, {NULL, 0}};

int bind_open_group(lua_State *L) {
  bind_newtype(L, &bind_group_type, metamethods, methods);
  /* the wrappers go into the methods table */
  luaL_getmetatable(L, GPULUA_GROUP);
  lua_getfield(L, -1, "__methods");
  for (int i = 0; wrapped[i].name; i++) {
    lua_getfield(L, -3, wrapped[i].name);   /* gpu.<name>, from the gpu table under the metatable */
    lua_pushinteger(L, wrapped[i].opts);
    lua_pushcclosure(L, group_call, 2);
    lua_setfield(L, -2, wrapped[i].name);
  }
  lua_pop(L, 2);
  lua_pushcfunction(L, group_new);
  lua_setfield(L, -2, "new_group");
  lua_pushcfunction(L, group_split);
  lua_setfield(L, -2, "split_group");
  return 0;
}
