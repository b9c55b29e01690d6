"""Tests of sandbox/hosted/kiln_hosted.py, the hosted runner, and kiln_record.py, its R recorder.

The framing tests and the refusal of a device the runner lacks need no torch (stdlib
only). The rest start the runner with KILN_PYTHON (a python with torch) as kiln's worker
does: descriptors 3-6 (go, done, fault, a memfd with every buffer), a setup message, then
one-byte commands; this process writes the inputs into the memfd and reads the outputs
with struct, so it needs no torch itself. Those runners are all started in setUpClass, as
many side by side as there are CPUs (torch's import dominates), and each test then drives
its own, already loaded.
"""

import ctypes
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


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hosted = load("kiln_hosted", SCRIPT)
# R's recorder (the runner imports it from its own folder).
RECORD = os.path.join(HERE, "..", "kiln_record.py")
record = load("kiln_record", RECORD)

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
                 device="cpu", python=None, script=SCRIPT):
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
             python or sys.executable, "-I", "-B", script, "serve"],
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
        return self.message(timeout)

    def message(self, timeout=60):
        """The next message on `done` (its body)."""
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
    # R on the cpu: forward runs as after G, unrecorded, with its regions.
    "record": dict(source=LINEAR, tensors=[("x", "f32", [2, 3], "input"), ("w", "f32", [4, 3], "input"),
                                           ("b", "f32", [4], "input"), ("s", "f32", [4], "input"),
                                           ("y", "f32", [2, 4], "output")],
                   forward=["x"], outputs=["y"], init="[3, 4]",
                   state={"linear.weight": "w", "linear.bias": "b", "shift": "s"}),
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

    def test_r_on_the_cpu_runs_forward_unrecorded_and_answers_in_place_of_d(self):
        r, ready = self.ready("record")
        self.assert_ok(r, ready)
        x = [0.5 * i - 1 for i in range(6)]
        w = [0.25 * ((i * 7) % 5) - 0.5 for i in range(12)]
        b, s = [1.0, -2.0, 0.5, 3.0], [0.0, 0.25, -1.0, 2.0]
        for name, v in (("x", x), ("w", w), ("b", b), ("s", s), ("y", [-1.0] * 8)):
            r.put(0, name, v)
        os.write(r.go, b"R")
        answer = r.message()  # after the run is finished; no D follows (the worker reads the answer)
        self.assertEqual(answer["error"], "launches are recorded on the GPU only")
        self.assertEqual((answer["ops"], answer["triton"], answer["allocations"]), ([], [], []))
        self.assertEqual([(g["name"], g["role"], g["bytes"]) for g in answer["regions"]],
                         [("x", "input", 24), ("w", "weight", 48), ("b", "weight", 16),
                          ("s", "buffer", 16), ("y", "output", 32)])
        regions = {g["name"]: g for g in answer["regions"]}
        self.assertTrue(regions["y"]["contiguous"])
        self.assertTrue(all(isinstance(g["ptr"], int) and g["ptr"] > 0 for g in answer["regions"]))
        self.assertNotEqual(regions["s"]["ptr"], regions["b"]["ptr"])
        want = [sum(x[row * 3 + k] * w[o * 3 + k] for k in range(3)) + b[o] + s[o]
                for row in range(2) for o in range(4)]
        for g, v in zip(r.get(0, "y"), want):
            self.assertAlmostEqual(g, v, places=5)
        # The runner goes on as before.
        r.put(0, "y", [-1.0] * 8)
        self.assertEqual(r.command(b"G"), b"D")
        for g, v in zip(r.get(0, "y"), want):
            self.assertAlmostEqual(g, v, places=5)

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


# ---- R's recorder, without a GPU: its pure parts on ctypes-built parameter structs ------


class RecorderDeployment(unittest.TestCase):
    """kiln writes kiln_record.py beside kiln_hosted.py (sandbox/src/engine/hosted.rs,
    write_files); R imports it from the script's folder, on the cpu too."""

    def r_on_the_cpu(self, files):
        """The R answer of a cpu runner whose script sits in a folder with `files` only,
        and the runner (still serving)."""
        python, why = torch_python()
        if python is None:
            self.skipTest(why)
        folder = tempfile.mkdtemp(prefix="kiln-hosted-deploy-")
        self.addCleanup(shutil.rmtree, folder, True)
        for f in files:
            shutil.copy(os.path.join(HERE, "..", f), folder)
        r = Runner(python=python, script=os.path.join(folder, "kiln_hosted.py"), **CASES["record"])
        self.addCleanup(r.close)
        self.assertEqual(r.ready(), {"missing": [], "error": None, "notes": []}, r.output())
        for name, n in (("x", 6), ("w", 12), ("b", 4), ("s", 4)):
            r.put(0, name, [0.5] * n)
        r.put(0, "y", [-1.0] * 8)
        os.write(r.go, b"R")
        answer = r.message()
        # forward ran either way, and the runner goes on serving.
        self.assertEqual(r.get(0, "y"), [0.5 * 3 * 0.5 + 0.5 + 0.5] * 8)
        self.assertEqual(r.command(b"G"), b"D", r.output())
        self.assertEqual(r.command(b"Q"), b"D")
        self.assertEqual(r.wait(), 0, r.output())
        return answer

    def test_without_the_recorder_beside_the_script_r_answers_an_error_naming_it(self):
        answer = self.r_on_the_cpu(["kiln_hosted.py"])
        self.assertTrue(answer["error"].startswith("no recorder (kiln_record.py) beside the runner: "), answer)
        self.assertIn("kiln_record", answer["error"])
        self.assertEqual((answer["ops"], answer["triton"], answer["regions"], answer["allocations"]),
                         ([], [], [], []))

    def test_with_the_recorder_beside_the_script_r_answers_the_cpu_recording(self):
        answer = self.r_on_the_cpu(["kiln_hosted.py", "kiln_record.py"])
        self.assertEqual(answer["error"], "launches are recorded on the GPU only")
        self.assertEqual([(g["name"], g["role"]) for g in answer["regions"]],
                         [("x", "input"), ("w", "weight"), ("b", "weight"), ("s", "buffer"), ("y", "output")])


def buf(data):
    """A C buffer holding `data` (kept alive by the caller) and its address."""
    b = ctypes.create_string_buffer(bytes(data), len(data))
    return b, ctypes.addressof(b)


def pointers(*objects):
    """A void* array pointing at each ctypes object (a launch's `args`), and its address."""
    arr = (ctypes.c_void_p * max(1, len(objects)))(*[ctypes.addressof(o) for o in objects])
    return arr, ctypes.addressof(arr)


class FakeKernels:
    """What a Decoder asks CUDA for, answered from dicts."""

    def __init__(self, functions=None, infos=None, names=None):
        self.functions, self.infos, self.names = functions or {}, infos or {}, names or {}
        self.asked = []

    def function(self, stub):
        self.asked.append(stub)
        if stub not in self.functions:
            raise record.RecordError("no kernel")
        return self.functions[stub]

    def params(self, f):
        return self.infos[f]

    def name(self, f):
        return self.names.get(f)


class FakeTensor:
    def __init__(self, ptr, n, size, contiguous=True):
        self.ptr, self.n, self.size, self.contiguous = ptr, n, size, contiguous

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.n

    def element_size(self):
        return self.size

    def is_contiguous(self):
        return self.contiguous


