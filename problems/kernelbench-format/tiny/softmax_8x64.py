# kiln's own KernelBench-format fixture: a row softmax small enough for the host backend.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Row softmax of an 8x64 matrix."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
