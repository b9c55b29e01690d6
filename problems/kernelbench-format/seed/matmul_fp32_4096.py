# The seed's "Matmul FP32" problem in KernelBench's format, at the seed's shape and
# distribution (a 4096 x 4096 square matmul of randn matrices); written for kiln.
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    """C = A @ B for 4096 x 4096 fp32 matrices."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
