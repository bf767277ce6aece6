/* The CUDA of a fused program (DEV_OP_FUSED, device.h: dev_fprog), and its
 * compile through NVRTC.  No GPU is needed here: CI compiles every op of the
 * table this way (tests/cuda/nvrtc_fused.c).
 *
 * Each node becomes one statement that calls the built-in op's own element
 * function of k_elem.cuh (kun, kbin, kter, k_cast, k_load/k_store,
 * k_scalar), so that a fused call equals the unfused ops bit for bit.  Floating-point contraction is off here and in
 * the built-in kernels (the Makefile's -fmad=false): an FMA across two ops
 * would round once where the unfused ops round twice.
 *
 * Each node's value is kept in its op's compute type, rounded to its dtype
 * (k_round: what the next op would load of the stored result).
 *
 * A program that ends in reductions (DEV_F_FREDUCE; dev_fprog.red) has,
 * instead of gf, gfr_rows, gfr_cols and gfr_run: k_reduce.cuh's bodies of
 * the built-in reduction's kernels, reading the program's values where
 * those read memory and carrying one accumulator per result (rmulti),
 * launched on the built-in's plan (k_reduce.cu: cuk_reduce_fused), so each
 * result is the unfused reduction's bit for bit, in one pass.
 *
 * Two variants of the kernel `gf` per program, each compiled when first
 * needed: one for every view contiguous and 16-byte aligned, which moves 16
 * bytes per load of its widest dtype, one for any layout (broadcast inputs
 * have stride 0) through k_at.  It takes one parameter, gf_args: the views
 * as k_view makes them (contiguous: their first elements' addresses; the
 * driver copies each launch's parameters, so they are kept small), the
 * element count, the division-by-zero flag and its tag, then one number per
 * number operand, already in the compute type of the op that reads it
 * (k_fused.cu fills it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu.h"
#include "scalar.h"
#include "util.h"

/* The headers a fused kernel includes, embedded at build time
 * ($(BUILD)/gen/fused_hdr.c): k_elem.cuh, device.h, ops.h, scalar.h. */
extern const char *const cuda_fused_hdr_names[];
extern const char *const cuda_fused_hdr_texts[];
extern const int cuda_fused_hdr_count;

/* Stand-ins for the C headers they include: NVRTC has none, and the
 * element layer needs only these names.  (Its math functions are NVRTC's
 * own built-ins, as in any kernel it compiles.) */
static const char shim_stdint[] =
    "#pragma once\n"
    "typedef signed char int8_t; typedef unsigned char uint8_t;\n"
    "typedef short int16_t; typedef unsigned short uint16_t;\n"
    "typedef int int32_t; typedef unsigned int uint32_t;\n"
    "typedef long long int64_t; typedef unsigned long long uint64_t;\n"
    "typedef long long intptr_t; typedef unsigned long long uintptr_t;\n"
    "#define INT8_MIN (-128)\n#define INT8_MAX 127\n#define UINT8_MAX 255\n"
    "#define INT16_MIN (-32768)\n#define INT16_MAX 32767\n#define UINT16_MAX 65535\n"
    "#define INT32_MIN (-2147483647 - 1)\n#define INT32_MAX 2147483647\n#define UINT32_MAX 4294967295U\n"
    "#define INT64_MIN (-9223372036854775807LL - 1)\n#define INT64_MAX 9223372036854775807LL\n"
    "#define UINT64_MAX 18446744073709551615ULL\n";
static const char shim_stddef[] =
    "#pragma once\n"
    "typedef unsigned long size_t; typedef long ptrdiff_t;\n"
    "#ifndef NULL\n#define NULL 0\n#endif\n"
    "#define offsetof(t, m) __builtin_offsetof(t, m)\n";
static const char shim_limits[] =
    "#pragma once\n"
    "#define CHAR_BIT 8\n#define INT_MAX 2147483647\n#define INT_MIN (-INT_MAX - 1)\n"
    "#define LLONG_MAX 9223372036854775807LL\n#define LLONG_MIN (-LLONG_MAX - 1)\n";
static const char shim_empty[] = "#pragma once\n";

#define DT(t) [DEV_##t] = "DEV_" #t
static const char *const dt_enum[DEV_NDTYPE] = {DT(F32), DT(F64), DT(F16), DT(BF16), DT(I8),
                                                DT(U8),  DT(I32), DT(I64), DT(BOOL)};
