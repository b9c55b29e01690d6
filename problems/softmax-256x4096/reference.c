/* Trusted reference: row softmax, every reduction and exp in double. */
#include <math.h>

void ref_softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        double m = -INFINITY;
        for (int c = 0; c < cols; c++) {
            if (xr[c] > m) m = xr[c];
        }
        double s = 0.0;
        for (int c = 0; c < cols; c++) {
            s += exp((double)xr[c] - m);
        }
        for (int c = 0; c < cols; c++) {
            yr[c] = (float)(exp((double)xr[c] - m) / s);
        }
    }
}
