/* cuk_launch: the built-in kernels' one entry point, a switch on the op kind.
 * The views are checked here, once (dev_submit has already checked the ops it
 * passes, which say so in env->checked); each launcher validates the rest of
 * its op as dev_cpu_run() does, enqueues on env->stream and returns at once. */
#include "k_common.cuh"

extern "C" int cuk_launch(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  if (op == NULL || env == NULL) return fail_msg(err, errlen, "cuk_launch: no op or environment");
  if (!env->checked && op->kind != DEV_OP_SLEEP) {
    static const char *const names[DEV_FMAXIN] = {"in[0]", "in[1]", "in[2]", "in[3]", "in[4]", "in[5]", "in[6]", "in[7]"};
    if (k_check_view(&op->out, "out", err, errlen)) return -1;
    for (int i = 0; i < op->nin && i < DEV_FMAXIN; i++)
      if (k_check_view(dev_kop_in(op, i), names[i], err, errlen)) return -1;
  }
  switch (op->kind) {
  case DEV_OP_FILL: return k_fill(op, env, err, errlen);
  case DEV_OP_ARANGE: return k_arange(op, env, err, errlen);
  case DEV_OP_RAND: return k_rand(op, env, err, errlen);
  case DEV_OP_UNARY: return k_unary(op, env, err, errlen);
  case DEV_OP_BINARY: return k_binary(op, env, err, errlen);
  case DEV_OP_TERNARY: return k_ternary(op, env, err, errlen);
  case DEV_OP_REDUCE: return k_reduce(op, env, err, errlen);
  case DEV_OP_MATMUL: return k_matmul_int(op, env, err, errlen);
  case DEV_OP_COPY: return k_copy(op, env, err, errlen);
  case DEV_OP_SLEEP: return k_sleep(op, env, err, errlen);
  case DEV_OP_CUMSUM: case DEV_OP_SOFTMAX: return k_rows(op, env, err, errlen);
  case DEV_OP_INDEX: return k_index(op, env, err, errlen);
  case DEV_OP_SORT: return k_sort(op, env, err, errlen);
  case DEV_OP_LAUNCH: break;   /* run-time kernels: launched by the backend */
  case DEV_OP_FUSED:   /* NVRTC's kernels: launched by the backend (modules.c) */
    return fail_msg(err, errlen, "%s: a fused op is launched by the backend", op->fprog ? op->fprog->name : "fused");
  }
  return fail_msg(err, errlen, "unknown op kind %d", (int)op->kind);
}

extern "C" int cuk_modules(const void **out, int max)
{
  const void *all[] = {k_module_fill(),    k_module_copy(),  k_module_binary(), k_module_unary(),
                       k_module_reduce(),  k_module_ternary(), k_module_index(), k_module_rand(),
                       k_module_rows(),    k_module_matmul_int(), k_module_sleep(), k_module_sort()};
  int n = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0] && n < max; i++) out[n++] = all[i];
  return n;
}
