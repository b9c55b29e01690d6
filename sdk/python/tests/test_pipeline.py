"""The pipelining machinery (submit_many, wait, rewards) against a stand-in daemon that
finishes jobs itself, including the paths a real kilnd rarely takes: missed events, a
lagging stream, no event stream at all, failed jobs, candidates that never finish."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import Any, AsyncIterator, Dict, Iterator, List

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
        self.assertEqual(ok.reward, ok.speedup)
        self.assertEqual([r.reward for r in records[1:]], [0.0] * 5)
        self.assertEqual((ok.trust, records[1].trust, records[2].trust), ("contract", "contract", None))
        self.assertIsNone(ok.speedup_eager)  # dbl has no torch baselines
        self.assertEqual(set(ok.as_dict()), {"index", "id", "verdict", "ok", "speedup", "median_us", "message",
                                             "reward", "speedup_eager", "speedup_compile", "trust", "problem",
                                             "hosted_median_us", "lift", "speedup_eager_in_process",
                                             "speedup_compile_in_process"})

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


def model_new(tag: str, body: str = "return torch.relu(x)") -> str:
    """A ModelNew file; the fake judges it by its markers (WRONG, LIBONLY, BROKEN, ...)."""
    return f"import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):  # {tag}\n    def forward(self, x):\n        {body}\n"


class KernelBenchRewards(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = FakeKilnd()
        self.addCleanup(self.fake.stop)
        # The hosted path costs the hosted baselines (and hosted candidates) 200 µs more.
        self.fake.HOSTED_COST_US = 200.0
        self.fake.register("kb-l1-19-relu", eager_us=40.0, compile_us=20.0)
        self.fake.register("kb-l1-1-square-matmul")  # no torch baselines measured
        self.client = kiln.Client(self.fake.socket)

    def test_records_carry_speedups_trust_and_reasons(self) -> None:
        sources: List[Any] = [
            model_new("k0"),
            model_new("k1", "return x + 1  # WRONG"),
            model_new("k2", "return torch.relu(x)  # LIBONLY: the reference renamed"),
            "print('no class here')",
            model_new("k4", "return x BROKEN"),
            kiln.modelnew("kb-l1-19-relu", model_new("k5"), cpu=True),
        ]
        records = kiln.rewards(self.client, kiln.KernelBenchProblem(level=1, id=19), sources,
                               language="modelnew", timeout=30.0)
        self.assertEqual([r.verdict for r in records],
                         ["ok", "wrong_answer", "no_own_kernels", kiln.CLIENT_ERROR, "compile_error", "ok"])
        self.assertEqual({r.problem for r in records}, {"kb-l1-19-relu"})
        ok = records[0]
        assert ok.median_us is not None and ok.speedup_eager is not None and ok.speedup_compile is not None
        # A hosted candidate against the hosted baselines (the same harness: 240 and
        # 220 µs), the in-process fp32 variants (40 and 20 µs, never the faster tf32 ones)
        # beside them.
        self.assertAlmostEqual(ok.speedup_eager, 240.0 / ok.median_us)
        self.assertAlmostEqual(ok.speedup_compile, 220.0 / ok.median_us)
        self.assertAlmostEqual(ok.speedup_eager_in_process or 0.0, 40.0 / ok.median_us)
        self.assertAlmostEqual(ok.speedup_compile_in_process or 0.0, 20.0 / ok.median_us)
        self.assertEqual((ok.speedup, ok.reward, ok.trust), (ok.speedup_eager, ok.speedup_eager, "hosted"))
        for r in records[1:5]:
            self.assertEqual((r.reward, r.speedup, r.speedup_eager, r.speedup_compile), (0.0, None, None, None), r)
            self.assertTrue(r.message, r)
        self.assertIn("outside the tolerance", records[1].message)
        self.assertIn("library kernels", records[2].message)
        self.assertIn("invalid_candidate", records[3].message)
        self.assertEqual([r.trust for r in records[1:5]], ["hosted", "hosted", None, "hosted"])
        # On the CPU (host backend): correct, but GPU baselines are no yardstick for it.
        cpu = records[5]
        self.assertEqual((cpu.ok, cpu.speedup_eager, cpu.speedup_compile, cpu.reward), (True, None, None, 1.0))
        self.assertEqual(self.fake.problem_requests, 1)

    def test_ids_as_text_and_one_problem_per_source(self) -> None:
        src = [model_new("m0"), model_new("m1")]
        by_text = kiln.rewards(self.client, "level1/19", src, language="modelnew", timeout=30.0)
        by_file = kiln.rewards(self.client, "KernelBench/level1/19_ReLU.py", src, language="modelnew", timeout=30.0)
        self.assertEqual([r.as_dict() for r in by_text], [r.as_dict() for r in by_file])  # the same candidates
        before = self.fake.problem_requests
        mixed = kiln.rewards(self.client, ["level1/19", "level_1_problem_1_sample_0", "level1/19", "kb-l1-19-relu"],
                             [model_new("p0"), model_new("p1"), model_new("p2", "x  # WRONG"), model_new("p3")],
                             language="modelnew", timeout=30.0)
        self.assertEqual(self.fake.problem_requests - before, 2, "each problem fetched once")
        self.assertEqual([r.problem for r in mixed], ["kb-l1-19-relu", "kb-l1-1-square-matmul"] + ["kb-l1-19-relu"] * 2)
        self.assertEqual([r.verdict for r in mixed], ["ok", "ok", "wrong_answer", "ok"])
        self.assertIsNotNone(mixed[0].speedup_eager)
        self.assertIsNone(mixed[1].speedup_eager)  # no baselines measured for it
        self.assertEqual(mixed[1].reward, 1.0)
        with self.assertRaisesRegex(ValueError, "2 problems for 3 sources"):
            kiln.rewards(self.client, ["level1/19"] * 2, src + src[:1], language="modelnew")

    def test_unknown_and_ambiguous_ids_raise(self) -> None:
        with self.assertRaisesRegex(kiln.NotFound, "kb-l1-2-"):
            kiln.rewards(self.client, "level1/2", [model_new("u")], language="modelnew")
        self.fake.register("kb-l1-19-relu-small")
        with self.assertRaisesRegex(ValueError, "kb-l1-19-relu, kb-l1-19-relu-small"):
            kiln.rewards(self.client, kiln.KernelBenchProblem(1, 19), [model_new("u")], language="modelnew")
        self.assertEqual(self.fake.posts, 0)

    def test_measured_on_request(self) -> None:
        self.fake.register("kb-l2-7-gemm", eager_us=90.0, compile_us=60.0, cached=False)
        (r,) = kiln.rewards(self.client, "level2/7", [model_new("g")], language="modelnew", timeout=30.0)
        self.assertTrue(r.ok)
        self.assertIsNone(r.speedup_eager)  # not measured yet, and not asked to
        self.assertEqual(self.fake.baseline_requests, 0)
        (r,) = kiln.rewards(self.client, "level2/7", [model_new("g")], language="modelnew",
                            measure_baselines=True, timeout=30.0)
        assert r.median_us is not None
        self.assertEqual(self.fake.baseline_requests, 1)
        self.assertAlmostEqual(r.speedup_eager or 0, (90.0 + self.fake.HOSTED_COST_US) / r.median_us)
        self.assertAlmostEqual(r.speedup_eager_in_process or 0, 90.0 / r.median_us)
        # A problem whose baselines cannot be measured here simply has none.
        (r,) = kiln.rewards(self.client, "level1/1", [model_new("h")], language="modelnew",
                            measure_baselines=True, timeout=30.0)
        self.assertEqual((r.verdict, r.speedup_eager), ("ok", None))


class Backpressure(unittest.TestCase):
    def test_a_full_queue_is_waited_out_without_reading_ahead(self) -> None:
        # One POST a candidate (a kilnd without the batch route, found by the first fill's
        # 404): no more than that first window is read ahead of what kilnd took.
        fake = FakeKilnd(queue_cap=3, delay=(0.01, 0.05))
        fake.batches = False
        self.addCleanup(fake.stop)
        read_ahead: List[int] = []

        def produce() -> Iterator[Dict[str, Any]]:
            for i, c in enumerate(mixed_batch(30)):
                read_ahead.append(i - fake.accepted)  # inputs read but not yet taken by kilnd
                yield c

        outcomes = list(kiln.Client(fake.socket).submit_many(produce(), window=16, poll_interval=60))
        check_mixed(self, outcomes, 30)
        self.assertGreater(fake.refused_full, 0)
        self.assertLessEqual(fake.max_unfinished, 3)
        self.assertLess(max(read_ahead), 16)  # the refused one is held; nothing past the window is read

    def test_a_batch_fills_the_window_and_a_full_queue_holds_the_refused(self) -> None:
        # Batches: the window is read and sent in one request; kilnd's per-candidate
        # refusals are held and sent again, and nothing more is read past the window.
        fake = FakeKilnd(queue_cap=3, delay=(0.01, 0.05))
        self.addCleanup(fake.stop)
        read_ahead: List[int] = []

        def produce() -> Iterator[Dict[str, Any]]:
            for i, c in enumerate(mixed_batch(30)):
                read_ahead.append(i - fake.accepted)
                yield c

        outcomes = list(kiln.Client(fake.socket).submit_many(produce(), window=16, poll_interval=60))
        check_mixed(self, outcomes, 30)
        self.assertGreater(fake.batch_posts, 0)
        self.assertGreater(fake.refused_full, 0)
        self.assertLessEqual(fake.max_unfinished, 3)
        self.assertLess(max(read_ahead), 16)

    def test_many_candidates_go_in_few_requests(self) -> None:
        fake = FakeKilnd(delay=(0.01, 0.02))
        self.addCleanup(fake.stop)
        records = kiln.rewards(kiln.Client(fake.socket), "dbl", [model_new(f"b{i}") for i in range(256)],
                               language="modelnew", window=256, timeout=60.0)
        self.assertEqual([r.verdict for r in records], ["ok"] * 256)
        self.assertEqual(fake.posts, 256)  # each candidate admitted once
        self.assertLessEqual(fake.batch_posts, 4, "256 files in a handful of requests")

    def test_rewards_through_a_full_queue(self) -> None:
        fake = FakeKilnd(queue_cap=2, delay=(0.01, 0.05))
        self.addCleanup(fake.stop)
        records = kiln.rewards(kiln.Client(fake.socket), "dbl", [model_new(f"q{i}") for i in range(12)],
                               language="modelnew", window=8, timeout=30.0)
        self.assertEqual([r.verdict for r in records], ["ok"] * 12)
        self.assertGreater(fake.refused_full, 0)

    def test_a_queue_full_for_the_whole_timeout_is_no_verdict(self) -> None:
        fake = FakeKilnd(queue_cap=0)
        self.addCleanup(fake.stop)
        t0 = time.monotonic()
        outcomes = sorted(kiln.Client(fake.socket).submit_many(mixed_batch(5), timeout=0.5), key=lambda o: o.index)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertTrue(all(isinstance(o.error, kiln.QueueFull) for o in outcomes), outcomes)
        self.assertEqual(outcomes[0].error.code, "queue_full")  # type: ignore[union-attr]
        records = kiln.rewards(kiln.Client(fake.socket), "dbl", [model_new("z")], language="modelnew", timeout=0.3)
        self.assertEqual(records[0].verdict, kiln.NO_VERDICT)
        self.assertIn("queue", records[0].message)
        with self.assertRaises(kiln.QueueFull):
            kiln.Client(fake.socket).submit(cand("plain"))


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

    async def test_kernelbench_rewards_through_a_full_queue(self) -> None:
        self.fake.register("kb-l1-19-relu", eager_us=40.0, compile_us=20.0)
        self.fake.queue_cap = 2
        sources = [model_new(f"aq{i}") for i in range(8)] + [model_new("aq-wrong", "x  # WRONG")]
        records = await kiln.arewards(self.client, "level1/19", sources, language="modelnew", window=6, timeout=30.0)
        self.assertEqual([r.verdict for r in records], ["ok"] * 8 + ["wrong_answer"])
        self.assertGreater(self.fake.refused_full, 0)
        self.assertLessEqual(self.fake.max_unfinished, 2)
        for r in records[:8]:
            assert r.median_us is not None
            self.assertAlmostEqual(r.speedup_eager or 0, 40.0 / r.median_us)
            self.assertEqual((r.reward, r.trust), (r.speedup_eager, "hosted"))
        self.assertEqual(records[8].reward, 0.0)


if __name__ == "__main__":
    unittest.main()
