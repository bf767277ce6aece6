/* The CPU kernels (cuda/cpu_ops.c): every built-in op run on the calling
 * thread.  A neutral module, not the host backend's: the host backend's
 * workers run ops with it, dev_op.c runs ops on host-visible memory with it
 * on either backend, and the CUDA backend's strided pageable copies gather
 * and scatter with it (cuda/cuda/runtime.c).  No state between calls. */
#ifndef GPULUA_CPU_OPS_H
#define GPULUA_CPU_OPS_H

#include <stddef.h>
#include "device.h"

/* Run an op on the calling CPU thread (host kernels).  Returns 0, or -1 with a
 * message in err (e.g. integer division by zero). */
int dev_cpu_run(const dev_kop *op, char *err, size_t errlen);

#endif
