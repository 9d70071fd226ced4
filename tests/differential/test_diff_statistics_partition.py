"""A request's duration in ModelStatistics is made of its parts, as in Triton 2.51.

Triton's counters partition a request's time: queue, then compute input (up to the model's
`execute`), compute infer (`execute`), compute output (what it returned, sent back); the success
duration runs from the request's arrival to its release, after `execute` returned [V]. Issue 24
found `perf_analyzer` reporting a request of 62 us made of 28 us queue + 47 us compute, and
compute input and output always 0. Durations are each server's own; the shape is compared: the
parts sum to at most the whole, and none of them is empty.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import REPOSITORIES, TRITON_DOOR
from tests.e2e.support import wait_until

pytestmark = [
    pytest.mark.oracle,
    pytest.mark.skipif(not TRITON_DOOR, reason="Dynamo's frontend: no ModelStatistics"),
]

REPO = REPOSITORIES / "composition"
MODEL = "add_sub"
REQUESTS = 40
PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def _shape(client: grpcclient.InferenceServerClient) -> dict[str, object]:
    x = np.arange(4, dtype=np.float32)
    for _ in range(REQUESTS):
        inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        client.infer(MODEL, inputs)

    def counted() -> bool:
        stats = client.get_inference_statistics(MODEL).model_stats[0].inference_stats
        return stats.success.count == REQUESTS

    wait_until(counted, "the requests counted")  # the door answers before the worker records
    stats = client.get_inference_statistics(MODEL).model_stats[0].inference_stats
    parts = {name: getattr(stats, name) for name in PARTS}
    return {
        "counts": {name: part.count for name, part in parts.items()},
        "parts_within_the_whole": sum(part.ns for part in parts.values()) <= stats.success.ns,
        "empty_parts": sorted(name for name, part in parts.items() if part.ns == 0),
    }


def test_a_request_is_its_parts(oracle_server, shared_bridge_server) -> None:
    # Extra flags that change nothing but make these servers the module's own (fresh counts).
    oracle = oracle_server(REPO, "--exit-on-error=false", "--log-info=true", wait_for="live")
    bridge = shared_bridge_server(
        REPO, "--frontend", "triton", "--log-format", "default", "--log-verbose", "0"
    )
    triton, ours = (_shape(server.client()) for server in (oracle, bridge))
    assert triton == {
        "counts": dict.fromkeys(PARTS, REQUESTS),
        "parts_within_the_whole": True,
        "empty_parts": [],
    }
    assert ours == triton
