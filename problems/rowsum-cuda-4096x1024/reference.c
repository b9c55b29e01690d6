/* Trusted reference (host backend): y[r] = sum over c of x[r, c], summed in double and
 * rounded once. */
void ref_rowsum(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        double s = 0.0;
        for (int c = 0; c < cols; c++) s += xr[c];
        y[r] = (float)s;
    }
}
