/* cuk_launch: the built-in kernels' one entry point, a switch on the op kind.
 * Each launcher validates its op as dev_host_run() does, enqueues on
 * env->stream and returns at once. */
#include "k_common.cuh"

extern "C" int cuk_launch(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  if (op == NULL || env == NULL) return k_fail(err, errlen, "cuk_launch: no op or environment");
  switch (op->kind) {
  case DEV_OP_FILL: return k_fill(op, env, err, errlen);
  case DEV_OP_ARANGE: return k_arange(op, env, err, errlen);
  case DEV_OP_RAND: return k_rand(op, env, err, errlen);
  case DEV_OP_UNARY: return k_unary(op, env, err, errlen);
  case DEV_OP_BINARY: return k_binary(op, env, err, errlen);
  case DEV_OP_REDUCE: return k_reduce(op, env, err, errlen);
  case DEV_OP_MATMUL: return k_matmul_int(op, env, err, errlen);
  case DEV_OP_COPY: return k_copy(op, env, err, errlen);
  case DEV_OP_SLEEP: return k_sleep(op, env, err, errlen);
  case DEV_OP_LAUNCH: break;   /* run-time kernels: launched by the backend */
  }
  return k_fail(err, errlen, "unknown op kind %d", (int)op->kind);
}
