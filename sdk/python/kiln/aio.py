"""The asyncio client: :class:`AsyncClient`, the same methods as :class:`kiln.Client`
as coroutines (and async iterators for events and ``submit_many``)."""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import (
    Any,
    AsyncIterable,
    AsyncIterator,
    Dict,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from . import _ahttp, _wire
from ._ahttp import AsyncEventStream
from ._batch import Backoff, Tracker
from ._paths import resolve_socket
from .candidate import CandidateLike, candidate_dict
from .client import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_WAIT_S,
    FOLLOW_IDLE_S,
    LONG_POLL_S,
    backend_warning,
    batch_wait,
    evaluation_of,
    poll_chunk,
    settled,
    unfinished_duplicate,
    wasm_bytes,
    with_warning,
)
from .errors import ApiError, KilnError, QueueFull, Timeout, TransportError
from .models import (
    ArchiveEntry,
    BaselineSet,
    CandidateRecord,
    CandidateSummary,
    Devices,
    Evaluation,
    Event,
    Health,
    Info,
    Job,
    Outcome,
    Problem,
    ProblemAdded,
    ProblemSummary,
    Search,
    SearchLogLine,
    Submission,
)
from .problem_folder import load_problem, problem_folders

__all__ = ["AsyncClient"]

T = TypeVar("T")
PathLike = Union[str, "os.PathLike[str]"]


