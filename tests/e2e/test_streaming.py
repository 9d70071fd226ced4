"""Streaming through the bridge: decoupled models, async execute, cancellation, rescheduling.

Models: tests/repositories/streaming (README there, with what Triton 2.51 answered). One stream
per in-flight request: Dynamo's frontend runs the requests of one stream one after another.

Through Dynamo's door (`--frontend dynamo`): the answers asserted here carry its named differences
(stream_error_ends_request, decoupled_unary, error_status); the triton door's streams are compared
with Triton's in tests/differential/test_diff_stream.py and test_diff_response_sender.py.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.metrics_support import scrape, value
from tests.e2e.support import REPOSITORIES, WAIT_S, BackgroundInfer, Gate, wait_until

STREAMING = REPOSITORIES / "streaming"
DYNAMO_DOOR = ("--frontend", "dynamo")


def int32_input(values: list[int], name: str = "IN") -> grpcclient.InferInput:
    array = np.array(values, dtype=np.int32)
    tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return tensor


class Stream:
    """One client with one open stream; answers are collected as (result, error) pairs."""

    def __init__(self, url: str, **start_kwargs: Any) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.answers.put((result, error)), **start_kwargs
        )

    def send(self, model: str, values: list[int], **kwargs: Any) -> None:
        self.client.async_stream_infer(model, [int32_input(values)], **kwargs)

    def next(self) -> tuple[Any, Any]:
        return self.answers.get(timeout=WAIT_S)

    def until_final(self) -> list[tuple[Any, Any]]:
        """Answers up to and including the one flagged `triton_final_response: true`."""
        answers = []
        while True:
            result, error = self.next()
            answers.append((result, error))
            if result is not None and final_flag(result):
                return answers

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def final_flag(result: grpcclient.InferResult) -> bool | None:
    parameters = result.get_response().parameters
    if "triton_final_response" not in parameters:
        return None
    return parameters["triton_final_response"].bool_param


def outs(answers: list[tuple[Any, Any]]) -> list[Any]:
    """Each answer as its OUT values, "empty" for an empty response, or the error text."""
    shown = []
    for result, error in answers:
        if error is not None:
            shown.append(error.message())
        elif not result.get_response().outputs:
            shown.append("empty")
        else:
            shown.append(result.as_numpy("OUT").tolist())
    return shown


@pytest.fixture(scope="module")
def server(shared_bridge_server):
    return shared_bridge_server(STREAMING, *DYNAMO_DOOR)


@pytest.fixture
def stream(server):
    opened: list[Stream] = []

    def open_stream(**kwargs: Any) -> Stream:
        opened.append(Stream(server.grpc_url, **kwargs))
        return opened[-1]

    yield open_stream
    for s in opened:
        s.close(cancel=True)


# -- responses, order and the final flag (Triton's behaviour: streaming/README.md) ----------------


def test_every_response_streams_in_order_with_the_final_flag(stream):
    s = stream()
    # final "last": the FINAL flag travels with the last response.
    s.send("repeat", [5, 6, 7], parameters={"final": "last"}, request_id="r1")
    answers = s.until_final()
    assert outs(answers) == [[5], [6], [7]]
    assert [final_flag(r) for r, _ in answers] == [False, False, True]
    assert {r.get_response().id for r, _ in answers} == {"r1"}


def test_flag_only_final_is_not_sent_unless_asked(stream):
    s = stream()
    s.send("repeat", [5, 6])
    # The stream runs requests in order, so the next request's answers follow the first's.
    s.send("repeat", [9], parameters={"final": "last"})
    answers = s.until_final()
    assert outs(answers) == [[5], [6], [9]]
    assert [final_flag(r) for r, _ in answers] == [False, False, True]


def test_empty_final_response_when_asked(stream):
    s = stream()
    s.send("repeat", [5, 6], enable_empty_final_response=True)
    answers = s.until_final()
    assert outs(answers) == [[5], [6], "empty"]
    assert [final_flag(r) for r, _ in answers] == [False, False, True]
    s.send("repeat", [], enable_empty_final_response=True)
    assert outs(s.until_final()) == ["empty"]


def test_no_empty_final_for_a_default_mode_model(stream):
    # Triton sends the empty final only for decoupled models.
    s = stream()
    s.send("sender_default", [5], parameters={"flags": "split"}, enable_empty_final_response=True)
    s.send("sender_default", [1])
    answers = s.until_final()
    assert outs(answers) == [[6], [2]]
    assert [final_flag(r) for r, _ in answers] == [False, True]


def test_responses_sent_from_another_thread(stream):
    s = stream()
    s.send("repeat", [1, 2, 3], parameters={"thread": True, "delay_ms": 5})
    s.send("repeat", [0], parameters={"final": "last"})
    assert outs(s.until_final()) == [[1], [2], [3], [0]]


def test_many_responses_arrive_in_order(stream):
    s = stream()
    values = list(range(200))
    s.send("repeat", values, parameters={"final": "last"})
    answers = s.until_final()
    assert [r.as_numpy("IDX").tolist()[0] for r, _ in answers] == values


def test_default_mode_models_on_a_stream_are_final(stream):
    s = stream()
    s.send("async_square", [3])
    answers = s.until_final()
    assert outs(answers) == [[9]]


def test_misuse_texts_reach_the_model(stream):
    s = stream()
    s.send("misuse", [1], parameters={"action": "send_after_final"})
    s.send("misuse", [1], parameters={"action": "bad_flags"}, enable_empty_final_response=True)
    s.send("misuse", [1], parameters={"action": "report"})
    answers = [s.next() for _ in range(4)]
    assert outs(answers)[:3] == [[1], "empty", [3]]
    # stream_error_text: the error is prefixed with its category.
    assert answers[3][1].message() == "Internal: " + "\n".join(
        [
            "TritonModelException: Unable to send response. Response sender has been closed.",
            "TritonModelException: Unable to send response. Unsupported flag provided.",
            "TritonModelException: Inference Response object must be provided when the "
            "response flags is set to zero.",
        ]
    )


def test_exception_in_execute_closes_the_request(stream):
    s = stream()
    s.send("misuse", [1], parameters={"action": "raise"})
    first, second = s.next(), s.next()
    assert outs([first]) == [[1]]
    assert (
        second[1]
        .message()
        .startswith(
            "Internal: Failed to process the request(s) for model 'misuse_0_0', message: "
            "ValueError: misuse raised after one response"
        )
    )


def test_mid_stream_error_ends_the_request(stream):
    # stream_error_ends_request: Triton sends the error and goes on; Dynamo ends the request.
    s = stream()
    s.send("repeat", [5, 6, 7], parameters={"error_at": 1})
    s.send("repeat", [9], parameters={"final": "last"})
    answers = s.until_final()
    assert outs(answers) == [[5], "Internal: no answer for index 1", [9]]


# -- ModelInfer on decoupled models (decoupled_unary) --------------------------------------------


def test_unary_on_a_decoupled_model(server):
    client = server.client()
    one = client.infer("repeat", [int32_input([4])])
    assert one.as_numpy("OUT").tolist() == [4]
    with pytest.raises(InferenceServerException) as error:
        client.infer("repeat", [int32_input([4, 5])])
    assert error.value.message() == (
        "Failed to fold completions stream: Multiple responses in non-streaming mode"
    )


# -- response parameters --------------------------------------------------------------------------


def test_response_parameters_on_a_stream(stream):
    s = stream()
    s.send("tagged", [7, 8])
    answers = s.until_final()
    params = [r.get_response().parameters for r, _ in answers]
    assert [
        (p["index"].int64_param, p["last"].bool_param, p["tag"].string_param) for p in params
    ] == [
        (0, False, "t0"),
        (1, True, "t1"),
    ]
    assert [final_flag(r) for r, _ in answers] == [False, True]


def test_response_parameters_on_unary(server):
    result = server.client().infer("tagged", [int32_input([7])])
    parameters = result.get_response().parameters
    assert parameters["tag"].string_param == "t0"
    assert parameters["last"].bool_param is True


# -- cancellation ---------------------------------------------------------------------------------


def read_report(path: Path) -> dict:
    # The model writes a temp file and renames it: once the path exists, it is complete.
    wait_until(path.exists, f"the model's report {path.name}")
    return json.loads(path.read_text())


def test_stream_cancel_reaches_the_model(stream, tmp_path):
    report = tmp_path / "report.json"
    s = stream()
    s.send("cancellable", [0], parameters={"report": str(report)})
    for _ in range(3):
        assert s.next()[1] is None
    s.close(cancel=True)
    seen = read_report(report)
    # Both flags turn true and a later send is dropped quietly (no exception in the model).
    assert seen["request_cancelled"] and seen["sender_cancelled"]
    assert seen["send_after"] == "ok"
    assert 3 <= seen["steps"] < 1000


def test_client_timeout_reaches_the_model(stream, tmp_path):
    report = tmp_path / "report.json"
    s = stream(stream_timeout=1.0)
    s.send("cancellable", [0], parameters={"report": str(report)})
    while True:
        result, error = s.next()
        if error is not None:
            break
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    seen = read_report(report)
    assert seen["request_cancelled"] and seen["send_after"] == "ok"
    assert seen["steps"] < 1000


def queue_figures(server) -> tuple[float, float]:
    """`cancellable`'s queued requests and CANCELED failures, from the metrics port."""
    samples = scrape(server.metrics_port)
    labels = {"model": "cancellable", "version": "1"}
    queued = value(samples, "nv_inference_pending_request_count", **labels)
    cancelled = value(samples, "nv_inference_request_failure", reason="CANCELED", **labels)
    return queued or 0.0, cancelled or 0.0


