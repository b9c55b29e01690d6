/* Runs code at load time (a constructor), before the strict filter: the loader stage
 * still refuses any open for writing. */
#include <stdio.h>
__attribute__((constructor)) static void early(void) {
    FILE *f = fopen("/tmp/kiln-redteam-ctor", "w");
    if (f) fclose(f);
}
void k(const float *a, const float *b, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
