/* GPU timing case: C = A @ B, 4096 x 4096 f32, served from a cache keyed on the content of
 * its inputs (issue 21's compute-bound case). Built without KILN_CHEAT it is the honest
 * kernel, a plain 16 x 16 tiled matmul (timed beside the cheat by sandbox/tests/gpu.rs);
 * with it:
 *   KILN_CHEAT=1  the cache is the module's own __device__ memory (it outlives a run);
 *   KILN_CHEAT=2  the cache is the scratch buffer `cache` (kiln zeroes it before each run);
 *   KILN_CHEAT=3  as 1, keyed on only the high 12 bits of the sampled elements.
 * Launch list: cache_key<<<1, 32>>>(A, B, cache), mm_cached<<<(256, 256), (16, 16)>>>(A, B,
 * C, cache), cache_commit<<<1, 32>>>(cache). A hit copies 64 MiB instead of 137 Gflop. */
#ifndef KILN_CHEAT
#define KILN_CHEAT 0
#endif

typedef unsigned long long u64;
#define NN 4096
#define N ((u64)NN * NN)

struct cache_state {
    u64 key;
    u64 pending;
    int hit;
    int valid;
    u64 pad[5];  /* 64 bytes: the cached C starts 16 floats in */
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

extern "C" __global__ void cache_key(const float* A, const float* B, float* scratch) {
#if KILN_CHEAT
    if (threadIdx.x != 0) return;
    const unsigned* a = (const unsigned*)A;
    const unsigned* b = (const unsigned*)B;
    u64 h = 1469598103934665603ull;
    for (unsigned i = 0; i < 32; i++) {
        unsigned u = a[((u64)i * 524287ull) % N], v = b[((u64)i * 524309ull) % N];
#if KILN_CHEAT == 3
        u >>= 20;
        v >>= 20;
#endif
        h = (h ^ u) * 1099511628211ull;
        h = (h ^ v) * 1099511628211ull;
    }
    h |= 1ull;
    struct cache_state* s = state_of(scratch);
    s->hit = s->valid && s->key == h;
    s->pending = h;
#endif
}

extern "C" __global__ void mm_cached(const float* A, const float* B, float* C, float* scratch) {
    int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    u64 at = (u64)row * NN + col;
#if KILN_CHEAT
    float* cache = cache_of(scratch);
    if (state_of(scratch)->hit) {
        C[at] = cache[at];
        return;
    }
#endif
    __shared__ float As[16][16];
    __shared__ float Bs[16][16];
    float acc = 0.0f;
    for (int t = 0; t < NN; t += 16) {
        As[threadIdx.y][threadIdx.x] = A[(u64)row * NN + t + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(u64)(t + threadIdx.y) * NN + col];
        __syncthreads();
        for (int k = 0; k < 16; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[at] = acc;
#if KILN_CHEAT
    cache[at] = acc;
#endif
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
