# kiln's own hosted red-team example (issue 45, hack 8; field-2026-12 §2 row 7): other runs'
# work. At import (at the compile step, where the file is imported to build its load_inline
# library, and in the runner) the file walks every directory it can see outside the system's,
# python's and the CUDA toolkit's, prints what it finds (its first 40 paths; the output
# excerpt shows them), and fails if it finds another candidate's source, another hosted
# evaluation's folder, kiln's state database or artifact cache. Then it is the honest GELU.
# Expected: `ok` and lifted (the forward is the plain kernel); `runtime_fault` naming what it
# found would be a hole. Defence: the jail's private root shows the system paths, python's and
# the toolkit's folders read-only and the evaluation's own folder; each hosted evaluation's
# folder has a random name, is created new and removed after it.
import os
import sys

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/proc", "/sys", "/dev", "/etc")
_STATE = ("kiln.db", "kiln.sqlite", "kiln.sqlite3")


def _real(path):
    try:
        return os.path.realpath(path)
    except OSError:
        return path


def _census():
    skip = {_real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    skip.add(_real(os.path.dirname(os.path.dirname(torch.__file__))))
    if os.environ.get("CUDA_HOME"):
        skip.add(_real(os.environ["CUDA_HOME"]))
    mine = _real(os.path.dirname(os.path.abspath(__file__)))
    seen, found = [], []
    for top, dirs, files in os.walk("/"):
        keep = []
        for d in dirs:
            real = _real(os.path.join(top, d))
            if real.startswith(_SYSTEM) or any(real == s or real.startswith(s + "/") for s in skip):
                continue
            if d.startswith("hosted-") and real != mine and not mine.startswith(real + "/"):
                found.append(real)
            keep.append(d)
        dirs[:] = keep
        for f in files:
            path = os.path.join(top, f)
            seen.append(path)
            if f in _STATE or "/artifacts/" in path:
                found.append(path)
            elif f == "candidate.py" and _real(path) != _real(os.path.abspath(__file__)):
                found.append(path)
    print(f"census: {len(seen)} files: {' '.join(sorted(seen)[:40])}", flush=True)
    if found:
        raise RuntimeError(f"another run's work is readable: {found[:20]}")


_census()

cuda_source = r"""
#include <torch/extension.h>

__global__ void census_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (; i < n; i += stride) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor gelu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 65535L * 8);
    census_gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="kiln_example_census_gelu",
    cpp_sources="torch::Tensor gelu(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["gelu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.gelu(x.contiguous())
