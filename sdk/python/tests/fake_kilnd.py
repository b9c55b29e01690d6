"""A stand-in for kilnd that finishes jobs itself, to test the client's pipelining
(event-driven completion, missed events, failed jobs) independently of any backend.

It speaks the same wire shapes as kilnd for the routes the batch machinery uses:
``POST /v1/candidates``, ``GET /v1/candidates/{id}[?wait=N]``, ``GET /v1/events``,
``GET /v1/info``. A candidate whose source contains ``BROKEN`` gets ``compile_error``,
one containing ``FAILJOB`` a failed job, one containing ``NEVER`` never finishes;
anything else is ``ok``.
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
    """

    def __init__(
        self,
        publish_done: bool = True,
        events: bool = True,
        lag: bool = False,
        delay: "tuple[float, float]" = (0.01, 0.2),
    ) -> None:
        self.publish_done = publish_done
        self.events_enabled = events
        self.lag = lag
        self.delay = delay
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-fake-"))
        self.socket = str(self.dir / "fake.sock")
        self.records: Dict[str, Dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.subscribers: List["queue.Queue[Optional[str]]"] = []
        self.next_job = 1
        self.posts = 0
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

    def publish(self, event: Dict[str, Any]) -> None:
        frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
        with self.cond:
            for q in self.subscribers:
                q.put(frame)

    def submit(self, cand: Dict[str, Any]) -> "tuple[int, Dict[str, Any]]":
        if cand.get("problem") != "dbl":
            return 404, {"error": {"code": "not_found", "message": f"problem {cand.get('problem')!r} is not registered"}}
        if cand.get("language") not in ("c", "cuda", "modelnew", "modelnew-cpu") or not isinstance(cand.get("source"), str):
            return 400, {"error": {"code": "invalid_field", "message": "field `language`: unknown variant"}}
        if cand["language"].startswith("modelnew") and (cand.get("launches") or "class ModelNew" not in cand["source"]):
            return 400, {"error": {"code": "invalid_candidate", "message": "launches: a modelnew candidate takes none"}}
        cid = hashlib.sha256(cand["source"].encode()).hexdigest()[:32]
        with self.cond:
            self.posts += 1
            if cid in self.records:
                rec = self.records[cid]
                return 200, {"id": cid, "job_id": rec["job"]["id"], "duplicate": True, "record": rec}
            job_id, self.next_job = self.next_job, self.next_job + 1
            self.records[cid] = {
                "id": cid,
                "candidate": cand,
                "backend": "host",
                "created_at": int(time.time() * 1000),
                "job": {"id": job_id, "candidate_id": cid, "backend": "host", "state": "queued", "attempts": 0},
                "evaluation": None,
            }
            unfinished = sum(1 for r in self.records.values() if r["job"]["state"] == "queued")
            self.max_unfinished = max(self.max_unfinished, unfinished)
        self.publish({"type": "job", "job_id": job_id, "candidate_id": cid, "problem": "dbl", "state": "queued"})
        if "NEVER" not in cand["source"]:
            threading.Timer(random.uniform(*self.delay), self.finish, args=(cid,)).start()
        return 202, {"id": cid, "job_id": job_id, "duplicate": False, "state": "queued"}

    def finish(self, cid: str) -> None:
        with self.cond:
            rec = self.records[cid]
            source = rec["candidate"]["source"]
            event: Dict[str, Any] = {"type": "job", "job_id": rec["job"]["id"], "candidate_id": cid, "problem": "dbl"}
            if "FAILJOB" in source:
                rec["job"].update(state="failed", error="worker crashed (fake)")
                event.update(state="failed", error="worker crashed (fake)")
            elif "BROKEN" in source:
                rec["job"]["state"] = "done"
                rec["evaluation"] = {
                    "verdict": "compile_error",
                    "message": "the compiler refused the source",
                    "backend": "host",
                    "compile": {"duration_ms": 3.0, "log": "error: expected ';'", "cached": False},
                    "evidence": {"trials_passed": 0, "trials_run": 0, "bitwise_diffs": 0},
                }
                event.update(state="done", verdict="compile_error")
            else:
                median = 10.0 + len(source) % 7
                rec["job"]["state"] = "done"
                rec["evaluation"] = {
                    "verdict": "ok",
                    "message": "correct on 3 trials",
                    "backend": "host",
                    "evidence": {"trials_passed": 3, "trials_run": 3, "bitwise_diffs": 0},
                    "timing": {"median_us": median, "mean_us": median, "stdev_us": 0.1, "min_us": median,
                               "max_us": median, "n": 10, "rse": 0.001, "stop_reason": "converged"},
                    "tier": "fp32-faithful",
                }
                if rec["candidate"]["language"].startswith("modelnew"):
                    rec["evaluation"]["trust"] = "hosted"
                event.update(state="done", verdict="ok", median_us=median)
            self.cond.notify_all()
        if self.lag:
            self.publish({"type": "lagged", "missed": 1})
        elif self.publish_done:
            self.publish(event)

    def show(self, cid: str, wait: float) -> "tuple[int, Dict[str, Any]]":
        deadline = time.monotonic() + wait
        with self.cond:
            while True:
                rec = self.records.get(cid)
                if rec is None:
                    return 404, {"error": {"code": "not_found", "message": f"candidate {cid!r} not found"}}
                done = rec["evaluation"] is not None or rec["job"]["state"] == "failed"
                left = deadline - time.monotonic()
                if done or left <= 0:
                    return 200, json.loads(json.dumps(rec))
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
        else:
            self._send(404, {"error": {"code": "not_found", "message": "no route"}})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlsplit(self.path)
        fake = self.server_fake
        if url.path == "/v1/info":
            self._send(200, {"version": "fake", "backends": [{"name": "host", "usable": True, "detail": "fake"}]})
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
