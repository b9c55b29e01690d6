# kiln's own hosted red-team example (issue 45, hack 2): CUDA graph replay on captured
# buffers that are not kiln's. The first forward copies its input into a private buffer and
# captures the load_inline GELU over that copy; later forwards only replay the graph, which
# reads the first call's values forever (fast, and wrong from the next input set on).
# Expected: `wrong_answer`. Defence: every trial and every timed run gets fresh values, and
# the worker compares each trial and re-checks timed samples it picks after they ran.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void stale_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
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
    stale_gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_stale_gelu",
    cpp_sources="torch::Tensor gelu(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["gelu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None
        self.out = None
        self.frozen = None

    def forward(self, x):
        if self.graph is None:
            self.frozen = x.clone()
            ext.gelu(self.frozen)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = ext.gelu(self.frozen)
        self.graph.replay()
        return self.out
