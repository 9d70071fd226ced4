"""The unary thread path's own conversions (bridge/frontends/triton/grpc/tensors.py, issue 37):
`to_loader_request`, protobuf straight into the loader's request, and `answer_of`, the model's
response straight into the answer's bytes.

The loader's request is held against what the bridge form's two steps make of the same request
(`to_bridge_request`, then the worker's `decode_request`), and against the values sent; the
answer is read back with the protobuf parser. The refusals both conversions share are
tests/unit/test_triton_door_tensors.py's."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from bridge.codec import decode_request
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.grpc.tensors import (
    answer_of,
    class_counts,
    to_bridge_request,
    to_loader_request,
)
from bridge.frontends.triton.grpc.wire import read_infer_request
from bridge.frontends.triton.header_forward import HeaderForwarding
from bridge.models.endpoint import ThreadAnswer
from bridge.serialized_bytes import BytesLimits
from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse, Tensor, TritonError
from model_repository_loader.validation import RequestError

CONFIG = mc.ModelConfig(name="m")


def _framed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _fp32_and_bytes() -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", id="req-1", model_version="2")
    r.inputs.add(name="X", datatype="FP32", shape=[2, 2])
    r.inputs.add(name="S", datatype="BYTES", shape=[2])
    r.raw_input_contents.append(np.array([1.5, -2, 3, 4], np.float32).tobytes())
    r.raw_input_contents.append(_framed(b"ab", b""))
    r.outputs.add(name="Y")
    return r


def _typed() -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="I", datatype="INT16", shape=[3]).contents.int_contents.extend([1, -2, 3])
    r.inputs.add(name="B", datatype="BOOL", shape=[2]).contents.bool_contents.extend([True, False])
    return r


def _parameters() -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", id="s")
    r.inputs.add(name="H", datatype="BF16", shape=[2])
    r.raw_input_contents.append(np.array([0x3F80, 0xC000], "<u2").tobytes())
    r.parameters["sequence_id"].int64_param = 42
    r.parameters["sequence_start"].bool_param = True
    r.parameters["priority"].int64_param = 2
    r.parameters["tag"].string_param = "hello"
    r.parameters["triton_enable_empty_final_response"].bool_param = True
    return r


def _large_split() -> pb.ModelInferRequest:
    """Read as the wire reads a large message: its raw contents views of the received bytes."""
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="BIG", datatype="INT64", shape=[20_000])
    r.raw_input_contents.append(np.arange(20_000, dtype="<i8").tobytes())
    return r


REQUESTS: dict[str, Callable[[], pb.ModelInferRequest]] = {
    "fp32-and-bytes": _fp32_and_bytes,
    "typed-contents": _typed,
    "parameters": _parameters,
    "large-split": _large_split,
}


def _received(request: pb.ModelInferRequest):
    received = read_infer_request(request.SerializeToString())
    assert not isinstance(received, type(None))
    return received


def _values(tensor: Tensor) -> list:
    """A tensor's values; BF16's as their bit patterns (as_numpy refuses BF16, as Triton's)."""
    return (tensor._array if tensor._datatype == "BF16" else tensor.as_numpy()).tolist()


def _summary(inference: InferRequest) -> list:
    return [
        [(t._name, t._datatype, _values(t)) for t in inference.inputs],
        inference.requested_outputs,
        inference.request_id,
        inference.parameters,
        inference.model_version,
    ]


@pytest.mark.parametrize("make", REQUESTS.values(), ids=list(REQUESTS))
def test_the_loader_request_is_what_the_bridge_form_decodes_to(make) -> None:
    received = _received(make())
    message = received.message
    direct = to_loader_request(message, message.model_version, CONFIG, BytesLimits(), received.raw)
    assert direct is not None
    body = to_bridge_request(message, message.model_version, CONFIG, raw_contents=received.raw)
    through_the_bridge_form = decode_request(body, "m", BytesLimits())
    through_the_bridge_form.model_version = direct.model_version  # the worker parses it apart
    assert _summary(direct) == _summary(through_the_bridge_form)
    for tensor in direct.inputs:  # Triton hands models writable inputs
        assert tensor._array.flags.writeable or tensor._datatype == "BYTES"


def test_the_loader_request_holds_what_was_sent() -> None:
    received = _received(_fp32_and_bytes())
    inference = to_loader_request(received.message, "2", CONFIG, BytesLimits(), received.raw)
    assert inference is not None
    x, s = inference.inputs
    assert x.as_numpy().tolist() == [[1.5, -2.0], [3.0, 4.0]]
    assert s.as_numpy().tolist() == [b"ab", b""]
    assert (inference.requested_outputs, inference.request_id) == (["Y"], "req-1")
    assert inference.model_version == 2
    received = _received(_parameters())
    inference = to_loader_request(received.message, "", CONFIG, BytesLimits(), received.raw)
    assert inference is not None and inference.model_version == -1
    assert inference.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "priority": 2,
        "tag": "hello",
        "triton_enable_empty_final_response": True,
    }
    assert _values(inference.inputs[0]) == [0x3F80, 0xC000]


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_request_naming_a_shared_memory_region_is_left_to_the_loop(where: str) -> None:
    """None: the loop's path reads and writes regions (to_bridge_request with the door's
    SharedMemory), whether or not any is registered."""
    r = _fp32_and_bytes()
    tensor = r.inputs[0] if where == "input" else r.outputs[0]
    tensor.parameters["shared_memory_region"].string_param = "region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    assert to_loader_request(r, "", CONFIG, BytesLimits(), r.raw_input_contents) is None


