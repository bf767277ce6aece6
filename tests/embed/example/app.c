/* app.c — an application that embeds gpulua: it wraps its own buffer as a
 * gpu.Tensor, runs a pipeline script on it (pipeline.lua beside this file:
 * y = 2x + 1 in batches through the device) and checks the result.
 *
 * Built against an installed gpulua (the suite builds it from build/stage):
 *   cc -o app app.c $(pkg-config --cflags --libs gpulua)
 *   ./app pipeline.lua            (LD_LIBRARY_PATH=<prefix>/lib outside the
 *                                  linker's paths)
 * The device: $GPULUA_DEVICE ("host", "cuda"), else cuda where a GPU
 * answers, else host.  Exit status 0 when every value is right; otherwise a
 * message on stderr and 1. */
#include <gpulua.h>

#include <stdio.h>
#include <stdlib.h>

#define N 8192

/* Called once when gpulua no longer uses the buffer (here: in gpulua_close). */
static void released(void *ud, void *data) {
  (void)data;
  ++*(int *)ud;
}

int main(int argc, char **argv) {
  const char *script = argc > 1 ? argv[1] : "pipeline.lua";
  float *buf = malloc(N * sizeof *buf);          /* the application's own memory */
  if (buf == NULL) return 1;
  for (int i = 0; i < N; i++) buf[i] = (float)i;
  gpulua_tensor_info t = {.data = buf, .dtype = GPULUA_F32, .memory = GPULUA_MEM_HOST,
                          .ndim = 1, .shape = {N}};
  int releases = 0;

  gpulua *g = gpulua_open(NULL);                 /* NULL: default options */
  lua_State *L = gpulua_state(g);                /* NULL if the open failed */
  int ok = L != NULL && gpulua_push_tensor(g, &t, released, &releases) == 0;
  if (ok) {
    lua_setglobal(L, "input");                   /* the script sees it as `input` */
    ok = gpulua_dofile(g, script) == 0 && gpulua_synchronize(g) == 0;
  }
  if (ok) {
    lua_getglobal(L, "gpu");
    lua_getfield(L, -1, "backend");
    printf("app: backend %s\n", lua_tostring(L, -1));
    lua_pop(L, 2);
  } else {
    fprintf(stderr, "app: %s\n", gpulua_error(g));
  }
  gpulua_close(g);

  for (int i = 0; i < N && ok; i++)
    if (buf[i] != 2.0f * (float)i + 1.0f) {
      fprintf(stderr, "app: buf[%d] = %g, expected %g\n", i, buf[i], 2.0 * i + 1.0);
      ok = 0;
    }
  if (ok && releases != 1) {
    fprintf(stderr, "app: release called %d times, expected once\n", releases);
    ok = 0;
  }
  free(buf);
  if (ok) printf("app: %d values checked, ok\n", N);
  return ok ? 0 : 1;
}
