"""Lifted ModelNew files (issue 29): kilnd lifts a hosted file's recorded GPU work into a
contract candidate it queues by itself; where it did, the lifted result is the file's
result, with the hosted one beside it. The record's ``lift`` read leniently, the batch
tracker waiting for the lifted job, and rewards over the stand-in daemon."""

from __future__ import annotations

import time
import unittest
from typing import Any, Dict, List, Optional

import harness  # noqa: F401 - puts the package on sys.path
import kiln
from fake_kilnd import FakeKilnd
from kiln._batch import Tracker
from kiln.models import Lift, Submission

FILE_ID = "f" * 32
LIFTED_ID = "a" * 32
HOSTED_EV: Dict[str, Any] = {
    "verdict": "ok", "message": "correct on 3 trials", "backend": "cuda", "trust": "hosted",
    "timing": {"median_us": 12.0}, "telemetry": {"device": {"name": "NVIDIA H200"}},
}
LIFTED_EV: Dict[str, Any] = {
    "verdict": "ok", "message": "correct on 2 trials", "backend": "cuda", "trust": "lifted",
    "timing": {"median_us": 3.0}, "telemetry": {"device": {"name": "NVIDIA H200"}},
}


def lifted(**kw: Any) -> Dict[str, Any]:
    """A ``lift`` of the lifted kind, pending unless ``kw`` says otherwise."""
    base: Dict[str, Any] = {"outcome": "lifted", "candidate_id": LIFTED_ID, "notes": ["dropped a sync"],
                            "state": "queued", "verdict": None, "message": None, "median_us": None,
                            "hosted_median_us": 12.0, "evaluation": None, "speedups": None}
    return {**base, **kw}


DONE = lifted(state="done", verdict="ok", message="correct on 2 trials", median_us=3.0, evaluation=LIFTED_EV,
              speedups=[{"baseline": "torch-eager-fp32", "precision": "fp32", "baseline_us": 30.0, "speedup": 10.0}])


def file_record(lift: Any = None, evaluation: Optional[Dict[str, Any]] = HOSTED_EV, **kw: Any) -> kiln.CandidateRecord:
    d: Dict[str, Any] = {"id": FILE_ID, "backend": "cuda", "trust": "hosted",
                         "candidate": {"problem": "kb", "language": "modelnew", "source": "class ModelNew: ..."},
                         "job": {"id": 7, "candidate_id": FILE_ID, "state": "done"}, "evaluation": evaluation,
                         "speedups": [{"baseline": "torch-eager-fp32", "speedup": 2.5}], **kw}
    if lift is not None:
        d["lift"] = lift
    return kiln.CandidateRecord.from_dict(d)


