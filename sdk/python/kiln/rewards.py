"""Batch rewards for RL loops: many candidate sources for one problem in, one flat,
reward-ready record per candidate out, in input order, without exceptions per candidate.

::

    records = kiln.rewards(client, "vecadd-4096", sources)
    scores = [(r.speedup or 1.0) if r.ok else 0.0 for r in records]

    # KernelBench ModelNew files, run as written in kiln's hosted runner:
    records = kiln.rewards(client, "kb-l1-19-relu", model_new_texts, language="modelnew")
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .aio import AsyncClient
from .candidate import HOSTED_LANGUAGES
from .client import DEFAULT_WAIT_S, Client
from .errors import ApiError, BackendUnavailable, JobFailed, Timeout
from .models import Evaluation, Outcome, Problem

__all__ = [
    "Reward",
    "rewards",
    "arewards",
    "CLIENT_ERROR",
    "SERVER_ERROR",
    "JOB_FAILED",
    "NO_VERDICT",
]

#: The candidate was not accepted: not a source or candidate dict, or refused by kilnd
#: (a 4xx: invalid field, unknown kernel name in the plan, too long, ...).
CLIENT_ERROR = "client_error"
#: kilnd failed answering for this candidate (a 5xx).
SERVER_ERROR = "server_error"
#: kilnd accepted the candidate but could not evaluate it (infrastructure failure).
JOB_FAILED = "job_failed"
#: No verdict: the time ran out, or the backend is not usable on this kilnd.
NO_VERDICT = "no_verdict"

Source = Union[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Reward:
    """One candidate's reward-ready record.

    Attributes:
        index: position in the input.
        id: the candidate's id, once kilnd accepted it.
        verdict: one of kiln's verdicts (``ok``, ``wrong_answer``, ``compile_error``, ...)
            or, when there is none, :data:`CLIENT_ERROR`, :data:`SERVER_ERROR`,
            :data:`JOB_FAILED` or :data:`NO_VERDICT`.
        ok: True if and only if the verdict is ``ok``.
        speedup: for ``ok`` candidates: kilnd's reported speedup over ``baseline`` when
            it reports speedups, else ``baseline_us / median_us`` when a baseline time
            was given; otherwise ``None``.
        median_us: the median time, for ``ok`` candidates.
        message: why, in one line (kilnd's message, or the error).
    """

    index: int
    id: Optional[str]
    verdict: str
    ok: bool
    speedup: Optional[float]
    median_us: Optional[float]
    message: str

    def as_dict(self) -> Dict[str, Any]:
        """The record as a plain dict (for JSON logs)."""
        return asdict(self)


def _failure(index: int, cid: Optional[str], verdict: str, message: str) -> Reward:
    return Reward(index, cid, verdict, False, None, None, message)


def _speedup(ev: Evaluation, baseline: Optional[str], baseline_us: Optional[float]) -> Optional[float]:
    if not ev.ok:
        return None
    reported = ev.speedup(baseline)
    if reported is not None:
        return reported
    if baseline_us is not None and ev.median_us:
        return baseline_us / ev.median_us
    return None


def _reward(
    index: int, outcome: Outcome, baseline: Optional[str], baseline_us: Optional[float]
) -> Reward:
    ev, err, cid = outcome.evaluation, outcome.error, outcome.candidate_id
    if ev is not None:
        return Reward(index, cid, ev.verdict, ev.ok, _speedup(ev, baseline, baseline_us), ev.median_us, ev.message)
    if isinstance(err, ApiError):
        verdict = SERVER_ERROR if err.status >= 500 else CLIENT_ERROR
        return _failure(index, cid, verdict, f"{err.code}: {err.message}")
    if isinstance(err, JobFailed):
        return _failure(index, cid, JOB_FAILED, str(err))
    if isinstance(err, (Timeout, BackendUnavailable)):
        return _failure(index, cid, NO_VERDICT, str(err))
    return _failure(index, cid, CLIENT_ERROR, str(err))


def _needs_plan(sources: Sequence[Any], language: str) -> bool:
    """Whether some input is a source launched from a plan (a hosted ``ModelNew`` file
    has none: its ``forward`` is the plan)."""

    def needs(s: Any) -> bool:
        if isinstance(s, str):
            return language not in HOSTED_LANGUAGES
        if isinstance(s, Mapping) and "launches" not in s:
            return s.get("language", language) not in HOSTED_LANGUAGES
        return False

    return any(needs(s) for s in sources)


def _default_launches(problem: Problem, language: str) -> Optional[List[Any]]:
    if language in HOSTED_LANGUAGES:
        return None
    seed = problem.seed("cuda" if language == "cuda" else "host")
    launches = seed.get("launches") if seed else None
    return launches if isinstance(launches, list) else None


def _prepare(
    problem: str,
    sources: Sequence[Any],
    language: str,
    launches: Optional[Sequence[Any]],
) -> Tuple[List[Tuple[int, Dict[str, Any]]], List[Reward]]:
    """Turns the inputs into candidates; the ones that cannot be are records already."""
    good: List[Tuple[int, Dict[str, Any]]] = []
    bad: List[Reward] = []
    for i, s in enumerate(sources):
        if isinstance(s, str):
            cand: Dict[str, Any] = {"source": s}
        elif isinstance(s, Mapping):
            cand = dict(s)
        else:
            bad.append(_failure(i, None, CLIENT_ERROR, f"a {type(s).__name__} is neither a source string nor a candidate dict"))
            continue
        if cand.setdefault("problem", problem) != problem:
            bad.append(_failure(i, None, CLIENT_ERROR, f"the candidate names problem {cand['problem']!r}, not {problem!r}"))
            continue
        if not isinstance(cand.get("source"), str):
            bad.append(_failure(i, None, CLIENT_ERROR, "the candidate has no `source` string"))
            continue
        cand.setdefault("language", language)
        if "launches" not in cand and cand["language"] not in HOSTED_LANGUAGES:
            if launches is None:
                bad.append(
                    _failure(
                        i, None, CLIENT_ERROR,
                        f"no launch plan: problem {problem!r} has no seed kernel for the "
                        f"{language!r} language to take one from; pass launches=",
                    )
                )
                continue
            cand["launches"] = list(launches)
        good.append((i, cand))
    return good, bad


def rewards(
    client: Client,
    problem: str,
    sources: Sequence[Source],
    *,
    language: str = "c",
    launches: Optional[Sequence[Any]] = None,
    timeout: float = DEFAULT_WAIT_S,
    window: int = 64,
    baseline: Optional[str] = None,
    baseline_us: Optional[float] = None,
) -> List[Reward]:
    """Evaluates candidates for one problem and returns one :class:`Reward` per input,
    in input order.

    Args:
        client: the client to use.
        problem: the problem's name (it must be registered: a :class:`NotFound` is raised
            otherwise, since no candidate could be evaluated).
        sources: each a source string (launched with ``launches``, by default the
            problem's seed kernel's launch plan, so the source must define the seed's
            kernel names with the same arguments; for a hosted language, the text of a
            KernelBench ``ModelNew`` file, which needs no plan) or a candidate dict
            (missing ``problem``, ``language`` and ``launches`` are filled in; see
            :func:`kiln.modelnew`).
        language: ``"c"`` (host backend), ``"cuda"``, or a hosted language:
            ``"modelnew"`` (a ``ModelNew`` file on the GPU) or ``"modelnew-cpu"`` (on the
            CPU); the problem then needs a torch reference.
        launches: the launch plan for source strings.
        timeout: seconds each candidate may take from submission to verdict.
        window: candidates in flight at once.
        baseline: the baseline whose speedup to report, among those kilnd reports.
        baseline_us: a baseline time in µs, for a speedup computed here
            (``baseline_us / median_us``) when kilnd reports none.

    Only a batch-level failure raises (daemon not running, problem not registered); a
    single candidate's failure is its record's verdict (:data:`CLIENT_ERROR`, ...).
    """
    plan = launches
    if plan is None and _needs_plan(sources, language):
        plan = _default_launches(client.problem(problem), language)
    good, bad = _prepare(problem, sources, language, plan)
    out: Dict[int, Reward] = {r.index: r for r in bad}
    origin = [i for i, _ in good]
    for o in client.submit_many([c for _, c in good], timeout=timeout, window=window):
        out[origin[o.index]] = _reward(origin[o.index], o, baseline, baseline_us)
    return [out[i] for i in range(len(sources))]


async def arewards(
    client: AsyncClient,
    problem: str,
    sources: Sequence[Source],
    *,
    language: str = "c",
    launches: Optional[Sequence[Any]] = None,
    timeout: float = DEFAULT_WAIT_S,
    window: int = 64,
    baseline: Optional[str] = None,
    baseline_us: Optional[float] = None,
) -> List[Reward]:
    """:func:`rewards` for an :class:`~kiln.AsyncClient`."""
    plan = launches
    if plan is None and _needs_plan(sources, language):
        plan = _default_launches(await client.problem(problem), language)
    good, bad = _prepare(problem, sources, language, plan)
    out: Dict[int, Reward] = {r.index: r for r in bad}
    origin = [i for i, _ in good]
    async for o in client.submit_many([c for _, c in good], timeout=timeout, window=window):
        out[origin[o.index]] = _reward(origin[o.index], o, baseline, baseline_us)
    return [out[i] for i in range(len(sources))]
