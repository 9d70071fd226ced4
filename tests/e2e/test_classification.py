"""Triton's classification extension on both wires of the triton door (repositories/dtypes).

A requested output with `class_count` comes back as its top k classes, BYTES `"<value>:<index>"`,
over gRPC as over HTTP (issue 40, bug 2: gRPC ignored it). The cases are Triton's qa/L0_parameters
class_count_test.py (2.73): `identity_fp32` with ones of shape [1, 8] and k = 5 gives BYTES of
shape [1, 5], each "1.000000:<index>"; a BYTES output cannot be ranked.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.harness import BridgeServer

DOOR = ("--frontend", "triton")
ROWS = np.array([[3, 1, 2, -1], [5, 5, 0, 7]], dtype=np.float32)


@pytest.fixture(scope="module")
def door(shared_bridge_server, repository) -> BridgeServer:
    return shared_bridge_server(repository("dtypes"), *DOOR)  # its models share one model.py


def infer(door: BridgeServer, wire: Any, model: str, array: np.ndarray, k: int) -> Any:
    """The classes of OUTPUT0 for INPUT0 = `array`, through tritonclient on `wire`."""
    datatype = {np.dtype(object): "BYTES", np.dtype(np.float16): "FP16"}.get(array.dtype, "FP32")
    tensor = wire.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    url = door.grpc_url if wire is grpcclient else door.http_url
    with wire.InferenceServerClient(url) as client:
        outputs = [wire.InferRequestedOutput("OUTPUT0", class_count=k)]
        return client.infer(model, [tensor], outputs=outputs)


@pytest.mark.parametrize("wire", [grpcclient, httpclient], ids=["grpc", "http"])
def test_class_count_of_tritons_qa(door: BridgeServer, wire: Any):
    result = infer(door, wire, "identity_fp32", np.ones((1, 8), np.float32), 5)
    output = result.get_output("OUTPUT0")
    datatype = output.datatype if wire is grpcclient else output["datatype"]
    assert datatype == "BYTES"
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (1, 5)
    assert all(c.decode().startswith("1.000000:") for c in classes.ravel())


@pytest.mark.parametrize("model", ["identity_fp32", "identity_fp32_nobatch"])
def test_grpc_answers_what_http_does(door: BridgeServer, model: str):
    # A batching model ranks each batch entry on its own; one that does not, the whole output.
    grpc_classes = infer(door, grpcclient, model, ROWS, 2).as_numpy("OUTPUT0")
    http_classes = infer(door, httpclient, model, ROWS, 2).as_numpy("OUTPUT0")
    assert grpc_classes.tolist() == http_classes.tolist()
    if model == "identity_fp32":
        assert grpc_classes.tolist() == [
            [b"3.000000:0", b"2.000000:2"],
            [b"7.000000:3", b"5.000000:0"],
        ]
    else:
        assert grpc_classes.tolist() == [b"7.000000:7", b"5.000000:4"]


def test_class_count_on_a_stream(door: BridgeServer):
    answers: list[Any] = []
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 3, 2]], np.float32))
    with grpcclient.InferenceServerClient(door.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)]
        client.async_stream_infer("identity_fp32", [tensor], outputs=outputs)
        client.stop_stream()  # waits for the answer
    [(result, error)] = answers
    assert error is None, error
    assert result.as_numpy("OUTPUT0").tolist() == [[b"3.000000:1", b"2.000000:2"]]


@pytest.mark.parametrize("wire", [grpcclient, httpclient], ids=["grpc", "http"])
def test_bytes_output_has_no_classes(door: BridgeServer, wire: Any):
    with pytest.raises(InferenceServerException) as failure:
        infer(door, wire, "identity_bytes", np.array([[b"test"] * 8], dtype=object), 5)
    assert "class result not available for output due to unsupported type 'BYTES'" in str(
        failure.value
    )


@pytest.mark.parametrize("wire", [grpcclient, httpclient], ids=["grpc", "http"])
def test_an_output_past_a_million_elements_is_not_ranked(door: BridgeServer, wire: Any):
    # Triton 2.66 on (qa/L0_parameters class_count_test.py): 1,000,001 elements is one too many.
    with pytest.raises(InferenceServerException) as failure:
        infer(door, wire, "identity_fp32", np.ones((1, 1_000_001), np.float32), 5)
    assert "classification output tensor too large" in str(failure.value)
    assert failure.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    ranked = infer(door, wire, "identity_fp32", np.ones((1, 1_000_000), np.float32), 1)
    assert ranked.as_numpy("OUTPUT0").shape == (1, 1)


@pytest.mark.parametrize("wire", [grpcclient, httpclient], ids=["grpc", "http"])
def test_fp16_is_not_ranked(door: BridgeServer, wire: Any):
    # Triton ranks integers, FP32 and FP64 only (src/classification.cc, 2.51 too).
    with pytest.raises(InferenceServerException) as failure:
        infer(door, wire, "identity_fp16", np.ones((1, 4), np.float16), 2)
    assert "class result not available for output due to unsupported type 'FP16'" in str(
        failure.value
    )


def _raw_classification(value: pb.InferParameter) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 2])
    request = pb.ModelInferRequest(model_name="identity_fp32", inputs=[tensor])
    request.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    output = request.outputs.add(name="OUTPUT0")
    output.parameters["classification"].CopyFrom(value)
    return request


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (
            pb.InferParameter(string_param="2"),
            "invalid value type for 'classification' parameter, expected int64_param",
        ),
        (
            pb.InferParameter(int64_param=0),
            "invalid value for 'classification' parameter, expected >= 0",
        ),
    ],
)
def test_bad_class_count_is_tritons_invalid_argument(door: BridgeServer, value, text):
    with grpc.insecure_channel(door.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(_raw_classification(value), timeout=30)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.value.details() == text
