# kiln's own KernelBench-format fixture: a layer with learnable parameters (nn.Linear's
# weight and bias become input tensors of the problem).
import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x @ W.T + b) for a 16 -> 8 linear layer on a batch of 4."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.rand(4, 16)]


def get_init_inputs():
    return [16, 8]
