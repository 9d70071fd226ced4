"""tests/repositories/load_failures: the server starts, serves `healthy`, and says why each
other model failed, in Triton's words.

Triton runs with `--exit-on-error=false` (the bridge's default). Triton's reason for each model
is read from its log (the same text as its repository index), and the bridge's log must hold it.
Traceback frames outside the repository (Triton's own triton_python_backend_utils.py and
`<frozen importlib>` frames, the bridge's loader) are implementation detail and are left out of
the comparison by `model_frames_only`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.differential.support import (
    TRITON_DOOR,
    Failure,
    Pair,
    both,
    expected_bridge_unknown_model,
    int32_input,
    is_triton_unknown_model,
    model_names,
    relative_paths,
)

pytestmark = pytest.mark.oracle

ROOT = Path(__file__).resolve().parents[1] / "repositories" / "load_failures"
FAILING = [m for m in model_names(ROOT) if m != "healthy"]

# A log line in tritonserver's shape: `E1121 11:12:11.835781 17605 file.cc:1460] message`.
_LOG_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]+\] (?P<message>.*)$")
# A traceback frame line as the Python backend prints it: `  <file>(<line>): <function>`.
_FRAME = re.compile(r"^  (?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
# How Triton logs a model's load failure; group 1 is the reason.
_TRITON_FAILURE_LINES = (
    "failed to load '{model}' version \\d+: (.*)",
    "Poll failed for model directory '{model}': (.*)",
    "failed to load model '{model}': (.*)",
)


def log_messages(text: str) -> list[str]:
    """The messages of a Triton-shaped log, continuation lines joined and quoting undone."""
    messages: list[str] = []
    for line in text.splitlines():
        match = _LOG_LINE.match(line)
        if match:
            messages.append(match["message"])
        elif messages:
            messages[-1] += "\n" + line
    out = []
    for message in messages:
        if len(message) >= 2 and message[0] == message[-1] == '"':
            try:
                message = json.loads(message)  # Triton quotes and escapes its messages
            except ValueError:
                pass
        out.append(message)
    return out


def model_frames_only(text: str, root: Path) -> str:
    """`text` with paths relative to `root` and only the traceback frames of model files."""
    lines = []
    for line in relative_paths(text, root).split("\n"):
        frame = _FRAME.match(line)
        if frame and (frame["file"].startswith(("/", "<")) or not frame["file"].endswith(".py")):
            continue
        lines.append(line)
    return "\n".join(lines)


def triton_reason(messages: list[str], model: str) -> str:
    for pattern in _TRITON_FAILURE_LINES:
        regex = re.compile(pattern.format(model=re.escape(model)), re.DOTALL)
        for message in messages:
            match = regex.fullmatch(message)
            if match:
                return match[1]
    raise AssertionError(f"Triton logged no load failure for {model!r}")


@pytest.fixture(scope="module")
def reasons(load_failures: Pair) -> dict[str, str]:
    """model → Triton's reason, as its log gives it."""
    messages = log_messages(load_failures.oracle.log_text)
    return {model: triton_reason(messages, model) for model in FAILING}


def test_oracle_log_agrees_with_its_repository_index(load_failures: Pair, reasons):
    """The reasons read from Triton's log are the ones its repository index reports."""
    index = load_failures.oracle.client().get_model_repository_index(as_json=True)["models"]
    indexed = {entry["name"]: entry["reason"] for entry in index if entry.get("reason")}
    assert indexed, index
    for model, reason in indexed.items():
        assert reasons[model] == reason


def test_healthy_model_serves(load_failures: Pair):
    triton, bridge = both(load_failures, lambda c: c.infer("healthy", [int32_input([7])]))
    assert triton.as_numpy("OUTPUT0").tolist() == [7]
    assert bridge.as_numpy("OUTPUT0").tolist() == [7]
    assert load_failures.bridge.client().is_model_ready("healthy")


def test_server_readiness(load_failures: Pair):
    """Both are live; Triton's strict readiness says not ready, Dynamo's frontend says ready
    (difference server_ready_with_failures)."""
    triton, bridge = both(load_failures, lambda c: (c.is_server_live(), c.is_server_ready()))
    assert triton == (True, False)
    assert bridge == (triton if TRITON_DOOR else (True, True))


@pytest.mark.parametrize("model", FAILING)
def test_failed_model_is_not_ready(load_failures: Pair, model: str):
    triton, bridge = both(load_failures, lambda c: c.is_model_ready(model))
    assert triton is False
    assert bridge is False


@pytest.mark.parametrize("model", FAILING)
def test_failed_model_refuses_inference(load_failures: Pair, model: str):
    triton, bridge = both(load_failures, lambda c: c.infer(model, [int32_input([1])]))
    assert isinstance(triton, Failure) and is_triton_unknown_model(triton, model), triton
    assert bridge == expected_bridge_unknown_model(model, triton)


@pytest.mark.parametrize("model", FAILING)
def test_bridge_logs_triton_reason(load_failures: Pair, reasons, model: str):
    expected = model_frames_only(reasons[model], load_failures.root)
    bridge_log = [
        model_frames_only(message, load_failures.root)
        for message in log_messages(load_failures.bridge.log_text)
    ]
    matching = [m for m in bridge_log if expected in m]
    assert matching, f"Triton's reason {expected!r} is in no bridge log message:\n" + "\n".join(
        m for m in bridge_log if model in m
    )
