"""BLS and ensembles through the bridge (tests/repositories/composition), with tritonclient.

Expected values are Triton 2.51's for the same repository (its README); the differential tests
compare with a live Triton.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import REPOSITORIES, WAIT_S, fp32_input, int32_input

REPO = REPOSITORIES / "composition"
F = [1.0, 2.0, 3.0, 4.0]


@pytest.fixture(scope="module")
def server(shared_bridge_server):
    return shared_bridge_server(REPO)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def probe(client: Any, spec: dict[str, Any], model: str = "bls") -> Any:
    tensor = grpcclient.InferInput("SPEC", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(spec).encode()], dtype=object))
    result = client.infer(model, [tensor], client_timeout=WAIT_S)
    return json.loads(result.as_numpy("INFO")[0])


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_bls_call(client, model):
    spec = {"model": "add_sub", "inputs": [["INPUT0", "FP32", F], ["INPUT1", "FP32", F]]}
    assert probe(client, spec, model)["responses"] == [
        {
            "error": None,
            "outputs": {
                "OUTPUT0": ["float32", [4], [2.0, 4.0, 6.0, 8.0]],
                "OUTPUT1": ["float32", [4], [0.0, 0.0, 0.0, 0.0]],
            },
        }
    ]


def test_bls_error_inside_the_response(client):
    spec = {"model": "nope", "inputs": [["INPUT0", "FP32", F]]}
    assert probe(client, spec)["responses"] == [
        {
            "error": [
                1,
                "Model nope - Error when running inference: Failed for execute the inference "
                "request. Model 'nope' is not ready.",
            ],
            "outputs": {},
        }
    ]


def test_bls_decoupled_iteration(client):
    spec = {"model": "repeat_dec", "inputs": [["IN", "INT32", [3]]], "decoupled": True}
    outputs = [r["outputs"] for r in probe(client, spec, "bls_async")["responses"]]
    assert outputs == [{"OUT": ["int32", [1], [i]]} for i in range(3)] + [{}]


def test_recursive_bls_does_not_deadlock(client):
    # Triton never answers this one (one instance waiting on itself) [V].
    result = client.infer("ping", [int32_input([3], "DEPTH")], client_timeout=WAIT_S)
    assert result.as_numpy("TRACE")[0] == b"ping>pong>ping>pong"


def test_ensemble(client):
    result = client.infer("pipeline", [fp32_input(F, "RAW")], client_timeout=WAIT_S)
    assert result.as_numpy("RESULT").tolist() == [3.0, 15.0, 35.0, 63.0]
    assert result.as_numpy("SUM").tolist() == [3.0, 5.0, 7.0, 9.0]


def test_nested_ensemble(client):
    result = client.infer("nested", [fp32_input(F, "X")], client_timeout=WAIT_S)
    assert result.as_numpy("Z").tolist() == [6.0, 30.0, 70.0, 126.0]


def test_ensemble_config_is_tritons(client):
    config = client.get_model_config("pipeline", as_json=True)["config"]
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
        "scale",
        "add_sub",
        "multiply",
    ]
    assert config["model_transaction_policy"] == {}
    streaming = client.get_model_config("streaming", as_json=True)["config"]
    assert streaming["model_transaction_policy"] == {"decoupled": True}


def test_ensemble_step_error(client):
    with pytest.raises(InferenceServerException) as failure:
        client.infer("raising_ens", [fp32_input(F, "X")], client_timeout=WAIT_S)
    assert "in ensemble 'raising_ens', Failed to process the request(s) for model 'raiser_0_0'" in (
        failure.value.message()
    )


def test_streaming_ensemble(server):
    answers: queue.Queue[Any] = queue.Queue()
    client = server.client()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("streaming", [int32_input([3], "COUNT")])
        values = []
        for _ in range(3):
            result, error = answers.get(timeout=WAIT_S)
            assert error is None, error
            values.append(result.as_numpy("F").tolist())
    finally:
        client.stop_stream()
    assert values == [[0.0], [1.5], [3.0]]


def test_failed_ensembles_are_not_served(client):
    assert client.is_model_ready("pipeline")
    assert not client.is_model_ready("cycle_a")
    assert not client.is_model_ready("bad_missing_step")


def test_example_client(bridge_server):
    examples = REPOSITORIES.parents[1] / "examples" / "composition"
    server = bridge_server(examples / "model_repository")
    done = subprocess.run(
        [sys.executable, str(examples / "client.py"), "--url", server.grpc_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Values the example models compute from the client's RAW = [0.5, 1, 3, -2].
    assert "router raw          LOGITS: [3.0, 2.5, 1.5]" in done.stdout
    assert "pipeline        LABEL: cat" in done.stdout
    assert "stream_consumer TEXT: the quick brown fox jumps" in done.stdout
    assert "stream_consumer RESPONSES: 6" in done.stdout  # 5 tokens + the empty final one
