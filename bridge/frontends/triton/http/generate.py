"""`POST /v2/models/<m>[/versions/<v>]/generate` and `.../generate_stream`, as Triton 2.51 has them.

The generate extension trades tensors for plain JSON: the body is an object whose members named
like the model's inputs are their values (a scalar or a list), plus an optional `id` and
`parameters`; any other member is a request parameter too (a number, bool or string, else
400). The answer is one object with each output by name (a single element as a scalar, more as
a flat list), `model_name`, `model_version` and the request's `id`, keys in sorted order.
What was checked against Triton 2.51 [V]:

- an input's shape is its config's dims (with the batch dimension first when the model batches),
  every variable dimension 1 except the last, which takes what the element count leaves
  (`len(value)`, 1 for a scalar); a count that does not fit is 400 "The schema can not convert
  input '<x>' to tensor with proper shape". Members are taken in the document's order; a name
  given twice is 400 "[request id: <id>] input '<x>' already exists in request";
- an `id` that is not a string, `parameters` that are not an object, JSON that does not parse,
  and values of the wrong JSON type are 500 with Triton's texts; a parameter that is not a
  number, bool or string is 400; FP16/BF16 inputs cannot come as JSON (400);
- `generate` runs decoupled models too: anything but exactly one response is a 200 carrying
  `{"error": "generate expects model to produce exactly 1 response, ..."}`;
- a model's error response is 400 whatever its code (Triton's generate answers an INTERNAL
  error 400 where /infer answers 500); a request refused before it reached the model (unknown
  model or version, missing inputs) has its code's status;
- `generate_stream` answers Server-Sent Events, one `data: {...}` per response. The HTTP
  status waits for the first response: a model's error there is 400 with the event
  `data: {"error": ...}`; a later error is an event and the stream goes on. A refusal before
  any response (unknown model or version, bad body, missing inputs) is a plain `{"error"}`.

A client that goes away stops its request (the Dynamo context), mid-stream or while `generate`
or `generate_stream` waits for its first answer, as Triton cancels it: the model sees
`is_cancelled()`. A stream sends one event per turn of the event loop, and a model faster than
its client waits in `send()` (bridge/models/endpoint.py), so a slow or vanished client costs neither
memory nor the other requests' turns (issue 22).
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
from dynamo.runtime import Context
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY
from model_repository_loader.validation import config_datatype_name

from ....codec import TO_DYNAMO, TO_KSERVE
from ..door_error import DoorError, invalid
from ..service import Target, TritonService
from .bodies import internal, read_json
from .error_status import encode_json, http_status, json_response

EXACTLY_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)
EVENT_STREAM = "text/event-stream; charset=utf-8"
MODEL_ERROR_STATUS = 400

_SIGNED = {"INT8", "INT16", "INT32", "INT64"}
_UNSIGNED = {"UINT8", "UINT16", "UINT32", "UINT64"}
_FLOATS = {"FP32", "FP64"}
_NO_JSON = {"FP16", "BF16"}
_INT64_MAX = 2**63 - 1


class _Members(dict):
    """A JSON object that also remembers its members in order, repeats included (Triton reads
    a repeated input as two inputs and refuses the second)."""

    pairs: list[tuple[str, Any]]


def _object(pairs: list[tuple[str, Any]]) -> _Members:
    members = _Members(pairs)
    members.pairs = pairs
    return members


async def _parse_body(request: Request) -> _Members:
    document = await read_json(request, object_pairs_hook=_object)
    if not isinstance(document, _Members):
        raise internal("attempt to get members for non-object")
    return document


# -- request ----------------------------------------------------------------------------------


def _parameter(key: str, value: Any, prefix: str) -> dict[str, Any]:
    """One request parameter in the bridge's dict form, or Triton's 400 for a JSON type that
    is none of number, bool and string."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int) and -(2**63) <= value <= _INT64_MAX:
        return {"int64": value}
    if isinstance(value, int) and 0 <= value < 2**64:
        return {"uint64": value}
    if isinstance(value, int | float):
        return {"double": float(value)}
    if isinstance(value, str):
        return {"string": value}
    raise invalid(
        f"{prefix}parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
        "'string'."
    )


def _parameters(given: Any) -> dict[str, dict[str, Any]]:
    """The `parameters` member."""
    if not isinstance(given, dict):
        raise internal(
            "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object "
            "as object"
        )
    prefix = "Converting keyword: 'parameters': "
    return {key: _parameter(key, value, prefix) for key, value in given.items()}


