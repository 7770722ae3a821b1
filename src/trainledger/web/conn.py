"""Connection limits of the web server that a slow client cannot exhaust (issue 20).

uvicorn's h11 protocol times out only *idle* keep-alive connections: a client that sends half a
request line, half its headers or half its body holds its connection forever, and 64 of them
filled the old connection cap so that every other request got 503 ("slowloris", CWE-400).
:class:`GuardedH11Protocol` gives every request a read deadline — from its first byte (or the
connection's start) until its last body byte has arrived — of :data:`REQUEST_READ_TIMEOUT_S`;
past it the connection is answered 408 (when nothing was answered yet) and closed, which the app
sees as a client disconnect. With that bound the connection cap can be generous
(:data:`MAX_CONNECTIONS`): an attacker must open connections faster than they expire.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: seconds a client has to send one whole request (line, headers and body up to 1 MiB)
REQUEST_READ_TIMEOUT_S = 10.0
#: seconds an idle keep-alive connection is kept
KEEP_ALIVE_S = 5
#: open connections (and running requests) before uvicorn answers 503; bounded by the fd limit
MAX_CONNECTIONS = 1000
#: largest request line + headers (bytes); larger is 400
MAX_HEADER_BYTES = 16 * 1024

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: 64\r\n\r\n" + b'{"error": "request not received in time", "field": null}'.ljust(64))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a per-request read deadline (see the module docstring)."""

    read_timeout_s = REQUEST_READ_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is timed out too

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is not h11.SEND_BODY and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of a new request
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()  # the whole request is in

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            return
        if self.conn.our_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            try:
                self.transport.write(_408)
            except Exception:  # noqa: BLE001 - the peer may be gone already
                pass
        self.transport.close()


def max_connections() -> int:
    """:data:`MAX_CONNECTIONS`, or fewer when the open-file limit is lower (half of it)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):  # not POSIX
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft // 2))


def uvicorn_config(app: Any, host: str, port: int, log_level: str = "warning", **extra: Any) -> Any:
    """The uvicorn.Config the server runs with (``serve`` and the load bench use the same one)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=GuardedH11Protocol,
                          timeout_keep_alive=KEEP_ALIVE_S, limit_concurrency=max_connections(),
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, **extra)
