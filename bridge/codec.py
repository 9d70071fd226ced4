"""Dynamo tensor dicts ⇄ `pb_utils.Tensor`, with the fastest conversion per datatype.

The KServe frontend of ai-dynamo-runtime 1.6 hands a worker every tensor as Python lists:
numbers as `list[int|float|bool]`, BYTES as one `list[int]` per element, and FP16/BF16 as their
u16 bit patterns. It accepts the same back, with BYTES also as `bytes` objects (much cheaper).
numpy arrays and numpy scalars cannot be yielded, hence `tolist()` on the way out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse, Tensor
from model_repository_loader.validation import RequestError

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

_NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP32": np.float32,
    "FP64": np.float64,
}


def _decode_numeric(dtype: type) -> Callable[[list], np.ndarray]:
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


def decode_tensor(tensor: dict[str, Any]) -> Tensor:
    metadata = tensor["metadata"]
    datatype = TO_KSERVE[metadata["data_type"]]
    array = _DECODERS[datatype](tensor["data"]["values"])
    shape = metadata["shape"]
    if len(shape) != 1 or shape[0] != array.shape[0]:  # 1-D needs no reshape (the usual case)
        array = array.reshape(shape)
    return Tensor._from_wire(metadata["name"], array, datatype)


def decode_request(request: dict[str, Any]) -> InferRequest:
    """A Dynamo tensor request → the loader's `InferRequest`.

    Raises RequestError (INVALID_ARG) for a request the frontend let through but no model can
    take: a reserved parameter of the wrong type, or a tensor that does not decode.
    """
    parameters = request.get("parameters")
    outputs = request.get("outputs")
    try:
        inputs = [decode_tensor(t) for t in request.get("tensors", ())]
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise RequestError(f"malformed inference input: {type(exc).__name__}: {exc}") from None
    return InferRequest(
        inputs=inputs,
        requested_outputs=[o["name"] for o in outputs] if outputs else [],
        request_id=request.get("id", "") or "",
        parameters=decode_parameters(parameters) if parameters else {},
    )


# A request with more elements than this is decoded in slices of DECODE_SLICE elements, giving
# the event loop back after each (about 1 ms of work at FP32, where 1M FP32 in one go blocked it
# for 14-25 ms); smaller ones in one go, which costs them nothing extra.
LARGE_REQUEST_ELEMENTS = 1 << 16
DECODE_SLICE = 1 << 15


def request_elements(request: dict[str, Any]) -> int:
    """Elements (or raw bytes) over every tensor: a cheap size, no element is touched."""
    total = 0
    for tensor in request.get("tensors", ()):
        try:
            total += len(tensor["data"]["values"])
        except (KeyError, TypeError):
            pass  # malformed: decode_request says why
    return total


async def decode_request_in_slices(request: dict[str, Any]) -> InferRequest:
    """decode_request for a large request: big list tensors are converted a slice at a time,
    with the event loop free between slices, then assembled into one array.

    Raises RequestError as decode_request does.
    """
    tensors: list[dict[str, Any] | Tensor] = []
    try:
        for tensor in request.get("tensors", ()):
            values = tensor["data"]["values"]
            if not isinstance(values, list) or len(values) <= DECODE_SLICE:
                tensors.append(tensor)
                continue
            metadata = tensor["metadata"]
            datatype = TO_KSERVE[metadata["data_type"]]
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
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise RequestError(f"malformed inference input: {type(exc).__name__}: {exc}") from None
    decoded = decode_request({**request, "tensors": [t for t in tensors if isinstance(t, dict)]})
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
    out = {}
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
