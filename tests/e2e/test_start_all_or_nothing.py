"""Start-up is all or nothing (issue 23): a process that cannot bind a port it needs exits with
status 1 and one line naming the flag and the value, no traceback, before it registers anything;
several `--role worker` processes on one host without explicit ports all serve.

Measured before the fix: three workers started without `--metrics-port` on one host, two died on
`address already in use` (a traceback from aiohttp) after registering their models, and the
frontend routed requests to the dead instances.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.cluster_support import file_discovery_env
from tests.e2e.metrics_support import scrape, value
from tests.e2e.support import SERVING, WAIT_S, fp32_input, wait_until
from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.ports import free_port, free_ports
from tests.harness.process import stop_process_group

# A "does not hang" bound for a start-up that must fail before loading anything.
FAIL_WITHIN_S = 30.0
METRICS_LINE = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")


class Bridge:
    """`python -m bridge ARGS` with its output in `log`, in its own process group."""

    def __init__(self, log: Path, env: dict[str, str], *args: str) -> None:
        environ = dict(os.environ)
        environ.update(env)
        environ.pop("DYN_BRIDGE_HTTP_PORT", None)
        environ.pop("DYN_BRIDGE_FRONTEND", None)
        environ["PYTHONPATH"] = os.pathsep.join(
            [str(PROJECT_ROOT)] + [p for p in environ.get("PYTHONPATH", "").split(":") if p]
        )
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bridge", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environ,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        return stop_process_group(self.process, WAIT_S)


@pytest.fixture
def bridges() -> Iterator[list[Bridge]]:
    started: list[Bridge] = []
    yield started
    for bridge in started:
        bridge.stop()


def held_port(address: str = "127.0.0.1") -> socket.socket:
    """A socket listening on a free port, as another program would hold it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen()
    return sock


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^E\d{4} ", line)]


@pytest.mark.parametrize("door", ["triton", "dynamo"])
@pytest.mark.parametrize("flag", ["--grpc-port", "--http-port", "--metrics-port", "--control-port"])
def test_a_port_in_use_fails_the_start_with_one_line(bridges, tmp_path, flag, door) -> None:
    if flag == "--http-port" and door == "dynamo":
        pytest.skip("Dynamo's frontend serves no HTTP port")
    with held_port() as sock:
        taken = sock.getsockname()[1]
        names = ("--grpc-port", "--http-port", "--metrics-port")
        ports = dict(zip(names, free_ports(3), strict=True))
        ports[flag] = taken  # --control-port is given only when it is the one taken
        args = [f"{name}={port}" for name, port in ports.items()]
        bridge = Bridge(
            tmp_path / "bridge.log",
            {},
            "--model-repository",
            str(SERVING),
            f"--frontend={door}",
            *args,
        )
        bridges.append(bridge)
        assert bridge.process.wait(FAIL_WITHIN_S) == 1
    text = bridge.text()
    assert error_lines(text) == [error_lines(text)[0]], text
    assert error_lines(text)[0].endswith(f"] {flag} {taken} is in use"), text
    assert "Traceback" not in text
    assert "+-------" not in text  # it stopped before loading any model


def test_a_worker_on_a_taken_port_registers_nothing(
    bridges, tmp_path, e2e_multi_a: Path, e2e_multi_b: Path
) -> None:
    """Two workers on one host (file discovery): the second is given the first's metrics port.
    It exits 1 with the one line, and nothing of its models is left in discovery."""
    kv = tmp_path / "kv"
    env = file_discovery_env(kv)
    metrics = free_port()
    first = Bridge(
        tmp_path / "first.log",
        env,
        "--role=worker",
        "--model-repository",
        str(e2e_multi_a),
        f"--metrics-port={metrics}",
    )
    bridges.append(first)
    wait_until(lambda: ready(metrics), "the first worker ready", WAIT_S)
    second = Bridge(
        tmp_path / "second.log",
        env,
        "--role=worker",
        "--model-repository",
        str(e2e_multi_b),
        f"--metrics-port={metrics}",
    )
    bridges.append(second)
    assert second.process.wait(FAIL_WITHIN_S) == 1
    text = second.text()
    assert [line.split("] ", 1)[1] for line in error_lines(text)] == [
        f"--metrics-port {metrics} is in use"
    ], text
    assert "Traceback" not in text
    time.sleep(1.0)  # anything it had written would be there by now
    entries = [p.relative_to(kv).as_posix() for p in kv.rglob("*") if p.is_file()]
    assert entries, "the first worker's registration is in the folder"
    assert not [e for e in entries if "beta" in e], entries  # e2e_multi_b's model
    assert ready(metrics)  # the first worker serves on


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def announced_metrics_port(bridge: Bridge) -> int | None:
    if bridge.process.poll() is not None:
        raise AssertionError(f"worker exited during start-up:\n{bridge.text()[-3000:]}")
    found = METRICS_LINE.search(bridge.text())
    return int(found.group(1)) if found else None


def test_three_workers_without_ports_share_a_host(bridges, tmp_path) -> None:
    env = file_discovery_env(tmp_path / "kv")
    workers = []
    for n in range(3):
        worker = Bridge(
            tmp_path / f"worker{n}.log",
            env,
            "--role=worker",
            "--model-repository",
            str(SERVING),
            "--model-control-mode=none",
        )
        bridges.append(worker)
        workers.append(worker)
    ports = []
    for worker in workers:
        wait_until(lambda w=worker: announced_metrics_port(w), "the metrics port announced", WAIT_S)
        port = announced_metrics_port(worker)
        assert port is not None and port != 8002
        wait_until(lambda p=port: ready(p), "the worker ready", WAIT_S)
        ports.append(port)
    assert len(set(ports)) == 3
    grpc_port, http_port, metrics_port = free_ports(3)
    frontend = Bridge(
        tmp_path / "frontend.log",
        env,
        "--role=frontend",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--metrics-port={metrics_port}",
    )
    bridges.append(frontend)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

    def model_ready() -> bool:
        try:
            return client.is_model_ready("echo")
        except Exception:
            return False

    wait_until(model_ready, "the frontend to find the workers' model", WAIT_S)

    def served_by_all() -> bool:
        result = client.infer("echo", [fp32_input([1.0, 2.0])])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2], np.float32))
        counts = [
            value(scrape(port), "nv_inference_request_success", model="echo", version="1")
            for port in ports
        ]
        return all(count for count in counts)

    wait_until(served_by_all, "every worker to have served a request", WAIT_S)
    for worker in workers:
        assert worker.stop() == 0
        assert not error_lines(worker.text()), worker.text()
