"""bridge/logs.py: client strings escaped and cut, Dynamo's filter, the loader's duplicate line."""

from __future__ import annotations

import logging

import pytest

from bridge.logs import TritonFormatter, _DuplicateFailureFilter, dynamo_log_filter, printable


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain id", "plain id"),
        ("a\x00b\x1b[31mc", "a\\x00b\\x1b[31mc"),
        ("line\nbreak\ttab", "line\\nbreak\\ttab"),
        ("back\\slash 'q'", "back\\\\slash 'q'"),
        ("rtl\u202eoverride é", "rtl\\u202eoverride é"),
    ],
)
def test_printable_escapes_like_repr(text: str, expected: str) -> None:
    assert printable(text) == expected


def test_printable_cuts_and_says_how_much() -> None:
    assert printable("x" * 10_000, 256) == "x" * 256 + "…(9744 more)"
    assert printable("x" * 256, 256) == "x" * 256


def test_formatter_escapes_control_characters_but_keeps_line_breaks() -> None:
    record = logging.LogRecord("x", logging.ERROR, "f.py", 3, "a\x00\x1b[31m\nb", None, None)
    line = TritonFormatter().format(record)
    assert line.endswith("f.py:3] a\\x00\\x1b[31m\nb")


def test_dynamo_filter_adds_the_quiet_targets_to_the_users_filter() -> None:
    assert dynamo_log_filter(0, None).startswith("warn,request_span[{request.outcome}]=error,")
    assert dynamo_log_filter(0, "info").startswith("info,")
    # A target the user names is the user's to set.
    mine = dynamo_log_filter(0, "warn,dynamo_llm::grpc::service::kserve=debug")
    assert mine.count("dynamo_llm::grpc::service::kserve") == 1
    # --log-verbose: Dynamo's per-request lines come back.
    assert dynamo_log_filter(1, None) == "warn"
    assert dynamo_log_filter(1, "debug") == "debug"


def test_the_loaders_failure_line_is_left_to_the_bridge() -> None:
    def record(name: str, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, "x.py", 1, "%s", (message,), None)

    keep = _DuplicateFailureFilter().filter
    failure = "Failed to process the request(s) for model 'm_0', message: ValueError: x"
    assert not keep(record("model_repository_loader.execution", failure))
    assert keep(record("model_repository_loader.execution", "m_0: finalize failed: x"))
    assert keep(record("bridge.errors", failure))
