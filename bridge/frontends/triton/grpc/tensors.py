"""KServe protobufs ⇄ the bridge tensor form (docs/worker_protocol.md §2), with no per-element work.

A `ModelInferRequest` becomes the dict a bridge worker takes: each tensor's `data.values` is
the input's raw bytes (`raw_input_contents[i]`, C order, little endian; BYTES as 4-byte length
prefixed elements), which Dynamo's request plane carries as msgpack bin. Typed `contents` are
packed into the same layout once. A response's output bytes go into `raw_output_contents`
as they are: Triton's gRPC server always answers with raw outputs, whatever the inputs were [V].

The checks here are the ones Triton's gRPC layer makes on the transport before the model's
config is consulted: where each input's data is; that it fits its declared shape and datatype,
and the BYTES framing, are the core's checks, shared with the HTTP wire (../tensor_checks.py).
Texts and codes are Triton 2.51's, captured from the real server (tests/e2e/test_triton_door.py
and the differential suite check them).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse
from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import parse_model_version

from ....codec import (
    TO_DYNAMO,
    TO_KSERVE,
    decode_parameters,
    decode_raw_tensor,
    encode_parameters,
    raw_contents,
    raw_view,
    refused_as_malformed,
)
from ....serialized_bytes import Budget, BytesLimits
from ..classification import classify
from ..door_error import DoorError, invalid
from ..shm import PARAMETERS as SHM_PARAMETERS
from ..shm import SharedMemory, placement
from ..tensor_checks import check_tensor, run_deferred_here
from .wire import serialized_answer

FINAL_RESPONSE = "triton_final_response"
EMPTY_FINAL_REQUESTED = "triton_enable_empty_final_response"
# A requested output's parameter that tritonclient's `class_count` sets (../classification.py).
CLASSIFICATION = "classification"


# Typed `contents` field → the datatype Triton names it by, and the datatypes it may carry.
_CONTENT_FIELDS: dict[str, tuple[str, frozenset[str]]] = {
    "bool_contents": ("BOOL", frozenset({"BOOL"})),
    "int_contents": ("INT32", frozenset({"INT8", "INT16", "INT32"})),
    "int64_contents": ("INT64", frozenset({"INT64"})),
    "uint_contents": ("UINT32", frozenset({"UINT8", "UINT16", "UINT32"})),
    "uint64_contents": ("UINT64", frozenset({"UINT64"})),
    "fp32_contents": ("FP32", frozenset({"FP32"})),
    "fp64_contents": ("FP64", frozenset({"FP64"})),
    "bytes_contents": ("BYTES", frozenset({"BYTES"})),
}

# InferParameter's oneof field ⇄ the kind name of the dict form.
_PARAMETER_KINDS = {
    "bool_param": "bool",
    "int64_param": "int64",
    "string_param": "string",
    "double_param": "double",
    "uint64_param": "uint64",
}
_PARAMETER_FIELDS = {kind: field for field, kind in _PARAMETER_KINDS.items()}


# -- parameters -----------------------------------------------------------------------------------


def parameters_to_dict(parameters: Any) -> dict[str, dict[str, Any]]:
    """A protobuf parameter map → `{name: {"int64": 3}}`; a parameter with no value is left out,
    and so are the shared memory ones (the door reads and writes the regions itself)."""
    out = {}
    for name, parameter in parameters.items():
        if name in SHM_PARAMETERS:
            continue
        field = parameter.WhichOneof("parameter_choice")
        if field is not None:
            out[name] = {_PARAMETER_KINDS[field]: getattr(parameter, field)}
    return out


def fill_parameters(target: Any, parameters: dict[str, dict[str, Any]]) -> None:
    """`{name: {"bool": True}}` → the protobuf parameter map `target`."""
    for name, value in parameters.items():
        for kind, item in value.items():
            field = _PARAMETER_FIELDS.get(kind)
            if field is not None:
                setattr(target[name], field, item)


def wants_empty_final(request: pb.ModelInferRequest) -> bool:
    """Did the client ask for an empty response marking a flag-only FINAL (tritonclient's
    `enable_empty_final_response=True`)?"""
    parameter = request.parameters.get(EMPTY_FINAL_REQUESTED)
    return parameter is not None and parameter.bool_param


def class_count(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> int:
    """The top-k classes a requested output asks for, 0 for none (Triton's checks and texts)."""
    parameter = output.parameters.get(CLASSIFICATION)
    if parameter is None:
        return 0
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise invalid("invalid value type for 'classification' parameter, expected int64_param")
    if parameter.int64_param <= 0:
        raise invalid("invalid value for 'classification' parameter, expected >= 0")
    return int(parameter.int64_param)


def class_counts(request: pb.ModelInferRequest) -> dict[str, int]:
    """The requested outputs that ask for classes: name → k."""
    counts = {}
    for output in request.outputs:
        if output.parameters:
            k = class_count(output)
            if k:
                counts[output.name] = k
    return counts


def region_names(request: pb.ModelInferRequest) -> list[str]:
    """The shared memory regions the request's inputs and outputs name (shm.py `holding`)."""
    names = []
    for tensor in (*request.inputs, *request.outputs):
        if tensor.parameters:
            where = placement(tensor.parameters)
            if where is not None:
                names.append(where[0])
    return names


def region_input_bytes(request: pb.ModelInferRequest) -> int:
    """The bytes the request's inputs name in shared memory regions: what converting it reads
    (or maps) out of them. A negative size counts nothing (the conversion refuses it), so
    that it cannot cancel another input's."""
    return sum(
        max(where[2], 0)
        for tensor in request.inputs
        if tensor.parameters and (where := placement(tensor.parameters)) is not None
    )


# -- request --------------------------------------------------------------------------------------


def _typed_contents(
    request: pb.ModelInferRequest, tensor: pb.ModelInferRequest.InferInputTensor
) -> bytes:
    """An input sent in typed `contents`, packed as raw bytes (Triton's checks and texts)."""
    contents = tensor.contents
    present = [field for field, _ in contents.ListFields()]
    if not present:
        raise invalid(
            f"unable to find data for input tensor '{tensor.name}' for model "
            f"'{request.model_name}' in request."
        )
    field = present[0]
    field_name = field.name
    named, carries = _CONTENT_FIELDS[field_name]
    if tensor.datatype not in carries:
        raise invalid(
            f"unexpected explicit tensor data for input tensor '{tensor.name}' for model "
            f"'{request.model_name}' of type '{named}', expected datatype '{tensor.datatype}'"
        )
    values = getattr(contents, field_name)
    if field_name == "bytes_contents":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    # Read as the field holds them, then cut to the datatype as Triton copies them: the low
    # bytes of each (an INT8 input of int_contents 300 is 44), never an error.
    held = np.asarray(values, dtype=DATATYPE_TO_NUMPY[named])
    return held.astype(DATATYPE_TO_NUMPY[tensor.datatype], copy=False).tobytes()


def _input_contents(
    request: pb.ModelInferRequest,
    tensor: pb.ModelInferRequest.InferInputTensor,
    raw: Sequence[bytes | memoryview],
    index: int,
) -> bytes | memoryview:
    """The contents of an input not placed in shared memory: `raw[index]` when the request
    has raw contents (then the next input's index is one more), else its typed `contents`
    packed (Triton's checks and texts)."""
    if not raw:
        return _typed_contents(request, tensor)
    if tensor.HasField("contents"):
        raise invalid(
            "contents field must not be specified when using raw_input_contents for "
            f"'{tensor.name}' for model '{request.model_name}'"
        )
    if index >= len(raw):
        raise invalid(
            f"unable to find data for input tensor '{tensor.name}' for model "
            f"'{request.model_name}' in request."
        )
    data = raw[index]
    if tensor.datatype == "BYTES" and isinstance(data, memoryview):
        return data.tobytes()  # read as bytes by the checks and the worker alike
    return data


def _request_parameters(request: pb.ModelInferRequest) -> dict[str, dict[str, Any]]:
    """The request's parameters in the dict form, refused when one is Triton's own."""
    reserved = [
        name
        for name in request.parameters
        if name.startswith("triton_") and name != EMPTY_FINAL_REQUESTED
    ]
    if reserved:
        # As Triton (2.33 on): only its stream option.
        raise invalid(
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
            f"the following keys starting with 'triton_' are allowed: {EMPTY_FINAL_REQUESTED}"
        )
    return parameters_to_dict(request.parameters)


def to_bridge_request(
    request: pb.ModelInferRequest,
    model_version: str,
    config: mc.ModelConfig | None = None,
    shm: SharedMemory | None = None,
    limits: BytesLimits | None = None,
    deferred: list[Callable[[], None]] | None = None,
    lend: bool = False,
    raw_contents: Sequence[bytes | memoryview] | None = None,
) -> dict[str, Any]:
    """A ModelInferRequest → the bridge form a bridge worker answers in (worker_protocol.md §2).

    Raises DoorError (INVALID_ARG, Triton's text) for data that does not fit its declaration,
    or for BYTES inputs that would cost more than `limits` once decoded. With `deferred`, the
    checks of large BYTES inputs are left there for the caller to run off the event loop
    (tensor_checks.run_deferred).
    `config` (the model's, when known) only names the datatype an unknown datatype should be.
    `raw_contents`: the request's raw input contents as received (wire.py), when not the
    message's own. Inputs placed in a registered shared memory region (shm.py) are read from
    it; they take no entry of `raw_input_contents`. With `lend` (the worker is in this
    process), regions that may be mapped are lent instead: inputs as mappings, outputs as
    writers the worker writes them with (shm.py).
    """
    # Each protobuf field read builds a Python object: read every one once (a per-request cost).
    raw = request.raw_input_contents if raw_contents is None else raw_contents
    model = request.model_name
    request_id = request.id
    budget = Budget(limits, model, request_id) if limits is not None else None
    tensors = []
    index = 0
    for tensor in request.inputs:
        name = tensor.name
        datatype = tensor.datatype
        shape = list(tensor.shape)
        parameters = tensor.parameters if tensor.parameters else None
        where = placement(parameters) if parameters is not None else None
        if where is not None and shm is not None:
            lent = shm.lend_input(*where, config) if lend and datatype != "BYTES" else None
            data = lent if lent is not None else shm.read(*where)
        else:
            data = _input_contents(request, tensor, raw, index)
            index += 1 if raw else 0
        check_tensor(model, request_id, name, datatype, shape, data, config, budget, deferred)
        data_type = TO_DYNAMO[datatype]
        metadata: dict[str, Any] = {"name": name, "data_type": data_type, "shape": shape}
        if parameters is not None:
            metadata["parameters"] = parameters_to_dict(parameters)
        tensors.append({"metadata": metadata, "data": {"data_type": data_type, "values": data}})
    out: dict[str, Any] = {
        "model": model,
        "tensors": tensors,
        "bridge_form": 1,
        "model_version": model_version,
    }
    if request_id:
        out["id"] = request_id
    if request.parameters:
        out["parameters"] = _request_parameters(request)
    if request.outputs:
        outputs = []
        for output in request.outputs:
            entry: dict[str, Any] = {"name": output.name}
            if output.parameters:
                if class_count(output) and placement(output.parameters) is not None:
                    raise invalid(
                        "output can't set both 'shared_memory_region' and 'classification'"
                    )
                entry["parameters"] = parameters_to_dict(output.parameters)
                where = placement(output.parameters) if lend and shm is not None else None
                sink = shm.lend_output(*where) if where is not None and shm else None
                if sink is not None:
                    entry["sink"] = sink
            outputs.append(entry)
        out["outputs"] = outputs
    return out


def to_loader_request(
    request: pb.ModelInferRequest,
    model_version: str,
    config: mc.ModelConfig,
    limits: BytesLimits,
    raw_contents: Sequence[bytes | memoryview],
    headers: Callable[[], dict[str, dict[str, str]]] | None = None,
) -> InferRequest | None:
    """A ModelInferRequest → the loader's request, for a model this process serves
    (grpc/unary.py): what `to_bridge_request` and the worker's `decode_request` make of it
    together, with no bridge form between (issue 37, docs/benchmarks.md). None when an input or
    output names a shared memory region: the loop's path reads and writes those
    (`to_bridge_request`).

    `headers()`: the call's headers forwarded as parameters (`--grpc-header-forward-pattern`),
    asked for where the loop's path adds them: after the door's checks, before the worker's.

    Raises DoorError for the door's checks, in `to_bridge_request`'s order and with its texts
    (large BYTES inputs' framing last, as the deferred checks run), then for a forwarded header
    of a reserved name; and RequestError (INVALID_ARG) for what the worker refuses: an input
    that does not decode, a reserved request parameter of the wrong type.
    """
    model = request.model_name
    request_id = request.id
    budget = Budget(limits, model, request_id)
    deferred: list[Callable[[], None]] = []
    checked = []
    index = 0
    for tensor in request.inputs:
        if tensor.parameters and placement(tensor.parameters) is not None:
            return None
        name = tensor.name
        datatype = tensor.datatype
        shape = list(tensor.shape)
        data = _input_contents(request, tensor, raw_contents, index)
        index += 1 if raw_contents else 0
        check_tensor(model, request_id, name, datatype, shape, data, config, budget, deferred)
        checked.append((name, datatype, shape, data))
    parameters = _request_parameters(request) if request.parameters else {}
    requested = []
    for output in request.outputs:
        if output.parameters:
            if placement(output.parameters) is not None:
                return None
            class_count(output)  # refused here, in to_bridge_request's order
        requested.append(output.name)
    run_deferred_here(deferred)
    forwarded = headers() if headers is not None else None
    if forwarded:  # a header wins a clash (header_forward.py)
        parameters = {**parameters, **forwarded}
    with refused_as_malformed():  # past the door's checks: refused as the worker refuses it
        inputs = [decode_raw_tensor(*entry, model, request_id) for entry in checked]
    return InferRequest(
        inputs=inputs,
        requested_outputs=requested,
        request_id=request_id,
        parameters=decode_parameters(parameters) if parameters else {},
        model_version=parse_model_version(model_version),
    )


# -- response -------------------------------------------------------------------------------------


def answer_of(
    request: pb.ModelInferRequest,
    classes: dict[str, int],
    batching: bool,
    model_version: str,
    response: InferenceResponse,
    final: bool,
) -> bytes:
    """A model's response to `request` as its unary answer's bytes, made on the model's thread
    when it sends it (to_loader_request's way back: `to_infer_response` and the serializer,
    without the bridge form). Each output is copied once, into the answer, now: as Triton's stub
    copies an output when it is sent, so a model may reuse its arrays. `classes`
    (`class_counts`) turns outputs into their top k classes. `final` is not sent: Triton puts
    no `triton_final_response` on a unary answer."""
    message = pb.ModelInferResponse(
        model_name=request.model_name, id=request.id, model_version=model_version
    )
    raw: list[bytes | bytearray | memoryview] = []
    for tensor in response._output_tensors:
        name = tensor._name
        datatype = tensor._datatype
        shape: Sequence[int] = tensor._dims()
        k = classes.get(name)
        if k:
            datatype, shape, contents = classify(
                datatype, list(shape), raw_contents(tensor), k, batching
            )
            raw.append(contents)
        elif datatype == "BYTES":
            raw.append(raw_contents(tensor))
        else:  # the array itself, read once by the answer's one copy
            raw.append(raw_view(tensor))
        output = message.outputs.add()
        output.name = name
        output.datatype = datatype
        output.shape.extend(shape)
    text = response._parameters
    if text and text != "{}":
        parameters = encode_parameters(json.loads(text))
        parameters.pop(FINAL_RESPONSE, None)
        fill_parameters(message.parameters, parameters)
    return serialized_answer(message, raw)


def to_infer_response(
    request: pb.ModelInferRequest,
    item: dict[str, Any],
    final: bool | None = None,
    shm: SharedMemory | None = None,
    raw_out: list[bytes | bytearray] | None = None,
    batching: bool = False,
) -> pb.ModelInferResponse:
    """A bridge-form response item → ModelInferResponse.

    `final` is None for a unary answer (Triton puts no `triton_final_response` there), else the
    value of that parameter on a streamed response. An output the request placed in a shared
    memory region is written there, and its `raw_output_contents` entry is empty (Triton's way).
    An output asked for with `class_count` goes back as its top k classes (BYTES), per batch
    entry when the model is `batching` (max_batch_size > 0), as over HTTP.
    With `raw_out`, the raw output contents go there instead of into the message (wire.py).
    """
    placed = {}
    if shm is not None:
        for output in request.outputs:
            where = placement(output.parameters) if output.parameters else None
            if where is not None:
                placed[output.name] = where
    classes = class_counts(request) if request.outputs else {}
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    if not item.get("empty"):  # Triton's empty final response names no version [V]
        response.model_version = str(item.get("model_version", ""))
    raw = response.raw_output_contents if raw_out is None else raw_out
    for tensor in item.get("tensors", ()):
        metadata = tensor["metadata"]
        output = response.outputs.add()
        output.name = metadata["name"]
        datatype = TO_KSERVE[metadata["data_type"]]
        shape = metadata["shape"]
        data = tensor["data"]
        values = data["values"]
        where = placed.get(output.name)
        if where is not None and data.get("written"):
            output.datatype = datatype
            output.shape.extend(shape)
            raw.append(b"")  # the worker wrote it into its region (shm.RegionWriter)
            continue
        if not isinstance(values, bytes | bytearray):
            raise DoorError(
                ErrorCode.INTERNAL,
                f"output '{output.name}' came back as a list from a bridge-form request",
            )
        k = classes.get(output.name)
        if k:
            datatype, shape, values = classify(datatype, list(shape), values, k, batching)
        output.datatype = datatype
        output.shape.extend(shape)
        if where is not None and shm is not None:
            shm.write(*where, output.name, values)
            raw.append(b"")
            continue
        # Into `raw_out` as it is (joined once into the message, wire.py); protobuf's own
        # field takes `bytes` only.
        raw.append(values if raw_out is not None else bytes(values))
    parameters = item.get("parameters")
    if parameters:
        parameters = {k: v for k, v in parameters.items() if k != FINAL_RESPONSE}
        fill_parameters(response.parameters, parameters)
    if final is not None:
        response.parameters[FINAL_RESPONSE].bool_param = final
    return response
