/* What the gpu.Tensor files share: tensor.c (the type and its ops),
 * tensor_format.c (tostring), tensor_table.c (gpu.tensor from nested
 * tables, t:totable), tensor_view.c (views, cat/stack, creation) and
 * tensor_reduce.c (reductions, softmax, indexing). */
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

/* tensor.c's helpers for the ops of the other files: a 1-based (or negative)
 * dim at idx as 0-based (errors name argument arg, or option 'dim' when arg
 * is 0); the out option's value (slot out) checked against the result and
 * pushed, else a new tensor like `like` made for slot stream's stream; an
 * argument error unless a and b are in memory an op can mix; enqueue op on
 * slot stream's stream, its views' buffers taken from the tensors at stack
 * indices out and in[] (0: keep the view's). */
int bind_tensor_dim(lua_State *L, int idx, int arg, int ndim);
gpu_tensor *bind_tensor_out(lua_State *L, int out, int stream, const gpu_tensor *like, dev_dtype dt, int ndim,
                            const int64_t *shape, const char *fname);
void bind_tensor_same_kind(lua_State *L, int arg, const gpu_tensor *a, const gpu_tensor *b);
void bind_tensor_submit(lua_State *L, int stream, dev_kop *op, int out, const int *in, int nin, const char *fname);

/* tensor_reduce.c: reductions, cumsum, softmax, indexing.  The reduction
 * `code` of the tensor at 1 with the options at 2 ({dim =, keepdim =, ...}). */
int bind_tensor_reduce(lua_State *L, dev_redop code);
extern const luaL_Reg bind_tensor_reduce_methods[];   /* added to gpu.Tensor's methods */

int bind_tensor_tostring(lua_State *L);   /* __tostring (tensor_format.c) */
int bind_tensor_from(lua_State *L);       /* gpu.tensor(values, opts) (tensor_table.c) */
int bind_tensor_totable(lua_State *L);    /* t:totable([opts]) (tensor_table.c) */
/* Views, joins and the *_like constructors (tensor_view.c): adds its methods
 * to gpu.Tensor and its functions to the module table on top. */
void bind_open_tensor_view(lua_State *L);
/* The sizes of shape, one of which may be -1 (inferred), checked against
 * the elements of from: -1 resolved, else an error naming argument arg
 * (t:view, t:reshape). */
void bind_infer_shape(lua_State *L, int arg, int ndim, int64_t *shape, const dev_view *from);

#endif
