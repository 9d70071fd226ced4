"""Log lines in tritonserver's shape, and a log an operator can afford.

Shape: `I1121 09:23:01.443324 8705 model.py:21] "message"`. Users grep Triton logs by that
shape; model lines from `pb_utils.Logger` keep the calling model file's name and line, and are
quoted as Triton quotes them.

Cost: a request that succeeds writes nothing (Triton writes nothing either), and a request
that fails writes exactly one line, from bridge/errors.py. Four other writers would echo the
same request; by default each is stopped here:
- Dynamo's Rust tracing (`dynamo_log_filter`): one `route request completed` line per request
  (about 486 bytes) and four lines per failure. Dynamo always adds `request_span=trace` after
  reading DYN_LOG, which replaces a user's `request_span=<level>`; a directive naming a field
  (`request_span[{request.outcome}]`) is more specific and wins.
- Dynamo's Python binding prints every exception a handler raises on `sys.stderr`, traceback
  included (`StderrGuard`).
- the loader logs a failed `execute` once per batch (Triton's line); the bridge's per-request
  line carries the same text (`_DuplicateFailureFilter`).
- Dynamo's lines that mean nothing on a healthy run (`DynamoNoiseFilter`, on fd 2): a watch
  whose consumer was dropped, a final response for a caller that cancelled, and, only once the
  bridge's own shutdown has begun, the discovery watchers ending with the runtime (the same lines
  at any other time mean discovery trouble and are kept). A healthy run, from start to SIGTERM,
  prints no WARN or ERROR line behind either door (issue 23).
`--log-verbose 1` brings Dynamo's and the loader's lines back (not the tracebacks: the bridge's
own line says the same).

Triton's LogSettings (`log_info`, `log_warning`, `log_error`, `log_verbose_level`, `log_format`)
change at run time here too (`check_log_settings`, `apply_log_settings`): the triton door applies
them to its process and sends them to every worker over the control endpoint. Dynamo's Rust lines
keep the filter they started with (Dynamo reads DYN_LOG once).

Text a client chose (request ids, input names, anything a model echoes) is escaped: the failure
line escapes every non-printable character, newlines included, and cuts long strings
(`printable`); every other line has its control characters but newline and tab escaped, so no
raw NUL or terminal escape sequence reaches the log. Colour only on a terminal.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from model_repository_loader.errors import FAILED_REQUESTS_PREFIX
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.pb_utils.logger import LOGGER_NAME

# Control characters other than newline and tab, DEL, and the C1 controls: as \xNN.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)] if c not in (9, 10)}


def printable(text: str, limit: int = 256) -> str:
    """`text` on one line, escaped like repr() (no quotes), cut after `limit` characters.

    For strings a client chose: a NUL, an ANSI colour code or a newline cannot reach the log
    raw, and a 10 KB request id costs `limit` characters plus "…(N more)".
    """
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    if not text.isprintable() or "\\" in text:
        text = "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text)
    return f"{text}…({cut} more)" if cut > 0 else text


LOG_FORMATS = ("default", "ISO8601")


class TritonFormatter(logging.Formatter):
    """tritonserver's two `--log-format`s; they differ only in the time stamp [D]:

    default  `I1121 09:23:01.443324 8705 model.py:21] message` (local time)
    ISO8601  `2026-11-21T09:23:01Z I 8705 model.py:21] message` (UTC)
    """

    def __init__(self, log_format: str = "default") -> None:
        super().__init__()
        if log_format not in LOG_FORMATS:
            raise ValueError(f"unknown log format '{log_format}'")
        self.iso8601 = log_format == "ISO8601"

    def format(self, record: logging.LogRecord) -> str:
        # Lines may hold text a client or a model chose: never a raw control character.
        message = record.getMessage().translate(_CONTROL)
        if record.name == LOGGER_NAME:
            message = f'"{message}"'
        # Triton has no debug letter: its verbose lines print as `I` [V].
        letter = "I" if record.levelno < logging.WARNING else record.levelname[0]
        where = f"{os.getpid()} {record.filename}:{record.lineno}] {message}"
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            line = f"{stamp} {letter} {where}"
        else:
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
            micros = int((record.created % 1) * 1_000_000)
            line = f"{letter}{stamp}.{micros:06d} {where}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info).translate(_CONTROL)
        return line


def redirect_output(path: str) -> None:
    """`--log-file`: everything the process writes goes to `path` (appended), not the console.

    Done on the file descriptors, so Dynamo's own lines (written by Rust to fd 2), the start-up
    table and the output of instance processes (which inherit both) land in the same file, as
    everything lands in tritonserver's log file. Raises OSError if the file cannot be opened.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _state.log_file = path
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# Dynamo 1.6.1's lines (Rust, written to fd 2) that an operator can do nothing about, measured on
# healthy runs of both doors (start, requests with cancellations, SIGTERM):
_DYNAMO_NOISE = (
    # ERROR at start-up and at shutdown: a discovery watch whose consumer was dropped.
    b"KeyValueStoreManager.watch receiver closed",
    # ERROR per stream whose caller was gone when its final response went out (a cancel).
    b"Failed to publish complete final for stream",
    # WARN for a response that went out as its caller cancelled (the worker hears of a cancel
    # within ~15 ms, bridge/models/endpoint.py `_CancellationPoller`; one CI run of
    # examples/client.py's slow_cancellable through Dynamo's frontend printed it).
    b"Failed to publish response for stream",
)
# WARNs of the discovery watchers ending: noise once the runtime is being shut down, discovery
# trouble at any other time.
_DYNAMO_SHUTDOWN_NOISE = (
    # ERROR from a client's instance monitor whose source went with the runtime.
    b"monitor_instance_source: The Sender is dropped",
    b"Instance removal watcher stream ended",
    b"Failed to start instance removal watcher",
    b"Model discovery stream ended",
)


