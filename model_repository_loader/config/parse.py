"""config.pbtxt text → `ModelConfig` protobuf."""

from __future__ import annotations

import os
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..pb_utils.errors import ErrorCode
from .errors import ConfigError


def parse_config_text(text: str, path: Path | str = "config.pbtxt") -> mc.ModelConfig:
    """Parse protobuf text format; a syntax error names the file (Triton's reason text)."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(
            f"failed to read text proto from {path}",
            code=ErrorCode.INTERNAL,
            stage="poll",
            detail=f"Error parsing text-format inference.ModelConfig: {exc}",
        ) from None
    return config


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
