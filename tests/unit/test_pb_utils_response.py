"""InferenceResponse, InferenceResponseSender and ResponseIterator.

[V] = observed on Triton 2.51 (spec §1.4-§1.6); parameters= is the 25.02+ argument, checked
against the messages of Triton's QA test for it (and the 2.51 request-parameter texts [V]).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from model_repository_loader.pb_utils import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponse,
    InferenceResponseSender,
    ResponseIterator,
    Tensor,
    TritonError,
    TritonModelException,
    get_output_tensor_by_name,
)

FINAL = TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _tensor(name: str = "OUT") -> Tensor:
    return Tensor(name, np.array([b"x"], dtype=object))


# -- InferenceResponse ----------------------------------------------------------------------------


def test_defaults() -> None:
    response = InferenceResponse()
    # [V] ([], False, None)
    assert response.output_tensors() == []
    assert response.has_error() is False
    assert response.error() is None
    assert response.parameters() == "{}"


def test_tuple_and_positional_error() -> None:
    assert len(InferenceResponse((_tensor(),)).output_tensors()) == 1  # [V]
    response = InferenceResponse([], TritonError("x"))
    assert response.has_error() and response.error().message() == "x"  # [V]


def test_none_inside_the_list() -> None:
    with pytest.raises(
        TritonModelException, match=r"^Output tensor for inference response should not be empty\.$"
    ):
        InferenceResponse([_tensor(), None])  # [V]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"output_tensors": None},
        {"output_tensors": [1]},
        {"output_tensors": "ab"},
        {"output_tensors": [], "error": "err"},
    ],
)
def test_type_errors(kwargs: dict) -> None:
    # [V] all four are pybind constructor TypeErrors.
    with pytest.raises(TypeError, match=r"^__init__\(\): incompatible constructor arguments\."):
        InferenceResponse(**kwargs)


def test_parameters() -> None:
    response = InferenceResponse([], parameters={"a": "1", "c": 3, "d": False})
    assert response.parameters() == '{"a": "1", "c": 3, "d": false}'
    with pytest.raises(TritonModelException, match=", got <class 'list'>$"):
        InferenceResponse([], parameters=[])
    with pytest.raises(
        TritonModelException,
        match=r"^Expect parameters values to have type bool/int/str, found type <class 'float'>$",
    ):
        InferenceResponse([], parameters={"int": 2, "float": 0.5})
    with pytest.raises(
        TritonModelException,
        match=r"^Expect parameters keys to have type str, found type <class 'int'>$",
    ):
        InferenceResponse([], parameters={1: "a"})


def test_output_tensors_returns_a_new_list() -> None:
    response = InferenceResponse([_tensor()])
    response.output_tensors().clear()
    assert len(response.output_tensors()) == 1


def test_create_skips_checks() -> None:
    response = InferenceResponse._create([_tensor("A")], None, '{"k":1}')
    assert response.parameters() == '{"k":1}'
    assert get_output_tensor_by_name(response, "A").name() == "A"
    assert get_output_tensor_by_name(response, "B") is None


# -- InferenceResponseSender ----------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[InferenceResponse | None, bool]] = []

    def __call__(self, response: InferenceResponse | None, final: bool) -> bool:
        self.calls.append((response, final))
        return True


def _message(fn: object) -> str:
    with pytest.raises(TritonModelException) as info:
        fn()  # type: ignore[operator]
    return str(info.value)


UNSUPPORTED = "Unable to send response. Unsupported flag provided."
NEEDS_RESPONSE = (
    "Inference Response object must be provided when the response flags is set to zero."
)
CLOSED = "Unable to send response. Response sender has been closed."
MORE_THAN_ONE = "Unable to send response. Non-decoupled model cannot send more than one response."
FINAL_FIRST = (
    "Unable to send response. Non-decoupled model cannot send complete final before sending a "
    "response."
)


def test_decoupled_sequence() -> None:
    # [V] the same sequence on a decoupled model, message for message.
    deliver = _Recorder()
    sender = InferenceResponseSender(deliver, decoupled=True)
    first = InferenceResponse([_tensor()])
    sender.send(first)
    assert _message(lambda: sender.send(InferenceResponse([_tensor()]), 2)) == UNSUPPORTED
    assert _message(lambda: sender.send()) == NEEDS_RESPONSE
    sender.send(InferenceResponse([_tensor()]))
    sender.send(flags=FINAL)
    assert _message(lambda: sender.send(InferenceResponse([_tensor()]))) == CLOSED
    assert _message(lambda: sender.send(flags=FINAL)) == CLOSED
    assert _message(lambda: sender.send(flags=3)) == UNSUPPORTED  # flags are checked first
    assert [final for _, final in deliver.calls] == [False, False, True]
    assert deliver.calls[0][0] is first
    assert deliver.calls[2][0] is None
    assert sender._is_closed and sender._responses_sent == 3


def test_decoupled_response_with_final_flag() -> None:
    deliver = _Recorder()
    sender = InferenceResponseSender(deliver, decoupled=True)
    response = InferenceResponse([_tensor()])
    sender.send(response, FINAL)
    assert deliver.calls == [(response, True)]


def test_default_mode_sequence() -> None:
    # [V] the same sequence on a non-decoupled model, message for message.
    deliver = _Recorder()
    sender = InferenceResponseSender(deliver, decoupled=False)
    assert _message(lambda: sender.send(flags=FINAL)) == FINAL_FIRST
    sender.send(InferenceResponse([_tensor()]))
    assert _message(lambda: sender.send(InferenceResponse([_tensor()]))) == MORE_THAN_ONE
    assert _message(lambda: sender.send(InferenceResponse([_tensor()]), FINAL)) == MORE_THAN_ONE
    sender.send(flags=FINAL)
    assert _message(lambda: sender.send(flags=FINAL)) == CLOSED
    assert _message(lambda: sender.send(InferenceResponse([_tensor()]))) == MORE_THAN_ONE
    assert [final for _, final in deliver.calls] == [False, True]


def test_default_mode_flag_checks_come_first() -> None:
    # [V] on a non-decoupled model before anything was sent.
    sender = InferenceResponseSender(_Recorder(), decoupled=False)
    assert _message(lambda: sender.send(None, 2)) == UNSUPPORTED
    assert _message(lambda: sender.send(None, 0)) == NEEDS_RESPONSE


@pytest.mark.parametrize("args", [("x",), (None, "1"), (None, -1)])
def test_send_argument_types(args: tuple) -> None:
    # [V] for ("x",) and (None, "1"): pybind TypeError naming send().
    sender = InferenceResponseSender(_Recorder(), decoupled=True)
    with pytest.raises(TypeError, match=r"^send\(\): incompatible function arguments\."):
        sender.send(*args)


def test_deliver_failure_becomes_a_model_exception() -> None:
    def deliver(response: InferenceResponse | None, final: bool) -> None:
        raise RuntimeError("stream gone")

    sender = InferenceResponseSender(deliver, decoupled=True)
    assert _message(lambda: sender.send(InferenceResponse([]))) == "stream gone"


def test_is_cancelled() -> None:
    event = threading.Event()
    sender = InferenceResponseSender(_Recorder(), decoupled=True, is_cancelled=event)
    assert sender.is_cancelled() is False  # [V]
    event.set()
    assert sender.is_cancelled() is True
    assert InferenceResponseSender(_Recorder(), decoupled=True).is_cancelled() is False


def test_concurrent_sends_are_serialized_and_counted() -> None:
    active = []
    overlaps = []

    def deliver(response: InferenceResponse | None, final: bool) -> None:
        active.append(1)
        if len(active) > 1:
            overlaps.append(1)
        active.pop()

    sender = InferenceResponseSender(deliver, decoupled=True)

    def worker() -> None:
        for _ in range(200):
            sender.send(InferenceResponse([]))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert sender._responses_sent == 800


# -- ResponseIterator -----------------------------------------------------------------------------


def test_iterator_yields_final_empty_response() -> None:
    # [V] a decoupled callee sending 2 data responses then a flag-only final gives 3 responses
    # with 1, 1 and 0 output tensors.
    iterator = ResponseIterator._create()
    iterator._put(InferenceResponse([_tensor()]), False)
    iterator._put(InferenceResponse([_tensor()]), False)
    iterator._put(None, True)
    assert [len(r.output_tensors()) for r in iterator] == [1, 1, 0]
    with pytest.raises(StopIteration):
        next(iterator)


def test_iterator_blocks_until_responses_arrive() -> None:
    iterator = ResponseIterator._create()

    def produce() -> None:
        iterator._put(InferenceResponse([_tensor("A")]), False)
        iterator._put(InferenceResponse([_tensor("B")]), True)

    thread = threading.Thread(target=produce)
    thread.start()
    names = [r.output_tensors()[0].name() for r in iterator]
    thread.join()
    assert names == ["A", "B"]


def test_iterator_cancel() -> None:
    cancelled = []
    iterator = ResponseIterator._create(lambda: cancelled.append(True))
    iterator.cancel()
    assert cancelled == [True]
    with pytest.raises(TypeError):
        ResponseIterator()
