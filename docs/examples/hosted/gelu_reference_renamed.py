# kiln's own hosted example: the sanity check of same-harness speedups (issue 43). This is
# the problem's own forward (the tanh GELU of the gelu_*m problems and of KernelBench's
# level-1 88, the same formula) as a ModelNew file: `no_own_kernels` (only ATen's kernels
# run), timed and shown. Against `torch-eager-hosted` (the problem's Model run through the
# same hosted path) its speedup must be 1.00 within noise at every size; against the
# in-process eager baseline it reads below 1 by the hosted path's fixed cost.
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
