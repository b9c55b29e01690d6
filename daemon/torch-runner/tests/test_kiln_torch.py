"""Tests of daemon/torch-runner/kiln_torch.py that need no torch and no GPU (stdlib only)."""

import importlib.util
import io
import json
import os
import subprocess
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "kiln_torch.py")
FRAMING_SPEC = os.path.join(HERE, "..", "..", "..", "sandbox", "protocol", "framing.json")
spec = importlib.util.spec_from_file_location("kiln_torch", SCRIPT)
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)


def problem(table, dtype="f32"):
    return {
        "name": "p",
        "tensor": [
            {"name": "x", "dtype": dtype, "shape": [4, 8], "role": "input", "init": {"dist": "normal", "mean": 0.0, "std": 1.0}},
            {"name": "y", "dtype": dtype, "shape": [4, 8], "role": "output"},
        ],
        "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        "baseline": {"torch": table},
    }


class ParseOp(unittest.TestCase):
    def test_known_op_with_tensors(self):
        op, p = helper.parse_op(problem({"op": "softmax", "x": "x", "y": "y"}))
        self.assertEqual((op, p), ("softmax", {"x": "x", "y": "y"}))

    def test_code_is_never_an_op(self):
        for bad in ["__import__('os').system('id')", "eval", None, 3]:
            with self.assertRaises(helper.Refused):
                helper.parse_op(problem({"op": bad, "x": "x", "y": "y"}))

    def test_unknown_keys_tensors_and_types_are_refused(self):
        cases = [
            {"op": "softmax", "x": "x", "y": "y", "dim": 0},
            {"op": "softmax", "x": "nope", "y": "y"},
            {"op": "softmax", "x": "x"},
            {"op": "layer_norm", "x": "x", "y": "y", "dims": "1", "eps": 1e-5},
            {"op": "layer_norm", "x": "x", "y": "y", "dims": True, "eps": 1e-5},
            {"op": "conv2d", "x": "x", "w": "x", "y": "y", "stride": 1, "maxpool": {"kernel": 3}},
        ]
        for table in cases:
            with self.assertRaises(helper.Refused, msg=str(table)):
                helper.parse_op(problem(table))

    def test_int_eps_is_a_float_and_missing_table_refused(self):
        _, p = helper.parse_op(problem({"op": "layer_norm", "x": "x", "y": "y", "dims": 1, "eps": 1}))
        self.assertIsInstance(p["eps"], float)
        with self.assertRaises(helper.Refused):
            helper.parse_op({"tensor": []})

    def test_integer_tensors_refused(self):
        with self.assertRaises(helper.Refused):
            helper.parse_op(problem({"op": "softmax", "x": "x", "y": "y"}, dtype="i32"))


class Variants(unittest.TestCase):
    def test_conv_default_is_tf32_and_strict_is_added(self):
        self.assertEqual(helper.variants("conv2d", "f32"), [("tf32", True), ("fp32", False)])
        self.assertEqual(helper.variants("matmul", "f32"), [("fp32", False)])
        self.assertEqual(helper.variants("sdpa", "f16"), [("fp16", False)])


