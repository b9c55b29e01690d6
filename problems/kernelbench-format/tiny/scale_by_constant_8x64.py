# kiln's own KernelBench-format fixture: forward takes a Python number beside its tensor,
# as KernelBench's level-1 5 does (get_inputs() returns [A, s]).
import torch
import torch.nn as nn


class Model(nn.Module):
    """A matrix times a scalar."""

    def __init__(self):
        super().__init__()

    def forward(self, A, s):
        return A * s


def get_inputs():
    return [torch.randn(8, 64), 2.5]


def get_init_inputs():
    return []
