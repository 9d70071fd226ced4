"""examples/model_repository: every example model answers as on Triton, and so does client.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.differential.support import (
    PROJECT_ROOT,
    Failure,
    Pair,
    both,
    expected_bridge_error,
    fp32_input,
    make_input,
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
    (difference error_status)."""
    triton = _client_output(examples.oracle.grpc_url)
    bridge = _client_output(examples.bridge.grpc_url)
    prefix = "strict_divide error: "
    expected = []
    for line in triton:
        if line.startswith(prefix):
            status, _, message = line[len(prefix) :].partition(" ")
            error = expected_bridge_error(Failure(status, message))
            line = f"{prefix}{error.status} {error.message}"
        expected.append(line)
    assert any(line.startswith(prefix) for line in triton), triton
    assert bridge == expected
