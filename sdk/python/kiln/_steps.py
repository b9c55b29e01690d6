"""The clients' procedures that take more than one request, written once.

Submitting and waiting, following a search and pipelining a batch (``submit_many``) are
generators of *steps*: a :class:`~kiln._wire.Call` to make, a :class:`Sleep`, the event
stream's next event (:class:`NextEvent`), the next input (:data:`NEXT_INPUT`), or
something to hand to the caller (:class:`Emit`). The blocking client (``client.py``)
and the asyncio one (``aio.py``) each run them with a :class:`Runner`, doing every step
with their own I/O and sending its answer back (or throwing in the error it raised, as
if the procedure had made the request itself). No I/O happens here; the helpers both
clients use around these procedures live here too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
import os
from typing import Any, Generator, Iterable, List, Optional, Tuple, Union

from . import _wire
from ._batch import Backoff, Tracker
from .candidate import CandidateLike, candidate_dict
from .errors import ApiError, BackendUnavailable, JobFailed, QueueFull, Timeout
from .models import CandidateRecord, Evaluation, Event, Info, Outcome, Submission

PathLike = Union[str, "os.PathLike[str]"]

#: Default limit for one plain request, seconds.
DEFAULT_TIMEOUT_S = 60.0
#: Default limit for waiting for a verdict, seconds.
DEFAULT_WAIT_S = 600.0
#: Longest single long-poll (the server accepts up to 600 s).
LONG_POLL_S = 60
#: Silence on the event stream after which a batch stops trusting it (kilnd sends a
#: keep-alive every 15 s) and falls back to polling.
FOLLOW_IDLE_S = 60.0


# ---- the steps --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``; answered with ``None``."""

    seconds: float


@dataclass(frozen=True)
class NextEvent:
    """The follower's next event within ``wait`` seconds (``follower.next_event``);
    answered with the event or ``None``."""

    wait: float


@dataclass(frozen=True)
class Emit:
    """Hand ``value`` to the caller (an iterator's next item); answered with ``None``."""

    value: Any


class _NextInput:
    def __repr__(self) -> str:
        return "NEXT_INPUT"


#: The batch's next ``(index, candidate)``; answered with it, or ``None`` at the end.
NEXT_INPUT = _NextInput()

Step = Union["_wire.Call[Any]", Sleep, NextEvent, Emit, _NextInput]
Procedure = Generator[Step, Any, Any]


class Runner:
    """Steps a procedure: :meth:`resume` gives the next step to do (``None`` once it
    returned, its value then in :attr:`value`), given the last step's answer or error."""

    def __init__(self, procedure: Generator[Any, Any, Any]) -> None:
        self.procedure = procedure
        self.value: Any = None

    def resume(self, answer: Any = None, error: Optional[BaseException] = None) -> Any:
        try:
            if error is not None:
                return self.procedure.throw(error)
            return self.procedure.send(answer)
        except StopIteration as done:
            self.value = done.value
            return None

    def close(self) -> None:
        self.procedure.close()


# ---- helpers ----------------------------------------------------------------------------


def settled(sub: Submission) -> Optional[Evaluation]:
    """What a submission's answer already says: the stored evaluation of a duplicate, or
    ``None`` if the caller must wait. Raises :class:`JobFailed` for a duplicate whose
    job failed and :class:`BackendUnavailable` when the answer warns that the job
    cannot run on this kilnd."""
    rec = sub.record
    if rec is not None and rec.finished:
        return evaluation_of(rec)
    if sub.warning:
        raise BackendUnavailable(sub.id, sub.job_id, sub.warning)
    return None


def unfinished_duplicate(sub: Submission) -> bool:
    """True for a duplicate still waiting: its answer carries no backend warning, so the
    caller must ask ``/v1/info`` whether its backend runs here."""
    return sub.duplicate and sub.record is not None and not sub.record.finished


def backend_warning(info: Info, backend: str) -> Optional[str]:
    """Why jobs for ``backend`` wait forever on this kilnd, or ``None`` if they run."""
    b = info.backend(backend)
    if b is not None and b.usable:
        return None
    why = b.detail if b is not None else "it is not built in"
    return f"the {backend} backend is not usable here ({why}); the job waits in the queue"


def with_warning(sub: Submission, warning: Optional[str]) -> Submission:
    """``sub`` with ``warning`` (when there is one)."""
    return dataclasses.replace(sub, warning=warning) if warning else sub


def evaluation_of(record: CandidateRecord) -> Evaluation:
    """The evaluation of a finished record; raises :class:`JobFailed` if its job failed."""
    if record.evaluation is not None:
        return record.evaluation
    job = record.job
    raise JobFailed(record.id, job.id if job else None, job.error if job else None)