def test_a_reserved_parameter_of_the_wrong_type_is_refused_as_the_worker_refuses_it() -> None:
    r = _fp32_and_bytes()
    r.parameters["sequence_id"].double_param = 1.5
    with pytest.raises(RequestError) as direct:
        to_loader_request(r, "", CONFIG, BytesLimits(), r.raw_input_contents)
    body = to_bridge_request(r, "", CONFIG)
    with pytest.raises(RequestError) as worker:
        decode_request(body, "m", BytesLimits())
    assert direct.value.message == worker.value.message
    assert "sequence_id" in direct.value.message


@pytest.mark.parametrize(
    "datatype, shape, raw",
    [
        ("FP32", [1] * 70, struct.pack("<f", 1.0)),  # past numpy's 64 dimensions
        ("FP32", [2**62, 0], b""),  # no elements, a shape no array takes
        ("BYTES", [1] * 70, _framed(b"a")),
    ],
)
def test_what_only_the_decoder_refuses_is_refused_as_the_worker_refuses_it(
    datatype: str, shape: list[int], raw: bytes
) -> None:
    """The door's checks let these through (the contents fit the element count); decoding
    them fails. The thread path refuses them with the worker's INVALID_ARG text, not with
    gRPC's UNKNOWN of an exception the handler let out."""
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="X", datatype=datatype, shape=shape)
    r.raw_input_contents.append(raw)
    with pytest.raises(RequestError) as direct:
        to_loader_request(r, "", CONFIG, BytesLimits(), r.raw_input_contents)
    body = to_bridge_request(r, "", CONFIG)
    with pytest.raises(RequestError) as worker:
        decode_request(body, "m", BytesLimits())
    assert (direct.value.code, direct.value.message) == (worker.value.code, worker.value.message)
    assert direct.value.message.startswith("malformed inference input: ")


@pytest.mark.parametrize(
    "datatype, field, sent",
    [
        ("INT8", "int_contents", [300, -129, 5]),
        ("INT16", "int_contents", [70000, -32769, 5]),
        ("UINT8", "uint_contents", [256 + 7, 2**32 - 1, 5]),
        ("UINT16", "uint_contents", [65536 + 9, 2**32 - 1, 5]),
    ],
)
def test_typed_contents_past_a_small_type_keep_their_low_bytes(
    datatype: str, field: str, sent: list[int]
) -> None:
    """Triton copies each 32-bit value's low bytes into a narrower input (its
    src/grpc/infer_handler.cc), so a value out of range wraps; it is never an error."""
    r = pb.ModelInferRequest(model_name="m")
    getattr(r.inputs.add(name="X", datatype=datatype, shape=[3]).contents, field).extend(sent)
    width = {"INT8": 1, "INT16": 2, "UINT8": 1, "UINT16": 2}[datatype]
    signed = datatype.startswith("INT")
    # The low bytes of each value as a little-endian 32-bit integer, read back as the datatype.
    expected = [
        int.from_bytes((v % 2**32).to_bytes(4, "little")[:width], "little", signed=signed)
        for v in sent
    ]
    inference = to_loader_request(r, "", CONFIG, BytesLimits(), r.raw_input_contents)
    assert inference is not None
    assert inference.inputs[0].as_numpy().tolist() == expected
    bridge_form = decode_request(to_bridge_request(r, "", CONFIG), "m", BytesLimits())
    assert bridge_form.inputs[0].as_numpy().tolist() == expected


def test_a_forwarded_header_is_a_parameter_and_its_refusal_comes_before_the_worker_s() -> None:
    """`--grpc-header-forward-pattern`: a header wins a clash with the request's parameter; a
    header of a reserved name is refused where the loop's path refuses it, after the door's
    checks and before the worker's (here a reserved parameter of the wrong type)."""
    forwarding = HeaderForwarding("^(x-.*|priority)$")
    r = _fp32_and_bytes()
    r.parameters["x-team"].string_param = "from the request"
    inference = to_loader_request(
        r, "", CONFIG, BytesLimits(), r.raw_input_contents,
        lambda: forwarding.parameters([("x-team", "from the header")]),
    )  # fmt: skip
    assert inference is not None and inference.parameters["x-team"] == "from the header"

    r.parameters["timeout"].string_param = "soon"  # the worker refuses this
    with pytest.raises(DoorError) as refused:
        to_loader_request(
            r, "", CONFIG, BytesLimits(), r.raw_input_contents,
            lambda: forwarding.parameters([("priority", "1")]),
        )  # fmt: skip
    assert refused.value.message == (
        "Header 'priority' is reserved for Triton usage and cannot be forwarded."
    )


