/* Where is a rank now?  A waiting rank asks a missing peer (by pid) for its
 * current script line: SIGURG (ignored by default, so a process that never
 * armed the answer is not harmed) makes the peer answer in files in /dev/shm
 * that the asker reads.  The signal handler at once writes what the device
 * layer last saw (the last gpu call and its script line: the answer when the
 * peer is in C), and arms a one-shot Lua hook that writes the current line
 * (the answer when it is running Lua).  Nothing here touches Lua: bindings/
 * where.c arms the hook.  No cost until asked. */
#ifndef GPULUA_WHERE_H
#define GPULUA_WHERE_H
#include <signal.h>
#include <stddef.h>

#include "device.h"

#define WHERE_SIGNAL SIGURG

/* The answer files of process pid: "" the hook's, ".c" the handler's,
 * ".ask" there while someone waits for an answer. */
void where_path(char *buf, size_t len, int pid, const char *suffix);
/* Ask pid where it is, waiting up to wait_s seconds for the hook's answer:
 * 1 with it in out, 2 with the handler's (in C), 0 when it did not answer. */
int where_ask(int pid, char *out, size_t len, double wait_s);
/* From the signal handler (async-signal-safe): write the ".c" answer from
 * ctx's last call and site. */
void where_note_c(dev_ctx *ctx);
/* Is someone waiting for this process's answer? */
int where_asked(void);
#endif
