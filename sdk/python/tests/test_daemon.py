"""The blocking client against a real kilnd on a temporary socket and state directory.

Tests of verdicts need the host backend; they skip, saying why, only while
``/v1/info`` reports it not usable. Everything else runs against any kilnd.
"""

from __future__ import annotations

import functools
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TypeVar

import harness
from harness import BROKEN, HONEST, WRONG, double_candidate, double_source, unique, write_double_problem

import kiln

DAEMON: Optional[harness.Daemon] = None
HOST_USABLE = False
HOST_DETAIL = ""
#: Per-candidate limit for evaluations in these tests, seconds.
EVAL_TIMEOUT = 300.0

F = TypeVar("F", bound=Callable[..., Any])


def setUpModule() -> None:  # noqa: N802 - unittest's name
    global DAEMON, HOST_USABLE, HOST_DETAIL
    DAEMON = harness.Daemon()
    HOST_USABLE, HOST_DETAIL = DAEMON.host_backend()


def tearDownModule() -> None:  # noqa: N802 - unittest's name
    if DAEMON is not None:
        DAEMON.stop()


def needs_host(test: F) -> F:
    """Skips ``test`` while this kilnd's host backend is not usable."""

    @functools.wraps(test)
    def wrapper(self: unittest.TestCase, *a: Any, **kw: Any) -> Any:
        if not HOST_USABLE:
            self.skipTest(f"/v1/info says the host backend is not usable: {HOST_DETAIL}")
        try:
            return test(self, *a, **kw)
        except (AssertionError, kiln.KilnError) as e:
            assert DAEMON is not None
            raise AssertionError(f"{e!r}\n--- kilnd log, last lines ---\n{DAEMON.log()[-4000:]}") from e

    return wrapper  # type: ignore[return-value]


class WithProblem(unittest.TestCase):
    """Registers a fresh y = 2x problem for each test class."""

    client: kiln.Client
    problem: str
    tmp: "tempfile.TemporaryDirectory[str]"
    folder: Path

    @classmethod
    def setUpClass(cls) -> None:
        assert DAEMON is not None
        cls.client = DAEMON.client()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.problem = unique("dbl")
        cls.folder = harness.register_double(cls.client, Path(cls.tmp.name), cls.problem)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def cand(self, body: str, tag: str = "") -> Dict[str, Any]:
        return double_candidate(self.problem, body, tag)


class Daemon(unittest.TestCase):
    def test_health_info_devices_metrics(self) -> None:
        assert DAEMON is not None
        c = DAEMON.client()
        h = c.health()
        self.assertEqual(h.status, "ok")
        self.assertTrue(h.version)
        self.assertEqual(h.running, 0)
        cluster = c.cluster()
        self.assertIs(cluster["clustered"], False)
        self.assertTrue(cluster["this_node"]["id"])
        info = c.info()
        self.assertEqual(info.version, h.version)
        self.assertEqual(info.api, "v1")
        host = info.backend("host")
        assert host is not None
        self.assertTrue(host.detail)
        self.assertGreater(info.host.get("cpus", 0), 0)
        self.assertEqual(info.socket, str(DAEMON.socket))
        devices = c.devices()
        self.assertTrue(devices.gpus or devices.error, "no GPUs must come with a reason")
        self.assertIn("kiln_requests_total", c.metrics())


