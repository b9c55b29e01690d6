# The seed's "Conv2D" problem in KernelBench's format: Conv2d(3 -> 96, kernel 11, stride 4,
# padding 2) on a (100, 3, 224, 224) randn batch (AlexNet's first layer); written for kiln.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d(3, 96, 11, stride=4, padding=2) with bias on a batch of 100 224x224 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 96, kernel_size=11, stride=4, padding=2)

    def forward(self, x):
        return self.conv1(x)


def get_inputs():
    return [torch.randn(100, 3, 224, 224)]


def get_init_inputs():
    return []
