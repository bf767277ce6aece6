/* The suite's side of a fuzz target: a TAP test that runs the target once on
 * every file of its seed corpus (tests/fuzz/corpus/<name>/) and of the
 * inputs that once crashed it (tests/fuzz/crashes/<name>/), so a fixed crash
 * stays fixed in every build `make test` makes, sanitizers included.  With
 * arguments, it runs those files instead.  A finding aborts (or is a
 * sanitizer report), as under libFuzzer.
 *
 * Include after the target, with REPLAY_NAME defined. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tests/tap.h"

static void run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char *buf = NULL;
  size_t n = 0, cap = 0, got = 0;
  if (f) {
    do {
      n += got;
      if (n == cap) {
        unsigned char *nb = realloc(buf, cap = cap ? 2 * cap : 4096);
        FUZZ_ASSERT(nb != NULL);
        buf = nb;
      }
    } while ((got = fread(buf + n, 1, cap - n, f)) > 0);
    fclose(f);
  }
  if (!f) {
    ok(0, "cannot open %s", path);
    exit(1);
  }
  /* an exact-size copy, so that a read past the end is an ASan report */
  unsigned char *in = malloc(n ? n : 1);
  FUZZ_ASSERT(in != NULL);
  memcpy(in, buf, n);
  free(buf);
  printf("# %s (%zu bytes)\n", path, n);
  fflush(stdout);
  LLVMFuzzerTestOneInput(in, n);
  free(in);
  ok(1, "%s", path);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every file of dir, in name order; a missing directory fails unless it
 * may be missing (a target that never crashed has no crashes/<name>/). */
static void run_dir(const char *dir, int may_be_missing) {
  DIR *d = opendir(dir);
  if (!d && may_be_missing) return;
  if (!d) {
    ok(0, "cannot open %s (run from the repository root)", dir);
    exit(1);
  }
  char **names = NULL;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char **nn = realloc(names, (n + 1) * sizeof *names);
    FUZZ_ASSERT(nn != NULL);
    names = nn;
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    FUZZ_ASSERT((names[n] = malloc(len)) != NULL);
    snprintf(names[n++], len, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    run_file(names[i]);
    free(names[i]);
  }
  free(names);
}

int main(int argc, char **argv) {
  if (argc > 1) {
    for (int i = 1; i < argc; i++) run_file(argv[i]);
  } else {
    run_dir("tests/fuzz/corpus/" REPLAY_NAME, 0);
    run_dir("tests/fuzz/crashes/" REPLAY_NAME, 1);
  }
  return done_testing();
}