class Problems(WithProblem):
    def test_register_again_is_unchanged_and_listed(self) -> None:
        spec = harness.double_problem_spec(self.problem)
        self.assertEqual(self.client.add_problem(spec), kiln.ProblemAdded(self.problem, False))
        names = [p.name for p in self.client.problems()]
        self.assertIn(self.problem, names)
        p = self.client.problem(self.problem)
        self.assertEqual((p.name, p.summary, p.backends), (self.problem, "y = 2x", ["host"]))
        self.assertEqual(p.derived["input_bytes"], 4096)
        self.assertIn("ref_double", p.spec["reference"]["host"]["source"])
        seed = p.seed_candidate("host")
        assert seed is not None
        self.assertEqual(seed["launches"][0]["kernel"], "double_it")

    def test_same_name_different_spec_is_a_conflict(self) -> None:
        spec = harness.double_problem_spec(self.problem)
        spec["summary"] = "something else"
        with self.assertRaises(kiln.Conflict) as cm:
            self.client.add_problem(spec)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "conflict"))

    def test_invalid_spec_is_a_bad_request(self) -> None:
        spec = harness.double_problem_spec(unique("bad"))
        spec["tensor"] = [t for t in spec["tensor"] if t["role"] == "input"]
        with self.assertRaises(kiln.BadRequest) as cm:
            self.client.add_problem(spec)
        self.assertEqual(cm.exception.code, "invalid_problem")
        self.assertIn("output", cm.exception.message)

    @unittest.skipUnless(harness.has_toml_parser(), "no TOML parser here (Python < 3.11 without tomli)")
    def test_add_problems_registers_a_folder_of_folders(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            names = [unique("many"), unique("many")]
            for n in names:
                write_double_problem(Path(d), n)
            added = self.client.add_problems(d)
            self.assertEqual(sorted(a.name for a in added), sorted(names))
            self.assertTrue(all(a.created for a in added))

    def test_unknown_problem_is_not_found(self) -> None:
        with self.assertRaises(kiln.NotFound) as cm:
            self.client.problem("no-such-problem")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        self.assertIn("no-such-problem", cm.exception.message)


class Candidates(WithProblem):
    def test_submit_without_waiting_then_duplicate(self) -> None:
        sub = self.client.submit(self.cand(HONEST, "nowait"), wait=False)
        self.assertRegex(sub.id, r"^[0-9a-f]{32}$")
        self.assertFalse(sub.duplicate)
        self.assertEqual(sub.state, "queued")
        self.assertEqual(bool(sub.warning), not HOST_USABLE)
        again = self.client.submit(self.cand(HONEST, "nowait") | {"note": "same code"}, wait=False)
        self.assertTrue(again.duplicate)
        self.assertEqual((again.id, again.job_id), (sub.id, sub.job_id))
        assert again.record is not None
        self.assertEqual(again.record.candidate["problem"], self.problem)
        rec = self.client.get(sub.id)
        assert rec.job is not None
        self.assertEqual((rec.id, rec.backend, rec.job.id), (sub.id, "host", sub.job_id))
        self.assertEqual(self.client.job(sub.job_id).candidate_id, sub.id)
        listed = self.client.candidates(self.problem, limit=1000)
        self.assertIn(sub.id, [c.id for c in listed])
        self.assertTrue(all(c.problem == self.problem for c in listed))

    def test_problem_argument_overrides(self) -> None:
        c = self.cand(HONEST, "override")
        c["problem"] = "whatever"
        sub = self.client.submit(c, problem=self.problem, wait=False)
        self.assertEqual(self.client.get(sub.id).candidate["problem"], self.problem)

    def test_api_errors_are_typed(self) -> None:
        c = self.client
        with self.assertRaises(kiln.NotFound):
            c.submit(self.cand(HONEST), problem="no-such-problem", wait=False)
        with self.assertRaises(kiln.BadRequest) as cm:
            c.submit(self.cand(HONEST) | {"language": "fortran"}, wait=False)
        self.assertEqual(cm.exception.code, "invalid_field")
        self.assertIn("language", cm.exception.message)
        with self.assertRaises(kiln.BadRequest) as cm:
            c.submit(self.cand(HONEST) | {"bogus": 1}, wait=False)
        self.assertIn("bogus", cm.exception.message)
        with self.assertRaises(kiln.BadRequest) as cm:
            c.submit(self.cand(HONEST) | {"launches": []}, wait=False)
        self.assertEqual(cm.exception.code, "invalid_candidate")
        with self.assertRaises(kiln.BadRequest):
            c.get("0" * 32, wait=601)
        with self.assertRaises(kiln.NotFound):
            c.get("0" * 32)
        with self.assertRaises(kiln.NotFound):
            c.job(987654321)

    def test_events_stream_the_submission(self) -> None:
        with self.client.events(timeout=30) as stream:
            self.assertEqual(next(stream).name, "hello")
            sub = self.client.submit(self.cand(HONEST, "events"), wait=False)
            for ev in stream:
                if ev.name == "job" and ev.candidate_id == sub.id:
                    # kilnd wakes its scheduler right after it publishes "queued", so with
                    # a usable backend a later state may come first.
                    self.assertIn(ev.state, ("queued", "compiling"))
                    self.assertEqual((ev.job_id, ev.problem), (sub.job_id, self.problem))
                    break


class UnusableBackend(unittest.TestCase):
    """Candidates for a backend that is not usable here (cuda without a GPU) wait in the
    queue for ever: the client says so at once instead of waiting out its timeout."""

    client: kiln.Client
    problem: str

    @classmethod
    def setUpClass(cls) -> None:
        assert DAEMON is not None
        cls.usable, _ = DAEMON.backend("cuda")
        cls.client = DAEMON.client()
        cls.problem = unique("cuda-dbl")
        cls.client.add_problem(harness.cuda_problem_spec(cls.problem))

    def setUp(self) -> None:
        if self.usable:
            self.skipTest("the cuda backend is usable here: no job waits for ever")

    def test_waiting_fails_fast(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(kiln.BackendUnavailable) as cm:
            self.client.submit(harness.cuda_candidate(self.problem, "unusable"))
        self.assertIn("cuda backend is not usable", str(cm.exception))
        self.assertEqual(self.client.get(cm.exception.candidate_id).job.state, "queued")  # type: ignore[union-attr]
        with self.assertRaises(kiln.BackendUnavailable):  # a duplicate says so too
            self.client.submit(harness.cuda_candidate(self.problem, "unusable"))
        self.assertLess(time.monotonic() - t0, 10)

    def test_submit_many_queues_all_and_returns(self) -> None:
        batch = [harness.cuda_candidate(self.problem, f"unusable-many-{i}") for i in range(50)]
        outcomes = list(self.client.submit_many(batch, window=16))
        self.assertEqual(sorted(o.index for o in outcomes), list(range(50)))
        self.assertTrue(all(isinstance(o.error, kiln.BackendUnavailable) for o in outcomes))
        ids = {o.candidate_id for o in outcomes}
        self.assertEqual(len(ids), 50)
        self.assertTrue(ids <= {c.id for c in self.client.candidates(self.problem, limit=1000)})

    def test_rewards_say_no_verdict(self) -> None:
        (r,) = kiln.rewards(self.client, self.problem, [harness.cuda_candidate(self.problem, "rw")], language="cuda")
        self.assertEqual(r.verdict, kiln.NO_VERDICT)
        self.assertIsNotNone(r.id)


class Verdicts(WithProblem):
    @needs_host
    def test_honest_and_broken(self) -> None:
        ev = self.client.submit(self.cand(HONEST, "honest"), timeout=EVAL_TIMEOUT)
        self.assertEqual(ev.verdict, "ok", ev.message)
        self.assertTrue(ev.ok)
        self.assertEqual(ev.backend, "host")
        assert ev.timing is not None
        self.assertGreater(ev.timing.median_us, 0)
        self.assertGreater(ev.timing.n or 0, 0)
        self.assertGreater(ev.evidence.trials_run, 0)
        self.assertEqual(ev.evidence.trials_passed, ev.evidence.trials_run)
        rec = self.client.get(ev.candidate_id or "")
        assert rec.job is not None and rec.evaluation is not None
        self.assertEqual((rec.job.state, rec.evaluation.verdict), ("done", "ok"))

        bad = self.client.submit(self.cand(BROKEN, "broken"), timeout=EVAL_TIMEOUT)
        self.assertEqual(bad.verdict, "compile_error", bad.message)
        self.assertFalse(bad.ok)
        self.assertIsNone(bad.timing)
        # Submitting it again is answered from the store.
        self.assertEqual(self.client.submit(self.cand(BROKEN, "broken")).verdict, "compile_error")

    @needs_host
    def test_wrong_answer_has_evidence(self) -> None:
        ev = self.client.submit(self.cand(WRONG, "wrong"), timeout=EVAL_TIMEOUT)
        self.assertEqual(ev.verdict, "wrong_answer", ev.message)
        self.assertTrue(ev.evidence.errors)
        self.assertGreater(ev.evidence.errors[0].mismatches or 0, 0)

    @needs_host
    def test_seed_kernel_is_ok(self) -> None:
        seed = self.client.problem(self.problem).seed_candidate()
        assert seed is not None
        self.assertEqual(self.client.submit(seed, timeout=EVAL_TIMEOUT).verdict, "ok")

    @needs_host
    def test_submit_many_fifty(self) -> None:
        def body(i: int) -> str:
            return BROKEN if i % 10 == 3 else WRONG if i % 10 == 7 else HONEST

        batch = [self.cand(body(i), f"many-{i}") for i in range(50)]
        seen: List[int] = []
        for o in self.client.submit_many(batch, timeout=EVAL_TIMEOUT, window=16):
            seen.append(o.index)
            assert o.evaluation is not None, f"candidate {o.index}: {o.error!r}"
            want = {BROKEN: "compile_error", WRONG: "wrong_answer", HONEST: "ok"}[body(o.index)]
            self.assertEqual(o.evaluation.verdict, want, f"candidate {o.index}: {o.evaluation.message}")
        self.assertEqual(sorted(seen), list(range(50)))

    @needs_host
    def test_events_reach_done(self) -> None:
        with self.client.events(timeout=60) as stream:
            next(stream)
            sub = self.client.submit(self.cand(HONEST, "events-done"), wait=False)
            states = []
            for ev in stream:
                if ev.candidate_id == sub.id:
                    states.append(ev.state)
                    if ev.finished:
                        self.assertEqual(ev.verdict, "ok")
                        break
        self.assertIn("queued", states)  # not necessarily first: kilnd wakes its scheduler before publishing it
        # Compiled (waiting for the lane), then running on it: only the last counts an attempt.
        self.assertLess(states.index("compiled"), states.index("running"))
        self.assertEqual(states[-1], "done")


class Searches(WithProblem):
    def setUp(self) -> None:
        try:
            self.client.start_search("no-such-problem", "example-minimal")
        except kiln.ServerError as e:
            if e.code == "searches_unavailable":
                self.skipTest(f"kilnd cannot run searches here: {e.message}")
            raise
        except kiln.NotFound:
            pass

    def test_search_errors_are_typed(self) -> None:
        unusable = "unknown_proposer" if HOST_USABLE else "no_backend"
        with self.assertRaises(kiln.BadRequest) as cm:
            self.client.start_search(self.problem, "no-such-proposer")
        self.assertEqual(cm.exception.code, unusable)
        with self.assertRaises(kiln.BadRequest) as cm:
            self.client.start_search(self.problem, "upload", wasm=b"not a wasm file")
        self.assertEqual(cm.exception.code, "invalid_plugin" if HOST_USABLE else "no_backend")
        for call in (self.client.search, self.client.cancel_search, self.client.search_log, self.client.search_archive):
            with self.assertRaises(kiln.NotFound):
                call("s-000000000000")
        self.assertIsInstance(self.client.searches(state="running"), list)

    @needs_host
    def test_search_events_iterate_to_its_end(self) -> None:
        wasm = harness.proposer_wasm()
        if wasm is None:
            self.skipTest("no example proposer component: `cargo test --workspace` builds it under "
                          "target/plugin-guests, or set KILN_TEST_PROPOSER")
        name = unique("knob")
        self.client.add_problem(harness.knob_problem_spec(name))
        started = self.client.start_search(name, "example-minimal", wasm=wasm, budget=10, time_limit_s=600)
        self.assertEqual((started.problem, started.proposer, started.budget), (name, "example-minimal", 10))
        events = list(self.client.follow_search(started.id, timeout=EVAL_TIMEOUT))
        self.assertTrue(all(e.search_id == started.id for e in events))
        self.assertTrue(events[-1].search_ended)
        self.assertEqual(events[-1].state, "done", self.client.search(started.id))
        final = self.client.search(started.id)
        self.assertEqual((final.state, final.submitted, final.evaluated), ("done", 2, 2))
        self.assertIsNotNone(final.best_candidate)
        archive = self.client.search_archive(started.id)
        self.assertEqual(len(archive), 2)
        self.assertTrue(all(e.evaluation is not None and e.evaluation.ok for e in archive))
        self.assertIn(final.best_candidate, [e.id for e in archive])
        log = self.client.search_log(started.id)
        self.assertTrue(any("UNROLL=2" in line.message for line in log))
        self.assertEqual(self.client.search_log(started.id, after=log[-1].id), [])
        self.assertIn(started.id, [s.id for s in self.client.searches()])
        with self.assertRaises(kiln.Conflict):
            self.client.cancel_search(started.id)
        # Following a search that has ended yields its final state at once.
        (again,) = list(self.client.follow_search(started.id))
        self.assertEqual(again.state, "done")


class Rewards(WithProblem):
    def test_bad_inputs_are_client_errors(self) -> None:
        records = kiln.rewards(self.client, self.problem, [42, {"source": 5}, {"source": "void f(){}", "bogus": 1}])  # type: ignore[list-item]
        self.assertEqual([r.verdict for r in records], [kiln.CLIENT_ERROR] * 3)
        self.assertEqual([r.index for r in records], [0, 1, 2])
        self.assertIn("bogus", records[2].message)
        self.assertFalse(any(r.ok for r in records))

    def test_unknown_problem_raises(self) -> None:
        with self.assertRaises(kiln.NotFound):
            kiln.rewards(self.client, "no-such-problem", ["void double_it(){}"])

    @needs_host
    def test_rewards(self) -> None:
        def seedlike(body: str, tag: str) -> str:
            return double_source(body, tag).replace("void k(", "void double_it(")

        sources: List[Any] = [
            seedlike(HONEST, "rw0"),
            seedlike(WRONG, "rw1"),
            seedlike(BROKEN, "rw2"),
            None,
            self.cand(HONEST, "rw4"),  # a full candidate dict
        ]
        records = kiln.rewards(self.client, self.problem, sources, baseline_us=1000.0, timeout=EVAL_TIMEOUT)
        self.assertEqual([r.verdict for r in records],
                         ["ok", "wrong_answer", "compile_error", kiln.CLIENT_ERROR, "ok"])
        for r in (records[0], records[4]):
            assert r.median_us is not None and r.speedup is not None
            self.assertTrue(r.ok)
            self.assertAlmostEqual(r.speedup, 1000.0 / r.median_us)
        self.assertIsNone(records[1].speedup)

    @needs_host
    def test_rewards_by_kernelbench_id(self) -> None:
        # A problem named the way `kiln problems import kernelbench` names them: found by its id.
        level, pid = 9, 7
        name = f"kb-l{level}-{pid}-double"
        self.client.add_problem(harness.double_problem_spec(name))
        seed = double_source(HONEST, "kb0").replace("void k(", "void double_it(")
        wrong = double_source(WRONG, "kb1").replace("void k(", "void double_it(")
        records = kiln.rewards(self.client, f"level{level}/{pid}", [seed, wrong], timeout=EVAL_TIMEOUT)
        self.assertEqual([(r.verdict, r.problem, r.trust) for r in records],
                         [("ok", name, "contract"), ("wrong_answer", name, "contract")])
        self.assertEqual(records[0].reward, 1.0)  # correct; no baseline to compare with
        self.assertEqual((records[0].speedup_eager, records[0].speedup_compile), (None, None))
        self.assertEqual(records[1].reward, 0.0)
        self.assertTrue(records[1].message)
        with self.assertRaises(kiln.NotFound):
            kiln.rewards(self.client, kiln.KernelBenchProblem(level, pid + 1), [seed])


if __name__ == "__main__":
    unittest.main()
