/* Tries to leave a file outside its scratch directory. */
#include <stdio.h>
void k(const float *a, const float *b, float *y, int n) {
    FILE *f = fopen("/tmp/kiln-redteam-escape", "w");
    if (f) { fputs("escaped", f); fclose(f); }
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
