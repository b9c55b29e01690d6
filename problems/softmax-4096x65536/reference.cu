/* Trusted reference: row softmax, y[r, :] = exp(x[r, :] - max_r) / sum(exp(x[r, :] - max_r)),
 * x and y (rows, cols) f32 row-major. The maximum is exact; every exponential, the sum
 * and the division are in f64, and y is rounded to f32 once.
 *
 * Launch: one block of 1024 threads per row: grid = [rows, 1, 1], block = [1024, 1, 1]
 * (the kernel loops over rows grid-stride, so a smaller grid is also correct; the block
 * must be 1024 threads, a multiple of 32, for the reduction). Args: x, y, rows, cols.
 *
 * Time on an H200 at 4096 x 65536: three reads of x (3 GiB, partly from L2) and one write
 * of y (1 GiB), plus 0.54 G f64 exponentials. Measured (2026-11, NVRTC 13.0, sm_90, no L2
 * flush, median of 5): 2.0-2.1 ms.
 */

__device__ __forceinline__ double ref_warp_max(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double ref_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(1024)
ref_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ double red[32];
    __shared__ double bcast;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;

    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (long long)r * cols;
        float* yr = y + (long long)r * cols;

        // Pass 1: the row maximum (exact).
        double m = __longlong_as_double(0xfff0000000000000ull);  // -inf
        for (int c = tid; c < cols; c += blockDim.x) m = fmax(m, (double)xr[c]);
        m = ref_warp_max(m);
        if (lane == 0) red[warp] = m;
        __syncthreads();
        if (warp == 0) {
            double v = lane < nwarps ? red[lane] : __longlong_as_double(0xfff0000000000000ull);
            v = ref_warp_max(v);
            if (lane == 0) bcast = v;
        }
        __syncthreads();
        m = bcast;
        __syncthreads();

        // Pass 2: the sum of exponentials, in f64.
        double s = 0.0;
        for (int c = tid; c < cols; c += blockDim.x) s += exp((double)xr[c] - m);
        s = ref_warp_sum(s);
        if (lane == 0) red[warp] = s;
        __syncthreads();
        if (warp == 0) {
            double v = lane < nwarps ? red[lane] : 0.0;
            v = ref_warp_sum(v);
            if (lane == 0) bcast = v;
        }
        __syncthreads();
        s = bcast;
        __syncthreads();

        // Pass 3: write, rounding once.
        for (int c = tid; c < cols; c += blockDim.x) yr[c] = (float)(exp((double)xr[c] - m) / s);
    }
}
