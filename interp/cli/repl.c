/* repl.c — the interactive loop of the gpulua program (lua.c's doREPL):
 * a line is tried first as an expression (`return <line>;`, results printed
 * with print/tostring), then as a statement, reading continuation lines while
 * the parser reports an incomplete statement (an error ending in "<eof>").
 * Errors print with their traceback and the session goes on; end of input
 * (Ctrl-D) ends it.
 *
 * On a terminal, with libedit: line editing, history kept in a file
 * (~/.gpulua_history, env GPULUA_HISTORY), tab completion of globals, fields
 * and methods, and Ctrl-C at the prompt dropping the line.  The prompt names
 * the device: gpu[host]> or gpu[cuda:0]>.  Off a terminal (a program driving
 * `gpulua -i` through pipes) lines are read as they come, no prompt is
 * printed, each result goes to stdout as its statement ends and errors to
 * stderr. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

#ifdef GPULUA_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "cli.h"

#define PROMPT_MAX 64
#define HISTORY_MAX 1000
#define EOFMARK "<eof>"
#define marklen (sizeof(EOFMARK) - 1)

/* What a read gave: a line, the end of input, or Ctrl-C at the prompt. */
enum { READ_EOF = 0, READ_LINE = 1, READ_INTR = -1 };

/* The REPL's state; static because libedit's callbacks and the SIGINT
 * handler take no user data (the program runs one REPL). */
static struct {
  gpulua *g;
  lua_State *L;
  int tty;                     /* stdin is a terminal: prompts, libedit */
  char *history;               /* the history file, NULL for none */
  volatile sig_atomic_t intr;  /* Ctrl-C while reading */
} repl;

static void on_sigint(int sig) {
  (void)sig;
  repl.intr = 1;
}

/* SIGINT while reading: interrupts the read (no SA_RESTART). */
static void catch_sigint(void) {
  struct sigaction sa;
  sa.sa_handler = on_sigint;
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

/* Wait until the terminal has input, or Ctrl-C (-1).  SIGINT is blocked
 * until ppoll unblocks it atomically, so a Ctrl-C that comes just before the
 * wait is not lost. */
static int wait_input(int fd) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &old);
  struct pollfd p = {fd, POLLIN, 0};
  while (!repl.intr && ppoll(&p, 1, NULL, &old) < 0 && errno == EINTR) {
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  return repl.intr ? -1 : 0;
}

/* ---- prompts ------------------------------------------------------------ */

/* "gpu[host]> ", "gpu[cuda:0]> ": the device this interpreter opened. */
static void default_prompt(char *buf, size_t len) {
  int device = 0;
  const char *backend = gpulua_backend(repl.g, &device);
  if (backend == NULL)
    snprintf(buf, len, "gpu> ");
  else if (strcmp(backend, "host") == 0)
    snprintf(buf, len, "gpu[host]> ");
  else
    snprintf(buf, len, "gpu[%s:%d]> ", backend, device);
}

/* _PROMPT / _PROMPT2 when set (through tostring), else the defaults: the
 * continuation prompt "...> " right-aligned under the first.  Pushes the
 * prompt (keeping it anchored) and returns it. */
static const char *push_prompt(lua_State *L, int firstline) {
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") != LUA_TNIL) {
    const char *p = luaL_tolstring(L, -1, NULL);
    lua_remove(L, -2);
    return p;
  }
  lua_pop(L, 1);
  char p[PROMPT_MAX];
  default_prompt(p, sizeof p);
  if (!firstline) {
    int w = (int)strlen(p);
    snprintf(p, sizeof p, "%*s", w > 5 ? w : 5, "...> ");
  }
  return lua_pushstring(L, p);
}

/* ---- history -------------------------------------------------------------- */

