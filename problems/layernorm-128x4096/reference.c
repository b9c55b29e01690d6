/* Trusted reference: per-row LayerNorm without affine, eps 1e-5, biased variance,
 * two passes in double. */
#include <math.h>

void ref_layernorm(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        double s = 0.0;
        for (int c = 0; c < cols; c++) s += xr[c];
        double mean = s / cols;
        double v = 0.0;
        for (int c = 0; c < cols; c++) {
            double d = (double)xr[c] - mean;
            v += d * d;
        }
        double rstd = 1.0 / sqrt(v / cols + 1e-5);
        for (int c = 0; c < cols; c++) yr[c] = (float)(((double)xr[c] - mean) * rstd);
    }
}
