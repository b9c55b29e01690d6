# The seed's "Conv2D + ReLU + MaxPool" problem in KernelBench's format: AlexNet's first
# block (Conv2d(3 -> 96, 11, stride 4, padding 2), ReLU, MaxPool2d(3, stride 2)) on a
# (100, 3, 224, 224) randn batch; written for kiln.
import torch
import torch.nn as nn


class Model(nn.Module):
    """MaxPool2d(3, 2)(ReLU(Conv2d(3, 96, 11, stride=4, padding=2)(x)))."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 96, kernel_size=11, stride=4, padding=2)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2)

    def forward(self, x):
        return self.pool(self.relu(self.conv1(x)))


def get_inputs():
    return [torch.randn(100, 3, 224, 224)]


def get_init_inputs():
    return []
