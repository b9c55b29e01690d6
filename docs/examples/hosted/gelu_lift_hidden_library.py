# kiln's own red-team example (issue 29): the load_inline GELU, with a library call hidden
# in forward (a torch multiply by one, which launches an ATen kernel). Hosted it is `ok`;
# it must not be lifted: a kernel of the forward is not in the file's sources.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void new_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (; i < n; i += stride) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor new_gelu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 65535L * 8);
    new_gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp_source = "torch::Tensor new_gelu(torch::Tensor x);"

gelu_ext = load_inline(
    name="kiln_example_hidden_library_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["new_gelu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = gelu_ext.new_gelu(x.contiguous())
        return y * 1.0 if y.is_cuda else y