#ifdef GPULUA_HAVE_LIBEDIT
/* GPULUA_HISTORY names the file ("" or "0": none), else ~/.gpulua_history. */
static void history_open(void) {
  const char *env = cli_setting("GPULUA_HISTORY");
  const char *home = getenv("HOME");
  stifle_history(HISTORY_MAX);
  if (env != NULL) {
    if (env[0] == '\0' || strcmp(env, "0") == 0)
      return;
    repl.history = strdup(env);
  } else if (home != NULL && home[0] != '\0') {
    size_t n = strlen(home) + sizeof "/.gpulua_history";
    repl.history = malloc(n);
    if (repl.history != NULL)
      snprintf(repl.history, n, "%s/.gpulua_history", home);
  }
  if (repl.history != NULL)
    read_history(repl.history);   /* a missing or unreadable file: no history */
}

/* The whole statement is one entry; the file is rewritten (at most
 * HISTORY_MAX entries), and a file that cannot be written is no error. */
static void saveline(const char *line) {
  if (!repl.tty || line[0] == '\0')
    return;
  add_history(line);
  if (repl.history != NULL)
    write_history(repl.history);
}

static void history_close(void) {
  free(repl.history);
  repl.history = NULL;
}
#else
static void saveline(const char *line) { (void)line; }
static void history_close(void) {}
#endif

/* ---- completion ----------------------------------------------------------- */

#ifdef GPULUA_HAVE_LIBEDIT
static const char *const keywords[] = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
  "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while", NULL};

static int is_ident(const char *s, size_t n) {
  if (n == 0 || (s[0] >= '0' && s[0] <= '9'))
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      return 0;
  }
  return 1;
}

/* Raw reads only: the value's metatable's __index (a table, followed while
 * it is one) and __methods (how gpulua's types list their methods); never
 * calls anything.  Pushes the table or returns 0 pushing nothing. */
static int push_meta_table(lua_State *L, int idx, const char *field) {
  if (!lua_getmetatable(L, idx))
    return 0;
  lua_pushstring(L, field);
  if (lua_rawget(L, -2) == LUA_TTABLE) {
    lua_remove(L, -2);
    return 1;
  }
  lua_pop(L, 2);
  return 0;
}

/* Add to the set at `set` the keys of the table at `t` (and of its
 * metatables' __index tables, a few levels) that start with `word`; methods
 * only: function values. */
static void add_keys(lua_State *L, int set, int t, const char *word, size_t wlen, int methods,
                     const char *prefix, int depth) {
  t = lua_absindex(L, t);
  lua_pushnil(L);
  while (lua_next(L, t)) {
    size_t klen;
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : NULL;
    if (k != NULL && is_ident(k, klen) && klen >= wlen && memcmp(k, word, wlen) == 0 &&
        (k[0] != '_' || word[0] == '_') && (!methods || lua_type(L, -1) == LUA_TFUNCTION)) {
      lua_pushfstring(L, "%s%s", prefix, k);
      lua_pushboolean(L, 1);
      lua_rawset(L, set);
    }
    lua_pop(L, 1);
  }
  if (depth < 8 && push_meta_table(L, t, "__index")) {
    add_keys(L, set, -1, word, wlen, methods, prefix, depth + 1);
    lua_pop(L, 1);
  }
}

/* The candidates for `text` (arg 1) as a set table: globals and keywords for
 * a bare word; after `a.b.` the fields of a.b; after `a.b:` its methods. */
