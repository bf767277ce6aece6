/* The suite replays the kernel cache entry reader's corpus and crashes (see
 * replay.h). */
#include "fuzz_kcache.c"
#define REPLAY_NAME "kcache"
#include "replay.h"
