"""Call every model of examples/model_repository and print what comes back.

Works against dynamo-bridge and against a real Triton server alike:

    dynamo-bridge --model-repository examples/model_repository
    python examples/client.py --url localhost:8001

tritonclient.grpc sends tensor data as raw bytes (raw_input_contents), so no JSON encoding
of the values happens on the way.

Decoupled (streaming) models are called over a gRPC stream (`start_stream` /
`async_stream_infer`). Each request in flight gets a stream of its own: Dynamo's frontend runs
the requests of one stream one after another, so requests meant to run at the same time must
not share a stream (one stream per request also works the same on Triton).
"""

from __future__ import annotations

import argparse
import queue
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def make_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def call_add_sub(client: grpcclient.InferenceServerClient) -> None:
    a = np.array([[1, 2, 3, 4], [10, 20, 30, 40]], dtype=np.float32)
    b = np.array([[4, 3, 2, 1], [1, 1, 1, 1]], dtype=np.float32)
    result = client.infer(
        "add_sub", [make_input("INPUT0", a, "FP32"), make_input("INPUT1", b, "FP32")]
    )
    print("add_sub      OUTPUT0 (sum):       ", result.as_numpy("OUTPUT0").tolist())
    print("add_sub      OUTPUT1 (difference):", result.as_numpy("OUTPUT1").tolist())


def call_text_case(client: grpcclient.InferenceServerClient) -> None:
    text = np.array([["hello", "wörld"]], dtype=np.object_)
    result = client.infer("text_case", [make_input("TEXT", text, "BYTES")])
    upper = [item.decode("utf-8") for item in result.as_numpy("UPPER").flat]
    print("text_case    UPPER:", upper)


def call_half_scale(client: grpcclient.InferenceServerClient) -> None:
    x = np.array([[1.0, 0.5, -2.0]], dtype=np.float16)
    result = client.infer("half_scale", [make_input("X", x, "FP16")])
    print("half_scale   Y:", result.as_numpy("Y").tolist())


def call_greeter(client: grpcclient.InferenceServerClient) -> None:
    name = make_input("NAME", np.array([b"Ada"], dtype=np.object_), "BYTES")
    title = make_input("TITLE", np.array([b"Countess"], dtype=np.object_), "BYTES")
    # Without TITLE (an optional input) and with default parameters.
    plain = client.infer("greeter", [name])
    print("greeter      GREETING:", plain.as_numpy("GREETING")[0].decode("utf-8"))
    # With TITLE, a request id and custom request parameters.
    fancy = client.infer(
        "greeter",
        [name, title],
        request_id="greet-1",
        parameters={"punctuation": "?!", "shout": True},
    )
    print("greeter      GREETING:", fancy.as_numpy("GREETING")[0].decode("utf-8"))
    print("greeter      REQUEST_ID:", fancy.as_numpy("REQUEST_ID")[0].decode("utf-8"))


def call_strict_divide(client: grpcclient.InferenceServerClient) -> None:
    num = np.array([[6.0, 9.0]], dtype=np.float32)
    for den in (np.array([[2.0, 3.0]], dtype=np.float32), np.array([[2.0, 0.0]], dtype=np.float32)):
        inputs = [make_input("NUMERATOR", num, "FP32"), make_input("DENOMINATOR", den, "FP32")]
        try:
            result = client.infer("strict_divide", inputs)
            print("strict_divide QUOTIENT:", result.as_numpy("QUOTIENT").tolist())
        except InferenceServerException as error:
            # The model's TritonError arrives with its status code and message.
            print("strict_divide error:", error.status(), error.message())


def call_auto_shape(client: grpcclient.InferenceServerClient) -> None:
    # The model has no config.pbtxt; the server still reports the completed configuration.
    config = client.get_model_config("auto_shape", as_json=True)["config"]
    print("auto_shape   max_batch_size:", config["max_batch_size"])
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    result = client.infer("auto_shape", [make_input("X", x, "FP32")])
    print("auto_shape   Y:", result.as_numpy("Y").tolist())


# -- streaming -------------------------------------------------------------------------------------

# Upper bound on the wait for any one streamed response.
STREAM_WAIT_S = 30.0


