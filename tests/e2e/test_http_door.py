"""The triton door's HTTP/REST API (`--frontend triton`, `--http-port`): bad input, flags, start-up.

Bad input gets a clear 400 with `{"error": text}` and nothing else changes: the server stays
up, and requests on other connections, before, during and after, are answered as usual. Real
Triton is not needed here (it even crashes on some of these, e.g. a shape of 2^62 elements).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.support import cancellation_gate, wait_for_file
from tests.harness import BridgeServer
from tests.harness.ports import LOCALHOST, free_port

DOOR = ("--frontend", "triton")
INFER = "/v2/models/identity_fp32/infer"


@pytest.fixture(scope="module")
def dtypes(repository: Callable[[str], Path]) -> Path:
    return repository("dtypes")  # its identity models share one model.py


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, dtypes: Path) -> Iterator[BridgeServer]:
    log = tmp_path_factory.mktemp("http-door") / "bridge.log"
    with BridgeServer(dtypes, *DOOR, "--allow-client-shm", log_path=log) as server:
        server.wait_model_ready("identity_fp32")
        yield server


def _binary(header: dict, data: bytes, lie: int = 0) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + data, {"Inference-Header-Content-Length": str(len(text) + lie)}


def _fp32(shape: list[int], **parameters) -> dict:
    tensor: dict = {"name": "INPUT0", "shape": shape, "datatype": "FP32"}
    if parameters:
        tensor["parameters"] = parameters
    return tensor


THREE = struct.pack("<3f", 1, 2, 3)
HUGE = 2**62

BAD_INPUT: dict[str, tuple[bytes, dict[str, str]]] = {
    "broken-json": (b'{"inputs": [', {}),
    "not-json": (b"\x00\x01\x02 binary garbage", {}),
    "json-array": (b"[1, 2, 3]", {}),
    "empty-body": (b"", {}),
    "header-length-too-long": _binary({"inputs": [_fp32([1, 3], binary_data_size=12)]}, THREE, 5),
    "header-length-too-short": _binary({"inputs": [_fp32([1, 3], binary_data_size=12)]}, THREE, -5),
    "header-length-beyond-body": _binary(
        {"inputs": [_fp32([1, 3], binary_data_size=12)]}, THREE, 1000
    ),
    "header-length-not-a-number": (
        json.dumps({"inputs": [_fp32([1, 1])]}).encode(),
        {"Inference-Header-Content-Length": "twelve"},
    ),
    "header-length-negative": (
        json.dumps({"inputs": [_fp32([1, 1])]}).encode(),
        {"Inference-Header-Content-Length": "-1"},
    ),
    "binary-short": _binary({"inputs": [_fp32([1, 3], binary_data_size=12)]}, THREE[:8]),
    "binary-left-over": _binary({"inputs": [_fp32([1, 3], binary_data_size=12)]}, THREE + b"x"),
    "binary-sizes-not-the-shape": _binary(
        {"inputs": [_fp32([1, 2], binary_data_size=4), {**_fp32([1, 1], binary_data_size=8)}]},
        THREE,
    ),
    "binary-size-negative": _binary({"inputs": [_fp32([1, 3], binary_data_size=-12)]}, THREE),
    "huge-shape-json": (
        json.dumps({"inputs": [{**_fp32([1, HUGE]), "data": [1, 2, 3]}]}).encode(),
        {},
    ),
    "huge-shape-binary": _binary({"inputs": [_fp32([HUGE, HUGE], binary_data_size=12)]}, THREE),
    "huge-shape-bytes": _binary(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, HUGE],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 5},
                }
            ]
        },
        struct.pack("<I", 1) + b"a",
    ),
    "shape-beyond-64-bits": (
        json.dumps({"inputs": [{**_fp32([1, 2**70]), "data": [1]}]}).encode(),
        {},
    ),
    "deep-nesting": (
        b'{"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": '
        + b"[" * 100_000
        + b"1"
        + b"]" * 100_000
        + b"}]}",
        {},
    ),
    "gzip-that-is-not": (json.dumps({"inputs": []}).encode(), {"Content-Encoding": "gzip"}),
}


def _good(client: httpx.Client) -> None:
    body = json.dumps({"inputs": [{**_fp32([1, 3]), "data": [1, 2, 3]}]}).encode()
    response = client.post(INFER, content=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_a_clear_400(door: BridgeServer, case: str):
    body, headers = BAD_INPUT[case]
    with httpx.Client(base_url=f"http://{door.http_url}", timeout=30) as client:
        response = client.post(INFER, content=body, headers=headers)
        assert response.status_code == 400, response.text
        error = json.loads(response.content)["error"]
        assert isinstance(error, str) and len(error) > 10
        _good(client)  # the same connection goes on


def test_bad_input_leaves_other_requests_alone(door: BridgeServer):
    """Every bad request, over and over, while another connection keeps inferring: every good
    request is answered, and the server is live and ready afterwards."""
    stop = threading.Event()
    failures: list[str] = []
    answered = [0]

    def steady() -> None:
        with httpx.Client(base_url=f"http://{door.http_url}", timeout=30) as client:
            while not stop.is_set():
                try:
                    _good(client)
                    answered[0] += 1
                except Exception as exc:  # noqa: BLE001 - reported below
                    failures.append(repr(exc))

    thread = threading.Thread(target=steady)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://{door.http_url}", timeout=30) as client:
            for _ in range(3):
                for body, headers in BAD_INPUT.values():
                    assert client.post(INFER, content=body, headers=headers).status_code == 400
    finally:
        stop.set()
        thread.join(60)
    assert failures == []
    assert answered[0] > 0
    assert door.running
    client = httpclient.InferenceServerClient(door.http_url)
    assert client.is_server_live() and client.is_server_ready()


def test_a_client_that_goes_away_mid_body(door: BridgeServer):
    """A request whose body never completes (the client closes the connection) costs nothing."""
    with socket.create_connection((LOCALHOST, door.http_port)) as sock:
        sock.sendall(
            b"POST "
            + INFER.encode()
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"
            + b"{" * 1000
        )
    with httpx.Client(base_url=f"http://{door.http_url}", timeout=30) as client:
        _good(client)  # answered after the other connection's end was handled
    assert "ClientDisconnect" not in door.log_text  # an ordinary event, not an error


def test_binary_round_trip_of_a_large_tensor(door: BridgeServer):
    """1M FP32 in and out as binary tensor data, through tritonclient.http."""
    array = np.random.default_rng(0).random((1, 1_000_000), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=True)
    client = httpclient.InferenceServerClient(door.http_url, network_timeout=60)
    result = client.infer(
        "identity_fp32", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")]
    )
    assert result.as_numpy("OUTPUT0").tobytes() == array.tobytes()


# -- flags and start-up ---------------------------------------------------------------------------


def test_http_port_and_address_flags(bridge_server, dtypes: Path):
    """`--http-port` on the command line wins over DYN_BRIDGE_HTTP_PORT (which the harness sets),
    and `--http-address` is where it listens."""
    port = free_port()
    server = bridge_server(dtypes, *DOOR, "--http-port", str(port), "--http-address", LOCALHOST)
    assert server.http_port != port  # the harness's variable ...
    with httpx.Client(timeout=30) as client:  # ... lost to the flag
        assert client.get(f"http://{LOCALHOST}:{port}/v2/health/live").status_code == 200
        with pytest.raises(httpx.ConnectError):
            client.get(f"http://{server.http_url}/v2/health/live")


def test_http_port_taken_fails_start_up(tmp_path: Path, dtypes: Path):
    """As tritonserver: the HTTP port cannot be bound, the server does not start (exit 1)."""
    with socket.socket() as taken:
        taken.bind((LOCALHOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = BridgeServer(
            dtypes, *DOOR, "--http-port", str(port), log_path=tmp_path / "bridge.log"
        )
        with pytest.raises(RuntimeError):
            server.start()
        assert server.returncode == 1
        # One line naming the flag and the value (tests/e2e/test_start_all_or_nothing.py).
        assert f"] --http-port {port} is in use" in server.log_text


def test_dynamo_frontend_serves_no_http_api(bridge_server, dtypes: Path):
    """`--frontend dynamo` has no HTTP/REST API: the harness's DYN_BRIDGE_HTTP_PORT is unused."""
    server = bridge_server(dtypes, "--frontend", "dynamo")
    with httpx.Client(timeout=10) as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://{server.http_url}/v2/health/live")


