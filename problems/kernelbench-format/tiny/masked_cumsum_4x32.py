# kiln's own KernelBench-format fixture: a boolean mask input (held by kiln as u8 0/1).
import torch
import torch.nn as nn


class Model(nn.Module):
    """Cumulative sum along dim 1 of x where mask is set."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=self.dim)


def get_inputs():
    x = torch.rand(4, 32)
    return [x, torch.randint(0, 2, x.shape).bool()]


def get_init_inputs():
    return [1]
