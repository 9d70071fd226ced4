"""Triton's shared memory extensions over HTTP: `/v2/systemsharedmemory[/region/<r>]/status`
(GET), `.../register` and `.../unregister` (POST), and the same under `/v2/cudasharedmemory`.

System regions are the door's (`service.shm`, ../shm.py), shared with the gRPC wire: a region
registered over one is used by the other, and HTTP infer reads and writes it through the
`shared_memory_region` parameters (tensors.py). CUDA regions share that name space: a
registration is parsed as Triton parses it, then opened (../shm.py `register_cuda`); where CUDA
cannot be used it fails as Triton 2.51 fails on a host without GPUs. Answers, as Triton
2.51's [V]:

- register: body `{"key": str, "offset": uint, "byte_size": uint}`; a body that is no object
  or lacks `key` / `byte_size` is 400 "Shared memory register request has no '<f>' field";
  values of the wrong JSON type, or JSON that does not parse, are 500 with RapidJSON's words;
  no `offset` is 0; the checks of the region itself are ../shm.py's;
- status: a JSON list of `{"name", "key", "offset", "byte_size"}`; an unknown region is 404;
- unregister: 200 with an empty body, for an unknown region too; the body is not read.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from model_repository_loader.gpu.cuda import IPC_HANDLE_BYTES as CUDA_HANDLE_BYTES
from model_repository_loader.gpu.cuda import CudaUnavailable, require_device

from ..door_error import invalid
from ..service import TritonService
from .bodies import internal, read_json
from .error_status import json_response


def _empty_ok() -> Response:
    return Response(b"", status_code=200, media_type="application/json")


def _required(document: Any, field: str) -> Any:
    if not isinstance(document, dict) or field not in document:
        raise invalid(f"Shared memory register request has no '{field}' field")
    return document[field]


def _unsigned(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise internal("attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def _member(document: Any, field: str) -> Any:
    if not isinstance(document, dict) or field not in document:
        raise internal(f"attempt to access non-existing object member '{field}'")
    return document[field]


# -- system shared memory -----------------------------------------------------------------------


async def system_status(request: Request) -> Response:
    service: TritonService = request.app.state.service
    regions = service.shm.status(request.path_params.get("region", ""))
    return json_response(
        [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in regions
        ]
    )


async def system_register(request: Request) -> Response:
    service: TritonService = request.app.state.service
    service.shm.require_allowed()  # before the body is read, as Triton
    document = await read_json(request)
    key = _required(document, "key")
    if not isinstance(key, str):
        raise internal("attempt to access JSON non-string as string")
    offset = _unsigned(document.get("offset", 0))
    byte_size = _unsigned(_required(document, "byte_size"))
    service.shm.register(request.path_params["region"], key, offset, byte_size)
    return _empty_ok()


async def system_unregister(request: Request) -> Response:
    service: TritonService = request.app.state.service
    service.shm.unregister(request.path_params.get("region", ""))
    return _empty_ok()


# -- CUDA shared memory ---------------------------------------------------------------------------


async def cuda_status(request: Request) -> Response:
    service: TritonService = request.app.state.service
    regions = service.shm.cuda_status(request.path_params.get("region", ""))
    return json_response(
        [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]
    )


async def cuda_register(request: Request) -> Response:
    service: TritonService = request.app.state.service
    service.shm.require_allowed()  # before the body is read, as Triton
    document = await read_json(request)
    handle = _member(_required(document, "raw_handle"), "b64")
    device_id = _member(document, "device_id")
    byte_size = _member(document, "byte_size")
    try:
        raw = base64.b64decode(handle, validate=True) if isinstance(handle, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != CUDA_HANDLE_BYTES:
        raise invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    try:
        require_device()
    except CudaUnavailable:
        # What Triton answers here when it has no GPU to open the handle on [V].
        raise invalid("failed to register shared memory region: invalid args") from None
    name = request.path_params["region"]
    service.shm.register_cuda(name, raw, _unsigned(device_id), _unsigned(byte_size))
    return _empty_ok()


async def cuda_unregister(request: Request) -> Response:
    service: TritonService = request.app.state.service
    service.shm.unregister_cuda(request.path_params.get("region", ""))
    return _empty_ok()