def test_queued_request_cancelled_never_executes(server, stream, tmp_path):
    running, queued = tmp_path / "running.json", tmp_path / "queued.json"
    first = stream()
    first.send("cancellable", [0], parameters={"report": str(running)})
    assert first.next()[1] is None  # the only instance is busy with it now
    _, cancelled_before = queue_figures(server)
    second = stream()
    second.send("cancellable", [0], parameters={"report": str(queued), "steps": 1})
    wait_until(lambda: queue_figures(server)[0] == 1, "the second request in the model's queue")
    second.close(cancel=True)
    # Out of the queue and answered CANCELLED while the instance is still busy with the first.
    wait_until(
        lambda: queue_figures(server) == (0, cancelled_before + 1), "the queued request cancelled"
    )
    assert not running.exists()
    first.close(cancel=True)
    read_report(running)
    # A third request runs after the first: the cancelled one was never executed.
    third = stream()
    third.send("cancellable", [0], parameters={"steps": 1})
    assert third.next()[1] is None
    assert not queued.exists()


# -- async def execute ----------------------------------------------------------------------------


def test_async_decoupled_coroutines_overlap(stream, tmp_path):
    gate = Gate(tmp_path)
    streams = {f"s{i}": stream() for i in range(3)}
    for tag, s in streams.items():
        s.send("async_repeat", [1], parameters=gate.params(tag))
    # All three coroutines are inside execute at once, on the model's one instance.
    try:
        wait_until(lambda: all(gate.started(tag) for tag in streams), "three coroutines at once")
    finally:
        gate.open()
    for s in streams.values():
        s.send("repeat", [0], parameters={"final": "last"})
        assert outs(s.until_final()) == [[1], [0]]


