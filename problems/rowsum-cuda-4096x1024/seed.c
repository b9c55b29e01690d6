/* Seed kernel (host backend): y[r] = sum over c of x[r, c] in float. Plain and correct;
 * UNROLL > 1 splits each row's sum into independent partial sums (still f32, within the
 * tolerance: see problem.toml). */

// @knob UNROLL 1|2|4|8
#define UNROLL 1

// @idea independent_accumulators: UNROLL>1 breaks the single dependency chain of the sum
// @idea flags: add -O3 -march=native to the candidate's flags so the partial sums become vector lanes

void rowsum(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float s[UNROLL];
        for (int k = 0; k < UNROLL; k++) s[k] = 0.0f;
        int c = 0;
        for (; c + UNROLL <= cols; c += UNROLL)
            for (int k = 0; k < UNROLL; k++) s[k] += xr[c + k];
        for (; c < cols; c++) s[0] += xr[c];
        float t = 0.0f;
        for (int k = 0; k < UNROLL; k++) t += s[k];
        y[r] = t;
    }
}