class Records(unittest.TestCase):
    def test_a_lifted_result_is_the_files_result(self) -> None:
        r = file_record(DONE)
        assert r.lift is not None and r.evaluation is not None and r.hosted_evaluation is not None
        self.assertTrue(r.finished)
        self.assertEqual((r.trust, r.evaluation.trust, r.evaluation.verdict), ("lifted", "lifted", "ok"))
        self.assertEqual((r.evaluation.median_us, r.evaluation.candidate_id), (3.0, LIFTED_ID))
        self.assertEqual(r.evaluation.speedups, {"torch-eager-fp32": 10.0})  # the lift's, not the file's
        self.assertEqual((r.hosted_evaluation.median_us, r.hosted_evaluation.trust), (12.0, "hosted"))
        self.assertEqual(r.hosted_evaluation.speedups, {"torch-eager-fp32": 2.5})
        self.assertEqual((r.lift.outcome, r.lift.candidate_id, r.lift.notes), ("lifted", LIFTED_ID, ["dropped a sync"]))
        self.assertEqual((r.lift.verdict, r.lift.median_us, r.lift.hosted_median_us), ("ok", 3.0, 12.0))
        self.assertFalse(r.lift.pending or r.lift.failed)
        # A lifted evaluation that does not say its trust is still lifted.
        untold = file_record({**DONE, "evaluation": {k: v for k, v in LIFTED_EV.items() if k != "trust"}})
        self.assertEqual((untold.trust, untold.evaluation.trust if untold.evaluation else None), ("lifted", "lifted"))

    def test_a_pending_lift_is_not_finished(self) -> None:
        for state in (None, "queued", "compiling", "compiled", "running", "done"):
            r = file_record(lifted(state=state))
            assert r.lift is not None
            self.assertTrue(r.lift.pending, state)
            self.assertFalse(r.finished, state)
            # Meanwhile the record holds the file's own result.
            self.assertEqual((r.trust, r.evaluation.trust if r.evaluation else None), ("hosted", "hosted"))
            self.assertIsNone(r.hosted_evaluation)

    def test_a_failed_lifted_job_leaves_the_hosted_result(self) -> None:
        r = file_record(lifted(state="failed"))
        assert r.lift is not None and r.evaluation is not None
        self.assertTrue(r.finished)
        self.assertTrue(r.lift.failed)
        self.assertFalse(r.lift.pending)
        self.assertEqual((r.trust, r.evaluation.median_us, r.evaluation.candidate_id), ("hosted", 12.0, FILE_ID))
        self.assertIsNone(r.hosted_evaluation)

    def test_a_lifted_candidate_judged_wrong_is_the_files_verdict(self) -> None:
        wrong = {**LIFTED_EV, "verdict": "wrong_answer", "message": "y: 3 elements outside", "timing": None}
        r = file_record(lifted(state="done", verdict="wrong_answer", evaluation=wrong))
        assert r.evaluation is not None and r.hosted_evaluation is not None
        self.assertEqual((r.evaluation.verdict, r.evaluation.ok, r.trust), ("wrong_answer", False, "lifted"))
        self.assertTrue(r.hosted_evaluation.ok)

    def test_not_lifted_keeps_the_hosted_result(self) -> None:
        r = file_record({"outcome": "not_lifted", "code": "memset", "reason": "forward calls cudaMemsetAsync"})
        assert r.lift is not None and r.evaluation is not None
        self.assertTrue(r.finished)
        self.assertEqual((r.lift.outcome, r.lift.code, r.lift.reason),
                         ("not_lifted", "memset", "forward calls cudaMemsetAsync"))
        self.assertFalse(r.lift.lifted or r.lift.pending)
        self.assertEqual((r.trust, r.evaluation.median_us), ("hosted", 12.0))
        self.assertIsNone(r.hosted_evaluation)
        self.assertIsNone(file_record().lift)  # nothing tried

    def test_malformed_lifts_are_ignored(self) -> None:
        for bad in ["lifted", 7, [], {}, {"outcome": "hoisted", "candidate_id": LIFTED_ID},
                    {"outcome": "lifted"}, {"outcome": "lifted", "candidate_id": 5},
                    {"outcome": "lifted", "candidate_id": ""}, {"outcome": 1, "code": "memset"}]:
            r = file_record(bad)
            self.assertIsNone(r.lift, bad)
            self.assertTrue(r.finished, bad)
            self.assertEqual((r.trust, r.evaluation.median_us if r.evaluation else None), ("hosted", 12.0))
        # A lift of the right kind whose parts are the wrong shape: read what is readable.
        odd = file_record({"outcome": "lifted", "candidate_id": LIFTED_ID, "notes": "x", "state": 3,
                           "verdict": ["ok"], "median_us": "fast", "evaluation": "nope", "speedups": 9})
        assert odd.lift is not None
        self.assertEqual((odd.lift.notes, odd.lift.state, odd.lift.verdict, odd.lift.median_us), ([], None, None, None))
        self.assertTrue(odd.lift.pending)
        # An evaluation without a verdict is no result to stand for the file.
        empty = file_record(lifted(state="done", verdict="ok", evaluation={"timing": {"median_us": 1.0}}))
        assert empty.lift is not None and empty.evaluation is not None
        self.assertIsNone(empty.lift.evaluation)
        self.assertEqual((empty.trust, empty.evaluation.median_us, empty.finished), ("hosted", 12.0, True))
        self.assertIsNone(Lift.from_dict(None))

    def test_a_duplicates_record_takes_the_outcome_from_the_telemetry(self) -> None:
        # The answer to a duplicate submission has no `lift`: the file's evaluation
        # recorded the outcome, so a lifted file is fetched again for its lifted result.
        tele = {"device": {"name": "NVIDIA H200"},
                "lift": {"outcome": "lifted", "candidate_id": LIFTED_ID, "candidate": {"language": "cuda"}, "notes": []}}
        sub = Submission.from_dict({"id": FILE_ID, "job_id": 7, "duplicate": True, "record": {
            "id": FILE_ID, "candidate": {"language": "modelnew"}, "job": {"id": 7, "state": "done"},
            "evaluation": {**HOSTED_EV, "telemetry": tele}}})
        assert sub.record is not None and sub.record.lift is not None
        self.assertEqual((sub.record.lift.candidate_id, sub.record.lift.state), (LIFTED_ID, None))
        self.assertFalse(sub.record.finished)
        not_lifted = {**tele, "lift": {"outcome": "not_lifted", "code": "side_stream", "reason": "r"}}
        r = file_record(evaluation={**HOSTED_EV, "telemetry": not_lifted})
        self.assertEqual((r.lift.code if r.lift else None, r.finished), ("side_stream", True))
        # kilnd's own `lift`, even malformed, wins over the telemetry's.
        self.assertIsNone(file_record("junk", evaluation={**HOSTED_EV, "telemetry": tele}).lift)

    def test_the_summary_and_the_cli_trust_modes(self) -> None:
        s = kiln.CandidateSummary.from_dict({"id": LIFTED_ID, "language": "cuda", "trust": "lifted"})
        self.assertEqual(s.trust, "lifted")


