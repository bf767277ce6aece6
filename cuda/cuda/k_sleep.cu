/* DEV_OP_SLEEP: hold the stream for op->ms milliseconds (one thread watching
 * the GPU's nanosecond global timer, napping between looks). */
#include "k_common.cuh"

K_MODULE(sleep)

/* ---- kernels ------------------------------------------------------------- */

__device__ __forceinline__ uint64_t globaltimer(void)
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void sleep_kernel(uint64_t ns)
{
  uint64_t start = globaltimer(), now;
  while ((now = globaltimer()) - start < ns) {
    uint64_t left = ns - (now - start);
    __nanosleep(left < 100000 ? (unsigned)left : 100000u);
  }
}

/* ---- launchers ----------------------------------------------------------- */

int k_sleep(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  double ms = op->ms;
  if (!(ms > 0)) return 0;
  if (ms > 1e12) ms = 1e12;   /* as the host: keeps the conversion defined */
  sleep_kernel<<<1, 1, 0, k_stream(env)>>>((uint64_t)(ms * 1e6));
  K_LAUNCHED();
  return 0;
}
