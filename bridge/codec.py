"""Dynamo tensor dicts ⇄ `pb_utils.Tensor`, with the fastest conversion per datatype.

Two forms (docs/worker_protocol.md §2, "the bridge tensor form"):

- The standard form. The KServe frontend of ai-dynamo-runtime 1.6 hands a worker every tensor
  as Python lists: numbers as `list[int|float|bool]`, BYTES as one `list[int]` per element, and
  FP16/BF16 as their u16 bit patterns. It accepts the same back, with BYTES also as `bytes`
  objects (much cheaper). numpy arrays and numpy scalars cannot be yielded, hence `tolist()` on
  the way out.
- Raw contents. Any tensor's `data.values` may be one `bytes` object instead, from any caller:
  the tensor's contents in C order, little endian, exactly as KServe's `raw_input_contents`
  (BYTES: each element a 4-byte little-endian length, then its bytes). numpy reads them with no
  per-element work, and Dynamo's request plane carries `bytes` as msgpack bin. A request with
  `"bridge_form": 1` gets its answers in that form too (`encode_bridge_response`): raw outputs,
  `final`, `model_version`, and errors as items (`bridge_error`) rather than exceptions.
- Lent buffers, in-process only (the door's LocalRoute, issue 27): an input's `data.values`
  may be a writable `memoryview` the caller lends for the request (a client's shared memory,
  mapped copy-on-write): a numeric input then reaches the model as a numpy view of it, no copy;
  or a `DeviceArray` (a client's CUDA shared memory, copied on its GPU for a model that takes
  GPU inputs): the input then reaches the model as a GPU tensor, never through the host.
  A requested output may carry an `OutputSink` as `sink` (`output_sinks`): the model's
  output (host or GPU memory) is written with it straight into the client's memory when the
  model sends it, and its `data` says `"written": true` (with empty `values`). Neither crosses
  a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import operator
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from model_repository_loader.gpu.device_array import DeviceArray
from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse, Tensor, TritonError
from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY
from model_repository_loader.validation import RequestError

from . import serialized_bytes
from .cluster.protocol import error_item, read_error
from .serialized_bytes import Budget, BytesLimits, OverLimit

# Dynamo's datatype names ⇄ KServe's.
TO_KSERVE = {
    "Bool": "BOOL",
    "Uint8": "UINT8",
    "Uint16": "UINT16",
    "Uint32": "UINT32",
    "Uint64": "UINT64",
    "Int8": "INT8",
    "Int16": "INT16",
    "Int32": "INT32",
    "Int64": "INT64",
    "Float16": "FP16",
    "BFloat16": "BF16",
    "Float32": "FP32",
    "Float64": "FP64",
    "Bytes": "BYTES",
}
TO_DYNAMO = {kserve: dynamo for dynamo, kserve in TO_KSERVE.items()}

# The numeric datatypes whose values Dynamo's lists carry as numbers (FP16/BF16 come as bits).
_NUMERIC = {
    name: dtype
    for name, dtype in DATATYPE_TO_NUMPY.items()
    if name not in ("FP16", "BF16", "BYTES")
}


def _decode_numeric(dtype: np.dtype) -> Callable[[list], np.ndarray]:
    # fromiter with a known count is the fastest list → array path (spec dynamo_runtime §6).
    return lambda values: np.fromiter(values, dtype, count=len(values))


def _decode_bytes(values: list[list[int]]) -> np.ndarray:
    out = np.empty(len(values), dtype=np.object_)
    out[:] = [bytes(bytearray(v)) for v in values]
    return out


_DECODERS: dict[str, Callable[[list], np.ndarray]] = {
    **{name: _decode_numeric(dtype) for name, dtype in _NUMERIC.items()},
    "BOOL": lambda values: np.array(values, dtype=np.bool_),
    "FP16": lambda values: np.array(values, dtype=np.uint16).view(np.float16),
    "BF16": lambda values: np.array(values, dtype=np.uint16),  # bits; pb_utils keeps BF16 raw
    "BYTES": _decode_bytes,
}


# Raw contents: little-endian numpy types per KServe datatype (BOOL as one byte per element).
_RAW_TYPES: dict[str, np.dtype] = {
    **{name: np.dtype(dtype).newbyteorder("<") for name, dtype in _NUMERIC.items()},
    "BOOL": np.dtype(np.uint8),
    "FP16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}
_STORED_TYPES = {name: DATATYPE_TO_NUMPY[name] for name in (*_NUMERIC, "FP16", "BF16")}


class RawContentsError(ValueError):
    """Raw contents that do not fit their tensor; `str()` is Triton's text."""


