"""The gRPC door's inference messages (bridge/frontends/triton/grpc/wire.py), held against the
protobuf library itself: requests read as its parser reads them (the same message, the same raw
contents, the same refusals), answers that its parser reads back whole."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from bridge.frontends.triton.grpc.tensors import to_bridge_request
from bridge.frontends.triton.grpc.wire import (
    MALFORMED,
    MAX_FIELDS,
    SPLIT_BYTES,
    InferRequest,
    InferResponse,
    framed,
    read_infer_request,
    write_infer_response,
    write_stream_response,
)


def _request(raw_sizes: list[int], *, extras: bool = True) -> pb.ModelInferRequest:
    """A request with one FP32 input per raw size (in bytes), and, with `extras`, every other
    kind of field around them (parameters, outputs, an input with typed contents)."""
    request = pb.ModelInferRequest(model_name="identity_fp32", model_version="1", id="r-7")
    for index, size in enumerate(raw_sizes):
        tensor = request.inputs.add(name=f"IN{index}", datatype="FP32", shape=[size // 4])
        tensor.parameters["tag"].string_param = f"input {index}"
        values = np.arange(size // 4, dtype=np.float32) + index
        request.raw_input_contents.append(values.tobytes())
    if extras:
        request.parameters["priority"].int64_param = 3
        request.parameters["sequence_start"].bool_param = True
        request.outputs.add(name="OUT0").parameters["binary_data"].bool_param = True
    return request


def _without_raw(message: pb.ModelInferRequest) -> tuple[pb.ModelInferRequest, list[bytes]]:
    """A copy of `message` without its raw contents, and those contents."""
    copy = pb.ModelInferRequest()
    copy.CopyFrom(message)
    raw = list(copy.raw_input_contents)
    del copy.raw_input_contents[:]
    return copy, raw


def _assert_read_as_the_parser_reads(received: object, data: bytes) -> None:
    """`received` is what the protobuf parser reads from `data`: the same message apart from
    the raw contents, and the same raw contents, in order."""
    assert isinstance(received, InferRequest), len(data)
    expected_message, expected_raw = _without_raw(pb.ModelInferRequest.FromString(data))
    message, raw_left_inside = _without_raw(received.message)
    assert message == expected_message
    assert [bytes(raw) for raw in (raw_left_inside or received.raw)] == expected_raw


@pytest.mark.parametrize(
    "raw_sizes",
    [[16], [SPLIT_BYTES], [4 * 1024 * 1024], [400_000, 16, 400_000], []],
    ids=["small", "at-threshold", "4MB", "three", "none"],
)
@pytest.mark.parametrize("extras", [True, False], ids=["extras", "bare"])
def test_reads_what_the_parser_reads(raw_sizes: list[int], extras: bool) -> None:
    data = _request(raw_sizes, extras=extras).SerializeToString()
    received = read_infer_request(data)
    _assert_read_as_the_parser_reads(received, data)
    assert isinstance(received, InferRequest)
    if len(data) >= SPLIT_BYTES and received.raw:
        # split: the contents are views of the received bytes, not copies in the message
        assert not received.message.raw_input_contents
        assert all(isinstance(raw, memoryview) and raw.readonly for raw in received.raw)


def test_fields_in_any_order_and_unknown_fields() -> None:
    """Protobuf allows fields in any order and repeated fields interleaved; a field this
    version does not know (number 99) is kept by the parser, and by the split."""
    big = b"\x01" * (SPLIT_BYTES + 4)
    parts = [
        _field(7, b"\x02" * 8),  # raw contents first
        pb.ModelInferRequest(model_name="m").SerializeToString(),
        _field(99, b"unknown"),
        _field(7, big),
        pb.ModelInferRequest(id="x").SerializeToString(),
    ]
    data = b"".join(parts)
    received = read_infer_request(data)
    assert isinstance(received, InferRequest)
    assert [bytes(raw) for raw in received.raw] == [b"\x02" * 8, big]
    assert received.message.model_name == "m" and received.message.id == "x"
    assert _field(99, b"unknown") in received.message.SerializeToString()


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _parser_refuses(data: bytes) -> bool:
    try:
        pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return True
    return False


def test_refuses_exactly_what_the_parser_refuses() -> None:
    """Every cut of a large message, and messages whose field 7 is not bytes or which carry a
    group: malformed here exactly when the protobuf parser says so, and otherwise the same."""
    data = _request([SPLIT_BYTES, 32]).SerializeToString()
    cuts = sorted({*range(0, 80), *range(len(data) - 80, len(data)), SPLIT_BYTES + 3})
    odd = [
        data + _varint(7 << 3 | 0) + _varint(5),  # field 7 as a varint
        data + _varint(5 << 3 | 3) + _varint(5 << 3 | 4),  # an (empty) group
        data + _varint(1 << 3 | 6),  # wire type 6 does not exist
        data + _varint(7 << 3 | 2) + _varint(10**6),  # a length past the end
    ]
    for case in [data[:cut] for cut in cuts] + odd:
        received = read_infer_request(case)
        if _parser_refuses(case):
            assert received is MALFORMED, len(case)
        else:
            _assert_read_as_the_parser_reads(received, case)


def test_a_message_of_many_fields_is_parsed_whole() -> None:
    """The walk takes at most MAX_FIELDS steps of Python: a large message of more fields (here
    tiny `id` fields, the last of which wins) goes to the parser whole, and reads the same."""
    request = _request([SPLIT_BYTES])
    filler = b"".join(pb.ModelInferRequest(id=f"{n}").SerializeToString() for n in range(9))
    for fields in (MAX_FIELDS // 2, MAX_FIELDS * 2):
        data = request.SerializeToString() + filler * (fields // 9)
        received = read_infer_request(data)
        _assert_read_as_the_parser_reads(received, data)
        assert isinstance(received, InferRequest)
        split = not received.message.raw_input_contents
        assert split == (fields < MAX_FIELDS), fields


def test_split_contents_reach_the_bridge_form_as_received() -> None:
    """The door's conversion takes the views as the input's values (no copy); a BYTES input
    becomes bytes there, as the checks and the worker read it."""
    request = _request([SPLIT_BYTES * 2])
    text = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(len(b"hello").to_bytes(4, "little") + b"hello")
    del text
    received = read_infer_request(request.SerializeToString())
    assert isinstance(received, InferRequest)
    body = to_bridge_request(received.message, "", raw_contents=received.raw)
    numeric, text_tensor = body["tensors"]
    assert isinstance(numeric["data"]["values"], memoryview)
    assert bytes(numeric["data"]["values"]) == request.raw_input_contents[0]
    assert text_tensor["data"]["values"] == request.raw_input_contents[1]
    assert isinstance(text_tensor["data"]["values"], bytes)


# -- responses ------------------------------------------------------------------------------------


def _response_parts(raw_sizes: list[int]) -> tuple[pb.ModelInferResponse, list[bytes]]:
    message = pb.ModelInferResponse(model_name="m", model_version="1", id="r-7")
    message.parameters["triton_final_response"].bool_param = True
    raw = []
    for index, size in enumerate(raw_sizes):
        output = message.outputs.add(name=f"OUT{index}", datatype="UINT8", shape=[size])
        output.parameters["binary_data_size"].int64_param = size
        raw.append(bytes([index % 251]) * size)
    return message, raw


def _whole(message: pb.ModelInferResponse, raw: list[bytes]) -> pb.ModelInferResponse:
    whole = pb.ModelInferResponse()
    whole.CopyFrom(message)
    whole.raw_output_contents.extend(raw)
    return whole


@pytest.mark.parametrize(
    "raw_sizes",
    [[], [8], [SPLIT_BYTES - 1], [SPLIT_BYTES], [4 * 1024 * 1024], [0, 300_000, 5, 0]],
    ids=["none", "small", "below", "at-threshold", "4MB", "four"],
)
def test_answers_read_back_as_the_whole_message(raw_sizes: list[int]) -> None:
    """Whatever form `framed` picks, what the client parses is the message with its raw
    contents, in order; the unary and the stream serializer alike."""
    message, raw = _response_parts(raw_sizes)
    expected = _whole(message, raw)
    answer = framed(message, list(raw))
    assert isinstance(answer, InferResponse) == (sum(raw_sizes) >= SPLIT_BYTES)
    assert pb.ModelInferResponse.FromString(write_infer_response(answer)) == expected
    stream = pb.ModelStreamInferResponse.FromString(
        write_stream_response(
            answer
            if isinstance(answer, InferResponse)
            else pb.ModelStreamInferResponse(infer_response=answer)
        )
    )
    assert stream == pb.ModelStreamInferResponse(infer_response=expected)


def test_stream_errors_are_written_as_messages() -> None:
    error = pb.ModelStreamInferResponse(error_message="boom")
    assert write_stream_response(error) == error.SerializeToString()
