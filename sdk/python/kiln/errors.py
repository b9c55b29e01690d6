"""Exceptions raised by the kiln client.

Everything the client raises on purpose derives from :class:`KilnError`:

- :class:`DaemonNotRunning`: nothing answers on the socket.
- :class:`TransportError`: the socket answered but the HTTP exchange broke.
- :class:`ApiError`: kilnd refused the request; it carries the HTTP status and the
  server's stable error ``code`` and ``message``. Subclasses by status:
  :class:`BadRequest` (400), :class:`Forbidden` (401/403), :class:`NotFound` (404),
  :class:`Conflict` (409), :class:`PayloadTooLarge` (413), :class:`QueueFull` (429),
  :class:`ServerError` (5xx).
- :class:`Timeout`: no answer (or no verdict) within the time allowed.
- :class:`JobFailed`: kilnd could not evaluate the candidate (infrastructure failure).
- :class:`BackendUnavailable`: the backend that would run the candidate is not usable
  on this kilnd, so the job waits in the queue.
- :class:`ProblemFolderError`: a problem folder could not be read.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Type

__all__ = [
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
]


class KilnError(Exception):
    """Base class of every error the kiln client raises."""


class DaemonNotRunning(KilnError):
    """Nothing answers on kilnd's socket (missing socket, or connection refused)."""

    def __init__(self, socket: str, cause: Optional[BaseException] = None) -> None:
        self.socket = socket
        self.cause = cause
        why = f" ({cause.strerror or cause})" if isinstance(cause, OSError) else ""
        super().__init__(
            f"kilnd is not running at {socket}{why}.\n"
            "Start it with `kilnd` (user mode) or `sudo systemctl start kilnd` (system "
            "service), or point Client(socket=...) / KILN_SOCKET at the right socket."
        )


class TransportError(KilnError):
    """The socket was reached but the HTTP exchange failed (closed early, garbled, ...)."""


class ApiError(KilnError):
    """kilnd answered with an error status.

    Attributes:
        status: the HTTP status (4xx or 5xx).
        code: kilnd's stable, machine-readable error code (``invalid_field``,
            ``not_found``, ``conflict``, ...), or ``"unknown"`` if the body had none.
        message: kilnd's message for people.
        body: the decoded JSON body (or the raw text) as received.
    """

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        super().__init__(f"kilnd refused the request ({status}, {code}): {message}")

    @staticmethod
    def from_response(status: int, raw: bytes) -> "ApiError":
        """Builds the fitting subclass from an error response's status and body."""
        body: Any
        try:
            body = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError):
            body = raw.decode("utf-8", "replace")
        code, message = "unknown", ""
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code = str(err.get("code") or "unknown")
            message = str(err.get("message") or "")
        if not message:
            message = body if isinstance(body, str) else json.dumps(body)
        cls = _BY_STATUS.get(status)
        if cls is None:
            cls = ServerError if status >= 500 else ApiError
        return cls(status, code, message, body)


class BadRequest(ApiError):
    """400: the request (a field, the JSON, a query argument) was refused."""


class Forbidden(ApiError):
    """401/403: this user is not allowed to use kilnd (see ``[access]`` in its config)."""


class NotFound(ApiError):
    """404: no such problem, candidate, job or route."""


class MethodNotAllowed(ApiError):
    """405: the route exists but not with this method."""


class Conflict(ApiError):
    """409: the name is taken by a different spec."""


class PayloadTooLarge(ApiError):
    """413: the request body is larger than kilnd's ``server.max_body_bytes``."""


class QueueFull(ApiError):
    """429: kilnd's queue is full (``queue_full``): back off and send it again later.

    :meth:`kiln.Client.submit_many` (and so :func:`kiln.rewards`) does that itself,
    holding the refused candidate until kilnd takes it; :meth:`kiln.Client.submit`
    raises it.
    """


class ServerError(ApiError):
    """5xx: kilnd failed while answering."""


_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: BadRequest,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    429: QueueFull,
}


class Timeout(KilnError, TimeoutError):
    """No answer, or no verdict, within the time allowed.

    Attributes:
        candidate_id: the candidate waited for, when the timeout was a wait for a verdict.
        state: the job's last known state (``queued``, ``compiling``, ``compiled``, ``running``), when known.
    """

    def __init__(
        self, message: str, candidate_id: Optional[str] = None, state: Optional[str] = None
    ) -> None:
        self.candidate_id = candidate_id
        self.state = state
        super().__init__(message)


class JobFailed(KilnError):
    """kilnd could not evaluate the candidate: its job ended ``failed`` with no verdict.

    This is an infrastructure failure (attempts used up after crashes, a backend
    error), not a verdict on the candidate.
    """

    def __init__(self, candidate_id: str, job_id: Optional[int], error: Optional[str]) -> None:
        self.candidate_id = candidate_id
        self.job_id = job_id
        self.error = error
        super().__init__(f"kilnd could not evaluate {candidate_id} (job {job_id}): {error}")


class BackendUnavailable(KilnError):
    """The backend that would run the candidate is not usable on this kilnd.

    The candidate *is* stored and queued (see :attr:`candidate_id`); it runs once
    kilnd is restarted with the backend usable.
    """

    def __init__(self, candidate_id: str, job_id: int, warning: str) -> None:
        self.candidate_id = candidate_id
        self.job_id = job_id
        self.warning = warning
        super().__init__(f"{candidate_id} queued as job {job_id}, but {warning}")


class ProblemFolderError(KilnError):
    """A problem folder could not be read (missing file, bad TOML, no TOML parser)."""
