"""Bookkeeping of a pipelined batch (``submit_many``), free of I/O.

The sync and async drivers submit candidates, feed the tracker the submissions, the
events and the records they fetch, and yield the outcomes it returns. The tracker
decides which candidates are still waited for, which are known to be finished (from an
event, possibly one that arrived before the submission's answer) and which ran out of
time. The backoff decides when to send again a candidate kilnd refused because its
queue was full.

A hosted ``ModelNew`` file that kilnd lifted into a contract candidate is finished only
once the lifted candidate's job has ended too (see :class:`~kiln.models.Lift`); that job's
events carry the lifted candidate's own id, so the tracker watches that id for the file.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from typing import Callable, Dict, List, Optional

from .errors import BackendUnavailable, JobFailed, Timeout
from .models import CandidateRecord, Event, Outcome, Submission

#: How many ids of finished jobs not (yet) ours are remembered, in case our submission's
#: answer arrives after the job's "done" event.
_SEEN_LIMIT = 4096


class Tracker:
    """Which inputs wait for which candidate, and what is known about each."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._waiting: Dict[str, List[int]] = {}
        self._deadline: Dict[str, float] = {}
        self._ready: "OrderedDict[str, None]" = OrderedDict()
        self._seen_finished: "OrderedDict[str, None]" = OrderedDict()
        self._unavailable: Dict[str, str] = {}
        #: Files waited for whose lift is pending: the last record fetched for each
        #: (its ``lift.candidate_id`` is the id watched for it).
        self._lifting: Dict[str, CandidateRecord] = {}

    @property
    def in_flight(self) -> int:
        """Inputs submitted and still waited for."""
        return sum(len(v) for v in self._waiting.values())

    def waiting_ids(self) -> List[str]:
        """Candidates still waited for."""
        return list(self._waiting)

    def add(self, index: int, sub: Submission) -> List[Outcome]:
        """Takes the answer to submitting input ``index``; returns any outcome known now."""
        if sub.record is not None and sub.record.finished:
            return [_outcome(index, sub.record)]
        if sub.warning:
            self._unavailable[sub.id] = sub.warning
        warning = self._unavailable.get(sub.id)
        if warning is not None:
            return [Outcome(index, sub.id, None, BackendUnavailable(sub.id, sub.job_id, warning))]
        self._waiting.setdefault(sub.id, []).append(index)
        self._deadline.setdefault(sub.id, self._clock() + self.timeout)
        if sub.id in self._seen_finished:
            self._ready[sub.id] = None
        if sub.record is not None and sub.record.lift is not None and sub.record.lift.pending:
            # A duplicate whose lifted result is still to come, or not in the answer at
            # all (a duplicate's record lacks kilnd's `lift`): fetched once now.
            self._ready[sub.id] = None
            self._watch_lift(sub.record)
        return []

    def on_event(self, ev: Event) -> None:
        """Notes a job event; a finished job of ours becomes ready to fetch, and so does
        a file whose lifted candidate's job it is."""
        cid = ev.candidate_id
        if not ev.finished or cid is None:
            return
        for file_id, rec in self._lifting.items():
            if rec.lift is not None and rec.lift.candidate_id == cid:
                self._ready[file_id] = None
        if cid in self._waiting:
            self._ready[cid] = None
        else:
            self._seen_finished[cid] = None
            while len(self._seen_finished) > _SEEN_LIMIT:
                self._seen_finished.popitem(last=False)

    @property
    def has_ready(self) -> bool:
        """True if some candidate waited for is known to be finished."""
        return any(cid in self._waiting for cid in self._ready)

    def take_ready(self) -> List[str]:
        """Candidates whose job is known to be finished, to fetch now."""
        ids = [cid for cid in self._ready if cid in self._waiting]
        self._ready.clear()
        return ids

    def resolve(self, record: CandidateRecord) -> List[Outcome]:
        """Takes a fetched record; returns the outcomes of the inputs it finishes. A
        record not finished only because its lift is pending stays waited for, with its
        lifted candidate watched (:meth:`on_event`)."""
        if record.id not in self._waiting:
            return []
        if not record.finished:
            self._watch_lift(record)
            return []
        self._deadline.pop(record.id, None)
        self._lifting.pop(record.id, None)
        return [_outcome(i, record) for i in self._waiting.pop(record.id)]

    def _watch_lift(self, record: CandidateRecord) -> None:
        """Watches the lifted candidate of a waited-for file whose lift is pending; its
        job already seen finished makes the file ready now (once: the id is taken out of
        the finished ones seen, so a record still pending waits for the next sweep)."""
        lift = record.lift
        if record.id not in self._waiting or lift is None or not lift.pending or not lift.candidate_id:
            return
        self._lifting[record.id] = record
        if lift.candidate_id in self._seen_finished:
            del self._seen_finished[lift.candidate_id]
            self._ready[record.id] = None

    def expired(self) -> List[Outcome]:
        """Outcomes of the candidates past their deadline: :class:`~kiln.errors.Timeout`,
        except for a file evaluated in time whose lifted candidate was not: its outcome
        is the file's own (hosted) evaluation, the record's lift still pending."""
        now = self._clock()
        out: List[Outcome] = []
        for cid in [c for c, d in self._deadline.items() if d <= now]:
            del self._deadline[cid]
            lifting = self._lifting.pop(cid, None)
            for i in self._waiting.pop(cid, []):
                if lifting is not None and lifting.evaluation is not None:
                    out.append(_outcome(i, lifting))
                    continue
                out.append(
                    Outcome(i, cid, None, Timeout(f"no verdict for {cid} within {self.timeout} s", cid))
                )
        return out

    def seconds_to_deadline(self) -> Optional[float]:
        """Seconds until the next deadline, or ``None`` if nothing is waited for; 0 while
        a candidate is ready to fetch (known finished before the batch waits for news:
        a job seen done before its submission's answer, a duplicate whose lifted result
        is to be fetched), so the batch fetches it without waiting first."""
        if not self._deadline:
            return None
        if self.has_ready:
            return 0.0
        return max(0.0, min(self._deadline.values()) - self._clock())


