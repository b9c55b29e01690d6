//! The headers nvcc users take for granted (issue #18 item 2), each with a snippet of
//! device code that uses it. Every snippet runs in all threads of a 256-thread block and
//! leaves `float extra` equal to 0, so a kernel can add it to a correct result.

/// (header, snippet defining `float extra = 0`).
pub const HEADER_USES: &[(&str, &str)] = &[
    ("cuda_runtime.h", "float extra = 0.0f * warpSize;"),
    ("cuda.h", "float extra = CUDA_VERSION > 0 ? 0.0f : 1.0f;"),
    (
        "cuda_fp16.h",
        "float extra = __half2float(__float2half(0.0f));",
    ),
    (
        "cuda_bf16.h",
        "float extra = __bfloat162float(__float2bfloat16(0.0f));",
    ),
    ("cuda_fp8.h", "float extra = float(__nv_fp8_e4m3(0.0f));"),
    (
        "mma.h",
        "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f; \
         nvcuda::wmma::fill_fragment(f, 0.0f); float extra = f.x[0];",
    ),
    (
        "cooperative_groups.h",
        "cooperative_groups::thread_block tb = cooperative_groups::this_thread_block(); \
         tb.sync(); float extra = 0.0f * tb.size();",
    ),
    (
        "cooperative_groups/reduce.h",
        "auto w = cooperative_groups::tiled_partition<32>(cooperative_groups::this_thread_block()); \
         float extra = 0.0f * cooperative_groups::reduce(w, 1.0f, cooperative_groups::plus<float>());",
    ),
    (
        "cuda/pipeline",
        "cuda::pipeline<cuda::thread_scope_thread> p = cuda::make_pipeline(); \
         p.producer_acquire(); p.producer_commit(); p.consumer_wait(); p.consumer_release(); \
         float extra = 0.0f;",
    ),
    (
        "cuda/barrier",
        "__shared__ cuda::barrier<cuda::thread_scope_block> bar; \
         if (threadIdx.x == 0) init(&bar, blockDim.x); __syncthreads(); \
         bar.arrive_and_wait(); float extra = 0.0f;",
    ),
    (
        "cuda/std/cstdint",
        "cuda::std::uint32_t z = 0; float extra = float(z);",
    ),
    (
        "cuda/std/limits",
        "float extra = 0.0f * cuda::std::numeric_limits<float>::digits;",
    ),
    (
        "cub/block/block_reduce.cuh",
        "typedef cub::BlockReduce<float, 256> R; __shared__ typename R::TempStorage t; \
         float extra = 0.0f * R(t).Sum(1.0f);",
    ),
    (
        "cub/warp/warp_reduce.cuh",
        "typedef cub::WarpReduce<float> R; __shared__ typename R::TempStorage t[8]; \
         float extra = 0.0f * R(t[threadIdx.x / 32]).Sum(1.0f);",
    ),
    ("float.h", "float extra = FLT_MAX > 0.0f ? 0.0f : 1.0f;"),
    ("cfloat", "float extra = FLT_EPSILON > 0.0f ? 0.0f : 1.0f;"),
    ("math.h", "float extra = 0.0f * sqrtf(M_PI);"),
    (
        "cmath",
        "float extra = 0.0f * (std::exp(0.0f) + std::fmax(1.0f, 2.0f));",
    ),
    ("stdint.h", "int64_t z = 0; float extra = float(z);"),
    ("cstdint", "std::uint8_t z = 0; float extra = float(z);"),
    ("climits", "float extra = INT_MAX > 0 ? 0.0f : 1.0f;"),
    (
        "cstdio",
        "if (blockIdx.x == 0xffffffffu) printf(\"never %d\\n\", 1); float extra = 0.0f;",
    ),
    ("cassert", "assert(blockDim.x > 0); float extra = 0.0f;"),
];
