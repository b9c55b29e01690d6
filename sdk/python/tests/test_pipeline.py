"""The pipelining machinery (submit_many, wait, rewards) against a stand-in daemon that
finishes jobs itself, including the paths a real kilnd rarely takes: missed events, a
lagging stream, no event stream at all, failed jobs, candidates that never finish."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import Any, AsyncIterator, Dict, List

import harness  # noqa: F401 - puts the package on sys.path
import kiln
from fake_kilnd import FakeKilnd

LAUNCHES = [{"kernel": "k", "args": ["x", "y", {"i32": 1024}]}]


def cand(tag: str, body: str = "ok") -> Dict[str, Any]:
    return {"problem": "dbl", "language": "c", "source": f"/* {tag} */ {body}", "launches": LAUNCHES}


def mixed_batch(n: int) -> List[Dict[str, Any]]:
    """n distinct candidates: every 7th broken, every 11th with a failing job."""
    out = []
    for i in range(n):
        body = "BROKEN" if i % 7 == 3 else "FAILJOB" if i % 11 == 5 else "ok"
        out.append(cand(f"c{i}", body))
    return out


def check_mixed(tc: unittest.TestCase, outcomes: List[kiln.Outcome], n: int) -> None:
    """Every input has one outcome, and each is what :func:`mixed_batch` asked for."""
    tc.assertEqual(sorted(o.index for o in outcomes), list(range(n)))
    for o in outcomes:
        if o.index % 7 == 3:
            assert o.evaluation is not None, o
            tc.assertEqual(o.evaluation.verdict, "compile_error")
        elif o.index % 11 == 5:
            tc.assertIsInstance(o.error, kiln.JobFailed)
        else:
            tc.assertTrue(o.ok, o)
            assert o.evaluation is not None
            tc.assertEqual(o.evaluation.candidate_id, o.candidate_id)
            tc.assertGreater(o.evaluation.median_us or 0, 0)


class SyncPipeline(unittest.TestCase):
    def start(self, **kw: Any) -> FakeKilnd:
        fake = FakeKilnd(**kw)
        self.addCleanup(fake.stop)
        return fake

    def test_events_drive_completion_within_the_window(self) -> None:
        fake = self.start()
        c = kiln.Client(fake.socket)
        t0 = time.monotonic()
        outcomes = list(c.submit_many(mixed_batch(50), window=8, poll_interval=60))
        check_mixed(self, outcomes, 50)
        self.assertLess(time.monotonic() - t0, 30)  # no 60 s poll was needed
        self.assertLessEqual(fake.max_unfinished, 8)

    def test_missed_events_are_caught_by_polling(self) -> None:
        fake = self.start(publish_done=False)
        outcomes = list(kiln.Client(fake.socket).submit_many(mixed_batch(20), poll_interval=0.2))
        check_mixed(self, outcomes, 20)

    def test_lagged_stream_triggers_a_poll(self) -> None:
        fake = self.start(lag=True)
        t0 = time.monotonic()
        outcomes = list(kiln.Client(fake.socket).submit_many(mixed_batch(20), poll_interval=60))
        check_mixed(self, outcomes, 20)
        self.assertLess(time.monotonic() - t0, 30)

    def test_no_event_stream_falls_back_to_long_polls(self) -> None:
        fake = self.start(events=False)
        outcomes = list(kiln.Client(fake.socket).submit_many(mixed_batch(20), poll_interval=0.5))
        check_mixed(self, outcomes, 20)

    def test_refusals_duplicates_and_timeouts_are_outcomes(self) -> None:
        fake = self.start()
        batch: List[Any] = [
            cand("a"),
            cand("a"),  # the same candidate again
            {**cand("b"), "problem": "nope"},  # 404
            {**cand("c"), "language": "fortran"},  # 400
            42,  # not a candidate at all
            cand("d", "NEVER"),
        ]
        outcomes = {o.index: o for o in kiln.Client(fake.socket).submit_many(batch, timeout=1.0, poll_interval=0.2)}
        self.assertEqual(sorted(outcomes), list(range(6)))
        self.assertTrue(outcomes[0].ok and outcomes[1].ok)
        self.assertEqual(outcomes[0].candidate_id, outcomes[1].candidate_id)
        self.assertIsInstance(outcomes[2].error, kiln.NotFound)
        self.assertIsInstance(outcomes[3].error, kiln.BadRequest)
        self.assertIsInstance(outcomes[4].error, TypeError)
        self.assertIsInstance(outcomes[5].error, kiln.Timeout)
        with self.assertRaises(kiln.Timeout):
            outcomes[5].result()

    def test_leaving_early_stops_the_follower(self) -> None:
        fake = self.start()
        before = threading.active_count()
        for _ in kiln.Client(fake.socket).submit_many(mixed_batch(10)):
            break
        deadline = time.monotonic() + 5
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse([t for t in threading.enumerate() if t.name == "kiln-events"])

    def test_submit_wait_and_its_errors(self) -> None:
        fake = self.start()
        c = kiln.Client(fake.socket)
        ev = c.submit(cand("w1"))
        self.assertTrue(ev.ok)
        self.assertEqual(c.submit(cand("w1")).verdict, "ok")  # duplicate: answered from the store
        with self.assertRaises(kiln.JobFailed) as cm:
            c.submit(cand("w2", "FAILJOB"))
        self.assertIn("worker crashed", str(cm.exception))
        with self.assertRaises(kiln.Timeout) as tm:
            c.submit(cand("w3", "NEVER"), timeout=1.0)
        self.assertEqual(tm.exception.state, "queued")
        sub = c.submit(cand("w4"), wait=False)
        self.assertEqual(c.wait(sub.id, timeout=30).verdict, "ok")

    def test_rewards_in_input_order(self) -> None:
        fake = self.start()
        sources: List[Any] = ["/* r0 */ ok", "/* r1 */ BROKEN", 7, {"source": "/* r3 */ FAILJOB"},
                              {"source": "/* r4 */ ok", "problem": "other"}, "/* r5 */ NEVER"]
        records = kiln.rewards(kiln.Client(fake.socket), "dbl", sources, launches=LAUNCHES,
                               baseline_us=100.0, timeout=1.0)
        self.assertEqual([r.index for r in records], list(range(6)))
        self.assertEqual(
            [r.verdict for r in records],
            ["ok", "compile_error", kiln.CLIENT_ERROR, kiln.JOB_FAILED, kiln.CLIENT_ERROR, kiln.NO_VERDICT],
        )
        ok = records[0]
        self.assertTrue(ok.ok)
        assert ok.median_us is not None and ok.speedup is not None
        self.assertAlmostEqual(ok.speedup, 100.0 / ok.median_us)
        self.assertIsNone(records[1].speedup)
        self.assertEqual(set(ok.as_dict()), {"index", "id", "verdict", "ok", "speedup", "median_us", "message"})

    def test_rewards_of_modelnew_sources_need_no_plan(self) -> None:
        fake = self.start()
        client = kiln.Client(fake.socket)
        model_new = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    pass  # {}\n"
        sources: List[Any] = [model_new.format(0), model_new.format(1), "no class here",
                              kiln.modelnew("dbl", model_new.format(3), cpu=True)]
        records = kiln.rewards(client, "dbl", sources, language="modelnew", timeout=10.0)
        self.assertEqual([r.verdict for r in records], ["ok", "ok", kiln.CLIENT_ERROR, "ok"])
        self.assertIn("invalid_candidate", records[2].message)
        posted = {r["candidate"]["language"] for r in fake.records.values()}
        self.assertEqual(posted, {"modelnew", "modelnew-cpu"})
        self.assertTrue(all("launches" not in r["candidate"] for r in fake.records.values()))
        ev = client.submit(kiln.modelnew("dbl", model_new.format(0)))
        self.assertEqual(ev.trust, "hosted")
        self.assertEqual(client.submit(cand("plain")).trust, "contract")


class AsyncPipeline(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.fake = FakeKilnd()
        self.client = kiln.AsyncClient(self.fake.socket)

    async def asyncTearDown(self) -> None:
        self.fake.stop()

    async def test_submit_many_with_events(self) -> None:
        outcomes = [o async for o in self.client.submit_many(mixed_batch(30), window=5, poll_interval=60)]
        check_mixed(self, outcomes, 30)
        self.assertLessEqual(self.fake.max_unfinished, 5)

    async def test_submit_many_from_an_async_generator_without_events(self) -> None:
        self.fake.publish_done = False

        async def produce() -> AsyncIterator[Dict[str, Any]]:
            for c in mixed_batch(12):
                await asyncio.sleep(0)
                yield c

        outcomes = [o async for o in self.client.submit_many(produce(), poll_interval=0.2)]
        check_mixed(self, outcomes, 12)

    async def test_submit_wait_and_rewards(self) -> None:
        ev = await self.client.submit(cand("aw1"))
        self.assertTrue(ev.ok)
        with self.assertRaises(kiln.JobFailed):
            await self.client.submit(cand("aw2", "FAILJOB"))
        with self.assertRaises(kiln.Timeout):
            await self.client.submit(cand("aw3", "NEVER"), timeout=1.0)
        records = await kiln.arewards(self.client, "dbl", ["/* ar0 */ ok", None], launches=LAUNCHES)  # type: ignore[list-item]
        self.assertEqual([r.verdict for r in records], ["ok", kiln.CLIENT_ERROR])


if __name__ == "__main__":
    unittest.main()
