/* repl.c — the interactive loop of the gpulua program (lua.c's doREPL):
 * a line is tried first as an expression (`return <line>;`, results printed
 * with print/tostring), then as a statement, reading continuation lines while
 * the parser reports an incomplete statement (an error ending in "<eof>").
 * Errors print with their traceback and the session goes on; end of input
 * (Ctrl-D) ends it.  Line editing and history come from libedit when the build
 * found it, otherwise lines are read with fgets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#ifdef GPULUA_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "bindings.h"
#include "cli.h"

#define PROMPT "> "
#define PROMPT2 ">> "
#define MAXINPUT 512   /* line length without libedit (as lua.c) */

#define EOFMARK "<eof>"
#define marklen (sizeof(EOFMARK) - 1)

static void saveline(const char *line) {
#ifdef GPULUA_HAVE_LIBEDIT
  add_history(line);
#else
  (void)line;
#endif
}

#ifdef GPULUA_HAVE_LIBEDIT
static int push_cstring(lua_State *L) {
  lua_pushstring(L, (const char *)lua_touserdata(L, 1));
  return 1;
}
#endif

/* Shows prompt, reads one line and pushes it without its newline.  Returns 0
 * at end of input. */
static int readline_push(lua_State *L, const char *prompt) {
#ifdef GPULUA_HAVE_LIBEDIT
  char *b = readline(prompt);
  if (b == NULL)
    return 0;
  /* Pushing can raise (memory); do it protected so b is always freed. */
  lua_pushcfunction(L, push_cstring);
  lua_pushlightuserdata(L, b);
  int status = lua_pcall(L, 1, 1, 0);
  free(b);
  if (status != LUA_OK)
    lua_error(L);
  return 1;
#else
  char b[MAXINPUT];
  fputs(prompt, stdout);
  fflush(stdout);
  if (fgets(b, sizeof b, stdin) == NULL)
    return 0;
  size_t l = strlen(b);
  if (l > 0 && b[l - 1] == '\n')
    b[--l] = '\0';
  lua_pushlstring(L, b, l);
  return 1;
#endif
}

/* _PROMPT / _PROMPT2 when set (through tostring), else the defaults; the
 * string stays on the stack to keep it anchored. */
static const char *get_prompt(lua_State *L, int firstline) {
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") == LUA_TNIL)
    return firstline ? PROMPT : PROMPT2;
  const char *p = luaL_tolstring(L, -1, NULL);
  lua_remove(L, -2);
  return p;
}

/* A syntax error whose message ends in "<eof>": the statement goes on. */
static int incomplete(lua_State *L, int status) {
  if (status == LUA_ERRSYNTAX) {
    size_t lmsg;
    const char *msg = lua_tolstring(L, -1, &lmsg);
    if (lmsg >= marklen && strcmp(msg + lmsg - marklen, EOFMARK) == 0) {
      lua_pop(L, 1);
      return 1;
    }
  }
  return 0;
}

static int pushline(lua_State *L, int firstline) {
  const char *prompt = get_prompt(L, firstline);
  if (!readline_push(L, prompt))
    return 0;  /* the caller clears the prompt */
  lua_remove(L, -2);  /* the prompt */
  const char *b = lua_tostring(L, -1);
  if (firstline && b[0] == '=') {  /* "=expr", as Lua 5.2 */
    lua_pushfstring(L, "return %s", b + 1);
    lua_remove(L, -2);
  }
  return 1;
}

/* Try the line as `return <line>;`.  Leaves the compiled chunk, or the
 * original line when that does not compile. */
static int addreturn(lua_State *L) {
  const char *line = lua_tostring(L, -1);
  const char *retline = lua_pushfstring(L, "return %s;", line);
  int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
  if (status == LUA_OK) {
    lua_remove(L, -2);
    if (line[0] != '\0')
      saveline(line);
  } else {
    lua_pop(L, 2);
  }
  return status;
}

/* Compile the statement at index 1, adding lines while it is incomplete. */
static int multiline(lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbuffer(L, line, len, "=stdin");
    if (incomplete(L, status)) {
      if (pushline(L, 0)) {
        lua_pushliteral(L, "\n");
        lua_insert(L, -2);
        lua_concat(L, 3);
        continue;
      }
      /* End of input inside a statement: report it as the parser does. */
      lua_pop(L, 1);  /* the prompt */
      status = luaL_loadbuffer(L, line, len, "=stdin");
    }
    saveline(line);
    return status;
  }
}

/* Read and compile one entry.  Returns -1 at end of input, else the load
 * status with the chunk (or error message) alone on the stack. */
static int loadline(lua_State *L) {
  lua_settop(L, 0);
  if (!pushline(L, 1))
    return -1;
  int status = addreturn(L);
  if (status != LUA_OK)
    status = multiline(L);
  lua_remove(L, 1);  /* the line */
  return status;
}

/* gpu.sync_debug(mode), protected; returns the previous mode (a static
 * string), or NULL when it could not be called. */
static const char *swap_sync_debug(lua_State *L, const char *mode) {
  static const char *const modes[] = {"off", "warn", "error"};
  const char *old = NULL;
  int top = lua_gettop(L);
  lua_pushcfunction(L, gpulua_bind_sync_debug);
  lua_pushstring(L, mode);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_type(L, -1) == LUA_TSTRING)
    for (int i = 0; i < 3; i++)
      if (strcmp(lua_tostring(L, -1), modes[i]) == 0) old = modes[i];
  lua_settop(L, top);
  return old;
}

/* Print every value left on the stack with the global print.  Showing a
 * result is what the person asked for: its sync (a tensor's values) is
 * counted but not warned about. */
static void print_results(lua_State *L) {
  int n = lua_gettop(L);
  if (n > 0) {
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    gpulua_bind_sync_suspend(L, 1);
    lua_getglobal(L, "print");
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
      cli_message(NULL, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
    gpulua_bind_sync_suspend(L, 0);
  }
}

void cli_repl(gpulua *g, int sync_warn) {
  lua_State *L = gpulua_state(g);
  int status;
  if (sync_warn)
    swap_sync_debug(L, "warn");
#ifdef GPULUA_HAVE_LIBEDIT
  rl_readline_name = "gpulua";
  using_history();
#endif
  while ((status = loadline(L)) != -1) {
    if (status == LUA_OK)
      status = cli_docall(g, 0, LUA_MULTRET);
    if (status == LUA_OK)
      print_results(L);
    else
      cli_report(L, status, NULL);
    /* tasks the statement queued run before the next prompt */
    lua_settop(L, 0);
    cli_run_tasks(g);
  }
  lua_settop(L, 0);
  fputs("\n", stdout);
  fflush(stdout);
}
