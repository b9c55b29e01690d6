# kiln's own KernelBench-format fixture that the importer must refuse: dropout makes the
# output random, so no reference can judge a candidate.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Dropout then softmax."""

    def __init__(self, p):
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return torch.softmax(self.dropout(x), dim=1)


def get_inputs():
    return [torch.rand(4, 16)]


def get_init_inputs():
    return [0.5]