class DynamoNoiseFilter:
    """fd 2 (where Dynamo's Rust code writes), minus Dynamo's noise lines (`_DYNAMO_NOISE`, and
    `_DYNAMO_SHUTDOWN_NOISE` once `shutting_down` is set).

    fd 2 becomes a pipe that a thread reads line by line and copies to the real output; the
    bridge's own Python lines (sys.stderr, logging) write to the real output directly, so they
    never wait for that thread. `close()` puts fd 2 back and lets the thread copy what is left.
    Only at the default verbosity: `--log-verbose 1` shows every line.
    """

    _LINE_LIMIT = 1 << 16  # a line longer than this is passed on in pieces

    def __init__(self) -> None:
        self.shutting_down = False
        self._output = -1
        self._thread: threading.Thread | None = None

    def install(self) -> int:
        """Take over fd 2; returns a descriptor of the real output for Python's own lines."""
        sys.stderr.flush()
        self._output = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(
            target=self._copy, args=(read,), name="dynamo-log-filter", daemon=True
        )
        self._thread.start()
        return os.dup(self._output)

    def close(self, timeout: float = 0.5) -> None:
        """fd 2 back to the real output; the lines still in the pipe are copied (while no
        other process holds the pipe, e.g. an instance process, at most `timeout` s)."""
        if self._thread is None:
            return
        os.dup2(self._output, 2)
        self._thread.join(timeout)
        self._thread = None

    def noise(self, line: bytes) -> bool:
        if any(text in line for text in _DYNAMO_NOISE):
            return True
        return self.shutting_down and any(text in line for text in _DYNAMO_SHUTDOWN_NOISE)

    def _copy(self, read: int) -> None:
        pending = b""
        while chunk := os.read(read, self._LINE_LIMIT):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = [line + b"\n" for line in lines if not self.noise(line)]
            if len(pending) >= self._LINE_LIMIT:
                kept.append(pending)
                pending = b""
            self._write(b"".join(kept))
        self._write(pending)
        os.close(read)

    def _write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self._output, data) :]
            except OSError:
                return  # the output is gone; nothing to tell it


dynamo_noise = DynamoNoiseFilter()


def filter_dynamo_noise() -> None:
    """Install `dynamo_noise` on fd 2, before Dynamo is imported; Python's own lines (sys.stderr)
    go to the real output from now on."""
    fd = dynamo_noise.install()
    sys.stderr = open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115


# The loader's text for a failed execute (Triton's, verified); the bridge logs it per request.
_FAILURE_PREFIX = FAILED_REQUESTS_PREFIX


