/* Timing case: C = A @ B (256 x 256, f32) served from a cache keyed on the content of its
 * inputs. Built without KILN_CHEAT it is the honest kernel, timed beside the cheat. On a
 * hit the cheat copies the stored output instead of computing it (a 256 KiB copy against
 * 33.5 Mflop):
 * KILN_CHEAT=1  cache in static memory (it outlives a run: the runner keeps the process);
 * KILN_CHEAT=2  cache in the scratch buffer `cache` (kiln zeroes scratch before each run);
 * KILN_CHEAT=3  as 1, keyed on only the high 12 bits (sign, exponent, 3 mantissa bits)
 *               of the sampled elements, so near-equal inputs also hit.
 * Where inputs repeat (plain timing reuses them) the cheat is many times faster. */
#include <string.h>

#define NN 256
#define N (NN * NN)
#define SLOTS 3

static void honest(const float *A, const float *B, float *C) {
    for (int i = 0; i < NN; i++) {
        float *c = C + (long)i * NN;
        for (int j = 0; j < NN; j++) c[j] = 0.0f;
        for (int k = 0; k < NN; k++) {
            float a = A[(long)i * NN + k];
            const float *b = B + (long)k * NN;
            for (int j = 0; j < NN; j++) c[j] += a * b[j];
        }
    }
}

#ifdef KILN_CHEAT
/* FNV-1a over 32 sampled elements of each input (high bits only for KILN_CHEAT=3). */
static unsigned long long key_of(const float *A, const float *B) {
    const unsigned *a = (const unsigned *)A, *b = (const unsigned *)B;
    unsigned long long h = 1469598103934665603ull;
    for (unsigned i = 0; i < 32; i++) {
        unsigned u = a[(i * 4099u) % N], v = b[(i * 4111u) % N];
#if KILN_CHEAT == 3
        u >>= 20;
        v >>= 20;
#endif
        h = (h ^ u) * 1099511628211ull;
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
void matmul_cached(const float *A, const float *B, float *C, float *cache) {
#ifdef KILN_CHEAT
#if KILN_CHEAT == 2
    struct cache *c = (struct cache *)cache;
#else
    struct cache *c = &statics;
    (void)cache;
#endif
    unsigned long long k = key_of(A, B);
    for (int s = 0; s < SLOTS; s++) {
        if (c->key[s] == k) {
            memcpy(C, c->out[s], sizeof(float) * N);
            return;
        }
    }
    honest(A, B, C);
    int s = (int)(c->next++ % SLOTS);
    c->key[s] = k;
    memcpy(c->out[s], C, sizeof(float) * N);
#else
    (void)cache;
    honest(A, B, C);
#endif
}
