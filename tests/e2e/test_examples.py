"""The example repository through the bridge: the shipped client, and each streaming example.

Expected values follow from what each example model is written to do (examples/README.md) and
from Triton's stream rules (spec §3.9: `triton_final_response`, empty final responses); the same
calls are compared with real Triton in tests/differential/test_diff_examples.py.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import WAIT_S, BackgroundInfer, wait_until
from tests.harness.bridge_server import PROJECT_ROOT

EXAMPLES = PROJECT_ROOT / "examples"
REPOSITORY = EXAMPLES / "model_repository"
FETCH_S = 0.3  # async_fetch's `fetch_ms` (config.pbtxt)
STEP_S = 0.05  # slow_cancellable's `step_ms`


# A warning or an error line: the bridge's (Triton's shape) or Dynamo's own (Rust's tracing).
ALARM_LINE = re.compile(r"^(?:[WE]\d{4} |\S+Z\s+(?:WARN|ERROR) )", re.MULTILINE)
DOORS = {
    "triton": (),
    # --host as Dynamo's frontend binds anyway: the warning that --host is not honoured is for
    # a user who asked for another address, not noise.
    "dynamo": ("--frontend", "dynamo", "--host", "0.0.0.0"),
}


@pytest.mark.parametrize("door", list(DOORS))
def test_example_client_runs(bridge_server, door: str) -> None:
    """The shipped client through either door, and a healthy run from start to SIGTERM: exit
    status 0, not one WARN or ERROR line (issue 23: Dynamo's own noise included)."""
    server = bridge_server(REPOSITORY, *DOORS[door])
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "client.py"), "--url", server.grpc_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # A few values the example models must produce (arithmetic on the client's inputs).
    assert "[[5.0, 5.0, 5.0, 5.0], [11.0, 21.0, 31.0, 41.0]]" in out  # add_sub sum
    assert "['HELLO', 'WÖRLD']" in out  # text_case
    assert "strict_divide QUOTIENT: [[3.0, 3.0]]" in out
    assert "strict_divide error:" in out  # division by zero is that request's error
    assert "auto_shape   Y: [[1.0, 4.0, 9.0]]" in out
    # The streaming examples.
    tokens = ["Streams ", "arrive ", "one ", "token ", "at ", "a ", "time."]
    assert f"token_streamer TOKENS: {tokens}" in out
    assert "token_streamer 3 tokens, joined: 'first prompt, streamed'" in out
    assert "token_streamer 4 tokens, joined: 'second prompt, streamed too'" in out
    assert "repeat       (VALUE, INDEX): [(10, 0), (20, 1), (30, 2), (10, 3), (20, 4)]" in out
    assert "'durian': '<missing>'" in out
    took = re.search(r"async_fetch  4 concurrent requests took ([0-9.]+) s", out)
    assert took and float(took[1]) < 4 * FETCH_S, out  # serial would be 4 fetches
    assert "slow_cancellable progress, then cancelled: [1, 2, 3]" in out
    assert "slow_cancellable stream_timeout: StatusCode.DEADLINE_EXCEEDED" in out
    assert "slow_cancellable STEPS=3: [1, 2, 3]" in out
    server.stop()
    assert server.returncode == 0, server.log_text[-3000:]
    assert not ALARM_LINE.findall(server.log_text), "\n".join(
        line for line in server.log_text.splitlines() if ALARM_LINE.match(line)
    )


# -- the streaming examples one by one -------------------------------------------------------------


@pytest.fixture(scope="module")
def server(shared_bridge_server):
    return shared_bridge_server(REPOSITORY)


