/* Trusted reference: y = a + b over n f32 elements (computed in f64 and rounded once,
 * which equals the correctly rounded f32 sum).
 * Launch: block = [256, 1, 1], grid = [ceil(n / 256), 1, 1] (grid-stride: any grid is
 * correct). Args: a, b, y, n. Measured on an H200 at n = 2^20: ~11-16 us.
 */
extern "C" __global__ void ref_vecadd(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ y, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = (float)((double)a[i] + (double)b[i]);
}
