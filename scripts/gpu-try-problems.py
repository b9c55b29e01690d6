#!/usr/bin/env python3
"""Tries the cuda problems of problems/ on a GPU, outside kiln: a developer's check that
every reference and seed compiles with NVRTC the way kiln compiles (sm_90 or the GPU's
arch, --no-source-include, no include path), runs with its problem.toml launch plan, and
that each seed - and each knob variant of it - agrees with the reference within the
problem's tolerance. Optionally times torch's equivalent and checks it the same way.

Not part of kiln and not a substitute for its worker (no jail, no L2 flush, no secret
seed, inputs from cupy's generator): a quick way to catch a broken problem before kiln does.

Needs: cupy, numpy, and cuda.bindings (NVRTC; cupy's own NVRTC is the fallback, which
adds include paths kiln does not); torch for --torch.

Usage: gpu-try-problems.py [--torch] [--no-knobs] [--only NAME,...] [--json FILE] [PROBLEMS_DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import tempfile
import time
import tomllib

if "--torch" in sys.argv:
    import torch  # noqa: F401  (imported before cupy: importing it later failed in one image)

import cupy as cp
import numpy as np

try:
    from cuda.bindings import nvrtc as _nvrtc
except ImportError:  # older cuda-python
    try:
        from cuda import nvrtc as _nvrtc
    except ImportError:
        _nvrtc = None

NP_DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32,
             "i64": np.int64, "u8": np.uint8}
SCALAR_NP = {"i32": np.int32, "i64": np.int64, "u32": np.uint32, "u64": np.uint64,
             "f32": np.float32, "f64": np.float64}


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- compile
def arch_of_device() -> str:
    return f"sm_{cp.cuda.Device().compute_capability}"  # e.g. "90"


def nvrtc_compile(source: str, name: str, arch: str, flags: list[str]) -> tuple[bytes | None, str]:
    """CUBIN (or None) and the log, with kiln's options."""
    opts = ["--no-source-include", f"--gpu-architecture={arch}"] + list(flags)
    if _nvrtc is None:
        try:
            mod = cp.RawModule(code=source, options=tuple(o for o in opts if not o.startswith("--gpu-arch")),
                               backend="nvrtc")
            return mod, "(compiled with cupy's NVRTC: include paths differ from kiln's)"
        except Exception as e:  # noqa: BLE001
            return None, str(e)
    ok = _nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = _nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok:
        return None, f"nvrtcCreateProgram: {err}"
    try:
        bopts = [o.encode() for o in opts]
        (cerr,) = _nvrtc.nvrtcCompileProgram(prog, len(bopts), bopts)
        err, size = _nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        _nvrtc.nvrtcGetProgramLog(prog, buf)
        text = buf.decode(errors="replace").replace("\x00", "").strip()
        if cerr != ok:
            return None, f"{cerr}\n{text}"
        err, size = _nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        _nvrtc.nvrtcGetCUBIN(prog, cubin)
        return cubin, text
    finally:
        _nvrtc.nvrtcDestroyProgram(prog)


_TMP = tempfile.TemporaryDirectory(prefix="kiln-try-")


def load_module(image) -> cp.RawModule:
    if isinstance(image, cp.RawModule):
        return image
    # cupy loads the file lazily (at the first get_function), so it stays until exit.
    fd, path = tempfile.mkstemp(suffix=".cubin", dir=_TMP.name)
    with os.fdopen(fd, "wb") as fh:
        fh.write(image)
    return cp.RawModule(path=path)


def header_probe(arch: str) -> dict:
    out = {}
    for h in ["cuda_fp16.h", "cuda_bf16.h", "mma.h", "cuda/std/cstdint", "cuda_fp8.h"]:
        src = f"#include <{h}>\nextern \"C\" __global__ void k(int* p) {{ p[0] = 1; }}\n"
        img, text = nvrtc_compile(src, "probe.cu", arch, [])
        errs = [l for l in text.splitlines()[1:] if "error" in l.lower()] if img is None else []
        out[h] = "ok" if img is not None else "refused: " + (errs[0][:300] if errs else text[-300:])
    src = ('extern "C" __global__ void k(unsigned short* o, double d) {\n'
           '  unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); o[0] = h; }\n')
    img, text = nvrtc_compile(src, "probe.cu", arch, [])
    out["asm cvt.rn.f16.f64"] = "ok" if img is not None else "refused: " + text[-300:]
    return out


