/* Tries to open a network connection. */
#include <sys/socket.h>
#include <netinet/in.h>
void k(const float *a, const float *b, float *y, int n) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(80), .sin_addr = { htonl(0x01010101) } };
    connect(s, (struct sockaddr *)&sa, sizeof sa);
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}
