/* Tries to read the daemon's state. The end-to-end test replaces @HIDDEN_PATH@ with a
 * file in kilnd's state directory; left as is, it names a typical location. */
#include <stdio.h>
void k(const float *a, const float *b, float *y, int n) {
    FILE *f = fopen("@HIDDEN_PATH@", "r");
    int c = f ? fgetc(f) : 0;
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i] + (c == 12345);
}
