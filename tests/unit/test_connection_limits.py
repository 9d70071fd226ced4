"""Connection limits (bridge/frontends/triton/http/connections.py): the flags, and the protocol
driven in memory (a transport that records what it was given, uvicorn's own testing shape) for
the cases a socket test does not reach: blank lines dripped as a head, a pipelined head behind
a request, an answer sent before its body was all in, a handler slower than the body deadline.
The deadlines are tenths of a second; each wait is bounded. The same limits over real sockets:
tests/e2e/test_http_connections.py.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from bridge.cli import build_parser, parse_with_environment, resolve_door, resolve_http_limits
from bridge.frontends.triton.http.connections import ConnectionLimits, protocol_class

FLAGS = (
    "DYN_BRIDGE_FRONTEND",
    "DYN_BRIDGE_HTTP_HEADER_TIMEOUT_SECS",
    "DYN_BRIDGE_HTTP_BODY_TIMEOUT_SECS",
    "DYN_BRIDGE_HTTP_KEEP_ALIVE_TIMEOUT_SECS",
    "DYN_BRIDGE_HTTP_MAX_CONNECTIONS",
    "DYN_BRIDGE_GRPC_MAX_CONNECTIONS",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch) -> None:
    for name in FLAGS:
        monkeypatch.delenv(name, raising=False)


def _args(*argv: str):
    parser = build_parser()
    return parser, parse_with_environment(parser, ["--model-repository", "m", *argv], os.environ)


def limits(*argv: str) -> ConnectionLimits:
    return resolve_http_limits(*_args(*argv))


def test_the_flags_their_defaults_and_environment_forms(monkeypatch) -> None:
    assert limits() == ConnectionLimits(5.0, 120.0, 75.0, 1024)
    given = limits(
        "--http-header-timeout-secs=1.5",
        "--http-body-timeout-secs=30",
        "--http-keep-alive-timeout-secs=10",
        "--http-max-connections=64",
    )
    assert given == ConnectionLimits(1.5, 30.0, 10.0, 64)
    monkeypatch.setenv("DYN_BRIDGE_HTTP_MAX_CONNECTIONS", "99")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_BODY_TIMEOUT_SECS", "7")
    assert limits() == ConnectionLimits(5.0, 7.0, 75.0, 99)
    assert resolve_door(*_args("--frontend=triton")).max_connections == 1024
    assert (
        resolve_door(*_args("--frontend=triton", "--grpc-max-connections=8")).max_connections == 8
    )


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (("--http-header-timeout-secs=0",), "--http-header-timeout-secs: 0.0 is not"),
        (("--http-body-timeout-secs=-1",), "--http-body-timeout-secs: -1.0 is not"),
        (("--http-keep-alive-timeout-secs=nan",), "--http-keep-alive-timeout-secs: nan is not"),
        (("--http-max-connections=0",), "--http-max-connections: 0 is not >= 1"),
    ],
)
def test_values_that_cannot_work_are_refused(capsys, argv, text) -> None:
    with pytest.raises(SystemExit) as exit_info:
        limits(*argv)
    assert exit_info.value.code == 2
    assert text in capsys.readouterr().err


def test_grpc_cap_needs_the_triton_door(capsys) -> None:
    for argv in (
        ("--frontend=dynamo", "--grpc-max-connections=8"),
        ("--frontend=triton", "--grpc-max-connections=0"),
    ):
        with pytest.raises(SystemExit):
            resolve_door(*_args(*argv))
    assert "--grpc-max-connections" in capsys.readouterr().err


# -- the protocol, in memory ------------------------------------------------------------------

TIGHT = ConnectionLimits(header_timeout=0.15, body_timeout=0.15, keep_alive_timeout=0.3)
WAIT_S = 3.0  # bound of every wait below


class Transport(asyncio.Transport):
    """What the protocol wrote, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
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
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

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


def connect(app: Any, state: ServerState, limits: ConnectionLimits = TIGHT) -> Transport:
    config = uvicorn.Config(app, lifespan="off", log_config=None, timeout_keep_alive=1)
    protocol = protocol_class(limits)(config=config, server_state=state, app_state={})
    transport = Transport()
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
