/* Every elementwise op, reduction and op kind, declared once.
 *
 * Each list is an X-macro: X(ENUM, name, classes, result, flags), one row per
 * op.  Every layer reads it: the enums and names (device.h, dtype.c), the
 * device layer's validation (dev_op.c), the Lua methods and their checks
 * (bindings/tensor_elementwise.c, tensor_reduce.c), the host loops (cpu_ops.c) and the CUDA dispatch
 * (cuda/k_*.cu).  An op's arithmetic is one scalar function per compute type
 * in scalar.h: sc_<name>_f (float and double) for F, sc_<name>_i for I and B.
 *
 *   ENUM     the code: DEV_UN_<ENUM>, DEV_BIN_<ENUM>, DEV_TER_<ENUM>
 *   name     the Lua method and the name in messages
 *   classes  the dtypes it takes: F (f32 f64 f16 bf16), I (i8 u8 i32 i64),
 *            B (bool), as one token: F, FI, FIB
 *   result   SAME (the operands' dtype) or BOOL
 *   flags    DEV_OPF_ZDIV: integer division, a zero divisor is an error;
 *            DEV_OPF_LEFT: takes a number on its left (a metamethod: 2 - t);
 *            DEV_OPF_COND: (ternary) operand 1 is a bool condition, not of
 *            the op's dtype
 *
 * Unary ops have a `_` (in place) method when the result is SAME; binary ops
 * take a tensor or a number (or nothing, for a row of DEV_BINARY_DEFAULTS);
 * ternary ops a tensor or a number as operands 2 and 3 (their methods are a
 * line each in tensor_elementwise.c, `where` written out: the table gives
 * their names, dtype rules and kernels).  DEV_UN_COPY (the cast) is not in
 * the table.
 */
#ifndef GPULUA_OPS_H
#define GPULUA_OPS_H

#define DEV_OPF_ZDIV 1u
#define DEV_OPF_LEFT 2u
#define DEV_OPF_COND 4u

#define DEV_UNARY_OPS(X)                        \
  X(NEG, neg, FI, SAME, 0)                      \
  X(ABS, abs, FI, SAME, 0)                      \
  X(EXP, exp, F, SAME, 0)                       \
  X(LOG, log, F, SAME, 0)                       \
  X(SQRT, sqrt, F, SAME, 0)                     \
  X(RELU, relu, FI, SAME, 0)                    \
  X(SIGMOID, sigmoid, F, SAME, 0)               \
  X(TANH, tanh, F, SAME, 0)                     \
  X(LOGICAL_NOT, logical_not, FIB, BOOL, 0)     \
  X(FLOOR, floor, FI, SAME, 0)                  \
  X(CEIL, ceil, FI, SAME, 0)                    \
  X(ROUND, round, FI, SAME, 0)                  \
  X(TRUNC, trunc, FI, SAME, 0)                  \
  X(SIGN, sign, FI, SAME, 0)                    \
  X(SIN, sin, F, SAME, 0)                       \
  X(COS, cos, F, SAME, 0)                       \
  X(RSQRT, rsqrt, F, SAME, 0)                   \
  X(SQUARE, square, FI, SAME, 0)               \
  X(LOG1P, log1p, F, SAME, 0)                   \
  X(EXPM1, expm1, F, SAME, 0)                   \
  X(LOG2, log2, F, SAME, 0)                     \
  X(LOG10, log10, F, SAME, 0)                   \
  X(EXP2, exp2, F, SAME, 0)                     \
  X(TAN, tan, F, SAME, 0)                       \
  X(ASIN, asin, F, SAME, 0)                     \
  X(ACOS, acos, F, SAME, 0)                     \
  X(ATAN, atan, F, SAME, 0)                     \
  X(SINH, sinh, F, SAME, 0)                     \
  X(COSH, cosh, F, SAME, 0)                     \
  X(ERF, erf, F, SAME, 0)                       \
  X(RECIPROCAL, reciprocal, F, SAME, 0)         \
  X(GELU, gelu, F, SAME, 0)                     \
  X(SILU, silu, F, SAME, 0)                     \
  X(SOFTPLUS, softplus, F, SAME, 0)             \
  X(ISNAN, isnan, FIB, BOOL, 0)                 \
  X(ISINF, isinf, FIB, BOOL, 0)                 \
  X(ISFINITE, isfinite, FIB, BOOL, 0)

