/* Trusted reference: C = A * B, A (M x K), B (K x N), C (M x N), f32, row-major.
 *
 * Every product and every sum is done in f64 (the product of two f32 values is exact in
 * f64), and C is rounded to f32 once at the end, so the result is the exact product
 * rounded to f32 up to ~K * 2^-53 relative error of the f64 sum.
 *
 * Launch: grid = [ceil(N / 64), ceil(M / 64), 1], block = [16, 16, 1], no dynamic shared
 * memory. Each block computes one 64 x 64 tile of C; thread (tx, ty) owns the 4 x 4
 * elements at rows by*64 + ty + 16*i and columns bx*64 + tx + 16*j (i, j in 0..3). Any
 * M, N, K: out-of-range loads read 0 and out-of-range stores are skipped.
 *
 * Time on an H200: 2*4096^3 = 137 GFLOP, i.e. 68.7 G f64 FMAs; the f64 rate outside the
 * f64 tensor cores is ~34 TFLOP/s, so the floor is ~4 ms. Measured (2026-11, NVRTC 13.0,
 * sm_90, no L2 flush, median of 5): 9.3 ms.
 */

#define RT 64  // rows and columns of C per block
#define RK 16  // depth of the k tile held in shared memory

extern "C" __global__ void __launch_bounds__(256)
ref_matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
           int M, int N, int K)
{
    __shared__ double As[RK][RT + 1];  // As[k][row], padded
    __shared__ double Bs[RK][RT];      // Bs[k][col]

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * 16 + tx;
    const int row0 = blockIdx.y * RT, col0 = blockIdx.x * RT;

    double acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;

    for (int k0 = 0; k0 < K; k0 += RK) {
        // A tile: 64 rows x 16 k, 1024 values, 4 per thread.
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int e = tid + 256 * s;
            const int r = e / RK, c = e % RK;
            const int gr = row0 + r, gc = k0 + c;
            As[c][r] = (gr < M && gc < K) ? (double)A[(long long)gr * K + gc] : 0.0;
        }
        // B tile: 16 k x 64 columns.
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int e = tid + 256 * s;
            const int r = e / RT, c = e % RT;
            const int gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < K && gc < N) ? (double)B[(long long)gr * N + gc] : 0.0;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < RK; ++kk) {
            double a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int gr = row0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int gc = col0 + tx + 16 * j;
            if (gr < M && gc < N) C[(long long)gr * N + gc] = (float)acc[i][j];
        }
    }
}
