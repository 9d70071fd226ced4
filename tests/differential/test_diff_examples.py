"""examples/model_repository: every example model answers as on Triton, and so does client.py.

The streaming examples are called on a stream of their own per request, and compared response
by response (`summarize(..., stream=True)`); differences: `response_model_version` on streams,
`decoupled_unary` for ModelInfer on a decoupled model.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import (
    PROJECT_ROOT,
    Failure,
    Pair,
    both,
    expected_bridge_decoupled_unary,
    expected_bridge_error,
    expected_bridge_stream_response,
    fp32_input,
    int32_input,
    make_input,
    relative_paths,
    requested,
    summarize,
)

pytestmark = pytest.mark.oracle


def text(*values: str) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=np.object_)


# id → (model, inputs factory, infer keyword arguments)
CALLS = {
    "add_sub": (
        "add_sub",
        lambda: [
            fp32_input([[1, 2, 3, 4], [10, 20, 30, 40]], "INPUT0"),
            fp32_input([[4, 3, 2, 1], [1, 1, 1, 1]], "INPUT1"),
        ],
        {},
    ),
    "add_sub-OUTPUT1-only": (
        "add_sub",
        lambda: [fp32_input([[1, 2, 3, 4]], "INPUT0"), fp32_input([[0.5] * 4], "INPUT1")],
        {"outputs": requested("OUTPUT1")},
    ),
    "text_case": (
        "text_case",
        lambda: [make_input("TEXT", text("hello", "wörld", "").reshape(1, 3), "BYTES")],
        {},
    ),
    "half_scale": (
        "half_scale",
        lambda: [make_input("X", np.array([[1.0, 0.5, -2.0, 65504]], np.float16), "FP16")],
        {},
    ),
    "greeter": ("greeter", lambda: [make_input("NAME", text("Ada"), "BYTES")], {}),
    "greeter-title-params": (
        "greeter",
        lambda: [
            make_input("NAME", text("Ada"), "BYTES"),
            make_input("TITLE", text("Countess"), "BYTES"),
        ],
        {"request_id": "greet-1", "parameters": {"punctuation": "?!", "shout": True}},
    ),
    "strict_divide": (
        "strict_divide",
        lambda: [fp32_input([[6.0, 9.0]], "NUMERATOR"), fp32_input([[2.0, 3.0]], "DENOMINATOR")],
        {},
    ),
    "auto_shape": ("auto_shape", lambda: [fp32_input([[1.0, 2.0, 3.0]], "X")], {}),
    "async_fetch": (
        "async_fetch",
        lambda: [make_input("KEY", text("cherry", "kiwi", "apple").reshape(3, 1), "BYTES")],
        {},
    ),
}


@pytest.mark.parametrize("case", list(CALLS))
def test_example_model(examples: Pair, case: str):
    model, inputs, kwargs = CALLS[case]
    triton, bridge = both(examples, lambda c: c.infer(model, inputs(), **kwargs))
    assert not isinstance(triton, Failure), triton
    assert summarize(bridge) == summarize(triton)


def test_strict_divide_error(examples: Pair):
    inputs = [fp32_input([[6.0, 9.0]], "NUMERATOR"), fp32_input([[2.0, 0.0]], "DENOMINATOR")]
    triton, bridge = both(examples, lambda c: c.infer("strict_divide", inputs))
    assert isinstance(triton, Failure) and triton.status == "StatusCode.INVALID_ARGUMENT"
    assert bridge == expected_bridge_error(triton)


# -- the streaming examples ----------------------------------------------------------------------

WAIT_S = 30.0
FETCH_S = 0.3  # async_fetch's `fetch_ms` (config.pbtxt)


def final_flag(result: grpcclient.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def open_stream(
    server, **start_kwargs: Any
) -> tuple[grpcclient.InferenceServerClient, queue.Queue]:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)), **start_kwargs)
    return client, answers


def stream_request(server, root: Path, model: str, inputs: list, **kwargs: Any) -> list[Any]:
    """One request on a stream of its own: every answer up to the one flagged final (or the
    first error), as `summarize(stream=True)` dicts or Failures."""
    client, answers = open_stream(server)
    shown: list[Any] = []
    try:
        client.async_stream_infer(model, inputs, **kwargs)
        while True:
            result, error = answers.get(timeout=WAIT_S)
            if error is not None:
                shown.append(Failure(str(error.status()), relative_paths(error.message(), root)))
                return shown
            shown.append(summarize(result, stream=True))
            if final_flag(result):
                return shown
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def streams_both(pair: Pair, model: str, inputs: list, **kwargs: Any) -> tuple[list, list]:
    triton, bridge = (
        stream_request(server, pair.root, model, inputs, **kwargs) for _, server in pair.servers()
    )
    return triton, bridge


def expected_bridge_stream(triton: list[Any]) -> list[Any]:
    """response_model_version on every streamed response (empty finals included)."""
    assert not any(isinstance(a, Failure) for a in triton), triton
    return [expected_bridge_stream_response(a) for a in triton]


def prompt(value: str) -> list[grpcclient.InferInput]:
    return [make_input("PROMPT", text(value), "BYTES")]


def repeat_inputs(values: list[int], count: int) -> list[grpcclient.InferInput]:
    return [int32_input(values, "VALUES"), int32_input([count], "COUNT")]


STREAM_CALLS = {
    "token_streamer": ("token_streamer", lambda: prompt("Hello, streaming  wörld! "), 4),
    "token_streamer-empty-prompt": ("token_streamer", lambda: prompt(""), 1),
    "repeat": ("repeat", lambda: repeat_inputs([7, 8, 9], 5), 5),
    "repeat-count-0": ("repeat", lambda: repeat_inputs([7], 0), 1),
    "slow_cancellable-short": ("slow_cancellable", lambda: [int32_input([3], "STEPS")], 3),
}


@pytest.mark.parametrize("case", list(STREAM_CALLS))
def test_streaming_example(examples: Pair, case: str):
    model, inputs, count = STREAM_CALLS[case]
    # The empty final response lets a client see the end after a flag-only FINAL.
    triton, bridge = streams_both(examples, model, inputs(), enable_empty_final_response=True)
    assert len(triton) == count, triton
    assert bridge == expected_bridge_stream(triton)


def test_unary_call_on_a_streaming_example(examples: Pair):
    inputs = repeat_inputs([1], 2)
    triton, bridge = both(examples, lambda c: c.infer("repeat", inputs))
    assert bridge == expected_bridge_decoupled_unary(triton)


def fetch_elapsed(server) -> tuple[float, list[Any]]:
    """Four async_fetch requests in flight at once: (seconds until all answered, answers)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def key(k: str) -> list[grpcclient.InferInput]:
        return [make_input("KEY", text(k).reshape(1, 1), "BYTES")]

    try:
        client.infer("async_fetch", key("warm-up"))
        answers: queue.Queue = queue.Queue()
        start = time.monotonic()
        keys = ["apple", "banana", "x", "cherry"]
        for index, k in enumerate(keys):
            client.async_infer(
                "async_fetch",
                key(k),
                callback=lambda result, error, index=index: answers.put((index, result, error)),
            )
        got = sorted(answers.get(timeout=WAIT_S) for _ in keys)
        elapsed = time.monotonic() - start
    finally:
        client.close()
    return elapsed, [summarize(r) if e is None else e for _, r, e in got]


