"""Dynamo's own standalone frontend (`python -m dynamo.frontend --kserve-grpc-server`) in front
of an unchanged `dynamo-bridge --role worker`, with file and etcd discovery (issue 23).

`ai-dynamo` (the package of `dynamo.frontend`) cannot be installed with its dependencies here:
1.6.1 requires `aisimulate`, a placeholder on PyPI. Installed with `--no-deps` into a folder of
its own, beside the product's environment (which has ai-dynamo-runtime 1.6.1), it needs only
`pyyaml` and `msgspec` to serve KServe gRPC. scripts/test.sh installs it into `.dynamo-frontend/`
of the checkout; when that is missing this module installs it there itself. Without a package
index the test fails under CI=true and is skipped elsewhere, as the other external services.

The traps a user meets, each exercised here: the frontend's gRPC port is its `--http-port`;
its discovery backend defaults to etcd while a worker's defaults to file; its namespace must be
the workers' (`dynamo_bridge` unless set); and it gets no thread default from the bridge (set
DYN_RUNTIME_MAX_BLOCKING_THREADS, docs/deployment.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.support import SERVING, fp32_input, wait_until
from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.cluster import Cluster
from tests.harness.oracle import in_ci
from tests.harness.ports import LOCALHOST, free_ports
from tests.harness.process import stop_process_group
from tests.harness.services import EtcdServer, require_service

FRONTEND_PACKAGES = ("ai-dynamo==1.6.1", "pyyaml", "msgspec")
FRONTEND_PATH = Path(
    os.environ.get("DYNAMO_BRIDGE_FRONTEND_PATH", PROJECT_ROOT / ".dynamo-frontend")
)
UP_S = 60.0  # "comes up at all", not a timing
INSTALL_S = 600.0


@pytest.fixture(scope="module")
def frontend_path() -> Path:
    """A folder holding `dynamo.frontend` (ai-dynamo --no-deps) and its two small needs."""
    if not (FRONTEND_PATH / "dynamo" / "frontend").is_dir():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(FRONTEND_PATH), *FRONTEND_PACKAGES],
            capture_output=True, text=True, timeout=INSTALL_S,
        )  # fmt: skip
        if done.returncode != 0:
            reason = f"cannot install {' '.join(FRONTEND_PACKAGES)}: {done.stderr[-2000:]}"
            if in_ci():
                pytest.fail(reason)
            pytest.skip(reason)
    return FRONTEND_PATH


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    require_service("etcd")
    root = tmp_path_factory.mktemp("services")
    with EtcdServer(root / "etcd") as etcd:
        yield etcd


class StandaloneFrontend:
    """`python -m dynamo.frontend --kserve-grpc-server` for one cluster's namespace."""

    def __init__(self, cluster: Cluster, frontend_path: Path, log: Path) -> None:
        self.grpc_port, metrics_port = free_ports(2)
        environ = dict(os.environ)
        environ.update(cluster.environ())
        environ["PYTHONPATH"] = os.pathsep.join([str(frontend_path), str(PROJECT_ROOT)])
        environ["DYN_LOG"] = "warn"
        environ["DYN_RUNTIME_MAX_BLOCKING_THREADS"] = "16"  # docs/deployment.md
        command = [
            sys.executable, "-m", "dynamo.frontend", "--kserve-grpc-server",
            "--http-port", str(self.grpc_port),  # the gRPC port, with --kserve-grpc-server
            "--http-host", LOCALHOST,
            "--grpc-metrics-port", str(metrics_port),
            "--namespace", cluster.namespace,
            "--discovery-backend", cluster.discovery,  # its default is etcd
            "--request-plane", cluster.request_plane,
        ]  # fmt: skip
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environ,
                start_new_session=True,
            )
        self.client = grpcclient.InferenceServerClient(f"{LOCALHOST}:{self.grpc_port}")

    def model_ready(self, name: str) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"dynamo.frontend exited:\n{self.log.read_text()[-3000:]}")
        try:
            return self.client.is_model_ready(name)
        except Exception:
            return False

    def stop(self) -> int:
        self.client.close()
        return stop_process_group(self.process, 15.0)


@pytest.mark.parametrize("discovery", ["file", "etcd"])
def test_dynamo_s_standalone_frontend_serves_bridge_workers(
    discovery: str, frontend_path: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    etcd = request.getfixturevalue("services") if discovery == "etcd" else None
    cluster = Cluster(
        tmp_path / "cluster",
        discovery=discovery,
        etcd_endpoint=etcd.endpoint if etcd is not None else None,
    )
    frontend: StandaloneFrontend | None = None
    try:
        worker = cluster.worker(SERVING, "--model-control-mode=none").start()
        frontend = StandaloneFrontend(cluster, frontend_path, tmp_path / "frontend.log")
        wait_until(lambda: frontend.model_ready("echo"), "dynamo.frontend serving echo", UP_S)
        result = frontend.client.infer("echo", [fp32_input([1.0, 2.0, 3.0])], request_id="sa-1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2, 3], np.float32))
        config = frontend.client.get_model_config("echo", as_json=True)["config"]
        assert config["name"] == "echo" and config["input"][0]["name"] == "INPUT0"
        # The worker's SIGTERM withdraws its models from the frontend.
        worker.terminate()
        assert worker.wait_exit(UP_S) == 0
        wait_until(lambda: not frontend.model_ready("echo"), "echo gone from the frontend", UP_S)
    finally:
        if frontend is not None:
            frontend.stop()
        cluster.stop()