#undef DT
#define OPNAME(E, name, cls, res, fl) [DEV_UN_##E] = "DEV_UN_" #E,
static const char *const un_enum[DEV_NUNOP] = {DEV_UNARY_OPS(OPNAME)};
#undef OPNAME
#define OPNAME(E, name, cls, res, fl) [DEV_BIN_##E] = "DEV_BIN_" #E,
static const char *const bin_enum[DEV_NBINOP] = {DEV_BINARY_OPS(OPNAME)};
#undef OPNAME
#define OPNAME(E, name, cls, res, fl) [DEV_TER_##E] = "DEV_TER_" #E,
static const char *const ter_enum[DEV_NTEROP] = {DEV_TERNARY_OPS(OPNAME)};
#undef OPNAME

static int is_num(const dev_fnode *x) { return x->kind == DEV_FN_CONST || x->kind == DEV_FN_PARAM; }
static int is_int(dev_dtype t) { return t != DEV_F32 && t != DEV_F64 && t != DEV_F16 && t != DEV_BF16; }
static const char *knum_field(dev_dtype t) { return t == DEV_F64 ? "d" : is_int(t) ? "i" : "f"; }
static int dsize(dev_dtype t) { return (int)dev_dtype_size(t); }

/* The dtype an op's operands are loaded as (the compute type's dtype): a
 * comparison's is its tensor operand's, the others' their own. */
static dev_dtype operand_dtype(const dev_fprog *p, const dev_fnode *x) {
  if (x->kind == DEV_FN_BINARY) return p->node[x->a[is_num(&p->node[x->a[0]])]].dtype;
  if (x->kind == DEV_FN_UNARY || x->kind == DEV_FN_CAST) return p->node[x->a[0]].dtype;
  return x->dtype;
}

int cuda_fused_numbers(const dev_fprog *p) {
  int q = 0;
  for (int i = 0; i < p->n; i++) {
    const dev_fnode *x = &p->node[i];
    int nop = x->kind == DEV_FN_BINARY ? 2 : x->kind == DEV_FN_TERNARY ? 3 : x->kind == DEV_FN_UNARY ? 1 : 0;
    for (int j = 0; j < nop; j++) q += is_num(&p->node[x->a[j]]);
  }
  return q;
}

/* Operand j of node i in its op's compute type, into b (q: the next number;
 * sfx: which element of a pair). */
static void operand(sbuf *b, const dev_fprog *p, int i, int j, dev_dtype t, int *q, const char *sfx) {
  int a = p->node[i].a[j];
  if (is_num(&p->node[a])) sb_printf(b, "a.num[%d].%s", (*q)++, knum_field(t));
  else sb_printf(b, "v%d%s", a, sfx);
}

/* Node i of p as one statement of gf_elem, into b (q: the next number).
 * sfx names the element of a pair (gf_elem2: "a", "b"; else ""); raw
 * leaves an op's result unrounded: the pair is rounded at once after. */
