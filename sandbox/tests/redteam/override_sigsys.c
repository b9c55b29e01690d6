#define _POSIX_C_SOURCE 200809L
/* Tries to install its own SIGSYS handler to swallow seccomp traps. */
#include <signal.h>
#include <string.h>
static void ignore(int s) { (void)s; }
void k(const float *a, const float *b, float *y, int n) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ignore;
    sigaction(SIGSYS, &sa, 0);
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
