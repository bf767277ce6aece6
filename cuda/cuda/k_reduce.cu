/* DEV_OP_REDUCE: the reductions of ops.h over the whole tensor (dim -1) or
 * along one dim.  Float sources accumulate in double and integer sums and
 * products in wrapping int64, as on the host; max/min/argmax/argmin carry
 * (value, index) so the first maximum, or the first NaN, wins whatever the
 * tree; any/all or and and the truth (nonzero, NaN included) of the
 * elements; var/std merge (count, mean, squared deviations) as Chan et al.
 * (one pass, stable), logsumexp (max, sum of exp(x - max)); norm is its own
 * code per p (inf, 2, other).
 *
 * Each output is one run of len elements at stride rstride (or, for dim -1
 * over a view that does not merge into one run, the flat order of the view).
 * Rows: a group of G threads per (output, split), for runs along memory.
 * Columns: a block's 32 lanes take 32 neighbouring outputs, its 8 warps split
 * the run, for reductions across the innermost dim.  When there are too few
 * outputs to fill the GPU, each is split over several groups/blocks whose
 * partial results a last kernel combines (a warp per output).
 *
 * The device code is k_reduce.cuh's, which a fused program that ends in a
 * reduction shares (cuk_reduce_fused): its kernels take the place of
 * reduce_rows/reduce_cols in the same plan, so the tree is the same. */
#include "k_common.cuh"
#include "k_reduce.cuh"

K_MODULE(reduce)

/* ---- kernels ------------------------------------------------------------- */

template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS) reduce_rows(const krargs r)
{
  k_reduce_rows<T, red1<T, CODE>>(r, kmem<typename kt<T>::S>());
}

/* runs along memory only: 8 loads in flight */
template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS) reduce_run(const krargs r)
{
  k_reduce_rows<T, red1<T, CODE>, kmem<typename kt<T>::S>, 8, true>(r, kmem<typename kt<T>::S>());
}

template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS) reduce_cols(const krargs r)
{
  k_reduce_cols<T, red1<T, CODE>>(r, kmem<typename kt<T>::S>());
}

/* The nsplit partials of each output (part[o * nsplit + j]): a warp each. */
template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS)
reduce_final(const typename red<T, CODE>::A *part, int64_t nsplit, int64_t nout, int64_t len, kview out, kprm prm)
{
  typedef red<T, CODE> R;
  typedef typename R::A A;
  int lane = threadIdx.x & 31;
  int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t o = w; o < nout; o += nw) {
    A acc = R::init();
    for (int64_t j = lane; j < nsplit; j += 32) acc = R::comb(acc, part[o * nsplit + j]);
    acc = warp_reduce<R>(acc);
    if (lane == 0) emit<R>(acc, o, 1, NULL, out, len, prm);
  }
}

/* ---- launchers ----------------------------------------------------------- */

/* What one reduction reduces: its runs, outputs and options. */
typedef struct rplan {
  int cols;              /* reduce_cols, else reduce_rows */
  int full;              /* rows over k_off(in, k) */
  kview in, outer, out;
  int64_t rstride, len, nout;
  kprm prm;
} rplan;

/* How one reduction's kernels are laid out on the GPU: which kernel, the
 * group size G, the split of each run (nsplit chunks of chunk), the grid;
 * and its accumulator's size.  The split decides the tree, so a fused
 * program's reduction takes the layout of the built-in one. */
typedef struct rlayout {
  int which, G;
  int64_t nsplit, chunk;
  unsigned gx, gy;
  size_t asize;
} rlayout;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Resident blocks per SM of a kernel; 4 if the query fails (it then leaves
 * its error behind, which is cleared: nothing was launched). */
template <typename K> static int occupancy(K kernel)
{
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, K_THREADS, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 4;
  }
  return n > 0 ? n : 4;
}