static int node_stmt(sbuf *b, const dev_fprog *p, int i, int *q, const char *sfx, int raw, char *err,
                     size_t errlen) {
  const dev_fnode *x = &p->node[i];
  const char *to = dt_enum[x->dtype];
  const char *rnd = raw ? "" : "k_round<", *rto = raw ? "" : to, *rgt = raw ? "" : ">";
  dev_dtype t = operand_dtype(p, x);
  switch (x->kind) {
  case DEV_FN_INPUT: sb_printf(b, "  kt<%s>::C v%d%s = k_load<%s>(x%d%s);\n", to, i, sfx, to, x->index, sfx); break;
  case DEV_FN_CONST: case DEV_FN_PARAM: break;
  case DEV_FN_UNARY:
    if ((unsigned)x->code >= DEV_NUNOP) return fail_msg(err, errlen, "%s: bad op", p->name);
    sb_printf(b, "  kt<%s>::C v%d%s = %s%s%s(kun<%s>::f(", to, i, sfx, rnd, rto, rgt, un_enum[x->code]);
    operand(b, p, i, 0, t, q, sfx);
    sb_str(b, "));\n");
    break;
  case DEV_FN_BINARY: {
    if ((unsigned)x->code >= DEV_NBINOP) return fail_msg(err, errlen, "%s: bad op", p->name);
    const dev_opinfo *o = dev_binop_info(x->code);
    sb_printf(b, "  kt<%s>::C l%d%s = ", dt_enum[t], i, sfx);
    operand(b, p, i, 0, t, q, sfx);
    sb_printf(b, ", r%d%s = ", i, sfx);
    operand(b, p, i, 1, t, q, sfx);
    sb_str(b, ";\n");
    if ((o->flags & DEV_OPF_ZDIV) && is_int(t)) sb_printf(b, "  if (r%d%s == 0) z = 1;\n", i, sfx);
    sb_printf(b, "  kt<%s>::C v%d%s = %s%s%s(kbin<%s>::f(l%d%s, r%d%s));\n", to, i, sfx, rnd, rto, rgt,
              bin_enum[x->code], i, sfx, i, sfx);
    break;
  }
  case DEV_FN_TERNARY: {
    if ((unsigned)x->code >= DEV_NTEROP) return fail_msg(err, errlen, "%s: bad op", p->name);
    const dev_opinfo *o = dev_terop_info(x->code);
    sb_printf(b, "  kt<%s>::C v%d%s = %s%s%s(kter<%s>::f(", to, i, sfx, rnd, rto, rgt, ter_enum[x->code]);
    for (int j = 0; j < 3; j++) {
      if (j) sb_str(b, ", ");
      /* a condition: bool, 0/1 in the compute type */
      if (j == 0 && (o->flags & DEV_OPF_COND)) sb_printf(b, "(kt<%s>::C)v%d%s", to, x->a[0], sfx);
      else operand(b, p, i, j, t, q, sfx);
    }
    sb_str(b, "));\n");
    break;
  }
  case DEV_FN_CAST:
    /* the unfused cast, from the value stored (exactly: it is rounded) */
    sb_printf(b, "  kt<%s>::C v%d%s = k_load<%s>(k_cast<%s, %s>(k_store<%s>(v%d%s)));\n", to, i, sfx, to, dt_enum[t],
              to, dt_enum[t], x->a[0], sfx);
    break;
  default: return fail_msg(err, errlen, "%s: bad node %d", p->name, i + 1);
  }
  return 0;
}

/* bf16 and f16: the dtypes whose pairs fused kernels keep packed */
static int is_p16(dev_dtype t) { return t == DEV_BF16 || t == DEV_F16; }

/* The float of a number node, as k_fused.cu's number() makes it */
static float num_float(const dev_fnode *x) { return sc_d2f(x->k.is_int ? (double)x->k.i : x->k.f); }

/* f's bits in t (bf16 or f16), rounded */
static unsigned p16_bits(dev_dtype t, float f) { return t == DEV_BF16 ? sc_float_to_bf16(f) : sc_float_to_half(f); }

/* Whether node a of p holds a value of t (bf16 or f16) exactly: 1 for a
 * tensor node of t, or a CONST whose float is one; 2 for a PARAM, whose
 * value is known only at run time; else 0. */
static int p16_exact(const dev_fprog *p, int a, dev_dtype t) {
  const dev_fnode *x = &p->node[a];
  if (x->kind == DEV_FN_PARAM) return 2;
  if (x->kind != DEV_FN_CONST) return x->dtype == t;
  float f = num_float(x);
  unsigned u = p16_bits(t, f);
  float g = t == DEV_BF16 ? sc_bf16_to_float((uint16_t)u) : sc_half_to_float((uint16_t)u);
  return f == f && g == f;
}

/* The packed op of node i (k_elem.cuh: k_p2_<op><T>), or NULL: + - x of two
 * values of T to a result of T, and exp (and, for bf16, tanh) of T, are
 * exact so.  (f16's tanh is not: docs/internals.md.) */
static const char *p16_op(const dev_fprog *p, int i) {
  const dev_fnode *x = &p->node[i];
  if (!is_p16(x->dtype)) return NULL;
  if (x->kind == DEV_FN_UNARY && p->node[x->a[0]].dtype == x->dtype && !is_num(&p->node[x->a[0]])) {
    if (x->code == DEV_UN_TANH && x->dtype == DEV_BF16) return "tanh";
    return x->code == DEV_UN_EXP ? "exp" : NULL;
  }
  if (x->kind != DEV_FN_BINARY || operand_dtype(p, x) != x->dtype) return NULL;
  int e0 = p16_exact(p, x->a[0], x->dtype), e1 = p16_exact(p, x->a[1], x->dtype);
  if (!e0 || !e1 || (e0 == 2 && e1 == 2)) return NULL;
  switch (x->code) {
  case DEV_BIN_ADD: return "add";
  case DEV_BIN_SUB: return "sub";
  case DEV_BIN_MUL: return "mul";
  default: return NULL;
  }
}

