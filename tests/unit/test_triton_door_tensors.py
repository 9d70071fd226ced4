"""The triton door's protobuf ⇄ bridge form conversion (bridge/frontends/triton/grpc/tensors.py),
and its refusals, which the conversion straight into the loader's request shares.

Texts are Triton 2.51's, captured from the real server with raw protobuf requests.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.grpc.tensors import (
    region_input_bytes,
    to_bridge_request,
    to_infer_response,
    to_loader_request,
)
from bridge.serialized_bytes import BytesLimits

T = pb.ModelInferRequest.InferInputTensor


def request(datatype: str = "FP32", shape=(1, 4), raw: bytes | None = None, **kwargs):
    r = pb.ModelInferRequest(
        model_name="m", inputs=[T(name="INPUT0", datatype=datatype, shape=list(shape))], **kwargs
    )
    if raw is not None:
        r.raw_input_contents.append(raw)
    return r


def error_of(r: pb.ModelInferRequest, config: mc.ModelConfig | None = None) -> str:
    """The door's refusal of `r`: the same code and text from both conversions (the bridge
    form's, and the unary thread path's straight into the loader's request)."""
    with pytest.raises(DoorError) as caught:
        to_bridge_request(r, "", config)
    with pytest.raises(DoorError) as direct:
        to_loader_request(
            r, "", config or mc.ModelConfig(name="m"), BytesLimits(), r.raw_input_contents
        )
    assert (direct.value.code, direct.value.message) == (caught.value.code, caught.value.message)
    return caught.value.message


FOUR = np.arange(4, dtype=np.float32).tobytes()


def test_raw_input_travels_as_the_same_bytes():
    r = request(raw=FOUR, id="a", model_version="2")
    r.parameters["sequence_id"].int64_param = 7
    r.outputs.add().name = "OUTPUT0"
    body = to_bridge_request(r, "2")
    tensor = body["tensors"][0]
    assert tensor["data"]["values"] == FOUR
    assert tensor["metadata"] == {"name": "INPUT0", "data_type": "Float32", "shape": [1, 4]}
    assert body["bridge_form"] == 1 and body["model_version"] == "2" and body["id"] == "a"
    assert body["parameters"] == {"sequence_id": {"int64": 7}}
    assert body["outputs"] == [{"name": "OUTPUT0"}]


def test_typed_contents_are_packed_once():
    r = request(datatype="INT16", shape=[3])
    r.inputs[0].contents.int_contents.extend([1, -2, 3])
    assert (
        to_bridge_request(r, "")["tensors"][0]["data"]["values"]
        == np.array([1, -2, 3], np.int16).tobytes()
    )
    r = request(datatype="BYTES", shape=[2])
    r.inputs[0].contents.bytes_contents.extend([b"ab", b""])
    packed = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0)
    assert to_bridge_request(r, "")["tensors"][0]["data"]["values"] == packed


@pytest.mark.parametrize(
    ("raw", "shape", "expected"),
    [
        (FOUR[:12], (1, 4), "Expected 16, got 12"),
        (FOUR + b"x", (1, 4), "Expected 16, got 17"),
        (FOUR, (1, 1 << 40), "Expected 4398046511104, got 16"),
    ],
)
def test_raw_size_must_fit_the_shape(raw: bytes, shape, expected: str):
    assert error_of(request(raw=raw, shape=shape)) == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'm'. "
        + expected
    )


def test_where_the_data_is():
    assert error_of(request()) == (
        "unable to find data for input tensor 'INPUT0' for model 'm' in request."
    )
    both = request(raw=FOUR)
    both.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    assert error_of(both) == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
        "model 'm'"
    )
    wrong = request()
    wrong.inputs[0].contents.int_contents.extend([1, 2, 3, 4])
    assert error_of(wrong) == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'm' of type "
        "'INT32', expected datatype 'FP32'"
    )
    missing = request(raw=FOUR)
    missing.inputs.append(T(name="INPUT1", datatype="FP32", shape=[1, 4]))
    assert error_of(missing) == (
        "unable to find data for input tensor 'INPUT1' for model 'm' in request."
    )


def test_region_input_bytes_adds_up_the_spans_inputs_name_in_regions():
    """What decides whether converting a request reads its regions off the event loop: the
    inputs' spans, not the outputs', nor bytes sent in the message."""
    r = request(raw=FOUR)
    assert region_input_bytes(r) == 0
    for name, size in (("IN_A", 3 << 20), ("IN_B", 5)):
        placed = r.inputs.add(name=name, datatype="FP32", shape=[1])
        placed.parameters["shared_memory_region"].string_param = "region"
        placed.parameters["shared_memory_byte_size"].int64_param = size
        placed.parameters["shared_memory_offset"].int64_param = 64
    out = r.outputs.add(name="OUT")
    out.parameters["shared_memory_region"].string_param = "region"
    out.parameters["shared_memory_byte_size"].int64_param = 1 << 30
    assert region_input_bytes(r) == (3 << 20) + 5
    negative = r.inputs.add(name="IN_C", datatype="FP32", shape=[1])
    negative.parameters["shared_memory_region"].string_param = "region"
    negative.parameters["shared_memory_byte_size"].int64_param = -(1 << 40)
    assert region_input_bytes(r) == (3 << 20) + 5  # it cannot cancel the others out


