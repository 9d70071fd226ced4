"""What one HTTP connection may cost: deadlines on its requests, a cap on its request head, and
caps on connections, per listener and per client.

uvicorn's httptools protocol times out only a connection idle between requests, and restarts
that timer on every byte received, so one byte every few seconds held a connection for ever
(a head, or a POST body on any route), and 20,000 idle connections filled the process's file
table until gRPC, HTTP, metrics and Dynamo's request plane all failed (issue 22, finding 7).
Then 1,024 unfinished POST bodies from one client held every place under the cap for 120 s,
renewable, and a 60 MiB header was read whole (issue 38, findings 4 and 7). `LimitedProtocol`
is that protocol with, per listener (the triton door's `--http-port`, the control port and the
metrics port each have their own):

- a **head deadline** (`--http-header-timeout-secs`): a request's line and headers must all
  arrive within it, measured from the first byte of the request (from the accept for a new
  connection), never restarted by later bytes. Bytes that never make a request (blank lines)
  run it too. Expired: 408 and the connection closes (nothing is sent to a connection that
  sent nothing);
- a **head cap** (`--http-max-header-size`): a request's line and headers together, counted as
  they are read (the parser is never fed past the cap, so an endless header is never held).
  Past it: 431 and the connection closes. libevhtp, Triton's HTTP server, cuts a connection
  without an answer when one header or the URL passes 8 KiB and has no total; this cap is on
  the total, 64 KiB by default (nginx's and Kestrel's are 32 KiB, Go's 1 MiB);
- a **body rate** (`--http-body-timeout-secs`, `--http-min-body-rate`), on every route: from the
  end of the head, a body may take the grace plus one second per `min_body_rate` bytes
  received, and no pause between its bytes may last longer than the grace. Time the server
  itself stopped reading (its buffer full, a pipelined request waiting) does not count.
  Expired: 408 if no answer has begun, the handler sees the client gone, the connection closes.
  A real client sends a body at once and far faster; one that trickles or stops holds its
  connection for seconds, not minutes (with a rate of 0 the grace bounds the whole body);
- a **keep-alive timeout** (`--http-keep-alive-timeout-secs`): a connection idle between
  requests is closed after it (uvicorn's own timer; the time spent running a request is not
  limited);
- a **connection cap** (`--http-max-connections`) and a **cap per client**
  (`--http-max-connections-per-client`; a client is an IPv4 address, or an IPv6 /64, the
  block one host is usually given). At either cap a connection already there makes room
  (of that client, for its own cap): first the one idle longest between requests (or one
  answered 408 or 431 and lingering), closed as nginx drains its keep-alive connections when
  it runs out; else the one the server has waited
  on longest for the rest of a request (its head or its body: silent the longest, whatever its
  deadlines still allow), answered 408 and closed. A connection being answered, or whose body
  the server has stopped reading, is never closed for room; when every one is, the new
  connection is answered 503 and closed at once. So neither idle nor stalled connections keep
  a new client out, even one at the same address (every local client is 127.0.0.1): it is
  served as Triton serves it, and a stalled request makes room before one whose bytes keep
  coming (a steady upload is heard from every few milliseconds; a connection sending a byte
  now and then is silent longer). One client cannot hold a listener, and one listener cannot
  starve the others of file descriptors (bridge/tuning.py raises the soft RLIMIT_NOFILE to the
  hard one, well above the caps).

tritonserver has none of these flags (its HTTP server is libevhtp's, with no read deadlines
and no connection caps), so the names are the bridge's, in the style of the other `--http-*`
flags; each also reads `DYN_BRIDGE_<NAME>` like every flag. The defaults: 5 s for a head (the
control port's documented one), a body's grace 10 s at 4 KiB/s at least, 75 s of keep-alive
(tritonclient and perf_analyzer keep one connection between bursts; uvicorn's 5 s would close
it), 1024 connections per listener (a generous pool for one server, far below the descriptors
the process may open) and 256 of them per client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
import weakref
from asyncio import TimerHandle
from collections.abc import Collection
from dataclasses import dataclass
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger("dynamo_bridge")

HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 10.0
MIN_BODY_RATE = 4096  # bytes a second
KEEP_ALIVE_TIMEOUT_S = 75.0
MAX_CONNECTIONS = 1024
MAX_CONNECTIONS_PER_CLIENT = 256
MAX_HEADER_SIZE = 1 << 16
CAP_WARNING_EVERY_S = 10.0  # one log line per listener and cap per this long while at a cap
# After a 408 or 431: the connection's sending side is closed first and what the client still
# sends is read and dropped for this long, then it closes. Closing at once with bytes unread
# makes the kernel reset the connection, and the client may lose the answer (nginx's lingering
# close).
LINGER_S = 1.0
IPV6_CLIENT_PREFIX = 64  # one client's block of IPv6 addresses


def _answer(status: bytes, error: bytes) -> bytes:
    """A whole HTTP/1.1 answer with Triton's `{"error": ...}` body, closing the connection."""
    body = b'{"error":"%s"}' % error
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, len(body), body)
    )


