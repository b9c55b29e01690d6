#!/usr/bin/env python3
"""kiln's trusted torch runner.

kiln starts this script as a trusted child process (outside the jail, cleared environment,
its own process group, killed past each call's deadline; see docs/security.md):

    python3 kiln_torch.py serve

and talks kiln's framing on stdin/stdout (sandbox/protocol, crate kiln-protocol): each message is a
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
  reference   run the problem's [reference.torch] module (its trusted reference) on the
              input tensors kiln sends as blobs (problem order) and answer its outputs as
              blobs (problem order, declared dtypes); float64 where every op supports it.
              The module is built once per problem and kept (the runner is warm).

And, for `kiln problems import kernelbench`, without serving:

    python3 kiln_torch.py describe FILE.py [--run-limit-bytes N] [--run-limit-flops N] [--atol X] [--rtol X]

prints one JSON object: the tensors (names, shapes, dtypes, distributions) found by running
get_inputs() and the module on the meta device, the parameters and buffers, the outputs,
get_init_inputs(), the flop count (torch's flop counter) and the output magnitude (a real
run on the CPU when the problem is small enough), or {"refused": REASON}.

Warm-up counts, fresh-input cadence, the stop rule and the statistics are kiln's
(sandbox/src/baselines/driver.rs): this helper only runs what it is asked.

Inputs are drawn from the problem's distributions (normal, uniform, randint) with a torch
generator seeded from the request: the same distributions as kiln's inputs, not the same
draws.
"""

import json
import math
import os
import struct
import sys

# op -> (tensor parameters, optional tensor parameters, other parameters with their types)
OPS = {
    "matmul": (("a", "b", "c"), (), {}),
    "conv2d": (("x", "w", "y"), ("b",), {"stride": int, "padding": int, "relu": bool, "maxpool": dict}),
    "softmax": (("x", "y"), (), {}),
    "layer_norm": (("x", "y"), ("w", "b"), {"dims": int, "eps": float}),
    "sdpa": (("q", "k", "v", "out"), (), {"causal": bool}),
    "module": ((), (), {}),
}
REQUIRED_OTHER = {"conv2d": ("stride",), "layer_norm": ("dims", "eps")}
FLOATS = {"f32", "f16", "bf16", "f64"}
KINDS = ("torch-eager", "torch-compile")
# kiln's framing: sandbox/protocol/framing.json is its one spec (the Rust side and this
# file are both tested against its vectors).
MAX_FRAME = 512 << 20
MAX_FRAMES_PER_BLOB = 512
MAX_BLOBS = 8
# Descriptors after a message: one marker byte carries them (kiln_protocol::fds).
FDS_MARKER = b"F"
FDS_MAX = 64
FDS_TOTAL_MAX = 1024  # over as many markers as they take


class Refused(Exception):
    """A request this helper does not run (the reason is the message)."""


# ---- kiln's framing ---------------------------------------------------------------------


def read_exact(f, n):
    """`n` bytes of `f`, read straight into one buffer (a reference's tensors are GiBs:
    each extra copy of them costs seconds)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise EOFError
        got += k
    return buf


def read_frame(f, max_frame=MAX_FRAME):
    (n,) = struct.unpack("<I", read_exact(f, 4))
    if n > max_frame:
        raise ValueError(f"frame of {n} bytes exceeds the limit of {max_frame}")
    return read_exact(f, n)


def read_message(f, max_frame=MAX_FRAME):
    """A message; a blob longer than a frame spans the envelope's `frames` count of
    consecutive frames, joined here. (`max_frame`: the blob frames' limit; the spec's
    vectors use small ones.)"""
    env = json.loads(read_frame(f))
    n = int(env.get("blobs", 0))
    if n > MAX_BLOBS:
        raise ValueError(f"{n} blobs announced; at most {MAX_BLOBS} are allowed")
    frames = env.get("frames") or [1] * n
    if len(frames) != n or any(not 1 <= int(k) <= MAX_FRAMES_PER_BLOB for k in frames):
        raise ValueError(f"bad frame counts {frames} for {n} blobs")
    blobs = []
    for k in frames:
        parts = [read_frame(f, max_frame) for _ in range(int(k))]
        blobs.append(parts[0] if len(parts) == 1 else bytearray().join(parts))
    return env["body"], blobs


def write_message(f, body, blobs=(), max_frame=MAX_FRAME):
    """A message; a blob longer than a frame is written as consecutive frames. The
    envelope is compact JSON with its keys in the spec's order, as kiln's Rust side
    writes it."""
    views = [memoryview(b).cast("B") for b in blobs]
    frames = [max(1, -(-len(v) // max_frame)) for v in views]
    env = {"blobs": len(views)}
    if any(k > 1 for k in frames):
        env["frames"] = frames
    env["body"] = body
    head = json.dumps(env, separators=(",", ":")).encode()
    f.write(struct.pack("<I", len(head)) + head)
    for v in views:
        if len(v) == 0:
            f.write(struct.pack("<I", 0))
        for at in range(0, len(v), max_frame):
            piece = v[at : at + max_frame]
            f.write(struct.pack("<I", len(piece)))
            f.write(piece)
    f.flush()


# ---- problem tables ---------------------------------------------------------------------


def parse_op(spec):
    """Validates spec['baseline']['torch'] against OPS and the tensors; returns (op, params)."""
    table = (spec.get("baseline") or {}).get("torch")
    if not isinstance(table, dict):
        raise Refused("the problem has no [baseline.torch] table")
    op = table.get("op")
    if op == "module":
        if set(table) != {"op"}:
            raise Refused("op module takes no keys")
        if not (spec.get("reference") or {}).get("torch"):
            raise Refused("op module needs a [reference.torch]")
        return op, {}
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


def problem_inputs(torch, ns, forward, seed, device):
    """What the file's get_inputs() returns (forward argument name -> value), torch seeded
    with `seed`, made on `device`; the caller's random state is left as it was."""
    devices = [torch.cuda.current_device()] if device == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed) & ((1 << 63) - 1))
        with torch.device(device), torch.no_grad():
            made = ns["get_inputs"]()
    if not isinstance(made, (list, tuple)):
        raise Refused("get_inputs() did not return a list")
    return dict(zip(forward, made))


