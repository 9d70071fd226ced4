"""Triton's error codes → gRPC status codes.

Triton's gRPC server maps each `TRITONSERVER_Error_Code` to one gRPC status (e.g. INVALID_ARG →
INVALID_ARGUMENT, UNSUPPORTED → UNIMPLEMENTED) and sends Triton's text unchanged as the
details [V] (spec §3.10). The gRPC door maps here, and nowhere else.

A status's details and a protobuf string must be valid UTF-8, and a text with a lone surrogate
(a model's message holding bytes it read with surrogateescape) would raise while the status or
the stream's error message is built: `wire_text` writes such a character as its `\\uXXXX`
escape instead, so the client still gets the answer and nothing is logged as a failure.
"""

from __future__ import annotations

import grpc

from model_repository_loader.pb_utils.errors import ErrorCode

GRPC_STATUS_NAMES: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN: "UNKNOWN",
    ErrorCode.INTERNAL: "INTERNAL",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.INVALID_ARG: "INVALID_ARGUMENT",
    ErrorCode.UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorCode.CANCELLED: "CANCELLED",
}


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    return grpc.StatusCode[GRPC_STATUS_NAMES[code]]


def wire_text(message: str) -> str:
    """`message` as gRPC can carry it (module docstring)."""
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return message.encode("utf-8", "backslashreplace").decode("utf-8")
    return message