def _shape(config: mc.ModelConfig, spec: mc.ModelInput, count: int) -> list[int]:
    """The input's shape for `count` elements (module docstring), or Triton's 400."""
    dims = ([-1] if config.max_batch_size > 0 else []) + list(spec.dims)
    variable = [i for i, d in enumerate(dims) if d < 0]
    shape = [1 if d < 0 else int(d) for d in dims]
    known = math.prod(shape)
    if variable and known > 0 and count % known == 0:
        shape[variable[-1]] = count // known
    if math.prod(shape) != count:
        raise invalid(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
    return shape


def _flatten(value: Any, out: list[Any]) -> list[Any]:
    if isinstance(value, list):
        for item in value:
            _flatten(item, out)
    else:
        out.append(value)
    return out


def _values_bytes(name: str, datatype: str, values: list[Any]) -> bytes:
    """JSON values of one input → its raw bytes (little endian, BYTES length-prefixed)."""
    if datatype in _NO_JSON:
        raise invalid(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    if datatype == "BYTES":
        parts = []
        for value in values:
            if not isinstance(value, str):
                raise internal(
                    "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
                )
            data = value.encode("utf-8", "surrogatepass")
            parts.append(struct.pack("<I", len(data)) + data)
        return b"".join(parts)
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise internal("Unable to parse 'data': attempt to access JSON non-boolean as boolean")
        return np.asarray(values, dtype=np.bool_).tobytes()
    dtype = DATATYPE_TO_NUMPY[datatype]
    if datatype in _SIGNED:
        if not all(type(v) is int and -(2**63) <= v <= _INT64_MAX for v in values):
            raise internal(
                "Unable to parse 'data': attempt to access JSON non-signed-integer as "
                "signed-integer"
            )
        # Triton narrows as C does: an out-of-range value wraps [V].
        return np.asarray(values, dtype=np.int64).astype(dtype).tobytes()
    if datatype in _UNSIGNED:
        if not all(type(v) is int and 0 <= v < 2**64 for v in values):
            raise internal(
                "Unable to parse 'data': attempt to access JSON non-unsigned-integer as "
                "unsigned-integer"
            )
        return np.asarray(values, dtype=np.uint64).astype(dtype).tobytes()
    if datatype in _FLOATS:
        if not all(type(v) in (int, float) for v in values):
            raise internal("Unable to parse 'data': attempt to access JSON non-number as double")
        return np.asarray(values, dtype=np.float64).astype(dtype).tobytes()
    raise invalid(f"input '{name}' has a datatype JSON cannot carry: {datatype}")


def bridge_request(target: Target, name: str, document: _Members) -> dict[str, Any]:
    """A generate body → the bridge-form request (docs/worker_protocol.md §2). Members are
    taken in the document's order, as Triton does [V]: `parameters`, inputs by name, and any
    other member as a request parameter of its own."""
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
    config = target.entry.config
    specs = {spec.name: spec for spec in config.input}
    tensors: list[dict[str, Any]] = []
    parameters: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for key, value in document.pairs:
        spec = specs.get(key)
        if key == "id":
            continue
        if key == "parameters":
            parameters.update(_parameters(value))
            continue
        if spec is None:
            parameters[key] = _parameter(key, value, "")
            continue
        datatype = config_datatype_name(spec.data_type)
        count = len(value) if isinstance(value, list) else 1
        shape = _shape(config, spec, count)
        values = _flatten(value, [])
        if len(values) != count:
            raise internal(
                "Unable to parse 'data': Shape does not match true shape of 'data' field"
            )
        data = _values_bytes(key, datatype, values)
        if key in seen:
            raise invalid(
                f"[request id: {request_id or '<id_unknown>'}] input '{key}' already exists in "
                "request"
            )
        seen.add(key)
        data_type = TO_DYNAMO[datatype]
        tensors.append(
            {
                "metadata": {"name": key, "data_type": data_type, "shape": shape},
                "data": {"data_type": data_type, "values": data},
            }
        )
    body: dict[str, Any] = {
        "model": name,
        "tensors": tensors,
        "bridge_form": 1,
        "model_version": target.version,
    }
    if request_id:
        body["id"] = request_id
    if parameters:
        body["parameters"] = parameters
    return body


# -- response ---------------------------------------------------------------------------------


def _bytes_elements(data: bytes) -> list[str]:
    out = []
    offset = 0
    while offset + 4 <= len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        out.append(data[offset : offset + length].decode("utf-8", errors="replace"))
        offset += length
    return out


def _output_value(tensor: dict[str, Any]) -> Any:
    """One output as Triton's generate writes it: a scalar for one element, else a flat list."""
    datatype = TO_KSERVE[tensor["metadata"]["data_type"]]
    data = tensor["data"]["values"]
    if not isinstance(data, bytes | bytearray):
        values = _flatten(list(data), [])
    elif datatype == "BYTES":
        values = _bytes_elements(bytes(data))
    elif datatype == "BF16":
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32).tolist()
    else:
        values = np.frombuffer(data, dtype=DATATYPE_TO_NUMPY[datatype]).tolist()
    return values[0] if len(values) == 1 else values


def response_document(name: str, request_id: str, item: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = {
        t["metadata"]["name"]: _output_value(t) for t in item.get("tensors", ())
    }
    if request_id:
        document["id"] = request_id
    document["model_name"] = name
    document["model_version"] = str(item.get("model_version", ""))
    return dict(sorted(document.items()))


def _error_answer(item: dict[str, Any]) -> Response:
    """An error item as the whole answer (module docstring: 400 unless refused up front)."""
    error = DoorError.from_item(item["error"])
    status = http_status(error.code) if item.get("rejected") else MODEL_ERROR_STATUS
    return json_response({"error": error.message}, status)


# -- handlers ---------------------------------------------------------------------------------


async def _prepare(request: Request) -> tuple[TritonService, Target, dict[str, Any]]:
    service: TritonService = request.app.state.service
    name = request.path_params["model"]
    # Both routes take decoupled models (generate checks the count of responses itself).
    target = await service.target(name, request.path_params.get("version", ""), stream=True)
    document = await _parse_body(request)
    return service, target, bridge_request(target, name, document)


async def _collect(
    service: TritonService, target: Target, body: dict[str, Any], context: Context
) -> list[dict[str, Any]]:
    """The responses of one request, up to the second (the answer is decided then)."""
    answers: list[dict[str, Any]] = []
    async for item in service.items(target, body, context):
        if item.get("empty"):
            continue  # a flag-only FINAL is no response
        answers.append(item)
        if len(answers) > 1:
            break
    return answers


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (its body was read: the next message says so)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def generate(request: Request) -> Response:
    service, target, body = await _prepare(request)
    context = Context()
    collecting = asyncio.ensure_future(_collect(service, target, body, context))
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({collecting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collecting.done():  # the client went away, or this call was cancelled
            context.stop_generating()
            collecting.cancel()
    if not collecting.done():
        return Response(b"", status_code=499)  # nobody reads it
    try:
        answers = collecting.result()
    except BaseException:  # the request plane failed: answered as its error
        context.stop_generating()
        raise
    if len(answers) != 1:
        context.stop_generating()  # a decoupled model may still be sending: it is not wanted
        return json_response({"error": EXACTLY_ONE})
    answer = answers[0]
    if "error" in answer:
        return _error_answer(answer)
    return json_response(response_document(body["model"], body.get("id", ""), answer))


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + encode_json(document) + b"\n\n"


def _error_event(message: str) -> bytes:
    return _event({"error": message})


async def _first_response(items: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
    """The first item that is a response (None: the stream ended with none)."""
    async for item in items:
        if not item.get("empty"):
            return item
    return None


class _EventStream(StreamingResponse):
    """Server-Sent Events that end, and stop their request, when the client goes away.

    Starlette's StreamingResponse hears of a disconnect only when its loop gives the event
    loop a turn, and uvicorn's `send()` to a closed connection returns at once without one:
    with a model faster than the rendering, the stream rendered its backlog for ever while
    nothing else ran and the model never saw `is_cancelled()` (issue 22). Here a task waits
    for the `http.disconnect` message and stops the request's Dynamo context (the path a gRPC
    cancel takes: the worker cancels the request for the model), and every event is followed
    by a turn of the event loop.
    """

    def __init__(self, events: AsyncGenerator[bytes, None], status_code: int, context: Context):
        super().__init__(events, status_code=status_code, media_type=EVENT_STREAM)
        self._events = events
        self._context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnected(receive))
        gone.add_done_callback(self._client_gone)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for event in self._events:
                if gone.done():
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.sleep(0)  # one event per turn of the loop (docstring)
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            await self._events.aclose()  # its `finally` stops the context

    def _client_gone(self, watcher: asyncio.Future[None]) -> None:
        if not watcher.cancelled():
            self._context.stop_generating()


async def generate_stream(request: Request) -> Response:
    service, target, body = await _prepare(request)
    name, request_id = body["model"], body.get("id", "")
    context = Context()
    items = aiter(service.items(target, body, context))

    def render(item: dict[str, Any]) -> bytes:
        if "error" in item:
            return _error_event(DoorError.from_item(item["error"]).message)
        return _event(response_document(name, request_id, item))

    # The status line waits for the first response (module docstring), or the client's leave.
    waiting = asyncio.ensure_future(_first_response(items))
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not waiting.done():  # the client went away, or this call was cancelled
            context.stop_generating()
            waiting.cancel()
    if not waiting.done():
        return Response(b"", status_code=499)  # nobody reads it
    try:
        first = waiting.result()
    except BaseException:
        context.stop_generating()
        raise
    status = 200
    if first is not None and "error" in first:
        if first.get("rejected"):
            context.stop_generating()
            return _error_answer(first)
        status = MODEL_ERROR_STATUS

    async def events() -> AsyncGenerator[bytes, None]:
        try:
            if first is None:
                return
            yield render(first)
            async for item in items:
                if not item.get("empty"):
                    yield render(item)
        except DoorError as exc:  # the request plane failed mid-stream
            yield _error_event(exc.message)
        finally:
            context.stop_generating()

    return _EventStream(events(), status, context)
