"""A rolling restart through the triton door (issue 39, item 5): when the last worker serving a
model leaves discovery, clients get UNAVAILABLE, which Triton clients retry, for
`DYN_BRIDGE_DEPARTED_GRACE_SECS`, then Triton's NOT_FOUND; a worker back in time serves again.
A model that a worker still there unloads is NOT_FOUND at once, as in Triton.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.support import SERVING, WAIT_S, fp32_input, wait_until
from tests.harness.roles import Frontend, Worker

GRACE_S = 4.0


@pytest.fixture
def roles(tmp_path):
    """A frontend (the triton door) and a way to start workers, one DYN_FILE_KV; stopped after."""
    kv = tmp_path / "kv"
    kv.mkdir()
    env = {"DYN_FILE_KV": str(kv), "DYN_BRIDGE_DEPARTED_GRACE_SECS": str(GRACE_S)}
    started: list = []

    def worker(*args: str) -> Worker:
        process = Worker(SERVING, *args, env=env, log_path=tmp_path / f"worker{len(started)}.log")
        started.append(process)
        return process.start()

    frontend = Frontend(env=env, log_path=tmp_path / "frontend.log").start()
    started.append(frontend)
    yield frontend, worker
    for process in started:
        process.stop()


def _status(client, model: str = "echo") -> tuple[str, str]:
    try:
        client.infer(model, [fp32_input([1.0])])
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()
    return "ok", ""


def test_a_departed_model_is_unavailable_for_the_grace_then_not_found(roles) -> None:
    frontend, worker = roles
    first = worker()
    client = frontend.client()
    wait_until(lambda: client.is_model_ready("echo"), "the frontend to find the model")
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(WAIT_S) == 0
    wait_until(lambda: _status(client)[0] != "ok", "the worker to leave")
    assert _status(client) == (
        "StatusCode.UNAVAILABLE",
        "Request for unknown model: 'echo' version 1 is not at ready state",
    )
    # Past the grace: Triton's answer for a model nobody serves.
    wait_until(
        lambda: _status(client)[0] == "StatusCode.NOT_FOUND", "NOT_FOUND", timeout=GRACE_S + 20
    )
    assert _status(client)[1] == "Request for unknown model: 'echo' is not found"

    # A replacement serves again, and a later departure gets the grace again.
    second = worker()
    wait_until(lambda: _status(client)[0] == "ok", "the new worker to serve")
    result = client.infer("echo", [fp32_input([2.0])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([2.0], np.float32))
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(WAIT_S) == 0
    wait_until(lambda: _status(client)[0] != "ok", "the worker to leave")
    assert _status(client)[0] == "StatusCode.UNAVAILABLE"


def test_an_unload_by_a_worker_still_there_is_not_found_at_once(roles) -> None:
    frontend, worker = roles
    worker("--model-control-mode=explicit", "--load-model=echo")
    client = frontend.client()
    wait_until(lambda: client.is_model_ready("echo"), "the frontend to find the model")
    client.unload_model("echo")
    wait_until(lambda: _status(client)[0] != "ok", "the unload")
    assert _status(client)[0] == "StatusCode.NOT_FOUND"
