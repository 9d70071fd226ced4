"""BLS and ensembles across bridge processes (issue 12), through a tritonclient against A.

Two bridges share one file-discovery folder: B serves tests/repositories/cluster_b, A serves
tests/repositories/cluster_a, whose BLS probes (`bls`, `bls_async`, `bls_isolated`: the probes of
tests/repositories/composition) and ensemble `remote_pipeline` call models that only B has. Each
process runs its own Dynamo frontend (the embedded default); the client talks to A's. The
expected answers are the ones in-process BLS gives for the same calls (tests/e2e/
test_composition.py, Triton 2.51's texts and codes).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.cluster_support import file_discovery_env, start_bridge
from tests.e2e.support import (
    REPOSITORIES,
    WAIT_S,
    BackgroundInfer,
    Gate,
    int32_input,
    wait_until,
)
from tests.harness.repositories import materialize, materialize_model

F = [1.0, 2.0, 3.0, 4.0]
ADD_SUB = {"model": "add_sub", "inputs": [["INPUT0", "FP32", F], ["INPUT1", "FP32", F]]}
PROBES = ["bls", "bls_async", "bls_isolated"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bls_remote")
    env = file_discovery_env(folder / "kv")
    b = start_bridge(materialize("cluster_b", folder), env, folder / "b.log")
    try:
        a = start_bridge(materialize("cluster_a", folder), env, folder / "a.log")
    except BaseException:
        b.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def client(cluster):
    a, _ = cluster
    return a.client()


def probe(client, spec, model="bls"):
    tensor = grpcclient.InferInput("SPEC", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(spec).encode()], dtype=object))
    result = client.infer(model, [tensor], client_timeout=WAIT_S)
    return json.loads(result.as_numpy("INFO")[0])


@pytest.mark.parametrize("model", PROBES)
def test_bls_reaches_a_model_of_another_process(client, model):
    assert probe(client, ADD_SUB, model)["responses"] == [
        {
            "error": None,
            "outputs": {
                "OUTPUT0": ["float32", [4], [2.0, 4.0, 6.0, 8.0]],
                "OUTPUT1": ["float32", [4], [0.0, 0.0, 0.0, 0.0]],
            },
        }
    ]


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_decoupled_iteration_across_processes(client, model):
    spec = {"model": "repeat_dec", "inputs": [["IN", "INT32", [3]]], "decoupled": True}
    outputs = [r["outputs"] for r in probe(client, spec, model)["responses"]]
    assert outputs == [{"OUT": ["int32", [1], [i]]} for i in range(3)] + [{}]


def test_an_error_response_mid_stream_is_delivered_and_the_stream_goes_on(client):
    spec = {"model": "repeat_dec", "inputs": [["IN", "INT32", [-1]]], "decoupled": True}
    assert probe(client, spec)["responses"] == [
        {"error": [1, "repeat_dec got a negative count"], "outputs": {}},
        {"error": None, "outputs": {}},
    ]


@pytest.mark.parametrize("model", PROBES)
def test_an_error_of_the_remote_model_comes_inside_the_response(client, model):
    (response,) = probe(client, {"model": "raiser", "inputs": [["INPUT0", "FP32", F]]}, model)[
        "responses"
    ]
    code, text = response["error"]
    assert code == 1  # INTERNAL, whatever the callee said (Triton 2.51)
    assert "raiser refuses" in text and not text.startswith("Model raiser")


def test_the_callees_own_code_becomes_internal(client):
    spec = {"model": "raiser", "inputs": [["INPUT0", "FP32", F]], "parameters": {"not_found": 1}}
    assert probe(client, spec)["responses"] == [
        {"error": [1, "raiser says not found"], "outputs": {}}
    ]


def test_the_remote_request_checks_are_prefixed(client):
    spec = {**ADD_SUB, "outputs": ["NOPE"]}
    assert probe(client, spec)["responses"] == [
        {
            "error": [
                1,
                "Model add_sub - Error when running inference: unexpected inference output "
                "'NOPE' for model 'add_sub'",
            ],
            "outputs": {},
        }
    ]


@pytest.mark.parametrize("model", PROBES)
def test_an_unknown_model_is_not_ready(client, model):
    spec = {"model": "nope", "inputs": [["INPUT0", "FP32", F]]}
    assert probe(client, spec, model)["responses"] == [
        {
            "error": [
                1,
                "Model nope - Error when running inference: Failed for execute the inference "
                "request. Model 'nope' is not ready.",
            ],
            "outputs": {},
        }
    ]


def test_a_model_that_failed_to_load_there_is_not_ready(client):
    spec = {"model": "broken", "inputs": [["INPUT0", "FP32", F]]}
    (response,) = probe(client, spec)["responses"]
    assert response["error"][1].endswith("Model 'broken' is not ready.")


def test_a_decoupled_target_needs_decoupled_true(client):
    spec = {"model": "repeat_dec", "inputs": [["IN", "INT32", [2]]]}
    (response,) = probe(client, spec)["responses"]
    assert response["error"][1].startswith(
        "Model repeat_dec - Error when running inference: Model repeat_dec is using the decoupled."
    )


@pytest.mark.parametrize(("version", "factor"), [(1, 1.0), (2, 2.0)])
def test_the_version_asked_for_answers(client, version, factor):
    spec = {"model": "versioned", "inputs": [["INPUT0", "FP32", F]], "model_version": version}
    (response,) = probe(client, spec)["responses"]
    assert response["outputs"]["OUTPUT0"][2] == [factor * v for v in F]


def test_an_unknown_version_is_not_ready(client):
    spec = {"model": "versioned", "inputs": [["INPUT0", "FP32", F]], "model_version": 5}
    (response,) = probe(client, spec)["responses"]
    assert response["error"][1].endswith("Model 'versioned' is not ready.")


def test_request_metadata_reaches_the_remote_model(client):
    spec = {
        "model": "echo_request",
        "inputs": [["INPUT0", "FP32", F]],
        "request_id": "bls-7",
        "correlation_id": 42,
        "flags": 3,
        "timeout": 123456,
        "parameters": {"tag": "t", "n": 3, "b": True},
        "outputs": ["INFO"],
    }
    (response,) = probe(client, spec)["responses"]
    info = json.loads(response["outputs"]["INFO"][2][0])
    assert info["request_id"] == "bls-7"
    assert info["correlation_id"] == 42
    assert info["flags"] == 3
    assert info["timeout"] == 123456
    assert info["parameters"] == {"tag": "t", "n": 3, "b": True}


def test_bytes_tensors_cross_as_bytes(client):
    spec = {"model": "identity_bytes", "inputs": [["INPUT0", "BYTES", [["a", "", "xyz"]]]]}
    (response,) = probe(client, spec)["responses"]
    assert response["outputs"]["OUTPUT0"] == ["object", [1, 3], ["a", "", "xyz"]]


def test_cancelling_the_iterator_cancels_the_remote_request(client):
    spec = {
        "model": "repeat_dec",
        "inputs": [["IN", "INT32", [500]]],
        "parameters": {"delay_ms": 20},
        "decoupled": True,
        "cancel_after": 2,
    }
    responses = probe(client, spec)["responses"]
    # The callee stops at its next is_cancelled() check (it would send 500 in 10 s otherwise);
    # the iteration ends with an empty final response.
    assert 2 <= len(responses) < 100
    assert responses[-1] == {"error": None, "outputs": {}}


def test_an_ensemble_runs_a_step_in_another_process(client):
    tensor = grpcclient.InferInput("RAW", [4], "FP32")
    tensor.set_data_from_numpy(np.array(F, dtype=np.float32))
    result = client.infer("remote_pipeline", [tensor], client_timeout=WAIT_S)
    # scale (here): 2x and ones; add_sub (in B): 2x + 1.
    assert result.as_numpy("SUM").tolist() == [3.0, 5.0, 7.0, 9.0]


def test_an_ensemble_step_error_in_another_process(client):
    tensor = grpcclient.InferInput("X", [4], "FP32")
    tensor.set_data_from_numpy(np.array(F, dtype=np.float32))
    with pytest.raises(InferenceServerException) as failure:
        client.infer("remote_raising", [tensor], client_timeout=WAIT_S)
    assert (
        "in ensemble 'remote_raising', Failed to process the request(s) for model 'raiser_0_0'"
        in failure.value.message()
    )


def test_a_streaming_ensemble_with_its_decoupled_step_in_another_process(cluster):
    a, _ = cluster
    config = a.client().get_model_config("remote_streaming").config
    assert config.model_transaction_policy.decoupled  # inferred from B's repeat_dec
    answers: queue.Queue[Any] = queue.Queue()
    client = a.client()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("remote_streaming", [int32_input([3], "COUNT")])
        values = []
        for _ in range(3):
            result, error = answers.get(timeout=WAIT_S)
            assert error is None, error
            values.append(result.as_numpy("F").tolist())
    finally:
        client.stop_stream()
    assert values == [[0.0], [1.5], [3.0]]


def test_bls_follows_a_reload_in_the_other_process(tmp_path):
    """B swaps add_sub for a new generation (a new endpoint): A's cached endpoint goes stale,
    and its BLS calls reach the new one, with no failed call on the way."""
    env = file_discovery_env(tmp_path / "kv")
    repo_b = tmp_path / "b"
    materialize_model("cluster_b", "add_sub", repo_b)
    b = start_bridge(repo_b, env, tmp_path / "b.log")
    try:
        a = start_bridge(materialize("cluster_a", tmp_path), env, tmp_path / "a.log")
        try:
            client = a.client()
            assert probe(client, ADD_SUB)["responses"][0]["outputs"]["OUTPUT0"][2] == [
                2.0,
                4.0,
                6.0,
                8.0,
            ]
            model_file = repo_b / "add_sub" / "1" / "model.py"
            model_file.write_text(model_file.read_text().replace("a + b", "a + b + 100"))
            wait_until(
                lambda: "successfully loaded 'add_sub' (generation 2)" in b.log_text,
                "the reload in B",
            )
            wait_until(
                lambda: "successfully unloaded 'add_sub' (generation 1)" in b.log_text,
                "generation 1 withdrawn in B",
            )
            (response,) = probe(client, ADD_SUB)["responses"]
            assert response["error"] is None
            assert response["outputs"]["OUTPUT0"][2] == [102.0, 104.0, 106.0, 108.0]
        finally:
            a.stop()
    finally:
        b.stop()


def test_a_call_in_flight_when_the_other_process_dies_is_answered(tmp_path):
    """SIGKILL B while its model holds A's BLS call: the call answers INTERNAL, never hangs;
    the next call to B's model (still listed by discovery for a while) is "not ready"."""
    env = file_discovery_env(tmp_path / "kv")
    repo_b = tmp_path / "b"
    shutil.copytree(REPOSITORIES / "e2e_serving" / "pool", repo_b / "pool")
    materialize_model("cluster_b", "add_sub", repo_b)
    b = start_bridge(repo_b, env, tmp_path / "b.log")
    try:
        a = start_bridge(materialize("cluster_a", tmp_path), env, tmp_path / "a.log")
        try:
            client = a.client()
            probe(client, ADD_SUB)  # A knows B before it dies
            gate = Gate(tmp_path)
            spec = {
                "model": "pool",
                "inputs": [["INPUT0", "FP32", F]],
                "parameters": gate.params("held"),
            }
            tensor = grpcclient.InferInput("SPEC", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([json.dumps(spec).encode()], dtype=object))
            held = BackgroundInfer(client, "bls", [tensor], client_timeout=WAIT_S)
            wait_until(lambda: gate.started("held"), "B's model executing the call")
            os.killpg(b.process.pid, signal.SIGKILL)
            (response,) = json.loads(held.result().as_numpy("INFO")[0])["responses"]
            assert response["error"][0] == 1
            assert response["error"][1].startswith("BLS call to 'pool' failed: ")
            (response,) = probe(client, ADD_SUB)["responses"]
            assert response["error"] == [
                1,
                "Model add_sub - Error when running inference: Failed for execute the "
                "inference request. Model 'add_sub' is not ready.",
            ]
        finally:
            a.stop()
    finally:
        b.stop()
