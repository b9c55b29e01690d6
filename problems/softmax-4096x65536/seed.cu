/* Seed kernel: row softmax of x (rows, cols) f32 row-major, y = exp(x - max) / sum(exp(x - max)).
 * One block per row, three passes over the row (max, sum of exponentials, write), f32
 * arithmetic, block reductions with warp shuffles. Plain and correct for every
 * combination of the knobs and any shape: every variant subtracts the row maximum (so the
 * shifted trial, mean 1000, cannot overflow), and the vector path falls back to scalar
 * code for a row tail or when cols is not a multiple of VEC.
 *
 * Launch plan (recompute it when BLOCK changes; VEC and EXPF change nothing):
 *   kernel softmax_rows, args [x, y, rows, cols]
 *   block = [BLOCK, 1, 1]
 *   grid  = [rows, 1, 1]   (the kernel loops over rows grid-stride: any grid is correct)
 *   shared_bytes = 0
 * Defaults (BLOCK 256) at 4096 x 65536: block [256, 1, 1], grid [4096, 1, 1]. A block
 * whose blockDim.x is not BLOCK returns without writing.
 */

// @knob VEC 1|2|4
#define VEC 4

// @knob EXPF expf|__expf
#define EXPF expf

// @knob BLOCK 128|256|512|1024 launch:block.x
#define BLOCK 256

// @idea online_max_sum: find the maximum and the sum of exponentials in one pass (online softmax: when the running maximum grows from m to m', multiply the running sum by exp(m - m')), then write in a second pass - two reads of x instead of three
// @idea row_in_registers: with BLOCK=1024 and VEC=4 a row of 65536 is 16 float4 per thread - keep them in registers and read x once (single pass over memory)
// @idea cluster_rows: split a row over several blocks (a thread-block cluster with distributed shared memory, or a two-kernel scheme with a scratch buffer) so more loads are in flight per row
// @idea exp2: precompute x*log2(e) and use exp2f / ex2.approx to save a multiply per element
// @idea streaming_stores: write y with st.global.cs (__stcs) so the output does not evict x from L2

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

#define NWARPS (BLOCK / 32)

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reductions; every thread gets the result. `red` holds NWARPS + 1 floats.
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < NWARPS ? red[lane] : __int_as_float(0xff800000);  // -inf
        t = warp_max(t);
        if (lane == 0) red[NWARPS] = t;
    }
    __syncthreads();
    const float r = red[NWARPS];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < NWARPS ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) red[NWARPS] = t;
    }
    __syncthreads();
    const float r = red[NWARPS];
    __syncthreads();
    return r;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    if (blockDim.x != BLOCK) return;
    __shared__ float red[NWARPS + 1];
    const int tid = threadIdx.x;
    // Whole vectors per row (0 when cols is not a multiple of VEC: all scalar then).
    const int nvec = (cols % VEC == 0) ? cols / VEC : 0;
    const int tail0 = nvec * VEC;

    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (long long)r * cols;
        float* yr = y + (long long)r * cols;
        const vec_t* xv = reinterpret_cast<const vec_t*>(xr);
        vec_t* yv = reinterpret_cast<vec_t*>(yr);

        // Pass 1: maximum.
        float m = __int_as_float(0xff800000);
        for (int i = tid; i < nvec; i += BLOCK) {
            VecU u;
            u.v = xv[i];
#pragma unroll
            for (int k = 0; k < VEC; ++k) m = fmaxf(m, u.f[k]);
        }
        for (int c = tail0 + tid; c < cols; c += BLOCK) m = fmaxf(m, xr[c]);
        m = block_max(m, red);

        // Pass 2: sum of exponentials.
        float s = 0.0f;
        for (int i = tid; i < nvec; i += BLOCK) {
            VecU u;
            u.v = xv[i];
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += EXPF(u.f[k] - m);
        }
        for (int c = tail0 + tid; c < cols; c += BLOCK) s += EXPF(xr[c] - m);
        s = block_sum(s, red);
        const float inv = 1.0f / s;

        // Pass 3: write.
        for (int i = tid; i < nvec; i += BLOCK) {
            VecU u;
            u.v = xv[i];
#pragma unroll
            for (int k = 0; k < VEC; ++k) u.f[k] = EXPF(u.f[k] - m) * inv;
            yv[i] = u.v;
        }
        for (int c = tail0 + tid; c < cols; c += BLOCK) yr[c] = EXPF(xr[c] - m) * inv;
    }
}
