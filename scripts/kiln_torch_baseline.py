#!/usr/bin/env python3
"""kiln's trusted torch-eager baseline helper.

kilnd runs this script (a trusted subprocess with a timeout, see docs/security.md) to time
torch eager on a problem, under kiln's timing rules:

    python3 kiln_torch_baseline.py --seed N --timing '{"warmup": 3, ...}' < problem.json

stdin: the problem spec as JSON (kiln_types::ProblemSpec); only its tensors, tolerance and
`baseline.torch` table are read. The op is a name from the fixed registry below (OPS), with
tensor names and typed parameters; nothing from the problem is ever evaluated as code.

Inputs are drawn on the GPU from the problem's distributions (normal, uniform, randint) with
a torch generator seeded from --seed: the same distributions as kiln's inputs, not the same
draws. Each timed sample: an L2 flush (a buffer of 2 x L2, at least 16 MiB, written with a
new byte), a short GPU spin so the start event is not recorded early, CUDA events around
the op, a full synchronize. The stop rule is kiln's: at least min_samples and min_time_ms,
then relative standard error below max_rse, or max_samples, or wall_cap_ms. The first run
is discarded, then `warmup` runs; a fresh input set for every sample, as for a candidate.

stdout: one JSON object {"results": [BaselineResult, ...]}, one result per precision
variant (torch's defaults, plus strict fp32 where torch's default is TF32). Exit status 0,
also when torch or a GPU is missing (the results say "unavailable" with the reason); 2 for
a refused problem (the message on stderr and in the results).
"""

import argparse
import json
import math
import sys
import time

NAME = "torch-eager"

# op -> (tensor parameters, optional tensor parameters, other parameters with their types)
OPS = {
    "matmul": (("a", "b", "c"), (), {}),
    "conv2d": (("x", "w", "y"), ("b",), {"stride": int, "padding": int, "relu": bool, "maxpool": dict}),
    "softmax": (("x", "y"), (), {}),
    "layer_norm": (("x", "y"), ("w", "b"), {"dims": int, "eps": float}),
    "sdpa": (("q", "k", "v", "out"), (), {"causal": bool}),
}
REQUIRED_OTHER = {"conv2d": ("stride",), "layer_norm": ("dims", "eps")}
DTYPES = {"f32", "f16", "bf16", "f64"}
TIMING_DEFAULTS = {
    "warmup": 3,
    "min_samples": 10,
    "min_time_ms": 50.0,
    "max_rse": 0.005,
    "max_samples": 2000,
    "wall_cap_ms": 10000.0,
}


class Refused(Exception):
    """The problem's [baseline.torch] table is not something this helper runs."""


def parse_op(spec):
    """Validates spec['baseline']['torch'] against OPS and the tensors; returns (op, params)."""
    table = (spec.get("baseline") or {}).get("torch")
    if not isinstance(table, dict):
        raise Refused("the problem has no [baseline.torch] table")
    op = table.get("op")
    if op not in OPS:
        raise Refused(f"unknown op {op!r} (one of {', '.join(sorted(OPS))})")
    names, optional, others = OPS[op]
    tensors = {t["name"]: t for t in spec.get("tensor", [])}
    params = {}
    for key, value in table.items():
        if key == "op":
            continue
        if key in names or key in optional:
            if not isinstance(value, str) or value not in tensors:
                raise Refused(f"{key} = {value!r} names no tensor of the problem")
            params[key] = value
        elif key in others:
            want = others[key]
            ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value, ok = float(value), True
            if not ok:
                raise Refused(f"{key} must be a {want.__name__}")
            params[key] = value
        else:
            raise Refused(f"unknown key {key!r} for op {op}")
    for key in names + REQUIRED_OTHER.get(op, ()):
        if key not in params:
            raise Refused(f"op {op} needs {key}")
    pool = params.get("maxpool")
    if pool is not None:
        if set(pool) != {"kernel", "stride"} or not all(
            isinstance(pool[k], int) and not isinstance(pool[k], bool) and pool[k] > 0 for k in pool
        ):
            raise Refused("maxpool must be {kernel = K, stride = S} with positive integers")
    for key in names + optional:
        if key in params:
            t = tensors[params[key]]
            if t.get("dtype") not in DTYPES:
                raise Refused(f"tensor {t['name']} has dtype {t.get('dtype')!r}; floats only")
    return op, params


