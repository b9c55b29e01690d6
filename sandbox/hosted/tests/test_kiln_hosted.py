"""Tests of sandbox/hosted/kiln_hosted.py, the hosted runner.

The framing tests and the refusal of a device the runner lacks need no torch (stdlib
only). The rest start the runner with KILN_PYTHON (a python with torch) as kiln's worker
does: descriptors 3-6 (go, done, fault, a memfd with every buffer), a setup message, then
one-byte commands; this process writes the inputs into the memfd and reads the outputs
with struct, so it needs no torch itself. Those runners are all started in setUpClass, as
many side by side as there are CPUs (torch's import dominates), and each test then drives
its own, already loaded.
"""

import importlib.util
import json
import math
import mmap
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "kiln_hosted.py")
FRAMING_SPEC = os.path.join(HERE, "..", "..", "protocol", "framing.json")
spec = importlib.util.spec_from_file_location("kiln_hosted", SCRIPT)
hosted = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hosted)

PAGE = 4096
FORMATS = {"f32": "f", "f64": "d", "i32": "i", "i64": "q", "u8": "B"}
# Moves the four prepared descriptors onto 3, 4, 5, 6 (as the worker does between fork and
# exec), then execs the runner.
TRAMPOLINE = """import fcntl, os, sys
src = [int(a) for a in sys.argv[1:5]]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in src]
for fd in src:
    os.close(fd)
for target, fd in zip((3, 4, 5, 6), high):
    os.dup2(fd, target)
    os.close(fd)
os.execv(sys.argv[5], sys.argv[5:])
"""


def torch_python():
    """(KILN_PYTHON, None) when it names a python with torch, else (None, why not)."""
    python = os.environ.get("KILN_PYTHON")
    if not python:
        return None, "KILN_PYTHON is not set (a python with torch runs the hosted runner)"
    if not os.access(python, os.X_OK):
        return None, f"KILN_PYTHON={python} is not an executable"
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    if subprocess.run([python, "-I", "-c", probe], capture_output=True).returncode != 0:
        return None, f"KILN_PYTHON={python} has no torch"
    return python, None


def read_exact(fd, n, deadline):
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"no answer from the runner ({len(buf)} of {n} bytes)")
        part = os.read(fd, n - len(buf))
        if not part:
            raise EOFError
        buf += part
    return buf


