/* main.c — the gpulua program: `gpulua [options] [script [args]]`.
 *
 * Modelled on Lua 5.4's lua.c (same options, `arg` table, LUA_INIT, exit
 * status) with the state made through the embedding API (gpulua_open), so the
 * program runs the same path as an embedding application.  Differences from
 * lua.c: --device; an error in a chunk read from stdin also exits 1; queued
 * device work is finished before exit (os.exit's too) and an asynchronous
 * failure exits 1.
 * `gpulua -n N script.lua` runs the script on N ranks (launch.c). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "cli.h"
#include "gpulua.h"
#include "launch.h"

/* The program's name in messages: argv[0] without its directories (lua.c
 * uses argv[0] whole; the name alone reads the same whether the program was
 * found on PATH or given by its path, and under the launcher). */
const char *cli_progname = "gpulua";

/* -E: gpulua's own GPULUA_* settings are ignored too, as lua.c ignores LUA_* */
static int cli_noenv;

const char *cli_setting(const char *name) {
  return cli_noenv ? NULL : getenv(name);
}

/* bits of `args` (as lua.c) */
#define has_error 1   /* bad option */
#define has_i 2       /* -i */
#define has_v 4       /* -v */
#define has_e 8       /* -e */
#define has_E 16      /* -E */
#define has_l 32      /* -l */
#define has_h 64      /* -h, --help */

#define LUA_INIT_VAR "LUA_INIT"
#define LUA_INITVARVERSION LUA_INIT_VAR LUA_VERSUFFIX

struct cli {
  int argc;
  char **argv;
  int script;   /* index of the script in argv, 0 if none, -1 if no argv[0] */
  int args;     /* has_* bits */
  gpulua *g;
  const char *sync_debug;   /* --sync-debug MODE, or NULL */
  int repl_tty;             /* a REPL session on a terminal runs or ran */
};

/* The interpreter and its state the SIGINT handler interrupts (a signal
 * handler has no other way to find them; the program has one interpreter). */
static lua_State *globalL = NULL;
static gpulua *globalg = NULL;
static volatile sig_atomic_t sigints;   /* Ctrl-Cs cli_docall took */

static void setsignal(int sig, void (*handler)(int), struct sigaction *old) {
  struct sigaction sa;
  sa.sa_handler = handler;
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, old);
}

/* The interrupt reaches Lua code here, unless a wait for the device took it
 * first (it raised "interrupted" itself). */
static void lstop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  if (gpulua_interrupt_clear(globalg))
    luaL_error(L, "interrupted!");
}

/* Ctrl-C: a second one kills the program; the first interrupts a wait for
 * the device in progress and sets a hook that raises at the next Lua
 * instruction, whichever comes first. */
static void laction(int sig) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  setsignal(sig, SIG_DFL, NULL);
  sigints++;
  gpulua_interrupt(globalg);
  lua_sethook(globalL, lstop, flag, 1);
}

