"""Request bodies as Triton's HTTP server reads JSON (its control routes, generate, settings).

Triton answers a body its JSON parser refuses with 500 "failed to parse the request JSON
buffer: ..." [V], and a JSON value of the wrong kind with its parser's own 500 texts (e.g.
"attempt to access JSON non-string as string"), so those are INTERNAL here, in one place.
`/infer` reads its JSON header itself (tensors.py: the binary extension, 400 by design).
JSON nested deeper than Triton's limit is its 400 before any parsing (limits.py); a large body
is parsed on a thread (`read_json`). A `\\uXXXX` escape of a lone UTF-16 surrogate (Python's
parser takes it, RapidJSON does not) is Triton's "The surrogate pair in string is invalid. at
<offset>" [V], so no such string reaches a model or an answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from model_repository_loader.pb_utils.errors import ErrorCode

from ..door_error import DoorError
from .limits import check_depth, off_loop

PARSE_FAILED = "failed to parse the request JSON buffer"
EMPTY_DOCUMENT = f"{PARSE_FAILED}: The document is empty. at 0"
SURROGATE_INVALID = "The surrogate pair in string is invalid."

# Backslashes then `uD800`-`uDFFF`: an escape when the backslashes are odd in number.
_SURROGATE_ESCAPE = re.compile(rb"(\\+)u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LOW_SURROGATE = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def lone_surrogate_at(raw: bytes) -> int | None:
    """The offset of the first escape of a lone surrogate in a JSON text, as RapidJSON reports
    it (the escape's backslash), or None. A high surrogate must be followed at once by an
    escaped low one."""
    if b"\\u" not in raw:
        return None
    position = 0
    while match := _SURROGATE_ESCAPE.search(raw, position):
        position = match.end()
        if len(match.group(1)) % 2 == 0:
            continue  # an escaped backslash, then the letter u
        start = match.end(1) - 1
        high = raw[start + 3 : start + 4].lower() in (b"8", b"9", b"a", b"b")
        if not high or not _LOW_SURROGATE.match(raw, match.end()):
            return start
        position = match.end() + 6  # the pair's low half
    return None


def internal(message: str) -> DoorError:
    """One of Triton's 500 answers to a body it could not read."""
    return DoorError(ErrorCode.INTERNAL, message)


def json_document(
    raw: bytes,
    *,
    required: bool = True,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The body's JSON value. An empty body is Triton's "document is empty" error when
    `required`, else None; a body that does not parse is its "failed to parse" error."""
    if not raw.strip():
        if required:
            raise internal(EMPTY_DOCUMENT)
        return None
    check_depth(raw)
    if (offset := lone_surrogate_at(raw)) is not None:
        raise internal(f"{PARSE_FAILED}: {SURROGATE_INVALID} at {offset}")
    try:
        return json.loads(raw, object_pairs_hook=object_pairs_hook)
    except (ValueError, RecursionError) as exc:
        raise internal(f"{PARSE_FAILED}: {exc}") from None


async def read_body(request: Request) -> bytes:
    """The whole body, not kept by the request: Starlette's `Request.body()` caches it for the
    handler's whole life, so an inference body would stay beside its decoded inputs while the
    model runs (issue 38: BYTES requests cost several times their size)."""
    chunks = [chunk async for chunk in request.stream()]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_json(
    request: Request,
    *,
    required: bool = True,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The request body's JSON value (`json_document`), parsed off the event loop when large."""
    raw = await request.body()
    return await off_loop(
        len(raw),
        lambda: json_document(raw, required=required, object_pairs_hook=object_pairs_hook),
    )
