"""Typed views of kilnd's JSON answers.

Every class is a frozen dataclass built with ``from_dict``, which tolerates missing and
extra fields: a field kilnd does not send (yet) is ``None`` or empty, and one this
client does not know is kept in ``raw`` (the dictionary as received), so newer daemons
never break older clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = [
    "VERDICTS",
    "JOB_STATES",
    "WAITING_JOB_STATES",
    "Health",
    "Backend",
    "Gpu",
    "Devices",
    "Info",
    "ProblemSummary",
    "Problem",
    "ProblemAdded",
    "BaselineResult",
    "BaselineSet",
    "TimingStats",
    "ErrorMetrics",
    "Unwritten",
    "Evidence",
    "CompileInfo",
    "Evaluation",
    "Job",
    "LIFT_OUTCOMES",
    "Lift",
    "CandidateRecord",
    "CandidateSummary",
    "Submission",
    "Event",
    "Outcome",
    "SEARCH_STATES",
    "Search",
    "SearchLogLine",
    "ArchiveEntry",
]

#: The verdicts of the evaluation contract, as sent on the wire.
VERDICTS: Tuple[str, ...] = (
    "compile_error",
    "invalid_launch",
    "runtime_fault",
    "timeout",
    "wrong_answer",
    "incomplete_output",
    "input_tampered",
    "nondeterministic",
    "implausible_time",
    "unmeasurable_time",
    "no_own_kernels",
    "ok",
)

#: Job states: ``queued`` → ``compiling`` → ``compiled`` (waiting for a lane) →
#: ``running`` (evaluating on a lane; only this counts an attempt) → ``done`` | ``failed``.
JOB_STATES: Tuple[str, ...] = ("queued", "compiling", "compiled", "running", "done", "failed")

#: Job states before the evaluation starts on a lane (what ``Health.queued`` counts).
WAITING_JOB_STATES: Tuple[str, ...] = ("queued", "compiling", "compiled")

#: What kilnd's attempt to lift a hosted ``ModelNew`` file into a contract candidate came
#: to (the ``outcome`` of a record's ``lift``).
LIFT_OUTCOMES: Tuple[str, ...] = ("lifted", "not_lifted")

#: Search states: ``running`` → ``done`` | ``failed`` | ``cancelled``.
SEARCH_STATES: Tuple[str, ...] = ("running", "done", "failed", "cancelled")

Json = Dict[str, Any]


def _obj(v: Any) -> Json:
    return v if isinstance(v, dict) else {}


def _str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def _float(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


def _list(v: Any) -> List[Any]:
    return v if isinstance(v, list) else []


@dataclass(frozen=True)
class Health:
    """``GET /v1/health``: kilnd is up and its store answers. ``queued`` counts every job
    not yet evaluating (queued, compiling, or compiled and waiting for a lane), ``running``
    those evaluating on a lane."""

    status: str
    version: str
    uptime_s: Optional[int]
    queued: Optional[int]
    running: Optional[int]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Health":
        return cls(
            status=_str(d.get("status")) or "",
            version=_str(d.get("version")) or "",
            uptime_s=_int(d.get("uptime_s")),
            queued=_int(d.get("queued")),
            running=_int(d.get("running")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Backend:
    """One evaluation backend (``host``, ``cuda``) and whether jobs for it will run."""

    name: str
    usable: bool
    detail: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Backend":
        return cls(
            name=_str(d.get("name")) or "",
            usable=d.get("usable") is True,
            detail=_str(d.get("detail")) or "",
        )


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML sees it."""

    index: Optional[int]
    name: str
    uuid: Optional[str]
    pci_bus_id: Optional[str]
    memory_total_bytes: Optional[int]
    compute_capability: Optional[str]
    sm_clock_mhz: Optional[int]
    sm_clock_max_mhz: Optional[int]
    mem_clock_mhz: Optional[int]
    mem_clock_max_mhz: Optional[int]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Gpu":
        return cls(
            index=_int(d.get("index")),
            name=_str(d.get("name")) or "",
            uuid=_str(d.get("uuid")),
            pci_bus_id=_str(d.get("pci_bus_id")),
            memory_total_bytes=_int(d.get("memory_total_bytes")),
            compute_capability=_str(d.get("compute_capability")),
            sm_clock_mhz=_int(d.get("sm_clock_mhz")),
            sm_clock_max_mhz=_int(d.get("sm_clock_max_mhz")),
            mem_clock_mhz=_int(d.get("mem_clock_mhz")),
            mem_clock_max_mhz=_int(d.get("mem_clock_max_mhz")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Devices:
    """The GPUs kilnd sees (what ``kiln devices`` prints)."""

    gpus: List[Gpu]
    error: Optional[str]
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]


@dataclass(frozen=True)
class Info:
    """``GET /v1/info``: version, backends, GPUs, jail layers, host CPU and memory."""

    version: str
    api: Optional[str]
    backends: List[Backend]
    gpus: List[Gpu]
    gpu_error: Optional[str]
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]
    clock_policy: Optional[str]
    jail: Json
    host: Json
    socket: Optional[str]
    state_dir: Optional[str]
    uptime_s: Optional[int]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Info":
        return cls(
            version=_str(d.get("version")) or "",
            api=_str(d.get("api")),
            backends=[Backend.from_dict(_obj(b)) for b in _list(d.get("backends"))],
            gpus=[Gpu.from_dict(_obj(g)) for g in _list(d.get("gpus"))],
            gpu_error=_str(d.get("gpu_error")),
            driver_version=_str(d.get("driver_version")),
            cuda_driver_version=_str(d.get("cuda_driver_version")),
            clock_policy=_str(d.get("clock_policy")),
            jail=_obj(d.get("jail")),
            host=_obj(d.get("host")),
            socket=_str(d.get("socket")),
            state_dir=_str(d.get("state_dir")),
            uptime_s=_int(d.get("uptime_s")),
            raw=dict(d),
        )

    def backend(self, name: str) -> Optional[Backend]:
        """The backend called ``name`` (``host``, ``cuda``), or ``None`` if kilnd has none."""
        return next((b for b in self.backends if b.name == name), None)

    @property
    def devices(self) -> Devices:
        """The GPU part of the answer."""
        return Devices(self.gpus, self.gpu_error, self.driver_version, self.cuda_driver_version)