static void print_usage_lines(FILE *f) {
  fprintf(f,
          "usage: %s [options] [script [args]]\n"
          "       %s -n N [launcher options] [options] script [args]\n"
          "Available options are:\n"
          "  -e stat        execute string 'stat'\n"
          "  -i             enter interactive mode after executing 'script'\n"
          "  -l mod         require library 'mod' into global 'mod'\n"
          "  -l g=mod       require library 'mod' into global 'g'\n"
          "  -v             show version information\n"
          "  -h, --help     show this help and exit\n"
          "  -E             ignore environment variables (LUA_INIT, LUA_PATH, LUA_CPATH, GPULUA_*)\n"
          "  -W             turn warnings on\n"
          "  --device DEV   run on DEV: host, cuda, cuda:N or auto (cuda if a GPU answers,\n"
          "                 else host); default: env GPULUA_DEVICE, else auto\n"
          "  --sync-debug M what a host-device sync does: off, warn or error (default: env\n"
          "                 GPULUA_SYNC_DEBUG, else warn in the REPL and off in scripts)\n"
          "  --trace FILE   write a timeline of every op at exit: FILE.json (Chrome trace\n"
          "                 events: ui.perfetto.dev) or FILE.svg (default: env GPULUA_TRACE)\n"
          "  --check races  fail an op that races with unordered work on another stream\n"
          "                 (also env GPULUA_CHECK=races)\n"
          "  --             stop handling options\n"
          "  -              stop handling options and execute stdin\n"
          "Launcher options (each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
          "MASTER_ADDR and MASTER_PORT in its environment):\n"
          "  -n N           run the script on N ranks (processes) on this node\n"
          "  --nnodes K     the job spans K nodes of N ranks each (default 1)\n"
          "  --node-rank R  this node's index, 0 to K-1 (default 0)\n"
          "  --master H:P   MASTER_ADDR and MASTER_PORT (needed with --nnodes; default:\n"
          "                 127.0.0.1 and a free port)\n"
          "  --prefix       write each output line as '[rank R] line' (default on a terminal)\n"
          "  --no-prefix    write output lines as they are\n"
          "Without a script, gpulua starts the REPL on a terminal and runs stdin otherwise.\n"
          "Documentation: docs/README.md in the source tree; man gpulua once installed.\n",
          cli_progname, cli_progname);
}

static void print_usage(const char *badoption) {
  fprintf(stderr, "%s: ", cli_progname);
  if (badoption[1] == 'e' || badoption[1] == 'l' || strcmp(badoption, "--device") == 0 ||
      strcmp(badoption, "--device=") == 0 || strcmp(badoption, "--trace") == 0 ||
      strcmp(badoption, "--trace=") == 0 || strcmp(badoption, "--check") == 0 ||
      strcmp(badoption, "--check=") == 0)
    fprintf(stderr, "'%s' needs argument\n", badoption);
  else if (strncmp(badoption, "--sync-debug", 12) == 0)
    fprintf(stderr, "'%s' needs argument off, warn or error\n", badoption);
  else
    fprintf(stderr, "unrecognized option '%s'\n", badoption);
  print_usage_lines(stderr);
}

static int usage_error(const char *msg) {
  fprintf(stderr, "%s: %s\n", cli_progname, msg);
  print_usage_lines(stderr);
  return EXIT_FAILURE;
}

