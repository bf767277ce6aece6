extern "C" __global__ void scale(float *x, float a, int n);
namespace a { namespace b { __global__ void deep(const double *__restrict__ in, double *out, std::size_t n, alignas(16) int k = 3); } }
__global__ void __cluster_dims__(2, 1, 1) __maxnreg__(64) clustered(__grid_constant__ const int4 *p, uint64_t bits, ::int32_t c);
