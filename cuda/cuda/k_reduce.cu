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
  k_reduce_rows<T, CODE>(r, kmem<typename kt<T>::S>());
}

/* runs along memory only: 8 loads in flight */
template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS) reduce_run(const krargs r)
{
  k_reduce_rows<T, CODE, kmem<typename kt<T>::S>, 8, true>(r, kmem<typename kt<T>::S>());
}

template <int T, int CODE>
__global__ void __launch_bounds__(K_THREADS) reduce_cols(const krargs r)
{
  k_reduce_cols<T, CODE>(r, kmem<typename kt<T>::S>());
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

/* How one reduction is laid out on the GPU. */
typedef struct rplan {
  int cols;              /* reduce_cols, else reduce_rows */
  int full;              /* rows over k_off(in, k) */
  kview in, outer, out;
  int64_t rstride, len, nout;
  kprm prm;
  const cuk_rsource *src;   /* a fused program's kernels in place of reduce_rows/cols; NULL: the built-in */
} rplan;

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

template <int T, int CODE>
static int launch_reduce(const rplan *pl, const cuk_env *env, char *err, size_t errlen)
{
  typedef typename red<T, CODE>::A A;
  cudaStream_t st = k_stream(env);
  int sm = k_sm(env), G = 32, rc = -1;
  /* which kernel: columns, runs along memory, or any other rows */
  int run = !pl->cols && !pl->full && pl->rstride == 1;
  int which = pl->cols ? CUK_RED_COLS : run ? CUK_RED_RUN : CUK_RED_ROWS;
  int64_t nsplit = 1, chunk, len = pl->len, nout = pl->nout;
  A *part = NULL;
  cudaError_t e;
  /* Split outputs until the GPU holds one full wave of blocks: a fixed count
   * leaves a part-empty last wave, as the blocks per SM vary with the
   * kernel's registers. */
  int per_sm = 0;
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
  chunk = cdiv(len, nsplit);
  nsplit = cdiv(len, chunk);
  if (nsplit > 1) {
    e = cudaMallocAsync((void **)&part, (size_t)(nout * nsplit) * sizeof(A), st);
    if (e != cudaSuccess) {
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      part = NULL;
      goto done;
    }
  }
  {
    krargs ra;
    memset(&ra, 0, sizeof ra);
    ra.in = pl->in, ra.outer = pl->outer, ra.out = pl->out, ra.full = pl->full, ra.G = G;
    ra.rstride = pl->rstride, ra.len = len, ra.nout = nout, ra.nsplit = nsplit, ra.chunk = chunk;
    ra.part = part, ra.prm = pl->prm;
    dim3 grid = pl->cols ? dim3((unsigned)min64(cdiv(nout, 32), (int64_t)sm * per_sm * 8), (unsigned)nsplit)
                         : dim3((unsigned)min64(cdiv(nout * nsplit, K_THREADS / G), (int64_t)sm * per_sm * 8));
    if (pl->src) {
      if (pl->src->launch(pl->src->ud, which, grid.x, grid.y, &ra, err, errlen)) goto done;
    } else {
      if (which == CUK_RED_COLS) reduce_cols<T, CODE><<<grid, K_THREADS, 0, st>>>(ra);
      else if (which == CUK_RED_RUN) reduce_run<T, CODE><<<grid, K_THREADS, 0, st>>>(ra);
      else reduce_rows<T, CODE><<<grid, K_THREADS, 0, st>>>(ra);
      if ((e = cudaGetLastError()) != cudaSuccess) {
        fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        goto done;
      }
    }
  }
  if (nsplit > 1) {
    reduce_final<T, CODE><<<(unsigned)min64(cdiv(nout * 32, K_THREADS), (int64_t)sm * 32), K_THREADS, 0, st>>>(
        part, nsplit, nout, len, pl->out, pl->prm);
    if ((e = cudaGetLastError()) != cudaSuccess) {
      fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
      goto done;
    }
  }
  rc = 0;
done:
  /* stream-ordered: freed once the kernels above are done with it */
  if (part != NULL && (e = cudaFreeAsync(part, st)) != cudaSuccess && rc == 0)
    rc = fail_msg(err, errlen, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return rc;
}

/* The kernel of the reduction code for dtype t (one instance per dtype
 * and code the op table allows), launched over pl. */
static int dispatch_reduce(rplan &pl, dev_dtype t, int code, const cuk_env *env, char *err, size_t errlen)
{
  int rc = k_dispatch(t, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    switch (code) {
    case DEV_RED_SUM: return launch_reduce<T, DEV_RED_SUM>(&pl, env, err, errlen);
    case DEV_RED_MEAN: return launch_reduce<T, DEV_RED_MEAN>(&pl, env, err, errlen);
    case DEV_RED_MAX: return launch_reduce<T, DEV_RED_MAX>(&pl, env, err, errlen);
    case DEV_RED_MIN: return launch_reduce<T, DEV_RED_MIN>(&pl, env, err, errlen);
    case DEV_RED_ANY: return launch_reduce<T, DEV_RED_ANY>(&pl, env, err, errlen);
    case DEV_RED_ALL: return launch_reduce<T, DEV_RED_ALL>(&pl, env, err, errlen);
    case DEV_RED_PROD: return launch_reduce<T, DEV_RED_PROD>(&pl, env, err, errlen);
    case DEV_RED_ARGMIN: return launch_reduce<T, DEV_RED_ARGMIN>(&pl, env, err, errlen);
    case DEV_RED_ARGMAX: return launch_reduce<T, DEV_RED_ARGMAX>(&pl, env, err, errlen);
    default: break;
    }
    /* the float-only ones: no integer instances */
    if constexpr (kt<T>::cls != KC_INT) {
      switch (code) {
      case DEV_RED_VAR: return launch_reduce<T, DEV_RED_VAR>(&pl, env, err, errlen);
      case DEV_RED_STD: return launch_reduce<T, DEV_RED_STD>(&pl, env, err, errlen);
      case DEV_RED_LOGSUMEXP: return launch_reduce<T, DEV_RED_LOGSUMEXP>(&pl, env, err, errlen);
      case DEV_RED_NORM:
        if (isinf(pl.prm.p)) return launch_reduce<T, KR_NORM_INF>(&pl, env, err, errlen);
        if (pl.prm.p == 2) return launch_reduce<T, KR_NORM_2>(&pl, env, err, errlen);
        return launch_reduce<T, KR_NORM_P>(&pl, env, err, errlen);
      default: break;
      }
    }
    return fail_msg(err, errlen, "%s is not supported for %s", dev_redop_name((dev_redop)code),
                  dev_dtype_name((dev_dtype)T));
  });
  if (rc == -2) return fail_msg(err, errlen, "reduce: bad dtype %d", (int)t);
  return rc;
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

/* A fused program's values (of dtype t and shape vshape, contiguous: the
 * tensor the unfused program would have made) reduced into out by code
 * along dim: the built-in plan, built-in final kernel, src's kernels. */
int cuk_reduce_fused(dev_dtype t, int vndim, const int64_t *vshape, const dev_view *out, int code, int dim,
                     const cuk_rsource *src, const cuk_env *env, char *err, size_t errlen)
{
  dev_view v;
  rplan pl;
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
  int rc = reduce_plan(&v, out, code, dim, s0, &pl, env, err, errlen);
  if (rc) return rc < 0 ? -1 : 0;
  pl.src = src;
  return dispatch_reduce(pl, t, code, env, err, errlen);
}
