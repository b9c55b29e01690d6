/* Seed kernel: C = A * B with A (M x K), B (K x N), C (M x N) in IEEE fp16, row-major,
 * accumulated in f32 (as cuBLAS and torch do for half matmuls) and rounded to fp16 once.
 * fp16 values travel as 16-bit patterns (unsigned short) and are converted with PTX cvt,
 * so no header is needed. A plain shared-memory tiled kernel on the CUDA cores (no tensor
 * cores): fp16 tiles are widened to f32 in shared memory. Correct for every combination
 * of the knobs below and for any M, N, K (out-of-range loads read 0, out-of-range stores
 * are skipped).
 *
 * Each block computes a BM x BM tile of C with BM = TDIM * WPT, using TDIM x TDIM threads;
 * thread (tx, ty) owns the WPT x WPT elements at rows ty + TDIM*i and columns
 * tx + TDIM*j of the tile. K is walked in steps of BK.
 *
 * Launch plan (recompute it when TDIM or WPT changes; BK changes nothing):
 *   kernel hgemm, args [A, B, C, M, N, K]
 *   block = [TDIM, TDIM, 1]
 *   grid  = [ceil(N / (TDIM*WPT)), ceil(M / (TDIM*WPT)), 1]
 *   shared_bytes = 0
 * Defaults (TDIM 16, WPT 4 -> BM 64) at 4096^3: block [16, 16, 1], grid [64, 64, 1].
 * A block whose blockDim is not TDIM x TDIM returns at once without writing.
 */

// @knob BK 8|16|32
#define BK 16

// @knob TDIM 8|16|32
#define TDIM 16

// @knob WPT 1|2|4
#define WPT 4

// @idea tensor_cores: use the fp16 tensor cores through inline PTX mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (f32 accumulation keeps the tolerance), with ldmatrix to feed fragments from shared memory - the step from ~20 to several hundred TFLOP/s
// @idea wgmma: on sm_90, warpgroup MMA (wgmma.mma_async) with TMA or cp.async.bulk loads into swizzled shared memory, as cuBLAS does
// @idea keep_half_in_smem: keep tiles as fp16 (half the shared memory, vector loads of 8 values) and convert when reading fragments
// @idea cp_async_pipeline: multi-stage cp.async pipeline so global loads overlap the math
// @idea no_fp16_accumulation: accumulating in fp16 (hfma2) is 2x faster on CUDA cores but errs by ~2 on |C| ~ 64 and fails the tolerance - keep f32 accumulators

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

#define BM (TDIM * WPT)

extern "C" __global__ void __launch_bounds__(TDIM * TDIM)
hgemm(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
      unsigned short* __restrict__ C, int M, int N, int K)
{
    if (blockDim.x != TDIM || blockDim.y != TDIM || blockDim.z != 1) return;

    __shared__ float As[BM][BK + 1];
    __shared__ float Bs[BK][BM];

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * TDIM + tx;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BM;

    float acc[WPT][WPT];
#pragma unroll
    for (int i = 0; i < WPT; ++i)
#pragma unroll
        for (int j = 0; j < WPT; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int e = tid; e < BM * BK; e += TDIM * TDIM) {
            const int r = e / BK, c = e % BK;
            const int gr = row0 + r, gc = k0 + c;
            As[r][c] = (gr < M && gc < K) ? h2f(A[(long long)gr * K + gc]) : 0.0f;
        }
        for (int e = tid; e < BK * BM; e += TDIM * TDIM) {
            const int r = e / BM, c = e % BM;
            const int gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < K && gc < N) ? h2f(B[(long long)gr * N + gc]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[WPT], b[WPT];
#pragma unroll
            for (int i = 0; i < WPT; ++i) a[i] = As[ty + TDIM * i][kk];
#pragma unroll
            for (int j = 0; j < WPT; ++j) b[j] = Bs[kk][tx + TDIM * j];
#pragma unroll
            for (int i = 0; i < WPT; ++i)
#pragma unroll
                for (int j = 0; j < WPT; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < WPT; ++i) {
        const int gr = row0 + ty + TDIM * i;
#pragma unroll
        for (int j = 0; j < WPT; ++j) {
            const int gc = col0 + tx + TDIM * j;
            if (gr < M && gc < N) C[(long long)gr * N + gc] = f2h(acc[i][j]);
        }
    }
}
