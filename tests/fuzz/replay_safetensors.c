/* The suite replays the safetensors reader's corpus and crashes (see replay.h). */
#include "fuzz_safetensors.c"
#define REPLAY_NAME "safetensors"
#include "replay.h"
