/* What the gpu.Tensor files share.  One file per concern (tensor.c's head
 * comment lists them); each ends with its method table
 * (bind_tensor_<concern>_methods) and, for the module's functions,
 * bind_tensor_<concern>_funcs, which tensor.c assembles. */
#ifndef GPULUA_BIND_TENSOR_H
#define GPULUA_BIND_TENSOR_H

#include "common.h"

#define MAXSHAPESTR 160   /* "{2,3,4}" of the most dims */

void bind_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

static inline const char *kind_name(const gpu_tensor *t) { return dev_memkind_name(t->v.buf->kind); }

/* Options are read by bind_read_opts (common.h) into slots; the helpers
 * below take a slot's stack index.  `stream` is always the stream option's
 * slot (0: the current stream), `out` the out option's. */

/* The options of the constructors, {dtype =, device =, stream =}: slots
 * o, o + 1, o + 2 of bind_read_opts(L, idx, bind_new_opts). */
extern const char *const bind_new_opts[];
/* The options of the ops that make a tensor, {out =, stream =}: slots o, o + 1. */
extern const char *const bind_out_opts[];

/* The dtype / device option's value at idx, checked; nil: dflt. */
dev_dtype bind_check_dtype(lua_State *L, int idx, dev_dtype dflt);
dev_memkind bind_check_device(lua_State *L, int idx, dev_memkind dflt);

/* The value at idx for dtype t: exact for integers, range-checked.  Errors
 * name argument `arg`, or, arg 0, the thing described by `what`. */
dev_scalar bind_check_scalar(lua_State *L, int idx, dev_dtype t, int arg, const char *what);
/* Push one element of dtype t as a Lua value. */
void bind_push_elem(lua_State *L, dev_dtype t, const void *p);

/* Push a tensor in released state, then allocate: an error leaks nothing.
 * Made for the stream of slot stream. */
gpu_tensor *bind_new_tensor(lua_State *L, dev_memkind kind, dev_dtype dt, int ndim,
                            const int64_t *shape, int stream, const char *fname);
/* Write packed f64 (isint: i64) values, one per element, into dst, a view
 * of the tensor at stack index tidx, on the stream of slot stream. */
void bind_tensor_upload(lua_State *L, dev_view dst, int tidx, int isint, const void *vals, int stream,
                        const char *fname);
/* Read all values of the tensor at tidx (C order) into a userdata pushed on
 * the stack, on the stream of slot stream; a counted sync. */
void *bind_tensor_download(lua_State *L, int tidx, int stream, const char *fname);

/* tensor.c's helpers for the ops of the other files. */
static inline int64_t bind_numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}
/* A 1-based (or negative) dim at idx as 0-based, the one dim reader: errors
 * name argument arg, or option 'dim' when arg is 0, and give the range. */
int bind_tensor_dim(lua_State *L, int idx, int arg, int ndim);
/* "index i out of range for dim d+1 of size n (1..n[, or -n..-1])", pushed */
const char *bind_push_index_range(lua_State *L, const char *what, lua_Integer i, int d, lua_Integer n, int neg);
/* The integer at idx, else an argument error ("integer <what> expected"). */
lua_Integer bind_tensor_int(lua_State *L, int idx, const char *what);
/* Integers from a table at arg, or the arguments arg..top (a shape, a list
 * of dims): how many, at most DEV_MAXDIM. */
int bind_tensor_ints(lua_State *L, int arg, int64_t *out, const char *what);
/* A device name's memory: 0, -1 unknown, -2 for "cuda:N" with N no
 * device's index. */
int bind_parse_device(lua_State *L, const char *name, dev_memkind *out);
/* A new tensor in like's memory, made for slot stream's stream, pushed. */
gpu_tensor *bind_tensor_like(lua_State *L, const gpu_tensor *like, dev_dtype dt, int ndim, const int64_t *shape,
                             int stream, const char *fname);
/* A new handle on the storage of the tensor at idx (a view), pushed. */
gpu_tensor *bind_tensor_view_of(lua_State *L, int idx);
/* The out option's value (slot out) checked against the result and pushed,
 * else a new tensor like `like` made for slot stream's stream. */
