# kiln's own hosted example: KernelBench's most common hack, the reference renamed: torch's
# own GELU (tanh approximation) and no kernel of the file's own. Correct and timed, but its
# forward launches only ATen's kernels: `no_own_kernels` (its time shown, never ranked).
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.gelu(x, approximate="tanh")
