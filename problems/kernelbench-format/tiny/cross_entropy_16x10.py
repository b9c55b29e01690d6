# kiln's own KernelBench-format fixture: an integer input (class indices) that must keep its
# dtype and range, and a 0-d output.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean cross-entropy of 16 rows of 10 logits against int64 targets."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.randn(16, 10), torch.randint(0, 10, (16,))]


def get_init_inputs():
    return []
