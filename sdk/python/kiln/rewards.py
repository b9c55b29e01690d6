"""Batch rewards for RL loops: many candidate sources in, one flat, reward-ready record
per candidate out, in input order, without exceptions per candidate.

::

    records = kiln.rewards(client, "vecadd-4096", sources)
    scores = [r.reward for r in records]       # speedup (else 1.0) when ok, else 0.0

    # KernelBench ModelNew files, run as written in kiln's hosted runner, by KernelBench id:
    records = kiln.rewards(client, "level1/19", model_new_texts, language="modelnew")
    print(records[0].verdict, records[0].speedup_eager, records[0].speedup_compile, records[0].trust)
    # trust "lifted" where kilnd lifted the file's GPU work into a contract candidate:
    print(records[0].lift, records[0].median_us, records[0].hosted_median_us)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, Union

from ._steps import Runner
from .aio import AsyncClient
from .candidate import HOSTED_LANGUAGES
from .client import DEFAULT_WAIT_S, Client
from .errors import ApiError, BackendUnavailable, JobFailed, QueueFull, Timeout
from .kernelbench import KernelBenchProblem, problem_id
from .models import (
    TORCH_COMPILE,
    TORCH_EAGER,
    BaselineSet,
    same_harness,
    CandidateRecord,
    Evaluation,
    Outcome,
    Problem,
    ProblemSummary,
    pick_baseline_set,
    torch_variant,
)

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
#: No verdict: the time ran out, the backend is not usable on this kilnd, or kilnd's
#: queue stayed full (429) for the whole timeout.
NO_VERDICT = "no_verdict"

Source = Union[str, Mapping[str, Any]]
#: A problem: a kiln problem name, or a KernelBench id (``"level1/19"``,
#: :class:`~kiln.KernelBenchProblem`) naming the problem imported from it.
ProblemLike = Union[str, KernelBenchProblem]


@dataclass(frozen=True)
class Reward:
    """One candidate's reward-ready record.

    Attributes:
        index: position in the input.
        id: the candidate's id, once kilnd accepted it.
        verdict: one of kiln's verdicts (``ok``, ``wrong_answer``, ``compile_error``,
            ``no_own_kernels``, ...) or, when there is none, :data:`CLIENT_ERROR`,
            :data:`SERVER_ERROR`, :data:`JOB_FAILED` or :data:`NO_VERDICT`.
        ok: True if and only if the verdict is ``ok``.
        speedup: for ``ok`` candidates: over ``baseline`` when one is named (kilnd's
            reported speedup, else computed from the problem's cached baselines), else
            ``baseline_us / median_us`` when a baseline time was given, else
            :attr:`speedup_eager`, else kilnd's only reported speedup; otherwise ``None``.
        median_us: the median time, for correct candidates.
        message: why, in one line (kilnd's message, or the error): for a verdict other
            than ``ok``, the reason.
        reward: the scalar for an RL loop: ``speedup`` (``1.0`` when unknown) for an
            ``ok`` candidate, ``0.0`` for everything else (a wrong, failing or refused
            candidate, one without a verdict, and ``no_own_kernels``: correct only by
            calling the library the reference calls, which must earn nothing).
        speedup_eager: torch eager's median / this median, for an ``ok`` candidate timed
            on the cuda backend when the problem's ``torch-eager`` baseline is measured
            on that GPU model (its ``fp32`` variant, else the one measured); otherwise
            ``None``.
        speedup_compile: the same against ``torch.compile`` (``torch-compile``). For a
            ``hosted`` candidate both are against the hosted baselines
            (``torch-eager-hosted``, ``torch-compile-hosted``: the problem's own module
            timed through the same hosted path), so the ratio holds no cost of kiln's that
            the other side lacks.
        speedup_eager_in_process, speedup_compile_in_process: for a ``hosted`` candidate,
            the same against the baselines timed in process (another harness: beside, for
            comparison, never the reward); ``None`` otherwise.
        trust: how the result was obtained: ``contract``, ``hosted`` (a ``ModelNew``
            file's own Python, in kiln's jailed runner) or ``lifted`` (the GPU work of a
            ``ModelNew`` file's forward, lifted by kilnd into a contract candidate that
            kiln compiled, launched and timed itself); ``None`` without an evaluation.
        problem: the kiln problem it was evaluated for (a KernelBench id resolved).
        hosted_median_us: when the record came from a lifted result (``trust``
            ``lifted``), the file's own hosted median time beside it; otherwise ``None``.
        lift: for a hosted ``ModelNew`` file kilnd tried to lift: ``"lifted"``, or why it
            was not (the lift's code: ``memset``, ``side_stream``, ...); ``None`` when
            nothing was tried. Where a file was lifted, its lifted result is its record
            (verdict, time, speedups, reward: the most trustworthy numbers); where the
            lifted candidate's job failed, or had no verdict within ``timeout``, the
            file's hosted result stands (``lift`` ``"lifted"``, ``trust`` ``hosted``,
            the message saying so).
    """

    index: int
    id: Optional[str]
    verdict: str
    ok: bool
    speedup: Optional[float]
    median_us: Optional[float]
    message: str
    reward: float = 0.0
    speedup_eager: Optional[float] = None
    speedup_compile: Optional[float] = None
    trust: Optional[str] = None
    speedup_eager_in_process: Optional[float] = None
    speedup_compile_in_process: Optional[float] = None
    problem: Optional[str] = None
    hosted_median_us: Optional[float] = None
    lift: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        """The record as a plain dict (for JSON logs)."""
        return asdict(self)


def _failure(index: int, cid: Optional[str], verdict: str, message: str, problem: Optional[str] = None) -> Reward:
    return Reward(index, cid, verdict, False, None, None, message, problem=problem)


def _per_source(problem: Union[ProblemLike, Sequence[ProblemLike]], n: int) -> List[ProblemLike]:
    """The problem of each source: the one given, or one per source."""
    if isinstance(problem, (str, KernelBenchProblem)):
        return [problem_id(problem)] * n
    if isinstance(problem, Sequence):
        if len(problem) != n:
            raise ValueError(f"{len(problem)} problems for {n} sources: give one problem, or one per source")
        return [problem_id(p) for p in problem]
    raise TypeError(
        "problem is a kiln problem name, a KernelBench id (`level1/19`, kiln.KernelBenchProblem), "
        f"or a list of them, one per source; not {type(problem).__name__}"
    )


def _names(ids: Sequence[ProblemLike], listing: Sequence[ProblemSummary]) -> List[str]:
    """Each source's kiln problem name, KernelBench ids resolved (each once)."""
    found = {kb: kb.find(listing) for kb in dict.fromkeys(p for p in ids if isinstance(p, KernelBenchProblem))}
    return [found[p] if isinstance(p, KernelBenchProblem) else p for p in ids]


def _default_launches(problem: Problem, language: str) -> Optional[List[Any]]:
    if language in HOSTED_LANGUAGES:
        return None
    seed = problem.seed("cuda" if language == "cuda" else "host")
    launches = seed.get("launches") if seed else None
    return launches if isinstance(launches, list) else None


def _prepare(
    names: Sequence[str],
    sources: Sequence[Any],
    language: str,
    plans: Mapping[str, Optional[Sequence[Any]]],
) -> Tuple[List[Tuple[int, Dict[str, Any]]], List[Reward]]:
    """Turns the inputs into candidates (source ``i`` for problem ``names[i]``, launched
    with ``plans[names[i]]`` when it needs a plan); the ones that cannot be are records
    already."""
    good: List[Tuple[int, Dict[str, Any]]] = []
    bad: List[Reward] = []
    for i, s in enumerate(sources):
        problem = names[i]
        if isinstance(s, str):
            cand: Dict[str, Any] = {"source": s}
        elif isinstance(s, Mapping):
            cand = dict(s)
        else:
            bad.append(_failure(i, None, CLIENT_ERROR, f"a {type(s).__name__} is neither a source string nor a candidate dict", problem))
            continue
        if cand.setdefault("problem", problem) != problem:
            bad.append(_failure(i, None, CLIENT_ERROR, f"the candidate names problem {cand['problem']!r}, not {problem!r}", problem))
            continue
        if not isinstance(cand.get("source"), str):
            bad.append(_failure(i, None, CLIENT_ERROR, "the candidate has no `source` string", problem))
            continue
        cand.setdefault("language", language)
        if "launches" not in cand and cand["language"] not in HOSTED_LANGUAGES:
            launches = plans.get(problem)
            if launches is None:
                bad.append(
                    _failure(
                        i, None, CLIENT_ERROR,
                        f"no launch plan: problem {problem!r} has no seed kernel for the "
                        f"{language!r} language to take one from; pass launches=",
                        problem,
                    )
                )
                continue
            cand["launches"] = list(launches)
        good.append((i, cand))
    return good, bad


def _lift_fields(record: Optional[CandidateRecord], ev: Evaluation) -> Tuple[Optional[str], Optional[float], str]:
    """A record's ``lift`` (``"lifted"`` or the not-lifted code), the file's hosted median
    when ``ev`` is the lifted result, and the message (saying so when a lifted
    candidate's result did not come and the hosted one stands)."""
    lift = record.lift if record is not None else None
    if lift is None:
        return None, None, ev.message
    if not lift.lifted:
        return lift.code or lift.outcome, None, ev.message
    if record is not None and record.hosted_evaluation is not None:
        hosted_us = lift.hosted_median_us
        if hosted_us is None:
            hosted_us = record.hosted_evaluation.median_us
        return "lifted", hosted_us, ev.message
    if lift.failed:
        note = f"lifted candidate {lift.candidate_id}: its job failed; hosted result"
    elif lift.pending:
        job = f"job {lift.state}" if lift.state else "job not queued yet"
        note = f"lifted candidate {lift.candidate_id}: no verdict in time ({job} when last read); hosted result"
    else:
        note = f"lifted candidate {lift.candidate_id}: no evaluation to read; hosted result"
    return "lifted", None, f"{ev.message} ({note})" if ev.message else note


class _Batch:
    """What one call knows about its problems (each fetched once): names per source,
    launch plans, baselines; and how an outcome becomes a :class:`Reward`."""

    def __init__(
        self,
        names: List[str],
        problems: Mapping[str, Problem],
        measured: Mapping[str, BaselineSet],
        language: str,
        launches: Optional[Sequence[Any]],
        baseline: Optional[str],
        baseline_us: Optional[float],
    ) -> None:
        self.names = names
        self.problems = problems
        self.measured = measured
        self.language = language
        self.plans = {n: launches if launches is not None else _default_launches(p, language) for n, p in problems.items()}
        self.baseline = baseline
        self.baseline_us = baseline_us

    def prepare(self, sources: Sequence[Any]) -> Tuple[List[Tuple[int, Dict[str, Any]]], List[Reward]]:
        return _prepare(self.names, sources, self.language, self.plans)

    def _baseline_us(self, problem: str, ev: Evaluation, name: Optional[str], kind: Optional[str]) -> Optional[float]:
        """A baseline's median on the GPU model that timed ``ev`` (cuda only): the
        baseline ``name``, or the chosen variant of the torch ``kind``."""
        if ev.backend != "cuda":
            return None
        sets = [self.measured[problem]] if problem in self.measured else []
        sets += self.problems[problem].baselines
        chosen = pick_baseline_set(sets, ev.gpu_model)
        if chosen is None:
            return None
        return chosen.median_us(name) if name is not None else chosen.torch_us(kind or "")

    def _over(self, problem: str, ev: Evaluation, name: Optional[str] = None, kind: Optional[str] = None) -> Optional[float]:
        """The speedup of an ``ok`` ``ev`` over baseline ``name`` (or the torch ``kind``):
        kilnd's reported one, else computed from the problem's cached baselines."""
        median = ev.median_us
        if not ev.ok or not median or median <= 0:
            return None
        if ev.speedups:
            reported = name if name is not None else torch_variant(ev.speedups, kind or "")
            if reported is not None and reported in ev.speedups:
                return ev.speedups[reported]
        us = self._baseline_us(problem, ev, name, kind)
        return us / median if us else None

    def reward(self, index: int, outcome: Outcome) -> Reward:
        problem = self.names[index]
        ev, err, cid = outcome.evaluation, outcome.error, outcome.candidate_id
        if ev is not None:
            eager = self._over(problem, ev, kind=same_harness(TORCH_EAGER, ev.trust))
            compiled = self._over(problem, ev, kind=same_harness(TORCH_COMPILE, ev.trust))
            hosted = ev.trust == "hosted"
            eager_ip = self._over(problem, ev, kind=TORCH_EAGER) if hosted else None
            compiled_ip = self._over(problem, ev, kind=TORCH_COMPILE) if hosted else None
            speedup = self._speedup(problem, ev, eager)
            score = (speedup if speedup is not None else 1.0) if ev.ok else 0.0
            lift, hosted_us, message = _lift_fields(outcome.record, ev)
            return Reward(index, cid, ev.verdict, ev.ok, speedup, ev.median_us, message,
                          reward=score, speedup_eager=eager, speedup_compile=compiled, trust=ev.trust,
                          problem=problem, hosted_median_us=hosted_us, lift=lift,
                          speedup_eager_in_process=eager_ip, speedup_compile_in_process=compiled_ip)
        if isinstance(err, QueueFull):
            return _failure(index, cid, NO_VERDICT, f"kilnd's queue stayed full: {err.message}", problem)
        if isinstance(err, ApiError):
            verdict = SERVER_ERROR if err.status >= 500 else CLIENT_ERROR
            return _failure(index, cid, verdict, f"{err.code}: {err.message}", problem)
        if isinstance(err, JobFailed):
            return _failure(index, cid, JOB_FAILED, str(err), problem)
        if isinstance(err, (Timeout, BackendUnavailable)):
            return _failure(index, cid, NO_VERDICT, str(err), problem)
        return _failure(index, cid, CLIENT_ERROR, str(err), problem)

    def _speedup(self, problem: str, ev: Evaluation, eager: Optional[float]) -> Optional[float]:
        if not ev.ok:
            return None
        if self.baseline is not None:
            named = self._over(problem, ev, name=self.baseline)
            if named is not None:
                return named
        if self.baseline_us is not None and ev.median_us:
            return self.baseline_us / ev.median_us
        if self.baseline is None:
            return eager if eager is not None else ev.speedup()
        return None


#: What :func:`_plan` asks of the client: a method's name and its arguments.
_Ask = Tuple[str, Tuple[Any, ...]]


def _plan(
    problem: Union[ProblemLike, Sequence[ProblemLike]],
    sources: Sequence[Source],
    language: str,
    launches: Optional[Sequence[Any]],
    baseline: Optional[str],
    baseline_us: Optional[float],
    measure_baselines: bool,
) -> Generator[_Ask, Any, "_Results"]:
    """What :func:`rewards` and :func:`arewards` do before submitting, written once: it
    yields the client calls it needs (each sent back the answer, or thrown the error it
    raised) and returns the batch's :class:`_Results`."""
    ids = _per_source(problem, len(sources))
    listing = (yield "problems", ()) if any(isinstance(p, KernelBenchProblem) for p in ids) else []
    names = _names(ids, listing)
    problems: Dict[str, Problem] = {}
    for n in dict.fromkeys(names):
        problems[n] = yield "problem", (n,)
    measured: Dict[str, BaselineSet] = {}
    if measure_baselines:
        for n in problems:
            try:
                measured[n] = yield "baselines", (n,)
            except (ApiError, Timeout):
                pass
    batch = _Batch(names, problems, measured, language, launches, baseline, baseline_us)
    return _Results(batch, *batch.prepare(sources), len(sources))


class _Results:
    """The rewards of one call as the outcomes come: those refused before sending at
    once, the others from their outcomes."""

    def __init__(self, batch: _Batch, good: List[Tuple[int, Dict[str, Any]]], bad: List[Reward], n: int) -> None:
        self.batch = batch
        self.candidates = [c for _, c in good]
        self._origin = [i for i, _ in good]
        self._out: Dict[int, Reward] = {r.index: r for r in bad}
        self._n = n

    def add(self, o: Outcome) -> None:
        i = self._origin[o.index]
        self._out[i] = self.batch.reward(i, o)

    def rewards(self) -> List[Reward]:
        return [self._out[i] for i in range(self._n)]


def rewards(
    client: Client,
    problem: Union[ProblemLike, Sequence[ProblemLike]],
    sources: Sequence[Source],
    *,
    language: str = "c",
    launches: Optional[Sequence[Any]] = None,
    timeout: float = DEFAULT_WAIT_S,
    window: int = 64,
    baseline: Optional[str] = None,
    baseline_us: Optional[float] = None,
    measure_baselines: bool = False,
) -> List[Reward]:
    """Evaluates candidates and returns one :class:`Reward` per input, in input order.

    Args:
        client: the client to use.
        problem: the problem of every source, or a list with one per source. Each is a
            registered kiln problem's name, or a KernelBench id: ``"level1/19"`` (also
            ``"level1/19_ReLU.py"``, ``"level_1_problem_19"``) or
            ``kiln.KernelBenchProblem(level=1, id=19)``, naming the problem imported from
            it (``kb-l1-19-relu``; see :meth:`KernelBenchProblem.find`). Each problem is
            fetched once per call (plans, baselines); one that is not registered raises
            :class:`NotFound`, since none of its candidates could be evaluated.
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
        window: candidates in flight at once (a full queue is waited out, see
            :meth:`Client.submit_many`).
        baseline: the baseline whose speedup to report as ``speedup`` (``reference``,
            ``torch-compile-fp32``, ...), among kilnd's reported or cached ones.
        baseline_us: a baseline time in µs, for a speedup computed here
            (``baseline_us / median_us``) when ``baseline`` gives none.
        measure_baselines: fetch each problem's baselines with
            :meth:`Client.baselines`, which measures them when they are not cached
            (minutes on first use, holding a GPU lane); by default only baselines
            already measured count. A problem whose baselines cannot be measured here
            (no cuda backend) simply has no speedups.

    Only a batch-level failure raises (daemon not running, problem not registered, a
    KernelBench id that names no registered problem or several); a single candidate's
    failure is its record's verdict (:data:`CLIENT_ERROR`, ...).
    """
    plan = Runner(_plan(problem, sources, language, launches, baseline, baseline_us, measure_baselines))
    ask = plan.resume()
    while ask is not None:
        try:
            answer = getattr(client, ask[0])(*ask[1])
        except Exception as e:  # noqa: BLE001 - raised inside the plan
            ask = plan.resume(error=e)
        else:
            ask = plan.resume(answer)
    results: _Results = plan.value
    for o in client.submit_many(results.candidates, timeout=timeout, window=window):
        results.add(o)
    return results.rewards()


async def arewards(
    client: AsyncClient,
    problem: Union[ProblemLike, Sequence[ProblemLike]],
    sources: Sequence[Source],
    *,
    language: str = "c",
    launches: Optional[Sequence[Any]] = None,
    timeout: float = DEFAULT_WAIT_S,
    window: int = 64,
    baseline: Optional[str] = None,
    baseline_us: Optional[float] = None,
    measure_baselines: bool = False,
) -> List[Reward]:
    """:func:`rewards` for an :class:`~kiln.AsyncClient`."""
    plan = Runner(_plan(problem, sources, language, launches, baseline, baseline_us, measure_baselines))
    ask = plan.resume()
    while ask is not None:
        try:
            answer = await getattr(client, ask[0])(*ask[1])
        except Exception as e:  # noqa: BLE001 - raised inside the plan
            ask = plan.resume(error=e)
        else:
            ask = plan.resume(answer)
    results: _Results = plan.value
    async for o in client.submit_many(results.candidates, timeout=timeout, window=window):
        results.add(o)
    return results.rewards()