class RecorderHelpers(unittest.TestCase):
    """The decoding of CUPTI's callback data, on structs built here as the CUDA 13 headers
    lay them out (the struct classes are kiln_record.py's; RecorderLayouts checks them
    against the headers where a C compiler and the headers are at hand)."""

    def setUp(self):
        self.keep = []

    def c(self, obj):
        self.keep.append(obj)
        return obj

    def symbol(self, text):
        b, at = buf(text.encode() + b"\0")
        self.keep.append(b)
        return at

    def args(self, *values):
        self.keep.extend(values)
        arr, at = pointers(*values)
        self.keep.append(arr)
        return at

    def test_names(self):
        self.assertEqual(record.api_name("cudaLaunchKernel_ptsz_v7000"), "cudaLaunchKernel")
        self.assertEqual(record.api_name("cuMemcpyHtoD_v2_ptds"), "cuMemcpyHtoD")
        self.assertEqual(record.api_name("cuLaunchKernelEx"), "cuLaunchKernelEx")
        self.assertEqual(record.layout_key("cudaLaunchKernelExC_ptsz_v11060"), "cudaLaunchKernelExC")
        self.assertEqual(record.layout_key("cuMemsetD8_v2_ptds"), "cuMemsetD8_v2")
        self.assertEqual(record.layout_key("cuMemAlloc"), "cuMemAlloc", "the 32-bit v1 keeps its name")
        kinds = {"cudaLaunchCooperativeKernel": "launch", "cuLaunchKernelEx": "launch",
                 "cudaMemsetAsync": "memset", "cuMemsetD2D8Async": "memset", "cudaMemcpy3D": "copy",
                 "cudaDeviceSynchronize": "sync", "cuStreamSynchronize": "sync", "cudaMalloc": "alloc",
                 "cuMemAllocPitch": "alloc", "cudaGraphLaunch": "other", "cuStreamWaitEvent": "other",
                 "cudaEventRecord": "event", "cudaGraphAddMemcpyNode": None, "cudaFuncSetAttribute": None,
                 "cudaGetLastError": None, "cudaStreamQuery": None, "cudaEventQuery": None}
        for api, kind in kinds.items():
            self.assertEqual(record.op_kind(api), kind, api)

    def test_streams(self):
        current = 0x55aa0000
        for handle, want in ((current, "current"), (None, "current"), (0, "current"), (1, "current"),
                             (2, "current"), (0x55aa0100, "other")):
            self.assertEqual(record.stream_kind(handle, current), want, hex(handle or 0))
        self.assertEqual(record.stream_kind(0x1000, 0), "other")

    def test_a_runtime_launch_reads_its_kernel_dimensions_and_parameter_bytes(self):
        ptr, n, scale = ctypes.c_uint64(0x7F0C0BA00000), ctypes.c_int32(-5), ctypes.c_float(1.5)
        p = self.c(record.RtLaunch(func=0x1234, gridDim=record.Dim3(2112, 1, 1),
                                   blockDim=record.Dim3(256, 2, 1), args=self.args(ptr, n, scale),
                                   sharedMem=48, stream=0x77))
        kernels = FakeKernels({0x1234: 0xF00}, {0xF00: [(0, 8), (8, 4), (12, 4)]})
        op = record.Decoder(0x77, kernels).enter("cudaLaunchKernel_v7000", ctypes.addressof(p),
                                                 self.symbol("_Z4geluPKfPfi"))
        self.assertEqual(op, {
            "op": "launch", "api": "cudaLaunchKernel", "symbol": "_Z4geluPKfPfi",
            "grid": [2112, 1, 1], "block": [256, 2, 1], "shared_bytes": 48, "stream": "current",
            "cooperative": False, "cluster": None,
            "params": [{"offset": 0, "size": 8, "hex": "0000a00b0c7f0000"},
                       {"offset": 8, "size": 4, "hex": struct.pack("<i", -5).hex()},
                       {"offset": 12, "size": 4, "hex": struct.pack("<f", 1.5).hex()}]})
        self.assertEqual(kernels.asked, [0x1234])
        p.stream = 0x99
        op = record.Decoder(0x77, kernels).enter("cudaLaunchCooperativeKernel_ptsz_v9000",
                                                 ctypes.addressof(p), self.symbol("k"))
        self.assertEqual((op["api"], op["stream"], op["cooperative"]), ("cudaLaunchCooperativeKernel", "other", True))

    def test_a_runtime_launch_of_an_unknown_stub_waits_for_its_driver_launch(self):
        p = self.c(record.RtLaunch(func=0x1, args=0))
        op = record.Decoder(0, FakeKernels()).enter("cudaLaunchKernel_v7000", ctypes.addressof(p), self.symbol("k"))
        self.assertEqual((op["symbol"], op["params"], op["_unresolved"]), ("k", None, "no kernel"))

    def test_a_driver_launch_with_an_extra_parameter_buffer(self):
        blob = struct.pack("<Qi4xd", 0xDEAD0000, 7, 2.5)
        b, b_at = buf(blob)
        size = ctypes.c_size_t(len(blob))
        extra = self.c((ctypes.c_void_p * 5)(1, b_at, 2, ctypes.addressof(size), 0))
        self.keep += [b, size]
        p = self.c(record.DrvLaunch(f=0xABC, gridDimX=4, gridDimY=3, gridDimZ=2, blockDimX=32, blockDimY=1,
                                    blockDimZ=1, sharedMemBytes=1024, hStream=2, kernelParams=None,
                                    extra=ctypes.addressof(extra)))
        kernels = FakeKernels(infos={0xABC: [(0, 8), (8, 4), (16, 8)]}, names={0xABC: "_Z3fooPfid"})
        op = record.Decoder(0x10, kernels).enter("cuLaunchKernel_ptsz", ctypes.addressof(p), None)
        self.assertEqual(op["symbol"], "_Z3fooPfid", "the CUfunction's name when CUPTI gives none")
        self.assertEqual((op["api"], op["grid"], op["block"], op["shared_bytes"], op["stream"]),
                         ("cuLaunchKernel", [4, 3, 2], [32, 1, 1], 1024, "current"))
        self.assertEqual([x["hex"] for x in op["params"]],
                         [blob[0:8].hex(), blob[8:12].hex(), blob[16:24].hex()])
        self.assertEqual(kernels.asked, [], "a driver launch gives its CUfunction")

    def test_launch_configurations_give_cooperative_and_cluster(self):
        attrs = self.c((record.LaunchAttribute * 3)())
        attrs[0].id = 1  # an access policy window: not read
        attrs[1].id = record.LAUNCH_ATTRIBUTE_COOPERATIVE
        attrs[1].value.cooperative = 1
        attrs[2].id = record.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[2].value.clusterDim = record.Dim3(2, 1, 1)
        config = self.c(record.DrvLaunchConfig(gridDimX=8, gridDimY=1, gridDimZ=1, blockDimX=128, blockDimY=1,
                                               blockDimZ=1, sharedMemBytes=0, hStream=0x4242,
                                               attrs=ctypes.addressof(attrs), numAttrs=3))
        x = ctypes.c_int64(-1)
        p = self.c(record.DrvLaunchEx(config=ctypes.addressof(config), f=0x5, kernelParams=self.args(x)))
        kernels = FakeKernels(infos={0x5: [(0, 8)]})
        op = record.Decoder(0x4242, kernels).enter("cuLaunchKernelEx", ctypes.addressof(p), self.symbol("tri"))
        self.assertEqual((op["grid"], op["block"], op["stream"], op["cooperative"], op["cluster"]),
                         ([8, 1, 1], [128, 1, 1], "current", True, [2, 1, 1]))
        self.assertEqual(op["params"], [{"offset": 0, "size": 8, "hex": "ff" * 8}])
        # The runtime's cudaLaunchKernelExC, through cudaLaunchConfig_t.
        rt = self.c(record.RtLaunchConfig(gridDim=record.Dim3(3, 2, 1), blockDim=record.Dim3(64, 1, 1),
                                          dynamicSmemBytes=4096, stream=0x9, attrs=ctypes.addressof(attrs),
                                          numAttrs=3))
        q = self.c(record.RtLaunchEx(config=ctypes.addressof(rt), func=0x77, args=self.args(x)))
        kernels = FakeKernels({0x77: 0x5}, {0x5: [(0, 8)]})
        op = record.Decoder(0, kernels).enter("cudaLaunchKernelExC_v11060", ctypes.addressof(q), self.symbol("k2"))
        self.assertEqual((op["api"], op["grid"], op["shared_bytes"], op["stream"], op["cooperative"], op["cluster"]),
                         ("cudaLaunchKernelExC", [3, 2, 1], 4096, "other", True, [2, 1, 1]))
        attrs[1].value.cooperative = 0
        self.assertEqual(record.launch_attributes(ctypes.addressof(attrs), 3), (False, [2, 1, 1]))
        self.assertEqual(record.launch_attributes(None, 0), (None, None))
        with self.assertRaises(record.RecordError):
            record.launch_attributes(ctypes.addressof(attrs), record.MAX_ATTRS + 1)

    def test_parameter_reading_refuses_what_it_cannot_read(self):
        with self.assertRaises(record.RecordError):
            record.launch_params([(0, 8)])  # neither args nor a buffer
        with self.assertRaises(record.RecordError):
            record.launch_params([(0, 8)], buffer=b"\0" * 4)  # past the buffer
        null = self.c((ctypes.c_void_p * 1)(None))
        with self.assertRaises(record.RecordError):
            record.launch_params([(0, 8)], args=ctypes.addressof(null))
        self.assertEqual(record.launch_params([]), [], "a kernel without parameters")
        bad = self.c((ctypes.c_void_p * 3)(7, 1, 0))
        with self.assertRaises(record.RecordError):
            record.extra_buffer(ctypes.addressof(bad))

    def test_memsets_copies_syncs_and_other_work(self):
        d = record.Decoder(0x30, FakeKernels())

        def enter(name, p=None):
            return d.enter(name, ctypes.addressof(self.c(p)) if p is not None else 0)

        self.assertEqual(enter("cudaMemsetAsync_ptsz_v7000", record.RtMemset(count=4096)),
                         {"op": "memset", "api": "cudaMemsetAsync", "bytes": 4096})
        self.assertEqual(enter("cuMemsetD32Async", record.DrvMemset(N=10)),
                         {"op": "memset", "api": "cuMemsetD32Async", "bytes": 40})
        self.assertEqual(enter("cudaMemset2D_v3020", record.RtMemset()), {"op": "memset", "api": "cudaMemset2D"})
        self.assertEqual(enter("cudaMemcpyAsync_v3020", record.RtMemcpy(count=64, kind=2)),
                         {"op": "copy", "api": "cudaMemcpyAsync", "bytes": 64, "kind": "d2h"})
        self.assertEqual(enter("cudaMemcpy_v3020", record.RtMemcpy(count=8, kind=4))["kind"], "default")
        self.assertEqual(enter("cudaMemcpyToSymbolAsync_v3020", record.RtMemcpySymbol(count=16, kind=1)),
                         {"op": "copy", "api": "cudaMemcpyToSymbolAsync", "bytes": 16, "kind": "symbol"})
        self.assertEqual(enter("cudaMemcpy2D_v3020", record.RtMemcpy2D(width=16, height=3, kind=3)),
                         {"op": "copy", "api": "cudaMemcpy2D", "bytes": 48, "kind": "d2d"})
        self.assertEqual(enter("cuMemcpyHtoDAsync_v2_ptsz", record.DrvMemcpy(ByteCount=12)),
                         {"op": "copy", "api": "cuMemcpyHtoDAsync", "bytes": 12, "kind": "h2d"})
        self.assertEqual(enter("cuMemcpyPeer", record.DrvMemcpyPeer(ByteCount=5))["kind"], "d2d")
        self.assertEqual(enter("cuMemcpy3D_v2", record.DrvMemcpy()), {"op": "copy", "api": "cuMemcpy3D", "kind": "unknown"})
        self.assertEqual(enter("cudaDeviceSynchronize_v3020"), {"op": "sync", "api": "cudaDeviceSynchronize"})
        self.assertEqual(enter("cudaGraphLaunch_v10000"), {"op": "other", "api": "cudaGraphLaunch"})
        self.assertIsNone(enter("cudaEventRecord_v3020", record.EventRecordParams(stream=0x30)))
        self.assertIsNone(enter("cuEventRecord", record.EventRecordParams(stream=0)))
        self.assertEqual(enter("cudaEventRecordWithFlags_v11010", record.EventRecordParams(stream=0x31)),
                         {"op": "other", "api": "cudaEventRecordWithFlags"})
        for ignored in ("cudaGetDevice_v3020", "cudaFuncSetAttribute_v9000", "cudaGetErrorString_v3020",
                        "cuCtxGetCurrent", "cudaGraphAddMemcpyNode_v10000", "cudaPeekAtLastError_v3020"):
            self.assertIsNone(enter(ignored), ignored)

    def test_an_allocation_gets_its_pointer_at_the_exit(self):
        d = record.Decoder(0, FakeKernels())
        out = self.c(ctypes.c_uint64(0))
        p = self.c(record.AllocParams(ptr=ctypes.addressof(out), size=1024))
        op = d.enter("cudaMalloc_v3020", ctypes.addressof(p))
        self.assertEqual(op, {"op": "alloc", "api": "cudaMalloc", "ptr": None, "bytes": 1024})
        out.value = 140000000000
        d.exit(op, ctypes.addressof(p), 0)
        self.assertEqual(op, {"op": "alloc", "api": "cudaMalloc", "ptr": 140000000000, "bytes": 1024})
        failed = d.enter("cuMemAlloc_v2", ctypes.addressof(p))
        d.exit(failed, ctypes.addressof(p), 2)
        self.assertEqual(failed, {"op": "alloc", "api": "cuMemAlloc", "bytes": 1024})
        self.assertEqual(d.enter("cuMemAlloc", ctypes.addressof(p)), {"op": "alloc", "api": "cuMemAlloc"},
                         "the 32-bit cuMemAlloc's layout is not read")

    def callback(self, name, site, params=0, symbol=None, status=None):
        data = record.CallbackData(callbackSite=site, functionName=self.symbol(name), functionParams=params,
                                   symbolName=self.symbol(symbol) if symbol else None)
        if status is not None:
            data.functionReturnValue = ctypes.addressof(self.c(ctypes.c_int(status)))
        return self.c(data)

    def test_only_the_outermost_call_of_a_nest_is_recorded(self):
        rec = record.Recorder(None, None, hosted.describe_exception)
        x = ctypes.c_uint64(0x1000)
        p = self.c(record.RtLaunch(func=0x10, gridDim=record.Dim3(1, 1, 1), blockDim=record.Dim3(32, 1, 1),
                                   args=self.args(x)))
        rec.decoder = record.Decoder(0, FakeKernels({0x10: 0x20}, {0x20: [(0, 8)]}))
        inner = self.c(record.DrvLaunch(f=0x20, kernelParams=self.args(x)))
        out = self.c(ctypes.c_uint64(0))
        alloc = self.c(record.AllocParams(ptr=ctypes.addressof(out), size=256))
        enter, leave = record.CUPTI_API_ENTER, 1
        calls = [("cudaLaunchKernel_v7000", enter, ctypes.addressof(p), "_Z1kPf"),
                 ("cuLaunchKernel", enter, ctypes.addressof(inner), "_Z1kPf"),   # the runtime's own
                 ("cuLaunchKernel", leave, ctypes.addressof(inner), None),
                 ("cudaLaunchKernel_v7000", leave, ctypes.addressof(p), None),
                 ("cudaGetLastError_v3020", enter, 0, None),
                 ("cudaGetLastError_v3020", leave, 0, None),
                 ("cudaMalloc_v3020", enter, ctypes.addressof(alloc), None),
                 ("cuMemAlloc_v2", enter, ctypes.addressof(alloc), None),
                 ("cuMemAlloc_v2", leave, ctypes.addressof(alloc), None)]
        for name, site, params, symbol in calls:
            rec.step(self.callback(name, site, params, symbol))
        out.value = 0xBEEF00
        rec.step(self.callback("cudaMalloc_v3020", leave, ctypes.addressof(alloc), status=0))
        self.assertIsNone(rec.error)
        self.assertEqual([(o["op"], o["api"]) for o in rec.ops],
                         [("launch", "cudaLaunchKernel"), ("alloc", "cudaMalloc")])
        self.assertEqual(rec.ops[1], {"op": "alloc", "api": "cudaMalloc", "ptr": 0xBEEF00, "bytes": 256})
        self.assertEqual(rec.threads[rec.thread_id()][0], 0, "every entry matched by its exit")
        # An unexpected failure stops the recording (nothing unwinds into CUDA); the ops
        # so far stay.
        rec.decoder.kernels.infos.clear()
        rec.on_api(None, 2, 0, ctypes.addressof(self.callback("cudaLaunchKernel_v7000", enter,
                                                              ctypes.addressof(p), "_Z1kPf")))
        self.assertIn("recording failed: KeyError", rec.error)
        rec.step(self.callback("cudaLaunchKernel_v7000", leave, ctypes.addressof(p)))
        answer = rec.answer()
        self.assertEqual(list(answer), ["error", "ops", "triton", "regions", "allocations"])
        self.assertEqual(answer["triton"], [], "no triton loaded here: no Triton launch")
        self.assertEqual(len(answer["ops"]), 2)

    def test_more_than_the_op_limit_is_an_error(self):
        rec = record.Recorder(None, None, hosted.describe_exception)
        rec.decoder = record.Decoder(0, FakeKernels())
        rec.ops = [{"op": "sync", "api": "cudaDeviceSynchronize"}] * record.MAX_OPS
        rec.step(self.callback("cudaDeviceSynchronize_v3020", record.CUPTI_API_ENTER))
        self.assertEqual(rec.error, "more than 4096 GPU operations in one forward")
        self.assertEqual(len(rec.ops), record.MAX_OPS)

    def test_regions_and_allocations(self):
        got = record.regions([("x", FakeTensor(1000, 6, 4))], [("w", FakeTensor(2000, 12, 4))],
                             [("running_mean", FakeTensor(3000, 4, 4))],
                             [("out", FakeTensor(4000, 8, 2, contiguous=False))])
        self.assertEqual(got, [
            {"name": "x", "role": "input", "ptr": 1000, "bytes": 24},
            {"name": "w", "role": "weight", "ptr": 2000, "bytes": 48},
            {"name": "running_mean", "role": "buffer", "ptr": 3000, "bytes": 16},
            {"name": "out", "role": "output", "ptr": 4000, "bytes": 16, "contiguous": False}])
        traces = [{"action": "segment_alloc", "addr": 1, "size": 2 << 20},
                  {"action": "alloc", "addr": 140100000000, "size": 512},
                  {"action": "free_requested", "addr": 140100000000, "size": 512},
                  {"action": "alloc", "addr": 140100000512, "size": 1024}]
        self.assertEqual(record.allocations_from(traces),
                         ([{"ptr": 140100000000, "bytes": 512}, {"ptr": 140100000512, "bytes": 1024}], None))
        self.assertIn("overflowed", record.allocations_from(traces, limit=4)[1])

    def test_kernel_parameter_infos_from_the_driver_getters(self):
        def getter(count, handle_ok=True):
            def get(f, i, offset, size):
                if not handle_ok:
                    return 400  # CUDA_ERROR_INVALID_HANDLE
                if i >= count:
                    return record.CUDA_ERROR_INVALID_VALUE
                ctypes.cast(offset, ctypes.POINTER(ctypes.c_size_t))[0] = 8 * i
                ctypes.cast(size, ctypes.POINTER(ctypes.c_size_t))[0] = 8
                return 0
            return get

        self.assertEqual(record.param_list(getter(2), 1), ([(0, 8), (8, 8)], record.CUDA_ERROR_INVALID_VALUE))
        with self.assertRaises(record.RecordError):
            record.param_list(getter(record.MAX_PARAMS + 1), 1)
        k = record.Kernels({"cuFuncGetParamInfo": getter(3)})
        self.assertEqual(k.params(7), [(0, 8), (8, 8), (16, 8)])
        # A CUkernel handle: cuFuncGetParamInfo does not know it, cuKernelGetParamInfo does.
        k = record.Kernels({"cuFuncGetParamInfo": getter(3, False), "cuKernelGetParamInfo": getter(1)})
        self.assertEqual(k.params(7), [(0, 8)])
        self.assertEqual(record.Kernels({"cuFuncGetParamInfo": getter(0)}).params(7), [])
        with self.assertRaises(record.RecordError):
            record.Kernels({"cuFuncGetParamInfo": getter(0, False), "cuKernelGetParamInfo": getter(0, False)}).params(7)