#define DEV_BINARY_OPS(X)                                   \
  X(ADD, add, FI, SAME, DEV_OPF_LEFT)                       \
  X(SUB, sub, FI, SAME, DEV_OPF_LEFT)                       \
  X(MUL, mul, FI, SAME, DEV_OPF_LEFT)                       \
  X(DIV, div, FI, SAME, DEV_OPF_LEFT | DEV_OPF_ZDIV)        \
  X(POW, pow, FI, SAME, DEV_OPF_LEFT)                       \
  X(MAX, max, FIB, SAME, 0)                                 \
  X(MIN, min, FIB, SAME, 0)                                 \
  X(EQ, eq, FIB, BOOL, 0)                                   \
  X(NE, ne, FIB, BOOL, 0)                                   \
  X(LT, lt, FIB, BOOL, 0)                                   \
  X(LE, le, FIB, BOOL, 0)                                   \
  X(GT, gt, FIB, BOOL, 0)                                   \
  X(GE, ge, FIB, BOOL, 0)                                   \
  X(LOGICAL_AND, logical_and, FIB, BOOL, 0)                 \
  X(LOGICAL_OR, logical_or, FIB, BOOL, 0)                  \
  X(FMOD, fmod, FI, SAME, DEV_OPF_ZDIV)                     \
  X(REMAINDER, remainder, FI, SAME, DEV_OPF_LEFT | DEV_OPF_ZDIV) \
  X(FLOOR_DIVIDE, floor_divide, FI, SAME, DEV_OPF_LEFT | DEV_OPF_ZDIV) \
  X(ATAN2, atan2, F, SAME, 0)                               \
  X(HYPOT, hypot, F, SAME, 0)                               \
  X(LEAKY_RELU, leaky_relu, F, SAME, 0)

/* where(cond, a, b): cond ? a : b; clamp(x, lo, hi): min(max(x, lo), hi);
 * lerp(a, b, w): a + w*(b - a) */
#define DEV_TERNARY_OPS(X)                                  \
  X(WHERE, where, FIB, SAME, DEV_OPF_COND)                  \
  X(CLAMP, clamp, FI, SAME, 0)                              \
  X(LERP, lerp, F, SAME, 0)

/* Binary ops whose operand may be left out: X(ENUM, default), the number
 * the method takes without one (t:leaky_relu() is t:leaky_relu(0.01)). */
#define DEV_BINARY_DEFAULTS(X)                              \
  X(LEAKY_RELU, 0.01)

/* Reductions: X(ENUM, name, classes, result), classes as above; result:
 *   SAME   the input's dtype
 *   ACC    floats keep their dtype, integers and bool give i64 (sum, prod)
 *   MEAN   floats keep their dtype, integers and bool give f64
 *   INDEX  i64, the 1-based position (the first, on ties)
 *   BOOL   bool
 * Options ride in the op's s0: var/std the correction (s0.i: 1 unbiased, 0
 * not), norm its p (s0.f: > 0, inf for the largest magnitude).  Of nothing
 * (a zero-sized dim): sum 0, prod 1, any false, all true, mean var std NaN,
 * norm 0, logsumexp -inf; max min argmax argmin raise (dev_redop_empty). */
#define DEV_REDUCE_OPS(X)                               \
  X(SUM, sum, FIB, ACC) X(MEAN, mean, FIB, MEAN)        \
  X(MAX, max, FIB, SAME) X(MIN, min, FIB, SAME)         \
  X(ARGMAX, argmax, FIB, INDEX)                         \
  X(ANY, any, FIB, BOOL) X(ALL, all, FIB, BOOL)         \
  X(PROD, prod, FIB, ACC)                               \
  X(VAR, var, F, SAME) X(STD, std, F, SAME)             \
  X(NORM, norm, F, SAME)                                \
  X(ARGMIN, argmin, FIB, INDEX)                         \
  X(LOGSUMEXP, logsumexp, F, SAME)

