"""One client cannot lock the others out of the triton door (issue 38, findings 4 and 7).

- gRPC: 1,100 connections that send HTTP/2's preface and SETTINGS and then nothing (before,
  they filled gRPC core's cap of 1024 and every new client failed for as long as they stayed);
  a new tritonclient is served at once, as real Triton 2.51 serves it. With
  `--grpc-max-connection-idle` such connections are closed once idle that long, and a real
  client's channel idle past it is served again.
- HTTP: 1,100 POSTs whose bodies never finish, from one client (127.0.0.2): it holds at most
  `--http-max-connections-per-client` (256), so a client elsewhere (127.0.0.1) is served at
  once (before, they held all 1,024 places under the listener's cap for 120 s and every new
  client got 503).
- HTTP: 1,100 or 5,000 such stalled POSTs, or 1,100 connections that send nothing, from the new
  client's own address (every local client is 127.0.0.1): the new client is served at once,
  in the room of the connection the server has waited on longest, as Triton serves it
  (before, it got 503 for as long as the body deadline let them stay, 10 s, renewable).
- HTTP: a request head past `--http-max-header-size` (64 KiB) is answered 431 as it arrives;
  four heads of 60 MiB sent at once neither grow the server nor delay another client's request
  (before, each was read whole: +240 MB, and a health check waited 4.4 s).

Connections are raw sockets (the attacker's side) and every one is closed; the test process's
soft open-file limit is raised to its hard one, and a test is skipped when that is too low.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.support import SERVING, fp32_input
from tests.harness import BridgeServer
from tests.harness.ports import LOCALHOST

HELD = 1100  # the count: past the door's old caps of 1024
OTHER_CLIENT = "127.0.0.2"  # another loopback address: another client to the door
PROMPT_S = 5.0  # a new client's call must be answered within this (they take milliseconds)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
MiB = 1 << 20


def _open_files(needed: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to the hard one; skip when `needed` do not fit
    (the server inherits the limit, and holds as many)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed} descriptors needed")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.contextmanager
def _held(port: int, count: int, first: bytes, source: str = OTHER_CLIENT) -> Iterator[list]:
    """`count` connections from `source`, each sent `first`; all closed on the way out."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(
                (LOCALHOST, port), timeout=10, source_address=(source, 0)
            )
            socks.append(sock)
            with contextlib.suppress(OSError):  # refused at once: the server may have closed
                sock.sendall(first)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _door(tmp: Path, *flags: str) -> Iterator[BridgeServer]:
    with BridgeServer(SERVING, "--frontend=triton", *flags, log_path=tmp / "bridge.log") as server:
        yield server


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeServer]:
    """Every default: the caps under test are the ones a user gets."""
    _open_files(4 * HELD + 4096)
    yield from _door(tmp_path_factory.mktemp("lockout"))


