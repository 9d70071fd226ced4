"""`POST /v2/models/<m>[/versions/<v>]/infer`: one request, one answer.

The model is looked up before the body is read as JSON, as Triton does (an unknown model is
404 whatever the body). The body may be compressed (`Content-Encoding: gzip` or `deflate`), and
the answer is compressed when `Accept-Encoding` asks for one of them, as Triton's HTTP server
does [V]. A body is inflated in slices and never past `--http-max-input-size` (limits.py);
inflating, parsing and packing a large body, and rendering a large answer, run on a thread.
A decoupled model cannot answer here (UNSUPPORTED, Triton's HTTP text; it has
generate_stream); a default model must answer exactly once. The request plane's context is
stopped when the client goes away before the answer, so the worker stops too.

Two paths, as the gRPC wire's ModelInfer (grpc/unary.py). The loop reads the body; then a
request to this process's own model is answered whole on a thread of the door's pool (inflate,
parse, `Model.submit`, a wait for the final response, the answer: `_answer_on_thread`), so the
event loop that every connection, stream and Dynamo's runtime share spends two hand-overs on it
and nothing that grows with the request. The pool has a thread for each connection the listener
takes (an HTTP/1.1 connection has one request at a time), so requests held by a slow model never
keep another model's waiting. The loop's path takes what needs the loop: tracing, a request
while shared memory regions are registered (their holding and lending are the loop's), and a
model of another process.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from dynamo.runtime import Context
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from model_repository_loader.pb_utils.errors import ErrorCode

from ....tracing.request import WireTrace
from ..door_error import DoorError
from ..header_forward import forward_into
from ..routes import LocalRoute
from ..service import Target, TritonService, single_answer
from ..tensor_checks import run_deferred
from .bodies import read_body
from .error_status import error_response
from .limits import DEFAULT_MAX_INPUT_SIZE, decompressed_too_large, off_loop
from .tensors import (
    HEADER_LENGTH,
    InferPlan,
    parse_json,
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


def _answer_size(item: dict[str, Any]) -> int:
    """The bytes of a response's tensors: what rendering it as JSON costs grows with."""
    return sum(len(tensor["data"]["values"]) for tensor in item.get("tensors", ()))


def _response_encoding(accept: str | None) -> str | None:
    """The first of gzip / deflate that `Accept-Encoding` lists, if any."""
    if not accept:
        return None
    for item in accept.split(","):
        name = item.split(";", 1)[0].strip().lower()
        if name in _COMPRESSIONS:
            return name
    return None


