"""Triton's error codes → gRPC status codes.

Triton's gRPC server maps each `TRITONSERVER_Error_Code` to one gRPC status (e.g. INVALID_ARG →
INVALID_ARGUMENT, UNSUPPORTED → UNIMPLEMENTED) and sends Triton's text unchanged as the
details [V] (spec §3.10). The gRPC door maps here, and nowhere else.
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
