"""execution.py and instance.py: what happens to `execute`'s outcome, coroutines, cancellation.

Two levels. Tiny models written to a temporary folder run on a real `ModelInstance` through
`run_execute`, with hand-made `Pending` requests (precise control over the batch, the
cancellation flags and the requeue hook). The models of tests/repositories/streaming run through
`load_repository` and `Model.submit`, the way the bridge calls them. Expected texts are Triton's
(spec §2.4–2.8, and tests/repositories/streaming/README.md for what Triton 2.51 answered).
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.execution import (
    RESCHEDULE_UNSUPPORTED,
    Pending,
    _coroutine_done,
    run_execute,
)
from model_repository_loader.inference import InferRequest
from model_repository_loader.instance import InstanceSpec, ModelInstance
from model_repository_loader.loader import LoadedRepository, load_repository

STREAMING = Path(__file__).resolve().parents[1] / "repositories" / "streaming"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
WAIT_S = 10.0
PREFIX = "Failed to process the request(s) for model 'tiny_0_0', message: "


class Answers:
    """A `respond` callback that keeps every (response, final) pair it is given."""

    def __init__(self) -> None:
        self.items: list[tuple[pb_utils.InferenceResponse | None, bool]] = []
        self.closed = threading.Event()
        self.first = threading.Event()

    def __call__(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        self.items.append((response, final))
        self.first.set()
        if final:
            self.closed.set()

    def wait_closed(self) -> list[tuple[pb_utils.InferenceResponse | None, bool]]:
        assert self.closed.wait(WAIT_S), f"the request was never closed: {self.items}"
        return self.items


def error_of(response: pb_utils.InferenceResponse | None) -> tuple[str, Any]:
    assert response is not None and response.has_error(), response
    return response.error().message(), response.error().code()


def out_values(response: pb_utils.InferenceResponse | None, name: str = "OUT") -> list:
    assert response is not None and not response.has_error(), response
    (tensor,) = [t for t in response.output_tensors() if t.name() == name]
    return tensor.as_numpy().tolist()


# -- tiny models on a real instance ---------------------------------------------------------------


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Any]:
    """`tiny(source)`: a loaded ModelInstance whose model.py is `source` (stopped afterwards)."""
    started: list[ModelInstance] = []

    def make(source: str) -> ModelInstance:
        folder = tmp_path / f"tiny{len(started)}" / "1"
        folder.mkdir(parents=True)
        model_file = folder / "model.py"
        model_file.write_text(textwrap.dedent(source))
        spec = InstanceSpec("tiny", "tiny_0_0", "CPU", 0, model_file, 1, {})
        instance = ModelInstance(spec)
        started.append(instance)
        instance.load()
        return instance

    yield make
    for instance in started:
        instance.stop()


def pending(
    answers: Answers,
    *,
    decoupled: bool,
    values: list[int] | None = None,
    params: str = "{}",
    requeue: Callable[[Pending], None] | None = None,
) -> Pending:
    """A request as the loader builds it: its sender and cancellation flag tied to the Pending."""
    request = pb_utils.InferenceRequest._incoming(
        inputs=[pb_utils.Tensor("IN", np.array(values or [0], dtype=np.int32))],
        parameters_json=params,
        requested_output_names={"OUT"},
        response_sender=None,
    )
    return Pending(request, answers, decoupled=decoupled, requeue=requeue)


def execute_on(instance: ModelInstance, batch: list[Pending], decoupled: bool) -> None:
    """Run one batch on the instance thread, as the schedulers do."""
    instance.call(lambda: run_execute(instance, batch, decoupled))


SQUARE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.seen = []

        def execute(self, requests):
            self.seen.append(len(requests))
            out = []
            for r in requests:
                v = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", v * v)]))
            return out
"""


def test_fail_cancelled_closes_with_a_bare_cancelled_status():
    answers = Answers()
    request = pending(answers, decoupled=False)
    request.fail_cancelled()
    ((response, final),) = answers.items
    # Triton's scheduler answers a request cancelled before execution with CANCELLED, no text.
    assert final and error_of(response) == ("", pb_utils.TritonError.CANCELLED)
    assert request.closed
    assert request.deliver(pb_utils.InferenceResponse([]), True) is False  # nothing more
    assert len(answers.items) == 1


