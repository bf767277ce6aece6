/* The suite replays the .npy reader's corpus and crashes (see replay.h). */
#include "fuzz_npy.c"
#define REPLAY_NAME "npy"
#include "replay.h"