@dataclass(frozen=True)
class ProblemSummary:
    """One entry of ``GET /v1/problems``."""

    name: str
    summary: str
    backends: List[str]
    created_at: Optional[int]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProblemSummary":
        return cls(
            name=_str(d.get("name")) or "",
            summary=_str(d.get("summary")) or "",
            backends=[b for b in _list(d.get("backends")) if isinstance(b, str)],
            created_at=_int(d.get("created_at")),
        )


@dataclass(frozen=True)
class Problem:
    """``GET /v1/problems/{name}``: the registered spec (sources inlined) and derived figures.

    ``spec`` is the problem as registered, in the same shape as ``problem.toml``
    (``tensor``, ``tolerance``, ``reference``, ``seed``, ...); ``derived`` holds
    ``input_bytes``, ``output_bytes``, ``min_bytes``, ``flops`` and ``backends``.
    """

    name: str
    summary: str
    backends: List[str]
    spec: Json
    derived: Json
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Problem":
        spec = _obj(d.get("spec"))
        derived = _obj(d.get("derived"))
        backends = [b for b in _list(derived.get("backends")) if isinstance(b, str)]
        if not backends:
            backends = sorted(_obj(spec.get("reference")))
        return cls(
            name=_str(spec.get("name")) or "",
            summary=_str(spec.get("summary")) or "",
            backends=backends,
            spec=spec,
            derived=derived,
            raw=dict(d),
        )

    @property
    def baselines(self) -> List["BaselineSet"]:
        """The baseline sets measured for the current spec, one per GPU model and driver,
        newest first (cached by kilnd; reading a problem never measures them)."""
        return [BaselineSet.from_dict(b) for b in _list(self.raw.get("baselines")) if isinstance(b, dict)]

    def baseline_set(self, gpu_model: Optional[str] = None) -> Optional["BaselineSet"]:
        """The newest baseline set measured on ``gpu_model`` (a GPU's name, as in
        ``telemetry.device.name``); without one, the newest set when every set is of one
        model. ``None`` when there is no such set: times on different GPU models are
        never compared."""
        return pick_baseline_set(self.baselines, gpu_model)

    def seed(self, backend: str = "host") -> Optional[Json]:
        """The seed kernel for ``backend`` (``file``, ``source``, ``launches``, ...), if any."""
        s = _obj(self.spec.get("seed")).get(backend)
        return s if isinstance(s, dict) else None

    def seed_candidate(self, backend: str = "host") -> Optional[Json]:
        """The seed kernel for ``backend`` as a submittable candidate, or ``None``."""
        s = self.seed(backend)
        if s is None:
            return None
        return {
            "problem": self.name,
            "language": "cuda" if backend == "cuda" else "c",
            "source": s.get("source", ""),
            "launches": s.get("launches", []),
            "scratch": s.get("scratch", []),
            "flags": s.get("flags", []),
            "note": "seed kernel",
        }


@dataclass(frozen=True)
class ProblemAdded:
    """The answer to registering a problem: ``created`` is False when it was already
    registered with the same spec."""

    name: str
    created: bool


@dataclass(frozen=True)
class TimingStats:
    """Timing statistics of the timed samples, in microseconds."""

    median_us: float
    mean_us: Optional[float]
    stdev_us: Optional[float]
    min_us: Optional[float]
    max_us: Optional[float]
    n: Optional[int]
    rse: Optional[float]
    stop_reason: Optional[str]
    wall_ms: Optional[float]
    fresh_inputs: Optional[int]
    #: Runs of the launch list per timed sample, each on its own fresh inputs (1 unless
    #: the kernel is too short to time one run at a time); the figures are per run.
    reps: int
    rechecks: Optional[int]
    overhead_us: Optional[float]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Optional["TimingStats"]:
        median = _float(d.get("median_us"))
        if median is None:
            return None
        return cls(
            median_us=median,
            mean_us=_float(d.get("mean_us")),
            stdev_us=_float(d.get("stdev_us")),
            min_us=_float(d.get("min_us")),
            max_us=_float(d.get("max_us")),
            n=_int(d.get("n")),
            rse=_float(d.get("rse")),
            stop_reason=_str(d.get("stop_reason")),
            wall_ms=_float(d.get("wall_ms")),
            fresh_inputs=_int(d.get("fresh_inputs")),
            reps=_int(d.get("reps")) or 1,
            rechecks=_int(d.get("rechecks")),
            overhead_us=_float(d.get("overhead_us")),
            raw=dict(d),
        )


