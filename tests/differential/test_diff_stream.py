"""ModelStreamInfer (one bidirectional stream) on Triton and on the bridge.

Differences: `stream_error_text` (errors in-band as `<Category>: <Triton's text>`) and
`stream_final_flag` (no `triton_final_response` parameter on the bridge's responses).
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import (
    Failure,
    Pair,
    call,
    expected_bridge_stream_error,
    expected_bridge_unknown_model,
    int32_input,
    is_triton_unknown_model,
    relative_paths,
    summarize,
)

pytestmark = pytest.mark.oracle

WAIT_S = 30.0


def stream_once(server, root: Path, model: str, inputs: list, **kwargs: Any) -> Any:
    """One request on a fresh stream: the result, or the in-band error as a Failure."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(model, inputs, **kwargs)
        result, error = answers.get(timeout=WAIT_S)
        client.stop_stream()
    finally:
        client.close()
    if error is not None:
        return Failure(str(error.status()), relative_paths(error.message() or "", root))
    return result


def stream_both(pair: Pair, model: str, inputs: list, **kwargs: Any) -> tuple[Any, Any]:
    return tuple(
        stream_once(server, pair.root, model, inputs, **kwargs) for _, server in pair.servers()
    )


def test_stream_answer(errors: Pair):
    triton, bridge = stream_both(errors, "error_code", [int32_input([7])], request_id="s-1")
    expected = summarize(triton)
    # stream_final_flag: Triton flags its (only) response as the final one.
    assert expected.pop("parameters") == {"triton_final_response": {"bool_param": True}}
    assert summarize(bridge) == expected


@pytest.mark.parametrize(
    ("model", "code"),
    [
        ("raise_in_execute", None),
        ("error_code", "INVALID_ARG"),
        ("error_code", "NOT_FOUND"),
        ("error_code", "UNSUPPORTED"),
        ("error_code", "CANCELLED"),
        ("error_code", "UNAVAILABLE"),
    ],
)
def test_stream_error(errors: Pair, model: str, code: str | None):
    kwargs = {"parameters": {"code": code}} if code else {}
    inputs = [int32_input([7])]
    triton, bridge = stream_both(errors, model, inputs, **kwargs)
    # The unary call tells Triton's status for this error (a stream error carries none).
    unary = call(errors.oracle, errors.root, lambda c: c.infer(model, inputs, **kwargs))
    assert isinstance(unary, Failure) and triton == Failure("None", unary.message), triton
    assert bridge == expected_bridge_stream_error(unary)


def test_stream_unknown_model(errors: Pair):
    triton, bridge = stream_both(errors, "no_such_model", [int32_input([7])])
    assert triton.status == "None" and is_triton_unknown_model(
        Failure("StatusCode.NOT_FOUND", triton.message), "no_such_model"
    ), triton
    assert bridge == expected_bridge_unknown_model("no_such_model")  # unknown_model_text
