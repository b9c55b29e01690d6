/* Seed kernel: y = conv2d(x, w) + b (torch.nn.Conv2d semantics: cross-correlation, NCHW,
 * zero padding), direct convolution in f32. Plain and correct for every combination of
 * the knobs and any shape (OC must be a multiple of OCPT, which holds for OC = 96 and
 * every OCPT value below; otherwise the kernel writes nothing).
 *
 * One thread computes OCPT output channels of one output pixel: it reads each input value
 * once and multiplies it into OCPT accumulators. Work items are numbered with ow fastest,
 * then oh, then the channel group, then the image, so the 32 threads of a warp share
 * their weights (broadcast loads) and read neighbouring input columns.
 *
 * Launch plan (recompute it when BLOCK changes; OCPT only changes the best grid):
 *   kernel conv2d, args [x, w, b, y, N, C, H, W, OC, KH, KW, stride, pad, OH, OW]
 *   block = [BLOCK, 1, 1]
 *   grid  = [ceil(N * (OC / OCPT) * OH * OW / BLOCK), 1, 1]   (the kernel loops
 *           grid-stride, so any grid is correct; this one gives each thread one item)
 *   shared_bytes = 0
 * Defaults (BLOCK 256, OCPT 4) at (100,3,224,224) -> (100,96,55,55): 7,260,000 items,
 * grid [28360, 1, 1]. A block whose blockDim.x is not BLOCK returns without writing.
 */

// @knob OCPT 1|2|4|8|16|32
#define OCPT 4

// @knob BLOCK 64|128|256|512 launch:block.x
#define BLOCK 256

// @idea smem_weights: stage the weights of the block's output channels (OCPT*C*KH*KW floats) in shared memory once per block
// @idea smem_input_tile: load the input patch a block needs into shared memory once and reuse it for all of its output pixels and channels
// @idea implicit_gemm: treat the convolution as a GEMM of (N*OH*OW) x (C*KH*KW) patches by (C*KH*KW) x OC weights and tile it like a matmul
// @idea tensor_cores: implicit GEMM on TF32 or fp16 tensor cores (mma.sync) - much faster; the precision tier then reads tf32-like or fp16-like
// @idea more_pixels_per_thread: give each thread 2-4 neighbouring output columns too, so the overlapping input columns are loaded once

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