def test_bytes_over_the_limits_are_refused_before_the_model() -> None:
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="S", datatype="BYTES", shape=[3])
    r.raw_input_contents.append(_framed(b"a", b"b", b"c"))
    limits = BytesLimits(max_elements=2)
    with pytest.raises(DoorError) as direct:
        to_loader_request(r, "", CONFIG, limits, r.raw_input_contents)
    with pytest.raises(DoorError) as bridge_form:
        to_bridge_request(r, "", CONFIG, limits=limits)
    assert direct.value.message == bridge_form.value.message
    assert "3" in direct.value.message and "2" in direct.value.message


# -- the answer ---------------------------------------------------------------------------------


def _answer(
    response: InferenceResponse,
    request: pb.ModelInferRequest | None = None,
    batching: bool = False,
) -> pb.ModelInferResponse:
    request = request or pb.ModelInferRequest(model_name="m", id="req-9")
    data = answer_of(request, class_counts(request), batching, "3", response, True)
    return pb.ModelInferResponse.FromString(data)


def test_the_answer_carries_every_output_as_the_client_parses_it() -> None:
    matrix = np.arange(6, dtype=np.float32).reshape(2, 3)
    outputs = [
        Tensor("F", matrix),
        Tensor("T", matrix.T),  # not C-contiguous: its raw contents are in C order
        Tensor("E", np.zeros((0, 4), np.int64)),
        Tensor("B", np.array([True, False])),
        Tensor("S", np.array([b"xy", b""], dtype=np.object_)),
    ]
    answer = _answer(InferenceResponse(outputs, parameters={"n": 2, "triton_final_response": 1}))
    assert (answer.model_name, answer.model_version, answer.id) == ("m", "3", "req-9")
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [
        ("F", "FP32", [2, 3]),
        ("T", "FP32", [3, 2]),
        ("E", "INT64", [0, 4]),
        ("B", "BOOL", [2]),
        ("S", "BYTES", [2]),
    ]
    assert answer.raw_output_contents == [
        matrix.tobytes(),
        np.ascontiguousarray(matrix.T).tobytes(),
        b"",
        b"\x01\x00",
        _framed(b"xy", b""),
    ]
    # A unary answer has no `triton_final_response`, whatever the model set (Triton's way).
    assert dict(answer.parameters) == {"n": pb.InferParameter(int64_param=2)}


def test_the_answer_is_a_copy_made_when_the_model_sends_it() -> None:
    """A model may reuse its output array once it sent the response, as Triton's stub copies
    an output when it is sent."""
    array = np.arange(100_000, dtype=np.float32)
    request = pb.ModelInferRequest(model_name="m")
    data = answer_of(request, {}, False, "1", InferenceResponse([Tensor("O", array)]), True)
    array[:] = -1
    raw = pb.ModelInferResponse.FromString(data).raw_output_contents[0]
    assert np.frombuffer(raw, np.float32).tolist() == list(range(100_000))


def test_an_output_asked_for_as_classes_is_answered_as_its_top_classes() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.outputs.add(name="P").parameters["classification"].int64_param = 2
    scores = np.array([0.1, 0.7, 0.2], np.float32)
    answer = _answer(InferenceResponse([Tensor("P", scores)]), request)
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [("P", "BYTES", [2])]
    assert answer.raw_output_contents == [_framed(b"0.700000:1", b"0.200000:2")]


def test_a_refusal_of_the_answer_reaches_the_client_with_its_own_status() -> None:
    """An answer the door refuses to make (classes of BYTES: Triton's INVALID_ARG) fails the
    request with that status and text, not an INTERNAL error (endpoint._encoded)."""
    request = pb.ModelInferRequest(model_name="m")
    request.outputs.add(name="S").parameters["classification"].int64_param = 1
    answer = ThreadAnswer("m")
    answer.encode = lambda response, final: answer_of(
        request, class_counts(request), False, "1", response, final
    )
    strings = Tensor("S", np.array([b"a"], dtype=np.object_))
    answer.respond(InferenceResponse([strings]), True)
    (refusal,) = answer.wait(None, "")
    assert isinstance(refusal, TritonError)
    assert refusal.code() == TritonError.INVALID_ARG
    assert (
        refusal.message() == "class result not available for output due to unsupported type 'BYTES'"
    )


class _Submitted:
    """What `Model.submit` returns, as far as ThreadAnswer uses it: something to cancel."""

    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def test_a_call_ending_after_its_answer_cancels_nothing() -> None:
    """gRPC calls `cancel` when every call ends; once the answer came, the request is done and
    is not marked cancelled (a model reading `is_cancelled()` later must not see it)."""
    answered, pending = ThreadAnswer("m"), _Submitted()
    answered.encode = lambda response, final: "encoded"
    answered.respond(InferenceResponse([]), True)
    assert answered.wait(pending, "") == ["encoded"]
    answered.cancel()
    assert pending.cancelled == 0
    given_up, pending = ThreadAnswer("m"), _Submitted()
    given_up.cancel()  # the client went first: the request is cancelled as it is submitted
    assert given_up.wait(pending, "") == []
    assert pending.cancelled == 1
