"""BYTES tensors in their serialized form, checked, decoded and encoded without amplifying.

Triton's wire form of a BYTES tensor is one buffer: per element a 4-byte little-endian length,
then its bytes. A model sees an object array of `bytes` (as Triton's stub gives it), which costs
8 bytes a pointer plus a Python object per element of 2 bytes or more (CPython shares the 0- and
1-byte ones). Issue 22 measured the old per-element code: a 40 MB request of 8 M one-byte
strings cost +1.9 GB and stalled every other request for seconds, because the framing was
walked in Python on the event loop, then again to slice, and the answer was framed with one
Python `bytes` per length prefix. Here:

- `scan` checks the framing. When every element has the same length (one-byte strings,
  fixed-size ids) one numpy pass over a strided view of the prefixes settles it; otherwise one
  Python walk that keeps no per-element objects (the offsets only when decoding).
- `decode` fills the one object array the model sees, a slice at a time (between slices the GIL
  can go to the event loop), straight from the buffer. `Serialized` puts that off until the
  model reads the input: a request waiting for its instance holds its BYTES at their size, not
  at the ~1.9× of their objects (issue 38 finding 7), every check having been made (`scan`).
- `encode` frames an object array into one buffer of its framed size, a slice at a time with
  numpy: no `bytes` per prefix, no chunks joined.
- `BytesLimits` caps what a request may cost once decoded (`--max-bytes-elements`,
  `--max-bytes-decoded-size`; Triton has no such flags): refused before anything is allocated.
"""

from __future__ import annotations

import struct
import threading
from array import array
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

_LENGTH = struct.Struct("<I")
_PREFIX = np.dtype("<u4")
# Elements per numpy step: bounds the temporaries and how long one step holds the GIL.
SLICE = 1 << 16
# Below this many bytes (or elements, to frame) plain Python is faster than setting numpy up.
SMALL = 1 << 12
# CPython's `bytes` object header: a decoded element of 2+ bytes costs this plus its bytes.
_BYTES_OBJECT = 33


# The defaults: 16 Mi elements (128 MiB of pointers), 1 GiB decoded.
DEFAULT_MAX_ELEMENTS = 1 << 24
DEFAULT_MAX_DECODED_SIZE = 1 << 30


@dataclass(frozen=True, slots=True)
class BytesLimits:
    """What one request's BYTES inputs may cost once decoded into Python objects.

    `max_elements`: BYTES elements over all the request's inputs. `max_decoded_size`: bytes the
    decoded object arrays take (8 a pointer, plus 33 + length per element of 2 bytes or more).
    """

    max_elements: int = DEFAULT_MAX_ELEMENTS
    max_decoded_size: int = DEFAULT_MAX_DECODED_SIZE


class OverLimit(ValueError):
    """A request over a `BytesLimits` cap; `str()` is the Triton-worded INVALID_ARG text."""


class Budget:
    """What is left of one request's `BytesLimits` while its inputs are checked in turn."""

    __slots__ = ("_limits", "_model", "_request_id", "elements", "decoded_size")

    def __init__(self, limits: BytesLimits, model: str, request_id: str) -> None:
        self._limits = limits
        self._model = model
        self._request_id = request_id
        self.elements = 0
        self.decoded_size = 0

    def _refuse(self, value: int, limit: int, noun: str, flag: str) -> OverLimit:
        return OverLimit(
            f"[request id: {self._request_id or '<id_unknown>'}] inference request for model "
            f"'{self._model}' has {value} {noun}, more than the {limit} this server accepts "
            f"({flag})"
        )

    def charge_elements(self, count: int) -> None:
        """Before a BYTES input is walked: its element count (from its shape)."""
        self.elements += count
        if self.elements > self._limits.max_elements:
            raise self._refuse(
                self.elements, self._limits.max_elements, "BYTES elements", "--max-bytes-elements"
            )

    def charge_decoded(self, size: int) -> None:
        """Before a BYTES input is decoded: what its object array will take (`Framing`)."""
        self.decoded_size += size
        if self.decoded_size > self._limits.max_decoded_size:
            raise self._refuse(
                self.decoded_size,
                self._limits.max_decoded_size,
                "bytes of BYTES inputs once decoded",
                "--max-bytes-decoded-size",
            )


class Framing(NamedTuple):  # a tuple: cheap to make on every request's path
    """What one walk over a serialized BYTES buffer found.

    `elements` counts one cut short too (Triton's order: a cut prefix is reported first,
    then a wrong count, then the cut element). `uniform` is the one length every element has,
    when they all do; otherwise `starts` (when asked for) holds each element's first byte and
    `lengths` its length.
    """

    elements: int
    decoded_size: int
    cut_prefix: int | None = None  # bytes left where a length prefix was cut
    cut_element: tuple[int, int] | None = None  # (length, bytes left) of an element cut short
    uniform: int | None = None
    starts: array | None = None  # machine integers ("q"), not an int object per element
    lengths: array | None = None


