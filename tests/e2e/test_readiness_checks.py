"""Model and server readiness as Triton's newest release answers them (issue 40 item 4): a
model's own `is_ready()` (python_backend 26.03 on), a dead instance process (26.01 on) and
`--strict-readiness`, over HTTP and gRPC through the triton door.

The upstream qa folder (qa/L0_backend_python/model_readiness) finds the stub by its process name
and kills it; here the instance process is found as the server's child that runs
`model_repository_loader.isolation.child`. Triton restarts a dead stub only at the next request;
the bridge restarts it at once (after its backoff), so the model is NOT READY until it is back.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.e2e.support import wait_until
from tests.unit.test_model_readiness import lay_out

EXITED = "dies_0_0: instance process exited"
DEAD = "Model 'dies' version 1 is not ready: Stub process 'dies_0_0' is not healthy."


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    lay_out(root, "yes", "true", "thread")
    lay_out(root, "no", "false", "thread")
    lay_out(root, "raises", "exception", "thread")
    lay_out(root, "dies", "none", "process")
    return root


def instance_pids(server_pid: int) -> list[int]:
    """The server's instance processes (its children running the loader's child module)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == server_pid and b"model_repository_loader.isolation.child" in command:
            pids.append(int(entry.name))
    return pids


def both_ready(server, name: str) -> tuple[bool, bool]:
    http = httpclient.InferenceServerClient(server.http_url)
    return http.is_model_ready(name), server.client().is_model_ready(name)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_is_ready_and_a_dead_instance_decide_model_readiness(
    bridge_server, repo: Path, sig: signal.Signals
) -> None:
    server = bridge_server(repo, "--log-verbose=1")
    assert both_ready(server, "yes") == (True, True)
    assert both_ready(server, "no") == (False, False)
    assert both_ready(server, "raises") == (False, False)
    assert both_ready(server, "dies") == (True, True)
    log = server.log_text
    assert "Model 'no' version 1 is not ready: Model 'no_0_0' is not ready (user-defined " in log
    assert "Model 'raises' version 1 is not ready: RuntimeError: Internal check failed" in log

    (instance,) = instance_pids(server.process.pid)  # "dies" is the one process instance
    os.kill(instance, sig)
    wait_until(lambda: EXITED in server.log_text, "the server to see the process gone")
    # NOT READY on both wires, each check logged with Triton's text, until the restart.
    assert both_ready(server, "dies") == (False, False)
    assert server.log_text.count(DEAD) == 2
    wait_until(lambda: both_ready(server, "dies") == (True, True), "the instance back", 30)
    assert instance_pids(server.process.pid) != [instance]


def test_strict_readiness_asks_every_model(bridge_server, repo: Path) -> None:
    # "no" and "raises" are loaded but their is_ready() says no: the server is not ready.
    strict = bridge_server(repo)
    assert not httpclient.InferenceServerClient(strict.http_url).is_server_ready()
    assert not strict.client().is_server_ready()
    relaxed = bridge_server(repo, "--strict-readiness=false")
    assert httpclient.InferenceServerClient(relaxed.http_url).is_server_ready()
    assert relaxed.client().is_server_ready()
    assert both_ready(relaxed, "no") == (False, False)
