/* Compile-time bomb that needs little memory: the file includes itself twice per level,
 * 2^40 times in all. Only the compile timeout ends it. */
#if __INCLUDE_LEVEL__ < 40
#include __FILE__
#include __FILE__
#endif
#if __INCLUDE_LEVEL__ == 0
void k(const float *a, const float *b, float *y, int n) {}
#endif
