# kiln's own hosted red-team example: an output allocated and never written, hoping to find
# the reference's result in recycled memory (the idea behind KernelBench's own
# result-reuse test). The reference runs in another process, and kiln poisons its outputs
# before every run: `wrong_answer` or `incomplete_output`, never `ok`.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.empty(A.shape[0], B.shape[1], device=A.device, dtype=A.dtype)