template <int T, int CODE> static rlayout layout(const rplan *pl, const cuk_env *env)
{
  rlayout l;
  memset(&l, 0, sizeof l);
  int sm = k_sm(env), G = 32, per_sm;
  int run = !pl->cols && !pl->full && pl->rstride == 1;
  int64_t nsplit = 1, len = pl->len, nout = pl->nout;
  l.which = pl->cols ? CUK_RED_COLS : run ? CUK_RED_RUN : CUK_RED_ROWS;
  /* Split outputs until the GPU holds one full wave of blocks: a fixed count
   * leaves a part-empty last wave, as the blocks per SM vary with the
   * kernel's registers. */
  if (pl->cols) {
    int64_t ntiles = cdiv(nout, 32), want;
    per_sm = occupancy(reduce_cols<T, CODE>);
    want = (int64_t)sm * per_sm;
    if (ntiles < want) nsplit = min64(min64(want / ntiles, max64(1, len / 64)), 4096);
  } else {
    int64_t want;
    per_sm = run ? occupancy(reduce_run<T, CODE>) : occupancy(reduce_rows<T, CODE>);
    G = len >= 8192 ? 256 : len >= 2048 ? 128 : len >= 512 ? 64 : 32;
    want = (int64_t)sm * per_sm * (K_THREADS / G);   /* groups */
    if (nout < want) nsplit = min64(min64(want / nout, max64(1, len / (G * 16))), 4096);
  }
  if (nsplit < 1) nsplit = 1;
  l.G = G;
  l.chunk = cdiv(len, nsplit);
  l.nsplit = cdiv(len, l.chunk);
  if (pl->cols) {
    l.gx = (unsigned)min64(cdiv(nout, 32), (int64_t)sm * per_sm * 8);
    l.gy = (unsigned)l.nsplit;
  } else {
    l.gx = (unsigned)min64(cdiv(nout * l.nsplit, K_THREADS / G), (int64_t)sm * per_sm * 8);
    l.gy = 1;
  }
  l.asize = sizeof(typename red<T, CODE>::A);
  return l;
}

static krargs make_args(const rplan *pl, const rlayout *l, void *part)
{
  krargs ra;
  memset(&ra, 0, sizeof ra);
  ra.in = pl->in, ra.outer = pl->outer, ra.out = pl->out, ra.full = pl->full, ra.G = l->G;
  ra.rstride = pl->rstride, ra.len = pl->len, ra.nout = pl->nout, ra.nsplit = l->nsplit, ra.chunk = l->chunk;
  ra.part = part, ra.prm = pl->prm;
  return ra;
}

/* The last kernel of a split reduction: the partials of each output. */
template <int T, int CODE>
static int launch_final(const void *part, const rplan *pl, const rlayout *l, const cuk_env *env, char *err,
                        size_t errlen)
{
  int64_t nout = pl->nout;
  reduce_final<T, CODE><<<(unsigned)min64(cdiv(nout * 32, K_THREADS), (int64_t)k_sm(env) * 32), K_THREADS, 0,
                          k_stream(env)>>>((const typename red<T, CODE>::A *)part, l->nsplit, nout, pl->len, pl->out,
                                           pl->prm);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
}

