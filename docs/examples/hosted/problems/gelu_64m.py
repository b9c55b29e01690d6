# kiln's own KernelBench-format problem: the tanh GELU of GPT-2 on a 8192 x 8192 matrix, one of
# three sizes for measuring what timing a hosted file from kiln's side costs
# (docs/examples/hosted, scripts/hosted-check.py).
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def get_inputs():
    return [torch.rand(8192, 8192)]


def get_init_inputs():
    return []
