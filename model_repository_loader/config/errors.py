"""The one exception type of repository scanning and configuration handling."""

from __future__ import annotations

from typing import Literal

from ..errors import TritonStatusError
from ..pb_utils.errors import ErrorCode

# Where in Triton's load sequence an error happens decides what a client sees:
# - "poll":     reading / normalizing / validating config.pbtxt before any version is chosen.
#               Triton only logs the reason; an explicit load answers "failed to poll".
# - "versions": no version directory matches the version policy.
# - "load":     per version: instance groups, auto-complete, tensor validation, model file.
Stage = Literal["poll", "versions", "load"]

# The words Triton prints for a status code in front of a reason, as in
# "version 1 is at UNAVAILABLE state: Invalid argument: ...".
_CODE_WORDS = {
    ErrorCode.UNKNOWN: "Unknown",
    ErrorCode.INTERNAL: "Internal",
    ErrorCode.NOT_FOUND: "Not found",
    ErrorCode.INVALID_ARG: "Invalid argument",
    ErrorCode.UNAVAILABLE: "Unavailable",
    ErrorCode.UNSUPPORTED: "Unsupported",
    ErrorCode.ALREADY_EXISTS: "Already exists",
    ErrorCode.CANCELLED: "Cancelled",
}


class ConfigError(TritonStatusError):
    """A model that cannot be loaded because of its directory or configuration.

    `str(error)` is Triton's reason text. `code` is its status code, `stage` where
    Triton would have failed (see `Stage`), `detail` extra text for logs (e.g. the parser's
    message for a config.pbtxt syntax error, which Triton logs on a separate line).
    """

    def __init__(
        self,
        reason: str,
        *,
        code: ErrorCode = ErrorCode.INVALID_ARG,
        stage: Stage = "poll",
        detail: str = "",
    ) -> None:
        super().__init__(reason, code)
        self.reason = reason
        self.stage: Stage = stage
        self.detail = detail

    def __str__(self) -> str:
        return self.reason

    @property
    def status_text(self) -> str:
        """`<code words>: <reason>`, the form inside Triton's per-version load errors."""
        return f"{_CODE_WORDS[self.code]}: {self.reason}"
