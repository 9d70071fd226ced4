"""A streaming client that stops reading, then goes away, on a real bridge (issue 22, streams).

`flood` sends responses as fast as it can until `is_cancelled()`, and stops by itself after
LIMIT_S seconds. A client reads a few, stops reading for a while (a slow client), then closes
its stream. What must hold, on the HTTP wire (generate_stream, SSE) and the gRPC one
(ModelStreamInfer), with a thread instance and a process instance:

- the model sees `is_cancelled()`: its report says so, not that it stopped by itself;
- the server's memory stays bounded while the client does not read (the model's `send()` waits
  for it): the peak RSS grows by less than RSS_GROWTH_BOUND, and the server runs under an
  address-space limit, so a regression fails instead of filling the machine;
- another model is answered on the other wire right after the client left, before the flooding
  model stopped by itself (an order of events, not a speed).

The gRPC client leaves by cancelling its stream, or by vanishing (its process exits); the SSE
client also through a door in another process than the worker (Dynamo's request plane).

Before the fix (main at 71e559c) the SSE stream, and the gRPC stream's request task, drained a
backlog the model refilled without ever giving the event loop a turn: nothing else was answered
(a gRPC call to `echo` hit its 60 s deadline) and the model ran to its own end, never seeing
`is_cancelled()`; behind the request plane the worker's peak RSS grew by 262-328 MB. Every test
here failed there except the two gRPC ones on the process instance, whose slower path let the
loop keep up.
"""

from __future__ import annotations

import itertools
import json
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.support import WAIT_S, int32_input, wait_until
from tests.harness.bridge_server import BridgeServer
from tests.harness.cluster import Cluster, start_all
from tests.harness.repositories import materialize

FLOOD = "stream_flood"  # flood and flood_process share one model.py (materialize)
LIMIT_S = 20  # the model's own stop (README.md): every wait below is bounded by it
# How long the client does not read. The test does not depend on it; it gives a server without
# backpressure the time to pile up responses (hundreds of MB before the fix).
STALL_S = 2.0
RSS_GROWTH_BOUND = 64 << 20  # measured after the fix: 0-2 MB
ADDRESS_SPACE_HEADROOM = 2 << 30  # RLIMIT_AS above what the started server maps

MODELS = pytest.mark.parametrize("model", ["flood", "flood_process"])


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeServer]:
    folder = tmp_path_factory.mktemp("bridge")
    repository = materialize(FLOOD, folder)
    with BridgeServer(repository, "--frontend=triton", log_path=folder / "bridge.log") as bridge:
        for name in ("flood", "flood_process", "echo"):
            bridge.wait_model_ready(name)
        _limit_memory(bridge)
        yield bridge


def _report(path: Path) -> dict | None:
    # The model writes a temp file and renames it: once the path exists, it is complete.
    return json.loads(path.read_text()) if path.exists() else None


def _echo_over_grpc(bridge: BridgeServer) -> int:
    with grpcclient.InferenceServerClient(bridge.grpc_url) as client:
        result = client.infer("echo", [int32_input([7], "IN")], client_timeout=3 * LIMIT_S)
    return int(result.as_numpy("OUT")[0])


def _echo_over_http(bridge: BridgeServer) -> int:
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [7]}]}
    url = f"http://{bridge.http_url}/v2/models/echo/infer"
    answer = httpx.post(url, json=body, timeout=3 * LIMIT_S)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["outputs"][0]["data"][0])


def _limit_memory(process: BridgeServer) -> None:
    """An address-space limit on a started server: a regression fails instead of swapping."""
    assert process.process is not None
    pid = process.process.pid
    limit = _status_bytes(pid, "VmSize") + ADDRESS_SPACE_HEADROOM
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


def _peaks(*processes: BridgeServer) -> list[int]:
    """Each process's peak RSS so far."""
    peaks = []
    for process in processes:
        assert process.process is not None and process.running, f"{process.program} died"
        peaks.append(_status_bytes(process.process.pid, "VmHWM"))
    return peaks


def _check_after_leave(
    door: BridgeServer, report: Path, peaks_before: list[int], other, *more: BridgeServer
) -> None:
    """The checks once the client has gone (module docstring); `more`: the other processes
    whose memory counts (a worker behind the door)."""
    assert other(door) == 7
    seen_then = _report(report)
    assert seen_then is None or seen_then["cancelled"], (
        f"another model was answered only after the flooding one stopped by itself: {seen_then}"
    )
    seen = wait_until(lambda: _report(report), "the model's report", timeout=LIMIT_S + WAIT_S)
    assert seen["cancelled"] and not seen["self_stopped"], seen
    processes = (door, *more)
    for process, before, after in zip(processes, peaks_before, _peaks(*processes), strict=True):
        growth = after - before
        assert growth < RSS_GROWTH_BOUND, f"{process.program}: peak RSS grew by {growth >> 20} MB"