def draw_all(torch, tensors, names, gen, device, ns, forward, seed):
    """Input tensors `names` of `tensors` (name -> spec): drawn as kiln draws them, or for
    an input whose init is get_inputs, what the file's get_inputs() gives under `seed`."""
    made = None
    out = {}
    for n in names:
        t = tensors[n]
        if (t.get("init") or {}).get("dist") == "get_inputs":
            if made is None:
                made = problem_inputs(torch, ns, forward, seed, device)
            x = made.get(n)
            if not isinstance(x, torch.Tensor):
                raise Refused(f"get_inputs() gave no tensor for {n}")
            out[n] = x.reshape(t["shape"]).to(torch_dtype(torch, t["dtype"]))
        else:
            out[n] = draw(torch, t, gen, device)
    return out


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


def load_model_code(source, name):
    """Executes a KernelBench-format file (trusted: the problem's author's) in a fresh namespace."""
    ns = {"__name__": f"kiln_reference_{name}"}
    exec(compile(source, f"<{name}/reference.py>", "exec"), ns)  # noqa: S102 - trusted problem code
    if not isinstance(ns.get("Model"), type):
        raise Refused("the file defines no class Model")
    return ns


def as_args(value):
    """get_init_inputs() as stored (JSON): lists become tuples, as KernelBench files return them."""
    if isinstance(value, list):
        return tuple(as_args(v) for v in value)
    return value


def module_kind(model):
    """'conv' when the module holds a convolution (its TF32 default differs), else 'other'."""
    import torch.nn as nn

    convs = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    return "conv" if any(isinstance(m, convs) for m in model.modules()) else "other"


