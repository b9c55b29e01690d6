"""Bookkeeping of a pipelined batch (``submit_many``), free of I/O.

The sync and async drivers submit candidates, feed the tracker the submissions, the
events and the records they fetch, and yield the outcomes it returns. The tracker
decides which candidates are still waited for, which are known to be finished (from an
event, possibly one that arrived before the submission's answer) and which ran out of
time. The backoff decides when to send again a candidate kilnd refused because its
queue was full.
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
        return []

    def on_event(self, ev: Event) -> None:
        """Notes a job event; a finished job of ours becomes ready to fetch."""
        cid = ev.candidate_id
        if not ev.finished or cid is None:
            return
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
        """Takes a fetched record; returns the outcomes of the inputs it finishes."""
        if not record.finished or record.id not in self._waiting:
            return []
        self._deadline.pop(record.id, None)
        return [_outcome(i, record) for i in self._waiting.pop(record.id)]

    def expired(self) -> List[Outcome]:
        """Outcomes (:class:`~kiln.errors.Timeout`) of the candidates past their deadline."""
        now = self._clock()
        out: List[Outcome] = []
        for cid in [c for c, d in self._deadline.items() if d <= now]:
            del self._deadline[cid]
            for i in self._waiting.pop(cid, []):
                out.append(
                    Outcome(i, cid, None, Timeout(f"no verdict for {cid} within {self.timeout} s", cid))
                )
        return out

    def seconds_to_deadline(self) -> Optional[float]:
        """Seconds until the next deadline, or ``None`` if nothing is waited for."""
        if not self._deadline:
            return None
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
        return Outcome(index, record.id, record.evaluation, None)
    job = record.job
    return Outcome(
        index,
        record.id,
        None,
        JobFailed(record.id, job.id if job else None, job.error if job else None),
    )
