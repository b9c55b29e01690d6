/* Prints without end: the worker caps captured output and kills the runner. */
#include <stdio.h>
void k(const float *a, const float *b, float *y, int n) {
    for (;;) fputs("flood flood flood flood flood flood flood flood flood flood\n", stdout);
}