class FakeCupti:
    """CUPTI's and CUDA's functions as the recorder calls them, in Python: a subscription
    keeps the callback so the test can play the CUDA calls of a forward through it."""

    def __init__(self, subscribe_result=0):
        self.subscribe_result = subscribe_result
        self.callback, self.enabled, self.unsubscribed = None, {}, False
        self.names = {39: b"CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"}

    def libs(self):
        return {"cuptiSubscribe": self.subscribe, "cuptiEnableDomain": self.enable,
                "cuptiUnsubscribe": self.unsubscribe, "cuptiGetResultString": self.result_string,
                "cudaGetFuncBySymbol": self.func_by_symbol, "cudaGetLastError": lambda: 0,
                "cuFuncGetParamInfo": self.param_info}

    def subscribe(self, handle, callback, userdata):
        if self.subscribe_result:
            return self.subscribe_result
        handle._obj.value = 0x5B
        self.callback = callback
        return 0

    def enable(self, on, handle, domain):
        self.enabled[domain] = on
        return 0

    def unsubscribe(self, handle):
        self.unsubscribed = True
        return 0

    def result_string(self, rc, text):
        text._obj.value = self.names.get(rc, b"CUPTI_ERROR_UNKNOWN")
        return 0

    def func_by_symbol(self, f, stub):
        f._obj.value = 0xF00 if stub.value == 0x1234 else None
        return 0 if stub.value == 0x1234 else 98

    def param_info(self, f, i, offset, size):
        if f.value != 0xF00 or i >= 1:
            return 1
        offset._obj.value, size._obj.value = 0, 8
        return 0