class Tracking(unittest.TestCase):
    def setUp(self) -> None:
        self.now = 0.0
        self.t = Tracker(timeout=10.0, clock=lambda: self.now)

    def start(self, index: int = 0) -> None:
        self.assertEqual(self.t.add(index, Submission.from_dict({"id": FILE_ID, "job_id": 7})), [])

    def done(self, cid: str) -> kiln.Event:
        return kiln.Event("job", {"type": "job", "candidate_id": cid, "state": "done", "verdict": "ok"})

    def test_the_lifted_jobs_event_makes_the_file_ready(self) -> None:
        self.start()
        self.t.on_event(self.done(FILE_ID))
        self.assertEqual(self.t.take_ready(), [FILE_ID])
        self.assertEqual(self.t.resolve(file_record(lifted(state=None))), [])  # not queued yet
        self.assertEqual(self.t.resolve(file_record(lifted(state="running"))), [])
        self.assertEqual(self.t.in_flight, 1)
        self.t.on_event(kiln.Event("job", {"candidate_id": LIFTED_ID, "state": "running"}))
        self.assertFalse(self.t.has_ready)
        self.t.on_event(self.done(LIFTED_ID))
        self.assertTrue(self.t.has_ready)
        self.assertEqual(self.t.take_ready(), [FILE_ID])  # the file's id, never the lifted one
        (o,) = self.t.resolve(file_record(DONE))
        assert o.evaluation is not None and o.record is not None
        self.assertEqual((o.candidate_id, o.evaluation.trust, o.evaluation.median_us), (FILE_ID, "lifted", 3.0))
        self.assertEqual(o.record.hosted_evaluation.median_us if o.record.hosted_evaluation else None, 12.0)
        self.assertEqual(self.t.in_flight, 0)
        self.t.on_event(self.done(LIFTED_ID))  # nothing is watched any more
        self.assertFalse(self.t.has_ready)

    def test_a_lifted_job_seen_finished_before_the_lift_was_known(self) -> None:
        self.start()
        self.t.on_event(self.done(LIFTED_ID))  # not ours (yet): remembered
        self.assertFalse(self.t.has_ready)
        self.assertEqual(self.t.resolve(file_record(lifted(state="running"))), [])  # a stale read
        self.assertEqual(self.t.take_ready(), [FILE_ID])
        # Still pending on the next read: no loop of fetches, it waits for the next sweep.
        self.assertEqual(self.t.resolve(file_record(lifted(state="running"))), [])
        self.assertEqual(self.t.take_ready(), [])
        (o,) = self.t.resolve(file_record(DONE))
        self.assertEqual(o.evaluation.trust if o.evaluation else None, "lifted")

    def test_a_failed_lifted_job_resolves_with_the_hosted_result(self) -> None:
        self.start(0)
        self.start(1)
        self.t.resolve(file_record(lifted()))
        self.t.on_event(kiln.Event("job", {"candidate_id": LIFTED_ID, "state": "failed", "error": "x"}))
        self.assertEqual(self.t.take_ready(), [FILE_ID])
        outs = self.t.resolve(file_record(lifted(state="failed")))
        self.assertEqual(sorted(o.index for o in outs), [0, 1])
        for o in outs:
            assert o.evaluation is not None
            self.assertEqual((o.evaluation.trust, o.evaluation.median_us, o.error), ("hosted", 12.0, None))

    def test_a_lift_without_a_verdict_in_time_leaves_the_hosted_result(self) -> None:
        self.start()
        self.t.resolve(file_record(lifted(state="running")))
        self.t.add(1, Submission.from_dict({"id": "b" * 32, "job_id": 8}))
        self.now = 10.0
        outs = {o.index: o for o in self.t.expired()}
        assert outs[0].evaluation is not None and outs[0].record is not None and outs[0].record.lift is not None
        self.assertEqual((outs[0].evaluation.trust, outs[0].evaluation.median_us), ("hosted", 12.0))
        self.assertTrue(outs[0].record.lift.pending)
        self.assertIsInstance(outs[1].error, kiln.Timeout)  # an ordinary candidate times out
        self.assertEqual(self.t.in_flight, 0)

    def test_a_duplicate_with_a_pending_lift_is_fetched_at_once(self) -> None:
        sub = Submission.from_dict({"id": FILE_ID, "job_id": 7, "duplicate": True, "record": {
            "id": FILE_ID, "job": {"id": 7, "state": "done"}, "evaluation": HOSTED_EV, "lift": lifted()}})
        self.assertEqual(self.t.add(0, sub), [])
        self.assertEqual(self.t.take_ready(), [FILE_ID])
        self.t.on_event(self.done(LIFTED_ID))
        self.assertEqual(self.t.take_ready(), [FILE_ID])
        # A duplicate whose lifted result is already in its record is answered at once.
        done = Submission.from_dict({"id": FILE_ID, "job_id": 7, "duplicate": True, "record": {
            "id": FILE_ID, "job": {"id": 7, "state": "done"}, "evaluation": HOSTED_EV, "lift": DONE}})
        (o,) = self.t.add(1, done)
        self.assertEqual(o.evaluation.trust if o.evaluation else None, "lifted")


