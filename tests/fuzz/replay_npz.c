/* The suite replays the .npz reader's corpus and crashes (see replay.h). */
#include "fuzz_npz.c"
#define REPLAY_NAME "npz"
#include "replay.h"
