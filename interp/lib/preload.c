/* preload.c — registers the embedded stdlib modules (stdlib_modules.h) in
 * package.preload; shared by the runtime (gpulua_open) and gpu.so's
 * luaopen_gpu (interp/module/luamod.c).  Internal to gpulua. */
#include <lauxlib.h>

#include "stdlib_modules.h"

/* package.preload loader of one embedded module; upvalue 1 is its index in
 * stdlib_modules.  Receives (name, extra) from require like a file loader. */
static int stdlib_loader(lua_State *L) {
  lua_Integer i = lua_tointeger(L, lua_upvalueindex(1));
  const struct stdlib_entry *e = &stdlib_modules[i];
  if (luaL_loadbuffer(L, e->src, e->len, e->chunkname) != LUA_OK)
    return lua_error(L);
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

void stdlib_preload(lua_State *L) {
  /* registry._PRELOAD is the table the package library exposes as
   * package.preload, so this works whether or not `package` is open yet. */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (lua_Integer i = 0; stdlib_modules[i].name != NULL; i++) {
    if (lua_getfield(L, -1, stdlib_modules[i].name) == LUA_TNIL) {
      lua_pushinteger(L, i);
      lua_pushcclosure(L, stdlib_loader, 1);
      lua_setfield(L, -3, stdlib_modules[i].name);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}
