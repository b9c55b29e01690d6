/* Seed kernels: LayerNorm over the trailing n = 64*256*256 elements of each of 16 rows,
 * with affine weight and bias (torch.nn.LayerNorm((64, 256, 256))), eps 1e-5, biased
 * variance: y = (x - mean) / sqrt(var + eps) * w + b.
 *
 * Not one block per row: 16 rows would leave 116 of the 132 SMs idle (torch's LayerNorm
 * does that and takes 8.4 ms). Instead, three launches:
 *   1. ln_stats: grid [CHUNKS, rows]; each block reduces one chunk of a row to
 *      (count, mean, M2) - per thread with Welford's update, then across the block with
 *      Chan's pairwise combination in f64 - into the scratch buffer `part`;
 *   2. ln_finalize: one thread per row combines the row's CHUNKS partials (Chan, f64) into
 *      mean and 1/sqrt(var + eps) in the scratch buffer `stats`;
 *   3. ln_apply: every element, (x - mean) in f64, then * rstd, * w + b.
 * Numerically safe on the shifted trial (mean 1000, std 0.1): no E[x^2] - E[x]^2 anywhere,
 * and x - mean is formed in f64, so the mean's f32 rounding (~3e-5 at 1000, i.e. 3e-4 of
 * the std) never enters. Correct for every combination of the knobs and any shape.
 *
 * Launch plan (recompute it when BLOCK changes; ACC_T, EPT and CHUNKS change nothing for
 * correctness, only the best grids):
 *   1. ln_stats    args [x, part, rows, n]            block [BLOCK,1,1] grid [CHUNKS, rows, 1]
 *   2. ln_finalize args [part, stats, rows, n, eps]   block [32,1,1]    grid [rows, 1, 1]
 *   3. ln_apply    args [x, w, b, stats, y, rows, n]  block [BLOCK,1,1] grid [ceil(n / (BLOCK*EPT)), rows, 1]
 *   scratch: part f64 rows*512*3 elements (room for the largest CHUNKS), stats f64 rows*2
 * All three loop grid-stride over their grid dimensions, so any grid is correct.
 * Defaults (BLOCK 256, EPT 4, CHUNKS 256) at 16 x 4194304: grids [256, 16, 1], [16, 1, 1]
 * and [4096, 16, 1]. A block of ln_stats or ln_apply whose blockDim.x is not BLOCK
 * returns without writing.
 */

// @knob ACC_T float|double
#define ACC_T float

// @knob EPT 1|2|4|8
#define EPT 4

// @knob CHUNKS 64|128|256|512
#define CHUNKS 256

// @knob BLOCK 128|256|512|1024 launch:block.x@ln_stats,ln_apply
#define BLOCK 256

// @idea l2_reuse: x is read twice (statistics, then apply); process a few rows at a time (one row of x is 16.8 MB, the L2 holds 60 MB), e.g. one launch triple per row group, so the second read hits L2 instead of HBM
// @idea vector_loads: read x, w and b and write y as float4
// @idea warp_welford: combine (count, mean, M2) with warp shuffles instead of a shared-memory tree
// @idea pivot_shift: instead of f64, subtract a per-row pivot (e.g. the row's first element) before accumulating, so f32 sums stay small and the f32 difference x - pivot is exact
// @idea fold_finalize: let every ln_apply block combine its row's partials itself and drop the ln_finalize launch

#define MAX_CHUNKS 512

__device__ __forceinline__ void chan_combine(double& na, double& ma, double& m2a,
                                             double nb, double mb, double m2b) {
    if (nb == 0.0) return;
    if (na == 0.0) { na = nb; ma = mb; m2a = m2b; return; }
    const double n = na + nb;
    const double d = mb - ma;
    ma += d * (nb / n);
    m2a += m2b + d * d * (na * nb / n);
    na = n;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
ln_stats(const float* __restrict__ x, double* __restrict__ part, int rows, int n)
{
    if (blockDim.x != BLOCK) return;
    __shared__ double sn[BLOCK], sm[BLOCK], sq[BLOCK];
    const int tid = threadIdx.x;
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {
        const float* xr = x + (long long)row * n;
        for (int chunk = blockIdx.x; chunk < CHUNKS; chunk += gridDim.x) {
            const long long start = (long long)n * chunk / CHUNKS;
            const long long end = (long long)n * (chunk + 1) / CHUNKS;
            ACC_T cnt = 0, mean = 0, m2 = 0;
            for (long long i = start + tid; i < end; i += BLOCK) {
                const ACC_T v = (ACC_T)xr[i];
                cnt += (ACC_T)1;
                const ACC_T d = v - mean;
                mean += d / cnt;
                m2 += d * (v - mean);
            }
            sn[tid] = (double)cnt;
            sm[tid] = (double)mean;
            sq[tid] = (double)m2;
            __syncthreads();
            for (int s = BLOCK / 2; s > 0; s >>= 1) {
                if (tid < s) {
                    double na = sn[tid], ma = sm[tid], m2a = sq[tid];
                    chan_combine(na, ma, m2a, sn[tid + s], sm[tid + s], sq[tid + s]);
                    sn[tid] = na;
                    sm[tid] = ma;
                    sq[tid] = m2a;
                }
                __syncthreads();
            }
            if (tid == 0) {
                double* p = part + ((long long)row * MAX_CHUNKS + chunk) * 3;
                p[0] = sn[0];
                p[1] = sm[0];
                p[2] = sq[0];
            }
            __syncthreads();
        }
    }
}

extern "C" __global__ void
ln_finalize(const double* __restrict__ part, double* __restrict__ stats, int rows, int n,
            double eps)
{
    if (threadIdx.x != 0) return;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        double na = 0.0, ma = 0.0, m2a = 0.0;
        const double* p = part + (long long)row * MAX_CHUNKS * 3;
        for (int c = 0; c < CHUNKS; ++c) chan_combine(na, ma, m2a, p[3 * c], p[3 * c + 1], p[3 * c + 2]);
        stats[2 * row] = ma;
        stats[2 * row + 1] = 1.0 / sqrt(m2a / n + eps);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
ln_apply(const float* __restrict__ x, const float* __restrict__ w,
         const float* __restrict__ b, const double* __restrict__ stats,
         float* __restrict__ y, int rows, int n)
{
    if (blockDim.x != BLOCK) return;
    const int tid = threadIdx.x;
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {
        const float* xr = x + (long long)row * n;
        float* yr = y + (long long)row * n;
        const double mean = stats[2 * row], rstd = stats[2 * row + 1];
        for (long long base = (long long)blockIdx.x * BLOCK * EPT; base < n;
             base += (long long)gridDim.x * BLOCK * EPT) {
#pragma unroll
            for (int k = 0; k < EPT; ++k) {
                const long long i = base + (long long)k * BLOCK + tid;
                if (i < n) {
                    const float xh = (float)(((double)xr[i] - mean) * rstd);
                    yr[i] = fmaf(xh, w[i], b[i]);
                }
            }
        }
    }
}
