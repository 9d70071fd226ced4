"""Triton's classification extension: an output asked for with `classification: k` (HTTP) or
`class_count` (gRPC) comes back as its top k values, as BYTES `"<value>:<index>"`.

As Triton 2.51 [V]: for a batched model each batch entry is ranked on its own (shape
`[batch, k]`), otherwise the whole output (shape `[k]`); k larger than the count gives them
all; values are ranked high to low, equal values by index; floating point values are written
as C's `%f` (`3.000000`), integers as they are. Labels (`label_filename`) live with the model's
files on the workers, so the door writes no `:<label>` suffix. Only integer, FP32 and FP64
outputs are ranked; others are Triton's "unsupported type" (INVALID_ARG). As Triton 2.66 on: an
output of more than MAX_CLASSIFICATION_ELEMENTS elements is refused before it is ranked.
"""

from __future__ import annotations

import struct

import numpy as np

from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY

from .door_error import invalid

_FLOATING = frozenset({"FP32", "FP64"})
# The datatypes Triton's TopkClassifications ranks (src/classification.cc).
_RANKED = _FLOATING | {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
# Triton's kMaxClassificationElements: an output past it costs a sort nobody asked to pay for.
MAX_CLASSIFICATION_ELEMENTS = 1_000_000
_LENGTH = struct.Struct("<I")


def classify(
    datatype: str, shape: list[int], values: bytes | bytearray, k: int, batching: bool
) -> tuple[str, list[int], bytes]:
    """An output's (datatype, shape, raw bytes) → its top-k classes as BYTES (same triple)."""
    unsupported = f"class result not available for output due to unsupported type '{datatype}'"
    if datatype == "BYTES" or datatype not in DATATYPE_TO_NUMPY:
        raise invalid(unsupported)
    # Triton's order: the size (whatever the type, once it has a fixed size), then the type.
    if len(values) // np.dtype(DATATYPE_TO_NUMPY[datatype]).itemsize > MAX_CLASSIFICATION_ELEMENTS:
        raise invalid("classification output tensor too large")
    if datatype not in _RANKED:
        raise invalid(unsupported)
    typed = np.frombuffer(values, dtype=DATATYPE_TO_NUMPY[datatype])
    batch = shape[0] if batching and shape else 1
    rows = typed.reshape(batch, -1) if typed.size else typed.reshape(batch, 0)
    count = min(k, rows.shape[1])
    floating = datatype in _FLOATING
    parts = []
    for row in rows:
        # Highest first, equal values by index (a stable sort of the negated values).
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for index in order.tolist():
            value = row[index]
            text = f"{float(value):f}" if floating else str(int(value))
            element = f"{text}:{index}".encode()
            parts.append(_LENGTH.pack(len(element)))
            parts.append(element)
    out_shape = [batch, count] if batching else [count]
    return "BYTES", out_shape, b"".join(parts)
