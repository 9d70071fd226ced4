"""config.pbtxt text → `ModelConfig` protobuf."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..pb_utils.errors import ErrorCode
from .errors import ConfigError

log = logging.getLogger(__name__)


def parse_config_text(text: str, path: Path | str = "config.pbtxt") -> mc.ModelConfig:
    """Parse protobuf text format; a syntax error names the file (Triton's reason text) and
    is logged on a line of its own first, as Triton's protobuf library logs it."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        detail = f"Error parsing text-format inference.ModelConfig: {_parser_message(exc, text)}"
        log.error("%s", detail)
        raise ConfigError(
            f"failed to read text proto from {path}",
            code=ErrorCode.INTERNAL,
            stage="poll",
            detail=detail,
        ) from None
    return config


def _parser_message(exc: text_format.ParseError, text: str) -> str:
    """`LINE:COLUMN: message` as the C++ protobuf parser Triton uses words it, for the messages
    of Python's parser that differ from it (integers; the rest as Python words them)."""
    line, column = exc.GetLine(), exc.GetColumn()
    message = str(exc)
    if line is None or column is None:
        return message
    lines = text.splitlines()
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    for prefix in (f"{line}:{column} : '{source}': ", f"{line}:{column} : "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
            break
    if found := re.fullmatch(r"Couldn't parse integer: (.*)", message):
        message = f"Expected integer, got: {found[1]}"
    elif found := re.fullmatch(r"Value out of range: (-?)(\d+)", message):
        # A negative number out of range is one in an unsigned field (almost always: a signed
        # 64-bit one needs 19 digits), where the C++ parser stops at the sign.
        if found[1] and len(found[2]) < 19:
            message = "Expected integer, got: -"
        else:
            message = f"Integer out of range ({found[2]})"
    return f"{line}:{column}: {message}"


def read_config_file(path: Path) -> mc.ModelConfig:
    """Read and parse a config.pbtxt file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(
            f"failed to open text file for read {path}: {reason}",
            code=ErrorCode.INTERNAL,
            stage="poll",
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"failed to read text proto from {path}",
            code=ErrorCode.INTERNAL,
            stage="poll",
            detail=f"Error parsing text-format inference.ModelConfig: {exc}",
        ) from None
    return parse_config_text(text, path)
