"""Tests that need no daemon: socket resolution, parsing, errors, problem folders,
batch bookkeeping, and what happens when nothing listens on the socket."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import socket
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Dict, Optional
from unittest import mock

import harness  # noqa: F401 - puts the package on sys.path
import kiln
from kiln import _paths, _wire
from kiln._batch import Backoff as _Backoff, Tracker
from kiln.models import Submission


class SocketResolution(unittest.TestCase):
    def env(self, **values: Optional[str]) -> "mock._patch[Dict[str, str]]":
        clean = {k: v for k, v in os.environ.items() if k not in ("KILN_SOCKET", "XDG_RUNTIME_DIR", "TMPDIR")}
        clean.update({k: v for k, v in values.items() if v is not None})
        return mock.patch.dict(os.environ, clean, clear=True)

    def test_explicit_beats_env(self) -> None:
        with self.env(KILN_SOCKET="/tmp/from-env.sock"):
            self.assertEqual(kiln.resolve_socket("/tmp/explicit.sock"), "/tmp/explicit.sock")
            self.assertEqual(kiln.resolve_socket(Path("/tmp/p.sock")), "/tmp/p.sock")
            self.assertEqual(kiln.resolve_socket(), "/tmp/from-env.sock")
            self.assertEqual(kiln.Client().socket, "/tmp/from-env.sock")

    def test_user_socket_when_it_exists(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "kiln").mkdir()
            sock = Path(d) / "kiln" / "kiln.sock"
            with self.env(XDG_RUNTIME_DIR=d):
                self.assertEqual(_paths.user_socket(), str(sock))
                sock.touch()
                self.assertEqual(kiln.resolve_socket(), str(sock))

    def test_system_socket_then_user_default(self) -> None:
        with tempfile.TemporaryDirectory() as d, self.env(XDG_RUNTIME_DIR=d):
            user = str(Path(d) / "kiln" / "kiln.sock")
            with mock.patch.object(_paths, "SYSTEM_SOCKET", str(Path(d) / "system.sock")):
                self.assertEqual(kiln.resolve_socket(), user)
                (Path(d) / "system.sock").touch()
                self.assertEqual(kiln.resolve_socket(), str(Path(d) / "system.sock"))

    def test_runtime_dir_fallbacks(self) -> None:
        uid = os.getuid()
        with self.env(TMPDIR="/var/tmp/x"):
            expected = (
                f"/run/user/{uid}/kiln/kiln.sock"
                if os.path.isdir(f"/run/user/{uid}")
                else f"/var/tmp/x/kiln-{uid}/kiln/kiln.sock"
            )
            self.assertEqual(_paths.user_socket(), expected)


class Errors(unittest.TestCase):
    def test_status_picks_the_class_and_keeps_code_and_message(self) -> None:
        body = b'{"error":{"code":"invalid_field","message":"field `x`: bad"}}'
        e = kiln.ApiError.from_response(400, body)
        self.assertIsInstance(e, kiln.BadRequest)
        self.assertEqual((e.status, e.code, e.message), (400, "invalid_field", "field `x`: bad"))
        self.assertIn("invalid_field", str(e))
        for status, cls in [(403, kiln.Forbidden), (404, kiln.NotFound), (405, kiln.MethodNotAllowed),
                            (409, kiln.Conflict), (413, kiln.PayloadTooLarge), (429, kiln.QueueFull),
                            (500, kiln.ServerError),
                            (503, kiln.ServerError)]:
            self.assertIsInstance(kiln.ApiError.from_response(status, body), cls)
        odd = kiln.ApiError.from_response(418, b"teapot")
        self.assertIs(type(odd), kiln.ApiError)
        self.assertEqual((odd.code, odd.message), ("unknown", "teapot"))

    def test_hierarchy(self) -> None:
        for cls in (kiln.DaemonNotRunning, kiln.ApiError, kiln.Timeout, kiln.JobFailed,
                    kiln.BackendUnavailable, kiln.TransportError, kiln.ProblemFolderError):
            self.assertTrue(issubclass(cls, kiln.KilnError))
        self.assertTrue(issubclass(kiln.NotFound, kiln.ApiError))
        self.assertTrue(issubclass(kiln.Timeout, TimeoutError))


class Models(unittest.TestCase):
    FULL = {
        "verdict": "ok",
        "message": "correct on 3 trials",
        "backend": "host",
        "compile": {"duration_ms": 12.5, "log": "", "cached": True, "kernels": []},
        "evidence": {"trials_passed": 3, "trials_run": 3, "bitwise_diffs": 0,
                     "errors": [{"tensor": "y", "max_abs": 0.0, "max_rel": 0.0, "rel_l2": 0.0,
                                 "mismatches": 0, "first_mismatches": [], "nonfinite_mismatches": 0}],
                     "unwritten": [["y", 2, [0, 5]]]},
        "timing": {"median_us": 4.5, "mean_us": 4.6, "stdev_us": 0.2, "min_us": 4.1, "max_us": 5.0, "n": 40,
                   "rse": 0.004, "stop_reason": "converged", "wall_ms": 3.0, "fresh_inputs": 10,
                   "rechecks": 8, "overhead_us": 0.3},
        "tier": "fp32-faithful",
        "telemetry": {"clock_mhz": 1980},
        "speedups": {"reference": 2.5, "torch": {"speedup": 1.5}},
        "something_new": [1, 2, 3],
    }

    def test_full_evaluation(self) -> None:
        ev = kiln.Evaluation.from_dict(self.FULL, candidate_id="abc", job_id=7)
        self.assertTrue(ev.ok)
        self.assertEqual(ev.median_us, 4.5)
        assert ev.timing is not None and ev.compile is not None
        self.assertEqual((ev.timing.n, ev.timing.stop_reason), (40, "converged"))
        self.assertTrue(ev.compile.cached)
        self.assertEqual(ev.evidence.errors[0].tensor, "y")
        self.assertEqual(ev.evidence.unwritten, [kiln.Unwritten("y", 2, [0, 5])])
        self.assertEqual(ev.tier, "fp32-faithful")
        self.assertEqual(ev.speedups, {"reference": 2.5, "torch": 1.5})
        self.assertEqual(ev.speedup("torch"), 1.5)
        self.assertIsNone(ev.speedup())  # ambiguous: two baselines
        self.assertEqual(ev.raw["something_new"], [1, 2, 3])
        self.assertEqual((ev.candidate_id, ev.job_id), ("abc", 7))

    def test_minimal_evaluation(self) -> None:
        ev = kiln.Evaluation.from_dict({"verdict": "compile_error", "message": "no", "backend": "host"})
        self.assertFalse(ev.ok)
        self.assertIsNone(ev.timing)
        self.assertIsNone(ev.median_us)
        self.assertIsNone(ev.speedups)
        self.assertIsNone(ev.speedup())
        self.assertEqual(ev.evidence.trials_run, 0)

    def test_record_and_submission(self) -> None:
        rec = {"id": "c1", "candidate": {"problem": "p"}, "backend": "host", "created_at": 1,
               "job": {"id": 3, "candidate_id": "c1", "backend": "host", "state": "failed", "attempts": 3,
                       "error": "boom"},
               "evaluation": None}
        r = kiln.CandidateRecord.from_dict(rec)
        self.assertTrue(r.finished)
        self.assertIsNone(r.evaluation)
        sub = kiln.Submission.from_dict({"id": "c1", "job_id": 3, "duplicate": True, "record": rec})
        self.assertTrue(sub.duplicate)
        self.assertEqual(sub.backend, "host")
        assert sub.record is not None and sub.record.job is not None
        self.assertEqual(sub.record.job.error, "boom")


    BASELINES = {
        "gpu_model": "NVIDIA H200", "driver": "580.0", "problem": "kb-l1-19-relu", "measured_at": 2,
        "results": [
            {"name": "reference", "library": "kiln", "precision": "reference-f64acc", "status": "measured",
             "timing": {"median_us": 50.0}},
            {"name": "torch-eager-tf32", "library": "torch", "precision": "tf32", "status": "measured",
             "timing": {"median_us": 20.0}},
            {"name": "torch-eager-fp32", "library": "torch", "precision": "fp32", "status": "measured",
             "timing": {"median_us": 40.0}},
            {"name": "torch-compile-fp32", "library": "torch", "precision": "fp32", "status": "failed",
             "detail": "outside the tolerance"},
            {"name": "torch-compile-bf16", "library": "torch", "precision": "bf16", "status": "measured",
             "timing": {"median_us": 9.0}},
        ],
    }

    def test_baselines_and_the_torch_variant_compared(self) -> None:
        b = kiln.BaselineSet.from_dict(self.BASELINES)
        self.assertEqual((b.gpu_model, len(b.results)), ("NVIDIA H200", 5))
        self.assertEqual(b.median_us("reference"), 50.0)
        self.assertIsNone(b.median_us("torch-compile-fp32"))  # failed: no time
        self.assertEqual(b.torch_us("torch-eager"), 40.0)  # fp32, though tf32 is faster
        self.assertEqual(b.torch_us("torch-compile"), 9.0)  # the only measured variant
        self.assertIsNone(b.torch_us("cublas"))
        older = {**self.BASELINES, "measured_at": 1, "results": []}
        other = {**self.BASELINES, "gpu_model": "NVIDIA A100"}
        p = kiln.Problem.from_dict({"spec": {"name": "kb-l1-19-relu"}, "baselines": [self.BASELINES, older]})
        self.assertEqual([s.measured_at for s in p.baselines], [2, 1])
        self.assertEqual(p.baseline_set().measured_at, 2)  # type: ignore[union-attr]
        self.assertIsNone(p.baseline_set("NVIDIA A100"))
        mixed = kiln.Problem.from_dict({"spec": {"name": "x"}, "baselines": [other, self.BASELINES]})
        self.assertIsNone(mixed.baseline_set(), "two GPU models: which one ran it must be known")
        self.assertEqual(mixed.baseline_set("NVIDIA H200").gpu_model, "NVIDIA H200")  # type: ignore[union-attr]
        self.assertEqual(kiln.Problem.from_dict({"spec": {}}).baselines, [])

    def test_a_hosted_candidate_is_compared_with_the_hosted_baseline(self) -> None:
        from kiln.models import same_harness, torch_variant

        names = ["torch-eager-fp32", "torch-eager-hosted", "torch-compile-hosted"]
        self.assertEqual(same_harness("torch-eager", "hosted"), "torch-eager-hosted")
        self.assertEqual(same_harness("torch-eager", "lifted"), "torch-eager")
        self.assertEqual(torch_variant(names, same_harness("torch-eager", "hosted")), "torch-eager-hosted")
        self.assertEqual(torch_variant(names, "torch-eager"), "torch-eager-fp32")
        # An in-process kind never stands for the hosted result, even when it is the only one.
        self.assertIsNone(torch_variant(["torch-compile-hosted"], "torch-compile"))
        b = kiln.BaselineSet.from_dict({**self.BASELINES, "results": self.BASELINES["results"] + [
            {"name": "torch-eager-hosted", "library": "torch", "precision": "", "status": "measured",
             "harness": "hosted", "timing": {"median_us": 240.0}}]})
        self.assertEqual(b.torch_us("torch-eager-hosted"), 240.0)
        self.assertEqual(b.torch_us("torch-eager"), 40.0)

    def test_baselines_request(self) -> None:
        get = _wire.baselines("kb-l1-19-relu", False, None)
        self.assertEqual((get.method, get.target, get.body), ("GET", "/v1/problems/kb-l1-19-relu/baselines", None))
        self.assertGreaterEqual(get.server_wait_s, 600)  # measuring on first use takes minutes
        self.assertEqual(_wire.baselines("p", False, "1").target, "/v1/problems/p/baselines?gpu=1")
        post = _wire.baselines("p", True, "GPU-x")
        self.assertEqual((post.method, json.loads(post.body or b"")), ("POST", {"remeasure": True, "gpu": "GPU-x"}))
        self.assertEqual(get.decode(self.BASELINES).torch_us("torch-eager"), 40.0)

    def test_speedups_beside_the_evaluation(self) -> None:
        rec = {"id": "c1", "candidate": {"problem": "p", "language": "modelnew"}, "backend": "cuda",
               "job": {"id": 1, "state": "done"},
               "evaluation": {"verdict": "ok", "message": "m", "backend": "cuda", "timing": {"median_us": 10.0},
                              "telemetry": {"device": {"name": "NVIDIA H200", "uuid": "GPU-1"}}},
               "speedups": [{"baseline": "torch-eager-fp32", "precision": "fp32", "baseline_us": 40.0, "speedup": 4.0},
                            {"baseline": "reference", "precision": "reference-f64acc", "baseline_us": 5.0,
                             "speedup": 0.5}]}
        ev = kiln.CandidateRecord.from_dict(rec).evaluation
        assert ev is not None
        self.assertEqual(ev.speedups, {"torch-eager-fp32": 4.0, "reference": 0.5})
        self.assertEqual(ev.speedup("reference"), 0.5)
        self.assertEqual(ev.gpu_model, "NVIDIA H200")
        self.assertNotIn("speedups", ev.raw)  # raw stays the evaluation as received
        self.assertIsNone(kiln.Evaluation.from_dict({"verdict": "ok"}).gpu_model)


class KernelBenchIds(unittest.TestCase):
    def test_forms(self) -> None:
        kb = kiln.KernelBenchProblem(1, 19)
        for text in ["level1/19", "level1/19_ReLU.py", "KernelBench/level1/19_ReLU.py", " level1/19 ",
                     "level_1_problem_19", "level_1_problem_19_sample_3"]:
            self.assertEqual(kiln.KernelBenchProblem.parse(text), kb, text)
        self.assertEqual((str(kb), kb.prefix), ("level1/19", "kb-l1-19-"))
        for text in ["kb-l1-19-relu", "vecadd-4096", "level1", "level1/x", "level0/3", "19_ReLU.py"]:
            self.assertIsNone(kiln.KernelBenchProblem.from_text(text), text)
        with self.assertRaisesRegex(ValueError, "level1/19"):
            kiln.KernelBenchProblem.parse("relu")
        with self.assertRaises(ValueError):
            kiln.KernelBenchProblem(0, 3)

    def test_find(self) -> None:
        names = ["kb-l1-1-square-matmul", "kb-l1-19-relu", "kb-l1-190-x", "kb-l2-19-conv", "vecadd-4096"]
        self.assertEqual(kiln.KernelBenchProblem(1, 19).find(names), "kb-l1-19-relu")
        self.assertEqual(kiln.KernelBenchProblem(1, 1).find(names), "kb-l1-1-square-matmul")
        summaries = [kiln.ProblemSummary.from_dict({"name": n}) for n in names]
        self.assertEqual(kiln.KernelBenchProblem(2, 19).find(summaries), "kb-l2-19-conv")
        with self.assertRaisesRegex(kiln.NotFound, "kb-l3-1-"):
            kiln.KernelBenchProblem(3, 1).find(names)
        with self.assertRaisesRegex(ValueError, "several"):
            kiln.KernelBenchProblem(1, 19).find(names + ["kb-l1-19-relu-big"])


class EventParsing(unittest.TestCase):
    def test_frames_split_anywhere(self) -> None:
        text = (b'event: hello\ndata: {"type":"hello"}\n\n:keep-alive\n\n'
                b'event: job\r\ndata: {"type":"job","job_id":4,"candidate_id":"c","state":"done",'
                b'"verdict":"ok","median_us":3.5}\r\n\r\nevent: lagged\rdata: {"missed":2}\r\r\n')
        for step in (1, 3, 7, len(text)):
            p = _wire.SSEParser()
            events = []
            for i in range(0, len(text), step):
                events += p.feed(text[i:i + step])
            self.assertEqual([e.name for e in events], ["hello", "job", "lagged"], step)
            job = events[1]
            self.assertTrue(job.finished)
            self.assertEqual((job.job_id, job.candidate_id, job.verdict, job.median_us), (4, "c", "ok", 3.5))
            self.assertEqual(events[2].data, {"missed": 2})

    def test_multiline_and_non_json_data(self) -> None:
        events = _wire.SSEParser().feed(b"data: a\ndata: b\n\n")
        self.assertEqual(events[0].name, "message")
        self.assertEqual(events[0].data, {"value": "a\nb"})


@unittest.skipUnless(harness.has_toml_parser(), "no TOML parser here (Python < 3.11 without tomli)")
class ProblemFolders(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def test_sources_are_inlined(self) -> None:
        folder = harness.write_double_problem(self.root, "dbl")
        spec = kiln.load_problem(folder)
        self.assertEqual(spec, harness.double_problem_spec("dbl"))
        self.assertEqual(spec["name"], "dbl")
        self.assertEqual([t["name"] for t in spec["tensor"]], ["x", "y"])
        self.assertIn("ref_double", spec["reference"]["host"]["source"])
        self.assertIn("double_it", spec["seed"]["host"]["source"])
        self.assertEqual(kiln.problem_folders(self.root), [folder])
        self.assertEqual(kiln.problem_folders(folder), [folder])

    def test_paths_outside_the_folder_are_refused(self) -> None:
        folder = harness.write_double_problem(self.root, "dbl")
        toml = folder / "problem.toml"
        toml.write_text(toml.read_text().replace('"reference.c"', '"../etc/passwd"'))
        with self.assertRaisesRegex(kiln.ProblemFolderError, "plain file name"):
            kiln.load_problem(folder)

    def test_missing_files_and_bad_toml(self) -> None:
        with self.assertRaisesRegex(kiln.ProblemFolderError, "problem.toml"):
            kiln.load_problem(self.root / "nothing")
        folder = harness.write_double_problem(self.root, "dbl")
        (folder / "seed.c").unlink()
        with self.assertRaisesRegex(kiln.ProblemFolderError, "seed.c"):
            kiln.load_problem(folder)
        (folder / "problem.toml").write_text("name = ")
        with self.assertRaises(kiln.ProblemFolderError):
            kiln.load_problem(folder)

    def test_empty_root(self) -> None:
        with self.assertRaisesRegex(kiln.ProblemFolderError, "no problem.toml"):
            kiln.problem_folders(self.root)


class NoTomlParser(unittest.TestCase):
    def test_the_error_says_what_to_install(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            folder = harness.write_double_problem(Path(d), "dbl")
            with mock.patch.dict(sys.modules, {"tomllib": None, "tomli": None}):
                with self.assertRaisesRegex(kiln.ProblemFolderError, "pip install tomli"):
                    kiln.load_problem(folder)


class Candidates(unittest.TestCase):
    def test_dataclass_and_dict_forms(self) -> None:
        c = kiln.Candidate(problem="p", source="void k(){}",
                           launches=[kiln.Launch("k", ["x", kiln.i32(4), kiln.f32(0.5)])], note="idea")
        d = json.loads(_wire.submit(kiln.candidate.candidate_dict(c)).body or b"")
        self.assertEqual(d["launches"][0]["args"], ["x", {"i32": 4}, {"f32": 0.5}])
        self.assertEqual(d["note"], "idea")
        self.assertNotIn("parent", d)
        self.assertEqual(kiln.candidate.candidate_dict({"source": "s"}, problem="q")["problem"], "q")
        with self.assertRaises(ValueError):
            kiln.candidate.candidate_dict({"source": "s"})
        with self.assertRaises(TypeError):
            kiln.candidate.candidate_dict("void k(){}")  # type: ignore[arg-type]

    def test_launch_kinds_are_sent_only_when_asked_for(self) -> None:
        plain = kiln.Launch("ns::k<256, float>", ["x"]).to_dict()
        self.assertNotIn("cooperative", plain)
        self.assertNotIn("cluster", plain)
        self.assertEqual(plain["kernel"], "ns::k<256, float>")
        self.assertIs(kiln.Launch("k", cooperative=True).to_dict()["cooperative"], True)
        self.assertEqual(kiln.Launch("k", grid=(8, 1, 1), cluster=(2, 1, 1)).to_dict()["cluster"], [2, 1, 1])


MODEL_NEW = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2\n"


class HostedCandidates(unittest.TestCase):
    def test_modelnew_from_text_and_from_a_file(self) -> None:
        c = kiln.modelnew("kb-relu", MODEL_NEW)
        self.assertEqual(c, {"problem": "kb-relu", "language": "modelnew", "source": MODEL_NEW})
        c = kiln.modelnew("kb-relu", MODEL_NEW, cpu=True, note="fused", parent="p0")
        self.assertEqual((c["language"], c["note"], c["parent"]), ("modelnew-cpu", "fused", "p0"))
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "model_new.py"
            path.write_text(MODEL_NEW)
            self.assertEqual(kiln.modelnew("kb-relu", path)["source"], MODEL_NEW)
            self.assertEqual(kiln.modelnew("kb-relu", str(path))["source"], MODEL_NEW)
        # Sent as it is: no launch plan, the file as written.
        sent = json.loads(_wire.submit(kiln.candidate.candidate_dict(kiln.modelnew("kb-relu", MODEL_NEW))).body or b"")
        self.assertEqual(sent, {"problem": "kb-relu", "language": "modelnew", "source": MODEL_NEW})
        self.assertEqual(kiln.HOSTED_LANGUAGES, ("modelnew", "modelnew-cpu"))

    def test_a_file_without_model_new_is_refused_before_sending(self) -> None:
        for bad in ["import torch\nclass Model(nn.Module):\n    pass\n",
                    "def f():\n    class ModelNew(nn.Module):\n        pass\n",
                    "class ModelNewer(nn.Module):\n    pass\n",
                    "no/such/file.py"]:
            with self.assertRaisesRegex(ValueError, "class ModelNew"):
                kiln.modelnew("p", bad)
        with self.assertRaises(TypeError):
            kiln.modelnew("p", b"class ModelNew(nn.Module): pass")  # type: ignore[arg-type]
        self.assertTrue(kiln.defines_model_new("x = 1\nclass ModelNew:\n    pass\n"))
        self.assertTrue(kiln.defines_model_new("class  ModelNew (torch.nn.Module):\n"))

    def test_rewards_take_modelnew_sources_without_a_plan(self) -> None:
        r = importlib.import_module("kiln.rewards")  # the module: kiln.rewards is the function
        good, bad = r._prepare(["kb-relu"] * 2, [MODEL_NEW, {"source": MODEL_NEW}], "modelnew-cpu", {"kb-relu": None})
        self.assertEqual(bad, [])
        self.assertEqual([c for _, c in good],
                         [{"problem": "kb-relu", "language": "modelnew-cpu", "source": MODEL_NEW}] * 2)
        # A C source with no plan to take is still the caller's error.
        _, bad = r._prepare(["kb-relu"], ["void k(){}"], "c", {"kb-relu": None})
        self.assertEqual(bad[0].verdict, kiln.CLIENT_ERROR)

    def test_trust_is_parsed_and_defaults_to_contract(self) -> None:
        base = {"verdict": "ok", "message": "m", "backend": "cuda"}
        self.assertEqual(kiln.Evaluation.from_dict(base).trust, "contract")
        self.assertEqual(kiln.Evaluation.from_dict({**base, "trust": "hosted"}).trust, "hosted")
        rec = {"id": "c1", "backend": "cuda", "candidate": {"problem": "p", "language": "modelnew"},
               "job": {"id": 1, "state": "queued"}, "evaluation": None}
        self.assertEqual(kiln.CandidateRecord.from_dict({**rec, "trust": "hosted"}).trust, "hosted")
        self.assertEqual(kiln.CandidateRecord.from_dict(rec).trust, "hosted", "from the language")
        plain = {**rec, "candidate": {"problem": "p", "language": "cuda"}, "evaluation": base}
        self.assertEqual(kiln.CandidateRecord.from_dict(plain).trust, "contract")
        r = kiln.CandidateRecord.from_dict({**plain, "evaluation": {**base, "trust": "hosted"}})
        assert r.evaluation is not None
        self.assertEqual((r.trust, r.evaluation.trust), ("hosted", "hosted"))
        s = kiln.CandidateSummary.from_dict({"id": "c1", "problem": "p", "backend": "host",
                                             "language": "modelnew-cpu", "trust": "hosted"})
        self.assertEqual((s.language, s.trust), ("modelnew-cpu", "hosted"))
        self.assertEqual(kiln.CandidateSummary.from_dict({"id": "c2"}).trust, "contract")


class Tracking(unittest.TestCase):
    def setUp(self) -> None:
        self.now = 0.0
        self.t = Tracker(timeout=10.0, clock=lambda: self.now)

    @staticmethod
    def sub(cid: str, **kw: object) -> Submission:
        return Submission.from_dict({"id": cid, "job_id": 1, "duplicate": False, **kw})

    @staticmethod
    def record(cid: str, verdict: Optional[str] = "ok", state: str = "done") -> kiln.CandidateRecord:
        ev = {"verdict": verdict, "message": "m", "backend": "host"} if verdict else None
        return kiln.CandidateRecord.from_dict(
            {"id": cid, "job": {"id": 1, "state": state, "error": "x"}, "evaluation": ev})

    def test_event_before_submission_answer_is_not_lost(self) -> None:
        self.t.on_event(kiln.Event("job", {"candidate_id": "a", "state": "done"}))
        self.assertEqual(self.t.add(0, self.sub("a")), [])
        self.assertEqual(self.t.take_ready(), ["a"])

    def test_same_candidate_twice_finishes_both(self) -> None:
        self.t.add(0, self.sub("a"))
        self.t.add(1, self.sub("a", duplicate=True))
        self.assertEqual(self.t.in_flight, 2)
        self.assertEqual(self.t.resolve(self.record("a", state="running", verdict=None)), [])
        outs = self.t.resolve(self.record("a"))
        self.assertEqual(sorted(o.index for o in outs), [0, 1])
        self.assertEqual(self.t.in_flight, 0)

    def test_failed_job_timeout_and_unusable_backend(self) -> None:
        self.t.add(0, self.sub("a"))
        (o,) = self.t.resolve(self.record("a", verdict=None, state="failed"))
        self.assertIsInstance(o.error, kiln.JobFailed)
        self.t.add(1, self.sub("b"))
        self.now = 10.0
        (o,) = self.t.expired()
        self.assertIsInstance(o.error, kiln.Timeout)
        (o,) = self.t.add(2, self.sub("c", warning="the host backend is not usable here"))
        self.assertIsInstance(o.error, kiln.BackendUnavailable)
        (o,) = self.t.add(3, self.sub("c", duplicate=True))
        self.assertIsInstance(o.error, kiln.BackendUnavailable)
        self.assertEqual(self.t.in_flight, 0)


class Backoff(unittest.TestCase):
    def test_waits_grow_reset_and_give_up(self) -> None:
        now = [0.0]
        b = _Backoff(give_up=10.0, first=0.125, cap=0.5, clock=lambda: now[0], jitter=lambda: 0.0)
        self.assertTrue(b.due())
        self.assertIsNone(b.seconds_to_retry())
        waits = []
        for _ in range(4):
            self.assertFalse(b.refused())
            self.assertFalse(b.due())
            waits.append(b.seconds_to_retry())
            now[0] += waits[-1] or 0
            self.assertTrue(b.due())
        self.assertEqual(waits, [0.125, 0.25, 0.5, 0.5])  # doubling up to the cap
        b.taken()
        self.assertFalse(b.refused())
        self.assertEqual(b.seconds_to_retry(), 0.125)  # started over
        now[0] += 10.0
        self.assertTrue(b.refused())  # full for the whole timeout: final
        self.assertTrue(b.due())
        self.assertTrue(b.refused(), "and the next refusal too, until one is taken")
        self.assertEqual(b.refusals, 7)

    def test_jitter_shortens_by_at_most_half(self) -> None:
        b = _Backoff(give_up=10.0, first=1.0, clock=lambda: 0.0, jitter=lambda: 1.0)
        b.refused()
        self.assertEqual(b.seconds_to_retry(), 0.5)


class FollowerClose(unittest.IsolatedAsyncioTestCase):
    async def test_close_ends_a_reader_that_swallowed_its_cancellation(self) -> None:
        # On Python 3.11, asyncio.wait_for() can swallow a cancellation that lands as its
        # read completes; the follower's reader task then read keep-alives for ever and
        # close() (which awaited it) hung a search's follow at its very end. This reader
        # swallows every cancellation and ends only when its stream is closed.
        class Stubborn:
            def __init__(self) -> None:
                self.closed = asyncio.Event()
                self.cancellations = 0

            def __aiter__(self) -> "Stubborn":
                return self

            async def __anext__(self) -> kiln.Event:
                while True:
                    try:
                        await self.closed.wait()
                    except asyncio.CancelledError:
                        self.cancellations += 1
                        continue
                    raise StopAsyncIteration

            async def aclose(self) -> None:
                self.closed.set()

        from kiln import aio

        stream = Stubborn()
        follower = aio._AsyncFollower(stream)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the reader task is waiting for an event
        closing = asyncio.ensure_future(follower.close())
        done, _ = await asyncio.wait({closing}, timeout=5)  # never cancels close()
        if not done:
            await stream.aclose()  # release it, then fail
            await closing
            self.fail("close() waited for a reader that had swallowed its cancellation")
        closing.result()
        self.assertEqual(stream.cancellations, 1)
        await asyncio.sleep(0)
        self.assertTrue(follower._task.done())


class NoDaemon(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.missing = str(Path(self.tmp.name) / "missing.sock")

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def test_missing_socket(self) -> None:
        c = kiln.Client(self.missing)
        with self.assertRaises(kiln.DaemonNotRunning) as cm:
            c.health()
        self.assertIn("kilnd is not running at " + self.missing, str(cm.exception))
        self.assertIn("Start it with `kilnd`", str(cm.exception))
        with self.assertRaises(kiln.DaemonNotRunning):
            c.events()
        with self.assertRaises(kiln.DaemonNotRunning):
            list(c.submit_many([{"problem": "p", "source": "x"}]))
        with self.assertRaises(kiln.DaemonNotRunning):
            kiln.rewards(c, "p", ["void k(){}"], launches=[])

    def test_stale_socket_file(self) -> None:
        # A socket file nobody listens on (a daemon that died without cleaning up).
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(self.missing)
        s.close()
        with self.assertRaises(kiln.DaemonNotRunning):
            kiln.Client(self.missing).health()

    def test_async_missing_socket(self) -> None:
        async def run() -> None:
            c = kiln.AsyncClient(self.missing)
            with self.assertRaises(kiln.DaemonNotRunning):
                await c.health()
            with self.assertRaises(kiln.DaemonNotRunning):
                await c.events()
            with self.assertRaises(kiln.DaemonNotRunning):
                [o async for o in c.submit_many([{"problem": "p", "source": "x"}])]

        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
