"""Slow clients and connection exhaustion on a real bridge process (issue 22, findings 7 and 9).

- A head sent one byte per second is closed within the head deadline on every HTTP port (the
  triton door's, the control port, the metrics port): the deadline runs from the request's
  first byte and later bytes do not restart it (before, each byte did, so such a client held
  its connection for ever).
- A POST body that stops arriving on `/v2/models/<m>/infer` is answered 408 and closed within
  the body deadline (before, only load/unload had one).
- Connection caps: past `--http-max-connections` a new HTTP connection makes room by closing
  one idle between requests, else the request the server has waited on longest (its body
  stalled), or, when every connection is being answered, is answered 503 and closed while
  gRPC, the metrics and control ports still answer, and HTTP answers again once connections
  close;
  past `--grpc-max-connections` gRPC closes new connections while HTTP still answers.
- The metrics port passes only `GET /health` and `GET /live` through to Dynamo's frontend
  (and serves `/metrics`): its other routes are 404, other methods 405.
- Where the process listens: with the triton door nothing is on 0.0.0.0; with Dynamo's door
  exactly the two ports Dynamo 1.6 binds there (its gRPC and its own HTTP port), which the log
  names, with Dynamo's admin API (`/busy_threshold`) off.

Every wait is bounded; deadlines are set small through the flags so the tests stay short.
"""

from __future__ import annotations

import json
import re
import select
import socket
import time
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient

from bridge.frontends.triton.grpc.server import HANDSHAKE_TIMEOUT_S
from tests.e2e.support import SERVING, fp32_input, wait_until
from tests.harness import BridgeServer
from tests.harness.ports import LOCALHOST, free_port

HEAD_S = 2.0  # --http-header-timeout-secs of these servers
BODY_S = 2.0  # --http-body-timeout-secs
HTTP_CAP = 6  # --http-max-connections
GRPC_CAP = 4  # --grpc-max-connections
# A client that is still connected this long after its deadline was not cut off by it (the
# old code never cut a dripping head: each byte restarted its timer).
DRIP_BOUND_S = 15.0
HEAD = b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"a" * 64


def _door(log_dir: Path, *flags: str):
    """The triton door with a control port, and `flags`."""
    control_port = free_port()
    server = BridgeServer(
        SERVING,
        "--frontend=triton",
        f"--control-port={control_port}",
        *flags,
        log_path=log_dir / "bridge.log",
    )
    with server:
        server.control_port = control_port  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory):
    """Small deadlines."""
    yield from _door(
        tmp_path_factory.mktemp("door"),
        f"--http-header-timeout-secs={HEAD_S}",
        f"--http-body-timeout-secs={BODY_S}",
    )


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory):
    """Small caps, and deadlines long enough for the connections a test holds."""
    yield from _door(
        tmp_path_factory.mktemp("capped"),
        "--http-header-timeout-secs=60",
        f"--http-max-connections={HTTP_CAP}",
        f"--grpc-max-connections={GRPC_CAP}",
    )