def test_stops_cleanly_after_serving_http(bridge_server, dtypes: Path):
    """SIGTERM with an idle keep-alive HTTP connection open: the door stops and the process
    exits 0 (the connection does not hold the shutdown)."""
    server = bridge_server(dtypes, *DOOR)
    server.wait_model_ready("identity_fp32")
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        _good(client)  # the connection stays open (keep-alive) while the server stops
        assert server.stop() == 0
    assert "serving Triton HTTP on" in server.log_text
    assert "Started server process" not in server.log_text  # uvicorn's lines stay out


def test_a_client_that_goes_away_cancels_its_request(bridge_server, tmp_path: Path):
    """The client closes its connection while the model runs: the request is cancelled, and
    the model sees `is_cancelled()` (it would otherwise run on for 20 s)."""
    repository, gates = cancellation_gate(tmp_path)
    server = bridge_server(repository, *DOOR)
    server.wait_model_ready("gate")
    body = json.dumps(
        {"inputs": [{"name": "DIR", "shape": [1], "datatype": "BYTES", "data": [str(gates)]}]}
    ).encode()
    with socket.create_connection((LOCALHOST, server.http_port)) as sock:
        sock.sendall(
            b"POST /v2/models/gate/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n"
            % len(body)
            + body
        )
        wait_for_file(gates, ("started",))
    assert wait_for_file(gates, ("cancelled", "not-cancelled")) == "cancelled"


