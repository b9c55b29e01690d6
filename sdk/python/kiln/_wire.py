"""What the sync and async clients share: the API calls as data, response decoding,
the errors a failed connection or exchange becomes, and the Server-Sent Events parser.
No I/O happens here (the procedures that make several calls are in ``_steps.py``)."""

from __future__ import annotations

import base64
import errno
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar
from urllib.parse import quote, urlencode

from .errors import ApiError, DaemonNotRunning, KilnError, Timeout, TransportError
from .models import (
    ArchiveEntry,
    BaselineSet,
    CandidateRecord,
    CandidateSummary,
    Event,
    Health,
    Info,
    Job,
    Problem,
    ProblemAdded,
    ProblemSummary,
    Search,
    SearchLogLine,
    Submission,
)

T = TypeVar("T")

#: How long kilnd may take to measure a problem's baselines (minutes on first use:
#: ``torch.compile``'s first call alone takes ~10 s), seconds.
MEASURE_BASELINES_S = 1800.0

#: How much longer than the server-side long-poll the client waits for the answer.
WAIT_MARGIN_S = 30.0


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to decode its JSON answer."""

    method: str
    target: str
    body: Optional[bytes]
    decode: Callable[[Any], T]
    #: Extra seconds the server may legitimately take (long-poll), added to the timeout.
    server_wait_s: float = 0.0
    #: The answer is text (``/metrics``), not JSON.
    text: bool = False


def _seg(value: str) -> str:
    return quote(value, safe="")


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode("utf-8")


def _expect_object(v: Any) -> Dict[str, Any]:
    if not isinstance(v, dict):
        raise TransportError(f"kilnd answered {type(v).__name__} where a JSON object was expected")
    return v


def health() -> Call[Health]:
    return Call("GET", "/v1/health", None, lambda v: Health.from_dict(_expect_object(v)))


def info() -> Call[Info]:
    return Call("GET", "/v1/info", None, lambda v: Info.from_dict(_expect_object(v)))


def cluster() -> Call[Dict[str, Any]]:
    return Call("GET", "/v1/cluster", None, lambda v: dict(_expect_object(v)))


def problems() -> Call[List[ProblemSummary]]:
    def decode(v: Any) -> List[ProblemSummary]:
        items = _expect_object(v).get("problems")
        return [ProblemSummary.from_dict(p) for p in items or [] if isinstance(p, dict)]

    return Call("GET", "/v1/problems", None, decode)


def problem(name: str) -> Call[Problem]:
    return Call("GET", f"/v1/problems/{_seg(name)}", None, lambda v: Problem.from_dict(_expect_object(v)))


def baselines(name: str, remeasure: bool, gpu: Optional[str]) -> Call[BaselineSet]:
    """``GET /v1/problems/{name}/baselines[?gpu=]`` (cached, or measured now), or with
    ``remeasure`` ``POST`` ``{"remeasure": true}`` (measured again)."""
    target = f"/v1/problems/{_seg(name)}/baselines"

    def decode(v: Any) -> BaselineSet:
        return BaselineSet.from_dict(_expect_object(v))

    if remeasure:
        body: Dict[str, Any] = {"remeasure": True}
        if gpu is not None:
            body["gpu"] = gpu
        return Call("POST", target, _json(body), decode, server_wait_s=MEASURE_BASELINES_S)
    if gpu is not None:
        target += f"?{urlencode({'gpu': gpu})}"
    return Call("GET", target, None, decode, server_wait_s=MEASURE_BASELINES_S)


def add_problem(spec: Mapping[str, Any]) -> Call[ProblemAdded]:
    def decode(v: Any) -> ProblemAdded:
        d = _expect_object(v)
        return ProblemAdded(name=str(d.get("name", spec.get("name", ""))), created=d.get("created") is True)

    return Call("POST", "/v1/problems", _json(spec), decode)


def submit(candidate: Mapping[str, Any]) -> Call[Submission]:
    return Call("POST", "/v1/candidates", _json(candidate), lambda v: Submission.from_dict(_expect_object(v)))


#: Most candidates kilnd takes in one ``POST /v1/candidates/batch``.
MAX_BATCH = 1024


def submit_batch(candidates: List[Mapping[str, Any]]) -> Call[Dict[str, Any]]:
    """``POST /v1/candidates/batch``: kilnd's answer as it is (``results`` by ``index``,
    each a submission's body with its ``status``, or its ``error``; ``queue``)."""
    return Call("POST", "/v1/candidates/batch", _json({"candidates": list(candidates)}), _expect_object)