class FakeTorch:
    """The parts of torch the recorder uses, on a fake device."""

    def __init__(self, traces=None, history_raises=False):
        outer = self
        self.history = []
        self.__file__ = "/nonexistent/site-packages/torch/__init__.py"

        class Memory:
            @staticmethod
            def _record_memory_history(enabled="all", **kwargs):
                if history_raises:
                    raise RuntimeError("no allocator history here")
                outer.history.append(enabled)

            @staticmethod
            def _snapshot():
                return {"device_traces": [traces or []]}

        class Stream:
            cuda_stream = 0x77

        class Cuda:
            memory = Memory

            @staticmethod
            def current_stream():
                return Stream

            @staticmethod
            def current_device():
                return 0

        self.cuda = Cuda


class RecorderSession(unittest.TestCase):
    """The recorder's subscription and its callback, through CFUNCTYPE, with CUPTI and torch
    replaced by fakes (the real ones need a GPU)."""

    def setUp(self):
        self.real = record.cuda_libraries
        self.keep = []

    def tearDown(self):
        record.cuda_libraries = self.real

    def data(self, name, site, params=None, symbol=None):
        name_b = ctypes.create_string_buffer(name.encode())
        sym_b = ctypes.create_string_buffer(symbol.encode()) if symbol else None
        self.keep += [name_b, sym_b]
        d = record.CallbackData(callbackSite=site, functionName=ctypes.addressof(name_b),
                                functionParams=params, symbolName=ctypes.addressof(sym_b) if sym_b else None)
        self.keep.append(d)
        return ctypes.addressof(d)

    def test_a_forward_played_through_the_callback(self):
        cupti = FakeCupti()
        record.cuda_libraries = lambda torch: cupti.libs()
        waited = []
        traces = [{"action": "alloc", "addr": 0x7000, "size": 4096}, {"action": "free_requested", "addr": 0x7000}]
        torch = FakeTorch(traces)
        x = ctypes.c_uint64(0xAB)
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(x))
        launch = record.RtLaunch(func=0x1234, gridDim=record.Dim3(1, 1, 1), blockDim=record.Dim3(64, 1, 1),
                                 args=ctypes.addressof(argv), stream=0x77)
        self.keep += [x, argv, launch]
        with record.Recorder(torch, lambda: waited.append(True), hosted.describe_exception) as rec:
            self.assertEqual(cupti.enabled, {1: 1, 2: 1})
            for site in (0, 1):
                cupti.callback(None, 2, 211, self.data("cudaLaunchKernel_v7000", site, ctypes.addressof(launch),
                                                       "_Z1kPm" if site == 0 else None))
            cupti.callback(None, 2, 165, self.data("cudaDeviceSynchronize_v3020", 0))
            cupti.callback(None, 2, 165, self.data("cudaDeviceSynchronize_v3020", 1))
        self.assertEqual((cupti.enabled, cupti.unsubscribed, waited), ({1: 0, 2: 0}, True, [True]))
        self.assertEqual(torch.history, ["all", None], "the allocator history on, then off")
        answer = rec.answer()
        self.assertEqual(answer["error"], None)
        self.assertEqual(answer["ops"], [
            {"op": "launch", "api": "cudaLaunchKernel", "symbol": "_Z1kPm", "grid": [1, 1, 1],
             "block": [64, 1, 1], "shared_bytes": 0, "stream": "current", "cooperative": False,
             "cluster": None, "params": [{"offset": 0, "size": 8, "hex": "ab00000000000000"}]},
            {"op": "sync", "api": "cudaDeviceSynchronize"}])
        self.assertEqual(answer["allocations"], [{"ptr": 0x7000, "bytes": 4096}])

    def test_a_subscription_refused_is_the_answers_error(self):
        cupti = FakeCupti(subscribe_result=39)
        record.cuda_libraries = lambda torch: cupti.libs()
        with record.Recorder(FakeTorch(history_raises=True), None, hosted.describe_exception) as rec:
            pass
        answer = rec.answer()
        self.assertEqual(answer["error"], "CUPTI: cuptiSubscribe: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.assertEqual((answer["ops"], answer["allocations"]), ([], []))
        self.assertIn("no allocator history here", answer["allocations_error"])
        self.assertFalse(cupti.unsubscribed)

    def test_no_cupti_is_the_answers_error(self):
        def missing(torch):
            raise record.RecordError("no CUPTI: libcupti.so.13: cannot open shared object file")

        record.cuda_libraries = missing
        with record.Recorder(FakeTorch(), None, hosted.describe_exception) as rec:
            pass
        self.assertTrue(rec.answer()["error"].startswith("no CUPTI: "))

    def test_a_runtime_launch_of_an_unknown_stub_with_no_driver_launch_stops_the_recording(self):
        cupti = FakeCupti()
        record.cuda_libraries = lambda torch: cupti.libs()
        launch = record.RtLaunch(func=0x999)
        self.keep.append(launch)
        with record.Recorder(FakeTorch(), None, hosted.describe_exception) as rec:
            cupti.callback(None, 2, 211, self.data("cudaLaunchKernel_ptsz_v7000", 0, ctypes.addressof(launch), "k"))
            cupti.callback(None, 2, 211, self.data("cudaLaunchKernel_ptsz_v7000", 1, ctypes.addressof(launch)))
        self.assertEqual(rec.answer()["error"], "a runtime launch of k could not be read (cudaGetFuncBySymbol "
                                                "found no kernel (cudaError 98)) and made no driver launch under it")

    def test_a_runtime_launch_of_an_unknown_stub_is_read_from_the_driver_launch_under_it(self):
        # An extension's own CUDA runtime registered the stub: this process cannot resolve
        # it, but the runtime's driver launch under the call names the kernel and its
        # parameter array.
        cupti = FakeCupti()
        record.cuda_libraries = lambda torch: cupti.libs()
        x = ctypes.c_uint64(0xCD)
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(x))
        launch = record.RtLaunch(func=0x999, gridDim=record.Dim3(2, 1, 1), blockDim=record.Dim3(32, 1, 1),
                                 args=ctypes.addressof(argv), stream=0x77)
        inner = record.DrvLaunch(f=0xF00, gridDimX=2, gridDimY=1, gridDimZ=1, blockDimX=32, blockDimY=1,
                                 blockDimZ=1, hStream=0x77, kernelParams=ctypes.addressof(argv))
        self.keep += [x, argv, launch, inner]
        with record.Recorder(FakeTorch(), None, hosted.describe_exception) as rec:
            cupti.callback(None, 2, 211, self.data("cudaLaunchKernel_v7000", 0, ctypes.addressof(launch), "_Z1kPm"))
            cupti.callback(None, 1, 307, self.data("cuLaunchKernel", 0, ctypes.addressof(inner), "_Z1kPm"))
            cupti.callback(None, 1, 307, self.data("cuLaunchKernel", 1, ctypes.addressof(inner)))
            cupti.callback(None, 2, 211, self.data("cudaLaunchKernel_v7000", 1, ctypes.addressof(launch)))
        answer = rec.answer()
        self.assertIsNone(answer["error"])
        self.assertEqual(answer["ops"], [
            {"op": "launch", "api": "cudaLaunchKernel", "symbol": "_Z1kPm", "grid": [2, 1, 1],
             "block": [32, 1, 1], "shared_bytes": 0, "stream": "current", "cooperative": False,
             "cluster": None, "params": [{"offset": 0, "size": 8, "hex": "cd00000000000000"}]}])

    def test_the_library_loader_says_what_it_tried(self):
        with self.assertRaises(record.RecordError) as e:
            record.load_library(["libkiln-no-such-library.so.1"], ["/nonexistent/*/libnothing.so*"])
        self.assertIn("libkiln-no-such-library.so.1", str(e.exception))
        self.assertIsNotNone(record.load_library(["libkiln-no-such-library.so.1", "libc.so.6"]))