async def _watch_disconnect(request: Request, stop: Callable[[], None]) -> None:
    """`stop()` when the client goes away (the body is read: the next message the server
    hands over is the disconnect): the request plane's context, or the thread's answer."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stop()
            return


@dataclass(frozen=True, slots=True)
class _Call:
    """What answering one request needs of it, read on the loop (the `Request` is the loop's)."""

    model: str
    target: Target
    service: TritonService
    limit: int  # `--http-max-input-size`
    encoding: str | None  # Content-Encoding
    header_length: str | None  # Inference-Header-Content-Length
    accept_encoding: str | None
    forwarded: dict[str, Any] | None  # `--http-header-forward-pattern`'s parameters

    @classmethod
    def of(cls, request: Request, target: Target) -> _Call:
        headers = request.headers
        options = request.app.state.options
        forwarding = options.header_forwarding
        return cls(
            request.path_params["model"],
            target,
            request.app.state.service,
            options.max_input_size,
            headers.get("content-encoding"),
            headers.get(HEADER_LENGTH),
            headers.get("accept-encoding"),
            None if forwarding is None else forwarding.parameters(headers.items()),
        )

    def split(self, raw: bytes) -> tuple[bytes, memoryview]:
        """The body inflated and cut into (JSON header, binary part); DoorError when it
        cannot be (answered text/plain: refused before the request is parsed [V])."""
        return split_body(_decompress(raw, self.encoding, self.limit), self.header_length)

    def to_bridge(
        self, header: bytes, binary: memoryview, deferred: list[Callable[[], None]], lend: bool
    ) -> tuple[dict[str, Any], InferPlan]:
        """The bridge form and the response's plan; DoorError (Triton's texts) for a request
        that does not fit the model."""
        service = self.service
        target = self.target
        bridge, plan = to_bridge_request(
            parse_json(header),
            binary,
            self.model,
            target.version,
            target.entry.config,
            service.shm,
            service.bytes_limits,
            deferred,
            self.limit,
            lend,
        )
        if self.forwarded is not None:
            forward_into(bridge, self.forwarded)
        return bridge, plan

    def render(self, answers: list[dict[str, Any]], plan: InferPlan) -> Response:
        """The model's answers (flag-only FINALs left out) as Triton's HTTP answer."""
        try:
            answer = single_answer(answers)
        except DoorError as exc:
            return error_response(exc, "text/plain")
        if "error" in answer:
            # Triton labels a request check's refusal JSON, and what failed past it (the
            # model, a version lookup) text/plain [V].
            error = DoorError.from_item(answer["error"])
            checked = answer.get("rejected") and error.code != ErrorCode.NOT_FOUND
            return error_response(error, "application/json" if checked else "text/plain")
        try:
            head, chunks = to_response(
                self.model, answer, plan, self.target.entry.config, self.service.shm
            )
        except DoorError as exc:  # e.g. FP16 asked for as JSON: found past the model [V]
            return error_response(exc, "text/plain")
        encoding = _response_encoding(self.accept_encoding)
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
            content = _compress(content, encoding)
            out_headers["content-encoding"] = encoding
        return Response(content, headers=out_headers)


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
    try:
        target = await service.target(params["model"], params.get("version", ""), stream=True)
        if target.decoupled:
            raise DoorError(ErrorCode.UNSUPPORTED, DECOUPLED)
        try:
            raw = await read_body(request)
        except ClientDisconnect:  # gone before its body arrived: nobody to answer, nothing to log
            return Response(b"", status_code=400)
    except DoorError as exc:  # refused before the request is parsed: Triton's label [V]
        return error_response(exc, "text/plain")
    call = _Call.of(request, target)
    # This process's own model, and nothing the loop must do (module doc): on a thread.
    route = (
        None
        if trace is not None or service.shm.regions
        else service.directory.local_route(target.endpoint)
    )
    if route is not None:
        answer = route.on_thread()
        watcher = asyncio.ensure_future(_watch_disconnect(request, answer.cancel))
        try:
            return await asyncio.get_running_loop().run_in_executor(
                request.app.state.infer_threads, _answer_on_thread, call, raw, route, answer
            )
        except asyncio.CancelledError:  # the server stops past its grace: the thread too
            answer.cancel()
            raise
        finally:
            watcher.cancel()
    if trace is not None:
        trace.stamp("HTTP_RECV_END")
    try:
        header, binary = await off_loop(len(raw), partial(call.split, raw))
    except DoorError as exc:
        return error_response(exc, "text/plain")
    deferred: list[Callable[[], None]] = []
    bridge, plan = await off_loop(
        len(header) + len(binary),
        partial(call.to_bridge, header, binary, deferred, service.lends(target)),
    )
    del raw, header, binary  # the bridge form holds what is needed
    with service.shm.holding(plan.regions):
        await run_deferred(deferred)  # large BYTES inputs are walked off the event loop
        if trace is not None and target.entry.bridge_form:
            bridge["trace"] = trace.request_form()
            trace.request_id = str(bridge.get("id") or "")
        context = Context()
        watcher = asyncio.ensure_future(_watch_disconnect(request, context.stop_generating))
        try:
            answers = await service.answers(target, bridge, context, trace)
        finally:
            watcher.cancel()
        return await off_loop(_answers_size(answers), partial(call.render, answers, plan))


def _answer_on_thread(call: _Call, raw: bytes, route: LocalRoute, answer: Any) -> Response:
    """The whole answer of a request to this process's own model, on a thread of the HTTP
    door's pool that waits for the model (`LocalRoute.answer_on_thread`); the loop's
    `answer.cancel()` gives it up when the client goes away."""
    try:
        header, binary = call.split(raw)
    except DoorError as exc:
        return error_response(exc, "text/plain")
    deferred: list[Callable[[], None]] = []
    bridge, plan = call.to_bridge(header, binary, deferred, False)  # no regions: nothing to lend
    del raw, header, binary
    for check in deferred:  # large BYTES inputs' checks: this thread has no loop to free
        check()
    try:
        items = route.answer_on_thread(bridge, answer)
    except Exception as exc:  # as TritonService.answers words a failure of the worker
        raise DoorError(ErrorCode.UNAVAILABLE, str(exc)) from None
    if answer.gone:  # the client went away: nobody reads this
        return Response(b"", status_code=400)
    return call.render([item for item in items if not item.get("empty")], plan)


def _answers_size(answers: list[dict[str, Any]]) -> int:
    """The bytes of the answers' tensors: what rendering them as JSON costs grows with."""
    return sum(_answer_size(item) for item in answers)


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