def test_cancel_sets_both_flags_that_the_model_sees():
    request = pending(Answers(), decoupled=True)
    sender = request.request.get_response_sender()
    assert not request.request.is_cancelled() and not sender.is_cancelled()
    request.cancel()
    assert request.request.is_cancelled() and sender.is_cancelled()


def test_cancelled_request_of_a_batch_is_never_executed(tiny):
    instance = tiny(SQUARE)
    kept, dropped = Answers(), Answers()
    live, cancelled = (
        pending(kept, decoupled=False, values=[3]),
        pending(dropped, decoupled=False, values=[4]),
    )
    cancelled.cancel()
    execute_on(instance, [cancelled, live], decoupled=False)
    assert instance.model.seen == [1]  # execute got only the live request
    assert out_values(kept.wait_closed()[0][0]) == [9]
    assert error_of(dropped.wait_closed()[0][0]) == ("", pb_utils.TritonError.CANCELLED)


def test_a_batch_of_cancelled_requests_never_reaches_execute(tiny):
    instance = tiny(SQUARE)
    answers = [Answers(), Answers()]
    batch = [pending(a, decoupled=False) for a in answers]
    for p in batch:
        p.cancel()
    execute_on(instance, batch, decoupled=False)
    assert instance.model.seen == []
    assert all(
        error_of(a.wait_closed()[0][0])[1] == pb_utils.TritonError.CANCELLED for a in answers
    )


# -- default-mode coroutines: the return value is checked as for `def execute` --------------------

ASYNC_RETURNS = """
    import asyncio
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            kind = json.loads(requests[0].parameters()).get("return")
            good = [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])]
            if kind == "dict":
                return {"OUT": 1}
            if kind == "short":
                return []
            if kind == "str":
                return ["not a response"] * len(requests)
            return good * len(requests)
"""


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("dict", "Expected a list in the execute return, found type '<class 'dict'>'."),
        (
            "short",
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            "objects. InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0\n",
        ),
        (
            "str",
            "Expected an 'InferenceResponse' object in the execute function return list, found "
            "type '<class 'str'>'.",
        ),
    ],
)
def test_default_mode_coroutine_return_is_checked(tiny, kind: str, problem: str):
    instance = tiny(ASYNC_RETURNS)
    answers = Answers()
    execute_on(
        instance, [pending(answers, decoupled=False, params=f'{{"return":"{kind}"}}')], False
    )
    ((response, final),) = answers.wait_closed()
    assert final
    assert error_of(response) == (PREFIX + problem, pb_utils.TritonError.INTERNAL)


def test_default_mode_coroutine_answers(tiny):
    instance = tiny(ASYNC_RETURNS)
    answers = Answers()
    execute_on(instance, [pending(answers, decoupled=False)], decoupled=False)
    ((response, final),) = answers.wait_closed()
    assert final and out_values(response) == [1]


# -- decoupled coroutines ------------------------------------------------------------------------

ASYNC_DECOUPLED = """
    import asyncio
    import json
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    def response(value):
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])

    class TritonPythonModel:
        async def execute(self, requests):
            params = json.loads(requests[0].parameters())
            if params.get("started"):  # file gates: the test holds the coroutine here
                open(params["started"], "w").close()
            for _ in range(6000 if params.get("gate") else 0):  # 60 s at most, never a hang
                if os.path.exists(params["gate"]):
                    break
                await asyncio.sleep(0.01)
            # The first request is answered and closed, the others get one response each.
            requests[0].get_response_sender().send(response(0), FINAL)
            for r in requests[1:]:
                r.get_response_sender().send(response(1))
            if params.get("raise"):
                raise KeyError("lost")
            if params.get("return_list"):
                return [None] * len(requests)
            for r in requests[1:]:
                r.get_response_sender().send(flags=FINAL)
            return None
"""


def test_decoupled_coroutine_exception_closes_only_open_requests(tiny):
    instance = tiny(ASYNC_DECOUPLED)
    closed, left_open = Answers(), Answers()
    batch = [
        pending(closed, decoupled=True, params='{"raise":true}'),
        pending(left_open, decoupled=True),
    ]
    execute_on(instance, batch, decoupled=True)
    left_open.wait_closed()
    assert instance.wait_coroutines(WAIT_S)
    assert [(out_values(r), f) for r, f in closed.items] == [([0], True)]  # nothing more
    (first, more), (error, final) = left_open.items
    assert out_values(first) == [1] and not more
    message, code = error_of(error)
    assert final and code == pb_utils.TritonError.INTERNAL
    # Triton's exception text (spec §2.9), with the traceback's frames after "At:".
    assert message.startswith(PREFIX + "KeyError: 'lost'\n\nAt:\n"), message