def get_candidate(candidate_id: str, wait_s: int = 0) -> Call[CandidateRecord]:
    target = f"/v1/candidates/{_seg(candidate_id)}"
    if wait_s > 0:
        target += f"?wait={wait_s}"
    return Call(
        "GET",
        target,
        None,
        lambda v: CandidateRecord.from_dict(_expect_object(v)),
        server_wait_s=float(wait_s),
    )


def candidates(problem: Optional[str], limit: int) -> Call[List[CandidateSummary]]:
    query: Dict[str, Any] = {"limit": limit}
    if problem is not None:
        query["problem"] = problem

    def decode(v: Any) -> List[CandidateSummary]:
        items = _expect_object(v).get("candidates")
        return [CandidateSummary.from_dict(c) for c in items or [] if isinstance(c, dict)]

    return Call("GET", f"/v1/candidates?{urlencode(query)}", None, decode)


def job(job_id: int) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{int(job_id)}", None, lambda v: Job.from_dict(_expect_object(v)))


def start_search(body: Mapping[str, Any]) -> Call[str]:
    """``POST /v1/searches``; decodes to the new search's id."""
    return Call("POST", "/v1/searches", _json(body), lambda v: str(_expect_object(v).get("id", "")))


def searches(state: Optional[str]) -> Call[List[Search]]:
    target = "/v1/searches" + (f"?{urlencode({'state': state})}" if state is not None else "")

    def decode(v: Any) -> List[Search]:
        return [Search.from_dict(s) for s in _expect_object(v).get("searches") or [] if isinstance(s, dict)]

    return Call("GET", target, None, decode)


def search(search_id: str) -> Call[Search]:
    return Call("GET", f"/v1/searches/{_seg(search_id)}", None, lambda v: Search.from_dict(_expect_object(v)))


def cancel_search(search_id: str) -> Call[None]:
    return Call("POST", f"/v1/searches/{_seg(search_id)}/cancel", b"", lambda v: None)


def search_log(search_id: str, after: int, limit: int) -> Call[List[SearchLogLine]]:
    query = urlencode({"after": after, "limit": limit})

    def decode(v: Any) -> List[SearchLogLine]:
        return [SearchLogLine.from_dict(x) for x in _expect_object(v).get("lines") or [] if isinstance(x, dict)]

    return Call("GET", f"/v1/searches/{_seg(search_id)}/log?{query}", None, decode)


def search_archive(search_id: str) -> Call[List[ArchiveEntry]]:
    def decode(v: Any) -> List[ArchiveEntry]:
        return [ArchiveEntry.from_dict(x) for x in _expect_object(v).get("entries") or [] if isinstance(x, dict)]

    return Call("GET", f"/v1/searches/{_seg(search_id)}/archive", None, decode)


def search_request(
    problem: str,
    proposer: Optional[str],
    wasm: Optional[bytes],
    config: Any,
    budget: Optional[int],
    time_limit_s: Optional[int],
    llm_tokens: Optional[int],
    seed: Optional[int],
) -> Dict[str, Any]:
    """The body of ``POST /v1/searches``; fields left ``None`` take kilnd's defaults."""
    body: Dict[str, Any] = {"problem": problem}
    if proposer is not None:
        body["proposer"] = proposer
    if wasm is not None:
        body["wasm_base64"] = base64.b64encode(wasm).decode("ascii")
    for key, value in (("config", config), ("budget", budget), ("time_limit_secs", time_limit_s),
                       ("llm_tokens", llm_tokens), ("seed", seed)):
        if value is not None:
            body[key] = value
    return body


