"""Malformed requests get a prompt, clear answer, and leave the server serving (issue 16).

Sent raw (tritonclient's service_pb2, no client-side checks) over ModelInfer and ModelStreamInfer.
The reserved request parameters reach the bridge unchecked by Dynamo's frontend (spec
dynamo_runtime §1); of the wrong kind, they used to surface as Python errors (`ValueError:
invalid literal for int()`, `Internal: OverflowError`, `AttributeError: 'float' object has no
attribute 'encode'`). Triton refuses them with INVALID_ARG: `invalid value type for
'<name>' parameter, expected <kind>.` [S]. benchmarks/fuzz_malformed.py sends the wider set.
The bridge runs Dynamo's door (`--frontend dynamo`): it is the door that passes the parameters
through unchecked, so the worker's own checks are what answers.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.e2e.support import SERVING

# A "not a hang" bound, never a latency claim.
ANSWER_WITHIN_S = 5.0


def echo_request(**parameters: pb.InferParameter) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name="echo",
        id="malformed",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[2])],
        parameters=parameters,
    )
    request.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    return request


P = pb.InferParameter
NAN = float("nan")

# name → (parameters, the kind Triton names in its refusal)
WRONG_KINDS = {
    "timeout_string": ({"timeout": P(string_param="soon")}, "int64_param"),
    "timeout_nan": ({"timeout": P(double_param=NAN)}, "int64_param"),
    "timeout_infinite": ({"timeout": P(double_param=float("inf"))}, "int64_param"),
    "timeout_bool": ({"timeout": P(bool_param=True)}, "int64_param"),
    "priority_string": ({"priority": P(string_param="high")}, "uint64_param"),
    "sequence_id_double": ({"sequence_id": P(double_param=1.5)}, "int64_param or string_param"),
    "sequence_id_bool": ({"sequence_id": P(bool_param=True)}, "int64_param or string_param"),
    "sequence_start_string": ({"sequence_start": P(string_param="yes")}, "bool_param"),
    "sequence_end_int": ({"sequence_end": P(int64_param=1)}, "bool_param"),
}


@pytest.fixture(scope="module")
def server(shared_bridge_server):
    return shared_bridge_server(SERVING, "--frontend", "dynamo")


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(f"localhost:{server.grpc_port}")
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def unary_error(stub, request: pb.ModelInferRequest) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=ANSWER_WITHIN_S)
    assert caught.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "no answer: the request hung"
    return caught.value.details()


def stream_error(stub, request: pb.ModelInferRequest) -> str:
    try:
        replies = list(stub.ModelStreamInfer(iter([request]), timeout=ANSWER_WITHIN_S))
    except grpc.RpcError as error:
        assert error.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "no answer: the request hung"
        raise
    assert len(replies) == 1 and replies[0].error_message, replies
    return replies[0].error_message


@pytest.mark.parametrize("case", list(WRONG_KINDS))
@pytest.mark.parametrize("send", [unary_error, stream_error], ids=["unary", "stream"])
def test_reserved_parameter_of_the_wrong_kind_is_refused(stub, send, case: str) -> None:
    parameters, expected = WRONG_KINDS[case]
    (name,) = parameters
    message = send(stub, echo_request(**parameters))
    # Dynamo's frontend carries INVALID_ARG as the `InvalidRequest:` category (bridge/errors.py).
    assert message.endswith(
        f"InvalidRequest: invalid value type for '{name}' parameter, expected {expected}."
    ), message


def test_the_server_serves_on_after_malformed_requests(stub) -> None:
    started = time.monotonic()
    for parameters, _ in WRONG_KINDS.values():
        unary_error(stub, echo_request(**parameters))
    reply = stub.ModelInfer(echo_request(), timeout=ANSWER_WITHIN_S)
    assert reply.id == "malformed" and reply.outputs[0].name == "OUTPUT0"
    assert time.monotonic() - started < 30  # generous: only a hang would reach it


def test_accepted_kinds_still_pass(stub) -> None:
    ok = {
        "timeout": P(int64_param=1_000_000),
        "priority": P(uint64_param=1),
        "sequence_id": P(string_param="s"),
        "sequence_start": P(bool_param=True),
        "sequence_end": P(bool_param=True),
    }
    reply = stub.ModelInfer(echo_request(**ok), timeout=ANSWER_WITHIN_S)
    assert reply.outputs[0].name == "OUTPUT0"