def make_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def final_flag(result: grpcclient.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


class Stream:
    """One request on a stream of its own; answers as (arrival time, result, error)."""

    def __init__(self, url: str, model: str, inputs: list, **kwargs: Any) -> None:
        self.answers: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        timeout = kwargs.pop("stream_timeout", None)
        self.client.start_stream(
            callback=lambda result, error: self.answers.put((time.monotonic(), result, error)),
            stream_timeout=timeout,
        )
        self.client.async_stream_infer(model, inputs, **kwargs)

    def next(self) -> tuple[float, Any, Any]:
        return self.answers.get(timeout=WAIT_S)

    def until_final(self) -> list[tuple[float, Any, Any]]:
        answers = [self.next()]
        while answers[-1][2] is None and not final_flag(answers[-1][1]):
            answers.append(self.next())
        return answers

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def prompt_input(text: str) -> grpcclient.InferInput:
    return make_input("PROMPT", np.array([text.encode()], dtype=np.object_), "BYTES")


def test_token_streamer_sends_each_token_as_it_is_made(server):
    s = Stream(
        server.grpc_url,
        "token_streamer",
        [prompt_input("one two  three")],
        enable_empty_final_response=True,
    )
    answers = s.until_final()
    s.close()
    results = [r for _, r, _ in answers]
    tokens = [r.as_numpy("TOKEN")[0] for r in results[:-1]]
    assert tokens == [b"one ", b"two  ", b"three"]
    assert [final_flag(r) for r in results] == [False, False, False, True]
    assert not results[-1].get_response().outputs  # the empty final response
    # The model sleeps 20 ms before each token: streamed, the first token arrives well before
    # the end; buffered, everything would arrive at once.
    assert answers[-1][0] - answers[0][0] >= 0.03


def test_token_streamer_prompts_on_their_own_streams_run_together(server):
    # 30 tokens take 0.6 s: the second stream has that long to start before the first ends.
    prompts = [" ".join(f"{word}{i}" for i in range(30)) for word in ("a", "b")]
    streams = [
        Stream(
            server.grpc_url, "token_streamer", [prompt_input(p)], enable_empty_final_response=True
        )
        for p in prompts
    ]
    firsts = [s.next()[0] for s in streams]
    ends = [s.until_final()[-1][0] for s in streams]
    for s in streams:
        s.close()
    # Two instances, one stream each: both streams had their first token before either
    # finished (one instance would run the second prompt only after the first).
    assert max(firsts) < min(ends)


def repeat_inputs(values: list[int], count: int) -> list[grpcclient.InferInput]:
    return [
        make_input("VALUES", np.array(values, dtype=np.int32), "INT32"),
        make_input("COUNT", np.array([count], dtype=np.int32), "INT32"),
    ]


def test_repeat_sends_count_responses(server):
    s = Stream(server.grpc_url, "repeat", repeat_inputs([4, 5], 5), request_id="rep")
    results = [r for _, r, _ in s.until_final()]
    s.close()
    shown = [(r.as_numpy("VALUE").tolist(), r.as_numpy("INDEX").tolist()) for r in results]
    assert shown == [([4], [0]), ([5], [1]), ([4], [2]), ([5], [3]), ([4], [4])]
    # FINAL travels with the last response.
    assert [final_flag(r) for r in results] == [False] * 4 + [True]
    assert {r.get_response().id for r in results} == {"rep"}


def test_repeat_count_zero_sends_only_the_final_flag(server):
    s = Stream(server.grpc_url, "repeat", repeat_inputs([4], 0), enable_empty_final_response=True)
    (_, result, error), *more = s.until_final()
    s.close()
    assert error is None and not more
    assert final_flag(result) and not result.get_response().outputs


def key_input(*keys: str) -> grpcclient.InferInput:
    array = np.array([[k.encode()] for k in keys], dtype=np.object_)
    return make_input("KEY", array, "BYTES")


def test_async_fetch_batch_of_keys(server):
    result = server.client().infer("async_fetch", [key_input("cherry", "kiwi", "apple")])
    assert result.as_numpy("VALUE").tolist() == [[b"dark red"], [b"<missing>"], [b"red"]]


def test_async_fetch_requests_overlap(server):
    client = server.client()
    client.infer("async_fetch", [key_input("apple")])  # connected and warm
    start = time.monotonic()
    calls = [BackgroundInfer(client, "async_fetch", [key_input(k)]) for k in ("apple", "banana")]
    calls += [BackgroundInfer(client, "async_fetch", [key_input(k)]) for k in ("x", "cherry")]
    values = [c.result().as_numpy("VALUE").tolist() for c in calls]
    elapsed = time.monotonic() - start
    assert values == [[[b"red"]], [[b"yellow"]], [[b"<missing>"]], [[b"dark red"]]]
    assert elapsed < 4 * FETCH_S  # one after the other: four fetch times at least


def steps_input(steps: int) -> grpcclient.InferInput:
    return make_input("STEPS", np.array([steps], dtype=np.int32), "INT32")


def cancelled_lines(log: str) -> list[str]:
    return re.findall(r"slow_cancellable: cancelled after \d+ of 1000 steps", log)


def test_slow_cancellable_stops_when_the_stream_is_cancelled(server):
    before = len(cancelled_lines(server.log_text))
    s = Stream(server.grpc_url, "slow_cancellable", [steps_input(1000)])
    progress = [s.next()[1].as_numpy("PROGRESS").tolist() for _ in range(3)]
    assert progress == [[1], [2], [3]]
    s.close(cancel=True)
    # The only instance is free again at once: a short job runs right after.
    short = Stream(server.grpc_url, "slow_cancellable", [steps_input(2)])
    start = time.monotonic()
    results = [r for _, r, _ in short.until_final()]
    short.close()
    assert [r.as_numpy("PROGRESS").tolist() for r in results] == [[1], [2]]
    assert time.monotonic() - start < 20 * STEP_S  # not the 1000 steps of the cancelled job
    wait_until(lambda: len(cancelled_lines(server.log_text)) == before + 1, "the model's log")


def test_slow_cancellable_stops_at_the_client_deadline(server):
    s = Stream(server.grpc_url, "slow_cancellable", [steps_input(1000)], stream_timeout=0.5)
    while (answer := s.next())[2] is None:
        pass
    s.close()
    error = answer[2]
    assert isinstance(error, InferenceServerException)
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    short = Stream(server.grpc_url, "slow_cancellable", [steps_input(1)])
    (_, result, _), *more = short.until_final()
    short.close()
    assert result.as_numpy("PROGRESS").tolist() == [1] and not more
