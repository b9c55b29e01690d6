/* Seed kernel: y[r] = sum over c of x[r, c], x (rows, cols) f32 row-major, y (rows) f32.
 * One warp per row: each lane sums a strided part of the row in f32 (VEC values per load),
 * then the warp adds its lanes with shuffles. Plain and correct for every combination of
 * the knobs and any shape (the vector path needs cols % VEC == 0, else it falls back to
 * scalar loads).
 *
 * Launch plan (recompute it when WARPS changes; VEC changes nothing):
 *   kernel rowsum, args [x, y, rows, cols]
 *   block = [32 * WARPS, 1, 1]
 *   grid  = [ceil(rows / WARPS), 1, 1]   (rows looped grid-stride: any grid is correct)
 * Defaults (WARPS 4) at 4096 x 1024: block [128, 1, 1], grid [1024, 1, 1]. A block whose
 * blockDim.x is not 32 * WARPS returns without writing.
 */

// @knob VEC 1|2|4
#define VEC 4

// @knob WARPS 1|2|4|8|16
#define WARPS 4

// @idea more_loads_in_flight: unroll the lane loop so each lane has 2-4 independent loads (and partial sums) in flight
// @idea block_per_row: give each row a whole block when rows are long, or several rows per warp when they are short

#if VEC == 4
typedef float4 vec_t;
#elif VEC == 2
typedef float2 vec_t;
#else
typedef float vec_t;
#endif

union VecU {
    vec_t v;
    float f[VEC];
};

extern "C" __global__ void __launch_bounds__(32 * WARPS)
rowsum(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    if (blockDim.x != 32 * WARPS) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nvec = (cols % VEC == 0) ? cols / VEC : 0;
    for (int r = blockIdx.x * WARPS + warp; r < rows; r += gridDim.x * WARPS) {
        const float* xr = x + (long long)r * cols;
        const vec_t* xv = reinterpret_cast<const vec_t*>(xr);
        float s = 0.0f;
        for (int i = lane; i < nvec; i += 32) {
            VecU u;
            u.v = xv[i];
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += u.f[k];
        }
        for (int c = nvec * VEC + lane; c < cols; c += 32) s += xr[c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[r] = s;
    }
}
