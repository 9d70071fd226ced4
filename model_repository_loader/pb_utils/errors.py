"""`TritonError`, `TritonModelException` and the pybind-style argument errors.

In Triton these come from the C++ extension `c_python_backend_utils`: `TritonError` is a plain
class (not an exception) carrying a message and an error code enum, and `TritonModelException` is
the exception pb_utils raises on misuse.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any


def failed_call_text(instance_name: str, what: str) -> str:
    """Triton's text for a pb_utils call the server failed (a metric, the loading API) [V]."""
    return f"Failed to process the request for model '{instance_name}', message: {what}"


class TritonModelException(Exception):
    """Raised by pb_utils on misuse; models raise it too. `str(e)` is the message."""


class ErrorCode(enum.IntEnum):
    """Triton's `TritonError.__ErrorCode`: the TRITONSERVER_Error_Code values."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    # pybind11 enums print as "<Type>.<NAME>" (IntEnum would print the number on 3.11+).
    def __str__(self) -> str:
        return f"__ErrorCode.{self.name}"

    def __repr__(self) -> str:
        return f"<__ErrorCode.{self.name}: {self.value}>"


def pybind_type_error(
    function: str, signature: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> TypeError:
    """The TypeError pybind11 raises when no overload accepts the arguments.

    `function` is "__init__" for constructors (pybind words that case differently).
    """
    if function == "__init__":
        head = "__init__(): incompatible constructor arguments."
    else:
        head = f"{function}(): incompatible function arguments."
    invoked = ", ".join(repr(a) for a in args)
    if kwargs:
        kw = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        invoked = f"{invoked}; kwargs: {kw}" if invoked else f"kwargs: {kw}"
    return TypeError(
        f"{head} The following argument types are supported:\n"
        f"    1. {signature}\n\nInvoked with: {invoked}"
    )


_ERROR_SIGNATURE = (
    "c_python_backend_utils.TritonError(message: str, "
    "code: c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)"
)


class TritonError:
    """An error to put in an `InferenceResponse`; the code picks the client's status."""

    __slots__ = ("_message", "_code")

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Parsed by hand to reproduce pybind's rules: `message` is a str (None is refused)
        # and `code` must be the enum member, never a plain int [V 2.51].
        params = bind_arguments(("message", "code"), args, kwargs)
        if params is None:
            raise pybind_type_error("__init__", _ERROR_SIGNATURE, args, kwargs)
        message = params.get("message")
        if isinstance(message, bytes):  # pybind's str caster takes bytes too
            message = message.decode()
        code = params.get("code", ErrorCode.INTERNAL)
        if not isinstance(message, str) or not isinstance(code, ErrorCode):
            raise pybind_type_error("__init__", _ERROR_SIGNATURE, args, kwargs)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code!r})"


def bind_arguments(
    names: Sequence[str], args: Sequence[Any], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """Map positional and keyword arguments onto `names`; None if they don't fit."""
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key not in names or key in bound:
            return None
        bound[key] = value
    return bound
