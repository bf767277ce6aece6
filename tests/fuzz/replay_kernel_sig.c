/* The suite replays the kernel-signature parsers' corpus and crashes (see
 * replay.h). */
#include "fuzz_kernel_sig.c"
#define REPLAY_NAME "kernel_sig"
#include "replay.h"
