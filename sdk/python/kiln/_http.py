"""Blocking HTTP/1.1 over kilnd's Unix socket, with ``http.client``.

One connection per request: connecting to a local Unix socket is cheap, and it keeps a
:class:`~kiln.Client` safe to share between threads.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections import deque
from typing import Deque, Dict, Iterator, Optional, Tuple

from .errors import ApiError, KilnError, Timeout, TransportError
from .models import Event
from ._wire import SSEParser, connect_error, exchange_broke, no_answer


class _UnixConnection(http.client.HTTPConnection):
    """An ``HTTPConnection`` whose transport is a Unix stream socket."""

    def __init__(self, socket_path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path
        self.raw_sock: Optional[socket.socket] = None

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.raw_sock = sock


def connect(socket_path: str, timeout: Optional[float]) -> _UnixConnection:
    """A connected :class:`_UnixConnection`; raises the client's errors, never ``OSError``."""
    conn = _UnixConnection(socket_path, timeout)
    failure: Optional[KilnError] = None
    try:
        conn.connect()
    except socket.timeout:
        failure = Timeout(f"connecting to kilnd at {socket_path} timed out")
    except OSError as e:
        failure = connect_error(socket_path, e)
    if failure is not None:
        conn.close()
        raise failure
    return conn


def request(
    socket_path: str, method: str, target: str, body: Optional[bytes], timeout: Optional[float]
) -> Tuple[int, bytes]:
    """Sends one request and returns (status, body bytes)."""
    conn = connect(socket_path, timeout)
    failure: Optional[KilnError] = None
    try:
        conn.request(method, target, body=body, headers=_headers(body, "application/json"))
        resp = conn.getresponse()
        return resp.status, resp.read()
    except socket.timeout:
        failure = no_answer(method, target, timeout)
    except (http.client.HTTPException, OSError) as e:
        failure = exchange_broke(method, target, e)
    finally:
        conn.close()
    assert failure is not None
    raise failure


def _headers(body: Optional[bytes], accept: str) -> Dict[str, str]:
    headers = {"Host": "localhost", "Accept": accept, "User-Agent": "kiln-python"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    return headers


class EventStream:
    """Server-Sent Events from ``GET /v1/events``: iterate it for :class:`~kiln.Event`\\ s.

    The first event is ``hello``; then ``job`` events as jobs change state, and
    ``lagged`` (with ``missed``) if this reader fell behind. Iteration ends when kilnd
    closes the stream (e.g. on shutdown). Use it as a context manager, or call
    :meth:`close` (from any thread) to stop.

    ``timeout`` is the longest silence allowed between two reads (kilnd sends a
    keep-alive every 15 s); past it iteration raises :class:`~kiln.errors.Timeout`.
    """

    def __init__(self, socket_path: str, timeout: Optional[float] = None) -> None:
        self._conn = connect(socket_path, timeout)
        self._parser = SSEParser()
        self._pending: Deque[Event] = deque()
        self._closed = False
        self._lock = threading.RLock()
        failure: Optional[KilnError] = None
        try:
            self._conn.request("GET", "/v1/events", headers=_headers(None, "text/event-stream"))
            self._resp = self._conn.getresponse()
            if self._resp.status >= 400:
                failure = ApiError.from_response(self._resp.status, self._resp.read())
        except socket.timeout:
            failure = Timeout("kilnd did not answer GET /v1/events in time")
        except (http.client.HTTPException, OSError) as e:
            failure = exchange_broke("GET", "/v1/events", e)
        if failure is not None:
            self.close()
            raise failure

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while not self._pending:
            with self._lock:
                if self._closed:
                    raise StopIteration
                try:
                    chunk = self._resp.read1(65536)
                except socket.timeout:
                    raise Timeout("no event (nor keep-alive) from kilnd in time") from None
                except Exception as e:  # noqa: BLE001 - a close() from another thread lands here
                    if self._closed:
                        raise StopIteration from None
                    raise TransportError(f"the event stream broke: {e!r}") from e
                if not chunk:
                    self.close()
                    raise StopIteration
            self._pending.extend(self._parser.feed(chunk))
        return self._pending.popleft()

    def close(self) -> None:
        """Ends the stream; safe to call from another thread to wake a blocked reader."""
        self._closed = True
        sock = self._conn.raw_sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        # A reader blocked in read1 wakes on the shutdown and lets go of the lock.
        with self._lock:
            resp = getattr(self, "_resp", None)
            if resp is not None:
                resp.close()
            self._conn.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
