"""bridge/logs.py: client strings escaped and cut, Dynamo's filter, the loader's duplicate line."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.logs import (
    DynamoNoiseFilter,
    TritonFormatter,
    _DuplicateFailureFilter,
    configure_dynamo_logging,
    dynamo_log_filter,
    printable,
)


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


@pytest.mark.parametrize("users", [None, "info"])
def test_a_re_executed_process_starts_again_from_the_users_filter(users: str | None) -> None:
    """Issue 39: a process that re-executes itself inherits the DYN_LOG it gave Dynamo; it must
    add the quiet targets again (and hide Dynamo's banner about them), not take them for the
    user's own filter."""
    environ = {} if users is None else {"DYN_LOG": users}
    first = configure_dynamo_logging(0, environ)
    given = environ["DYN_LOG"]
    again = configure_dynamo_logging(0, environ)  # what the re-executed process sees
    assert first and again
    assert environ["DYN_LOG"] == given
    assert given.startswith(f"{users or 'warn'},request_span")


def test_the_loaders_failure_line_is_left_to_the_bridge() -> None:
    def record(name: str, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, "x.py", 1, "%s", (message,), None)

    keep = _DuplicateFailureFilter().filter
    failure = "Failed to process the request(s) for model 'm_0', message: ValueError: x"
    assert not keep(record("model_repository_loader.execution", failure))
    assert keep(record("model_repository_loader.execution", "m_0: finalize failed: x"))
    assert keep(record("bridge.errors", failure))


def _record(message: str) -> logging.LogRecord:
    record = logging.LogRecord(
        "dynamo_bridge", logging.WARNING, "/x/server.py", 42, message, (), None
    )
    record.created = 1_700_000_000.25  # 2023-11-14T22:13:20.25Z
    return record


def test_iso8601_format_is_utc_with_the_letter_after_the_stamp() -> None:
    line = TritonFormatter("ISO8601").format(_record("hello"))
    assert line == f"2023-11-14T22:13:20Z W {os.getpid()} server.py:42] hello"


def test_default_format_keeps_micros_and_the_letter_first() -> None:
    line = TritonFormatter().format(_record("hello"))
    assert re.fullmatch(rf"W1114 \d\d:13:20\.250000 {os.getpid()} server\.py:42\] hello", line)


def test_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log format"):
        TritonFormatter("json")


def test_dynamo_noise_is_dropped_and_discovery_trouble_kept_until_shutdown() -> None:
    noise = DynamoNoiseFilter()
    always = (
        b"2026-11-27T08:12:42Z ERROR dynamo_runtime::storage::kv: KeyValueStoreManager.watch "
        b'receiver closed bucket_name="v1/instances" error=channel closed'
    )
    watcher = (
        b"2026-11-27T08:12:48Z  WARN dynamo_runtime::pipeline::network::egress::push_router: "
        b"Instance removal watcher stream ended; reconnecting endpoint=generate"
    )
    other = b"2026-11-27T08:12:48Z ERROR dynamo_runtime::transports::etcd: lease lost"
    assert noise.noise(always) and not noise.noise(watcher) and not noise.noise(other)
    cancelled = (  # a response racing its caller's cancel (CI, examples through Dynamo's frontend)
        b"2026-11-29T07:54:11.020761Z  WARN handle_payload: dynamo_runtime::pipeline::network::"
        b"ingress::push_handler: Failed to publish response for stream 77691b21 "
        b'component="slow_cancellable-b66da7bb" endpoint="generate"'
    )
    assert noise.noise(cancelled)
    noise.shutting_down = True
    assert noise.noise(always) and noise.noise(watcher) and not noise.noise(other)


def test_dynamo_noise_filter_copies_every_other_line(tmp_path) -> None:
    """fd 2 through the filter, in a child process (it takes over the process's fd 2)."""
    script = (
        "import os, sys, time\n"
        "from bridge.logs import filter_dynamo_noise, dynamo_noise\n"
        "filter_dynamo_noise()\n"
        "os.write(2, b'kept 1\\nx KeyValueStoreManager.watch receiver closed y\\nkept 2\\n')\n"
        "os.write(2, b'Model discovery stream ended\\n')\n"
        "time.sleep(0.5)  # copied before the shutdown begins\n"
        "dynamo_noise.shutting_down = True\n"
        "os.write(2, b'Model discovery stream ended\\npartial')\n"
        "print('python line', file=sys.stderr)\n"
        "dynamo_noise.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.decode().splitlines()
    assert sorted(lines) == sorted(
        ["kept 1", "kept 2", "Model discovery stream ended", "partial", "python line"]
    ), lines
