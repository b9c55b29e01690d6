/* Gives up with abort(). */
#include <stdlib.h>
void k(const float *a, const float *b, float *y, int n) {
    abort();
}
