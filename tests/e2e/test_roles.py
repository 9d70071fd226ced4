"""Split roles: a `--role worker` and a `--role frontend` finding each other through file
discovery; the start-up error when etcd cannot be reached; a worker's health on Dynamo's system
status server (DYN_SYSTEM_PORT) following Triton's strict readiness.

The scale-out behaviours (replicas, SIGKILL/SIGTERM under load, etcd and NATS planes, reloads
through a separate frontend) are tests/e2e/test_scale_out.py's.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.reload_support import Traffic, control, copy_models, set_line
from tests.e2e.support import SERVING, WAIT_S, fp32_input, wait_until
from tests.harness import BridgeServer
from tests.harness.ports import free_port
from tests.harness.process import stop_process_group
from tests.harness.roles import SYSTEM_PORTS, Frontend, Worker, http_status


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


@pytest.fixture
def started(tmp_path):
    """Start servers; every one is stopped after the test."""
    servers: list[BridgeServer] = []

    def start(server: BridgeServer) -> BridgeServer:
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def file_kv(tmp_path) -> dict[str, str]:
    """The environment of every process of one "host": the same DYN_FILE_KV."""
    folder = tmp_path / "kv"
    folder.mkdir()
    return {"DYN_FILE_KV": str(folder)}


def test_worker_and_frontend_with_file_discovery(started, file_kv, tmp_path) -> None:
    # DYN_SYSTEM_PORT is a worker's: a frontend started with it does not serve it.
    system_port = free_port(SYSTEM_PORTS)
    frontend_env = {**file_kv, "DYN_SYSTEM_PORT": str(system_port), "DYN_SYSTEM_HOST": "127.0.0.1"}
    # Dynamo's door: its frontend metrics pass through the metrics port (the triton door's
    # split roles are tests/e2e/test_triton_door.py's).
    frontend = started(
        Frontend("--frontend", "dynamo", env=frontend_env, log_path=tmp_path / "frontend.log")
    )
    metrics = f"http://127.0.0.1:{frontend.metrics_port}"
    # Ready once its gRPC port is up, with no worker yet.
    wait_until(lambda: http_status(f"{metrics}/v2/health/ready") == 200, "the frontend ready")
    worker = started(Worker(SERVING, env=file_kv, log_path=tmp_path / "worker.log"))

    client = frontend.client()
    wait_until(lambda: client.is_model_ready("echo"), "the frontend to find the worker's model")
    result = client.infer("echo", [fp32_input([1.0, 2.0, 3.0])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2, 3], np.float32))
    # The worker counts what it served on its own metrics port; the frontend passes Dynamo's.
    worker_metrics = http_text(worker.metrics_url)
    assert 'nv_inference_request_success{model="echo",version="1"} 1' in worker_metrics
    assert "dynamo_frontend_requests_total" in http_text(f"{metrics}/metrics")
    assert "serving KServe gRPC" not in worker.log_text  # a worker serves no gRPC port
    assert http_status(f"http://127.0.0.1:{system_port}/health") is None

    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(WAIT_S) == 0
    # Withdrawn from discovery on the way out, not left for the discovery TTL.
    wait_until(lambda: not client.is_model_ready("echo"), "the model to leave the frontend")
    with pytest.raises(InferenceServerException):
        client.infer("echo", [fp32_input([1.0])])


def test_unreachable_etcd_is_a_start_up_error(tmp_path) -> None:
    # Dynamo itself retries for about 120 s in silence; the bridge says so and exits.
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    environ = Worker(SERVING).environ()
    environ["ETCD_ENDPOINTS"] = address
    command = [
        sys.executable,
        "-m",
        "bridge",
        "--role=worker",
        "--discovery-backend=etcd",
        "--model-repository",
        str(SERVING),
    ]
    began = time.monotonic()
    try:
        done = subprocess.run(
            command, env=environ, capture_output=True, text=True, timeout=WAIT_S, cwd=tmp_path
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("no start-up error: still waiting for etcd") from None
    assert done.returncode == 1, done.stderr
    assert f"cannot reach etcd at {address} (ETCD_ENDPOINTS)" in done.stderr
    assert "| Model" not in done.stdout  # refused before loading anything
    assert time.monotonic() - began < WAIT_S


@pytest.mark.parametrize("role", ["worker", "frontend"])
def test_an_address_other_hosts_cannot_reach_is_a_start_up_error(role: str, tmp_path) -> None:
    # etcd on another host (nothing listens there: the addresses are checked before it is
    # reached), and this process's address unset: Dynamo alone would advertise an interface it
    # picks itself, report READY, and fail every request sent to it (issue 39).
    environ = Worker(SERVING).environ()
    for variable in ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST"):
        environ.pop(variable, None)
    environ["ETCD_ENDPOINTS"] = "http://198.51.100.1:2379"
    command = [sys.executable, "-m", "bridge", f"--role={role}", "--discovery-backend=etcd"]
    if role == "worker":
        command += ["--model-repository", str(SERVING)]
    else:
        environ["DYN_TCP_RESPONSE_STREAM_HOST"] = "127.0.0.1"
    done = subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=WAIT_S, cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr  # one line
    if role == "worker":
        assert "DYN_TCP_RPC_HOST and DYN_TCP_RESPONSE_STREAM_HOST are not set" in errors[0]
    else:
        assert "DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 is a loopback address" in errors[0]
    assert "ETCD_ENDPOINTS=http://198.51.100.1:2379" in errors[0]
    assert "| Model" not in done.stdout  # refused before loading anything


def test_worker_health_on_the_system_port_is_strict(
    started, file_kv, tmp_path, e2e_load_failures: Path
) -> None:
    system_port, control_port = free_port(SYSTEM_PORTS), free_port()
    env = {**file_kv, "DYN_SYSTEM_PORT": str(system_port), "DYN_SYSTEM_HOST": "127.0.0.1"}
    worker = started(
        Worker(
            e2e_load_failures,
            "--model-control-mode=explicit",
            "--load-model=healthy",
            f"--control-port={control_port}",
            env=env,
            log_path=tmp_path / "worker.log",
        )
    )
    system = f"http://127.0.0.1:{system_port}"
    wait_until(lambda: http_status(f"{system}/health") == 200, "/health to say ready")
    # The worker's Triton metrics are appended to Dynamo's own on the system port.
    text = http_text(f"{system}/metrics")
    assert 'nv_inference_request_success{model="healthy",version="1"} 0' in text
    assert "dynamo_component" in text

    # A model that fails to load makes the worker not ready, as Triton's strict readiness.
    assert control(control_port, "/v2/repository/models/init_raises/load")[0] == 400
    wait_until(lambda: http_status(f"{system}/health") == 503, "/health to say not ready")
    assert http_status(f"{worker.metrics_url[: -len('/metrics')]}/v2/health/ready") == 400


def test_worker_not_healthy_while_a_start_up_model_failed(
    started, file_kv, tmp_path, e2e_load_failures: Path
) -> None:
    system_port = free_port(SYSTEM_PORTS)
    env = {**file_kv, "DYN_SYSTEM_PORT": str(system_port), "DYN_SYSTEM_HOST": "127.0.0.1"}
    # never ready (init_raises and others fail at start-up): started once it listens
    worker = started(
        Worker(e2e_load_failures, "--model-control-mode=none", env=env, ready_on="listening")
    )
    # The metrics port answers once the worker serves what loaded (its health then set).
    ready_url = f"{worker.metrics_url[: -len('/metrics')]}/v2/health/ready"
    assert http_status(ready_url) == 400
    assert http_status(f"http://127.0.0.1:{system_port}/health") == 503


def test_worker_stops_while_a_caller_routes_on_its_instance(started, file_kv, tmp_path) -> None:
    # A caller that routes on the endpoint's instances (cross-worker BLS does) keeps sending
    # after the model cards are gone: the worker withdraws its instances after a bounded wait,
    # and stops cleanly well inside --exit-timeout-secs.
    worker = started(
        Worker(
            SERVING,
            "--model-control-mode=none",
            "--exit-timeout-secs=20",
            env=file_kv,
            log_path=tmp_path / "worker.log",
        )
    )
    report = tmp_path / "calls"
    caller = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.roles_caller", "dynamo_bridge", "echo", str(report)],
        env={**worker.environ(), **file_kv},
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )
    try:
        wait_until(lambda: report.exists() and "ok" in report.read_text(), "the caller's calls")
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(WAIT_S) == 0, worker.log_tail()
    finally:
        stop_process_group(caller, timeout=5)


def test_hot_reload_in_a_worker_through_a_separate_frontend(started, file_kv, tmp_path) -> None:
    # The frontend in another process cannot be asked whether it sees the new generation: the
    # worker gives it a grace before withdrawing the old one (without it: NOT_FOUND, seen here).
    repo = copy_models(tmp_path, "marked")
    started(Worker(repo, "--reload-debounce-secs=0.2", env=file_kv, log_path=tmp_path / "w.log"))
    frontend = started(Frontend(env=file_kv, log_path=tmp_path / "frontend.log"))
    wait_until(lambda: frontend.client().is_model_ready("marked"), "the frontend to find it")
    traffic = [Traffic(frontend.grpc_url).start() for _ in range(4)]
    try:
        for mark in (1, 2, 3, 4):
            if mark > 1:
                set_line(repo / "marked" / "1" / "model.py", "MARK = ", f"MARK = {mark}")
            for t in traffic:
                wait_until(lambda t=t, m=mark: t.last_mark() == m, f"version {mark} answering")
    finally:
        for t in traffic:
            t.stop()
    for t in traffic:
        assert t.errors == []
        assert t.marks == sorted(t.marks)  # never back to an old version


def test_control_port_on_a_frontend_reaches_the_worker(started, file_kv, tmp_path) -> None:
    # `--control-port` is the HTTP wire's repository API over Dynamo: a `--role frontend`
    # process (Dynamo's KServe frontend, no repository RPCs) serves it for its workers.
    repo = copy_models(tmp_path, "plain")
    port = free_port()
    frontend = started(
        Frontend(f"--control-port={port}", env=file_kv, log_path=tmp_path / "frontend.log")
    )
    started(Worker(repo, "--model-control-mode=explicit", env=file_kv, log_path=tmp_path / "w.log"))
    wait_until(
        lambda: control(port, "/v2/repository/index") == (200, [{"name": "plain"}]),
        "the frontend's control port to list the worker's repository",
    )
    assert control(port, "/v2/repository/models/plain/load") == (200, None)
    client = frontend.client()
    wait_until(lambda: client.is_model_ready("plain"), "the loaded model to reach the frontend")
    assert client.infer("plain", [fp32_input([4.0])]).as_numpy("OUTPUT0").tolist() == [4.0]
    assert control(port, "/v2/repository/models/plain/unload") == (200, None)
    wait_until(lambda: not client.is_model_ready("plain"), "the unloaded model to leave")
