"""The blocking client: :class:`Client`."""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, TypeVar, Union, overload

from . import _http, _steps, _wire
from ._paths import resolve_socket
from ._steps import (  # noqa: F401 - the helpers' names stay importable from here
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

__all__ = ["Client", "DEFAULT_TIMEOUT_S", "DEFAULT_WAIT_S"]

T = TypeVar("T")
PathLike = Union[str, "os.PathLike[str]"]


class Client:
    """A blocking client of kilnd over its Unix socket. Safe to share between threads.

    Args:
        socket: kilnd's socket. Default: ``$KILN_SOCKET``, else the user socket
            (``$XDG_RUNTIME_DIR/kiln/kiln.sock``) if it exists, else
            ``/run/kiln/kiln.sock`` if it exists, else the user socket.
        timeout: limit for one plain request, seconds (long-polls get their wait on top).

    Nothing is contacted until the first call; a missing daemon raises
    :class:`~kiln.errors.DaemonNotRunning` then.
    """

    def __init__(self, socket: Optional[PathLike] = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._socket = resolve_socket(socket)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"kiln.Client(socket={self._socket!r})"

    @property
    def socket(self) -> str:
        """The socket this client talks to."""
        return self._socket

    def _call(self, call: "_wire.Call[T]") -> T:
        timeout = self.timeout + call.server_wait_s
        status, data = _http.request(self._socket, call.method, call.target, call.body, timeout)
        return _wire.decode_response(call, status, data)

    def _run(
        self, runner: _steps.Runner, follower: Optional["_Follower"] = None, inputs: Optional[Iterator[Any]] = None
    ) -> Iterator[Any]:
        """Runs a procedure of :mod:`kiln._steps`, yielding what it emits (its value is
        then ``runner.value``)."""
        try:
            step = runner.resume()
            while step is not None:
                if isinstance(step, _steps.Emit):
                    yield step.value
                    step = runner.resume()
                    continue
                try:
                    answer = self._do(step, follower, inputs)
                except Exception as e:  # noqa: BLE001 - raised inside the procedure
                    step = runner.resume(error=e)
                else:
                    step = runner.resume(answer)
        finally:
            runner.close()

    def _value(self, procedure: _steps.Procedure) -> Any:
        """What a procedure that emits nothing returns."""
        runner = _steps.Runner(procedure)
        for _ in self._run(runner):
            pass  # such a procedure has nothing to emit
        return runner.value

    def _do(self, step: _steps.Step, follower: Optional["_Follower"], inputs: Optional[Iterator[Any]]) -> Any:
        if isinstance(step, _wire.Call):
            return self._call(step)
        if isinstance(step, _steps.Sleep):
            time.sleep(step.seconds)
        elif isinstance(step, _steps.NextEvent):
            assert follower is not None
            return follower.next_event(step.wait)
        elif step is _steps.NEXT_INPUT:
            assert inputs is not None
            return next(inputs, None)
        else:  # pragma: no cover
            raise TypeError(f"not a step: {step!r}")
        return None

    # -- the daemon --------------------------------------------------------------------

    def health(self) -> Health:
        """``GET /v1/health``: status, version, uptime, jobs not yet on a lane (``queued``) and evaluating (``running``)."""
        return self._call(_wire.health())

    def cluster(self) -> Dict[str, Any]:
        """``GET /v1/cluster``: the nodes sharing this kilnd's database (alive, lanes and
        GPU classes, leases held, drift), the queue per class; ``clustered`` is false on
        a single host."""
        return self._call(_wire.cluster())

    def info(self) -> Info:
        """``GET /v1/info``: version, backends (and whether each is usable), GPUs, jail
        layers, host CPUs and memory."""
        return self._call(_wire.info())

    def devices(self) -> Devices:
        """The GPUs kilnd sees, with the driver versions (or why there are none)."""
        return self.info().devices

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._call(_wire.metrics())

    # -- problems ----------------------------------------------------------------------

    def problems(self) -> List[ProblemSummary]:
        """Registered problems."""
        return self._call(_wire.problems())

    def problem(self, name: str) -> Problem:
        """One problem's spec (sources inlined) and derived figures; :class:`NotFound` if
        it is not registered."""
        return self._call(_wire.problem(name))

    def baselines(self, name: str, *, remeasure: bool = False, gpu: Optional[str] = None) -> BaselineSet:
        """The problem's baselines (its reference, cuBLAS, cuDNN, torch eager and
        ``torch.compile``, as its spec asks) timed on a GPU of this machine under the
        candidates' protocol: cached, else measured now (minutes on first use: it holds
        a GPU lane meanwhile); ``remeasure`` measures again. ``gpu`` (NVML index or UUID)
        picks the GPU model, default lane 0's. Raises :class:`NotFound` for an unknown
        problem or GPU and :class:`Conflict` (``baselines_unavailable``) without a
        usable cuda backend."""
        return self._call(_wire.baselines(name, remeasure, gpu))

    def add_problem(self, problem: Union[PathLike, Mapping[str, object]]) -> ProblemAdded:
        """Registers a problem: a folder with ``problem.toml`` (read here, sources
        inlined, like ``kiln problems add``), or an already loaded spec dict.

        Returns ``created=True`` when new, ``False`` when already registered with the
        same spec; raises :class:`~kiln.errors.Conflict` when the name is taken by a
        different spec and :class:`~kiln.errors.BadRequest` for an invalid spec.
        """
        spec = problem if isinstance(problem, Mapping) else load_problem(problem)
        return self._call(_wire.add_problem(spec))

    def add_problems(self, root: PathLike) -> List[ProblemAdded]:
        """Registers every problem folder under ``root`` (or ``root`` itself)."""
        return [self.add_problem(folder) for folder in problem_folders(root)]

    # -- candidates --------------------------------------------------------------------

    @overload
    def submit(
        self,
        candidate: CandidateLike,
        problem: Optional[str] = ...,
        *,
        wait: Literal[True] = ...,
        timeout: float = ...,
    ) -> Evaluation: ...

    @overload
    def submit(
        self,
        candidate: CandidateLike,
        problem: Optional[str] = ...,
        *,
        wait: Literal[False],
        timeout: float = ...,
    ) -> Submission: ...

    def submit(
        self,
        candidate: CandidateLike,
        problem: Optional[str] = None,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_WAIT_S,
    ) -> Union[Evaluation, Submission]:
        """Submits a candidate (a dict in the wire shape or a :class:`kiln.Candidate`).

        ``problem``, when given, overrides the candidate's ``problem``. With ``wait``
        (the default) returns its :class:`Evaluation` once there is one, waiting up to
        ``timeout`` seconds; a candidate submitted before is answered from the store.
        Without ``wait`` returns the :class:`Submission` (id, job id, duplicate).

        Raises :class:`~kiln.errors.BadRequest` / :class:`~kiln.errors.NotFound` when
        kilnd refuses it, and, with ``wait``: :class:`~kiln.errors.BackendUnavailable`
        when its backend is not usable here (it stays queued),
        :class:`~kiln.errors.JobFailed` when kilnd could not evaluate it, and
        :class:`~kiln.errors.Timeout` when no verdict came in time.
        """
        return self._value(_steps.submit(candidate, problem, wait, timeout))

    def get(self, candidate_id: str, *, wait: int = 0) -> CandidateRecord:
        """A candidate with its latest job and evaluation (``None`` until there is one).

        With ``wait`` (seconds, at most 600), kilnd holds the answer until the
        evaluation exists or the job failed, or the time is up.
        """
        return self._call(_wire.get_candidate(candidate_id, int(wait)))

    def wait(self, candidate_id: str, timeout: float = DEFAULT_WAIT_S) -> Evaluation:
        """Waits (long-polling) for a submitted candidate's evaluation.

        Raises :class:`~kiln.errors.JobFailed` or :class:`~kiln.errors.Timeout`.
        """
        return self._value(_steps.wait_until(candidate_id, time.monotonic() + timeout, timeout))

    def candidates(self, problem: Optional[str] = None, limit: int = 50) -> List[CandidateSummary]:
        """Candidates, newest first (``limit`` 1..1000), optionally of one problem."""
        return self._call(_wire.candidates(problem, limit))

    def job(self, job_id: int) -> Job:
        """One job of the queue."""
        return self._call(_wire.job(job_id))

    def events(self, timeout: Optional[float] = None) -> _http.EventStream:
        """Opens ``GET /v1/events``; iterate the stream for :class:`Event`\\ s (the first
        is ``hello``). Close it (or use ``with``) when done.

        ``timeout`` bounds the silence between reads (keep-alives come every 15 s).
        """
        return _http.EventStream(self._socket, timeout)

    # -- searches ----------------------------------------------------------------------

    def start_search(
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
        """Starts a search: a proposer plugin submitting candidates for ``problem``.

        ``proposer`` names a proposer installed with kilnd, or (with ``wasm``: the
        component's bytes or a path to its ``.wasm``) the name to give an uploaded one.
        ``config`` (any JSON) is passed to the plugin; ``budget`` (distinct candidates),
        ``time_limit_s``, ``llm_tokens`` and ``seed`` default to kilnd's ``[search]``.

        Raises :class:`NotFound` for an unknown problem, :class:`BadRequest`
        (``unknown_proposer``, ``invalid_plugin``, ``no_backend``, ...) and
        :class:`ServerError` ``searches_unavailable`` when kilnd cannot run plugins.
        """
        body = _wire.search_request(problem, proposer, wasm_bytes(wasm), config, budget, time_limit_s, llm_tokens, seed)
        return self.search(self._call(_wire.start_search(body)))

    def searches(self, state: Optional[str] = None) -> List[Search]:
        """Searches, newest first, optionally only those in ``state``."""
        return self._call(_wire.searches(state))

    def search(self, search_id: str) -> Search:
        """One search: state, progress, best candidate so far."""
        return self._call(_wire.search(search_id))

    def cancel_search(self, search_id: str) -> None:
        """Cancels a running search (:class:`Conflict` if it is not running)."""
        self._call(_wire.cancel_search(search_id))

    def search_log(self, search_id: str, after: int = 0, limit: int = 500) -> List[SearchLogLine]:
        """A search's log lines with ids above ``after`` (page with the last line's id)."""
        return self._call(_wire.search_log(search_id, after, limit))

    def search_archive(self, search_id: str) -> List[ArchiveEntry]:
        """Every candidate the search submitted, oldest first, with its evaluation."""
        return self._call(_wire.search_archive(search_id))

    def follow_search(
        self, search_id: str, *, timeout: Optional[float] = None, poll_interval: float = 2.0
    ) -> Iterator[Event]:
        """Yields the search's ``search`` (progress) and ``search_log`` events until it
        ends; the last event yielded is always a ``search`` event with its final state
        (read from the search itself if the stream missed it, or if it had ended
        already). Raises :class:`Timeout` if it is still running after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = _Follower.start(self._socket)  # subscribed before the state is read
        try:
            yield from self._run(
                _steps.Runner(_steps.follow_search(search_id, deadline, timeout, poll_interval, follower)), follower
            )
        finally:
            if follower is not None:
                follower.close()

    def submit_many(
        self,
        candidates: Iterable[CandidateLike],
        problem: Optional[str] = None,
        *,
        timeout: float = DEFAULT_WAIT_S,
        window: int = 64,
        poll_interval: float = 10.0,
    ) -> Iterator[Outcome]:
        """Submits many candidates and yields an :class:`Outcome` for each as it finishes.

        Pipelined: up to ``window`` candidates are in flight at once (submitted, not
        yet finished), sent together in one ``POST /v1/candidates/batch`` (one
        ``POST /v1/candidates`` each to a kilnd without that route); results are followed on the event stream, with a poll of the
        unfinished ones every ``poll_interval`` seconds (and long-polls if the stream
        is unavailable), so a missed event cannot hang the batch. Each candidate has
        ``timeout`` seconds from its submission to finish.

        Backpressure: a candidate kilnd refuses because its queue is full
        (:class:`~kiln.errors.QueueFull`, 429) is held and sent again after a growing
        wait (0.1 s doubling up to 5 s, with jitter), and no further input is read
        meanwhile: a full queue never makes the batch read ``candidates`` more than
        ``window`` ahead of what kilnd takes. Once the queue has been full for ``timeout`` seconds in a
        row, the refusal is the candidate's outcome.

        Outcomes come in completion order; ``Outcome.index`` is the input position.
        One candidate's failure (refused by kilnd, job failed, no verdict in time,
        backend not usable) is its outcome's ``error``, never an exception; only a
        daemon that cannot be reached raises. Leaving the loop early stops following;
        candidates already submitted are still evaluated by kilnd.
        """
        _steps.check_window(window)
        follower = _Follower.start(self._socket)
        try:
            procedure = _steps.submit_many(problem, timeout, window, poll_interval, follower)
            yield from self._run(_steps.Runner(procedure), follower, iter(enumerate(candidates)))
        finally:
            if follower is not None:
                follower.close()


class _Follower:
    """Reads the event stream on a thread and hands the events to the batch's thread."""

    def __init__(self, stream: _http.EventStream) -> None:
        self._stream = stream
        self._queue: "queue.Queue[Optional[Event]]" = queue.Queue()
        self.alive = True
        #: The stream reported missed events (set by the batch, see :func:`kiln._steps.drain`).
        self.lagged = False
        self._thread = threading.Thread(target=self._run, name="kiln-events", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, socket_path: str) -> Optional["_Follower"]:
        """Subscribes and waits for ``hello`` (so no later event can be missed); ``None``
        if the stream is not available (the batch then polls). A missing daemon raises."""
        try:
            stream = _http.EventStream(socket_path, FOLLOW_IDLE_S)
        except (ApiError, Timeout, TransportError):
            return None
        try:
            next(stream)
        except (StopIteration, KilnError):
            stream.close()
            return None
        return cls(stream)

    def _run(self) -> None:
        try:
            for ev in self._stream:
                self._queue.put(ev)
        except KilnError:
            pass
        finally:
            self._queue.put(None)

    def next_event(self, wait: float) -> Optional[Event]:
        """The next event, waiting up to ``wait`` seconds; ``None`` if none came or the
        stream ended (then :attr:`alive` is False)."""
        try:
            ev = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        if ev is None:
            self.alive = False
        return ev

    def idle(self) -> bool:
        """True if no event waits to be read."""
        return self._queue.empty()

    def close(self) -> None:
        self._stream.close()
        self._thread.join(timeout=5)
