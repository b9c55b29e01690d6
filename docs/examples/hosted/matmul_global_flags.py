# kiln's own hosted red-team example (issue 45, hack 6; field-2026-12 §2 row 5, CUDA-Agent
# issue 16): global precision flags set at import, TF32 for matmuls and cuDNN,
# cudnn.benchmark and set_float32_matmul_precision("medium"), hoping that the grader's
# reference or baseline, run in the same process, is then computed in TF32 too, or that the
# answer is compared with a TF32 baseline. forward is torch's own matmul.
# Expected: `no_own_kernels` (torch's kernel only; `wrong_answer` if TF32's error ever leaves
# the tolerance). Defence: the reference is kilnd's torch runner, another process, computed
# in float64 where it can be with TF32 off (the evaluation's note says how); baselines are
# timed there too, each with its `allow_tf32` setting recorded; the file's own precision
# shows in its tier, except on all-positive inputs such as this problem's torch.rand, where
# TF32's rounding averages out (the CPU test `tf32_on_all_positive_inputs_is_not_seen_by_the_tier`).
import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.cudnn.benchmark = True
torch.set_float32_matmul_precision("medium")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)