def _read_three_then_leave(door: BridgeServer, model: str, report: Path) -> None:
    """generate_stream: read three events, stop reading for a while, close the connection."""
    url = f"http://{door.http_url}/v2/models/{model}/generate_stream"
    body = {"IN": 0, "parameters": {"report": str(report), "limit_s": LIMIT_S}}
    with httpx.Client(timeout=WAIT_S) as client:
        with client.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            events = (line for line in response.iter_lines() if line.startswith("data: "))
            first = [json.loads(line[6:]) for line in itertools.islice(events, 3)]
            assert len(first) == 3 and len(first[0]["OUT"]) == 1024
            time.sleep(STALL_S)  # a slow client (module docstring)
        # Leaving the block closes the connection with the rest unread.


@MODELS
def test_sse_client_that_goes_away_cancels_the_model(server, model, tmp_path) -> None:
    peaks_before = _peaks(server)
    report = tmp_path / "report.json"
    _read_three_then_leave(server, model, report)
    _check_after_leave(server, report, peaks_before, _echo_over_grpc)


@MODELS
def test_grpc_stream_cancelled_mid_flood_cancels_the_model(server, model, tmp_path) -> None:
    peaks_before = _peaks(server)
    report = tmp_path / "report.json"
    received = 0
    three = threading.Event()
    reading = threading.Event()  # the client's reader thread is held until this is set

    def callback(result: object, error: object) -> None:
        nonlocal received
        received += 1
        if received >= 3:  # from the third response on, the client does not read
            three.set()
            reading.wait(WAIT_S)

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback)
        parameters = {"report": str(report), "limit_s": LIMIT_S}
        client.async_stream_infer(model, [int32_input([0], "IN")], parameters=parameters)
        assert three.wait(WAIT_S), "no responses"
        time.sleep(STALL_S)  # a slow client (module docstring)
        reading.set()
        client.stop_stream(cancel_requests=True)
    finally:
        reading.set()
        client.close()
    _check_after_leave(server, report, peaks_before, _echo_over_http)


# A gRPC client in its own process that reads three responses, stops reading, then exits
# without closing anything: the kernel closes its connection (a client that vanishes).
_VANISHING_CLIENT = """
import os, sys, threading, time
import numpy as np
import tritonclient.grpc as grpcclient
url, model, report, limit_s, stall_s = sys.argv[1:]
three = threading.Event()
count = [0]
def callback(result, error):
    count[0] += 1
    if count[0] >= 3:
        three.set()
        time.sleep(3600)  # the reader thread stops reading
client = grpcclient.InferenceServerClient(url)
client.start_stream(callback)
tensor = grpcclient.InferInput("IN", [1], "INT32")
tensor.set_data_from_numpy(np.array([0], dtype=np.int32))
client.async_stream_infer(
    model, [tensor], parameters={"report": report, "limit_s": int(limit_s)}
)
if not three.wait(30):
    os._exit(3)
time.sleep(float(stall_s))
os._exit(0)
"""


@MODELS
def test_grpc_client_that_vanishes_mid_flood_cancels_the_model(server, model, tmp_path) -> None:
    peaks_before = _peaks(server)
    report = tmp_path / "report.json"
    arguments = [server.grpc_url, model, str(report), str(LIMIT_S), str(STALL_S)]
    client = subprocess.run(
        [sys.executable, "-c", _VANISHING_CLIENT, *arguments], timeout=WAIT_S + STALL_S
    )
    assert client.returncode == 0, "the client got no responses"
    _check_after_leave(server, report, peaks_before, _echo_over_http)


def test_sse_through_the_request_plane_cancels_the_model_in_its_worker(tmp_path) -> None:
    """The door in another process than the worker (RequestPlaneRoute): the client's leave
    crosses Dynamo's request plane as the request's cancellation, and neither process piles
    up the responses the client does not read."""
    cluster = Cluster(tmp_path / "cluster")
    worker = cluster.worker(materialize(FLOOD, tmp_path))
    door = cluster.frontend("--frontend=triton")
    try:
        start_all([worker, door])
        door.wait_model_ready("flood")
        for process in (worker, door):
            _limit_memory(process)
        peaks_before = _peaks(door, worker)
        report = tmp_path / "report.json"
        _read_three_then_leave(door, "flood", report)
        _check_after_leave(door, report, peaks_before, _echo_over_grpc, worker)
    finally:
        cluster.stop()