/* Op kinds: X(ENUM, name, flags), one row per kind of dev_kop, the code
 * DEV_OP_<ENUM> (device.h).  The device layer checks an op of kind name
 * with check_<name> (dev_op.c), after the checks every kind shares (the
 * operand count, the output and input views); a backend runs it (the host
 * loops in cpu_ops.c, the CUDA kernels in cuda/k_*.cu).
 *
 *   flags  DEV_OPK_NOIN: takes no tensor operand (nin 0);
 *          DEV_OPK_NOVIEWS: has no output view either (its check_<name>
 *          does all the checking);
 *          DEV_OPK_INPLACE: reads each input element only where it writes
 *          the output (elementwise): out may be exactly an input, as it is;
 *          DEV_OPK_MEMMOVE: the backends read every input element before
 *          they write any, whatever the overlap (copy)
 *
 * An output that overlaps an input otherwise (shifted, transposed, or an
 * op that reads other elements than it writes) is computed into a
 * temporary and copied to out by dev_submit, so that every op reads its
 * inputs before it writes (NumPy's rule); a new kind gets that for free.
 *
 *   FILL     out = s0
 *   ARANGE   out[i] = s0 + i*s1 (flat C order)
 *   RAND     code = dev_randkind; uniform [s0,s1) / normal(mean s0, std s1) /
 *            integers [s0,s1)
 *   UNARY    code = dev_unop; out = op(in[0])
 *   BINARY   code = dev_binop; out = in[0] op in[1] (or scalar, see flags)
 *   TERNARY  code = dev_terop; out = op(in[0], x, y): x, y the next tensor
 *            operands in[1], in[2], or s0, s1 (see flags)
 *   REDUCE   code = dev_redop; dim = -1 (all) or 0-based dim of in[0]; s0 the
 *            option of var/std/norm (above)
 *   MATMUL   out = in[0] @ in[1], 2-D, or 3-D with one batch size
 *   COPY     out = in[0], same dtype, same numel; flat element order.
 *            in[0] alone of every op's views may have negative strides,
 *            when in memory of out's kind and device (flip)
 *   SLEEP    hold the stream for ms milliseconds
 *   LAUNCH   a run-time kernel: see dev_launch
 *   CUMSUM   code = dev_cumkind; out = running sum or product of in[0] along
 *            dim (same shape; i64 for integer and bool sources, floats keep
 *            their dtype)
 *   SOFTMAX  code = dev_softkind; out = softmax or log_softmax of in[0] along
 *            dim, float dtypes, same shape
 *   INDEX    code = dev_idxkind; dim the 0-based dim; indices 1-based, one
 *            outside 1..size fails the op ("index out of range").
 *            SELECT, GATHER: out[p] = in[0][p with p[dim] = in[1][p]], in[1]
 *              an integer tensor of out's shape (select: a 1-D index seen with
 *              stride 0 along the other dims), in[0] of out's dtype and ndim,
 *              no smaller than out along the other dims;
 *            SCATTER_ADD: out[p with p[dim] = in[0][p]] += in[1][p] for p over
 *              in[0]'s shape, in place; in[1] of out's dtype, no smaller than
 *              in[0]; out no smaller than in[0] along the other dims.
 *            s0 is free for a backend (cuda: the op's tag in its error flag)
 *   SORT     code = DEV_SORT_* flags; out (i64, in[0]'s shape) = the 1-based
 *            positions along dim of in[0]'s elements in sorted order: NaN
 *            above every number (last ascending, first descending); equal
 *            keys keep their order (every sort is stable).  out may be
 *            shorter along dim (k <= in[0]'s): the first k of them (topk)
 *   FUSED    out = fprog's result (device.h: dev_fprog), a chain of the
 *            elementwise ops above; its tensor inputs (each of out's shape,
 *            broadcast with stride 0) are in[], then fargs->xin[]
 *            (dev_kop_in), its number parameters fargs->param[].  With
 *            DEV_F_FREDUCE in flags (a program with red[]), out and
 *            fargs->xout[] = the results (tensors of the inputs' shape)
 *            reduced as REDUCE reduces them, each by its red[] (SUM, MEAN,
 *            PROD, MAX, MIN) along dim: the same values, in one pass
 */
