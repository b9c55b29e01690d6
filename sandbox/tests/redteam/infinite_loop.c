/* Never returns: the worker's per-run wall limit must end it (timeout). */
void k(const float *a, const float *b, float *y, int n) {
    volatile unsigned long spin = 0;
    for (;;) spin++;
}