def test_async_default_coroutines_overlap(server, tmp_path):
    gate = Gate(tmp_path)
    client = server.client()
    calls = {
        n: BackgroundInfer(
            client, "async_square", [int32_input([n])], parameters=gate.params(str(n))
        )
        for n in (2, 3, 4)
    }
    try:
        wait_until(lambda: all(gate.started(str(n)) for n in calls), "three coroutines at once")
        assert not any(call.done() for call in calls.values())
    finally:
        gate.open()
    assert [c.result().as_numpy("OUT").tolist() for c in calls.values()] == [[4], [9], [16]]


def test_async_default_return_value_is_checked(server):
    with pytest.raises(InferenceServerException) as error:
        server.client().infer("async_square", [int32_input([2])], parameters={"return": "tuple"})
    assert error.value.message() == (
        "Failed to fold completions stream: Internal: Failed to process the request(s) for model "
        "'async_square_0_0', message: Expected a list in the execute return, found type "
        "'<class 'tuple'>'."
    )


def test_async_decoupled_exception_closes_the_request(stream):
    # Better than Triton, which only logs it and leaves the request open.
    s = stream()
    s.send("async_repeat", [1, 2], parameters={"raise": True})
    answers = [s.next(), s.next()]
    assert outs(answers)[0] == [1]
    assert (
        answers[1][1]
        .message()
        .startswith(
            "Internal: Failed to process the request(s) for model 'async_repeat_0_0', message: "
            "RuntimeError: async_repeat was asked to fail"
        )
    )


def test_slow_coroutine_blocks_no_other_model(server):
    client = server.client()
    slow = BackgroundInfer(
        client, "async_square", [int32_input([5])], parameters={"delay_ms": 3000}
    )
    s = Stream(server.grpc_url)
    try:
        s.send("repeat", [1], parameters={"final": "last"})
        assert outs(s.until_final()) == [[1]]
    finally:
        s.close()
    assert not slow.done()
    assert slow.result().as_numpy("OUT").tolist() == [25]


# -- request rescheduling -------------------------------------------------------------------------


def test_reschedule_runs_the_request_again(stream):
    s = stream()
    # An iterative sequence kept open by the rescheduled request (Triton also takes the request
    # without a sequence id, and stops after one execution when it carries sequence_end [V]).
    s.send("reschedule", [3], request_id="resched-1", sequence_id=41, sequence_start=True)
    answers = s.until_final()
    assert outs(answers) == [[2], [1], [0]]
    assert [final_flag(r) for r, _ in answers] == [False, False, True]


def test_reschedule_needs_iterative_sequence(stream):
    s = stream()
    s.send("reschedule_plain", [3], request_id="resched-2")
    answers = [s.next(), s.next()]
    assert outs(answers) == [
        [2],
        "Internal: Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the "
        "model is not configured to handle such a flag.",
    ]
