"""An ensemble whose first step is decoupled, streamed over gRPC (repositories/ensemble_stream).

As Triton's qa/L0_simple_ensemble `EnsembleBackpressureTest` (2.73) calls it: a plain
`start_stream` (no empty final responses asked for) and responses read until one says
`triton_final_response: true`. Triton puts that flag on the ensemble's last response; a bridge
that sent it on its own, flag-only, left such a client waiting for ever (issue 40, bug 1), so
every wait here is bounded.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.support import REPOSITORIES

REPO = REPOSITORIES / "ensemble_stream"
# The producer answers every 20 ms and the consumer takes 100 ms a request: a few seconds at most.
ANSWER_S = 10.0


@pytest.fixture(scope="module")
def server(shared_bridge_server):
    return shared_bridge_server(REPO)


class Stream:
    """One client, one stream, its answers in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, count: int) -> None:
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[count]], dtype=np.int32))
        self.client.async_stream_infer("decoupled_first", [tensor])

    def until_final(self) -> list[tuple[list[float], bool]]:
        """Each answer's OUT values and final flag, up to the one flagged final."""
        got: list[tuple[list[float], bool]] = []
        while True:
            try:
                result, error = self.answers.get(timeout=ANSWER_S)
            except queue.Empty:
                pytest.fail(f"no final response within {ANSWER_S} s after {got}")
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            got.append((result.as_numpy("OUT").flatten().tolist(), final))
            if final:
                return got

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


@pytest.fixture
def streams(server) -> Iterator[list[Stream]]:
    opened = [Stream(server.grpc_url) for _ in range(4)]
    yield opened
    for stream in opened:
        stream.close()


@pytest.mark.timeout(60)
def test_last_response_carries_the_final_flag(streams):
    stream = streams[0]
    stream.send(5)
    assert stream.until_final() == [([0.5], False)] * 4 + [([0.5], True)]
    with pytest.raises(queue.Empty):  # nothing after the final one
        stream.answers.get(timeout=0.5)


@pytest.mark.timeout(60)
def test_concurrent_streams_each_end(streams):
    for stream in streams:
        stream.send(3)
    for stream in streams:
        assert stream.until_final() == [([0.5], False)] * 2 + [([0.5], True)]
