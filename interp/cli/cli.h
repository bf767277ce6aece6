/* Internal to the gpulua program (main.c, repl.c): what the REPL shares with
 * the lua.c-style driver.  Not part of the library. */
#ifndef GPULUA_CLI_H
#define GPULUA_CLI_H

#include <lua.h>

#include "gpulua.h"

/* The program's name for messages (from argv[0]; "gpulua" without one). */
extern const char *cli_progname;

/* A GPULUA_* setting: getenv, or NULL for all of them under -E (the
 * launcher's own GPULUA_LAUNCHER* are read with getenv). */
const char *cli_setting(const char *name);

/* Print "pname: msg" (or just msg when pname is NULL) on stderr. */
void cli_message(const char *pname, const char *msg);

/* If status is an error, print the message on top of the stack and pop it. */
int cli_report(lua_State *L, int status, const char *pname);

/* gpulua_pcall with Ctrl-C turned into a Lua error while it runs: "interrupted!"
 * in Lua code, "<call>: interrupted" in a wait for the device (the queued
 * work runs on).  The SIGINT handler before the call is restored after it. */
int cli_docall(gpulua *g, int narg, int nres);

/* gpulua_poll with Ctrl-C interrupting it as cli_docall does. */
int cli_poll(gpulua *g, double timeout_s);

/* How many Ctrl-Cs cli_docall and cli_poll have taken so far. */
unsigned cli_sigints(void);

/* The interactive read-eval-print loop; returns at end of input.  With
 * sync_warn, host-device syncs in entered statements warn (printing the
 * results does not). */
void cli_repl(gpulua *g, int sync_warn);

/* 1 when the REPL was built with libedit (line editing, history, completion). */
int cli_repl_has_libedit(void);

/* --trace FILE (label: how the user gave it, for messages): start tracing;
 * at exit write the file.  Both print their error and return non-zero. */
int cli_trace_start(gpulua *g, const char *path, const char *label);
int cli_trace_finish(gpulua *g);
/* The trace will not be written (the program exits without its queued
 * work): says so, with why, when one was started. */
void cli_trace_drop(gpulua *g, const char *why);

#endif
