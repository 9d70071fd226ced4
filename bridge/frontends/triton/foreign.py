"""The door's bridge form ⇄ Dynamo's standard `NvCreateTensorRequest` form, for foreign workers.

A worker that is not a bridge worker (model_cards.py) takes what Dynamo's KServe frontend sends
(bridge/codec.py, spec dynamo_runtime §1–3): every tensor's values as a typed per-element list
(numbers; BOOL as bools; FP16/BF16 as their u16 bit patterns; BYTES as one list of ints per
element), no version, no `bridge_form`. Its answers come back in the same form, with no `final`
flag and errors raised rather than sent. So the door converts its request once
(`to_standard_request`) and each answer (`bridge_items`) into the bridge form the wires take:
raw outputs, `final` on the last answer (the stream's end; a `triton_final_response` parameter
when the worker sends one), the error of a failed stream as an INTERNAL item (a foreign worker
sends no code; Dynamo's own frontend answers INTERNAL too). That costs the per-element work the
bridge form avoids: the fast form is only for workers that announce it.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from model_repository_loader.pb_utils.errors import ErrorCode

from ...cluster.protocol import error_item
from ...codec import TO_KSERVE
from .model_cards import FOREIGN_VERSION

_LENGTH = struct.Struct("<I")
# The little-endian layout of each datatype's raw contents (FP16/BF16 as their bit patterns).
_RAW: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.uint8),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<u2"),
    "BF16": np.dtype("<u2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
FINAL_PARAMETER = "triton_final_response"


def _split(raw: bytes) -> list[bytes]:
    """KServe's length-prefixed BYTES contents (already checked by the wire) → elements."""
    out = []
    offset = 0
    while offset < len(raw):
        (length,) = _LENGTH.unpack_from(raw, offset)
        out.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return out


def to_list(datatype: str, raw: bytes) -> list[Any]:
    """Raw contents → Dynamo's per-element list for `datatype` (KServe name)."""
    if datatype == "BYTES":
        return [list(element) for element in _split(raw)]
    values = np.frombuffer(raw, _RAW[datatype])
    return (values != 0).tolist() if datatype == "BOOL" else values.tolist()


def _element(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return bytes(bytearray(value))


def to_raw(datatype: str, values: Any) -> bytes:
    """Dynamo's per-element list (or raw bytes, left as they are) → raw contents."""
    if isinstance(values, bytes | bytearray):
        return bytes(values)
    if datatype == "BYTES":
        parts = []
        for value in values:
            element = _element(value)
            parts.append(_LENGTH.pack(len(element)))
            parts.append(element)
        return b"".join(parts)
    if datatype == "BOOL":
        return np.asarray(values, dtype=np.bool_).astype(np.uint8).tobytes()
    return np.asarray(values, dtype=_RAW[datatype]).tobytes()


def to_standard_request(body: dict[str, Any]) -> dict[str, Any]:
    """A bridge-form request (grpc/tensors.py, http/) → the standard form."""
    out = {k: v for k, v in body.items() if k not in ("bridge_form", "model_version")}
    tensors = []
    for tensor in body.get("tensors", ()):
        data = tensor["data"]
        values = data["values"]
        if isinstance(values, bytes | bytearray):
            values = to_list(TO_KSERVE[data["data_type"]], bytes(values))
        tensors.append({"metadata": tensor["metadata"], "data": {**data, "values": values}})
    out["tensors"] = tensors
    return out


def _bridge_item(answer: dict[str, Any], final: bool) -> dict[str, Any]:
    tensors = []
    for tensor in answer.get("tensors", ()):
        data = tensor["data"]
        raw = to_raw(TO_KSERVE[data["data_type"]], data["values"])
        tensors.append({"metadata": tensor["metadata"], "data": {**data, "values": raw}})
    item = {**answer, "tensors": tensors, "final": final, "model_version": FOREIGN_VERSION}
    if "parameters" in answer:
        item["parameters"] = {k: v for k, v in answer["parameters"].items() if k != FINAL_PARAMETER}
    return item


def _says_final(answer: dict[str, Any]) -> bool:
    parameter = (answer.get("parameters") or {}).get(FINAL_PARAMETER)
    return bool(isinstance(parameter, dict) and parameter.get("bool"))


async def bridge_items(stream: AsyncIterator[Any], model: str) -> AsyncIterator[dict[str, Any]]:
    """A foreign worker's answers → bridge-form items, the last one `final`.

    Each answer is held until the next one (or the end) shows whether it was the last, unless
    the worker marks it final itself. A stream that ends with no answer gives a flag-only FINAL.
    """
    held: dict[str, Any] | None = None
    try:
        async for answer in stream:
            if held is not None:
                yield _bridge_item(held, False)
            if _says_final(answer):
                yield _bridge_item(answer, True)
                return
            held = answer
    except Exception as exc:  # the worker's handler raised: Dynamo carries the text only
        if held is not None:
            yield _bridge_item(held, False)
        yield {"error": error_item(ErrorCode.INTERNAL, str(exc)), "final": True}
        return
    if held is not None:
        yield _bridge_item(held, True)
    else:
        yield {"model": model, "model_version": "", "tensors": [], "final": True, "empty": True}