def _grpc_served(server: BridgeServer) -> float:
    """Seconds a new gRPC client took for one inference (fails if refused)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        started = time.monotonic()
        result = client.infer("echo", [fp32_input([3.0])], client_timeout=PROMPT_S)
        assert result.as_numpy("OUTPUT0").tolist() == [3.0]
        return time.monotonic() - started
    finally:
        client.close()


def _http_served(server: BridgeServer) -> float:
    """Seconds a new HTTP client took for one inference (fails if refused)."""
    client = httpclient.InferenceServerClient(
        server.http_url, connection_timeout=PROMPT_S, network_timeout=PROMPT_S
    )
    try:
        started = time.monotonic()
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([4.0], np.float32))
        result = client.infer("echo", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [4.0]
        return time.monotonic() - started
    finally:
        client.close()


def test_idle_grpc_connections_do_not_lock_out_a_new_client(door) -> None:
    with _held(door.grpc_port, HELD, PREFACE) as socks:
        time.sleep(0.5)  # the server has taken them all in
        for _ in range(3):
            assert _grpc_served(door) < PROMPT_S
        # None of them was refused: gRPC's cap is what the open-file limit leaves.
        assert _closed(socks) == 0


def test_idle_grpc_connections_are_closed_after_the_idle_limit(tmp_path) -> None:
    _open_files(4096)
    for server in _door(tmp_path, "--grpc-max-connection-idle=500"):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert client.is_server_ready()
            with _held(server.grpc_port, 20, PREFACE) as socks:
                deadline = time.monotonic() + 10.0
                while _closed(socks) < len(socks) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert _closed(socks) == len(socks)
            # The client's own connection was idle as long: its next call reconnects.
            result = client.infer("echo", [fp32_input([5.0])], client_timeout=PROMPT_S)
            assert result.as_numpy("OUTPUT0").tolist() == [5.0]
        finally:
            client.close()


def _closed(socks: list[socket.socket]) -> int:
    """How many of `socks` the server has closed (what it sent is read and dropped)."""
    count = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass
            count += 1  # b"": closed
        except BlockingIOError:
            pass
        except OSError:
            count += 1
        sock.setblocking(True)
    return count


def _answers(socks: list[socket.socket]) -> list[bytes]:
    """The first bytes each of `socks` received within a moment (b"" for none yet)."""
    answers = []
    for sock in socks:
        sock.settimeout(0.01)
        try:
            answers.append(sock.recv(4096))
        except (TimeoutError, OSError):
            answers.append(b"")
    return answers


UNFINISHED_POST = (
    b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: localhost\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    b'{"inputs": ['
)


def test_unfinished_http_bodies_from_one_client_do_not_lock_out_another(door) -> None:
    with _held(door.http_port, HELD, UNFINISHED_POST) as socks:
        time.sleep(0.5)
        for _ in range(3):
            assert _http_served(door) < PROMPT_S
        # Its cap: 256 at most are held; the rest were closed to make room for its newer ones.
        assert _closed(socks) >= HELD - 256
    assert "--http-max-connections-per-client" in door.log_text


@pytest.mark.parametrize(
    ("count", "first"),
    [(HELD, UNFINISHED_POST), (5000, UNFINISHED_POST), (HELD, b"")],
    ids=["1100-stalled-bodies", "5000-stalled-bodies", "1100-silent-connections"],
)
def test_a_flood_from_the_new_client_s_own_address_does_not_lock_it_out(
    door, count, first
) -> None:
    _open_files(count + 4096)
    with _held(door.http_port, count, first, source=LOCALHOST) as socks:
        time.sleep(0.5)
        for _ in range(3):
            assert _http_served(door) < PROMPT_S  # before: 503
        answers = [a for a in _answers(socks) if a]
        if first:  # a request begun and cut answers 408, never 503
            assert answers and all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:3]
        assert _closed(socks) >= count - 256  # the flood holds at most its cap
    assert "answered 408 and closed to make room" in door.log_text


def test_a_request_head_past_the_cap_is_answered_431(door) -> None:
    with _held(door.http_port, 1, b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\n") as [
        sock
    ]:
        sock.sendall(b"X-Padding: " + b"a" * (128 * 1024))  # twice the cap, never ended
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer
    assert answer.endswith(b'{"error":"request header fields too large"}')


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_huge_request_heads_cost_neither_memory_nor_other_clients_time(door) -> None:
    assert door.process is not None
    before = _rss(door.process.pid)
    answers: list[bytes] = []

    def send_huge_head(sock: socket.socket) -> None:
        """60 MiB of one header, while another thread reads the answer as it comes."""
        reader = threading.Thread(target=lambda: answers.append(sock.recv(4096)))
        reader.start()
        with contextlib.suppress(OSError):  # the server closes it once answered
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
            for _ in range(60):
                sock.sendall(b"a" * MiB)
        reader.join(10.0)

    with _held(door.http_port, 4, b"", source=LOCALHOST) as socks:
        senders = [threading.Thread(target=send_huge_head, args=(sock,)) for sock in socks]
        for sender in senders:
            sender.start()
        slowest = max(_http_served(door) for _ in range(5))
        for sender in senders:
            sender.join(30.0)
    assert [a[:12] for a in answers] == [b"HTTP/1.1 431"] * 4, answers
    assert slowest < 2.0, slowest  # before: a health check waited 4.4 s
    assert _rss(door.process.pid) - before < 64 * MiB  # before: +240 MB
