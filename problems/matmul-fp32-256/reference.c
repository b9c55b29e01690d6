/* Trusted reference: C = A @ B for n x n row-major f32 matrices, accumulating each row
 * of C in double (i-k-j order, so B is read row by row). */

void ref_matmul(const float *A, const float *B, float *C, int n) {
    double acc[1024];
    if (n > 1024) return; /* leaves C poisoned: the contract refuses the reference */
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) acc[j] = 0.0;
        for (int k = 0; k < n; k++) {
            double a = A[(long)i * n + k];
            const float *b = B + (long)k * n;
            for (int j = 0; j < n; j++) acc[j] += a * b[j];
        }
        for (int j = 0; j < n; j++) C[(long)i * n + j] = (float)acc[j];
    }
}