_TIMEOUT_408 = _answer(b"408 Request Timeout", b"request not received in time")
_HEAD_TOO_LARGE_431 = _answer(
    b"431 Request Header Fields Too Large", b"request header fields too large"
)
PER_LISTENER = "--http-max-connections"
PER_CLIENT = "--http-max-connections-per-client"
# What a connection past a cap is answered, by the cap's flag.
_REFUSALS = {
    PER_LISTENER: _answer(b"503 Service Unavailable", b"too many connections, retry"),
    PER_CLIENT: _answer(b"503 Service Unavailable", b"too many connections from this client"),
}


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """One listener's connection limits (module docstring): seconds, counts and bytes."""

    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    min_body_rate: int = MIN_BODY_RATE
    max_header_size: int = MAX_HEADER_SIZE

    def check(self) -> None:
        """ValueError naming the flag whose value cannot work."""
        for flag, value in (
            ("--http-header-timeout-secs", self.header_timeout),
            ("--http-body-timeout-secs", self.body_timeout),
            ("--http-keep-alive-timeout-secs", self.keep_alive_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{flag}: {value} is not a number of seconds > 0")
        for flag, count, least in (
            (PER_LISTENER, self.max_connections, 1),
            (PER_CLIENT, self.max_connections_per_client, 1),
            ("--http-min-body-rate", self.min_body_rate, 0),
            # Room for a request line and the headers real clients send.
            ("--http-max-header-size", self.max_header_size, 1024),
        ):
            if count < least:
                raise ValueError(f"{flag}: {count} is not >= {least}")


def client_of(transport: asyncio.BaseTransport) -> str:
    """The client a connection counts against: its IPv4 address, or its IPv6 /64 (one host's
    usual block); '' when the transport has no IP peer (a Unix socket)."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return ""
    try:
        address = ipaddress.ip_address(peer[0])
    except ValueError:
        return str(peer[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)


# Each listener's connections by client (its uvicorn ServerState holds them all, unordered).
_CLIENTS: weakref.WeakKeyDictionary[ServerState, dict[str, set[LimitedProtocol]]] = (
    weakref.WeakKeyDictionary()
)


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under `limits` (module docstring). `protocol_class(limits)`
    makes the subclass a listener passes to uvicorn."""

    limits = ConnectionLimits()
    last_cap_warning: dict[str, float] = {}  # per listener's subclass: flag → last warning

    _client = ""
    _refused = False
    _head_timer: TimerHandle | None = None
    _body_timer: TimerHandle | None = None
    _request_begun = False  # bytes of a request arrived since the head timer was armed
    _head_bytes = 0  # of the request head being read
    _lingering = False  # answered 408 or 431: reading and dropping until LINGER_S has passed
    last_heard = 0.0  # loop time of the last bytes received (or of the accept)
    _body_began = 0.0  # loop time the body's rate is counted from
    _body_bytes = 0  # received since then

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._client = client_of(transport)
        clients = _CLIENTS.setdefault(self.server_state, {})
        refusal = self._make_room(clients.get(self._client, set()))
        if refusal is not None:
            self._refused = True
            self._warn_full(transport, refusal)
            transport.write(_REFUSALS[refusal])
            transport.close()
            return
        super().connection_made(transport)
        clients.setdefault(self._client, set()).add(self)
        self.last_heard = self.loop.time()
        self._arm_head(begun=False)  # a new connection has come to send a request

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._cancel_timers()
        clients = _CLIENTS.get(self.server_state, {})
        mine = clients.get(self._client)
        if mine is not None:
            mine.discard(self)
            if not mine:
                del clients[self._client]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._lingering:
            return
        self.last_heard = self.loop.time()
        if self._head_timer is None and self._body_timer is None:
            self._arm_head(begun=True)  # the first byte of the next request
        self._request_begun = True
        # Inside a head the parser is fed at most up to the cap: what lies past it is never
        # parsed (nor held) unless the head ended before it.
        view = memoryview(data)
        while self._head_timer is not None and view:
            room = self.limits.max_header_size - self._head_bytes
            if room <= 0:
                self._close(_HEAD_TOO_LARGE_431 if not self._answering() else None)
                return
            piece, view = view[:room], view[room:]
            self._head_bytes += len(piece)
            super().data_received(piece)  # type: ignore[arg-type]  # httptools reads buffers
            if self.transport.is_closing():  # the parser refused it (400)
                return
        if view:
            super().data_received(view)  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a pipelined request, begun behind the previous body
            self._arm_head(begun=True)

    def on_headers_complete(self) -> None:
        self._cancel_timers()
        self._body_began = self.last_heard = self.loop.time()
        self._body_bytes = 0
        self._body_timer = self.loop.call_at(self._body_due(), self._body_check)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

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

    def lingering(self) -> bool:
        return self._lingering and not self.transport.is_closing()

    def waiting_on_client(self) -> bool:
        """The server waits for the client's bytes and has begun no answer: a new connection
        that sent nothing, a request's head, or its body while the server is reading it (a
        body the server stopped reading is the server's wait, not the client's)."""
        if self.transport.is_closing() or self._lingering:
            return False
        if self._head_timer is not None:
            return not self._answering()  # not a pipelined head behind an answer
        cycle = self.cycle
        return (
            self._body_timer is not None
            and not self.flow.read_paused
            and (cycle is None or not cycle.response_started)
        )

    def _make_room(self, mine: Collection[LimitedProtocol]) -> str | None:
        """Close a connection where a cap is reached (module doc); the flag of the cap that
        has no room, or None."""
        limits = self.limits
        if _full(mine, limits.max_connections_per_client) and not self._room_in(mine, PER_CLIENT):
            return PER_CLIENT
        # Every connection of a listener is one of these (no WebSocket protocol is served).
        connections = cast("set[LimitedProtocol]", self.server_state.connections)
        if _full(connections, limits.max_connections) and not self._room_in(
            connections, PER_LISTENER
        ):
            return PER_LISTENER
        return None

    def _room_in(self, connections: Collection[LimitedProtocol], flag: str) -> bool:
        """Close one of `connections` to make room (module doc); False when none may be."""
        if _close_longest_idle(connections):
            return True
        stalled = [c for c in connections if c.waiting_on_client()]
        if not stalled:
            return False
        # Silent longest: a steady client's bytes keep its last_heard a moment ago.
        victim = min(stalled, key=lambda c: c.last_heard)
        # The victim's transport names the listener (this one's is not set up yet).
        self._warn_full(victim.transport, flag, evicting=True)
        victim.evict()
        return True

    def evict(self) -> None:
        """Closed to make room while its request is not all in: 408, as a deadline would
        answer it (nothing to a new connection that sent nothing), and closed at once (no
        lingering: the room is needed now). Its handler, if one awaits the body, sees the
        client gone when the connection is lost (uvicorn's connection_lost)."""
        self._cancel_timers()
        if self._request_begun:
            self.transport.write(_TIMEOUT_408)
        self.transport.close()

    def _answering(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    def _arm_head(self, begun: bool) -> None:
        self._request_begun = begun
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_expired)

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        # A request being answered (pipelining) keeps its answer; the rest gets the 408.
        begun = self._request_begun and not self._answering()
        self._close(_TIMEOUT_408 if begun else None)

    def _body_due(self) -> float:
        """When the body is late: past the grace plus what its bytes earned at the minimum
        rate, or a grace after its last bytes, whichever comes first."""
        limits = self.limits
        earned = self._body_bytes / limits.min_body_rate if limits.min_body_rate else 0.0
        grace = limits.body_timeout
        return min(self._body_began + grace + earned, self.last_heard + grace)

    def _body_check(self) -> None:
        now = self.loop.time()
        if self.flow.read_paused:
            # The server is not reading (its buffer is full, or a pipelined request waits):
            # the client is not late; its rate counts again from now.
            rate = self.limits.min_body_rate
            self._body_began = now - (self._body_bytes / rate if rate else 0.0)
            self.last_heard = now
        due = self._body_due()
        if due > now:
            self._body_timer = self.loop.call_at(due, self._body_check)
            return
        self._body_timer = None
        cycle = self.cycle
        answer = cycle is not None and not cycle.response_started
        if cycle is not None:
            # The handler's receive() sees the client gone; what it sends next is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self._close(_TIMEOUT_408 if answer else None)

    def _close(self, answer: bytes | None) -> None:
        """Close the connection, after `answer` if given (then lingering, as LINGER_S says)."""
        transport = self.transport
        if transport.is_closing() or self._lingering:
            return
        if answer is None:
            transport.close()
            return
        transport.write(answer)
        if not transport.can_write_eof():  # TLS
            transport.close()
            return
        self._lingering = True
        transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    def _warn_full(self, transport: asyncio.Transport, flag: str, evicting: bool = False) -> None:
        """One line per listener, cap and outcome every CAP_WARNING_EVERY_S while at a cap:
        new connections refused (503), or stalled requests closed to make room (408)."""
        now = time.monotonic()
        warnings = type(self).last_cap_warning
        which = f"{flag} evicting" if evicting else flag
        if now - warnings.get(which, -CAP_WARNING_EVERY_S) < CAP_WARNING_EVERY_S:
            return
        warnings[which] = now
        address = transport.get_extra_info("sockname")
        where = f"{address[0]}:{address[1]}" if address else "?"
        outcome = (
            "the request waited on longest is answered 408 and closed to make room"
            if evicting
            else "new connections are answered 503 and closed"
        )
        if flag == PER_LISTENER:
            log.warning(
                "HTTP on %s: %d connections open, the most allowed (%s): %s",
                where,
                self.limits.max_connections,
                flag,
                outcome,
            )
        else:
            log.warning(
                "HTTP on %s: client %s has %d connections open, the most allowed (%s): %s",
                where,
                self._client,
                self.limits.max_connections_per_client,
                flag,
                outcome,
            )


def _full(connections: Collection[LimitedProtocol], cap: int) -> bool:
    """`cap` connections or more, not counting those already closing (made room a moment
    ago: they leave at the loop's next turn)."""
    if len(connections) < cap:
        return False
    return sum(not c.transport.is_closing() for c in connections) >= cap


def _close_longest_idle(connections: Collection[LimitedProtocol]) -> bool:
    """Close the connection idle between requests that was heard from longest ago, if any;
    True when one was. One lingering after its 408 or 431 counts as idle: it was answered,
    and only waits to close."""
    idle = [c for c in connections if c.idle() or c.lingering()]
    if not idle:
        return False
    min(idle, key=lambda c: c.last_heard).transport.close()
    return True


def protocol_class(limits: ConnectionLimits) -> type[LimitedProtocol]:
    """The protocol class of one listener: `LimitedProtocol` under `limits`, with its own
    warning clocks."""
    return type("LimitedProtocol", (LimitedProtocol,), {"limits": limits, "last_cap_warning": {}})
