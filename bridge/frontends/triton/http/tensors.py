"""Triton's HTTP inference JSON and binary tensor data extension ⇄ the bridge tensor form.

A request body is a JSON header, optionally followed by binary tensor data: the header's length
is then `Inference-Header-Content-Length`, and each input with a `binary_data_size` parameter
takes that many bytes, in input order, from what follows it. An input given as JSON `data`
(flat or nested lists, in row-major order) is packed once into the raw layout the bridge form
carries (docs/worker_protocol.md §2): C order, little endian, BYTES as 4-byte length-prefixed
elements. An input in a registered system shared memory region is read from it (shm.py).

A response is JSON unless an output is asked for as binary (`binary_data` on a requested
output, or `binary_data_output` on the request when it names no outputs): those outputs carry
`binary_data_size` and their raw bytes follow the JSON, in output order, with the JSON's length
in `Inference-Header-Content-Length`. `classification` on a requested output turns it into
Triton's top-k BYTES (../classification.py).

What Triton 2.51's HTTP server answers was captured from it [V]: JSON values are checked by
kind as rapidjson reads them (a float is not an integer, a bool is not a number, a negative
number is not unsigned), integers out of the datatype's range wrap as a C cast does (300 as
INT8 is 44), floats round to FP32; FP16 / BF16 go only as binary, both ways. Texts are Triton's.
One deliberate difference: a request that cannot be parsed (broken JSON, a value of the wrong
kind) is 400 here; Triton answers those 500.
"""

from __future__ import annotations

import json
import math
import secrets
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.gpu.device_array import DeviceArray
from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY
from model_repository_loader.pb_utils.errors import ErrorCode

from ....codec import TO_DYNAMO, TO_KSERVE
from ....serialized_bytes import Budget, BytesLimits
from ..classification import classify
from ..door_error import DoorError, invalid
from ..shm import BYTE_SIZE, OFFSET, REGION, SharedMemory
from ..tensor_checks import charge_bytes, check_tensor
from .bodies import PARSE_FAILED, SURROGATE_INVALID, lone_surrogate_at
from .error_status import encode_json
from .limits import DEFAULT_MAX_INPUT_SIZE, check_depth, json_input_too_large

HEADER_LENGTH = "inference-header-content-length"
BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"
CLASSIFICATION = "classification"
# Parameters the HTTP wire acts on; they do not reach the model.
_INPUT_WIRE_PARAMETERS = frozenset({BINARY_DATA_SIZE, REGION, BYTE_SIZE, OFFSET})
_OUTPUT_WIRE_PARAMETERS = frozenset({BINARY_DATA, CLASSIFICATION, REGION, BYTE_SIZE, OFFSET})
_REQUEST_WIRE_PARAMETERS = frozenset({BINARY_DATA_OUTPUT})

_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)
_SIGNED = frozenset({"INT8", "INT16", "INT32", "INT64"})
_UNSIGNED = frozenset({"UINT8", "UINT16", "UINT32", "UINT64"})
_FLOATS = frozenset({"FP32", "FP64"})
_BINARY_ONLY = frozenset({"FP16", "BF16"})
_LENGTH = struct.Struct("<I")
FINAL_RESPONSE = "triton_final_response"


def malformed(message: str) -> DoorError:
    """A request the wire cannot parse: 400 (Triton's text; Triton's status there is 500)."""
    return invalid(message)


def _kind_error(what: str, expected: str) -> DoorError:
    return malformed(f"Unable to parse '{what}': attempt to access JSON {expected}")


# -- the parsed request ---------------------------------------------------------------------------


@dataclass(slots=True)
class OutputPlan:
    """How one output goes back: binary or JSON, top-k classes, a shared memory region."""

    binary: bool = False
    classes: int = 0
    region: tuple[str, int, int] | None = None


@dataclass(slots=True)
class InferPlan:
    """What the response needs to know about its request."""

    request_id: str = ""
    outputs: dict[str, OutputPlan] = field(default_factory=dict)
    binary_default: bool = False  # for outputs the request did not name
    regions: list[str] = field(default_factory=list)  # shared memory it names (shm.py holding)

    def output(self, name: str) -> OutputPlan:
        plan = self.outputs.get(name)
        return plan if plan is not None else OutputPlan(binary=self.binary_default)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary part) of a request body, by `Inference-Header-Content-Length`."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 < length <= len(body):
        raise invalid(
            f"inference header size should be in range (0, {len(body)}), got: {header_length}"
        )
    if length == len(body):
        return body, memoryview(b"")
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


