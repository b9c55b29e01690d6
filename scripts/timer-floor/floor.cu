// timer-floor: what Nsight Compute's gpu__time_duration and CUPTI's kernel records read for
// the same kernels under the same L2 state. A measurement aid for `kiln bench agreement`
// (issue 13); built and run by scripts/timer-floor/run.sh on a GPU host with nvcc and ncu.
//
// Every sample is kiln's sequence (sandbox/gpu/src/timing.rs): an L2 flush (a 2 x L2 buffer
// set, then read once, so no dirty line is left), a drain, a blocking kernel spinning on
// %globaltimer for 36 us, start event, the kernel, end event, synchronize.
//
//   floor cupti N   CUPTI activity records (CONCURRENT_KERNEL) of every kernel; prints
//                   medians per kernel and phase (cold: flushed; warm: no flush)
//   floor plain N   the same work with no CUPTI, for ncu to profile
//
// Kernels: k_empty <<<1,1>>> (nothing), k_one <<<1,64>>> (one element copied), and the
// vecadd-cuda-1m and rowsum-cuda-4096x1024 seeds, linked in from problems/ as they are.
#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#define CK(x)                                                                             \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define CP(x)                                                                             \
    do {                                                                                  \
        CUptiResult r_ = (x);                                                             \
        if (r_ != CUPTI_SUCCESS) {                                                        \
            const char* s_ = "?";                                                         \
            cuptiGetResultString(r_, &s_);                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);                \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

extern "C" __global__ void vecadd(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ y, int n);
extern "C" __global__ void rowsum(const float* __restrict__ x, float* __restrict__ y, int rows,
                                  int cols);

extern "C" __global__ void k_empty() {}

extern "C" __global__ void k_one(const float* a, float* y)
{
    if (threadIdx.x == 0) y[0] = a[0];
}

extern "C" __global__ void k_fill(float* p, size_t n, unsigned salt)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ salt;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = (float)(h & 0xffffff) / 8388608.0f - 1.0f;
    }
}

// Reads the flush buffer once (the read pass of kiln's flush).
extern "C" __global__ void k_read(const uint4* p, size_t n, unsigned* sink)
{
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

// kiln's blocking kernel: spins on %globaltimer.
extern "C" __global__ void k_spin(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// The start of every CUDA 11+ kernel activity record (as kiln's KernelPrefix).
struct KernelPrefix {
    uint32_t kind;
    uint8_t cache_config;
    uint8_t shared_memory_config;
    uint16_t registers_per_thread;
    uint32_t partitioned_requested;
    uint32_t partitioned_executed;
    uint64_t start;
    uint64_t end;
    uint64_t completed;
    uint32_t device_id, context_id, stream_id;
    int32_t grid[3], block[3];
    int32_t static_shared, dynamic_shared;
    uint32_t local_per_thread, local_total;
    uint32_t correlation_id;
};

// (grid.x, block.x) -> durations in ns, in completion order.
static std::map<std::pair<int, int>, std::vector<uint64_t>> g_records;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records)
{
    *size = 16 << 20;
    *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t,
                                      size_t valid)
{
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        KernelPrefix k;
        memcpy(&k, rec, sizeof k);
        g_records[{k.grid[0], k.block[0]}].push_back(k.end - k.start);
    }
    free(buffer);
}

struct Target {
    const char* name;
    int grid, block;
};

static const Target kTargets[] = {
    {"k_empty", 1, 1}, {"k_one", 1, 64}, {"vecadd", 4096, 256}, {"rowsum", 1024, 128}};

static double median(std::vector<double> v)
{
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double quantile(std::vector<double> v, double q)
{
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q * (v.size() - 1) + 0.5))];
}

int main(int argc, char** argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: floor cupti|plain N\n");
        return 2;
    }
    const bool cupti = strcmp(argv[1], "cupti") == 0;
    const int n = atoi(argv[2]);
    if (cupti) {
        CP(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
        CP(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    }
    CK(cudaSetDevice(0));
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t flush_bytes = std::max<size_t>(2 * (size_t)l2, 16 << 20);
    printf("device %s, L2 %d bytes, flush %zu bytes, mode %s, %d samples\n", prop.name, l2,
           flush_bytes, argv[1], n);

    const int vn = 1 << 20, rows = 4096, cols = 1024;
    float *a, *b, *y, *x, *ys;
    void* flush;
    unsigned* sink;
    CK(cudaMalloc(&a, vn * 4));
    CK(cudaMalloc(&b, vn * 4));
    CK(cudaMalloc(&y, vn * 4));
    CK(cudaMalloc(&x, (size_t)rows * cols * 4));
    CK(cudaMalloc(&ys, rows * 4));
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&sink, 16));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    k_fill<<<1024, 257, 0, s>>>(a, vn, 1);
    k_fill<<<1024, 257, 0, s>>>(b, vn, 2);
    k_fill<<<1024, 257, 0, s>>>(x, (size_t)rows * cols, 3);
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    auto launch = [&](int t) {
        switch (t) {
        case 0: k_empty<<<1, 1, 0, s>>>(); break;
        case 1: k_one<<<1, 64, 0, s>>>(a, y); break;
        case 2: vecadd<<<4096, 256, 0, s>>>(a, b, y, vn); break;
        case 3: rowsum<<<1024, 128, 0, s>>>(x, ys, rows, cols); break;
        }
    };
    // Warm every kernel once (module load, first-launch costs).
    for (int t = 0; t < 4; ++t) launch(t);
    CK(cudaStreamSynchronize(s));
    if (cupti) {
        CP(cuptiActivityFlushAll(1));
        g_records.clear();
    }

    std::map<std::string, std::vector<double>> events;  // "phase kernel" -> us
    unsigned char v = 0;
    for (int phase = 0; phase < 2; ++phase) {  // 0 cold (flushed), 1 warm
        for (int t = 0; t < 4; ++t) {
            for (int i = 0; i < n; ++i) {
                if (phase == 0) {
                    CK(cudaMemsetAsync(flush, ++v, flush_bytes, s));
                    k_read<<<prop.multiProcessorCount * 4, 512, 0, s>>>(
                        static_cast<const uint4*>(flush), flush_bytes / 16, sink);
                    CK(cudaStreamSynchronize(s));
                }
                k_spin<<<1, 3, 0, s>>>(36000);
                CK(cudaEventRecord(e0, s));
                launch(t);
                CK(cudaEventRecord(e1, s));
                CK(cudaStreamSynchronize(s));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                events[std::string(phase ? "warm " : "cold ") + kTargets[t].name].push_back(
                    ms * 1000.0);
            }
            if (cupti) {
                CP(cuptiActivityFlushAll(1));
                auto& r = g_records[{kTargets[t].grid, kTargets[t].block}];
                std::vector<double> us;
                for (uint64_t d : r) us.push_back(d / 1000.0);
                r.clear();
                auto& ev = events[std::string(phase ? "warm " : "cold ") + kTargets[t].name];
                printf("CUPTI %s %-8s n=%zu median %.3f us  p10 %.3f  p90 %.3f  min %.3f | "
                       "events median %.3f us\n",
                       phase ? "warm" : "cold", kTargets[t].name, us.size(), median(us),
                       quantile(us, 0.1), quantile(us, 0.9),
                       us.empty() ? -1 : *std::min_element(us.begin(), us.end()),
                       median(ev));
            }
        }
    }
    if (!cupti) {
        for (auto& kv : events)
            printf("EVENTS %-14s median %.3f us\n", kv.first.c_str(), median(kv.second));
    }
    CK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