/* Operand j of node i as a packed pair of T, into b */
static void p16_operand(sbuf *b, const dev_fprog *p, int i, int j, const char *T, int *q) {
  const dev_fnode *x = &p->node[p->node[i].a[j]];
  if (x->kind == DEV_FN_CONST) {
    /* its bits, a constant of the kernel (p16_exact: exact) */
    unsigned u = p16_bits(p->node[i].dtype, num_float(x));
    sb_printf(b, "k_p2_bits<%s>(0x%04x, 0x%04x)", T, u, u);
    (*q)++;
  } else if (is_num(x)) {
    sb_printf(b, "k_p2_num<%s>(a.num[%d].f)", T, (*q)++);
  } else {
    sb_printf(b, "h%d", p->node[i].a[j]);
  }
}

/* The packed binary op f of node i, both operands, into b */
static void p16_binary(sbuf *b, const dev_fprog *p, int i, const char *f, const char *T, int *q) {
  sb_printf(b, "k_p2_%s<%s>(", f, T);
  p16_operand(b, p, i, 0, T, q);
  sb_str(b, ", ");
  p16_operand(b, p, i, 1, T, q);
  sb_str(b, ")");
}

/* pair_stmt of a packed op f with a PARAM operand: packed when the number
 * is exact in T (a branch on a kernel parameter: the same way in every
 * thread), else the float op rounded. */
static int pair_param(sbuf *b, const dev_fprog *p, int i, const char *f, int *q, char *err, size_t errlen) {
  const char *T = dt_enum[p->node[i].dtype];
  int q0 = *q;
  sb_printf(b, "  kp2<%s> h%d;\n  if (k_p2_exact<%s>(a.num[%d].f)) {\n    h%d = ", T, i, T, q0, i);
  p16_binary(b, p, i, f, T, q);
  sb_str(b, ";\n  } else {\n");
  *q = q0;
  if (node_stmt(b, p, i, q, "a", 1, err, errlen)) return -1;
  *q = q0;
  if (node_stmt(b, p, i, q, "b", 1, err, errlen)) return -1;
  sb_printf(b, "  h%d = k_p2_round<%s>(v%da, v%db);\n  }\n", i, T, i, i);
  sb_printf(b, "  kp1<%s> v%da = k_p2_lo<%s>(h%d), v%db = k_p2_hi<%s>(h%d);\n", T, i, T, i, i, T, i);
  return 0;
}

/* Node i of p as statements of gf_elem2, for both elements of the pair (q:
 * the next number).  A bf16 or f16 node has its value packed too, h<i>
 * (unused ones cost nothing: the compiler drops them), so that the packed
 * ops of p16_op read and write pairs; every node keeps v<i>a, v<i>b, its
 * elements (floats, or kp1 for a packed op's). */
static int pair_stmt(sbuf *b, const dev_fprog *p, int i, int *q, char *err, size_t errlen) {
  const dev_fnode *x = &p->node[i];
  const char *T = dt_enum[x->dtype], *f = p16_op(p, i);
  int q0 = *q, op = x->kind == DEV_FN_UNARY || x->kind == DEV_FN_BINARY || x->kind == DEV_FN_TERNARY;
  if (f && x->kind == DEV_FN_BINARY &&
      (p->node[x->a[0]].kind == DEV_FN_PARAM || p->node[x->a[1]].kind == DEV_FN_PARAM))
    return pair_param(b, p, i, f, q, err, errlen);
  if (f) {
    sb_printf(b, "  kp2<%s> h%d = ", T, i);
    int a0 = x->a[0];
    /* bf16's tanh reads the pair (its operand is a node of T: every such
     * node has one) */
    if (x->kind == DEV_FN_UNARY && strcmp(f, "tanh") == 0) sb_printf(b, "k_p2_tanh_bf16(h%d)", a0);
    else if (x->kind == DEV_FN_UNARY) sb_printf(b, "k_p2_%s<%s>(v%da, v%db)", f, T, a0, a0);
    else p16_binary(b, p, i, f, T, q);
    sb_printf(b, ";\n  kp1<%s> v%da = k_p2_lo<%s>(h%d), v%db = k_p2_hi<%s>(h%d);\n", T, i, T, i, i, T, i);
    return 0;
  }
  if (node_stmt(b, p, i, q, "a", op, err, errlen)) return -1;
  *q = q0;
  if (node_stmt(b, p, i, q, "b", op, err, errlen)) return -1;
  if (!is_p16(x->dtype) || is_num(x)) {
    if (op) sb_printf(b, "  k_round2<%s>(v%da, v%db);\n", T, i, i);
  } else if (x->kind == DEV_FN_INPUT) {
    sb_printf(b, "  kp2<%s> h%d = k_p2_bits<%s>(x%da, x%db);\n", T, i, T, x->index, x->index);
  } else {
    /* rounded (an op), or already of T (a cast) */
    sb_printf(b, "  kp2<%s> h%d = k_p2_%s<%s>(v%da, v%db);\n", T, i, op ? "round" : "pack", T, i, i);
  }
  return 0;
}

