"""`GET|POST /v2/logging`, `GET|POST /v2/trace/setting` and `/v2/models/<m>/trace/setting`.

What the settings are and do is the service's (`service.logging`, `service.trace`,
../settings.py, shared with the gRPC wire); this module is their JSON, as Triton 2.51's HTTP
server has it [V]:

- logging: the six keys with their JSON types. A POST body that is no object changes nothing;
  `null` values and unknown keys are ignored; a value of the wrong JSON type is 500 with
  RapidJSON's words, an unknown `log_format` 503 (Triton's HTTP text), each after the keys
  Triton reads before it have applied (keys in Triton's order, bridge/logs.py).
- trace: `trace_level` a list of strings, every other setting one string; in a POST,
  `trace_level` must be a JSON array and the others strings (500 with RapidJSON's words
  otherwise, nothing applied), `null` clears a setting, unknown keys are ignored. A model's
  settings need a model the door knows (400 "Request for unknown model : <m>"); there is no
  `/versions/<v>` form.
- an empty body or one that does not parse is 500 "failed to parse the request JSON buffer".
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from model_repository_loader.pb_utils.errors import ErrorCode

from ....logs import LOG_FORMATS, LOG_SETTING_TYPES
from ..door_error import DoorError
from ..log_trace_settings import TRACE_DEFAULTS
from ..service import TritonService
from .bodies import internal, read_json
from .error_status import json_response

_JSON_TYPE_ERRORS = {
    bool: "attempt to access JSON non-boolean as boolean",
    int: "attempt to access JSON non-unsigned-integer as unsigned-integer",
    str: "attempt to access JSON non-string as string",
}


def _json_type_ok(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return type(value) is int and value >= 0
    return isinstance(value, kind)


async def logging(request: Request) -> Response:
    service: TritonService = request.app.state.service
    if request.method == "GET":
        return json_response(service.logging.current())
    document = await read_json(request)
    changes: dict[str, Any] = {}
    refused: DoorError | None = None
    if isinstance(document, dict):
        for key, kind in LOG_SETTING_TYPES.items():
            value = document.get(key)
            if value is None:
                continue  # absent or null: Triton reads no change
            if not _json_type_ok(kind, value):
                refused = internal(_JSON_TYPE_ERRORS[kind])
                break
            if key == "log_format" and value not in LOG_FORMATS:
                # Triton's HTTP server words and codes this one itself [V].
                refused = DoorError(
                    ErrorCode.UNAVAILABLE, f"invalid argument for --log_format, got: {value}"
                )
                break
            changes[key] = value
    settings = await service.logging.update(changes)
    if refused is not None:
        raise refused
    return json_response(settings)


def _trace_changes(document: Any) -> dict[str, list[str] | None]:
    changes: dict[str, list[str] | None] = {}
    if not isinstance(document, dict):
        return changes
    for key, value in document.items():
        if key not in TRACE_DEFAULTS:
            continue  # Triton ignores keys it does not know, whatever their value [V]
        if value is None:
            changes[key] = None
        elif key == "trace_level":
            if not isinstance(value, list):
                raise internal("attempt to access JSON non-array as array")
            if not all(isinstance(v, str) for v in value):
                raise internal(_JSON_TYPE_ERRORS[str])
            changes[key] = list(value)
        elif not isinstance(value, str):
            raise internal(_JSON_TYPE_ERRORS[str])
        else:
            changes[key] = [value]
    return changes


def _trace_document(settings: dict[str, list[str]]) -> dict[str, Any]:
    return {
        key: list(values) if key == "trace_level" else (values[0] if values else "")
        for key, values in settings.items()
    }


async def trace(request: Request) -> Response:
    service: TritonService = request.app.state.service
    model = request.path_params.get("model", "")
    changes = {}
    if request.method == "POST":
        changes = _trace_changes(await read_json(request))
    # An empty update reads, with the unknown-model check a read has too.
    return json_response(_trace_document(await service.trace.update(model, changes)))
