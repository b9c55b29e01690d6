# kiln's own red-team example (issue 29): a correct GELU whose wrapper picks its grid
# from the data (how many elements are positive, read back to the host). Hosted it is
# `ok`; it must not be lifted: the copy to the host, and the grid it sets, change with the
# inputs.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void gelu_grid(const float* __restrict__ x, float* __restrict__ y, long n) {
    const float c = 0.7978845608028654f;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor grid_gelu(torch::Tensor x, long blocks) {
    auto y = torch::empty_like(x);
    gelu_grid<<<(int)blocks, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""

cpp_source = "torch::Tensor grid_gelu(torch::Tensor x, long blocks);"

ext = load_inline(
    name="kiln_example_grid_from_data_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["grid_gelu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        blocks = 1024 + int(x[:4096].gt(0).sum().item())
        return ext.grid_gelu(x, blocks)
