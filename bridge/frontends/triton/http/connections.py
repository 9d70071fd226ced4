"""What one HTTP connection may cost: deadlines on its requests, and a cap on connections.

uvicorn's httptools protocol times out only a connection idle between requests, and restarts
that timer on every byte received, so one byte every few seconds held a connection for ever
(a head, or a POST body on any route), and 20,000 idle connections filled the process's file
table until gRPC, HTTP, metrics and Dynamo's request plane all failed (issue 22, finding 7).
`LimitedProtocol` is that protocol with, per listener (the triton door's `--http-port`, the
control port and the metrics port each have their own):

- a **head deadline** (`--http-header-timeout-secs`): a request's line and headers must all
  arrive within it, measured from the first byte of the request (from the accept for a new
  connection), never restarted by later bytes. Bytes that never make a request (blank lines)
  run it too. Expired: 408 and the connection closes (nothing is sent to a connection that
  sent nothing);
- a **body deadline** (`--http-body-timeout-secs`), on every route: the whole body must arrive
  within it, measured from the end of the head. Expired: 408 if no answer has begun, the
  handler sees the client gone, the connection closes;
- a **keep-alive timeout** (`--http-keep-alive-timeout-secs`): a connection idle between
  requests is closed after it (uvicorn's own timer; the time spent running a request is not
  limited);
- a **connection cap** (`--http-max-connections`): at the cap, a connection idle between
  requests makes room (it is closed, as nginx drains its keep-alive connections when it runs
  out); when none is idle, the new connection is answered 503 and closed at once. So one
  listener cannot starve the others of file descriptors (bridge/tuning.py raises the soft
  RLIMIT_NOFILE to the hard one, well above the caps), and idle connections cannot lock out
  new clients.

tritonserver has none of these flags (its HTTP server is libevhtp's, with no read deadlines),
so the names are the bridge's, in the style of the other `--http-*` flags; each also reads
`DYN_BRIDGE_<NAME>` like every flag. The defaults are the control port's documented ones (5 s
for a head, 120 s for a body: a 64 MB body at 0.5 MB/s), 75 s of keep-alive (tritonclient and
perf_analyzer keep one connection between bursts; uvicorn's 5 s would close it), and 1024
connections per listener (a generous pool for one server, far below the descriptors the
process may open).
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import TimerHandle
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("dynamo_bridge")

HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 120.0
KEEP_ALIVE_TIMEOUT_S = 75.0
MAX_CONNECTIONS = 1024
CAP_WARNING_EVERY_S = 10.0  # one log line per listener per this long while at the cap
# After a 408: the connection's sending side is closed first and what the client still sends
# is read and dropped for this long, then it closes. Closing at once with bytes unread makes
# the kernel reset the connection, and the client may lose the 408 (nginx's lingering close).
LINGER_S = 1.0

_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b'content-length: 39\r\nconnection: close\r\n\r\n{"error":"request not received in time"}'
)
_FULL_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b'content-length: 39\r\nconnection: close\r\n\r\n{"error":"too many connections, retry"}'
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """One listener's connection limits (module docstring); seconds and a count."""

    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def check(self) -> None:
        """ValueError naming the flag whose value cannot work."""
        for flag, value in (
            ("--http-header-timeout-secs", self.header_timeout),
            ("--http-body-timeout-secs", self.body_timeout),
            ("--http-keep-alive-timeout-secs", self.keep_alive_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{flag}: {value} is not a number of seconds > 0")
        if self.max_connections < 1:
            raise ValueError(f"--http-max-connections: {self.max_connections} is not >= 1")


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under `limits` (module docstring). `protocol_class(limits)`
    makes the subclass a listener passes to uvicorn."""

    limits = ConnectionLimits()
    last_cap_warning = 0.0  # per listener's subclass

    _refused = False
    _head_timer: TimerHandle | None = None
    _body_timer: TimerHandle | None = None
    _request_begun = False  # bytes of a request arrived since the head timer was armed
    _lingering = False  # answered 408: reading and dropping until LINGER_S has passed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        connections = self.server_state.connections
        if len(connections) >= self.limits.max_connections and not _close_an_idle(connections):
            self._refused = True
            self._warn_full(transport)
            transport.write(_FULL_503)
            transport.close()
            return
        super().connection_made(transport)
        self._arm_head(begun=False)  # a new connection has come to send a request

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._lingering:
            return
        if self._head_timer is None and self._body_timer is None:
            self._arm_head(begun=True)  # the first byte of the next request
        self._request_begun = True
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a pipelined request, begun behind the previous body
            self._arm_head(begun=True)

    def on_headers_complete(self) -> None:
        self._cancel_timers()
        self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_expired)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel_timers()
        cycle = self.cycle
        # Answered before its body was all in: uvicorn armed keep-alive then, and the body's
        # bytes cancelled it; arm it again now that the connection is idle.
        if (
            cycle is not None
            and cycle.response_complete
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def idle(self) -> bool:
        """Between requests: nothing of a request received, nothing being answered."""
        cycle = self.cycle
        return (
            self._head_timer is None
            and self._body_timer is None
            and not self._lingering
            and (cycle is None or cycle.response_complete)
            and not self.pipeline
            and not self.transport.is_closing()
        )

    def _arm_head(self, begun: bool) -> None:
        self._request_begun = begun
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_expired)

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        cycle = self.cycle
        answering = cycle is not None and not cycle.response_complete
        # A request being answered (pipelining) keeps its answer; the rest gets the 408.
        self._close(answer=self._request_begun and not answering)

    def _body_expired(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        answer = cycle is not None and not cycle.response_started
        if cycle is not None:
            # The handler's receive() sees the client gone; what it sends next is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self._close(answer=answer)

    def _close(self, answer: bool) -> None:
        transport = self.transport
        if transport.is_closing() or self._lingering:
            return
        if not answer:
            transport.close()
            return
        transport.write(_TIMEOUT_408)
        if not transport.can_write_eof():  # TLS
            transport.close()
            return
        self._lingering = True
        transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    def _warn_full(self, transport: asyncio.Transport) -> None:
        now = time.monotonic()
        cls = type(self)
        if now - cls.last_cap_warning >= CAP_WARNING_EVERY_S:
            cls.last_cap_warning = now
            address = transport.get_extra_info("sockname")
            log.warning(
                "HTTP on %s: %d connections open, the most allowed (--http-max-connections): "
                "new connections are answered 503 and closed",
                f"{address[0]}:{address[1]}" if address else "?",
                self.limits.max_connections,
            )


def _close_an_idle(connections: set[Any]) -> bool:
    """Close one connection idle between requests, if any; True when one was."""
    for connection in connections:
        if isinstance(connection, LimitedProtocol) and connection.idle():
            connection.transport.close()
            return True
    return False


def protocol_class(limits: ConnectionLimits) -> type[LimitedProtocol]:
    """The protocol class of one listener: `LimitedProtocol` under `limits`, with its own
    warning clock."""
    return type("LimitedProtocol", (LimitedProtocol,), {"limits": limits, "last_cap_warning": 0.0})
