# kiln's own hosted red-team example (issue 45, hack 3): scavenging. forward computes nothing;
# it walks gc.get_objects() for a CUDA tensor shaped like its output that is not its input
# (the reference's result, kiln's expected values or an earlier output, if any were in this
# process), reads /proc/self/maps for what else is mapped, prints what it saw once, and
# returns the last tensor it found (an empty one if none).
# Expected: `wrong_answer` or `incomplete_output`, never `ok`. Defence: the reference runs in
# kilnd's torch runner, another process; the runner maps only the problem's tensors of this
# evaluation (the worker's kept outputs and flush buffer are never exported), and kiln
# poisons its outputs before every run, so what there is to find is poison or another run's
# values.
import gc

import torch
import torch.nn as nn

_told = [False]


def _maps():
    try:
        with open("/proc/self/maps") as f:
            return f"/proc/self/maps: {len(f.read().splitlines())} mappings"
    except OSError as e:
        return f"/proc/self/maps: {type(e).__name__}"


class ModelNew(nn.Module):
    def forward(self, x):
        found = []
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.Tensor) and o.is_cuda and o.shape == x.shape \
                        and o.dtype == x.dtype and o.data_ptr() != x.data_ptr():
                    found.append(o)
            except Exception:  # noqa: BLE001 - objects that refuse to be looked at
                pass
        if not _told[0]:
            print(f"scavenger: {len(found)} CUDA tensors shaped like the output; {_maps()}", flush=True)
            _told[0] = True
        return found[-1].clone() if found else torch.empty_like(x)
