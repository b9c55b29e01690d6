/* Unbounded recursion. */
static int deep(volatile int d) {
    volatile char pad[4096];
    pad[0] = (char)d;
    return deep(d + 1) + pad[0];
}
void k(const float *a, const float *b, float *y, int n) {
    y[0] = (float)deep(0);
}