class Runner:
    """One hosted runner, started as kiln's worker starts it (minus the jail)."""

    def __init__(self, source, tensors, forward, outputs, state=None, bools=(), init="[]", slots=1,
                 device="cpu", python=None):
        self.dir = tempfile.mkdtemp(prefix="kiln-hosted-test-")
        path = os.path.join(self.dir, "candidate.py")
        with open(path, "w") as f:
            f.write(source)
        # The worker's layout: each buffer on a page boundary, a guard page after it.
        self.tensors, offset = {}, 0
        for name, dtype, shape, role in tensors:
            n = math.prod(shape)
            size = n * struct.calcsize(FORMATS[dtype])
            self.tensors[name] = {"name": name, "dtype": dtype, "shape": shape, "role": role,
                                  "offset": offset, "bytes": size}
            offset += -(-max(size, 1) // PAGE) * PAGE + PAGE
        self.slot_bytes, self.slots = offset, slots
        total = offset * slots
        self.mem = os.memfd_create("kiln-hosted-test")
        os.ftruncate(self.mem, total)
        self.map = mmap.mmap(self.mem, total)
        go_r, self.go = os.pipe()
        self.done, done_w = os.pipe()
        self.fault, fault_w = os.pipe()
        self.capture = tempfile.TemporaryFile()
        child = (go_r, done_w, fault_w, self.mem)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", TRAMPOLINE, *map(str, child),
             python or sys.executable, "-I", "-B", SCRIPT, "serve"],
            stdin=subprocess.DEVNULL, stdout=self.capture, stderr=subprocess.STDOUT, pass_fds=child,
            cwd=self.dir)
        for fd in (go_r, done_w, fault_w):
            os.close(fd)
        self.setup = {
            "source": path, "device": device, "map_len": total, "slots": slots, "slot_bytes": offset,
            "tensors": list(self.tensors.values()), "forward": forward, "outputs": outputs,
            "state": state or {}, "bool_tensors": list(bools), "init_inputs": init, "threads": 1,
            "unknown_key": "ignored",
        }
        hosted.write_message(self.go, self.setup)

    def ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        (n,) = struct.unpack("<I", read_exact(self.done, 4, deadline))
        env = json.loads(read_exact(self.done, n, deadline))
        assert env["blobs"] == 0, env
        return env["body"]

    def where(self, slot, name):
        t = self.tensors[name]
        return FORMATS[t["dtype"]], t["offset"] + slot * self.slot_bytes, math.prod(t["shape"])

    def put(self, slot, name, values):
        fmt, at, n = self.where(slot, name)
        assert len(values) == n
        struct.pack_into(f"<{n}{fmt}", self.map, at, *values)

    def get(self, slot, name):
        fmt, at, n = self.where(slot, name)
        return list(struct.unpack_from(f"<{n}{fmt}", self.map, at))

    def command(self, cmd, timeout=60):
        """Sends `cmd`; its answer (b"D"), or b"" when the runner closed `done` instead."""
        os.write(self.go, cmd)
        try:
            return read_exact(self.done, 1, time.monotonic() + timeout)
        except EOFError:
            return b""

    def wait(self, timeout=60):
        return self.proc.wait(timeout)

    def output(self):
        self.capture.seek(0)
        return self.capture.read().decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.go, self.done, self.fault, self.mem):
            try:
                os.close(fd)
            except OSError:
                pass
        self.map.close()
        self.capture.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Framing(unittest.TestCase):
    """kiln's framing, over descriptors, against sandbox/protocol/framing.json."""

    def test_the_module_loads_without_torch(self):
        self.assertNotIn("torch", vars(hosted))
        self.assertTrue(callable(hosted.main))

    def test_framing_matches_the_shared_spec(self):
        with open(FRAMING_SPEC) as f:
            spec = json.load(f)
        self.assertEqual(
            (spec["max_frame"], spec["max_frames_per_blob"], spec["max_blobs"]),
            (hosted.MAX_FRAME, hosted.MAX_FRAMES_PER_BLOB, hosted.MAX_BLOBS))

        def through_pipe(write):
            r, w = os.pipe()
            try:
                write(w)
            finally:
                os.close(w)
            return r

        for v in spec["messages"]:
            with self.subTest(v["name"]):
                blobs = [bytes.fromhex(b) for b in v["blobs_hex"]]
                r = through_pipe(lambda w: hosted.write_message(w, v["body"], blobs, max_frame=v["max_frame"]))
                got = os.read(r, 1 << 16)
                os.close(r)
                self.assertEqual(got.hex(), v["stream_hex"])
                r = through_pipe(lambda w: os.write(w, bytes.fromhex(v["stream_hex"])))
                body, read = hosted.read_message(r, max_frame=v["max_frame"])
                os.close(r)
                self.assertEqual(body, v["body"])
                self.assertEqual([bytes(b) for b in read], blobs)
        for v in spec["refused"]:
            with self.subTest(v["name"]):
                r = through_pipe(lambda w: os.write(w, bytes.fromhex(v["stream_hex"])))
                with self.assertRaises((ValueError, EOFError)):
                    hosted.read_message(r, max_frame=v["max_frame"])
                os.close(r)


class NoTorchNeeded(unittest.TestCase):
    def test_an_unknown_device_is_refused_before_torch_is_imported(self):
        # This python need not have torch: the answer comes before torch's import.
        r = Runner("raise SystemExit('never imported')\n", [("x", "f32", [2], "input"), ("y", "f32", [2], "output")],
                   ["x"], ["y"], device="tpu")
        try:
            self.assertEqual(r.ready(timeout=30),
                             {"missing": [], "error": "hosted runner: unknown device 'tpu'"})
            self.assertEqual(r.wait(), 0)
        finally:
            r.close()


DOUBLE = """
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        assert isinstance(scale, int)
        self.scale = scale

    def forward(self, x):
        print("forward ran")
        return x * self.scale
"""

LINEAR = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        self.register_buffer("shift", torch.zeros(n_out))
        self.register_buffer("own", torch.ones(1))  # a buffer of its own: allowed, kept

    def forward(self, x):
        return self.linear(x) + self.shift * self.own
"""

TUPLE_BOOL = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x, mask):
        if mask.dtype != torch.bool:
            raise TypeError(f"mask is {mask.dtype}")
        return torch.where(mask, x, torch.zeros_like(x)), mask.sum()
"""

MISMATCH = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(12))
        self.extra = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return x
