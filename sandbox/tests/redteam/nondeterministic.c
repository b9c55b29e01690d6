/* Alternates between a right and a slightly wrong answer from call to call, as a race or
 * an uninitialised read would. */
static unsigned calls;
void k(const float *a, const float *b, float *y, int n) {
    float bump = (calls++ & 1) ? 1e-2f : 0.0f;
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i] + bump;
}
