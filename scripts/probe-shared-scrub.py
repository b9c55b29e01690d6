#!/usr/bin/env python3
"""Where a shared-tensor reference call's time goes on a GPU (a developer's probe, not
part of kiln): the torch runner's own pieces (daemon/torch-runner/kiln_torch.py:
SharedTensors, scrub_cuda) on allocations this process exports to itself, as a GPU
worker's are, with the softmax of kb-softmax-4096x65536 as the reference.

    python3 scripts/probe-shared-scrub.py [--rows 4096 --cols 65536 --rounds 12]

Prints one JSON line per order of the steps, with each step's median in milliseconds:
  unmap-then-scrub   the runner's order (compute, unmap, scrub)
  scrub-then-unmap   the scrub while the mappings are still in place
  no-mapping         the same compute and scrub on plain torch tensors
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "daemon", "torch-runner"))
import kiln_torch  # noqa: E402


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


def exported(lib, nbytes):
    """(fd, mapped bytes) of a new exportable allocation of at least nbytes."""
    prop = Prop(1, 1, 1, 0)
    gran = ctypes.c_size_t()
    assert lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0) == 0
    size = (nbytes + gran.value - 1) // gran.value * gran.value
    handle = ctypes.c_ulonglong()
    assert lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                           ctypes.c_ulonglong(0)) == 0
    fd = ctypes.c_int()
    assert lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, 1, ctypes.c_ulonglong(0)) == 0
    return fd.value, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    import torch

    torch.zeros(1, device="cuda")
    lib = ctypes.CDLL("libcuda.so.1")
    nbytes = a.rows * a.cols * 4
    spec = [{"name": "x", "dtype": "f32", "shape": [a.rows, a.cols]},
            {"name": "y", "dtype": "f32", "shape": [a.rows, a.cols]}]
    allocs = [exported(lib, nbytes) for _ in spec]

    def one(order):
        ms = {}
        t = time.perf_counter()
        if order == "no-mapping":
            x = torch.randn(a.rows, a.cols, device="cuda")
            y = torch.empty_like(x)
            shared = None
        else:
            shared = kiln_torch.SharedTensors(torch, [os.dup(fd) for fd, _ in allocs],
                                              [size for _, size in allocs])
            x, y = (shared.tensor(i, t) for i, t in enumerate(spec))
        ms["map"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        out = torch.softmax(x, dim=1)
        y.copy_(out)
        del out, x, y
        torch.cuda.synchronize()
        ms["compute"] = (time.perf_counter() - t) * 1e3
        steps = ["unmap", "scrub"] if order == "unmap-then-scrub" else ["scrub", "unmap"]
        for step in steps:
            t = time.perf_counter()
            if step == "unmap":
                if shared is not None:
                    shared.close()
            else:
                parts = kiln_torch.scrub_cuda(torch)
                ms.update({f"scrub_{k}": v for k, v in parts.items()})
            ms[step] = (time.perf_counter() - t) * 1e3
        # The next kernel after the call (what the next call's first launch would pay).
        t = time.perf_counter()
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        ms["next_kernel"] = (time.perf_counter() - t) * 1e3
        return ms

    for order in ("unmap-then-scrub", "scrub-then-unmap", "no-mapping", "unmap-then-scrub"):
        runs = [one(order) for _ in range(a.rounds)][2:]
        med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
        print(json.dumps({"order": order, "median_ms": med}), flush=True)


if __name__ == "__main__":
    main()
