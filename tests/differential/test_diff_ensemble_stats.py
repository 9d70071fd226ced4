"""ModelStatistics of ensembles, against Triton 2.51 (the triton door only).

A Triton and a door of their own on tests/repositories/composition (so the counts start at
zero), the same requests on both, then every count compared (durations are each server's own):
successes (a nested ensemble counts its inner ensemble's run too), a step's failure, and a
request refused before the run (not counted by Triton), and a failure that Triton counts
twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.differential.support import REPOSITORIES, TRITON_DOOR
from tests.e2e.support import wait_until

pytestmark = [
    pytest.mark.oracle,
    pytest.mark.skipif(not TRITON_DOOR, reason="Dynamo's frontend: no ModelStatistics"),
]

REPO = REPOSITORIES / "composition"
ENSEMBLES = ("pipeline", "nested", "raising_ens")


@pytest.fixture(scope="module")
def clients(oracle_server, shared_bridge_server) -> list[grpcclient.InferenceServerClient]:
    # Extra flags that change nothing but make these servers the module's own (fresh counts).
    oracle = oracle_server(REPO, "--exit-on-error=false", "--log-warning=true", wait_for="live")
    bridge = shared_bridge_server(REPO, "--frontend", "triton", "--log-format", "default")
    clients = [oracle.client(), bridge.client()]
    for client in clients:
        wait_until(lambda c=client: all(c.is_model_ready(m) for m in ENSEMBLES), "ensembles")
    return clients


def fp32(name: str, count: int = 4) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [count], "FP32")
    tensor.set_data_from_numpy(np.arange(count, dtype=np.float32))
    return tensor


def counts(client: grpcclient.InferenceServerClient, model: str) -> dict[str, Any]:
    """The statistics of `model` without durations and times (which are each server's own)."""
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"]
    assert len(stats) == 1, stats
    row = stats[0]
    return {
        "version": row["version"],
        "has_last_inference": int(row.get("last_inference", 0)) > 0,
        "inference_count": row.get("inference_count", "0"),
        "execution_count": row.get("execution_count", "0"),
        "inference_stats": {k: v.get("count", "0") for k, v in row["inference_stats"].items()},
        "batch_stats": [
            (b["batch_size"], {k: v.get("count") for k, v in b.items() if k != "batch_size"})
            for b in row.get("batch_stats", ())
        ],
    }


def run(client: grpcclient.InferenceServerClient) -> None:
    nested_input = client.get_model_config("nested", as_json=True)["config"]["input"][0]["name"]
    for _ in range(3):
        client.infer("pipeline", [fp32("RAW")])
    for _ in range(2):
        client.infer("nested", [fp32(nested_input)])
    for inputs in (("raising_ens", [fp32("X")]), ("pipeline", [fp32("RAW", 3)])):
        with pytest.raises(InferenceServerException):  # a step raises; a refused shape
            client.infer(*inputs)


def test_ensemble_statistics_as_triton(clients):
    before = [{m: counts(c, m) for m in ENSEMBLES} for c in clients]
    assert before[1] == before[0]  # listed, all zero
    for client in clients:
        run(client)
    # Triton records a request's statistics a moment after answering it: wait for the counts
    # to agree, then say what differs if they never do.
    for model in ENSEMBLES:
        try:
            wait_until(lambda m=model: counts(clients[1], m) == counts(clients[0], m), model, 10)
        except AssertionError:
            assert counts(clients[1], model) == counts(clients[0], model), model
