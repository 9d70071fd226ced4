"""Inference messages on the wire with their tensor bytes copied as little as possible
(issue 27).

Parsing a protobuf copies a `bytes` field twice before the door sees it: into the parser's
memory, and again into a new `bytes` object on each read of `raw_input_contents[i]`; building
one copies it twice too: into the message on `append`, and out of it on serializing. For large
tensors those copies were most of the door's own work (measured in docs/benchmarks.md).

* Requests (ModelInfer, ModelStreamInfer): a message of SPLIT_BYTES or more is read in two
  parts. Its top-level fields are walked here (the protobuf wire format: a varint key, then a
  varint, 8 bytes, a length-delimited run or 4 bytes); every `raw_input_contents` entry is kept
  as a read-only view of the received message, and the rest is parsed as usual. Whatever the
  walk does not expect (a group, raw contents that are not length-delimited, a run past the
  end) is left to the protobuf parser, on the whole message, so a message is accepted or
  refused exactly as before. A smaller message is parsed whole: the walk would cost more than
  the copies it saves.
* Responses: when the raw output contents come to SPLIT_BYTES or more, the message is
  serialized without them and they are written after it, each as its field (protobuf allows a
  message's fields in any order), joined into the answer's bytes in one copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

# Smaller messages are parsed and built whole (their raw contents, if any, are small too).
SPLIT_BYTES = 64 * 1024
# The walk is Python on the event loop: a message of more top-level fields than this (a real
# request has a few per input, output and parameter) is parsed whole instead, so a message of
# millions of tiny fields costs the loop what the parser costs, not a Python step per field.
MAX_FIELDS = 1024
_LENGTH_DELIMITED = 2


def _number(message: type, field: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[field].number  # type: ignore[attr-defined]
    return number


RAW_INPUT_CONTENTS = _number(pb.ModelInferRequest, "raw_input_contents")  # repeated bytes
RAW_OUTPUT_CONTENTS = _number(pb.ModelInferResponse, "raw_output_contents")  # repeated bytes
STREAM_INFER_RESPONSE = _number(pb.ModelStreamInferResponse, "infer_response")


class Malformed:
    """What a request that is not a valid protobuf deserializes to (server.py)."""


MALFORMED = Malformed()


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A ModelInferRequest as received: the message, and its raw input contents (views of the
    received bytes when the message was split, else the message's own field)."""

    message: pb.ModelInferRequest
    raw: Sequence[bytes | memoryview]


class _NotSplit(Exception):
    """The walk met something it leaves to the protobuf parser."""


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at `position` and the position after it."""
    value = 0
    shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise _NotSplit
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _split(data: bytes) -> tuple[list[memoryview], list[memoryview]]:
    """The message's other fields (views, in order) and its raw input contents (views)."""
    view = memoryview(data)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    position = 0
    end = len(data)
    fields = 0
    while position < end:
        fields += 1
        if fields > MAX_FIELDS:
            raise _NotSplit
        start = position
        key, position = _varint(data, position)
        field, kind = key >> 3, key & 7
        if kind == 0:
            _, position = _varint(data, position)
        elif kind == 1:
            position += 8
        elif kind == 5:
            position += 4
        elif kind == _LENGTH_DELIMITED:
            length, position = _varint(data, position)
            if field == RAW_INPUT_CONTENTS:
                if position + length > end:
                    raise _NotSplit
                raw.append(view[position : position + length])
                position += length
                continue
            position += length
        else:  # a group (3, 4) or no wire type at all (6, 7)
            raise _NotSplit
        if position > end:
            raise _NotSplit
        if field == RAW_INPUT_CONTENTS:
            raise _NotSplit  # raw contents that are not bytes: the parser's to refuse
        rest.append(view[start:position])
    return rest, raw


def read_infer_request(data: bytes) -> InferRequest | Malformed:
    """The request deserializer of ModelInfer and ModelStreamInfer."""
    try:
        if len(data) >= SPLIT_BYTES:
            try:
                rest, raw = _split(data)
            except _NotSplit:
                pass
            else:
                if raw:  # else the whole message is parsed below: nothing joined for it
                    message = pb.ModelInferRequest.FromString(b"".join(rest))
                    return InferRequest(message, raw)
        message = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return MALFORMED
    return InferRequest(message, message.raw_input_contents)


# -- responses ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferResponse:
    """A ModelInferResponse to send: the message without its raw output contents, and those
    contents, written after it (`write_infer_response`)."""

    message: pb.ModelInferResponse
    raw: list[bytes | bytearray]


def framed(
    message: pb.ModelInferResponse, raw: list[bytes | bytearray]
) -> pb.ModelInferResponse | InferResponse:
    """`message` with its raw output contents `raw`, in the form that costs fewer copies."""
    if sum(map(len, raw)) < SPLIT_BYTES:
        message.raw_output_contents.extend(map(bytes, raw))  # protobuf takes `bytes` only
        return message
    return InferResponse(message, raw)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


_RAW_OUTPUT_KEY = _encode_varint(RAW_OUTPUT_CONTENTS << 3 | _LENGTH_DELIMITED)
_STREAM_INFER_RESPONSE_KEY = _encode_varint(STREAM_INFER_RESPONSE << 3 | _LENGTH_DELIMITED)


def _parts(
    message: pb.ModelInferResponse, raw: Sequence[bytes | bytearray | memoryview]
) -> list[bytes | bytearray | memoryview]:
    parts: list[bytes | bytearray | memoryview] = [message.SerializeToString()]
    for contents in raw:
        parts += (_RAW_OUTPUT_KEY, _encode_varint(len(contents)), contents)
    return parts


def serialized_answer(
    message: pb.ModelInferResponse, raw: Sequence[bytes | bytearray | memoryview]
) -> bytes:
    """A ModelInfer answer's bytes: `message` with `raw` as its raw output contents (byte
    views: `len` is their size), written after it in one copy. Made where the outputs may be
    read (the model's thread, as it sends the response), it is the one copy of each output
    before gRPC's own."""
    return b"".join(_parts(message, raw))


def write_infer_response(response: pb.ModelInferResponse | InferResponse | bytes) -> bytes:
    """The response serializer of ModelInfer (bytes: `serialized_answer`'s, as they are)."""
    if isinstance(response, bytes):
        return response
    if isinstance(response, InferResponse):
        return b"".join(_parts(response.message, response.raw))
    return response.SerializeToString()


def write_stream_response(response: pb.ModelStreamInferResponse | InferResponse) -> bytes:
    """The response serializer of ModelStreamInfer: an `InferResponse` is a stream response
    whose `infer_response` it is."""
    if isinstance(response, InferResponse):
        parts = _parts(response.message, response.raw)
        size = sum(map(len, parts))
        return b"".join([_STREAM_INFER_RESPONSE_KEY, _encode_varint(size), *parts])
    return response.SerializeToString()