def model_new(tag: str, marker: str = "") -> str:
    return (f"import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):  # {tag} {marker}\n"
            f"    def forward(self, x):\n        return torch.relu(x)\n")


#: One source per lifting case, and a plain hosted file (nothing tried).
CASES = ["LIFT_OK", "LIFT_NOT", "LIFT_CRASH", "LIFT_GARBAGE", "LIFT_INCORRECT", ""]
EAGER_US = 40.0


def sources(tag: str) -> List[str]:
    return [model_new(f"{tag}{i}", m) for i, m in enumerate(CASES)]


def fake_kilnd(tc: unittest.TestCase, **kw: Any) -> FakeKilnd:
    fake = FakeKilnd(**kw)
    tc.addCleanup(fake.stop)
    fake.register("kb-l1-19-relu", eager_us=EAGER_US, compile_us=20.0)
    return fake


def check_rewards(tc: unittest.TestCase, records: List[kiln.Reward], fake: FakeKilnd) -> None:
    """The rewards of :func:`sources`."""
    ok, not_lifted, crash, garbage, incorrect, plain = records
    # Lifted: the lifted result is the record, the hosted time beside it.
    assert ok.median_us is not None and ok.hosted_median_us is not None
    tc.assertEqual((ok.verdict, ok.trust, ok.lift), ("ok", "lifted", "lifted"))
    tc.assertLess(ok.median_us, 10.0)  # the fake's lifted times are all below its hosted ones
    tc.assertGreaterEqual(ok.hosted_median_us, 10.0)
    tc.assertAlmostEqual(ok.speedup_eager or 0, EAGER_US / ok.median_us)
    tc.assertEqual(ok.reward, ok.speedup_eager)
    assert ok.id is not None
    tc.assertEqual(fake.records[ok.id]["candidate"]["language"], "modelnew")  # the file's id
    # Not lifted: the hosted result, with the reason's code.
    assert not_lifted.median_us is not None
    tc.assertEqual((not_lifted.verdict, not_lifted.trust, not_lifted.lift), ("ok", "hosted", "memset"))
    tc.assertGreaterEqual(not_lifted.median_us, 10.0)
    tc.assertIsNone(not_lifted.hosted_median_us)
    # The lifted job failed: the hosted result stands, and the message says so.
    assert crash.median_us is not None
    tc.assertEqual((crash.verdict, crash.trust, crash.lift, crash.hosted_median_us), ("ok", "hosted", "lifted", None))
    tc.assertGreaterEqual(crash.median_us, 10.0)
    tc.assertIn("job failed", crash.message)
    # A malformed lift is ignored.
    tc.assertEqual((garbage.verdict, garbage.trust, garbage.lift), ("ok", "hosted", None))
    # The lifted candidate is wrong although the hosted run passed: its verdict counts.
    tc.assertEqual((incorrect.verdict, incorrect.trust, incorrect.reward, incorrect.lift),
                   ("wrong_answer", "lifted", 0.0, "lifted"))
    tc.assertIsNotNone(incorrect.hosted_median_us)
    tc.assertEqual((plain.verdict, plain.trust, plain.lift, plain.hosted_median_us), ("ok", "hosted", None, None))