_DECODER = json.JSONDecoder()


def parse_json(text: bytes) -> dict[str, Any]:
    """The request's JSON header. As Triton's parser, what follows the first JSON value is
    ignored (a header length that is too long is then caught by the binary data's sizes).
    Nesting past Triton's limit is its 400 (limits.py)."""
    check_depth(text)
    if (offset := lone_surrogate_at(text)) is not None:
        raise malformed(f"{PARSE_FAILED}: {SURROGATE_INVALID} at {offset}")
    try:
        document, _ = _DECODER.raw_decode(text.decode("utf-8", "surrogateescape").lstrip())
    except ValueError as exc:  # JSONDecodeError
        raise malformed(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise malformed(
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
        )
    return document


def _member(document: dict[str, Any], key: str) -> Any:
    if key not in document:
        raise malformed(
            f"Unable to parse '{key}': attempt to access non-existing object member '{key}'"
        )
    return document[key]


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _kind_error(what, "non-object as object")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _kind_error(what, "non-string as string")
    return value


def _unsigned(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise _kind_error(what, "non-unsigned-integer as unsigned-integer")
    return value


def _array(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _kind_error(what, "non-array as array")
    return value


def parameters_dict(parameters: Any, skip: frozenset[str], what: str) -> dict[str, dict]:
    """JSON parameters → the bridge form's `{name: {"int64": 3}}`, without the wire's own."""
    out: dict[str, dict] = {}
    for name, value in _object(parameters, what).items():
        if name in skip:
            continue
        kind = type(value)
        if kind is bool:
            out[name] = {"bool": value}
        elif kind is int:
            out[name] = {"int64" if value <= _INT64[1] else "uint64": value}
        elif kind is float:
            out[name] = {"double": value}
        elif kind is str:
            out[name] = {"string": value}
        else:
            raise invalid(
                f"parameter '{name}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
    return out


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


# Elements per step over a long list: each step is one C call holding the GIL, and between
# steps the event loop's thread can take it (the packing runs on a thread; infer.py).
_SLICE = 1 << 18
_RENDER_WHOLE_BYTES = 1 << 20


def _kinds(values: list[Any]) -> set[type]:
    kinds: set[type] = set()
    for start in range(0, len(values), _SLICE):
        kinds.update(map(type, values[start : start + _SLICE]))
    return kinds


def _within(values: list[int], low: int, high: int) -> bool:
    for start in range(0, len(values), _SLICE):
        part = values[start : start + _SLICE]
        if min(part) < low or max(part) > high:
            return False
    return True


def _wide(values: list[Any], dtype: type) -> np.ndarray:
    out: np.ndarray = np.empty(len(values), dtype)
    for start in range(0, len(values), _SLICE):
        out[start : start + _SLICE] = values[start : start + _SLICE]
    return out


def _packed_json(name: str, datatype: str, data: Any, count: int, limit: int) -> bytes:
    """An input's JSON `data` as the raw bytes of `datatype` (Triton's kind checks), at most
    `limit` bytes (`--http-max-input-size`; fixed types checked from the shape first, as
    Triton does)."""
    if datatype in _BINARY_ONLY:
        raise invalid(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    if datatype != "BYTES":
        size = count * np.dtype(DATATYPE_TO_NUMPY[datatype]).itemsize
        if size > limit:
            raise invalid(json_input_too_large(name, size, limit))
    values = _array(data, "data")
    kinds = _kinds(values)
    if list in kinds:
        values = _flatten(values)
        kinds = _kinds(values)
    if len(values) != count:
        raise malformed("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        if not kinds <= {str}:
            raise malformed(
                "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
            )
        parts = []
        for text in values:
            encoded = text.encode("utf-8", "surrogatepass")
            parts.append(_LENGTH.pack(len(encoded)))
            parts.append(encoded)
        packed = b"".join(parts)
        if len(packed) > limit:
            raise invalid(json_input_too_large(name, len(packed), limit))
        return packed
    if not values:
        return b""
    if datatype == "BOOL":
        if kinds != {bool}:
            raise _kind_error("data", "non-boolean as boolean")
        return _wide(values, np.bool_).tobytes()
    if datatype in _SIGNED or datatype in _UNSIGNED:
        low, high = _INT64 if datatype in _SIGNED else _UINT64
        if kinds != {int} or not _within(values, low, high):
            if datatype in _SIGNED:
                raise _kind_error("data", "non-signed-integer as signed-integer")
            raise _kind_error("data", "non-unsigned-integer as unsigned-integer")
        wide = _wide(values, np.int64 if datatype in _SIGNED else np.uint64)
        return wide.astype(DATATYPE_TO_NUMPY[datatype]).tobytes()  # wraps, as a C cast
    if datatype in _FLOATS:
        if not kinds <= {int, float}:
            raise _kind_error("data", "non-number as double")
        try:
            wide = _wide(values, np.float64)
        except OverflowError:  # an integer beyond any double
            raise _kind_error("data", "non-number as double") from None
        with np.errstate(over="ignore"):  # beyond FP32's range is ±inf, as Triton's cast
            return wide.astype(DATATYPE_TO_NUMPY[datatype]).tobytes()
    raise invalid(f"invalid datatype for input {name}")


def _placement(parameters: dict[str, Any]) -> tuple[str, int, int]:
    region = _string(parameters[REGION], REGION)
    offset = _unsigned(parameters.get(OFFSET, 0), OFFSET)
    size = _unsigned(parameters.get(BYTE_SIZE, 0), BYTE_SIZE)
    return region, offset, size


def region_input_bytes(document: Any) -> int:
    """The bytes a parsed request's inputs name in shared memory regions: what converting it
    reads (or maps) out of them. What is not well formed counts nothing here;
    `to_bridge_request` refuses it with Triton's text."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    total = 0
    for tensor in inputs if isinstance(inputs, list) else ():
        parameters = tensor.get("parameters") if isinstance(tensor, dict) else None
        if isinstance(parameters, dict) and REGION in parameters:
            size = parameters.get(BYTE_SIZE)
            if type(size) is int and size > 0:
                total += size
    return total


def _sources_error(given: Iterable[str]) -> DoorError:
    names = " ".join(f"'{name}'" for name in given) or "no field is set"
    prefix = "But set " if given else "But "
    return invalid(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. " + prefix + names
    )


def to_bridge_request(
    document: dict[str, Any],
    binary: memoryview,
    model: str,
    model_version: str,
    config: mc.ModelConfig | None = None,
    shm: SharedMemory | None = None,
    limits: BytesLimits | None = None,
    deferred: list[Callable[[], None]] | None = None,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    lend: bool = False,
) -> tuple[dict[str, Any], InferPlan]:
    """A parsed request header and its binary part → (the bridge form, the response's plan).

    Raises DoorError (INVALID_ARG, Triton's texts) for whatever does not fit, or for BYTES
    inputs that would cost more than `limits` once decoded. With `deferred`, the checks of
    large BYTES inputs are left there for the caller to run off the event loop
    (tensor_checks.run_deferred). With `lend` (the worker is in this process), shared memory
    regions that may be mapped are lent instead of copied (shm.py).
    """
    plan = InferPlan()
    out: dict[str, Any] = {"model": model, "bridge_form": 1, "model_version": model_version}
    if "id" in document:
        plan.request_id = _string(document["id"], "id")
        if plan.request_id:
            out["id"] = plan.request_id
    if "parameters" in document:
        raw = _object(document["parameters"], "parameters")
        binary_output = raw.get(BINARY_DATA_OUTPUT, False)
        if type(binary_output) is not bool:
            raise _kind_error(BINARY_DATA_OUTPUT, "non-boolean as boolean")
        plan.binary_default = binary_output
        if any(name.startswith("triton_") for name in raw):
            # As Triton (2.33 on): none on this wire.
            raise invalid(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        parameters = parameters_dict(raw, _REQUEST_WIRE_PARAMETERS, "parameters")
        if parameters:
            out["parameters"] = parameters
    budget = Budget(limits, model, plan.request_id) if limits is not None else None
    tensors = []
    # The core's checks, run once every input took its bytes.
    unchecked: list[tuple[str, str, list[int], bytes | memoryview | DeviceArray]] = []
    offset = 0
    for entry in _array(_member(document, "inputs"), "inputs"):
        tensor = _object(entry, "inputs")
        name = _string(_member(tensor, "name"), "name")
        shape = [_unsigned(d, "shape") for d in _array(_member(tensor, "shape"), "shape")]
        datatype = _string(_member(tensor, "datatype"), "datatype")
        if datatype not in TO_DYNAMO:
            raise invalid(f"invalid datatype for input {name}")
        raw_parameters = _object(tensor.get("parameters", {}), "parameters")
        given = [
            key
            for key, present in (
                ("data", "data" in tensor),
                (BINARY_DATA_SIZE, BINARY_DATA_SIZE in raw_parameters),
                (REGION, REGION in raw_parameters),
            )
            if present
        ]
        if len(given) != 1:
            raise _sources_error(given)
        data: bytes | memoryview | DeviceArray
        if given[0] == "data":
            count = math.prod(shape)
            data = _packed_json(name, datatype, tensor["data"], count, max_input_size)
            if datatype == "BYTES" and budget is not None:
                charge_bytes(budget, data)
        elif given[0] == BINARY_DATA_SIZE:
            size = _unsigned(raw_parameters[BINARY_DATA_SIZE], BINARY_DATA_SIZE)
            if offset + size > len(binary):
                raise invalid(
                    f"unexpected size for input '{name}', expecting "
                    f"{offset + size - len(binary)} additional bytes for model '{model}'"
                )
            data = bytes(binary[offset : offset + size])
            offset += size
            unchecked.append((name, datatype, shape, data))
        else:
            if shm is None:
                raise DoorError(ErrorCode.UNSUPPORTED, "shared memory is not served here")
            where = _placement(raw_parameters)
            plan.regions.append(where[0])
            lent = shm.lend_input(*where, config) if lend and datatype != "BYTES" else None
            data = lent if lent is not None else shm.read(*where)
            unchecked.append((name, datatype, shape, data))
        data_type = TO_DYNAMO[datatype]
        metadata: dict[str, Any] = {"name": name, "data_type": data_type, "shape": shape}
        parameters = parameters_dict(raw_parameters, _INPUT_WIRE_PARAMETERS, "parameters")
        if parameters:
            metadata["parameters"] = parameters
        tensors.append({"metadata": metadata, "data": {"data_type": data_type, "values": data}})
    if offset != len(binary):
        raise invalid(f"unexpected additional input data for model '{model}'")
    for name, datatype, shape, data in unchecked:  # once every input took its bytes [V]
        check_tensor(model, plan.request_id, name, datatype, shape, data, config, budget, deferred)
    out["tensors"] = tensors
    if "outputs" in document:
        outputs = []
        for entry in _array(document["outputs"], "outputs"):
            requested = _object(entry, "outputs")
            name = _string(_member(requested, "name"), "name")
            raw_parameters = _object(requested.get("parameters", {}), "parameters")
            output = plan.outputs[name] = OutputPlan()
            if BINARY_DATA in raw_parameters:
                output.binary = raw_parameters[BINARY_DATA]
                if type(output.binary) is not bool:
                    raise _kind_error(BINARY_DATA, "non-boolean as boolean")
            if CLASSIFICATION in raw_parameters:
                output.classes = _unsigned(raw_parameters[CLASSIFICATION], CLASSIFICATION)
            item: dict[str, Any] = {"name": name}
            if REGION in raw_parameters:
                output.region = _placement(raw_parameters)
                plan.regions.append(output.region[0])
                if lend and shm is not None and not output.classes:
                    sink = shm.lend_output(*output.region)
                    if sink is not None:
                        item["sink"] = sink
            parameters = parameters_dict(raw_parameters, _OUTPUT_WIRE_PARAMETERS, "parameters")
            if parameters:
                item["parameters"] = parameters
            outputs.append(item)
        if outputs:
            out["outputs"] = outputs
    return out, plan


# -- response -------------------------------------------------------------------------------------


def _bytes_elements(values: bytes) -> list[str]:
    """BYTES raw layout → its elements as JSON strings; bytes that are not UTF-8 go out as
    they are (surrogateescape round trip), as Triton writes them."""
    out = []
    offset = 0
    size = len(values)
    while offset + 4 <= size:
        (length,) = _LENGTH.unpack_from(values, offset)
        offset += 4
        out.append(bytes(values[offset : offset + length]).decode("utf-8", "surrogateescape"))
        offset += length
    return out


def _json_values(name: str, datatype: str, values: bytes) -> list[Any] | bytes:
    """An output's JSON `data`: a list, or for a large numeric output its JSON text, rendered
    in slices (one `json.dumps` of millions of numbers holds the GIL for seconds)."""
    if datatype == "BYTES":
        return _bytes_elements(values)
    if datatype in _BINARY_ONLY:
        raise invalid(
            f"sending {datatype} data via JSON is not supported. Please use the binary data "
            "format for output"
        )
    array = np.frombuffer(values, dtype=DATATYPE_TO_NUMPY[datatype])
    if array.nbytes <= _RENDER_WHOLE_BYTES:
        return array.tolist()
    parts = [
        json.dumps(array[start : start + _SLICE].tolist(), separators=(",", ":"))[1:-1]
        for start in range(0, len(array), _SLICE)
    ]
    return ("[" + ",".join(parts) + "]").encode()


def to_response(
    model: str,
    item: dict[str, Any],
    plan: InferPlan,
    config: mc.ModelConfig | None,
    shm: SharedMemory | None = None,
) -> tuple[bytes, list[bytes | bytearray]]:
    """A bridge-form response item → (JSON header, binary chunks that follow it)."""
    document: dict[str, Any] = {}
    if plan.request_id:
        document["id"] = plan.request_id
    document["model_name"] = model
    document["model_version"] = str(item.get("model_version", ""))
    parameters = {
        name: next(iter(value.values()))
        for name, value in (item.get("parameters") or {}).items()
        if value and name != FINAL_RESPONSE  # a stream's flag; a unary answer has none [V]
    }
    if parameters:
        document["parameters"] = parameters
    outputs = []
    chunks: list[bytes | bytearray] = []
    rendered: dict[bytes, bytes] = {}  # placeholder → an output's data rendered in slices
    nonce = ""  # drawn once a placeholder is needed: no string from the client can equal one
    batching = config is not None and config.max_batch_size > 0
    for tensor in item.get("tensors", ()):
        metadata = tensor["metadata"]
        name = metadata["name"]
        datatype = TO_KSERVE[metadata["data_type"]]
        shape = list(metadata["shape"])
        values = tensor["data"]["values"]
        output_plan = plan.output(name)
        if output_plan.region is not None and tensor["data"].get("written"):
            # the worker wrote it into its region (shm.RegionWriter): no data here [V]
            outputs.append({"name": name, "datatype": datatype, "shape": shape})
            continue
        if not isinstance(values, bytes | bytearray):
            raise DoorError(
                ErrorCode.INTERNAL,
                f"output '{name}' came back as a list from a bridge-form request",
            )
        if output_plan.classes:
            datatype, shape, values = classify(
                datatype, shape, values, output_plan.classes, batching
            )
        output: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if output_plan.region is not None and shm is not None:
            shm.write(*output_plan.region, name, values)  # named there, no data here [V]
        elif output_plan.binary:
            output["parameters"] = {BINARY_DATA_SIZE: len(values)}
            chunks.append(values)  # a bytearray (a BYTES output) is sent as it is: no copy
        else:
            data = _json_values(name, datatype, values)
            if isinstance(data, bytes):  # spliced in once the document is written
                nonce = nonce or secrets.token_hex(16)
                token = f"{nonce}:{len(rendered)}"
                rendered[token.encode()] = data
                output["data"] = token
            else:
                output["data"] = data
        outputs.append(output)
    document["outputs"] = outputs
    head = encode_json(document)
    for placeholder, json_text in rendered.items():
        head = head.replace(b'"' + placeholder + b'"', json_text, 1)
    return head, chunks
