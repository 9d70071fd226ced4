"""Triton's limits on what an HTTP request may cost, and their texts.

Triton caps a request's JSON, a compressed body once inflated and a JSON input's bytes at
`--http-max-input-size` (64 MB by default, its HTTP_DEFAULT_MAX_INPUT_SIZE), and nested JSON
at 100 levels (HTTP_MAX_JSON_NESTING_DEPTH), each refusal INVALID_ARG (400) with the texts
below (src/http_server.cc, src/data_compressor.h; newer than the 2.51 oracle, which has no such
limits, so they are read from Triton's source rather than observed). Triton reads a binary
extension body whole whatever its size; the door caps the whole body too (security.py), as
it holds the body in memory, with the same flag to raise it.

Work whose cost grows with the body (inflating it, parsing its JSON, packing its tensors) runs
on a thread once the body passes OFF_LOOP_BYTES, so one large request does not hold the event
loop that every other connection, the gRPC wire and Dynamo's runtime share. The JSON parser
itself holds the GIL while it runs; the size cap bounds that.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ....offload import run_off_loop
from ..door_error import invalid

DEFAULT_MAX_INPUT_SIZE = 1 << 26  # Triton's HTTP_DEFAULT_MAX_INPUT_SIZE (64 MB)
MAX_JSON_NESTING_DEPTH = 100  # Triton's HTTP_MAX_JSON_NESTING_DEPTH
OFF_LOOP_BYTES = 1 << 20
RAISE_IT = "Use --http-max-input-size to increase the limit."
NESTING_TOO_DEEP = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_NESTING_DEPTH})"

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string: its brackets do not nest
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_SLICE = 1 << 20

T = TypeVar("T")


def body_too_large(size: int, limit: int, complete: bool = True) -> str:
    """Triton's text for a request JSON over the limit (`complete`: `size` is the whole
    body's; else the part read when it passed the limit)."""
    amount = f"{size} bytes" if complete else f"more than {limit} bytes"
    return (
        f"request JSON size of {amount} exceeds the maximum allowed input size of {limit} "
        f"bytes. {RAISE_IT}"
    )


def decompressed_too_large(limit: int) -> str:
    return f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {RAISE_IT}"


def json_input_too_large(name: str, size: int, limit: int) -> str:
    return (
        f"JSON input '{name}' has a byte_size ({size} bytes) that exceeds the maximum allowed "
        f"value of {limit} bytes. {RAISE_IT}"
    )


def check_depth(raw: bytes, limit: int = MAX_JSON_NESTING_DEPTH) -> None:
    """Refuse (400, Triton's text) a JSON text whose arrays and objects nest deeper than
    `limit`, before it is parsed. Done on the bytes at C speed: strings removed, brackets kept,
    a running sum in slices (bounded memory whatever the body)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # cannot nest deeper than it has brackets
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    depth = 0
    for start in range(0, len(brackets), _DEPTH_SLICE):
        codes = np.frombuffer(brackets, np.uint8, min(_DEPTH_SLICE, len(brackets) - start), start)
        steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
        running = np.cumsum(steps, dtype=np.int64) + depth
        if int(running.max()) > limit:
            raise invalid(NESTING_TOO_DEEP)
        depth = int(running[-1])


async def off_loop(size: int, work: Callable[[], T]) -> T:
    """`work()` on a thread when its input is `size` bytes past OFF_LOOP_BYTES, else here."""
    if size > OFF_LOOP_BYTES:
        return await run_off_loop(work)
    return work()