# The runner's structs against the CUDA headers: (struct, the C type it reads, {field: the
# C field}, whether the sizes match too: False where the runner reads a prefix).
LAYOUTS = [
    ("CallbackData", "CUpti_CallbackData", {f: f for f in (
        "callbackSite", "functionName", "functionParams", "functionReturnValue", "symbolName",
        "context", "contextUid", "correlationData", "correlationId")}, True),
    ("RtLaunch", "cudaLaunchKernel_v7000_params", {f: f for f in (
        "func", "gridDim", "blockDim", "args", "sharedMem", "stream")}, True),
    ("RtLaunch", "cudaLaunchKernel_ptsz_v7000_params", {"args": "args", "stream": "stream"}, True),
    ("RtLaunch", "cudaLaunchCooperativeKernel_v9000_params", {"args": "args", "stream": "stream"}, True),
    ("RtLaunch", "cudaLaunchCooperativeKernel_ptsz_v9000_params", {"args": "args", "stream": "stream"}, True),
    ("RtLaunchEx", "cudaLaunchKernelExC_v11060_params", {"config": "config", "func": "func", "args": "args"}, True),
    ("RtLaunchEx", "cudaLaunchKernelExC_ptsz_v11060_params", {"args": "args"}, True),
    ("RtLaunchConfig", "cudaLaunchConfig_t", {f: f for f in (
        "gridDim", "blockDim", "dynamicSmemBytes", "stream", "attrs", "numAttrs")}, True),
    ("LaunchAttribute", "cudaLaunchAttribute", {"id": "id", "value": "val"}, True),
    ("LaunchAttribute", "CUlaunchAttribute", {"id": "id", "value": "value"}, True),
    ("LaunchAttributeValue", "CUlaunchAttributeValue", {"cooperative": "cooperative", "clusterDim": "clusterDim"}, True),
    ("LaunchAttributeValue", "cudaLaunchAttributeValue", {"cooperative": "cooperative", "clusterDim": "clusterDim"}, True),
    ("DrvLaunchConfig", "CUlaunchConfig", {f: f for f in (
        "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes",
        "hStream", "attrs", "numAttrs")}, True),
    ("DrvLaunch", "cuLaunchKernel_params", {f: f for f in (
        "f", "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
        "sharedMemBytes", "hStream", "kernelParams", "extra")}, True),
    ("DrvLaunch", "cuLaunchKernel_ptsz_params", {"kernelParams": "kernelParams", "extra": "extra"}, True),
    ("DrvCoopLaunch", "cuLaunchCooperativeKernel_params", {"hStream": "hStream", "kernelParams": "kernelParams"}, True),
    ("DrvCoopLaunch", "cuLaunchCooperativeKernel_ptsz_params", {"kernelParams": "kernelParams"}, True),
    ("DrvLaunchEx", "cuLaunchKernelEx_params", {f: f for f in ("config", "f", "kernelParams", "extra")}, True),
    ("DrvLaunchEx", "cuLaunchKernelEx_ptsz_params", {"extra": "extra"}, True),
    ("RtMemcpy", "cudaMemcpy_v3020_params", {"count": "count", "kind": "kind"}, True),
    ("RtMemcpy", "cudaMemcpy_ptds_v7000_params", {"count": "count", "kind": "kind"}, True),
    ("RtMemcpy", "cudaMemcpyAsync_v3020_params", {"count": "count", "kind": "kind"}, False),
    ("RtMemcpy", "cudaMemcpyAsync_ptsz_v7000_params", {"count": "count", "kind": "kind"}, False),
    ("RtMemcpySymbol", "cudaMemcpyToSymbol_v3020_params", {"count": "count", "offset": "offset", "kind": "kind"}, True),
    ("RtMemcpySymbol", "cudaMemcpyFromSymbol_v3020_params", {"count": "count", "offset": "offset", "kind": "kind"}, True),
    ("RtMemcpySymbol", "cudaMemcpyToSymbolAsync_ptsz_v7000_params", {"count": "count", "kind": "kind"}, False),
    ("RtMemcpySymbol", "cudaMemcpyFromSymbolAsync_v3020_params", {"count": "count", "kind": "kind"}, False),
    ("RtMemcpyPeer", "cudaMemcpyPeer_v4000_params", {"count": "count"}, True),
    ("RtMemcpyPeer", "cudaMemcpyPeerAsync_v4000_params", {"count": "count"}, False),
    ("RtMemcpy2D", "cudaMemcpy2D_v3020_params", {"width": "width", "height": "height", "kind": "kind"}, True),
    ("RtMemcpy2D", "cudaMemcpy2DAsync_ptsz_v7000_params", {"width": "width", "height": "height", "kind": "kind"}, False),
    ("DrvMemcpy", "cuMemcpy_params", {"ByteCount": "ByteCount"}, True),
    ("DrvMemcpy", "cuMemcpyAsync_ptsz_params", {"ByteCount": "ByteCount"}, False),
    ("DrvMemcpy", "cuMemcpyHtoD_v2_params", {"ByteCount": "ByteCount"}, True),
    ("DrvMemcpy", "cuMemcpyDtoHAsync_v2_params", {"ByteCount": "ByteCount"}, False),
    ("DrvMemcpy", "cuMemcpyDtoD_v2_ptds_params", {"ByteCount": "ByteCount"}, True),
    ("DrvMemcpyPeer", "cuMemcpyPeer_params", {"ByteCount": "ByteCount"}, True),
    ("DrvMemcpyPeer", "cuMemcpyPeerAsync_ptsz_params", {"ByteCount": "ByteCount"}, False),
    ("RtMemset", "cudaMemset_v3020_params", {"count": "count"}, True),
    ("RtMemset", "cudaMemsetAsync_ptsz_v7000_params", {"count": "count"}, False),
    ("DrvMemset", "cuMemsetD8_v2_params", {"N": "N"}, True),
    ("DrvMemset", "cuMemsetD16Async_params", {"N": "N"}, False),
    ("DrvMemset", "cuMemsetD32_v2_ptds_params", {"N": "N"}, True),
    ("AllocParams", "cudaMalloc_v3020_params", {"ptr": "devPtr", "size": "size"}, True),
    ("AllocParams", "cudaMallocAsync_ptsz_v11020_params", {"ptr": "devPtr", "size": "size"}, False),
    ("AllocParams", "cudaMallocManaged_v6000_params", {"ptr": "devPtr", "size": "size"}, False),
    ("AllocParams", "cudaMallocFromPoolAsync_v11020_params", {"ptr": "ptr", "size": "size"}, False),
    ("AllocParams", "cudaMallocHost_v3020_params", {"ptr": "ptr", "size": "size"}, True),
    ("AllocParams", "cudaHostAlloc_v3020_params", {"ptr": "pHost", "size": "size"}, False),
    ("AllocParams", "cuMemAlloc_v2_params", {"ptr": "dptr", "size": "bytesize"}, True),
    ("AllocParams", "cuMemAllocAsync_ptsz_params", {"ptr": "dptr", "size": "bytesize"}, False),
    ("AllocParams", "cuMemAllocManaged_params", {"ptr": "dptr", "size": "bytesize"}, False),
    ("AllocParams", "cuMemAllocFromPoolAsync_params", {"ptr": "dptr", "size": "bytesize"}, False),
    ("AllocParams", "cuMemAllocHost_v2_params", {"ptr": "pp", "size": "bytesize"}, True),
    ("AllocParams", "cuMemHostAlloc_params", {"ptr": "pp", "size": "bytesize"}, False),
    ("EventRecordParams", "cudaEventRecord_v3020_params", {"stream": "stream"}, True),
    ("EventRecordParams", "cudaEventRecordWithFlags_ptsz_v11010_params", {"stream": "stream"}, False),
    ("EventRecordParams", "cuEventRecord_params", {"stream": "hStream"}, True),
    ("EventRecordParams", "cuEventRecordWithFlags_params", {"stream": "hStream"}, False),
]
CONSTANTS = {"CUPTI_API_ENTER": "CUPTI_API_ENTER", "CUPTI_CB_DOMAIN_DRIVER_API": "CUPTI_CB_DOMAIN_DRIVER_API",
             "CUPTI_CB_DOMAIN_RUNTIME_API": "CUPTI_CB_DOMAIN_RUNTIME_API",
             "LAUNCH_ATTRIBUTE_COOPERATIVE": "CU_LAUNCH_ATTRIBUTE_COOPERATIVE",
             "LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION": "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION",
             "CUDA_ERROR_INVALID_VALUE": "CUDA_ERROR_INVALID_VALUE",
             "LAUNCH_PARAM_BUFFER_POINTER": "CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT",
             "LAUNCH_PARAM_BUFFER_SIZE": "CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT"}