def wasm_bytes(wasm: Union[bytes, PathLike, None]) -> Optional[bytes]:
    """A proposer component's bytes, from bytes or a path to a ``.wasm`` file."""
    if wasm is None or isinstance(wasm, (bytes, bytearray)):
        return bytes(wasm) if wasm is not None else None
    with open(wasm, "rb") as f:
        return f.read()


def batch_wait(poll_interval: float, tracker: Tracker, backoff: Backoff) -> float:
    """How long a batch may wait for news before it must look again: the poll interval,
    shortened to the next candidate's deadline and to the held candidate's retry."""
    wait = poll_interval
    for t in (tracker.seconds_to_deadline(), backoff.seconds_to_retry()):
        if t is not None:
            wait = min(wait, t)
    return wait


def poll_chunk(deadline: float) -> int:
    """Seconds for the next long-poll before ``deadline`` (0 once it has passed)."""
    left = deadline - time.monotonic()
    return 0 if left <= 0 else min(LONG_POLL_S, math.ceil(left))


def check_window(window: int) -> None:
    """``submit_many``'s window, checked before anything is sent."""
    if window < 1:
        raise ValueError("window must be at least 1")


def _take_lagged(follower: Any) -> bool:
    """True (once) if the stream reported missed events since the last call."""
    lagged, follower.lagged = follower.lagged, False
    return bool(lagged)


def _emit(outcomes: Iterable[Outcome]) -> Procedure:
    for o in outcomes:
        yield Emit(o)


# ---- the procedures ---------------------------------------------------------------------


def drain(tracker: Tracker, wait: float, follower: Any) -> Procedure:
    """Feeds the follower's events to ``tracker`` until one of ours finished, or ``wait``
    seconds; a ``lagged`` event (events were missed) ends it, noted on the follower so
    that the batch polls."""
    deadline = time.monotonic() + wait
    while follower.alive:
        ev: Optional[Event] = yield NextEvent(deadline - time.monotonic())
        if ev is None:
            return None
        if ev.name == "lagged":
            follower.lagged = True
            return None
        tracker.on_event(ev)
        if tracker.has_ready and follower.idle():
            return None
    return None


def wait_until(candidate_id: str, deadline: float, timeout: float) -> Procedure:
    """Long-polls a candidate until its evaluation; returns it. Raises
    :class:`JobFailed`, or :class:`Timeout` once ``deadline`` has passed."""
    while True:
        record: CandidateRecord = yield _wire.get_candidate(candidate_id, poll_chunk(deadline))
        if record.finished:
            return evaluation_of(record)
        if time.monotonic() >= deadline:
            state = record.job.state if record.job else None
            raise Timeout(
                f"no verdict for {candidate_id} within {timeout} s (job state: {state})",
                candidate_id,
                state,
            )


def submit(candidate: CandidateLike, problem: Optional[str], wait: bool, timeout: float) -> Procedure:
    """``Client.submit``: returns the :class:`Submission`, or with ``wait`` the
    :class:`Evaluation`."""
    deadline = time.monotonic() + timeout
    sub: Submission = yield _wire.submit(candidate_dict(candidate, problem))
    if not wait:
        return sub
    if unfinished_duplicate(sub):
        info: Info = yield _wire.info()
        sub = with_warning(sub, backend_warning(info, sub.backend))
    evaluation = settled(sub)
    if evaluation is not None:
        return evaluation
    return (yield from wait_until(sub.id, deadline, timeout))


def follow_search(
    search_id: str, deadline: Optional[float], timeout: Optional[float], poll_interval: float, follower: Any
) -> Procedure:
    """``Client.follow_search``, with the follower the caller subscribed (or ``None``)
    before the search's state is read; emits the events."""
    current = yield _wire.search(search_id)
    checked = time.monotonic()
    while not current.finished:
        wait = poll_interval
        if deadline is not None:
            if time.monotonic() >= deadline:
                raise Timeout(f"search {search_id} still running after {timeout} s", state="running")
            wait = min(wait, deadline - time.monotonic())
        ev: Optional[Event] = None
        if follower is not None and follower.alive:
            ev = yield NextEvent(wait)
        else:
            yield Sleep(wait)
        if ev is not None and ev.search_id == search_id and ev.name in ("search", "search_log"):
            yield Emit(ev)
            if ev.search_ended:
                return None
        elif ev is None or ev.name == "lagged" or time.monotonic() - checked >= poll_interval:
            current = yield _wire.search(search_id)
            checked = time.monotonic()
    yield Emit(current.as_event())
    return None


def _batch_item(item: Any) -> Union[Submission, ApiError]:
    """One result of ``POST /v1/candidates/batch``: the submission a single ``POST`` would
    have answered, or the error it would have raised (``QueueFull`` for a full queue)."""
    if not isinstance(item, dict):
        return ApiError(502, "bad_batch_answer", "kilnd's batch answer lacks this candidate's result", item)
    status = item.get("status")
    if isinstance(status, int) and status < 300 and "error" not in item:
        return Submission.from_dict(item)
    raw = json.dumps({"error": item.get("error") or {}}).encode()
    return ApiError.from_response(status if isinstance(status, int) else 502, raw)


