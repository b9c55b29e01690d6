#!/usr/bin/env python3
"""kiln's trusted torch helper.

kiln starts this script as a trusted child process (outside the jail, cleared environment,
its own process group, killed past each call's deadline; see docs/security.md):

    python3 kiln_torch.py serve

and talks kiln's framing on stdin/stdout (sandbox/src/protocol.rs): each message is a
u32 little-endian length and a JSON envelope {"blobs": N, "body": {...}}, then N raw
frames (tensor bytes). One answer per request; an answer with "error" is a refusal or a
failure, with the reason. Prints of the code it runs go to stderr, never to the protocol.

Requests ("cmd"):
  hello       torch's version, the device, its L2 size; an error when torch or the device
              is missing.
  baseline    set up a torch baseline kind ("torch-eager" or "torch-compile") of the
              problem's [baseline.torch] op: a name from the fixed registry OPS, with
              tensor names and typed parameters (nothing from the problem is evaluated as
              code). Answers the precision variants.
  check       run variant i once and compare it with torch's own f64 run.
  run         one untimed run, synchronized.
  fresh       a fresh input set.
  sample      one timed sample: an L2 flush of the size kiln gives, a blocking kernel of
              the length kiln gives, CUDA events around the op, a synchronize.

Warm-up counts, fresh-input cadence, the stop rule and the statistics are kiln's
(sandbox/src/baselines/driver.rs): this helper only runs what it is asked.

Inputs are drawn from the problem's distributions (normal, uniform, randint) with a torch
generator seeded from the request: the same distributions as kiln's inputs, not the same
draws.
"""

import json
import struct
import sys

# op -> (tensor parameters, optional tensor parameters, other parameters with their types)
OPS = {
    "matmul": (("a", "b", "c"), (), {}),
    "conv2d": (("x", "w", "y"), ("b",), {"stride": int, "padding": int, "relu": bool, "maxpool": dict}),
    "softmax": (("x", "y"), (), {}),
    "layer_norm": (("x", "y"), ("w", "b"), {"dims": int, "eps": float}),
    "sdpa": (("q", "k", "v", "out"), (), {"causal": bool}),
}
REQUIRED_OTHER = {"conv2d": ("stride",), "layer_norm": ("dims", "eps")}
FLOATS = {"f32", "f16", "bf16", "f64"}
KINDS = ("torch-eager", "torch-compile")
MAX_FRAME = 512 << 20


class Refused(Exception):
    """A request this helper does not run (the reason is the message)."""


# ---- kiln's framing ---------------------------------------------------------------------


