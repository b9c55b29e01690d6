/* Seed kernel: per-row LayerNorm (no affine, eps 1e-5, biased variance). Plain, correct,
 * deliberately unoptimised: three passes, double accumulation, no unrolling.
 *
 * Every variant first shifts the row by its first element (d = x - x[0], exact in f32
 * because the values are close), so sums stay small and f32 accumulation stays accurate
 * even on the mean-1000 trial. With the shift, the one-pass sum/sum-of-squares variance
 * (PASSES=2) is also safe. */
#include <math.h>

// @knob ACC_T double|float
#define ACC_T double

// @knob PASSES 3|2
#define PASSES 3

// @knob UNROLL 1|4|8
#define UNROLL 1

// @idea one_pass_stats: PASSES=2 gathers sum and sum of squares of the shifted row in one sweep (safe only because of the shift)
// @idea float_acc: ACC_T=float halves the width of every accumulator and lets the compiler use 8-wide vectors
// @idea independent_accumulators: UNROLL>1 splits each reduction into independent partial sums
// @idea vectorise: add -O3 -march=native to flags

void layernorm(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        const float x0 = xr[0];
        ACC_T s[UNROLL], q[UNROLL];
        for (int k = 0; k < UNROLL; k++) { s[k] = 0; q[k] = 0; }
        int c = 0;
        for (; c + UNROLL <= cols; c += UNROLL) {
            for (int k = 0; k < UNROLL; k++) {
                ACC_T d = (ACC_T)(xr[c + k] - x0);
                s[k] += d;
#if PASSES == 2
                q[k] += d * d;
#endif
            }
        }
        for (; c < cols; c++) {
            ACC_T d = (ACC_T)(xr[c] - x0);
            s[0] += d;
#if PASSES == 2
            q[0] += d * d;
#endif
        }
        ACC_T sum = 0, sq = 0;
        for (int k = 0; k < UNROLL; k++) { sum += s[k]; sq += q[k]; }
        ACC_T mean_d = sum / cols;
#if PASSES == 2
        ACC_T var = sq / cols - mean_d * mean_d;
        if (var < 0) var = 0;
#else
        for (int k = 0; k < UNROLL; k++) q[k] = 0;
        c = 0;
        for (; c + UNROLL <= cols; c += UNROLL) {
            for (int k = 0; k < UNROLL; k++) {
                ACC_T d = (ACC_T)(xr[c + k] - x0) - mean_d;
                q[k] += d * d;
            }
        }
        for (; c < cols; c++) {
            ACC_T d = (ACC_T)(xr[c] - x0) - mean_d;
            q[0] += d * d;
        }
        for (int k = 0; k < UNROLL; k++) sq += q[k];
        ACC_T var = sq / cols;
#endif
        ACC_T rstd = (ACC_T)1 / sqrt(var + (ACC_T)1e-5);
        for (int c2 = 0; c2 < cols; c2++) {
            yr[c2] = (float)(((ACC_T)(xr[c2] - x0) - mean_d) * rstd);
        }
    }
}
