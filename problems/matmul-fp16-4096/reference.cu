/* Trusted reference: C = A * B with A (M x K), B (K x N) and C (M x N) in IEEE fp16,
 * row-major. fp16 values are passed as their 16-bit patterns (unsigned short) and
 * converted with PTX cvt, so no header is needed. Every product and sum is in f64 (exact
 * products: two fp16 values have 11-bit significands), and C is rounded to fp16 once,
 * directly from f64 (cvt.rn.f16.f64, round to nearest even; values beyond fp16's range
 * become +-inf, as torch's half matmul gives).
 *
 * Launch: grid = [ceil(N / 64), ceil(M / 64), 1], block = [16, 16, 1], no dynamic shared
 * memory; each block computes a 64 x 64 tile of C, thread (tx, ty) the 4 x 4 elements at
 * rows by*64 + ty + 16*i and columns bx*64 + tx + 16*j. Any M, N, K.
 *
 * Time on an H200: 68.7 G f64 FMAs, as matmul-fp32-4096's reference. Measured (2026-11,
 * NVRTC 13.0, sm_90, no L2 flush, median of 5): 8.6 ms.
 */

#define RT 64
#define RK 16

__device__ __forceinline__ float ref_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short ref_d2h(double d) {
    unsigned short h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));
    return h;
}

extern "C" __global__ void __launch_bounds__(256)
ref_hgemm(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
          unsigned short* __restrict__ C, int M, int N, int K)
{
    __shared__ double As[RK][RT + 1];  // As[k][row]
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
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int e = tid + 256 * s;
            const int r = e / RK, c = e % RK;
            const int gr = row0 + r, gc = k0 + c;
            As[c][r] = (gr < M && gc < K) ? (double)ref_h2f(A[(long long)gr * K + gc]) : 0.0;
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int e = tid + 256 * s;
            const int r = e / RT, c = e % RT;
            const int gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < K && gc < N) ? (double)ref_h2f(B[(long long)gr * N + gc]) : 0.0;
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
            if (gr < M && gc < N) C[(long long)gr * N + gc] = ref_d2h(acc[i][j]);
        }
    }
}
