"""Instance kinds through the bridge: threads in the server process, or one process each.

Repository: tests/repositories/isolation (written to tmp_path whole: `crash` writes a marker
file, and `thread_pids` runs `proc_pids`'s model.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import BackgroundInfer, fp32_input, int32_input, wait_until
from tests.harness.repositories import materialize


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return materialize("isolation", tmp_path)  # thread_pids runs proc_pids's model.py


def _pid_and_instance(result: grpcclient.InferResult) -> tuple[int, str]:
    return int(result.as_numpy("PID")[0]), result.as_numpy("INSTANCE")[0].decode()


def test_process_instances_run_outside_the_server(bridge_server, repo: Path):
    server = bridge_server(repo)
    client = server.client()
    # Two requests that keep their instance busy, sent together: each instance takes one.
    calls = [
        BackgroundInfer(
            client, "proc_pids", [fp32_input([1.0, 2.0], "X")], parameters={"busy_ms": 400}
        )
        for _ in range(2)
    ]
    answers = [_pid_and_instance(call.result()) for call in calls]
    pids = {pid for pid, _ in answers}
    assert server.process is not None and server.process.pid not in pids
    assert len(pids) == 2, answers
    assert {name for _, name in answers} == {"proc_pids_0_0", "proc_pids_0_1"}
    result = client.infer("proc_pids", [fp32_input([1.5, -2.0], "X")])
    np.testing.assert_array_equal(result.as_numpy("Y"), np.array([3.0, -4.0], np.float32))


def test_thread_instances_run_in_the_server(bridge_server, repo: Path):
    server = bridge_server(repo)
    result = server.client().infer("thread_pids", [fp32_input([1.0], "X")])
    assert server.process is not None
    assert _pid_and_instance(result)[0] == server.process.pid


def test_large_tensor_crosses_the_process_boundary(bridge_server, repo: Path):
    server = bridge_server(repo)
    values = np.random.default_rng(7).standard_normal(200_000).astype(np.float32)
    result = server.client().infer("proc_pids", [fp32_input(values.tolist(), "X")])
    np.testing.assert_array_equal(result.as_numpy("Y"), values * 2)


def test_killed_instance_fails_only_its_request_and_restarts(bridge_server, repo: Path):
    # `crash` writes a marker beside itself: no watching, or that write would reload it.
    server = bridge_server(repo, "--model-control-mode=none")
    client = server.client()
    first_pid = int(client.infer("crash", [int32_input([0], "MODE")]).as_numpy("PID")[0])

    crashing = BackgroundInfer(client, "crash", [int32_input([1], "MODE")])
    wait_until(lambda: (repo / "crash" / "dying").exists(), "the crashing request to run")
    # Queued behind the crashing request on the only instance: served by the new process.
    queued = BackgroundInfer(client, "crash", [int32_input([0], "MODE")])
    with pytest.raises(InferenceServerException) as failure:
        crashing.result()
    assert "Stub process 'crash_0_0' is not healthy." in failure.value.message()

    # The restarted instance takes 2 s to initialize: the model is not ready meanwhile.
    wait_until(lambda: not client.is_model_ready("crash"), "crash to report not ready")
    new_pid = int(queued.result().as_numpy("PID")[0])
    assert new_pid != first_pid
    wait_until(lambda: client.is_model_ready("crash"), "crash to be ready again")
    again = client.infer("crash", [int32_input([0], "MODE")])
    assert int(again.as_numpy("PID")[0]) == new_pid
    # Other models never noticed.
    assert client.is_model_ready("proc_pids")
    assert "is not healthy" not in str(client.infer("thread_pids", [fp32_input([1.0], "X")]))