"""

NO_MODELNEW = """
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x
"""

IMPORT_RAISES = """
import torch

def helper():
    raise RuntimeError("no kernels for you")

helper()
"""

FORWARD_RAISES = """
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        raise ValueError("boom in forward")
"""

WRONG_SHAPE = """
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x[:1]
"""

XY = [("x", "f32", [3, 4], "input"), ("y", "f32", [3, 4], "output")]

# name -> the runner's arguments (all started in setUpClass).
CASES = {
    "double": dict(source=DOUBLE, tensors=XY, forward=["x"], outputs=["y"], init="[2]", slots=3),
    "linear": dict(source=LINEAR, tensors=[("x", "f32", [2, 3], "input"), ("w", "f32", [4, 3], "input"),
                                           ("b", "f32", [4], "input"), ("s", "f32", [4], "input"),
                                           ("y", "f32", [2, 4], "output")],
                   forward=["x"], outputs=["y"], init="[3, 4]", slots=2,
                   state={"linear.weight": "w", "linear.bias": "b", "shift": "s"}),
    # The same layer and buffer under other names: paired by creation order, as
    # KernelBench's seeding lets such answers pass.
    "renamed": dict(source=LINEAR.replace("self.linear", "self.fc").replace('"shift"', '"offset"')
                    .replace("self.shift", "self.offset"),
                    tensors=[("x", "f32", [2, 3], "input"), ("w", "f32", [4, 3], "input"),
                             ("b", "f32", [4], "input"), ("s", "f32", [4], "input"),
                             ("y", "f32", [2, 4], "output")],
                    forward=["x"], outputs=["y"], init="[3, 4]", slots=1,
                    state={"linear.weight": "w", "linear.bias": "b", "shift": "s"}),
    "tuple_bool": dict(source=TUPLE_BOOL, tensors=[("x", "f32", [2, 3], "input"), ("mask", "u8", [2, 3], "input"),
                                                   ("y", "f32", [2, 3], "output"), ("count", "i64", [1], "output")],
                       forward=["x", "mask"], outputs=["y", "count"], bools=["mask"]),
    "mismatch": dict(source=MISMATCH, tensors=XY + [("w", "f32", [16], "input"), ("lw", "f32", [4], "input")],
                     forward=["x"], outputs=["y"], state={"w": "w", "linear.weight": "lw"}),
    "no_modelnew": dict(source=NO_MODELNEW, tensors=XY, forward=["x"], outputs=["y"]),
    "import_raises": dict(source=IMPORT_RAISES, tensors=XY, forward=["x"], outputs=["y"]),
    "forward_raises": dict(source=FORWARD_RAISES, tensors=XY, forward=["x"], outputs=["y"]),
    "wrong_shape": dict(source=WRONG_SHAPE, tensors=XY, forward=["x"], outputs=["y"]),
}


class HostedRunner(unittest.TestCase):
    runners = {}
    readies = {}

    @classmethod
    def setUpClass(cls):
        python, why = torch_python()
        if python is None:
            raise unittest.SkipTest(why)
        # Loading in parallel past the CPUs only slows every runner down.
        pending, loading = list(CASES.items()), []
        width = max(2, os.cpu_count() or 1)
        try:
            while pending or loading:
                while pending and len(loading) < width:
                    name, args = pending.pop(0)
                    cls.runners[name] = Runner(python=python, **args)
                    loading.append(name)
                name = loading.pop(0)
                cls.readies[name] = cls.runners[name].ready()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for r in cls.runners.values():
            r.close()
        cls.runners.clear()
        cls.readies.clear()

    def ready(self, name):
        """The runner `name` and its ready message."""
        return self.runners[name], self.readies[name]

    def assert_ok(self, r, ready):
        self.assertEqual(ready, {"missing": [], "error": None, "notes": []}, r.output())

    def test_double_on_slots_with_t_g_e_q(self):
        r, ready = self.ready("double")
        self.assert_ok(r, ready)
        xs = [[float(j * 100 + i) for i in range(12)] for j in range(3)]
        for j in range(3):
            r.put(j, "x", xs[j])
            r.put(j, "y", [-1.0] * 12)
        self.assertEqual(r.command(b"T\x02"), b"D")
        self.assertEqual(r.get(0, "y"), [2 * v for v in xs[0]])
        self.assertEqual(r.get(1, "y"), [2 * v for v in xs[1]])
        self.assertEqual(r.get(2, "y"), [-1.0] * 12, "T 2 runs slots 0 and 1 only")
        # G: slot 0 alone, on the inputs written since.
        r.put(0, "x", [0.5] * 12)
        r.put(1, "y", [-1.0] * 12)
        self.assertEqual(r.command(b"G"), b"D")
        self.assertEqual(r.get(0, "y"), [1.0] * 12)
        self.assertEqual(r.get(1, "y"), [-1.0] * 12)
        # E: nothing runs.
        r.put(0, "y", [-1.0] * 12)
        self.assertEqual(r.command(b"E"), b"D")
        self.assertEqual(r.get(0, "y"), [-1.0] * 12)
        self.assertEqual(r.command(b"Q"), b"D")
        self.assertEqual(r.wait(), 0)
        self.assertIn("forward ran", r.output())

    def test_linear_parameters_and_buffers_are_kilns_per_slot(self):
        r, ready = self.ready("linear")
        self.assert_ok(r, ready)
        for j in range(2):
            x = [0.5 * i - 1 + j for i in range(6)]
            w = [0.25 * ((i * 7 + j) % 5) - 0.5 for i in range(12)]
            b = [1.0 + j, -2.0, 0.5, 3.0 * j]
            s = [0.125 * j, 0.0, -1.0, 2.0]
            for name, v in (("x", x), ("w", w), ("b", b), ("s", s)):
                r.put(j, name, v)
        self.assertEqual(r.command(b"T\x02"), b"D")
        for j in range(2):
            x, w, b, s = (r.get(j, n) for n in ("x", "w", "b", "s"))
            want = [sum(x[row * 3 + k] * w[o * 3 + k] for k in range(3)) + b[o] + s[o]
                    for row in range(2) for o in range(4)]
            got = r.get(j, "y")
            for g, v in zip(got, want):
                self.assertAlmostEqual(g, v, places=5, msg=f"slot {j}: {got} != {want}")
        # EOF on go: exit 0.
        os.close(r.go)
        r.go = -1
        self.assertEqual(r.wait(), 0)

    def test_renamed_parameters_are_paired_by_creation_order_with_a_note(self):
        r, ready = self.ready("renamed")
        self.assertEqual((ready["missing"], ready["error"]), ([], None), r.output())
        self.assertEqual(len(ready["notes"]), 1, ready)
        self.assertIn("fc.weight<-linear.weight", ready["notes"][0])
        self.assertIn("offset<-shift", ready["notes"][0])
        x = [0.5 * i - 1 for i in range(6)]
        w = [0.25 * ((i * 7) % 5) - 0.5 for i in range(12)]
        b, s = [1.0, -2.0, 0.5, 3.0], [0.0, 0.0, -1.0, 2.0]
        for name, v in (("x", x), ("w", w), ("b", b), ("s", s)):
            r.put(0, name, v)
        self.assertEqual(r.command(b"G"), b"D")
        want = [sum(x[row * 3 + k] * w[o * 3 + k] for k in range(3)) + b[o] + s[o]
                for row in range(2) for o in range(4)]
        for g, v in zip(r.get(0, "y"), want):
            self.assertAlmostEqual(g, v, places=5)

    def test_tuple_outputs_and_a_bool_tensor(self):
        r, ready = self.ready("tuple_bool")
        self.assert_ok(r, ready)
        r.put(0, "x", [1.5, 2.5, 3.5, 4.5, 5.5, 6.5])
        r.put(0, "mask", [1, 0, 1, 0, 0, 1])
        r.put(0, "count", [-7])
        self.assertEqual(r.command(b"G"), b"D", r.output())
        self.assertEqual(r.get(0, "y"), [1.5, 0.0, 3.5, 0.0, 0.0, 6.5])
        self.assertEqual(r.get(0, "count"), [3], "a 0-d result fills kiln's [1]")

    def test_a_parameter_kiln_does_not_set_is_named(self):
        r, ready = self.ready("mismatch")
        self.assertEqual(sorted(ready["missing"]), sorted([
            "no parameter or buffer 'linear.weight'",
            "parameter 'w' has 12 elements, kiln's tensor 'w' has 16",
            "parameter 'extra' is not one of the problem's",
        ]))
        for name in ("linear.weight", "'w'", "'extra'"):
            self.assertIn(name, ready["error"])
        self.assertEqual(r.wait(), 0)

    def test_no_modelnew_is_a_ready_error(self):
        r, ready = self.ready("no_modelnew")
        self.assertEqual(ready["missing"], [])
        self.assertIn("no ModelNew", ready["error"])
        self.assertEqual(r.wait(), 0)

    def test_an_import_that_raises_is_a_ready_error_with_the_exception(self):
        r, ready = self.ready("import_raises")
        self.assertEqual(ready["missing"], [])
        self.assertIn("RuntimeError: no kernels for you", ready["error"])
        self.assertIn("candidate.py", ready["error"], "the traceback's last lines")
        self.assertLessEqual(len(ready["error"]), 2 * hosted.ERROR_CHARS)
        self.assertEqual(r.wait(), 0)

    def test_forward_raising_exits_1_with_its_traceback(self):
        r, ready = self.ready("forward_raises")
        self.assert_ok(r, ready)
        self.assertEqual(r.command(b"G"), b"", "no D")
        self.assertEqual(r.wait(), 1)
        out = r.output()
        self.assertIn("Traceback", out)
        self.assertIn("ValueError: boom in forward", out)

    def test_a_wrong_output_shape_exits_3_with_a_kiln_line(self):
        r, ready = self.ready("wrong_shape")
        self.assert_ok(r, ready)
        self.assertEqual(r.command(b"G"), b"", "no D")
        self.assertEqual(r.wait(), 3)
        lines = [ln for ln in r.output().splitlines() if ln.startswith("kiln: ")]
        self.assertTrue(lines, r.output())
        self.assertIn("output y", lines[0])
        self.assertIn("[1, 4]", lines[0])


# Drives keep_builds in a python with torch, with load_inline replaced by a fake that
# "builds" <name>.so holding its source (no compiler, no ninja needed) and load_prebuilt by
# one that reads it back.
KEEP_BUILDS = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import kiln_hosted as h
import torch
import torch.utils.cpp_extension as ext

tmp = sys.argv[2]
def fake(name, cpp_sources, cuda_sources=None, functions=None, verbose=False,
         build_directory=None, is_python_module=True):
    d = build_directory or os.path.join(tmp, "default", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name + ".so"), "w") as f:
        f.write(str(cpp_sources))
    return ["built", name, d]
h.load_prebuilt = lambda torch, name, path, module: ["prebuilt", open(path).read(), module]
record = os.path.join(tmp, "record")
out = {}
ext.load_inline = fake
out["build_notes"] = h.keep_builds(torch, record=record)
from torch.utils.cpp_extension import load_inline
out["a"] = load_inline("ops", "int a;", verbose=True)
out["a_kw"] = load_inline(name="ops", cpp_sources="int a;")
out["b"] = load_inline("ops", "int b;", is_python_module=False)
out["keys"] = sorted(os.listdir(record))
flat = os.path.join(tmp, "flat")
os.makedirs(flat)
for key in os.listdir(record):
    for f in os.listdir(os.path.join(record, key)):
        os.rename(os.path.join(record, key, f), os.path.join(flat, h.prebuilt_name(key, f[:-3])))
ext.load_inline = fake
out["run_notes"] = h.keep_builds(torch, prebuilt=flat)
out["a_run"] = ext.load_inline("ops", "int a;")
out["b_run"] = ext.load_inline(name="ops", cpp_sources="int b;", is_python_module=False)
out["c_run"] = ext.load_inline("ops", "int c;")
ext.load_inline = fake
h.keep_builds(torch, prebuilt=os.path.join(tmp, "nothing"))
out["none_run"] = ext.load_inline("ops", "int a;")
print(json.dumps(out))
"""