gpu_tensor *bind_tensor_out(lua_State *L, int out, int stream, const gpu_tensor *like, dev_dtype dt, int ndim,
                            const int64_t *shape, const char *fname);
/* An argument error unless a and b are in memory an op can mix. */
void bind_tensor_same_kind(lua_State *L, int arg, const gpu_tensor *a, const gpu_tensor *b);
/* Enqueue op on s (bind_tensor_submit: on slot stream's stream), its views'
 * buffers taken from the tensors at stack indices out and in[] (0: keep the
 * view's), after the binding's last Lua allocation (see common.h). */
void bind_tensor_submit_on(lua_State *L, dev_stream *s, dev_kop *op, int out, const int *in, int nin,
                           const char *fname);
void bind_tensor_submit(lua_State *L, int stream, dev_kop *op, int out, const int *in, int nin, const char *fname);
static inline void bind_tensor_submit2(lua_State *L, int stream, dev_kop *op, int out, int in0, int in1,
                                       const char *fname) {
  int in[2] = {in0, in1};
  bind_tensor_submit(L, stream, op, out, in, 2, fname);
}
/* Enqueue a copy of the view src (of the tensor at stack sidx) into the view
 * dst (of the tensor at didx) on s. */
void bind_tensor_copy_view(lua_State *L, dev_stream *s, int didx, dev_view dst, int sidx, dev_view src,
                           const char *fname);

/* tensor_view.c: the sizes of shape, one of which may be -1 (inferred),
 * checked against the elements of from: -1 resolved, else an error naming
 * argument arg. */
void bind_infer_shape(lua_State *L, int arg, int ndim, int64_t *shape, const dev_view *from);

/* tensor_elementwise.c: NumPy broadcasting of n views (the result's shape,
 * each view expanded to it; -1 when they do not broadcast), and the check
 * of a condition or mask (a bool tensor). */
int bind_tensor_broadcast(int n, const dev_view *const *in, dev_view *ex, int *ndim, int64_t *shape);
void bind_tensor_check_cond(lua_State *L, int arg, const gpu_tensor *c, const char *what);

/* tensor_reduce.c: the reduction `code` of the tensor at 1 with the options
 * at 2 ({dim =, keepdim =, ...}). */
int bind_tensor_reduce(lua_State *L, dev_redop code);
/* A reduction's dim from the value at idx (nil: -1, every dim) of a tensor
 * of ndim dims, 0-based; raises as the reductions do. */
int bind_reduce_dim(lua_State *L, int idx, int ndim, const char *fname);
/* The output of reduction code of a tensor of dtype in along dim (-1:
 * all): its dtype, and (ndim, shape) made the output's (keepdim: 1 where
 * reduced).  Raises for a dtype the reduction does not take and for an
 * empty run it has no identity for. */
dev_dtype bind_reduce_out(lua_State *L, dev_redop code, dev_dtype in, int dim, int keepdim, int *ndim,
                          int64_t *shape);

int bind_tensor_tostring(lua_State *L);   /* __tostring (tensor_format.c) */

/* fuse.c: gpu.fuse, and its C half as the module "gpu._fuse" (preloaded) */
extern const luaL_Reg bind_fuse_funcs[];
void bind_fuse_preload(lua_State *L);

/* Each concern's methods and module functions, assembled by tensor.c. */
extern const luaL_Reg bind_tensor_copy_methods[], bind_tensor_view_methods[], bind_tensor_elementwise_methods[],
    bind_tensor_reduce_methods[], bind_tensor_index_methods[], bind_tensor_matmul_methods[],
    bind_tensor_table_methods[], bind_tensor_compose_methods[], bind_tensor_shape_methods[],
    bind_tensor_sort_methods[], bind_tensor_reorder_methods[];
extern const luaL_Reg bind_tensor_new_funcs[], bind_tensor_table_funcs[], bind_tensor_elementwise_funcs[],
    bind_tensor_matmul_funcs[], bind_tensor_compose_funcs[];
extern const luaL_Reg bind_tensor_elementwise_meta[];   /* __add ... __unm */

#endif
