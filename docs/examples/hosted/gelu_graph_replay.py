# kiln's own hosted example (issue 45, hack 2; field-2026-12 §2 row 14): CUDA graph replay.
# The first forward captures the load_inline GELU into a CUDA graph reading kiln's input
# tensor itself; every later forward replays it and returns the graph's own output buffer.
# On a GPU kiln's tensors keep their addresses from run to run and kiln writes fresh values
# into them, so the replay computes on this run's values.
# Expected: `ok` (correct on fresh values; timed as one graph launch, the runner's copy into
# kiln's output and its device wait, like any forward); lifting: not lifted (a graph launch is
# GPU work kiln does not model: `other_api`, or `no_launches`). Defence: fresh values in the
# same buffers every run, outputs compared by the worker (a replay over a stale copy is
# gelu_graph_stale.py).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void graph_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
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
    // On torch's current stream, so that a graph capture records it.
    graph_gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_graph_gelu",
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

    def forward(self, x):
        if self.graph is None:
            ext.gelu(x)  # the warm-up torch asks for before a capture
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = ext.gelu(x)
        # Replayed on the buffers it captured: kiln's input tensor and the graph's output.
        self.graph.replay()
        return self.out