template <int T, int CODE>
static int launch_reduce(const rplan *pl, const cuk_env *env, char *err, size_t errlen)
{
  typedef typename red<T, CODE>::A A;
  cudaStream_t st = k_stream(env);
  rlayout l = layout<T, CODE>(pl, env);
  A *part = NULL;
  int rc = -1;
  cudaError_t e;
  if (l.nsplit > 1) {
    e = cudaMallocAsync((void **)&part, (size_t)(pl->nout * l.nsplit) * sizeof(A), st);
    if (e != cudaSuccess) {
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      part = NULL;
      goto done;
    }
  }
  {
    krargs ra = make_args(pl, &l, part);
    dim3 grid(l.gx, l.gy);
    if (l.which == CUK_RED_COLS) reduce_cols<T, CODE><<<grid, K_THREADS, 0, st>>>(ra);
    else if (l.which == CUK_RED_RUN) reduce_run<T, CODE><<<grid, K_THREADS, 0, st>>>(ra);
    else reduce_rows<T, CODE><<<grid, K_THREADS, 0, st>>>(ra);
    if ((e = cudaGetLastError()) != cudaSuccess) {
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      goto done;
    }
  }
  if (l.nsplit > 1 && launch_final<T, CODE>(part, pl, &l, env, err, errlen)) goto done;
  rc = 0;
done:
  /* stream-ordered: freed once the kernels above are done with it */
  if (part != NULL && (e = cudaFreeAsync(part, st)) != cudaSuccess && rc == 0)
    rc = fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

template <int C> struct kcode {
  static constexpr int value = C;
};

/* f(dtype tag, kcode<code>) for the reduction code of dtype t (one
 * instance per dtype and code the op table allows; norm by its p): f's
 * value, -2 for a bad dtype, -3 for a code t does not take. */
template <class F> static int red_dispatch(dev_dtype t, int code, const kprm &prm, F f)
{
  return k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    switch (code) {
    case DEV_RED_SUM: return f(tag, kcode<DEV_RED_SUM>());
    case DEV_RED_MEAN: return f(tag, kcode<DEV_RED_MEAN>());
    case DEV_RED_MAX: return f(tag, kcode<DEV_RED_MAX>());
    case DEV_RED_MIN: return f(tag, kcode<DEV_RED_MIN>());
    case DEV_RED_ANY: return f(tag, kcode<DEV_RED_ANY>());
    case DEV_RED_ALL: return f(tag, kcode<DEV_RED_ALL>());
    case DEV_RED_PROD: return f(tag, kcode<DEV_RED_PROD>());
    case DEV_RED_ARGMIN: return f(tag, kcode<DEV_RED_ARGMIN>());
    case DEV_RED_ARGMAX: return f(tag, kcode<DEV_RED_ARGMAX>());
    default: break;
    }
    /* the float-only ones: no integer instances */
    if constexpr (kt<T>::cls != KC_INT) {
      switch (code) {
      case DEV_RED_VAR: return f(tag, kcode<DEV_RED_VAR>());
      case DEV_RED_STD: return f(tag, kcode<DEV_RED_STD>());
      case DEV_RED_LOGSUMEXP: return f(tag, kcode<DEV_RED_LOGSUMEXP>());
      case DEV_RED_NORM:
        if (isinf(prm.p)) return f(tag, kcode<KR_NORM_INF>());
        if (prm.p == 2) return f(tag, kcode<KR_NORM_2>());
        return f(tag, kcode<KR_NORM_P>());
      default: break;
      }
    }
    return -3;
  });
}

/* red_dispatch's -2 and -3 as messages */
static int red_fail(int rc, dev_dtype t, int code, char *err, size_t errlen)
{
  if (rc == -2) return fail_msg(err, errlen, "reduce: bad dtype %d", (int)t);
  if (rc == -3)
    return fail_msg(err, errlen, "%s is not supported for %s", dev_redop_name((dev_redop)code), dev_dtype_name(t));
  return rc;
}

/* The kernel of the reduction code for dtype t, launched over pl. */
static int dispatch_reduce(rplan &pl, dev_dtype t, int code, const cuk_env *env, char *err, size_t errlen)
{
  int rc = red_dispatch(t, code, pl.prm, [&](auto tt, auto cc) {
    return launch_reduce<decltype(tt)::value, decltype(cc)::value>(&pl, env, err, errlen);
  });
  return red_fail(rc, t, code, err, errlen);
}

/* The plan of reducing src (code, dim; s0: norm's p, var's correction) into
 * out: 0 and *pl, or 1 when nothing is left to launch (no outputs; an empty
 * run: out filled), or -1 and a message. */
