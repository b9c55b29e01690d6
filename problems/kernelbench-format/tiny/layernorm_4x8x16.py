# kiln's own KernelBench-format fixture: LayerNorm with its affine terms (initialised to
# ones and zeros by PyTorch; kiln draws them around those values).
import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last two dimensions of a (4, 8, 16) tensor."""

    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(4, 8, 16)]


def get_init_inputs():
    return [(8, 16)]