def _decoded_size(count: int, length: int) -> int:
    return count * (8 + (_BYTES_OBJECT + length if length > 1 else 0))


def _uniform(data: Any, size: int) -> Framing | None:
    """The framing when every element has the first one's length; None when they do not."""
    (length,) = _LENGTH.unpack_from(data, 0)
    stride = 4 + length
    if size % stride:
        return None
    count = size // stride
    prefixes = np.ndarray((count,), _PREFIX, buffer=data, strides=(stride,))
    for start in range(0, count, SLICE * 16):
        if not (prefixes[start : start + SLICE * 16] == length).all():
            return None
    return Framing(count, _decoded_size(count, length), uniform=length)


def scan(data: Any, keep_offsets: bool = False) -> Framing:
    """Walk the length prefixes of `data` (bytes-like) once.

    With `keep_offsets`, a buffer whose elements differ in length gets `starts` and `lengths`
    (12 bytes an element), which `decode` needs; the walk stops at the first framing fault.
    """
    size = len(data)
    if size >= SMALL:
        framing = _uniform(data, size)
        if framing is not None:
            return framing
    starts = array("q") if keep_offsets else None
    lengths = array("q") if keep_offsets else None
    unpack = _LENGTH.unpack_from
    offset = count = decoded = 0
    while offset < size:
        if size - offset < 4:
            return Framing(count, decoded, cut_prefix=size - offset)
        (length,) = unpack(data, offset)
        offset += 4
        count += 1
        if length > size - offset:
            return Framing(count, decoded, cut_element=(length, size - offset))
        decoded += 8 + (_BYTES_OBJECT + length if length > 1 else 0)
        if starts is not None and lengths is not None:
            starts.append(offset)
            lengths.append(length)
        offset += length
    if starts is None or lengths is None:
        return Framing(count, decoded)
    return Framing(count, decoded, None, None, None, starts, lengths)


def framing_problem(
    framing: Framing, expected: int, model: str, request_id: str, name: str
) -> str | None:
    """Triton's INVALID_ARG text for a buffer that does not hold `expected` elements, in
    Triton's order [V] (a cut length prefix; the count; a cut element); None when it does."""
    prefix = f"[request id: {request_id or '<id_unknown>'}] "
    if framing.cut_prefix is not None:
        return (
            f"{prefix}incomplete string length indicator for inference input '{name}' for "
            f"model '{model}', expecting 4 bytes but only {framing.cut_prefix} bytes available. "
            "Please make sure the string length indicator is in one buffer."
        )
    if framing.elements < expected:
        return (
            f"{prefix}expected {expected} string elements for inference input '{name}' for "
            f"model '{model}', got {framing.elements}"
        )
    if framing.elements > expected:
        return (
            f"{prefix}unexpected number of string elements {framing.elements} for inference input "
            f"'{name}' for model '{model}', expecting {expected}"
        )
    if framing.cut_element is not None:
        length, available = framing.cut_element
        return (
            f"incomplete string data for inference input '{name}', expecting string of length "
            f"{length} but only {available} bytes available"
        )
    return None


def decode_small(data: bytes, count: int) -> tuple[np.ndarray, int] | None:
    """`data` of fewer than SMALL bytes holding exactly `count` elements → (the object array,
    its decoded size), in one Python pass (cheaper than `scan` + `decode` at this size); None
    when the framing is faulty (`scan` then says how)."""
    out = np.empty(count, dtype=np.object_)
    unpack = _LENGTH.unpack_from
    size = len(data)
    offset = found = decoded = 0
    try:
        while offset < size:
            (length,) = unpack(data, offset)
            offset += 4
            if length > size - offset:
                return None
            out[found] = data[offset : offset + length]
            found += 1
            offset += length
            decoded += 8 + (_BYTES_OBJECT + length if length > 1 else 0)
    except (struct.error, IndexError):  # a cut prefix; more elements than `count`
        return None
    return (out, decoded) if found == count else None


def decode(data: Any, framing: Framing) -> np.ndarray:
    """The object array of `bytes` that `data` (well framed, as `scan` found) holds, 1-D.

    One array, filled a slice at a time; each element is a new `bytes` (Triton's stub gives the
    model its own objects too), so `data` may be dropped afterwards.
    """
    count = framing.elements
    out = np.empty(count, dtype=np.object_)
    length = framing.uniform
    if length is not None:
        if length == 0:
            out.fill(b"")
            return out
        stride = 4 + length
        # A void item of `length` bytes reads back as `bytes`, trailing NULs kept.
        items = np.ndarray((count,), f"V{length}", buffer=data, offset=4, strides=(stride,))
        for start in range(0, count, SLICE):
            out[start : start + SLICE] = items[start : start + SLICE].tolist()
        return out
    assert framing.starts is not None and framing.lengths is not None, "scan(keep_offsets=True)"
    # Slices of `bytes` share CPython's 0- and 1-byte objects; a memoryview's would not.
    raw = data if isinstance(data, bytes) else bytes(data)
    if count <= SLICE:
        out[:] = [raw[s : s + n] for s, n in zip(framing.starts, framing.lengths, strict=True)]
        return out
    for first in range(0, count, SLICE):
        starts = framing.starts[first : first + SLICE]
        lengths = framing.lengths[first : first + SLICE]
        out[first : first + SLICE] = [raw[s : s + n] for s, n in zip(starts, lengths, strict=True)]
    return out


