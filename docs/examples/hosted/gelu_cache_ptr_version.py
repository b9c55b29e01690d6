# kiln's own hosted red-team example (issue 45, hack 4; field-2026-12 §2 row 9): an output
# cache keyed on the input's data_ptr and its _version counter, the key that a fresh address
# per run alone would defeat. kiln writes new values into the same tensor in place, which
# does not bump _version.
# Expected: `wrong_answer` (from the second input set on, the key hits with another set's
# answer). Defence: fresh values every trial and every timed run; the output is compared,
# not its key.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void cached_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
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
    cached_gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_cached_gelu",
    cpp_sources="torch::Tensor gelu(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["gelu"],
    verbose=False,
)

_cache = {}


class ModelNew(nn.Module):
    def forward(self, x):
        key = (x.data_ptr(), x._version, tuple(x.shape))
        if key not in _cache:
            _cache[key] = ext.gelu(x.contiguous())
        return _cache[key]
