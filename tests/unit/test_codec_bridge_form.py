"""The bridge tensor form (bridge/codec.py, docs/worker_protocol.md §2): raw `bytes` values for any
tensor, and the bridge-form answers, both ways, for every datatype; broken raw contents get
Triton's texts (INVALID_ARG)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bridge.codec import (
    bridge_error,
    decode_bridge_item,
    decode_request,
    decode_tensor,
    encode_bridge_request,
    encode_bridge_response,
    encode_raw_tensor,
    raw_contents,
)
from bridge.serialized_bytes import BytesLimits
from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse, Tensor, TritonError
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError

ARRAYS = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([0, 255, 7], np.uint8),
    "UINT16": np.array([0, 65535], np.uint16),
    "UINT32": np.array([0, 2**32 - 1], np.uint32),
    "UINT64": np.array([0, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 127], np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], np.int16),
    "INT32": np.array([[-(2**31)], [2**31 - 1]], np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([1.5, -2.0, 65504.0], np.float16),
    "FP32": np.array([[1.5, -2.25], [3.0, 0.0]], np.float32),
    "FP64": np.array([1e300, -2.5], np.float64),
    "BF16": np.array([16320, 49024], np.uint16),  # stored as bit patterns: 1.5, -1.0
    "BYTES": np.array([b"", b"abc", "é".encode(), b"\x00\x01"], dtype=object),
}


def stored(datatype: str) -> Tensor:
    return Tensor._from_wire("X", ARRAYS[datatype], datatype)


@pytest.mark.parametrize("datatype", sorted(ARRAYS))
def test_every_datatype_round_trips_through_raw_contents(datatype):
    wire = encode_raw_tensor(stored(datatype))
    assert isinstance(wire["data"]["values"], bytes)
    assert wire["metadata"]["shape"] == list(ARRAYS[datatype].shape)
    tensor = decode_tensor(wire)
    array = tensor._array
    assert tensor._datatype == datatype
    assert array.dtype == ARRAYS[datatype].dtype
    assert array.shape == ARRAYS[datatype].shape
    assert array.tolist() == ARRAYS[datatype].tolist()
    assert array.flags.writeable  # Triton hands models writable inputs; `bytes` are read-only


def test_raw_contents_are_kserves_layout():
    assert raw_contents(stored("FP32")) == np.array([1.5, -2.25, 3.0, 0.0], "<f4").tobytes()
    assert raw_contents(stored("FP16")) == np.array([1.5, -2.0, 65504.0], "<f2").tobytes()
    assert raw_contents(stored("BOOL")) == bytes([1, 0, 1, 0, 0, 1])
    expected = b"".join(struct.pack("<I", len(b)) + b for b in ARRAYS["BYTES"])
    assert raw_contents(stored("BYTES")) == expected
    # A non-contiguous view goes out in C order.
    view = np.arange(6, dtype=np.int32).reshape(2, 3).T
    assert raw_contents(Tensor._from_wire("T", view, "INT32")) == view.copy().tobytes()


def test_bytes_elements_that_are_not_bytes_go_out_as_triton_serializes_them():
    tensor = Tensor("S", np.array(["ab", 7], dtype=object))
    assert raw_contents(tensor) == b"\x02\x00\x00\x00ab\x01\x00\x00\x007"


def test_bool_bytes_other_than_one_are_true():
    wire = raw("B", "Bool", [3], bytes([0, 2, 255]))
    assert decode_tensor(wire)._array.tolist() == [False, True, True]


def raw(name: str, data_type: str, shape: list[int], values: bytes) -> dict:
    return {
        "metadata": {"name": name, "data_type": data_type, "shape": shape},
        "data": {"data_type": data_type, "values": values},
    }


def refusal(tensor: dict) -> RequestError:
    with pytest.raises(RequestError) as caught:
        decode_request({"id": "r7", "tensors": [tensor]}, "m")
    assert caught.value.code == ErrorCode.INVALID_ARG
    return caught.value


def test_a_size_that_does_not_fit_the_shape_is_refused_with_tritons_text():
    error = refusal(raw("INPUT0", "Float32", [4], b"\x00" * 8))
    assert str(error) == (
        "[request id: r7] input byte size mismatch for input 'INPUT0' for model 'm'. "
        "Expected 16, got 8"
    )


def test_a_broken_length_prefix_is_refused():
    error = refusal(raw("S", "Bytes", [2], b"\x01\x00\x00\x00a\x05\x00"))
    assert str(error) == (
        "[request id: r7] incomplete string length indicator for inference input 'S' for model "
        "'m', expecting 4 bytes but only 2 bytes available. Please make sure the string length "
        "indicator is in one buffer."
    )


def test_a_length_beyond_the_data_is_refused():
    error = refusal(raw("S", "Bytes", [1], b"\x05\x00\x00\x00ab"))
    assert str(error) == (
        "incomplete string data for inference input 'S', expecting string of length 5 but "
        "only 2 bytes available"
    )


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        ([3], "expected 3 string elements for inference input 'S' for model 'm', got 2"),
        (
            [1],
            "unexpected number of string elements 2 for inference input 'S' for model 'm', "
            "expecting 1",
        ),
    ],
)
def test_an_element_count_that_does_not_fit_the_shape_is_refused(shape, text):
    """The worker words framing faults as the door does (Triton's texts)."""
    error = refusal(raw("S", "Bytes", shape, b"\x01\x00\x00\x00a\x00\x00\x00\x00"))
    assert str(error) == f"[request id: r7] {text}"


def _large_bytes(count: int) -> tuple[list[bytes], bytes]:
    """`count` elements of many lengths, framed: past SMALL, so decoded late."""
    items = [b"%d" % i * (1 + i % 5) for i in range(count)]
    return items, b"".join(struct.pack("<I", len(v)) + v for v in items)


def test_a_large_bytes_input_is_decoded_only_when_read():
    """Issue 38 finding 7: a request waiting for its instance holds a large BYTES input in its
    serialized form; its objects are made when the model reads it, once."""
    import tracemalloc

    items, data = _large_bytes(50_000)
    request = {"id": "r7", "tensors": [raw("S", "Bytes", [2, 25_000], data)]}
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        decoded = decode_request(request, "m", BytesLimits())
        waiting, _ = tracemalloc.get_traced_memory()
        tensor = decoded.inputs[0]
        assert tensor.shape() == [2, 25_000] and tensor.name() == "S"
        renamed = tensor._renamed("T")  # an ensemble step's input, before the model reads it
        array = tensor.as_numpy()
        read, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Waiting: no object per element (50,000 of them would be >2.6 MB).
    assert waiting - before < 200_000
    assert read - before > 50_000 * 40
    assert array.shape == (2, 25_000) and array.reshape(-1).tolist() == items
    assert tensor.as_numpy() is array
    assert renamed.as_numpy().reshape(-1)[-1] is array.reshape(-1)[-1]  # one decode, shared


@pytest.mark.parametrize(
    ("shape", "cut", "text"),
    [
        (
            [50_001],
            0,
            "[request id: r7] expected 50001 string elements for inference input 'S' "
            "for model 'm', got 50000",
        ),
        (
            [49_999],
            0,
            "[request id: r7] unexpected number of string elements 50000 for "
            "inference input 'S' for model 'm', expecting 49999",
        ),
        (
            [50_000],
            2,
            "[request id: r7] incomplete string length indicator for inference input "
            "'S' for model 'm', expecting 4 bytes but only 2 bytes available. Please make sure "
            "the string length indicator is in one buffer.",
        ),
        (
            [50_000],
            9,
            "incomplete string data for inference input 'S', expecting string of "
            "length 25 but only 16 bytes available",
        ),
    ],
)
def test_a_large_bytes_input_is_checked_when_admitted(shape, cut, text):
    """Decoded late, but refused at admission with Triton's texts."""
    _, data = _large_bytes(50_000)
    if cut == 2:
        data += b"\x01\x00"
    elif cut:
        data = data[:-cut]
    error = refusal(raw("S", "Bytes", shape, data))
    assert str(error) == text


def test_a_large_bytes_input_over_the_decoded_size_limit_is_refused_when_admitted():
    items, data = _large_bytes(50_000)
    decoded = 50_000 * 8 + sum(33 + len(v) for v in items if len(v) > 1)
    request = {"id": "r7", "tensors": [raw("S", "Bytes", [50_000], data)]}
    with pytest.raises(RequestError) as caught:
        decode_request(request, "m", BytesLimits(max_decoded_size=decoded - 1))
    assert str(caught.value) == (
        f"[request id: r7] inference request for model 'm' has {decoded} bytes of BYTES inputs "
        f"once decoded, more than the {decoded - 1} this server accepts (--max-bytes-decoded-size)"
    )
    assert decode_request(request, "m", BytesLimits(max_decoded_size=decoded)).inputs


def test_raw_and_list_tensors_mix_in_one_request():
    request = decode_request(
        {
            "tensors": [
                raw("A", "Int32", [2], np.array([5, 6], "<i4").tobytes()),
                {
                    "metadata": {"name": "B", "data_type": "Int32", "shape": [1]},
                    "data": {"data_type": "Int32", "values": [9]},
                },
            ]
        }
    )
    assert [t.as_numpy().tolist() for t in request.inputs] == [[5, 6], [9]]


def test_a_bridge_request_decodes_to_the_request_it_was_made_from():
    original = InferRequest(
        inputs=[stored("FP32"), Tensor._from_wire("S", ARRAYS["BYTES"], "BYTES")],
        requested_outputs=["OUT"],
        request_id="q1",
        parameters={"timeout": 5, "sequence_start": True, "tag": "t", "ratio": 0.5},
        model_version=2,
    )
    wire = encode_bridge_request(original)
    assert wire["bridge_form"] == 1
    assert wire["model_version"] == "2"
    decoded = decode_request(wire, "m")
    assert decoded.request_id == "q1"
    assert decoded.requested_outputs == ["OUT"]
    assert decoded.parameters == original.parameters
    assert [t._array.tolist() for t in decoded.inputs] == [
        ARRAYS["FP32"].tolist(),
        ARRAYS["BYTES"].tolist(),
    ]
    assert "model_version" not in encode_bridge_request(InferRequest(inputs=[]))


def test_bridge_answers_round_trip():
    response = InferenceResponse([stored("INT64")], parameters={"k": 3})
    item = encode_bridge_response("m", "1", response, False)
    assert item["final"] is False and item["model_version"] == "1"
    assert isinstance(item["tensors"][0]["data"]["values"], bytes)
    back, final, rejected = decode_bridge_item(item)
    assert (final, rejected) == (False, False)
    assert back.output_tensors()[0].as_numpy().tolist() == ARRAYS["INT64"].tolist()
    assert back.parameters() == '{"k": 3}'

    empty = encode_bridge_response("m", "1", None, True)
    assert empty["final"] is True and empty["empty"] is True and empty["tensors"] == []
    assert decode_bridge_item(empty) == (None, True, False)


def test_bytes_answers_stay_in_their_framed_buffer_only_in_process():
    """Issue 38 finding 7: a BYTES output is framed into one bytearray; a unary answer to the
    in-process door keeps it (the wires send it as it is), anything that may cross the request
    plane gets `bytes` (Dynamo's msgpack refuses a bytearray: "cannot be converted to
    'PyBytes'", measured on 1.6.1)."""
    response = InferenceResponse([stored("BYTES")])
    expected = b"".join(struct.pack("<I", len(v)) + v for v in ARRAYS["BYTES"])
    local = encode_bridge_response("m", "1", response, True, local=True)
    crossing = encode_bridge_response("m", "1", response, True)
    assert type(local["tensors"][0]["data"]["values"]) is bytearray
    assert type(crossing["tensors"][0]["data"]["values"]) is bytes
    assert local["tensors"][0]["data"]["values"] == crossing["tensors"][0]["data"]["values"]
    assert crossing["tensors"][0]["data"]["values"] == expected
    request = encode_bridge_request(InferRequest(inputs=[stored("BYTES")]))
    assert type(request["tensors"][0]["data"]["values"]) is bytes


def test_errors_are_items_with_their_code_name():
    item = bridge_error(TritonError("no", TritonError.NOT_FOUND), final=False)
    assert item == {"error": {"code": "NOT_FOUND", "message": "no"}, "final": False}
    response, final, rejected = decode_bridge_item(item)
    assert response.error().code() == ErrorCode.NOT_FOUND
    assert response.error().message() == "no"
    assert (final, rejected) == (False, False)
    refused = bridge_error(TritonError("bad", TritonError.INVALID_ARG), True, rejected=True)
    assert decode_bridge_item(refused)[1:] == (True, True)
    # A code this side does not know is INTERNAL.
    odd = {"error": {"code": "WHATEVER", "message": "x"}, "final": True}
    assert decode_bridge_item(odd)[0].error().code() == ErrorCode.INTERNAL


# -- lent buffers, in-process only (issue 27) ------------------------------------------------------


def test_a_lent_input_reaches_the_model_as_a_view_of_it():
    lent = bytearray(np.arange(6, dtype=np.float32).tobytes())
    tensor = {
        "metadata": {"name": "x", "data_type": "Float32", "shape": [2, 3]},
        "data": {"data_type": "Float32", "values": memoryview(lent)},
    }
    array = decode_tensor(tensor).as_numpy()
    assert array.shape == (2, 3) and array.flags.writeable
    lent[:4] = np.float32(42).tobytes()
    assert array[0, 0] == 42  # no copy
    boolean = {  # BOOL bytes other than 0/1 are True: copied, as for bytes
        "metadata": {"name": "b", "data_type": "Bool", "shape": [2]},
        "data": {"data_type": "Bool", "values": memoryview(bytearray(b"\x00\x07"))},
    }
    assert decode_tensor(boolean).as_numpy().tolist() == [False, True]


class Sink:
    def __init__(self, room: int) -> None:
        self.room = room
        self.written: list[bytes] = []

    def write(self, data: memoryview) -> bool:
        if data.nbytes > self.room:
            return False
        self.written.append(bytes(data.cast("B")))
        return True


def test_an_output_with_a_sink_is_written_with_it_when_sent():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for given in (array, array.T, array.astype(np.float64)):  # a view, C order or not
        sink = Sink(1024)
        tensor = Tensor("OUTPUT0", given.astype(np.float32) if given.dtype != np.float32 else given)
        item = encode_raw_tensor(tensor, sink)
        assert item["data"] == {"data_type": "Float32", "values": b"", "written": True}
        assert sink.written == [np.ascontiguousarray(tensor.as_numpy()).tobytes()]
    small = Sink(8)  # it does not fit: bytes, and the door says Triton's error
    item = encode_raw_tensor(Tensor("OUTPUT0", array), small)
    assert item["data"]["values"] == array.tobytes() and "written" not in item["data"]
    text = Tensor("T", np.array([b"ab"], dtype=np.object_))  # BYTES: never through a sink
    assert "written" not in encode_raw_tensor(text, Sink(1024))["data"]
    response = InferenceResponse([Tensor("OUTPUT0", array), Tensor("OTHER", array)])
    out = encode_bridge_response("m", "1", response, True, sinks={"OUTPUT0": Sink(1024)})
    assert [t["data"].get("written", False) for t in out["tensors"]] == [True, False]