def test_a_conversion_on_a_thread_refuses_as_the_loop_s_way_does():
    """Off the loop (large region inputs), the deferred BYTES checks still run last: a request
    with a large broken BYTES input and a later fault gets the later fault's text, as on the
    loop's way (the deferred checks run after the conversion)."""
    from functools import partial

    from bridge.frontends.triton.grpc.servicer import _convert_here
    from bridge.frontends.triton.tensor_checks import run_deferred_here

    broken = _bytes(b"x" * (1 << 19)) + b"zz"  # past OFF_LOOP_BYTES: its walk is deferred
    r = request("BYTES", shape=(1, 1), raw=broken)
    r.parameters["triton_reserved"].string_param = "x"  # a fault found after the inputs
    deferred: list = []
    with pytest.raises(DoorError) as on_loop:
        to_bridge_request(r, "", None, deferred=deferred)
        run_deferred_here(deferred)
    with pytest.raises(DoorError) as on_thread:
        _convert_here(partial(to_bridge_request, r, "", None))
    assert on_thread.value.message == on_loop.value.message
    assert "parameter keys starting with 'triton_' are reserved" in on_loop.value.message


def test_datatype_and_shape():
    config = mc.ModelConfig(name="m")
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32)
    assert error_of(request(datatype="FP8", raw=FOUR), config) == (
        "[request id: <id_unknown>] inference input 'INPUT0' data-type is '<invalid>', but "
        "model 'm' expects 'FP32'"
    )
    assert error_of(request(shape=(1, -1), raw=FOUR)) == (
        "[request id: <id_unknown>] All input dimensions should be specified for input "
        "'INPUT0' for model 'm', got [1,-1]"
    )


def _bytes(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


@pytest.mark.parametrize(
    ("raw", "shape", "expected"),
    [
        (
            struct.pack("<I", 3) + b"abc" + struct.pack("<I", 9) + b"x",
            (1, 2),
            "incomplete string data for inference input 'INPUT0', expecting string of length 9 "
            "but only 1 bytes available",
        ),
        (
            _bytes(b"abc"),
            (1, 2),
            "[request id: <id_unknown>] expected 2 string elements for inference input 'INPUT0' "
            "for model 'm', got 1",
        ),
        (
            struct.pack("<I", 3) + b"ab",
            (1, 2),
            "[request id: <id_unknown>] expected 2 string elements for inference input 'INPUT0' "
            "for model 'm', got 1",
        ),
        (
            _bytes(b"a", b"b"),
            (1, 1),
            "[request id: <id_unknown>] unexpected number of string elements 2 for inference "
            "input 'INPUT0' for model 'm', expecting 1",
        ),
        (
            _bytes(b"abc") + b"zz",
            (1, 1),
            "[request id: <id_unknown>] incomplete string length indicator for inference input "
            "'INPUT0' for model 'm', expecting 4 bytes but only 2 bytes available. Please make "
            "sure the string length indicator is in one buffer.",
        ),
    ],
    ids=["length-past-end", "too-few-elements", "cut-short-too-few", "too-many", "broken-prefix"],
)
def test_bytes_framing(raw: bytes, shape, expected: str):
    assert error_of(request(datatype="BYTES", shape=shape, raw=raw)) == expected


def test_bytes_framing_accepts_empty_elements():
    raw = _bytes(b"", b"x")
    assert to_bridge_request(request("BYTES", (2,), raw), "")["tensors"][0]["data"]["values"] == raw


def test_response():
    r = request(raw=FOUR, id="abc")
    item = {
        "model": "m",
        "model_version": "3",
        "final": True,
        "tensors": [
            {
                "metadata": {"name": "OUT", "data_type": "Float32", "shape": [1, 4]},
                "data": {"data_type": "Float32", "values": FOUR},
            }
        ],
        "parameters": {"triton_final_response": {"bool": True}, "n": {"int64": 2}},
    }
    unary = to_infer_response(r, item)
    assert (unary.model_name, unary.model_version, unary.id) == ("m", "3", "abc")
    assert unary.raw_output_contents == [FOUR]
    assert [(o.name, o.datatype, list(o.shape)) for o in unary.outputs] == [("OUT", "FP32", [1, 4])]
    assert dict(unary.parameters) == {"n": pb.InferParameter(int64_param=2)}
    streamed = to_infer_response(r, item, final=False)
    assert streamed.parameters["triton_final_response"].bool_param is False


def test_triton_parameters_other_than_the_stream_option_are_refused():
    """Triton's gRPC wire (2.33 on, 2.71 too): a request parameter starting with `triton_` is
    INVALID_ARG unless it is `triton_enable_empty_final_response`."""
    r = request(raw=FOUR)
    r.parameters["triton_enable_empty_final_response"].bool_param = True
    assert "triton_enable_empty_final_response" in to_bridge_request(r, "")["parameters"]
    r.parameters["triton_final_response"].bool_param = True
    assert error_of(r) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
    )
