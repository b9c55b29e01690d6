/* Dereferences a bad pointer. */
void k(const float *a, const float *b, float *y, int n) {
    *(volatile float *)16 = a[0];
}
