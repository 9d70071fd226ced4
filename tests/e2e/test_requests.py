"""What a request carries reaches the model, and what the model returns reaches the client.

Expected values are Triton's [V]: parameters() is the compact JSON of the custom parameters with
their types kept; the response echoes the request id; only requested outputs come back.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.support import SERVING, fp32_input

ALL_OUTPUTS = ["OUTPUT0", "TEXT", "PARAMS", "REQUEST_ID"]


@pytest.fixture
def client(shared_bridge_server):
    return shared_bridge_server(SERVING).client()


def output_names(result: grpcclient.InferResult) -> list[str]:
    return [o.name for o in result.get_response().outputs]


def model_parameters(result: grpcclient.InferResult) -> str:
    return result.as_numpy("PARAMS")[0].decode()


def test_parameters_of_every_type_reach_the_model(client) -> None:
    sent = {"flag": True, "off": False, "count": 3, "neg": -7, "name": "ünï code", "ratio": 1.5}
    result = client.infer("echo", [fp32_input([1.0])], parameters=sent)
    raw = model_parameters(result)
    received = json.loads(raw)
    assert received == sent
    # Types survive the trip: bool stays bool (not 1), int stays int, double stays float.
    assert {k: type(v) for k, v in received.items()} == {k: type(v) for k, v in sent.items()}
    assert ", " not in raw and ": " not in raw  # Triton's text is compact


def test_no_parameters_gives_empty_object(client) -> None:
    result = client.infer("echo", [fp32_input([1.0])])
    assert json.loads(model_parameters(result)) == {}


def test_request_id_reaches_model_and_response(client) -> None:
    result = client.infer("echo", [fp32_input([1.0])], request_id="rid-42")
    assert result.as_numpy("REQUEST_ID")[0].decode() == "rid-42"
    assert result.get_response().id == "rid-42"


def test_no_request_id_is_empty(client) -> None:
    result = client.infer("echo", [fp32_input([1.0])])
    assert result.as_numpy("REQUEST_ID")[0].decode() == ""
    assert result.get_response().id == ""


def test_all_outputs_without_requested_outputs(client) -> None:
    result = client.infer("echo", [fp32_input([1.0, 2.0])])
    assert output_names(result) == ALL_OUTPUTS
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2], np.float32))


@pytest.mark.parametrize("wanted", [["TEXT"], ["REQUEST_ID", "OUTPUT0"], ["PARAMS"]])
def test_requested_outputs_filter_the_response(client, wanted: list[str]) -> None:
    outputs = [grpcclient.InferRequestedOutput(name) for name in wanted]
    result = client.infer("echo", [fp32_input([1.0])], outputs=outputs, request_id="f")
    assert sorted(output_names(result)) == sorted(wanted)
    for name in set(ALL_OUTPUTS) - set(wanted):
        assert result.as_numpy(name) is None


def test_bytes_outputs(client) -> None:
    result = client.infer("echo", [fp32_input([1.5, -2.0, 1e10, 0.0])])
    text = result.as_numpy("TEXT")
    assert text.dtype == np.object_
    assert text.tolist() == [b"1.5", b"-2", b"1e+10", b"0"]
    response = result.get_response()
    assert [o.datatype for o in response.outputs] == ["FP32", "BYTES", "BYTES", "BYTES"]
    assert list(response.outputs[1].shape) == [4]


def test_output_values_round_trip(client) -> None:
    values = np.array([0.1, -3.25, 65504.0, np.inf], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(values)
    result = client.infer("echo", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_response_parameters_reach_the_client_with_their_types(client) -> None:
    # InferenceResponse(parameters=...) (Triton 25.02+) -> the response's typed parameters.
    result = client.infer(
        "reply_params",
        [fp32_input([1.0, 2.0, 3.0])],
        parameters={"label": "héllo", "flag": True, "limit": 7},
    )
    parameters = result.get_response().parameters
    assert parameters["label"].string_param == "héllo"
    assert parameters["flag"].bool_param is True
    assert parameters["limit"].int64_param == 7
    assert parameters["element_count"].int64_param == 3
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [1.0, 2.0, 3.0])