def test_inputs_and_outputs_in_system_shared_memory(door: BridgeServer):
    """An input read from a registered region and an output written into one, over HTTP (the
    region registered over gRPC: both wires share the door's regions). As Triton 2.51 answers
    it: the output is named with its datatype and shape, no data and no parameters; a region
    too small and an unknown region are Triton's 500 and 404 texts."""
    from multiprocessing import shared_memory

    region = shared_memory.SharedMemory(create=True, size=64)
    client = door.client()
    written = None  # a view of the region: released before the region closes
    try:
        np.ndarray((3,), np.float32, buffer=region.buf)[:] = [1, 2, 3]
        client.register_system_shared_memory("http_region", "/" + region.name.lstrip("/"), 64)
        where = {"shared_memory_region": "http_region", "shared_memory_byte_size": 12}
        body = {
            "inputs": [{**_fp32([1, 3]), "parameters": where}],
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "parameters": {
                        **where,
                        "shared_memory_byte_size": 16,
                        "shared_memory_offset": 32,
                    },
                }
            ],
        }
        with httpx.Client(base_url=f"http://{door.http_url}", timeout=30) as http:
            response = http.post(INFER, json=body, headers={"accept-encoding": "identity"})
            assert response.status_code == 200, response.text
            assert response.json()["outputs"] == [
                {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 3]}
            ]
            written = np.ndarray((3,), np.float32, buffer=region.buf, offset=32)
            assert written.tolist() == [1.0, 2.0, 3.0]
            body["outputs"][0]["parameters"]["shared_memory_byte_size"] = 8
            response = http.post(INFER, json=body)
            assert response.status_code == 500
            assert "should be at least 12 bytes to hold the results" in response.json()["error"]
            body["inputs"][0]["parameters"]["shared_memory_region"] = "nope"
            response = http.post(INFER, json=body)
            assert (response.status_code, response.json()) == (
                404,
                {"error": "Unable to find shared memory region: 'nope'"},
            )
    finally:
        client.unregister_system_shared_memory("http_region")
        del written
        region.close()
        region.unlink()
