"""`GET /v2`, `/v2/models/<m>[/versions/<v>]`, `.../config`, `.../stats` and `/v2/models/stats`.

The service answers in tritonclient's protobufs; Triton's HTTP server writes the same messages
as JSON [V]: field names as in the .proto and in its order, every field printed (zeros, empty
lists and maps included), enums by name, and 64-bit integers as JSON numbers (protobuf's own
JSON mapping would quote them). Statistics are the exception to the order: Triton writes
`response_stats` before `batch_stats`.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from .error_status import json_response

_BYTES = FieldDescriptor.TYPE_BYTES
_ENUM = FieldDescriptor.TYPE_ENUM


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == _ENUM and field.enum_type is not None:
        item = field.enum_type.values_by_number.get(value)
        return item.name if item is not None else value
    if field.type == _BYTES:
        return base64.b64encode(value).decode()
    return value  # bool, int (64-bit ones too: numbers, as Triton writes them), float, str


def _value(field: FieldDescriptor, value: Any) -> Any:
    return message_json(value) if field.message_type is not None else _scalar(field, value)


_MAP, _REPEATED, _OPTIONAL, _SINGLE = range(4)


def _is_repeated(field: FieldDescriptor) -> bool:
    if hasattr(type(field), "is_repeated"):  # protobuf >= 6.31 (`label` is deprecated there)
        return bool(field.is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)  # type: ignore[attr-defined]


@functools.cache
def _fields(descriptor: Descriptor) -> tuple[tuple[str, int, FieldDescriptor], ...]:
    """How each field of a message type is written, in declared order (worked out once)."""
    out = []
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out.append((field.name, _MAP, field.message_type.fields_by_name["value"]))
        elif _is_repeated(field):
            out.append((field.name, _REPEATED, field))
        else:
            out.append((field.name, _OPTIONAL if field.has_presence else _SINGLE, field))
    return tuple(out)


def message_json(message: Message) -> dict[str, Any]:
    """A protobuf message as Triton's HTTP server writes it: fields in the order the .proto
    declares them, each one printed unless it tracks presence and is unset (a sub-message or a
    oneof member)."""
    out: dict[str, Any] = {}
    for name, kind, field in _fields(message.DESCRIPTOR):
        if kind == _OPTIONAL and not message.HasField(name):
            continue
        value = getattr(message, name)
        if kind == _MAP:
            out[name] = {str(k): _value(field, v) for k, v in value.items()}
        elif kind == _REPEATED:
            out[name] = [_value(field, v) for v in value]
        else:
            out[name] = _value(field, value)
    return out


def _version(request: Request) -> str:
    return request.path_params.get("version", "")


async def server_metadata(request: Request) -> Response:
    return json_response(message_json(request.app.state.service.server_metadata()))


async def model_metadata(request: Request) -> Response:
    service = request.app.state.service
    answer = await service.model_metadata(request.path_params["model"], _version(request))
    return json_response(message_json(answer))


async def model_config(request: Request) -> Response:
    service = request.app.state.service
    answer = await service.model_config(request.path_params["model"], _version(request))
    return json_response(message_json(answer.config))


async def model_stats(request: Request) -> Response:
    service = request.app.state.service
    name = request.path_params.get("model", "")
    answer = await service.statistics(name, _version(request))
    document = message_json(answer)
    document["model_stats"] = [_triton_order(stats) for stats in document["model_stats"]]
    return json_response(document)


def _triton_order(stats: dict[str, Any]) -> dict[str, Any]:
    """One model's statistics in the order Triton writes them (response_stats moved up)."""
    response = stats.pop("response_stats", {})
    out = {}
    for key, value in stats.items():
        if key == "batch_stats":
            out["response_stats"] = response
        out[key] = value
    return out