def _request_prefix(request_id: str) -> str:
    return f"[request id: {request_id or '<id_unknown>'}] "


def _decode_raw(
    name: str,
    datatype: str,
    shape: list[int],
    raw: bytes | memoryview,
    model: str,
    request_id: str,
    budget: Budget | None,
) -> np.ndarray | serialized_bytes.Serialized:
    """`raw` (KServe's raw contents) as the stored array of `datatype`, writable, in `shape`;
    BYTES of SMALL bytes or more as a `Serialized`, checked now and decoded when the model
    reads them (serialized_bytes.py).

    Numeric data is copied once (a memcpy): Triton hands models writable inputs, and `bytes`
    are read-only. A lent buffer (a writable memoryview, module doc) is used as it is.
    Raises RawContentsError with Triton's text (naming `model` and `request_id`) when the
    size does not fit, OverLimit when BYTES would cost more than `budget` allows
    (checked before the object array is made).
    """
    count = math.prod(shape)
    if datatype == "BYTES":
        if isinstance(raw, memoryview):  # decoded into new objects either way
            raw = raw.tobytes()
        if budget is not None:
            budget.charge_elements(count)
        if len(raw) < serialized_bytes.SMALL:
            small = serialized_bytes.decode_small(bytes(raw), count)
            if small is not None:
                if budget is not None:
                    budget.charge_decoded(small[1])
                return small[0].reshape(shape)
        framing = serialized_bytes.scan(raw)
        problem = serialized_bytes.framing_problem(framing, count, model, request_id, name)
        if problem is not None:
            raise RawContentsError(problem)
        if budget is not None:
            budget.charge_decoded(framing.decoded_size)
        return serialized_bytes.Serialized(raw)
    raw_type = _RAW_TYPES[datatype]
    expected = count * raw_type.itemsize
    if len(raw) != expected:
        raise RawContentsError(
            f"{_request_prefix(request_id)}input byte size mismatch for input '{name}' for "
            f"model '{model}'. Expected {expected}, got {len(raw)}"
        )
    array = np.frombuffer(raw, raw_type)
    if array.flags.writeable and raw_type == _STORED_TYPES[datatype] and datatype != "BOOL":
        # a lent buffer (client shared memory in-process, frontends/triton/shm.py) or a writable
        # view of a copy-on-write mapped region (bridge/transport/shm_exchange.py), itself: zero
        # copies
        return array.reshape(shape)
    # A copy either way: writable, native byte order; BOOL bytes other than 0/1 are True.
    array = array != 0 if datatype == "BOOL" else array.astype(_STORED_TYPES[datatype])
    return array.reshape(shape)


def decode_tensor(
    tensor: dict[str, Any], model: str = "", request_id: str = "", budget: Budget | None = None
) -> Tensor:
    """A tensor dict (values as lists, or raw `bytes`) → `Tensor`.

    Raises RawContentsError for raw contents that do not fit (Triton's texts name `model` and
    `request_id`), OverLimit for BYTES over `budget`, KeyError / TypeError / ValueError for a
    malformed dict.
    """
    metadata = tensor["metadata"]
    datatype = TO_KSERVE[metadata["data_type"]]
    values = tensor["data"]["values"]
    shape = metadata["shape"]
    if isinstance(values, DeviceArray):
        return _decode_device(metadata["name"], datatype, shape, values, model, request_id)
    if isinstance(values, bytes | memoryview):
        return decode_raw_tensor(
            metadata["name"], datatype, shape, values, model, request_id, budget
        )
    if datatype == "BYTES" and budget is not None:
        _charge_bytes_list(budget, values)
    array = _DECODERS[datatype](values)
    if len(shape) != 1 or shape[0] != array.shape[0]:  # 1-D needs no reshape (the usual case)
        array = array.reshape(shape)
    return Tensor._from_wire(metadata["name"], array, datatype)