def check_outcomes(tc: unittest.TestCase, outcomes: List[kiln.Outcome]) -> None:
    """The outcomes of :func:`sources` submitted as they are."""
    tc.assertEqual(sorted(o.index for o in outcomes), list(range(len(CASES))))
    by = {o.index: o for o in outcomes}
    got = []
    for i in range(len(CASES)):
        o = by[i]
        assert o.evaluation is not None and o.record is not None, o
        lift = o.record.lift
        got.append((o.evaluation.verdict, o.evaluation.trust, lift.outcome if lift else None,
                    o.record.hosted_evaluation is not None, o.candidate_id == o.evaluation.candidate_id))
    tc.assertEqual(got, [
        ("ok", "lifted", "lifted", True, False),
        ("ok", "hosted", "not_lifted", False, True),
        ("ok", "hosted", "lifted", False, True),
        ("ok", "hosted", None, False, True),
        ("wrong_answer", "lifted", "lifted", True, False),
        ("ok", "hosted", None, False, True),
    ])


class LiftedRewards(unittest.TestCase):
    """ModelNew files against the stand-in daemon, which lifts them."""

    def test_rewards_with_events(self) -> None:
        fake = fake_kilnd(self)
        check_rewards(self, kiln.rewards(kiln.Client(fake.socket), "level1/19", sources("e"),
                                         language="modelnew", timeout=30.0), fake)

    def test_rewards_with_long_polls_without_an_event_stream(self) -> None:
        fake = fake_kilnd(self, events=False)
        check_rewards(self, kiln.rewards(kiln.Client(fake.socket), "level1/19", sources("l"),
                                         language="modelnew", timeout=30.0), fake)

    def test_polls_without_done_events(self) -> None:
        fake = fake_kilnd(self, publish_done=False)
        outcomes = list(kiln.Client(fake.socket).submit_many(
            [kiln.modelnew("kb-l1-19-relu", s) for s in sources("p")], poll_interval=0.2, timeout=30.0))
        check_outcomes(self, outcomes)

    def test_submit_and_duplicates(self) -> None:
        fake = fake_kilnd(self)
        client = kiln.Client(fake.socket)
        text = model_new("s", "LIFT_OK")
        ev = client.submit(kiln.modelnew("kb-l1-19-relu", text), timeout=30.0)
        assert ev.median_us is not None
        self.assertEqual((ev.verdict, ev.trust), ("ok", "lifted"))
        self.assertLess(ev.median_us, 10.0)
        # Submitted again: the duplicate's answer lacks `lift`, the lifted result still comes.
        again = client.submit(kiln.modelnew("kb-l1-19-relu", text), timeout=30.0)
        self.assertEqual((again.trust, again.median_us, again.candidate_id), ("lifted", ev.median_us, ev.candidate_id))
        t0 = time.monotonic()
        records = kiln.rewards(client, "level1/19", [text] * 3, language="modelnew", timeout=30.0)
        self.assertLess(time.monotonic() - t0, 5.0)  # fetched at once, not at the next 10 s sweep
        self.assertEqual({(r.trust, r.median_us, r.lift) for r in records}, {("lifted", ev.median_us, "lifted")})
        rec = client.get(records[0].id or "")
        assert rec.lift is not None and rec.hosted_evaluation is not None
        self.assertEqual((rec.trust, rec.lift.candidate_id), ("lifted", ev.candidate_id))
        self.assertEqual(client.get(rec.lift.candidate_id or "").trust, "lifted")

    def test_a_lifted_job_without_a_verdict_in_time(self) -> None:
        fake = fake_kilnd(self)
        (r,) = kiln.rewards(kiln.Client(fake.socket), "level1/19", [model_new("stuck", "LIFT_STUCK")],
                            language="modelnew", timeout=2.0)
        self.assertEqual((r.verdict, r.trust, r.lift, r.hosted_median_us), ("ok", "hosted", "lifted", None))
        self.assertIn("no verdict in time", r.message)
        self.assertTrue(r.message.startswith("correct on 3 trials (lifted candidate "), r.message)


class AsyncLiftedRewards(unittest.IsolatedAsyncioTestCase):
    async def test_rewards_with_events(self) -> None:
        fake = fake_kilnd(self)
        records = await kiln.arewards(kiln.AsyncClient(fake.socket), "level1/19", sources("a"),
                                      language="modelnew", timeout=30.0)
        check_rewards(self, records, fake)

    async def test_polls_without_done_events(self) -> None:
        fake = fake_kilnd(self, publish_done=False)
        client = kiln.AsyncClient(fake.socket)
        outcomes = [o async for o in client.submit_many(
            [kiln.modelnew("kb-l1-19-relu", s) for s in sources("ap")], poll_interval=0.2, timeout=30.0)]
        check_outcomes(self, outcomes)


if __name__ == "__main__":
    unittest.main()
