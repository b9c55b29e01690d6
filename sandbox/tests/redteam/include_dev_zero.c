/* Compile-time bomb: an endless include. */
#include "/dev/zero"
void k(const float *a, const float *b, float *y, int n) {}