def decode_raw_tensor(
    name: str,
    datatype: str,
    shape: list[int],
    raw: bytes | memoryview,
    model: str = "",
    request_id: str = "",
    budget: Budget | None = None,
) -> Tensor:
    """An input's raw contents (KServe's, `datatype` its KServe name) as the `Tensor` a model
    reads: numeric data copied once, BYTES checked now and decoded when read (`_decode_raw`)."""
    array = _decode_raw(name, datatype, shape, raw, model, request_id, budget)
    if isinstance(array, serialized_bytes.Serialized):
        return Tensor._from_source(name, array, _dims(shape), datatype)
    return Tensor._from_wire(name, array, datatype)


def _decode_device(
    name: str, datatype: str, shape: list[int], raw: DeviceArray, model: str, request_id: str
) -> Tensor:
    """A GPU tensor over raw contents a caller in this process lent on a GPU (a client's CUDA
    shared memory, copied on the device for the request: frontends/triton/shm.py), read in
    place as the datatype's stored form."""
    if datatype == "BYTES":
        raise TypeError("BYTES contents are never lent on a GPU")
    dtype = np.dtype(_STORED_TYPES[datatype])
    expected = math.prod(shape) * dtype.itemsize
    if raw.nbytes != expected:
        raise RawContentsError(
            f"{_request_prefix(request_id)}input byte size mismatch for input '{name}' for "
            f"model '{model}'. Expected {expected}, got {raw.nbytes}"
        )
    return Tensor._from_device(name, raw.viewed_as(dtype, _dims(shape)), datatype)


def _dims(shape: list[int]) -> tuple[int, ...]:
    """A shape numpy's reshape would take (a reshape checks it when the array is made)."""
    dims = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    return dims


def _charge_bytes_list(budget: Budget, values: list) -> None:
    """BYTES in the standard form (one list of ints per element): what they will decode to."""
    budget.charge_elements(len(values))
    budget.charge_decoded(8 * len(values) + sum(map(len, values)) + 33 * len(values))


def decode_request(
    request: dict[str, Any], model_name: str = "", limits: BytesLimits | None = None
) -> InferRequest:
    """A Dynamo tensor request → the loader's `InferRequest`.

    Raises RequestError (INVALID_ARG) for a request the frontend let through but no model can
    take: a reserved parameter of the wrong type, a tensor that does not decode (raw contents
    that do not fit their shape get Triton's texts, naming `model_name`), or BYTES inputs over
    `limits` (refused before they are decoded).
    """
    parameters = request.get("parameters")
    outputs = request.get("outputs")
    request_id = request.get("id", "") or ""
    budget = Budget(limits, model_name, request_id) if limits is not None else None
    with refused_as_malformed():
        inputs = [
            decode_tensor(t, model_name, request_id, budget) for t in request.get("tensors", ())
        ]
    return InferRequest(
        inputs=inputs,
        requested_outputs=[o["name"] for o in outputs] if outputs else [],
        request_id=request_id,
        parameters=decode_parameters(parameters) if parameters else {},
    )


