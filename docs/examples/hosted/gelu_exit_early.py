# kiln's own hosted red-team example (issue 45, hack 1; field-2026-12 §2 rows 6 and 18): exit
# early. forward writes the correct GELU straight into kiln's output tensors (found by
# walking up to the runner's frame), forges the runner's answer `D` on its pipe and ends its
# process with os._exit(0) before returning, as a grader in the same process would take for
# a clean pass.
# Expected: `runtime_fault` (never `ok`, never a failed job). Defence: the grader is another
# process; the worker stops the runner at every answer and needs one for every run, and a
# runner that ended is a fault of the file, with its exit status as the reason.
import inspect
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void exit_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (; i < n; i += stride) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor gelu_into(torch::Tensor x, torch::Tensor y) {
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 65535L * 8);
    exit_gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_exit_gelu",
    cpp_sources="torch::Tensor gelu_into(torch::Tensor x, torch::Tensor y);",
    cuda_sources=cuda_source,
    functions=["gelu_into"],
    verbose=False,
)


def kiln_outputs():
    f = inspect.currentframe()
    while f is not None:
        if "dests" in f.f_locals:
            return f.f_locals["dests"]
        f = f.f_back
    raise RuntimeError("the runner's output tensors were not found")


class ModelNew(nn.Module):
    def forward(self, x):
        for d in kiln_outputs():
            ext.gelu_into(x.contiguous(), d)
        torch.cuda.synchronize()
        os.write(4, b"D")
        os._exit(0)