def metrics() -> Call[str]:
    """``/metrics`` is text, not JSON: the decoder gets the text."""
    return Call("GET", "/metrics", None, str, text=True)


#: errno values meaning "nobody is listening there".
_NOT_RUNNING = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR}


def connect_error(socket_path: str, e: OSError) -> KilnError:
    """What a failed connection to kilnd's socket is to the client's callers."""
    if e.errno in _NOT_RUNNING:
        return DaemonNotRunning(socket_path, e)
    if e.errno in (errno.EACCES, errno.EPERM):
        return TransportError(
            f"cannot connect to kilnd at {socket_path}: permission denied (the socket is "
            "for its owner and the `kiln` group: ask for membership or use another socket)"
        )
    return TransportError(f"cannot connect to kilnd at {socket_path}: {e}")


def no_answer(method: str, target: str, timeout: Optional[float]) -> Timeout:
    """kilnd did not answer a request in time."""
    return Timeout(f"kilnd did not answer {method} {target} within {timeout} s")


def exchange_broke(method: str, target: str, e: BaseException) -> TransportError:
    """The HTTP exchange of a request failed halfway."""
    return TransportError(f"{method} {target}: the exchange with kilnd broke: {e!r}")


def decode_response(call: "Call[T]", status: int, data: bytes) -> T:
    """Raises the typed :class:`~kiln.errors.ApiError` for an error status; else decodes."""
    if status >= 400:
        raise ApiError.from_response(status, data)
    if call.text:
        return call.decode(data.decode("utf-8", "replace"))
    try:
        value = json.loads(data.decode("utf-8")) if data else None
    except (UnicodeDecodeError, ValueError) as e:
        raise TransportError(f"kilnd's answer to {call.method} {call.target} is not JSON: {e}") from e
    return call.decode(value)


class SSEParser:
    """Incremental Server-Sent Events parser: feed bytes, get complete events.

    Comment lines (keep-alives) are skipped; an event without data is dropped; the data
    is decoded as JSON (a non-object payload is wrapped as ``{"value": ...}``).
    """

    def __init__(self) -> None:
        self._buf = b""
        self._name = ""
        self._data: List[str] = []

    def feed(self, chunk: bytes) -> List[Event]:
        self._buf += chunk
        events: List[Event] = []
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                return events
            line_end, next_start = cut
            line = self._buf[:line_end].decode("utf-8", "replace")
            self._buf = self._buf[next_start:]
            if line == "":
                ev = self._dispatch()
                if ev is not None:
                    events.append(ev)
            elif line.startswith(":"):
                continue
            else:
                key, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if key == "event":
                    self._name = value
                elif key == "data":
                    self._data.append(value)

    def _dispatch(self) -> Optional[Event]:
        name, data = self._name or "message", "\n".join(self._data)
        self._name, self._data = "", []
        if not data:
            return None
        try:
            payload: Any = json.loads(data)
        except ValueError:
            payload = data
        if not isinstance(payload, dict):
            payload = {"value": payload}
        return Event(name=name, data=payload)


def _line_end(buf: bytes) -> Optional[Tuple[int, int]]:
    """Where the first line ending (CRLF, LF or CR) in ``buf`` is and where the next line
    starts; ``None`` if there is no complete line yet (a trailing CR may still be a CRLF)."""
    lf, cr = buf.find(b"\n"), buf.find(b"\r")
    if cr == -1 or (lf != -1 and lf < cr):
        return (lf, lf + 1) if lf != -1 else None
    if cr + 1 == len(buf):
        return None
    return cr, (cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1)
