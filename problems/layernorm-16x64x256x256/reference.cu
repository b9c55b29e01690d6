/* Trusted reference: LayerNorm over the trailing n elements of each row, with affine
 * weight and bias of n elements (torch.nn.LayerNorm(normalized_shape) with
 * elementwise_affine=True), biased variance:
 *   y[r, i] = (x[r, i] - mean_r) / sqrt(var_r + eps) * w[i] + b[i]
 * x, y (rows, n) f32; w, b (n) f32. Two passes in f64 (mean, then the sum of squared
 * deviations from it), normalisation and affine step in f64, one rounding to f32.
 *
 * Launch: one block of 1024 threads per row: grid = [rows, 1, 1], block = [1024, 1, 1]
 * (rows are looped grid-stride, so a smaller grid is also correct). Args: x, w, b, y,
 * rows, n, eps (f64).
 *
 * Time on an H200 at 16 rows of 64*256*256 = 4,194,304: only 16 SMs work, each reading its
 * row three times plus w and b and writing y (~100 MB per SM). Measured (2026-11, NVRTC
 * 13.0, sm_90, no L2 flush, median of 5): 4.9 ms (torch's one-block-per-row LayerNorm:
 * 8.1 ms on the same inputs).
 */

__device__ __forceinline__ double ref_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide f64 sum, every thread gets the result; `red` holds 33 doubles.
__device__ double ref_block_sum(double v, double* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = ref_warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double t = lane < nwarps ? red[lane] : 0.0;
        t = ref_warp_sum(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    const double r = red[32];
    __syncthreads();
    return r;
}

extern "C" __global__ void __launch_bounds__(1024)
ref_layernorm(const float* __restrict__ x, const float* __restrict__ w,
              const float* __restrict__ b, float* __restrict__ y,
              int rows, int n, double eps)
{
    __shared__ double red[33];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (long long)r * n;
        float* yr = y + (long long)r * n;

        double s = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)xr[i];
        const double mean = ref_block_sum(s, red) / n;

        double q = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const double d = (double)xr[i] - mean;
            q = fma(d, d, q);
        }
        const double var = ref_block_sum(q, red) / n;
        const double rstd = 1.0 / sqrt(var + eps);

        for (int i = threadIdx.x; i < n; i += blockDim.x)
            yr[i] = (float)(((double)xr[i] - mean) * rstd * (double)w[i] + (double)b[i]);
    }
}
