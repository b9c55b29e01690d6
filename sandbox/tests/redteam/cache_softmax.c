/* Timing case: row softmax (256 x 4096) that serves outputs from a cache keyed on the
 * content of its input. Built without KILN_CHEAT it is the honest kernel, timed beside
 * the cheat. On a hit the cheat copies the stored output instead of computing it:
 * KILN_CHEAT=1  cache in static memory (it outlives a run: the runner keeps the process);
 * KILN_CHEAT=2  cache in the scratch buffer `cache` (kiln zeroes scratch before each run);
 * KILN_CHEAT=3  as 1, keyed on only the high 12 bits (sign, exponent, 3 mantissa bits)
 *               of the sampled elements, so near-equal inputs also hit.
 * Where inputs repeat (plain timing reuses them) the cheat is several times faster. */
#include <math.h>
#include <string.h>

#define ROWS 256
#define COLS 4096
#define N (ROWS * COLS)
#define SLOTS 3

static void honest(const float *x, float *y) {
    for (int r = 0; r < ROWS; r++) {
        const float *xr = x + (long)r * COLS;
        float *yr = y + (long)r * COLS;
        float m = -INFINITY;
        for (int c = 0; c < COLS; c++) m = xr[c] > m ? xr[c] : m;
        double s = 0.0;
        for (int c = 0; c < COLS; c++) s += exp((double)xr[c] - m);
        for (int c = 0; c < COLS; c++) yr[c] = (float)(exp((double)xr[c] - m) / s);
    }
}

#ifdef KILN_CHEAT
/* FNV-1a over 64 sampled elements (their high bits only for KILN_CHEAT=3); never 0. */
static unsigned long long key_of(const float *x) {
    const unsigned *b = (const unsigned *)x;
    unsigned long long h = 1469598103934665603ull;
    for (unsigned i = 0; i < 64; i++) {
        unsigned v = b[(i * 16411u) % N];
#if KILN_CHEAT == 3
        v >>= 20;
#endif
        h = (h ^ v) * 1099511628211ull;
    }
    return h | 1;
}

struct cache {
    unsigned long long key[SLOTS];
    unsigned long long next;
    float out[SLOTS][N];
};
#if KILN_CHEAT != 2
static struct cache statics;
#endif
#endif

/* `cache`: scratch of (sizeof(struct cache) + 3) / 4 floats, used by KILN_CHEAT=2 only. */
void softmax_cached(const float *x, float *y, float *cache) {
#ifdef KILN_CHEAT
#if KILN_CHEAT == 2
    struct cache *c = (struct cache *)cache;
#else
    struct cache *c = &statics;
    (void)cache;
#endif
    unsigned long long k = key_of(x);
    for (int s = 0; s < SLOTS; s++) {
        if (c->key[s] == k) {
            memcpy(y, c->out[s], sizeof(float) * N);
            return;
        }
    }
    honest(x, y);
    int s = (int)(c->next++ % SLOTS);
    c->key[s] = k;
    memcpy(c->out[s], y, sizeof(float) * N);
#else
    (void)cache;
    honest(x, y);
#endif
}
