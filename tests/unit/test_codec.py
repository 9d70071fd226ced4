"""The Dynamo tensor codec: every datatype both ways, in the exact shapes Dynamo 1.6 uses.

The wire forms asserted here are the ones spec/dynamo_runtime.md §1 records from the real
frontend (e.g. FP16 1.5 arrives as the u16 bit pattern 15872).
"""

from __future__ import annotations

import numpy as np
import pytest

from bridge.codec import (
    decode_request,
    decode_tensor,
    encode_response,
    encode_tensor,
    release_raw_inputs,
)
from bridge.serialized_bytes import encode
from model_repository_loader.pb_utils import InferenceResponse, Tensor
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError


def wire(name: str, data_type: str, shape: list[int], values: list) -> dict:
    return {
        "metadata": {"name": name, "data_type": data_type, "shape": shape},
        "data": {"data_type": data_type, "values": values},
    }


@pytest.mark.parametrize(
    ("data_type", "values", "dtype"),
    [
        ("Bool", [True, False], np.bool_),
        ("Uint8", [0, 255], np.uint8),
        ("Uint16", [0, 65535], np.uint16),
        ("Uint32", [0, 2**32 - 1], np.uint32),
        ("Uint64", [0, 2**64 - 1], np.uint64),
        ("Int8", [-128, 127], np.int8),
        ("Int16", [-(2**15), 2**15 - 1], np.int16),
        ("Int32", [-(2**31), 2**31 - 1], np.int32),
        ("Int64", [-(2**63), 2**63 - 1], np.int64),
        ("Float32", [1.5, -2.25], np.float32),
        ("Float64", [1e300, -2.5], np.float64),
    ],
)
def test_numeric_round_trip_keeps_dtype_values_and_python_builtins(data_type, values, dtype):
    tensor = decode_tensor(wire("X", data_type, [2], values))
    array = tensor.as_numpy()
    assert array.dtype == dtype
    assert array.tolist() == values
    assert array.flags.writeable  # Triton hands models writable inputs
    out = encode_tensor(tensor)
    assert out["metadata"] == {"name": "X", "data_type": data_type, "shape": [2]}
    assert out["data"]["values"] == values
    # Dynamo rejects numpy scalars: every value must be a Python builtin.
    assert all(type(v) in (bool, int, float) for v in out["data"]["values"])


def test_fp16_travels_as_u16_bit_patterns():
    tensor = decode_tensor(wire("H", "Float16", [2], [15872, 49152]))  # 1.5, -2.0 (0x3E00, 0xC000)
    assert tensor.as_numpy().dtype == np.float16
    assert tensor.as_numpy().tolist() == [1.5, -2.0]
    out = encode_tensor(Tensor("H", np.array([1.5, -2.0], np.float16)))
    assert out["data"]["values"] == [15872, 49152]


def test_bf16_keeps_its_bits_and_datatype():
    tensor = decode_tensor(wire("B", "BFloat16", [1], [16320]))  # BF16 1.5
    assert tensor._datatype == "BF16"
    out = encode_tensor(tensor)
    assert out["metadata"]["data_type"] == "BFloat16"
    assert out["data"]["values"] == [16320]


def test_bytes_arrive_as_int_lists_and_leave_as_bytes_objects():
    raw = [list(b"ab\x00c"), list(b"\xff\xfe"), []]
    tensor = decode_tensor(wire("S", "Bytes", [3], raw))
    array = tensor.as_numpy()
    assert array.dtype == np.object_
    assert array.tolist() == [b"ab\x00c", b"\xff\xfe", b""]
    out = encode_tensor(tensor)
    assert out["data"]["values"] == [b"ab\x00c", b"\xff\xfe", b""]


def test_shapes_pass_through_including_scalars_and_empty_tensors():
    assert decode_tensor(wire("X", "Float32", [2, 3], [0.0] * 6)).shape() == [2, 3]
    assert decode_tensor(wire("X", "Float32", [], [7.0])).shape() == []
    assert decode_tensor(wire("X", "Int32", [2, 0], [])).shape() == [2, 0]
    assert encode_tensor(Tensor("X", np.zeros((0, 4), np.int32)))["metadata"]["shape"] == [0, 4]


