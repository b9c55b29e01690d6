/* Tries to hide work in a thread: thread creation (stack guard mprotect, clone3) traps. */
#include <pthread.h>
static void *work(void *p) { return p; }
void k(const float *a, const float *b, float *y, int n) {
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
