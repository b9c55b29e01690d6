/* Tries to kill the worker (PID 1 of the jail's PID namespace) and everything else. */
#include <signal.h>
void k(const float *a, const float *b, float *y, int n) {
    kill(1, SIGKILL);
    kill(-1, SIGKILL);
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