class Backoff:
    """When to send again the candidate kilnd refused with a full queue (429).

    The driver holds that one candidate (and pulls no further input) until it is taken.
    The waits grow from ``first`` seconds, doubling up to ``cap``, each shortened by a
    random part of up to half (so clients that were refused together do not come back
    together), and start over once a candidate is taken. Once the queue has been full
    for ``give_up`` seconds in a row, a refusal is final: that candidate's outcome is
    the refusal, and so is the next one's if kilnd refuses it too, until one is taken.
    """

    def __init__(
        self,
        give_up: float,
        first: float = 0.1,
        cap: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.give_up = give_up
        self.first = first
        self.cap = cap
        self._clock = clock
        self._jitter = jitter
        self._delay = first
        self._retry_at: Optional[float] = None
        self._full_since: Optional[float] = None
        #: Refusals seen (for logs and tests).
        self.refusals = 0

    def due(self) -> bool:
        """True when a candidate may be sent now."""
        return self._retry_at is None or self._clock() >= self._retry_at

    def refused(self) -> bool:
        """Notes a refusal; True when it is final (the queue has been full too long),
        else the candidate is sent again after :meth:`seconds_to_retry`."""
        now = self._clock()
        self.refusals += 1
        if self._full_since is None:
            self._full_since = now
        if now - self._full_since >= self.give_up:
            self._retry_at = None
            return True
        self._retry_at = now + self._delay * (1.0 - 0.5 * self._jitter())
        self._delay = min(self.cap, self._delay * 2)
        return False

    def taken(self) -> None:
        """A candidate was taken: the queue has room again."""
        self._delay = self.first
        self._retry_at = None
        self._full_since = None

    def seconds_to_retry(self) -> Optional[float]:
        """Seconds until the held candidate may be sent again; ``None`` if none waits."""
        if self._retry_at is None:
            return None
        return max(0.0, self._retry_at - self._clock())


def _outcome(index: int, record: CandidateRecord) -> Outcome:
    if record.evaluation is not None:
        return Outcome(index, record.id, record.evaluation, None, record)
    job = record.job
    return Outcome(
        index,
        record.id,
        None,
        JobFailed(record.id, job.id if job else None, job.error if job else None),
        record,
    )
