"""Self-test of the harness: ports, the oracle launcher, the bridge launcher, and the
repositories written whole from shared model code."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.harness import (
    BridgeServer,
    free_port,
    free_ports,
    oracle_unavailable_reason,
    require_oracle,
    wait_for_port,
)
from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.oracle import ORACLE_PYTHON_ENV
from tests.harness.repositories import REPOSITORIES, SAME_CODE, materialize, materialize_model

# A trivial model of our own: OUT = IN.
IDENTITY_CONFIG = """\
name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
IDENTITY_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""


def write_identity_repo(root: Path) -> Path:
    model = root / "identity"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (model / "1" / "model.py").write_text(IDENTITY_MODEL)
    return root


# -- ports ----------------------------------------------------------------------------------------


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_in_range() -> None:
    ports = free_ports(3, range(19390, 19400))
    assert len(set(ports)) == 3
    assert all(19390 <= p < 19400 for p in ports)


def test_wait_for_port_sees_a_listener() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        wait_for_port(sock.getsockname()[1], timeout=2)


def test_wait_for_port_times_out() -> None:
    with pytest.raises(TimeoutError):
        wait_for_port(free_port(), timeout=0.2)


def test_wait_for_port_notices_a_dead_server() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    with pytest.raises(RuntimeError, match="exited with code 0"):
        wait_for_port(free_port(), timeout=5, process=process)


# -- oracle availability --------------------------------------------------------------------------


def test_missing_oracle_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ORACLE_PYTHON_ENV, str(tmp_path / "no-venv" / "bin" / "python"))
    reason = oracle_unavailable_reason()
    assert reason is not None
    assert "no-venv" in reason and ORACLE_PYTHON_ENV in reason


def test_missing_oracle_fails_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ORACLE_PYTHON_ENV, str(tmp_path / "python"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="oracle is unavailable"):
        require_oracle()


def test_missing_oracle_skips_locally(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ORACLE_PYTHON_ENV, str(tmp_path / "python"))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="oracle is unavailable"):
        require_oracle()


# -- bridge launcher ------------------------------------------------------------------------------


def test_bridge_command_line(tmp_path: Path) -> None:
    server = BridgeServer(tmp_path, "--log-verbose", "1")
    server.grpc_port, server.metrics_port = 18001, 18002
    assert server.command() == [
        sys.executable,
        "-m",
        "bridge",
        "--model-repository",
        str(tmp_path),
        "--grpc-port",
        "18001",
        "--metrics-port",
        "18002",
        "--log-verbose",
        "1",
    ]
    environ = server.environ()
    assert environ["DYN_LOG"] == "warn"
    assert str(PROJECT_ROOT) in environ["PYTHONPATH"].split(":")


def test_bridge_that_dies_at_start_up_is_reported(tmp_path: Path) -> None:
    class Crashing(BridgeServer):
        def command(self) -> list[str]:
            return [sys.executable, "-c", "print('boom', flush=True); raise SystemExit(3)"]

    server = Crashing(tmp_path, startup_timeout=20, log_path=tmp_path / "bridge.log")
    with pytest.raises(RuntimeError, match="exited with code 3") as info:
        server.start()
    assert "boom" in str(info.value)
    assert server.returncode == 3
    assert "boom" in server.log_text


# -- the oracle itself ----------------------------------------------------------------------------


@pytest.mark.oracle
def test_oracle_serves_a_model_of_ours(oracle_server, tmp_path_factory) -> None:
    server = oracle_server(write_identity_repo(tmp_path_factory.mktemp("harness_repo")))
    client = server.client()
    assert client.is_server_ready()
    data = np.arange(3, dtype=np.float32)
    tensor = grpcclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    assert f"Started GRPCInferenceService at 127.0.0.1:{server.grpc_port}" in server.log_text


# -- repositories whose models share code --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAME_CODE))
def test_materialize_writes_each_shared_model_whole(name: str, tmp_path: Path) -> None:
    """A model named in SAME_CODE has only its config in tests/repositories, or no folder at all
    (its code lives once, in its template); the written copy holds the template's version
    folders beside its own config, or the template's whole folder."""
    root = materialize(name, tmp_path)
    for model, template_name in SAME_CODE[name].items():
        template = REPOSITORIES / (
            template_name if "/" in template_name else f"{name}/{template_name}"
        )
        source = REPOSITORIES / name / model
        config = source / "config.pbtxt" if source.exists() else template / "config.pbtxt"
        if source.exists():
            assert sorted(p.name for p in source.iterdir()) == ["config.pbtxt"]
        assert (root / model / "config.pbtxt").read_text() == config.read_text()
        versions = sorted(p.name for p in template.iterdir() if p.name.isdigit())
        assert (
            versions
            and sorted(p.name for p in (root / model).iterdir() if p.name.isdigit()) == versions
        )
        for version in versions:
            written = (root / model / version / "model.py").read_bytes()
            assert written == (template / version / "model.py").read_bytes()
        one = materialize_model(name, model, tmp_path / "one" / name)
        assert (one / versions[0] / "model.py").read_bytes() == (
            template / versions[0] / "model.py"
        ).read_bytes()