static int reduce_plan(const dev_view *src, const dev_view *out, int code, int dim, dev_scalar s0, rplan *pl,
                       const cuk_env *env, char *err, size_t errlen)
{
  int64_t nout = 1;
  dev_view outer;
  memset(pl, 0, sizeof *pl);
  if ((unsigned)code >= DEV_NREDOP) return fail_msg(err, errlen, "reduce: bad op %d", code);
  if (dim < -1 || dim >= src->ndim) return fail_msg(err, errlen, "%s: bad dim %d", dev_redop_name((dev_redop)code), dim);
  outer = *src;
  if (dim >= 0) {
    pl->len = src->shape[dim];
    pl->rstride = src->stride[dim];
    for (int d = dim; d + 1 < src->ndim; d++) {
      outer.shape[d] = src->shape[d + 1];
      outer.stride[d] = src->stride[d + 1];
    }
    outer.ndim--;
    nout = dev_view_numel(&outer);
  } else {
    pl->len = dev_view_numel(src);
  }
  if (dev_view_numel(out) != nout)
    return fail_msg(err, errlen, "%s: out has %lld elements, expected %lld", dev_redop_name((dev_redop)code),
                  (long long)dev_view_numel(out), (long long)nout);
  if (nout == 0) return 1;
  if (pl->len == 0) {
    dev_scalar s;
    if (dev_redop_empty(code, &s)) return fail_msg(err, errlen, "%s of an empty tensor", dev_redop_name((dev_redop)code));
    return k_fill_view(out, s, env, err, errlen) ? -1 : 1;
  }
  pl->prm.p = s0.f;
  pl->prm.corr = (double)s0.i;
  pl->nout = nout;
  pl->out = k_view(out);
  pl->in = k_view(src);
  if (dim < 0) {
    if (pl->in.ndim == 1) {
      /* one run: the same as a dim reduction with one output */
      pl->outer = pl->in;
      pl->outer.contig = 1;
      pl->rstride = pl->in.stride[0];
    } else {
      pl->full = 1;
      pl->outer = pl->in;
    }
  } else {
    pl->outer = k_view(&outer);
    int64_t inner = pl->outer.stride[pl->outer.ndim - 1];
    /* neighbouring outputs are neighbours in memory, or the runs are short */
    pl->cols = nout > 1 && (pl->len <= 32 || ((inner == 1 || inner == -1) && pl->rstride != 1 && pl->rstride != -1));
  }
  return 0;
}

int k_reduce(const dev_kop *op, const cuk_env *env, char *err, size_t errlen)
{
  rplan pl;
  int rc = reduce_plan(&op->in[0], &op->out, op->code, op->dim, op->s0, &pl, env, err, errlen);
  if (rc) return rc < 0 ? -1 : 0;
  return dispatch_reduce(pl, op->in[0].dtype, op->code, env, err, errlen);
}

/* One pass of a fused program's reductions: the results in mask (lead's
 * among them) on lead's layout, then the last kernel of each when outputs
 * are split. */
