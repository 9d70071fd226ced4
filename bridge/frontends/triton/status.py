"""Triton's error codes ⇄ gRPC status codes, and the error the door answers with.

Triton's gRPC server maps each `TRITONSERVER_Error_Code` to one gRPC status (e.g. INVALID_ARG →
INVALID_ARGUMENT, UNSUPPORTED → UNIMPLEMENTED) and sends Triton's text unchanged as the
details. Workers send the code by name (`{"error": {"code": "INVALID_ARG", "message": ...}}`,
docs/worker_protocol.md §2); the door turns it into the status here, and nowhere else.
"""

from __future__ import annotations

import grpc

from model_repository_loader.errors import TritonStatusError
from model_repository_loader.pb_utils.errors import ErrorCode

_BY_NAME = {code.name: code for code in ErrorCode}
# Triton's code → the gRPC status its gRPC server answers with [V] (spec §3.10).
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


class DoorError(TritonStatusError):
    """A request the door answers with a Triton error: its code and Triton's text (code first,
    as the door's call sites read best)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message, code)

    @property
    def status(self) -> grpc.StatusCode:
        return grpc_status(self.code)

    @classmethod
    def from_item(cls, error: object) -> DoorError:
        """A worker's error item (`{"code": "INVALID_ARG", "message": "..."}`)."""
        if not isinstance(error, dict):
            return cls(ErrorCode.INTERNAL, f"malformed error from the model's worker: {error!r}")
        return cls(code_by_name(str(error.get("code", ""))), str(error.get("message", "")))


def code_by_name(name: str) -> ErrorCode:
    """`"INVALID_ARG"` → ErrorCode.INVALID_ARG; an unknown name is INTERNAL."""
    return _BY_NAME.get(name, ErrorCode.INTERNAL)


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    return grpc.StatusCode[GRPC_STATUS_NAMES[code]]


def invalid(message: str) -> DoorError:
    return DoorError(ErrorCode.INVALID_ARG, message)
