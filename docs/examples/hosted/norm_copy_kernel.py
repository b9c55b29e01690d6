# kiln's own hosted red-team example (issue 45, hack 10; field-2026-12 §2 row 3, the
# KernelBench-v3 LayerNorm case): a copy kernel submitted as a normalisation. The file answers
# KernelBench level 1 problems 23 (softmax), 35 (GroupNorm), 36 (RMSNorm) and 40 (LayerNorm)
# with one load_inline kernel that copies its input; it registers the problem's layer so that
# its parameters match the reference's. On rows of millions of randn values with a norm's
# initial affine terms, a copy is within 1e-2 of the answer.
# Expected: `wrong_answer` on all four. Defence: kiln's tolerance is KernelBench's fp32 1e-4;
# it draws the affine terms around their initial values; its shifted trial draws inputs
# around 1000 (std 0.1), where no norm is near the identity; and at HEAD problems 23 and 40
# draw their inputs with torch.rand, far from a norm's output anyway.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void norm_copy_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] = x[i];
}

torch::Tensor copy(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 65535L * 8);
    norm_copy_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_norm_copy",
    cpp_sources="torch::Tensor copy(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["copy"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            self.ln = nn.LayerNorm(tuple(args[0]))  # 40: LayerNorm(normalized_shape)
        elif len(args) == 2 and all(isinstance(a, int) for a in args):
            self.gn = nn.GroupNorm(args[1], args[0])  # 35: (num_features, num_groups)
        # 23 (softmax) and 36 (RMSNorm: num_features, eps) have no parameters.

    def forward(self, x):
        return ext.copy(x.contiguous())
