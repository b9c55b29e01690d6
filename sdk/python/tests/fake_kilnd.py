"""A stand-in for kilnd that finishes jobs itself, to test the client's pipelining
(event-driven completion, missed events, failed jobs) independently of any backend.

It speaks the same wire shapes as kilnd for the routes the batch machinery and
``rewards`` use: ``POST /v1/candidates``, ``GET /v1/candidates/{id}[?wait=N]``,
``GET /v1/events``, ``GET /v1/info``, ``GET /v1/problems[/{name}[/baselines]]``. A
candidate whose source contains ``BROKEN`` gets ``compile_error``, ``WRONG``
``wrong_answer``, ``LIBONLY`` ``no_own_kernels``, one containing ``FAILJOB`` a failed
job, one containing ``NEVER`` never finishes; anything else is ``ok``, in
``10 + len(source) % 7`` µs. Problem ``dbl`` is registered; :meth:`FakeKilnd.register`
adds others, with torch baselines. With ``queue_cap``, a new candidate is refused with
``429 queue_full`` while that many jobs are queued.

Lifting (issue 29), for a hosted (``modelnew``) file, as kilnd does it: after the file's
evaluation (recorded in its telemetry under ``lift``, its done event published), a file
containing ``LIFT_OK`` is lifted into a cuda candidate that the fake queues by itself
(``lift_delay`` later) and evaluates with trust ``lifted`` (``ok`` in ``2 + len % 3`` µs,
faster than any hosted time, with the lift's ``speedups`` against cached baselines);
``LIFT_INCORRECT``: the lifted candidate is ``wrong_answer``; ``LIFT_CRASH``: its job
fails; ``LIFT_STUCK``: it never finishes; ``LIFT_NOT``: ``not_lifted`` (code ``memset``);
``LIFT_GARBAGE``: the record's ``lift`` is malformed. ``GET /v1/candidates/{id}`` of the
file carries ``lift`` (and, with ``wait``, returns once the lifted job has ended too, a
lifted candidate not stored yet counting as ended, as in kilnd); the lifted job's events
carry the lifted candidate's own id.
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import shutil
import socketserver
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit


class FakeKilnd:
    """Serves on a temporary Unix socket until :meth:`stop`.

    Args:
        publish_done: publish ``done``/``failed`` job events (False: the client must poll).
        events: serve ``/v1/events`` at all (False: 404, the client must poll).
        lag: send a ``lagged`` event instead of every done event (the client must poll).
        delay: seconds each job takes, drawn uniformly from this range.
        queue_cap: refuse new candidates (429 ``queue_full``) while this many jobs wait.
    """

    #: The GPU the fake's cuda evaluations say they ran on.
    GPU = "NVIDIA H200"
    #: What the fake's hosted baselines add to the in-process ones, µs.
    HOSTED_COST_US = 0.0

    def __init__(
        self,
        publish_done: bool = True,
        events: bool = True,
        lag: bool = False,
        delay: "tuple[float, float]" = (0.01, 0.2),
        queue_cap: Optional[int] = None,
        lift_delay: float = 0.05,
    ) -> None:
        self.publish_done = publish_done
        self.events_enabled = events
        self.lag = lag
        self.delay = delay
        self.queue_cap = queue_cap
        self.lift_delay = lift_delay
        #: Refusals with a full queue, problem records served, and baseline requests
        #: (``GET …/baselines``).
        self.refused_full = 0
        #: Whether ``POST /v1/candidates/batch`` is served (a kilnd from before it: not),
        #: and how many batch requests came.
        self.batches = True
        self.batch_posts = 0
        self.problem_requests = 0
        self.baseline_requests = 0
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-fake-"))
        self.socket = str(self.dir / "fake.sock")
        self.records: Dict[str, Dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.problems: Dict[str, Dict[str, Any]] = {}
        self.register("dbl")
        self.subscribers: List["queue.Queue[Optional[str]]"] = []
        self.next_job = 1
        self.posts = 0
        self.accepted = 0
        self.max_unfinished = 0
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.server = _Server(self.socket, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            for q in self.subscribers:
                q.put(None)
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- behaviour -------------------------------------------------------------------

    def register(
        self, name: str, eager_us: Optional[float] = None, compile_us: Optional[float] = None,
        cached: bool = True,
    ) -> None:
        """Registers problem ``name``; with ``eager_us``/``compile_us``, its torch
        baselines on :attr:`GPU` (``torch-eager-fp32``, ``torch-compile-fp32``, and a
        faster tf32 variant that must not be the one compared; ``torch-eager-hosted`` and
        ``torch-compile-hosted``, :attr:`HOSTED_COST_US` slower), in its record when
        ``cached``, else only once measured by ``GET …/baselines``."""
        results: List[Dict[str, Any]] = [
            {"name": "reference", "library": "kiln", "precision": "reference-f64acc", "status": "measured",
             "timing": {"median_us": 1000.0}},
        ]
        for kind, us in (("torch-eager", eager_us), ("torch-compile", compile_us)):
            if us is None:
                results.append({"name": f"{kind}-fp32", "library": "torch", "precision": "fp32",
                                "status": "unavailable", "detail": "no torch (fake)"})
                continue
            for precision, factor in (("fp32", 1.0), ("tf32", 0.5)):
                results.append({"name": f"{kind}-{precision}", "library": "torch", "precision": precision,
                                "status": "measured", "timing": {"median_us": us * factor, "n": 20}})
            # The same module through the hosted path: what a hosted candidate is compared
            # with. Slower by the fake's fixed hosted cost.
            results.append({"name": f"{kind}-hosted", "library": "torch", "precision": "",
                            "harness": "hosted", "status": "measured",
                            "timing": {"median_us": us + self.HOSTED_COST_US, "n": 20}})
        baselines = {"gpu_model": self.GPU, "driver": "580.0", "problem": name, "problem_hash": "h",
                     "measured_at": int(time.time() * 1000), "results": results}
        with self.cond:
            self.problems[name] = {
                "summary": f"fake problem {name}",
                "baselines": baselines if eager_us is not None or compile_us is not None else None,
                "cached": cached,
            }

    def problem_record(self, name: str) -> "tuple[int, Dict[str, Any]]":
        self.problem_requests += 1
        p = self.problems.get(name)
        if p is None:
            return 404, {"error": {"code": "not_found", "message": f"problem {name!r} is not registered"}}
        cached = [p["baselines"]] if p["baselines"] is not None and p["cached"] else []
        return 200, {"spec": {"name": name, "summary": p["summary"]},
                     "derived": {"backends": ["host", "cuda"]}, "baselines": cached}

    def measure_baselines(self, name: str) -> "tuple[int, Dict[str, Any]]":
        self.baseline_requests += 1
        p = self.problems.get(name)
        if p is None:
            return 404, {"error": {"code": "not_found", "message": f"problem {name!r} is not registered"}}
        if p["baselines"] is None:
            return 409, {"error": {"code": "baselines_unavailable", "message": "no usable cuda backend (fake)"}}
        p["cached"] = True
        return 200, p["baselines"]

    def publish(self, event: Dict[str, Any]) -> None:
        frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
        with self.cond:
            for q in self.subscribers:
                q.put(frame)

    def submit(self, cand: Dict[str, Any]) -> "tuple[int, Dict[str, Any]]":
        if cand.get("problem") not in self.problems:
            return 404, {"error": {"code": "not_found", "message": f"problem {cand.get('problem')!r} is not registered"}}
        if cand.get("language") not in ("c", "cuda", "modelnew", "modelnew-cpu") or not isinstance(cand.get("source"), str):
            return 400, {"error": {"code": "invalid_field", "message": "field `language`: unknown variant"}}
        if cand["language"].startswith("modelnew") and (cand.get("launches") or "class ModelNew" not in cand["source"]):
            return 400, {"error": {"code": "invalid_candidate", "message": "launches: a modelnew candidate takes none"}}
        key = "\0".join((cand["problem"], cand["language"], cand["source"]))
        cid = hashlib.sha256(key.encode()).hexdigest()[:32]
        backend = "cuda" if cand["language"] in ("cuda", "modelnew") else "host"
        with self.cond:
            self.posts += 1
            if cid in self.records:
                rec = self.records[cid]
                return 200, {"id": cid, "job_id": rec["job"]["id"], "duplicate": True, "record": rec}
            queued = sum(1 for r in self.records.values() if r["job"]["state"] == "queued")
            if self.queue_cap is not None and queued >= self.queue_cap:
                self.refused_full += 1
                return 429, {"error": {"code": "queue_full",
                                       "message": f"{queued} candidates are waiting; wait for some first"}}
            job_id, self.next_job = self.next_job, self.next_job + 1
            self.records[cid] = {
                "id": cid,
                "candidate": cand,
                "backend": backend,
                "created_at": int(time.time() * 1000),
                "job": {"id": job_id, "candidate_id": cid, "backend": backend, "state": "queued", "attempts": 0},
                "evaluation": None,
            }
            self.accepted += 1
            self.max_unfinished = max(self.max_unfinished, queued + 1)
        self.publish({"type": "job", "job_id": job_id, "candidate_id": cid, "problem": cand["problem"], "state": "queued"})
        if "NEVER" not in cand["source"]:
            threading.Timer(random.uniform(*self.delay), self.finish, args=(cid,)).start()
        return 202, {"id": cid, "job_id": job_id, "duplicate": False, "state": "queued"}

    def finish(self, cid: str) -> None:
        with self.cond:
            rec = self.records[cid]
            source, backend = rec["candidate"]["source"], rec["backend"]
            event: Dict[str, Any] = {"type": "job", "job_id": rec["job"]["id"], "candidate_id": cid,
                                     "problem": rec["candidate"]["problem"]}
            trust = "hosted" if rec["candidate"]["language"].startswith("modelnew") else "contract"
            if rec.get("lifted_from"):
                trust = "lifted"
            if "FAILJOB" in source:
                rec["job"].update(state="failed", error="worker crashed (fake)")
                event.update(state="failed", error="worker crashed (fake)")
            elif "BROKEN" in source or "WRONG" in source:
                verdict, message = (
                    ("compile_error", "the compiler refused the source") if "BROKEN" in source
                    else ("wrong_answer", "y: 1024 of 1024 elements outside the tolerance (max abs error 1.0)")
                )
                rec["job"]["state"] = "done"
                rec["evaluation"] = {
                    "verdict": verdict,
                    "message": message,
                    "backend": backend,
                    "trust": trust,
                    "compile": {"duration_ms": 3.0, "log": "error: expected ';'" if "BROKEN" in source else "",
                                "cached": False},
                    "evidence": {"trials_passed": 0, "trials_run": 1, "bitwise_diffs": 0},
                }
                event.update(state="done", verdict=verdict)
            else:
                median = 2.0 + len(source) % 3 if trust == "lifted" else 10.0 + len(source) % 7
                verdict, message = (
                    ("no_own_kernels", "correct, but its forward launched only library kernels")
                    if "LIBONLY" in source else ("ok", "correct on 3 trials")
                )
                rec["job"]["state"] = "done"
                rec["evaluation"] = {
                    "verdict": verdict,
                    "message": message,
                    "backend": backend,
                    "trust": trust,
                    "evidence": {"trials_passed": 3, "trials_run": 3, "bitwise_diffs": 0},
                    "timing": {"median_us": median, "mean_us": median, "stdev_us": 0.1, "min_us": median,
                               "max_us": median, "n": 10, "rse": 0.001, "stop_reason": "converged"},
                    "tier": "fp32-faithful",
                }
                if backend == "cuda":
                    rec["evaluation"]["telemetry"] = {"device": {"name": self.GPU, "uuid": "GPU-fake"}}
                event.update(state="done", verdict=verdict, median_us=median)
            lifted = self._lift_outcome(rec) if trust == "hosted" and rec["evaluation"] is not None else None
            if lifted is not None:
                rec["evaluation"]["lift"] = lifted
            self.cond.notify_all()
        if self.lag:
            self.publish({"type": "lagged", "missed": 1})
        elif self.publish_done:
            self.publish(event)
        if lifted is not None and lifted["outcome"] == "lifted":
            threading.Timer(self.lift_delay, self.queue_lifted, args=(cid,)).start()

    # -- lifting ---------------------------------------------------------------------

    def _lift_outcome(self, rec: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """What lifting the hosted file ``rec`` comes to, as its evaluation records it."""
        source = rec["candidate"]["source"]
        if "LIFT_NOT" in source:
            return {"outcome": "not_lifted", "code": "memset",
                    "reason": "forward calls cudaMemsetAsync (fake): the file stays hosted"}
        marker = next((m for m in ("LIFT_OK", "LIFT_INCORRECT", "LIFT_CRASH", "LIFT_STUCK", "LIFT_GARBAGE")
                       if m in source), None)
        if marker is None:
            return None
        body = {"LIFT_INCORRECT": "WRONG", "LIFT_CRASH": "FAILJOB"}.get(marker, "ok")
        cand = {"problem": rec["candidate"]["problem"], "language": "cuda",
                "source": f"// lifted from {rec['id']} ({marker})\n__global__ void k() {{}} // {body}",
                "launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "args": []}]}
        key = "\0".join((cand["problem"], cand["language"], cand["source"]))
        lifted_id = hashlib.sha256(key.encode()).hexdigest()[:32]
        return {"outcome": "lifted", "candidate_id": lifted_id, "candidate": cand,
                "notes": ["dropped a cudaDeviceSynchronize (fake)"], "marker": marker}

    def queue_lifted(self, file_id: str) -> None:
        """Queues the candidate lifted from ``file_id`` (after its evaluation, as kilnd)."""
        with self.cond:
            lift = self.records[file_id]["evaluation"]["lift"]
            lifted_id, cand = lift["candidate_id"], lift["candidate"]
            if lifted_id in self.records:
                return  # already stored: nothing is queued
            job_id, self.next_job = self.next_job, self.next_job + 1
            self.records[lifted_id] = {
                "id": lifted_id,
                "candidate": cand,
                "backend": "cuda",
                "created_at": int(time.time() * 1000),
                "job": {"id": job_id, "candidate_id": lifted_id, "backend": "cuda", "state": "queued",
                        "attempts": 0},
                "evaluation": None,
                "lifted_from": file_id,
            }
            self.cond.notify_all()
        self.publish({"type": "job", "job_id": job_id, "candidate_id": lifted_id, "problem": cand["problem"],
                      "state": "queued"})
        if lift["marker"] != "LIFT_STUCK":
            threading.Timer(random.uniform(*self.delay), self.finish, args=(lifted_id,)).start()

    def lift_json(self, rec: Dict[str, Any]) -> "tuple[Optional[Dict[str, Any]], bool]":
        """The file's ``lift`` as kilnd answers it, and whether its lifted job has ended
        (True when there is nothing to wait for). Called with ``cond`` held."""
        outcome = (rec.get("evaluation") or {}).get("lift")
        if outcome is None:
            return None, True
        if outcome.get("marker") == "LIFT_GARBAGE":
            return {"outcome": "lifted", "notes": 7, "evaluation": "not an object"}, True
        if outcome["outcome"] != "lifted":
            return dict(outcome), True
        lifted = self.records.get(outcome["candidate_id"])
        done = lifted is None or lifted["evaluation"] is not None or lifted["job"]["state"] == "failed"
        ev = lifted["evaluation"] if lifted is not None else None
        timing = (ev or {}).get("timing") or {}
        return {
            "outcome": "lifted",
            "candidate_id": outcome["candidate_id"],
            "notes": outcome["notes"],
            "state": lifted["job"]["state"] if lifted is not None else None,
            "verdict": ev["verdict"] if ev else None,
            "message": ev["message"] if ev else None,
            "median_us": timing.get("median_us"),
            "hosted_median_us": (rec["evaluation"].get("timing") or {}).get("median_us"),
            "evaluation": ev,
            "speedups": self._speedups(rec["candidate"]["problem"], timing.get("median_us")),
        }, done

    def _speedups(self, problem: str, median: Optional[float]) -> Optional[List[Dict[str, Any]]]:
        """kilnd's ``speedups`` of a time against the problem's cached baselines."""
        p = self.problems.get(problem)
        if not median or p is None or p["baselines"] is None or not p["cached"]:
            return None
        return [{"baseline": r["name"], "precision": r["precision"], "baseline_us": r["timing"]["median_us"],
                 "speedup": r["timing"]["median_us"] / median, "harness": r.get("harness", "in_process")}
                for r in p["baselines"]["results"] if r["status"] == "measured"]

    def show(self, cid: str, wait: float) -> "tuple[int, Dict[str, Any]]":
        deadline = time.monotonic() + wait
        with self.cond:
            while True:
                rec = self.records.get(cid)
                if rec is None:
                    return 404, {"error": {"code": "not_found", "message": f"candidate {cid!r} not found"}}
                done = rec["evaluation"] is not None or rec["job"]["state"] == "failed"
                lift, lift_done = self.lift_json(rec)
                left = deadline - time.monotonic()
                if (done and lift_done) or left <= 0:
                    body = json.loads(json.dumps({k: v for k, v in rec.items() if k != "lifted_from"}))
                    if rec.get("lifted_from"):
                        body["trust"] = "lifted"
                    if lift is not None:
                        body["lift"] = lift
                    return 200, body
                self.cond.wait(left)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeKilnd

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def address_string(self) -> str:
        return "unix"

    def _send(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        if self.path == "/v1/candidates" and isinstance(body, dict):
            self._send(*self.server_fake.submit(body))
        elif self.path == "/v1/candidates/batch" and self.server_fake.batches and isinstance(body, dict):
            fake = self.server_fake
            fake.batch_posts += 1
            results = []
            for i, cand in enumerate(body.get("candidates") or []):
                status, answer = fake.submit(cand) if isinstance(cand, dict) else (
                    400, {"error": {"code": "invalid_field", "message": "field `candidates`: not an object"}})
                results.append({**answer, "index": i, "status": status})
            self._send(200, {"results": results, "queue": {}})
        else:
            self._send(404, {"error": {"code": "not_found", "message": "no route"}})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlsplit(self.path)
        fake = self.server_fake
        if url.path == "/v1/info":
            self._send(200, {"version": "fake", "backends": [{"name": "host", "usable": True, "detail": "fake"},
                                                             {"name": "cuda", "usable": True, "detail": "fake"}]})
        elif url.path == "/v1/problems":
            self._send(200, {"problems": [{"name": n, "summary": p["summary"], "backends": ["host", "cuda"]}
                                          for n, p in sorted(fake.problems.items())]})
        elif url.path.startswith("/v1/problems/") and url.path.endswith("/baselines"):
            self._send(*fake.measure_baselines(url.path.split("/")[3]))
        elif url.path.startswith("/v1/problems/"):
            self._send(*fake.problem_record(url.path.rsplit("/", 1)[1]))
        elif url.path.startswith("/v1/candidates/"):
            wait = float(parse_qs(url.query).get("wait", ["0"])[0])
            self._send(*fake.show(url.path.rsplit("/", 1)[1], wait))
        elif url.path == "/v1/events" and fake.events_enabled:
            self._stream_events()
        else:
            self._send(404, {"error": {"code": "not_found", "message": f"no route for GET {url.path}"}})

    def _stream_events(self) -> None:
        fake = self.server_fake
        q: "queue.Queue[Optional[str]]" = queue.Queue()
        with fake.cond:
            fake.subscribers.append(q)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._chunk('event: hello\ndata: {"type":"hello"}\n\n')
            while True:
                try:
                    frame = q.get(timeout=1.0)
                except queue.Empty:
                    frame = ":\n\n"  # keep-alive comment
                if frame is None:
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self._chunk(frame)
        except OSError:
            pass
        finally:
            with fake.cond:
                fake.subscribers.remove(q)
            self.close_connection = True

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