#: The torch baseline kinds: eager PyTorch and ``torch.compile`` of the same module.
TORCH_EAGER = "torch-eager"
TORCH_COMPILE = "torch-compile"
#: The suffix of the hosted baselines' names (``torch-eager-hosted``): the problem's own
#: module run through the hosted path, timed by the same harness as a hosted candidate.
HOSTED_SUFFIX = "-hosted"


def same_harness(kind: str, trust: Optional[str]) -> str:
    """The torch baseline ``kind`` a candidate run under ``trust`` is compared with: its
    hosted twin (``torch-eager-hosted``) for a ``hosted`` candidate, whose times hold the
    hosted path's own cost as that baseline's do; ``kind`` itself otherwise."""
    return kind + HOSTED_SUFFIX if trust == "hosted" else kind


def torch_variant(names: "Iterable[str]", kind: str) -> Optional[str]:
    """Which result of the torch baseline ``kind`` (``torch-eager``, ``torch-compile``,
    or a hosted one, ``torch-eager-hosted``) stands for it among ``names``
    (``torch-eager-fp32``, ``torch-eager-tf32``, ..., in kilnd's order): its ``fp32``
    variant (PyTorch's default precision, the one KernelBench times), else the bare kind,
    else the first; ``None`` if there is none. An in-process kind never picks a hosted
    result."""
    hosted = kind.endswith(HOSTED_SUFFIX)
    found = [n for n in names if (n == kind or n.startswith(kind + "-")) and (hosted or not n.endswith(HOSTED_SUFFIX))]
    for preferred in (f"{kind}-fp32", kind):
        if preferred in found:
            return preferred
    return found[0] if found else None


@dataclass(frozen=True)
class BaselineResult:
    """One baseline of a problem on one GPU model (``reference``, ``cublas-fp32``,
    ``torch-eager-fp32``, ``torch-compile-fp32``, ...): ``status`` is ``measured``,
    ``unavailable`` or ``failed`` (``detail`` says why)."""

    name: str
    library: str
    precision: str
    status: str
    timing: Optional[TimingStats]
    rel_l2: Optional[float]
    mismatches: Optional[int]
    detail: str
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BaselineResult":
        return cls(
            name=_str(d.get("name")) or "",
            library=_str(d.get("library")) or "",
            precision=_str(d.get("precision")) or "",
            status=_str(d.get("status")) or "",
            timing=TimingStats.from_dict(_obj(d.get("timing"))),
            rel_l2=_float(d.get("rel_l2")),
            mismatches=_int(d.get("mismatches")),
            detail=_str(d.get("detail")) or "",
            raw=dict(d),
        )

    @property
    def median_us(self) -> Optional[float]:
        """The median time in µs, when measured."""
        if self.status != "measured" or self.timing is None or self.timing.median_us <= 0:
            return None
        return self.timing.median_us


@dataclass(frozen=True)
class BaselineSet:
    """``GET /v1/problems/{name}/baselines``: a problem's baselines on one GPU model and
    driver (also each entry of :attr:`Problem.baselines`)."""

    gpu_model: str
    driver: str
    problem: str
    measured_at: Optional[int]
    results: List[BaselineResult]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BaselineSet":
        return cls(
            gpu_model=_str(d.get("gpu_model")) or "",
            driver=_str(d.get("driver")) or "",
            problem=_str(d.get("problem")) or "",
            measured_at=_int(d.get("measured_at")),
            results=[BaselineResult.from_dict(r) for r in _list(d.get("results")) if isinstance(r, dict)],
            raw=dict(d),
        )

    def median_us(self, name: str) -> Optional[float]:
        """The median of the baseline called ``name``, when measured."""
        return next((r.median_us for r in self.results if r.name == name), None)

    def torch_us(self, kind: str) -> Optional[float]:
        """The median of the torch baseline ``kind`` (``torch-eager`` or
        ``torch-compile``): its measured variant chosen by :func:`torch_variant`."""
        name = torch_variant([r.name for r in self.results if r.median_us is not None], kind)
        return self.median_us(name) if name is not None else None


def pick_baseline_set(sets: "Iterable[BaselineSet]", gpu_model: Optional[str]) -> Optional[BaselineSet]:
    """The first of ``sets`` measured on ``gpu_model``; without one, the first when every
    set is of one model; else ``None`` (times on different GPU models are not compared)."""
    sets = list(sets)
    if gpu_model is not None:
        return next((b for b in sets if b.gpu_model == gpu_model), None)
    if sets and all(b.gpu_model == sets[0].gpu_model for b in sets):
        return sets[0]
    return None