#define DEV_OPK_NOIN 1u
#define DEV_OPK_NOVIEWS 2u
#define DEV_OPK_INPLACE 4u
#define DEV_OPK_MEMMOVE 8u

#define DEV_OP_KINDS(X)                                 \
  X(FILL, fill, DEV_OPK_NOIN)                           \
  X(ARANGE, arange, DEV_OPK_NOIN)                       \
  X(RAND, rand, DEV_OPK_NOIN)                           \
  X(UNARY, unary, DEV_OPK_INPLACE)                      \
  X(BINARY, binary, DEV_OPK_INPLACE)                    \
  X(TERNARY, ternary, DEV_OPK_INPLACE)                  \
  X(REDUCE, reduce, 0)                                  \
  X(MATMUL, matmul, 0)                                  \
  X(COPY, copy, DEV_OPK_MEMMOVE)                        \
  X(SLEEP, sleep, DEV_OPK_NOIN | DEV_OPK_NOVIEWS)       \
  X(LAUNCH, launch, DEV_OPK_NOIN | DEV_OPK_NOVIEWS)     \
  X(CUMSUM, cumsum, 0)                                  \
  X(SOFTMAX, softmax, 0)                                \
  X(INDEX, index, 0)                                    \
  X(SORT, sort, 0)                                      \
  X(FUSED, fused, DEV_OPK_INPLACE)

/* ---- reading the columns ------------------------------------------------- */

/* The classes as bits (dev_dtype_class gives a dtype's). */
#define DEV_CLS_F 1u
#define DEV_CLS_I 2u
#define DEV_CLS_B 4u
#define DEV_CLASSES_F DEV_CLS_F
#define DEV_CLASSES_FI (DEV_CLS_F | DEV_CLS_I)
#define DEV_CLASSES_FIB (DEV_CLS_F | DEV_CLS_I | DEV_CLS_B)
#define DEV_CLASSES(cls) DEV_CLASSES_##cls

/* DEV_IF_F(cls, code): code when the op has a float formula (sc_<name>_f and
 * _d); DEV_IF_I(cls, code): when it has an integer one (sc_<name>_i, also
 * used for bool). */
#define DEV_IF_F(cls, ...) DEV_IF_F_##cls(__VA_ARGS__)
#define DEV_IF_F_F(...) __VA_ARGS__
#define DEV_IF_F_FI(...) __VA_ARGS__
#define DEV_IF_F_FIB(...) __VA_ARGS__
#define DEV_IF_I(cls, ...) DEV_IF_I_##cls(__VA_ARGS__)
#define DEV_IF_I_F(...)
#define DEV_IF_I_FI(...) __VA_ARGS__
#define DEV_IF_I_FIB(...) __VA_ARGS__

/* The result column: DEV_IF_SAME(res, code) keeps code for SAME only. */
#define DEV_RES_SAME 0
#define DEV_RES_BOOL 1
#define DEV_RESULT(res) DEV_RES_##res
#define DEV_IF_SAME(res, ...) DEV_IF_SAME_##res(__VA_ARGS__)
#define DEV_IF_SAME_SAME(...) __VA_ARGS__
#define DEV_IF_SAME_BOOL(...)

/* A reduction's result column. */
#define DEV_RRES_SAME 0
#define DEV_RRES_ACC 1
#define DEV_RRES_MEAN 2
#define DEV_RRES_INDEX 3
#define DEV_RRES_BOOL 4
#define DEV_RRESULT(res) DEV_RRES_##res

#endif
