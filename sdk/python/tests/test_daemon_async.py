"""The asyncio client against a real kilnd (verdict tests skip while the host backend
is not usable, as in test_daemon)."""

from __future__ import annotations

import asyncio
import tempfile
import unittest
from pathlib import Path
from typing import Any, Dict, Optional

import harness
from harness import BROKEN, HONEST, WRONG, double_candidate, double_source, unique, write_double_problem

import kiln

DAEMON: Optional[harness.Daemon] = None
HOST_USABLE = False
HOST_DETAIL = ""
EVAL_TIMEOUT = 300.0


def setUpModule() -> None:  # noqa: N802 - unittest's name
    global DAEMON, HOST_USABLE, HOST_DETAIL
    DAEMON = harness.Daemon()
    HOST_USABLE, HOST_DETAIL = DAEMON.host_backend()


def tearDownModule() -> None:  # noqa: N802 - unittest's name
    if DAEMON is not None:
        DAEMON.stop()


class AsyncClientTests(unittest.IsolatedAsyncioTestCase):
    tmp: "tempfile.TemporaryDirectory[str]"
    problem: str
    folder: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.problem = unique("adbl")
        cls.folder = write_double_problem(Path(cls.tmp.name), cls.problem)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    async def asyncSetUp(self) -> None:
        assert DAEMON is not None
        self.client = DAEMON.async_client()
        await self.client.add_problem(harness.double_problem_spec(self.problem))

    def cand(self, body: str, tag: str = "") -> Dict[str, Any]:
        return double_candidate(self.problem, body, tag)

    def needs_host(self) -> None:
        if not HOST_USABLE:
            self.skipTest(f"/v1/info says the host backend is not usable: {HOST_DETAIL}")

    async def test_daemon_and_problems(self) -> None:
        health, info, devices = await asyncio.gather(self.client.health(), self.client.info(), self.client.devices())
        self.assertEqual(health.status, "ok")
        self.assertIsNotNone(info.backend("host"))
        self.assertTrue(devices.gpus or devices.error)
        self.assertIn("kiln_jobs", await self.client.metrics())
        again = await self.client.add_problem(self.folder if harness.has_toml_parser() else harness.double_problem_spec(self.problem))
        self.assertEqual(again, kiln.ProblemAdded(self.problem, False))
        self.assertIn(self.problem, [p.name for p in await self.client.problems()])
        self.assertEqual((await self.client.problem(self.problem)).backends, ["host"])

    async def test_api_errors_are_typed(self) -> None:
        with self.assertRaises(kiln.NotFound) as nf:
            await self.client.problem("no-such-problem")
        self.assertEqual(nf.exception.code, "not_found")
        with self.assertRaises(kiln.BadRequest) as br:
            await self.client.submit(self.cand(HONEST) | {"language": "fortran"}, wait=False)
        self.assertEqual(br.exception.code, "invalid_field")
        spec = harness.double_problem_spec(self.problem)
        spec["summary"] = "changed"
        with self.assertRaises(kiln.Conflict):
            await self.client.add_problem(spec)
        with self.assertRaises(kiln.NotFound):
            await self.client.job(987654321)

    async def test_submit_get_and_events(self) -> None:
        async with self.client.events(timeout=30) as stream:
            hello = await stream.__anext__()
            self.assertEqual(hello.name, "hello")
            sub = await self.client.submit(self.cand(HONEST, "async-events"), wait=False)
            async for ev in stream:
                if ev.candidate_id == sub.id:
                    self.assertIn(ev.state, ("queued", "compiling"))
                    break
        rec = await self.client.get(sub.id)
        self.assertEqual(rec.id, sub.id)
        again = await self.client.submit(self.cand(HONEST, "async-events"), wait=False)
        self.assertTrue(again.duplicate)
        self.assertIn(sub.id, [c.id for c in await self.client.candidates(self.problem)])

    async def test_many_clients_at_once(self) -> None:
        subs = await asyncio.gather(
            *(self.client.submit(self.cand(HONEST, f"async-gather-{i}"), wait=False) for i in range(20))
        )
        self.assertEqual(len({s.id for s in subs}), 20)

    async def test_unusable_backend_fails_fast(self) -> None:
        assert DAEMON is not None
        if DAEMON.backend("cuda")[0]:
            self.skipTest("the cuda backend is usable here: no job waits for ever")
        name = unique("acuda")
        await self.client.add_problem(harness.cuda_problem_spec(name))
        with self.assertRaises(kiln.BackendUnavailable):
            await self.client.submit(harness.cuda_candidate(name, "async-unusable"), timeout=30)
        batch = [harness.cuda_candidate(name, f"au-{i}") for i in range(10)]
        outcomes = [o async for o in self.client.submit_many(batch)]
        self.assertEqual(sorted(o.index for o in outcomes), list(range(10)))
        self.assertTrue(all(isinstance(o.error, kiln.BackendUnavailable) for o in outcomes))

    async def test_verdicts(self) -> None:
        self.needs_host()
        ok, broken = await asyncio.gather(
            self.client.submit(self.cand(HONEST, "async-honest"), timeout=EVAL_TIMEOUT),
            self.client.submit(self.cand(BROKEN, "async-broken"), timeout=EVAL_TIMEOUT),
        )
        self.assertEqual(ok.verdict, "ok", ok.message)
        self.assertIsNotNone(ok.timing)
        self.assertEqual(broken.verdict, "compile_error", broken.message)

    async def test_submit_many_and_rewards(self) -> None:
        self.needs_host()
        batch = [self.cand(WRONG if i % 4 == 0 else HONEST, f"async-many-{i}") for i in range(12)]
        outcomes = [o async for o in self.client.submit_many(batch, timeout=EVAL_TIMEOUT, window=4)]
        self.assertEqual(sorted(o.index for o in outcomes), list(range(12)))
        for o in outcomes:
            assert o.evaluation is not None, repr(o.error)
            self.assertEqual(o.evaluation.verdict, "wrong_answer" if o.index % 4 == 0 else "ok")
        src = double_source(HONEST, "async-rw").replace("void k(", "void double_it(")
        records = await kiln.arewards(self.client, self.problem, [src, 3], timeout=EVAL_TIMEOUT)  # type: ignore[list-item]
        self.assertEqual([r.verdict for r in records], ["ok", kiln.CLIENT_ERROR])

    async def test_search_follow(self) -> None:
        self.needs_host()
        wasm = harness.proposer_wasm()
        if wasm is None:
            self.skipTest("no example proposer component: `cargo test --workspace` builds it under "
                          "target/plugin-guests, or set KILN_TEST_PROPOSER")
        name = unique("aknob")
        await self.client.add_problem(harness.knob_problem_spec(name))
        started = await self.client.start_search(name, "example-minimal", wasm=wasm, budget=10)
        events = [e async for e in self.client.follow_search(started.id, timeout=EVAL_TIMEOUT)]
        self.assertEqual((events[-1].name, events[-1].state), ("search", "done"))
        self.assertTrue(any(e.name == "search_log" for e in events))
        self.assertEqual(len(await self.client.search_archive(started.id)), 2)
        with self.assertRaises(kiln.NotFound):
            await self.client.search("s-000000000000")


if __name__ == "__main__":
    unittest.main()