class Framing(unittest.TestCase):
    def test_messages_round_trip_with_blobs(self):
        buf = io.BytesIO()
        helper.write_message(buf, {"cmd": "x", "n": 3}, [b"abc", b""])
        buf.seek(0)
        self.assertEqual(helper.read_message(buf), ({"cmd": "x", "n": 3}, [b"abc", b""]))

    def test_a_blob_longer_than_a_frame_spans_frames(self):
        # Frames of 4 bytes: a 10-byte blob is 3 frames, as kiln's protocol.rs writes it.
        buf = io.BytesIO()
        helper.write_message(buf, {"cmd": "x"}, [b"ab", b"0123456789", b""], max_frame=4)
        buf.seek(0)
        (n,) = helper.struct.unpack("<I", buf.read(4))
        env = json.loads(buf.read(n))
        self.assertEqual(env["frames"], [1, 3, 1])
        sizes = []
        while True:
            head = buf.read(4)
            if not head:
                break
            (k,) = helper.struct.unpack("<I", head)
            sizes.append(k)
            buf.read(k)
        self.assertEqual(sizes, [2, 4, 4, 2, 0])
        buf.seek(0)
        self.assertEqual(helper.read_message(buf, max_frame=4), ({"cmd": "x"}, [b"ab", b"0123456789", b""]))

    def test_framing_matches_the_shared_spec(self):
        """sandbox/protocol/framing.json, which the kiln-protocol crate's tests read too:
        the same limits, every vector written to the byte and read back, every refused
        stream refused."""
        with open(FRAMING_SPEC) as f:
            spec = json.load(f)
        self.assertEqual(spec["max_frame"], helper.MAX_FRAME)
        self.assertEqual(spec["max_frames_per_blob"], helper.MAX_FRAMES_PER_BLOB)
        self.assertEqual(spec["max_blobs"], helper.MAX_BLOBS)
        self.assertTrue(spec["messages"] and spec["refused"])
        for v in spec["messages"]:
            with self.subTest(v["name"]):
                blobs = [bytes.fromhex(b) for b in v["blobs_hex"]]
                buf = io.BytesIO()
                helper.write_message(buf, v["body"], blobs, max_frame=v["max_frame"])
                self.assertEqual(buf.getvalue().hex(), v["stream_hex"])
                body, got = helper.read_message(io.BytesIO(bytes.fromhex(v["stream_hex"])), max_frame=v["max_frame"])
                self.assertEqual(body, v["body"])
                self.assertEqual([bytes(b) for b in got], blobs)
        for v in spec["refused"]:
            with self.subTest(v["name"]):
                with self.assertRaises((ValueError, EOFError)):
                    helper.read_message(io.BytesIO(bytes.fromhex(v["stream_hex"])), max_frame=v["max_frame"])

    def test_bad_frame_counts_are_refused(self):
        for frames in ([1], [1, 0], [1, helper.MAX_FRAMES_PER_BLOB + 1]):
            head = json.dumps({"blobs": 2, "frames": frames, "body": {}}).encode()
            buf = io.BytesIO(helper.struct.pack("<I", len(head)) + head)
            with self.assertRaises(ValueError):
                helper.read_message(buf)

    def test_a_lying_length_is_refused(self):
        buf = io.BytesIO(b"\xff\xff\xff\xff")
        with self.assertRaises(ValueError):
            helper.read_frame(buf)


def memfd(text):
    fd = os.memfd_create("kiln-test")
    os.write(fd, text)
    return fd


class Descriptors(unittest.TestCase):
    """Descriptors after a message (a GPU worker's shared tensors), as kiln_protocol::fds
    sends them: one marker byte with SCM_RIGHTS."""

    def pair(self):
        import socket

        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        return a, b

    def test_exactly_the_sent_descriptors_arrive(self):
        import socket

        a, b = self.pair()
        sent = [memfd(b"one"), memfd(b"two")]
        socket.send_fds(a, [helper.FDS_MARKER], sent)
        got = helper.recv_fds(b.fileno(), 2)
        self.assertEqual([os.pread(fd, 8, 0) for fd in got], [b"one", b"two"])
        for fd in got + sent:
            os.close(fd)

    def test_more_than_one_markers_worth_arrives_in_order(self):
        import socket

        a, b = self.pair()
        n = helper.FDS_MAX + 6
        sent = [memfd(str(i).encode()) for i in range(n)]
        for k in range(0, n, helper.FDS_MAX):
            socket.send_fds(a, [helper.FDS_MARKER], sent[k:k + helper.FDS_MAX])
        got = helper.recv_fds(b.fileno(), n)
        self.assertEqual([os.pread(fd, 8, 0) for fd in got], [str(i).encode() for i in range(n)])
        for fd in got + sent:
            os.close(fd)

    def test_the_wrong_marker_or_count_is_refused_and_closed(self):
        import socket

        a, b = self.pair()
        fd = memfd(b"x")
        socket.send_fds(a, [b"Z"], [fd])
        with self.assertRaises(helper.Refused):
            helper.recv_fds(b.fileno(), 1)
        socket.send_fds(a, [helper.FDS_MARKER], [fd])
        with self.assertRaises(helper.Refused) as e:
            helper.recv_fds(b.fileno(), 2)
        self.assertIn("expected 2 descriptors", str(e.exception))
        with self.assertRaises(helper.Refused):
            helper.recv_fds(b.fileno(), 0)
        os.close(fd)
        # Nothing we were sent stays open here: only our own memfd was, and it is closed.
        before = set(os.listdir("/proc/self/fd"))
        socket.send_fds(a, [helper.FDS_MARKER], [a.fileno(), a.fileno()])
        with self.assertRaises(helper.Refused):
            helper.recv_fds(b.fileno(), 3)
        self.assertEqual(set(os.listdir("/proc/self/fd")), before)

    def test_serve_takes_the_descriptors_off_the_stream_even_when_it_refuses(self):
        """A shared-tensor request the runner cannot serve (no GPU here) is refused, and
        the next request is still read from a stream in step: the descriptors were taken."""
        import socket

        ours, theirs = socket.socketpair()
        self.addCleanup(ours.close)
        proc = subprocess.Popen([sys.executable, SCRIPT, "serve"], stdin=theirs.fileno(),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONPATH=""))
        theirs.close()
        w = ours.makefile("wb", buffering=0)
        tensors = [{"name": "x", "mapped": 2 << 20}, {"name": "y", "mapped": 2 << 20}]
        helper.write_message(w, {"cmd": "reference_shared", "problem": problem({}), "tensors": tensors})
        fds = [memfd(b"x"), memfd(b"y")]
        socket.send_fds(ours, [helper.FDS_MARKER], fds)
        helper.write_message(w, {"cmd": "hello", "device": "cpu"})
        ours.shutdown(socket.SHUT_WR)
        out, _ = proc.communicate(timeout=120)
        buf = io.BytesIO(out)
        first, _ = helper.read_message(buf)
        second, _ = helper.read_message(buf)
        self.assertIn("error", first)
        # The hello was read whole (an answer either way: torch's version, or that this
        # python has no torch); a stream out of step would have ended the runner instead.
        self.assertIn("torch", json.dumps(second))
        for fd in fds:
            os.close(fd)


