"""`POST /v2/models/<m>[/versions/<v>]/infer`: one request, one answer.

The model is looked up before the body is read as JSON, as Triton does (an unknown model is
404 whatever the body). The body may be compressed (`Content-Encoding: gzip` or `deflate`), and
the answer is compressed when `Accept-Encoding` asks for one of them, as Triton's HTTP server
does [V]. A body is inflated in slices and never past `--http-max-input-size` (limits.py);
inflating, parsing and packing a large body, and rendering a large answer, run on a thread.
A decoupled model cannot answer here (UNSUPPORTED, Triton's HTTP text; it has
generate_stream); a default model must answer exactly once. The request plane's context is
stopped when the client goes away before the answer, so the worker stops too.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any

from dynamo.runtime import Context
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from model_repository_loader.pb_utils.errors import ErrorCode

from ....codec import tensor_bytes
from ....tracing.request import WireTrace
from ..door_error import DoorError
from ..header_forward import forward_into
from ..service import Target, single_answer
from ..tensor_checks import run_deferred
from .bodies import read_body
from .error_status import error_response
from .limits import DEFAULT_MAX_INPUT_SIZE, OFF_LOOP_BYTES, decompressed_too_large, off_loop
from .tensors import (
    HEADER_LENGTH,
    InferPlan,
    parse_json,
    region_input_bytes,
    split_body,
    to_bridge_request,
    to_response,
)

_COMPRESSIONS = ("gzip", "deflate")
DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"


# zlib's window bits: a gzip wrapper, or a zlib wrapper (what HTTP calls "deflate").
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_JOIN_BELOW = 1 << 16  # an answer's parts are joined and sent at once below this size
_INFLATE_SLICE = 1 << 20  # output per step: never more than the limit allocated, nor past it


def _decompress(body: bytes, encoding: str | None, limit: int = DEFAULT_MAX_INPUT_SIZE) -> bytes:
    """The body inflated, in slices, refused (Triton's 400) as soon as it passes `limit`."""
    if not encoding or encoding == "identity":
        return body
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise DoorError(ErrorCode.UNSUPPORTED, f"unsupported Content-Encoding '{encoding}'")
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending = body
    try:
        while pending and not inflater.eof:
            out += inflater.decompress(pending, min(_INFLATE_SLICE, limit + 1 - len(out)))
            if len(out) > limit:
                raise DoorError(ErrorCode.INVALID_ARG, decompressed_too_large(limit))
            pending = inflater.unconsumed_tail
    except zlib.error as exc:
        raise DoorError(
            ErrorCode.INVALID_ARG, f"failed to decompress the request body ({encoding}): {exc}"
        ) from None
    if not inflater.eof:
        raise DoorError(
            ErrorCode.INVALID_ARG,
            f"failed to decompress the request body ({encoding}): the data is cut short",
        )
    return bytes(out)


def _compress(content: bytes, encoding: str) -> bytes:
    return gzip.compress(content, 1) if encoding == "gzip" else zlib.compress(content, 1)


def _response_encoding(accept: str | None) -> str | None:
    """The first of gzip / deflate that `Accept-Encoding` lists, if any."""
    if not accept:
        return None
    for item in accept.split(","):
        name = item.split(";", 1)[0].strip().lower()
        if name in _COMPRESSIONS:
            return name
    return None


async def _watch_disconnect(request: Request, context: Context) -> None:
    """Stop the request plane's context when the client goes away (the body is read: the
    next message the server hands over is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            context.stop_generating()
            return


def _to_bridge(header: bytes, **arguments: Any) -> tuple[dict[str, Any], InferPlan]:
    """`to_bridge_request` of the header as sent: a large one is parsed, and its document
    freed, on the thread that converts it."""
    return to_bridge_request(parse_json(header), **arguments)


class _DisconnectWatch:
    """`_watch_disconnect` for a request whose answer is late. Watching takes a task, which
    costs a small request a few percent of its time on the loop, and most answers come back
    within milliseconds; so the task starts only once the answer is WATCH_AFTER_S late. A
    client that goes away sooner has its request stopped then."""

    WATCH_AFTER_S = 0.02

    def __init__(self, request: Request, context: Context) -> None:
        self._task: asyncio.Future[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(
            self.WATCH_AFTER_S, self._start, request, context
        )

    def _start(self, request: Request, context: Context) -> None:
        self._task = asyncio.ensure_future(_watch_disconnect(request, context))

    def cancel(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


async def infer(request: Request) -> Response:
    service = request.app.state.service
    if not service.trace.active:  # tracing off: nothing more per request
        return await _infer(request, None)
    traceparent = request.headers.get("traceparent", "")
    trace = service.trace.start(request.path_params["model"], "HTTP", traceparent)
    if trace is None:
        return await _infer(request, None)
    trace.stamp("HTTP_RECV_START")
    response = await _infer(request, trace)
    trace.stamp("HTTP_SEND_START")
    response.background = BackgroundTask(trace.finish, "HTTP_SEND_END")  # once it is sent
    return response


async def _infer(request: Request, trace: WireTrace | None) -> Response:
    service = request.app.state.service
    params = request.path_params
    model = params["model"]
    headers = request.headers
    try:
        target = await service.target(model, params.get("version", ""), stream=True)
        if target.decoupled:
            raise DoorError(ErrorCode.UNSUPPORTED, DECOUPLED)
        try:
            raw = await read_body(request)
        except ClientDisconnect:  # gone before its body arrived: nobody to answer, nothing to log
            return Response(b"", status_code=400)
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
        limit = request.app.state.options.max_input_size
        encoding = headers.get("content-encoding")
        body = await off_loop(len(raw), partial(_decompress, raw, encoding, limit))
        header, binary = split_body(body, headers.get(HEADER_LENGTH))
    except DoorError as exc:  # refused before the request is parsed: Triton's label [V]
        return error_response(exc, "text/plain")
    config = target.entry.config
    deferred: list[Callable[[], None]] = []
    arguments = dict(
        binary=binary,
        model=model,
        model_version=target.version,
        config=config,
        shm=service.shm,
        limits=service.bytes_limits,
        deferred=deferred,
        max_input_size=limit,
        lend=service.lends(target),
    )
    if len(body) > OFF_LOOP_BYTES:  # parsing and converting it grow with the body
        bridge, plan = await off_loop(len(body), partial(_to_bridge, header, **arguments))
    else:
        # A small body may still name large inputs in shared memory regions, which converting
        # reads out of them: their bytes decide where it runs (none without a region).
        document = parse_json(header)
        regions = region_input_bytes(document) if service.shm.any_registered() else 0
        bridge, plan = await off_loop(regions, partial(to_bridge_request, document, **arguments))
        del document
    del raw, body, header, binary, arguments  # the bridge form holds what is needed
    with service.shm.holding(plan.regions):
        return await _answer(request, trace, target, bridge, plan, deferred)


async def _answer(
    request: Request,
    trace: WireTrace | None,
    target: Target,
    bridge: dict[str, Any],
    plan: InferPlan,
    deferred: list[Callable[[], None]],
) -> Response:
    """The rest of `_infer`, once the request is parsed (the regions it names held)."""
    service = request.app.state.service
    model = request.path_params["model"]
    headers = request.headers
    config = target.entry.config
    await run_deferred(deferred)  # large BYTES inputs are walked off the event loop
    forwarding = request.app.state.options.header_forwarding
    if forwarding is not None:  # `--http-header-forward-pattern`
        forward_into(bridge, forwarding.parameters(headers.items()))
    if trace is not None and target.entry.bridge_form:
        bridge["trace"] = trace.request_form()
        trace.request_id = str(bridge.get("id") or "")
    context = Context()
    watcher = _DisconnectWatch(request, context)
    try:
        answers = await service.answers(target, bridge, context, trace)
    finally:
        watcher.cancel()
    try:
        answer = single_answer(answers)
    except DoorError as exc:
        return error_response(exc, "text/plain")
    if "error" in answer:
        # Triton labels a request check's refusal JSON, and what failed past it (the model, a
        # version lookup) text/plain [V].
        error = DoorError.from_item(answer["error"])
        checked = answer.get("rejected") and error.code != ErrorCode.NOT_FOUND
        return error_response(error, "application/json" if checked else "text/plain")
    try:
        head, chunks = await off_loop(
            tensor_bytes(answer), partial(to_response, model, answer, plan, config, service.shm)
        )
    except DoorError as exc:  # e.g. FP16 asked for as JSON: found past the model, text/plain [V]
        return error_response(exc, "text/plain")
    encoding = _response_encoding(headers.get("accept-encoding"))
    if chunks:
        out_headers = {
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(head)),
        }
        size = len(head) + sum(map(len, chunks))
        if encoding is None and size > _JOIN_BELOW:
            return PartsResponse([head, *chunks], out_headers)
        content = b"".join([head, *chunks])  # small: one send costs less than several
    else:
        out_headers = {"content-type": "application/json"}
        content = head
    if encoding is not None:
        content = await off_loop(len(content), partial(_compress, content, encoding))
        out_headers["content-encoding"] = encoding
    return Response(content, headers=out_headers)


class PartsResponse(Response):
    """A 200 whose body is sent as its parts (the JSON header, then each output's bytes), so
    that megabytes of output are not joined into one more copy first."""

    def __init__(self, parts: list[bytes | bytearray], headers: dict[str, str]) -> None:
        self.parts = parts
        self.status_code = 200
        self.background = None
        self.body = b""
        self.init_headers({**headers, "content-length": str(sum(map(len, parts)))})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        last = len(self.parts) - 1
        for index, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})
        if self.background is not None:  # a traced request's HTTP_SEND_END
            await self.background()
