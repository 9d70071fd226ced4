"""The response cache against Triton 2.51 (`--cache-config local,size=N`), on the triton door.

The repository's models count their own executions in an output (EXECUTIONS), so a client sees
whether `execute` ran: a hit repeats the count of the request that filled the cache. Compared:
those counts, ModelStatistics (hit and miss counts, what a hit leaves out), and the metric
families' names and series. Known differences, by design (model_repository_loader/
response_cache.py): the bridge's key also covers the requested outputs and the request parameters
a model reads (issue 38: one tenant's answer must not reach another; the last test names it),
and an unload or reload drops a model's entries.
"""

from __future__ import annotations

import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format

from tests.differential.http_support import DOOR_ARGS
from tests.differential.support import Pair
from tests.harness.oracle import find_oracle

pytestmark = pytest.mark.oracle

CACHE = "--cache-config=local,size=1048576"


@pytest.fixture(scope="module")
def pair(oracle_server, shared_bridge_server, repository) -> Pair:
    root = repository("response_cache")  # its models share `cached`'s model.py
    caches = find_oracle().backends_dir.parent / "caches"
    oracle = oracle_server(root, CACHE, f"--cache-directory={caches}")
    return Pair(oracle, shared_bridge_server(root, CACHE, *DOOR_ARGS), root)


def executions(client: grpcclient.InferenceServerClient, model: str, values: list, **kw) -> int:
    array = np.array(values, dtype=np.float32)
    if model == "cached_batched":
        array = array.reshape(1, -1)
    tensor = grpcclient.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    result = client.infer(model, [tensor], **kw)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array * 2)
    return int(result.as_numpy("EXECUTIONS").reshape(-1)[0])


def statistics(client: grpcclient.InferenceServerClient, model: str, requests: int) -> dict:
    """The model's statistics once `requests` requests are counted: Triton counts a request
    when it releases it, which may be after the client has its answer."""
    deadline = time.monotonic() + 10
    while True:
        response = client.get_inference_statistics(model)
        message = json_format.MessageToDict(response, preserving_proto_field_name=True)
        (stats,) = message["model_stats"]
        success = int(stats["inference_stats"]["success"].get("count", "0"))
        if success >= requests or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def counts(stats: dict) -> dict:
    """Every count of a model's statistics (durations differ between any two runs)."""
    inference = stats["inference_stats"]
    return {
        "inference_count": stats.get("inference_count", "0"),
        "execution_count": stats.get("execution_count", "0"),
        **{kind: inference[kind].get("count", "0") for kind in sorted(inference)},
        "batch_sizes": [b["batch_size"] for b in stats.get("batch_stats", [])],
    }


def test_hits_skip_execute_and_count_as_triton_counts_them(pair: Pair) -> None:
    seen = {}
    for name, server in pair.servers():
        client = server.client()
        seen[name] = {
            "cached": [
                executions(client, "cached", [1, 2, 3, 4]),
                executions(client, "cached", [1, 2, 3, 4]),  # a hit: execute does not run
                executions(client, "cached", [5]),
                # Parameters and the request id are not part of the key [V].
                executions(client, "cached", [5], parameters={"p": "b"}, request_id="r"),
            ],
            "uncached": [executions(client, "uncached", [1, 2, 3, 4]) for _ in range(2)],
            "stats": counts(statistics(client, "cached", 4)),
            "uncached_stats": counts(statistics(client, "uncached", 2)),
        }
    assert seen["triton"]["cached"] == [1, 1, 2, 2]
    assert seen["triton"]["uncached"] == [1, 2]
    assert seen["triton"]["stats"]["cache_hit"] == "2"
    assert seen["bridge"] == seen["triton"]


def test_a_hit_through_the_dynamic_batcher(pair: Pair) -> None:
    seen = {}
    for name, server in pair.servers():
        client = server.client()
        runs = [executions(client, "cached_batched", [3, 4]) for _ in range(3)]
        stats = statistics(client, "cached_batched", 3)
        seen[name] = (runs, counts(stats), int(stats["inference_stats"]["cache_hit"]["ns"]) > 0)
    assert seen["triton"][0] == [1, 1, 1]
    assert seen["bridge"] == seen["triton"]


def _families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (nv_cache\w*) (\w+)$", text, re.M))


def _series(text: str, family: str) -> list[str]:
    return sorted(re.findall(rf"^{family}(\{{[^}}]*\}}) ", text, re.M))


def test_cache_metrics_have_triton_names_and_series(pair: Pair) -> None:
    texts = {}
    for name, server in pair.servers():
        executions(server.client(), "cached", [42])
        with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
            texts[name] = reply.read().decode()
    assert _families(texts["bridge"]) == _families(texts["triton"])
    assert "nv_cache_num_hits_per_model" in _families(texts["triton"])
    for family in _families(texts["triton"]):
        if family.endswith("_per_model"):
            # Only the models whose config enables the cache have these series.
            assert _series(texts["bridge"], family) == _series(texts["triton"], family)


def test_an_ensemble_answers_from_the_cache_without_running_its_steps(pair: Pair) -> None:
    seen = {}
    for name, server in pair.servers():
        client = server.client()
        runs = [executions(client, "cached_ensemble", [8, 9]) for _ in range(3)]
        stats = counts(statistics(client, "cached_ensemble", 3))
        seen[name] = ([run - runs[0] for run in runs], stats)
    assert seen["triton"][0] == [0, 0, 0]  # one run of the step, then hits
    assert seen["triton"][1]["cache_hit"] == "2"
    assert seen["bridge"] == seen["triton"]


def test_request_parameters_key_apart_where_triton_shares_an_entry(pair: Pair) -> None:
    seen = {}
    for name, server in pair.servers():
        client = server.client()
        first = executions(client, "cached", [9], parameters={"tenant": "a"})
        second = executions(client, "cached", [9], parameters={"tenant": "b"})
        seen[name] = second - first
    # Triton answers tenant b from tenant a's entry [V]; the bridge runs the model for b.
    assert seen == {"triton": 0, "bridge": 1}