def test_request_fields_and_typed_parameters():
    request = decode_request(
        {
            "id": "req-7",
            "model": "m",
            "tensors": [wire("X", "Int32", [1], [5])],
            "parameters": {
                "flag": {"bool": True},
                "count": {"int64": 3},
                "name": {"string": "s"},
                "ratio": {"double": 0.5},
                "priority": {"uint64": 2},
            },
            "outputs": [{"name": "Y", "parameters": {}}],
        }
    )
    assert request.request_id == "req-7"
    assert [t.name() for t in request.inputs] == ["X"]
    assert request.requested_outputs == ["Y"]
    assert request.parameters == {
        "flag": True,
        "count": 3,
        "name": "s",
        "ratio": 0.5,
        "priority": 2,
    }


def test_request_without_optional_keys():
    request = decode_request({"model": "m", "tensors": []})
    assert (request.request_id, request.inputs, request.requested_outputs) == ("", [], [])
    assert request.parameters == {}


def test_response_carries_tensors_and_typed_parameters():
    response = InferenceResponse(
        [Tensor("Y", np.array([[1, 2]], np.int64))],
        parameters={"done": True, "n": 2, "tag": "x"},
    )
    out = encode_response("m", response)
    assert out["model"] == "m"
    assert out["tensors"][0]["data"]["values"] == [1, 2]
    assert out["parameters"] == {"done": {"bool": True}, "n": {"int64": 2}, "tag": {"string": "x"}}
    assert "parameters" not in encode_response("m", InferenceResponse([]))


# -- malformed requests the frontend lets through (issue 16) --------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("timeout", {"string": "soon"}, "int64_param"),
        ("timeout", {"double": float("inf")}, "int64_param"),
        ("priority", {"string": "high"}, "uint64_param"),
        ("sequence_id", {"double": 1.5}, "int64_param or string_param"),
        ("sequence_start", {"int64": 1}, "bool_param"),
        ("sequence_end", {"string": "true"}, "bool_param"),
    ],
)
def test_reserved_parameter_of_the_wrong_kind_is_invalid_arg(name, value, expected):
    with pytest.raises(RequestError) as caught:
        decode_request({"tensors": [], "parameters": {name: value}})
    assert str(caught.value) == f"invalid value type for '{name}' parameter, expected {expected}."
    assert caught.value.code == ErrorCode.INVALID_ARG


def test_reserved_parameters_of_the_right_kinds_and_custom_ones_pass():
    parameters = {
        "timeout": {"int64": 5},
        "priority": {"uint64": 2},
        "sequence_id": {"string": "s"},
        "sequence_start": {"bool": True},
        "custom": {"double": 1.5},
    }
    request = decode_request({"tensors": [], "parameters": parameters})
    assert request.parameters == {
        "timeout": 5,
        "priority": 2,
        "sequence_id": "s",
        "sequence_start": True,
        "custom": 1.5,
    }


def test_undecodable_tensor_is_invalid_arg():
    broken = wire("X", "Float32", [3], [1.0, 2.0])  # 2 values for 3 elements
    with pytest.raises(RequestError) as caught:
        decode_request({"tensors": [broken]})
    assert str(caught.value).startswith("malformed inference input: ValueError: ")


def test_a_decoded_request_lets_go_of_its_raw_contents() -> None:
    """Issue 38, finding 7: once decoded, the bridge form's raw bytes are dropped from the
    request dict (an in-process door holds that dict until the answer), and the tensors keep
    what they need."""

    strings = np.array([b"ab", b"cde"], dtype=np.object_)
    numbers = np.arange(3, dtype=np.float32)
    request = {
        "model": "m",
        "tensors": [
            {
                "metadata": {"name": "S", "data_type": "Bytes", "shape": [2]},
                "data": {"data_type": "Bytes", "values": bytes(encode(strings))},
            },
            {
                "metadata": {"name": "F", "data_type": "Float32", "shape": [3]},
                "data": {"data_type": "Float32", "values": numbers.tobytes()},
            },
        ],
    }
    decoded = decode_request(request)
    release_raw_inputs(request)
    assert [t["data"]["values"] for t in request["tensors"]] == [b"", b""]
    by_name = {t.name(): t.as_numpy() for t in decoded.inputs}
    assert by_name["S"].tolist() == [b"ab", b"cde"]
    np.testing.assert_array_equal(by_name["F"], numbers)