void cli_message(const char *pname, const char *msg) {
  if (pname != NULL)
    fprintf(stderr, "%s: ", pname);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

int cli_report(lua_State *L, int status, const char *pname) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    cli_message(pname, msg != NULL ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return status;
}

/* Ctrl-C interrupts what runs between these two (cli_docall, cli_poll). */
static void interruptible_begin(gpulua *g, struct sigaction *old) {
  globalL = gpulua_state(g);
  globalg = g;
  gpulua_interrupt_clear(g);   /* a Ctrl-C from before the call */
  setsignal(SIGINT, laction, old);
}

static void interruptible_end(gpulua *g, struct sigaction *old) {
  sigaction(SIGINT, old, NULL);
  /* an interrupt the call did not take ends with it */
  if (lua_gethook(globalL) == lstop)
    lua_sethook(globalL, NULL, 0, 0);
  gpulua_interrupt_clear(g);
}

int cli_docall(gpulua *g, int narg, int nres) {
  struct sigaction old;
  interruptible_begin(g, &old);
  int status = gpulua_pcall(g, narg, nres);
  interruptible_end(g, &old);
  return status;
}

int cli_poll(gpulua *g, double timeout_s) {
  struct sigaction old;
  interruptible_begin(g, &old);
  int left = gpulua_poll(g, timeout_s);
  interruptible_end(g, &old);
  return left;
}

unsigned cli_sigints(void) { return (unsigned)sigints; }

/* ---- finishing the queued work at exit ----------------------------------- */

/* Ctrl-C while the program finishes the queued work: the first interrupts
 * the wait, a second kills the program (as lua.c's second Ctrl-C). */
static void finish_action(int sig) {
  setsignal(sig, SIG_DFL, NULL);
  sigints++;
  gpulua_interrupt(globalg);
}

static int is_interrupt(gpulua *g) { return strcmp(gpulua_error(g), "interrupted") == 0; }

#define FINISH_INTERRUPTED (-1)

/* Finishes the run's queued work before the program exits: LUA_OK, an
 * asynchronous error (gpulua_error), or FINISH_INTERRUPTED when Ctrl-C
 * stopped the wait.  With `say` (the end of a REPL session on a terminal,
 * where a silent wait looks like a hang) a wait that has to block first
 * says what it waits for: the first wait is a probe with an interrupt
 * already pending, which gives up at once if it has to wait at all. */
static int finish_queued(gpulua *g, int say) {
  struct sigaction old;
  int before = sigints;
  globalg = g;
  gpulua_interrupt_clear(g);   /* a Ctrl-C from before */
  setsignal(SIGINT, finish_action, &old);
  int status;
  if (say) {
    gpulua_interrupt(g);
    status = gpulua_synchronize(g);
    if (status == LUA_OK) {
      gpulua_interrupt_clear(g);   /* it had nothing to wait for */
    } else if (is_interrupt(g) && sigints == before) {
      cli_message(cli_progname, "waiting for the queued work to finish (Ctrl-C to stop waiting)");
      status = gpulua_synchronize(g);
    }
  } else {
    status = gpulua_synchronize(g);
  }
  sigaction(SIGINT, &old, NULL);
  if (status != LUA_OK && sigints != before && is_interrupt(g))
    return FINISH_INTERRUPTED;
  return status;
}

/* gpulua's version, then Lua's copyright line as lua.c prints it. */
static void print_version(void) {
  printf("gpulua %s (%s, REPL line editing: %s)\n", GPULUA_VERSION_STRING, LUA_RELEASE,
         cli_repl_has_libedit() ? "libedit" : "none");
  printf("%s\n", LUA_COPYRIGHT);
  fflush(stdout);
}

static void set_progname(const char *argv0) {
  if (argv0 == NULL || argv0[0] == '\0')
    return;
  const char *slash = strrchr(argv0, '/');
  cli_progname = slash != NULL && slash[1] != '\0' ? slash + 1 : argv0;
}

/* ---- a rank under the launcher ------------------------------------------ */

/* The launcher's pipe for failure notes (GPULUA_LAUNCHER_FD), or -1. */
static int launcher_fd = -1;

/* Takes the pipe from the environment, out of reach of the script's own
 * child processes (a gpulua among them would take it for its own). */
static void launcher_open(void) {
  const char *s = getenv("GPULUA_LAUNCHER_FD");
  if (s == NULL)
    return;
  char *end;
  long fd = strtol(s, &end, 10);
  struct stat st;
  if (getenv("GPULUA_LAUNCHER") != NULL && s[0] >= '0' && s[0] <= '9' && *end == '\0' && fd > 2 &&
      fd < 1L << 20 && fstat((int)fd, &st) == 0 && S_ISFIFO(st.st_mode) &&
      fcntl((int)fd, F_SETFD, FD_CLOEXEC) == 0)
    launcher_fd = (int)fd;
  unsetenv("GPULUA_LAUNCHER_FD");
}

/* This rank has failed: it tells the launcher before it leaves the job
 * (gpulua_close), so that a peer failing because it left is noted after it
 * and the launcher names this rank (launch.c).  The SIGTERM that the
 * launcher then sends every rank must not cut short this one's own exit
 * (finishing its queued work, its trace): it is ignored from here on. */
static void launcher_note_failure(void) {
  if (launcher_fd < 0)
    return;
  char note[32];
  int n = snprintf(note, sizeof note, "%ld\n", (long)getpid());
  while (write(launcher_fd, note, (size_t)n) < 0 && errno == EINTR) {
  }
  close(launcher_fd);
  launcher_fd = -1;
  setsignal(SIGTERM, SIG_IGN, NULL);
}

/* arg[0] is the script (or the interpreter when there is none); the
 * interpreter and its options get negative indices, script arguments 1..n. */
static void createargtable(lua_State *L, char **argv, int argc, int script) {
  int narg = argc - (script + 1);
  lua_createtable(L, narg > 0 ? narg : 0, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int dochunk(gpulua *g, int status) {
  if (status == LUA_OK)
    status = cli_docall(g, 0, 0);
  return cli_report(gpulua_state(g), status, cli_progname);
}

static int dofile(gpulua *g, const char *name) {
  return dochunk(g, luaL_loadfile(gpulua_state(g), name));
}

static int dostring(gpulua *g, const char *s, const char *name) {
  return dochunk(g, luaL_loadbuffer(gpulua_state(g), s, strlen(s), name));
}

/* 'globname[=modname]': globname = require(modname) */
static int dolibrary(gpulua *g, char *globname) {
  lua_State *L = gpulua_state(g);
  char *modname = strchr(globname, '=');
  if (modname == NULL) {
    modname = globname;
  } else {
    *modname = '\0';
    modname++;
  }
  lua_getglobal(L, "require");
  lua_pushstring(L, modname);
  int status = cli_docall(g, 1, 1);
  if (status == LUA_OK)
    lua_setglobal(L, globname);
  return cli_report(L, status, cli_progname);
}

/* Push arg[1..#arg] for the main chunk. */
static int pushargs(lua_State *L) {
  int i, n;
  if (lua_getglobal(L, "arg") != LUA_TTABLE)
    luaL_error(L, "'arg' is not a table");
  n = (int)luaL_len(L, -1);
  luaL_checkstack(L, n + 3, "too many arguments to script");
  for (i = 1; i <= n; i++)
    lua_rawgeti(L, -i, i);
  lua_remove(L, -i);
  return n;
}

static int handle_script(gpulua *g, char **argv) {
  lua_State *L = gpulua_state(g);
  const char *fname = argv[0];
  if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0)
    fname = NULL;  /* stdin */
  int status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    int n = pushargs(L);
    status = cli_docall(g, n, LUA_MULTRET);
  }
  return cli_report(L, status, cli_progname);
}

/* Checks all options before anything runs.  Returns the has_* mask, or
 * has_error with *first the index of the bad option.  Otherwise *first is -1
 * with no program name, 0 with no script, else the script's index. */
static int is_sync_mode(const char *m) {
  return m != NULL && (strcmp(m, "off") == 0 || strcmp(m, "warn") == 0 || strcmp(m, "error") == 0);
}

/* gpulua's own long option at argv[*i] (its value taken, *i moved past
 * it).  0, or -1 for a bad option or value. */
static int long_option(char **argv, int *i, int *args, const char **device, const char **sync_debug,
                       const char **trace, const char **check) {
  if (strcmp(argv[*i], "--help") == 0) {
    *args |= has_h;
  } else if (strcmp(argv[*i], "--device") == 0) {
    (*i)++;
    if (argv[*i] == NULL || argv[*i][0] == '-' || argv[*i][0] == '\0')
      return -1;
    *device = argv[*i];
  } else if (strncmp(argv[*i], "--device=", 9) == 0) {
    if (argv[*i][9] == '\0')
      return -1;
    *device = argv[*i] + 9;
  } else if (strcmp(argv[*i], "--sync-debug") == 0) {
    if (argv[*i + 1] == NULL || !is_sync_mode(argv[*i + 1]))
      return -1;
    *sync_debug = argv[++*i];
  } else if (strncmp(argv[*i], "--sync-debug=", 13) == 0) {
    if (!is_sync_mode(argv[*i] + 13))
      return -1;
    *sync_debug = argv[*i] + 13;
  } else if (strcmp(argv[*i], "--trace") == 0) {
    (*i)++;
    if (argv[*i] == NULL || argv[*i][0] == '-' || argv[*i][0] == '\0')
      return -1;
    *trace = argv[*i];
  } else if (strncmp(argv[*i], "--trace=", 8) == 0) {
    if (argv[*i][8] == '\0')
      return -1;
    *trace = argv[*i] + 8;
  } else if (strcmp(argv[*i], "--check") == 0 || strncmp(argv[*i], "--check=", 8) == 0) {
    const char *v = argv[*i][7] == '=' ? argv[*i] + 8 : argv[++*i];
    if (v == NULL || v[0] == '-' || v[0] == '\0')
      return -1;
    *check = v;
  } else {
    return -1;
  }
  return 0;
}

static int collectargs(char **argv, int *first, const char **device, const char **sync_debug,
                       const char **trace, const char **check) {
  int args = 0;
  int i;
  if (argv[0] == NULL) {
    *first = -1;
    return 0;
  }
  for (i = 1; argv[i] != NULL; i++) {
    *first = i;
    if (argv[i][0] != '-')
      return args;
    switch (argv[i][1]) {
      case '-':
        if (argv[i][2] == '\0') {  /* '--' */
          *first = argv[i + 1] != NULL ? i + 1 : 0;
          return args;
        }
        if (long_option(argv, &i, &args, device, sync_debug, trace, check) != 0)
          return has_error;
        break;
      case '\0':  /* '-': the script "name" is stdin */
        return args;
      case 'E':
        if (argv[i][2] != '\0')
          return has_error;
        args |= has_E;
        break;
      case 'W':
        if (argv[i][2] != '\0')
          return has_error;
        break;
      case 'h':
        if (argv[i][2] != '\0')
          return has_error;
        args |= has_h;
        break;
      case 'i':
        args |= has_i;  /* -i implies -v */
        /* FALLTHROUGH */
      case 'v':
        if (argv[i][2] != '\0')
          return has_error;
        args |= has_v;
        break;
      case 'e':
        args |= has_e;
        /* FALLTHROUGH */
      case 'l':
        if (argv[i][1] == 'l')
          args |= has_l;
        if (argv[i][2] == '\0') {  /* argument in the next argv */
          i++;
          if (argv[i] == NULL || argv[i][0] == '-')
            return has_error;
        }
        break;
      default:
        return has_error;
    }
  }
  *first = 0;
  return args;
}

/* Runs -e and -l (and -W) in order.  Returns 0 if some code failed. */
static int runargs(gpulua *g, char **argv, int n) {
  for (int i = 1; i < n; i++) {
    int option = argv[i][1];
    switch (option) {
      case 'e':
      case 'l': {
        char *extra = argv[i] + 2;
        if (*extra == '\0')
          extra = argv[++i];
        int status = option == 'e' ? dostring(g, extra, "=(command line)") : dolibrary(g, extra);
        if (status != LUA_OK)
          return 0;
        break;
      }
      case 'W':
        lua_warning(gpulua_state(g), "@on", 0);
        break;
      case '-':
        if (strcmp(argv[i], "--device") == 0 || strcmp(argv[i], "--sync-debug") == 0 ||
            strcmp(argv[i], "--trace") == 0 || strcmp(argv[i], "--check") == 0)
          i++;  /* skip its value */
        break;
    }
  }
  return 1;
}

static int handle_luainit(gpulua *g) {
  const char *name = "=" LUA_INITVARVERSION;
  const char *init = getenv(name + 1);
  if (init == NULL) {
    name = "=" LUA_INIT_VAR;
    init = getenv(name + 1);
  }
  if (init == NULL)
    return LUA_OK;
  if (init[0] == '@')
    return dofile(g, init + 1);
  return dostring(g, init, name);
}

static int set_sync_debug(gpulua *g, const char *mode) {
  if (gpulua_sync_debug(g, mode) == 0)
    return LUA_OK;
  cli_message(cli_progname, gpulua_error(g));
  return LUA_ERRRUN;
}

/* gpu.run(): the queued tasks; reports an error itself. */
static int run_tasks(gpulua *g) {
  if (cli_poll(g, -1) >= 0)
    return LUA_OK;
  cli_message(cli_progname, gpulua_error(g));
  return LUA_ERRRUN;
}

/* The body of the program, run in protected mode (as lua.c's pmain). */
static int pmain(lua_State *L) {
  struct cli *c = (struct cli *)lua_touserdata(L, 1);
  char **argv = c->argv;
  int script = c->script;
  int args = c->args;
  int optlim = script > 0 ? script : c->argc;
  luaL_checkversion(L);
  createargtable(L, argv, c->argc, script);
  /* before any code runs: LUA_INIT, -e and the script all see the mode */
  if (c->sync_debug != NULL && set_sync_debug(c->g, c->sync_debug) != LUA_OK)
    return 0;
  if (!(args & has_E) && handle_luainit(c->g) != LUA_OK)
    return 0;
  if (!runargs(c->g, argv, optlim))
    return 0;
  if (script > 0 && handle_script(c->g, argv + script) != LUA_OK)
    return 0;
  /* the tasks the chunks queued (gpu.task) run now, before the REPL or exit */
  if (run_tasks(c->g) != LUA_OK)
    return 0;
  /* the REPL warns of syncs unless told otherwise */
  int repl_warn = c->sync_debug == NULL && cli_setting("GPULUA_SYNC_DEBUG") == NULL;
  /* repl_tty before the session: os.exit in it ends a session too */
  if (args & has_i) {
    c->repl_tty = isatty(0);
    cli_repl(c->g, repl_warn);
  } else if (script < 1 && !(args & (has_e | has_v))) {
    if (isatty(0)) {
      print_version();
      c->repl_tty = 1;
      cli_repl(c->g, repl_warn);
    } else if (dofile(c->g, NULL) != LUA_OK || run_tasks(c->g) != LUA_OK) {
      return 0;
    }
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* The message for a --check value other than races, or NULL. */
static const char *bad_check(const char *check, char *buf, size_t len) {
  if (check == NULL || strcmp(check, "races") == 0)
    return NULL;
  snprintf(buf, len, "unknown --check value '%.64s' (expected races)", check);
  return buf;
}

/* --check races: gpu.check_races(true) before anything runs. */
static int check_races(gpulua *g) {
  lua_State *L = gpulua_state(g);
  lua_getglobal(L, "gpu");
  lua_getfield(L, -1, "check_races");
  lua_remove(L, -2);
  lua_pushboolean(L, 1);
  return cli_report(L, gpulua_pcall(g, 1, 0), cli_progname);
}

/* One line on stderr, once per job, when the device was chosen for the user
 * and it is the host: timings and overlap mean something else there.  Saying
 * where to run (--device, GPULUA_DEVICE; "auto" too) silences it. */
static void note_host_fallback(gpulua *g, const char *device) {
  const char *env = cli_setting("GPULUA_DEVICE");
  const char *rank = getenv("RANK");
  const char *backend = gpulua_backend(g, NULL);
  if (device != NULL || (env != NULL && *env != '\0') || backend == NULL || strcmp(backend, "host") != 0)
    return;
  if (getenv("GPULUA_LAUNCHER") != NULL && rank != NULL && strcmp(rank, "0") != 0)
    return;
#ifdef GPULUA_HAVE_CUDA
  const char *why = "no GPU answered";
#else
  const char *why = "this gpulua has no CUDA backend (make CUDA=1 builds it)";
#endif
  fprintf(stderr, "%s: running on the host backend (CPU threads): %s; --device host (or auto) silences this\n",
          cli_progname, why);
  fflush(stderr);
}

/* `gpulua -n N ...`: checks the options the ranks will get, then runs them. */
static int launch(struct launch *l) {
  int script;
  const char *device = NULL, *sync_debug = NULL, *trace = NULL, *check = NULL;
  int args = collectargs(l->argv, &script, &device, &sync_debug, &trace, &check);
  char buf[160];
  const char *msg = NULL;
  if (args == has_error)
    print_usage(l->argv[script]);
  else if (bad_check(check, buf, sizeof buf) != NULL)
    msg = buf;
  else if (args & has_i)
    msg = "-n cannot be used with -i (the ranks have no REPL)";
  else if (script > 0 && strcmp(l->argv[script], "-") == 0 &&
           strcmp(l->argv[script - 1], "--") != 0)
    msg = "-n cannot read the script from stdin; name a script file";
  else if (script < 1 && !(args & has_e))
    msg = "-n needs a script (or -e) to run on each rank";
  int status;
  if (args != has_error && (args & has_h)) {
    print_usage_lines(stdout);
    status = EXIT_SUCCESS;
  } else {
    status = args == has_error ? EXIT_FAILURE : msg != NULL ? usage_error(msg) : launch_run(l);
  }
  launch_free(l);
  return status;
}

/* Opens the interpreter of c with the options given, and turns on what
 * they ask for before any code runs (--check races, --trace).  0, or -1
 * with the message printed and c->g closed. */
static int open_interpreter(struct cli *c, const char *device, const char *trace, const char *check) {
  gpulua_options o = GPULUA_OPTIONS_INIT;
  o.device = device;
  o.ignore_env = (c->args & has_E) != 0;
  o.interruptible = 1;   /* Ctrl-C interrupts waits for the device too (cli_docall) */
  c->g = gpulua_open(&o);
  if (gpulua_state(c->g) == NULL) {
    cli_message(cli_progname, gpulua_error(c->g));
    goto fail;
  }
  note_host_fallback(c->g, device);
  const char *trace_env = cli_setting("GPULUA_TRACE");
  if ((check != NULL && check_races(c->g) != LUA_OK) ||
      ((trace || (trace_env && *trace_env)) &&
       cli_trace_start(c->g, trace ? trace : trace_env, trace ? "--trace" : "GPULUA_TRACE") != 0))
    goto fail;
  return 0;
fail:
  launcher_note_failure();
  gpulua_close(c->g);
  c->g = NULL;
  return -1;
}

/* After the run: the queued work is part of it, so finish it and report a
 * failure in it (after a failed run, whose error is printed already, as
 * "also: ..."); write the trace; close the state when `close` (os.exit
 * without close leaves it open, as lua.c's).  code: the exit status asked
 * for, which a failure turns from 0 into 1; failed: the run failed.  The
 * exit status.  Ctrl-C stops the wait: the program says so and exits 1
 * without the rest of the work (closing would wait for it).  The wait
 * says what it waits for at the end of a REPL session on a terminal and
 * after a Ctrl-C, where a silent wait looks like a hang. */
static int finish_run(struct cli *c, int code, int failed, int close) {
  if (failed)
    launcher_note_failure();
  int fin = finish_queued(c->g, (c->repl_tty && !failed) || sigints > 0);
  if (fin == FINISH_INTERRUPTED) {
    cli_message(cli_progname, "interrupted while finishing queued work");
    launcher_note_failure();
    cli_trace_drop(c->g, "interrupted");
    fflush(NULL);
    _exit(EXIT_FAILURE);
  }
  if (fin != LUA_OK) {
    if (failed)
      fprintf(stderr, "%s: also: ", cli_progname);
    cli_message(failed ? NULL : cli_progname, gpulua_error(c->g));
    failed = 1;
  }
  if (cli_trace_finish(c->g) != 0)
    failed = 1;
  if (failed) {
    launcher_note_failure();
    if (code == EXIT_SUCCESS)
      code = EXIT_FAILURE;
  }
  if (close)
    gpulua_close(c->g);
  /* a thread still in NCCL's communicator creation (timed out): exit()
   * would tear the CUDA runtime down under it */
  if (gpulua_detached_threads() > 0) {
    fflush(NULL);
    _exit(code);
  }
  return code;
}

/* os.exit([code [, close]]) in the program's state: lua.c's, after the end
 * of a run (finish_run): the queued work is finished, a failure in it is
 * reported and turns a status of 0 into 1, the trace is written. */
static int cli_os_exit(lua_State *L) {
  struct cli *c = (struct cli *)lua_touserdata(L, lua_upvalueindex(1));
  int code;
  if (lua_isboolean(L, 1))
    code = lua_toboolean(L, 1) ? EXIT_SUCCESS : EXIT_FAILURE;
  else
    code = (int)luaL_optinteger(L, 1, EXIT_SUCCESS);
  int close = lua_toboolean(L, 2);
  fflush(NULL);
  code = finish_run(c, code, 0, close);
  exit(code);
}

/* Puts cli_os_exit in the place of os.exit (when the os library is there). */
static void wrap_os_exit(struct cli *c) {
  lua_State *L = gpulua_state(c->g);
  if (lua_getglobal(L, "os") == LUA_TTABLE) {
    lua_pushlightuserdata(L, c);
    lua_pushcclosure(L, cli_os_exit, 1);
    lua_setfield(L, -2, "exit");
  }
  lua_pop(L, 1);
}

int main(int argc, char **argv) {
  struct cli c = {argc, argv, 0, 0, NULL, NULL, 0};
  const char *device = NULL, *trace = NULL, *check = NULL;
  struct launch l;
  char err[256];
  set_progname(argv[0]);
  switch (launch_parse(argv, &l, err, sizeof err)) {
    case -1:
      return usage_error(err);
    case 1:
      l.progname = cli_progname;
      return launch(&l);
  }
  /* Under the launcher stdout is a pipe: write whole lines as they come, as
   * on a terminal, so that ranks' output interleaves by line and nothing is
   * held back when a rank is killed. */
  if (getenv("GPULUA_LAUNCHER") != NULL)
    setvbuf(stdout, NULL, _IOLBF, 0);
  launcher_open();
  c.args = collectargs(argv, &c.script, &device, &c.sync_debug, &trace, &check);
  cli_noenv = c.args != has_error && (c.args & has_E) != 0;
  if (c.args == has_error) {
    print_usage(argv[c.script]);
    return EXIT_FAILURE;
  }
  /* -h / --help: the usage on stdout, and nothing else runs */
  if (c.args & has_h) {
    print_usage_lines(stdout);
    return EXIT_SUCCESS;
  }
  char buf[160];
  if (bad_check(check, buf, sizeof buf) != NULL)
    return usage_error(buf);
  if (c.args & has_v)
    print_version();
  /* `gpulua -v` alone opens no device. */
  if ((c.args & has_v) && !(c.args & (has_i | has_e | has_l)) && c.script < 1)
    return EXIT_SUCCESS;

  if (open_interpreter(&c, device, trace, check) != 0)
    return EXIT_FAILURE;
  wrap_os_exit(&c);
  lua_State *L = gpulua_state(c.g);
  lua_pushcfunction(L, pmain);
  lua_pushlightuserdata(L, &c);
  int status = lua_pcall(L, 1, 1, 0);
  int result = lua_toboolean(L, -1);
  cli_report(L, status, cli_progname);
  int ok = status == LUA_OK && result;
  return finish_run(&c, ok ? EXIT_SUCCESS : EXIT_FAILURE, !ok, 1);
}
