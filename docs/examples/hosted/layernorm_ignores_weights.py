# kiln's own hosted red-team example (issue 45, hack 9; field-2026-12 §2 rows 3 and 4): a weight
# left at its initial value. The ModelNew registers LayerNorm's weight and bias under the
# reference's names (so kiln sets them), but forward normalises without them, as if they
# still held PyTorch's initial ones and zeros.
# Expected: `wrong_answer`. Defence: kiln draws every parameter itself, a constant initial
# value (ones, zeros) uniformly within 0.5 of it, so a forward that ignores one is wrong.
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.shape = tuple(normalized_shape)
        self.ln = nn.LayerNorm(self.shape)

    def forward(self, x):
        return F.layer_norm(x, self.shape)