def test_async_fetch_overlaps_on_both(examples: Pair):
    (triton_s, triton), (bridge_s, bridge) = (fetch_elapsed(s) for _, s in examples.servers())
    # Four fetches one after the other take at least 4 × FETCH_S; both servers overlap them.
    assert triton_s < 4 * FETCH_S, triton_s
    assert bridge_s < 4 * FETCH_S, bridge_s
    assert bridge == triton


def cancelled_lines(server) -> int:
    return len(re.findall(r"slow_cancellable: cancelled after \d+ of 1000 steps", server.log_text))


def cancel_then_short_job(server, root: Path, timeout: float | None) -> tuple[list, Any, list]:
    """A 1000-step job cancelled after three progress reports (or by a stream deadline), then
    a 2-step job: (the progress seen, the end the client saw, the short job's answers)."""
    before = cancelled_lines(server)
    client, answers = open_stream(server, **({"stream_timeout": timeout} if timeout else {}))
    seen: list[Any] = []
    end: Any = "cancelled by the client"
    try:
        client.async_stream_infer("slow_cancellable", [int32_input([1000], "STEPS")])
        while timeout is not None or len(seen) < 3:
            result, error = answers.get(timeout=WAIT_S)
            if error is not None:
                end = Failure(str(error.status()), "")
                break
            seen.append(result.as_numpy("PROGRESS").tolist())
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    short = stream_request(server, root, "slow_cancellable", [int32_input([2], "STEPS")])
    # The model said in the log that it stopped (Triton-shaped log lines on both).
    deadline = time.monotonic() + WAIT_S
    while cancelled_lines(server) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled_lines(server) == before + 1
    return seen[:3], end, short


@pytest.mark.parametrize("timeout", [None, 0.5], ids=["stop_stream-cancel", "stream_timeout"])
def test_slow_cancellable_stops_on_both(examples: Pair, timeout: float | None):
    (t_seen, t_end, t_short), (b_seen, b_end, b_short) = (
        cancel_then_short_job(server, examples.root, timeout) for _, server in examples.servers()
    )
    assert t_seen == [[1], [2], [3]][: len(t_seen)] and b_seen == [[1], [2], [3]][: len(b_seen)]
    assert b_end == t_end
    if timeout is not None:
        assert t_end == Failure("StatusCode.DEADLINE_EXCEEDED", "")
    # The short job ran at once after the cancelled one, with the same answers.
    assert len(t_short) == 2
    assert b_short == expected_bridge_stream(t_short)


def _client_output(url: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "examples" / "client.py"), "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return run.stdout.splitlines()


def test_client_script(examples: Pair):
    """examples/client.py prints the same on both servers, but for strict_divide's error line
    (difference error_status) and the time async_fetch took."""
    triton = _client_output(examples.oracle.grpc_url)
    bridge = _client_output(examples.bridge.grpc_url)
    prefix = "strict_divide error: "
    took = re.compile(r"(async_fetch  4 concurrent requests took )[0-9.]+( s)")
    triton = [took.sub(r"\1<t>\2", line) for line in triton]
    bridge = [took.sub(r"\1<t>\2", line) for line in bridge]
    assert any("<t>" in line for line in triton), triton
    expected = []
    for line in triton:
        if line.startswith(prefix):
            status, _, message = line[len(prefix) :].partition(" ")
            error = expected_bridge_error(Failure(status, message))
            line = f"{prefix}{error.status} {error.message}"
        expected.append(line)
    assert any(line.startswith(prefix) for line in triton), triton
    assert bridge == expected
