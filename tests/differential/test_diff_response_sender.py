"""A default-mode (non-decoupled) model answering through its response sender, on Triton and on
the bridge: `execute` returning None or [None], one response sent with FINAL or split from a
flag-only FINAL, before or after `execute` returns (from another thread), mixed with returned
responses, misuse, and a dynamic batch of such requests. Thread and process instances alike.

Differences: `error_status`, `response_model_version`, `stream_error_text` and
`default_second_response`. The models are in tests/repositories/response_sender (README there);
each request's parameter `case` says what the model does, and OUT = IN + a tag says where the
answer came from (+1 returned, +100 sent before returning, +200 sent after, +300 a second send).
"""

from __future__ import annotations

import base64
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import (
    TRITON_DOOR,
    Failure,
    Pair,
    call,
    expected_bridge_error,
    expected_bridge_response,
    expected_bridge_stream_error,
    expected_bridge_stream_response,
    make_input,
    relative_paths,
    summarize,
)

pytestmark = pytest.mark.oracle

ROOT = "response_sender"  # one model.py for its three models: written whole (`repository`)
MODELS = ["sender", "sender_process"]  # a thread instance and a process instance on the bridge
WAIT_S = 30.0
VALUE = 5

# case -> OUT of Triton 2.51's one answer, or None where it answers an error [V on 2.51].
ANSWERED = {
    "final_before": VALUE + 100,  # send(response, FINAL), return None
    "final_before_list": VALUE + 100,  # the same, return [None]
    "final_after": VALUE + 200,  # return None, send(response, FINAL) from a thread
    "split_before": VALUE + 100,  # send(response), send(flags=FINAL), return None
    "split_across": VALUE + 100,  # send(response), return None, then send(flags=FINAL)
    "split_after": VALUE + 200,  # return None, then send(response), send(flags=FINAL)
    "returned": VALUE + 1,  # return [response]
    # send(response, FINAL), return [response]: the first wins, the returned one is only logged.
    "final_before_and_returned": VALUE + 100,
    # return [response], then send(response, FINAL): the send raises in the model's thread.
    "returned_and_after": VALUE + 1,
}
# The model fails the request after its one response went out (default_second_response).
SECOND_RESPONSE = {
    # send(response), return [response]: the returned one is refused, the batch fails
    "sent_and_returned": "Unable to send response. Non-decoupled model cannot send more than one "
    "response.",
    # send(response), send(response): the second send raises out of execute
    "two_sends": "TritonModelException: Unable to send response. Non-decoupled model cannot send "
    "more than one response.\n\nAt:\n",
}
# send(flags=FINAL) first: raises out of execute, the request's only answer is the error.
FAILED = ["final_first"]


@pytest.fixture(scope="module")
def senders(pair_for, repository) -> Pair:
    return pair_for(repository(ROOT))


def _inputs(value: int, batched: bool) -> list[grpcclient.InferInput]:
    array = np.array([[value]] if batched else [value], np.int32)
    return [make_input("IN", array, "INT32")]


def infer(pair: Pair, server: Any, model: str, case: str, value: int = VALUE, batched=False):
    return call(
        server,
        pair.root,
        lambda client: client.infer(
            model, _inputs(value, batched), parameters={"case": case}, client_timeout=WAIT_S
        ),
    )


