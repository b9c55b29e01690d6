# kiln's own hosted red-team example (issue 45, hack 4; field-2026-12 §2 row 1, the MoE
# contest kernel): an output cache keyed on a fingerprint of eight sampled input values, which
# a fresh address per run does not stop. A hit returns the cached output without launching
# anything.
# Expected: `ok`, at the honest kernel's time plus the fingerprint's cost: the cache hits
# only where kiln repeats an input set on purpose (a trial's second run, the warm-up), never
# in a timed run (each gets values no run saw before; the CPU test
# `a_cache_keyed_on_sampled_values_never_hits_while_timed` counts the hits). Lifting: not
# lifted (the fingerprint's reads are copies, and a hit launches nothing: `copy` or `differs`).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void print_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (; i < n; i += stride) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor gelu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 65535L * 8);
    print_gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_fingerprint_gelu",
    cpp_sources="torch::Tensor gelu(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["gelu"],
    verbose=False,
)

_cache = {}


class ModelNew(nn.Module):
    def forward(self, x):
        flat = x.reshape(-1)
        n = flat.numel()
        picks = torch.tensor([0, n // 7, n // 5, n // 3, n // 2, (2 * n) // 3, n - 2, n - 1],
                             device=x.device)
        key = tuple(flat[picks].tolist())
        hit = _cache.get(key)
        if hit is not None:
            return hit
        if len(_cache) > 4:
            _cache.clear()
        y = ext.gelu(x.contiguous())
        _cache[key] = y
        return y