/* gf_elem2: two elements at once, the program's statements for each, and
 * each op's two results rounded together (k_round2: one packed conversion
 * for bf16 and f16, whose conversions bound a chain's speed). */
static int elem2(sbuf *b, const dev_fprog *p, int nin, const char *const *in_dt, const char *const *out_dt, char *err,
                 size_t errlen) {
  int q = 0;
  sb_str(b, "static __device__ __forceinline__ void gf_elem2(const gf_args &a");
  for (int k = 0; k < nin; k++) sb_printf(b, ", kt<%s>::S x%da, kt<%s>::S x%db", in_dt[k], k, in_dt[k], k);
  for (int o = 0; o < p->nout; o++) sb_printf(b, ", kt<%s>::S &out%da, kt<%s>::S &out%db", out_dt[o], o, out_dt[o], o);
  sb_str(b, ", int &z)\n{\n");
  for (int i = 0; i < p->n; i++) {
    if (pair_stmt(b, p, i, &q, err, errlen)) return -1;
  }
  for (int o = 0; o < p->nout; o++) {
    const dev_fnode *r = &p->node[p->res[o]];
    /* a node of bf16 or f16 stored as its pair's bits, halves of one word:
     * no unpacking and packing again */
    if (is_p16(r->dtype) && !is_num(r))
      sb_printf(b, "  k_p2_put<%s>(out%da, out%db, h%d);\n", out_dt[o], o, o, p->res[o]);
    else
      sb_printf(b, "  out%da = k_store<%s>(v%da);\n  out%db = k_store<%s>(v%db);\n", o, out_dt[o], p->res[o], o,
                out_dt[o], p->res[o]);
  }
  sb_str(b, "}\n\n");
  return 0;
}

#define RNAME(E, name, cls, res) [DEV_RED_##E] = "DEV_RED_" #E,
static const char *const red_enum[DEV_NREDOP] = {DEV_REDUCE_OPS(RNAME)};
#undef RNAME

/* The x<k> arguments of gf_elem for element i (an expression) */
static void elem_args(sbuf *b, int nin, const char *const *in_dt, int vec, const char *i) {
  for (int k = 0; k < nin; k++) {
    if (vec) sb_printf(b, ", ((const kt<%s>::S *)a.in[%d])[%s]", in_dt[k], k, i);
    else sb_printf(b, ", *k_at<kt<%s>::S>(a.in[%d], %s)", in_dt[k], k, i);
  }
}

/* The reductions' kernels: k_reduce.cuh's bodies, whose elements are the
 * program's values (gsrc) rather than memory, reduced by rmulti (one
 * accumulator per result).  Element q - NULL of the run is element i of
 * each result; at16 is N of each, N-aligned. */