class TorchModule:
    """A problem's [reference.torch] module built on a device, called with kiln's tensors."""

    def __init__(self, torch, spec, device):
        self.torch, self.device = torch, device
        ref = spec["reference"]["torch"]
        self.ref = ref
        self.tensors = {t["name"]: t for t in spec["tensor"]}
        ns = load_model_code(ref["source"], spec["name"])
        self.ns = ns
        init = as_args(json.loads(ref.get("init_inputs") or "[]"))
        torch.manual_seed(0)
        self.model = ns["Model"](*init).to(device)
        self.model64 = None
        self.precision = ref.get("precision", "auto")
        self.fallback = None
        self.bools = set(ref.get("bool_tensors") or [])

    def prepare(self, inputs, f64):
        """(forward args, state dict) from `inputs` (name -> tensor), cast for f64."""

        def cast(name):
            x = inputs[name]
            if name in self.bools:
                return x.bool()
            if f64 and x.is_floating_point():
                return x.double()
            return x

        constants = self.ref.get("constants") or {}
        args = tuple(constants[n] if n in constants else cast(n) for n in self.ref["forward"])
        # kiln holds a 0-d parameter as shape [1]: give the module its own shape back.
        shapes = {k: t.shape for k, t in list(self.model.named_parameters()) + list(self.model.named_buffers())}
        state = {k: cast(v).reshape(shapes[k]) if k in shapes else cast(v)
                 for k, v in (self.ref.get("state") or {}).items()}
        # Buffers the module updates in place (BatchNorm's running stats) must not write kiln's
        # tensors: the module gets its own copies.
        buffers = dict(self.model.named_buffers())
        state = {k: (v.clone() if k in buffers else v) for k, v in state.items()}
        return args, state

    def forward(self, inputs, f64):
        """The module's outputs (a list) on `inputs`, in f64 when asked and supported."""
        torch = self.torch
        model = self.model
        if f64:
            if self.model64 is None:
                import copy

                self.model64 = copy.deepcopy(self.model).double()
            model = self.model64
        args, state = self.prepare(inputs, f64)
        with torch.no_grad():
            out = torch.func.functional_call(model, state, args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise Refused("the module returned something that is not a tensor")
        return outs, f64

    def bind(self, inputs):
        """The module with its parameters and buffers aliasing `inputs` (declared dtypes, so
        fresh draws copied into `inputs` reach it), and forward's arguments: for torch
        eager and torch.compile of the module itself."""
        args, _ = self.prepare(inputs, False)
        named = dict(self.model.named_parameters())
        named.update(dict(self.model.named_buffers()))
        for pname, tname in (self.ref.get("state") or {}).items():
            t = named.get(pname)
            if t is None:
                raise Refused(f"the module has no parameter or buffer {pname}")
            t.data = inputs[tname].reshape(t.shape)
        return self.model, args

    def reference(self, inputs):
        """Outputs in the problem's order and dtypes, and how they were computed. On a GPU,
        TF32 is off for the call (a declared-f32 fallback stays strict fp32)."""
        torch = self.torch
        if self.device == "cuda":
            saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            try:
                return self.compute_reference(inputs)
            finally:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        return self.compute_reference(inputs)

    def compute_reference(self, inputs):
        """(answer, blobs): the outputs' bytes on the CPU (for a caller that sent bytes)."""
        torch = self.torch
        note, outs = self.outputs(inputs)
        blobs = []
        for o in outs:
            o = o.cpu()
            # The tensor's own bytes, written from where they are (no copy).
            blobs.append(o.reshape(-1).view(torch.uint8).numpy() if o.numel() else b"")
            del o
        del outs
        if self.device == "cuda":
            torch.cuda.synchronize()
        return {"precision": note}, blobs

    def reference_into(self, inputs, dests):
        """Writes the outputs into `dests` (name -> tensor of the declared dtype and shape:
        a GPU worker's shared memory); returns how they were computed."""
        torch = self.torch
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            note, outs = self.outputs(inputs)
            for name, o in zip(self.ref["outputs"], outs):
                dests[name].copy_(o)
            del outs
            torch.cuda.synchronize()
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        return {"precision": note}

    def outputs(self, inputs):
        """(how they were computed, the outputs on the device in the problem's order, each
        in its declared dtype and shape)."""
        torch = self.torch
        want64 = self.precision in ("auto", "f64")
        note = "float64"
        if want64 and self.fallback is None:
            try:
                outs, _ = self.forward(inputs, True)
            except Refused:
                raise
            except Exception as e:  # noqa: BLE001 - an op without f64: fall back, recorded
                if self.precision == "f64":
                    raise
                self.fallback = f"{type(e).__name__}: {e}"
        if not want64 or self.fallback is not None:
            outs, _ = self.forward(inputs, False)
            note = "declared dtypes" if not want64 else f"declared dtypes (float64 failed: {self.fallback})"
        names = self.ref["outputs"]
        if len(outs) != len(names):
            raise Refused(f"the module returned {len(outs)} tensors; the problem names {len(names)} outputs")
        done = []
        for name, o in zip(names, outs):
            t = self.tensors[name]
            o = o.reshape(-1) if o.dim() == 0 else o
            if list(o.shape) != list(t["shape"]) and not (o.numel() == 1 and t["shape"] == [1]):
                raise Refused(f"output {name}: the module returned shape {list(o.shape)}, the problem declares {t['shape']}")
            done.append(o.reshape(t["shape"]).to(torch_dtype(torch, t["dtype"])).contiguous())
        del outs
        return note, done


def tensor_from_bytes(torch, blob, t):
    """A kiln input tensor (bytes, problem dtype and shape) as a torch tensor on the CPU,
    over `blob` itself when it is a bytearray (read_message's blobs are: no copy)."""
    dt = torch_dtype(torch, t["dtype"])
    if not blob:
        return torch.empty(t["shape"], dtype=dt)
    buf = blob if isinstance(blob, bytearray) else bytearray(blob)
    return torch.frombuffer(buf, dtype=dt).reshape(t["shape"])


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
        self.module = None
        if self.op == "module":
            ref = spec["reference"]["torch"]
            self.module = TorchModule(torch, spec, device)
            out = ref["outputs"][0]
            self.inputs_used = [t["name"] for t in spec["tensor"] if t["role"] == "input"]
            kinds = {module_kind(self.module.model)}
            self.variants = [("tf32", True), ("fp32", False)] if "conv" in kinds else \
                variants("matmul", self.tensors[out]["dtype"])
        else:
            out = self.p.get("c") or self.p.get("y") or self.p.get("out")
            self.inputs_used = [v for k, v in self.p.items() if k in names + optional and v != out]
            self.variants = variants(self.op, self.tensors[out]["dtype"])
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.seed = seed
        ns = self.module.ns if self.module is not None else None
        forward = spec["reference"]["torch"]["forward"] if self.module is not None else []
        self.inputs = draw_all(torch, self.tensors, self.inputs_used, self.gen, device, ns, forward, seed)
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
        if self.module is not None:
            model, args = self.module.bind(self.inputs)
            run = torch.compile(model) if self.kind == "torch-compile" else model
            self.call = lambda: run(*args)
            return
        eager = make_call(torch, self.op, self.p, self.inputs)
        self.call = torch.compile(eager) if self.kind == "torch-compile" else eager

    def check(self, index):
        torch = self.torch
        self.use(index)
        with torch.no_grad():
            got = self.call()
            self.sync()
            if self.module is not None:
                want, _ = self.module.forward(self.inputs, f64=True)
                got, want = got if isinstance(got, torch.Tensor) else got[0], want[0]
            else:
                want = make_call(torch, self.op, self.p, {n: x.double() for n, x in self.inputs.items()})()
            diff = got.double() - want.double()
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
        seed = (self.seed + 0x9E3779B97F4A7C15 * (int(index) + 1)) & ((1 << 63) - 1)
        gen.manual_seed(seed)
        ns = self.module.ns if self.module is not None else None
        forward = self.module.ref["forward"] if self.module is not None else []
        fresh = draw_all(self.torch, self.tensors, list(self.inputs), gen, self.device, ns, forward, seed)
        for n, x in fresh.items():
            self.inputs[n].copy_(x)
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
        self.modules = {}

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

    def reference(self, req, blobs):
        torch = self.need_torch()
        spec = req["problem"]
        if not (spec.get("reference") or {}).get("torch"):
            raise Refused("the problem has no [reference.torch]")
        module = self.module_for(spec)
        inputs_spec = [t for t in spec["tensor"] if t["role"] == "input"]
        if len(blobs) != len(inputs_spec):
            raise Refused(f"{len(blobs)} input blobs for {len(inputs_spec)} inputs")
        inputs = {}
        for t, blob in zip(inputs_spec, blobs):
            want = 1
            for d in t["shape"]:
                want *= d
            if len(blob) != want * torch.empty((), dtype=torch_dtype(torch, t["dtype"])).element_size():
                raise Refused(f"input {t['name']}: {len(blob)} bytes do not match its shape and dtype")
            inputs[t["name"]] = tensor_from_bytes(torch, blob, t).to(self.device)
        try:
            return module.reference(inputs)
        finally:
            del inputs
            if self.device == "cuda":
                scrub_cuda(torch)

    def reference_shared(self, req, fds):
        """The reference computed in place in a GPU worker's tensors: `fds` (one per listed
        tensor, inputs then outputs) are mapped for this call only; the outputs are written
        into the worker's memory, then everything is unmapped and torch's cache scrubbed
        before the answer, so nothing of this call stays reachable."""
        torch = self.need_torch()
        if self.device != "cuda":
            raise Refused("shared tensors need a runner on a GPU")
        spec = req["problem"]
        if not (spec.get("reference") or {}).get("torch"):
            raise Refused("the problem has no [reference.torch]")
        listed = req.get("tensors") or []
        by_name = {t["name"]: t for t in spec["tensor"]}
        order = [t["name"] for t in spec["tensor"] if t["role"] == "input"] + [
            t["name"] for t in spec["tensor"] if t["role"] == "output"]
        if [t.get("name") for t in listed] != order or len(fds) != len(order):
            raise Refused(f"shared tensors {[t.get('name') for t in listed]} do not match the problem's {order}")
        import time

        module = self.module_for(spec)
        t0 = time.perf_counter()
        shared = SharedTensors(torch, fds, [int(t["mapped"]) for t in listed])
        ms = {"map": (time.perf_counter() - t0) * 1e3}
        try:
            t0 = time.perf_counter()
            views = {}
            for i, name in enumerate(order):
                views[name] = shared.tensor(i, by_name[name])
            inputs = {n: views[n] for n in order if by_name[n]["role"] == "input"}
            dests = {n: views[n] for n in order if by_name[n]["role"] == "output"}
            answer = module.reference_into(inputs, dests)
            del inputs, dests, views
            ms["compute"] = (time.perf_counter() - t0) * 1e3
        finally:
            # The scrub first, while the worker's memory is still mapped (it touches only
            # torch's own blocks), then the unmap: scripts/probe-shared-scrub.py measures
            # both orders.
            try:
                t0 = time.perf_counter()
                parts = scrub_cuda(torch)
                ms["scrub"] = (time.perf_counter() - t0) * 1e3
                ms.update({f"scrub_{k}": v for k, v in parts.items()})
            finally:
                t0 = time.perf_counter()
                shared.close()
                ms["unmap"] = (time.perf_counter() - t0) * 1e3
        # Where the call's time went, for kilnd's log (milliseconds).
        answer["ms"] = {k: round(v, 3) for k, v in ms.items()}
        return answer, []

    def inputs_shared(self, req, fds):
        """The problem's own inputs for one input set: its file's get_inputs() run on the
        GPU with torch seeded from the set's secret seed, each listed forward argument
        written into the worker's tensor (mapped for this call only), then everything
        unmapped and torch's cache zeroed."""
        import time

        torch = self.need_torch()
        if self.device != "cuda":
            raise Refused("inputs from get_inputs() are made on a runner with a GPU")
        spec = req["problem"]
        ref = (spec.get("reference") or {}).get("torch")
        if not ref:
            raise Refused("the problem has no [reference.torch]")
        listed = req.get("tensors") or []
        by_name = {t["name"]: t for t in spec["tensor"]}
        order = [t["name"] for t in spec["tensor"]
                 if t["role"] == "input" and (t.get("init") or {}).get("dist") == "get_inputs"]
        if [t.get("name") for t in listed] != order or len(fds) != len(order):
            raise Refused(f"shared tensors {[t.get('name') for t in listed]} are not the problem's get_inputs() inputs {order}")
        module = self.module_for(spec)
        seed = int(req["seed"]) & ((1 << 63) - 1)
        t0 = time.perf_counter()
        shared = SharedTensors(torch, fds, [int(t["mapped"]) for t in listed])
        try:
            made = problem_inputs(torch, module.ns, ref["forward"], seed, "cuda")
            for i, name in enumerate(order):
                x = made.get(name)
                if not isinstance(x, torch.Tensor):
                    raise Refused(f"get_inputs() gave no tensor for {name}")
                dest = shared.tensor(i, by_name[name])
                if x.numel() != dest.numel():
                    raise Refused(f"get_inputs() gave {name} of shape {list(x.shape)}; the problem declares {list(dest.shape)}")
                dest.copy_(x.reshape(dest.shape).to(dest.dtype))
                del x, dest
            del made
            torch.cuda.synchronize()
        finally:
            try:
                scrub_cuda(torch)
            finally:
                shared.close()
        return {"ms": {"all": round((time.perf_counter() - t0) * 1e3, 3)}}, []

    def module_for(self, spec):
        key = reference_key(spec)
        module = self.modules.get(key)
        if module is None:
            if len(self.modules) >= 8:
                self.modules.clear()
            module = self.modules[key] = TorchModule(self.torch, spec, self.device)
        return module

    def handle(self, req, blobs, fds=()):
        cmd = req.get("cmd")
        if cmd == "reference_shared":
            return self.reference_shared(req, fds)
        if cmd == "inputs_shared":
            return self.inputs_shared(req, fds)
        if cmd == "hello":
            return self.hello(req), []
        torch = self.need_torch()
        if cmd == "baseline":
            self.baseline = None
            torch.cuda.empty_cache() if self.device == "cuda" else None
            self.baseline = Baseline(torch, self.device, req["problem"], req.get("kind"), int(req.get("seed", 0)))
            return {"variants": self.baseline.describe()}, []
        if cmd == "reference":
            return self.reference(req, blobs)
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


def reference_key(spec):
    import hashlib

    ref = spec["reference"]["torch"]
    doc = json.dumps([spec["name"], ref, spec["tensor"]], sort_keys=True)
    return hashlib.blake2b(doc.encode(), digest_size=16).hexdigest()


def scrub_cuda(torch, release=False):
    """Zeroes every block torch's caching allocator holds but no tensor uses: nothing the
    reference computed stays in memory (kiln's rule). The zeroed blocks stay cached for the
    next call (giving GiBs back and allocating them again costs more than the call itself
    on large problems; the allocator frees them by itself when it runs short), unless
    `release`."""
    import time

    t0 = time.perf_counter()
    segments = torch.cuda.memory_snapshot()
    t1 = time.perf_counter()
    blocks = zeroed = 0
    for seg in segments:
        addr = seg["address"]
        for block in seg.get("blocks", []):
            if block.get("state") == "inactive" and block.get("size", 0) > 0:
                zero_device_range(torch, addr, block["size"])
                blocks += 1
                zeroed += block["size"]
            addr += block.get("size", 0)
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    if release:
        torch.cuda.empty_cache()
    # Where a scrub's time goes (milliseconds), for kilnd's debug log.
    return {"snapshot": (t1 - t0) * 1e3, "launch": (t2 - t1) * 1e3, "wait": (t3 - t2) * 1e3,
            "blocks": blocks, "mib": zeroed / 2**20}


def zero_device_range(torch, ptr, size):
    class Span:
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    torch.as_tensor(Span(), device="cuda").zero_()


def serve():
    # Unbuffered: a request may be followed by descriptors on the socket (SCM_RIGHTS), which
    # a buffered reader would swallow with the bytes around them.
    proto_in = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    proto_out = sys.stdout.buffer
    # Whatever the code we run prints goes to the log, not into the protocol.
    sys.stdout = sys.stderr
    server = Server()
    while True:
        try:
            req, blobs = read_message(proto_in)
        except EOFError:
            return 0
        fds = []
        try:
            if isinstance(req, dict) and req.get("cmd") in ("reference_shared", "inputs_shared"):
                # Taken off the stream before anything can refuse the request.
                fds = recv_fds(sys.stdin.fileno(), len(req.get("tensors") or []))
            body, out = server.handle(req, blobs, fds)
        except Refused as e:
            body, out = {"error": str(e)}, []
        except Exception as e:  # noqa: BLE001 - report, never crash the caller
            body, out = {"error": f"{type(e).__name__}: {e}"}, []
        finally:
            for fd in fds:
                os.close(fd)
        write_message(proto_out, body, out)


def recv_fds(fd, n):
    """The `n` descriptors kiln sent after a message on the socket `fd`: marker bytes with
    SCM_RIGHTS, at most FDS_MAX descriptors each, in order (the Rust side:
    kiln_protocol::fds). Anything else is refused, and whatever arrived is closed."""
    import socket

    if not 1 <= n <= FDS_TOTAL_MAX:
        raise Refused(f"{n} descriptors announced; 1 to {FDS_TOTAL_MAX} may follow a message")
    got = []
    with socket.socket(fileno=os.dup(fd)) as sock:
        while len(got) < n:
            want = min(FDS_MAX, n - len(got))
            msg, fds, flags, _ = socket.recv_fds(sock, 1, FDS_MAX)
            if msg != FDS_MARKER or len(fds) != want or flags & socket.MSG_CTRUNC:
                for x in got + list(fds):
                    os.close(x)
                raise Refused(f"expected {want} descriptors after a marker, received {len(fds)} with {msg!r}")
            got.extend(fds)
    return got


class CudaDriver:
    """The few CUDA driver calls that map another process's exported memory (ctypes on
    libcuda: torch has no API for it)."""

    POSIX_FD = 1
    LOCATION_DEVICE = 1
    READ_WRITE = 3

    def __init__(self):
        import ctypes

        class Location(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

        class AccessDesc(ctypes.Structure):
            _fields_ = [("location", Location), ("flags", ctypes.c_int)]

        self.ctypes, self.Location, self.AccessDesc = ctypes, Location, AccessDesc
        lib = ctypes.CDLL("libcuda.so.1")
        u64, size, ptr = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
        sigs = {
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), ptr, ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size, size, u64, u64],
            "cuMemMap": [u64, size, size, u64, u64],
            "cuMemSetAccess": [u64, size, ctypes.POINTER(AccessDesc), size],
            "cuMemUnmap": [u64, size],
            "cuMemAddressFree": [u64, size],
            "cuMemRelease": [u64],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, args in sigs.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, ctypes.c_int
            setattr(self, name, f)

    def check(self, what, code):
        if code != 0:
            name = self.ctypes.c_char_p()
            self.cuGetErrorName(code, self.ctypes.byref(name))
            raise RuntimeError(f"{what}: {(name.value or b'CUDA error %d' % code).decode()}")

    def access(self, device):
        return self.AccessDesc(self.Location(self.LOCATION_DEVICE, device), self.READ_WRITE)


_DRIVER = None


def cuda_driver():
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = CudaDriver()
    return _DRIVER


class SharedTensors:
    """A GPU worker's exported allocations mapped into this process for one call (torch's
    device 0 is the lane's GPU: CUDA_VISIBLE_DEVICES names it alone)."""

    def __init__(self, torch, fds, sizes):
        self.torch = torch
        self.cu = cuda_driver()
        ct = self.cu.ctypes
        self.maps = []
        torch.zeros(1, device="cuda")  # the primary context exists and is current
        dev = ct.c_int()
        self.cu.check("cuDeviceGet", self.cu.cuDeviceGet(ct.byref(dev), torch.cuda.current_device()))
        try:
            for fd, size in zip(fds, sizes):
                handle = ct.c_ulonglong()
                self.cu.check("cuMemImportFromShareableHandle", self.cu.cuMemImportFromShareableHandle(
                    ct.byref(handle), ct.c_void_p(fd), CudaDriver.POSIX_FD))
                ptr = ct.c_ulonglong()
                code = self.cu.cuMemAddressReserve(ct.byref(ptr), size, 0, 0, 0)
                if code != 0:
                    self.cu.cuMemRelease(handle.value)
                    self.cu.check("cuMemAddressReserve", code)
                code = self.cu.cuMemMap(ptr.value, size, 0, handle.value, 0)
                if code != 0:
                    self.cu.cuMemAddressFree(ptr.value, size)
                    self.cu.cuMemRelease(handle.value)
                    self.cu.check("cuMemMap", code)
                self.maps.append((ptr.value, size, handle.value))
                desc = self.cu.access(dev.value)
                self.cu.check("cuMemSetAccess", self.cu.cuMemSetAccess(ptr.value, size, ct.byref(desc), 1))
        except BaseException:
            self.close()
            raise

    def tensor(self, i, t):
        """Mapping `i` as the kiln tensor `t` (its bytes come first in the allocation)."""
        torch = self.torch
        ptr, size, _ = self.maps[i]
        dt = torch_dtype(torch, t["dtype"])
        numel = 1
        for d in t["shape"]:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dt).element_size()
        if nbytes > size:
            raise Refused(f"{t['name']}: {nbytes} bytes do not fit its {size}-byte mapping")

        class Span:
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

        return torch.as_tensor(Span(), device="cuda").view(dt).reshape(t["shape"])

    def close(self):
        """Waits for every use, then unmaps and releases every mapping (once)."""
        if self.maps:
            self.torch.cuda.synchronize()
        while self.maps:
            ptr, size, handle = self.maps.pop()
            self.cu.cuMemUnmap(ptr, size)
            self.cu.cuMemAddressFree(ptr, size)
            self.cu.cuMemRelease(handle)


