"""Triton's model repository API over HTTP: `POST /v2/repository/index`,
`/v2/repository/models/<m>/load` and `.../unload`.

    POST /v2/repository/index                 [{"name", "version"?, "state"?, "reason"?}, ...]
         body (optional): {"ready": true}
    POST /v2/repository/models/<m>/load       body (optional): {"parameters": {
             "config": "<JSON model config>", "file:<version>/<name>": "<base64 bytes>"}}
    POST /v2/repository/models/<m>/unload     body (optional): {"parameters": {...}}

Success is 200 with an empty body (the index: a JSON list, a row per version, a model with no
version by its name only; `reason` only when there is one). The service forwards loads and
unloads to the workers, which apply their `--model-control-mode` (explicit only; otherwise 503
"explicit model load / unload is not allowed if polling is enabled", Triton's text for every
other mode) and answer with Triton's texts. What the body may hold, as Triton 2.51 [V]: a body
that is no JSON object is ignored; JSON that does not parse is 500 "failed to parse the request
JSON buffer: ..."; `ready` that is not a bool, `parameters` that are not an object, a `config`
or `file:` value that is not a string are 500 with RapidJSON's words; a `file:` value that is
not base64 is 500 "failed to load '<m>', failed to poll from model repository".

These routes are the whole of the control port (`--control-port`, app.py's control routes);
security.py guards them against browsers and oversized or stalled bodies.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..service import TritonService
from .bodies import internal, read_json
from .error_status import json_response

NON_OBJECT = "attempt to get members for non-object"
NON_STRING = "attempt to access JSON non-string as string"
NON_BOOLEAN = "attempt to access JSON non-boolean as boolean"


async def _document(request: Request) -> dict[str, Any]:
    """The body as a JSON object ({} for an empty body or one that is no object)."""
    document = await read_json(request, required=False)
    return document if isinstance(document, dict) else {}


def _empty_ok() -> Response:
    return Response(b"", status_code=200, media_type="application/json")


async def index(request: Request) -> Response:
    service: TritonService = request.app.state.service
    document = await _document(request)
    ready = document.get("ready", False)
    if not isinstance(ready, bool):
        raise internal(NON_BOOLEAN)
    rows = []
    for model in (await service.repository_index(ready)).models:
        row = {"name": model.name}
        if model.version:
            row |= {"version": model.version, "state": model.state}
            if model.reason:
                row["reason"] = model.reason
        rows.append(row)
    return json_response(rows)


def _parameters(document: dict[str, Any]) -> dict[str, Any]:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise internal(NON_OBJECT)
    return parameters


async def load(request: Request) -> Response:
    service: TritonService = request.app.state.service
    name = request.path_params["model"]
    parameters = _parameters(await _document(request))
    config = parameters.get("config", "")
    if not isinstance(config, str):
        raise internal(NON_STRING)
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            continue
        if not isinstance(value, str):
            raise internal(NON_STRING)
        try:
            files[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise internal(
                f"failed to load '{name}', failed to poll from model repository"
            ) from None
    await service.load(name, config, files)
    return _empty_ok()


async def unload(request: Request) -> Response:
    service: TritonService = request.app.state.service
    _parameters(await _document(request))  # read, as Triton does; `unload_dependents` is moot
    await service.unload(request.path_params["model"])
    return _empty_ok()
