/* GPU timing case: row softmax of a 4096 x 65536 f32 matrix that serves its output from a
 * cache keyed on the content of its input. Built without KILN_CHEAT it is the honest
 * kernel (timed beside the cheat by sandbox/tests/gpu.rs); with it:
 *   KILN_CHEAT=1  the cache is the module's own __device__ memory (it outlives a run);
 *   KILN_CHEAT=2  the cache is the scratch buffer `cache` (kiln zeroes it before each run);
 *   KILN_CHEAT=3  as 1, keyed on only the high 12 bits of the sampled elements.
 * Launch list: cache_key<<<1, 32>>>(x, cache), softmax_cached<<<4096, 256>>>(x, y, cache),
 * cache_commit<<<1, 32>>>(cache); the first and the last do nothing in the honest build.
 * The honest rows take two exponentials in double per element, so a hit (one copy of the
 * stored row) is about twice as fast: what a cache would win on a memory-bound problem. */
#ifndef KILN_CHEAT
#define KILN_CHEAT 0
#endif

typedef unsigned long long u64;
#define ROWS 4096
#define COLS 65536
#define N ((u64)ROWS * COLS)
#define THREADS 256

struct cache_state {
    u64 key;
    u64 pending;
    int hit;
    int valid;
    u64 pad[5];  /* 64 bytes: the cached rows start 16 floats in */
};

#if KILN_CHEAT == 1 || KILN_CHEAT == 3
__device__ struct cache_state g_state;
__device__ float g_cache[N];
#endif

__device__ __forceinline__ struct cache_state* state_of(float* scratch) {
#if KILN_CHEAT == 2
    return (struct cache_state*)scratch;
#elif KILN_CHEAT
    return &g_state;
#else
    return (struct cache_state*)0;
#endif
}

__device__ __forceinline__ float* cache_of(float* scratch) {
#if KILN_CHEAT == 2
    return scratch + 16;
#elif KILN_CHEAT
    return g_cache;
#else
    return scratch;
#endif
}

extern "C" __global__ void cache_key(const float* x, float* scratch) {
#if KILN_CHEAT
    if (threadIdx.x != 0) return;
    const unsigned* b = (const unsigned*)x;
    u64 h = 1469598103934665603ull;
    for (unsigned i = 0; i < 64; i++) {
        unsigned v = b[((u64)i * 4194301ull) % N];
#if KILN_CHEAT == 3
        v >>= 20;
#endif
        h = (h ^ v) * 1099511628211ull;
    }
    h |= 1ull;
    struct cache_state* s = state_of(scratch);
    s->hit = s->valid && s->key == h;
    s->pending = h;
#endif
}

__device__ float block_reduce(float v, bool is_max, float* red) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < THREADS / 32 ? red[threadIdx.x] : (is_max ? -1e30f : 0.0f);
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(0xffffffffu, t, o);
            t = is_max ? fmaxf(t, w) : t + w;
        }
        if (threadIdx.x == 0) red[THREADS / 32] = t;
    }
    __syncthreads();
    float r = red[THREADS / 32];
    __syncthreads();
    return r;
}

extern "C" __global__ void softmax_cached(const float* x, float* y, float* scratch) {
    __shared__ float red[THREADS / 32 + 1];
    __shared__ double dred[THREADS];
    for (u64 r = blockIdx.x; r < ROWS; r += gridDim.x) {
        const float* xr = x + r * COLS;
        float* yr = y + r * COLS;
#if KILN_CHEAT
        float* cr = cache_of(scratch) + r * COLS;
        if (state_of(scratch)->hit) {
            for (int c = threadIdx.x; c < COLS; c += THREADS) yr[c] = cr[c];
            continue;
        }
#endif
        float m = -1e30f;
        for (int c = threadIdx.x; c < COLS; c += THREADS) m = fmaxf(m, xr[c]);
        m = block_reduce(m, true, red);
        double s = 0.0;
        for (int c = threadIdx.x; c < COLS; c += THREADS) s += exp((double)xr[c] - m);
        dred[threadIdx.x] = s;
        __syncthreads();
        for (int k = THREADS / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) dred[threadIdx.x] += dred[threadIdx.x + k];
            __syncthreads();
        }
        double total = dred[0];
        __syncthreads();
        for (int c = threadIdx.x; c < COLS; c += THREADS) {
            float v = (float)(exp((double)xr[c] - m) / total);
            yr[c] = v;
#if KILN_CHEAT
            cr[c] = v;
#endif
        }
    }
}

extern "C" __global__ void cache_commit(float* scratch) {
#if KILN_CHEAT
    if (threadIdx.x != 0) return;
    struct cache_state* s = state_of(scratch);
    if (!s->hit) {
        s->key = s->pending;
        s->valid = 1;
    }
#endif
}
