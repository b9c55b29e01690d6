/* Trusted reference: y = a + b, computed in double and rounded once. */
void ref_vecadd(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n; i++) {
        y[i] = (float)((double)a[i] + (double)b[i]);
    }
}
