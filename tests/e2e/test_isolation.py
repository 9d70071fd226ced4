"""One model's slowness or failure never holds up or breaks another model or the server.

Ordering, not timing: the `pool` model is held inside execute (tests/e2e/support.Gate) while
other requests run; they must come back while it is still held.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import SERVING, BackgroundInfer, Gate, fp32_input, wait_until


@pytest.fixture
def server(shared_bridge_server):
    return shared_bridge_server(SERVING)


def assert_echo_works(client, values=(1.0, 2.0)) -> None:
    result = client.infer("echo", [fp32_input(list(values))])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array(values, np.float32))


def test_slow_model_does_not_delay_other_models(server, tmp_path) -> None:
    client = server.client()
    gate = Gate(tmp_path)
    slow = BackgroundInfer(client, "pool", [fp32_input([9.0])], parameters=gate.params("slow"))
    try:
        wait_until(lambda: gate.started("slow"), "the slow request to start executing")
        for i in range(3):
            assert_echo_works(client, (float(i),))
            client.infer("chatty", [fp32_input([1.0])])
        assert not slow.done(), "the slow request finished before it was released"
    finally:
        gate.open()
    np.testing.assert_array_equal(slow.result().as_numpy("OUTPUT0"), np.array([9], np.float32))


def test_slow_request_does_not_block_the_other_instance(server, tmp_path) -> None:
    # pool has two instances: with one held, the other still answers requests.
    client = server.client()
    gate = Gate(tmp_path)
    slow = BackgroundInfer(client, "pool", [fp32_input([1.0])], parameters=gate.params("slow"))
    try:
        wait_until(lambda: gate.started("slow"), "the slow request to start executing")
        fast = client.infer("pool", [fp32_input([2.0])])
        assert fast.as_numpy("INSTANCE")[0].decode() != gate.instance_of("slow")
        assert not slow.done()
    finally:
        gate.open()
    slow.result()


def test_exception_in_execute_fails_only_that_request(server) -> None:
    client = server.client()
    with pytest.raises(InferenceServerException) as info:
        client.infer("flaky", [fp32_input([1.0, -1.0])])
    message = info.value.message()
    # Triton's text for an exception raised by execute [V] (spec §2.4, §2.9).
    assert "Failed to process the request(s) for model 'flaky_0', message: " in message
    assert "ValueError: flaky refuses negative values: [1.0, -1.0]" in message
    # The same model and the others keep working; the server stays up.
    result = client.infer("flaky", [fp32_input([1.0, 2.0])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2], np.float32))
    assert_echo_works(client)
    assert client.is_server_live()
    assert client.is_model_ready("flaky")


def test_failing_requests_do_not_disturb_one_in_flight(server, tmp_path) -> None:
    client = server.client()
    gate = Gate(tmp_path)
    held = BackgroundInfer(client, "pool", [fp32_input([5.0])], parameters=gate.params("held"))
    try:
        wait_until(lambda: gate.started("held"), "the held request to start executing")
        for _ in range(3):
            with pytest.raises(InferenceServerException, match="flaky refuses"):
                client.infer("flaky", [fp32_input([-2.0])])
        # An unknown model and a malformed request are refused without harm either.
        with pytest.raises(InferenceServerException):
            client.infer("no_such_model", [fp32_input([1.0])])
        with pytest.raises(InferenceServerException):
            client.infer("echo", [fp32_input([1.0], name="WRONG")])
        assert not held.done()
    finally:
        gate.open()
    np.testing.assert_array_equal(held.result().as_numpy("OUTPUT0"), np.array([5], np.float32))
    assert_echo_works(client)


def test_server_keeps_serving_after_many_errors(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        calls = [BackgroundInfer(client, "flaky", [fp32_input([-float(i) - 1])]) for i in range(8)]
        for call in calls:
            with pytest.raises(InferenceServerException, match="flaky refuses"):
                call.result()
        assert client.is_server_live() and client.is_server_ready()
        assert_echo_works(client)
    finally:
        client.close()
