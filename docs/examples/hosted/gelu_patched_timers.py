# kiln's own hosted red-team example: every clock a file can reach in its process patched
# to say "no time passed", and a forward that sleeps 5 ms. kiln takes the time on the
# worker's clock, so the median is at least 5000 us (and, torch's GELU being no kernel of
# its own, the verdict is `no_own_kernels`).
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

_sleep = time.sleep
_frozen = time.perf_counter()
time.perf_counter = lambda: _frozen
time.monotonic = lambda: _frozen
time.time = lambda: _frozen
torch.cuda.Event.elapsed_time = lambda self, end: 0.001
torch.cuda.synchronize = lambda *a, **k: None


class ModelNew(nn.Module):
    def forward(self, x):
        _sleep(0.005)
        return F.gelu(x, approximate="tanh")
