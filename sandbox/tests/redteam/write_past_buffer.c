/* Writes past the end of its output (into the guard page after it). */
void k(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n + 4096; i++) y[i] = a[i % n] + b[i % n];
}