def timing_plan(text):
    """kiln's TimingPlan from JSON, defaults filled in; unknown keys ignored."""
    plan = dict(TIMING_DEFAULTS)
    if text:
        given = json.loads(text)
        if not isinstance(given, dict):
            raise Refused("--timing must be a JSON object")
        for k in TIMING_DEFAULTS:
            if k in given:
                plan[k] = type(TIMING_DEFAULTS[k])(given[k])
    return plan


def stats(samples):
    """Median, mean, sample stdev, min, max, n and rse, as kiln computes them (µs in, µs out)."""
    n = len(samples)
    if n == 0:
        return {"median_us": 0.0, "mean_us": 0.0, "stdev_us": 0.0, "min_us": 0.0, "max_us": 0.0, "n": 0, "rse": 0.0}
    v = sorted(samples)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
    rse = sd / math.sqrt(n) / mean if mean > 0 else 0.0
    return {"median_us": median, "mean_us": mean, "stdev_us": sd, "min_us": v[0], "max_us": v[-1], "n": n, "rse": rse}


def stop_rule(samples, wall_ms, plan):
    """kiln's stop rule (sandbox/src/contract/timing.rs): a reason to stop, or None."""
    n = len(samples)
    if n >= max(plan["max_samples"], 1):
        return "max_samples"
    if wall_ms >= plan["wall_cap_ms"]:
        return "wall_cap"
    if n >= max(plan["min_samples"], 2) and wall_ms >= plan["min_time_ms"] and stats(samples)["rse"] < plan["max_rse"]:
        return "converged"
    return None


def variants(op, dtype):
    """(precision label, allow_tf32) per timed variant: torch's defaults first."""
    if dtype == "f32" and op == "conv2d":
        return [("tf32", True), ("fp32", False)]  # cudnn.allow_tf32 defaults to True
    if dtype == "f32" and op == "matmul":
        return [("fp32", False)]  # cuda.matmul.allow_tf32 defaults to False
    return [({"f16": "fp16", "bf16": "bf16", "f64": "fp64"}.get(dtype, "fp32"), False)]


def result(name, precision, status, detail, timing=None, rel_l2=None, mismatches=None):
    r = {"name": name, "library": "torch", "precision": precision, "status": status, "detail": detail}
    if timing is not None:
        r["timing"] = timing
    if rel_l2 is not None:
        r["rel_l2"] = rel_l2
    if mismatches is not None:
        r["mismatches"] = mismatches
    return r


# ---- everything below needs torch -------------------------------------------------------


def torch_dtype(torch, name):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}[name]


def draw(torch, t, gen):
    """One input tensor from the problem's distribution, drawn in f64 and rounded once."""
    init = t.get("init") or {"dist": "normal"}
    shape = tuple(t["shape"])
    dist = init.get("dist", "normal")
    if dist == "normal":
        x = torch.randn(shape, dtype=torch.float64, device="cuda", generator=gen)
        x = x * float(init.get("std", 1.0)) + float(init.get("mean", 0.0))
    elif dist == "uniform":
        lo, hi = float(init["low"]), float(init["high"])
        x = torch.rand(shape, dtype=torch.float64, device="cuda", generator=gen) * (hi - lo) + lo
    elif dist == "randint":
        x = torch.randint(int(init["low"]), int(init["high"]), shape, device="cuda", generator=gen).double()
    else:
        raise Refused(f"unknown distribution {dist!r}")
    return x.to(torch_dtype(torch, t["dtype"]))


def make_call(torch, op, p, inputs):
    """A closure computing the op's output from `inputs` (name -> tensor)."""
    F = torch.nn.functional
    if op == "matmul":
        return lambda: torch.matmul(inputs[p["a"]], inputs[p["b"]])
    if op == "conv2d":
        def conv():
            y = F.conv2d(inputs[p["x"]], inputs[p["w"]], inputs.get(p.get("b")) if "b" in p else None,
                         stride=p["stride"], padding=p.get("padding", 0))
            if p.get("relu"):
                y = torch.relu(y)
            if p.get("maxpool"):
                y = F.max_pool2d(y, p["maxpool"]["kernel"], p["maxpool"]["stride"])
            return y
        return conv
    if op == "softmax":
        return lambda: torch.softmax(inputs[p["x"]], dim=-1)
    if op == "layer_norm":
        x = inputs[p["x"]]
        shape = tuple(x.shape[x.dim() - p["dims"]:])
        w = inputs[p["w"]] if "w" in p else None
        b = inputs[p["b"]] if "b" in p else None
        return lambda: F.layer_norm(inputs[p["x"]], shape, w, b, p["eps"])
    if op == "sdpa":
        return lambda: F.scaled_dot_product_attention(inputs[p["q"]], inputs[p["k"]], inputs[p["v"]],
                                                      is_causal=bool(p.get("causal")))
    raise Refused(f"unknown op {op}")