# ----------------------------------------------------------------------------- knobs
KNOB_RE = re.compile(r"^\s*//\s*@knob\s+([A-Za-z_][A-Za-z0-9_]*)\s+(\S+)\s*$")


def parse_knobs(src: str) -> list[tuple[str, list[str], str]]:
    lines = src.split("\n")
    knobs = []
    for i, line in enumerate(lines):
        m = KNOB_RE.match(line)
        if m and i + 1 < len(lines):
            d = re.match(r"^\s*#\s*define\s+" + m.group(1) + r"\s+(\S+)", lines[i + 1])
            if d:
                knobs.append((m.group(1), m.group(2).split("|"), d.group(1)))
    return knobs


def set_knobs(src: str, values: dict[str, str]) -> str:
    lines = src.split("\n")
    for i, line in enumerate(lines):
        m = KNOB_RE.match(line)
        if m and m.group(1) in values and i + 1 < len(lines):
            lines[i + 1] = re.sub(r"^(\s*#\s*define\s+" + m.group(1) + r"\s+)\S+",
                                  lambda mm: mm.group(1) + values[m.group(1)], lines[i + 1])
    return "\n".join(lines)


def cdiv(a, b):
    return -(-a // b)


def _set(launches, i, grid=None, block=None):
    if grid is not None:
        launches[i]["grid"] = list(grid)
    if block is not None:
        launches[i]["block"] = list(block)


def replan(problem: str, launches: list[dict], k: dict[str, str]) -> list[dict]:
    """The launch plan for knob values `k`, following each seed's header comment."""
    L = [dict(l) for l in launches]
    g = lambda n: int(k[n])  # noqa: E731
    if problem.startswith("matmul-"):
        t, w = g("TDIM"), g("WPT")
        _set(L, 0, [cdiv(4096, t * w), cdiv(4096, t * w), 1], [t, t, 1])
    elif problem == "conv2d-3to96-k11s4p2":
        _set(L, 0, [cdiv(100 * (96 // g("OCPT")) * 55 * 55, g("BLOCK")), 1, 1], [g("BLOCK"), 1, 1])
    elif problem == "conv2d-relu-maxpool":
        _set(L, 0, [cdiv(100 * (96 // g("OCPT")) * 55 * 55, g("BLOCK")), 1, 1], [g("BLOCK"), 1, 1])
        _set(L, 1, [cdiv(100 * 96 * 27 * 27, g("PBLOCK")), 1, 1], [g("PBLOCK"), 1, 1])
    elif problem == "softmax-4096x65536":
        _set(L, 0, None, [g("BLOCK"), 1, 1])
    elif problem == "layernorm-16x64x256x256":
        _set(L, 0, [g("CHUNKS"), 16, 1], [g("BLOCK"), 1, 1])
        _set(L, 2, [cdiv(4194304, g("BLOCK") * g("EPT")), 16, 1], [g("BLOCK"), 1, 1])
    elif problem == "sdpa-fp16-b4h16s2048d64":
        _set(L, 0, [cdiv(2048, g("BQ")), 64, 1], [g("BQ"), 1, 1])
    elif problem == "vecadd-cuda-1m":
        _set(L, 0, [cdiv(1048576, g("BLOCK") * g("ILP")), 1, 1], [g("BLOCK"), 1, 1])
    elif problem == "rowsum-cuda-4096x1024":
        _set(L, 0, [cdiv(4096, g("WARPS")), 1, 1], [32 * g("WARPS"), 1, 1])
    else:
        return None
    return L


# ----------------------------------------------------------------------------- data
def draw(t: dict, shifted: bool) -> cp.ndarray:
    shape = tuple(t["shape"])
    dt = NP_DTYPES[t["dtype"]]
    init = t.get("init", {"dist": "normal"})
    if shifted and t.get("shifted_trial", True) and t["dtype"] in ("f32", "f64", "f16"):
        init = {"dist": "normal", "mean": 1000.0, "std": 0.1}
    dist = init.get("dist", "normal")
    if dist == "normal":
        x = cp.random.standard_normal(shape, dtype=cp.float64 if dt == np.float64 else cp.float32)
        x = x * init.get("std", 1.0) + init.get("mean", 0.0)
    elif dist == "uniform":
        x = cp.random.uniform(init["low"], init["high"], shape, dtype=cp.float64)
    else:
        x = cp.random.randint(init["low"], init["high"], shape)
    return x.astype(dt)


def poisoned(t: dict) -> cp.ndarray:
    dt = NP_DTYPES[t["dtype"]]
    if t["dtype"] in ("f32", "f64", "f16"):
        return cp.full(tuple(t["shape"]), np.nan, dtype=dt)
    return cp.full(tuple(t["shape"]), -0x5A5A5A5A % 127, dtype=dt)


def compare(got: cp.ndarray, want: cp.ndarray, atol: float, rtol: float) -> dict:
    g = got.astype(cp.float64).ravel()
    w = want.astype(cp.float64).ravel()
    gn, wn = cp.isnan(g), cp.isnan(w)
    gi, wi = cp.isinf(g), cp.isinf(w)
    d = cp.abs(g - w)
    ok = cp.where(gn | wn, gn & wn, cp.where(gi | wi, g == w, d <= atol + rtol * cp.abs(w)))
    fin = cp.isfinite(g) & cp.isfinite(w)
    dfin = cp.where(fin, d, 0.0)
    wfin = cp.where(fin, w, 0.0)
    num, den = float((dfin * dfin).sum()), float((wfin * wfin).sum())
    fails = int((~ok).sum())
    res = {"fails": fails, "elems": int(g.size), "nan_got": int(gn.sum()),
           "max_abs": float(dfin.max()), "rel_l2": math.sqrt(num / den) if den > 0 else math.sqrt(num)}
    if fails:
        i = int(cp.argmax(~ok))
        res["first_fail"] = {"index": i, "got": float(g[i]), "want": float(w[i])}
    del g, w, gn, wn, gi, wi, d, ok, fin, dfin, wfin
    return res


def tier(rel_l2: float) -> str:
    # sandbox/src/engine/contract/compare.rs
    if rel_l2 <= 1e-5:
        return "fp32-faithful"
    if rel_l2 <= 1e-3:
        return "tf32-like"
    if rel_l2 <= 8e-3:
        return "bf16-like"
    return "coarse"


# ----------------------------------------------------------------------------- running
class Plan:
    def __init__(self, module: cp.RawModule, ks: dict, launches: list[dict]):
        self.launches = launches
        self.kernels = {}
        self.attrs = {}
        for l in launches:
            name = l["kernel"]
            if name not in self.kernels:
                f = module.get_function(name)
                self.kernels[name] = f
                try:
                    a = f.attributes
                    self.attrs[name] = {"regs": a.get("num_regs"), "local_bytes": a.get("local_size_bytes"),
                                        "static_smem": a.get("shared_size_bytes"),
                                        "max_threads": a.get("max_threads_per_block")}
                except Exception:  # noqa: BLE001
                    pass
        self.scratch_specs = ks.get("scratch", [])

    def run(self, buffers: dict) -> None:
        scratch = {s["name"]: cp.zeros(s["elems"], dtype=NP_DTYPES[s["dtype"]]) for s in self.scratch_specs}
        for l in self.launches:
            args = []
            for a in l.get("args", []):
                if isinstance(a, str):
                    args.append(buffers[a] if a in buffers else scratch[a])
                else:
                    (k, v), = a.items()
                    args.append(SCALAR_NP[k](v))
            f = self.kernels[l["kernel"]]
            sh = l.get("shared_bytes", 0)
            if sh > 48 * 1024:
                f.max_dynamic_shared_size_bytes = sh
            f(tuple(l.get("grid", [1, 1, 1])), tuple(l.get("block", [1, 1, 1])), tuple(args), shared_mem=sh)

    def time(self, buffers: dict, reps: int = 5) -> float:
        self.run(buffers)
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            self.run(buffers)
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e))
        return float(np.median(times))


def build(problem_dir: str, ks: dict, arch: str, source: str | None = None, launches=None):
    src = source if source is not None else open(os.path.join(problem_dir, ks["file"]), encoding="utf-8").read()
    t0 = time.time()
    img, text = nvrtc_compile(src, ks["file"], arch, ks.get("flags", []))
    ms = (time.time() - t0) * 1e3
    if img is None:
        return None, text, ms
    return Plan(load_module(img), ks, launches if launches is not None else ks["launches"]), text, ms


# ----------------------------------------------------------------------------- torch
def torch_variants(name: str):
    """name -> list of (label, fn(inputs as torch tensors) -> output tensor)."""
    import torch
    import torch.nn.functional as F

    def mm(tf32):
        def f(t):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            return torch.matmul(t["A"], t["B"])
        return f

    def conv(t, tf32):
        torch.backends.cudnn.allow_tf32 = tf32
        return F.conv2d(t["x"], t["w"], t["b"], stride=4, padding=2)

    def fp16_operands(t):
        torch.backends.cuda.matmul.allow_tf32 = False
        return torch.matmul(t["A"].half().float(), t["B"].half().float())

    def half_mm(reduced):
        def f(t):
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = reduced
            return torch.matmul(t["A"], t["B"])
        return f

    def sdpa(backend):
        def f(t):
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(t["q"], t["k"], t["v"])
        return f
    from torch.nn.attention import SDPBackend

    if name in ("matmul-fp32-4096", "matmul-fp32-4096-strict"):
        return [("torch fp32 (tf32 off)", mm(False)), ("torch tf32", mm(True)),
                ("fp16-rounded operands, fp32 accumulation", fp16_operands),
                ("torch fp16 matmul (fp16 output)", lambda t: torch.matmul(t["A"].half(), t["B"].half()).float()),
                ("torch bf16 matmul", lambda t: torch.matmul(t["A"].bfloat16(), t["B"].bfloat16()).float())]
    if name == "matmul-fp16-4096":
        return [("torch half (reduced-precision reduction allowed, default)", half_mm(True)),
                ("torch half (reduced-precision reduction off)", half_mm(False)),
                ("fp16 accumulation emulated (fp16 chunks of 256)",
                 lambda t: sum((torch.matmul(t["A"][:, i:i + 256], t["B"][i:i + 256, :]) for i in range(0, 4096, 256)),
                               torch.zeros(4096, 4096, dtype=torch.half, device="cuda")))]
    if name == "conv2d-3to96-k11s4p2":
        return [("torch conv strict fp32", lambda t: conv(t, False)), ("torch conv tf32 (default)", lambda t: conv(t, True))]
    if name == "conv2d-relu-maxpool":
        return [("torch conv+relu+pool strict", lambda t: F.max_pool2d(F.relu(conv(t, False)), 3, 2)),
                ("torch conv+relu+pool tf32", lambda t: F.max_pool2d(F.relu(conv(t, True)), 3, 2))]
    if name == "softmax-4096x65536":
        return [("torch softmax", lambda t: torch.softmax(t["x"], dim=1))]
    if name == "layernorm-16x64x256x256":
        return [("torch layer_norm", lambda t: F.layer_norm(t["x"], (64, 256, 256), t["w"], t["b"], 1e-5))]
    if name == "sdpa-fp16-b4h16s2048d64":
        return [("torch sdpa flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                ("torch sdpa efficient", sdpa(SDPBackend.EFFICIENT_ATTENTION)),
                ("torch sdpa math", sdpa(SDPBackend.MATH))]
    if name == "vecadd-cuda-1m":
        return [("torch add", lambda t: t["a"] + t["b"])]
    if name == "rowsum-cuda-4096x1024":
        return [("torch sum", lambda t: t["x"].sum(dim=1))]
    return []


def torch_time(fn, tin, reps=10) -> float:
    import torch
    fn(tin)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(tin)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return float(np.median(times))


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("problems", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "problems"))
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--no-knobs", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--random-combos", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--probe-only", action="store_true", help="only report which headers NVRTC provides")
    a = ap.parse_args()

    arch = arch_of_device()
    report = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "arch": arch, "problems": {}}
    if _nvrtc is not None:
        err, major, minor = _nvrtc.nvrtcVersion()
        report["nvrtc"] = f"{major}.{minor}"
    log(f"device {report['device']} ({arch}), nvrtc {report.get('nvrtc', 'via cupy')}")
    report["headers"] = header_probe(arch)
    log("NVRTC built-in headers (no include path, --no-source-include):")
    for h, r in report["headers"].items():
        log(f"  {h}: {r}")
    if a.probe_only:
        return 0

    only = set(filter(None, a.only.split(",")))
    failures = 0
    for entry in sorted(os.listdir(a.problems)):
        pdir = os.path.join(a.problems, entry)
        tp = os.path.join(pdir, "problem.toml")
        if not os.path.isfile(tp) or (only and entry not in only):
            continue
        spec = tomllib.load(open(tp, "rb"))
        if "cuda" not in spec.get("reference", {}):
            continue
        name = spec["name"]
        log(f"\n=== {name}")
        pr = report["problems"][name] = {}
        tol = spec["tolerance"]
        tensors = spec["tensor"]
        inputs_t = [t for t in tensors if t["role"] == "input"]
        outputs_t = [t for t in tensors if t["role"] == "output"]
        shifted_any = any(t.get("shifted_trial", True) and t["dtype"] in ("f32", "f64", "f16") for t in inputs_t)

        ref, text, ms = build(pdir, spec["reference"]["cuda"], arch)
        pr["reference_compile_ms"] = round(ms, 1)
        if text:
            pr["reference_log"] = text[:2000]
        if ref is None:
            log(f"  reference: COMPILE ERROR\n{text}")
            failures += 1
            continue
        pr["reference_attrs"] = ref.attrs
        log(f"  reference compiled in {ms:.0f} ms {ref.attrs}" + (f"\n  log: {text[:500]}" if text else ""))

        trials = [("normal", False)] + ([("shifted", True)] if shifted_any else [])
        data = {}
        for label, sh in trials:
            cp.random.seed(1234 + (7 if sh else 0))
            ins = {t["name"]: draw(t, sh) for t in inputs_t}
            outs = {t["name"]: poisoned(t) for t in outputs_t}
            bufs = dict(ins, **outs)
            try:
                ref.run(bufs)
                cp.cuda.Device().synchronize()
            except Exception as e:  # noqa: BLE001
                log(f"  reference run ({label}) FAILED: {e}")
                failures += 1
                break
            want = {n: outs[n].copy() for n in outs}
            nan_left = {n: int(cp.isnan(want[n].astype(cp.float32)).sum()) for n in want}
            if label == "normal":
                pr["reference_ms"] = round(ref.time(dict(ins, **{t["name"]: poisoned(t) for t in outputs_t})), 3)
                log(f"  reference: {pr['reference_ms']} ms; NaN/unwritten outputs {nan_left}")
            data[label] = (ins, want)
        if len(data) != len(trials):
            continue

        def check_plan(plan: Plan, label: str, trials_to_run) -> dict:
            res = {}
            for tl in trials_to_run:
                ins, want = data[tl]
                snap = {n: v.copy() for n, v in ins.items()}
                outs = {t["name"]: poisoned(t) for t in outputs_t}
                try:
                    plan.run(dict(ins, **outs))
                    cp.cuda.Device().synchronize()
                except Exception as e:  # noqa: BLE001
                    res[tl] = {"error": str(e)}
                    continue
                first = {n: v.copy() for n, v in outs.items()}
                outs2 = {t["name"]: poisoned(t) for t in outputs_t}
                plan.run(dict(ins, **outs2))
                cp.cuda.Device().synchronize()
                r = {}
                for t in outputs_t:
                    n = t["name"]
                    r[n] = compare(first[n], want[n], tol["atol"], tol["rtol"])
                    r[n]["bitwise_diffs_run2"] = int((first[n].view(cp.uint16 if t["dtype"] == "f16" else cp.uint32 if t["dtype"] in ("f32", "i32") else cp.uint64) !=
                                                      outs2[n].view(cp.uint16 if t["dtype"] == "f16" else cp.uint32 if t["dtype"] in ("f32", "i32") else cp.uint64)).sum())
                r["inputs_intact"] = all(bool(cp.array_equal(snap[n], ins[n])) for n in ins)
                res[tl] = r
            return res

        def verdict(res: dict) -> tuple[bool, float]:
            ok, worst = True, 0.0
            for tl, r in res.items():
                if "error" in r or not r.get("inputs_intact", False):
                    return False, float("nan")
                for n, m in r.items():
                    if n == "inputs_intact":
                        continue
                    ok &= m["fails"] == 0
                    worst = max(worst, m["rel_l2"])
            return ok, worst

        seed_ks = spec.get("seed", {}).get("cuda")
        if seed_ks:
            src = open(os.path.join(pdir, seed_ks["file"]), encoding="utf-8").read()
            seed, text, ms = build(pdir, seed_ks, arch)
            if seed is None:
                log(f"  seed: COMPILE ERROR\n{text}")
                failures += 1
                pr["seed"] = {"compile_error": text[:4000]}
            else:
                res = check_plan(seed, "seed", list(data))
                ok, worst = verdict(res)
                t_ms = seed.time(dict(data["normal"][0], **{t["name"]: poisoned(t) for t in outputs_t}))
                pr["seed"] = {"ok": ok, "worst_rel_l2": worst, "tier": tier(worst) if ok else None, "ms": round(t_ms, 3),
                              "attrs": seed.attrs, "trials": res, "compile_ms": round(ms, 1)}
                if text:
                    pr["seed"]["log"] = text[:2000]
                failures += 0 if ok else 1
                log(f"  seed: {'ok' if ok else 'WRONG'} worst rel L2 {worst:.3e} ({tier(worst) if ok else '-'}), "
                    f"{t_ms:.3f} ms (ref/seed {pr.get('reference_ms', 0) / t_ms:.2f}x) {seed.attrs}")
                if not ok:
                    log("   ", json.dumps(res)[:1500])
                if text:
                    log(f"  seed log: {text[:500]}")

                # knob variants
                knobs = parse_knobs(src)
                if knobs and not a.no_knobs:
                    defaults = {k: d for k, _, d in knobs}
                    combos = []
                    for k, vals, d in knobs:
                        for v in vals:
                            if v != d:
                                combos.append(dict(defaults, **{k: v}))
                    rng = random.Random(7)
                    for _ in range(a.random_combos):
                        combos.append({k: rng.choice(vals) for k, vals, _ in knobs})
                    pr["knob_variants"] = []
                    for combo in combos:
                        L = replan(name, seed_ks["launches"], combo)
                        if L is None:
                            break
                        label = ",".join(f"{k}={v}" for k, v in combo.items() if v != defaults[k]) or "defaults"
                        vs, vtext, _ = build(pdir, seed_ks, arch, set_knobs(src, combo), L)
                        if vs is None:
                            log(f"    {label}: COMPILE ERROR {vtext[-800:]}")
                            pr["knob_variants"].append({"knobs": label, "compile_error": vtext[-2000:]})
                            failures += 1
                            continue
                        res = check_plan(vs, label, ["normal"])
                        ok, worst = verdict(res)
                        try:
                            t_ms = vs.time(dict(data["normal"][0], **{t["name"]: poisoned(t) for t in outputs_t}), reps=3)
                        except Exception as e:  # noqa: BLE001
                            t_ms = float("nan")
                            ok = False
                            res["time_error"] = str(e)
                        failures += 0 if ok else 1
                        pr["knob_variants"].append({"knobs": label, "ok": ok, "rel_l2": worst, "ms": round(t_ms, 3),
                                                    "attrs": vs.attrs})
                        log(f"    {label}: {'ok' if ok else 'WRONG'} rel L2 {worst:.2e} {t_ms:.3f} ms "
                            f"regs {[v.get('regs') for v in vs.attrs.values()]} local {[v.get('local_bytes') for v in vs.attrs.values()]}")
                        if not ok:
                            log("     ", json.dumps(res)[:800])

        if a.torch:
            try:
                import torch
                variants = torch_variants(name)
            except Exception as e:  # noqa: BLE001
                variants = []
                log(f"  torch unavailable: {e}")
            pr["torch"] = []
            for label, fn in variants:
                entry_r = {"variant": label}
                for tl, (ins, want) in data.items():
                    tin = {n: torch.from_dlpack(v) for n, v in ins.items()}
                    try:
                        out = fn(tin).contiguous()
                    except Exception as e:  # noqa: BLE001
                        entry_r[tl] = {"error": str(e)[:300]}
                        continue
                    oname = outputs_t[0]["name"]
                    got = cp.from_dlpack(out)
                    if got.dtype != want[oname].dtype:
                        got = got.astype(want[oname].dtype)
                    m = compare(got.reshape(want[oname].shape), want[oname], tol["atol"], tol["rtol"])
                    m["tier"] = tier(m["rel_l2"])
                    entry_r[tl] = m
                    if tl == "normal":
                        entry_r["ms"] = round(torch_time(fn, tin), 3)
                pr["torch"].append(entry_r)
                n_ = entry_r.get("normal", {})
                s_ = entry_r.get("shifted", {})
                log(f"  {label}: {entry_r.get('ms')} ms; normal: fails {n_.get('fails')} rel L2 {n_.get('rel_l2', float('nan')):.2e} "
                    f"max abs {n_.get('max_abs', float('nan')):.2e}" + (f"; shifted: fails {s_.get('fails')} rel L2 {s_.get('rel_l2', float('nan')):.2e}" if s_ else "")
                    + (f" {n_['error']}" if 'error' in n_ else ""))
        del data
        cp.get_default_memory_pool().free_all_blocks()

    report["failures"] = failures
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    log(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