def read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def read_frame(f):
    (n,) = struct.unpack("<I", read_exact(f, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds the limit")
    return read_exact(f, n)


def read_message(f):
    env = json.loads(read_frame(f))
    blobs = [read_frame(f) for _ in range(int(env.get("blobs", 0)))]
    return env["body"], blobs


def write_message(f, body, blobs=()):
    head = json.dumps({"blobs": len(blobs), "body": body}).encode()
    f.write(struct.pack("<I", len(head)) + head)
    for b in blobs:
        f.write(struct.pack("<I", len(b)))
        f.write(b)
    f.flush()


# ---- problem tables ---------------------------------------------------------------------


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
            if t.get("dtype") not in FLOATS:
                raise Refused(f"tensor {t['name']} has dtype {t.get('dtype')!r}; floats only")
    return op, params


def variants(op, dtype):
    """(precision label, allow_tf32) per timed variant: torch's defaults first."""
    if dtype == "f32" and op == "conv2d":
        return [("tf32", True), ("fp32", False)]  # cudnn.allow_tf32 defaults to True
    if dtype == "f32" and op == "matmul":
        return [("fp32", False)]  # cuda.matmul.allow_tf32 defaults to False
    return [({"f16": "fp16", "bf16": "bf16", "f64": "fp64"}.get(dtype, "fp32"), False)]


# ---- everything below needs torch -------------------------------------------------------


def torch_dtype(torch, name):
    return {
        "f32": torch.float32,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "f64": torch.float64,
        "i32": torch.int32,
        "i64": torch.int64,
        "u8": torch.uint8,
    }[name]


def draw(torch, t, gen, device):
    """One input tensor from the problem's distribution, drawn in f64 and rounded once."""
    init = t.get("init") or {"dist": "normal"}
    shape = tuple(t["shape"])
    dist = init.get("dist", "normal")
    if dist == "normal":
        x = torch.randn(shape, dtype=torch.float64, device=device, generator=gen)
        x = x * float(init.get("std", 1.0)) + float(init.get("mean", 0.0))
    elif dist == "uniform":
        lo, hi = float(init["low"]), float(init["high"])
        x = torch.rand(shape, dtype=torch.float64, device=device, generator=gen) * (hi - lo) + lo
    elif dist == "randint":
        x = torch.randint(int(init["low"]), int(init["high"]), shape, device=device, generator=gen)
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
            y = F.conv2d(inputs[p["x"]], inputs[p["w"]], inputs[p["b"]] if "b" in p else None,
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


class Baseline:
    """One baseline kind of one problem, set up on the device."""

    def __init__(self, torch, device, spec, kind, seed):
        if kind not in KINDS:
            raise Refused(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
        self.torch, self.device, self.kind = torch, device, kind
        self.tensors = {t["name"]: t for t in spec["tensor"]}
        tol = spec.get("tolerance", {})
        self.atol, self.rtol = float(tol.get("atol", 0.0)), float(tol.get("rtol", 0.0))
        self.op, self.p = parse_op(spec)
        names, optional = OPS[self.op][0], OPS[self.op][1]
        out = self.p.get("c") or self.p.get("y") or self.p.get("out")
        self.inputs_used = [v for k, v in self.p.items() if k in names + optional and v != out]
        self.variants = variants(self.op, self.tensors[out]["dtype"])
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.seed = seed
        self.inputs = {n: draw(torch, self.tensors[n], self.gen, device) for n in self.inputs_used}
        self.call = None
        self.flush = None
        self.flush_value = 0

    def describe(self):
        return [{"precision": v, "detail": f"allow_tf32={tf32}"} for v, tf32 in self.variants]

    def use(self, index):
        """Makes variant `index` current (TF32 switches) and compiles it for torch.compile."""
        torch = self.torch
        _, tf32 = self.variants[index]
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        eager = make_call(torch, self.op, self.p, self.inputs)
        self.call = torch.compile(eager) if self.kind == "torch-compile" else eager

    def check(self, index):
        torch = self.torch
        self.use(index)
        with torch.no_grad():
            got = self.call()
            self.sync()
            want = make_call(torch, self.op, self.p, {n: x.double() for n, x in self.inputs.items()})()
            diff = got.double() - want
            norm = float(want.norm())
            rel = float(diff.norm() / norm) if norm > 0 else float(diff.norm())
            bad = int((diff.abs() > self.atol + self.rtol * want.abs()).sum())
        return {"rel_l2": rel, "mismatches": bad}

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def run(self):
        with self.torch.no_grad():
            self.call()
        self.sync()

    def fresh(self, index):
        gen = self.torch.Generator(device=self.device)
        gen.manual_seed((self.seed + 0x9E3779B97F4A7C15 * (int(index) + 1)) & ((1 << 63) - 1))
        for n in self.inputs:
            self.inputs[n].copy_(draw(self.torch, self.tensors[n], gen, self.device))
        self.sync()

    def sample(self, flush_bytes, blocker_ns):
        torch = self.torch
        if self.device != "cuda":
            raise Refused("samples are timed on a CUDA device only")
        if self.flush is None or self.flush.numel() != flush_bytes:
            self.flush = torch.empty(int(flush_bytes), dtype=torch.uint8, device="cuda")
        self.flush_value = (self.flush_value + 1) % 256
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            self.flush.fill_(self.flush_value)
            spin = getattr(torch.cuda, "_sleep", None)
            if spin is not None and blocker_ns > 0:
                spin(int(blocker_ns) * 2)  # cycles at ~2 GHz
            start.record()
            self.call()
            end.record()
            torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3


class Server:
    """The state of one conversation: the device, the baseline being timed."""

    def __init__(self):
        self.torch = None
        self.device = "cpu"
        self.baseline = None

    def need_torch(self):
        if self.torch is None:
            try:
                import torch
            except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
                raise Refused(f"python cannot import torch: {e}") from None
            self.torch = torch
        return self.torch

    def hello(self, req):
        torch = self.need_torch()
        want = req.get("device", "cpu")
        if want == "cuda" and not torch.cuda.is_available():
            raise Refused(f"torch {torch.__version__} sees no CUDA GPU")
        self.device = want
        about = f"torch {torch.__version__}"
        l2 = 0
        if want == "cuda":
            dev = torch.cuda.get_device_properties(0)
            l2 = int(getattr(dev, "L2_cache_size", 0) or 0)
            about += f", CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, {dev.name}"
        return {"torch": torch.__version__, "device": want, "l2_bytes": l2, "about": about}

    def handle(self, req, blobs):
        cmd = req.get("cmd")
        if cmd == "hello":
            return self.hello(req), []
        torch = self.need_torch()
        if cmd == "baseline":
            self.baseline = None
            torch.cuda.empty_cache() if self.device == "cuda" else None
            self.baseline = Baseline(torch, self.device, req["problem"], req.get("kind"), int(req.get("seed", 0)))
            return {"variants": self.baseline.describe()}, []
        b = self.baseline
        if cmd in ("check", "run", "fresh", "sample") and b is None:
            raise Refused(f"{cmd} before baseline")
        if cmd == "check":
            return b.check(int(req["variant"])), []
        if cmd == "run":
            b.run()
            return {}, []
        if cmd == "fresh":
            b.fresh(req.get("set", 0))
            return {}, []
        if cmd == "sample":
            return {"us": b.sample(int(req["flush_bytes"]), int(req.get("blocker_ns", 0)))}, []
        raise Refused(f"unknown command {cmd!r}")


def serve():
    proto_in = sys.stdin.buffer
    proto_out = sys.stdout.buffer
    # Whatever the code we run prints goes to the log, not into the protocol.
    sys.stdout = sys.stderr
    server = Server()
    while True:
        try:
            req, blobs = read_message(proto_in)
        except EOFError:
            return 0
        try:
            body, out = server.handle(req, blobs)
        except Refused as e:
            body, out = {"error": str(e)}, []
        except Exception as e:  # noqa: BLE001 - report, never crash the caller
            body, out = {"error": f"{type(e).__name__}: {e}"}, []
        write_message(proto_out, body, out)


def main(argv):
    if len(argv) >= 1 and argv[0] == "serve":
        return serve()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