@dataclass(frozen=True)
class ErrorMetrics:
    """Error of one output tensor against the reference."""

    tensor: str
    max_abs: Optional[float]
    max_rel: Optional[float]
    rel_l2: Optional[float]
    mismatches: Optional[int]
    first_mismatches: List[Json]
    nonfinite_mismatches: Optional[int]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ErrorMetrics":
        return cls(
            tensor=_str(d.get("tensor")) or "",
            max_abs=_float(d.get("max_abs")),
            max_rel=_float(d.get("max_rel")),
            rel_l2=_float(d.get("rel_l2")),
            mismatches=_int(d.get("mismatches")),
            first_mismatches=[_obj(m) for m in _list(d.get("first_mismatches"))],
            nonfinite_mismatches=_int(d.get("nonfinite_mismatches")),
        )


@dataclass(frozen=True)
class Unwritten:
    """Output elements a candidate left unwritten."""

    tensor: str
    count: int
    first_indices: List[int]


@dataclass(frozen=True)
class Evidence:
    """The evidence behind a verdict."""

    trials_passed: int
    trials_run: int
    fault: Optional[str]
    errors: List[ErrorMetrics]
    deciding_trial: Optional[str]
    tampered_inputs: List[str]
    unwritten: List[Unwritten]
    bitwise_diffs: int
    output_excerpt: Optional[str]
    notes: List[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Evidence":
        unwritten: List[Unwritten] = []
        for u in _list(d.get("unwritten")):
            if isinstance(u, list) and len(u) >= 2:
                first = [i for i in _list(u[2]) if _int(i) is not None] if len(u) > 2 else []
                unwritten.append(Unwritten(str(u[0]), _int(u[1]) or 0, first))
        return cls(
            trials_passed=_int(d.get("trials_passed")) or 0,
            trials_run=_int(d.get("trials_run")) or 0,
            fault=_str(d.get("fault")),
            errors=[ErrorMetrics.from_dict(_obj(e)) for e in _list(d.get("errors"))],
            deciding_trial=_str(d.get("deciding_trial")),
            tampered_inputs=[t for t in _list(d.get("tampered_inputs")) if isinstance(t, str)],
            unwritten=unwritten,
            bitwise_diffs=_int(d.get("bitwise_diffs")) or 0,
            output_excerpt=_str(d.get("output_excerpt")),
            notes=[n for n in _list(d.get("notes")) if isinstance(n, str)],
            raw=dict(d),
        )


@dataclass(frozen=True)
class CompileInfo:
    """What the compile step produced: wall time, compiler log, cache hit, kernel resources."""

    duration_ms: Optional[float]
    log: str
    cached: bool
    kernels: List[Json]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CompileInfo":
        return cls(
            duration_ms=_float(d.get("duration_ms")),
            log=_str(d.get("log")) or "",
            cached=d.get("cached") is True,
            kernels=[_obj(k) for k in _list(d.get("kernels"))],
        )


def _speedups(v: Any) -> Optional[Dict[str, float]]:
    """Reads ``speedups`` as ``{baseline: factor}``; ``None`` when absent or not that shape.

    kilnd sends a list, ``[{"baseline", "precision", "baseline_us", "speedup"}]``, beside
    the evaluation of a candidate timed on the cuda backend; a ``{baseline: factor}`` (or
    ``{baseline: {"speedup": factor}}``) object is read too.
    """
    if isinstance(v, list):
        v = {e.get("baseline"): e for e in v if isinstance(e, dict) and isinstance(e.get("baseline"), str)}
    if not isinstance(v, dict):
        return None
    out: Dict[str, float] = {}
    for name, value in v.items():
        number = _float(value)
        if number is None and isinstance(value, dict):
            number = _float(value.get("speedup"))
        if number is not None:
            out[str(name)] = number
    return out


@dataclass(frozen=True)
class Evaluation:
    """A finished evaluation: the verdict and everything behind it.

    Attributes:
        verdict: one of :data:`VERDICTS` (kept as a string, so a verdict added later
            still parses).
        message: one line saying why, for people.
        backend: the backend that ran it (``host``, ``cuda``).
        trust: how it was run: ``contract`` (kiln launched its device code from its plan;
            none of its host code ran), ``hosted`` (a KernelBench ``ModelNew`` file whose
            own Python ran in kiln's jailed hosted runner; kiln made the inputs and weights,
            compared the outputs and timed it from its side) or ``lifted`` (a contract
            candidate kilnd made itself of the GPU work a ``ModelNew`` file's forward
            recorded, then compiled, launched and timed like any contract candidate; see
            :class:`Lift`). ``contract`` when kilnd does not say (evaluations made before
            hosted candidates existed).
        compile: the compile step, when there was one.
        evidence: trials, error metrics, faults, tampered inputs, ...
        timing: timing statistics (correct candidates only).
        tier: the precision tier (``fp32-faithful``, ``tf32-like``, ...; correct only).
        telemetry: backend-specific telemetry (GPU clocks, throttling, ...).
        speedups: speedup factor (baseline median / this median) per baseline, as kilnd
            reports them beside a candidate timed on the cuda backend: against the
            baselines cached for the model of the GPU that timed it (empty until they
            are measured); ``None`` when kilnd sends none.
        candidate_id: the candidate evaluated, when known.
        job_id: the job that produced it, when known.
        raw: the evaluation object as received.
    """

    verdict: str
    message: str
    backend: str
    compile: Optional[CompileInfo]
    evidence: Evidence
    timing: Optional[TimingStats]
    tier: Optional[str]
    telemetry: Optional[Json]
    speedups: Optional[Dict[str, float]]
    candidate_id: Optional[str]
    job_id: Optional[int]
    raw: Json = field(repr=False, compare=False)
    trust: str = "contract"

    @classmethod
    def from_dict(
        cls,
        d: Mapping[str, Any],
        candidate_id: Optional[str] = None,
        job_id: Optional[int] = None,
        speedups: Any = None,
    ) -> "Evaluation":
        """``speedups``: kilnd's, sent beside the evaluation (in the candidate's record),
        used when the evaluation itself has none."""
        compile_info = d.get("compile")
        telemetry = d.get("telemetry")
        return cls(
            verdict=_str(d.get("verdict")) or "",
            message=_str(d.get("message")) or "",
            backend=_str(d.get("backend")) or "",
            compile=CompileInfo.from_dict(compile_info) if isinstance(compile_info, dict) else None,
            evidence=Evidence.from_dict(_obj(d.get("evidence"))),
            timing=TimingStats.from_dict(_obj(d.get("timing"))),
            tier=_str(d.get("tier")),
            telemetry=telemetry if isinstance(telemetry, dict) else None,
            speedups=_speedups(d["speedups"] if "speedups" in d else speedups),
            candidate_id=candidate_id,
            job_id=job_id,
            raw=dict(d),
            trust=_str(d.get("trust")) or "contract",
        )

    @property
    def ok(self) -> bool:
        """True if and only if the verdict is ``ok`` (correct, timed and plausible)."""
        return self.verdict == "ok"

    @property
    def median_us(self) -> Optional[float]:
        """The median time in microseconds, for correct candidates."""
        return self.timing.median_us if self.timing else None

    @property
    def gpu_model(self) -> Optional[str]:
        """The name of the GPU that ran it (``telemetry.device.name``), when it says."""
        device = _obj(_obj(self.telemetry).get("device"))
        return _str(device.get("name"))

    def speedup(self, baseline: Optional[str] = None) -> Optional[float]:
        """The speedup over ``baseline``, as reported by kilnd; ``None`` if not reported.

        Without ``baseline``, the only reported speedup (``None`` if there are several).
        """
        if not self.speedups:
            return None
        if baseline is not None:
            return self.speedups.get(baseline)
        if len(self.speedups) == 1:
            return next(iter(self.speedups.values()))
        return None


@dataclass(frozen=True)
class Job:
    """A job of the queue: ``queued`` → ``compiling`` → ``compiled`` → ``running`` →
    ``done`` | ``failed``. ``attempts`` counts evaluations started on a lane; ``lane`` is
    the lane of the (last) one."""

    id: int
    candidate_id: str
    backend: str
    state: str
    lane: Optional[int]
    attempts: int
    #: The node that holds or held it, and the GPU class it is routed to (in a cluster).
    node: Optional[str]
    gpu_class: Optional[str]
    error: Optional[str]
    created_at: Optional[int]
    started_at: Optional[int]
    finished_at: Optional[int]
    compile_ms: Optional[float]
    eval_ms: Optional[float]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Job":
        return cls(
            id=_int(d.get("id")) or 0,
            candidate_id=_str(d.get("candidate_id")) or "",
            backend=_str(d.get("backend")) or "",
            state=_str(d.get("state")) or "",
            lane=_int(d.get("lane")),
            attempts=_int(d.get("attempts")) or 0,
            node=_str(d.get("node")),
            gpu_class=_str(d.get("gpu_class")),
            error=_str(d.get("error")),
            created_at=_int(d.get("created_at")),
            started_at=_int(d.get("started_at")),
            finished_at=_int(d.get("finished_at")),
            compile_ms=_float(d.get("compile_ms")),
            eval_ms=_float(d.get("eval_ms")),
            raw=dict(d),
        )

    @property
    def finished(self) -> bool:
        """True once the job is ``done`` or ``failed``."""
        return self.state in ("done", "failed")


def _trust(given: Any, evaluation: Optional[Evaluation], language: Any) -> str:
    """kilnd's trust mode, else the evaluation's, else the language's."""
    if isinstance(given, str) and given:
        return given
    if evaluation is not None and "trust" in evaluation.raw:
        return evaluation.trust
    return "hosted" if language in ("modelnew", "modelnew-cpu") else "contract"


@dataclass(frozen=True)
class Lift:
    """What kilnd's attempt to lift a hosted ``ModelNew`` file came to: the ``lift`` of
    the file's :class:`CandidateRecord` (absent when nothing was tried).

    kilnd records the GPU work the file's forward did and, where it can, makes of it an
    ordinary contract candidate (language ``cuda``) that it queues by itself after the
    file's evaluation; that candidate's evaluation has trust ``lifted``.

    Attributes:
        outcome: ``lifted`` or ``not_lifted`` (see :data:`LIFT_OUTCOMES`).
        code: why it was not lifted, as a short stable key (``memset``, ``differs``,
            ``side_stream``, ...); ``None`` when lifted.
        reason: the same for people; ``None`` when lifted.
        candidate_id: the lifted candidate's id (``lifted`` only).
        notes: what was dropped or assumed on the way (``lifted`` only).
        state: the lifted candidate's job state (one of :data:`JOB_STATES`), ``None``
            until kilnd has queued it.
        verdict: the lifted candidate's verdict, once evaluated.
        message: its message, once evaluated.
        median_us: its median time, when correct.
        hosted_median_us: the file's own (hosted) median time, beside it.
        evaluation: the lifted candidate's full evaluation, once there is one
            (``candidate_id`` the lifted id, ``speedups`` as kilnd reports them beside it).
        raw: the ``lift`` object as received.
    """

    outcome: str
    code: Optional[str]
    reason: Optional[str]
    candidate_id: Optional[str]
    notes: List[str]
    state: Optional[str]
    verdict: Optional[str]
    message: Optional[str]
    median_us: Optional[float]
    hosted_median_us: Optional[float]
    evaluation: Optional[Evaluation]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Any) -> Optional["Lift"]:
        """The lift, or ``None`` for anything that is not one (absent, not an object, an
        unknown outcome, a ``lifted`` without a candidate id): never raises."""
        try:
            return cls._parse(d)
        except Exception:  # noqa: BLE001 - a malformed `lift` is ignored, never fatal
            return None

    @classmethod
    def _parse(cls, d: Any) -> Optional["Lift"]:
        if not isinstance(d, dict):
            return None
        outcome = _str(d.get("outcome"))
        if outcome == "not_lifted":
            return cls(
                outcome=outcome,
                code=_str(d.get("code")),
                reason=_str(d.get("reason")),
                candidate_id=None,
                notes=[],
                state=None,
                verdict=None,
                message=None,
                median_us=None,
                hosted_median_us=_float(d.get("hosted_median_us")),
                evaluation=None,
                raw=dict(d),
            )
        cid = _str(d.get("candidate_id"))
        if outcome != "lifted" or not cid:
            return None
        ev = d.get("evaluation")
        evaluation = None
        if isinstance(ev, dict) and _str(ev.get("verdict")):
            evaluation = Evaluation.from_dict(ev, candidate_id=cid, speedups=d.get("speedups"))
            if "trust" not in ev:
                evaluation = replace(evaluation, trust="lifted")
        return cls(
            outcome=outcome,
            code=None,
            reason=None,
            candidate_id=cid,
            notes=[n for n in _list(d.get("notes")) if isinstance(n, str)],
            state=_str(d.get("state")),
            verdict=_str(d.get("verdict")) or (evaluation.verdict if evaluation else None),
            message=_str(d.get("message")),
            median_us=_float(d.get("median_us")),
            hosted_median_us=_float(d.get("hosted_median_us")),
            evaluation=evaluation,
            raw=dict(d),
        )

    @property
    def lifted(self) -> bool:
        """True when the file was lifted (whatever became of the lifted candidate)."""
        return self.outcome == "lifted"

    @property
    def pending(self) -> bool:
        """True while the lifted candidate has no verdict and its job has not failed
        (not queued yet, queued, compiling or running): its result is still to come."""
        return self.lifted and self.verdict is None and self.evaluation is None and self.state != "failed"

    @property
    def failed(self) -> bool:
        """True when the lifted candidate's job failed without a verdict: the file's
        hosted result stands."""
        return self.lifted and self.evaluation is None and self.verdict is None and self.state == "failed"


