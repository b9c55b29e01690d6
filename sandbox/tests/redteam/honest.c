/* A correct kernel, for cases whose attack is in the launch plan or the flags. */
void k(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
