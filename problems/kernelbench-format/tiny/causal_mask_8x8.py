# kiln's own KernelBench-format fixture: a module with a constant buffer (a causal mask,
# as GPT-style attention blocks register one), which the import leaves to the module.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Masks the upper triangle of each 8x8 score matrix to zero."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 8, 8))

    def forward(self, x):
        return x.masked_fill(self.mask == 0, 0.0)


def get_inputs():
    return [torch.randn(4, 8, 8)]


def get_init_inputs():
    return []