def submit_many(problem: Optional[str], timeout: float, window: int, poll_interval: float, follower: Any) -> Procedure:
    """``Client.submit_many`` (see there), with the follower the caller subscribed (or
    ``None``); reads the inputs with :data:`NEXT_INPUT` and emits the outcomes.

    The window is filled with one ``POST /v1/candidates/batch`` (kilnd admits each
    candidate as a single submission, with per-candidate backpressure); a kilnd without
    that route (404/405) gets one ``POST /v1/candidates`` each, as before."""
    tracker = Tracker(timeout)
    backoff = Backoff(timeout)
    # Inputs read and not yet taken by kilnd, in order; while any of them was refused with
    # a full queue, no further input is read.
    held: List[Tuple[int, CandidateLike]] = []
    refused_held = False
    batches = True
    exhausted = False
    info: Optional[Info] = None
    last_sweep = time.monotonic()
    while True:
        while tracker.in_flight < window:
            room = min(window - tracker.in_flight, _wire.MAX_BATCH if batches else 1)
            while not refused_held and not exhausted and len(held) < room:
                nxt = yield NEXT_INPUT
                if nxt is None:
                    exhausted = True
                else:
                    held.append(nxt)
            if not held or not backoff.due():
                break
            sending = held[:room]
            bodies: List[Tuple[int, CandidateLike, Any]] = []
            for index, cand in sending:
                try:
                    bodies.append((index, cand, candidate_dict(cand, problem)))
                except (TypeError, ValueError) as e:
                    yield Emit(Outcome(index, None, None, e))
            held = held[len(sending):]
            answers: List[Tuple[int, CandidateLike, Any]] = []
            if batches and len(bodies) > 1:
                try:
                    reply = yield _wire.submit_batch([b for _, _, b in bodies])
                    by_index = {r.get("index"): r for r in reply.get("results") or [] if isinstance(r, dict)}
                    answers = [(i, c, by_index.get(k)) for k, (i, c, _) in enumerate(bodies)]
                except ApiError as e:
                    # 404/405: a kilnd from before batches; 413: a batch over its body limit.
                    if e.status not in (404, 405, 413):
                        for index, _, _ in bodies:
                            yield Emit(Outcome(index, None, None, e))
                        continue
                    batches = False  # one at a time from here on
            if not answers:
                # One at a time: the first; the rest go back in front of the held ones.
                if not bodies:
                    continue
                (index, cand, body), rest = bodies[0], bodies[1:]
                held = [(i, c) for i, c, _ in rest] + held
                try:
                    sub: Submission = yield _wire.submit(body)
                    answers = [(index, cand, sub)]
                except ApiError as e:  # QueueFull among them: held below
                    answers = [(index, cand, e)]
            refused: List[Tuple[int, CandidateLike, ApiError]] = []
            taken = False
            for index, cand, got in answers:
                if isinstance(got, dict):
                    got = _batch_item(got)
                if isinstance(got, QueueFull):
                    refused.append((index, cand, got))
                    continue
                if isinstance(got, BaseException):
                    yield Emit(Outcome(index, None, None, got))
                    continue
                taken = True
                sub = got
                if unfinished_duplicate(sub):
                    info = info or (yield _wire.info())
                    sub = with_warning(sub, backend_warning(info, sub.backend))
                yield from _emit(tracker.add(index, sub))
            if taken:
                backoff.taken()
            refused_held = False
            if refused:
                if backoff.refused():
                    # Full for too long: the refusal is each one's outcome.
                    for index, _, e in refused:
                        yield Emit(Outcome(index, None, None, e))
                else:
                    held = [(i, c) for i, c, _ in refused] + held
                    refused_held = True
                    break
        if exhausted and not held and tracker.in_flight == 0:
            return None
        wait = batch_wait(poll_interval, tracker, backoff)
        if tracker.in_flight == 0:
            yield Sleep(wait)  # only a refused candidate waits: nothing to follow
        elif follower is not None and follower.alive:
            yield from drain(tracker, wait, follower)
        else:
            ids = tracker.waiting_ids()
            if ids:
                rec = yield _wire.get_candidate(ids[0], min(LONG_POLL_S, math.ceil(wait)))
                yield from _emit(tracker.resolve(rec))
        for cid in tracker.take_ready():
            yield from _emit(tracker.resolve((yield _wire.get_candidate(cid, 0))))
        now = time.monotonic()
        stream_ok = follower is not None and follower.alive and not _take_lagged(follower)
        if not stream_ok or now - last_sweep >= poll_interval:
            for cid in tracker.waiting_ids():
                yield from _emit(tracker.resolve((yield _wire.get_candidate(cid, 0))))
            last_sweep = now
        yield from _emit(tracker.expired())
