/* launch.h — `gpulua -n N script.lua`: the rank launcher of the gpulua
 * program (torchrun-style: N children of this same binary, each with RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
 * Internal to the program; not part of the library. */
#ifndef GPULUA_LAUNCH_H
#define GPULUA_LAUNCH_H

#include <stddef.h>

struct launch {
  int nproc;          /* -n: ranks on this node */
  int nnodes;         /* --nnodes (default 1) */
  int node_rank;      /* --node-rank (default 0) */
  char *master_addr;  /* --master's host (owned), or NULL: 127.0.0.1 */
  int master_port;    /* --master's port, or 0: a free port on 127.0.0.1 */
  int prefix;         /* --prefix 1, --no-prefix 0, default -1 (on a terminal) */
  int argc;           /* the children's argv: ours without the launcher options */
  char **argv;        /* (owned array, NULL-terminated; strings are the caller's) */
  const char *progname;  /* the program's name in messages (the caller sets it) */
};

/* Takes the launcher options from argv (those before the script, as lua.c
 * reads options).  Returns 0 when there are none, 1 when the program should
 * launch (l filled; free with launch_free), -1 on a bad launcher option with
 * the message in err (without the program name). */
int launch_parse(char **argv, struct launch *l, char *err, size_t errlen);

/* Starts the ranks, relays their output, waits for them; returns the exit
 * status of the program: 0, a failed rank's status (128 + signal when killed),
 * 128 + signal when the launcher was interrupted, 1 when a rank could not
 * start. */
int launch_run(const struct launch *l);

void launch_free(struct launch *l);

#endif
