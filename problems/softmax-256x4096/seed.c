/* Seed kernel: row softmax. Plain, correct and deliberately unoptimised: three passes,
 * double accumulation, double exp, no unrolling. Every knob combination is correct
 * (every variant subtracts the row maximum, so the mean-1000 trial cannot overflow). */
#include <math.h>

// @knob ACC_T double|float
#define ACC_T double

// @knob EXP exp|expf
#define EXP exp

// @knob ONLINE 0|1
#define ONLINE 0

// @knob UNROLL 1|4|8
#define UNROLL 1

// @idea online: ONLINE=1 finds the maximum and the sum of exponentials in one pass (rescaling the running sum when the maximum grows), then writes in a second pass
// @idea float_math: ACC_T=float with EXP=expf halves the cost of every exponential
// @idea independent_accumulators: UNROLL>1 keeps several partial maxima and sums so the loop is not one long dependency chain
// @idea vectorise: add -O3 -march=native -ffast-math to flags once the loops are unrolled

static void row_max_sum(const float *xr, int cols, ACC_T *out_m, ACC_T *out_s) {
#if ONLINE
    ACC_T m[UNROLL], s[UNROLL];
    for (int k = 0; k < UNROLL; k++) { m[k] = -INFINITY; s[k] = 0; }
    int c = 0;
    for (; c + UNROLL <= cols; c += UNROLL) {
        for (int k = 0; k < UNROLL; k++) {
            ACC_T v = xr[c + k];
            if (v > m[k]) { s[k] = s[k] * EXP(m[k] - v) + 1; m[k] = v; }
            else { s[k] += EXP(v - m[k]); }
        }
    }
    for (; c < cols; c++) {
        ACC_T v = xr[c];
        if (v > m[0]) { s[0] = s[0] * EXP(m[0] - v) + 1; m[0] = v; }
        else { s[0] += EXP(v - m[0]); }
    }
    ACC_T mm = m[0];
    for (int k = 1; k < UNROLL; k++) if (m[k] > mm) mm = m[k];
    ACC_T ss = 0;
    for (int k = 0; k < UNROLL; k++) if (s[k] > 0) ss += s[k] * EXP(m[k] - mm);
    *out_m = mm;
    *out_s = ss;
#else
    ACC_T m[UNROLL], s[UNROLL];
    for (int k = 0; k < UNROLL; k++) { m[k] = -INFINITY; s[k] = 0; }
    int c = 0;
    for (; c + UNROLL <= cols; c += UNROLL)
        for (int k = 0; k < UNROLL; k++)
            if (xr[c + k] > m[k]) m[k] = xr[c + k];
    for (; c < cols; c++)
        if (xr[c] > m[0]) m[0] = xr[c];
    ACC_T mm = m[0];
    for (int k = 1; k < UNROLL; k++) if (m[k] > mm) mm = m[k];
    c = 0;
    for (; c + UNROLL <= cols; c += UNROLL)
        for (int k = 0; k < UNROLL; k++)
            s[k] += EXP((ACC_T)xr[c + k] - mm);
    for (; c < cols; c++)
        s[0] += EXP((ACC_T)xr[c] - mm);
    ACC_T ss = 0;
    for (int k = 0; k < UNROLL; k++) ss += s[k];
    *out_m = mm;
    *out_s = ss;
#endif
}

void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        ACC_T m, s;
        row_max_sum(xr, cols, &m, &s);
        ACC_T inv = (ACC_T)1 / s;
        for (int c = 0; c < cols; c++) {
            yr[c] = (float)(EXP((ACC_T)xr[c] - m) * inv);
        }
    }
}