static int fused_pass(unsigned mask, int lead, const rplan *pl, const rlayout *lay, dev_dtype t, const int *codes,
                      int nres, const cuk_rsource *src, const cuk_env *env, char *err, size_t errlen)
{
  cudaStream_t st = k_stream(env);
  const rlayout *l = &lay[lead];
  krouts o;
  int rc = -1;
  cudaError_t e;
  memset(&o, 0, sizeof o);
  o.mask = mask;
  for (int k = 0; k < nres; k++) {
    o.out[k] = pl[k].out;
    if (!(mask & (1u << k)) || l->nsplit <= 1) continue;
    e = cudaMallocAsync(&o.part[k], (size_t)(pl[k].nout * l->nsplit) * lay[k].asize, st);
    if (e != cudaSuccess) {
      o.part[k] = NULL;
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      goto done;
    }
  }
  {
    krargs ra = make_args(&pl[lead], l, NULL);
    if (src->launch(src->ud, l->which, l->gx, l->gy, &ra, &o, err, errlen)) goto done;
  }
  for (int k = 0; k < nres && l->nsplit > 1; k++) {
    if (!(mask & (1u << k))) continue;
    int r = red_dispatch(t, codes[k], pl[k].prm, [&](auto tt, auto cc) {
      return launch_final<decltype(tt)::value, decltype(cc)::value>(o.part[k], &pl[k], l, env, err, errlen);
    });
    if (red_fail(r, t, codes[k], err, errlen)) goto done;
  }
  rc = 0;
done:
  for (int k = 0; k < nres; k++)
    if (o.part[k] != NULL && (e = cudaFreeAsync(o.part[k], st)) != cudaSuccess && rc == 0)
      rc = fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

/* Whether a reduction's result depends on its tree: float sums and
 * products, and means (max and min keep the first best whatever the order;
 * integer sums and products wrap, which is associative). */
static int tree_bound(dev_dtype t, int code)
{
  return code == DEV_RED_MEAN || ((code == DEV_RED_SUM || code == DEV_RED_PROD) && dev_dtype_is_float(t));
}

/* A fused program's values (of dtype t and shape vshape, contiguous: the
 * tensors the unfused program would have made) reduced into outs[k] by
 * codes[k] along dim: each result as its built-in reduction makes it.  One
 * pass computes every value and reduces all of them, each on its own
 * accumulator, on the built-in plan of the first whose result depends on
 * its tree; another such result whose built-in layout differs (none of the
 * trailing reductions of one dtype do, on an H200) takes a pass of its own. */
int cuk_reduce_fused(dev_dtype t, int vndim, const int64_t *vshape, const dev_view *const *outs, const int *codes,
                     int nres, int dim, const cuk_rsource *src, const cuk_env *env, char *err, size_t errlen)
{
  dev_view v;
  rplan pl[KR_MAXRES];
  rlayout lay[KR_MAXRES];
  unsigned left = 0;
  if (nres < 1 || nres > KR_MAXRES) return fail_msg(err, errlen, "reduce: %d results in one pass", nres);
  memset(&v, 0, sizeof v);   /* buf NULL: k_view's p is NULL, where the run starts */
  v.dtype = t;
  v.ndim = vndim;
  int64_t step = 1;
  for (int d = vndim - 1; d >= 0; d--) {
    v.shape[d] = vshape[d];
    v.stride[d] = step;
    step *= vshape[d];
  }
  dev_scalar s0;
  memset(&s0, 0, sizeof s0);
  for (int k = 0; k < nres; k++) {
    int rc = reduce_plan(&v, outs[k], codes[k], dim, s0, &pl[k], env, err, errlen);
    if (rc < 0) return -1;
    if (rc > 0) continue;   /* nothing to launch: no outputs, or filled */
    rc = red_dispatch(t, codes[k], pl[k].prm, [&](auto tt, auto cc) {
      lay[k] = layout<decltype(tt)::value, decltype(cc)::value>(&pl[k], env);
      return 0;
    });
    if (red_fail(rc, t, codes[k], err, errlen)) return -1;
    left |= 1u << k;
  }
  while (left) {
    int lead = -1;
    for (int k = 0; k < nres && lead < 0; k++)
      if ((left & (1u << k)) && tree_bound(t, codes[k])) lead = k;
    for (int k = 0; k < nres && lead < 0; k++)
      if (left & (1u << k)) lead = k;
    unsigned mask = 0;
    for (int k = 0; k < nres; k++) {
      if (!(left & (1u << k))) continue;
      const rlayout *a = &lay[k], *b = &lay[lead];
      if (!tree_bound(t, codes[k]) ||
          (a->which == b->which && a->G == b->G && a->nsplit == b->nsplit && a->chunk == b->chunk))
        mask |= 1u << k;
    }
    if (fused_pass(mask, lead, pl, lay, t, codes, nres, src, env, err, errlen)) return -1;
    left &= ~mask;
  }
  return 0;
}
