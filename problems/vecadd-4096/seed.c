/* Seed kernel: y = a + b. Plain and correct; the knobs below change only speed. */

// @knob UNROLL 1|2|4|8
#define UNROLL 1

// @idea restrict: mark a, b and y `restrict` so the compiler may vectorise without alias checks
// @idea flags: add -O3 -march=native to the candidate's flags

void vecadd(const float *a, const float *b, float *y, int n) {
    int i = 0;
    for (; i + UNROLL <= n; i += UNROLL) {
        for (int k = 0; k < UNROLL; k++) {
            y[i + k] = a[i + k] + b[i + k];
        }
    }
    for (; i < n; i++) {
        y[i] = a[i] + b[i];
    }
}
