/* Seed kernel: y = a + b over n f32 elements. Plain and correct for every combination of
 * the knobs and any n: a grid-stride loop in which each thread handles ILP elements per
 * step, BLOCK apart.
 *
 * Launch plan (recompute it when BLOCK changes; ILP only changes the best grid):
 *   kernel vecadd, args [a, b, y, n]
 *   block = [BLOCK, 1, 1]
 *   grid  = [ceil(n / (BLOCK * ILP)), 1, 1]   (grid-stride: any grid is correct)
 * Defaults (BLOCK 256, ILP 1) at n = 2^20: grid [4096, 1, 1]. A block whose blockDim.x is
 * not BLOCK returns without writing.
 */

// @knob ILP 1|2|4|8
#define ILP 1

// @knob BLOCK 128|256|512|1024 launch:block.x
#define BLOCK 256

// @idea float4: load a and b and store y as float4 (n is a multiple of 4 here), a quarter of the memory instructions
// @idea fewer_blocks: launch a few blocks per SM (e.g. 132 * 8) and let the grid-stride loop do the rest

extern "C" __global__ void __launch_bounds__(BLOCK)
vecadd(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int n)
{
    if (blockDim.x != BLOCK) return;
    for (long long base = (long long)blockIdx.x * BLOCK * ILP; base < n;
         base += (long long)gridDim.x * BLOCK * ILP) {
#pragma unroll
        for (int k = 0; k < ILP; ++k) {
            const long long i = base + (long long)k * BLOCK + threadIdx.x;
            if (i < n) y[i] = a[i] + b[i];
        }
    }
}