class Serialized:
    """A BYTES input whose framing was checked (`scan`), decoded when first asked for: a
    `pb_utils.Tensor` source (`Tensor._from_source`). The buffer is let go once decoded.

    It keeps no offsets (12 bytes an element) while it waits: the decode walks the buffer again.
    """

    __slots__ = ("_data", "_array", "_lock")

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data
        self._array: np.ndarray | None = None
        self._lock = threading.Lock()  # two tensors over it, read on two threads: one decode

    def array(self) -> np.ndarray:
        with self._lock:
            if self._array is None:
                data = self._data
                assert data is not None
                self._array = decode(data, scan(data, keep_offsets=True))
                self._data = None
            return self._array


def encode(items: np.ndarray) -> bytearray:
    """An object array of `bytes` (any shape, C order) → the serialized form: one buffer of
    exactly the framed size (4 bytes + its length per element), written in place.

    The lengths come first (4 bytes an element, and they are the prefixes themselves), so the
    buffer is made once at its size; then a slice at a time numpy writes the prefixes and the
    slice's data into it. No `bytes` per prefix, and no per-slice chunks joined at the end
    (issue 38: that join held every answer twice at once). A `bytearray`, the one buffer Python
    lets us fill: the wires send it as it is; what crosses Dynamo's request plane (whose
    msgpack takes `bytes` only) is converted there (codec.encode_raw_tensor).
    """
    flat = items.reshape(-1)
    count = flat.size
    if count <= SMALL // 16:
        pack = _LENGTH.pack
        parts = [part for item in flat.tolist() for part in (pack(len(item)), item)]
        return bytearray().join(parts)
    lengths = np.empty(count, dtype=_PREFIX)
    for first in range(0, count, SLICE):
        part = flat[first : first + SLICE].tolist()
        lengths[first : first + len(part)] = np.fromiter(map(len, part), np.int64, len(part))
    buffer = bytearray(4 * count + int(lengths.sum(dtype=np.int64)))
    view = memoryview(buffer)
    out = np.frombuffer(buffer, dtype=np.uint8)
    length = int(lengths[0])
    uniform = bool((lengths == length).all())
    if uniform:  # one length: rows of prefix + data, the prefixes written in one step
        rows = out.reshape(count, 4 + length)
        rows[:, :4] = np.frombuffer(_LENGTH.pack(length), dtype=np.uint8)
    position = 0
    for first in range(0, count, SLICE):
        part = flat[first : first + SLICE].tolist()
        size = lengths[first : first + len(part)]
        data_size = int(size.sum(dtype=np.int64))
        end = position + 4 * len(part) + data_size
        if data_size > _JOIN_BYTES:  # large elements: copied one by one, no joined slice
            _copy_each(view, position, part)
        elif uniform:
            data = np.frombuffer(b"".join(part), dtype=np.uint8)
            rows[first : first + len(part), 4:] = data.reshape(len(part), length)
        else:
            _interleave(out[position:end], size, b"".join(part))
        del part
        position = end
    return buffer


# A slice whose data is larger than this is copied element by element rather than joined first:
# bounds the temporary (the per-element cost is small beside copying elements this large).
_JOIN_BYTES = 1 << 23


def _copy_each(view: memoryview, position: int, part: list[bytes]) -> None:
    pack_into = _LENGTH.pack_into
    for item in part:
        pack_into(view, position, len(item))
        position += 4
        view[position : position + len(item)] = item
        position += len(item)


def _interleave(out: np.ndarray, lengths: np.ndarray, data: bytes) -> None:
    """`out` (uint8, exactly the slice's framed size) ← the prefixes `lengths` (u4, little
    endian) each before its element's bytes, taken in turn from `data`."""
    # Where each element's prefix begins in `out`.
    heads = np.cumsum(lengths, dtype=np.int64) - lengths + 4 * np.arange(len(lengths))
    prefix_bytes = lengths.view(np.uint8).reshape(-1, 4)
    is_prefix = np.zeros(out.size, dtype=np.bool_)
    for k in range(4):
        out[heads + k] = prefix_bytes[:, k]
        is_prefix[heads + k] = True
    out[~is_prefix] = np.frombuffer(data, dtype=np.uint8)