def run(spec, seed, plan):
    op, p = parse_op(spec)
    tensors = {t["name"]: t for t in spec["tensor"]}
    out_name = p.get("c") or p.get("y") or p.get("out")
    dtype = tensors[out_name]["dtype"]
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        return [result(f"{NAME}-{v}", v, "unavailable", f"python cannot import torch: {e}") for v, _ in variants(op, dtype)]
    if not torch.cuda.is_available():
        return [result(f"{NAME}-{v}", v, "unavailable", f"torch {torch.__version__} sees no CUDA GPU")
                for v, _ in variants(op, dtype)]
    dev = torch.cuda.get_device_properties(0)
    flush = torch.empty(max(2 * int(getattr(dev, "L2_cache_size", 0) or 0), 16 << 20), dtype=torch.uint8, device="cuda")
    tol = spec.get("tolerance", {})
    atol, rtol = float(tol.get("atol", 0.0)), float(tol.get("rtol", 0.0))
    about = f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, {dev.name}"
    inputs_used = [v for k, v in p.items() if k in OPS[op][0] + OPS[op][1] and v != out_name]
    results = []
    for precision, tf32 in variants(op, dtype):
        name = f"{NAME}-{precision}"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        try:
            inputs = {n: draw(torch, tensors[n], gen) for n in inputs_used}
            call = make_call(torch, op, p, inputs)
            with torch.no_grad():
                got = call()
                torch.cuda.synchronize()
                want_inputs = {n: x.double() for n, x in inputs.items()}
                want = make_call(torch, op, p, want_inputs)()
                diff = (got.double() - want)
                rel = float(diff.norm() / want.norm()) if float(want.norm()) > 0 else float(diff.norm())
                bad = int((diff.abs() > atol + rtol * want.abs()).sum())
                del want_inputs, want, diff, got
                timing = time_op(torch, call, inputs, tensors, gen, flush, plan)
            results.append(result(name, precision, "measured",
                                  f"{about}; allow_tf32={tf32}; error vs torch's own f64 run", timing, rel, bad))
        except Refused:
            raise
        except Exception as e:  # noqa: BLE001 - report, never crash the caller
            results.append(result(name, precision, "failed", f"{about}: {type(e).__name__}: {e}"))
        finally:
            torch.cuda.empty_cache()
    return results


def time_op(torch, call, inputs, tensors, gen, flush, plan):
    """kiln's timing phase around `call` (see the module docstring); µs statistics."""
    spin = getattr(torch.cuda, "_sleep", None)
    for _ in range(plan["warmup"] + 1):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples, fresh, value = [], 0, 0
    t0 = time.monotonic()
    while True:
        for k in inputs:
            inputs[k].copy_(draw(torch, tensors[k], gen))
        fresh += 1
        torch.cuda.synchronize()
        value = (value + 1) % 256
        flush.fill_(value)
        if spin is not None:
            spin(200_000)  # ~100 µs at 2 GHz: the op's launches queue behind it
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
        wall_ms = (time.monotonic() - t0) * 1e3
        reason = stop_rule(samples, wall_ms, plan)
        if reason:
            s = stats(samples)
            s.update({"stop_reason": reason, "wall_ms": wall_ms, "fresh_inputs": fresh, "rechecks": 0, "overhead_us": 0.0})
            return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timing", default="", help="kiln's TimingPlan as JSON")
    args = ap.parse_args(argv)
    try:
        spec = json.load(sys.stdin)
        if not isinstance(spec, dict):
            raise Refused("the problem must be a JSON object")
        plan = timing_plan(args.timing)
        results = run(spec, args.seed & ((1 << 63) - 1), plan)
    except (Refused, ValueError, KeyError, TypeError) as e:
        print(f"kiln_torch_baseline: refused: {e}", file=sys.stderr)
        print(json.dumps({"results": [result(NAME, "", "failed", f"refused: {e}")]}))
        return 2
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