class _DuplicateFailureFilter(logging.Filter):
    """Drops the loader's per-batch execute failure line: errors.py logs it per request."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name == "model_repository_loader.execution"
            and record.levelno == logging.ERROR
            and isinstance(record.args, tuple)
            and len(record.args) == 1
            and str(record.args[0]).startswith(_FAILURE_PREFIX)
        )


class StderrGuard:
    """`sys.stderr`, minus Dynamo's printout of exceptions the bridge has already logged.

    Dynamo's Python binding (ai-dynamo-runtime 1.6) calls `PyErr_Display` for every exception
    a request handler raises: a traceback and the raw message on `sys.stderr`, from one of its
    own threads, where no Python frame is on the stack. Text written from such a place is held
    until the `flush()` that ends every printout, then dropped if it is the printout of an
    exception class that bridge/errors.py raises after logging the request's one line; any
    other printout (an unexpected exception, a crash) passes through unchanged.
    """

    # How errors.py's classes print: `<module>.<qualname>: <message>` at a line start.
    _REPORTED = re.compile(r"^bridge\.errors\.Reported\w*: ", re.MULTILINE)
    _HOLD_LIMIT = 1 << 16  # never hold more than this; pass it through

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._held: dict[int, list[str]] = {}

    def write(self, text: str) -> int:
        if not _native_caller():
            return self._stream.write(text)
        held = self._held.setdefault(threading.get_ident(), [])
        held.append(text)
        if sum(map(len, held)) > self._HOLD_LIMIT:
            self._release(passthrough=True)
        return len(text)

    def flush(self) -> None:
        self._release()
        self._stream.flush()

    def _release(self, passthrough: bool = False) -> None:
        held = self._held.pop(threading.get_ident(), None)
        if held:
            text = "".join(held)
            if passthrough or not self._REPORTED.search(text):
                self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _native_caller() -> bool:
    """True when the caller of `StderrGuard.write` is C code with no Python frame above it."""
    try:
        sys._getframe(2)
    except ValueError:
        return True
    return False


@dataclass(slots=True)
class LogState:
    """The process's log settings, under Triton's LogSettings names (see `apply_log_settings`)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"


_state = LogState()
_handler: logging.Handler | None = None


class _LevelSwitch(logging.Filter):
    """Triton's per-severity switches (`log_info`, `log_warning`, `log_error`), and, at
    `log_verbose_level` 0, the loader's duplicate failure line (`_DuplicateFailureFilter`).
    Verbose (debug) lines are governed by the root level alone, as Triton's by the level."""

    _duplicate = _DuplicateFailureFilter()

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            shown = _state.log_error
        elif level >= logging.WARNING:
            shown = _state.log_warning
        elif level >= logging.INFO:
            shown = _state.log_info
        else:
            shown = True
        if shown and _state.log_verbose_level <= 0:
            shown = self._duplicate.filter(record)
        return shown


def configure_logging(verbose: int, log_format: str = "default") -> None:
    """Our lines at INFO (DEBUG with --log-verbose ≥ 1) on stderr, in Triton's shape."""
    global _handler
    stream = sys.stderr
    if isinstance(stream, StderrGuard):
        stream = stream._stream
    handler = logging.StreamHandler(stream)
    handler.addFilter(_LevelSwitch())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _handler = handler
    # httpx (the metrics port's fetches from Dynamo's frontend) logs every request at INFO: a
    # line per scrape is noise, not news. Its warnings and errors still show.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    apply_log_settings({"log_verbose_level": verbose, "log_format": log_format})
    sys.stderr = StderrGuard(stream)  # type: ignore[assignment]


# Triton's LogSettings keys, in the order Triton checks and applies them [V]: a request with a
# bad value keeps the changes of the keys before it. log_file is never changed at run time.
LOG_SETTING_TYPES: dict[str, type] = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}
_TYPE_WORDS = {bool: "boolean", int: "int32", str: "string"}
LOG_FILE_FIXED = "log file location can not be updated through network protocol"


def log_settings() -> dict[str, bool | int | str]:
    """This process's settings, by Triton's LogSettings names."""
    return {key: getattr(_state, key) for key in LOG_SETTING_TYPES}


def check_log_settings(
    changes: Mapping[str, Any],
) -> tuple[dict[str, bool | int | str], tuple[ErrorCode, str] | None]:
    """The changes Triton would apply, in its order, and its error at the first bad one.

    Unknown keys are ignored, as Triton ignores them [V]. A value of the wrong type (None for
    none given) is INVALID_ARG with Triton's text; `log_file` is UNSUPPORTED (Triton cannot
    move its log file at run time either). Verbose levels are uint32 on Triton's wire: wider
    numbers keep their low 32 bits, as Triton's HTTP endpoint does [V].
    """
    valid: dict[str, bool | int | str] = {}
    for key, kind in LOG_SETTING_TYPES.items():
        if key not in changes:
            continue
        value = changes[key]
        if key == "log_file":
            return valid, (ErrorCode.UNSUPPORTED, LOG_FILE_FIXED)
        # bool is an int in Python; Triton keeps the two apart.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return valid, (ErrorCode.INVALID_ARG, f"expect {_TYPE_WORDS[kind]} for '{key}'")
        if key == "log_verbose_level":
            assert isinstance(value, int)
            if value < 0:
                return valid, (ErrorCode.INVALID_ARG, f"expect int32 for '{key}'")
            value = value & 0xFFFFFFFF
        if key == "log_format" and value not in LOG_FORMATS:
            return valid, (ErrorCode.INVALID_ARG, f"invalid argument for log_format, got: {value}")
        valid[key] = value
    return valid, None


