#include <cuda_fp16.h>
#define N 4 /* a macro, with a ( in a comment */
// __global__ void commented(int x) {}
/* __global__ void also_commented(int x) {} */
struct Pair { int a, b; };
extern "C" __global__ void saxpy(float a, const float *__restrict__ x, float* y, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }
__global__ void __launch_bounds__(256, 2) mangled(unsigned long long n, size_t m,
    double d, __half h, bool flag, const int64_t *src, __nv_bfloat16 *dst, void *any) {}
template <typename T> __global__ void templ(T *x) {}
namespace ns { __global__ void inner(char c, unsigned char u, signed char s) {} }
extern "C" {
__global__ void noargs() {}
__global__ void voidargs(void) {}
}
__global__ void unnamed(float, const int *, unsigned int);
__global__ void unnamed(float a, const int *b, unsigned int c) {}
__global__ void other(Pair p, float4 *v, float &r, float x[]) {}
__device__ void not_a_kernel(int x) {}
static const char *s = "__global__ void in_string(int x) {}";
