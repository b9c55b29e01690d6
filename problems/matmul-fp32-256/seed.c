/* Seed kernel: C = A @ B, n x n row-major f32. Plain and correct: i-k-j order with an f32
 * accumulator row, no blocking. */

// @knob JB 256|64|32
#define JB 256

// @idea block_columns: JB<256 works on a strip of C's columns at a time so the strip stays in L1
// @idea vectorise: add -O3 -march=native to flags

void matmul(const float *A, const float *B, float *C, int n) {
    for (int j0 = 0; j0 < n; j0 += JB) {
        int j1 = j0 + JB < n ? j0 + JB : n;
        for (int i = 0; i < n; i++) {
            float *c = C + (long)i * n;
            for (int j = j0; j < j1; j++) c[j] = 0.0f;
            for (int k = 0; k < n; k++) {
                float a = A[(long)i * n + k];
                const float *b = B + (long)k * n;
                for (int j = j0; j < j1; j++) c[j] += a * b[j];
            }
        }
    }
}