def malformed(exc: Exception) -> RequestError:
    """What decoding an input raised, as the RequestError (INVALID_ARG) a model's request is
    refused with: Triton's own text for raw contents that do not fit and for BYTES over the
    limits, else the decoder's complaint, named."""
    if isinstance(exc, RawContentsError | OverLimit):
        return RequestError(str(exc))
    return RequestError(f"malformed inference input: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def refused_as_malformed() -> Iterator[None]:
    """Decoding inputs in this block: what it raises for a bad tensor (`malformed`) is a
    RequestError, the refusal every path to a model gives (decode_request, and the gRPC door's
    conversion straight into the loader's request)."""
    try:
        yield
    except (KeyError, TypeError, ValueError, OverflowError, OverLimit) as exc:
        raise malformed(exc) from None


# A request with more elements than this is decoded in slices of DECODE_SLICE elements, giving
# the event loop back after each (about 1 ms of work at FP32, where 1M FP32 in one go blocked it
# for 14-25 ms); smaller ones in one go, which costs them nothing extra.
LARGE_REQUEST_ELEMENTS = 1 << 16
DECODE_SLICE = 1 << 15


# Raw BYTES contents larger than this are decoded off the event loop (worker.py): walking and
# decoding them is per-element work (one numpy step per element group at best).
OFF_LOOP_BYTES = 1 << 18


def tensor_bytes(item: dict[str, Any]) -> int:
    """The bytes of a bridge-form item's tensors (a response's outputs, from a worker): what
    rendering or placing them costs grows with."""
    return sum(len(tensor["data"]["values"]) for tensor in item.get("tensors", ()))


def raw_bytes_size(request: dict[str, Any]) -> int:
    """Bytes of raw BYTES contents over every tensor: a cheap size, no element is touched."""
    total = 0
    for tensor in request.get("tensors", ()):
        try:
            values = tensor["data"]["values"]
            bytes_type = tensor["metadata"]["data_type"] == "Bytes"
        except (KeyError, TypeError):
            continue  # malformed: decode_request says why
        if bytes_type and isinstance(values, bytes | memoryview):
            total += len(values)
    return total


def request_elements(request: dict[str, Any]) -> int:
    """List elements over every tensor: a cheap size, no element is touched.

    Raw contents (`bytes`) count nothing: numpy reads them in one go, with no per-element work.
    """
    total = 0
    for tensor in request.get("tensors", ()):
        try:
            values = tensor["data"]["values"]
        except (KeyError, TypeError):
            continue  # malformed: decode_request says why
        if isinstance(values, list):
            total += len(values)
    return total


def release_raw_inputs(request: dict[str, Any]) -> None:
    """Drop a decoded request's raw input contents (`bytes`) from its dict. A decoded BYTES
    tensor holds objects of its own, a numeric one a copy or a view (which keeps what it views
    alive by itself): the dict's reference is then only what keeps a second copy of every input
    alive until the answer, for a caller that still holds the dict (the in-process door)."""
    for tensor in request.get("tensors") or ():
        data = tensor.get("data") if isinstance(tensor, dict) else None
        if isinstance(data, dict) and isinstance(data.get("values"), bytes | bytearray):
            data["values"] = b""


async def decode_request_in_slices(
    request: dict[str, Any], model_name: str = "", limits: BytesLimits | None = None
) -> InferRequest:
    """decode_request for a large request: big list tensors are converted a slice at a time,
    with the event loop free between slices, then assembled into one array.

    Raises RequestError as decode_request does.
    """
    tensors: list[dict[str, Any] | Tensor] = []
    request_id = request.get("id", "") or ""
    budget = Budget(limits, model_name, request_id) if limits is not None else None
    try:
        for tensor in request.get("tensors", ()):
            values = tensor["data"]["values"]
            if not isinstance(values, list) or len(values) <= DECODE_SLICE:
                tensors.append(tensor)
                continue
            metadata = tensor["metadata"]
            datatype = TO_KSERVE[metadata["data_type"]]
            if datatype == "BYTES" and budget is not None:
                _charge_bytes_list(budget, values)
            decode = _DECODERS[datatype]
            first = decode(values[:DECODE_SLICE])
            # Filled slice by slice: no concatenation at the end, which would block as one piece.
            array = np.empty(len(values), first.dtype)
            array[: len(first)] = first
            for start in range(DECODE_SLICE, len(values), DECODE_SLICE):
                await asyncio.sleep(0)
                array[start : start + DECODE_SLICE] = decode(values[start : start + DECODE_SLICE])
            shape = metadata["shape"]
            if len(shape) != 1 or shape[0] != array.shape[0]:
                array = array.reshape(shape)
            tensors.append(Tensor._from_wire(metadata["name"], array, datatype))
            await asyncio.sleep(0)
    except (KeyError, TypeError, ValueError, OverflowError, OverLimit) as exc:
        raise malformed(exc) from None
    # What the slices charged is not charged again: only the smaller tensors are left.
    rest = None
    if limits is not None and budget is not None:
        rest = BytesLimits(
            limits.max_elements - budget.elements, limits.max_decoded_size - budget.decoded_size
        )
    decoded = decode_request(
        {**request, "tensors": [t for t in tensors if isinstance(t, dict)]}, model_name, rest
    )
    # Keep the request's input order: decoded dict tensors fill the gaps left by big ones.
    small = iter(decoded.inputs)
    decoded.inputs = [t if isinstance(t, Tensor) else next(small) for t in tensors]
    return decoded


# Triton's reserved request parameters: the kinds its gRPC front end accepts for each, and the
# end of its refusal text ("invalid value type for 'sequence_end' parameter, expected
# bool_param." [S]). The frontend passes them through unchecked (spec dynamo_runtime §1), and the
# loader converts them (int(timeout), the correlation id), so a wrong kind must stop here.
_RESERVED_KINDS: dict[str, tuple[frozenset[str], str]] = {
    "sequence_id": (frozenset({"int64", "uint64", "string"}), "int64_param or string_param"),
    "sequence_start": (frozenset({"bool"}), "bool_param"),
    "sequence_end": (frozenset({"bool"}), "bool_param"),
    "priority": (frozenset({"int64", "uint64"}), "uint64_param"),
    "timeout": (frozenset({"int64"}), "int64_param"),
}


def decode_parameters(parameters: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`{name: {'int64': 3}}` → `{name: 3}` (each value carries one typed field)."""
    out = {}
    for name, value in parameters.items():
        kind, item = next(iter(value.items()))
        reserved = _RESERVED_KINDS.get(name)
        if reserved is not None and kind not in reserved[0]:
            raise RequestError(
                f"invalid value type for '{name}' parameter, expected {reserved[1]}."
            )
        out[name] = item
    return out


def encode_parameters(parameters: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in parameters.items():
        if isinstance(value, bool):
            out[name] = {"bool": value}
        elif isinstance(value, int):
            out[name] = {"int64": value}
        elif isinstance(value, float):
            out[name] = {"double": value}
        else:
            out[name] = {"string": str(value)}
    return out


def encode_tensor(tensor: Tensor) -> dict[str, Any]:
    # Reads the tensor's fields directly: this runs for every output of every response.
    datatype = tensor._datatype
    # BYTES: `_wire_array` gives `bytes` elements (a model may return str, int, an `S` array),
    # which Dynamo takes as they are; for other types it is the stored array itself.
    array = tensor._wire_array() if datatype == "BYTES" else tensor._array
    dynamo_type = TO_DYNAMO[datatype]
    flat = array.ravel()
    values = flat.view(np.uint16).tolist() if datatype == "FP16" else flat.tolist()
    return {
        "metadata": {"name": tensor._name, "data_type": dynamo_type, "shape": list(array.shape)},
        "data": {"data_type": dynamo_type, "values": values},
    }


def encode_response(
    model_name: str, response: InferenceResponse | None, final: bool | None = None
) -> dict[str, Any]:
    """A successful `InferenceResponse` → a Dynamo tensor response dict.

    `final` (when given) becomes the `triton_final_response` parameter Triton puts on every
    streamed response: true only on the response sent together with FINAL.
    """
    if response is None:
        out: dict[str, Any] = {"model": model_name, "tensors": []}
        text = ""
    else:
        out = {"model": model_name, "tensors": [encode_tensor(t) for t in response._output_tensors]}
        text = response._parameters
    parameters = encode_parameters(json.loads(text)) if text and text != "{}" else {}
    if final is not None:
        parameters[FINAL_RESPONSE_PARAMETER] = {"bool": final}
    if parameters:
        out["parameters"] = parameters
    return out


FINAL_RESPONSE_PARAMETER = "triton_final_response"
_EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"


def wants_empty_final_response(request: dict[str, Any]) -> bool:
    """Did the client ask for an empty response marking a flag-only FINAL?

    tritonclient's `enable_empty_final_response=True` sends the request parameter
    `triton_enable_empty_final_response`; without it Triton transmits no flag-only FINAL.
    """
    value = (request.get("parameters") or {}).get(_EMPTY_FINAL_PARAMETER)
    return bool(value and value.get("bool"))


def empty_final_response(model_name: str) -> dict[str, Any]:
    """The response Triton sends for a flag-only FINAL when the client asked for it."""
    return {
        "model": model_name,
        "tensors": [],
        "parameters": {FINAL_RESPONSE_PARAMETER: {"bool": True}},
    }


# -- the bridge form ----------------------------------------------------------------------------

BRIDGE_FORM = "bridge_form"


# A caller's probe of a worker it stopped sending to (bridge/cluster/instances.py): answered at
# once with PONG, the model untouched, over the same request plane connections as requests.
PING: dict[str, Any] = {"bridge_ping": 1}
PONG: dict[str, Any] = {"final": True, "pong": 1}


def is_ping(request: dict[str, Any]) -> bool:
    return request.get("bridge_ping") == 1


def wants_bridge_form(request: dict[str, Any]) -> bool:
    """Did the caller (the bridge's own door, a BLS call from another worker) ask for answers in
    the bridge form (`"bridge_form": 1`)?"""
    return request.get(BRIDGE_FORM) == 1


def raw_contents(tensor: Tensor) -> bytes | bytearray:
    """A tensor's contents as KServe's raw contents: C order, little endian, BYTES with 4-byte
    length prefixes (framed into one `bytearray` with numpy, serialized_bytes.py), FP16/BF16 as
    their 2-byte patterns. One copy, no per-element Python work."""
    if tensor._datatype == "BYTES":
        return serialized_bytes.encode(tensor._wire_array())
    return _little_endian(tensor).tobytes()  # C order whatever the array's layout


def raw_array(tensor: Tensor) -> np.ndarray:
    """A non-BYTES tensor's array laid out as its raw contents (C order, little endian): the
    stored array itself when it already is."""
    return np.ascontiguousarray(_little_endian(tensor))


def raw_view(tensor: Tensor) -> memoryview:
    """A non-BYTES tensor's raw contents as a view of bytes over `raw_array` (its `len` is
    their size): no copy when the stored array is already laid out so."""
    array = raw_array(tensor)
    return array.data.cast("B") if array.size else memoryview(b"")


def _little_endian(tensor: Tensor) -> np.ndarray:
    array = tensor._array
    raw_type = _RAW_TYPES[tensor._datatype]
    if array.dtype != raw_type and tensor._datatype != "BOOL":
        array = array.astype(raw_type)  # only on a big-endian host
    return array


class OutputSink(Protocol):
    """Where an in-process caller has an output written (module doc)."""

    def write(self, data: memoryview | DeviceArray) -> bool:
        """Writes `data` (C order, host or GPU memory); False, writing nothing, where it
        cannot take it."""
        ...


def encode_raw_tensor(
    tensor: Tensor, sink: OutputSink | None = None, local: bool = False
) -> dict[str, Any]:
    """A tensor in the bridge form; written with `sink` (module doc) when it is numeric and
    the sink takes it, else as `bytes`. `local`: the dict stays in this process (a unary answer
    to the in-process door), so BYTES stay in the `bytearray` they were framed into; anything
    else may cross the request plane, whose msgpack takes `bytes` only (one copy)."""
    dynamo_type = TO_DYNAMO[tensor._datatype]
    data: dict[str, Any] = {"data_type": dynamo_type}
    if sink is not None and _written(tensor, sink):
        data["values"] = b""
        data["written"] = True
    else:
        values = raw_contents(tensor)
        data["values"] = values if local or isinstance(values, bytes) else bytes(values)
    return {
        "metadata": {
            "name": tensor._name,
            "data_type": dynamo_type,
            "shape": list(tensor._dims()),
        },
        "data": data,
    }


def _written(tensor: Tensor, sink: OutputSink) -> bool:
    """The tensor's raw contents written with `sink` when the model sends it (as Triton's stub
    copies an output when it is sent): straight from the model's array when its memory is
    already in that form, else from one copy. False for BYTES, or where the sink cannot take
    it (too large, the region gone: the door then says Triton's error)."""
    datatype = tensor._datatype
    if datatype == "BYTES":
        return False
    if tensor._device is not None:  # from the GPU, with no host copy on the way
        return sink.write(tensor._device)
    array = tensor._array
    if array.dtype == _RAW_TYPES[datatype] and array.flags.c_contiguous:
        return sink.write(array.reshape(-1).data)  # a view: C-contiguous
    return sink.write(memoryview(raw_contents(tensor)))


def output_sinks(request: dict[str, Any]) -> dict[str, OutputSink] | None:
    """The sinks an in-process caller gave for the request's outputs, by name (module doc)."""
    sinks = {
        output["name"]: output["sink"]
        for output in request.get("outputs") or ()
        if isinstance(output, dict) and output.get("sink") is not None
    }
    return sinks or None


def encode_bridge_response(
    model_name: str,
    model_version: str,
    response: InferenceResponse | None,
    final: bool,
    place: Callable[[list[Tensor]], tuple[list[dict[str, Any]], dict | None]] | None = None,
    sinks: dict[str, OutputSink] | None = None,
    local: bool = False,
) -> dict[str, Any]:
    """A successful response (None: a flag-only FINAL) in the bridge form.

    Every output's values are raw `bytes`, or written with its sink (`sinks`, module doc);
    `final` is true on the response sent with FINAL; a flag-only FINAL is
    `{"final": true, "tensors": [], "empty": true}` (the caller decides whether its client
    wants it). `model_version` is the version that answered. `place` (a request in the shared
    memory form, bridge/transport/shm_exchange.py) gives the tensors' dicts and the answer's
    `shm` entry instead. `local`: the answer stays in this process (`encode_raw_tensor`).
    """
    if response is None:
        return {
            "model": model_name,
            "model_version": model_version,
            "tensors": [],
            "final": final,
            "empty": True,
        }
    out: dict[str, Any] = {"model": model_name, "model_version": model_version}
    if place is None:
        out["tensors"] = [
            encode_raw_tensor(t, sinks.get(t._name) if sinks else None, local)
            for t in response._output_tensors
        ]
    else:
        out["tensors"], shm = place(response._output_tensors)
        if shm is not None:
            out["shm"] = shm
    out["final"] = final
    text = response._parameters
    if text and text != "{}":
        out["parameters"] = encode_parameters(json.loads(text))
    return out


def bridge_error(error: TritonError, final: bool, rejected: bool = False) -> dict[str, Any]:
    """An error as a bridge-form response item: `{"error": {"code", "message"}, "final"}`.

    The stream goes on when `final` is false (a decoupled model may send an error response and
    continue, as in Triton). `rejected` (sent only when true) says the request never reached the
    model: the request checks (or an unknown version, a closing model) refused it. Triton's BLS
    prefixes exactly those errors with the model's name.
    """
    item: dict[str, Any] = {
        "error": error_item(error.code(), error.message()),
        "final": final,
    }
    if rejected:
        item["rejected"] = True
    return item


def encode_bridge_request(request: InferRequest) -> dict[str, Any]:
    """The loader's request → a model endpoint request in the bridge form (raw inputs)."""
    out: dict[str, Any] = {
        BRIDGE_FORM: 1,
        "tensors": [encode_raw_tensor(t) for t in request.inputs],
    }
    if request.request_id:
        out["id"] = request.request_id
    if request.parameters:
        out["parameters"] = encode_parameters(request.parameters)
    if request.requested_outputs:
        out["outputs"] = [{"name": name} for name in request.requested_outputs]
    if request.model_version != -1:
        out["model_version"] = str(request.model_version)
    return out


def decode_bridge_item(
    item: dict[str, Any],
) -> tuple[InferenceResponse | None, bool, bool]:
    """A bridge-form response item → (response or None for a flag-only FINAL, final, rejected).

    An error item becomes an error response carrying its code; raises KeyError / TypeError /
    ValueError / RawContentsError for an item that is not in the bridge form.
    """
    final = bool(item.get("final", False))
    error = item.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise TypeError(f"an error item that is not a dict: {error!r}")
        code, message = read_error(error)
        response = InferenceResponse._create([], TritonError(message, code))
        return response, final, bool(item.get("rejected"))
    if item.get("empty"):
        return None, final, False
    tensors = [decode_tensor(t) for t in item.get("tensors", ())]
    parameters = item.get("parameters")
    text = json.dumps(decode_parameters(parameters)) if parameters else "{}"
    return InferenceResponse._create(tensors, None, text), final, False
