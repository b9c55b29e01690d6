# kiln's own red-team example (issue 29): a correct GELU whose wrapper launches a
# different kernel on every other call (one element per thread, then a grid-stride loop).
# Hosted it is `ok`; it must not be lifted: the two recorded forwards differ.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__device__ __forceinline__ float gelu(float v) {
    const float c = 0.7978845608028654f;
    return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

__global__ void gelu_flat(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(x[i]);
}

__global__ void gelu_strided(const float* __restrict__ x, float* __restrict__ y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = gelu(x[i]);
}

static long calls = 0;

torch::Tensor alt_gelu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    if (calls++ % 2 == 0) {
        gelu_flat<<<(int)((n + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    } else {
        gelu_strided<<<4096, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

cpp_source = "torch::Tensor alt_gelu(torch::Tensor x);"

ext = load_inline(
    name="kiln_example_alternating_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["alt_gelu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.alt_gelu(x.contiguous())