def test_decoupled_coroutine_must_return_none(tiny):
    instance = tiny(ASYNC_DECOUPLED)
    closed, left_open = Answers(), Answers()
    batch = [
        pending(closed, decoupled=True, params='{"return_list":true}'),
        pending(left_open, decoupled=True),
    ]
    execute_on(instance, batch, decoupled=True)
    (_, _), (error, final) = left_open.wait_closed()
    assert final and error_of(error)[0] == (
        PREFIX + "Python model 'tiny_0_0' is using the decoupled mode and the execute function "
        "must return None."
    )
    assert len(closed.items) == 1  # already closed: it gets nothing more


def gated(tmp_path: Path, tag: str) -> str:
    """Request parameters that hold ASYNC_DECOUPLED's coroutine until `tmp_path/gate` exists."""
    return json.dumps({"started": str(tmp_path / f"started-{tag}"), "gate": str(tmp_path / "gate")})


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_coroutines_of_one_instance_overlap(tiny, tmp_path):
    instance = tiny(ASYNC_DECOUPLED)
    tags = ["a", "b", "c"]
    answers = [Answers() for _ in tags]
    for tag, a in zip(tags, answers, strict=True):
        execute_on(instance, [pending(a, decoupled=True, params=gated(tmp_path, tag))], True)
    # execute returned for all three, and all three coroutines are inside it at once.
    wait_for(lambda: all((tmp_path / f"started-{t}").exists() for t in tags), "three coroutines")
    assert not any(a.closed.is_set() for a in answers)
    assert instance.wait_coroutines(timeout=0.05) is False
    (tmp_path / "gate").touch()
    assert instance.wait_coroutines(WAIT_S) is True
    assert all(a.closed.is_set() for a in answers)


def test_instance_thread_is_free_while_a_coroutine_awaits(tiny, tmp_path):
    instance = tiny(ASYNC_DECOUPLED)
    slow = Answers()
    execute_on(instance, [pending(slow, decoupled=True, params=gated(tmp_path, "slow"))], True)
    wait_for((tmp_path / "started-slow").exists, "the coroutine to start")
    # A plain call on the instance thread runs while the coroutine is held at its gate.
    assert instance.call(lambda: 42, timeout=WAIT_S) == 42
    assert not slow.closed.is_set()
    (tmp_path / "gate").touch()
    assert [f for _, f in slow.wait_closed()] == [True]


def test_a_failing_done_callback_does_not_stop_the_loop(tiny):
    instance = tiny(ASYNC_DECOUPLED)

    async def value(v: int) -> int:
        return v

    results: list[int] = []

    def broken(_future: Any) -> None:
        raise RuntimeError("routing bug")

    instance.call(lambda: instance.run_coroutine(value(1), broken))
    instance.call(lambda: instance.run_coroutine(value(2), lambda f: results.append(f.result())))
    assert instance.wait_coroutines(WAIT_S)
    assert results == [2]


# -- request rescheduling: the requeue hook -------------------------------------------------------

