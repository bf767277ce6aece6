/* How a Lua type is made: every gpulua type's tag, its metatable (as
 * liolib's createmeta) and the checks on its handles. */
#include <string.h>

#include "common.h"

const bind_type bind_stream_type = {GPULUA_STREAM};
const bind_type bind_event_type = {GPULUA_EVENT};
const bind_type bind_tensor_type = {GPULUA_TENSOR};
const bind_type bind_kernel_type = {GPULUA_KERNEL};
const bind_type bind_launcher_type = {GPULUA_LAUNCHER};
const bind_type bind_module_type = {GPULUA_MODULE};
const bind_type bind_modref_type = {GPULUA_MODREF};
const bind_type bind_modfile_type = {GPULUA_MODFILE};
const bind_type bind_task_type = {GPULUA_TASK};
const bind_type bind_nosync_type = {GPULUA_NOSYNC};
const bind_type bind_range_type = {GPULUA_RANGE};
const bind_type bind_using_type = {GPULUA_USING};
const bind_type bind_npy_file_type = {GPULUA_NPY_FILE};
const bind_type bind_dlpack_type = {GPULUA_DLPACK};
const bind_type bind_state_type = {GPULUA_STATE};
const bind_type bind_graph_type = {GPULUA_GRAPH};
const bind_type bind_group_type = {GPULUA_GROUP};
const bind_type bind_st_header_type = {GPULUA_ST_HEADER};

void *bind_check_type(lua_State *L, int idx, const bind_type *ty, size_t size) {
  void *p = bind_test_type(L, idx, ty, size);
  if (!p) luaL_typeerror(L, idx, ty->name);
  return p;
}

const char *bind_typename(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) return lua_tostring(L, -1);
  if (lua_type(L, idx) == LUA_TLIGHTUSERDATA) return "light userdata";
  return luaL_typename(L, idx);
}

/* __index of every type with methods or fields: upvalue 1 the methods table
 * (a method is one raw get), upvalue 2 the field getter, if any, as a light C
 * function called directly, so that its errors read as __index's own. */
static int type_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  lua_pop(L, 1);
  lua_CFunction fields = lua_tocfunction(L, lua_upvalueindex(2));
  if (fields) return fields(L);
  lua_pushnil(L);
  return 1;
}

void bind_newtype(lua_State *L, const bind_type *ty, const luaL_Reg *meta, const luaL_Reg *methods) {
  if (luaL_newmetatable(L, ty->name)) {
    lua_CFunction fields = NULL;
    for (const luaL_Reg *r = meta; r && r->name; r++) {
      if (strcmp(r->name, "__index") == 0) {
        fields = r->func;
        continue;
      }
      lua_pushcfunction(L, r->func);
      lua_setfield(L, -2, r->name);
    }
    if (methods || fields) {
      int n = 0;
      while (methods && methods[n].name) n++;
      lua_createtable(L, 0, n);
      if (methods) luaL_setfuncs(L, methods, 0);
      lua_pushvalue(L, -1);
      lua_setfield(L, -3, "__methods");
      if (fields) lua_pushcfunction(L, fields);
      lua_pushcclosure(L, type_index, fields ? 2 : 1);
      lua_setfield(L, -2, "__index");
    }
  }
  /* also under ty's address: bind_new_udata finds it without a string */
  lua_rawsetp(L, LUA_REGISTRYINDEX, ty);
}

void *bind_new_udata(lua_State *L, const bind_type *ty, size_t size, int nuv) {
  void *p = lua_newuserdatauv(L, size, nuv);
  memset(p, 0, size);
  *(const bind_type **)p = ty;
  lua_rawgetp(L, LUA_REGISTRYINDEX, ty);
  lua_setmetatable(L, -2);
  return p;
}
