/* Writes only the first half of the output. */
void k(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n / 2; i++) y[i] = a[i] + b[i];
}