static int collect(lua_State *L) {
  const char *text = luaL_checkstring(L, 1);
  lua_newtable(L);
  int set = lua_gettop(L);
  const char *sep = strpbrk(text, ".:");
  const char *last = text, *p;
  for (p = text; *p; p++)
    if (*p == '.' || *p == ':')
      last = p + 1;
  const char *word = last;
  size_t wlen = strlen(word);
  lua_pushlstring(L, text, (size_t)(word - text));
  const char *prefix = lua_tostring(L, -1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  if (sep == NULL) {
    add_keys(L, set, -1, word, wlen, 0, "", 0);
    for (int i = 0; keywords[i]; i++)
      if (strncmp(keywords[i], word, wlen) == 0) {
        lua_pushboolean(L, 1);
        lua_setfield(L, set, keywords[i]);
      }
    goto done;
  }
  /* walk the path: identifiers joined by '.', only the last separator may be ':' */
  for (p = text;;) {
    const char *e = p + strcspn(p, ".:");
    if ((*e == ':' && e + 1 != word) || !is_ident(p, (size_t)(e - p)))
      goto done;
    lua_pushlstring(L, p, (size_t)(e - p));
    int found = 0;
    for (int depth = 0; depth < 8 && !found; depth++) {
      if (lua_type(L, -2) == LUA_TTABLE) {
        lua_pushvalue(L, -1);
        if (lua_rawget(L, -3) != LUA_TNIL) {
          found = 1;
          break;
        }
        lua_pop(L, 1);
      }
      /* a field behind __index (a table) or among __methods */
      if (!push_meta_table(L, -2, "__index") && !push_meta_table(L, -2, "__methods"))
        break;
      lua_replace(L, -3);
    }
    if (!found)
      goto done;
    lua_replace(L, -3);
    lua_pop(L, 1);
    p = e + 1;
    if (p == word)
      break;
  }
  int v = lua_gettop(L);
  int methods = word[-1] == ':';
  if (lua_type(L, v) == LUA_TTABLE)
    add_keys(L, set, v, word, wlen, methods, prefix, 0);
  else if (push_meta_table(L, v, "__index"))
    add_keys(L, set, -1, word, wlen, methods, prefix, 0);
  if (push_meta_table(L, v, "__methods"))
    add_keys(L, set, -1, word, wlen, methods, prefix, 0);
done:
  lua_settop(L, set);
  return 1;
}

static char **cands;
static int ncands, nextcand;

static void free_cands(void) {
  for (int i = 0; i < ncands; i++)
    free(cands[i]);
  free(cands);
  cands = NULL;
  ncands = 0;
}

static char *cand_gen(const char *text, int state) {
  (void)text;
  if (state == 0)
    nextcand = 0;
  return nextcand < ncands ? strdup(cands[nextcand++]) : NULL;
}

/* libedit's rl_attempted_completion_function: the word under the cursor is
 * `text` (the word breaks leave '.' and ':' in it). */
static char **complete(const char *text, int start, int end) {
  (void)start;
  (void)end;
  lua_State *L = repl.L;
  rl_attempted_completion_over = 1;   /* never file names */
  rl_completion_append_character = '\0';
  free_cands();
  int top = lua_gettop(L);
  lua_pushcfunction(L, collect);
  lua_pushstring(L, text);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK) {
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      n++;
      lua_pop(L, 1);
    }
    cands = calloc((size_t)n + 1, sizeof *cands);
    lua_pushnil(L);
    while (cands != NULL && lua_next(L, -2)) {
      char *c = strdup(lua_tostring(L, -2));
      if (c != NULL)
        cands[ncands++] = c;
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  if (ncands == 0)
    return NULL;
  return rl_completion_matches(text, cand_gen);
}

/* Ctrl-C while libedit waits for a key ends the read (libedit's own signal
 * handling is off): the caller drops the line. */
static int getc_intr(FILE *f) {
  unsigned char c;
  int fd = f != NULL ? fileno(f) : 0;
  for (;;) {
    if (wait_input(fd) < 0)
      return EOF;
    ssize_t n = read(fd, &c, 1);
    if (n == 1)
      return c;
    if (n < 0 && errno == EINTR)
      continue;
    return EOF;
  }
}

/* gpu.trace's writers (json, svg, write, events) are put in the table by
 * the stdlib module gpu.trace, which the table loads on first use through
 * an __index function.  Completion reads tables raw and never calls a
 * function, so it would not see them: the REPL loads the module itself
 * when it starts (protected; a failure only leaves them out). */
static void load_lazy_fields(lua_State *L) {
  int top = lua_gettop(L);
  if (lua_getglobal(L, "require") == LUA_TFUNCTION) {
    lua_pushliteral(L, "gpu.trace");
    lua_pcall(L, 1, 0, 0);
  }
  lua_settop(L, top);
}

static char breaks[] = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^#~";

static void edit_init(void) {
  rl_readline_name = "gpulua";
  rl_catch_signals = 0;
  rl_getc_function = getc_intr;
  rl_attempted_completion_function = complete;
  rl_basic_word_break_characters = breaks;   /* libedit reads this one */
  rl_completer_word_break_characters = breaks;
  rl_completion_append_character = '\0';
  /* a tensor has over 100 methods: t:<TAB><TAB> lists them without asking */
  rl_completion_query_items = 1000;
  using_history();
  history_open();
}
#endif

/* ---- reading ------------------------------------------------------------ */

/* A line without libedit (any length). */
static int read_plain(lua_State *L, const char *prompt) {
  if (prompt != NULL) {
    fputs(prompt, stdout);
    fflush(stdout);
  }
  char *b = NULL;
  size_t cap = 0;
  /* a terminal gives a line per read, so stdin holds nothing buffered here */
  ssize_t n = repl.tty && wait_input(0) < 0 ? -1 : getline(&b, &cap, stdin);
  if (n < 0) {
    free(b);
    if (repl.intr) {
      clearerr(stdin);
      return READ_INTR;
    }
    return READ_EOF;
  }
  if (n > 0 && b[n - 1] == '\n')
    b[--n] = '\0';
  lua_pushlstring(L, b, (size_t)n);   /* memory error: b leaks, the REPL goes */
  free(b);
  return READ_LINE;
}

#ifdef GPULUA_HAVE_LIBEDIT
static int push_cstring(lua_State *L) {
  lua_pushstring(L, (const char *)lua_touserdata(L, 1));
  return 1;
}
#endif

/* Shows the prompt, reads one line and pushes it without its newline. */
static int read_push(lua_State *L, int firstline) {
  const char *prompt = push_prompt(L, firstline);
  /* a Ctrl-C since the last read (while a line compiled, between
   * statements) is not dropped: it cancels this read at once */
  catch_sigint();
  int r;
#ifdef GPULUA_HAVE_LIBEDIT
  if (repl.tty) {
    char *b = readline(prompt);
    if (b == NULL) {
      r = repl.intr ? READ_INTR : READ_EOF;
    } else {
      /* Pushing can raise (memory); do it protected so b is always freed. */
      lua_pushcfunction(L, push_cstring);
      lua_pushlightuserdata(L, b);
      int status = lua_pcall(L, 1, 1, 0);
      free(b);
      if (status != LUA_OK)
        lua_error(L);
      r = READ_LINE;
    }
  } else
#endif
    r = read_plain(L, repl.tty ? prompt : NULL);
  if (r == READ_LINE && repl.intr) {
    lua_pop(L, 1);      /* Ctrl-C came during the read: the line is dropped */
    r = READ_INTR;
  }
  if (r == READ_LINE)
    lua_remove(L, -2);  /* the prompt */
  else
    lua_pop(L, 1);
  if (r == READ_INTR) {
    repl.intr = 0;
    if (repl.tty) {
      fputs("\n", stdout);
      fflush(stdout);
    }
  }
  return r;
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
  int r = read_push(L, firstline);
  if (r != READ_LINE)
    return r;
  const char *b = lua_tostring(L, -1);
  if (firstline && b[0] == '=') {  /* "=expr", as Lua 5.2 */
    lua_pushfstring(L, "return %s", b + 1);
    lua_remove(L, -2);
  }
  return r;
}

/* Try the line as `return <line>;`.  Leaves the compiled chunk, or the
 * original line when that does not compile. */
static int addreturn(lua_State *L) {
  const char *line = lua_tostring(L, -1);
  const char *retline = lua_pushfstring(L, "return %s;", line);
  int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
  if (status == LUA_OK) {
    lua_remove(L, -2);
    saveline(line);
  } else {
    lua_pop(L, 2);
  }
  return status;
}

/* Compile the statement at index 1, adding lines while it is incomplete.
 * Returns the load status, or READ_INTR (Ctrl-C drops the statement). */
static int multiline(lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbuffer(L, line, len, "=stdin");
    if (incomplete(L, status)) {
      int r = pushline(L, 0);
      if (r == READ_LINE) {
        lua_pushliteral(L, "\n");
        lua_insert(L, -2);
        lua_concat(L, 3);
        continue;
      }
      if (r == READ_INTR)
        return READ_INTR;
      /* End of input inside a statement: report it as the parser does. */
      status = luaL_loadbuffer(L, line, len, "=stdin");
    }
    saveline(line);
    return status;
  }
}

