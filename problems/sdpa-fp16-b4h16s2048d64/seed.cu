/* Seed kernel: scaled dot-product attention, non-causal (torch's
 * scaled_dot_product_attention(q, k, v) with scale 1/sqrt(64)), q, k, v, out
 * (BH, S, 64) fp16, BH = batch * heads. fp16 values travel as 16-bit patterns and are
 * converted with PTX cvt (no header).
 *
 * A straightforward single-pass ("online softmax") kernel on the CUDA cores, all in f32:
 * one thread per query row keeps its scaled query and its output accumulator (64 + 64
 * floats) in registers; the block's threads stage BKV keys and values at a time in shared
 * memory (as f32) and every thread walks them in order, rescaling its running sum and
 * accumulator whenever its running maximum grows. Slow next to a tensor-core flash
 * attention, but correct for every combination of the knobs and any S (D must be 64;
 * otherwise the kernel writes nothing).
 *
 * Launch plan (recompute it when BQ changes; BKV and EXPF change nothing):
 *   kernel attn_fwd, args [q, k, v, out, BH, S, D, scale (f32)]
 *   block = [BQ, 1, 1]
 *   grid  = [ceil(S / BQ), BH, 1]   (both dimensions looped grid-stride: any grid is correct)
 *   shared_bytes = 0 (static: 2 * BKV * 64 * 4 bytes, at most 32 KiB)
 * Defaults (BQ 64) at BH = 64, S = 2048: block [64, 1, 1], grid [32, 64, 1].
 * A block whose blockDim.x is not BQ returns without writing.
 */

// @knob BKV 16|32|64
#define BKV 32

// @knob EXPF expf|__expf
#define EXPF expf

// @knob BQ 32|64|128
#define BQ 64

// @idea tensor_cores: compute the score tile Q*K^T and the product P*V with fp16 mma.sync (m16n8k16, f32 accumulators) per warp, as FlashAttention-2 does: 16 query rows per warp, P converted to fp16 in registers between the two products
// @idea tile_softmax: rescale once per key tile instead of once per key: compute the BKV scores of a tile, take their maximum, then update the running maximum, sum and accumulator once
// @idea exp2_scaling: fold log2(e) into the query scale and use exp2f (ex2.approx) for every exponential
// @idea share_kv_reads: read K and V from shared memory as float4 (or keep them as fp16 in shared memory and convert two at a time) to cut shared-memory traffic
// @idea wgmma_fa3: on sm_90, warpgroup MMA with TMA loads and producer/consumer warp specialisation (FlashAttention-3)

#define HD 64  // head dimension the kernel is written for

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

extern "C" __global__ void __launch_bounds__(BQ)
attn_fwd(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
         const unsigned short* __restrict__ v, unsigned short* __restrict__ out,
         int BH, int S, int D, float scale)
{
    if (blockDim.x != BQ || D != HD) return;
    __shared__ __align__(16) float Ks[BKV][HD];
    __shared__ __align__(16) float Vs[BKV][HD];
    const int tid = threadIdx.x;

    for (int bh = blockIdx.y; bh < BH; bh += gridDim.y) {
        const unsigned short* kh = k + (long long)bh * S * HD;
        const unsigned short* vh = v + (long long)bh * S * HD;
        for (int q0 = blockIdx.x * BQ; q0 < S; q0 += gridDim.x * BQ) {
            const int i = q0 + tid;
            const bool active = i < S;

            float qr[HD], acc[HD];
            if (active) {
                const unsigned short* qp = q + ((long long)bh * S + i) * HD;
#pragma unroll
                for (int d = 0; d < HD; ++d) qr[d] = h2f(qp[d]) * scale;
            } else {
#pragma unroll
                for (int d = 0; d < HD; ++d) qr[d] = 0.0f;
            }
#pragma unroll
            for (int d = 0; d < HD; ++d) acc[d] = 0.0f;
            float m = __int_as_float(0xff800000);  // running maximum, -inf
            float l = 0.0f;                         // running sum of exp(s - m)

            for (int j0 = 0; j0 < S; j0 += BKV) {
                __syncthreads();  // the previous tile is no longer read
                for (int e = tid; e < BKV * HD; e += BQ) {
                    const int r = e / HD, c = e % HD;
                    const int j = j0 + r;
                    Ks[r][c] = j < S ? h2f(kh[(long long)j * HD + c]) : 0.0f;
                    Vs[r][c] = j < S ? h2f(vh[(long long)j * HD + c]) : 0.0f;
                }
                __syncthreads();
                if (active) {
                    const int nk = min(BKV, S - j0);
                    for (int r = 0; r < nk; ++r) {
                        float s = 0.0f;
#pragma unroll
                        for (int d = 0; d < HD; ++d) s = fmaf(qr[d], Ks[r][d], s);
                        if (s > m) {
                            const float corr = EXPF(m - s);  // 0 on the first key
                            l *= corr;
#pragma unroll
                            for (int d = 0; d < HD; ++d) acc[d] *= corr;
                            m = s;
                        }
                        const float p = EXPF(s - m);
                        l += p;
#pragma unroll
                        for (int d = 0; d < HD; ++d) acc[d] = fmaf(p, Vs[r][d], acc[d]);
                    }
                }
            }

            if (active) {
                const float inv = 1.0f / l;
                unsigned short* op = out + ((long long)bh * S + i) * HD;
#pragma unroll
                for (int d = 0; d < HD; ++d) op[d] = f2h(acc[d] * inv);
            }
        }
    }
}