# ---- describe: what `kiln problems import kernelbench` needs of one file ----------------

# Random ops that make a forward pass non-deterministic (refused: kiln compares runs).
RANDOM_OPS = ("bernoulli", "dropout", "native_dropout", "rand", "randn", "randint", "randperm", "normal",
              "uniform", "exponential", "geometric", "cauchy", "log_normal", "multinomial", "rrelu")
KILN_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
               "int64": "i64", "uint8": "u8", "bool": "u8"}


class Dist:
    """What kiln knows of how a tensor was made: a distribution kiln can draw, a constant,
    or a reason it cannot say."""

    def __init__(self, kind, a=0.0, b=1.0, why=""):
        self.kind, self.a, self.b, self.why = kind, a, b, why

    def init(self):
        if self.kind == "normal":
            return {"dist": "normal", "mean": self.a, "std": self.b}
        if self.kind == "uniform":
            return {"dist": "uniform", "low": self.a, "high": self.b}
        if self.kind == "randint":
            return {"dist": "randint", "low": int(self.a), "high": int(self.b)}
        if self.kind == "const":
            # A constant (norm affine terms: ones/zeros) drawn around its value, so a kernel that
            # ignores the parameter fails.
            return {"dist": "uniform", "low": self.a - 0.5, "high": self.a + 0.5}
        return None


