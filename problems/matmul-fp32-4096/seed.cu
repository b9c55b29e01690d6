/* Seed kernel: C = A * B in f32 (A M x K, B K x N, C M x N, row-major), a plain
 * shared-memory tiled SGEMM on the CUDA cores. Correct for every combination of the knobs
 * below and for any M, N, K (out-of-range loads read 0, out-of-range stores are skipped).
 *
 * Each block computes a BM x BM tile of C with BM = TDIM * WPT, using TDIM x TDIM threads;
 * thread (tx, ty) owns the WPT x WPT elements at rows ty + TDIM*i and columns
 * tx + TDIM*j of the tile (strided, so shared-memory reads are conflict-free). K is walked
 * in steps of BK, staging a BM x BK slice of A and a BK x BM slice of B in shared memory
 * (static: (BM*(BK+1) + BK*BM) * 4 bytes, at most 33 KiB).
 *
 * Launch plan (recompute it when TDIM or WPT changes; BK changes nothing):
 *   kernel sgemm, args [A, B, C, M, N, K]
 *   block = [TDIM, TDIM, 1]
 *   grid  = [ceil(N / (TDIM*WPT)), ceil(M / (TDIM*WPT)), 1]
 *   shared_bytes = 0
 * Defaults (TDIM 16, WPT 4 -> BM 64) at 4096^3: block [16, 16, 1], grid [64, 64, 1].
 * A block whose blockDim is not TDIM x TDIM returns at once without writing, so a plan
 * that does not follow the knobs ends in `incomplete_output` rather than wrong numbers.
 */

// @knob BK 8|16|32
#define BK 16

// @knob TDIM 8|16|32
#define TDIM 16

// @knob WPT 1|2|4
#define WPT 4

// @idea register_blocking: give each thread a larger, rectangular register tile (8x8 outputs, e.g. BM=128 with 16x16 threads) so each shared-memory load feeds more FMAs
// @idea vector_loads: load A and B tiles with float4 and read shared memory with float4 (transpose the A tile in shared memory so a thread's rows are contiguous)
// @idea double_buffer: stage the next k slice (cp.async or registers) while computing on the current one, with two shared-memory buffers
// @idea tf32_tensor_cores: use mma.sync m16n8k8 TF32 (inline PTX) - much faster, but it lowers the precision tier to tf32-like
// @idea fp32_split_tensor_cores: split each f32 value into a TF32 or bf16 high part and a low remainder and run three tensor-core products (hi*hi + hi*lo + lo*hi) to keep near-fp32 accuracy

#define BM (TDIM * WPT)

extern "C" __global__ void __launch_bounds__(TDIM * TDIM)
sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
      int M, int N, int K)
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
            As[r][c] = (gr < M && gc < K) ? A[(long long)gr * K + gc] : 0.0f;
        }
        for (int e = tid; e < BK * BM; e += TDIM * TDIM) {
            const int r = e / BM, c = e % BM;
            const int gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < K && gc < N) ? B[(long long)gr * N + gc] : 0.0f;
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
            if (gr < M && gc < N) C[(long long)gr * N + gc] = acc[i][j];
        }
    }
}