@dataclass(frozen=True)
class CandidateRecord:
    """``GET /v1/candidates/{id}``: a candidate, its latest job and its evaluation.

    ``trust`` is how the result in ``evaluation`` was obtained (``contract``, ``hosted``
    or ``lifted``, see :class:`Evaluation`): kilnd's, else its evaluation's, else its
    language's; ``lifted`` when the evaluation is a lifted one.

    For a hosted ``ModelNew`` file kilnd tried to lift, ``lift`` says what became of it
    (:class:`Lift`; ``None`` when nothing was tried, or when kilnd's ``lift`` is not one
    this client can read). A record without kilnd's ``lift`` (the one in the answer to a
    duplicate submission) takes the outcome the file's evaluation recorded in its
    telemetry: a ``lifted`` one then knows nothing of the lifted candidate yet, so the
    record is not finished until fetched again. Where the file was lifted and the lifted candidate has an
    evaluation, that lifted evaluation is the file's result (the most trustworthy
    number): ``evaluation`` is the lifted one (its ``candidate_id`` the lifted
    candidate's, its ``speedups`` the lift's) and ``hosted_evaluation`` the file's own.
    Otherwise ``evaluation`` is the file's own and ``hosted_evaluation`` is ``None`` (so
    ``hosted_evaluation is not None`` says the result came from a lift). A record whose
    lift is still pending (see :attr:`Lift.pending`) is not :attr:`finished`; one whose
    lifted job failed is, with the file's hosted result (:attr:`Lift.failed`).
    """

    id: str
    candidate: Json
    backend: str
    created_at: Optional[int]
    job: Optional[Job]
    evaluation: Optional[Evaluation]
    raw: Json = field(repr=False, compare=False)
    trust: str = "contract"
    lift: Optional[Lift] = None
    hosted_evaluation: Optional[Evaluation] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CandidateRecord":
        cid = _str(d.get("id")) or ""
        job = Job.from_dict(d["job"]) if isinstance(d.get("job"), dict) else None
        ev = d.get("evaluation")
        evaluation = (
            Evaluation.from_dict(ev, candidate_id=cid, job_id=job.id if job else None, speedups=d.get("speedups"))
            if isinstance(ev, dict)
            else None
        )
        trust = _trust(d.get("trust"), evaluation, _obj(d.get("candidate")).get("language"))
        if "lift" in d:
            lift = Lift.from_dict(d.get("lift"))
        else:
            # A record without kilnd's `lift` (the one answered to a duplicate submission):
            # the outcome as the file's evaluation recorded it, without the lifted
            # candidate's state, so a lifted file waits for its lifted result.
            lift = Lift.from_dict(_obj(ev).get("lift") or _obj(evaluation.telemetry if evaluation else None).get("lift"))
        hosted: Optional[Evaluation] = None
        if lift is not None and lift.evaluation is not None:
            hosted, evaluation, trust = evaluation, lift.evaluation, lift.evaluation.trust
        return cls(
            id=cid,
            candidate=_obj(d.get("candidate")),
            backend=_str(d.get("backend")) or "",
            created_at=_int(d.get("created_at")),
            job=job,
            evaluation=evaluation,
            raw=dict(d),
            trust=trust,
            lift=lift,
            hosted_evaluation=hosted,
        )

    @property
    def finished(self) -> bool:
        """True once there is an evaluation or the job failed, and no lifted candidate's
        result is still to come: waiting longer changes nothing."""
        if self.lift is not None and self.lift.pending:
            return False
        return self.evaluation is not None or (self.job is not None and self.job.state == "failed")


