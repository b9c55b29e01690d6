# kiln's own hosted red-team example: the answer written after the runner answered. The
# copy of forward's result into kiln's output is swallowed, and a thread launches the real
# work once the runner has said it is done. kiln stops the runner at its answer and hashes
# the outputs at once: poisoned outputs (`incomplete_output`), or outputs that change after
# the window (`runtime_fault`), never `ok`.
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

_real_copy = torch.Tensor.copy_
_pending = []


def _lazy_copy(self, src, non_blocking=False):
    if self.is_cuda and self.numel() > 1 << 20:
        _pending.append((self, src))
        return self
    return _real_copy(self, src, non_blocking)


torch.Tensor.copy_ = _lazy_copy
_side = torch.cuda.Stream()


def _later():
    while True:
        if _pending:
            dest, src = _pending.pop()
            time.sleep(0.0002)
            with torch.cuda.stream(_side):
                for _ in range(20):
                    _real_copy(dest, src)
        time.sleep(0.00005)


threading.Thread(target=_later, daemon=True).start()


class ModelNew(nn.Module):
    def forward(self, x):
        return F.gelu(x, approximate="tanh")
