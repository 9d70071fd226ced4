"""HTTP infer requests held by a slow model (issue 37): they leave the event loop, other models
and the gRPC wire free; a shutdown lets them finish (Triton's drain); one stuck in the model does
not hold the exit past `--exit-timeout-secs`. Ordered by events (gate files, the
pending-request gauge), never by time.
"""

from __future__ import annotations

import signal
import subprocess
from concurrent import futures
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from tests.e2e.metrics_support import scrape, value
from tests.e2e.support import WAIT_S, Gate, held_and_fast, wait_until

HELD = 12  # requests held on the gate at once


def _body(number: int, parameters: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [number]}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def _infer(url: str, model: str, number: int, parameters: dict[str, str] | None = None) -> Any:
    """One request on a connection of its own: (status, OUT or the error's text)."""
    with httpx.Client(base_url=f"http://{url}", timeout=WAIT_S * 4) as client:
        response = client.post(f"/v2/models/{model}/infer", json=_body(number, parameters))
    if response.status_code != 200:
        return response.status_code, response.text
    return 200, response.json()["outputs"][0]["data"][0]


def _pending(server: Any) -> float | None:
    return value(
        scrape(server.metrics_port), "nv_inference_pending_request_count", model="held", version="1"
    )


def _hold(server: Any, gate: Gate, pool: futures.Executor) -> list[futures.Future]:
    """HELD requests to `held`: one runs, the others wait in its queue."""
    calls = [
        pool.submit(_infer, server.http_url, "held", i, gate.params(f"h{i}")) for i in range(HELD)
    ]

    def all_submitted() -> bool:
        running = sum(gate.started(f"h{i}") for i in range(HELD))
        return running == 1 and _pending(server) == HELD - 1

    wait_until(all_submitted, "the held requests in the model's queue")
    return calls


def _serve(bridge_server: Any, tmp_path: Path, *args: str) -> tuple[Any, Gate]:
    server = bridge_server(held_and_fast(tmp_path / "repo"), *args)
    server.wait_model_ready("held")
    server.wait_model_ready("fast")
    gates = tmp_path / "gates"
    gates.mkdir()
    return server, Gate(gates)


def test_requests_held_by_a_slow_model_leave_room_for_the_rest(bridge_server, tmp_path):
    server, gate = _serve(bridge_server, tmp_path)
    with futures.ThreadPoolExecutor(HELD) as pool:
        calls = _hold(server, gate, pool)
        try:
            # Meanwhile another model over HTTP, the health routes and the gRPC wire answer.
            for number in range(20):
                assert _infer(server.http_url, "fast", number) == (200, number + 1)
            with httpx.Client(base_url=f"http://{server.http_url}", timeout=WAIT_S) as client:
                assert client.get("/v2/health/ready").status_code == 200
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([7], np.int32))
            assert grpc.infer("fast", [tensor]).as_numpy("OUT").tolist() == [8]
            assert not any(call.done() for call in calls)
        finally:
            gate.open()
        assert [call.result() for call in calls] == [(200, i + 1) for i in range(HELD)]


def test_a_shutdown_lets_held_requests_finish(bridge_server, tmp_path):
    """SIGTERM while requests wait for the model: they are answered, and the process exits 0
    (Triton's drain; tests/e2e/test_shutdown.py for gRPC)."""
    server, gate = _serve(bridge_server, tmp_path)
    with futures.ThreadPoolExecutor(HELD) as pool:
        calls = _hold(server, gate, pool)
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "Server exiting" in server.log_text or _exiting(server), "the drain")
        assert not any(call.done() for call in calls)
        gate.open()
        assert [call.result() for call in calls] == [(200, i + 1) for i in range(HELD)]
    assert server.process.wait(WAIT_S) == 0


def _exiting(server: Any) -> bool:
    try:
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=WAIT_S) as client:
            return client.get("/v2/health/ready").status_code != 200
    except httpx.TransportError:
        return True


def test_a_request_stuck_in_the_model_does_not_hold_the_exit(bridge_server, tmp_path):
    """A request whose model never answers: past `--exit-timeout-secs` the process still
    exits (1: a model was still running)."""
    server, gate = _serve(bridge_server, tmp_path, "--exit-timeout-secs=2")
    with futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(_infer, server.http_url, "held", 0, gate.params("stuck"))
        wait_until(lambda: gate.started("stuck"), "execute to be stuck")
        server.process.send_signal(signal.SIGTERM)
        try:
            code = server.process.wait(2 + WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running past the exit timeout:\n{server.log_tail()}"
            ) from None
        finally:
            gate.open()  # the model's thread may end now; the process is gone either way
        assert code == 1
        call.exception(WAIT_S)  # the client's connection ended with the process