@dataclass(frozen=True)
class CandidateSummary:
    """One entry of ``GET /v1/candidates``: newest first, with the latest verdict."""

    id: str
    problem: str
    backend: str
    note: Optional[str]
    created_at: Optional[int]
    state: Optional[str]
    verdict: Optional[str]
    median_us: Optional[float]
    language: Optional[str] = None
    trust: str = "contract"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CandidateSummary":
        return cls(
            id=_str(d.get("id")) or "",
            problem=_str(d.get("problem")) or "",
            backend=_str(d.get("backend")) or "",
            note=_str(d.get("note")),
            created_at=_int(d.get("created_at")),
            state=_str(d.get("state")),
            verdict=_str(d.get("verdict")),
            median_us=_float(d.get("median_us")),
            language=_str(d.get("language")),
            trust=_trust(d.get("trust"), None, d.get("language")),
        )


@dataclass(frozen=True)
class Submission:
    """The answer to ``POST /v1/candidates``.

    Attributes:
        id: the candidate's id (a content hash: the same candidate always gets the same id).
        job_id: its job.
        duplicate: True when the same candidate was submitted before; ``record`` then
            holds what kilnd has for it (possibly a finished evaluation).
        state: ``queued`` for a new candidate.
        warning: set when the backend that runs it is not usable on this kilnd.
    """

    id: str
    job_id: int
    duplicate: bool
    state: Optional[str]
    warning: Optional[str]
    record: Optional[CandidateRecord]
    raw: Json = field(repr=False, compare=False)

    @property
    def backend(self) -> str:
        """The backend that runs it, when known (from the record of a duplicate)."""
        return self.record.backend if self.record is not None else ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Submission":
        rec = d.get("record")
        return cls(
            id=_str(d.get("id")) or "",
            job_id=_int(d.get("job_id")) or 0,
            duplicate=d.get("duplicate") is True,
            state=_str(d.get("state")),
            warning=_str(d.get("warning")),
            record=CandidateRecord.from_dict(rec) if isinstance(rec, dict) else None,
            raw=dict(d),
        )


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event from ``GET /v1/events``.

    ``name`` is the SSE event name (``hello``, ``job``, ``lagged``, ...); ``data`` is its
    decoded JSON payload. For ``job`` events the properties read the payload's fields.
    """

    name: str
    data: Json

    @property
    def type(self) -> str:
        """The payload's ``type`` (same as ``name`` for kilnd's events)."""
        return _str(self.data.get("type")) or self.name

    @property
    def job_id(self) -> Optional[int]:
        return _int(self.data.get("job_id"))

    @property
    def candidate_id(self) -> Optional[str]:
        return _str(self.data.get("candidate_id"))

    @property
    def problem(self) -> Optional[str]:
        return _str(self.data.get("problem"))

    @property
    def state(self) -> Optional[str]:
        return _str(self.data.get("state"))

    @property
    def lane(self) -> Optional[int]:
        return _int(self.data.get("lane"))

    @property
    def node(self) -> Optional[str]:
        """The node that holds the job (a cluster relays other nodes' results)."""
        return _str(self.data.get("node"))

    @property
    def verdict(self) -> Optional[str]:
        return _str(self.data.get("verdict"))

    @property
    def median_us(self) -> Optional[float]:
        return _float(self.data.get("median_us"))

    @property
    def error(self) -> Optional[str]:
        return _str(self.data.get("error"))

    @property
    def search_id(self) -> Optional[str]:
        """The search of a ``search`` or ``search_log`` event."""
        return _str(self.data.get("search_id"))

    @property
    def finished(self) -> bool:
        """True for a job event saying the job is ``done`` or ``failed``."""
        return self.name == "job" and self.state in ("done", "failed")

    @property
    def search_ended(self) -> bool:
        """True for a ``search`` event saying the search is no longer running."""
        return self.name == "search" and self.state is not None and self.state != "running"


@dataclass(frozen=True)
class Outcome:
    """One result of :meth:`kiln.Client.submit_many`: an evaluation or the error that
    stopped this candidate (the batch goes on either way).

    Attributes:
        index: position of the candidate in the input.
        candidate_id: its id, once kilnd accepted it.
        evaluation: the evaluation, when there is one.
        error: why there is none: an :class:`~kiln.errors.ApiError` (kilnd refused the
            candidate), :class:`~kiln.errors.JobFailed`,
            :class:`~kiln.errors.BackendUnavailable`, :class:`~kiln.errors.Timeout`, or a
            ``TypeError``/``ValueError`` for input that is not a candidate at all.
        record: the candidate's record the evaluation (or the failed job) was read
            from, when there was one: for a hosted ``ModelNew`` file, its ``lift`` and
            ``hosted_evaluation`` (``evaluation`` is then the record's: the lifted one
            where the file was lifted). ``candidate_id`` stays the submitted candidate's
            (the file's) id.
    """

    index: int
    candidate_id: Optional[str]
    evaluation: Optional[Evaluation]
    error: Optional[BaseException]
    record: Optional[CandidateRecord] = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True if and only if there is an evaluation with verdict ``ok``."""
        return self.evaluation is not None and self.evaluation.ok

    def result(self) -> Evaluation:
        """The evaluation, or raises the error."""
        if self.evaluation is not None:
            return self.evaluation
        assert self.error is not None
        raise self.error


@dataclass(frozen=True)
class Search:
    """A search: a proposer plugin submitting candidates for one problem within budgets.

    Attributes:
        id: the search's id (``s-…``).
        problem: the problem searched.
        proposer: the proposer's name.
        state: one of :data:`SEARCH_STATES`.
        budget: distinct candidates it may submit.
        submitted: distinct candidates submitted so far.
        evaluated: of those, finished (job done or failed).
        best_candidate: the best ``ok`` candidate so far, and ``best_median_us`` its time.
        summary: what the plugin returned, once done.
        error: why it failed.
    """

    id: str
    problem: str
    proposer: str
    state: str
    budget: Optional[int]
    submitted: int
    evaluated: int
    best_candidate: Optional[str]
    best_median_us: Optional[float]
    summary: Any
    error: Optional[str]
    config: Any
    seed: Optional[int]
    time_limit_ms: Optional[int]
    llm_tokens: Optional[int]
    tokens_used: Optional[int]
    elapsed_ms: Optional[int]
    created_at: Optional[int]
    finished_at: Optional[int]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Search":
        best = d.get("best")
        best_id = _str(best[0]) if isinstance(best, list) and len(best) == 2 else None
        best_us = _float(best[1]) if isinstance(best, list) and len(best) == 2 else None
        return cls(
            id=_str(d.get("id")) or "",
            problem=_str(d.get("problem")) or "",
            proposer=_str(d.get("proposer")) or "",
            state=_str(d.get("state")) or "",
            budget=_int(d.get("budget_candidates")),
            submitted=_int(d.get("submitted")) or 0,
            evaluated=_int(d.get("evaluated")) or 0,
            best_candidate=best_id,
            best_median_us=best_us,
            summary=d.get("summary"),
            error=_str(d.get("error")),
            config=d.get("config"),
            seed=_int(d.get("seed")),
            time_limit_ms=_int(d.get("time_limit_ms")),
            llm_tokens=_int(d.get("llm_tokens")),
            tokens_used=_int(d.get("tokens_used")),
            elapsed_ms=_int(d.get("elapsed_ms")),
            created_at=_int(d.get("created_at")),
            finished_at=_int(d.get("finished_at")),
            raw=dict(d),
        )

    @property
    def finished(self) -> bool:
        """True once the search is no longer running."""
        return self.state != "running"

    def as_event(self) -> Event:
        """This search's state as a ``search`` event (what the event stream would say)."""
        data: Json = {
            "type": "search",
            "search_id": self.id,
            "problem": self.problem,
            "state": self.state,
            "submitted": self.submitted,
            "evaluated": self.evaluated,
            "budget": self.budget,
        }
        if self.best_candidate is not None:
            data["best_candidate"] = self.best_candidate
            data["best_median_us"] = self.best_median_us
        return Event("search", data)


@dataclass(frozen=True)
class SearchLogLine:
    """One line of a search's log (``id`` pages with ``after=``)."""

    id: int
    level: str
    message: str
    created_at: Optional[int]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SearchLogLine":
        return cls(
            id=_int(d.get("id")) or 0,
            level=_str(d.get("level")) or "",
            message=_str(d.get("message")) or "",
            created_at=_int(d.get("created_at")),
        )


@dataclass(frozen=True)
class ArchiveEntry:
    """One candidate a search submitted, oldest first, with its evaluation once finished."""

    id: str
    candidate: Json
    evaluation: Optional[Evaluation]
    error: Optional[str]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArchiveEntry":
        cid = _str(d.get("id")) or ""
        ev = d.get("evaluation")
        return cls(
            id=cid,
            candidate=_obj(d.get("candidate")),
            evaluation=Evaluation.from_dict(ev, candidate_id=cid) if isinstance(ev, dict) else None,
            error=_str(d.get("error")),
        )