class Serve(unittest.TestCase):
    def converse(self, *requests, python=sys.executable, blobs=None, with_blobs=False):
        """Runs `serve` in a subprocess with the given requests; returns the answers (with
        their blobs: `with_blobs`)."""
        stdin = io.BytesIO()
        for i, r in enumerate(requests):
            helper.write_message(stdin, r, (blobs or {}).get(i, ()))
        env = dict(os.environ, PYTHONPATH="")
        out = subprocess.run([python, SCRIPT, "serve"], input=stdin.getvalue(), capture_output=True,
                             env=env, timeout=300, check=True).stdout
        buf, answers = io.BytesIO(out), []
        for _ in requests:
            answers.append(helper.read_message(buf))
        return answers if with_blobs else [a[0] for a in answers]

    def test_refusals_are_answers_not_crashes(self):
        answers = self.converse({"cmd": "run"}, {"cmd": "nope"}, {"cmd": "sample", "flush_bytes": 1})
        self.assertEqual(len(answers), 3, "the helper kept serving after each refusal")
        for a in answers:
            self.assertIn("error", a)

    @unittest.skipUnless(os.environ.get("KILN_PYTHON"), "KILN_PYTHON (a python with torch) is not set")
    def test_the_module_as_baseline_and_as_reference_on_the_cpu(self):
        src = os.path.join(HERE, "..", "..", "..", "problems", "kernelbench-format", "tiny", "linear_relu_4x16x8.py")
        out = subprocess.run([os.environ["KILN_PYTHON"], SCRIPT, "describe", src], capture_output=True,
                             timeout=300, check=True).stdout
        d = json.loads(out)
        self.assertEqual([t["name"] for t in d["tensors"]], ["x", "linear_weight", "linear_bias", "out"])
        with open(src, encoding="utf-8") as f:
            source = f.read()
        ref = {k: d[k] for k in ("forward", "state", "outputs", "init_inputs", "bool_tensors")}
        spec = {"name": "t", "tensor": d["tensors"], "tolerance": {"atol": 1e-4, "rtol": 1e-4},
                "reference": {"torch": dict(ref, source=source)}, "baseline": {"torch": {"op": "module"}}}
        x = bytes(4 * 16 * 4)  # zeros: out = relu(bias)
        w = bytes(8 * 16 * 4)
        b = b"".join(__import__("struct").pack("<f", v) for v in (-1, 2, -3, 4, -5, 6, -7, 8))
        answers = self.converse(
            {"cmd": "hello", "device": "cpu"},
            {"cmd": "baseline", "kind": "torch-eager", "problem": spec, "seed": 3},
            {"cmd": "check", "variant": 0},
            {"cmd": "reference", "problem": spec},
            python=os.environ["KILN_PYTHON"], blobs={3: (x, w, b)}, with_blobs=True)
        answers, blobs = [a[0] for a in answers], [a[1] for a in answers]
        self.assertEqual(answers[1]["variants"][0]["precision"], "fp32")
        self.assertEqual(answers[2]["mismatches"], 0)
        self.assertLess(answers[2]["rel_l2"], 1e-6)
        self.assertEqual(answers[3]["precision"], "float64")
        # The output's bytes: relu(bias) in every row of the 4x8 f32 output.
        st = __import__("struct")
        row = st.pack("<8f", 0, 2, 0, 4, 0, 6, 0, 8)
        self.assertEqual(bytes(blobs[3][0]), row * 4)

    def test_without_torch_hello_says_so(self):
        with mock.patch.dict(sys.modules, {"torch": None}):
            with self.assertRaises(helper.Refused) as e:
                helper.Server().hello({"device": "cuda"})
        self.assertIn("torch", str(e.exception))


if __name__ == "__main__":
    unittest.main()
