"""Concurrent requests to a model with `instance_group [{ count: 2 }]` use both instances."""

from __future__ import annotations

import numpy as np

from tests.e2e.support import SERVING, BackgroundInfer, Gate, fp32_input, wait_until

# Triton's names for the two instances of `pool`'s single unnamed group.
POOL_INSTANCES = {"pool_0_0", "pool_0_1"}
REQUESTS = 4


def test_requests_spread_over_both_instances(shared_bridge_server, tmp_path) -> None:
    client = shared_bridge_server(SERVING).client()
    gate = Gate(tmp_path)
    tags = [f"r{i}" for i in range(REQUESTS)]
    calls = {
        tag: BackgroundInfer(client, "pool", [fp32_input([float(i)])], parameters=gate.params(tag))
        for i, tag in enumerate(tags)
    }
    try:
        # Both instances take a request and hold it; with one instance only one could start.
        def started() -> list[str]:
            return [t for t in tags if gate.started(t)]

        wait_until(lambda: len(started()) >= 2, "two requests executing at once")
        running = started()
        assert {gate.instance_of(t) for t in running} == POOL_INSTANCES
        # Each instance runs one request at a time (Triton's default scheduler).
        assert len(running) == 2
        assert not any(call.done() for call in calls.values())
    finally:
        gate.open()
    instances = set()
    for i, tag in enumerate(tags):
        result = calls[tag].result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([i], np.float32))
        instance = result.as_numpy("INSTANCE")[0].decode()
        assert instance == gate.instance_of(tag)
        instances.add(instance)
    assert instances == POOL_INSTANCES