static void reduce_src(sbuf *b, const dev_fprog *p, int nin, const char *const *in_dt, const char *out_dt, int vec,
                       int mask) {
  int K = p->nout;
  /* any layout: each element walks every input's view (k_at), so the
   * element is one function, not inlined at each of the bodies' sites (it
   * would be at about 80 for a u8 result: minutes of NVRTC) */
  const char *inl = vec ? "__forceinline__" : "__noinline__";
  sb_printf(b, "struct gsrc {\n  gf_args a;\n  krouts o;\n  typedef kt<%s>::S S;\n  typedef kv4<S> V;\n"
               "  typedef kp4<S> P;\n", out_dt);
  sb_printf(b, "  __device__ %s V at(const S *q) const\n  {\n", inl);
  sb_str(b, "    int64_t i = (int64_t)((uintptr_t)q / sizeof(S));\n    int z = 0;\n    V r = V();\n    gf_elem(a");
  elem_args(b, nin, in_dt, vec, "i");
  for (int k = 0; k < K; k++) sb_printf(b, ", r.x[%d]", k);
  sb_str(b, ", z);\n    if (z && a.zflag) *a.zflag = a.ztag;\n    return r;\n  }\n");
  sb_printf(b, "  __device__ %s P at16(const uint4 *q) const\n  {\n", inl);
  sb_str(b, ""
            "    constexpr int N = 16 / sizeof(S);\n"
            "    int64_t i = (int64_t)((uintptr_t)q / sizeof(S));\n    int z = 0;\n    P r = P();\n");
  if (vec) {
    /* N of each input at once (aligned: i is a multiple of N) */
    for (int k = 0; k < nin; k++)
      sb_printf(b, "    kpack<kt<%s>::S, N> p%d = ((const kpack<kt<%s>::S, N> *)a.in[%d])[i / N];\n", in_dt[k], k,
                in_dt[k], k);
    sb_str(b, "#pragma unroll\n    for (int j = 0; j < N; j += 2) gf_elem2(a");
    for (int k = 0; k < nin; k++) sb_printf(b, ", p%d.x[j], p%d.x[j + 1]", k, k);
    for (int k = 0; k < K; k++) sb_printf(b, ", r.v[%d].x[j], r.v[%d].x[j + 1]", k, k);
    sb_str(b, ", z);\n");
  } else {
    sb_str(b, "    for (int j = 0; j < N; j++) {\n      V e = at((const S *)q + j);\n");
    for (int k = 0; k < K; k++) sb_printf(b, "      r.v[%d].x[j] = e.x[%d];\n", k, k);
    sb_str(b, "    }\n");
  }
  sb_str(b, "    if (z && a.zflag) *a.zflag = a.ztag;\n    return r;\n  }\n");
  sb_str(b, "  static __device__ __forceinline__ V pick(const P &p, int j)\n  {\n    V v = V();\n");
  for (int k = 0; k < K; k++) sb_printf(b, "    v.x[%d] = p.v[%d].x[j];\n", k, k);
  sb_str(b, "    return v;\n  }\n};\n\n");
  char R[160];
  snprintf(R, sizeof R, "rmulti<%s, %s, %s, %s, %s>", out_dt, red_enum[p->red[0]], K > 1 ? red_enum[p->red[1]] : "-1",
           K > 2 ? red_enum[p->red[2]] : "-1", K > 3 ? red_enum[p->red[3]] : "-1");
  /* k_reduce.cu's three kernels, in the order of CUK_RED_*: those in mask */
  static const char *const kname[] = {"rows", "cols", "run"};
  /* loads in flight in a run (U: the speed, not the tree): 8 for one
   * result; 2 for several, whose pass is bound by issue, not memory (on an
   * H200, sum and sum of squares of 256 MiB f32: 84.5 us with 8, 83.5 with
   * 2; sum, sum of squares, max and min: 219.7 and 208.6) */
  char run[64];
  snprintf(run, sizeof run, "k_reduce_rows<%%s, %%s, gsrc, %d, true>", K > 1 ? 2 : 8);
  const char *const body[] = {"k_reduce_rows<%s, %s, gsrc>", "k_reduce_cols<%s, %s, gsrc>", run};
  for (int k = 0; k < 3; k++) {
    if (!(mask & (1 << k))) continue;
    sb_printf(b, "extern \"C\" __global__ void __launch_bounds__(256) gfr_%s(const krargs r, const gf_args a, "
                 "const krouts o)\n{\n  ", kname[k]);
    sb_printf(b, body[k], out_dt, R);
    sb_str(b, "(r, gsrc{a, o});\n}\n");
  }
}

/* gf_elem: the program, one statement per node, each value in its op's
 * compute type rounded to its dtype (k_round); the results stored through
 * out0.. after every input was read (an output may be an input's memory;
 * node_stmt's own names are v, l and r with the node's number). */
