# kiln's own hosted red-team example (issue 45, hack 9; field-2026-12 §2 row 3): weights that
# differ from the reference's, `load_state_dict(strict=False)`-style. KernelBench level 1
# problem 40's LayerNorm has a weight and a bias; this ModelNew has neither
# (elementwise_affine=False), so nothing kiln draws for them reaches it.
# Expected: `invalid_launch`, naming ln.weight and ln.bias. Defence: kiln sets every
# parameter of the reference by name, then by creation order; one it cannot set is refused,
# never left out silently.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape, elementwise_affine=False)

    def forward(self, x):
        return self.ln(x)
