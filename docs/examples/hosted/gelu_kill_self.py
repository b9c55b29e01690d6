# kiln's own hosted red-team example (issue 45, hack 1): exit early by killing itself. forward
# computes the correct GELU into kiln's output tensors (found through the runner's frame),
# waits for it, and sends SIGKILL to its own process before returning.
# Expected: `runtime_fault` (SIGKILL named as the reason), never `ok` and never a failed job.
# Defence: the worker needs an answer for every run; signals reach only the runner itself
# (the hosted filter refuses any other pid), and the worker kills the runner's group after.
import inspect
import os
import signal

import torch
import torch.nn as nn
import torch.nn.functional as F


def kiln_outputs():
    f = inspect.currentframe()
    while f is not None:
        if "dests" in f.f_locals:
            return f.f_locals["dests"]
        f = f.f_back
    raise RuntimeError("the runner's output tensors were not found")


class ModelNew(nn.Module):
    def forward(self, x):
        for d in kiln_outputs():
            d.copy_(F.gelu(x, approximate="tanh"))
        torch.cuda.synchronize()
        os.kill(os.getpid(), signal.SIGKILL)