/* Read and compile one entry.  Returns READ_EOF - 1 at end of input,
 * READ_INTR when Ctrl-C dropped it, else the load status with the chunk (or
 * error message) alone on the stack. */
#define LOAD_EOF (-2)
static int loadline(lua_State *L) {
  lua_settop(L, 0);
  int r = pushline(L, 1);
  if (r != READ_LINE)
    return r == READ_EOF ? LOAD_EOF : READ_INTR;
  int status = addreturn(L);
  if (status != LUA_OK)
    status = multiline(L);
  if (status == READ_INTR) {
    lua_settop(L, 0);
    return READ_INTR;
  }
  lua_remove(L, 1);  /* the line */
  return status;
}

/* Print every value left on the stack with the global print, as a call that
 * Ctrl-C interrupts (a tensor's values may wait for the device).  Showing a
 * result is what the person asked for: its sync is counted but not warned
 * about. */
static void print_results(gpulua *g) {
  lua_State *L = gpulua_state(g);
  int n = lua_gettop(L);
  if (n > 0) {
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    gpulua_sync_debug_suspend(g, 1);
    lua_getglobal(L, "print");
    lua_insert(L, 1);
    if (cli_docall(g, n, 0) != LUA_OK) {
      fflush(stdout);
      cli_message(NULL, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
    }
    gpulua_sync_debug_suspend(g, 0);
  }
}

/* The tasks the statement queued run before the next prompt.  Once Ctrl-C
 * interrupted that, they stay queued and get one round per statement
 * (gpu.run(0)) until they are done or gpu.run() is called: the prompt does
 * not block on them again. */
static void run_tasks(gpulua *g, int *held) {
  lua_State *L = gpulua_state(g);
  unsigned before = cli_sigints();
  int left = cli_poll(g, *held ? 0 : -1);
  if (left == 0) {
    *held = 0;
  } else if (left < 0) {
    fflush(stdout);
    cli_message(NULL, gpulua_error(g));
    if (cli_sigints() != before) {
      *held = 1;
      cli_message(NULL, "(the tasks stay queued; gpu.run() waits for them)");
    }
  }
  lua_settop(L, 0);
}

int cli_repl_has_libedit(void) {
#ifdef GPULUA_HAVE_LIBEDIT
  return 1;
#else
  return 0;
#endif
}

void cli_repl(gpulua *g, int sync_warn) {
  lua_State *L = gpulua_state(g);
  struct sigaction old;
  sigaction(SIGINT, NULL, &old);
  repl.L = L;
  repl.g = g;
  repl.tty = isatty(0);
  if (sync_warn)
    gpulua_sync_debug(g, "warn");
#ifdef GPULUA_HAVE_LIBEDIT
  if (repl.tty) {
    edit_init();
    load_lazy_fields(L);
  }
#endif
  int status, held = 0;
  while ((status = loadline(L)) != LOAD_EOF) {
    if (status == READ_INTR)
      continue;
    if (status == LUA_OK)
      status = cli_docall(g, 0, LUA_MULTRET);
    if (status == LUA_OK) {
      print_results(g);
    } else {
      fflush(stdout);
      cli_report(L, status, NULL);
    }
    lua_settop(L, 0);
    run_tasks(g, &held);
    fflush(stdout);
  }
  lua_settop(L, 0);
  if (repl.tty)
    fputs("\n", stdout);
  fflush(stdout);
  history_close();
#ifdef GPULUA_HAVE_LIBEDIT
  free_cands();
#endif
  sigaction(SIGINT, &old, NULL);
  repl.L = NULL;
  repl.g = NULL;
}