class KeptBuilds(unittest.TestCase):
    def test_a_load_inline_built_at_compile_is_loaded_at_run_by_its_arguments(self):
        python, why = torch_python()
        if python is None:
            self.skipTest(why)
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([python, "-I", "-c", KEEP_BUILDS, os.path.dirname(SCRIPT), tmp],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            out = json.loads(p.stdout.strip().splitlines()[-1])
            record = os.path.join(tmp, "record")
            # At compile: each call builds into record/<hash of its arguments>; the same
            # call by position or by keyword (verbose aside) is the same key.
            # (The worker writes them flat, as kiln-prebuilt-<key>-<name>.so.)
            self.assertEqual(len(out["keys"]), 2, out)
            self.assertEqual(out["a"][2], out["a_kw"][2])
            self.assertNotEqual(out["a"][2], out["b"][2])
            for k in out["keys"]:
                self.assertRegex(k, "^[0-9a-f]{32}$")
            self.assertEqual(os.path.dirname(out["a"][2]), record)
            self.assertEqual(len(out["build_notes"]), 3)
            # At run: a call compile built is loaded from there, as a module or a library
            # as it asked; a call it did not build is built now, and says so.
            self.assertEqual(out["a_run"], ["prebuilt", "int a;", True])
            self.assertEqual(out["b_run"], ["prebuilt", "int b;", False])
            self.assertEqual(out["c_run"][0], "built")
            self.assertEqual(out["none_run"][0], "built")
            notes = out["run_notes"]
            self.assertEqual(sum("loaded from kiln's cache" in n for n in notes), 2, notes)
            self.assertEqual(sum("not built at compile" in n for n in notes), 1, notes)


    def test_a_gpu_lanes_build_sees_cuda_so_a_guarded_build_runs(self):
        python, why = torch_python()
        if python is None:
            self.skipTest(why)
        with tempfile.TemporaryDirectory() as tmp:
            seen = os.path.join(tmp, "seen")
            source = os.path.join(tmp, "candidate.py")
            with open(source, "w") as f:
                f.write("import torch\n"
                        f"open({seen!r}, 'a').write(str(torch.cuda.is_available()) + '\\n')\n"
                        "class ModelNew(torch.nn.Module):\n    pass\n")
            record = os.path.join(tmp, "record")
            os.makedirs(record)
            for arch, want in (("9.0", "True"), ("", "False")):
                env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
                env["CUDA_VISIBLE_DEVICES"] = ""
                if arch:
                    env["TORCH_CUDA_ARCH_LIST"] = arch
                p = subprocess.run([python, "-I", SCRIPT, "build", source, record, "[]"],
                                   capture_output=True, text=True, timeout=300, env=env)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(seen) as f:
                    # A GPU lane's build (an architecture given) answers True; a CPU
                    # lane's build leaves torch as it is (no GPU here: False).
                    self.assertEqual(f.read().split()[-1], want, p.stdout)


class PrecompiledHeader(unittest.TestCase):
    def test_gch_precompiles_torchs_extension_header_and_a_build_uses_it(self):
        python, why = torch_python()
        if python is None:
            self.skipTest(why)
        path = os.pathsep.join([os.path.dirname(python), os.environ.get("PATH", "")])
        if shutil.which("ninja", path=path) is None:
            self.skipTest("no ninja beside KILN_PYTHON or on PATH (torch's probe build needs it)")
        cxx = os.environ.get("CXX", "c++")
        if shutil.which(cxx, path=path) is None:
            self.skipTest(f"no {cxx} (the host compiler) on PATH")
        env = dict(os.environ, PATH=path, CUDA_VISIBLE_DEVICES="")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "gch")
            # kiln's own text only: a trivial probe build gives torch's flags.
            p = subprocess.run([python, "-I", "-B", SCRIPT, "gch", out], capture_output=True,
                               text=True, timeout=600, env=dict(env, TMPDIR=tmp))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            gch = os.path.join(out, "torch", "extension.h.gch")
            self.assertTrue(os.path.isfile(gch), p.stdout)
            self.assertGreater(os.path.getsize(gch), 0)
            self.assertIn("kiln gch: ", p.stdout)
            self.assertNotIn("TORCH_EXTENSION_NAME", p.stdout)
            # A file as load_inline writes it, compiled with the same flags and CPATH set:
            # GCC reports the header it used with "! " (a valid .gch).
            flags = next(line for line in p.stdout.splitlines()
                         if line.startswith("kiln gch: ") and "c++-header" in line).split()
            flags = flags[flags.index("c++-header") + 1:flags.index("-o") - 1]
            main = os.path.join(tmp, "main.cpp")
            with open(main, "w") as f:
                f.write("#include <torch/extension.h>\nint twice(int x) { return 2 * x; }\n")
            c = subprocess.run([cxx, "-DTORCH_EXTENSION_NAME=kiln_probe_two", *flags, "-H",
                                "-fsyntax-only", main], capture_output=True, text=True,
                               timeout=600, env=dict(env, CPATH=out))
            self.assertEqual(c.returncode, 0, c.stderr[-2000:])
            used = [line for line in c.stderr.splitlines() if line.startswith("! ")]
            self.assertTrue(used and used[0].endswith(gch), c.stderr[:2000])


if __name__ == "__main__":
    unittest.main()