def scalar(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Provenance:
    """A TorchFunctionMode that records, for every tensor made while it is active, the
    distribution it was drawn from (factories, in-place inits, affine maps by scalars)."""

    def __init__(self, torch):
        from torch.overrides import TorchFunctionMode

        prov = self
        self.torch = torch
        self.dist = {}
        self.keep = []

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                try:
                    prov.record(func, args, kwargs, out)
                except Exception:  # noqa: BLE001 - provenance is best effort
                    pass
                return out

        self.mode = Mode()

    def of(self, t):
        return self.dist.get(id(t))

    def set(self, t, d):
        self.dist[id(t)] = d
        self.keep.append(t)

    def record(self, func, args, kwargs, out):
        torch = self.torch
        name = getattr(func, "__name__", "")
        if not isinstance(out, torch.Tensor):
            return
        first = args[0] if args else None
        if getattr(func, "__module__", "") == "torch.nn.init":
            d = self.init_dist(name, args, kwargs)
            if d is not None:
                self.set(out, d)
            return
        if name in ("rand", "rand_like"):
            self.set(out, Dist("uniform", 0.0, 1.0))
        elif name in ("randn", "randn_like"):
            self.set(out, Dist("normal", 0.0, 1.0))
        elif name in ("randint", "randint_like"):
            nums = [a for a in args if scalar(a)]
            lo, hi = (0, nums[0]) if len(nums) == 1 else (nums[0], nums[1])
            self.set(out, Dist("randint", lo, hi))
        elif name in ("ones", "ones_like"):
            self.set(out, Dist("const", 1.0))
        elif name in ("zeros", "zeros_like"):
            self.set(out, Dist("const", 0.0))
        elif name in ("tensor", "as_tensor") and args and scalar(args[0]):
            self.set(out, Dist("const", float(args[0])))
        elif name in ("full", "full_like") and len(args) >= 2 and scalar(args[1]):
            self.set(out, Dist("const", float(args[1])))
        elif name == "uniform_":
            lo = args[1] if len(args) > 1 else kwargs.get("a", kwargs.get("from", 0.0))
            hi = args[2] if len(args) > 2 else kwargs.get("b", kwargs.get("to", 1.0))
            self.set(out, Dist("uniform", float(lo), float(hi)))
        elif name == "normal_":
            mean = args[1] if len(args) > 1 else kwargs.get("mean", 0.0)
            std = args[2] if len(args) > 2 else kwargs.get("std", 1.0)
            self.set(out, Dist("normal", float(mean), float(std)))
        elif name in ("fill_", "ones_", "zeros_", "zero_"):
            v = 1.0 if name == "ones_" else 0.0 if name in ("zeros_", "zero_") else args[1]
            if scalar(v):
                self.set(out, Dist("const", float(v)))
        elif name in ("float", "double", "half", "bfloat16", "long", "int", "bool", "to", "contiguous",
                      "clone", "detach", "requires_grad_", "cpu", "cuda"):
            if isinstance(first, torch.Tensor) and self.of(first) is not None:
                self.set(out, self.of(first))
        elif name in ("__mul__", "__rmul__", "mul", "__add__", "__radd__", "add", "__sub__", "sub",
                      "__rsub__", "__truediv__", "div", "__neg__", "neg"):
            self.affine(name, args, out)
        elif isinstance(first, torch.Tensor) and self.of(first) is not None and out is not first:
            self.set(out, Dist("unknown", why=f"a tensor made by {name}() from a drawn one"))

    def init_dist(self, name, args, kwargs):
        """The distribution a torch.nn.init function draws (layers' default initialisers)."""
        import math

        init = self.torch.nn.init
        t = kwargs["tensor"] if "tensor" in kwargs else args[0]

        def arg(i, key, default):
            # handle_torch_function passes nn.init's arguments by keyword.
            return kwargs[key] if key in kwargs else args[i] if len(args) > i else default

        if name == "uniform_":
            return Dist("uniform", float(arg(1, "a", 0.0)), float(arg(2, "b", 1.0)))
        if name == "normal_":
            return Dist("normal", float(arg(1, "mean", 0.0)), float(arg(2, "std", 1.0)))
        if name in ("ones_", "zeros_", "constant_"):
            return Dist("const", 1.0 if name == "ones_" else 0.0 if name == "zeros_" else float(arg(1, "val", 0.0)))
        if name in ("kaiming_uniform_", "kaiming_normal_"):
            a = float(arg(1, "a", 0.0))
            fan = init._calculate_correct_fan(t, arg(2, "mode", "fan_in"))
            std = init.calculate_gain(arg(3, "nonlinearity", "leaky_relu"), a) / math.sqrt(fan)
            if name == "kaiming_normal_":
                return Dist("normal", 0.0, std)
            return Dist("uniform", -math.sqrt(3.0) * std, math.sqrt(3.0) * std)
        if name in ("xavier_uniform_", "xavier_normal_"):
            fan_in, fan_out = init._calculate_fan_in_and_fan_out(t)
            std = float(arg(1, "gain", 1.0)) * math.sqrt(2.0 / float(fan_in + fan_out))
            if name == "xavier_normal_":
                return Dist("normal", 0.0, std)
            return Dist("uniform", -math.sqrt(3.0) * std, math.sqrt(3.0) * std)
        return Dist("unknown", why=f"initialised by torch.nn.init.{name}")

    def affine(self, name, args, out):
        torch = self.torch
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        nums = [a for a in args if scalar(a)]
        if len(tensors) > 1 and any(self.of(t) is not None for t in tensors):
            op = name.strip("_").removeprefix("r")
            self.set(out, Dist("unknown", why=f"the {op} of two tensors, at least one of them drawn"))
            return
        if len(tensors) != 1 or self.of(tensors[0]) is None:
            return
        d = self.of(tensors[0])
        k = float(nums[0]) if nums else 0.0
        if name in ("__neg__", "neg"):
            scale, shift = -1.0, 0.0
        elif name in ("__mul__", "__rmul__", "mul"):
            scale, shift = k, 0.0
        elif name in ("__truediv__", "div"):
            scale, shift = (1.0 / k if k else 0.0), 0.0
        elif name in ("__add__", "__radd__", "add"):
            scale, shift = 1.0, k
        elif name in ("__sub__", "sub"):
            scale, shift = 1.0, -k
        else:  # __rsub__: k - x
            scale, shift = -1.0, k
        if d.kind == "normal":
            self.set(out, Dist("normal", d.a * scale + shift, abs(d.b * scale)))
        elif d.kind in ("uniform", "const"):
            lo, hi = sorted((d.a * scale + shift, d.b * scale + shift))
            self.set(out, Dist(d.kind, lo, hi) if d.kind == "uniform" else Dist("const", d.a * scale + shift))
        elif d.kind == "unknown":
            self.set(out, d)
        else:
            self.set(out, Dist("unknown", why=f"{d.kind} values mapped by {name.strip('_')} {k:g}"))


def identifier(name, taken):
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "t"
    if out[0].isdigit():
        out = "t_" + out
    base, i = out, 2
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


def tensor_desc(torch, name, t, dist, role, from_file=False):
    """A tensor's description. An input kiln cannot draw: from the file's own get_inputs()
    when it is a forward argument (`from_file`: made on the GPU by kiln's runner under a
    secret seed), else refused."""
    dtype = KILN_DTYPES.get(str(t.dtype).replace("torch.", ""))
    if dtype is None:
        raise Refused(f"tensor {name} has dtype {t.dtype}, which kiln has no type for")
    shape = list(t.shape) or [1]
    d = {"name": name, "dtype": dtype, "shape": shape, "role": role}
    if role == "input":
        init = dist.init() if dist is not None else None
        if init is None and from_file:
            why = dist.why if dist is not None else "it was not made by a random factory kiln knows"
            d["init"] = {"dist": "get_inputs"}
            d["shifted_trial"] = False
            d["bool"] = t.dtype == torch.bool
            d["source"] = "get_inputs"
            d["why"] = why
            return d
        if init is None:
            why = dist.why if dist is not None else "it was not made by a random factory kiln knows"
            raise Refused(f"input {name}: kiln cannot draw its distribution ({why})")
        if t.dtype == torch.bool:
            init = {"dist": "randint", "low": 0, "high": 2}
        elif not t.is_floating_point() and init["dist"] != "randint":
            raise Refused(f"integer input {name} is not drawn by randint")
        d["init"] = init
        d["shifted_trial"] = bool(t.is_floating_point()) and dist.kind in ("normal", "uniform")
        d["bool"] = t.dtype == torch.bool
        d["source"] = "const" if dist.kind == "const" else "drawn"
    return d


def describe(path, run_limit_bytes, run_limit_flops=4 * 10**9, tol=(1e-4, 1e-4)):
    import inspect

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    source = open(path, encoding="utf-8").read()
    ns = load_model_code(source, "import")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(ns.get(fn)):
            raise Refused(f"the file defines no {fn}()")
    init_inputs = ns["get_init_inputs"]()
    try:
        init_json = json.dumps(list(init_inputs))
    except TypeError:
        raise Refused("get_init_inputs() returns something that is not plain data (ints, floats, lists)") from None
    prov = Provenance(torch)
    real_param = torch.nn.Parameter.__new__

    def tracked_param(cls, data=None, requires_grad=True):
        p = real_param(cls, data, requires_grad)
        if data is not None and prov.of(data) is not None:
            prov.set(p, prov.of(data))
        return p

    torch.nn.Parameter.__new__ = tracked_param
    try:
        with torch.device("meta"), prov.mode:
            inputs = ns["get_inputs"]()
            model = ns["Model"](*as_args(json.loads(init_json)))
    finally:
        torch.nn.Parameter.__new__ = real_param
    if not isinstance(inputs, (list, tuple)):
        raise Refused("get_inputs() does not return a list")
    scalars = (bool, int, float)
    if not all(isinstance(x, (torch.Tensor,) + scalars) for x in inputs):
        raise Refused("get_inputs() returns a Python value that is neither a tensor nor a number or bool")
    if any(isinstance(x, float) and not math.isfinite(x) for x in inputs):
        raise Refused("get_inputs() returns a Python float that is not finite")
    if any(isinstance(x, scalars) for x in inputs):
        # A number forward takes is a constant of the problem: the same on every call.
        with torch.device("meta"):
            again = ns["get_inputs"]()
        if len(again) != len(inputs) or any(
                isinstance(a, scalars) and (type(a) is not type(b) or a != b)
                for a, b in zip(inputs, again)):
            raise Refused("get_inputs() returns a Python number that changes from call to call "
                          "(kiln passes such a value as a constant)")
    taken = set()
    try:
        names = [p for p in inspect.signature(model.forward).parameters]
    except (TypeError, ValueError):
        names = []
    if len(names) != len(inputs) or any(inspect.signature(model.forward).parameters[n].kind
                                         in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
                                         for n in names):
        names = [f"in{i}" for i in range(len(inputs))]
    tensors, forward, state, bools, constants = [], [], {}, [], {}
    for n, x in zip(names, inputs):
        kn = identifier(n, taken)
        forward.append(kn)
        if isinstance(x, scalars):
            constants[kn] = x
            continue
        d = tensor_desc(torch, kn, x, prov.of(x), "input", from_file=True)
        tensors.append(d)
    kept_buffers = []
    params = {n for n, _ in model.named_parameters()}
    for pname, p in list(model.named_parameters()) + [(b, t) for b, t in model.named_buffers() if t.is_floating_point()]:
        dist = prov.of(p)
        if pname not in params and (dist is None or dist.init() is None):
            # A buffer made from no draw (a causal mask: `tril(ones).view(...)`) is a
            # constant of the module, not data: the module keeps its own, and it is not an
            # input a candidate is handed.
            kept_buffers.append(pname)
            continue
        kn = identifier(pname.replace(".", "_"), taken)
        d = tensor_desc(torch, kn, p, dist, "input")
        d["parameter"] = pname
        state[pname] = kn
        tensors.append(d)
    for d in tensors:
        if d.pop("bool", False):
            bools.append(d["name"])
    # Shapes, random ops and flops from a forward pass on the meta device.
    seen_ops = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen_ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter, Ops():
            out = model(*inputs)
    except Refused:
        raise
    except Exception as e:  # noqa: BLE001 - the reason is the answer
        raise Refused(f"the forward pass cannot run on the meta device, so its output shapes "
                      f"depend on the data or an op has no meta kernel ({type(e).__name__}: {str(e)[:200]})") from None
    random = sorted({o for o in seen_ops if o.strip("_") in RANDOM_OPS})
    if random:
        raise Refused(f"random ops in forward ({', '.join(random)}): the output differs run to run")
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise Refused("forward returns something that is not a tensor or a tuple of tensors")
    outputs = []
    for i, o in enumerate(outs):
        kn = identifier("out" if len(outs) == 1 else f"out{i}", taken)
        tensors.append(tensor_desc(torch, kn, o, None, "output"))
        outputs.append(kn)
    nbytes = 0
    for d in tensors:
        n = 1
        for s in d["shape"]:
            n *= s
        nbytes += n * {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1}[d["dtype"]]
    doc = (inspect.getdoc(ns["Model"]) or "").strip().splitlines()
    result = {
        "tensors": tensors,
        "forward": forward,
        "constants": constants,
        "state": state,
        "outputs": outputs,
        "bool_tensors": bools,
        "init_inputs": init_json,
        "flops": int(counter.get_total_flops()),
        "min_bytes": nbytes,
        "summary": doc[0] if doc else "",
        "kept_buffers": kept_buffers,
        "output_max_abs": None,
        "output_note": "",
    }
    if nbytes <= run_limit_bytes and result["flops"] <= run_limit_flops:
        result.update(output_magnitude(torch, ns, init_json, tensors, forward, state, bools, outputs, tol,
                                       constants))
    else:
        result["output_note"] = (f"not run here ({nbytes} bytes of tensors, {result['flops']} flops; the limits are "
                                 f"{run_limit_bytes} bytes and {run_limit_flops} flops: --run-limit-bytes, "
                                 "--run-limit-flops)")
    return result


def output_magnitude(torch, ns, init_json, tensors, forward, state, bools, outputs, tol, constants=None):
    """Runs the module once on the CPU, on inputs drawn as kiln would, for the outputs' size."""
    spec = {"name": "import", "tensor": tensors,
            "reference": {"torch": {"source": "", "forward": forward, "state": state, "outputs": outputs,
                                    "init_inputs": init_json, "bool_tensors": bools,
                                    "constants": constants or {}}}}
    gen = torch.Generator()
    gen.manual_seed(1)
    names = [t["name"] for t in tensors if t["role"] == "input"]
    inputs = draw_all(torch, {t["name"]: t for t in tensors}, names, gen, "cpu", ns, forward, 1)
    torch.manual_seed(0)
    mod = TorchModule.__new__(TorchModule)
    mod.torch, mod.device, mod.ref = torch, "cpu", spec["reference"]["torch"]
    mod.tensors = {t["name"]: t for t in tensors}
    mod.model = ns["Model"](*as_args(json.loads(init_json)))
    mod.model64, mod.precision, mod.fallback, mod.bools = None, "declared", None, set(bools)
    outs, _ = mod.forward(inputs, False)
    m = max(float(o.abs().max()) if o.numel() else 0.0 for o in outs)
    # Outputs small enough that a zero passes the tolerance the problem gets (atol, rtol):
    # |0 - w| <= atol + rtol * |w| when |w| <= atol / (1 - rtol).
    atol, rtol = tol
    bound = atol / (1 - rtol) if rtol < 1 else float("inf")
    small = sum(int((o.abs() <= bound).sum()) for o in outs)
    total = sum(o.numel() for o in outs) or 1
    return {"output_max_abs": m, "zero_passes": small / total, "output_note": "one CPU run on kiln-drawn inputs"}


def describe_main(argv):
    limit, flops, atol, rtol = 256 << 20, 4 * 10**9, 1e-4, 1e-4
    files = []
    it = iter(argv)
    for a in it:
        if a == "--run-limit-bytes":
            limit = int(next(it))
        elif a == "--run-limit-flops":
            flops = int(next(it))
        elif a == "--atol":
            atol = float(next(it))
        elif a == "--rtol":
            rtol = float(next(it))
        else:
            files.append(a)
    sys.stdout, out = sys.stderr, sys.stdout
    for path in files:
        try:
            r = describe(path, limit, flops, (atol, rtol))
        except Refused as e:
            r = {"refused": str(e)}
        except Exception as e:  # noqa: BLE001 - the reason is the answer
            r = {"refused": f"the file failed to load or run: {type(e).__name__}: {str(e)[:300]}"}
        r["file"] = path
        out.write(json.dumps(r) + "\n")
        out.flush()
    return 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "serve":
        return serve()
    if len(argv) >= 2 and argv[0] == "describe":
        return describe_main(argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
