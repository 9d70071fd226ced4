"""`--grpc-header-forward-pattern` / `--http-header-forward-pattern`: headers as request parameters.

As Triton 2.51 does [V]: every header (gRPC metadata entry) whose name the regular expression
matches anywhere in it (a search, not a full match), case-insensitively unless the pattern starts
with `(?-i)`, becomes a string parameter of the inference request under the header's name. On a
clash with a parameter of the request's body the header wins; of two headers with one name the
last wins. Only inference requests carry them (HTTP `/infer`, gRPC ModelInfer and
ModelStreamInfer), not `/generate`. A BLS request a model builds carries only the parameters the
model gives it, as in Triton: forwarded headers reach a callee when the model passes them on.

Differences: a header named like a reserved parameter (`sequence_id`, `priority`, `timeout`,
... or `triton_*`) is refused INVALID_ARG with the text of Triton's later releases; Triton 2.51
forwards it, letting a header steer sequence ids and priorities. The HTTP wire sees header names
in lower case (HTTP/1.1 names are case-insensitive and the server lowercases them); Triton keeps
the case the client sent. gRPC metadata names are lower case on both.

Python's `re` reads the pattern (Triton uses RE2; the common syntax is the same).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from model_repository_loader.inference import TRITON_PARAMETERS
from model_repository_loader.pb_utils.errors import ErrorCode

from .door_error import DoorError

_CASE_SENSITIVE = "(?-i)"


class HeaderForwarding:
    """One wire's pattern, compiled once at start-up (ValueError for one that does not parse)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        flags = 0
        if pattern.startswith(_CASE_SENSITIVE):
            pattern = pattern[len(_CASE_SENSITIVE) :]
        else:
            flags = re.IGNORECASE
        try:
            self._regex = re.compile(pattern, flags)
        except re.error as exc:
            raise ValueError(f"header forward pattern '{self.pattern}': {exc}") from None

    def parameters(self, headers: Iterable[tuple[str, Any]]) -> dict[str, dict[str, str]]:
        """The matching headers as bridge-form parameters (`{name: {"string": value}}`).

        Raises DoorError (INVALID_ARG) for a matching header that is a reserved parameter name.
        """
        out: dict[str, dict[str, str]] = {}
        for name, value in headers:
            if not self._regex.search(name):
                continue
            if name in TRITON_PARAMETERS or name.startswith("triton_"):
                raise DoorError(
                    ErrorCode.INVALID_ARG,
                    f"Header '{name}' is reserved for Triton usage and cannot be forwarded.",
                )
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            out[name] = {"string": text}
        return out


def forward_into(body: dict[str, Any], forwarded: dict[str, dict[str, str]]) -> None:
    """Add `forwarded` to a bridge-form request's parameters; a header wins a clash [V]."""
    if forwarded:
        body["parameters"] = {**body.get("parameters", {}), **forwarded}