RESCHEDULING = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                sender = r.get_response_sender()
                params = json.loads(r.parameters())
                out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))])
                if params.get("final_too"):
                    sender.send(out, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    sender.send(out)
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return None
"""


def test_rescheduled_request_goes_to_the_requeue_hook(tiny):
    instance = tiny(RESCHEDULING)
    answers = Answers()
    requeued: list[Pending] = []
    request = pending(answers, decoupled=True, requeue=requeued.append)
    execute_on(instance, [request], decoupled=True)
    assert requeued == [request]
    # The flags are reset for the next execution, and the request stays open.
    assert request.request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    assert [f for _, f in answers.items] == [False] and not request.closed


def test_reschedule_without_a_hook_is_refused(tiny):
    instance = tiny(RESCHEDULING)
    answers = Answers()
    execute_on(instance, [pending(answers, decoupled=True)], decoupled=True)
    (data, more), (error, final) = answers.wait_closed()
    assert out_values(data) == [7] and not more
    assert final and error_of(error) == (RESCHEDULE_UNSUPPORTED, pb_utils.TritonError.INTERNAL)


def test_closed_request_is_not_requeued(tiny):
    instance = tiny(RESCHEDULING)
    answers = Answers()
    requeued: list[Pending] = []
    request = pending(answers, decoupled=True, params='{"final_too":true}', requeue=requeued.append)
    execute_on(instance, [request], decoupled=True)
    assert requeued == [] and [f for _, f in answers.items] == [True]


# -- the streaming repository through Model.submit ------------------------------------------------


@pytest.fixture(scope="module")
def streaming() -> Iterator[LoadedRepository]:
    repo = load_repository(
        [STREAMING],
        only=["cancellable", "async_square", "async_repeat", "reschedule", "reschedule_plain"],
    )
    assert not repo.failures, repo.failures
    yield repo
    repo.close()


def submit(repo: LoadedRepository, model: str, values: list[int], **kwargs: Any) -> Answers:
    answers = Answers()
    inputs = [pb_utils.Tensor("IN", np.array(values, dtype=np.int32))]
    repo.models[model].submit(InferRequest(inputs=inputs, **kwargs), answers)
    return answers


def test_queued_request_cancelled_never_reaches_execute(streaming, tmp_path: Path):
    model = streaming.models["cancellable"]
    busy = Answers()
    running = model.submit(
        InferRequest(
            inputs=[pb_utils.Tensor("IN", np.array([0], np.int32))],
            parameters={"interval_ms": 10},
        ),
        busy,
    )
    assert busy.first.wait(WAIT_S)  # the only instance is inside execute with it
    report = tmp_path / "queued.json"
    queued_answers = Answers()
    queued = model.submit(
        InferRequest(
            inputs=[pb_utils.Tensor("IN", np.array([0], np.int32))],
            parameters={"steps": 1, "report": str(report)},
        ),
        queued_answers,
    )
    assert queued is not None and running is not None
    queued.cancel()
    running.cancel()  # the model sees it and returns; the queue moves on
    ((response, final),) = queued_answers.wait_closed()
    assert final and error_of(response) == ("", pb_utils.TritonError.CANCELLED)
    assert busy.wait_closed()[-1][1]
    assert not report.exists()  # execute never saw the queued request


def test_async_default_model_return_check(streaming):
    answers = submit(streaming, "async_square", [3], parameters={"return": "tuple"})
    ((response, final),) = answers.wait_closed()
    # Triton 2.51's text (streaming/README.md).
    assert final and error_of(response)[0] == (
        "Failed to process the request(s) for model 'async_square_0_0', message: Expected a "
        "list in the execute return, found type '<class 'tuple'>'."
    )


def test_async_default_model_answers_through_infer(streaming):
    request = InferRequest(inputs=[pb_utils.Tensor("IN", np.array([3, 4], np.int32))])
    response = streaming.models["async_square"].infer(request, timeout=WAIT_S)
    assert out_values(response) == [9, 16]


def test_async_decoupled_exception_closes_the_request(streaming):
    answers = submit(streaming, "async_repeat", [1, 2], parameters={"raise": True})
    (first, more), (error, final) = answers.wait_closed()
    assert out_values(first) == [1] and not more
    assert final and error_of(error)[0].startswith(
        "Failed to process the request(s) for model 'async_repeat_0_0', message: "
        "RuntimeError: async_repeat was asked to fail"
    )


def test_rescheduled_request_runs_again(streaming):
    sequence = {"sequence_id": 7, "sequence_start": True}
    answers = submit(streaming, "reschedule", [3], request_id="unit-resched", parameters=sequence)
    # Triton 2.51: 2, 1, 0, the last one final (streaming/README.md).
    assert [(out_values(r), f) for r, f in answers.wait_closed()] == [
        ([2], False),
        ([1], False),
        ([0], True),
    ]


def test_reschedule_needs_iterative_sequence(streaming):
    answers = submit(streaming, "reschedule_plain", [3], request_id="unit-plain")
    (data, more), (error, final) = answers.wait_closed()
    assert out_values(data) == [2] and not more
    assert final and error_of(error)[0] == RESCHEDULE_UNSUPPORTED


RESCHEDULE_WITH_A_RESPONSE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            out = pb_utils.Tensor("OUT", np.array([1], np.int32))
            return [pb_utils.InferenceResponse([out]) for r in requests]
"""


def test_default_mode_reschedule_must_return_none(tiny):
    """spec §2.4: a rescheduled request's slot in the returned list must be None."""
    instance = tiny(RESCHEDULE_WITH_A_RESPONSE)
    answers = Answers()
    requeued: list[Pending] = []
    request = pending(answers, decoupled=False, requeue=requeued.append)
    execute_on(instance, [request], decoupled=False)
    ((error, final),) = answers.wait_closed()
    expected = (
        "Failed to process the request(s) for model 'tiny_0_0', message: Expected a None object "
        "in the execute function return list for reschduled request, found type "
        "'<class 'c_python_backend_utils.InferenceResponse'>'."
    )
    assert final and error_of(error) == (expected, pb_utils.TritonError.INTERNAL)
    assert requeued == []


# -- default mode answering through the response sender (Triton >= 24.06) -------------------------

SENDER_DEFAULT = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    class TritonPythonModel:
        def initialize(self, args):
            self.senders = []

        def execute(self, requests):
            returned = []
            for r in requests:
                how = json.loads(r.parameters()).get("how")
                v = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                sender = r.get_response_sender()
                self.senders.append(sender)
                if how == "send_final_and_return":
                    sent = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", v + 100)])
                    sender.send(sent, FINAL)
                returned.append(
                    None if how == "later"
                    else pb_utils.InferenceResponse([pb_utils.Tensor("OUT", v + 1)])
                )
            return None if all(x is None for x in returned) else returned
"""


def test_default_mode_returns_none_and_answers_after_returning(tiny):
    instance = tiny(SENDER_DEFAULT)
    answers = Answers()
    execute_on(instance, [pending(answers, decoupled=False, params='{"how":"later"}')], False)
    assert answers.items == []  # execute returned None: the request waits for its sender
    (sender,) = instance.model.senders
    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]))
    sender.send(flags=FINAL)
    ((response, final), (flag_only, last)) = answers.wait_closed()
    assert out_values(response) == [7] and not final
    assert flag_only is None and last


def test_returned_response_after_a_sender_final_fails_the_batch(tiny):
    # Triton 2.51 sends none of the returned responses then: the request answered through its
    # sender keeps that answer, every other request still open gets the error [V].
    instance = tiny(SENDER_DEFAULT)
    sent, returned = Answers(), Answers()
    batch = [
        pending(sent, decoupled=False, values=[1], params='{"how":"send_final_and_return"}'),
        pending(returned, decoupled=False, values=[2]),
    ]
    execute_on(instance, batch, False)
    ((response, final),) = sent.wait_closed()
    assert out_values(response) == [101] and final
    ((error, final),) = returned.wait_closed()
    refused = "Unable to send response. Non-decoupled model cannot send more than one response."
    assert final and error_of(error) == (PREFIX + refused, pb_utils.TritonError.INTERNAL)


def test_send_after_a_returned_response_is_refused_in_the_model(tiny):
    instance = tiny(SENDER_DEFAULT)
    answers = Answers()
    execute_on(instance, [pending(answers, decoupled=False, values=[4])], False)
    ((response, final),) = answers.wait_closed()
    assert out_values(response) == [5] and final
    (sender,) = instance.model.senders
    late = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))])
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(late, FINAL)
    assert len(answers.items) == 1


def test_default_mode_coroutine_may_return_none(tiny):
    # What an `async def execute` returned is routed by `_coroutine_done` on the instance's loop;
    # called here directly with a finished coroutine's outcome, so the order is fixed.
    instance = tiny(SENDER_DEFAULT)
    answers = Answers()
    request = pending(answers, decoupled=False)
    outcome: Future = Future()
    outcome.set_result(None)
    _coroutine_done(instance, [request], False, outcome)
    assert answers.items == []  # not failed: it waits for its sender
    sender = request.request.get_response_sender()
    sender.send(
        pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([6], np.int32))]), FINAL
    )
    ((answer, final),) = answers.wait_closed()
    assert out_values(answer) == [6] and final
