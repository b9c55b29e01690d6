/* Defines a function with another name than the launch plan calls. */
void other(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
