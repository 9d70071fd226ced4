"""Errors at inference (tests/repositories/errors): Triton's texts, inside the frontend's wrapping.

Difference `error_status`: the bridge's unary error is always INTERNAL with the prefix
`Failed to fold completions stream: <Category>: `, the category standing for Triton's code
(`expected_bridge_error`). Tracebacks are compared with the repository path taken off.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import (
    TRITON_DOOR,
    Failure,
    Pair,
    both,
    call,
    expected_bridge_error,
    int32_input,
    make_input,
    triton_text_in_bridge_error,
)

pytestmark = pytest.mark.oracle

EXECUTE_CONTRACT = [
    "raise_in_execute",
    "raise_model_exception",
    "return_response_not_list",
    "return_tuple",
    "return_dict",
    "return_too_few",
    "return_too_many",
    "return_non_response",
    "no_execute",
]


@pytest.mark.parametrize("model", EXECUTE_CONTRACT)
def test_execute_contract_error(errors: Pair, model: str):
    triton, bridge = both(errors, lambda c: c.infer(model, [int32_input([7])]))
    assert isinstance(triton, Failure), triton
    assert triton.status == "StatusCode.INTERNAL"
    assert triton.message.startswith(f"Failed to process the request(s) for model '{model}_0'")
    assert triton_text_in_bridge_error(bridge) == triton.message
    assert bridge == expected_bridge_error(triton)


# TritonError code name → the gRPC status Triton answers with (README of the errors repo).
TRITON_CODES = {
    "UNKNOWN": "StatusCode.UNKNOWN",
    "INTERNAL": "StatusCode.INTERNAL",
    "NOT_FOUND": "StatusCode.NOT_FOUND",
    "INVALID_ARG": "StatusCode.INVALID_ARGUMENT",
    "UNAVAILABLE": "StatusCode.UNAVAILABLE",
    "UNSUPPORTED": "StatusCode.UNIMPLEMENTED",
    "ALREADY_EXISTS": "StatusCode.ALREADY_EXISTS",
    "CANCELLED": "StatusCode.CANCELLED",
    "DEFAULT": "StatusCode.INTERNAL",  # TritonError without a code
}

# Triton's status → the exact start of the bridge's message (difference error_status; NOT_FOUND
# and UNIMPLEMENTED continue with a JSON body, difference error_json_body).
BRIDGE_PREFIX = {
    "StatusCode.UNKNOWN": "Failed to fold completions stream: Internal: ",
    "StatusCode.INTERNAL": "Failed to fold completions stream: Internal: ",
    "StatusCode.NOT_FOUND": 'Failed to fold completions stream: NotFound: {"message":',
    "StatusCode.INVALID_ARGUMENT": "Failed to fold completions stream: InvalidRequest: ",
    "StatusCode.UNAVAILABLE": "Failed to fold completions stream: Internal: ",
    "StatusCode.UNIMPLEMENTED": 'Failed to fold completions stream: NotImplemented: {"message":',
    "StatusCode.ALREADY_EXISTS": "Failed to fold completions stream: Internal: ",
    "StatusCode.CANCELLED": "Failed to fold completions stream: Cancelled: ",
}


@pytest.mark.parametrize("code", [*TRITON_CODES, "no-such-code"])
@pytest.mark.parametrize("via", ["parameter", "input"])
def test_triton_error_code(errors: Pair, code: str, via: str):
    inputs = [int32_input([1])]
    kwargs = {}
    if via == "input":
        inputs.append(make_input("CODE", np.array([code.encode()], dtype=np.object_), "BYTES"))
    else:
        kwargs["parameters"] = {"code": code}
    triton, bridge = both(errors, lambda c: c.infer("error_code", inputs, **kwargs))
    assert isinstance(triton, Failure), triton
    assert triton.status == TRITON_CODES.get(code, "StatusCode.INVALID_ARGUMENT")
    if not TRITON_DOOR:  # error_status: the triton door answers with Triton's status
        assert bridge.status == "StatusCode.INTERNAL"
        assert bridge.message.startswith(BRIDGE_PREFIX[triton.status]), bridge
    assert triton_text_in_bridge_error(bridge) == triton.message
    assert bridge == expected_bridge_error(triton)


def test_error_code_model_echoes_without_a_code(errors: Pair):
    triton, bridge = both(errors, lambda c: c.infer("error_code", [int32_input([5])]))
    assert triton.as_numpy("OUTPUT0").tolist() == [5]
    assert bridge.as_numpy("OUTPUT0").tolist() == triton.as_numpy("OUTPUT0").tolist()


def _send(server, root, value: int):
    # A client per request: one gRPC channel each, so the requests really overlap.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        outcome = call(
            server, root, lambda _: client.infer("batch_errors", [int32_input([[value]])])
        )
    finally:
        client.close()
    if isinstance(outcome, Failure):
        return outcome
    return (outcome.as_numpy("OUTPUT0").tolist(), outcome.as_numpy("EXEC_SIZE").tolist())


def _batch(pair: Pair, values: list[int]) -> list:
    """One [1, 1] request per value, all at once (Triton's dynamic batcher groups them):
    [triton outcomes, bridge outcomes]."""
    results = []
    for _, server in pair.servers():
        with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
            results.append(list(pool.map(lambda v, s=server: _send(s, pair.root, v), values)))
    return results


def _expected_bridge(triton: list) -> list:
    return [expected_bridge_error(t) if isinstance(t, Failure) else t for t in triton]


def test_per_request_errors_in_a_dynamic_batch(errors: Pair):
    triton, bridge = _batch(errors, [2, 3, 4, 6])
    assert triton[1] == Failure("StatusCode.INVALID_ARGUMENT", "odd value(s) [3]")
    assert bridge == _expected_bridge(triton)


def test_execute_exception_fails_the_whole_batch(errors: Pair):
    triton, bridge = _batch(errors, [2, 3, -1, 6])
    assert all(isinstance(t, Failure) for t in triton), triton
    assert bridge == _expected_bridge(triton)