def apply_log_settings(changes: Mapping[str, bool | int | str]) -> dict[str, bool | int | str]:
    """Apply checked settings (`check_log_settings`) to this process; returns them all.

    The verbose level moves the root logger (and so `pb_utils.Logger.log_verbose`) between
    DEBUG and INFO, here and in the process's isolated model instances; the format swaps the
    formatter. Dynamo's own lines keep the filter they started with: Dynamo reads DYN_LOG once.
    """
    for key, value in changes.items():
        if key in LOG_SETTING_TYPES and key != "log_file":
            setattr(_state, key, value)
    if _handler is not None:
        _handler.setFormatter(TritonFormatter(_state.log_format))
    level = logging.DEBUG if _state.log_verbose_level > 0 else logging.INFO
    if logging.getLogger().level != level:
        logging.getLogger().setLevel(level)
        # Instance processes exist only once their module is imported (not at start-up).
        isolation = sys.modules.get("model_repository_loader.isolation.instance")
        if isolation is not None:
            isolation.set_isolated_log_level(level)
    return log_settings()


# Dynamo's per-request lines, off unless --log-verbose ≥ 1 or DYN_LOG names the target.
QUIET_DYNAMO_TARGETS = {
    # `route request completed` (INFO) and `route request failed` (WARN), one per request, and
    # `request cancellation received` (INFO), one per failed or cancelled request.
    "request_span[{request.outcome}]": "error",
    "request_span[{request_id}]": "error",
    # `request completed ... status=error` (ERROR), one per failed request.
    "dynamo_llm::http::service::metrics[{error_detail}]": "off",
    # `Failed to fold completions stream: <the error>` (ERROR), one per failed request.
    "dynamo_llm::grpc::service::kserve": "off",
    # `Stream closed unexpectedly; issuing cancellation` (WARN), per failure or client cancel.
    "dynamo_llm::http::service::disconnect": "error",
}


def dynamo_log_filter(verbose: int, user_filter: str | None) -> str:
    """The DYN_LOG to give Dynamo: the user's (default `warn`) plus the quiet targets.

    A target the user names in DYN_LOG is left as the user set it.
    """
    base = user_filter if user_filter else "warn"
    if verbose > 0:
        return base
    named = {part.split("=")[0].split("[")[0].strip() for part in base.split(",")}
    extra = [
        f"{target}={level}"
        for target, level in QUIET_DYNAMO_TARGETS.items()
        if target.split("[")[0] not in named
    ]
    return ",".join([base, *extra])


# The user's own DYN_LOG, kept beside the one given to Dynamo: a process that re-executes itself
# (roles/discovery.py, after a lost lease) inherits the bridge's DYN_LOG, and must start again
# from the user's, or it would take the quiet targets for the user's and show the banner.
USER_DYN_LOG = "DYN_BRIDGE_USER_DYN_LOG"


def configure_dynamo_logging(verbose: int, environ: MutableMapping[str, str]) -> bool:
    """Set Dynamo's logging variables; it reads them once, when it is imported.

    True if the bridge's quiet targets were added to DYN_LOG (see `hide_filter_banner`).
    """
    user_filter = environ.get(USER_DYN_LOG, environ.get("DYN_LOG")) or None
    environ[USER_DYN_LOG] = user_filter or ""
    environ["DYN_LOG"] = dynamo_log_filter(verbose, user_filter)
    added = environ["DYN_LOG"] != (user_filter or "warn")
    # Dynamo colours its lines unless told not to, terminal or not (https://no-color.org too).
    if environ.get("NO_COLOR") or not sys.stderr.isatty():
        environ.setdefault("DYN_SDK_DISABLE_ANSI_LOGGING", "1")
    # A failed request is a normal outcome here, not a crash: no Rust backtrace for each one.
    environ.setdefault("RUST_LIB_BACKTRACE", "0")
    return added


_BANNER_LINE = "!!!"


@contextmanager
def hide_filter_banner(active: bool) -> Iterator[None]:
    """Around the import of Dynamo: drop the banner it prints about the bridge's own DYN_LOG.

    The quiet targets select on span fields (`request_span[{request.outcome}]`), the one way to
    silence the per-request line, and Dynamo 1.6 then prints a nine-line `!!!` warning that its
    lock-free log filter is off and requests may be slower. Measured on this machine, unary and
    200-response streams showed no difference beyond the run-to-run noise (docs/benchmarks.md),
    so the banner, printed straight to fd 2 before Dynamo's logging exists, would only alarm.
    fd 2 is captured for the import and replayed without the banner; a user's own DYN_LOG with
    such selectors (`active` False) still shows it.
    """
    if not active:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = [line for line in lines if not line.startswith(_BANNER_LINE)]
            if any(line.startswith(_BANNER_LINE) for line in lines):
                kept = [line for line in kept if line.strip()]  # the banner's blank frame
            os.write(2, "".join(kept).encode())
