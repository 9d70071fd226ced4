"""Errors the loader reports, worded as Triton words them.

`TritonStatusError` is the one base of every error this project reports to a client: Triton's
text and Triton's status code (`ErrorCode`). The loader and the bridge raise its subclasses; a
code becomes a Dynamo exception, a gRPC status or an HTTP status only at the edge that answers
(bridge/errors.py, bridge/frontends/, bridge/control/).
"""

from __future__ import annotations

import traceback
from pathlib import Path

from .pb_utils.errors import ErrorCode, TritonError

_PACKAGE_DIR = Path(__file__).resolve().parent
_PB_UTILS_DIR = _PACKAGE_DIR / "pb_utils"
_NATIVE_IN_TRITON = frozenset({_PB_UTILS_DIR / "response_sender.py"})


# Triton's text for requests an instance could not process [V], built here only.
FAILED_REQUESTS_PREFIX = "Failed to process the request(s) for model "


def failed_requests_text(instance_name: str, what: str) -> str:
    """`Failed to process the request(s) for model '<instance>', message: <what>`."""
    return f"{FAILED_REQUESTS_PREFIX}'{instance_name}', message: {what}"


class TritonStatusError(Exception):
    """An error with Triton's text (`str(exc)`, `message`) and status code (`code`)."""

    default_code = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code

    def triton_error(self) -> TritonError:
        """The same error as a response carries it."""
        return TritonError(self.message, self.code)


class ModelLoadError(TritonStatusError):
    """A model (version) failed to load; str() is the reason Triton would report.

    `version` is the version that failed, or None when the model failed before any version
    (its config, or the repository scan).
    """

    def __init__(self, reason: str, version: int | None = None) -> None:
        super().__init__(reason)
        self.version = version


def _is_ours(filename: str) -> bool:
    # The loader's own frames are hidden, as Triton's C++ frames are; pb_utils frames stay, as
    # Triton shows those of triton_python_backend_utils.py, except those of classes Triton
    # implements in C++ (the response sender's `send` has no frame there [V on 2.51]).
    if filename.startswith("<frozen "):
        return True
    try:
        path = Path(filename).resolve()
    except (OSError, ValueError):
        return False
    if path in _NATIVE_IN_TRITON:
        return True
    return path.is_relative_to(_PACKAGE_DIR) and not path.is_relative_to(_PB_UTILS_DIR)


def format_python_error(exc: BaseException) -> str:
    """A Python exception as Triton's Python backend reports it.

    `"<Type>: <message>"`, then `"\n\nAt:\n"` and one `"  <file>(<line>): <function>\n"` per
    frame, innermost first, from the raising frame up to the model's entry point (`execute`,
    `initialize`, ...), when the exception went through user code.
    """
    text = f"{type(exc).__name__}: {exc}"
    frames = [
        frame
        for frame in reversed(traceback.extract_tb(exc.__traceback__))
        if not _is_ours(frame.filename)
    ]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in frames)
    return text