static int elem1(sbuf *b, const dev_fprog *p, int nin, const char *const *in_dt, const char *const *out_dt,
                 char *err, size_t errlen) {
  int q = 0;
  sb_str(b, "static __device__ __forceinline__ void gf_elem(const gf_args &a");
  for (int k = 0; k < nin; k++) sb_printf(b, ", kt<%s>::S x%d", in_dt[k], k);
  for (int o = 0; o < p->nout; o++) sb_printf(b, ", kt<%s>::S &out%d", out_dt[o], o);
  sb_str(b, ", int &z)\n{\n");
  for (int i = 0; i < p->n; i++)
    if (node_stmt(b, p, i, &q, "", 0, err, errlen)) return -1;
  for (int o = 0; o < p->nout; o++) sb_printf(b, "  out%d = k_store<%s>(v%d);\n", o, out_dt[o], p->res[o]);
  sb_str(b, "}\n\n");
  return 0;
}

/* The kernel gf: each element (any layout), or V at a time (contiguous and
 * aligned: 16 bytes of the widest dtype a step, then the tail one by one). */
static void kernel(sbuf *b, const dev_fprog *p, int nin, const char *const *in_dt, const char *const *out_dt, int vec,
                   int widest) {
  sb_str(b, "extern \"C\" __global__ void __launch_bounds__(256) gf(const gf_args a)\n{\n"
            "  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x, i = tid;\n"
            "  int z = 0;\n");
  if (!vec) {
    sb_str(b, "  for (; i < a.n; i += nth)\n    gf_elem(a");
    for (int k = 0; k < nin; k++) sb_printf(b, ", *k_at<kt<%s>::S>(a.in[%d], i)", in_dt[k], k);
    for (int o = 0; o < p->nout; o++) sb_printf(b, ", *k_at<kt<%s>::S>(a.out[%d], i)", out_dt[o], o);
  } else {
    int V = 16 / widest;
    sb_printf(b, "  const int64_t nv = a.n / %d;\n  for (; i < nv; i += nth) {\n", V);
    for (int k = 0; k < nin; k++)
      sb_printf(b, "    kpack<kt<%s>::S, %d> p%d = ((const kpack<kt<%s>::S, %d> *)a.in[%d])[i];\n", in_dt[k], V, k,
                in_dt[k], V, k);
    for (int o = 0; o < p->nout; o++) sb_printf(b, "    kpack<kt<%s>::S, %d> r%d;\n", out_dt[o], V, o);
    sb_printf(b, "#pragma unroll\n    for (int j = 0; j < %d; j += 2) gf_elem2(a", V);
    for (int k = 0; k < nin; k++) sb_printf(b, ", p%d.x[j], p%d.x[j + 1]", k, k);
    for (int o = 0; o < p->nout; o++) sb_printf(b, ", r%d.x[j], r%d.x[j + 1]", o, o);
    sb_str(b, ", z);\n");
    for (int o = 0; o < p->nout; o++)
      sb_printf(b, "    ((kpack<kt<%s>::S, %d> *)a.out[%d])[i] = r%d;\n", out_dt[o], V, o, o);
    sb_printf(b, "  }\n  for (i = nv * %d + tid; i < a.n; i += nth)\n    gf_elem(a", V);
    for (int k = 0; k < nin; k++) sb_printf(b, ", ((const kt<%s>::S *)a.in[%d])[i]", in_dt[k], k);
    for (int o = 0; o < p->nout; o++) sb_printf(b, ", ((kt<%s>::S *)a.out[%d])[i]", out_dt[o], o);
  }
  sb_str(b, ", z);\n  if (z && a.zflag) *a.zflag = a.ztag;\n}\n");
}

/* p's name as the source's comment and NVRTC's file name may hold it: any
 * byte but letters, digits and _.:@/+- as '_' (a user's name may hold a
 * quote, which the PTX's .file directive does not escape, or a newline,
 * which would end the comment). */
static void plain_name(const dev_fprog *p, char *out, size_t n) {
  size_t i = 0;
  for (const char *c = p->name; *c && i + 1 < n; c++, i++) {
    int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("_.:@/+-", *c);
    out[i] = ok ? *c : '_';
  }
  out[i] = 0;
}

