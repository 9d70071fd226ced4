"""The error a door answers with: Triton's code and text.

Workers send the code by name (`{"error": {"code": "INVALID_ARG", "message": ...}}`,
docs/worker_protocol.md §2); each wire maps the code to its own status once (grpc/status.py,
http/...).
"""

from __future__ import annotations

from model_repository_loader.errors import TritonStatusError
from model_repository_loader.pb_utils.errors import ErrorCode

_BY_NAME = {code.name: code for code in ErrorCode}


class DoorError(TritonStatusError):
    """A request the door answers with a Triton error: its code and Triton's text (code first,
    as the door's call sites read best)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message, code)

    @classmethod
    def from_item(cls, error: object) -> DoorError:
        """A worker's error item (`{"code": "INVALID_ARG", "message": "..."}`)."""
        if not isinstance(error, dict):
            return cls(ErrorCode.INTERNAL, f"malformed error from the model's worker: {error!r}")
        return cls(code_by_name(str(error.get("code", ""))), str(error.get("message", "")))


def code_by_name(name: str) -> ErrorCode:
    """`"INVALID_ARG"` → ErrorCode.INVALID_ARG; an unknown name is INTERNAL."""
    return _BY_NAME.get(name, ErrorCode.INTERNAL)


def invalid(message: str) -> DoorError:
    return DoorError(ErrorCode.INVALID_ARG, message)