class AsyncClient:
    """An asyncio client of kilnd over its Unix socket; see :class:`kiln.Client` for
    the meaning of each method. Safe to use from many tasks at once."""

    def __init__(self, socket: Optional[PathLike] = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._socket = resolve_socket(socket)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"kiln.AsyncClient(socket={self._socket!r})"

    @property
    def socket(self) -> str:
        """The socket this client talks to."""
        return self._socket

    async def _call(self, call: "_wire.Call[T]") -> T:
        timeout = self.timeout + call.server_wait_s
        status, data = await _ahttp.request(self._socket, call.method, call.target, call.body, timeout)
        return _wire.decode_response(call, status, data)

    async def health(self) -> Health:
        """``GET /v1/health``."""
        return await self._call(_wire.health())

    async def cluster(self) -> Dict[str, Any]:
        """``GET /v1/cluster``."""
        return await self._call(_wire.cluster())

    async def info(self) -> Info:
        """``GET /v1/info``."""
        return await self._call(_wire.info())

    async def devices(self) -> Devices:
        """The GPUs kilnd sees."""
        return (await self.info()).devices

    async def metrics(self) -> str:
        """``GET /metrics`` (Prometheus text)."""
        return await self._call(_wire.metrics())

    async def problems(self) -> List[ProblemSummary]:
        """Registered problems."""
        return await self._call(_wire.problems())

    async def problem(self, name: str) -> Problem:
        """One problem's spec and derived figures."""
        return await self._call(_wire.problem(name))

    async def baselines(self, name: str, *, remeasure: bool = False, gpu: Optional[str] = None) -> BaselineSet:
        """The problem's baselines on a GPU of this machine (measured on first use);
        see :meth:`kiln.Client.baselines`."""
        return await self._call(_wire.baselines(name, remeasure, gpu))

    async def add_problem(self, problem: Union[PathLike, Mapping[str, object]]) -> ProblemAdded:
        """Registers a problem folder (read here) or a loaded spec dict."""
        spec = problem if isinstance(problem, Mapping) else load_problem(problem)
        return await self._call(_wire.add_problem(spec))

    async def add_problems(self, root: PathLike) -> List[ProblemAdded]:
        """Registers every problem folder under ``root`` (or ``root`` itself)."""
        return [await self.add_problem(folder) for folder in problem_folders(root)]

    @overload
    async def submit(
        self,
        candidate: CandidateLike,
        problem: Optional[str] = ...,
        *,
        wait: Literal[True] = ...,
        timeout: float = ...,
    ) -> Evaluation: ...

    @overload
    async def submit(
        self,
        candidate: CandidateLike,
        problem: Optional[str] = ...,
        *,
        wait: Literal[False],
        timeout: float = ...,
    ) -> Submission: ...

    async def submit(
        self,
        candidate: CandidateLike,
        problem: Optional[str] = None,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_WAIT_S,
    ) -> Union[Evaluation, Submission]:
        """Submits a candidate; with ``wait``, returns its :class:`Evaluation`."""
        deadline = time.monotonic() + timeout
        sub = await self._call(_wire.submit(candidate_dict(candidate, problem)))
        if not wait:
            return sub
        if unfinished_duplicate(sub):
            sub = with_warning(sub, backend_warning(await self.info(), sub.backend))
        evaluation = settled(sub)
        if evaluation is not None:
            return evaluation
        return await self._wait_until(sub.id, deadline, timeout)

    async def get(self, candidate_id: str, *, wait: int = 0) -> CandidateRecord:
        """A candidate with its latest job and evaluation; ``wait`` long-polls."""
        return await self._call(_wire.get_candidate(candidate_id, int(wait)))

    async def wait(self, candidate_id: str, timeout: float = DEFAULT_WAIT_S) -> Evaluation:
        """Waits for a submitted candidate's evaluation."""
        return await self._wait_until(candidate_id, time.monotonic() + timeout, timeout)

    async def _wait_until(self, candidate_id: str, deadline: float, timeout: float) -> Evaluation:
        while True:
            record = await self.get(candidate_id, wait=poll_chunk(deadline))
            if record.finished:
                return evaluation_of(record)
            if time.monotonic() >= deadline:
                state = record.job.state if record.job else None
                raise Timeout(
                    f"no verdict for {candidate_id} within {timeout} s (job state: {state})",
                    candidate_id,
                    state,
                )

    async def candidates(self, problem: Optional[str] = None, limit: int = 50) -> List[CandidateSummary]:
        """Candidates, newest first, optionally of one problem."""
        return await self._call(_wire.candidates(problem, limit))

    async def job(self, job_id: int) -> Job:
        """One job of the queue."""
        return await self._call(_wire.job(job_id))

    def events(self, timeout: Optional[float] = None) -> AsyncEventStream:
        """The event stream: ``async with client.events() as s: async for ev in s: ...``
        (or ``s = await client.events()``; then ``await s.aclose()``)."""
        return AsyncEventStream(self._socket, timeout)

    async def start_search(
        self,
        problem: str,
        proposer: Optional[str] = None,
        *,
        wasm: Union[bytes, PathLike, None] = None,
        config: object = None,
        budget: Optional[int] = None,
        time_limit_s: Optional[int] = None,
        llm_tokens: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> Search:
        """Starts a search; see :meth:`kiln.Client.start_search`."""
        body = _wire.search_request(problem, proposer, wasm_bytes(wasm), config, budget, time_limit_s, llm_tokens, seed)
        return await self.search(await self._call(_wire.start_search(body)))

    async def searches(self, state: Optional[str] = None) -> List[Search]:
        """Searches, newest first, optionally only those in ``state``."""
        return await self._call(_wire.searches(state))

    async def search(self, search_id: str) -> Search:
        """One search: state, progress, best candidate so far."""
        return await self._call(_wire.search(search_id))

    async def cancel_search(self, search_id: str) -> None:
        """Cancels a running search."""
        await self._call(_wire.cancel_search(search_id))

    async def search_log(self, search_id: str, after: int = 0, limit: int = 500) -> List[SearchLogLine]:
        """A search's log lines with ids above ``after``."""
        return await self._call(_wire.search_log(search_id, after, limit))

    async def search_archive(self, search_id: str) -> List[ArchiveEntry]:
        """Every candidate the search submitted, oldest first, with its evaluation."""
        return await self._call(_wire.search_archive(search_id))

    async def follow_search(
        self, search_id: str, *, timeout: Optional[float] = None, poll_interval: float = 2.0
    ) -> AsyncIterator[Event]:
        """Yields the search's events until it ends, the last one a ``search`` event with
        its final state; see :meth:`kiln.Client.follow_search`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = await _AsyncFollower.start(self._socket)
        try:
            current, checked = await self.search(search_id), time.monotonic()
            while not current.finished:
                wait = poll_interval
                if deadline is not None:
                    if time.monotonic() >= deadline:
                        raise Timeout(f"search {search_id} still running after {timeout} s", state="running")
                    wait = min(wait, deadline - time.monotonic())
                ev: Optional[Event] = None
                if follower is not None and follower.alive:
                    ev = await follower.next_event(wait)
                else:
                    await asyncio.sleep(wait)
                if ev is not None and ev.search_id == search_id and ev.name in ("search", "search_log"):
                    yield ev
                    if ev.search_ended:
                        return
                elif ev is None or ev.name == "lagged" or time.monotonic() - checked >= poll_interval:
                    current, checked = await self.search(search_id), time.monotonic()
            yield current.as_event()
        finally:
            if follower is not None:
                await follower.close()

    async def submit_many(
        self,
        candidates: Union[Iterable[CandidateLike], AsyncIterable[CandidateLike]],
        problem: Optional[str] = None,
        *,
        timeout: float = DEFAULT_WAIT_S,
        window: int = 64,
        poll_interval: float = 10.0,
    ) -> AsyncIterator[Outcome]:
        """Submits many candidates (an iterable or async iterable) and yields an
        :class:`Outcome` for each as it finishes; see :meth:`kiln.Client.submit_many`."""
        if window < 1:
            raise ValueError("window must be at least 1")
        tracker = Tracker(timeout)
        backoff = Backoff(timeout)
        follower = await _AsyncFollower.start(self._socket)
        inputs = _Enumerate(candidates)
        held: Optional[Tuple[int, CandidateLike]] = None  # refused with a full queue: sent again
        exhausted = False
        info: Optional[Info] = None
        last_sweep = time.monotonic()
        try:
            while True:
                while tracker.in_flight < window:
                    if held is None:
                        held = None if exhausted else await inputs.next()
                        if held is None:
                            exhausted = True
                            break
                    if not backoff.due():
                        break
                    index, cand = held
                    try:
                        sub = await self._call(_wire.submit(candidate_dict(cand, problem)))
                    except QueueFull as e:
                        if not backoff.refused():
                            break
                        held = None
                        yield Outcome(index, None, None, e)
                        continue
                    except (ApiError, TypeError, ValueError) as e:
                        held = None
                        yield Outcome(index, None, None, e)
                        continue
                    held = None
                    backoff.taken()
                    if unfinished_duplicate(sub):
                        info = info or await self.info()
                        sub = with_warning(sub, backend_warning(info, sub.backend))
                    for o in tracker.add(index, sub):
                        yield o
                if exhausted and held is None and tracker.in_flight == 0:
                    return
                wait = batch_wait(poll_interval, tracker, backoff)
                if tracker.in_flight == 0:
                    await asyncio.sleep(wait)  # only a refused candidate waits: nothing to follow
                elif follower is not None and follower.alive:
                    await follower.drain(tracker, wait)
                else:
                    ids = tracker.waiting_ids()
                    if ids:
                        rec = await self.get(ids[0], wait=min(LONG_POLL_S, math.ceil(wait)))
                        for o in tracker.resolve(rec):
                            yield o
                for cid in tracker.take_ready():
                    for o in tracker.resolve(await self.get(cid)):
                        yield o
                now = time.monotonic()
                stream_ok = follower is not None and follower.alive and not follower.take_lagged()
                if not stream_ok or now - last_sweep >= poll_interval:
                    for cid in tracker.waiting_ids():
                        for o in tracker.resolve(await self.get(cid)):
                            yield o
                    last_sweep = now
                for o in tracker.expired():
                    yield o
        finally:
            if follower is not None:
                await follower.close()


class _Enumerate:
    """``enumerate`` over a sync or async iterable; :meth:`next` returns ``None`` at the end."""

    def __init__(self, items: Union[Iterable[CandidateLike], AsyncIterable[CandidateLike]]) -> None:
        self._sync = iter(items) if isinstance(items, Iterable) else None
        self._async = items.__aiter__() if self._sync is None else None  # type: ignore[union-attr]
        self._index = 0

    async def next(self) -> Optional[Tuple[int, CandidateLike]]:
        try:
            if self._sync is not None:
                item = next(self._sync)
            else:
                assert self._async is not None
                item = await self._async.__anext__()
        except (StopIteration, StopAsyncIteration):
            return None
        index, self._index = self._index, self._index + 1
        return index, item


class _AsyncFollower:
    """Reads the event stream in a task and hands the events to the batch."""

    def __init__(self, stream: AsyncEventStream) -> None:
        self._stream = stream
        self._queue: "asyncio.Queue[Optional[Event]]" = asyncio.Queue()
        self.alive = True
        self._lagged = False
        self._task = asyncio.ensure_future(self._run())

    @classmethod
    async def start(cls, socket_path: str) -> Optional["_AsyncFollower"]:
        """Subscribes and waits for ``hello``; ``None`` if the stream is not available.
        A missing daemon raises."""
        stream = AsyncEventStream(socket_path, FOLLOW_IDLE_S)
        try:
            await stream.open()
        except (ApiError, Timeout, TransportError):
            return None
        try:
            await stream.__anext__()
        except (StopAsyncIteration, KilnError):
            await stream.aclose()
            return None
        return cls(stream)

    async def _run(self) -> None:
        try:
            async for ev in self._stream:
                self._queue.put_nowait(ev)
        except KilnError:
            pass
        finally:
            self._queue.put_nowait(None)

    async def next_event(self, wait: float) -> Optional[Event]:
        """The next event, waiting up to ``wait`` seconds; ``None`` if none came or the
        stream ended (then :attr:`alive` is False)."""
        try:
            if wait > 0:
                ev = await asyncio.wait_for(self._queue.get(), wait)
            else:
                ev = self._queue.get_nowait()
        except (asyncio.TimeoutError, asyncio.QueueEmpty):
            return None
        if ev is None:
            self.alive = False
        return ev

    async def drain(self, tracker: Tracker, wait: float) -> None:
        """Feeds events to ``tracker`` until one of ours finished, or ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while self.alive:
            ev = await self.next_event(deadline - time.monotonic())
            if ev is None:
                return
            if ev.name == "lagged":
                self._lagged = True  # events were missed: the batch polls now
                return
            tracker.on_event(ev)
            if tracker.has_ready and self._queue.empty():
                return

    def take_lagged(self) -> bool:
        lagged, self._lagged = self._lagged, False
        return lagged

    async def close(self) -> None:
        self._task.cancel()
        # Closing the connection ends the reader task's read as well: on Python 3.11,
        # wait_for() can swallow a cancellation that lands just as its read completes
        # (fixed in 3.12), and the task would then go on reading keep-alives for ever, so
        # it is never awaited without a bound.
        await self._stream.aclose()
        await asyncio.wait({self._task}, timeout=_ahttp.CLOSE_WAIT_S)
        if self._task.done() and not self._task.cancelled():
            self._task.exception()  # retrieved here: nothing else reads it