def _connect(port: int) -> socket.socket:
    return socket.create_connection((LOCALHOST, port), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing `sock`, if it closed it within `seconds`."""
    received = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
        deadline = max(deadline, time.monotonic() + 5.0)  # an answer came: its end follows
    return None


def _eof_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed `sock` within `seconds` (what it sent is dropped: gRPC sends
    its SETTINGS at once)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            return False
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
    return False


def _drip(port: int) -> tuple[float, bytes]:
    """Send a request head one byte per second; (seconds until the server closed the
    connection, what it answered). Fails if it is still open after DRIP_BOUND_S."""
    with _connect(port) as sock:
        started = time.monotonic()
        for byte in HEAD:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started, b""
            answer = _closed_within(sock, 1.0)
            if answer is not None:
                return time.monotonic() - started, answer
            if time.monotonic() - started > DRIP_BOUND_S:
                break
    raise AssertionError(f"a head dripped one byte a second held port {port} for "
                         f"{DRIP_BOUND_S:.0f} s (head deadline {HEAD_S} s)")  # fmt: skip


def _ports(door: BridgeServer) -> dict[str, int]:
    return {"http": door.http_port, "control": door.control_port, "metrics": door.metrics_port}  # type: ignore[attr-defined]


@pytest.mark.parametrize("port_name", ["http", "control", "metrics"])
def test_a_dripping_head_is_closed_at_its_deadline(door, port_name) -> None:
    elapsed, answer = _drip(_ports(door)[port_name])
    assert elapsed < HEAD_S + 5.0, elapsed  # never restarted by the bytes that kept coming
    assert answer.startswith(b"HTTP/1.1 408"), answer


def test_a_silent_connection_is_closed_at_the_head_deadline(door) -> None:
    with _connect(door.http_port) as sock:
        assert _closed_within(sock, HEAD_S + 10.0) == b""  # closed, with nothing to answer


def test_a_silent_body_on_infer_is_answered_408(door) -> None:
    body = b'{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}'
    with _connect(door.http_port) as sock:
        sock.sendall(
            b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (len(body) + 100)
            + body
        )
        started = time.monotonic()
        answer = _closed_within(sock, BODY_S + 10.0)
    assert answer is not None, "a body that stopped arriving kept its connection"
    assert time.monotonic() - started < BODY_S + 5.0
    assert answer.startswith(b"HTTP/1.1 408"), answer
    # The door still serves.
    with httpx.Client(base_url=f"http://{door.http_url}", timeout=30) as client:
        assert client.get("/v2/health/ready").status_code == 200


def _idle_http_connections(port: int, count: int) -> list[socket.socket]:
    """`count` keep-alive connections, each counted by the server: one request answered."""
    held = []
    for _ in range(count):
        sock = _connect(port)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"connection {len(held) + 1} of {count} closed: {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer
        held.append(sock)
    return held


def _answering_http_connections(
    server: BridgeServer, count: int, folder: Path
) -> tuple[list[socket.socket], Path]:
    """`count` connections, each with a whole `pool` request held in its model until the gate
    (the path returned) exists: requests being answered, which no cap closes for room. Waits
    until the door has them all (two executing, the rest queued)."""
    gate = folder / "gate"
    held = []
    for i in range(count):
        body = json.dumps(
            {
                "parameters": {"gate": str(gate), "started": str(folder / f"started{i}")},
                "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [i]}],
            }
        ).encode()
        sock = _connect(server.http_port)
        sock.sendall(
            b"POST /v2/models/pool/infer HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        held.append(sock)

    def all_in() -> bool:
        started = len(list(folder.glob("started*")))
        queued = re.search(
            r'^nv_inference_pending_request_count\{model="pool",version="1"\} (\d+)',
            httpx.get(server.metrics_url, timeout=30).text,
            re.MULTILINE,
        )
        return started == 2 and queued is not None and int(queued.group(1)) == count - 2

    wait_until(all_in, "the door to hold every request")
    return held, gate


def _http_served(server: BridgeServer) -> bool:
    try:
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=10) as client:
            return client.get("/v2/health/ready").status_code == 200
    except httpx.HTTPError:
        return False


def test_past_the_http_cap_new_connections_get_503_and_the_rest_serves(capped, tmp_path) -> None:
    wait_until(lambda: _http_served(capped), "HTTP to answer")
    held, gate = _answering_http_connections(capped, HTTP_CAP, tmp_path)
    try:
        for _ in range(3):
            with _connect(capped.http_port) as extra:
                answer = _closed_within(extra, 10.0)
                assert answer is not None and answer.startswith(b"HTTP/1.1 503"), answer
        # The other listeners are not starved.
        result = capped.client().infer("echo", [fp32_input([5.0, 6.0])])
        assert result.as_numpy("OUTPUT0").tolist() == [5.0, 6.0]
        assert httpx.get(capped.metrics_url, timeout=30).status_code == 200
        control = f"http://{LOCALHOST}:{capped.control_port}/v2/health/live"
        assert httpx.get(control, timeout=30).status_code == 200
        # The requests held are still answered.
        gate.write_text("open")
        for sock in held:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        gate.touch()
        for sock in held:
            sock.close()
    wait_until(lambda: _http_served(capped), "HTTP to answer once the connections held close")
    assert "connections open, the most allowed (--http-max-connections)" in capped.log_text


def test_at_the_http_cap_a_stalled_request_makes_room(capped) -> None:
    wait_until(lambda: _http_served(capped), "HTTP to answer")
    held = []
    try:
        for _ in range(HTTP_CAP):
            # A body the door waits for: its 100 Continue says the handler is reading it.
            held.append(_connect(capped.http_port))
            held[-1].sendall(
                b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            assert held[-1].recv(4096).startswith(b"HTTP/1.1 100 Continue")
            held[-1].sendall(b"{")  # ... and then it stalls
        assert _http_served(capped)  # a new client is served ...
        closed = [sock for sock in held if _closed_within(sock, 0.2) is not None]
        assert len(closed) == 1, closed  # ... in the room of one stalled request
    finally:
        for sock in held:
            sock.close()


def test_at_the_http_cap_an_idle_connection_makes_room(capped) -> None:
    wait_until(lambda: _http_served(capped), "HTTP to answer")
    held = _idle_http_connections(capped.http_port, HTTP_CAP)
    try:
        assert _http_served(capped)  # a new client is served ...
        readable, _, _ = select.select(held, [], [], 10.0)
        closed = [sock for sock in readable if sock.recv(4096) == b""]
        assert len(closed) == 1, closed  # ... in the room of one idle connection, closed
    finally:
        for sock in held:
            sock.close()


def test_past_the_grpc_cap_new_connections_are_closed_and_http_serves(capped) -> None:
    assert capped.client().is_server_live()  # the harness's client holds one connection
    held = [_connect(capped.grpc_port) for _ in range(GRPC_CAP + 3)]
    try:
        closed = [
            _eof_within(sock, 0.5 if i < GRPC_CAP - 1 else 10.0) for i, sock in enumerate(held)
        ]
        assert closed[: GRPC_CAP - 1] == [False] * (GRPC_CAP - 1), closed
        assert closed[-3:] == [True] * 3, closed
        with httpx.Client(base_url=f"http://{capped.http_url}", timeout=30) as client:
            answer = client.post(
                "/v2/models/echo/infer",
                json={
                    "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [7]}]
                },  # fmt: skip
            )
            assert answer.status_code == 200, answer.text
    finally:
        for sock in held:
            sock.close()

    def served() -> bool:
        client = grpcclient.InferenceServerClient(capped.grpc_url)
        try:
            result = client.infer("echo", [fp32_input([8.0])], client_timeout=10)
            return result.as_numpy("OUTPUT0").tolist() == [8.0]
        except Exception:  # noqa: BLE001 - refused while the cap is still full
            return False
        finally:
            client.close()

    wait_until(served, "a new gRPC client to be served once the connections held are closed")


# -- Dynamo's door: the metrics port's pass-through, and where the process listens ------------


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.add((_address(address, width), int(port, 16)))
    return found


def _address(hex_text: str, width: int) -> str:
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, bytes.fromhex(hex_text)[::-1])
    words = [bytes.fromhex(hex_text[i : i + 8])[::-1] for i in range(0, 32, 8)]
    return socket.inet_ntop(socket.AF_INET6, b"".join(words))


ANY = ("0.0.0.0", "::")


def test_the_triton_door_listens_on_no_wildcard_address(door) -> None:
    assert door.process is not None
    wildcard = {(a, p) for a, p in _listening(door.process.pid) if a in ANY}
    assert not wildcard, wildcard


def test_dynamo_door_metrics_port_and_where_it_listens(bridge_server) -> None:
    server = bridge_server(SERVING, "--frontend=dynamo")
    assert server.process is not None
    named = re.search(r"Dynamo's frontend HTTP on 0\.0\.0\.0:(\d+)", server.log_text)
    assert named, server.log_tail()
    frontend_http = int(named.group(1))
    wildcard = {(a, p) for a, p in _listening(server.process.pid) if a in ANY}
    # Dynamo 1.6 binds these two on every interface and offers no setting; the log says so.
    assert {p for _, p in wildcard} == {server.grpc_port, frontend_http}, wildcard
    assert f"binds gRPC (port {server.grpc_port}) and its own HTTP port ({frontend_http}" in (
        server.log_text
    )
    base = f"http://{LOCALHOST}:{server.metrics_port}"
    with httpx.Client(base_url=base, timeout=30) as client:
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert "nv_inference_request_success" in metrics.text
        assert "dynamo_frontend" in metrics.text  # the frontend's own families, merged
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "healthy"
        assert client.get("/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 200
        assert client.post("/busy_threshold", json={"model": "echo"}).status_code == 404
        for path in ("/docs", "/openapi.json", "/v1/models", "/busy_threshold"):
            assert client.get(path).status_code == 404, path
        for method, path in (("POST", "/metrics"), ("POST", "/health"), ("DELETE", "/live")):
            assert client.request(method, path).status_code == 405, (method, path)
    # Dynamo's own port: its admin API is off (DYN_DISABLE_FRONTEND_ADMIN_API).
    threshold = httpx.post(
        f"http://{LOCALHOST}:{frontend_http}/busy_threshold", json={"model": "echo"}, timeout=30
    )
    assert threshold.status_code == 404, threshold.text
    # An idle request's deadlines hold on the metrics port here too.
    elapsed, answer = _drip(server.metrics_port)
    assert answer.startswith(b"HTTP/1.1 408") and elapsed < 5.0 + 5.0


def test_a_grpc_connection_that_sends_nothing_is_closed(capped) -> None:
    with _connect(capped.grpc_port) as sock:
        assert _eof_within(sock, HANDSHAKE_TIMEOUT_S + 10.0)
