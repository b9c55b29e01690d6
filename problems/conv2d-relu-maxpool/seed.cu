/* Seed kernels: y = MaxPool2d(3, stride 2)(ReLU(conv2d(x, w) + b)) in two launches.
 *   1. conv2d: the direct convolution of conv2d-3to96-k11s4p2's seed, f32, into the scratch
 *      buffer `conv` (N, OC, OH, OW) = (100, 96, 55, 55);
 *   2. relu_maxpool: one thread per pooled output, y = max(0, max over the PK x PK window).
 * Plain and correct for every combination of the knobs and any shape (OC must be a
 * multiple of OCPT, which holds for OC = 96 and every OCPT value below; otherwise conv2d
 * writes nothing and the output is wrong).
 *
 * conv2d: one thread computes OCPT output channels of one output pixel; work items are
 * numbered with ow fastest, then oh, then the channel group, then the image.
 *
 * Launch plan (recompute it when BLOCK or PBLOCK changes; OCPT only changes the best grid):
 *   1. kernel conv2d, args [x, w, b, conv, N, C, H, W, OC, KH, KW, stride, pad, OH, OW]
 *      block = [BLOCK, 1, 1], grid = [ceil(N * (OC / OCPT) * OH * OW / BLOCK), 1, 1]
 *   2. kernel relu_maxpool, args [conv, y, N*OC, OH, OW, PK, PS, PH, PW]
 *      block = [PBLOCK, 1, 1], grid = [ceil(N * OC * PH * PW / PBLOCK), 1, 1]
 *   scratch: conv, f32, N*OC*OH*OW = 29,040,000 elements
 * Both kernels loop grid-stride, so any grid is correct. Defaults (BLOCK 256, OCPT 4,
 * PBLOCK 256): grids [28360, 1, 1] and [27338, 1, 1]. A block whose blockDim.x is not
 * BLOCK (PBLOCK) returns without writing.
 */

// @knob OCPT 1|2|4|8|16|32
#define OCPT 4

// @knob BLOCK 64|128|256|512 launch:block.x@conv2d
#define BLOCK 256

// @knob PBLOCK 64|128|256|512 launch:block.x@relu_maxpool
#define PBLOCK 256

// @idea fuse: compute the convolution for a tile of output pixels in shared memory and pool it in the same kernel, so the 116 MB intermediate never goes to memory
// @idea smem_weights: stage the weights of the block's output channels in shared memory once per block
// @idea implicit_gemm: treat the convolution as a GEMM of (N*OH*OW) x 363 patches by 363 x OC weights and tile it like a matmul
// @idea tensor_cores: implicit GEMM on TF32 or fp16 tensor cores (mma.sync) - much faster; the precision tier then reads tf32-like or fp16-like
// @idea pool_rows: let each relu_maxpool thread produce several pooled outputs of a row so the overlapping window columns are read once

extern "C" __global__ void __launch_bounds__(BLOCK)
conv2d(const float* __restrict__ x, const float* __restrict__ w,
       const float* __restrict__ b, float* __restrict__ y,
       int N, int C, int H, int W, int OC, int KH, int KW, int stride, int pad,
       int OH, int OW)
{
    if (blockDim.x != BLOCK || OC % OCPT != 0) return;
    const int groups = OC / OCPT;
    const long long total = (long long)N * groups * OH * OW;
    for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * BLOCK) {
        const int ow = (int)(idx % OW);
        long long t = idx / OW;
        const int oh = (int)(t % OH);
        t /= OH;
        const int g = (int)(t % groups);
        const int n = (int)(t / groups);
        const int oc0 = g * OCPT;

        float acc[OCPT];
#pragma unroll
        for (int o = 0; o < OCPT; ++o) acc[o] = b[oc0 + o];

        const int ih0 = oh * stride - pad, iw0 = ow * stride - pad;
        for (int c = 0; c < C; ++c) {
            const float* xc = x + ((long long)n * C + c) * H * W;
            for (int kh = 0; kh < KH; ++kh) {
                const int ih = ih0 + kh;
                if (ih < 0 || ih >= H) continue;
                for (int kw = 0; kw < KW; ++kw) {
                    const int iw = iw0 + kw;
                    if (iw < 0 || iw >= W) continue;
                    const float xv = xc[(long long)ih * W + iw];
                    const float* wp = w + (((long long)oc0 * C + c) * KH + kh) * KW + kw;
#pragma unroll
                    for (int o = 0; o < OCPT; ++o)
                        acc[o] = fmaf(xv, __ldg(wp + (long long)o * C * KH * KW), acc[o]);
                }
            }
        }
#pragma unroll
        for (int o = 0; o < OCPT; ++o)
            y[(((long long)n * OC + oc0 + o) * OH + oh) * OW + ow] = acc[o];
    }
}

extern "C" __global__ void __launch_bounds__(PBLOCK)
relu_maxpool(const float* __restrict__ conv, float* __restrict__ y,
             int planes, int OH, int OW, int PK, int PS, int PH, int PW)
{
    if (blockDim.x != PBLOCK) return;
    const long long total = (long long)planes * PH * PW;
    for (long long idx = (long long)blockIdx.x * PBLOCK + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * PBLOCK) {
        const int pw = (int)(idx % PW);
        long long t = idx / PW;
        const int ph = (int)(t % PH);
        const long long plane = t / PH;
        const float* cp = conv + plane * OH * OW;
        float m = 0.0f;  // ReLU folded in: max(0, max over the window)
        for (int dy = 0; dy < PK; ++dy) {
            const int oh = ph * PS + dy;
            if (oh >= OH) continue;
            for (int dx = 0; dx < PK; ++dx) {
                const int ow = pw * PS + dx;
                if (ow >= OW) continue;
                m = fmaxf(m, cp[(long long)oh * OW + ow]);
            }
        }
        y[idx] = m;
    }
}
