"""The bridge log: Triton's line shape, and what each request costs in it.

pb_utils.Logger lines: Triton [V] (spec §1.9): `I1121 09:23:01.443324 8705 model.py:21] "info msg"`;
verbose lines only with `--log-verbose` ≥ 1, and then with the letter `I` like info lines (seen on
Triton 2.51 with the `chatty` model: `I… model.py:23] "chatty-execute-verbose"`).

Cost (issue 16): a successful request writes nothing, a failed one exactly one line with the
client's strings escaped and cut; no colour codes in a log that is not a terminal; the start-up
lines never claim a bind address that is not the real one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.support import SERVING, fp32_input, line_of, wait_until
from tests.harness.sockets import listening_addresses

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


# -- what a request costs in the log (issue 16) ---------------------------------------------------


def lines_since(server, start: int, marker: str) -> list[str]:
    """The log's lines after offset `start`, once a line holding `marker` has been written.

    Lines are written in order by one process, so a later request's line coming out means the
    earlier requests' lines (if any) are already there.
    """
    wait_until(lambda: marker in server.log_text[start:], f"{marker!r} in the log")
    return server.log_text[start:].splitlines()


def fail_echo(server, request_id: str, input_name: str = "NOPE") -> None:
    """A request the bridge refuses (INVALID_ARG: echo has no input `input_name`)."""
    with pytest.raises(InferenceServerException):
        server.client().infer("echo", [fp32_input([1.0], input_name)], request_id=request_id)


def test_successful_requests_write_no_lines(quiet) -> None:
    start = len(quiet.log_text)
    client = quiet.client()
    for n in range(20):
        client.infer("echo", [fp32_input([float(n)])], request_id=f"ok-{n}")
    # chatty's own lines mark the point by which the echo requests' lines would be out.
    call_chatty(quiet, "after-the-good-ones")
    lines = lines_since(quiet, start, "chatty-execute-error")
    assert all('] "chatty-execute-' in line for line in lines), "\n".join(lines)


@pytest.mark.parametrize(
    "model, request_id, input_name, code",
    [
        # The bridge refuses it: the message echoes the input name.
        ("echo", "bad\x00\x1b[31mred\x1b[0m", "IN\x00\x1b[31mPUT", "INVALID_ARG"),
        # The model raises: the message spans lines ("At:" and the model's stack).
        ("flaky", "raise\x00\x1b[31m", "INPUT0", "INTERNAL"),
    ],
)
def test_failed_request_writes_one_escaped_line(
    quiet, model: str, request_id: str, input_name: str, code: str
) -> None:
    start = len(quiet.log_text)
    with pytest.raises(InferenceServerException):
        quiet.client().infer(model, [fp32_input([-1.0], input_name)], request_id=request_id)
    escaped_id = request_id.replace("\x00", "\\x00").replace("\x1b", "\\x1b")
    lines = [line for line in lines_since(quiet, start, escaped_id) if escaped_id in line]
    assert len(lines) == 1, "\n".join(lines)
    (line,) = lines
    # The client's fault is an INFO line (nothing for an operator to do), the model's an ERROR.
    level = "I" if code == "INVALID_ARG" else "E"
    assert re.match(
        rf"^{level}\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} \d+ errors\.py:\d+\] request failed: ", line
    )
    assert f"model '{model}'" in line and f"id '{escaped_id}'" in line and f" {code}: " in line
    if input_name != "INPUT0":
        assert "IN\\x00\\x1b[31mPUT" in line
    assert "\x00" not in line and "\x1b" not in line


def test_client_strings_are_cut(quiet) -> None:
    start = len(quiet.log_text)
    fail_echo(quiet, "long-" + "x" * 10_000, input_name="Y" * 10_000)
    # The bridge's one line for the request (Dynamo may add its own transport lines meanwhile,
    # e.g. "writer task returned error ... Broken pipe" when the client's stream closes first).
    (line,) = [line for line in lines_since(quiet, start, "long-") if "long-" in line]
    assert "…(9749 more)" in line  # the id: 256 characters kept of 10,005
    assert len(line) < 1_500, len(line)  # the message is cut too


def test_no_colour_when_the_log_is_not_a_terminal(verbose) -> None:
    # With --log-verbose Dynamo writes its per-request lines; the log here is a file.
    start = len(verbose.log_text)
    verbose.client().infer("echo", [fp32_input([1.0])], request_id="colourless")
    lines_since(verbose, start, "route request completed")
    assert "\x1b[" not in verbose.log_text


def test_startup_lines_tell_the_bind_address(quiet) -> None:
    # The triton door (the default) honours --host and --http-address: loopback only.
    assert listening_addresses(quiet.grpc_port) == {"127.0.0.1"}
    assert listening_addresses(quiet.http_port) == {"127.0.0.1"}
    assert f"serving Triton gRPC on 127.0.0.1:{quiet.grpc_port}" in quiet.log_text
    assert f"serving Triton HTTP on 127.0.0.1:{quiet.http_port}" in quiet.log_text
    assert "Dynamo's KServe frontend serves" not in quiet.log_text


def test_the_door_polls_its_grpc_connections_on_its_own_thread(quiet) -> None:
    """EventEngine's listener is off in the door's process (bridge/tuning.py grpc_server_io),
    chosen before gRPC was loaded, on the grpcio releases known to have the switch."""
    from importlib.metadata import version

    from bridge.tuning import GRPC_LISTENER_KNOWN_FROM, GRPC_LISTENER_KNOWN_UNTIL

    release = tuple(int(part) for part in version("grpcio").split(".")[:2])
    if not GRPC_LISTENER_KNOWN_FROM <= release <= GRPC_LISTENER_KNOWN_UNTIL:
        pytest.skip(f"grpcio {version('grpcio')} is not among the releases known to have it")
    (line,) = [line for line in quiet.log_text.splitlines() if "serving Triton gRPC" in line]
    assert line.endswith("GRPC_EXPERIMENTS=-event_engine_listener"), line
    assert "Unknown experiment" not in quiet.log_text


def test_startup_lines_tell_dynamo_s_real_bind_address(shared_bridge_server) -> None:
    dynamo = shared_bridge_server(SERVING, "--frontend", "dynamo")
    port = dynamo.grpc_port
    assert listening_addresses(port) == {"0.0.0.0"}  # Dynamo 1.6 ignores http_host
    text = dynamo.log_text
    assert re.search(
        r"^W\d{4} .*\] --host 127\.0\.0\.1 is not honoured: .* every interface \(0\.0\.0\.0\)",
        text,
        re.MULTILINE,
    )
    assert f"serving KServe gRPC on 0.0.0.0:{port}" in text
    assert f"127.0.0.1:{port}" not in text
    # Once, at start-up: what this door does not serve that a Triton user expects, and where.
    notices = [line for line in text.splitlines() if "Dynamo's KServe frontend serves" in line]
    assert len(notices) == 1 and re.match(r"^I\d{4} ", notices[0]), notices
    for missing in ("HTTP/REST port (8000, --http-port)", "repository", "statistics"):
        assert missing in notices[0]
    assert notices[0].endswith("--frontend triton (the default) serves all of them")


# -- --log-format and --log-file, as tritonserver has them ---------------------------------------

ISO8601_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ [\w.]+:\d+\] ", re.MULTILINE)
DEFAULT_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+:\d+\] ", re.MULTILINE)


def test_iso8601_lines_go_to_the_log_file(shared_bridge_server, tmp_path: Path) -> None:
    log_file = tmp_path / "bridge-file.log"
    server = shared_bridge_server(SERVING, "--log-format", "ISO8601", "--log-file", str(log_file))
    server.client().infer("chatty", [fp32_input([1.0])], request_id="in-file")
    wait_until(
        lambda: "chatty-execute-info id=in-file" in log_file.read_text(), "the line in the file"
    )
    text = log_file.read_text()
    # Every line the bridge formats is in the ISO8601 shape, model lines quoted as Triton does.
    assert re.search(
        r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ model\.py:\d+\] "chatty-initialize-info"$',
        text,
        re.MULTILINE,
    )
    assert ISO8601_LINE.search(text) and not DEFAULT_LINE.search(text)
    assert "serving Triton gRPC on" in text  # the bridge's own lines
    assert "+-------" in text  # the start-up table (stdout) too
    # Nothing reaches the console any more.
    assert "chatty" not in server.log_text
    assert "serving Triton gRPC" not in server.log_text


def test_unwritable_log_file_is_a_start_up_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "bridge.log"
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "--model-repository", SERVING, "--log-file", missing],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2
    assert f"--log-file: cannot open '{missing}'" in done.stderr


def test_no_dynamo_filter_banner_for_the_bridges_own_quiet_targets(quiet) -> None:
    # The bridge's DYN_LOG selects on span fields; Dynamo's warning about that is its own
    # choice, measured and documented, not the user's concern (logs.hide_filter_banner).
    assert "EnvFilter FALLBACK" not in quiet.log_text
    assert "!!!" not in quiet.log_text
