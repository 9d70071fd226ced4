"""SIGTERM / SIGINT: in-flight requests finish, every instance's finalize() runs, exit code 0;
a model stuck in execute delays the exit by at most --exit-timeout-secs; a second signal exits
at once."""

from __future__ import annotations

import signal
import subprocess

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.metrics_support import scrape, value
from tests.e2e.support import (
    REPOSITORIES,
    SERVING,
    WAIT_S,
    BackgroundInfer,
    Gate,
    fp32_input,
    wait_until,
)

# Every instance of the models in e2e_serving that leave a marker in finalize(), named as Triton
# names instances: `<model>_0` for the default group, `<model>_0_<k>` for `count: 2`.
FINALIZED = {"echo_0.finalized", "pool_0_0.finalized", "pool_0_1.finalized"}

PENDING = "nv_inference_pending_request_count"

# `hang` waits in execute, with no bound, for a gate file these tests never write.
LIFECYCLE = REPOSITORIES / "lifecycle"

SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGINT, id="SIGINT")]


@pytest.fixture
def markers(tmp_path):
    folder = tmp_path / "markers"
    folder.mkdir()
    return folder


def wait_for_exit(server) -> int:
    try:
        return server.process.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"bridge still running after the signal:\n{server.log_tail()}"
        ) from None


@pytest.mark.parametrize("signum", SIGNALS)
def test_idle_server_stops_cleanly(bridge_server, markers, signum) -> None:
    server = bridge_server(SERVING, env={"E2E_MARKER_DIR": str(markers)})
    server.process.send_signal(signum)
    assert wait_for_exit(server) == 0
    assert {p.name for p in markers.iterdir()} == FINALIZED
    assert "chatty-finalize-info" in server.log_text  # pb_utils.Logger works in finalize()


def shutdown_started(client) -> bool:
    # Triton reports the server not ready (or refuses health checks) once shutdown has begun.
    try:
        return not client.is_server_ready()
    except InferenceServerException:
        return True


@pytest.mark.parametrize("signum", SIGNALS)
def test_in_flight_requests_finish(bridge_server, markers, tmp_path, signum) -> None:
    # Seen on Triton 2.51 with the same repository: after SIGTERM the two executing requests
    # and the one queued behind them all succeed, every finalize() runs, exit code 0.
    server = bridge_server(SERVING, env={"E2E_MARKER_DIR": str(markers)})
    client = server.client()
    gate = Gate(tmp_path)
    tags = ["r0", "r1", "r2"]  # two run (one per instance), one waits in the queue
    calls = [
        BackgroundInfer(client, "pool", [fp32_input([float(i)])], parameters=gate.params(tag))
        for i, tag in enumerate(tags)
    ]
    wait_until(lambda: sum(map(gate.started, tags)) == 2, "both instances to be busy")
    # The third is queued in the server, not still on its way (a request arriving after the
    # signal is refused, as Triton refuses it).
    wait_until(
        lambda: value(scrape(server.metrics_port), PENDING, model="pool", version="1") == 1,
        "the third request to wait in the queue",
    )

    server.process.send_signal(signum)
    wait_until(lambda: shutdown_started(client), "the server to begin shutting down")
    assert not any(call.done() for call in calls)
    assert server.process.poll() is None
    # Other models may finalize already; pool's instances wait for their requests.
    assert not list(markers.glob("pool_*")), "finalize() ran before the requests finished"

    gate.open()
    for i, call in enumerate(calls):
        result = call.result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([i], np.float32))
    assert wait_for_exit(server) == 0
    assert {p.name for p in markers.iterdir()} == FINALIZED


def test_stop_after_failed_requests_still_finalizes(bridge_server, markers) -> None:
    server = bridge_server(SERVING, env={"E2E_MARKER_DIR": str(markers)})
    client = server.client()
    with pytest.raises(Exception, match="flaky refuses negative values"):
        client.infer("flaky", [fp32_input([-1.0])])
    server.process.send_signal(signal.SIGTERM)
    assert wait_for_exit(server) == 0
    assert {p.name for p in markers.iterdir()} == FINALIZED


def start_stuck(bridge_server, tmp_path, exit_timeout: float):
    """A bridge whose one thread instance is stuck in execute for good."""
    server = bridge_server(
        LIFECYCLE,
        "--model-control-mode=explicit",
        "--load-model=hang",
        f"--exit-timeout-secs={exit_timeout:g}",
    )
    started = tmp_path / "started"
    params = {"started": str(started), "gate": str(tmp_path / "never-written")}
    BackgroundInfer(server.client(), "hang", [fp32_input([1.0])], parameters=params)
    wait_until(started.exists, "execute to be stuck")
    return server


@pytest.mark.parametrize("signum", SIGNALS)
def test_stuck_execute_exits_after_the_exit_timeout(bridge_server, tmp_path, signum) -> None:
    exit_timeout = 2.0
    server = start_stuck(bridge_server, tmp_path, exit_timeout)
    server.process.send_signal(signum)
    try:
        # About exit_timeout plus stopping the runtime; the bound only catches "never".
        code = server.process.wait(exit_timeout + WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running past the exit timeout:\n{server.log_tail()}") from None
    assert code == 1  # not a clean stop: a model was still running
    assert "exit timeout expired" in server.log_text


def test_second_signal_exits_at_once(bridge_server, tmp_path) -> None:
    server = start_stuck(bridge_server, tmp_path, exit_timeout=600)
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "shutting down" in server.log_text, "shutdown to begin")
    server.process.send_signal(signal.SIGTERM)
    # Far inside the 600 s exit timeout: the second signal did it.
    code = wait_for_exit(server)
    assert code == 1
    assert "second signal" in server.log_text
