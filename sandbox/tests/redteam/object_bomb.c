/* A 100 MiB initialised array: the assembler writes an object past the compile jail's
 * file-size limit (64 MiB) and dies of SIGXFSZ; the verdict must name that limit. */
char big[100 << 20] = {1};
void k(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i] + big[i & 1];
}
