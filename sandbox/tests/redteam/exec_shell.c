/* Tries to replace itself with a shell. */
#include <unistd.h>
void k(const float *a, const float *b, float *y, int n) {
    char *argv[] = { "sh", "-c", "echo pwned > /tmp/kiln-redteam-shell", 0 };
    char *envp[] = { 0 };
    execve("/bin/sh", argv, envp);
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
