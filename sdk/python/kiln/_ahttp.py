"""Asynchronous HTTP/1.1 over kilnd's Unix socket, on ``asyncio`` streams.

A minimal client for what kilnd sends: a status line, headers, and a body framed by
``Content-Length``, ``Transfer-Encoding: chunked`` (the event stream) or the end of the
connection. One connection per request (``Connection: close``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import AsyncIterator, Deque, Dict, Optional, Tuple

from .errors import ApiError, KilnError, Timeout, TransportError
from .models import Event
from ._wire import SSEParser, connect_error, exchange_broke, no_answer
_LINE_LIMIT = 1 << 20
_MAX_HEADERS = 100


async def _open(socket_path: str) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    failure: KilnError
    try:
        return await asyncio.open_unix_connection(socket_path, limit=_LINE_LIMIT)
    except OSError as e:
        failure = connect_error(socket_path, e)
    raise failure


def _request_bytes(method: str, target: str, body: Optional[bytes], accept: str) -> bytes:
    lines = [
        f"{method} {target} HTTP/1.1",
        "Host: localhost",
        f"Accept: {accept}",
        "User-Agent: kiln-python",
        "Connection: close",
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")


async def _read_head(reader: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
    status_line = await reader.readline()
    parts = status_line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise TransportError(f"kilnd sent a malformed status line: {status_line[:100]!r}")
    headers: Dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            return int(parts[1]), headers
        if not line:
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise TransportError("kilnd's response headers were cut short or too many")


async def _chunks(reader: asyncio.StreamReader, headers: Dict[str, str]) -> AsyncIterator[bytes]:
    """The body, piece by piece, as it arrives."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise TransportError("the chunked body ended without its last chunk")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise TransportError(f"bad chunk size line {size_line[:40]!r}") from None
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise TransportError("bad Content-Length") from None
        if length:
            yield await reader.readexactly(length)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


CLOSE_WAIT_S = 2.0
"""How long closing a connection waits for the transport to report it closed."""


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        # Bounded: on some Python versions wait_closed() can wait for ever on a stream
        # whose reader task was cancelled mid-read; the transport is closed either way.
        await asyncio.wait_for(writer.wait_closed(), CLOSE_WAIT_S)
    except (OSError, asyncio.CancelledError, asyncio.TimeoutError):
        pass


async def request(
    socket_path: str, method: str, target: str, body: Optional[bytes], timeout: Optional[float]
) -> Tuple[int, bytes]:
    """Sends one request and returns (status, body bytes)."""

    async def exchange() -> Tuple[int, bytes]:
        reader, writer = await _open(socket_path)
        try:
            writer.write(_request_bytes(method, target, body, "application/json"))
            await writer.drain()
            status, headers = await _read_head(reader)
            data = b"".join([c async for c in _chunks(reader, headers)])
            return status, data
        finally:
            await _close(writer)

    failure: KilnError
    try:
        return await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        failure = no_answer(method, target, timeout)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        if isinstance(e, KilnError):
            raise
        failure = exchange_broke(method, target, e)
    raise failure


class AsyncEventStream:
    """Server-Sent Events from ``GET /v1/events``, as an async iterator of
    :class:`~kiln.Event`\\ s. Open it with ``await client.events()`` or
    ``async with client.events() as stream``.

    The first event is ``hello``; iteration ends when kilnd closes the stream.
    ``timeout`` is the longest silence allowed between two reads (kilnd sends a
    keep-alive every 15 s); past it iteration raises :class:`~kiln.errors.Timeout`.
    """

    def __init__(self, socket_path: str, timeout: Optional[float] = None) -> None:
        self._socket_path = socket_path
        self._timeout = timeout
        self._parser = SSEParser()
        self._pending: Deque[Event] = deque()
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._body: Optional[AsyncIterator[bytes]] = None
        self._closed = False

    async def open(self) -> "AsyncEventStream":
        """Connects and reads the response head; raises the client's errors."""
        if self._body is not None or self._closed:
            return self
        reader, writer = await _open(self._socket_path)
        self._reader, self._writer = reader, writer
        failure: Optional[KilnError] = None
        try:
            writer.write(_request_bytes("GET", "/v1/events", None, "text/event-stream"))
            await writer.drain()
            status, headers = await asyncio.wait_for(_read_head(reader), self._timeout)
            if status >= 400:
                data = b"".join([c async for c in _chunks(reader, headers)])
                failure = ApiError.from_response(status, data)
            else:
                self._body = _chunks(reader, headers)
        except asyncio.TimeoutError:
            failure = Timeout("kilnd did not answer GET /v1/events in time")
        except (OSError, asyncio.IncompleteReadError) as e:
            failure = exchange_broke("GET", "/v1/events", e)
        if failure is not None:
            await self.aclose()
            raise failure
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.open().__await__()

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __anext__(self) -> Event:
        await self.open()
        while not self._pending:
            if self._body is None:
                raise StopAsyncIteration
            try:
                chunk = await asyncio.wait_for(self._body.__anext__(), self._timeout)
            except StopAsyncIteration:
                await self.aclose()
                raise
            except asyncio.TimeoutError:
                await self.aclose()
                raise Timeout("no event (nor keep-alive) from kilnd in time") from None
            except (OSError, asyncio.IncompleteReadError) as e:
                await self.aclose()
                raise TransportError(f"the event stream broke: {e!r}") from e
            self._pending.extend(self._parser.feed(chunk))
        return self._pending.popleft()

    async def aclose(self) -> None:
        """Ends the stream and closes the connection."""
        self._closed = True
        self._body = None
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await _close(writer)

    async def __aenter__(self) -> "AsyncEventStream":
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
