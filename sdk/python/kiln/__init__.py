"""kiln: the Python client of kilnd, which evaluates machine-written kernels.

::

    import kiln

    client = kiln.Client()                      # $KILN_SOCKET or the default socket
    client.add_problem("problems/vecadd-4096")
    ev = client.submit({"problem": "vecadd-4096", "language": "c", "source": src,
                        "launches": [{"kernel": "vecadd", "args": ["a", "b", "c", {"i32": 4096}]}]})
    print(ev.verdict, ev.median_us)
    ev = client.submit(kiln.modelnew("kb-l1-19-relu", "model_new.py"))   # a KernelBench answer
    print(ev.trust)                             # "lifted" (kiln launched the GPU work its
                                                # forward recorded), else "hosted"
    records = kiln.rewards(client, "level1/19", texts, language="modelnew")   # RL rewards

See :class:`Client`, :class:`AsyncClient` and :func:`rewards`.
"""

from ._ahttp import AsyncEventStream
from ._http import EventStream
from ._paths import resolve_socket
from .aio import AsyncClient
from .candidate import (
    HOSTED_LANGUAGES,
    Candidate,
    CandidateLike,
    Launch,
    Scratch,
    defines_model_new,
    f32,
    f64,
    i32,
    i64,
    modelnew,
    u32,
    u64,
)
from .client import Client
from .errors import (
    ApiError,
    BackendUnavailable,
    BadRequest,
    Conflict,
    DaemonNotRunning,
    Forbidden,
    JobFailed,
    KilnError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProblemFolderError,
    QueueFull,
    ServerError,
    Timeout,
    TransportError,
)
from .kernelbench import KernelBenchProblem
from .models import (
    JOB_STATES,
    WAITING_JOB_STATES,
    SEARCH_STATES,
    VERDICTS,
    ArchiveEntry,
    Backend,
    BaselineResult,
    BaselineSet,
    CandidateRecord,
    CandidateSummary,
    CompileInfo,
    Devices,
    ErrorMetrics,
    Evaluation,
    Event,
    Evidence,
    Gpu,
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
    TimingStats,
    Unwritten,
)
from .problem_folder import load_problem, problem_folders
from .rewards import CLIENT_ERROR, JOB_FAILED, NO_VERDICT, SERVER_ERROR, Reward, arewards, rewards

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "EventStream",
    "AsyncEventStream",
    "resolve_socket",
    "load_problem",
    "problem_folders",
    "rewards",
    "arewards",
    "Reward",
    "KernelBenchProblem",
    "CLIENT_ERROR",
    "SERVER_ERROR",
    "JOB_FAILED",
    "NO_VERDICT",
    "Candidate",
    "CandidateLike",
    "modelnew",
    "defines_model_new",
    "HOSTED_LANGUAGES",
    "Launch",
    "Scratch",
    "i32",
    "i64",
    "u32",
    "u64",
    "f32",
    "f64",
    "KilnError",
    "DaemonNotRunning",
    "TransportError",
    "ApiError",
    "BadRequest",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "PayloadTooLarge",
    "QueueFull",
    "ServerError",
    "Timeout",
    "JobFailed",
    "BackendUnavailable",
    "ProblemFolderError",
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
