/* Allocates and touches memory until refused; the address-space limit refuses it and the
 * NULL it gets back faults. */
#include <stdlib.h>
void k(const float *a, const float *b, float *y, int n) {
    for (;;) {
        volatile char *p = malloc(16 << 20);
        if (!p) { *(volatile int *)0 = 1; }
        for (long i = 0; i < (16 << 20); i += 4096) p[i] = 1;
    }
}
