"""BLS and ensembles on Triton and on the bridge (tests/repositories/composition, README there).

BLS is compared through the `bls` / `bls_async` probe models: each runs one BLS call described
by a JSON spec and answers, as JSON, every response it got (outputs, error code and text), so
both servers' answers must be equal byte for byte. Calls that hang Triton 2.51 (a model waiting
on itself, an error mid-stream of a decoupled BLS callee) are never sent to the oracle; the
e2e and unit tests cover them on the bridge.

Differences: `error_status` (unary errors) and `response_model_version`.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import (
    PROJECT_ROOT,
    REPOSITORIES,
    Failure,
    Pair,
    both,
    expected_bridge_error,
    expected_bridge_response,
    fp32_input,
    int32_input,
    requested,
    summarize,
)
from tests.harness.oracle import starved_stub

pytestmark = pytest.mark.oracle

ROOT = REPOSITORIES / "composition"
WAIT_S = 30.0
F = [1.0, 2.0, 3.0, 4.0]
ADD = [["INPUT0", "FP32", F], ["INPUT1", "FP32", F]]

BLS_CASES: dict[str, dict[str, Any]] = {
    "outputs": {"model": "add_sub", "inputs": ADD, "outputs": ["OUTPUT0"]},
    "all_outputs": {"model": "add_sub", "inputs": ADD},
    "version_1": {"model": "versioned", "model_version": 1, "inputs": [ADD[0]]},
    "version_latest": {"model": "versioned", "inputs": [ADD[0]]},
    "unknown_model": {"model": "nope", "inputs": [ADD[0]]},
    "unknown_version": {"model": "add_sub", "model_version": 5, "inputs": ADD},
    "missing_input": {"model": "add_sub", "inputs": ADD[:1]},
    "extra_input": {"model": "add_sub", "inputs": [*ADD, ["X", "FP32", F]]},
    "bad_dtype": {"model": "add_sub", "inputs": [["INPUT0", "INT32", F], ADD[1]]},
    "bad_shape": {"model": "add_sub", "inputs": [["INPUT0", "FP32", [1, 2]], ADD[1]]},
    "bytes_for_fp32": {"model": "add_sub", "inputs": [["INPUT0", "BYTES", ["a"]], ADD[1]]},
    "bad_output": {"model": "add_sub", "inputs": ADD, "outputs": ["NOPE"]},
    "callee_raises": {"model": "raiser", "inputs": [ADD[0]]},
    "callee_error_code": {"model": "raiser", "inputs": [ADD[0]], "parameters": {"not_found": True}},
    "decoupled_without_flag": {"model": "repeat_dec", "inputs": [["IN", "INT32", [2]]]},
    "decoupled": {"model": "repeat_dec", "inputs": [["IN", "INT32", [2]]], "decoupled": True},
    "decoupled_zero": {"model": "repeat_dec", "inputs": [["IN", "INT32", [0]]], "decoupled": True},
    "decoupled_flag_on_default": {"model": "add_sub", "inputs": ADD, "decoupled": True},
    "decoupled_unknown": {"model": "nope", "inputs": [ADD[0]], "decoupled": True},
    "metadata": {
        "model": "echo_request",
        "inputs": [ADD[0]],
        "request_id": "rid-7",
        "correlation_id": 42,
        "flags": 3,
        "timeout": 5000000,
        "parameters": {"p": "s", "n": 3, "b": True},
    },
    "string_correlation_id": {"model": "echo_request", "inputs": [ADD[0]], "correlation_id": "a"},
    "timeout": {
        "model": "slow",
        "inputs": [ADD[0]],
        "timeout": 1000,
        "parameters": {"sleep_ms": 100},
    },
    "ensemble": {"model": "pipeline", "inputs": [["RAW", "FP32", F]]},
    "decoupled_ensemble_without_flag": {"model": "streaming", "inputs": [["COUNT", "INT32", [2]]]},
    "bad_parameter": {"model": "add_sub", "inputs": [], "parameters": {"f": 1.5}},
}


@pytest.fixture(scope="module")
def composition(pair_for) -> Pair:
    return pair_for(ROOT, expect_failures=True)


def probe(spec: dict[str, Any], model: str = "bls"):
    def request(client: grpcclient.InferenceServerClient) -> Any:
        tensor = grpcclient.InferInput("SPEC", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([json.dumps(spec).encode()], dtype=object))
        result = client.infer(model, [tensor], client_timeout=WAIT_S)
        return json.loads(result.as_numpy("INFO")[0])

    return request


@pytest.mark.parametrize("caller", ["bls", "bls_async"])
@pytest.mark.parametrize("case", BLS_CASES)
def test_bls(composition: Pair, case: str, caller: str):
    triton, bridge = both(composition, probe(BLS_CASES[case], caller))
    assert not isinstance(triton, Failure), triton
    assert bridge == triton


def test_bls_gather(composition: Pair):
    spec = {"gather": [BLS_CASES["outputs"], BLS_CASES["version_1"], BLS_CASES["unknown_model"]]}
    triton, bridge = both(composition, probe(spec, "bls_async"))
    assert bridge == triton


def test_bls_decoupled_ensemble_final_rides_on_its_last_response(composition: Pair):
    """A decoupled ensemble's responses through BLS, and its end: the response made once no
    step is in flight carries FINAL, so when `repeat_dec`'s flag-only FINAL comes before
    `to_float` answers the last value there is no trailing empty response [V]. Which of the
    two comes first is a race between two models' threads; Triton's steps talk to their stub
    processes over IPC, which makes the producer's FINAL first nearly always, where the
    bridge's in-process steps can let the consumer answer first. Then FINAL goes alone and the
    iterator ends with an empty response, as Triton does in that order (README, ensembles):
    the data responses must match, and a trailing one, if any, must be empty."""
    spec = {"model": "streaming", "inputs": [["COUNT", "INT32", [2]]], "decoupled": True}
    triton, bridge = both(composition, probe(spec))
    assert not isinstance(triton, Failure), triton
    empty = {"error": None, "outputs": {}}
    assert triton["responses"][-1] != empty  # Triton: FINAL rode on the last data response
    data = [r for r in bridge["responses"] if r != empty]
    assert data == triton["responses"]
    assert bridge["responses"][len(data) :] in ([], [empty])


# -- ensembles ----------------------------------------------------------------------------------

ENSEMBLE_CALLS = {
    "pipeline": ("pipeline", [fp32_input(F, "RAW")], None),
    "pipeline_result_only": ("pipeline", [fp32_input(F, "RAW")], requested("RESULT")),
    "nested": ("nested", [fp32_input(F, "X")], None),
    "versioned_step": ("versioned_ens", [fp32_input(F, "X")], None),
    "parallel": ("parallel", [fp32_input(F, "X")], None),
}


@pytest.mark.parametrize("case", ENSEMBLE_CALLS)
def test_ensemble(composition: Pair, case: str):
    model, inputs, outputs = ENSEMBLE_CALLS[case]
    triton, bridge = both(composition, lambda c: c.infer(model, inputs, outputs=outputs))
    assert not isinstance(triton, Failure), triton
    assert summarize(bridge) == expected_bridge_response(triton)


ENSEMBLE_ERRORS = {
    "step_raises": ("raising_ens", [fp32_input(F, "X")], None),
    "pruned_output": ("pipeline", [fp32_input(F, "RAW")], requested("SUM")),
    "unknown_output": ("pipeline", [fp32_input(F, "RAW")], requested("S")),
    "unknown_input": ("pipeline", [fp32_input(F, "X")], None),
    "bad_shape": ("pipeline", [fp32_input(F[:3], "RAW")], None),
    "bad_dtype": ("pipeline", [int32_input([1, 2, 3, 4], "RAW")], None),
}


@pytest.mark.parametrize("case", ENSEMBLE_ERRORS)
def test_ensemble_error(composition: Pair, case: str):
    model, inputs, outputs = ENSEMBLE_ERRORS[case]
    triton, bridge = both(composition, lambda c: c.infer(model, inputs, outputs=outputs))
    assert isinstance(triton, Failure), triton
    assert bridge == expected_bridge_error(triton)


@pytest.mark.parametrize("model", ["pipeline", "nested", "streaming"])
def test_ensemble_config(composition: Pair, model: str):
    triton, bridge = both(composition, lambda c: c.get_model_config(model, as_json=True))
    assert bridge == triton


def stream_values(server: Any, count: int) -> list[Any]:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("streaming", [int32_input([count], "COUNT")])
        values = []
        for _ in range(count):
            result, error = answers.get(timeout=WAIT_S)
            values.append(str(error) if error is not None else result.as_numpy("F").tolist())
        client.stop_stream()
    finally:
        client.close()
    return values


def test_decoupled_step_streams_through_the_ensemble(composition: Pair):
    triton = stream_values(composition.oracle, 3)
    assert triton == [[0.0], [1.5], [3.0]]
    assert stream_values(composition.bridge, 3) == triton


READY = ["pipeline", "nested", "parallel", "streaming", "versioned_ens", "raising_ens"]
FAILED = [
    "bad_missing_step",
    "bad_self",
    "cycle_a",
    "cycle_b",
    "bad_dtype",
    "bad_input_key",
    "bad_output_key",
    "bad_shape",
    "bad_version",
    "bad_on_failed",
]


@pytest.mark.parametrize("model", READY + FAILED)
def test_which_ensembles_load(composition: Pair, model: str):
    triton, bridge = both(composition, lambda c: c.is_model_ready(model))
    assert triton == (model in READY)
    assert bridge == triton


def test_example_client_prints_the_same(oracle_server, shared_bridge_server):
    """examples/composition: the client's whole output is the same on both servers."""
    repo = PROJECT_ROOT / "examples" / "composition" / "model_repository"
    client = repo.parent / "client.py"

    def run_client(server) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(client), "--url", server.grpc_url],
            capture_output=True,
            text=True,
            timeout=120,
        )

    triton = run_client(oracle_server(repo))
    if triton.returncode != 0 and starved_stub(triton.stderr):  # the oracle's flake: once more
        warnings.warn(f"real Triton starved a stub: {triton.stderr.splitlines()[-1]}", stacklevel=1)
        triton = run_client(oracle_server(repo))
    bridge = run_client(shared_bridge_server(repo))
    assert triton.returncode == 0, triton.stderr
    assert bridge.returncode == 0, bridge.stderr
    assert bridge.stdout == triton.stdout
