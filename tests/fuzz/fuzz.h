/* Shared by the fuzz targets: an invariant that aborts (a finding) when it
 * does not hold, in every build, with the file and line. */
#ifndef GPULUA_FUZZ_H
#define GPULUA_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_ASSERT(c)                                                                  \
  do {                                                                                  \
    if (!(c)) {                                                                         \
      fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #c);    \
      abort();                                                                          \
    }                                                                                   \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
