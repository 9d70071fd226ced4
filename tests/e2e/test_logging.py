"""pb_utils.Logger lines in the bridge log: Triton's shape, the model file's name and line.

Triton [V] (spec §1.9): `I1121 09:23:01.443324 8705 model.py:21] "info msg"`; verbose lines only
with `--log-verbose` ≥ 1, and then with the letter `I` like info lines (seen on Triton 2.51 with
the `chatty` model: `I… model.py:23] "chatty-execute-verbose"`).
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.support import SERVING, fp32_input, line_of, wait_until

CHATTY = SERVING / "chatty" / "1" / "model.py"


def log_line(level: str, message: str) -> re.Pattern[str]:
    """Triton's line for a model message logged from CHATTY at `level` (I, W or E)."""
    line = line_of(CHATTY, f'"{message.split(" id=")[0]}')
    return re.compile(
        rf'^{level}\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} \d+ model\.py:{line}\] "{re.escape(message)}"$',
        re.MULTILINE,
    )


def call_chatty(server, request_id: str) -> None:
    server.client().infer("chatty", [fp32_input([1.0])], request_id=request_id)
    message = f"chatty-execute-info id={request_id}"
    wait_until(lambda: message in server.log_text, f"{message!r} in the log")


@pytest.fixture
def quiet(shared_bridge_server):
    return shared_bridge_server(SERVING)


@pytest.fixture
def verbose(shared_bridge_server):
    return shared_bridge_server(SERVING, "--log-verbose", "1")


def test_initialize_line_has_file_and_line(quiet) -> None:
    assert log_line("I", "chatty-initialize-info").search(quiet.log_text)


@pytest.mark.parametrize(
    "level, message",
    [
        ("I", "chatty-execute-info id=quiet-1"),
        ("W", "chatty-execute-warn"),
        ("E", "chatty-execute-error"),
    ],
)
def test_execute_lines_have_level_file_and_line(quiet, level: str, message: str) -> None:
    call_chatty(quiet, "quiet-1")
    pattern = log_line(level, message)
    wait_until(lambda: pattern.search(quiet.log_text), f"the {message!r} line")


def test_verbose_lines_hidden_by_default(quiet) -> None:
    call_chatty(quiet, "quiet-2")
    # chatty has one instance: once the next execute has logged, the previous one is done and
    # its verbose lines had their chance.
    call_chatty(quiet, "quiet-3")
    assert "chatty-execute-verbose" not in quiet.log_text
    assert "chatty-execute-log-verbose" not in quiet.log_text
    assert "chatty-initialize-verbose" not in quiet.log_text


@pytest.mark.parametrize(
    "message",
    ["chatty-initialize-verbose", "chatty-execute-verbose", "chatty-execute-log-verbose"],
)
def test_verbose_lines_shown_with_log_verbose(verbose, message: str) -> None:
    call_chatty(verbose, "loud-1")
    # Triton prints verbose lines with the INFO letter [V].
    pattern = log_line("I", message)
    wait_until(lambda: pattern.search(verbose.log_text), f"the {message!r} line")
