"""The response cache and header forwarding with a separate frontend (`--role frontend
--frontend triton`) in front of two `--role worker` processes (file discovery, tcp).

The cache is per worker (docs/deployment.md): the same request misses once in each worker it
reaches, then hits there; the door's statistics sum the workers'. Forwarded headers are added by
the frontend and reach the model in the worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format

from tests.e2e.support import REPOSITORIES
from tests.harness.cluster import Cluster, start_all

CACHE = "--cache-config=local,size=1048576"
REQUESTS = 8


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path / "cluster")
    yield made
    made.stop()


def _input() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array([6.0, 7.0], dtype=np.float32))
    return [tensor]


def test_a_cache_per_worker_and_headers_through_the_frontend(cluster: Cluster, repository) -> None:
    repositories = ("--model-repository", str(REPOSITORIES / "header_forward"))
    workers = [
        cluster.worker(repository("response_cache"), CACHE, *repositories, name=f"w{i}")
        for i in range(2)
    ]
    frontend = cluster.frontend(
        "--frontend", "triton", "--grpc-header-forward-pattern=^x-tenant"
    )  # fmt: skip
    start_all([*workers, frontend])
    frontend.wait_model_ready("cached", timeout=60)
    frontend.wait_model_ready("params", timeout=60)
    client = frontend.client()
    # Every answer was computed by its worker's first execution of this input, or cached there.
    runs = [
        int(client.infer("cached", _input()).as_numpy("EXECUTIONS")[0]) for _ in range(REQUESTS)
    ]
    assert runs == [1] * REQUESTS
    deadline = time.monotonic() + 10
    while True:
        response = client.get_inference_statistics("cached")
        (stats,) = json_format.MessageToDict(response)["modelStats"]
        inference = stats["inferenceStats"]
        hits = int(inference["cacheHit"].get("count", "0"))
        misses = int(inference["cacheMiss"].get("count", "0"))
        if hits + misses == REQUESTS or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert 1 <= misses <= len(workers), stats  # one per worker that was reached
    assert hits + misses == REQUESTS, stats
    assert int(stats.get("executionCount", "0")) == misses, stats

    result = client.infer("params", _one(), headers={"x-tenant-id": "acme"})
    assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"x-tenant-id": "acme"}


def _one() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return [tensor]
