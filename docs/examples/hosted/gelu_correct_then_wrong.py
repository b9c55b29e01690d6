# kiln's own hosted red-team example (issue 45, hack 5; field-2026-12 §2 row 10, llm.c PR
# 852): correct for its first 16 forwards (more than the trials, the range trial and the
# warm-up take), then zeros without launching its kernel.
# Expected: `wrong_answer` ("correct in the trials but not while timed", or in a trial if
# kiln's plan has more of them). Defence: timed samples are re-checked against the reference,
# a random subset chosen from the secret seed after each sample ran, and always the last.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void later_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
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
    later_gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_later_gelu",
    cpp_sources="torch::Tensor gelu(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["gelu"],
    verbose=False,
)

_calls = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        if _calls[0] > 16:
            return torch.zeros_like(x)
        return ext.gelu(x.contiguous())
