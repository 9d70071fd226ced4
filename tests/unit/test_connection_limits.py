"""Connection limits (bridge/frontends/triton/http/connections.py, and the gRPC door's
frontends/triton/grpc/connections.py): the flags, and the HTTP protocol driven in memory (a
transport that records what it was given, uvicorn's own testing shape) for the cases a socket
test does not reach: blank lines dripped as a head, a pipelined head behind a request, an answer
sent before its body was all in, a handler slower than the body deadline, a body under the
minimum rate, a head past the cap in any slicing, which connection makes room at a cap. The
deadlines are tenths of a second; each wait is bounded. The same limits over real sockets:
tests/e2e/test_http_connections.py and tests/e2e/test_connection_lockout.py.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from bridge.cli import build_parser, parse_with_environment, resolve_door, resolve_http_limits
from bridge.frontends.triton.grpc.connections import ConnectionPolicy
from bridge.frontends.triton.http.connections import ConnectionLimits, protocol_class


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch) -> None:
    for name in os.environ:
        if name.startswith("DYN_BRIDGE_"):
            monkeypatch.delenv(name)


def _args(*argv: str):
    parser = build_parser()
    return parser, parse_with_environment(parser, ["--model-repository", "m", *argv], os.environ)


def limits(*argv: str) -> ConnectionLimits:
    return resolve_http_limits(*_args(*argv))


def test_the_flags_their_defaults_and_environment_forms(monkeypatch) -> None:
    assert limits() == ConnectionLimits(
        header_timeout=5.0,
        body_timeout=10.0,
        keep_alive_timeout=75.0,
        max_connections=1024,
        max_connections_per_client=256,
        min_body_rate=4096,
        max_header_size=65536,
    )
    given = limits(
        "--http-header-timeout-secs=1.5",
        "--http-body-timeout-secs=30",
        "--http-keep-alive-timeout-secs=10",
        "--http-max-connections=64",
        "--http-max-connections-per-client=8",
        "--http-min-body-rate=0",
        "--http-max-header-size=2048",
    )
    assert given == ConnectionLimits(1.5, 30.0, 10.0, 64, 8, 0, 2048)
    monkeypatch.setenv("DYN_BRIDGE_HTTP_MAX_CONNECTIONS", "99")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_BODY_TIMEOUT_SECS", "7")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_MAX_CONNECTIONS_PER_CLIENT", "9")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_MIN_BODY_RATE", "100")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_MAX_HEADER_SIZE", "4096")
    assert limits() == ConnectionLimits(5.0, 7.0, 75.0, 99, 9, 100, 4096)


def test_the_grpc_connection_flags_are_tritonserver_s(monkeypatch) -> None:
    door = resolve_door(*_args("--frontend=triton"))
    assert door.max_connections is None  # the composition root sets what open files leave
    assert door.max_streams == 1024  # a stream holds two threads
    assert door.infer_threads == 1024  # a ModelInfer call holds one while its model works
    cpus = os.sched_getaffinity(0)
    assert door.thread_cpu == (max(cpus) if len(cpus) > 1 else None)  # auto
    assert resolve_door(*_args("--frontend=triton", "--grpc-thread-cpu=off")).thread_cpu is None
    assert door.connection_policy == ConnectionPolicy()
    # tritonserver's defaults (src/grpc/grpc_server.h KeepAliveOptions), and the idle limit
    assert dict(ConnectionPolicy().channel_args()) == {
        "grpc.keepalive_time_ms": 7_200_000,
        "grpc.keepalive_timeout_ms": 20_000,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 2,
        "grpc.http2.min_ping_interval_without_data_ms": 300_000,
        "grpc.http2.max_ping_strikes": 2,
        "grpc.max_connection_idle_ms": 300_000,
    }
    monkeypatch.setenv("DYN_BRIDGE_GRPC_MAX_CONNECTION_AGE", "60000")
    door = resolve_door(
        *_args(
            "--frontend=triton",
            "--grpc-max-connections=8",
            "--grpc-max-streams=16",
            "--grpc-stream-requests=4",
            "--grpc-infer-threads=32",
            "--grpc-keepalive-time=1000",
            "--grpc-keepalive-timeout=500",
            "--grpc-keepalive-permit-without-calls=true",
            "--grpc-http2-max-pings-without-data=0",
            "--grpc-http2-min-recv-ping-interval-without-data=100",
            "--grpc-http2-max-ping-strikes=3",
            "--grpc-max-connection-age-grace=5000",
            "--grpc-max-connection-idle=0",
        )
    )
    assert door.max_connections == 8
    assert door.max_streams == 16
    assert door.stream_requests == 4
    assert door.infer_threads == 32
    assert dict(door.connection_policy.channel_args()) == {
        "grpc.keepalive_time_ms": 1000,
        "grpc.keepalive_timeout_ms": 500,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 100,
        "grpc.http2.max_ping_strikes": 3,
        "grpc.max_connection_age_ms": 60000,
        "grpc.max_connection_age_grace_ms": 5000,
    }


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (("--http-header-timeout-secs=0",), "--http-header-timeout-secs: 0.0 is not"),
        (("--http-body-timeout-secs=-1",), "--http-body-timeout-secs: -1.0 is not"),
        (("--http-keep-alive-timeout-secs=nan",), "--http-keep-alive-timeout-secs: nan is not"),
        (("--http-max-connections=0",), "--http-max-connections: 0 is not >= 1"),
        (
            ("--http-max-connections-per-client=0",),
            "--http-max-connections-per-client: 0 is not >= 1",
        ),
        (("--http-min-body-rate=-1",), "--http-min-body-rate: -1 is not >= 0"),
        (("--http-max-header-size=100",), "--http-max-header-size: 100 is not >= 1024"),
    ],
)
def test_values_that_cannot_work_are_refused(capsys, argv, text) -> None:
    with pytest.raises(SystemExit) as exit_info:
        limits(*argv)
    assert exit_info.value.code == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (("--frontend=dynamo", "--grpc-max-connections=8"), "--grpc-max-connections: need"),
        (("--frontend=dynamo", "--grpc-max-connection-idle=8"), "--grpc-max-connection-idle: need"),
        (("--frontend=triton", "--grpc-max-connections=0"), "--grpc-max-connections: 0 is not"),
        (("--frontend=dynamo", "--grpc-max-streams=8"), "--grpc-max-streams: need"),
        (("--frontend=triton", "--grpc-max-streams=0"), "--grpc-max-streams: 0 is not"),
        (("--frontend=dynamo", "--grpc-stream-requests=8"), "--grpc-stream-requests: need"),
        (("--frontend=triton", "--grpc-stream-requests=0"), "--grpc-stream-requests: 0 is not"),
        (("--frontend=dynamo", "--grpc-infer-threads=8"), "--grpc-infer-threads: need"),
        (("--frontend=triton", "--grpc-infer-threads=0"), "--grpc-infer-threads: 0 is not"),
        (("--frontend=dynamo", "--grpc-thread-cpu=0"), "--grpc-thread-cpu: need"),
        (("--frontend=triton", "--grpc-thread-cpu=4096"), "--grpc-thread-cpu: CPU 4096 is not"),
        (("--frontend=triton", "--grpc-max-connection-age=-1"), "--grpc-max-connection-age: -1"),
        (("--frontend=triton", "--grpc-keepalive-time=0"), "--grpc-keepalive-time and"),
    ],
)
def test_grpc_connection_flags_that_cannot_work_are_refused(capsys, argv, text) -> None:
    with pytest.raises(SystemExit):
        resolve_door(*_args(*argv))
    assert text in capsys.readouterr().err


# -- the protocol, in memory ------------------------------------------------------------------

TIGHT = ConnectionLimits(header_timeout=0.15, body_timeout=0.15, keep_alive_timeout=0.3)
WAIT_S = 3.0  # bound of every wait below


class Transport(asyncio.Transport):
    """What the protocol wrote, and whether it closed."""

    def __init__(self, peer: str = "127.0.0.1") -> None:
        super().__init__()
        self.peer = peer
        self.written = b""
        self.closed = False
        self.eof = False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            protocol = self.protocol
            asyncio.get_running_loop().call_soon(protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": (self.peer, 5000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200 after `scope`'s query string seconds."""
    while (await receive()).get("more_body"):
        pass
    delay = float(scope["query_string"] or b"0")
    if delay:
        await asyncio.sleep(delay)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def _answer_at_once(scope: Any, receive: Any, send: Any) -> None:
    """Answers before reading the body (as a 404 or 405 does)."""
    await send(
        {"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]}
    )
    await send({"type": "http.response.body", "body": b""})


def connect(
    app: Any, state: ServerState, limits: ConnectionLimits = TIGHT, peer: str = "127.0.0.1"
) -> Transport:
    config = uvicorn.Config(app, lifespan="off", log_config=None, timeout_keep_alive=1)
    protocol = protocol_class(limits)(config=config, server_state=state, app_state={})
    transport = Transport(peer)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    return transport


async def until(predicate: Any) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def test_blank_lines_dripped_as_a_head_are_cut_off() -> None:
    async def main() -> None:
        transport = connect(_ok, ServerState())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not transport.closed and loop.time() < deadline:
            transport.protocol.data_received(b"\r\n")
            await asyncio.sleep(0.02)
        assert transport.closed  # no request ever began, and the blank lines did not count

    asyncio.run(main())


def test_a_pipelined_head_behind_a_slow_request_has_its_deadline() -> None:
    async def main() -> None:
        transport = connect(_ok, ServerState())
        # One whole request (answered after 0.5 s), then the start of another that never ends.
        transport.protocol.data_received(b"GET /?0.5 HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n")
        assert await until(lambda: transport.closed)
        assert b"408" not in transport.written  # the answer in progress is not mixed with one

    asyncio.run(main())


def test_an_answer_before_the_body_still_bounds_the_body_then_idles() -> None:
    async def main() -> None:
        transport = connect(_answer_at_once, ServerState())
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab"
        transport.protocol.data_received(head)
        assert await until(lambda: transport.written.startswith(b"HTTP/1.1 404"))
        assert await until(lambda: transport.closed)  # the rest of the body never came

        # The body completes after the answer: the connection idles under keep-alive again.
        transport = connect(_answer_at_once, ServerState())
        transport.protocol.data_received(head)
        await asyncio.sleep(0.05)
        transport.protocol.data_received(b"cd")
        assert transport.protocol.timeout_keep_alive_task is not None
        assert not transport.closed

    asyncio.run(main())


def test_a_handler_slower_than_the_deadlines_still_answers() -> None:
    async def main() -> None:
        transport = connect(_ok, ServerState())
        transport.protocol.data_received(
            b"POST /?0.5 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        )
        assert await until(lambda: transport.written.endswith(b"ok"))
        assert transport.written.startswith(b"HTTP/1.1 200") and not transport.closed

    asyncio.run(main())


def test_past_the_cap_a_connection_is_answered_503_and_closed() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(max_connections=2)
        kept = [connect(_ok, state, capped) for _ in range(2)]
        for transport in kept:  # being answered (the handler takes 1 s): none makes room
            transport.protocol.data_received(b"GET /?1 HTTP/1.1\r\nHost: x\r\n\r\n")
        extra = connect(_ok, state, capped)
        assert extra.written.startswith(b"HTTP/1.1 503") and extra.closed
        assert len(state.connections) == 2 and not any(t.closed for t in kept)
        kept[0].close()
        await asyncio.sleep(0)  # connection_lost
        assert not connect(_ok, state, capped).closed  # room again

    asyncio.run(main())


def test_at_the_cap_a_connection_idle_between_requests_makes_room() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(max_connections=2)
        idle, busy = (connect(_ok, state, capped) for _ in range(2))
        idle.protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await until(lambda: idle.written.endswith(b"ok"))
        busy.protocol.data_received(b"GET / HTTP/1.1\r\n")  # inside a head: not idle
        new = connect(_ok, state, capped)
        assert not new.closed and not new.written
        assert idle.closed and not busy.closed

    asyncio.run(main())


def _answered(transport: Transport) -> bool:
    return transport.written.endswith(b"ok")


def test_at_the_cap_the_connection_idle_longest_makes_room() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(max_connections=3)
        first, second, busy = (connect(_ok, state, capped) for _ in range(3))
        for idle in (first, second):
            idle.protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await until(lambda idle=idle: _answered(idle))
        busy.protocol.data_received(b"GET / HTTP/1.1\r\n")
        assert not connect(_ok, state, capped).closed
        assert first.closed and not second.closed and not busy.closed

    asyncio.run(main())


def test_one_client_at_its_cap_leaves_room_for_others() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(max_connections=10, max_connections_per_client=2)
        idle_b = connect(_ok, state, capped, peer="127.0.0.2")
        idle_b.protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await until(lambda: _answered(idle_b))
        # Two requests being answered (the handler takes 2 s): neither is closed for room.
        busy = [connect(_ok, state, capped, peer="127.0.0.1") for _ in range(2)]
        for transport in busy:
            transport.protocol.data_received(b"GET /?2 HTTP/1.1\r\nHost: x\r\n\r\n")
        # Past its cap, with none of its own to close: refused, and another client's idle
        # connection is left alone.
        refused = connect(_ok, state, capped, peer="127.0.0.1")
        assert refused.closed and b"too many connections from this client" in refused.written
        assert refused.written.startswith(b"HTTP/1.1 503") and not idle_b.closed
        assert not any(t.closed for t in busy)
        # An IPv6 client is its /64: its third connection takes the room of its first (silent
        # since it connected), and closes nobody else's.
        ipv6 = [connect(_ok, state, capped, peer=f"2001:db8::{i}") for i in (1, 2, 3)]
        assert [t.closed for t in ipv6] == [True, False, False]
        assert ipv6[0].written == b""  # it sent nothing: nothing is sent back
        assert not connect(_ok, state, capped, peer="::ffff:127.0.0.3").closed
        assert not ipv6[1].closed and not ipv6[2].closed
        # Once answered, the client's own idle connection makes room for it.
        assert await until(lambda: _answered(busy[0]) and _answered(busy[1]))
        assert not connect(_ok, state, capped, peer="127.0.0.1").closed
        assert sum(t.closed for t in busy) == 1

    asyncio.run(main())


STALLED_POST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"


def test_at_its_cap_a_client_s_stalled_request_makes_room_for_its_new_one() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(header_timeout=30, body_timeout=30, max_connections_per_client=3)
        stalled = [connect(_ok, state, capped) for _ in range(3)]
        for transport in stalled:  # a body begun, then nothing: the server waits on them
            transport.protocol.data_received(STALLED_POST)
            await asyncio.sleep(0.02)
        new = connect(_ok, state, capped)
        assert not new.closed and not new.written
        # The one silent longest is answered 408 and closed; the others stay.
        assert [t.closed for t in stalled] == [True, False, False]
        assert stalled[0].written.startswith(b"HTTP/1.1 408")
        # The newcomer is served, on the same address as the stalled ones.
        new.protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await until(lambda: _answered(new))
        # A flood from that address rotates through its own stalled connections: at most the
        # cap is held, and the newest always gets in.
        flood = [connect(_ok, state, capped) for _ in range(50)]
        for transport in flood:
            transport.protocol.data_received(STALLED_POST)
        assert sum(not t.closed for t in [*stalled, new, *flood]) == 3
        assert not any(t.closed for t in flood[-3:])

    asyncio.run(main())


def test_a_steady_upload_is_not_closed_for_room_before_a_stalled_one() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(header_timeout=30, body_timeout=30, max_connections_per_client=2)
        steady = connect(_ok, state, capped)  # the older of the two: age is not the rule
        steady.protocol.data_received(STALLED_POST)
        stalled = connect(_ok, state, capped)
        stalled.protocol.data_received(STALLED_POST)
        for _ in range(5):  # the steady one keeps sending; the stalled one does not
            await asyncio.sleep(0.02)
            steady.protocol.data_received(b"x" * 1000)
        new = connect(_ok, state, capped)
        assert not new.closed
        assert stalled.closed and stalled.written.startswith(b"HTTP/1.1 408")
        assert not steady.closed and not steady.written

    asyncio.run(main())


def test_a_connection_lingering_after_its_408_makes_room_first() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(header_timeout=0.1, body_timeout=30, max_connections=2)
        late = connect(_ok, state, capped)
        late.protocol.data_received(b"GET / HTTP/1.1\r\n")  # a head that never ends: 408
        assert await until(lambda: late.eof)  # answered, lingering before it closes
        stalled = connect(_ok, state, capped)
        stalled.protocol.data_received(STALLED_POST)
        assert not connect(_ok, state, capped).closed
        assert late.closed and not stalled.closed

    asyncio.run(main())


def test_a_body_the_server_stopped_reading_is_not_closed_for_room() -> None:
    async def main() -> None:
        state = ServerState()
        capped = ConnectionLimits(header_timeout=30, body_timeout=30, max_connections_per_client=1)
        held = connect(_ok, state, capped)
        held.protocol.data_received(STALLED_POST)
        held.protocol.flow.pause_reading()  # the server's wait, not the client's
        new = connect(_ok, state, capped)
        assert new.closed and new.written.startswith(b"HTTP/1.1 503")
        assert not held.closed

    asyncio.run(main())


BODY_LIMITS = ConnectionLimits(header_timeout=1.0, body_timeout=0.5, min_body_rate=1000)


async def _send_body(transport: Transport, size: int, chunk: int, every: float) -> float:
    """POST a body of `size` bytes, `chunk` bytes every `every` s, until it is all sent or an
    answer comes; the seconds until the answer was whole."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    transport.protocol.data_received(b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size)
    sent = 0
    while sent < size and not transport.written and loop.time() - started < WAIT_S:
        await asyncio.sleep(every)
        transport.protocol.data_received(b"x" * min(chunk, size - sent))
        sent += chunk
    await until(lambda: transport.written.endswith((b"}", b"ok")))
    return loop.time() - started


def test_a_body_under_the_minimum_rate_is_cut_and_one_above_it_is_not() -> None:
    async def main() -> None:
        # 100 B/s against a minimum of 1000 B/s: cut soon after the grace, not after 4 s.
        slow = connect(_ok, ServerState(), BODY_LIMITS)
        elapsed = await _send_body(slow, 400, 5, 0.05)
        assert slow.written.startswith(b"HTTP/1.1 408") and elapsed < 2.0, elapsed
        # About 10 kB/s for 1 s, twice the grace (a total deadline would cut it): served.
        steady = connect(_ok, ServerState(), BODY_LIMITS)
        elapsed = await _send_body(steady, 10_000, 500, 0.05)
        assert _answered(steady) and not steady.closed and elapsed > BODY_LIMITS.body_timeout
        # The rate earned does not buy a long pause: 5000 bytes at once, then silence.
        paused = connect(_ok, ServerState(), BODY_LIMITS)
        paused.protocol.data_received(b"POST / HTTP/1.1\r\nContent-Length: 9000\r\n\r\n")
        paused.protocol.data_received(b"x" * 5000)
        started = asyncio.get_running_loop().time()
        assert await until(lambda: paused.written)
        assert asyncio.get_running_loop().time() - started < 2.0  # the grace, not 5 s
        assert paused.written.startswith(b"HTTP/1.1 408")

    asyncio.run(main())


HEAD_LIMITS = ConnectionLimits(max_header_size=1024)
PADDING = b"X-Padding: " + b"a" * 2000 + b"\r\n"


@pytest.mark.parametrize("chunk", [1 << 20, 1024, 100, 1])
def test_a_head_past_the_cap_is_answered_431_whatever_its_slicing(chunk) -> None:
    async def main() -> None:
        transport = connect(_ok, ServerState(), HEAD_LIMITS)
        protocol = transport.protocol
        request = b"GET / HTTP/1.1\r\nHost: x\r\n" + PADDING * 1000 + b"\r\n"  # 2 MB
        for start in range(0, len(request), chunk):
            protocol.data_received(request[start : start + chunk])
            if transport.eof:
                break
        assert transport.written.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
        assert b"request header fields too large" in transport.written and transport.eof
        assert start < 1024 + chunk  # nothing past the cap was parsed

    asyncio.run(main())


def test_a_head_within_the_cap_is_served_whatever_follows_it() -> None:
    async def main() -> None:
        transport = connect(_ok, ServerState(), HEAD_LIMITS)
        # A whole head at the cap, then a body 50 times the cap, in one read.
        head = b"POST / HTTP/1.1\r\nContent-Length: 51200\r\nX-P: "
        head += b"a" * (1024 - len(head) - 4) + b"\r\n\r\n"
        assert len(head) == 1024
        transport.protocol.data_received(head + b"b" * 51200)
        assert await until(lambda: _answered(transport))
        # Then a second request on the connection: its head is counted from its own start.
        transport.written = b""
        transport.protocol.data_received(b"GET / HTTP/1.1\r\n" + b"X-Q: q\r\n" * 100 + b"\r\n")
        assert await until(lambda: _answered(transport))
        assert transport.written.startswith(b"HTTP/1.1 200") and not transport.closed

    asyncio.run(main())
