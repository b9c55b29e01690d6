# The seed's "Softmax" problem in KernelBench's format: torch.softmax over dim 1 of a
# (4096, 65536) randn batch; written for kiln.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Row softmax of a 4096 x 65536 fp32 matrix."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(4096, 65536)]


def get_init_inputs():
    return []