def stream(pair: Pair, server: Any, model: str, case: str, count: int) -> list[Any]:
    """`count` answers of one request on a stream, then those of a sentinel request sent after
    them, up to the sentinel's own: what came after the first `count` shows up there."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def take() -> Any:
        result, error = answers.get(timeout=WAIT_S)
        if error is not None:
            return Failure(str(error.status()), relative_paths(error.message(), pair.root))
        if result.get_response().id == "sentinel":
            return None
        return summarize(result, stream=True)

    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            model,
            _inputs(VALUE, False),
            parameters={"case": case},
            enable_empty_final_response=True,
        )
        shown = [take() for _ in range(count)]
        client.async_stream_infer(
            model, _inputs(0, False), parameters={"case": "returned"}, request_id="sentinel"
        )
        while (answer := take()) is not None:
            shown.append(answer)
        return shown
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def out(answer: Any) -> int:
    """OUT of a `summarize`d answer (raw contents are base64 there)."""
    assert not isinstance(answer, Failure), answer
    raw = base64.b64decode(answer["raw_output_contents"]["OUT"])
    return int(np.frombuffer(raw, np.int32).reshape(-1)[0])


def second_response_error(model: str, case: str) -> Failure:
    """default_second_response: the error the request got after its response (Triton only logs
    it); the bridge answers it, wrapped as any error (error_status, stream_error_text)."""
    text = f"Failed to process the request(s) for model '{model}_0_0', message: "
    return Failure("StatusCode.INTERNAL", text + SECOND_RESPONSE[case])


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", sorted(ANSWERED))
def test_answered(senders: Pair, model: str, case: str):
    triton = infer(senders, senders.oracle, model, case)
    bridge = infer(senders, senders.bridge, model, case)
    assert out(summarize(triton)) == ANSWERED[case]
    assert summarize(bridge) == expected_bridge_response(triton)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", sorted(ANSWERED))
def test_answered_on_a_stream(senders: Pair, model: str, case: str):
    triton = stream(senders, senders.oracle, model, case, 1)
    bridge = stream(senders, senders.bridge, model, case, 1)
    # One response; a split FINAL flags nothing (no empty final follows it on a default model).
    assert [out(a) for a in triton] == [ANSWERED[case]]
    assert bridge == [expected_bridge_stream_response(a) for a in triton]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", FAILED)
def test_failed(senders: Pair, model: str, case: str):
    triton = infer(senders, senders.oracle, model, case)
    bridge = infer(senders, senders.bridge, model, case)
    assert isinstance(triton, Failure) and "cannot send complete final" in triton.message
    # The traceback shows the model's frames only: no frame of the sender (C++ in Triton).
    assert bridge == expected_bridge_error(triton)
    on_streams = [stream(senders, server, model, case, 1) for _, server in senders.servers()]
    assert on_streams[1] == [expected_bridge_stream_error(triton)]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", sorted(SECOND_RESPONSE))
def test_failed_after_one_response(senders: Pair, model: str, case: str):
    triton = infer(senders, senders.oracle, model, case)
    bridge = infer(senders, senders.bridge, model, case)
    assert triton == Failure("StatusCode.INTERNAL", "expected a single response, got 2")
    if TRITON_DOOR:  # default_second_response: the triton door answers as Triton, both ways
        assert bridge == triton
        streams = [stream(senders, server, model, case, 1) for _, server in senders.servers()]
        assert streams[1] == streams[0]
        return
    assert isinstance(bridge, Failure)
    error = second_response_error(model, case)
    expected = expected_bridge_error(error)
    assert bridge.status == expected.status
    assert bridge.message.startswith(expected.message), bridge  # a traceback may follow
    # On a stream Triton shows the response sent before returning; the bridge, the error too.
    triton_stream = stream(senders, senders.oracle, model, case, 1)
    bridge_stream = stream(senders, senders.bridge, model, case, 2)
    assert [out(a) for a in triton_stream] == [VALUE + 100]
    assert bridge_stream[0] == expected_bridge_stream_response(triton_stream[0])
    assert bridge_stream[1].message.startswith(expected_bridge_stream_error(error).message)


# Three requests sent together run as one batch of 3; each trio's answers do not depend on the
# order of the requests in the batch. Per request: OUT, or the start of the error's text.
_REFUSED = "Unable to send response. Non-decoupled model cannot send more than one response."
BATCHES = {
    "answered": [("returned", 1), ("final_before", 100), ("final_after", 200)],
    # A returned response refused (its sender sent FINAL): Triton sends none of the returned
    # responses, and every request still open gets the error, also the one that returned fine.
    "refused_return": [
        ("final_before_and_returned", 100),
        ("returned", _REFUSED),
        ("split_before", 100),
    ],
    # The same, where a request had sent a response without FINAL (default_second_response).
    "refused_return_after_send": [
        ("returned", _REFUSED),
        ("final_before_and_returned", 100),
        ("split_across", "second"),
    ],
    # execute raises in a send: every request gets the error (with its traceback).
    "raised": [
        ("returned", "TritonModelException: " + _REFUSED),
        ("two_sends", "second"),
        ("final_after", "TritonModelException: " + _REFUSED),
    ],
}


def batch(pair: Pair, server: Any, cases: list[str]) -> list[Any]:
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = [
            pool.submit(infer, pair, server, "sender_batching", case, index, True)
            for index, case in enumerate(cases)
        ]
        return [future.result() for future in futures]


@pytest.mark.parametrize("trio", sorted(BATCHES))
def test_dynamic_batch(senders: Pair, trio: str):
    cases = [case for case, _ in BATCHES[trio]]
    triton, bridge = (batch(senders, server, cases) for _, server in senders.servers())
    prefix = "Failed to process the request(s) for model 'sender_batching_0_0', message: "
    for index, (case, expected) in enumerate(BATCHES[trio]):
        if isinstance(expected, int):
            assert out(summarize(triton[index])) == index + expected, (case, triton[index])
            assert summarize(bridge[index]) == expected_bridge_response(triton[index])
        elif expected == "second":
            assert triton[index] == Failure(
                "StatusCode.INTERNAL", "expected a single response, got 2"
            )
            assert isinstance(bridge[index], Failure), bridge[index]
            if TRITON_DOOR:  # default_second_response
                assert bridge[index] == triton[index]
                continue
            assert expected_bridge_error(Failure("StatusCode.INTERNAL", prefix)).message in (
                bridge[index].message
            )
        else:
            assert isinstance(triton[index], Failure), (case, triton[index])
            assert triton[index].message.startswith(prefix + expected), triton[index]
            assert bridge[index] == expected_bridge_error(triton[index])
