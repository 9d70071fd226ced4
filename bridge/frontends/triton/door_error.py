"""The error a door answers with: Triton's code and text.

Workers send the code by name (the error item of bridge/cluster/protocol.py,
docs/worker_protocol.md §2); each wire maps the code to its own status once (grpc/error_status.py,
http/...).
"""

from __future__ import annotations

from model_repository_loader.errors import TritonStatusError
from model_repository_loader.pb_utils.errors import ErrorCode

from ...cluster.protocol import read_error


class DoorError(TritonStatusError):
    """A request the door answers with a Triton error: its code and Triton's text (code first,
    as the door's call sites read best)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message, code)

    @classmethod
    def from_item(cls, error: object) -> DoorError:
        """A worker's error item (`{"code": "INVALID_ARG", "message": "..."}`)."""
        return cls(*read_error(error))


def invalid(message: str) -> DoorError:
    return DoorError(ErrorCode.INVALID_ARG, message)