def cuda_headers():
    """The CUDA 13 headers (with CUPTI's) Triton's wheel carries beside KILN_PYTHON, or None."""
    python = os.environ.get("KILN_PYTHON")
    if not python:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    import glob

    found = glob.glob(os.path.join(root, "lib", "python3*", "site-packages", "triton", "backends",
                                   "nvidia", "include", "cupti_callbacks.h"))
    return os.path.dirname(found[0]) if found else None


class RecorderLayouts(unittest.TestCase):
    def test_the_structs_match_the_cuda_headers(self):
        include = cuda_headers()
        if include is None:
            self.skipTest("no CUDA headers beside KILN_PYTHON (triton/backends/nvidia/include)")
        cc = shutil.which(os.environ.get("CC", "cc"))
        if cc is None:
            self.skipTest("no C compiler")
        lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <cuda.h>",
                 "#include <cuda_runtime_api.h>", "#include <cupti_callbacks.h>",
                 "#include <generated_cuda_runtime_api_meta.h>", "#include <generated_cuda_meta.h>",
                 "int main(void) {"]
        for _, ctype, fields, _ in LAYOUTS:
            lines.append(f'printf("{ctype} sizeof %zu\\n", sizeof({ctype}));')
            for c_field in fields.values():
                lines.append(f'printf("{ctype} {c_field} %zu\\n", offsetof({ctype}, {c_field}));')
        for c_name in CONSTANTS.values():
            lines.append(f'printf("const {c_name} %d\\n", (int)({c_name}));')
        lines += ["return 0;", "}"]
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "layouts.c"), os.path.join(tmp, "layouts")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            # generated_cuda_meta.h names the 32-bit v1 types cuda.h declares only for its
            # own build.
            c = subprocess.run([cc, "-D__CUDA_API_VERSION_INTERNAL", "-I", include, src, "-o", exe],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(c.returncode, 0, c.stderr[-3000:])
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        c_values = {}
        for line in out.splitlines():
            a, b, v = line.split()
            c_values[(a, b)] = int(v)
        for name, ctype, fields, same_size in LAYOUTS:
            cls = getattr(record, name)
            with self.subTest(ctype):
                for field, c_field in fields.items():
                    self.assertEqual(getattr(cls, field).offset, c_values[(ctype, c_field)], f"{name}.{field}")
                if same_size:
                    self.assertEqual(ctypes.sizeof(cls), c_values[(ctype, "sizeof")])
                else:
                    self.assertLessEqual(ctypes.sizeof(cls), c_values[(ctype, "sizeof")])
        for ours, c_name in CONSTANTS.items():
            self.assertEqual(getattr(record, ours), c_values[("const", c_name)], ours)


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


class TTensor:
    """A tensor as the Triton capture reads one."""

    class dtype:  # noqa: N801 - str() like torch's
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return "torch." + self.name

    def __init__(self, ptr, dtype="float32", contiguous=True):
        self.ptr, self.dtype, self.contiguous = ptr, TTensor.dtype(dtype), contiguous

    def data_ptr(self):
        return self.ptr

    def is_contiguous(self):
        return self.contiguous


class FakeTl:
    """triton.language's constexpr and dtype, as the capture reads them."""

    class constexpr:  # noqa: N801
        def __init__(self, value):
            self.value = value

    class dtype:  # noqa: N801
        def __init__(self, name):
            self.name = name

        def __eq__(self, other):
            return isinstance(other, FakeTl.dtype) and other.name == self.name

        def __hash__(self):
            return hash(self.name)


FakeTl.float16 = FakeTl.dtype("fp16")
FakeTl.float32 = FakeTl.dtype("fp32")


class Param:
    def __init__(self, name, is_constexpr):
        self.name, self.is_constexpr = name, is_constexpr


def fake_triton(run_raises=None):
    """A module dict holding a fake triton.runtime.jit whose JITFunction.run takes Triton's
    real signature and logs its calls (raising `run_raises` when given)."""
    import inspect
    import types

    calls = []

    class JITFunction:
        def __init__(self, fn):
            self.fn = fn
            self.__name__ = fn.__name__
            self.signature = inspect.signature(fn)
            self.params = [Param(n, p.annotation == "constexpr") for n, p in self.signature.parameters.items()]
            self.constexprs = [i for i, p in enumerate(self.params) if p.is_constexpr]

        def run(self, *args, grid, warmup, **kwargs):
            calls.append((self, args, dict(kwargs, grid=grid, warmup=warmup)))
            if run_raises is not None:
                raise run_raises
            return "compiled"

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)

    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    torch = types.ModuleType("torch")
    torch.Tensor = TTensor
    return {"triton.runtime.jit": jit, "torch": torch, "triton.language": FakeTl}, JITFunction, calls