def is_final(result: grpcclient.InferResult) -> bool:
    """True on the last response of a request: Triton flags it `triton_final_response`."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def stream(
    url: str,
    model: str,
    inputs: list[grpcclient.InferInput],
    stream_timeout: float | None = None,
    **kwargs: Any,
) -> Iterator[grpcclient.InferResult]:
    """Send one request on a stream of its own and yield its responses as they arrive.

    Ends after the response flagged final. Leaving the loop early (break, an exception)
    cancels the request: `stop_stream(cancel_requests=True)` tells the server, and the model
    sees `request.is_cancelled()`. `stream_timeout` is a deadline for the whole stream.
    """
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url=url)
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), stream_timeout=stream_timeout
    )
    finished = False
    try:
        client.async_stream_infer(model, inputs, **kwargs)
        while not finished:
            result, error = answers.get(timeout=STREAM_WAIT_S)
            if error is not None:
                raise error
            finished = is_final(result)
            yield result
    finally:
        client.stop_stream(cancel_requests=not finished)
        client.close()


def text_input(name: str, text: str) -> grpcclient.InferInput:
    return make_input(name, np.array([text.encode("utf-8")], dtype=np.object_), "BYTES")


def stream_tokens(url: str, prompt: str) -> list[str]:
    # The model ends with a flag-only FINAL; enable_empty_final_response turns it into an empty
    # response flagged final, which is how this client knows the stream is over.
    tokens = []
    for result in stream(
        url, "token_streamer", [text_input("PROMPT", prompt)], enable_empty_final_response=True
    ):
        if result.get_response().outputs:
            tokens.append(result.as_numpy("TOKEN")[0].decode("utf-8"))
    return tokens


def call_token_streamer(url: str) -> None:
    tokens = stream_tokens(url, "Streams arrive one token at a time.")
    print("token_streamer TOKENS:", tokens)
    # Two prompts at the same time: one stream each.
    prompts = ["first prompt, streamed", "second prompt, streamed too"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        streamed = list(pool.map(lambda prompt: stream_tokens(url, prompt), prompts))
    for tokens in streamed:
        print(f"token_streamer {len(tokens)} tokens, joined: {''.join(tokens)!r}")


def call_repeat(url: str) -> None:
    values = make_input("VALUES", np.array([10, 20, 30], dtype=np.int32), "INT32")
    count = make_input("COUNT", np.array([5], dtype=np.int32), "INT32")
    answers = [
        (int(r.as_numpy("VALUE")[0]), int(r.as_numpy("INDEX")[0]))
        for r in stream(url, "repeat", [values, count])
    ]
    print("repeat       (VALUE, INDEX):", answers)


def call_async_fetch(client: grpcclient.InferenceServerClient) -> None:
    keys = ["apple", "banana", "cherry", "durian"]
    answers: queue.Queue = queue.Queue()
    start = time.monotonic()
    # Four requests in flight at once: the model's coroutines await their I/O together.
    for index, key in enumerate(keys):
        client.async_infer(
            "async_fetch",
            [make_input("KEY", np.array([[key.encode()]], dtype=np.object_), "BYTES")],
            callback=lambda result, error, index=index: answers.put((index, result, error)),
        )
    values = [""] * len(keys)
    for _ in keys:
        index, result, error = answers.get(timeout=STREAM_WAIT_S)
        if error is not None:
            raise error
        values[index] = result.as_numpy("VALUE")[0][0].decode("utf-8")
    elapsed = time.monotonic() - start
    print("async_fetch  VALUES:", dict(zip(keys, values, strict=True)))
    print(f"async_fetch  {len(keys)} concurrent requests took {elapsed:.2f} s")


def call_slow_cancellable(url: str) -> None:
    steps = make_input("STEPS", np.array([1000], dtype=np.int32), "INT32")  # 50 s of work
    # Cancel: stop reading after three progress reports; leaving the loop cancels the request.
    progress = []
    for result in stream(url, "slow_cancellable", [steps]):
        progress.append(int(result.as_numpy("PROGRESS")[0]))
        if len(progress) == 3:
            break
    print("slow_cancellable progress, then cancelled:", progress)
    # Deadline: the stream's timeout passes while the model works; the server cancels it too.
    try:
        for _ in stream(url, "slow_cancellable", [steps], stream_timeout=0.5):
            pass
    except InferenceServerException as error:
        print("slow_cancellable stream_timeout:", error.status())
    # The model stopped both jobs early, so a short one runs at once.
    short = make_input("STEPS", np.array([3], dtype=np.int32), "INT32")
    progress = [int(r.as_numpy("PROGRESS")[0]) for r in stream(url, "slow_cancellable", [short])]
    print("slow_cancellable STEPS=3:", progress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8001", help="gRPC address of the server")
    args = parser.parse_args()

    client = grpcclient.InferenceServerClient(url=args.url)
    if not client.is_server_live():
        raise SystemExit(f"server at {args.url} is not live")
    for call in (
        call_add_sub,
        call_text_case,
        call_half_scale,
        call_greeter,
        call_strict_divide,
        call_auto_shape,
    ):
        call(client)
    call_token_streamer(args.url)
    call_repeat(args.url)
    call_async_fetch(client)
    call_slow_cancellable(args.url)


if __name__ == "__main__":
    main()
