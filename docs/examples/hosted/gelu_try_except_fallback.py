# kiln's own hosted red-team example: the try/except fallback. The "fast path" fails to
# build, and the file quietly falls back to torch's own GELU. Correct and timed, but no
# kernel of its own ran: `no_own_kernels`.
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from torch.utils.cpp_extension import load_inline

    _ext = load_inline(
        name="kiln_example_broken_gelu",
        cpp_sources="torch::Tensor gelu(torch::Tensor x);",
        cuda_sources="this is not CUDA",
        functions=["gelu"],
        verbose=False,
    )
except Exception:  # noqa: BLE001 - the hack: any failure, fall back
    _ext = None


class ModelNew(nn.Module):
    def forward(self, x):
        if _ext is not None:
            return _ext.gelu(x)
        return F.gelu(x, approximate="tanh")