int cuda_fused_source(const dev_fprog *p, int vec, int red, sbuf *b, char *err, size_t errlen) {
  int nin = p->nin, nnum = cuda_fused_numbers(p), widest = 1;
  const char *in_dt[DEV_FMAXIN] = {0}, *out_dt[DEV_FMAXOUT] = {0};
  if (p->nout < 1 || p->nout > DEV_FMAXOUT) return fail_msg(err, errlen, "%s: bad result count %d", p->name, p->nout);
  if (red && p->nred != p->nout) return fail_msg(err, errlen, "%s: the program has no reductions", p->name);
  if (red & ~7) return fail_msg(err, errlen, "%s: bad reduction kernels %#x", p->name, (unsigned)red);
  for (int j = 0; red && j < p->nout; j++)
    if ((unsigned)p->red[j] >= DEV_NREDOP) return fail_msg(err, errlen, "%s: bad reduction %d", p->name, p->red[j]);
  for (int i = 0; i < p->n; i++)
    if (p->node[i].kind == DEV_FN_INPUT) {
      in_dt[p->node[i].index] = dt_enum[p->node[i].dtype];
      if (dsize(p->node[i].dtype) > widest) widest = dsize(p->node[i].dtype);
    }
  for (int o = 0; o < p->nout; o++) {
    dev_dtype t = p->node[p->res[o]].dtype;
    out_dt[o] = dt_enum[t];
    if (dsize(t) > widest) widest = dsize(t);
  }
  for (int k = 0; k < nin; k++)
    if (!in_dt[k]) return fail_msg(err, errlen, "%s: input %d is never read", p->name, k + 1);
  char pname[DEV_SITE_LEN];
  plain_name(p, pname, sizeof pname);
  sb_printf(b, "// gpu.fuse: %s (%s", pname, vec ? "contiguous" : "any layout");
  for (int j = 0; red && j < p->nout; j++) sb_printf(b, "%s%s", j ? ", " : ", then ", dev_redop_name(p->red[j]));
  sb_printf(b, ")\n#include \"%s\"\n\n", red ? "k_reduce.cuh" : "k_elem.cuh");
  sb_str(b, "union knum { float f; double d; int64_t i; };\n");
  /* the views as kernels take them, or (contiguous) their first elements */
  const char *view = vec ? "char *" : "kview ";
  sb_printf(b, "struct gf_args { %sout[%d]; %sin[%d]; int64_t n; int *zflag; int ztag; knum num[%d]; };\n\n", view,
            p->nout, view, nin, nnum > 0 ? nnum : 1);
  if (elem1(b, p, nin, in_dt, out_dt, err, errlen)) return -1;
  if (vec && elem2(b, p, nin, in_dt, out_dt, err, errlen)) return -1;
  if (red) reduce_src(b, p, nin, in_dt, out_dt[0], vec, red);
  else kernel(b, p, nin, in_dt, out_dt, vec, widest);
  if (b->oom) return fail_msg(err, errlen, "%s: out of memory", p->name);
  return 0;
}

int cuda_fused_compile_src(const char *src, const char *name, const char *arch, dev_kimage *img, char **log,
                           char *err, size_t errlen) {
  enum { MAXH = 16 };
  const char *names[MAXH], *texts[MAXH];
  int n = 0;
  for (int i = 0; i < cuda_fused_hdr_count && n < MAXH - 5; i++, n++) {
    names[n] = cuda_fused_hdr_names[i];
    texts[n] = cuda_fused_hdr_texts[i];
  }
  names[n] = "stdint.h", texts[n++] = shim_stdint;
  names[n] = "stddef.h", texts[n++] = shim_stddef;
  names[n] = "limits.h", texts[n++] = shim_limits;
  names[n] = "string.h", texts[n++] = shim_empty;
  names[n] = "math.h", texts[n++] = shim_empty;
  dev_nvrtc_headers h = {n, names, texts};
  /* -default-device: device.h's declarations are not host functions to NVRTC */
  static const char *const opts[] = {"--fmad=false", "-default-device", "-diag-suppress=20044"};
  return dev_nvrtc_compile_h(src, name, arch, opts, (int)(sizeof opts / sizeof opts[0]), NULL, 0, &h, 1, img, log,
                             err, errlen);
}

int cuda_fused_compile(const dev_fprog *p, int vec, int red, const char *arch, dev_kimage *img, char **log, char *err,
                       size_t errlen) {
  sbuf src = {0};
  if (cuda_fused_source(p, vec, red, &src, err, errlen)) {
    free(src.p);
    return -1;
  }
  char name[DEV_SITE_LEN + 16];
  plain_name(p, name, sizeof name - 3);
  strcat(name, ".cu");
  int rc = cuda_fused_compile_src(src.p, name, arch, img, log, err, errlen);
  free(src.p);
  return rc;
}
