"""`GET /v2`, `/v2/models/<m>[/versions/<v>]`, `.../config`, `.../stats` and `/v2/models/stats`.

The service answers in tritonclient's protobufs; Triton's HTTP server writes the same messages
as JSON [V]: field names as in the .proto, every field printed (zeros, empty lists and maps
included), enums by name, and 64-bit integers as JSON numbers (protobuf's own JSON mapping
would quote them).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from .status import json_response

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _numbers(message: Message, document: dict[str, Any]) -> dict[str, Any]:
    """`document` (MessageToDict of `message`) with every 64-bit integer made a number again,
    walking the descriptor so that only integer fields are touched (a string field holding
    digits stays a string)."""
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if name not in document:
            continue
        value = document[name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            mapping = getattr(message, name)
            if value_field.message_type is not None:
                for key in value:
                    _numbers(mapping[_map_key(field, key)], value[key])
            elif value_field.type in _INT64_TYPES:
                document[name] = {k: int(v) for k, v in value.items()}
        elif field.message_type is not None:
            if field.label == FieldDescriptor.LABEL_REPEATED:
                for sub, sub_document in zip(getattr(message, name), value, strict=True):
                    _numbers(sub, sub_document)
            else:
                _numbers(getattr(message, name), value)
        elif field.type in _INT64_TYPES:
            if field.label == FieldDescriptor.LABEL_REPEATED:
                document[name] = [int(v) for v in value]
            else:
                document[name] = int(value)
    return document


def _map_key(field: FieldDescriptor, key: str) -> Any:
    key_field = field.message_type.fields_by_name["key"]
    return key if key_field.type == FieldDescriptor.TYPE_STRING else int(key)


def message_json(message: Message) -> dict[str, Any]:
    """A protobuf message as Triton's HTTP server writes it."""
    document = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _numbers(message, document)


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
    return json_response(message_json(answer))