def kernel(x_ptr, y_ptr, n, scale, BLOCK: "constexpr" = 128, ACT: "constexpr" = "relu"):
    pass


class TritonCapture(unittest.TestCase):
    """The pure pieces of R's capture of Triton launches (no triton needed) and the wrapping
    of a JITFunction-like class's `run` (the real one: TritonCaptureWithTriton)."""

    def test_values_by_kind(self):
        tv = lambda v: record.triton_value(v, TTensor, FakeTl)  # noqa: E731
        self.assertEqual(tv(TTensor(0x7F00, "bfloat16", False)),
                         {"kind": "tensor", "ptr": 0x7F00, "contiguous": False, "dtype": "bfloat16"})
        self.assertEqual(tv(True), {"kind": "bool", "value": True})
        self.assertEqual(tv(7), {"kind": "int", "value": 7})
        self.assertEqual(tv(1 << 70), {"kind": "int", "value": 1 << 70})
        self.assertEqual(tv(0.5), {"kind": "float", "value": 0.5})
        self.assertEqual(tv(float("-inf")), {"kind": "float", "value": None, "text": "-inf"})
        self.assertEqual(tv(float("nan"))["value"], None)
        self.assertEqual(tv(None), {"kind": "none"})
        self.assertEqual(tv("relu"), {"kind": "str", "value": "relu"})
        self.assertEqual(tv(FakeTl.constexpr(64)), {"kind": "int", "value": 64})
        self.assertEqual(tv(FakeTl.dtype("fp16")), {"kind": "dtype", "value": "tl.float16"})
        self.assertEqual(tv([1, 2]), {"kind": "other", "type": "list"})
        self.assertEqual(record.triton_value(TTensor(1), None, None), {"kind": "other", "type": "TTensor"},
                         "no torch loaded: no tensor")
        json.dumps([tv(float("inf")), tv(1 << 70)], allow_nan=False)  # what the answer can carry

    def test_grids_as_triton_computes_them(self):
        bound = {"n": 1000, "BLOCK": 128}
        self.assertEqual(record.triton_grid((4,), bound), [4, 1, 1])
        self.assertEqual(record.triton_grid([2, 3], bound), [2, 3, 1])
        self.assertEqual(record.triton_grid((2, 3, 4, 5), bound), [2, 3, 4], "Triton reads three")
        seen = []
        grid = lambda meta: (seen.append(meta) or -(-meta["n"] // meta["BLOCK"]),)  # noqa: E731
        self.assertEqual(record.triton_grid(grid, bound), [8, 1, 1])
        self.assertEqual(seen, [bound])
        self.assertIsNot(seen[0], bound, "the lambda gets a copy")

        class Index:
            def __index__(self):
                return 6

        self.assertEqual(record.triton_grid((Index(), 2), bound), [6, 2, 1])
        for bad, error in (((), ValueError), ((1.5,), TypeError), ((1 << 64,), ValueError), (7, TypeError)):
            with self.assertRaises(error, msg=repr(bad)):
                record.triton_grid(bad, bound)

    def test_binding_fills_defaults_and_keeps_the_options_apart(self):
        _, JIT, _ = fake_triton()
        f = JIT(kernel)
        bound, options = record.triton_bind(f, (1, 2), {"n": 3, "scale": 0.5, "ACT": "gelu", "num_warps": 8,
                                                        "maxnreg": None, "grid": (1,), "warmup": False})
        self.assertEqual(list(bound.items()), [("x_ptr", 1), ("y_ptr", 2), ("n", 3), ("scale", 0.5),
                                               ("BLOCK", 128), ("ACT", "gelu")])
        self.assertEqual(options, {"num_warps": 8, "maxnreg": None})
        with self.assertRaises(TypeError):
            record.triton_bind(f, (1,), {})

    def test_a_wrapped_run_records_each_launch_and_runs_as_it_would_have(self):
        modules, JIT, calls = fake_triton()
        original = JIT.__dict__["run"]
        f = JIT(kernel)
        x, y = TTensor(0x1000), TTensor(0x2000, "float16")
        with record.TritonCapture(modules, hosted.describe_exception) as cap:
            self.assertIsNot(JIT.__dict__["run"], original)
            got = f[lambda m: (-(-m["n"] // m["BLOCK"]),)](x, y, 1000, 0.5, BLOCK=256, num_warps=8, num_stages=2,
                                                          maxnreg=None, enable_fp_fusion=False)
            f.run(x, y, 10, 1.0, grid=(1,), warmup=True)  # a warmup compiles, launches nothing
            f[(2, 2)](x, y, 5, 2.0, ACT=FakeTl.float16)
        self.assertIs(JIT.__dict__["run"], original)
        self.assertEqual(got, "compiled", "the original's result")
        self.assertEqual(len(calls), 3, "every call reached the original")
        self.assertEqual(calls[0][1], (x, y, 1000, 0.5))
        self.assertEqual(calls[0][2]["num_warps"], 8)
        self.assertIsNone(cap.error)
        self.assertEqual(cap.launches, [
            {"kernel": "kernel", "grid": [4, 1, 1],
             "args": [{"name": "x_ptr", "constexpr": False, "kind": "tensor", "ptr": 0x1000, "contiguous": True,
                       "dtype": "float32"},
                      {"name": "y_ptr", "constexpr": False, "kind": "tensor", "ptr": 0x2000, "contiguous": True,
                       "dtype": "float16"},
                      {"name": "n", "constexpr": False, "kind": "int", "value": 1000},
                      {"name": "scale", "constexpr": False, "kind": "float", "value": 0.5},
                      {"name": "BLOCK", "constexpr": True, "kind": "int", "value": 256},
                      {"name": "ACT", "constexpr": True, "kind": "str", "value": "relu"}],
             "num_warps": 8, "num_stages": 2, "num_ctas": 1, "options": {"enable_fp_fusion": False}},
            {"kernel": "kernel", "grid": [2, 2, 1],
             "args": [{"name": "x_ptr", "constexpr": False, "kind": "tensor", "ptr": 0x1000, "contiguous": True,
                       "dtype": "float32"},
                      {"name": "y_ptr", "constexpr": False, "kind": "tensor", "ptr": 0x2000, "contiguous": True,
                       "dtype": "float16"},
                      {"name": "n", "constexpr": False, "kind": "int", "value": 5},
                      {"name": "scale", "constexpr": False, "kind": "float", "value": 2.0},
                      {"name": "BLOCK", "constexpr": True, "kind": "int", "value": 128},
                      {"name": "ACT", "constexpr": True, "kind": "dtype", "value": "tl.float16"}],
             "num_warps": 4, "num_stages": 3, "num_ctas": 1, "options": {}}])

    def test_a_capture_failure_is_the_error_and_forward_goes_on(self):
        modules, JIT, calls = fake_triton()
        f = JIT(kernel)

        def bad_grid(meta):
            raise ZeroDivisionError("grid")

        with record.TritonCapture(modules, hosted.describe_exception) as cap:
            self.assertEqual(f[bad_grid](1, 2, 3, 4.0), "compiled")
            f[(1,)](1, 2, 3, 4.0)
        self.assertIn("a Triton launch could not be recorded: ZeroDivisionError", cap.error)
        self.assertEqual(cap.launches, [], "nothing after the first failure")
        self.assertEqual([c[2]["grid"] for c in calls], [bad_grid, (1,)], "the original got the grid as given")

    def test_run_is_restored_when_forward_raises(self):
        modules, JIT, _ = fake_triton(run_raises=RuntimeError("no GPU"))
        original = JIT.__dict__["run"]
        f = JIT(kernel)
        with self.assertRaises(RuntimeError):
            with record.TritonCapture(modules, hosted.describe_exception) as cap:
                f[(3,)](1, 2, 3, 4.0)
        self.assertIs(JIT.__dict__["run"], original)
        self.assertEqual([t["grid"] for t in cap.launches], [[3, 1, 1]], "taken down before the launch")
        # Through the recorder too: its exit restores run, and the answer carries the launches.
        rec = record.Recorder(None, None, hosted.describe_exception)
        rec.triton = record.TritonCapture(modules, hosted.describe_exception)
        rec.triton.__enter__()
        with self.assertRaises(RuntimeError):
            f[(5,)](1, 2, 3, 4.0)
        rec.triton.__exit__(RuntimeError, None, None)
        self.assertIs(JIT.__dict__["run"], original)
        self.assertEqual(rec.answer()["triton"][0]["grid"], [5, 1, 1])

    def test_without_triton_nothing_is_wrapped_and_a_capture_error_is_the_answers(self):
        with record.TritonCapture({}, hosted.describe_exception) as cap:
            pass
        self.assertEqual((cap.launches, cap.error, cap.cls), ([], None, None))
        # A JITFunction that inherits its run: the wrapper goes, the inherited one is back.
        modules, JIT, calls = fake_triton()
        Sub = type("JITFunction", (JIT,), {})
        modules["triton.runtime.jit"].JITFunction = Sub
        with record.TritonCapture(modules, hosted.describe_exception) as cap:
            self.assertIn("run", Sub.__dict__)
            Sub(kernel)[(2,)](1, 2, 3, 4.0)
        self.assertNotIn("run", Sub.__dict__)
        self.assertIs(Sub.run, JIT.run)
        self.assertEqual((len(cap.launches), len(calls)), (1, 1))
        rec = record.Recorder(None, None, hosted.describe_exception)
        rec.triton.error = "a Triton launch could not be recorded: KeyError"
        self.assertEqual(rec.answer()["error"], rec.triton.error)
        rec.error = "CUPTI: first"
        self.assertEqual(rec.answer()["error"], "CUPTI: first")
        modules, _, _ = fake_triton()
        cap = record.TritonCapture(modules, hosted.describe_exception)
        cap.launches = [{}] * record.MAX_OPS
        cap.take(None, (), {})
        self.assertEqual(cap.error, "more than 4096 Triton launches in one forward")


# A module with real Triton kernels: an autotuned one (two configs) with a heuristic, and a
# plain one launched over a grid lambda.
TRITON_MODULE = """
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4),
                          triton.Config({"BLOCK": 4096}, num_warps=8, num_stages=2)], key=["n_cols"])
@triton.heuristics({"EVEN": lambda a: a["n_cols"] % a["BLOCK"] == 0})
@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, scale, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols)
    tl.store(y_ptr + row * n_cols + offs, x * scale, mask=offs < n_cols)


@triton.jit
def add_kernel(a_ptr, b_ptr, n, BLOCK: tl.constexpr = 256):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(a_ptr + offs, tl.load(b_ptr + offs, mask=offs < n), mask=offs < n)
"""

# Drives TRITON_MODULE's kernels under the recorder's TritonCapture with the installed triton:
# the autotuner's cache seeded as a first forward leaves it (its second config), each call
# going on to the original run, which needs a GPU (none here: it raises, as it may).
TRITON_DRIVE = """
import importlib.util, json, os, sys
loaded = []
for name in ("kiln_hosted", "kiln_record"):
    spec = importlib.util.spec_from_file_location(name, os.path.join(sys.argv[1], name + ".py"))
    loaded.append(importlib.util.module_from_spec(spec))
    spec.loader.exec_module(loaded[-1])
hosted, record = loaded
sys.path.insert(0, sys.argv[2])
import kmod, torch, triton
x = torch.zeros(4, 4096)
y = torch.zeros(4, 4096)
k = kmod.softmax_kernel
k.cache[(4096, "torch.float32", "torch.float32")] = k.configs[1]
original = triton.runtime.jit.JITFunction.__dict__["run"]
raised = []
with record.TritonCapture(None, hosted.describe_exception) as cap:
    wrapped = triton.runtime.jit.JITFunction.__dict__["run"] is not original
    for launch in (lambda: k[(x.shape[0],)](x, y, x.shape[1], 0.5),
                   lambda: kmod.add_kernel[lambda m: (triton.cdiv(m["n"], m["BLOCK"]),)](x, y, 1000, BLOCK=128,
                                                                                          num_warps=2)):
        try:
            launch()
        except Exception as e:
            raised.append(type(e).__name__)
print(json.dumps({"launches": cap.launches, "error": cap.error, "wrapped": wrapped, "raised": raised,
                  "restored": triton.runtime.jit.JITFunction.__dict__["run"] is original}))
"""


class TritonCaptureWithTriton(unittest.TestCase):
    def test_the_installed_triton_run_is_wrapped_and_restored(self):
        python, why = torch_python()
        if python is None:
            self.skipTest(why)
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is None)"
        if subprocess.run([python, "-I", "-c", probe], capture_output=True).returncode != 0:
            self.skipTest(f"KILN_PYTHON={python} has no triton")
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "kmod.py"), "w") as f:
                f.write(TRITON_MODULE)
            p = subprocess.run([python, "-I", "-c", TRITON_DRIVE, os.path.dirname(SCRIPT), tmp],
                               capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertTrue(got["wrapped"] and got["restored"], got)
        self.assertIsNone(got["error"])
        soft, add = got["launches"]
        self.assertEqual((soft["kernel"], soft["grid"]), ("softmax_kernel", [4, 1, 1]))
        self.assertEqual((soft["num_warps"], soft["num_stages"], soft["num_ctas"], soft["options"]), (8, 2, 1, {}),
                         "the autotuner's chosen config")
        args = {a["name"]: a for a in soft["args"]}
        self.assertEqual([a["name"] for a in soft["args"]], ["x_ptr", "y_ptr", "n_cols", "scale", "BLOCK", "EVEN"])
        self.assertEqual(args["x_ptr"]["dtype"], "float32")
        self.assertEqual((args["x_ptr"]["kind"], args["x_ptr"]["constexpr"]), ("tensor", False))
        self.assertEqual(args["n_cols"], {"name": "n_cols", "constexpr": False, "kind": "int", "value": 4096})
        self.assertEqual(args["BLOCK"], {"name": "BLOCK", "constexpr": True, "kind": "int", "value": 4096})
        self.assertEqual(args["EVEN"], {"name": "EVEN", "constexpr": True, "kind": "bool", "value": True},
                         "the heuristic's value")
        self.assertEqual((add["kernel"], add["grid"], add["num_warps"]), ("add_kernel", [8, 1, 1], 2))
        self.assertEqual(add["args"][-1], {"name": "BLOCK", "constexpr": True, "kind": "int", "value": 128})


if __name__ == "__main__":
    unittest.main()


class RecordingBound(unittest.TestCase):
    def test_a_recording_over_the_bound_becomes_an_error_answer(self):
        small = {"error": None, "ops": [{"op": "sync", "api": "cudaDeviceSynchronize"}],
                 "regions": [], "allocations": []}
        self.assertIs(hosted.bounded_recording(small), small)
        op = {"op": "launch", "api": "cuLaunchKernel", "symbol": "k", "grid": [1, 1, 1],
              "block": [1, 1, 1], "shared_bytes": 0, "stream": "current",
              "params": [{"offset": 0, "size": 4096, "hex": "00" * 4096}]}
        big = dict(small, ops=[op] * 200)
        answer = hosted.bounded_recording(big)
        self.assertEqual((answer["ops"], answer["triton"], answer["regions"], answer["allocations"]),
                         ([], [], [], []))
        self.assertIn("over the 900000 sent", answer["error"])
