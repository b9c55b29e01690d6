"""The asyncio client: :class:`AsyncClient`, the same methods as :class:`kiln.Client`
as coroutines (and async iterators for events and ``submit_many``)."""

from __future__ import annotations

import asyncio
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

from . import _ahttp, _steps, _wire
from ._ahttp import AsyncEventStream
from ._paths import resolve_socket
from ._steps import DEFAULT_TIMEOUT_S, DEFAULT_WAIT_S, FOLLOW_IDLE_S, wasm_bytes
from .candidate import CandidateLike
from .errors import ApiError, KilnError, Timeout, TransportError
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

    async def _run(
        self, runner: _steps.Runner, follower: Optional["_AsyncFollower"] = None, inputs: Optional["_Enumerate"] = None
    ) -> AsyncIterator[Any]:
        """Runs a procedure of :mod:`kiln._steps` (as :meth:`kiln.Client._run` does),
        yielding what it emits (its value is then ``runner.value``)."""
        try:
            step = runner.resume()
            while step is not None:
                if isinstance(step, _steps.Emit):
                    yield step.value
                    step = runner.resume()
                    continue
                try:
                    answer = await self._do(step, follower, inputs)
                except Exception as e:  # noqa: BLE001 - raised inside the procedure
                    step = runner.resume(error=e)
                else:
                    step = runner.resume(answer)
        finally:
            runner.close()

    async def _value(self, procedure: _steps.Procedure) -> Any:
        """What a procedure that emits nothing returns."""
        runner = _steps.Runner(procedure)
        async for _ in self._run(runner):
            pass  # such a procedure has nothing to emit
        return runner.value

    async def _do(
        self, step: _steps.Step, follower: Optional["_AsyncFollower"], inputs: Optional["_Enumerate"]
    ) -> Any:
        if isinstance(step, _wire.Call):
            return await self._call(step)
        if isinstance(step, _steps.Sleep):
            await asyncio.sleep(step.seconds)
        elif isinstance(step, _steps.NextEvent):
            assert follower is not None
            return await follower.next_event(step.wait)
        elif step is _steps.NEXT_INPUT:
            assert inputs is not None
            return await inputs.next()
        else:  # pragma: no cover
            raise TypeError(f"not a step: {step!r}")
        return None

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
        return await self._value(_steps.submit(candidate, problem, wait, timeout))

    async def get(self, candidate_id: str, *, wait: int = 0) -> CandidateRecord:
        """A candidate with its latest job and evaluation; ``wait`` long-polls."""
        return await self._call(_wire.get_candidate(candidate_id, int(wait)))

    async def wait(self, candidate_id: str, timeout: float = DEFAULT_WAIT_S) -> Evaluation:
        """Waits for a submitted candidate's evaluation."""
        return await self._value(_steps.wait_until(candidate_id, time.monotonic() + timeout, timeout))

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
        procedure = _steps.follow_search(search_id, deadline, timeout, poll_interval, follower)
        run = self._run(_steps.Runner(procedure), follower)
        try:
            async for ev in run:
                yield ev
        finally:
            await run.aclose()
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
        _steps.check_window(window)
        follower = await _AsyncFollower.start(self._socket)
        procedure = _steps.submit_many(problem, timeout, window, poll_interval, follower)
        run = self._run(_steps.Runner(procedure), follower, _Enumerate(candidates))
        try:
            async for o in run:
                yield o
        finally:
            await run.aclose()
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
        #: The stream reported missed events (set by the batch, see :func:`kiln._steps.drain`).
        self.lagged = False
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

    def idle(self) -> bool:
        """True if no event waits to be read."""
        return self._queue.empty()

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
